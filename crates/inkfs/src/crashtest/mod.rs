//! Crash exploration: every workload of one and two operations, and of
//! write–fsync–anything ([`workload`], ACE style) over a small fixed
//! namespace, run in each consistency mode on the crash simulator
//! ([`SimPool`]); at every fence of the workload, crash images are
//! produced, recovered, checked (internal consistency, [`crate::fsck`] of
//! the crash image and of the recovered pool, a clean remount, the mode's
//! promise: [`expect`]) and counted.
//!
//! Used by the test `tests/crash_explore.rs` (a fixed CI budget) and by
//! `inkfs crashtest` (any budget, one workload, one mode, reproduction).
//!
//! How the budget is spent: runs (workload × mode) go in a fixed order,
//! all one-operation workloads first, then the longer ones in an order
//! shuffled by the seed. Each run checks every crash point of its last
//! operation (the crash points of the operations before it are those of
//! the shorter workload they form, which is in the catalogue too) and the
//! end of the trace. The run's share is the budget left
//! divided by the runs left; it is water-filled over the run's points
//! (each gets at least one image and at most `max_images_per_point` or as
//! many as it has; what a point cannot use goes to the others), or every
//! point gets exactly `images` when that is set. Images
//! are sampled from the seed when a point has more possible images than
//! `k` (the first two being "nothing pending persisted" and "everything
//! persisted"), all of them otherwise. Identical images of one run are
//! checked once; the count of states is of distinct images checked. The
//! exploration stops when the budget is spent.
//!
//! A violation names the workload, mode, crash point, image index and the
//! images per point; `inkfs crashtest --workload W --mode M --seed S
//! --images K` rebuilds exactly those images.

pub mod deferred;
pub mod expect;
pub mod lease;
pub mod nslease;
pub mod reap;
pub mod snapshot;
pub mod workload;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::fs::Fs;
use crate::pmem::{Pmem, SimPool, SimTrace};

use crate::testkit::Rng;
use crate::types::*;

use expect::{OpRecord, Point};
use snapshot::{image_hash, snapshot, Snap};
use workload::{Workload, OPS};

/// What to explore.
#[derive(Clone, Debug)]
pub struct CrashTestOptions {
    /// Crash states (distinct recovered images) to check at most: the
    /// exploration stops at this count, with `images` set or not.
    pub states_budget: u64,
    pub seed: u64,
    pub modes: Vec<Mode>,
    /// Upper bound of images per crash point when the budget decides.
    pub max_images_per_point: usize,
    /// Exactly this many images per crash point (reproduction) instead of
    /// the budget's share; `states_budget` still caps the total.
    pub images: Option<usize>,
    /// Only the workload of this name (`op` or `op1+op2`), or, if no
    /// workload has that name, the workloads whose name contains it.
    pub filter: Option<String>,
    /// Record a version per 8-byte word instead of per store, so crash
    /// images also hold torn multi-word stores (`SimPool::set_torn_stores`).
    pub torn_stores: bool,
    /// After each recovery also unmount, remount cleanly, compare, and run
    /// a probe write (slower, finds allocator and save-area bugs).
    pub deep: bool,
    /// Explore hybrid pools: the workloads' large writes go to a simulated
    /// data device that loses (or keeps, line by line) every write not yet
    /// flushed (`workload::base_image_for`).
    pub hybrid: bool,
    /// Run the workloads with a client of the kernel-free path attached (a
    /// claimed slot of a shared epoch table): an inode's last unlink then
    /// commits it ORPHAN and frees it after (holds.rs).
    pub clients: bool,
}

impl Default for CrashTestOptions {
    fn default() -> Self {
        CrashTestOptions {
            states_budget: 20_000,
            seed: 0xACE,
            modes: vec![Mode::Strict, Mode::Sync, Mode::Posix],
            max_images_per_point: 64,
            images: None,
            filter: None,
            torn_stores: false,
            deep: true,
            hybrid: false,
            clients: false,
        }
    }
}

/// One failing crash image.
#[derive(Clone, Debug)]
pub struct Violation {
    pub workload: String,
    pub mode: Mode,
    /// The crash point (just before this fence of the trace; the fence
    /// count is the end of the trace).
    pub fence: usize,
    pub fences: usize,
    /// The exploration's seed (what `--seed` takes).
    pub seed: u64,
    pub image_index: u64,
    /// Images per crash point of the run (what `--images` takes).
    pub images: usize,
    /// Torn stores were simulated (`--torn`).
    pub torn_stores: bool,
    /// A hybrid pool was explored (`--hybrid`).
    pub hybrid: bool,
    /// A client was attached (`--clients`).
    pub clients: bool,
    /// How the operations ended and where the point lies.
    pub context: String,
    pub diff: String,
}

impl Violation {
    /// The command that rebuilds this image and checks it again.
    pub fn repro_command(&self) -> String {
        format!(
            "inkfs crashtest --workload {} --mode {} --seed {:#x} --images {}{}{}{}",
            self.workload,
            self.mode.name(),
            self.seed,
            self.images,
            if self.torn_stores { " --torn" } else { "" },
            if self.hybrid { " --hybrid" } else { "" },
            if self.clients { " --clients" } else { "" }
        )
    }
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "VIOLATION workload {} mode {} fence {} of {} image {} (seed {:#x}, {} images per point)",
            self.workload,
            self.mode.name(),
            self.fence,
            self.fences,
            self.image_index,
            self.seed,
            self.images
        )?;
        writeln!(f, "  {}", self.context)?;
        write!(f, "{}", self.diff)?;
        writeln!(f, "  reproduce: {}", self.repro_command())
    }
}

#[derive(Clone, Debug, Default)]
pub struct CrashTestReport {
    /// Distinct crash images recovered and checked.
    pub states_checked: u64,
    /// Per mode (strict, sync, posix).
    pub states_per_mode: [u64; 3],
    /// Images generated, duplicates included.
    pub images_generated: u64,
    pub crash_points: u64,
    /// Distinct workloads run (in at least one mode).
    pub workloads: u64,
    /// Workloads the catalogue (after the filter) has.
    pub workloads_total: u64,
    /// Workload × mode runs done, and planned.
    pub runs: u64,
    pub runs_total: u64,
    /// Runs done per mode (strict, sync, posix) that checked every image
    /// their crash points were given (not cut short by the budget).
    pub complete_runs_per_mode: [u64; 3],
    pub violations: Vec<Violation>,
    pub elapsed: Duration,
}

impl CrashTestReport {
    pub fn states_per_second(&self) -> f64 {
        self.states_checked as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Progress after each run.
#[derive(Clone, Debug)]
pub struct Progress<'a> {
    pub workload: &'a str,
    pub mode: Mode,
    pub runs_done: u64,
    pub runs_total: u64,
    pub states_checked: u64,
    pub violations: usize,
    pub elapsed: Duration,
}

fn mode_index(m: Mode) -> usize {
    match m {
        Mode::Strict => 0,
        Mode::Sync => 1,
        Mode::Posix => 2,
    }
}

/// The workloads `filter` selects, in exploration order.
pub fn select_workloads(filter: Option<&str>, seed: u64) -> Vec<Workload> {
    let all = workload::all_workloads();
    match filter {
        Some(f) => {
            if let Some(w) = Workload::parse(f) {
                return vec![w];
            }
            all.into_iter().filter(|w| w.name().contains(f)).collect()
        }
        None => {
            let (mut one, mut two): (Vec<_>, Vec<_>) =
                all.into_iter().partition(|w| w.ops.len() == 1);
            // Seeded Fisher-Yates over the longer workloads, so a small
            // budget samples all kinds of pairs and triples.
            let mut rng = Rng::new(seed ^ 0x0005_EED0_FACE);
            for i in (1..two.len()).rev() {
                let j = rng.below(i as u64 + 1) as usize;
                two.swap(i, j);
            }
            one.append(&mut two);
            one
        }
    }
}

/// Run the exploration. `progress` is called after every run.
pub fn run(opts: &CrashTestOptions, mut progress: impl FnMut(&Progress<'_>)) -> CrashTestReport {
    let t0 = Instant::now();
    let workloads = select_workloads(opts.filter.as_deref(), opts.seed);
    let base = workload::base_image_for(opts.hybrid);
    let mut report = CrashTestReport {
        workloads_total: workloads.len() as u64,
        runs_total: (workloads.len() * opts.modes.len()) as u64,
        ..Default::default()
    };
    'outer: for w in &workloads {
        let name = w.name();
        let mut ran = false;
        for &mode in &opts.modes {
            if report.states_checked >= opts.states_budget {
                break 'outer;
            }
            let runs_left = (report.runs_total - report.runs).max(1);
            let budget_left = opts.states_budget.saturating_sub(report.states_checked);
            let share = budget_left as f64 / runs_left as f64;
            if run_one(opts, &base, w, &name, mode, share, &mut report) {
                report.complete_runs_per_mode[mode_index(mode)] += 1;
            }
            report.runs += 1;
            ran = true;
            report.elapsed = t0.elapsed();
            progress(&Progress {
                workload: &name,
                mode,
                runs_done: report.runs,
                runs_total: report.runs_total,
                states_checked: report.states_checked,
                violations: report.violations.len(),
                elapsed: report.elapsed,
            });
        }
        if ran {
            report.workloads += 1;
        }
    }
    report.elapsed = t0.elapsed();
    report
}

/// The seed of one run's image sampling.
fn run_seed(seed: u64, workload: &str, mode: Mode) -> u64 {
    let h = workload.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    Rng::new(seed ^ h ^ (mode_index(mode) as u64) << 56).next_u64()
}

/// What a run recorded: the live states and where each operation's fences
/// are.
struct Recorded {
    states: Vec<Snap>,
    free: Vec<u64>,
    /// Log pages fast GC unlinked during the run: a crash between an
    /// operation's commit and GC's unlinking recovers them still linked
    /// (garbage, not a leak), so up to this many fewer blocks free.
    gc_slack: u64,
    /// With held handles: free blocks once they are closed.
    free_released: Option<u64>,
    records: Vec<OpRecord>,
    results: Vec<String>,
    trace: SimTrace,
}

fn record(
    base: &[u8],
    w: &Workload,
    mode: Mode,
    torn: bool,
    clients: bool,
) -> Result<Recorded, String> {
    let pm = workload::pool_of(base.to_vec());
    let mopts = workload::mount_options(&pm, mode);
    let fs = Fs::mount(pm, mopts).map_err(|e| format!("mount the base image: {e:?}"))?;
    if clients {
        // A client attached (its slot claimed, holding nothing): every
        // last unlink goes ORPHAN, then FREE once no hold is seen.
        let table = crate::epoch::EpochTable::new_shared();
        let _ = table.claim_index();
        fs.share_epochs(table);
    }
    fs.pmem().sync_all().map_err(|e| e.to_string())?;
    let mut states = vec![snapshot(&fs).map_err(|e| format!("base state: {e}"))?];
    let mut free = vec![fs.statfs().blocks_free];
    let mut records = Vec::new();
    let mut results = Vec::new();
    let held = if w.held {
        workload::Held::open(&fs).map_err(|e| format!("open the held handles: {e:?}"))?
    } else {
        workload::Held::default()
    };
    fs.pmem().sync_all().map_err(|e| e.to_string())?;
    let f0 = fs.pmem().fence_count();
    fs.pmem().set_torn_stores(torn);
    let gc0 = fs.gc_stats().fast_pages_freed;
    fs.pmem().start_trace();
    for &i in &w.ops {
        let op = &OPS[i];
        let target = workload::data_target(&fs, op)
            .and_then(|ino| fs.getattr(ino).ok().map(|a| (ino, a.generation)));
        let before = (fs.pmem().fence_count() - f0) as usize;
        let r = workload::exec(&fs, op, &held);
        let after = (fs.pmem().fence_count() - f0) as usize;
        if matches!(r, Err(crate::Error::Errno(libc::ENOSPC))) {
            return Err(format!(
                "{} ran out of space: the crash-test pool is too small for the catalogue",
                op.name
            ));
        }
        results.push(format!("{} -> {}", op.name, workload::result_name(&r)));
        records.push(OpRecord {
            class: op.class(),
            target,
            ok: r.is_ok(),
            fences: (before, after),
        });
        let s =
            snapshot(&fs).map_err(|e| format!("live state after {} inconsistent: {e}", op.name))?;
        if r.is_err() && s.timeless() != states.last().unwrap().timeless() {
            return Err(format!(
                "{} failed ({}) but changed the state:\n{}",
                op.name,
                workload::result_name(&r),
                snapshot::diff(&states.last().unwrap().timeless(), &s.timeless())
            ));
        }
        states.push(s);
        free.push(fs.statfs().blocks_free);
    }
    let trace = fs.pmem().stop_trace();
    let gc_slack = fs.gc_stats().fast_pages_freed - gc0;
    // Closing the held handles frees what became an orphan, as recovery
    // does.
    held.release(&fs);
    let free_released = fs.statfs().blocks_free;
    Ok(Recorded {
        gc_slack,
        states,
        free,
        free_released: w.held.then_some(free_released),
        records,
        results,
        trace,
    })
}

fn run_one(
    opts: &CrashTestOptions,
    base: &[u8],
    w: &Workload,
    name: &str,
    mode: Mode,
    share: f64,
    report: &mut CrashTestReport,
) -> bool {
    let violation =
        |fence: usize, fences: usize, index: u64, images: usize, context: String, diff: String| {
            Violation {
                workload: name.to_string(),
                mode,
                fence,
                fences,
                seed: opts.seed,
                image_index: index,
                images,
                torn_stores: opts.torn_stores,
                hybrid: opts.hybrid,
                clients: opts.clients,
                context,
                diff,
            }
        };
    let rec = match record(base, w, mode, opts.torn_stores, opts.clients) {
        Ok(r) => r,
        Err(e) => {
            report.violations.push(violation(
                0,
                0,
                0,
                0,
                "while running the workload".into(),
                format!("  {e}\n"),
            ));
            return true;
        }
    };
    let fences = rec.trace.fence_count();
    // Crash points of the last operation, and the end of the trace.
    let first = rec.records.last().map_or(0, |r| r.fences.0);
    let points: Vec<usize> = (first..=fences).collect();
    let seed = run_seed(opts.seed, name, mode);
    // Images per point: exactly `images` when asked; otherwise the run's
    // share of the budget, water-filled over its points so that points
    // with few possible images leave the rest to those with many.
    let per_point: Vec<usize> = match opts.images {
        Some(k) => vec![k.max(1); points.len()],
        None => {
            let cap = opts.max_images_per_point.max(1);
            let possible: Vec<u64> = points
                .iter()
                .map(|&p| rec.trace.crash_images(p, cap, seed).total().min(cap as u64))
                .collect();
            water_fill(&possible, share.floor() as u64)
                .into_iter()
                .map(|n| n as usize)
                .collect()
        }
    };
    let mut seen: HashSet<u128> = HashSet::new();
    for (&point, &images) in points.iter().zip(&per_point) {
        let at = expect::locate(&rec.records, point);
        report.crash_points += 1;
        for img in rec
            .trace
            .crash_images(point, images.max(2), seed)
            .take(images)
        {
            if report.states_checked >= opts.states_budget {
                return false;
            }
            report.images_generated += 1;
            if !seen.insert(image_hash(&img.image)) {
                continue;
            }
            report.states_checked += 1;
            report.states_per_mode[mode_index(mode)] += 1;
            if let Err(why) = check_image(opts, mode, img.image, &rec, at) {
                let context = format!(
                    "{}; crash {} ({})",
                    rec.results.join(", "),
                    match at {
                        Point::InFlight(i) => format!("during operation {i}"),
                        Point::After(c) => format!("after {c} operations"),
                    },
                    img.description
                );
                report
                    .violations
                    .push(violation(point, fences, img.index, images, context, why));
            }
        }
    }
    true
}

/// Share `budget` over points that have `caps[i]` possible images each:
/// every point gets at least one, none more than its cap, and what a small
/// point cannot use goes to the others.
fn water_fill(caps: &[u64], budget: u64) -> Vec<u64> {
    let n = caps.len();
    let mut out = vec![0; n];
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| caps[i]);
    let mut left = budget.max(n as u64);
    for (k, &i) in order.iter().enumerate() {
        let fair = left / (n - k) as u64;
        let give = caps[i].min(fair).max(1);
        out[i] = give;
        left = left.saturating_sub(give);
    }
    out
}

/// Recover one crash image and check everything that must hold.
fn check_image(
    opts: &CrashTestOptions,
    mode: Mode,
    image: Vec<u8>,
    rec: &Recorded,
    at: Point,
) -> Result<(), String> {
    let pm = workload::pool_of(image);
    let mopts = workload::mount_options(&pm, mode);
    // fsck sees the crash image as the next mount will: pending journals
    // and orphans are notes; any error is a violation.
    fsck_clean(&pm, false)?;
    let fs = Fs::mount(pm, mopts.clone()).map_err(|e| format!("  mount failed: {e:?}\n"))?;
    let snap = snapshot(&fs).map_err(|e| format!("  inconsistent after recovery: {e}\n"))?;
    let m = expect::check(mode, &snap, &rec.states, &rec.records, at)
        .map_err(|e| format!("  {}\n", e.trim_end()))?;
    let free = fs.statfs().blocks_free;
    // A state's free count, less log pages GC had yet to unlink.
    let near = |f: u64| free <= f && f - free <= rec.gc_slack;
    let free_ok = match (mode, rec.free_released) {
        // Held handles: recovery frees orphans (and drops block
        // reservations) the live file system still kept, so only bounds;
        // fsck checks for leaks.
        (_, Some(released)) => {
            let hi = match at {
                Point::InFlight(i) => i,
                Point::After(c) => c,
            };
            let lo = rec.free[..=hi]
                .iter()
                .min()
                .unwrap()
                .saturating_sub(rec.gc_slack);
            // What closing the handles freed after the last operation,
            // on top of the most any state had free.
            let closing = released.saturating_sub(*rec.free.last().unwrap());
            let top = rec.free[..=hi].iter().copied().max().unwrap() + closing;
            lo <= free && free <= top
        }
        (mode, None) => match mode {
            // Strict and sync: the free space of a state recovered (for a
            // write in flight in sync mode, of either state).
            Mode::Strict | Mode::Sync => match at {
                Point::InFlight(i) if mode == Mode::Sync => {
                    rec.free[i - 1..=i].iter().any(|&f| near(f))
                }
                _ => m.iter().any(|&c| near(rec.free[c])),
            },
            // Posix: unsynced writes may be lost, so only bounds.
            Mode::Posix => {
                let hi = match at {
                    Point::InFlight(i) => i,
                    Point::After(c) => c,
                };
                let lo = rec.free[..=hi]
                    .iter()
                    .min()
                    .unwrap()
                    .saturating_sub(rec.gc_slack);
                let hi = *rec.free[..=hi].iter().max().unwrap();
                lo <= free && free <= hi
            }
        },
    };
    if !free_ok {
        return Err(format!(
            "  recovered state (matching state {m:?}) has {free} free blocks; the live file system had {:?}\n",
            rec.free
        ));
    }
    if !opts.deep {
        return Ok(());
    }
    let pm = fs
        .unmount()
        .map_err(|e| format!("  unmount after recovery: {e:?}\n"))?;
    // After recovery and a clean unmount: no problem of any kind.
    fsck_clean(&pm, true)?;
    let fs = Fs::mount(pm, mopts).map_err(|e| format!("  clean remount failed: {e:?}\n"))?;
    if !fs.mount_report().allocator_restored {
        return Err("  clean remount did not restore the allocator\n".into());
    }
    let again = snapshot(&fs).map_err(|e| format!("  inconsistent after remount: {e}\n"))?;
    if again != snap {
        return Err(format!(
            "  a clean remount changed the state:\n{}",
            snapshot::diff(&snap, &again)
        ));
    }
    let free2 = fs.statfs().blocks_free;
    if free2 != free {
        return Err(format!(
            "  free blocks: {free} after recovery, {free2} after a clean remount\n"
        ));
    }
    probe(&fs, &snap).map_err(|e| format!("  {e}\n"))
}

/// fsck (`crate::fsck::check`, read-only) of a crash image (`no_notes`
/// false: errors only) or of a recovered, cleanly unmounted one (`no_notes`
/// true: nothing at all may be reported).
fn fsck_clean(pm: &SimPool, no_notes: bool) -> Result<(), String> {
    let opts = crate::fsck::FsckOptions {
        data: workload::mount_options(pm, Mode::Strict).data,
        ..Default::default()
    };
    let r = crate::fsck::check(pm, &opts)
        .map_err(|e| format!("  fsck could not check the pool: {e}\n"))?;
    let bad: Vec<String> = r
        .problems
        .iter()
        .filter(|p| no_notes || p.severity == crate::fsck::Severity::Error)
        .map(|p| format!("    [{}] {p}\n", p.kind.name()))
        .collect();
    if bad.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "  fsck {}:\n{}",
            if no_notes {
                "after recovery and a clean unmount"
            } else {
                "of the crash image"
            },
            bad.concat()
        ))
    }
}

/// The recovered file system accepts new work, and no file hides stale
/// bytes past its end (growing a file must show zeros).
fn probe<P: Pmem>(fs: &Fs<P>, snap: &Snap) -> Result<(), String> {
    for (p, n) in &snap.nodes {
        if n.kind != FileKind::File || n.size % 4096 == 0 {
            continue;
        }
        let grown = (n.size / 4096 + 1) * 4096;
        unpin(fs, n.ino, n.flags).map_err(|e| format!("chattr {p}: {e:?}"))?;
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
    let data = snapshot::pattern(6000, 99);
    let (_, fh) = fs
        .create(1, b"__probe", 0o600, 0, 0)
        .map_err(|e| format!("create after recovery: {e:?}"))?;
    let r = fs.write(&fh, 0, &data).map(|_| ());
    let mut back = vec![0u8; data.len()];
    let r = r.and_then(|_| fs.read(&fh, 0, &mut back).map(|_| ()));
    fs.release(fh);
    r.map_err(|e| format!("write/read after recovery: {e:?}"))?;
    if back != data {
        return Err("probe file reads back different data".into());
    }
    fs.unlink(1, b"__probe")
        .map_err(|e| format!("unlink probe: {e:?}"))
}

/// Clear the flags that would refuse the probe's growing of a file.
pub fn unpin<P: Pmem>(fs: &Fs<P>, ino: u64, flags: u32) -> crate::Result<()> {
    use crate::types::inode_flags::{APPEND, IMMUTABLE};
    if flags & (IMMUTABLE | APPEND) == 0 {
        return Ok(());
    }
    fs.set_flags(ino, flags & !(IMMUTABLE | APPEND), true)
}
