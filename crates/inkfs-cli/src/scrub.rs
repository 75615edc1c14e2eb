//! `inkfs scrub MOUNTPOINT [--json] [-q]`: an online check of
//! a mounted pool. The server that owns the pool runs it
//! (`inkfs_fuse::scrub`, `inkfs::Fs::scrub`) while it keeps serving; this
//! command asks for it, shows progress and reports (docs/FSCK.md, "Scrub").
//!
//! Exit codes, as fsck's: 0 nothing damaged, 4 damage found (scrub repairs
//! nothing; what it found went through the mount's errors= policy), 8
//! operational error (not an inkfs mount point, server not answering,
//! refused, stopped by an unmount), 16 usage error (given by the argument
//! parser: `usage::refuse`).

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use inkfs_fuse::scrub::Outcome;
use serde_json::{json, Map, Value};

pub const EXIT_CLEAN: i32 = 0;
pub const EXIT_DAMAGE: i32 = 4;
pub const EXIT_OPERATIONAL: i32 = 8;

const EXIT_CODES_HELP: &str = "\
Exit status, as fsck's (e2fsck's):
  0   nothing damaged
  4   damage found (nothing is repaired: unmount, then `inkfs fsck -y POOL`)
  8   operational error: not the mount point of an inkfs server, no answer,
      refused, or stopped by an unmount
  16  usage error (an unknown flag, a missing or extra argument); --help
      exits 0";

/// Check every checksum of a mounted pool while it keeps serving
///
/// The server that owns the pool runs the check (superblocks, journals,
/// inode tables, every live inode's log); damage found goes through the
/// mount's errors= policy. Root or the server's user only; one scrub at a
/// time per mount. Progress goes to stderr (none with -q). docs/FSCK.md,
/// "Scrub".
#[derive(clap::Args, Debug)]
#[command(after_help = EXIT_CODES_HELP)]
pub struct ScrubArgs {
    /// The mount point of a running inkfs server
    pub mountpoint: PathBuf,
    /// Print one JSON object (for scripts)
    #[arg(long)]
    pub json: bool,
    /// Print only the problems found (no summary, no progress)
    #[arg(short, long)]
    pub quiet: bool,
}

/// `inkfs scrub ...`; returns the exit status.
pub fn scrub_main(a: &ScrubArgs) -> i32 {
    let started = Instant::now();
    let mut bar = Bar::new(!a.quiet);
    let result =
        match inkfs_fuse::scrub::request(&a.mountpoint, &mut |done, total| bar.update(done, total))
        {
            None => Err(format!(
                "{} is not the mount point of an inkfs server",
                a.mountpoint.display()
            )),
            Some(r) => r,
        };
    bar.finish();
    match result {
        Ok(outcome) => report(a, &outcome, started.elapsed()),
        Err(m) => operational_error(a, &m),
    }
}

/// Say why the scrub did not run to its end (as JSON too with --json).
fn operational_error(a: &ScrubArgs, m: &str) -> i32 {
    if a.json {
        let v = json!({
            "mountpoint": a.mountpoint.display().to_string(),
            "error": m,
            "exit_code": EXIT_OPERATIONAL,
        });
        println!("{v}");
    }
    eprintln!("inkfs scrub: {}: {m}", a.mountpoint.display());
    EXIT_OPERATIONAL
}

/// The server's JSON object, with what only the client knows in front:
/// `{"mountpoint", "exit_code", "elapsed_s" (ms precision), ...server's}`.
fn json_report(
    mountpoint: &Path,
    code: i32,
    elapsed: Duration,
    server: &str,
) -> Result<Value, String> {
    let server: Map<String, Value> = serde_json::from_str(server)
        .map_err(|e| format!("the server's report is not a JSON object ({e})"))?;
    let mut v = Map::new();
    v.insert("mountpoint".into(), mountpoint.display().to_string().into());
    v.insert("exit_code".into(), code.into());
    let ms = elapsed.as_secs_f64() * 1000.0;
    v.insert("elapsed_s".into(), (ms.round() / 1000.0).into());
    v.extend(server);
    Ok(Value::Object(v))
}

fn report(a: &ScrubArgs, o: &Outcome, elapsed: Duration) -> i32 {
    let code = if o.count("cancelled") != 0 {
        EXIT_OPERATIONAL
    } else if o.findings.is_empty() {
        EXIT_CLEAN
    } else {
        EXIT_DAMAGE
    };
    let mnt = a.mountpoint.display();
    if a.json {
        return match json_report(&a.mountpoint, code, elapsed, &o.json) {
            Ok(v) => {
                println!("{v}");
                code
            }
            Err(m) => operational_error(a, &m),
        };
    }
    let mut out = std::io::stdout().lock();
    for f in &o.findings {
        let inode = f.ino.map_or(String::new(), |i| format!("inode {i}: "));
        let _ = writeln!(out, "error: {inode}{} ({})", f.message, f.reason);
    }
    if a.quiet {
        return code;
    }
    let _ = writeln!(
        out,
        "{mnt}: checked {} inodes ({} log pages, {} entries), {} inode-table blocks, {} superblocks, {} journals",
        o.count("inodes"),
        o.count("log_pages"),
        o.count("log_entries"),
        o.count("table_blocks"),
        o.count("superblocks"),
        o.count("journals"),
    );
    let verdict = match (code, o.count("read_only") != 0) {
        (EXIT_OPERATIONAL, _) => "stopped before the end".to_string(),
        (EXIT_CLEAN, _) => "clean".to_string(),
        (_, true) => format!(
            "{} problem(s) found; the file system is read-only now: unmount it and run \
             `inkfs fsck -y` on the pool",
            o.findings.len()
        ),
        (_, false) => format!(
            "{} problem(s) found (errors=continue: still serving); run `inkfs fsck -y` on the \
             pool after unmounting it",
            o.findings.len()
        ),
    };
    let _ = writeln!(out, "{mnt}: {verdict} ({:.2} s)", elapsed.as_secs_f64());
    code
}

/// Progress on stderr (none with -q): a bar redrawn in place on a
/// terminal, elsewhere a plain line at every tenth.
struct Bar {
    enabled: bool,
    tty: bool,
    drawn: bool,
    last: Option<Instant>,
    last_tenth: Option<u64>,
}

impl Bar {
    fn new(enabled: bool) -> Bar {
        Bar {
            enabled,
            tty: std::io::stderr().is_terminal(),
            drawn: false,
            last: None,
            last_tenth: None,
        }
    }

    fn update(&mut self, done: u64, total: u64) {
        if !self.enabled {
            return;
        }
        let frac = if total == 0 {
            1.0
        } else {
            done as f64 / total as f64
        };
        let mut err = std::io::stderr().lock();
        if self.tty {
            let now = Instant::now();
            if done < total
                && self
                    .last
                    .is_some_and(|l| now - l < Duration::from_millis(100))
            {
                return;
            }
            self.last = Some(now);
            let width = 30;
            let filled = ((frac * width as f64) as usize).min(width);
            let _ = write!(
                err,
                "\rinkfs scrub: [{}{}] {:3.0}% ({done}/{total} inode slots)",
                "#".repeat(filled),
                "-".repeat(width - filled),
                frac * 100.0
            );
            self.drawn = true;
        } else {
            let tenth = (frac * 10.0) as u64;
            if self.last_tenth == Some(tenth) {
                return;
            }
            self.last_tenth = Some(tenth);
            let _ = writeln!(
                err,
                "inkfs scrub: {:3.0}% ({done}/{total} inode slots)",
                frac * 100.0
            );
        }
        let _ = err.flush();
    }

    fn finish(&self) {
        if self.drawn {
            eprint!("\r\x1b[K");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_report_puts_the_client_fields_first_and_escapes() {
        let server = r#"{"clean":false,"inodes":3,"problems":[{"reason":"log","inode":7,"message":"a \"b\"\nc"}]}"#;
        let mnt = Path::new("/mnt/we\"ird");
        let v = json_report(mnt, 4, Duration::from_micros(1_234_567), server).unwrap();
        assert_eq!(
            v.to_string(),
            r#"{"mountpoint":"/mnt/we\"ird","exit_code":4,"elapsed_s":1.235,"clean":false,"inodes":3,"problems":[{"reason":"log","inode":7,"message":"a \"b\"\nc"}]}"#
        );
        let e = json_report(mnt, 0, Duration::ZERO, "done inodes=3").unwrap_err();
        assert!(e.contains("not a JSON object"), "{e}");
    }
}
