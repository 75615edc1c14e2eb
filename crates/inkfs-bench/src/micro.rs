//! Single-threaded latencies of the basic operations, one file system call
//! (or library call) each, timed one by one.

use std::io;
use std::time::Instant;

use crate::backend::Backend;
use crate::rng::seeded;
use crate::stats::Lat;

pub struct MicroCfg {
    pub ops: usize,
    pub seed: u64,
}

/// Returns (op name, latencies) in a fixed order.
pub fn run<B: Backend>(b: &B, cfg: &MicroCfg) -> io::Result<Vec<(&'static str, Lat)>> {
    let n = cfg.ops.max(1);
    let root = b.root();
    let page = vec![0x5au8; 4096];
    let mut rng = seeded(cfg.seed);
    let mut out = Vec::new();
    let name = |i: usize| format!("m{i:07}");

    let mut lat = Lat::default();
    for i in 0..n {
        let t = Instant::now();
        let f = b.create(&root, &name(i))?;
        b.close(f);
        lat.push(t);
    }
    out.push(("create", lat));

    let mut lat = Lat::default();
    for _ in 0..n {
        let i = rng.scaled_below(n as u64) as usize;
        let t = Instant::now();
        b.stat(&root, &name(i))?;
        lat.push(t);
    }
    out.push(("stat", lat));

    let mut lat = Lat::default();
    let listings = (n / 20).clamp(5, 200);
    for _ in 0..listings {
        let t = Instant::now();
        let got = b.readdir(&root)?;
        lat.push(t);
        if got < n {
            return Err(io::Error::other(format!(
                "readdir saw {got} of {n} entries"
            )));
        }
    }
    out.push(("readdir", lat));

    let mut f = b.create(&root, "append")?;
    let mut lat = Lat::default();
    for _ in 0..n {
        let t = Instant::now();
        b.append(&mut f, &page)?;
        b.fsync(&mut f)?;
        lat.push(t);
    }
    out.push(("append4k+fsync", lat));
    b.close(f);
    b.unlink(&root, "append")?;

    let pages = n.max(256) as u64;
    let mut f = b.create(&root, "overwrite")?;
    for p in 0..pages {
        b.pwrite(&mut f, p * 4096, &page)?;
    }
    b.fsync(&mut f)?;
    for (label, sync) in [("overwrite4k", false), ("overwrite4k+fsync", true)] {
        let mut lat = Lat::default();
        for _ in 0..n {
            let p = rng.scaled_below(pages);
            let t = Instant::now();
            b.pwrite(&mut f, p * 4096, &page)?;
            if sync {
                b.fsync(&mut f)?;
            }
            lat.push(t);
        }
        out.push((label, lat));
    }
    b.close(f);
    b.unlink(&root, "overwrite")?;

    let mut lat = Lat::default();
    for i in 0..n {
        let t = Instant::now();
        b.unlink(&root, &name(i))?;
        lat.push(t);
    }
    out.push(("delete", lat));
    Ok(out)
}
