//! fsck: check a pool against the invariants docs/FORMAT.md states, and
//! repair what can be repaired safely (docs/FSCK.md).
//!
//! The check only reads media. It looks at the pool as the next mount would
//! see it: a committed but unapplied journal transaction is applied in DRAM
//! (an overlay on the inode records), not on media. Every walk is bounded
//! (log walks by `log::walk`, table chains by a visited set, the namespace
//! by a visited set of directories).
//!
//! Repair (`FsckOptions::repair`) runs in two steps. Media-level fixes
//! first: a damaged superblock copy is rewritten from the good one, pending
//! journals are replayed or discarded. Then, if anything else needs fixing
//! and nothing unrepairable was found, the pool is mounted read-write with
//! its free-list save areas invalidated (so the mount rebuilds the
//! allocator by scanning, which also frees orphans), the namespace fixes go
//! through the engine's normal commit paths (log entries committed by a tail
//! store or the journal), and a clean unmount saves fresh free lists. A
//! second check then tells what is left. Last, the superblock's record of
//! errors met while mounted is cleared if that check found nothing else.
//!
//! The pieces, one file each:
//! - `report.rs`: what fsck tells its caller: `Problem`, `ProblemKind`,
//!   `Severity`, `Progress`, `FsckReport` and its exit code;
//! - `check.rs`: the read-only check's state (`Checker`) and its first
//!   passes: superblocks, the error record, inode tables, journals;
//! - `inodes.rs`: the inode scan: records, logs, flags, readdir positions,
//!   the blocks each inode uses and bytes mapped past its end of file;
//! - `namespace.rs`: the walk from the root: dangling entries, directories
//!   named twice, unreachable inodes, link counts, "..";
//! - `free_lists.rs`: on a clean pool, the saved free lists against what
//!   is in use;
//! - `device.rs`: a hybrid pool's data device: its identity, and on a
//!   clean pool its saved free list against the device blocks in use;
//! - `repair.rs`: the fixes the check proposes and how they are applied
//!   (on media directly, or through a repair mount of the engine).
//!
//! The check never writes and the repair never decides what is wrong: the
//! check's findings carry their fix, and this file's driver applies them
//! between a first check and a verifying one.

mod check;
mod device;
mod free_lists;
mod inodes;
mod namespace;
mod repair;
mod report;

use crate::error::Result;
use crate::pmem::Pmem;
use check::Checker;
use repair::Fix;

pub use report::{FsckReport, Problem, ProblemKind, Progress, Severity};

/// What fsck may do.
#[derive(Clone, Debug, Default)]
pub struct FsckOptions {
    /// Repair what is safely repairable (`inkfs fsck -y`).
    pub repair: bool,
    /// Hybrid pools: the data device, when not at the path recorded at
    /// mkfs (`inkfs fsck --data PATH`), or already open.
    pub data: Option<crate::types::DataDevice>,
}

/// Check `pm` (and repair it if asked). `Err` only when there is nothing
/// to check: neither superblock copy is usable.
pub fn check<P: Pmem>(pm: &P, opts: &FsckOptions) -> Result<FsckReport> {
    check_with_progress(pm, opts, &mut |_| {})
}

/// `check`, reporting progress of the inode scan.
pub fn check_with_progress<P: Pmem>(
    pm: &P,
    opts: &FsckOptions,
    progress: &mut dyn FnMut(Progress),
) -> Result<FsckReport> {
    let mut first = Checker::run(pm, opts.data.as_ref(), "check", progress)?;
    let mut report = first.report();
    if !opts.repair {
        report.errors_remaining = report.errors_found();
        return Ok(report);
    }
    let fixes: Vec<(usize, Fix)> = first
        .found
        .iter()
        .enumerate()
        .filter_map(|(i, f)| f.fix.clone().map(|x| (i, x)))
        .collect();
    if fixes.is_empty() {
        report.errors_remaining = report.errors_found();
        return Ok(report);
    }
    let blocked = first.found.iter().any(|f| f.blocking());
    // The check's read-only handle of the data device holds a shared lock
    // that the repairs' read-write open (exclusive) would find taken.
    first.dev = None;

    repair::apply_media_fixes(
        pm,
        &first.geo,
        &first.table_blocks,
        &fixes,
        blocked,
        &mut report,
    );
    repair::apply_device_fixes(
        pm,
        &first.sb,
        opts.data.as_ref(),
        &fixes,
        blocked,
        &mut report,
    );
    let fs_fixes: Vec<(usize, Fix)> = fixes.into_iter().filter(|(_, f)| f.needs_mount()).collect();
    if !fs_fixes.is_empty() {
        repair::apply_mounted_fixes(pm, opts.data.clone(), &fs_fixes, blocked, &mut report);
    }

    // What is left.
    let second = Checker::run(pm, opts.data.as_ref(), "verify", progress)?;
    let mut after = second.report();
    repair::settle_error_record(pm, &mut report, &mut after)?;
    let same = |a: &Problem, b: &Problem| a.kind == b.kind && a.ino == b.ino;
    for p in report.problems.iter_mut() {
        if p.repaired && after.errors().any(|q| same(p, q) && q.message == p.message) {
            p.repaired = false;
        }
    }
    let before = report.problems.clone();
    for q in after.errors() {
        if !before.iter().any(|p| same(p, q) && !p.repaired) {
            let mut q = q.clone();
            q.message = format!("after repair: {}", q.message);
            report.problems.push(q);
        }
    }
    report.errors_remaining = after.errors_found();
    Ok(report)
}
