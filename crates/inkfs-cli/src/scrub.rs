//! `inkfs scrub MOUNTPOINT [--json] [-q]`: an online check of
//! a mounted pool. The server that owns the pool runs it
//! (`inkfs_fuse::scrub`, `inkfs::Fs::scrub`) while it keeps serving; this
//! command asks for it, shows progress and reports (docs/FSCK.md, "Scrub").
//!
//! Exit codes, as fsck's: 0 nothing damaged, 4 damage found (scrub repairs
//! nothing; what it found went through the mount's errors= policy), 8
//! operational error (not an inkfs mount point, server not answering,
//! refused, stopped by an unmount), 16 usage error.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use inkfs_fuse::scrub::Outcome;

pub const EXIT_CLEAN: i32 = 0;
pub const EXIT_DAMAGE: i32 = 4;
pub const EXIT_OPERATIONAL: i32 = 8;
pub const EXIT_USAGE: i32 = 16;

const USAGE: &str = "usage: inkfs scrub MOUNTPOINT [--json] [-q|--quiet]";

struct Args {
    mountpoint: PathBuf,
    json: bool,
    quiet: bool,
}

fn parse(args: &[String]) -> Result<Args, String> {
    let mut mountpoint = None;
    let (mut json, mut quiet) = (false, false);
    for a in args {
        match a.as_str() {
            "--json" => json = true,
            "-q" | "--quiet" => quiet = true,
            "-h" | "--help" => return Err(String::new()),
            s if s.starts_with('-') => return Err(format!("unknown option '{s}'")),
            s if mountpoint.is_none() => mountpoint = Some(PathBuf::from(s)),
            s => return Err(format!("unexpected argument '{s}'")),
        }
    }
    Ok(Args {
        mountpoint: mountpoint.ok_or("which mount point?")?,
        json,
        quiet,
    })
}

pub fn scrub_main(args: &[String]) -> i32 {
    let a = match parse(args) {
        Ok(a) => a,
        Err(m) if m.is_empty() => {
            println!("{USAGE}");
            return EXIT_CLEAN;
        }
        Err(m) => {
            eprintln!("inkfs scrub: {m}\n{USAGE}");
            return EXIT_USAGE;
        }
    };
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
        Ok(outcome) => report(&a, &outcome, started.elapsed()),
        Err(m) => {
            if a.json {
                println!(
                    "{{\"mountpoint\":{},\"error\":{},\"exit_code\":{EXIT_OPERATIONAL}}}",
                    json_str(&a.mountpoint.display().to_string()),
                    json_str(&m)
                );
            }
            eprintln!("inkfs scrub: {}: {m}", a.mountpoint.display());
            EXIT_OPERATIONAL
        }
    }
}

fn report(a: &Args, o: &Outcome, elapsed: Duration) -> i32 {
    let code = if o.count("cancelled") != 0 {
        EXIT_OPERATIONAL
    } else if o.findings.is_empty() {
        EXIT_CLEAN
    } else {
        EXIT_DAMAGE
    };
    let mnt = a.mountpoint.display();
    if a.json {
        // The server's object, with what only the client knows in front.
        let rest = o.json.strip_prefix('{').unwrap_or("}");
        println!(
            "{{\"mountpoint\":{},\"exit_code\":{code},\"elapsed_s\":{:.3},{rest}",
            json_str(&mnt.to_string()),
            elapsed.as_secs_f64()
        );
        return code;
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

/// `s` as a JSON string literal, quotes included.
fn json_str(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}
