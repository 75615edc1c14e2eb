//! The client sequence of the kernel-free path under the crash simulator
//! (docs/KERNEL-FREE.md, "What each crash leaves": power cut; CRASHTEST.md,
//! "Client leases").
//!
//! One simulated pool, two engines on it: the owner (a mounted engine, the
//! server's) and a client engine (`Fs::attach_client`) over a second handle
//! of the same simulated memory, as another process maps the pool. The
//! lease protocol's DRAM side runs as the mount's lease table runs it (the
//! grant notes the inode's blocks and reserves blocks for the client; the
//! recall catches the owner's inode up and returns what the client freed
//! and did not use), without sockets. The client then writes under the
//! lease: appends, overwrites, a write past the end of file, truncates;
//! the lease goes back to the owner, which writes the file itself, and
//! comes to the client again. The client recycles the blocks its
//! overwrites displace (recycle.rs) from the first one, against an epoch
//! table no one else pins: later overwrites reuse them, and the sequence
//! fails if none did.
//!
//! At every fence of the trace, crash images (all of them when few lines
//! are pending, else a seeded sample) are checked: fsck finds no error;
//! recovery mounts the image; the file is the state before or after the
//! operation in flight (strict: exactly; sync: an overwrite in flight may
//! mix old and new bytes, the size is one or the other); the other file is
//! untouched; after a clean unmount fsck reports nothing at all.
//!
//! On a hybrid pool ([`explore_leases_hybrid`]) the simulated data device
//! is shared the same way (its writes are lost or kept line by line until
//! a device flush), the client gets device blocks in its reservation too,
//! and the placement threshold (4 KiB) sends most of the operations' data
//! to the device: the client writes device blocks, flushes the device,
//! then commits, as the engine does. The owner's DRAM cache of device
//! blocks is on: after each recall the owner reads what the client wrote
//! (in place, in sync mode), not what it had cached.

use std::sync::Arc;

use crate::blockdev::BlockDev;
use crate::crashtest::workload::{DEV_BYTES, HYBRID_THRESHOLD, HYBRID_UNIT_BLOCKS};
use crate::fs::{FileHandle, Fs};
use crate::pmem::{Pmem, SimPool};
use crate::types::{Attr, DataDevice, FormatOptions, Mode, MountOptions, SetAttr};

/// What one exploration found.
#[derive(Debug, Default)]
pub struct LeaseReport {
    /// Crash images checked.
    pub states: u64,
    /// Crash points (fences) of the traces.
    pub points: u64,
    /// Operations traced (per mode).
    pub ops: u64,
    pub violations: Vec<String>,
}

/// Pool size: room for the reservation and a few files.
pub(super) const POOL_BYTES: u64 = 2 << 20;
/// Blocks reserved for the client at each grant.
pub(super) const RESERVE: u64 = 64;
pub(super) const ROOT: u64 = crate::format::ROOT_INO;

#[derive(Clone, Copy, Debug)]
enum Op {
    Append(usize, u8),
    Write(u64, usize, u8),
    Truncate(u64),
    /// The lease goes back; the owner overwrites bytes itself; the client
    /// gets the lease again.
    OwnerWrite(u64, usize, u8),
}

const OPS: &[Op] = &[
    Op::Append(3000, 1),
    Op::Write(100, 4096, 2),
    Op::Append(4096, 3),
    Op::Write(20_000, 100, 4),
    Op::Truncate(7000),
    Op::Truncate(12_000),
    Op::OwnerWrite(10, 5000, 5),
    Op::Append(5000, 6),
    Op::Write(0, 12_000, 7),
    Op::Write(4096, 8192, 10),
    Op::Write(0, 16_384, 11),
    // Small overwrites after large ones: on a hybrid pool they are placed
    // on PM and take blocks the earlier overwrites displaced (recycled:
    // only PM ones may be).
    Op::Write(50, 1000, 12),
    Op::Write(3000, 1000, 13),
];

/// One traced operation: the fences it issued and the file before and
/// after it.
struct Traced {
    op: Op,
    fences: (usize, usize),
    before: Vec<u8>,
    after: Vec<u8>,
}

/// Explore the client sequence in strict and sync modes, checking at most
/// `max_images` images per crash point (sampled from `seed` beyond that).
pub fn explore_leases(max_images: usize, seed: u64) -> LeaseReport {
    explore(false, max_images, seed)
}

/// [`explore_leases`] on a hybrid pool (see the module comment).
pub fn explore_leases_hybrid(max_images: usize, seed: u64) -> LeaseReport {
    explore(true, max_images, seed)
}

fn explore(hybrid: bool, max_images: usize, seed: u64) -> LeaseReport {
    let mut report = LeaseReport::default();
    for mode in [Mode::Strict, Mode::Sync] {
        if let Err(e) = explore_mode(mode, hybrid, max_images, seed, &mut report) {
            report.violations.push(format!("{mode:?}: {e}"));
        }
    }
    report
}

/// A fresh simulated pool, hybrid (with a data device behind it) or not.
pub(super) fn new_pool(hybrid: bool) -> Result<SimPool, String> {
    let e = |err: crate::Error| format!("format: {err}");
    if !hybrid {
        let pool = SimPool::new(POOL_BYTES);
        Fs::format(&pool, &FormatOptions::default()).map_err(e)?;
        return Ok(pool);
    }
    let pool = SimPool::with_device(vec![0; POOL_BYTES as usize], &vec![0; DEV_BYTES as usize]);
    let dev = pool.device().ok_or("no simulated device")?;
    Fs::format_hybrid(
        &pool,
        &FormatOptions::default(),
        &crate::blockdev::HybridFormat {
            device: &*dev,
            path: std::path::Path::new("/nonexistent/inkfs-crashtest-device"),
            blocks: None,
            threshold_bytes: HYBRID_THRESHOLD,
            unit_blocks: HYBRID_UNIT_BLOCKS,
        },
    )
    .map_err(e)?;
    Ok(pool)
}

/// The owner's side of an exploration before any lease: the pool mounted
/// in `mode`, a second handle on it for the client, file `f` of
/// `f_bytes` bytes of 9 (its handle kept open) and file `g`, 8 KiB of 8,
/// which no operation touches.
pub(super) struct OwnerFiles {
    pub owner: Fs<SimPool>,
    pub client_view: SimPool,
    pub f: (Attr, FileHandle),
    pub g: Attr,
}

pub(super) fn owner_with_files(
    hybrid: bool,
    mode: Mode,
    f_bytes: usize,
) -> Result<OwnerFiles, String> {
    let e = |what: &'static str| move |err: crate::Error| format!("{what}: {err}");
    let pool = new_pool(hybrid)?;
    let opts = mount_options(&pool, mode);
    let client_view = pool.share();
    let owner = Fs::mount(pool, opts).map_err(e("mount"))?;
    let (fa, ofh) = owner
        .create(ROOT, b"f", 0o644, 0, 0)
        .map_err(e("create f"))?;
    owner
        .write(&ofh, 0, &vec![9u8; f_bytes])
        .map_err(e("write f"))?;
    let (ga, gfh) = owner
        .create(ROOT, b"g", 0o644, 0, 0)
        .map_err(e("create g"))?;
    owner.write(&gfh, 0, &[8u8; 8192]).map_err(e("write g"))?;
    owner.release(gfh);
    Ok(OwnerFiles {
        owner,
        client_view,
        f: (fa, ofh),
        g: ga,
    })
}

/// Mount options in `mode`, naming the pool's simulated device if any.
pub(super) fn mount_options(pool: &SimPool, mode: Mode) -> MountOptions {
    MountOptions {
        mode,
        data: device_of(pool).map(DataDevice::Open),
        ..Default::default()
    }
}

fn device_of(pool: &SimPool) -> Option<Arc<dyn BlockDev>> {
    pool.device().map(|d| d as Arc<dyn BlockDev>)
}

fn explore_mode(
    mode: Mode,
    hybrid: bool,
    max_images: usize,
    seed: u64,
    report: &mut LeaseReport,
) -> Result<(), String> {
    let e = |what: &'static str| move |err: crate::Error| format!("{what}: {err}");
    let OwnerFiles {
        owner,
        client_view,
        f: (fa, ofh),
        g: ga,
    } = owner_with_files(hybrid, mode, 5000)?;
    // The client's own handle on the device, as the server hands its
    // descriptor over.
    let client_dev = device_of(&client_view).map(|d| (d, HYBRID_THRESHOLD as u64));
    let client = Fs::attach_client_with(client_view, mode, client_dev).map_err(e("attach"))?;
    let epochs = crate::epoch::EpochTable::new_shared();
    let slot = epochs.claim_index().ok_or("no epoch slot")?;
    client.client_use_epochs(epochs, slot);
    client.client_recycle_batch(1);
    let cfh = client.open(fa.ino).map_err(e("client open"))?;
    let mut model = vec![9u8; 5000];
    let mut lease = grant(&owner, &client, fa.ino)?;

    let f0 = owner.pmem().fence_count();
    owner.pmem().start_trace();
    let mut traced = Vec::new();
    for &op in OPS {
        let before = model.clone();
        let start = (owner.pmem().fence_count() - f0) as usize;
        let result = match op {
            Op::Append(len, b) => {
                let _w = client.client_writes();
                model.extend(std::iter::repeat_n(b, len));
                client.append(&cfh, &vec![b; len]).map(|_| ())
            }
            Op::Write(off, len, b) => {
                let _w = client.client_writes();
                write_model(&mut model, off, len, b);
                client.write(&cfh, off, &vec![b; len]).map(|_| ())
            }
            Op::Truncate(size) => {
                let _w = client.client_writes();
                model.resize(size as usize, 0);
                let set = SetAttr {
                    size: Some(size),
                    ..Default::default()
                };
                client.setattr(fa.ino, &set).map(|_| ())
            }
            Op::OwnerWrite(off, len, b) => {
                recall(&owner, &client, fa.ino, lease)?;
                write_model(&mut model, off, len, b);
                let r = owner.write(&ofh, off, &vec![b; len]).map(|_| ());
                lease = grant(&owner, &client, fa.ino)?;
                r
            }
        };
        result.map_err(|err| format!("{op:?}: {err}"))?;
        let end = (owner.pmem().fence_count() - f0) as usize;
        // The live state is the model, seen by both engines.
        let seen = read_all(&client, fa.ino)?;
        if seen != model {
            return Err(format!(
                "{op:?}: the client reads {} bytes, not the model's {}",
                seen.len(),
                model.len()
            ));
        }
        traced.push(Traced {
            op,
            fences: (start, end),
            before,
            after: model.clone(),
        });
    }
    let trace = owner.pmem().stop_trace();
    if hybrid && client.data_stats().is_none_or(|d| d.bytes_written == 0) {
        return Err("the client wrote nothing to the data device".into());
    }
    if mode == Mode::Strict && client.client_recycled_reused() == 0 {
        return Err("no overwrite reused a recycled block".into());
    }
    recall(&owner, &client, fa.ino, lease)?;
    if read_all(&owner, fa.ino)? != model {
        return Err("the owner, after the recall, does not read the model".into());
    }
    client.release(cfh);
    owner.release(ofh);
    report.ops += traced.len() as u64;

    let last = traced.len() - 1;
    for (i, t) in traced.iter().enumerate() {
        for point in points_of(t.fences, i == last, trace.fence_count()) {
            report.points += 1;
            for img in trace.crash_images(point, max_images, seed) {
                report.states += 1;
                if let Err(why) = check_image(img.image, hybrid, mode, fa.ino, ga.ino, t) {
                    report
                        .violations
                        .push(format!("{mode:?} {:?} {}: {why}", t.op, img.description));
                }
            }
        }
    }
    Ok(())
}

pub(super) fn write_model(model: &mut Vec<u8>, off: u64, len: usize, b: u8) {
    let (off, end) = (off as usize, off as usize + len);
    if model.len() < end {
        model.resize(end, 0);
    }
    model[off..end].fill(b);
}

/// The grant's DRAM side: the blocks the inode refers to (the mount keeps
/// them to settle the lease) and a reservation for the client (device
/// blocks too, on a hybrid pool).
fn grant(owner: &Fs<SimPool>, client: &Fs<SimPool>, ino: u64) -> Result<Vec<(u64, u64)>, String> {
    let before = owner.lease_refs(ino).map_err(|e| format!("grant: {e}"))?;
    let mut blocks = owner.reserve_blocks(RESERVE, 64);
    if owner.data_stats().is_some() {
        blocks.extend(owner.reserve_dev_blocks(RESERVE / 2, 64));
    }
    client
        .add_reservation(&blocks)
        .map_err(|e| format!("reservation: {e}"))?;
    Ok(before)
}

/// The recall's DRAM side: the client gives back what it freed and did
/// not use; the owner catches up and frees what the inode no longer refers
/// to and the client did not return.
fn recall(
    owner: &Fs<SimPool>,
    client: &Fs<SimPool>,
    ino: u64,
    before: Vec<(u64, u64)>,
) -> Result<(), String> {
    client.client_release_inode(ino);
    let mut back = client.take_client_freed();
    back.extend(client.drain_reservation());
    let after = owner.lease_refs(ino).map_err(|e| format!("recall: {e}"))?;
    let mut freed = crate::lease::RangeSet::from_ranges(&before);
    for &(s, l) in after.iter().chain(&back) {
        freed.remove(s, l);
    }
    owner.return_blocks(&back);
    owner.return_blocks(&freed.ranges());
    Ok(())
}

pub(super) fn read_all<P: Pmem>(fs: &Fs<P>, ino: u64) -> Result<Vec<u8>, String> {
    let fh = fs.open(ino).map_err(|e| format!("open: {e}"))?;
    let size = fs.fgetattr(&fh).map_err(|e| format!("getattr: {e}"))?.size as usize;
    let mut buf = vec![0u8; size];
    let n = fs.read(&fh, 0, &mut buf);
    fs.release(fh);
    buf.truncate(n.map_err(|e| format!("read: {e}"))?);
    Ok(buf)
}

/// The crash points of one traced step whose fences are `fences` (first,
/// end): point k is just before the trace's fence k, so a step's own are
/// those before each of its fences. Just before the next step's first
/// fence, that one's first stores may be there too: the point is the next
/// step's (its state before is this one's after). The end of the trace
/// (after its last fence) is the `last` step's.
pub(super) fn points_of(
    fences: (usize, usize),
    last: bool,
    fence_count: usize,
) -> std::ops::Range<usize> {
    let end = if last { fences.1 + 1 } else { fences.1 };
    fences.0..end.min(fence_count + 1)
}

/// One crash image: fsck, recovery, the file one of the allowed states, a
/// clean unmount that fsck finds perfect.
fn check_image(
    image: Vec<u8>,
    hybrid: bool,
    mode: Mode,
    f: u64,
    g: u64,
    t: &Traced,
) -> Result<(), String> {
    let pm = if hybrid {
        SimPool::from_combined(image, POOL_BYTES)
    } else {
        SimPool::from_image(image)
    };
    fsck(&pm, false)?;
    let opts = mount_options(&pm, mode);
    let fs = Fs::mount(pm, opts).map_err(|e| format!("recovery: {e}"))?;
    let got = read_all(&fs, f)?;
    let ok = got == t.before
        || got == t.after
        || (mode == Mode::Sync
            && matches!(t.op, Op::Write(..) | Op::OwnerWrite(..))
            && mixed(&got, &t.before, &t.after));
    if !ok {
        return Err(format!(
            "file of {} bytes: neither the state before ({} bytes) nor after ({} bytes)",
            got.len(),
            t.before.len(),
            t.after.len()
        ));
    }
    if read_all(&fs, g)? != vec![8u8; 8192] {
        return Err("the other file changed".into());
    }
    let pm = fs.unmount().map_err(|e| format!("unmount: {e}"))?;
    fsck(&pm, true)
}

/// Sync mode's overwrite in flight: the size one of the two, each byte the
/// old or the new one (past the old end: the new one or zero, never
/// invented).
pub(super) fn mixed(got: &[u8], before: &[u8], after: &[u8]) -> bool {
    if got.len() != before.len() && got.len() != after.len() {
        return false;
    }
    got.iter().enumerate().all(|(i, &b)| {
        before.get(i).is_some_and(|&o| o == b) || after.get(i).is_some_and(|&n| n == b) || b == 0
    })
}

pub(super) fn fsck(pm: &SimPool, no_notes: bool) -> Result<(), String> {
    let opts = crate::fsck::FsckOptions {
        data: device_of(pm).map(DataDevice::Open),
        ..Default::default()
    };
    let r = crate::fsck::check(pm, &opts).map_err(|e| format!("fsck: {e}"))?;
    let bad: Vec<String> = r
        .problems
        .iter()
        .filter(|p| no_notes || p.severity == crate::fsck::Severity::Error)
        .map(|p| format!("[{}] {p}", p.kind.name()))
        .collect();
    if bad.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "fsck{}: {}",
            if no_notes {
                " after recovery and unmount"
            } else {
                ""
            },
            bad.join("; ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hybrid client's overwrites displace device blocks; a later small
    /// overwrite (placed on PM) takes a recycled block: never a device one
    /// (kept with the PM ones before and taken first, being the oldest, a
    /// 300-byte overwrite was written to the device with a device flush).
    #[test]
    fn a_small_overwrite_never_takes_a_recycled_device_block() {
        let pool = new_pool(true).unwrap();
        let client_view = pool.share();
        let owner = Fs::mount(pool, mount_options(&client_view, Mode::Strict)).unwrap();
        let (a, ofh) = owner.create(ROOT, b"f", 0o644, 0, 0).unwrap();
        owner.release(ofh);
        let client_dev = device_of(&client_view).map(|d| (d, HYBRID_THRESHOLD as u64));
        let client = Fs::attach_client_with(client_view, Mode::Strict, client_dev).unwrap();
        let epochs = crate::epoch::EpochTable::new_shared();
        let slot = epochs.claim_index().unwrap();
        client.client_use_epochs(epochs, slot);
        client.client_recycle_batch(1);
        let fh = client.open(a.ino).unwrap();
        let lease = grant(&owner, &client, a.ino).unwrap();
        let mut model = vec![0u8; 16384];
        let mut write = |off: usize, len: usize, b: u8| {
            let _w = client.client_writes();
            client.write(&fh, off as u64, &vec![b; len]).unwrap();
            model[off..off + len].fill(b);
        };
        // Device pages, overwritten whole twice: device blocks displaced
        // first, so they head the recycled list.
        write(0, 16384, 1);
        write(0, 16384, 2);
        write(0, 16384, 3);
        // Small overwrites: PM blocks, recycled or new.
        for (i, off) in [100usize, 5000, 9000, 13000, 200, 5100]
            .into_iter()
            .enumerate()
        {
            write(off, 300, 10 + i as u8);
        }
        assert_eq!(read_all(&client, a.ino).unwrap(), model);
        // Every page was last written by a small overwrite: on PM.
        let extents = client.fiemap(a.ino, 0, 1 << 20).unwrap();
        assert!(extents.iter().all(|e| !e.flags.device), "{extents:?}");
        assert!(client.client_recycled_reused() > 0);
        client.release(fh);
        recall(&owner, &client, a.ino, lease).unwrap();
        assert_eq!(read_all(&owner, a.ino).unwrap(), model);
    }
}
