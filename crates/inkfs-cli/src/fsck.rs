//! `inkfs fsck POOL [-y|--repair] [-n] [--json] [-q] [--progress]`: check a
//! pool, and with -y repair what is safely repairable (docs/FSCK.md).
//!
//! Exit codes follow e2fsck: 0 clean, 1 errors corrected, 4 errors left
//! uncorrected, 8 operational error (cannot open, not an inkfs pool, repair
//! of a mounted pool refused), 16 usage error.

use std::io::{IsTerminal, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use inkfs::fsck::{self, FsckOptions, FsckReport, Progress, Severity};
use inkfs::pmem::{MappedPool, PoolOpenOptions};

pub const EXIT_OPERATIONAL: i32 = 8;
pub const EXIT_USAGE: i32 = 16;

const USAGE: &str = "usage: inkfs fsck POOL [-y|--repair] [-n] [--json] [-q] [--progress]";

struct Args {
    pool: PathBuf,
    repair: bool,
    json: bool,
    quiet: bool,
    progress: bool,
}

fn parse(args: &[String]) -> Result<Args, String> {
    let mut pool = None;
    let (mut repair, mut json, mut quiet, mut progress) = (false, false, false, false);
    for a in args {
        match a.as_str() {
            "-y" | "--repair" | "--yes" => repair = true,
            "-n" | "--no" => repair = false,
            "--json" => json = true,
            "-q" | "--quiet" => quiet = true,
            "--progress" => progress = true,
            // e2fsck's "check even if clean": inkfs always checks.
            "-f" | "--force" => {}
            "-h" | "--help" => return Err(String::new()),
            s if s.starts_with('-') => return Err(format!("unknown option '{s}'")),
            s if pool.is_none() => pool = Some(PathBuf::from(s)),
            s => return Err(format!("unexpected argument '{s}'")),
        }
    }
    Ok(Args {
        pool: pool.ok_or("which pool?")?,
        repair,
        json,
        quiet,
        progress,
    })
}

pub fn fsck_main(args: &[String]) -> i32 {
    let a = match parse(args) {
        Ok(a) => a,
        Err(m) if m.is_empty() => {
            println!("{USAGE}");
            return 0;
        }
        Err(m) => {
            eprintln!("inkfs fsck: {m}\n{USAGE}");
            return EXIT_USAGE;
        }
    };
    match run(&a) {
        Ok(code) => code,
        Err(m) => {
            if a.json {
                println!(
                    "{{\"pool\":{},\"error\":{},\"exit_code\":{EXIT_OPERATIONAL}}}",
                    json_str(&a.pool.display().to_string()),
                    json_str(&m)
                );
            }
            eprintln!("inkfs fsck: {}: {m}", a.pool.display());
            EXIT_OPERATIONAL
        }
    }
}

/// The lock file `inkfs mount` holds for `pool` (see inkfs_fuse::mount::PoolLock).
fn lock_path(pool: &Path) -> Result<PathBuf, String> {
    let meta = std::fs::metadata(pool).map_err(|e| e.to_string())?;
    let ft = meta.mode() & libc::S_IFMT;
    let key = if ft == libc::S_IFCHR || ft == libc::S_IFBLK {
        format!("rdev-{:x}", meta.rdev())
    } else {
        format!("{:x}-{:x}", meta.dev(), meta.ino())
    };
    Ok(inkfs_fuse::mount::run_dir().join(format!("pool-{key}.lock")))
}

/// Whether a FUSE server holds the pool: a shared, non-blocking flock on
/// its lock file fails while the server's exclusive one is held.
fn is_mounted(pool: &Path) -> Result<Option<String>, String> {
    let path = lock_path(pool)?;
    let file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    // SAFETY: flock on a descriptor we own; no memory is involved.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
    if rc == 0 {
        // SAFETY: as above.
        unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) };
        return Ok(None);
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
        return Err(format!("locking {}: {e}", path.display()));
    }
    let holder = std::fs::read_to_string(&path).unwrap_or_default();
    let mut words = holder.split_whitespace();
    Ok(Some(match (words.next(), words.collect::<Vec<_>>()) {
        (Some(pid), mnt) if !mnt.is_empty() => format!("by pid {pid} on {}", mnt.join(" ")),
        (Some(pid), _) => format!("by pid {pid}"),
        _ => "by another process".into(),
    }))
}

/// A progress bar on stderr, drawn once the check has run for a second.
struct Bar {
    start: Instant,
    last: Option<Instant>,
    enabled: bool,
    tty: bool,
}

impl Bar {
    fn update(&mut self, p: Progress) {
        if !self.enabled || self.start.elapsed() < Duration::from_secs(1) {
            return;
        }
        let now = Instant::now();
        if p.done < p.total
            && self
                .last
                .is_some_and(|l| now - l < Duration::from_millis(100))
        {
            return;
        }
        self.last = Some(now);
        let frac = if p.total == 0 {
            1.0
        } else {
            p.done as f64 / p.total as f64
        };
        let width = 30;
        let filled = ((frac * width as f64) as usize).min(width);
        let mut err = std::io::stderr().lock();
        let _ = write!(
            err,
            "\rinkfs fsck: {:<6} [{}{}] {:3.0}% ({}/{} inode slots)",
            p.phase,
            "#".repeat(filled),
            "-".repeat(width - filled),
            frac * 100.0,
            p.done,
            p.total
        );
        if !self.tty {
            let _ = writeln!(err);
        }
        let _ = err.flush();
    }

    fn finish(&self) {
        if self.last.is_some() && self.tty {
            eprint!("\r\x1b[K");
        }
    }
}

fn run(a: &Args) -> Result<i32, String> {
    let path = &a.pool;
    std::fs::metadata(path).map_err(|e| e.to_string())?;
    let mounted = is_mounted(path)?;
    // Held for the whole repair, so no mount can start meanwhile.
    let _lock = if a.repair {
        if let Some(by) = &mounted {
            return Err(format!(
                "the pool is mounted ({by}); refusing to repair it (unmount it first)"
            ));
        }
        Some(
            inkfs_fuse::mount::PoolLock::acquire(path)
                .map_err(|e| format!("{e}; refusing to repair a mounted pool"))?,
        )
    } else {
        if let Some(by) = &mounted {
            eprintln!(
                "inkfs fsck: warning: {} is mounted ({by}); it changes while being checked, \
                 so the results may be inconsistent",
                path.display()
            );
        }
        None
    };
    let pm = MappedPool::open(
        path,
        &PoolOpenOptions {
            create_size_bytes: None,
            read_only: !a.repair,
        },
    )
    .map_err(|e| e.to_string())?;
    let mut bar = Bar {
        start: Instant::now(),
        last: None,
        enabled: !a.quiet && (a.progress || std::io::stderr().is_terminal()),
        tty: std::io::stderr().is_terminal(),
    };
    let started = Instant::now();
    let result = fsck::check_with_progress(&pm, &FsckOptions { repair: a.repair }, &mut |p| {
        bar.update(p)
    });
    bar.finish();
    let report = result.map_err(|e| e.to_string())?;
    let elapsed = started.elapsed();
    if a.json {
        println!(
            "{}",
            json_report(path, &report, a.repair, mounted.is_some())
        );
    } else {
        print_human(path, &report, a, elapsed);
    }
    Ok(report.exit_code())
}

fn print_human(path: &Path, r: &FsckReport, a: &Args, elapsed: Duration) {
    let mut out = std::io::stdout().lock();
    for p in &r.problems {
        if a.quiet && p.severity == Severity::Note {
            continue;
        }
        let status = match (p.severity, a.repair, p.repairable, p.repaired) {
            (Severity::Note, _, _, true) => " [done]",
            (Severity::Note, _, _, false) => "",
            (_, _, _, true) => " [fixed]",
            (_, true, _, false) => " [not fixed]",
            (_, false, true, _) => " [fixable with -y]",
            (_, false, false, _) => "",
        };
        let sev = if p.severity == Severity::Error {
            "error: "
        } else {
            ""
        };
        let _ = writeln!(out, "{sev}{p}{status}");
    }
    if a.quiet {
        return;
    }
    let _ = writeln!(
        out,
        "{}: {} inodes checked ({} directories, {} files, {} symlinks, {} other, {} orphans)",
        path.display(),
        r.inodes_checked,
        r.directories,
        r.files,
        r.symlinks,
        r.other,
        r.orphans
    );
    let _ = writeln!(
        out,
        "{}: data blocks: {} used, {} free, {} total",
        path.display(),
        r.blocks_used,
        r.blocks_free,
        r.blocks_total
    );
    let found = r.errors_found();
    let verdict = if found == 0 {
        "clean".to_string()
    } else if a.repair {
        format!(
            "{found} error(s) found, {} fixed, {} left",
            r.errors_fixed(),
            r.errors_remaining
        )
    } else {
        format!("{found} error(s) found, none fixed (run with -y to repair)")
    };
    let _ = writeln!(
        out,
        "{}: {verdict} ({:.2} s)",
        path.display(),
        elapsed.as_secs_f64()
    );
}

fn json_report(path: &Path, r: &FsckReport, repair: bool, mounted: bool) -> String {
    let problems: Vec<String> = r
        .problems
        .iter()
        .map(|p| {
            format!(
                "{{\"kind\":{},\"severity\":{},\"inode\":{},\"message\":{},\"repairable\":{},\"repaired\":{}}}",
                json_str(p.kind.name()),
                json_str(if p.severity == Severity::Error { "error" } else { "note" }),
                p.ino.map_or("null".to_string(), |i| i.to_string()),
                json_str(&p.message),
                p.repairable,
                p.repaired
            )
        })
        .collect();
    format!(
        "{{\"pool\":{},\"clean\":{},\"was_clean\":{},\"mounted\":{mounted},\"repair\":{repair},\"modified\":{},\"inodes_checked\":{},\"directories\":{},\"files\":{},\"symlinks\":{},\"other\":{},\"orphans\":{},\"blocks_total\":{},\"blocks_used\":{},\"blocks_free\":{},\"errors_found\":{},\"errors_fixed\":{},\"errors_remaining\":{},\"exit_code\":{},\"problems\":[{}]}}",
        json_str(&path.display().to_string()),
        r.errors_remaining == 0,
        r.was_clean,
        r.modified,
        r.inodes_checked,
        r.directories,
        r.files,
        r.symlinks,
        r.other,
        r.orphans,
        r.blocks_total,
        r.blocks_used,
        r.blocks_free,
        r.errors_found(),
        r.errors_fixed(),
        r.errors_remaining,
        r.exit_code(),
        problems.join(",")
    )
}

fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
