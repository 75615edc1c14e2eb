//! Hybrid pools (a data device behind the PM pool): placement, reads
//! through the cache, remounts, identity checks, space on both sides.

use std::sync::Arc;

use inkfs::blockdev::{BlockDev, HybridFormat, MemDev};
use inkfs::pmem::SimPool;
use inkfs::types::*;
use inkfs::{Error, Fs};

const POOL: u64 = 16 << 20;
const DEV: u64 = 8 << 20;

fn format(pm: &SimPool, dev: &dyn BlockDev, threshold: u32) {
    Fs::format_hybrid(
        pm,
        &FormatOptions {
            lanes: 2,
            ..Default::default()
        },
        &HybridFormat {
            device: dev,
            path: std::path::Path::new("/nonexistent/inkfs-test-data"),
            blocks: None,
            threshold_bytes: threshold,
            unit_blocks: 16,
        },
    )
    .unwrap();
}

fn opts(mode: Mode, dev: Arc<dyn BlockDev>) -> MountOptions {
    MountOptions {
        mode,
        data: Some(DataDevice::Open(dev)),
        ..Default::default()
    }
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| {
            (i as u32)
                .wrapping_mul(2_654_435_761)
                .rotate_left(seed as u32 % 31) as u8
        })
        .collect()
}

#[test]
fn large_writes_go_to_the_device_small_ones_stay_on_pm() {
    for mode in [Mode::Strict, Mode::Sync, Mode::Posix] {
        let pm = SimPool::new(POOL);
        let dev: Arc<MemDev> = Arc::new(MemDev::new(DEV));
        format(&pm, &*dev, 64 << 10);
        let fs = Fs::mount(pm, opts(mode, dev.clone())).unwrap();
        let st0 = fs.statfs();
        assert!(st0.data_blocks > 0 && st0.data_blocks_free == st0.data_blocks);
        let (big, fh) = fs.create(1, b"big", 0o644, 0, 0).unwrap();
        let data = pattern(300_000, 1);
        fs.write(&fh, 0, &data).unwrap();
        fs.fsync(&fh, false).unwrap();
        // Overwrite a piece in the middle (small: in place, or on PM).
        fs.write(&fh, 5000, b"hello").unwrap();
        let (_, small) = fs.create(1, b"small", 0o644, 0, 0).unwrap();
        fs.write(&small, 0, b"tiny").unwrap();
        let st = fs.statfs();
        assert!(
            st.data_blocks_free + 70 <= st.data_blocks,
            "{mode:?}: 300 KB should be on the device: {st:?}"
        );
        // Available: PM's free blocks above the server's keep, and all of
        // the device's (no reservation is granted on it).
        let pm_free = st.blocks_free - st.data_blocks_free;
        let keep = inkfs::alloc::grant::server_keep_blocks(st.blocks - st.data_blocks);
        assert_eq!(
            st.blocks_avail,
            pm_free - keep + st.data_blocks_free,
            "{st:?}"
        );
        let ext = fs.fiemap(big.ino, 0, u64::MAX).unwrap();
        assert!(!ext.is_empty());
        let mut want = data.clone();
        want[5000..5005].copy_from_slice(b"hello");
        let mut back = vec![0u8; want.len()];
        assert_eq!(fs.read(&fh, 0, &mut back).unwrap(), want.len());
        assert!(back == want, "{mode:?}: read back differs");
        fs.release(fh);
        fs.release(small);
        assert!(dev.flushes() > 0, "{mode:?}: device never flushed");
        let stats = fs.data_stats().unwrap();
        assert!(stats.bytes_written >= 300_000);
        let pm = fs.unmount().unwrap();
        let fs = Fs::mount(pm, opts(mode, dev.clone())).unwrap();
        assert!(fs.mount_report().allocator_restored);
        assert_eq!(fs.statfs(), st);
        let fh = fs.open(big.ino).unwrap();
        let mut back = vec![0u8; want.len()];
        fs.read(&fh, 0, &mut back).unwrap();
        assert!(back == want, "{mode:?}: after remount");
        fs.release(fh);
        let small = fs.lookup(1, b"small").unwrap();
        let fh = fs.open(small.ino).unwrap();
        let mut b = [0u8; 4];
        fs.read(&fh, 0, &mut b).unwrap();
        assert_eq!(&b, b"tiny");
        fs.release(fh);
        // Deleting gives the device blocks back.
        fs.unlink(1, b"big").unwrap();
        assert_eq!(
            fs.statfs().data_blocks_free,
            st0.data_blocks_free,
            "{mode:?}"
        );
        fs.unmount().unwrap();
    }
}

#[test]
fn a_cacheless_mount_reads_from_the_device() {
    let pm = SimPool::new(POOL);
    let dev: Arc<MemDev> = Arc::new(MemDev::new(DEV));
    format(&pm, &*dev, 4096);
    let mut o = opts(Mode::Strict, dev.clone());
    o.data_cache_bytes = Some(0);
    let fs = Fs::mount(pm, o).unwrap();
    let (_, fh) = fs.create(1, b"f", 0o644, 0, 0).unwrap();
    let data = pattern(100_000, 3);
    fs.write(&fh, 0, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    fs.read(&fh, 0, &mut back).unwrap();
    assert!(back == data);
    let s = fs.data_stats().unwrap();
    assert_eq!(s.cache_hits, 0);
    assert!(s.bytes_read >= data.len() as u64);
    fs.release(fh);
}

#[test]
fn a_wrong_or_missing_device_is_refused_saying_which() {
    let pm = SimPool::new(POOL);
    let dev: Arc<MemDev> = Arc::new(MemDev::new(DEV));
    format(&pm, &*dev, 4096);
    // Another pool's device.
    let other_pm = SimPool::new(POOL);
    let other: Arc<MemDev> = Arc::new(MemDev::new(DEV));
    format(&other_pm, &*other, 4096);
    let msg = |r: inkfs::Result<Fs<SimPool>>| match r {
        Err(Error::BadPool(m)) => m,
        Err(e) => panic!("unexpected error {e:?}"),
        Ok(_) => panic!("mounted with the wrong device"),
    };
    let image = pm.current_image();
    let m = msg(Fs::mount(
        SimPool::from_image(image.clone()),
        opts(Mode::Strict, other),
    ));
    assert!(m.contains("another pool"), "{m}");
    let blank: Arc<MemDev> = Arc::new(MemDev::new(DEV));
    let m = msg(Fs::mount(
        SimPool::from_image(image.clone()),
        opts(Mode::Strict, blank),
    ));
    assert!(m.contains("no label"), "{m}");
    // No device given: the recorded path does not exist.
    let m = msg(Fs::mount(
        SimPool::from_image(image.clone()),
        MountOptions::default(),
    ));
    assert!(m.contains("missing"), "{m}");
    // A plain pool given a device.
    let plain = SimPool::new(POOL);
    Fs::format(&plain, &FormatOptions::default()).unwrap();
    let m = msg(Fs::mount(plain, opts(Mode::Strict, dev.clone())));
    assert!(m.contains("has none"), "{m}");
    // A truncated device.
    let mut img = dev.image();
    img.truncate(img.len() / 2);
    let m = msg(Fs::mount(
        SimPool::from_image(image.clone()),
        opts(Mode::Strict, Arc::new(MemDev::from_image(img))),
    ));
    assert!(m.contains("truncated"), "{m}");
    // The right one mounts.
    Fs::mount(SimPool::from_image(image), opts(Mode::Strict, dev)).unwrap();
}

#[test]
fn enospc_on_either_side_loses_nothing() {
    for mode in [Mode::Strict, Mode::Sync, Mode::Posix] {
        let pm = SimPool::new(POOL);
        let dev: Arc<MemDev> = Arc::new(MemDev::new(1 << 20));
        format(&pm, &*dev, 4096);
        let fs = Fs::mount(pm, opts(mode, dev.clone())).unwrap();
        let (ino, fh) = fs.create(1, b"f", 0o644, 0, 0).unwrap();
        let data = pattern(64 << 10, 7);
        let mut size = 0u64;
        // Fill the device, then PM (a full side spills to the other).
        let err = loop {
            match fs.write(&fh, size, &data) {
                Ok(n) => size += n as u64,
                Err(e) => break e,
            }
            assert!(size < 64 << 20, "never ran out of space");
        };
        assert!(
            matches!(err, Error::Errno(libc::ENOSPC)),
            "{mode:?}: {err:?}"
        );
        let st = fs.statfs();
        assert!(
            st.data_blocks_free < 16,
            "{mode:?}: device not used up: {st:?}"
        );
        assert_eq!(fs.getattr(ino.ino).unwrap().size, size);
        let mut back = vec![0u8; data.len()];
        for k in 0..size / data.len() as u64 {
            fs.read(&fh, k * data.len() as u64, &mut back).unwrap();
            assert!(back == data, "{mode:?}: chunk {k} lost");
        }
        fs.release(fh);
        let pm = fs.unmount().unwrap();
        let fs = Fs::mount(pm, opts(mode, dev)).unwrap();
        assert_eq!(fs.getattr(ino.ino).unwrap().size, size);
        fs.unlink(1, b"f").unwrap();
    }
}

/// The crash-test pool of the hybrid exploration really keeps file data
/// on its simulated device (else the exploration would test nothing new).
#[test]
fn the_hybrid_crash_test_pool_uses_its_device() {
    use inkfs::crashtest::workload;
    let pm = workload::pool_of(workload::base_image_for(true));
    assert_eq!(pm.device_bytes(), workload::DEV_BYTES);
    let o = workload::mount_options(&pm, Mode::Strict);
    let fs = Fs::mount(pm, o).unwrap();
    let st = fs.statfs();
    assert!(
        st.data_blocks > 0 && st.data_blocks_free < st.data_blocks,
        "{st:?}"
    );
    let r = inkfs::fsck::check(
        fs.pmem(),
        &inkfs::fsck::FsckOptions {
            data: workload::mount_options(fs.pmem(), Mode::Strict).data,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(r.problems.is_empty(), "{:?}", r.problems);
}

fn fsck_with(pm: &SimPool, dev: Option<Arc<dyn BlockDev>>) -> inkfs::fsck::FsckReport {
    inkfs::fsck::check(
        pm,
        &inkfs::fsck::FsckOptions {
            data: dev.map(DataDevice::Open),
            ..Default::default()
        },
    )
    .unwrap()
}

#[test]
fn fsck_finds_a_block_side_leak_and_a_wrong_device() {
    use inkfs::blockdev::layout;
    use inkfs::format::*;
    use inkfs::fsck::ProblemKind;
    let pm = SimPool::new(POOL);
    let dev: Arc<MemDev> = Arc::new(MemDev::new(DEV));
    format(&pm, &*dev, 4096);
    let fs = Fs::mount(pm, opts(Mode::Strict, dev.clone())).unwrap();
    let (_, fh) = fs.create(1, b"f", 0o644, 0, 0).unwrap();
    fs.write(&fh, 0, &pattern(200_000, 9)).unwrap();
    fs.release(fh);
    let pm = fs.unmount().unwrap();
    let r = fsck_with(&pm, Some(dev.clone()));
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    // The file's 49 pages are counted on the device's side, not PM's.
    assert!(
        r.data_blocks_used >= 49 && r.data_blocks_total > r.data_blocks_used,
        "{r:?}"
    );
    assert!(r.blocks_used < 20, "{r:?}");

    // A wrong device, and none.
    let other_pm = SimPool::new(POOL);
    let other: Arc<MemDev> = Arc::new(MemDev::new(DEV));
    format(&other_pm, &*other, 4096);
    let r = fsck_with(&pm, Some(other));
    assert!(
        r.problems
            .iter()
            .any(|p| p.kind == ProblemKind::DataDevice && p.message.contains("another pool")),
        "{:?}",
        r.problems
    );
    assert!(r.errors_found() > 0);
    let r = fsck_with(&pm, None);
    assert!(
        r.problems
            .iter()
            .any(|p| p.kind == ProblemKind::DataDevice && p.message.contains("missing")),
        "{:?}",
        r.problems
    );

    // A leak: the saved free list loses its last range.
    let sb = inkfs::superblock::read_superblock(&pm).unwrap().0;
    let mut free = layout::read_save_area(&*dev, sb.data_blocks, sb.mount_epoch).unwrap();
    let (start, len) = free.pop().unwrap();
    layout::write_save_area(&*dev, sb.data_blocks, sb.mount_epoch, &free).unwrap();
    let r = fsck_with(&pm, Some(dev.clone()));
    let leak = r
        .problems
        .iter()
        .find(|p| p.kind == ProblemKind::BlockLeak)
        .unwrap_or_else(|| panic!("no leak reported: {:?}", r.problems));
    assert!(
        leak.message
            .contains(&format!("{len} data-device block(s)"))
            && leak
                .message
                .contains(&format!("{}", start - DEV_BLOCK_BASE)),
        "{leak}"
    );
    // Repair rebuilds both sides; the data is intact.
    let r = inkfs::fsck::check(
        &pm,
        &inkfs::fsck::FsckOptions {
            repair: true,
            data: Some(DataDevice::Open(dev.clone())),
        },
    )
    .unwrap();
    assert_eq!(r.errors_remaining, 0, "{:?}", r.problems);
    assert!(fsck_with(&pm, Some(dev.clone())).problems.is_empty());
    // A used block on the free list.
    let fs = Fs::mount(pm, opts(Mode::Strict, dev.clone())).unwrap();
    let pm = fs.unmount().unwrap();
    let sb = inkfs::superblock::read_superblock(&pm).unwrap().0;
    let mut free = layout::read_save_area(&*dev, sb.data_blocks, sb.mount_epoch).unwrap();
    // A block the file uses (on no free range), put on the list.
    let used = (DEV_BLOCK_BASE + sb.data_first_block..DEV_BLOCK_BASE + sb.data_blocks)
        .find(|&b| !free.iter().any(|&(s, n)| (s..s + n).contains(&b)))
        .expect("the file uses device blocks");
    free.push((used, 1));
    free.sort_unstable();
    layout::write_save_area(&*dev, sb.data_blocks, sb.mount_epoch, &free).unwrap();
    let r = fsck_with(&pm, Some(dev));
    assert!(
        r.problems
            .iter()
            .any(|p| p.kind == ProblemKind::SaveArea && p.message.contains("in use")),
        "{:?}",
        r.problems
    );
}

/// A data device needs format 5: a superblock of an older version that
/// names one is refused (its bytes were reserved, hence zero, before);
/// and attaching to a hybrid pool (docs/KERNEL-FREE.md) is refused until
/// it is designed.
#[test]
fn older_versions_cannot_name_a_data_device_and_attach_is_refused() {
    use inkfs::format::*;
    let pm = SimPool::new(POOL);
    let dev: Arc<MemDev> = Arc::new(MemDev::new(DEV));
    format(&pm, &*dev, 4096);
    let fs = Fs::mount(
        SimPool::from_image(pm.current_image()),
        opts(Mode::Strict, dev.clone()),
    )
    .unwrap();
    let attached = Fs::attach(SimPool::from_image(fs.pmem().current_image()), Mode::Strict);
    match attached {
        Err(Error::BadPool(m)) => assert!(m.contains("hybrid"), "{m}"),
        other => panic!("attach of a hybrid pool: {:?}", other.map(|_| ())),
    }
    drop(fs);
    let mut img = pm.current_image();
    for block in [SUPER_PRIMARY_BLOCK, SUPER_BACKUP_BLOCK] {
        let off = (block * BLOCK_SIZE) as usize;
        let mut sb = Superblock::from_bytes(&img[off..]);
        sb.version = 4;
        sb.seal();
        img[off..off + std::mem::size_of::<Superblock>()].copy_from_slice(sb.as_bytes());
    }
    match Fs::mount(SimPool::from_image(img), opts(Mode::Strict, dev)) {
        Err(e) => assert!(format!("{e}").contains("cannot have a data device"), "{e}"),
        Ok(_) => panic!("a version 4 superblock naming a data device mounted"),
    }
}

/// Concurrent writers of large data on one hybrid pool: every file reads
/// back whole, and device flushes are requested once per committing
/// write and issued at most that often (grouped when they overlap).
#[test]
fn concurrent_writers_in_every_mode() {
    for mode in [Mode::Strict, Mode::Sync, Mode::Posix] {
        let pm = SimPool::new(64 << 20);
        let dev: Arc<MemDev> = Arc::new(MemDev::new(32 << 20));
        format(&pm, &*dev, 16 << 10);
        let fs = Arc::new(Fs::mount(pm, opts(mode, dev.clone())).unwrap());
        let threads: Vec<_> = (0..4u8)
            .map(|t| {
                let fs = fs.clone();
                std::thread::spawn(move || {
                    let name = format!("t{t}");
                    let (_, fh) = fs.create(1, name.as_bytes(), 0o644, 0, 0).unwrap();
                    let data = pattern(40_000, t);
                    for i in 0..25u64 {
                        fs.write(&fh, i * 40_000, &data).unwrap();
                    }
                    fs.fsync(&fh, false).unwrap();
                    fs.release(fh);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let s = fs.data_stats().unwrap();
        assert!(s.flushes_requested >= 100, "{mode:?}: {s:?}");
        assert!(s.flushes_issued <= s.flushes_requested, "{mode:?}: {s:?}");
        for t in 0..4u8 {
            let ino = fs.lookup(1, format!("t{t}").as_bytes()).unwrap().ino;
            let fh = fs.open(ino).unwrap();
            let data = pattern(40_000, t);
            let mut back = vec![0u8; 40_000];
            for i in 0..25u64 {
                fs.read(&fh, i * 40_000, &mut back).unwrap();
                assert!(back == data, "{mode:?}: t{t} chunk {i}");
            }
            fs.release(fh);
        }
    }
}

/// FIEMAP names a device extent by its byte offset on the data device (as
/// XFS does for a realtime file's extents, which live on its realtime
/// device), flagged `device`; PM extents keep pool offsets. The bytes at
/// the reported device offset are the file's.
#[test]
fn fiemap_reports_device_extents_at_device_offsets() {
    let pm = SimPool::new(POOL);
    let dev: Arc<MemDev> = Arc::new(MemDev::new(DEV));
    format(&pm, &*dev, 64 << 10);
    let fs = Fs::mount(pm, opts(Mode::Strict, dev.clone())).unwrap();
    let (big, fh) = fs.create(1, b"big", 0o644, 0, 0).unwrap();
    let data = pattern(256 << 10, 5);
    fs.write(&fh, 0, &data).unwrap();
    let (small, sh) = fs.create(1, b"small", 0o644, 0, 0).unwrap();
    fs.write(&sh, 0, &pattern(8192, 6)).unwrap();
    fs.sync().unwrap();
    let ext = fs.fiemap(big.ino, 0, u64::MAX).unwrap();
    assert!(!ext.is_empty());
    let image = dev.image();
    for e in &ext {
        assert!(e.flags.device, "{e:?}: a device extent not flagged");
        assert!(
            e.physical + e.length <= DEV,
            "{e:?}: physical is not an offset on the {DEV}-byte device"
        );
        let (p, l) = (e.physical as usize, e.length as usize);
        let want = &data[e.logical as usize..(e.logical as usize + l).min(data.len())];
        assert!(
            &image[p..p + want.len()] == want,
            "{e:?}: not the file's bytes"
        );
    }
    assert!(ext.last().unwrap().flags.last);
    let pm_ext = fs.fiemap(small.ino, 0, u64::MAX).unwrap();
    assert!(!pm_ext.is_empty());
    for e in &pm_ext {
        assert!(!e.flags.device, "{e:?}: a PM extent flagged device");
        assert!(e.physical + e.length <= POOL, "{e:?}");
    }
    fs.release(fh);
    fs.release(sh);
}

/// Non-zero bytes past the end of file on the data device (the tail of the
/// last page) are reported by fsck and zeroed by its repair, on the device.
/// A data file on disk, named by path as the CLI names it: the repair
/// opens it for writing while the check had it open for reading.
#[test]
fn fsck_repairs_stale_bytes_past_eof_on_the_device() {
    use inkfs::blockdev::dev::pages;
    use inkfs::blockdev::FileDev;
    use inkfs::fsck::ProblemKind;
    let dir = tempfile::Builder::new()
        .prefix("inkfs-hybrid-test")
        .tempdir_in("/var/tmp")
        .unwrap();
    let path = dir.path().join("data");
    let pm = SimPool::new(POOL);
    {
        let dev = FileDev::create(&path, DEV).unwrap();
        Fs::format_hybrid(
            &pm,
            &FormatOptions {
                lanes: 2,
                ..Default::default()
            },
            &HybridFormat {
                device: &dev,
                path: &path,
                blocks: None,
                threshold_bytes: 4096,
                unit_blocks: 16,
            },
        )
        .unwrap();
    }
    let by_path = || Some(DataDevice::Path(path.clone()));
    let fs = Fs::mount(
        pm,
        MountOptions {
            mode: Mode::Strict,
            data: by_path(),
            ..Default::default()
        },
    )
    .unwrap();
    let (f, fh) = fs.create(1, b"f", 0o644, 0, 0).unwrap();
    let size = 100_000u64; // the last page holds 1,696 bytes of it
    let want = pattern(size as usize, 2);
    fs.write(&fh, 0, &want).unwrap();
    let ext = fs.fiemap(f.ino, 0, u64::MAX).unwrap();
    fs.release(fh);
    let pm = fs.unmount().unwrap();
    let last = ext.last().unwrap();
    assert!(last.flags.device, "{last:?}");
    let page_off = last.physical + (size / 4096 - last.logical / 4096) * 4096;
    let tail = (size % 4096) as usize;
    let poke = |byte: u8| {
        let dev = FileDev::open(&path, false).unwrap();
        let mut page = pages(1);
        dev.read_at(page_off, &mut page).unwrap();
        page[0].0[tail + 10] = byte;
        dev.write_at(page_off, &page).unwrap();
        dev.flush().unwrap();
    };
    poke(0x5a);
    // And a leak on the device (its saved free list loses its last range),
    // which the repair mount fixes: it too opens the device by path.
    {
        use inkfs::blockdev::layout;
        let dev = FileDev::open(&path, false).unwrap();
        let sb = inkfs::superblock::read_superblock(&pm).unwrap().0;
        let mut free = layout::read_save_area(&dev, sb.data_blocks, sb.mount_epoch).unwrap();
        free.pop().unwrap();
        layout::write_save_area(&dev, sb.data_blocks, sb.mount_epoch, &free).unwrap();
    }

    let check = |repair: bool| {
        inkfs::fsck::check(
            &pm,
            &inkfs::fsck::FsckOptions {
                repair,
                data: by_path(),
            },
        )
        .unwrap()
    };
    let r = check(false);
    assert!(
        r.problems
            .iter()
            .any(|p| p.kind == ProblemKind::PastEof && p.ino == Some(f.ino)),
        "{:?}",
        r.problems
    );
    assert!(
        r.problems.iter().any(|p| p.kind == ProblemKind::BlockLeak),
        "{:?}",
        r.problems
    );
    let r = check(true);
    assert_eq!(r.errors_remaining, 0, "{:?}", r.problems);
    assert!(
        r.problems
            .iter()
            .any(|p| p.kind == ProblemKind::PastEof && p.repaired),
        "{:?}",
        r.problems
    );
    let dev = FileDev::open(&path, true).unwrap();
    let mut page = pages(1);
    dev.read_at(page_off, &mut page).unwrap();
    assert!(page[0].0[tail..].iter().all(|&b| b == 0), "not zeroed");
    assert!(
        page[0].0[..tail] == want[(size as usize - tail)..],
        "file bytes changed"
    );
    drop(dev);
    let r = check(false);
    assert!(r.problems.is_empty(), "{:?}", r.problems);
}

/// A device whose reads take a millisecond, as a disk's do: a reader's
/// own misses are slow enough for the readahead threads to get ahead of
/// it (on a memory device the reader reads every block itself first).
/// Once the reading thread is named (`reader`, with the moment), its own
/// reads also wait until a read from another thread (the readahead) has
/// begun: on a loaded machine the readahead threads could otherwise get no
/// CPU until the reader had read the whole file itself, and read nothing.
/// The wait ends `WAIT_LIMIT` after the naming, for all reads at once.
#[derive(Debug)]
struct SlowReads {
    dev: Arc<MemDev>,
    reader: std::sync::Mutex<Option<(std::thread::ThreadId, std::time::Instant)>>,
    others: std::sync::atomic::AtomicU64,
}

impl SlowReads {
    fn new(dev: Arc<MemDev>) -> SlowReads {
        SlowReads {
            dev,
            reader: std::sync::Mutex::new(None),
            others: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The calling thread is the reader, from now.
    fn name_reader(&self) {
        *self.reader.lock().unwrap() =
            Some((std::thread::current().id(), std::time::Instant::now()));
    }
}

impl BlockDev for SlowReads {
    fn size_bytes(&self) -> u64 {
        self.dev.size_bytes()
    }
    fn read_at(&self, off: u64, buf: &mut [inkfs::blockdev::Page]) -> std::io::Result<()> {
        use std::sync::atomic::Ordering::SeqCst;
        let reader = *self.reader.lock().unwrap();
        if let Some((_, since)) = reader.filter(|(id, _)| *id == std::thread::current().id()) {
            // Not a panic at the limit: the test's own assertion then says
            // that nothing was read ahead.
            let deadline = since + inkfs::testkit::WAIT_LIMIT;
            while self.others.load(SeqCst) == 0 && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        } else if reader.is_some() {
            self.others.fetch_add(1, SeqCst);
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
        self.dev.read_at(off, buf)
    }
    fn write_at(&self, off: u64, data: &[inkfs::blockdev::Page]) -> std::io::Result<()> {
        self.dev.write_at(off, data)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.dev.flush()
    }
    fn describe(&self) -> String {
        "memory, slow reads (tests)".into()
    }
}

/// Reads a file sequentially on a fresh mount (cold cache) in 32 KiB
/// requests, waits for the readahead to go quiet, and returns the device
/// bytes read and the bytes read ahead.
fn cold_sequential_read(
    pm: SimPool,
    dev: Arc<MemDev>,
    ino: u64,
    size: usize,
) -> (SimPool, u64, u64) {
    let slow = Arc::new(SlowReads::new(dev));
    let mut o = opts(Mode::Strict, slow.clone());
    o.data_cache_bytes = Some(4 << 20); // readahead up to 1 MiB ahead
    let fs = Fs::mount(pm, o).unwrap();
    let fh = fs.open(ino).unwrap();
    let mut buf = vec![0u8; 32 << 10];
    slow.name_reader();
    let mut off = 0;
    while off < size {
        let n = fs.read(&fh, off as u64, &mut buf).unwrap();
        assert!(n > 0, "short file at {off}");
        off += n;
    }
    assert_eq!(fs.read(&fh, off as u64, &mut buf).unwrap(), 0);
    // Readahead runs on threads: wait until a read ahead is counted (a
    // worker counts after its read: a pause alone missed it under load),
    // then until nothing more arrives. The device bytes asserted on are an
    // upper bound: a read still to come can only be missed, not wrong.
    let limit = std::time::Instant::now() + inkfs::testkit::WAIT_LIMIT;
    while fs.data_stats().unwrap().readahead_bytes == 0 && std::time::Instant::now() < limit {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let mut last = fs.data_stats().unwrap();
    let quiet = std::time::Instant::now();
    loop {
        std::thread::sleep(std::time::Duration::from_millis(50));
        let s = fs.data_stats().unwrap();
        if s == last || quiet.elapsed() > std::time::Duration::from_secs(5) {
            break;
        }
        last = s;
    }
    fs.release(fh);
    let s = fs.data_stats().unwrap();
    (fs.unmount().unwrap(), s.bytes_read, s.readahead_bytes)
}

/// Readahead follows device blocks; a file's last reads must not read on
/// into the blocks that follow it on the device (the next file's, or the
/// file's own blocks freed by a truncate).
#[test]
fn readahead_stays_within_the_file_and_its_truncated_size() {
    let pm = SimPool::new(POOL);
    let dev: Arc<MemDev> = Arc::new(MemDev::new(DEV));
    format(&pm, &*dev, 4096);
    let fs = Fs::mount(pm, opts(Mode::Strict, dev.clone())).unwrap();
    // A then B, written one after the other: B's blocks follow A's.
    let (a, fa) = fs.create(1, b"a", 0o644, 0, 0).unwrap();
    let (_, fb) = fs.create(1, b"b", 0o644, 0, 0).unwrap();
    let a_size = 1 << 20;
    for (fh, n, seed) in [(&fa, a_size, 1u8), (&fb, 2 << 20, 2u8)] {
        let data = pattern(n, seed);
        for (i, chunk) in data.chunks(64 << 10).enumerate() {
            fs.write(fh, (i * (64 << 10)) as u64, chunk).unwrap();
        }
    }
    let a_ext = fs.fiemap(a.ino, 0, u64::MAX).unwrap();
    let b_ext = fs
        .fiemap(fs.lookup(1, b"b").unwrap().ino, 0, u64::MAX)
        .unwrap();
    let a_end = a_ext.iter().map(|e| e.physical + e.length).max().unwrap();
    assert!(
        b_ext.iter().any(|e| e.physical == a_end),
        "the test needs B's blocks right after A's: {a_ext:?} {b_ext:?}"
    );
    fs.release(fa);
    fs.release(fb);
    let pm = fs.unmount().unwrap();

    let (pm, read, ahead) = cold_sequential_read(pm, dev.clone(), a.ino, a_size);
    assert!(ahead > 0, "A is long enough to be read ahead");
    assert!(
        read <= a_size as u64,
        "read {read} bytes of the device for a file of {a_size}"
    );

    // Truncated to 600,000 bytes: its old tail is free blocks now.
    let fs = Fs::mount(pm, opts(Mode::Strict, dev.clone())).unwrap();
    let cut = 600_000usize;
    fs.setattr(
        a.ino,
        &SetAttr {
            size: Some(cut as u64),
            ..Default::default()
        },
    )
    .unwrap();
    let pm = fs.unmount().unwrap();
    let (pm, read, ahead) = cold_sequential_read(pm, dev.clone(), a.ino, cut);
    assert!(ahead > 0);
    let cut_pages = cut.div_ceil(4096) as u64 * 4096;
    assert!(
        read <= cut_pages,
        "read {read} bytes of the device for a file of {cut}"
    );
    // And the bytes are the file's.
    let fs = Fs::mount(pm, opts(Mode::Strict, dev)).unwrap();
    let fh = fs.open(a.ino).unwrap();
    let mut back = vec![0u8; cut + 10];
    assert_eq!(fs.read(&fh, 0, &mut back).unwrap(), cut);
    assert!(back[..cut] == pattern(a_size, 1)[..cut]);
    fs.release(fh);
}
