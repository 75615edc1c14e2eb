//! `inkfs fsck POOL [-y|--repair] [-n] [--json] [-q] [--progress]`: check a
//! pool, and with -y repair what is safely repairable (docs/FSCK.md).
//!
//! Exit codes follow e2fsck: 0 clean, 1 errors corrected, 4 errors left
//! uncorrected, 8 operational error (cannot open, not an inkfs pool, repair
//! of a pool that another process has open refused), 16 usage error (given
//! by the argument parser: `usage::refuse`).

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use inkfs::fsck::{self, FsckOptions, FsckReport, Progress, Severity};
use inkfs::pmem::{MappedPool, PoolBusy, PoolFile, PoolOpenOptions};
use serde_json::json;

use crate::state::{holders_json, pool_state, PoolState};

pub const EXIT_OPERATIONAL: i32 = 8;

const EXIT_CODES_HELP: &str = "\
Exit status, as e2fsck's:
  0   no errors (notes may have been printed, or acted on with -y)
  1   errors were found and all of them were corrected
  4   errors were left uncorrected (every error, without -y)
  8   operational error: cannot open the pool, not an inkfs pool, or -y on a
      pool that another process has open
  16  usage error (an unknown flag, a missing or extra argument); --help
      exits 0";

/// Check a pool; with -y, repair what is safely repairable
///
/// Without -y the check is read-only: the pool is mapped read-only and
/// nothing is written; a pool that a mount has open is checked too (with a
/// warning: it changes while it is read). -y needs the pool to itself.
/// docs/FSCK.md lists what is checked and what is repaired.
#[derive(clap::Args, Debug)]
#[command(after_help = EXIT_CODES_HELP)]
pub struct FsckArgs {
    /// The pool: a file or a DAX device
    pub pool: PathBuf,
    /// Repair what is safely repairable
    #[arg(
        short = 'y',
        long = "repair",
        visible_alias = "yes",
        overrides_with = "_no"
    )]
    pub repair: bool,
    /// Check only, change nothing: the default (the last of -y and -n wins)
    #[arg(short = 'n', long = "no", overrides_with = "repair")]
    _no: bool,
    /// Print one JSON object (for scripts)
    #[arg(long)]
    pub json: bool,
    /// Print only problems that are errors (no notes, no summary, no
    /// progress)
    #[arg(short, long)]
    pub quiet: bool,
    /// Show progress on stderr also when it is not a terminal (after the
    /// first second)
    #[arg(long)]
    pub progress: bool,
    /// Accepted for e2fsck's "check even if clean": inkfs always checks in
    /// full
    #[arg(short = 'f', long = "force")]
    _force: bool,
    /// Hybrid pools: the data device or file, when not at the path
    /// recorded by mkfs
    #[arg(long, value_name = "PATH")]
    pub data: Option<PathBuf>,
}

/// `inkfs fsck ...`; returns the exit status.
pub fn fsck_main(a: &FsckArgs) -> i32 {
    match run(a) {
        Ok(code) => code,
        Err(m) => {
            if a.json {
                let v = json!({
                    "pool": a.pool.display().to_string(),
                    "error": m,
                    "exit_code": EXIT_OPERATIONAL,
                });
                println!("{v}");
            }
            eprintln!("inkfs fsck: {}: {m}", a.pool.display());
            EXIT_OPERATIONAL
        }
    }
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

/// Open the pool for the check: claimed exclusively for a repair (refused
/// while anything else has it open), shared for a read-only check. A
/// read-only check of a pool that a read-write holder has is allowed
/// without a claim, and says so: the pool changes while it is read.
fn open_for_check(path: &Path, repair: bool) -> Result<(MappedPool, Option<PoolBusy>), String> {
    let opts = PoolOpenOptions {
        create_size_bytes: None,
        read_only: !repair,
    };
    match MappedPool::open(path, &opts) {
        Ok(pm) => Ok((pm, None)),
        Err(e) => match PoolBusy::of(&e) {
            Some(busy) if repair => Err(format!(
                "{busy}; refusing to repair it (unmount it, or let that process finish, first)"
            )),
            Some(busy) => {
                let busy = busy.clone();
                let pm = PoolFile::open_unlocked(path)
                    .and_then(|f| MappedPool::map(f, &opts))
                    .map_err(|e| e.to_string())?;
                Ok((pm, Some(busy)))
            }
            None => Err(e.to_string()),
        },
    }
}

fn run(a: &FsckArgs) -> Result<i32, String> {
    let path = &a.pool;
    std::fs::metadata(path).map_err(|e| e.to_string())?;
    // Held for the whole check: no mount can start meanwhile.
    let (pm, in_use) = open_for_check(path, a.repair)?;
    if let Some(busy) = &in_use {
        eprintln!(
            "inkfs fsck: warning: {}: {busy}; checking it while it changes, so the results \
             may be inconsistent",
            path.display()
        );
    }
    let mut bar = Bar {
        start: Instant::now(),
        last: None,
        enabled: !a.quiet && (a.progress || std::io::stderr().is_terminal()),
        tty: std::io::stderr().is_terminal(),
    };
    let started = Instant::now();
    let result = fsck::check_with_progress(
        &pm,
        &FsckOptions {
            repair: a.repair,
            data: a.data.clone().map(inkfs::api::DataDevice::Path),
        },
        &mut |p| bar.update(p),
    );
    bar.finish();
    let report = result.map_err(|e| e.to_string())?;
    let elapsed = started.elapsed();
    // The superblock's state as found before the check (a repair may mount
    // and cleanly unmount the pool).
    let state = pool_state(report.was_clean, in_use.as_ref());
    if a.json {
        println!(
            "{}",
            json_report(path, &report, a.repair, &state, in_use.as_ref())
        );
    } else {
        print_human(path, &report, a, &state, in_use.is_some(), elapsed);
    }
    Ok(report.exit_code())
}

fn print_human(
    path: &Path,
    r: &FsckReport,
    a: &FsckArgs,
    state: &PoolState,
    in_use: bool,
    elapsed: Duration,
) {
    let mut out = std::io::stdout().lock();
    if !a.quiet || in_use {
        let _ = writeln!(out, "{}: state: {}", path.display(), state.text);
    }
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
    if r.data_blocks_total > 0 {
        let _ = writeln!(
            out,
            "{}: data device blocks: {} used, {} free, {} total",
            path.display(),
            r.data_blocks_used,
            r.data_blocks_total - r.data_blocks_used,
            r.data_blocks_total
        );
    }
    let found = r.errors_found();
    let verdict = if found == 0 {
        "no errors found".to_string()
    } else if a.repair {
        format!(
            "{found} error(s) found, {} fixed, {} left",
            r.errors_fixed(),
            r.errors_remaining
        )
    } else {
        format!("{found} error(s) found, none fixed (run with -y to repair)")
    };
    let caveat = if in_use {
        "; checked while in use by another process, so it may be inconsistent"
    } else {
        ""
    };
    let _ = writeln!(
        out,
        "{}: {verdict} ({:.2} s){caveat}",
        path.display(),
        elapsed.as_secs_f64()
    );
}

fn json_report(
    path: &Path,
    r: &FsckReport,
    repair: bool,
    state: &PoolState,
    in_use: Option<&PoolBusy>,
) -> serde_json::Value {
    let problems: Vec<serde_json::Value> = r
        .problems
        .iter()
        .map(|p| {
            json!({
                "kind": p.kind.name(),
                "severity": if p.severity == Severity::Error { "error" } else { "note" },
                "inode": p.ino,
                "message": p.message,
                "repairable": p.repairable,
                "repaired": p.repaired,
            })
        })
        .collect();
    json!({
        "pool": path.display().to_string(),
        "clean": r.errors_remaining == 0,
        "was_clean": r.was_clean,
        "state": state.word,
        "state_text": state.text,
        // Kept for scripts: true when a read-write holder had the pool.
        "mounted": in_use.is_some_and(|b| b.exclusive),
        "checked_while_in_use": in_use.is_some(),
        "holders": holders_json(in_use),
        "repair": repair,
        "modified": r.modified,
        "inodes_checked": r.inodes_checked,
        "directories": r.directories,
        "files": r.files,
        "symlinks": r.symlinks,
        "other": r.other,
        "orphans": r.orphans,
        "blocks_total": r.blocks_total,
        "blocks_used": r.blocks_used,
        "data_blocks_total": r.data_blocks_total,
        "data_blocks_used": r.data_blocks_used,
        "blocks_free": r.blocks_free,
        "errors_found": r.errors_found(),
        "errors_fixed": r.errors_fixed(),
        "errors_remaining": r.errors_remaining,
        "exit_code": r.exit_code(),
        "problems": problems,
    })
}
