//! `inkbench-work`: the workloads of the benchmark suite that are written in
//! Rust, so they can run both on a mounted directory (POSIX calls: tmpfs,
//! ext4, FUSE mounts) and on the inkfs engine through its library API.
//! Driven by `bench/run`; prints one JSON object on stdout.
//!
//! ```text
//! inkbench-work micro     TARGET --ops N [--seed S] [--keep K]
//! inkbench-work filebench TARGET --personality fileserver|varmail|webserver|webproxy
//!               [--nfiles N] [--dirwidth W] [--filesize BYTES] [--threads T]
//!               [--iosize BYTES] [--appendsize BYTES] [--prealloc PCT]
//!               [--seconds S] [--seed S]
//! TARGET: --dir DIR | --pool FILE [--pool-size BYTES] [--mode strict|sync|posix]
//! ```

mod backend;
mod filebench;
mod micro;
mod rng;
mod stats;

use std::collections::HashMap;
use std::path::PathBuf;

use backend::{Backend, Lib, Posix};
use inkfs::types::Mode;
use serde_json::{Map, Value};

const USAGE: &str = "usage: inkbench-work micro|filebench (--dir DIR | --pool FILE [--pool-size BYTES] [--mode M]) [options]
  micro:     --ops N [--seed S] [--keep K]
  filebench: --personality fileserver|varmail|webserver|webproxy [--nfiles N] [--dirwidth W]
             [--filesize BYTES] [--threads T] [--iosize BYTES] [--appendsize BYTES]
             [--prealloc PCT] [--seconds S] [--seed S]";

struct Args {
    cmd: String,
    opts: HashMap<String, String>,
}

impl Args {
    fn parse() -> Result<Args, String> {
        let mut it = std::env::args().skip(1);
        let cmd = it.next().ok_or("missing command")?;
        let mut opts = HashMap::new();
        while let Some(a) = it.next() {
            let key = a
                .strip_prefix("--")
                .ok_or_else(|| format!("unexpected argument {a}"))?;
            let v = it.next().ok_or_else(|| format!("--{key} needs a value"))?;
            opts.insert(key.to_string(), v);
        }
        Ok(Args { cmd, opts })
    }
    fn get<T: std::str::FromStr>(&self, k: &str, default: T) -> Result<T, String> {
        match self.opts.get(k) {
            None => Ok(default),
            Some(v) => v.parse().map_err(|_| format!("--{k}: bad value {v}")),
        }
    }
}

/// The fields of the result object that the workload gives.
fn run_on<B: Backend>(b: &B, a: &Args) -> Result<Map<String, Value>, String> {
    match a.cmd.as_str() {
        "micro" => {
            let cfg = micro::MicroCfg {
                ops: a.get("ops", 1000)?,
                seed: a.get("seed", 1)?,
            };
            let keep: usize = a.get("keep", 400)?;
            let res = micro::run(b, &cfg).map_err(|e| format!("micro: {e}"))?;
            let ops: Map<String, Value> = res
                .iter()
                .map(|(n, l)| (n.to_string(), l.json(keep)))
                .collect();
            Ok(Map::from_iter([("ops".to_string(), ops.into())]))
        }
        "filebench" => {
            let p = a
                .opts
                .get("personality")
                .ok_or("--personality is required")?;
            let p = filebench::Personality::parse(p)
                .ok_or_else(|| format!("unknown personality {p}"))?;
            let d = filebench::FbCfg::published(p);
            let cfg = filebench::FbCfg {
                personality: p,
                nfiles: a.get("nfiles", d.nfiles)?,
                dirwidth: a.get("dirwidth", d.dirwidth)?,
                filesize: a.get("filesize", d.filesize)?,
                gamma: d.gamma,
                nthreads: a.get("threads", d.nthreads)?,
                iosize: a.get("iosize", d.iosize)?,
                appendsize: a.get("appendsize", d.appendsize)?,
                prealloc_pct: a.get("prealloc", d.prealloc_pct)?,
                seconds: a.get("seconds", d.seconds)?,
                seed: a.get("seed", d.seed)?,
            };
            let r = filebench::run(b, &cfg).map_err(|e| format!("filebench {}: {e}", p.name()))?;
            Ok(Map::from_iter([
                ("params".to_string(), cfg.json()),
                ("result".to_string(), r.json()),
            ]))
        }
        other => Err(format!("unknown command {other}\n{USAGE}")),
    }
}

/// One object: what was measured on (`head`), then the workload's fields.
fn result(head: Vec<(&str, Value)>, body: Map<String, Value>) -> Value {
    let mut m: Map<String, Value> = head.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    m.extend(body);
    Value::Object(m)
}

fn main() {
    let r = Args::parse().and_then(|a| {
        if let Some(dir) = a.opts.get("dir") {
            let b = Posix::new(&PathBuf::from(dir)).map_err(|e| format!("{dir}: {e}"))?;
            let body = run_on(&b, &a)?;
            Ok(result(vec![("target", "dir".into())], body))
        } else if let Some(pool) = a.opts.get("pool") {
            let mode_s = a.opts.get("mode").map(String::as_str).unwrap_or("strict");
            let mode = Mode::parse(mode_s).ok_or_else(|| format!("unknown mode {mode_s}"))?;
            let size: u64 = a.get("pool-size", 2u64 << 30)?;
            let b = Lib::create(&PathBuf::from(pool), size, mode)
                .map_err(|e| format!("{pool}: {e}"))?;
            let backend = b.describe();
            let body = run_on(&b, &a);
            let fin = b.finish().map_err(|e| format!("unmount: {e}"));
            let body = body?;
            fin?;
            let head = vec![
                ("target", "lib".into()),
                ("mode", mode.name().into()),
                ("backend", backend.into()),
            ];
            Ok(result(head, body))
        } else {
            Err(format!("give --dir or --pool\n{USAGE}"))
        }
    });
    match r {
        Ok(json) => println!("{json}"),
        Err(e) => {
            eprintln!("inkbench-work: {e}");
            std::process::exit(1);
        }
    }
}
