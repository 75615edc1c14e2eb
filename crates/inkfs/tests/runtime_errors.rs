//! Corruption met while mounted (ext4's `errors=`): a clean mount reads no
//! log, so a damaged entry is met at run time. It must be counted, said,
//! recorded in the superblock, turn the file system read-only under
//! `remount-ro` (or leave the rest serving under `continue`); the next
//! read-write mount must refuse the pool until fsck finds it clean; and a
//! scrub must find damage in inodes nobody touched, on a live file system.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use inkfs::format::*;
use inkfs::fsck::{self, FsckOptions, ProblemKind};
use inkfs::pmem::{read_pod, Pmem, SimPool};
use inkfs::types::*;
use inkfs::{Error, Fs};

type F = Fs<SimPool>;
const R: u64 = ROOT_INO;

fn opts(errors: ErrorsPolicy) -> MountOptions {
    MountOptions {
        errors,
        ..Default::default()
    }
}

/// A pool with files "victim" and "bystander" and a directory "dir"
/// holding "inner", cleanly unmounted. Returns the pool and the inode
/// numbers (victim, bystander, dir).
fn pool() -> (SimPool, u64, u64, u64) {
    let pm = SimPool::new(16 << 20);
    Fs::format(
        &pm,
        &FormatOptions {
            lanes: 2,
            ..Default::default()
        },
    )
    .unwrap();
    let fs = Fs::mount(pm, MountOptions::default()).unwrap();
    let (v, fh) = fs.create(R, b"victim", 0o644, 0, 0).unwrap();
    fs.write(&fh, 0, &[7u8; 5000]).unwrap();
    fs.release(fh);
    let (b, fh) = fs.create(R, b"bystander", 0o644, 0, 0).unwrap();
    fs.write(&fh, 0, b"fine").unwrap();
    fs.release(fh);
    let d = fs.mkdir(R, b"dir", 0o755, 0, 0).unwrap();
    let (_, fh) = fs.create(d.ino, b"inner", 0o644, 0, 0).unwrap();
    fs.release(fh);
    (fs.unmount().unwrap(), v.ino, b.ino, d.ino)
}

/// Byte offset of `ino`'s record (following its lane's table chain).
fn rec_off(pm: &SimPool, ino: u64) -> u64 {
    let sb: Superblock = read_pod(pm, 0);
    let (lane, slot) = ino_to_lane_slot(ino, sb.lane_count);
    let mut block = lane_first_block(lane) + LANE_INODE_TABLE_BLOCK;
    for _ in 0..slot / INODES_PER_TABLE_BLOCK {
        let t: TableTrailer = read_pod(pm, block * BLOCK_SIZE + TABLE_TRAILER_OFFSET);
        block = t.next_block;
    }
    block * BLOCK_SIZE + (slot % INODES_PER_TABLE_BLOCK) * INODE_RECORD_SIZE
}

/// Pool offset of a byte inside the first entry of `ino`'s log (its
/// attribute snapshot): flipping it breaks that entry's checksum, and
/// nothing else (the superblock stays valid).
fn entry_byte(pm: &SimPool, ino: u64) -> u64 {
    let rec: InodeRecord = read_pod(pm, rec_off(pm, ino));
    LogPageSpan::of(rec.log_head).base + 20
}

fn flip(pm: &SimPool, off: u64) {
    let mut b = [0u8; 1];
    pm.read(off, &mut b);
    pm.write(off, &[b[0] ^ 0x5a]);
    pm.persist(off, 1);
}

fn media_superblocks(pm: &SimPool) -> [Superblock; 2] {
    [
        read_pod(pm, SUPER_PRIMARY_BLOCK * BLOCK_SIZE),
        read_pod(pm, SUPER_BACKUP_BLOCK * BLOCK_SIZE),
    ]
}

#[track_caller]
fn errno<T: std::fmt::Debug>(r: inkfs::Result<T>) -> i32 {
    match r {
        Ok(v) => panic!("expected an error, got Ok({v:?})"),
        Err(e) => e.errno(),
    }
}

fn read_all(fs: &F, ino: u64) -> Vec<u8> {
    let fh = fs.open(ino).unwrap();
    let mut buf = vec![0u8; 1 << 16];
    let n = fs.read(&fh, 0, &mut buf).unwrap();
    fs.release(fh);
    buf.truncate(n);
    buf
}

/// Uses only the API that existed before errors= (it fails on that code:
/// the create succeeded, and the next read-write mount took the pool).
#[test]
fn regression_a_damaged_log_met_at_run_time_turns_the_fs_read_only_and_is_remembered() {
    let (pm, victim, bystander, _) = pool();
    flip(&pm, entry_byte(&pm, victim));
    let fs = Fs::mount(pm, MountOptions::default()).unwrap();
    assert_eq!(errno(fs.lookup(R, b"victim")), libc::EIO);
    // Reads go on; every mutating call is refused.
    assert_eq!(read_all(&fs, bystander), b"fine");
    assert_eq!(errno(fs.create(R, b"new", 0o644, 0, 0)), libc::EROFS);
    assert_eq!(errno(fs.mkdir(R, b"d2", 0o755, 0, 0)), libc::EROFS);
    let fh = fs.open(bystander).unwrap();
    assert_eq!(errno(fs.write(&fh, 0, b"x")), libc::EROFS);
    fs.release(fh);
    assert!(fs.lookup(R, b"new").is_err());
    let pm = fs.unmount().unwrap();
    match Fs::mount(pm, MountOptions::default()) {
        Err(e) => assert!(e.to_string().contains("fsck"), "{e}"),
        Ok(_) => panic!("a pool with a recorded error mounted read-write"),
    }
}

#[test]
fn remount_ro_counts_records_refuses_and_fsck_clears() {
    let (pm, victim, bystander, _) = pool();
    let at = entry_byte(&pm, victim);
    flip(&pm, at);
    let before = media_superblocks(&pm)[0];
    let fs = Fs::mount(pm, opts(ErrorsPolicy::RemountRo)).unwrap();
    assert_eq!(fs.error_stats().count, 0);
    assert!(!fs.is_read_only());

    // Met through lookup: EIO, counted, recorded, read-only.
    let e = fs.lookup(R, b"victim").unwrap_err();
    assert!(matches!(e, Error::Corrupt(_)), "{e:?}");
    let s = fs.error_stats();
    assert_eq!(
        (s.count, s.policy, s.remounted_ro),
        (1, ErrorsPolicy::RemountRo, true)
    );
    assert!(fs.is_read_only());
    assert_eq!(s.recorded.count, 1);
    let first = s.recorded.first.unwrap();
    assert_eq!(first.ino, Some(victim));
    assert_eq!(first.reason(), Some(ErrorReason::Log));
    assert_eq!(s.recorded.last, s.recorded.first);
    // On media, in both copies, sealed.
    for sb in media_superblocks(fs.pmem()) {
        assert_eq!(sb.checksum, sb.compute_checksum());
        assert_eq!(sb.errors_count, 1);
        assert_eq!(sb.first_error_ino, victim);
        assert_eq!(sb.first_error_reason, ErrorReason::Log.code());
        assert!(sb.first_error_unix_ns >= before.created_unix_ns);
        assert_eq!(sb.version, FORMAT_VERSION);
    }
    // Met again: counted again; the first error stays the first.
    assert_eq!(errno(fs.getattr(victim)), libc::EIO);
    let s = fs.error_stats();
    assert_eq!((s.count, s.recorded.count), (2, 2));
    assert_eq!(s.recorded.first, Some(first));
    // Reads keep working, writes and GC stop.
    assert_eq!(read_all(&fs, bystander), b"fine");
    let mut names = Vec::new();
    fs.readdir(R, 0, &mut |e| {
        names.push(e.name);
        true
    })
    .unwrap();
    assert_eq!(names.len(), 5);
    assert_eq!(errno(fs.unlink(R, b"bystander")), libc::EROFS);
    assert_eq!(
        errno(fs.setattr(
            bystander,
            &SetAttr {
                mode: Some(0o600),
                ..Default::default()
            }
        )),
        libc::EROFS
    );
    assert_eq!(
        errno(fs.setxattr(bystander, b"user.a", b"1", XattrFlags::Any)),
        libc::EROFS
    );
    let pm = fs.unmount().unwrap();
    // A clean unmount (so a read-only mount needs no scan); record kept.
    for sb in media_superblocks(&pm) {
        assert_eq!((sb.state, sb.errors_count), (STATE_CLEAN, 2));
    }

    // The next read-write mount refuses, saying what to do; read-only is fine.
    let msg = match Fs::mount(pm.clone_image(), MountOptions::default()) {
        Err(Error::BadPool(m)) => m,
        Err(e) => panic!("expected BadPool, got {e:?}"),
        Ok(_) => panic!("mounted read-write"),
    };
    assert!(msg.contains("inkfs fsck -y"), "{msg}");
    assert!(msg.contains(&format!("inode {victim}")), "{msg}");
    let ro = Fs::mount(
        pm.clone_image(),
        MountOptions {
            read_only: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(ro.error_stats().recorded.count, 2);
    assert_eq!(read_all(&ro, bystander), b"fine");
    drop(ro);

    // fsck reports the record; -y keeps it while the log is still damaged.
    let r = fsck::check(
        &pm,
        &FsckOptions {
            repair: false,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(
        r.errors().any(|p| p.kind == ProblemKind::ErrorsRecorded),
        "{:#?}",
        r.problems
    );
    assert!(r
        .errors()
        .any(|p| p.kind == ProblemKind::Log && p.ino == Some(victim)));
    assert_eq!(r.exit_code(), 4);
    let r = fsck::check(
        &pm,
        &FsckOptions {
            repair: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(r.exit_code(), 4);
    assert!(r
        .errors()
        .any(|p| p.kind == ProblemKind::ErrorsRecorded && !p.repaired));
    assert!(Fs::mount(pm.clone_image(), MountOptions::default()).is_err());

    // The damage undone (what a repair of the log would do): -y finds
    // nothing else wrong and clears the record; the pool mounts again.
    flip(&pm, at);
    let r = fsck::check(
        &pm,
        &FsckOptions {
            repair: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(
        r.errors()
            .all(|p| p.kind == ProblemKind::ErrorsRecorded && p.repaired),
        "{:#?}",
        r.problems
    );
    assert_eq!(r.exit_code(), 1);
    for sb in media_superblocks(&pm) {
        assert_eq!(sb.errors_count, 0);
        assert_eq!(sb.checksum, sb.compute_checksum());
    }
    let r = fsck::check(
        &pm,
        &FsckOptions {
            repair: false,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(r.exit_code(), 0, "{:#?}", r.problems);
    let fs = Fs::mount(pm, MountOptions::default()).unwrap();
    assert_eq!(read_all(&fs, victim), vec![7u8; 5000]);
    assert_eq!(fs.error_stats().recorded.count, 0);
    fs.create(R, b"after", 0o644, 0, 0)
        .map(|(_, h)| fs.release(h))
        .unwrap();
    fs.unmount().unwrap();
}

#[test]
fn readdir_of_a_damaged_directory_is_counted() {
    let (pm, _, _, dir) = pool();
    flip(&pm, entry_byte(&pm, dir));
    let fs = Fs::mount(pm, MountOptions::default()).unwrap();
    assert_eq!(errno(fs.readdir(dir, 0, &mut |_| true)), libc::EIO);
    let s = fs.error_stats();
    assert_eq!(s.count, 1);
    assert_eq!(s.recorded.last.unwrap().ino, Some(dir));
    assert!(s.remounted_ro);
    // The root, which names it, still lists it.
    let mut names = Vec::new();
    fs.readdir(R, 0, &mut |e| {
        names.push(e.name);
        true
    })
    .unwrap();
    assert!(names.iter().any(|n| n == b"dir"));
}

#[test]
fn continue_keeps_serving_and_still_refuses_the_next_mount() {
    let (pm, victim, bystander, _) = pool();
    flip(&pm, entry_byte(&pm, victim));
    let fs = Fs::mount(pm, opts(ErrorsPolicy::Continue)).unwrap();
    assert_eq!(errno(fs.lookup(R, b"victim")), libc::EIO);
    assert_eq!(errno(fs.open(victim)), libc::EIO);
    assert_eq!(errno(fs.unlink(R, b"victim")), libc::EIO);
    let s = fs.error_stats();
    assert_eq!((s.count, s.recorded.count, s.remounted_ro), (3, 3, false));
    assert!(!fs.is_read_only());
    // Other inodes keep serving, writes included.
    let (_, fh) = fs.create(R, b"new", 0o644, 0, 0).unwrap();
    fs.write(&fh, 0, b"still writable").unwrap();
    fs.release(fh);
    assert_eq!(read_all(&fs, bystander), b"fine");
    let pm = fs.unmount().unwrap();
    // A clean unmount; the record survives it.
    let [sb, _] = media_superblocks(&pm);
    assert_eq!((sb.state, sb.errors_count), (STATE_CLEAN, 3));
    assert!(matches!(
        Fs::mount(pm, MountOptions::default()),
        Err(Error::BadPool(_))
    ));
}

/// Damage met when the blocks of a loaded inode are freed (its log is
/// walked again) goes through the same path.
#[test]
fn damage_met_by_unlink_is_counted() {
    let (pm, victim, _, _) = pool();
    let fs = Fs::mount(pm, opts(ErrorsPolicy::Continue)).unwrap();
    // Loaded while intact, damaged afterwards (a media error).
    fs.getattr(victim).unwrap();
    flip(fs.pmem(), entry_byte(fs.pmem(), victim));
    fs.unlink(R, b"victim").unwrap();
    let s = fs.error_stats();
    assert_eq!(s.count, 1);
    assert_eq!(s.recorded.first.unwrap().ino, Some(victim));
}

/// Damage log GC meets (a loaded inode's page chain broken since it was
/// loaded) goes through the same path; GC leaves that log alone.
#[test]
fn damage_met_by_log_gc_is_counted() {
    let (pm, victim, _, _) = pool();
    let fs = Fs::mount(pm, opts(ErrorsPolicy::Continue)).unwrap();
    let fh = fs.open(victim).unwrap();
    // Two pages of entries, all but the last dead (one hot page).
    for i in 0..70u32 {
        fs.write(&fh, 0, &[i as u8; 100]).unwrap();
    }
    assert!(fs.log_pages(victim).unwrap() >= 2);
    assert_eq!(fs.error_stats().count, 0);
    // Break the head page's link to the next page.
    let rec: InodeRecord = read_pod(fs.pmem(), rec_off(fs.pmem(), victim));
    let link = LogPageSpan::of(rec.log_head).footer();
    fs.pmem().write_u64(link, 1);
    fs.pmem().persist(link, 8);
    // Enough appends for compaction (and fast GC) to come due.
    for i in 0..200u32 {
        fs.write(&fh, 0, &[i as u8; 100]).unwrap();
    }
    fs.release(fh);
    let s = fs.error_stats();
    assert!(s.count >= 1, "{s:?}");
    assert_eq!(s.recorded.first.unwrap().ino, Some(victim));
    assert_eq!(s.recorded.first.unwrap().reason(), Some(ErrorReason::Log));
}

/// A read-only mount counts and reports, and writes nothing.
#[test]
fn read_only_mount_counts_but_does_not_write() {
    let (pm, victim, _, _) = pool();
    flip(&pm, entry_byte(&pm, victim));
    let image = pm.current_image();
    let fs = Fs::mount(
        pm,
        MountOptions {
            read_only: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(errno(fs.getattr(victim)), libc::EIO);
    let s = fs.error_stats();
    assert_eq!((s.count, s.recorded.count, s.remounted_ro), (1, 0, false));
    let pm = fs.unmount().unwrap();
    assert!(pm.current_image() == image, "a read-only mount wrote");
}

/// Version 2 pools (reserved bytes where the record now is) mount, and
/// their zero record means "no errors".
#[test]
fn a_version_2_pool_has_no_record_and_is_upgraded() {
    let (pm, _, _, _) = pool();
    for block in [SUPER_PRIMARY_BLOCK, SUPER_BACKUP_BLOCK] {
        let mut sb: Superblock = read_pod(&pm, block * BLOCK_SIZE);
        sb.version = 2;
        sb.seal();
        inkfs::pmem::write_pod(&pm, block * BLOCK_SIZE, &sb);
        pm.persist(block * BLOCK_SIZE, 256);
    }
    let fs = Fs::mount(pm, MountOptions::default()).unwrap();
    assert_eq!(fs.error_stats().recorded, ErrorRecord::default());
    let pm = fs.unmount().unwrap();
    assert_eq!(media_superblocks(&pm)[0].version, FORMAT_VERSION);
}

// ---------------------------------------------------------------- scrub

fn scrub(fs: &F) -> inkfs::scrub::ScrubReport {
    let mut last = None;
    let r = fs.scrub(&mut |p| {
        assert!(p.done <= p.total);
        last = Some(p);
        true
    });
    let last = last.expect("progress reported");
    assert_eq!(last.done, last.total);
    r
}

#[test]
fn scrub_of_a_clean_pool_is_clean() {
    let (pm, _, _, _) = pool();
    let fs = Fs::mount(pm, MountOptions::default()).unwrap();
    // Some loaded, some not.
    fs.lookup(R, b"bystander").unwrap();
    let r = scrub(&fs);
    assert!(r.is_clean(), "{:#?}", r.problems);
    // root, victim, bystander, dir, inner.
    assert_eq!(r.inodes, 5);
    assert_eq!((r.superblocks, r.journals), (2, 2));
    assert!(r.log_entries >= 5 && r.log_pages >= 5 && r.table_blocks >= 2);
    assert_eq!(fs.error_stats().count, 0);
    assert!(!fs.is_read_only());
}

#[test]
fn scrub_finds_damage_in_an_inode_nobody_touched() {
    let (pm, victim, bystander, dir) = pool();
    let fs = Fs::mount(pm, MountOptions::default()).unwrap();
    // Damage while mounted: the victim was never loaded by this mount.
    let inner = fs.lookup(dir, b"inner").unwrap().ino;
    flip(fs.pmem(), entry_byte(fs.pmem(), victim));
    let r = scrub(&fs);
    assert_eq!(r.problems.len(), 1, "{:#?}", r.problems);
    let p = &r.problems[0];
    assert_eq!((p.reason, p.ino), (ErrorReason::Log, Some(victim)));
    assert!(p.message.contains("checksum"), "{}", p.message);
    // Into the errors= path: counted, recorded, read-only.
    let s = fs.error_stats();
    assert_eq!((s.count, s.recorded.count, s.remounted_ro), (1, 1, true));
    assert_eq!(errno(fs.create(R, b"x", 0o644, 0, 0)), libc::EROFS);
    // Damage to a loaded inode is found too (checked under its lock).
    flip(fs.pmem(), entry_byte(fs.pmem(), inner));
    let r = scrub(&fs);
    let inos: Vec<_> = r.problems.iter().map(|p| p.ino).collect();
    assert_eq!(inos, vec![Some(victim), Some(inner)], "{:#?}", r.problems);
    assert_eq!(read_all(&fs, bystander), b"fine");
}

#[test]
fn scrub_finds_damaged_superblocks_journals_and_tables() {
    let (pm, _, _, _) = pool();
    let fs = Fs::mount(pm, opts(ErrorsPolicy::Continue)).unwrap();
    let pm = fs.pmem();
    // A byte of the backup superblock's reserved area.
    flip(pm, SUPER_BACKUP_BLOCK * BLOCK_SIZE + 200);
    // A commit word in lane 1's idle journal.
    let j = (lane_first_block(1) + LANE_JOURNAL_BLOCK) * BLOCK_SIZE + 8;
    pm.write_u64(j, 0x1234_0001);
    pm.persist(j, 8);
    // Lane 0's first table block's trailer magic.
    let t = (lane_first_block(0) + LANE_INODE_TABLE_BLOCK) * BLOCK_SIZE + TABLE_TRAILER_OFFSET;
    flip(pm, t);
    let r = scrub(&fs);
    let reasons: Vec<_> = r.problems.iter().map(|p| p.reason).collect();
    assert_eq!(
        reasons,
        vec![
            ErrorReason::Superblock,
            ErrorReason::Journal,
            ErrorReason::InodeTable
        ],
        "{:#?}",
        r.problems
    );
    assert!(r.problems[0].message.contains("backup"));
    assert_eq!(fs.error_stats().count, 3);
    // The record was written: both copies equal and sealed again.
    let [p, b] = media_superblocks(pm);
    assert_eq!(p, b);
    assert_eq!(p.errors_count, 3);
}

/// No false alarm while the file system changes under the scrub: inodes
/// are created, loaded, written, renamed, freed and their slots reused
/// while it runs (the lock-free check of unloaded inodes must not report
/// what a concurrent change did).
#[test]
fn scrub_during_concurrent_changes_reports_nothing() {
    let (pm, _, _, dir) = pool();
    let fs = Arc::new(Fs::mount(pm, MountOptions::default()).unwrap());
    // Many unloaded inodes for the scrub to walk without locks.
    for i in 0..200u32 {
        let (_, fh) = fs
            .create(dir, format!("cold{i}").as_bytes(), 0o644, 0, 0)
            .unwrap();
        fs.write(&fh, 0, &vec![i as u8; 100 + i as usize * 37])
            .unwrap();
        fs.release(fh);
    }
    let pm = Arc::try_unwrap(fs).ok().unwrap().unmount().unwrap();
    let fs = Arc::new(Fs::mount(pm, MountOptions::default()).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..2u32)
        .map(|t| {
            let (fs, stop) = (fs.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    let cold = format!("cold{}", (n * 7 + t) % 200);
                    // Load and change a cold inode, with log GC on the way.
                    if let Ok(a) = fs.lookup(dir, cold.as_bytes()) {
                        if let Ok(fh) = fs.open(a.ino) {
                            let _ = fs.write(&fh, (n as u64 % 8) * 4096, &[n as u8; 4096]);
                            fs.release(fh);
                        }
                    }
                    let name = format!("t{t}-{}", n % 16);
                    let _ = fs.unlink(R, name.as_bytes());
                    if let Ok((_, fh)) = fs.create(R, name.as_bytes(), 0o644, 0, 0) {
                        let _ = fs.write(&fh, 0, b"churn");
                        fs.release(fh);
                    }
                    let _ = fs.rename(
                        R,
                        name.as_bytes(),
                        dir,
                        format!("moved{t}").as_bytes(),
                        RenameFlags::default(),
                    );
                    n += 1;
                }
            })
        })
        .collect();
    let mut scrubs = 0;
    let started = std::time::Instant::now();
    while scrubs < 3 || started.elapsed() < std::time::Duration::from_secs(2) {
        let r = fs.scrub(&mut |_| true);
        assert!(r.is_clean(), "scrub {scrubs}: {:#?}", r.problems);
        scrubs += 1;
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    assert_eq!(fs.error_stats().count, 0);
    assert!(!fs.is_read_only());
}

#[test]
fn scrub_can_be_cancelled() {
    let (pm, _, _, _) = pool();
    let fs = Fs::mount(pm, MountOptions::default()).unwrap();
    let mut calls = 0;
    let r = fs.scrub(&mut |_| {
        calls += 1;
        false
    });
    assert!(r.cancelled);
    assert_eq!(calls, 1);
    assert_eq!(r.inodes, 0);
}

/// A helper the tests above use: a SimPool with the same bytes.
trait CloneImage {
    fn clone_image(&self) -> SimPool;
}

impl CloneImage for SimPool {
    fn clone_image(&self) -> SimPool {
        SimPool::from_image(self.current_image())
    }
}
