//! Shared helpers of the crash-consistency tests: a canonical snapshot of a
//! whole file system, consistency checks, and the crash-point driver.
#![allow(dead_code)]

use std::collections::HashSet;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use inkfs::pmem::{Pmem, SimPool};
use inkfs::types::*;
use inkfs::Fs;

pub const BLOCK: u64 = 4096;

pub fn opts(mode: Mode) -> MountOptions {
    MountOptions {
        mode,
        read_only: false,
        ..Default::default()
    }
}

/// A freshly formatted, mounted pool of `bytes` bytes (2 lanes).
pub fn fresh(mode: Mode, bytes: u64) -> Fs<SimPool> {
    let pm = SimPool::new(bytes);
    Fs::format(
        &pm,
        &FormatOptions {
            lanes: 2,
            ..Default::default()
        },
    )
    .expect("format");
    Fs::mount(pm, opts(mode)).expect("mount fresh pool")
}

// The snapshot, its diff, the file pattern and the image hash live in the
// library (shared with the crash-exploration suite).
#[allow(unused_imports)]
pub use inkfs::crashtest::snapshot::{diff, image_hash, pattern, snapshot, Node, Snap};

// ------------------------------------------------------------ comparisons

/// How a recovered state may relate to the states the operation passed
/// through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Exactly one of the checkpoint states (timestamps ignored).
    Exact,
    /// Exactly one of the checkpoint states, timestamps included.
    ExactWithTimes,
    /// Metadata of one checkpoint; each file byte from some checkpoint
    /// (in-place overwrites that are not atomic).
    DataMix,
}

/// Whether `found` is acceptable; `Err` explains why not.
pub fn matches(found: &Snap, states: &[Snap], expect: Expect) -> Result<usize, String> {
    match expect {
        Expect::Exact | Expect::ExactWithTimes => {
            let f = if expect == Expect::Exact {
                found.timeless()
            } else {
                found.clone()
            };
            for (i, s) in states.iter().enumerate() {
                let s = if expect == Expect::Exact {
                    s.timeless()
                } else {
                    s.clone()
                };
                if s == f {
                    return Ok(i);
                }
            }
            Err("state equals none of the expected states".into())
        }
        Expect::DataMix => {
            let fm = found.metadata();
            let Some(i) = states.iter().position(|s| s.metadata() == fm) else {
                return Err("metadata equals none of the expected states".into());
            };
            for (p, n) in &found.nodes {
                if n.kind != FileKind::File {
                    continue;
                }
                for (off, &b) in n.content.iter().enumerate() {
                    let ok = states.iter().any(|s| {
                        s.nodes
                            .get(p)
                            .map_or(b == 0, |m| m.content.get(off).copied().unwrap_or(0) == b)
                    });
                    if !ok {
                        return Err(format!("{p}: byte {off} = {b:#x} is in no expected state"));
                    }
                }
            }
            Ok(i)
        }
    }
}

// ------------------------------------------------------------- counting

pub static STATES: [AtomicU64; 3] = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];
pub static DISTINCT: [AtomicU64; 3] = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];

pub fn mode_index(m: Mode) -> usize {
    match m {
        Mode::Strict => 0,
        Mode::Sync => 1,
        Mode::Posix => 2,
    }
}

// -------------------------------------------------- checking a recovery

/// Everything that must hold for one crash image. Returns the index of the
/// matching state, or a failure description.
pub struct Ctx<'a> {
    pub mode: Mode,
    pub states: &'a [Snap],
    pub expect: Expect,
    /// Free blocks the live file system reported in each state (a
    /// recovered image must report one of them).
    pub free: &'a [u64],
    /// Log pages fast GC unlinked during the trace: a crash after an
    /// operation committed but before GC unlinked its dead pages recovers
    /// them still linked (garbage, not a leak), so up to this many fewer
    /// blocks free than the state had.
    pub free_slack: u64,
    pub check_free_matches_state: bool,
    /// The end of the trace must recover exactly the final state.
    pub final_durable: bool,
}

pub fn check_image(ctx: &Ctx<'_>, image: Vec<u8>) -> Result<usize, String> {
    let fs = Fs::mount(SimPool::from_image(image), opts(ctx.mode))
        .map_err(|e| format!("mount failed: {e:?}"))?;
    let snap = snapshot(&fs).map_err(|e| format!("inconsistent after recovery: {e}"))?;
    let which = matches(&snap, ctx.states, ctx.expect).map_err(|why| {
        let mut s = format!("{why}\n");
        for (i, st) in ctx.states.iter().enumerate() {
            let (a, b) = if ctx.expect == Expect::ExactWithTimes {
                (st.clone(), snap.clone())
            } else {
                (st.timeless(), snap.timeless())
            };
            write!(s, " diff from state {i} to recovered:\n{}", diff(&a, &b)).unwrap();
        }
        s
    })?;
    let free = fs.statfs().blocks_free;
    let free_ok = ctx
        .free
        .iter()
        .any(|&f| free <= f && f - free <= ctx.free_slack);
    if ctx.check_free_matches_state && !free_ok {
        return Err(format!(
            "recovered state {which} has {free} free blocks; the live file system had {:?}",
            ctx.free
        ));
    }
    // Clean unmount and remount: same state, same free space.
    let pm = fs
        .unmount()
        .map_err(|e| format!("unmount after recovery: {e:?}"))?;
    // fsck of the recovered, cleanly unmounted pool: no problem of any kind.
    let r = inkfs::fsck::check(&pm, &inkfs::fsck::FsckOptions::default())
        .map_err(|e| format!("fsck: {e}"))?;
    if !r.problems.is_empty() {
        return Err(format!("fsck after recovery: {:#?}", r.problems));
    }
    let fs = Fs::mount(pm, opts(ctx.mode)).map_err(|e| format!("clean remount failed: {e:?}"))?;
    if !fs.mount_report().allocator_restored {
        return Err("clean remount did not restore the allocator".into());
    }
    let again = snapshot(&fs).map_err(|e| format!("inconsistent after remount: {e}"))?;
    if again != snap {
        return Err(format!(
            "remount changed the state:\n{}",
            diff(&snap, &again)
        ));
    }
    let free2 = fs.statfs().blocks_free;
    if free2 != free {
        return Err(format!(
            "free blocks: {free} after recovery, {free2} after a clean remount"
        ));
    }
    usable(&fs, &snap)?;
    Ok(which)
}

/// The recovered file system accepts new work, and no file hides stale
/// bytes past its end (growing a file must show zeros).
pub fn usable(fs: &Fs<SimPool>, snap: &Snap) -> Result<(), String> {
    let data = pattern(10_000, 99);
    let (_, fh) = fs
        .create(1, b"__probe", 0o600, 0, 0)
        .map_err(|e| format!("create after recovery: {e:?}"))?;
    fs.write(&fh, 0, &data)
        .map_err(|e| format!("write after recovery: {e:?}"))?;
    fs.fsync(&fh, false).map_err(|e| format!("fsync: {e:?}"))?;
    let mut back = vec![0u8; 10_000];
    fs.read(&fh, 0, &mut back)
        .map_err(|e| format!("read after recovery: {e:?}"))?;
    fs.release(fh);
    if back != data {
        return Err("probe file reads back different data".into());
    }
    // Every file's tail page: zeros past the end once the file grows.
    for (p, n) in &snap.nodes {
        if n.kind != FileKind::File || n.size % BLOCK == 0 {
            continue;
        }
        let grown = (n.size / BLOCK + 1) * BLOCK;
        inkfs::crashtest::unpin(fs, n.ino, n.flags).map_err(|e| format!("chattr {p}: {e:?}"))?;
        fs.setattr(
            n.ino,
            &SetAttr {
                size: Some(grown),
                ..Default::default()
            },
        )
        .map_err(|e| format!("grow {p}: {e:?}"))?;
        let fh = fs.open(n.ino).map_err(|e| format!("open {p}: {e:?}"))?;
        let mut buf = vec![0u8; (grown - n.size) as usize];
        let r = fs.read(&fh, n.size, &mut buf);
        fs.release(fh);
        r.map_err(|e| format!("read {p}: {e:?}"))?;
        if let Some(i) = buf.iter().position(|&b| b != 0) {
            return Err(format!(
                "{p}: byte {} past the old end of file ({}) reads {:#x} after growing, not zero",
                n.size + i as u64,
                n.size,
                buf[i]
            ));
        }
    }
    fs.unlink(1, b"__probe")
        .map_err(|e| format!("unlink probe: {e:?}"))?;
    Ok(())
}

/// One failure, with what is needed to reproduce it.
pub struct Failure {
    pub point: usize,
    pub index: u64,
    pub seed: u64,
    pub description: String,
    pub why: String,
}

/// Run every crash point and image of `trace`; return failures and counts.
pub struct Sweep {
    pub failures: Vec<Failure>,
    pub checked: u64,
    pub distinct: u64,
}

pub fn sweep(trace: &inkfs::pmem::SimTrace, ctx: &Ctx<'_>, max_images: usize, seed: u64) -> Sweep {
    let mut seen: HashSet<u128> = HashSet::new();
    let mut out = Sweep {
        failures: Vec::new(),
        checked: 0,
        distinct: 0,
    };
    let points = trace.fence_count();
    // The end of the trace: durable on return, so only the final state.
    let last = ctx.states.len() - 1;
    let final_ctx = Ctx {
        mode: ctx.mode,
        states: &ctx.states[last..],
        expect: if ctx.expect == Expect::ExactWithTimes {
            Expect::ExactWithTimes
        } else {
            Expect::Exact
        },
        free: &ctx.free[last..],
        free_slack: 0,
        check_free_matches_state: ctx.check_free_matches_state,
        final_durable: true,
    };
    for point in 0..=points {
        let c = if point == points && ctx.final_durable {
            &final_ctx
        } else {
            ctx
        };
        if point == points {
            seen.clear();
        }
        for img in trace.crash_images(point, max_images, seed) {
            out.checked += 1;
            if !seen.insert(image_hash(&img.image)) {
                continue; // already checked (and any failure recorded)
            }
            out.distinct += 1;
            if let Err(why) = check_image(c, img.image) {
                out.failures.push(Failure {
                    point,
                    index: img.index,
                    seed: img.seed,
                    description: img.description,
                    why,
                });
            }
        }
    }
    let m = mode_index(ctx.mode);
    STATES[m].fetch_add(out.checked, Ordering::Relaxed);
    DISTINCT[m].fetch_add(out.distinct, Ordering::Relaxed);
    out
}

pub fn free_blocks(fs: &Fs<SimPool>) -> u64 {
    fs.statfs().blocks_free
}

/// Unused; keeps the Pmem trait import meaningful for helpers.
pub fn pool_size(fs: &Fs<SimPool>) -> u64 {
    fs.pmem().size_bytes()
}
