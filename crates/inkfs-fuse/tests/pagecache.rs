//! Posix mode through the kernel's page cache (FUSE's writeback cache),
//! as docs/MODES.md promises it: whatever was made durable (fsync,
//! fdatasync, O_SYNC, O_DSYNC, syncfs, sync, msync, close) survives a
//! SIGKILL of the server, and what was not is old or new bytes, never
//! garbage; times and sizes are the kernel's and are what a remount shows;
//! O_APPEND holds with several writers; write-only descriptors work; the
//! kernel is told what changed behind its back. Root required (FUSE,
//! setpriv, chattr).
//!
//! A SIGKILL loses what the kernel had not written back (its dirty pages
//! die with the connection) but nothing the server wrote (the pool is
//! mapped memory): these tests check that each durability point has the
//! kernel write back, and the server take, everything it covers before it
//! returns. The order of the engine's own stores (a power cut) is the
//! crash simulator's (crates/inkfs/tests/crash_*.rs).

mod common;

use std::fs;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use common::*;

const POSIX: &str = "mode=posix";

fn posix(pool: &Pool) -> Mounted {
    let m = Mounted::new(pool, POSIX);
    assert!(
        writeback_cache(m.path()),
        "posix mode mounts with the cache"
    );
    m
}

/// `len` bytes of a pattern distinct for each `seed`.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = inkfs::testkit::Rng::new(seed);
    rng.bytes(len)
}

fn as_user(uid: u32, script: &str) -> Output {
    tool("setpriv")
        .args([
            &format!("--reuid={uid}"),
            &format!("--regid={uid}"),
            "--clear-groups",
            "sh",
            "-c",
            script,
        ])
        .output()
        .expect("run setpriv")
}

fn ok(out: Output, what: &str) {
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

const PAGE: usize = 4096;

/// Write `data` at `off` of `path` through a shared mapping (the file is
/// extended to cover it first), then `sync` the mapping as asked.
fn write_mapped(path: &Path, off: usize, data: &[u8], msync: bool) -> fs::File {
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .unwrap();
    let len = off + data.len();
    if (f.metadata().unwrap().len() as usize) < len {
        f.set_len(len as u64).unwrap();
    }
    // SAFETY: a fresh shared mapping of `len` bytes of a file at least that
    // long; written within bounds, unmapped before returning.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
        std::ptr::copy_nonoverlapping(data.as_ptr(), (p as *mut u8).add(off), data.len());
        if msync {
            assert_eq!(libc::msync(p, len, libc::MS_SYNC), 0);
        }
        libc::munmap(p, len);
    }
    f
}

/// Each durability point, then SIGKILL of the server: everything it
/// covered is there after recovery; what nothing covered is old or new
/// bytes page by page, never garbage.
#[test]
fn every_durability_point_survives_kill9() {
    let pool = Pool::new("pc-kill9", 256);
    let m = posix(&pool);
    let p = |n: &str| m.p(n);
    let len = 5 * PAGE + 123;
    let mut keep = Vec::new(); // descriptors left open across the kill

    // fsync and fdatasync: then an overwrite nothing covers.
    for (name, data_only) in [("fsync", false), ("fdatasync", true)] {
        let f = fs::File::create(p(name)).unwrap();
        f.write_all_at(&pattern(1, len), 0).unwrap();
        if data_only {
            f.sync_data().unwrap();
        } else {
            f.sync_all().unwrap();
        }
        f.write_all_at(&pattern(2, PAGE), PAGE as u64).unwrap();
        keep.push(f);
    }
    // O_SYNC and O_DSYNC: each write durable on return.
    for (name, flag) in [("osync", libc::O_SYNC), ("odsync", libc::O_DSYNC)] {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(flag)
            .open(p(name))
            .unwrap();
        f.write_all(&pattern(3, len)).unwrap();
        keep.push(f);
    }
    // syncfs(2) and sync(2): everything written before them.
    let f = fs::File::create(p("syncfs")).unwrap();
    f.write_all_at(&pattern(4, len), 0).unwrap();
    // SAFETY: syncfs on an open descriptor.
    assert_eq!(unsafe { libc::syncfs(f.as_raw_fd()) }, 0);
    keep.push(f);
    let f = fs::File::create(p("sync")).unwrap();
    f.write_all_at(&pattern(5, len), 0).unwrap();
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
    keep.push(f);
    // msync(MS_SYNC) of a shared mapping; fsync of a mapped file.
    keep.push(write_mapped(&p("msync"), 3, &pattern(6, len), true));
    let f = write_mapped(&p("mmap-fsync"), 0, &pattern(7, len), false);
    f.sync_all().unwrap();
    keep.push(f);
    // close(2): FUSE writes a file's dirty pages back before close returns,
    // and the server makes each write-back durable before answering it.
    fs::write(p("closed"), pattern(8, len)).unwrap();
    // Metadata: durable when the call returns, in every mode.
    fs::create_dir(p("dir")).unwrap();
    fs::write(p("moved"), b"m").unwrap();
    fs::rename(p("moved"), p("dir/moved")).unwrap();
    // Not covered by anything: written, left open and dirty.
    let f = fs::File::create(p("unsynced")).unwrap();
    f.write_all_at(&pattern(9, len), 0).unwrap();
    keep.push(f);

    let dir = m.kill9();
    drop(keep); // their closes fail on the dead connection: nothing to flush to
    let m = Mounted::at(&pool, dir, POSIX);
    assert!(!mounted_clean(m.path()), "a crash, recovered");
    let read = |n: &str| fs::read(m.p(n)).unwrap_or_else(|e| panic!("{n}: {e}"));
    for name in ["fsync", "fdatasync"] {
        let got = read(name);
        let (old, new) = (pattern(1, len), pattern(2, PAGE));
        assert_eq!(got.len(), len, "{name}: size");
        assert_eq!(got[..PAGE], old[..PAGE], "{name}: page 0");
        assert!(
            got[PAGE..2 * PAGE] == old[PAGE..2 * PAGE] || got[PAGE..2 * PAGE] == new[..],
            "{name}: the unsynced overwrite left neither old nor new bytes"
        );
        assert_eq!(got[2 * PAGE..], old[2 * PAGE..], "{name}: pages 2..");
    }
    for (name, seed) in [("osync", 3), ("odsync", 3), ("syncfs", 4), ("sync", 5)] {
        assert!(read(name) == pattern(seed, len), "{name}: lost");
    }
    assert!(read("msync")[3..] == pattern(6, len)[..], "msync: lost");
    assert!(read("mmap-fsync") == pattern(7, len), "mmap + fsync: lost");
    assert!(read("closed") == pattern(8, len), "close: lost");
    assert_eq!(read("dir/moved"), b"m");
    assert!(!m.p("moved").exists(), "rename half done");
    let got = read("unsynced");
    let want = pattern(9, len);
    assert!(got.len() <= len, "unsynced: longer than written");
    for (i, page) in got.chunks(PAGE).enumerate() {
        let w = &want[i * PAGE..][..page.len()];
        assert!(
            page == w || page.iter().all(|&b| b == 0),
            "unsynced: page {i} is neither written bytes nor zeros"
        );
    }
}

/// Data written through a shared mapping and fsynced (or only unmapped and
/// closed) is in the pool after a clean remount.
#[test]
fn mmap_writes_reach_the_pool() {
    let pool = Pool::new("pc-mmap", 64);
    let m = posix(&pool);
    let len = 3 * PAGE + 10;
    let f = write_mapped(&m.p("synced"), 100, &pattern(11, len), false);
    f.sync_all().unwrap();
    drop(f);
    drop(write_mapped(&m.p("unmapped"), 0, &pattern(12, len), false));
    let dir = m.unmount();
    let m = Mounted::at(&pool, dir, POSIX);
    assert!(fs::read(m.p("synced")).unwrap()[100..] == pattern(11, len)[..]);
    assert!(fs::read(m.p("unmapped")).unwrap() == pattern(12, len));
}

/// (size, mtime, ctime) as stat shows them.
fn times(path: &Path) -> (u64, (i64, i64), (i64, i64)) {
    let md = fs::metadata(path).unwrap();
    (
        md.size(),
        (md.mtime(), md.mtime_nsec()),
        (md.ctime(), md.ctime_nsec()),
    )
}

/// Under the cache the kernel keeps a regular file's size, mtime and ctime
/// and sends them to the server: what stat shows while mounted is what the
/// pool keeps (a remount, with nothing cached, shows the same to the
/// nanosecond), and every kind of change moves them as on ext4.
#[test]
fn times_and_sizes_are_the_kernels_and_persist() {
    let pool = Pool::new("pc-times", 64);
    let m = posix(&pool);
    let pause = || std::thread::sleep(Duration::from_millis(20));
    let mut seen = Vec::new();

    // write(2): size, mtime and ctime move together.
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.p("w"))
        .unwrap();
    let (_, m0, _) = times(&m.p("w"));
    pause();
    f.write_all_at(b"0123456789", 0).unwrap();
    let (size, m1, c1) = times(&m.p("w"));
    assert_eq!(size, 10);
    assert!(m1 > m0, "write moved mtime");
    assert_eq!(m1, c1, "write stamps mtime and ctime alike");
    // A write far past the end: a hole of zeros between.
    f.write_all_at(b"end", (1 << 20) + 5).unwrap();
    assert_eq!(times(&m.p("w")).0, (1 << 20) + 8);
    let mut hole = vec![1u8; 100];
    f.read_exact_at(&mut hole, 4096).unwrap();
    assert!(hole.iter().all(|&b| b == 0), "hole reads as zeros");
    drop(f);
    seen.push("w");

    // ftruncate, shrinking and growing.
    let f = fs::OpenOptions::new().write(true).open(m.p("w")).unwrap();
    pause();
    f.set_len(3000).unwrap();
    let (size, m2, _) = times(&m.p("w"));
    assert_eq!(size, 3000);
    assert!(m2 > m1, "truncate moved mtime");
    f.set_len(9000).unwrap();
    assert_eq!(times(&m.p("w")).0, 9000);
    drop(f);

    // A write through a mapping moves mtime too.
    fs::write(m.p("mapped"), vec![5u8; 2 * PAGE]).unwrap();
    let (_, before, _) = times(&m.p("mapped"));
    pause();
    let f = write_mapped(&m.p("mapped"), PAGE, b"mapped write", true);
    drop(f);
    assert!(times(&m.p("mapped")).1 > before, "mmap write moved mtime");
    seen.push("mapped");

    // utimensat with explicit times, then chmod (ctime only).
    fs::write(m.p("touched"), b"t").unwrap();
    let ts = [
        libc::timespec {
            tv_sec: 1_000_000_000,
            tv_nsec: 123_456_789,
        },
        libc::timespec {
            tv_sec: 1_200_000_000,
            tv_nsec: 987_654_321,
        },
    ];
    let c = std::ffi::CString::new(m.p("touched").as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path and two timespecs, both live for the call.
    assert_eq!(
        unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), ts.as_ptr(), 0) },
        0
    );
    assert_eq!(times(&m.p("touched")).1, (1_200_000_000, 987_654_321));
    let (_, _, c0) = times(&m.p("touched"));
    pause();
    fs::set_permissions(m.p("touched"), fs::Permissions::from_mode(0o600)).unwrap();
    let (_, mt, ct) = times(&m.p("touched"));
    assert_eq!(mt, (1_200_000_000, 987_654_321), "chmod keeps mtime");
    assert!(ct > c0, "chmod moved ctime");
    seen.push("touched");

    // Appends from several opens, the last one left to the flusher.
    for i in 0..5u8 {
        let mut a = fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(m.p("appended"))
            .unwrap();
        a.write_all(&[i; 1000]).unwrap();
        pause();
    }
    assert_eq!(times(&m.p("appended")).0, 5000);
    seen.push("appended");

    let before: Vec<_> = seen.iter().map(|n| times(&m.p(n))).collect();
    let dir = m.unmount();
    let m = Mounted::at(&pool, dir, POSIX);
    let after: Vec<_> = seen.iter().map(|n| times(&m.p(n))).collect();
    for ((name, b), a) in seen.iter().zip(&before).zip(&after) {
        assert_eq!(
            b, a,
            "{name}: (size, mtime, ctime) before unmount, after remount"
        );
    }
}

/// O_APPEND through the cache with several writers at once (threads with
/// descriptors of their own, and processes): every record lands whole,
/// once, in its writer's order, and nothing is overwritten.
#[test]
fn o_append_with_several_writers() {
    let pool = Pool::new("pc-append", 64);
    let m = posix(&pool);
    let path = m.p("log");
    const REC: usize = 64;
    const PER: usize = 400;
    let record = |w: usize, i: usize| {
        let mut r = format!("w{w:02} r{i:05} ").into_bytes();
        r.resize(REC - 1, b'.');
        r.push(b'\n');
        r
    };
    let threads: Vec<_> = (0..4)
        .map(|w| {
            let path = path.clone();
            std::thread::spawn(move || {
                let mut f = fs::OpenOptions::new()
                    .append(true)
                    .create(true)
                    .open(&path)
                    .unwrap();
                for i in 0..PER {
                    f.write_all(&record(w, i)).unwrap();
                    if i % 97 == 0 {
                        f.sync_data().unwrap();
                    }
                }
            })
        })
        .collect();
    // Two more writers in processes of their own (the shell's >> is O_APPEND).
    let shells: Vec<_> = (4..6)
        .map(|w| {
            let lines: String = (0..PER)
                .map(|i| String::from_utf8(record(w, i)).unwrap())
                .collect();
            let script = format!(
                "while IFS= read -r l; do printf '%s\\n' \"$l\" >> '{}'; done",
                path.display()
            );
            let mut c = tool("sh")
                .arg("-c")
                .arg(script)
                .stdin(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let mut stdin = c.stdin.take().unwrap();
            std::thread::spawn(move || stdin.write_all(lines.as_bytes()).unwrap());
            c
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    for mut c in shells {
        assert!(c.wait().unwrap().success());
    }
    let check = |data: &[u8]| {
        assert_eq!(data.len(), 6 * PER * REC, "every record, once");
        let mut next = [0usize; 6];
        for r in data.chunks(REC) {
            let w: usize = std::str::from_utf8(&r[1..3]).unwrap().parse().unwrap();
            assert_eq!(r, record(w, next[w]), "a torn or misplaced record");
            next[w] += 1;
        }
        assert!(next.iter().all(|&n| n == PER));
    };
    check(&fs::read(&path).unwrap());
    let dir = m.unmount();
    let m = Mounted::at(&pool, dir, POSIX);
    check(&fs::read(m.p("log")).unwrap());
}

/// A partial-page write through a write-only descriptor: the kernel reads
/// the rest of the page through that same descriptor to fill its cache.
#[test]
fn write_only_descriptors_fill_pages() {
    let pool = Pool::new("pc-wronly", 64);
    let m = posix(&pool);
    let old = pattern(21, 3 * PAGE);
    fs::write(m.p("f"), &old).unwrap();
    // Remount: nothing of the file cached.
    let dir = m.unmount();
    let m = Mounted::at(&pool, dir, POSIX);
    let f = fs::OpenOptions::new().write(true).open(m.p("f")).unwrap();
    f.write_all_at(b"patch", PAGE as u64 + 100).unwrap();
    drop(f);
    let mut want = old;
    want[PAGE + 100..PAGE + 105].copy_from_slice(b"patch");
    assert!(fs::read(m.p("f")).unwrap() == want);
    let dir = m.unmount();
    let m = Mounted::at(&pool, dir, POSIX);
    assert!(fs::read(m.p("f")).unwrap() == want);
}

/// Another user writes a file they may write but do not own: the kernel
/// sends the new times with that user's credentials when it writes them
/// back (at close here); they are the kernel's own stamps, not a `touch`
/// to chosen times, which only the owner may do.
#[test]
fn a_writer_who_is_not_the_owner_can_close() {
    require_tool("setpriv", "util-linux");
    let pool = Pool::new("pc-owner", 64);
    let m = posix(&pool);
    fs::write(m.p("shared"), b"0123456789").unwrap();
    fs::set_permissions(m.p("shared"), fs::Permissions::from_mode(0o666)).unwrap();
    fs::set_permissions(m.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let (_, m0, _) = times(&m.p("shared"));
    std::thread::sleep(Duration::from_millis(20));
    // dd reports a failed close.
    let q = m.p("shared").display().to_string();
    ok(
        as_user(
            65534,
            &format!("printf ab | dd of={q} bs=1 seek=3 conv=notrunc status=none"),
        ),
        "nobody writes and closes a file it may write",
    );
    assert_eq!(fs::read(m.p("shared")).unwrap(), b"012ab56789");
    assert!(times(&m.p("shared")).1 > m0, "the write moved mtime");
    // A chosen time is still the owner's alone.
    let out = as_user(65534, &format!("touch -d 2001-01-01 {q}"));
    assert!(
        !out.status.success(),
        "nobody set chosen times on root's file"
    );
}

/// The kernel writes back the ctime it stamps on a file it has just
/// unlinked, after the last close freed that file in the pool: the server
/// must take it, or the kernel keeps the error for the mount and the next
/// syncfs(2) fails (filebench's fileserver and webproxy did, ENOENT).
#[test]
fn unlinking_a_closed_file_leaves_no_error_for_syncfs() {
    let pool = Pool::new("pc-unlink-syncfs", 64);
    let m = posix(&pool);
    // The server's count (statfs's is bounded by free blocks too).
    let free_inodes = || {
        stats_json(m.path()).expect("statistics of the mount")["inodes_free"]
            .as_u64()
            .expect("inodes_free")
    };
    fs::write(m.p("old"), pattern(7, PAGE)).unwrap();
    let before = free_inodes();
    for i in 0..4 {
        let p = m.p(&format!("f{i}"));
        fs::write(&p, pattern(i, 3 * PAGE)).unwrap();
        fs::remove_file(&p).unwrap();
    }
    // A rename over a file removes its last name too.
    fs::write(m.p("new"), pattern(8, PAGE)).unwrap();
    fs::rename(m.p("new"), m.p("old")).unwrap();
    let d = fs::File::open(m.path()).unwrap();
    // SAFETY: syncfs on an open descriptor.
    let r = unsafe { libc::syncfs(d.as_raw_fd()) };
    assert_eq!(r, 0, "syncfs: {}", std::io::Error::last_os_error());
    assert_eq!(fs::read(m.p("old")).unwrap(), pattern(8, PAGE));
    // The removed files are freed once the kernel forgets them (at once:
    // nothing holds them), so nothing leaks: one file, as before.
    let deadline = std::time::Instant::now() + inkfs::testkit::WAIT_LIMIT;
    while free_inodes() != before && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(free_inodes(), before, "an unlinked file was never freed");
}

/// The kernel keeps attributes for an hour (`CACHE_TTL`): a change it did
/// not make itself must be pushed to it, or stat shows the old value. In
/// every mode. (The set-id bits an unprivileged write or O_TRUNC open
/// drops: the kernel, which asks the server to drop them
/// (FUSE_HANDLE_KILLPRIV_V2), forgets the mode itself; chattr's ctime is
/// the server's to push.)
#[test]
fn the_kernel_is_told_what_it_did_not_change() {
    require_tool("setpriv", "util-linux");
    require_tool("chattr", "e2fsprogs");
    for opts in ["mode=strict", POSIX] {
        let pool = Pool::new("pc-inval", 64);
        let m = Mounted::new(&pool, opts);
        fs::set_permissions(m.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let mode = |n: &str| fs::metadata(m.p(n)).unwrap().permissions().mode() & 0o7777;
        // A write by an unprivileged user drops set-user-ID (the server's
        // doing: the kernel leaves it to FUSE_HANDLE_KILLPRIV_V2 servers).
        fs::write(m.p("suid"), b"#!/bin/sh\n").unwrap();
        fs::set_permissions(m.p("suid"), fs::Permissions::from_mode(0o4777)).unwrap();
        assert_eq!(mode("suid"), 0o4777); // cached now
        let q = m.p("suid").display().to_string();
        ok(
            as_user(65534, &format!("printf x >> {q}")),
            "nobody appends",
        );
        assert_eq!(
            mode("suid"),
            0o777,
            "{opts}: set-user-ID shown after a write by nobody"
        );
        // So does an O_TRUNC open by an unprivileged user.
        fs::set_permissions(m.p("suid"), fs::Permissions::from_mode(0o6777)).unwrap();
        assert_eq!(mode("suid"), 0o6777);
        ok(as_user(65534, &format!(": > {q}")), "nobody truncates");
        assert_eq!(
            mode("suid"),
            0o777,
            "{opts}: set-id shown after O_TRUNC by nobody"
        );
        // chattr changes a directory's ctime (and flags) with an ioctl.
        fs::create_dir(m.p("d")).unwrap();
        let ctime = |n: &str| {
            let md = fs::metadata(m.p(n)).unwrap();
            (md.ctime(), md.ctime_nsec())
        };
        let c0 = ctime("d");
        std::thread::sleep(Duration::from_millis(20));
        ok(
            tool("chattr").arg("+d").arg(m.p("d")).output().unwrap(),
            "chattr",
        );
        assert!(ctime("d") > c0, "{opts}: chattr's ctime shown");
        let report = stats_json(m.path()).unwrap();
        assert!(report["invalidations"].as_u64().unwrap() >= 1, "{report}");
    }
}

/// SEEK_DATA and SEEK_HOLE see the file as the kernel has it, cached
/// writes included (the kernel does not write back before asking the
/// server, so under the cache it answers itself: all data up to its size).
#[test]
fn seek_data_and_hole_see_cached_writes() {
    let pool = Pool::new("pc-seek", 64);
    let m = posix(&pool);
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.p("sparse"))
        .unwrap();
    f.write_all_at(&[1u8; 8192], 0).unwrap();
    f.write_all_at(&[2u8; 4096], 65536).unwrap();
    let seek = |off: i64, whence: i32| {
        // SAFETY: plain syscall on an open descriptor.
        let r = unsafe { libc::lseek(f.as_raw_fd(), off, whence) };
        if r < 0 {
            Err(std::io::Error::last_os_error().raw_os_error().unwrap())
        } else {
            Ok(r)
        }
    };
    let size = 65536 + 4096;
    for off in [0, 100, 8192, 20000, 65536, size - 1] {
        let data = seek(off, libc::SEEK_DATA).unwrap_or_else(|e| panic!("SEEK_DATA {off}: {e}"));
        let hole = seek(off, libc::SEEK_HOLE).unwrap_or_else(|e| panic!("SEEK_HOLE {off}: {e}"));
        // Where data was written, SEEK_DATA stays; no hole before the end
        // covers written bytes.
        if !(8192..65536).contains(&off) {
            assert_eq!(data, off, "SEEK_DATA from written bytes at {off}");
            assert!(hole > off, "SEEK_HOLE from written bytes at {off}");
        }
        assert!((off..=size).contains(&data) && (off..=size).contains(&hole));
        assert!(
            !(hole < 8192 || (65536..size).contains(&hole)),
            "a hole in written bytes"
        );
    }
    assert_eq!(seek(size, libc::SEEK_DATA), Err(libc::ENXIO));
}

#[test]
fn writeback_cache_options() {
    let pool = Pool::new("pc-opts", 64);
    for (opts, cached) in [
        (POSIX, true),
        ("mode=posix,writeback_cache", true),
        ("mode=posix,nowriteback_cache", false),
        ("mode=posix,nodefault_permissions", false),
        ("mode=posix,ro", false),
        ("mode=strict", false),
        ("mode=sync", false),
    ] {
        let m = Mounted::new(&pool, opts);
        assert_eq!(writeback_cache(m.path()), cached, "{opts}");
    }
    let dir = tempfile::tempdir().unwrap();
    for opts in [
        "mode=strict,writeback_cache",
        "mode=sync,writeback_cache",
        "mode=posix,nodefault_permissions,writeback_cache",
    ] {
        let out = mount_with(&pool.path, dir.path(), opts);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{opts} refused as a usage error"
        );
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("writeback_cache"),
            "{opts}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
