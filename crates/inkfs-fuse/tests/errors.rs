//! Corruption met while mounted, end to end through FUSE (errors=): a pool
//! whose file "victim" has a damaged log entry (cleanly unmounted, so the
//! mount does not read it) is mounted; `ls -l` must show the damage
//! instead of hiding the name, `inkfs stat MOUNTPOINT` must count it, and
//! writes must get EROFS afterwards (errors=remount-ro) or keep working
//! (errors=continue); the next read-write mount must refuse the pool; a
//! scrub must find damage nobody touched. Needs root and fuse3.

mod common;

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;

use common::*;
use inkfs::format::*;
use inkfs::pmem::{read_pod, MappedPool, PoolFile, PoolOpenOptions};
use inkfs::types::MountOptions;
use inkfs::Fs;

fn open_pool(path: &Path) -> MappedPool {
    MappedPool::open(
        path,
        &PoolOpenOptions {
            create_size_bytes: None,
            read_only: false,
        },
    )
    .expect("open pool")
}

/// Files "victim" and "bystander", a directory "dir" with "inner", through
/// the engine; returns the inode numbers of victim and inner.
fn populate(pool: &Pool) -> (u64, u64) {
    let fs = Fs::mount(open_pool(&pool.path), MountOptions::default()).unwrap();
    let (v, fh) = fs.create(ROOT_INO, b"victim", 0o644, 0, 0).unwrap();
    fs.write(&fh, 0, &[7u8; 5000]).unwrap();
    fs.release(fh);
    let (_, fh) = fs.create(ROOT_INO, b"bystander", 0o644, 0, 0).unwrap();
    fs.write(&fh, 0, b"fine").unwrap();
    fs.release(fh);
    let d = fs.mkdir(ROOT_INO, b"dir", 0o755, 0, 0).unwrap();
    let (inner, fh) = fs.create(d.ino, b"inner", 0o644, 0, 0).unwrap();
    fs.release(fh);
    fs.unmount().unwrap();
    (v.ino, inner.ino)
}

/// Pool offset of a byte inside the first log entry of `ino`.
fn entry_byte(pool: &Pool, ino: u64) -> u64 {
    // No claim: the pool may be mounted.
    let file = PoolFile::open_unlocked(&pool.path).expect("open pool");
    let pm = MappedPool::map(
        file,
        &PoolOpenOptions {
            create_size_bytes: None,
            read_only: true,
        },
    )
    .expect("map pool");
    let sb: Superblock = read_pod(&pm, 0);
    let (lane, slot) = ino_to_lane_slot(ino, sb.lane_count);
    assert!(slot < INODES_PER_TABLE_BLOCK);
    let table = lane_first_block(lane) + LANE_INODE_TABLE_BLOCK;
    let rec: InodeRecord = read_pod(&pm, table * BLOCK_SIZE + slot * INODE_RECORD_SIZE);
    rec.log_head * BLOCK_SIZE + 20
}

/// Flip a byte of the pool file (through the file: a mounted pool's server
/// maps the same pages, as a media error would show).
fn flip(pool: &Pool, off: u64) {
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&pool.path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, off).unwrap();
    f.write_all_at(&[b[0] ^ 0x5a], off).unwrap();
}

/// One value of the server's JSON statistics (`inkfs stat MOUNTPOINT --json`).
fn stat_value(m: &Mounted, key: &str) -> serde_json::Value {
    let report = stats_json(m.path()).expect("statistics of the mount");
    report
        .get(key)
        .cloned()
        .unwrap_or_else(|| panic!("no {key} in {report}"))
}

fn errno_of(r: std::io::Result<()>) -> i32 {
    r.expect_err("expected an error")
        .raw_os_error()
        .unwrap_or(0)
}

#[test]
fn remount_ro_surfaces_the_damage_counts_it_and_refuses_writes() {
    require_tool("fusermount3", "fuse3");
    let pool = Pool::new("errors-ro", 64);
    let (victim, _) = populate(&pool);
    flip(&pool, entry_byte(&pool, victim));
    let m = Mounted::new(&pool, "");
    assert_eq!(stat_value(&m, "fs_errors"), 0);

    // ls -l: the name is listed and the error said (it was left out).
    let out = tool("ls").arg("-l").arg(m.path()).output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(!out.status.success(), "ls -l succeeded:\n{stdout}");
    assert!(stdout.contains("victim"), "victim hidden:\n{stdout}");
    assert!(
        stderr.contains("victim") && stderr.contains("Input/output error"),
        "{stderr}"
    );
    assert!(stdout.contains("bystander"), "{stdout}");
    let e = fs::metadata(m.p("victim")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO));

    // Counted, and the file system is read-only now.
    assert_ne!(stat_value(&m, "fs_errors"), 0);
    assert_eq!(stat_value(&m, "remounted_read_only"), true);
    assert_eq!(stat_value(&m, "errors_policy"), "remount-ro");
    assert!(stat_value(&m, "last_error")
        .as_str()
        .is_some_and(|e| e.contains(&format!("inode {victim}, log"))));
    assert_eq!(
        errno_of(fs::write(m.p("new"), b"x")),
        libc::EROFS,
        "create after the error"
    );
    assert_eq!(errno_of(fs::write(m.p("bystander"), b"x")), libc::EROFS);
    assert_eq!(errno_of(fs::create_dir(m.p("d2"))), libc::EROFS);
    assert_eq!(errno_of(fs::remove_file(m.p("bystander"))), libc::EROFS);
    // Reads go on.
    assert_eq!(fs::read(m.p("bystander")).unwrap(), b"fine");
    assert!(fs::read_dir(m.p("dir")).unwrap().count() == 1);

    // The next read-write mount refuses, naming fsck; read-only works.
    let dir = m.unmount();
    let out = mount_with(&pool.path, dir.path(), "");
    assert!(!out.status.success(), "a read-write mount took the pool");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("inkfs fsck -y"), "{err}");
    assert!(!is_mounted(dir.path()));
    let m = Mounted::at(&pool, dir, "ro");
    assert_eq!(fs::read(m.p("bystander")).unwrap(), b"fine");
    let _ = m.unmount();
}

#[test]
fn continue_keeps_serving() {
    require_tool("fusermount3", "fuse3");
    let pool = Pool::new("errors-continue", 64);
    let (victim, _) = populate(&pool);
    flip(&pool, entry_byte(&pool, victim));
    let m = Mounted::new(&pool, "errors=continue");
    let e = fs::metadata(m.p("victim")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO));
    assert_ne!(stat_value(&m, "fs_errors"), 0);
    assert_eq!(stat_value(&m, "remounted_read_only"), false);
    assert_eq!(stat_value(&m, "errors_policy"), "continue");
    fs::write(m.p("new"), b"still writable").unwrap();
    assert_eq!(fs::read(m.p("new")).unwrap(), b"still writable");
    let dir = m.unmount();
    assert!(!mount_with(&pool.path, dir.path(), "").status.success());
    // A bad value is refused before anything happens.
    let out = mount_with(&pool.path, dir.path(), "errors=panic");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("errors=panic"));
}

/// The scrub runs inside the server and finds damage in an inode nobody
/// touched (the kernel never asked for it), on a live mount.
#[test]
fn scrub_finds_damage_nobody_touched() {
    require_tool("fusermount3", "fuse3");
    let pool = Pool::new("errors-scrub", 64);
    let (_, inner) = populate(&pool);
    let m = Mounted::new(&pool, "");
    let mut calls = 0;
    let clean = inkfs_fuse::scrub::request(m.path(), &mut |d, t| {
        assert!(d <= t);
        calls += 1;
    })
    .expect("an inkfs mount")
    .expect("scrub ran");
    assert!(calls >= 1);
    assert!(clean.findings.is_empty(), "{clean:?}");
    assert!(clean.count("inodes") >= 5, "{clean:?}");
    assert!(clean.json.contains("\"clean\":true"), "{}", clean.json);

    // Damage "dir/inner" under the running server, which never loaded it.
    flip(&pool, entry_byte(&pool, inner));
    let found = inkfs_fuse::scrub::request(m.path(), &mut |_, _| {})
        .unwrap()
        .unwrap();
    assert_eq!(found.findings.len(), 1, "{found:?}");
    assert_eq!(found.findings[0].ino, Some(inner));
    assert_eq!(found.findings[0].reason, "log");
    assert_eq!(found.count("read_only"), 1);
    // Into the same errors= path as any other error.
    assert_eq!(stat_value(&m, "remounted_read_only"), true);
    assert_eq!(errno_of(fs::write(m.p("x"), b"x")), libc::EROFS);
    // Not a mount point: no server to ask.
    let plain = tempfile::tempdir().unwrap();
    assert!(inkfs_fuse::scrub::request(plain.path(), &mut |_, _| {}).is_none());
}
