//! Deferred tails under the crash simulator (blockdev/deferred.rs;
//! docs/CRASHTEST.md, "Deferred posix appends").
//!
//! A hybrid pool in posix mode, written as the FUSE mount writes it back:
//! appends to fresh device blocks through `Fs::write_deferring` (their
//! tails left for a round), with other commits to the same inode in
//! between, each of which must settle the pending tail first (a chmod, a
//! link, a truncate that frees blocks later appends reuse, an fsync), and
//! a write-back of the file's times that joins the deferred commits, and
//! rounds (`Fs::commit_deferred`, the mount's flusher) that acknowledge
//! what was deferred before them. Crash images at every fence and every
//! device flush (the simulated device loses each write not yet flushed),
//! each checked: fsck finds no error; recovery mounts it; the file is the
//! state after some step between the last acknowledged one (a round, or
//! an operation durable on return) and the step in flight, so every byte
//! is one it was given or past its size, and nothing acknowledged is
//! lost; after a clean unmount fsck reports nothing at all.

use super::lease::{fsck, points_of, read_all};
use super::workload::{base_image_for, mount_options, pool_of};
use crate::format::BLOCK_SIZE;
use crate::fs::{FileHandle, Fs};
use crate::perm::Actor;
use crate::pmem::SimPool;
use crate::types::{Mode, SetAttr, TimeSet};

/// One step of the sequence.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// Two pages of this byte at the end of file, deferred.
    Append(u8),
    /// The flusher's round: everything deferred before it is durable.
    Round,
    Chmod(u32),
    /// A second name for the file (its LINK_CHANGE commits its tail
    /// through the journal).
    Link,
    /// Shrink to this many pages: frees device blocks the next appends
    /// may take again.
    Truncate(u64),
    Fsync,
    /// The times a kernel writes back between write-backs: on a file with
    /// a deferred tail, committed with it by the next round.
    Touch,
}

use Step::*;

const STEPS: &[Step] = &[
    Append(1),
    Append(2),
    Chmod(0o600),
    Append(3),
    Link,
    Append(4),
    Round,
    Append(5),
    Truncate(5),
    Append(6),
    Fsync,
    Append(7),
    Touch,
    Append(8),
    Round,
    Append(9),
];

/// Pages per append (a page or more goes to the device in the crash-test
/// pool: `workload::HYBRID_THRESHOLD`).
const APPEND_PAGES: u64 = 2;

/// What one exploration found.
#[derive(Debug, Default)]
pub struct DeferredReport {
    /// Crash images checked.
    pub states: u64,
    /// Crash points (fences and device flushes).
    pub points: u64,
    /// Commits the engine deferred (every `Append` and `Touch` must be).
    pub deferred: u64,
    /// Pending tails a settle stored (another commit to the inode first).
    pub settles: u64,
    pub violations: Vec<String>,
}

/// One traced step: its fences, and the oldest state a crash in it may
/// leave (the last acknowledged one).
struct Traced {
    fences: (usize, usize),
    oldest: usize,
}

/// Run the sequence once and check up to `max_images` images per crash
/// point.
pub fn explore_deferred(max_images: usize, seed: u64) -> DeferredReport {
    let mut report = DeferredReport::default();
    if let Err(e) = run(max_images, seed, &mut report) {
        report.violations.push(e);
    }
    report
}

fn run(max_images: usize, seed: u64, report: &mut DeferredReport) -> Result<(), String> {
    let e = |what: &'static str| move |err: crate::Error| format!("{what}: {err}");
    let pm = pool_of(base_image_for(true));
    let opts = mount_options(&pm, Mode::Posix);
    let fs = Fs::mount(pm, opts).map_err(e("mount"))?;
    let (attr, fh) = fs.create(1, b"d", 0o644, 0, 0).map_err(e("create"))?;
    fs.fsync(&fh, false).map_err(e("fsync"))?;
    let ino = attr.ino;

    // states[i]: the file after i steps.
    let mut states = vec![Vec::new()];
    let mut traced = Vec::new();
    let mut oldest = 0;
    fs.pmem().start_trace();
    let f0 = fs.pmem().fence_count();
    let fences = || (fs.pmem().fence_count() - f0) as usize;
    for (i, &step) in STEPS.iter().enumerate() {
        let start = fences();
        let mut now = states[i].clone();
        let acknowledged = apply(&fs, &fh, ino, step, &mut now, report)
            .map_err(|err| format!("step {i} {step:?}: {err}"))?;
        states.push(now);
        traced.push(Traced {
            fences: (start, fences()),
            oldest,
        });
        if acknowledged {
            oldest = i + 1;
        }
    }
    let trace = fs.pmem().stop_trace();
    if let Some(d) = fs.data_stats() {
        report.settles = d.deferred_settles;
    }
    fs.release(fh);

    let last = traced.len() - 1;
    for (i, t) in traced.iter().enumerate() {
        for point in points_of(t.fences, i == last, trace.fence_count()) {
            report.points += 1;
            // Step i in flight: the state before it, back to the last
            // acknowledged one, or after it.
            let allowed = &states[t.oldest..=i + 1];
            for img in trace.crash_images(point, max_images, seed) {
                report.states += 1;
                if let Err(why) = check_image(img.image, ino, allowed) {
                    report.violations.push(format!(
                        "step {i} {:?}, {}: {why}",
                        STEPS[i], img.description
                    ));
                    if report.violations.len() >= 10 {
                        return Ok(());
                    }
                }
            }
        }
    }
    Ok(())
}

/// Apply `step` to the engine and to `model`; true when the step
/// acknowledges everything before it (durable on return).
fn apply(
    fs: &Fs<SimPool>,
    fh: &FileHandle,
    ino: u64,
    step: Step,
    model: &mut Vec<u8>,
    report: &mut DeferredReport,
) -> Result<bool, String> {
    let e = |err: crate::Error| err.to_string();
    match step {
        Append(b) => {
            let data = vec![b; (APPEND_PAGES * BLOCK_SIZE) as usize];
            let pending = fs
                .write_deferring(fh, model.len() as u64, &data, false)
                .map_err(e)?;
            if !pending {
                return Err("an append to fresh device blocks was not deferred".into());
            }
            report.deferred += 1;
            model.extend_from_slice(&data);
            Ok(false)
        }
        Round => fs.commit_deferred().map(|()| true).map_err(e),
        Chmod(mode) => {
            let set = SetAttr {
                mode: Some(mode),
                ..Default::default()
            };
            fs.setattr(ino, &set).map(|_| true).map_err(e)
        }
        Link => fs.link(ino, 1, b"d2").map(|_| true).map_err(e),
        Truncate(pages) => {
            let size = pages * BLOCK_SIZE;
            let set = SetAttr {
                size: Some(size),
                ..Default::default()
            };
            fs.setattr(ino, &set).map_err(e)?;
            model.truncate(size as usize);
            Ok(true)
        }
        Fsync => fs.fsync(fh, false).map(|()| true).map_err(e),
        Touch => {
            let set = SetAttr {
                mtime: Some(TimeSet::At(1_000_000_000)),
                ..Default::default()
            };
            let kernel = Some(crate::fs::KernelTimes { ctime: None });
            let (_, deferred) = fs
                .setattr_times_deferring(Actor::Engine, ino, &set, kernel)
                .map_err(e)?;
            if !deferred {
                return Err("the times of a file with a deferred tail were not deferred".into());
            }
            report.deferred += 1;
            Ok(false)
        }
    }
}

/// One crash image: fsck, recovery, the file one of `allowed`, a clean
/// unmount that fsck finds perfect.
fn check_image(image: Vec<u8>, ino: u64, allowed: &[Vec<u8>]) -> Result<(), String> {
    let pm = pool_of(image);
    fsck(&pm, false)?;
    let opts = mount_options(&pm, Mode::Posix);
    let fs = Fs::mount(pm, opts).map_err(|e| format!("recovery: {e}"))?;
    let got = read_all(&fs, ino)?;
    if !allowed.contains(&got) {
        let first_wrong = allowed
            .iter()
            .filter_map(|s| got.iter().zip(s).position(|(a, b)| a != b))
            .max();
        return Err(format!(
            "the file has {} bytes (first differing byte at {first_wrong:?}): none of the \
             allowed states ({:?} bytes)",
            got.len(),
            allowed.iter().map(Vec::len).collect::<Vec<_>>()
        ));
    }
    let pm = fs.unmount().map_err(|e| format!("unmount: {e}"))?;
    fsck(&pm, true)
}
