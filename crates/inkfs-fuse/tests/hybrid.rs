//! A hybrid pool (metadata on the pool in /dev/shm, large writes' data on
//! a data file on a disk file system) through the FUSE mount: files of
//! every size written, read back, kept across a clean remount and across
//! a SIGKILL of the server (what was fsynced); the mount's statistics show
//! both sides; a missing or wrong data device is refused, saying which.

mod common;

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use inkfs::api::{Filesystem, FormatOptions, HybridFormat};
use inkfs::blockdev::FileDev;

/// A hybrid pool: the pool in /dev/shm, its data file in /var/tmp (a disk
/// file system, so O_DIRECT and fdatasync are real); both removed on drop.
struct Hybrid {
    pool: Pool,
    data: PathBuf,
}

impl Hybrid {
    fn new(name: &str) -> Hybrid {
        let pid = std::process::id();
        let path = PathBuf::from(format!("/dev/shm/inkfs-fuse-test-{name}-{pid}.pool"));
        let data = PathBuf::from(format!("/var/tmp/inkfs-fuse-test-{name}-{pid}.data"));
        let _ = fs::remove_file(&path);
        let pm = inkfs::pmem::MappedPool::open(
            &path,
            &inkfs::pmem::PoolOpenOptions {
                create_size_bytes: Some(64 << 20),
                read_only: false,
            },
        )
        .expect("create pool");
        let dev = FileDev::create(&data, 256 << 20).expect("create data file");
        Filesystem::format_hybrid(
            &pm,
            &FormatOptions::default(),
            &HybridFormat {
                device: &dev,
                path: &data,
                blocks: None,
                threshold_bytes: 64 << 10,
                unit_blocks: 256,
            },
        )
        .expect("format hybrid pool");
        Hybrid {
            pool: Pool { path },
            data,
        }
    }
}

impl Drop for Hybrid {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.data);
    }
}

fn pattern(seed: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|j| (seed.wrapping_mul(31) ^ j.wrapping_mul(7) ^ (j >> 12)) as u8)
        .collect()
}

/// Sizes on both sides of the threshold, sequential and not.
const SIZES: [usize; 6] = [100, 5000, 70_000, 300_000, 1 << 20, (3 << 20) + 777];

fn write_files(root: &Path, tag: &str) {
    for (i, &len) in SIZES.iter().enumerate() {
        let mut f = fs::File::create(root.join(format!("{tag}{i}"))).unwrap();
        f.write_all(&pattern(i, len)).unwrap();
        f.sync_all().unwrap();
    }
}

fn check_files(root: &Path, tag: &str) {
    for (i, &len) in SIZES.iter().enumerate() {
        let got = fs::read(root.join(format!("{tag}{i}"))).unwrap();
        assert!(
            got == pattern(i, len),
            "{tag}{i}: {len} bytes read back differ"
        );
    }
}

fn stat_u64(v: &serde_json::Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("no {key} in the statistics: {v}"))
}

#[test]
fn hybrid_pool_through_fuse_in_every_mode() {
    for mode in ["strict", "sync", "posix"] {
        let h = Hybrid::new(&format!("hy-{mode}"));
        let opts = format!("mode={mode}");
        let m = Mounted::new(&h.pool, &opts);
        write_files(m.path(), "f");
        // An overwrite in the middle of a device-side file, then an
        // unaligned small one.
        let big = m.p("big");
        let mut want = pattern(9, 2 << 20);
        fs::write(&big, &want).unwrap();
        {
            use std::os::unix::fs::FileExt;
            let f = fs::OpenOptions::new().write(true).open(&big).unwrap();
            f.write_all_at(&[0xab; 200_000], 300_001).unwrap();
            want[300_001..500_001].fill(0xab);
            f.write_all_at(b"small", 1_000_003).unwrap();
            want[1_000_003..1_000_008].copy_from_slice(b"small");
            f.sync_all().unwrap();
        }
        check_files(m.path(), "f");
        assert!(fs::read(&big).unwrap() == want, "{mode}: big file differs");
        let s = stats_json(m.path()).expect("statistics");
        let total = stat_u64(&s, "data_bytes_total");
        let free = stat_u64(&s, "data_bytes_free");
        assert!(
            total - free >= 4 << 20,
            "{mode}: the large files are not on the data device: {s}"
        );
        assert!(stat_u64(&s, "data_bytes_written") >= 4 << 20, "{s}");
        assert!(stat_u64(&s, "pm_bytes_total") > 0, "{s}");
        let dir = m.unmount();
        let m = Mounted::at(&h.pool, dir, &opts);
        assert!(mounted_clean(m.path()));
        check_files(m.path(), "f");
        assert!(
            fs::read(m.p("big")).unwrap() == want,
            "{mode}: big file after remount"
        );
        drop(m);
        // fsck of the pool and its data device finds nothing.
        let r = inkfs::fsck::check(
            &inkfs::pmem::MappedPool::open(
                &h.pool.path,
                &inkfs::pmem::PoolOpenOptions {
                    create_size_bytes: None,
                    read_only: true,
                },
            )
            .unwrap(),
            &inkfs::fsck::FsckOptions::default(),
        )
        .unwrap();
        assert!(r.problems.is_empty(), "{mode}: {:?}", r.problems);
    }
}

#[test]
fn hybrid_kill9_keeps_fsynced_data() {
    for mode in ["strict", "posix"] {
        let h = Hybrid::new(&format!("hykill-{mode}"));
        let opts = format!("mode={mode}");
        let m = Mounted::new(&h.pool, &opts);
        let root = m.path().to_path_buf();
        let mut synced = Vec::new();
        for i in 0..12 {
            let len = 1000 + i * 97_003;
            let mut f = fs::File::create(root.join(format!("w{i}"))).unwrap();
            f.write_all(&pattern(i, len)).unwrap();
            f.sync_all().unwrap();
            synced.push((i, len));
        }
        // Written, not fsynced: posix may lose it, strict keeps it.
        fs::write(root.join("late"), pattern(99, 500_000)).unwrap();
        let dir = m.kill9();
        let m = Mounted::at(&h.pool, dir, &opts);
        assert!(
            !mounted_clean(m.path()),
            "{mode}: a kill leaves the pool to recover"
        );
        for (i, len) in synced {
            let got = fs::read(m.p(&format!("w{i}"))).unwrap();
            assert!(
                got == pattern(i, len),
                "{mode}: w{i} ({len} bytes) lost after the kill"
            );
        }
        if mode == "strict" {
            assert!(fs::read(m.p("late")).unwrap() == pattern(99, 500_000));
        }
    }
}

#[test]
fn a_missing_or_wrong_data_device_is_refused() {
    require_root();
    let h = Hybrid::new("hyrefuse");
    let other = Hybrid::new("hyother");
    let dir = tempfile::Builder::new()
        .prefix("inkfs-mnt-")
        .tempdir()
        .unwrap();
    let text = |o: std::process::Output| {
        assert!(!o.status.success(), "mounted: {o:?}");
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    let msg = text(mount_with(
        &h.pool.path,
        dir.path(),
        &format!("data={}", other.data.display()),
    ));
    assert!(msg.contains("another pool"), "{msg}");
    let moved = PathBuf::from(format!("{}.moved", h.data.display()));
    fs::rename(&h.data, &moved).unwrap();
    let msg = text(mount_with(&h.pool.path, dir.path(), ""));
    assert!(msg.contains("missing") && msg.contains("data="), "{msg}");
    // Named where it moved to, it mounts.
    let out = mount_with(
        &h.pool.path,
        dir.path(),
        &format!("data={}", moved.display()),
    );
    assert!(out.status.success(), "{out:?}");
    let pid = server_pid(dir.path()).unwrap();
    run(Command::new("umount").arg(dir.path()));
    wait_exit(pid);
    fs::rename(&moved, &h.data).unwrap();
}

/// fsck of the pool (and its data device, at the recorded path), read-only.
fn fsck_hybrid(h: &Hybrid) -> inkfs::fsck::FsckReport {
    inkfs::fsck::check(
        &inkfs::pmem::MappedPool::open(
            &h.pool.path,
            &inkfs::pmem::PoolOpenOptions {
                create_size_bytes: None,
                read_only: true,
            },
        )
        .unwrap(),
        &inkfs::fsck::FsckOptions::default(),
    )
    .unwrap()
}

/// kill -9 rounds on a hybrid pool, in every mode: a writer makes files on
/// both sides of the threshold (some in several writes, some rewriting an
/// earlier file in place), fsyncing each; the server is SIGKILLed while it
/// writes; then fsck (before recovery: nothing but what recovery undoes),
/// remount, every fsynced file as it was fsynced (in strict and sync mode
/// every completed write too), a clean unmount, and fsck finds nothing.
/// The same pool goes through every round, each starting from the last's
/// recovery. `INKFS_HYBRID_KILL9_ROUNDS` rounds per mode (default 2).
#[test]
fn hybrid_kill9_rounds_in_every_mode() {
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    let rounds: usize = std::env::var("INKFS_HYBRID_KILL9_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    for mode in ["strict", "sync", "posix"] {
        let h = Hybrid::new(&format!("hyk9-{mode}"));
        let opts = format!("mode={mode}");
        // name -> (seed, len) of its last completed (fsynced) version
        let mut want: BTreeMap<String, (usize, usize)> = BTreeMap::new();
        let mut m = Mounted::new(&h.pool, &opts);
        for round in 0..rounds {
            let root = m.path().to_path_buf();
            let pid = m.pid;
            let done = Arc::new(AtomicUsize::new(0));
            let seen = done.clone();
            // Kill once some files are down, a varying moment later, so
            // that the kill lands in a write, an fsync or between them.
            let killer = std::thread::spawn(move || {
                let t = Instant::now();
                while seen.load(Ordering::Relaxed) < 12 && t.elapsed() < Duration::from_secs(20) {
                    std::thread::sleep(Duration::from_millis(2));
                }
                std::thread::sleep(Duration::from_millis(7 + 13 * round as u64));
                // SAFETY: kill has no memory preconditions.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            });
            let mut completed = 0;
            let t = Instant::now();
            for i in 0.. {
                if t.elapsed() > Duration::from_secs(30) {
                    break;
                }
                // Sizes across the 64 KiB threshold; every fifth write
                // rewrites an earlier file of this round in place.
                let len = [3000, 70_000, 200_000, 600_001, 9000][i % 5] + i * 17;
                let seed = round * 10_000 + i;
                let name = if i % 5 == 4 && i > 5 {
                    format!("r{round}-w{}", i - 5)
                } else {
                    format!("r{round}-w{i}")
                };
                let data = pattern(seed, len);
                let r = (|| -> std::io::Result<()> {
                    let mut f = fs::OpenOptions::new()
                        .write(true)
                        .create(true)
                        .truncate(false)
                        .open(root.join(&name))?;
                    for piece in data.chunks(len / 3 + 1) {
                        f.write_all(piece)?;
                    }
                    f.set_len(len as u64)?;
                    f.sync_all()?;
                    Ok(())
                })();
                if r.is_err() {
                    // The server died: this file's state is unknown.
                    want.remove(&name);
                    break;
                }
                want.insert(name, (seed, len));
                completed += 1;
                done.store(completed, Ordering::Relaxed);
            }
            killer.join().unwrap();
            assert!(
                completed >= 12,
                "{mode} round {round}: {completed} files before the kill"
            );
            let dir = m.kill9();
            let r = fsck_hybrid(&h);
            assert_eq!(
                r.errors_found(),
                0,
                "{mode} round {round}: fsck after the kill: {:?}",
                r.problems
            );
            m = Mounted::at(&h.pool, dir, &opts);
            assert!(!mounted_clean(m.path()), "{mode}: the kill, recovered");
            for (name, &(seed, len)) in &want {
                let got =
                    fs::read(m.p(name)).unwrap_or_else(|e| panic!("{mode}: {name} lost: {e}"));
                assert!(
                    got == pattern(seed, len),
                    "{mode} round {round}: {name} ({len} bytes) differs after the kill"
                );
            }
            // A clean unmount of the recovered pool, then fsck: nothing.
            let dir = m.unmount();
            let r = fsck_hybrid(&h);
            assert!(
                r.problems.is_empty(),
                "{mode} round {round}: fsck after recovery: {:?}",
                r.problems
            );
            m = Mounted::at(&h.pool, dir, &opts);
            assert!(mounted_clean(m.path()));
        }
        drop(m);
    }
}

/// A file larger than the mount's DRAM cache of device blocks, read
/// sequentially after a remount (nothing cached): the readahead threads
/// read most of it (`data_readahead_bytes`) and every byte is right; read
/// again at random 4 KiB offsets, nothing is read ahead. Then in sync
/// mode, an overwrite in the middle while a reader streams the file: the
/// reader's bytes after it are the new ones (a block read ahead before the
/// write is not served after it).
#[test]
fn a_sequential_reader_is_read_ahead_through_the_mount() {
    require_root();
    let h = Hybrid::new("hyra");
    let len = 40 << 20;
    let want = pattern(5, len);
    {
        let m = Mounted::new(&h.pool, "mode=sync");
        fs::write(m.p("f"), &want).unwrap();
    }
    // Both ways of reading ahead (threads, io_uring); a bad one refused.
    let out = mount_with(
        &h.pool.path,
        Path::new("/nonexistent"),
        "data_readahead=lots",
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("data_readahead=lots"));
    for how in ["uring", "threads"] {
        let opts = format!("mode=sync,data_cache=8M,data_readahead={how}");
        let m = Mounted::new(&h.pool, &opts);
        read_ahead_checks(&m, &want, how);
    }
}

fn read_ahead_checks(m: &Mounted, want: &[u8], how: &str) {
    let len = want.len();
    let s0 = stats_json(m.path()).expect("statistics");
    let got = {
        use std::io::Read;
        let mut f = fs::File::open(m.p("f")).unwrap();
        let mut got = Vec::with_capacity(len);
        let mut buf = vec![0u8; 128 << 10];
        loop {
            let n = f.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        got
    };
    assert!(got == want, "{how}: the file read back differs");
    let s1 = stats_json(m.path()).expect("statistics");
    let ahead = stat_u64(&s1, "data_readahead_bytes") - stat_u64(&s0, "data_readahead_bytes");
    assert!(
        ahead >= (len / 2) as u64,
        "{how}: read ahead {ahead} of {len} bytes"
    );
    if how != "threads" {
        return;
    }
    // Random 4 KiB reads (no page cache: O_DIRECT through FUSE is a read
    // request each): nothing read ahead.
    {
        use std::os::unix::fs::{FileExt, OpenOptionsExt};
        let f = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(m.p("f"))
            .unwrap();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut buf = vec![0u8; 4096];
        for _ in 0..200 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let off = (x % (len as u64 / 4096)) * 4096;
            f.read_exact_at(&mut buf, off).unwrap();
            assert!(
                buf[..] == want[off as usize..off as usize + 4096],
                "offset {off}"
            );
        }
    }
    let s2 = stats_json(m.path()).expect("statistics");
    assert_eq!(
        stat_u64(&s2, "data_readahead_bytes"),
        stat_u64(&s1, "data_readahead_bytes"),
        "random reads were read ahead"
    );
    // Streaming again, with an overwrite half way (in place: sync mode).
    {
        use std::io::Read;
        use std::os::unix::fs::{FileExt, OpenOptionsExt};
        let mut f = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(m.p("f"))
            .unwrap();
        let w = fs::OpenOptions::new().write(true).open(m.p("f")).unwrap();
        let mut buf = vec![0u8; 128 << 10];
        let mut at = 0usize;
        let mut want = want.to_vec();
        while at < len {
            if at == len / 2 {
                // The readahead has the next window in the cache by now.
                w.write_all_at(&[0xee; 1 << 20], (at + (256 << 10)) as u64)
                    .unwrap();
                want[at + (256 << 10)..at + (256 << 10) + (1 << 20)].fill(0xee);
            }
            let n = f.read(&mut buf).unwrap();
            assert!(n > 0);
            assert!(
                buf[..n] == want[at..at + n],
                "offset {at} after the overwrite"
            );
            at += n;
        }
    }
}

/// A posix hybrid mount answers a write-back that appended to fresh device
/// blocks only after a shared flush and the commit of its tail
/// (inkfs-fuse `writeback.rs`): a file whose write-backs were answered
/// (fsync waits for them; the mount answers FSYNC with ENOSYS) survives a
/// SIGKILL of the server, and the statistics show the write-backs were
/// deferred and committed by shared flushes.
#[test]
fn answered_write_backs_survive_a_kill_of_the_server() {
    let h = Hybrid::new("hydefer");
    let m = Mounted::new(&h.pool, "mode=posix");
    assert!(
        writeback_cache(m.path()),
        "a posix mount has the writeback cache by default"
    );
    let root = m.path().to_path_buf();
    let mut files = Vec::new();
    for i in 0..3 {
        let len = (4 << 20) + i * 12_345;
        let mut f = fs::File::create(root.join(format!("d{i}"))).unwrap();
        for chunk in pattern(i, len).chunks(256 << 10) {
            f.write_all(chunk).unwrap();
        }
        f.sync_all().unwrap();
        files.push((i, len));
    }
    let s = stats_json(&root).expect("statistics");
    let appends = stat_u64(&s, "data_deferred_appends");
    let rounds = stat_u64(&s, "data_deferred_rounds");
    assert!(appends >= 3, "no write-back was deferred: {s}");
    assert!(rounds >= 1 && rounds <= appends, "{s}");
    let dir = m.kill9();
    let m = Mounted::at(&h.pool, dir, "mode=posix");
    assert!(
        !mounted_clean(m.path()),
        "a kill leaves the pool to recover"
    );
    for (i, len) in files {
        let got = fs::read(m.p(&format!("d{i}"))).unwrap();
        assert!(
            got == pattern(i, len),
            "d{i} ({len} bytes) lost after the kill"
        );
    }
    drop(m);
    let r = fsck_hybrid(&h);
    assert!(r.problems.is_empty(), "{:?}", r.problems);
}
