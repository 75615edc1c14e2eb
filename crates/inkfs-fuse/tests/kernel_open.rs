//! Regular files opened by the kernel alone (mount option `kernel_open`,
//! crates/inkfs-fuse/src/open.rs): no OPEN or RELEASE reaches the server,
//! and what a per-open handle used to keep still holds: an unlinked file
//! stays readable and writable until its last close and is freed after
//! it, O_TRUNC truncates, a file renamed over stays readable through its
//! open descriptor, fsync after a close and a reopen is durable. The
//! whole suite runs with the option on through
//! `INKFS_TEST_MOUNT_OPTS=mode=posix,kernel_open` (kernel_open_clients.rs:
//! with the preload library). Root required (FUSE).

mod common;

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;

const OPTS: &str = "mode=posix,kernel_open";

fn count(mnt: &Path, op: &str) -> u64 {
    let s = stats_json(mnt).expect("statistics of the mount");
    s["ops"][op]["count"].as_u64().unwrap_or(0)
}

/// The removed inodes the kernel still holds, and the engine handles the
/// server keeps for files the kernel opened (`crate::open`).
fn held(mnt: &Path) -> (u64, u64) {
    let s = stats_json(mnt).expect("statistics of the mount");
    let n = |k: &str| s[k].as_u64().unwrap_or_else(|| panic!("{k} in {s}"));
    (n("kernel_pins"), n("kernel_open_files"))
}

/// Wait until the server holds no removed inode and no file handle (the
/// kernel forgets inodes asynchronously), then check it.
fn wait_nothing_held(mnt: &Path, what: &str) {
    let deadline = Instant::now() + inkfs::testkit::WAIT_LIMIT;
    while held(mnt) != (0, 0) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(held(mnt), (0, 0), "{what}");
}

fn mount(pool: &Pool) -> Mounted {
    let m = Mounted::new(pool, OPTS);
    let s = stats_json(m.path()).expect("statistics of the mount");
    assert_eq!(s["kernel_open"], true, "kernel_open is on: {s}");
    m
}

/// Ten opens and closes of a file cost at most one OPEN (the one answered
/// ENOSYS) and no RELEASE; the data written through each is there.
#[test]
fn opens_and_closes_send_no_requests() {
    kernel_only("counts the FUSE requests of opens");
    let pool = Pool::new("ko-count", 64);
    let m = mount(&pool);
    let p = m.p("f");
    fs::write(&p, b"0").unwrap();
    let (open0, release0) = (count(m.path(), "open"), count(m.path(), "release"));
    for i in 1..=10u8 {
        let mut f = fs::OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(&[b'0' + i % 10]).unwrap();
    }
    assert_eq!(fs::read(&p).unwrap(), b"01234567890");
    let opens = count(m.path(), "open") - open0;
    assert!(opens <= 1, "{opens} OPEN requests for ten opens");
    assert_eq!(count(m.path(), "release") - release0, 0, "no RELEASE");
    m.unmount();
}

/// An unlinked file stays readable and writable through its descriptor
/// until it is closed, and its inode is freed once the kernel forgets it.
#[test]
fn unlinked_open_file_lives_until_closed() {
    let pool = Pool::new("ko-unlinked", 64);
    let m = mount(&pool);
    let p = m.p("u");
    let mut f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    f.write_all(&vec![7u8; 10_000]).unwrap();
    f.sync_all().unwrap();
    fs::remove_file(&p).unwrap();
    assert!(!p.exists());
    // Written back after the unlink, read from the server (the kernel's
    // cache dropped first by a fresh read of a cold range).
    f.write_all_at(&vec![9u8; 5000], 20_000).unwrap();
    f.sync_all().unwrap();
    let mut back = vec![0u8; 25_000];
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_exact(&mut back).unwrap();
    assert!(back[..10_000].iter().all(|&b| b == 7));
    assert!(back[10_000..20_000].iter().all(|&b| b == 0));
    assert!(back[20_000..].iter().all(|&b| b == 9));
    // Still held while open.
    assert_eq!(held(m.path()), (1, 1), "held while open");
    drop(f);
    // The kernel forgets an unlinked inode at its last close.
    wait_nothing_held(m.path(), "freed after the last close");
    let s = stats_json(m.path()).unwrap();
    assert_eq!(s["held_orphans"], 0, "no orphan left: {s}");
    m.unmount();
}

/// open(O_TRUNC) of an existing file empties it (the kernel sends the
/// truncation as a SETATTR: no OPEN carries it).
#[test]
fn o_trunc_truncates() {
    let pool = Pool::new("ko-trunc", 64);
    let m = mount(&pool);
    let p = m.p("t");
    fs::write(&p, vec![1u8; 100_000]).unwrap();
    let dir = m.unmount();
    // Remounted: the kernel has nothing of the file cached.
    let m = Mounted::at(&pool, dir, OPTS);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    f.write_all(b"short").unwrap();
    drop(f);
    assert_eq!(fs::metadata(&p).unwrap().len(), 5);
    let dir = m.unmount();
    let m = Mounted::at(&pool, dir, OPTS);
    let got = fs::read(&p).unwrap();
    assert_eq!(got.len(), 5, "size after a remount");
    assert_eq!(got, b"short", "after a remount");
    m.unmount();
}

/// A file renamed over while open keeps its data for its descriptor; the
/// new file is at the name.
#[test]
fn rename_over_open_file() {
    let pool = Pool::new("ko-rename", 64);
    let m = mount(&pool);
    fs::write(m.p("old"), vec![3u8; 8192]).unwrap();
    fs::write(m.p("new"), b"new").unwrap();
    let f = fs::File::open(m.p("old")).unwrap();
    fs::rename(m.p("new"), m.p("old")).unwrap();
    let mut buf = vec![0u8; 8192];
    f.read_exact_at(&mut buf, 0).unwrap();
    assert!(buf.iter().all(|&b| b == 3));
    assert_eq!(fs::read(m.p("old")).unwrap(), b"new");
    assert_eq!(held(m.path()).0, 1, "held while open");
    drop(f);
    // The file now at the name keeps its handle while the kernel caches
    // it: only the pin of the replaced one must go.
    let deadline = Instant::now() + inkfs::testkit::WAIT_LIMIT;
    while held(m.path()).0 != 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(held(m.path()).0, 0, "the replaced file freed");
    m.unmount();
}

/// Written, closed, reopened and fsynced: what a SIGKILL of the server
/// then leaves is the data.
#[test]
fn fsync_after_reopen_is_durable() {
    let pool = Pool::new("ko-fsync", 64);
    let m = mount(&pool);
    let p = m.p("d");
    fs::write(&p, b"first").unwrap();
    let f = fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.write_all_at(b"SECOND", 5).unwrap();
    f.sync_all().unwrap();
    let dir = m.kill9();
    let m = Mounted::at(&pool, dir, OPTS);
    assert_eq!(fs::read(&p).unwrap(), b"firstSECOND");
    m.unmount();
}
