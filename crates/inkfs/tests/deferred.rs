//! Deferred posix appends on hybrid pools (blockdev/deferred.rs): what a
//! write-back leaves on media before and after the round that commits it,
//! the settle another commit to the inode makes first, strict and sync
//! modes unchanged; and the crash exploration of the sequence
//! (`inkfs::crashtest::deferred`).
//!
//! `INKFS_CRASHTEST_DEFERRED_IMAGES` sets the images per crash point (32).

use std::sync::Arc;

use inkfs::blockdev::BlockDev;
use inkfs::crashtest::workload::{base_image_for, mount_options, pool_of};
use inkfs::pmem::SimPool;
use inkfs::types::*;
use inkfs::Fs;

const PAGE: usize = 4096;

fn mounted(mode: Mode) -> Fs<SimPool> {
    let pm = pool_of(base_image_for(true));
    let opts = mount_options(&pm, mode);
    Fs::mount(pm, opts).unwrap()
}

/// The file `ino` as recovery finds it in what is durable now (a power
/// cut that keeps no pending line, on either side).
fn after_power_cut(fs: &Fs<SimPool>, ino: u64) -> Vec<u8> {
    let pm = pool_of(fs.pmem().persisted_image());
    let opts = mount_options(&pm, Mode::Posix);
    let fs = Fs::mount(pm, opts).unwrap();
    let fh = fs.open(ino).unwrap();
    let size = fs.fgetattr(&fh).unwrap().size as usize;
    let mut buf = vec![0u8; size];
    let n = fs.read(&fh, 0, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

fn flushes(fs: &Fs<SimPool>) -> u64 {
    fs.data_stats().unwrap().flushes_issued
}

#[test]
fn a_deferred_append_is_committed_by_the_round_after_one_flush() {
    let fs = mounted(Mode::Posix);
    let (a, fh) = fs.create(1, b"d", 0o644, 0, 0).unwrap();
    let f0 = flushes(&fs);
    let mut want = Vec::new();
    for b in 1..=4u8 {
        let data = vec![b; 2 * PAGE];
        assert!(fs
            .write_deferring(&fh, want.len() as u64, &data, false)
            .unwrap());
        want.extend_from_slice(&data);
    }
    assert_eq!(flushes(&fs), f0, "no flush before the round");
    // The server's own reads see the appends at once.
    let mut buf = vec![0u8; want.len()];
    assert_eq!(fs.read(&fh, 0, &mut buf).unwrap(), want.len());
    assert_eq!(buf, want);
    // Not committed yet: a power cut now leaves the file empty.
    assert_eq!(after_power_cut(&fs, a.ino), Vec::<u8>::new());
    fs.commit_deferred().unwrap();
    assert_eq!(flushes(&fs), f0 + 1, "one flush for four appends");
    assert_eq!(after_power_cut(&fs, a.ino), want);
    let s = fs.data_stats().unwrap();
    assert_eq!((s.deferred_appends, s.deferred_rounds), (4, 1), "{s:?}");
    // Nothing pending: the next round flushes nothing.
    fs.commit_deferred().unwrap();
    assert_eq!(flushes(&fs), f0 + 1);
    fs.release(fh);
}

#[test]
fn another_commit_to_the_inode_settles_its_deferred_tail_first() {
    let fs = mounted(Mode::Posix);
    let (a, fh) = fs.create(1, b"d", 0o644, 0, 0).unwrap();
    let data = vec![7u8; 2 * PAGE];
    assert!(fs.write_deferring(&fh, 0, &data, false).unwrap());
    let f0 = flushes(&fs);
    let set = SetAttr {
        mode: Some(0o600),
        ..Default::default()
    };
    fs.setattr(a.ino, &set).unwrap();
    assert_eq!(flushes(&fs), f0 + 1, "the settle flushed the device");
    assert_eq!(fs.data_stats().unwrap().deferred_settles, 1);
    // The chmod is durable on return, and the append before it with it.
    assert_eq!(after_power_cut(&fs, a.ino), data);
    // fsync settles too.
    assert!(fs
        .write_deferring(&fh, 2 * PAGE as u64, &data, false)
        .unwrap());
    fs.fsync(&fh, true).unwrap();
    assert_eq!(after_power_cut(&fs, a.ino).len(), 4 * PAGE);
    assert_eq!(fs.data_stats().unwrap().deferred_settles, 2);
    fs.release(fh);
}

#[test]
fn write_backs_out_of_order_fill_holes_without_a_settle() {
    let fs = mounted(Mode::Posix);
    let (a, fh) = fs.create(1, b"d", 0o644, 0, 0).unwrap();
    // The kernel's write-backs may reach the pool out of order: the
    // second half first, then the first half below the size in DRAM.
    let (lo, hi) = (vec![1u8; 2 * PAGE], vec![2u8; 2 * PAGE]);
    assert!(fs
        .write_deferring(&fh, 2 * PAGE as u64, &hi, false)
        .unwrap());
    assert!(fs.write_deferring(&fh, 0, &lo, false).unwrap());
    assert_eq!(fs.data_stats().unwrap().deferred_settles, 0);
    assert_eq!(after_power_cut(&fs, a.ino), Vec::<u8>::new());
    fs.commit_deferred().unwrap();
    assert_eq!(after_power_cut(&fs, a.ino), [lo, hi].concat());
    // An overwrite in place past the durable size still settles first.
    let more = vec![3u8; 2 * PAGE];
    assert!(fs
        .write_deferring(&fh, 4 * PAGE as u64, &more, false)
        .unwrap());
    fs.write(&fh, 4 * PAGE as u64 + 100, b"in place").unwrap();
    assert_eq!(fs.data_stats().unwrap().deferred_settles, 1);
    fs.release(fh);
}

#[test]
fn write_backs_leave_no_copy_in_the_cache_and_drop_a_stale_one() {
    let fs = mounted(Mode::Posix);
    let (_, fh) = fs.create(1, b"d", 0o644, 0, 0).unwrap();
    let data = vec![4u8; 8 * PAGE];
    assert!(fs.write_deferring(&fh, 0, &data, false).unwrap());
    fs.commit_deferred().unwrap();
    // The kernel's page cache holds a write-back's pages: the server's
    // cache took no copy, so this read comes from the device (and stays
    // in the cache, as any read does).
    let read0 = fs.data_stats().unwrap().bytes_read;
    let mut buf = vec![0u8; data.len()];
    assert_eq!(fs.read(&fh, 0, &mut buf).unwrap(), data.len());
    assert_eq!(buf, data);
    assert!(
        fs.data_stats().unwrap().bytes_read >= read0 + data.len() as u64,
        "a write-back's pages were cached"
    );
    // An overwrite in place by a write-back drops the cached old copy.
    let new = vec![6u8; 8 * PAGE];
    assert!(fs.write_deferring(&fh, 0, &new, false).unwrap());
    assert_eq!(fs.read(&fh, 0, &mut buf).unwrap(), new.len());
    assert_eq!(buf, new, "the cache served the old contents");
    // Other writes still keep theirs: read back with no device read.
    fs.write(&fh, 0, &data).unwrap();
    let read1 = fs.data_stats().unwrap().bytes_read;
    assert_eq!(fs.read(&fh, 0, &mut buf).unwrap(), data.len());
    assert_eq!(buf, data);
    assert_eq!(fs.data_stats().unwrap().bytes_read, read1);
    fs.release(fh);
}

#[test]
fn what_is_not_deferred() {
    let fs = mounted(Mode::Posix);
    let (_, fh) = fs.create(1, b"d", 0o644, 0, 0).unwrap();
    // Below the placement threshold: on PM, no device block written.
    assert!(!fs.write_deferring(&fh, 0, &[1u8; 100], false).unwrap());
    // An append into the partial last page copies it on write (it
    // displaces a block): committed after its own flush.
    let f0 = flushes(&fs);
    assert!(!fs
        .write_deferring(&fh, 100, &vec![2u8; 2 * PAGE], false)
        .unwrap());
    assert_eq!(flushes(&fs), f0 + 1);
    // An overwrite in place on the device: no tail to defer, but device
    // data to flush before it is durable.
    assert!(fs
        .write_deferring(&fh, PAGE as u64 + 10, &[3u8; 50], false)
        .unwrap());
    fs.release(fh);
    // No data device: never.
    let pm = SimPool::new(4 << 20);
    Fs::format(&pm, &FormatOptions::default()).unwrap();
    let fs = Fs::mount(
        pm,
        MountOptions {
            mode: Mode::Posix,
            ..Default::default()
        },
    )
    .unwrap();
    let (_, fh) = fs.create(1, b"d", 0o644, 0, 0).unwrap();
    assert!(!fs
        .write_deferring(&fh, 0, &vec![1u8; 64 * PAGE], false)
        .unwrap());
    fs.commit_deferred().unwrap();
    fs.release(fh);
}

#[test]
fn strict_and_sync_write_backs_still_flush_before_they_return() {
    for mode in [Mode::Strict, Mode::Sync] {
        let fs = mounted(mode);
        let (a, fh) = fs.create(1, b"d", 0o644, 0, 0).unwrap();
        let data = vec![5u8; 2 * PAGE];
        let f0 = flushes(&fs);
        assert!(
            !fs.write_deferring(&fh, 0, &data, false).unwrap(),
            "{mode:?}"
        );
        assert_eq!(flushes(&fs), f0 + 1, "{mode:?}: flushed before the commit");
        assert_eq!(after_power_cut(&fs, a.ino), data, "{mode:?}");
        assert_eq!(fs.data_stats().unwrap().deferred_appends, 0);
        fs.release(fh);
    }
}

#[test]
fn a_clean_unmount_commits_what_is_deferred() {
    let fs = mounted(Mode::Posix);
    let (a, fh) = fs.create(1, b"d", 0o644, 0, 0).unwrap();
    let data = vec![9u8; 3 * PAGE];
    assert!(fs.write_deferring(&fh, 0, &data, false).unwrap());
    fs.release(fh);
    let pm = fs.unmount().unwrap();
    let dev = pm.device().map(|d| d as Arc<dyn BlockDev>);
    assert!(dev.is_some());
    let fs = Fs::mount(
        pool_of(pm.persisted_image()),
        mount_options(&pm, Mode::Posix),
    )
    .unwrap();
    let fh = fs.open(a.ino).unwrap();
    let mut buf = vec![0u8; data.len()];
    assert_eq!(fs.read(&fh, 0, &mut buf).unwrap(), data.len());
    assert_eq!(buf, data);
    fs.release(fh);
}

fn images() -> usize {
    std::env::var("INKFS_CRASHTEST_DEFERRED_IMAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(32)
}

#[test]
fn crash_exploration_deferred_appends() {
    let t = std::time::Instant::now();
    let r = inkfs::crashtest::deferred::explore_deferred(images(), 0xace);
    eprintln!(
        "crash_deferred: {} crash states at {} crash points, {} appends deferred, {} settles \
         in {:.1}s; {} violations",
        r.states,
        r.points,
        r.deferred,
        r.settles,
        t.elapsed().as_secs_f64(),
        r.violations.len()
    );
    for v in &r.violations {
        eprintln!("{v}");
    }
    assert!(r.violations.is_empty(), "{} violations", r.violations.len());
    assert_eq!(r.deferred, 10, "nine appends and the times: {r:?}");
    // The chmod, the link, the truncate and the fsync each found a tail
    // pending (the rounds store theirs themselves).
    assert!(r.settles >= 4, "{r:?}");
    assert!(r.points >= 30 && r.states >= r.points, "{r:?}");
}
