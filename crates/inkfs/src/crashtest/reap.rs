//! A client killed under a write lease, then reaped by the server, under
//! the crash simulator (docs/KERNEL-FREE.md, "What each crash leaves":
//! client killed at any instruction, then power cut; CRASHTEST.md, "A
//! client killed").
//!
//! One simulated pool, the owner's mounted engine and a client engine on a
//! second handle of it (as in [`super::lease`]). The client takes a lease
//! on file `f` and starts one operation (an overwrite, a truncate, an
//! append); its handle is killed after its k-th store (`SimPool::
//! kill_after_stores`), for every k from 0 until the operation completes:
//! what it stored stays visible, durable only if it was written back and
//! fenced. The owner then reaps the client as the mount's lease table does
//! for a dead holder (`Leases::end` then `Leases::leave`: the settle's
//! `lease_refs`, the blocks the inode no longer refers to returned, its
//! log collected, the rest of the reservation returned) and writes another
//! file, `h`, block by block, so that the returned blocks are reused and
//! fenced. The run fails unless at least one run adopted a tail the client
//! stored and then had `h` reuse a block that tail displaced (the case a
//! settle that adopts an unflushed tail gets wrong).
//!
//! Crash images at every fence from the settle on (the client's pending
//! lines included) are checked: fsck finds no error (a block owned by two
//! files is one); recovery mounts the image; `f` is its state before or
//! after the killed operation (sync: an overwrite may mix old and new
//! bytes) and, from the owner's first write on, the state the owner
//! adopted; `h` is before or after the owner's write in flight; `g` is
//! untouched; after a clean unmount fsck reports nothing at all.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};

use super::lease::{
    fsck, mixed, mount_options, owner_with_files, read_all, write_model, OwnerFiles, RESERVE, ROOT,
};
use crate::format::BLOCK_SIZE;
use crate::fs::Fs;
use crate::lease::RangeSet;
use crate::pmem::{Killed, SimPool};
use crate::types::{Mode, SetAttr};

/// What one exploration found.
#[derive(Debug, Default)]
pub struct ReapReport {
    /// Crash images checked.
    pub states: u64,
    /// Crash points (fences) of the reaps.
    pub points: u64,
    /// Runs (mode, operation, kill point).
    pub runs: u64,
    /// Runs whose client was killed inside its operation.
    pub kills: u64,
    /// Killed runs whose settle adopted the killed operation (its tail
    /// store was made) and freed blocks.
    pub adopted: u64,
    /// Runs in which the owner's writes reused a block the settle freed.
    pub reused: u64,
    pub violations: Vec<String>,
}

/// The client's operation, killed at each of its stores.
#[derive(Clone, Copy, Debug)]
enum ClientOp {
    /// Strict: copy-on-write of both pages (the old ones are displaced).
    Write(u64, usize, u8),
    /// The second page is cut off.
    Truncate(u64),
    Append(usize, u8),
}

const OPS: &[ClientOp] = &[
    ClientOp::Write(100, 4096, 2),
    ClientOp::Truncate(1000),
    ClientOp::Append(4096, 3),
];

/// `f`'s size before the client's operation (two blocks).
const F_BYTES: usize = 8192;
/// Blocks the owner writes to `h` after the reap, one at a time.
const OWNER_WRITES: usize = 3;
/// Bound on the kill points of one operation (it has far fewer stores).
const KILLS_MAX: u64 = 200;

/// A phase of the reap's trace: its fences and the states allowed meanwhile.
struct Phase {
    fences: (usize, usize),
    /// `f` must be the adopted state (the owner builds on it now).
    f_settled: bool,
    h_before: Vec<u8>,
    h_after: Vec<u8>,
}

/// One run's files: `f` before and after the killed operation, as the
/// owner adopted it, and what `g` holds.
struct Files {
    f: u64,
    g: u64,
    h: u64,
    before: Vec<u8>,
    after: Vec<u8>,
    settled: Vec<u8>,
}

/// Explore every kill point of each operation in strict and sync modes,
/// checking at most `max_images` images per crash point.
pub fn explore_reaping(max_images: usize, seed: u64) -> ReapReport {
    let mut report = ReapReport::default();
    for mode in [Mode::Strict, Mode::Sync] {
        for &op in OPS {
            for k in 0..=KILLS_MAX {
                report.runs += 1;
                match run(mode, op, k, max_images, seed, &mut report) {
                    Ok(true) => {}
                    Ok(false) => break,
                    Err(e) => {
                        report
                            .violations
                            .push(format!("{mode:?} {op:?} killed after store {k}: {e}"));
                        break;
                    }
                }
                if k == KILLS_MAX {
                    report
                        .violations
                        .push(format!("{mode:?} {op:?}: not done after {k} stores"));
                }
            }
        }
    }
    report
}

/// One run: the client killed after `k` stores of `op`, reaped, the owner
/// writing on; true if the kill came inside the operation (false: it
/// completed, and the client died after it).
fn run(
    mode: Mode,
    op: ClientOp,
    k: u64,
    max_images: usize,
    seed: u64,
    report: &mut ReapReport,
) -> Result<bool, String> {
    let e = |what: &'static str| move |err: crate::Error| format!("{what}: {err}");
    let OwnerFiles {
        owner,
        client_view,
        f: (fa, ofh),
        g: ga,
    } = owner_with_files(false, mode, F_BYTES)?;
    owner.release(ofh);
    let (ha, hfh) = owner
        .create(ROOT, b"h", 0o644, 0, 0)
        .map_err(e("create h"))?;

    // The grant, as the mount's lease table makes it.
    let client = Fs::attach_client(client_view, mode).map_err(e("attach"))?;
    let cfh = client.open(fa.ino).map_err(e("client open"))?;
    let before_refs = owner.lease_refs(fa.ino).map_err(e("grant"))?;
    let reserved = owner.reserve_blocks(RESERVE, 64);
    client
        .add_reservation(&reserved)
        .map_err(e("reservation"))?;

    let before = vec![9u8; F_BYTES];
    let mut after = before.clone();
    match op {
        ClientOp::Write(off, len, b) => write_model(&mut after, off, len, b),
        ClientOp::Truncate(size) => after.resize(size as usize, 0),
        ClientOp::Append(len, b) => after.extend(std::iter::repeat_n(b, len)),
    }
    client.pmem().kill_after_stores(k);
    let done = catch_unwind(AssertUnwindSafe(|| {
        let _w = client.client_writes();
        match op {
            ClientOp::Write(off, len, b) => client.write(&cfh, off, &vec![b; len]).map(|_| ()),
            ClientOp::Truncate(size) => {
                let set = SetAttr {
                    size: Some(size),
                    ..Default::default()
                };
                client.setattr(fa.ino, &set).map(|_| ())
            }
            ClientOp::Append(len, b) => client.append(&cfh, &vec![b; len]).map(|_| ()),
        }
    }));
    let killed = match done {
        Ok(r) => {
            r.map_err(|err| format!("the client's operation: {err}"))?;
            // Completed: the client dies right after it, before it sends
            // anything.
            client.pmem().kill();
            false
        }
        Err(payload) if payload.is::<Killed>() => true,
        Err(payload) => resume_unwind(payload),
    };
    // A dead process's memory is gone: nothing it freed reaches the owner.
    drop(cfh);
    drop(client);
    report.kills += killed as u64;

    // The reap (`Leases::end`, then `Leases::leave`).
    owner.pmem().start_trace();
    let f0 = owner.pmem().fence_count();
    let fences = || (owner.pmem().fence_count() - f0) as usize;
    let after_refs = owner.lease_refs(fa.ino).map_err(e("settle"))?;
    let mut freed = RangeSet::from_ranges(&before_refs);
    let mut rest = RangeSet::from_ranges(&reserved);
    for &(s, l) in &after_refs {
        freed.remove(s, l);
        rest.remove(s, l);
    }
    owner.return_blocks(&freed.ranges());
    owner.collect_log(fa.ino).map_err(e("collect"))?;
    owner.return_blocks(&rest.ranges());
    let settled = read_all(&owner, fa.ino)?;
    let sync_overwrite = mode == Mode::Sync && matches!(op, ClientOp::Write(..));
    if settled != before
        && settled != after
        && !(sync_overwrite && mixed(&settled, &before, &after))
    {
        return Err(format!(
            "the owner adopted {} bytes: neither the state before nor after",
            settled.len()
        ));
    }
    if killed && settled == after && !freed.is_empty() {
        report.adopted += 1;
    }
    let mut phases = vec![Phase {
        fences: (0, fences()),
        f_settled: false,
        h_before: Vec::new(),
        h_after: Vec::new(),
    }];

    // The owner builds on what it adopted: `h`, a block at a time.
    let mut h = Vec::new();
    for j in 0..OWNER_WRITES {
        let start = fences();
        let h_before = h.clone();
        h.extend(std::iter::repeat_n(20 + j as u8, BLOCK_SIZE as usize));
        owner
            .write(&hfh, (j as u64) * BLOCK_SIZE, &h[h_before.len()..])
            .map_err(e("owner write h"))?;
        phases.push(Phase {
            fences: (start, fences()),
            f_settled: true,
            h_before,
            h_after: h.clone(),
        });
    }
    let h_blocks = owner.fiemap(ha.ino, 0, 1 << 20).map_err(e("fiemap h"))?;
    let reused = h_blocks.iter().any(|x| {
        !freed
            .intersect(x.physical / BLOCK_SIZE, x.length / BLOCK_SIZE)
            .is_empty()
    });
    report.reused += reused as u64;
    let trace = owner.pmem().stop_trace();
    owner.release(hfh);

    let files = Files {
        f: fa.ino,
        g: ga.ino,
        h: ha.ino,
        before,
        after,
        settled,
    };
    let last = phases.len() - 1;
    for (i, p) in phases.iter().enumerate() {
        for point in super::lease::points_of(p.fences, i == last, trace.fence_count()) {
            report.points += 1;
            for img in trace.crash_images(point, max_images, seed) {
                report.states += 1;
                if let Err(why) = check_image(img.image, mode, sync_overwrite, &files, p) {
                    return Err(format!("{}: {why}", img.description));
                }
            }
        }
    }
    Ok(killed)
}

/// One crash image of the reap: fsck, recovery, each file in an allowed
/// state, a clean unmount that fsck finds perfect.
fn check_image(
    image: Vec<u8>,
    mode: Mode,
    sync_overwrite: bool,
    x: &Files,
    p: &Phase,
) -> Result<(), String> {
    let pm = SimPool::from_image(image);
    fsck(&pm, false)?;
    let opts = mount_options(&pm, mode);
    let fs = Fs::mount(pm, opts).map_err(|e| format!("recovery: {e}"))?;
    let got = read_all(&fs, x.f)?;
    let ok = if p.f_settled {
        // Built on: the adopted state is durable (sync: the bytes of an
        // overwrite the client did not flush may still be either).
        got == x.settled
            || (sync_overwrite && got.len() == x.settled.len() && mixed(&got, &x.before, &x.after))
    } else {
        got == x.before || got == x.after || (sync_overwrite && mixed(&got, &x.before, &x.after))
    };
    if !ok {
        return Err(format!(
            "f of {} bytes (first {:?}): not {} (before {}, after {}, adopted {} bytes)",
            got.len(),
            got.first(),
            if p.f_settled {
                "the adopted state"
            } else {
                "before or after"
            },
            x.before.len(),
            x.after.len(),
            x.settled.len()
        ));
    }
    let h = read_all(&fs, x.h)?;
    if h != p.h_before && h != p.h_after {
        return Err(format!(
            "h of {} bytes: neither before ({}) nor after ({}) the owner's write",
            h.len(),
            p.h_before.len(),
            p.h_after.len()
        ));
    }
    if read_all(&fs, x.g)? != vec![8u8; 8192] {
        return Err("g changed".into());
    }
    let pm = fs.unmount().map_err(|e| format!("unmount: {e}"))?;
    fsck(&pm, true)
}
