//! On-media format: every type round-trips through media, and a table of
//! damaged or foreign superblocks is refused with a clear reason (and the
//! backup copy is used when only the primary is damaged).

use inkfs::format::*;
use inkfs::pmem::{read_pod, write_pod, Pmem, SimPool};
use inkfs::superblock::{read_superblock, SuperSource};
use inkfs::types::{FormatOptions, MountOptions};
use inkfs::{Error, Fs};

fn round_trip<T: Pod + PartialEq + std::fmt::Debug>(value: T) {
    let pm = SimPool::new(1 << 20);
    write_pod(&pm, 4096 + 64, &value);
    pm.persist(4096 + 64, std::mem::size_of::<T>() as u64);
    let back: T = read_pod(&pm, 4096 + 64);
    assert_eq!(back, value);
    // And through a crash image: the persisted bytes are the value.
    let img = SimPool::from_image(pm.persisted_image());
    assert_eq!(read_pod::<T, _>(&img, 4096 + 64), value);
}

/// A value of `T` with every byte set to a different non-zero pattern.
fn patterned<T: Pod>(seed: u8) -> T {
    let mut v = T::zeroed();
    for (i, b) in v.as_bytes_mut().iter_mut().enumerate() {
        *b = seed.wrapping_add(i as u8).wrapping_mul(31) | 1;
    }
    v
}

#[test]
fn every_on_media_type_round_trips() {
    round_trip::<Superblock>(patterned(1));
    round_trip::<JournalHeader>(patterned(2));
    round_trip::<JournalRecord>(patterned(3));
    round_trip::<SaveHeader>(patterned(4));
    round_trip::<SavedRange>(patterned(5));
    round_trip::<InodeRecord>(patterned(6));
    round_trip::<TableTrailer>(patterned(7));
    round_trip::<LogPageFooter>(patterned(8));
    round_trip::<EntryHeader>(patterned(9));
    round_trip::<AttrEntry>(patterned(10));
    round_trip::<WriteEntry>(patterned(11));
    round_trip::<DirEntryHead>(patterned(12));
    round_trip::<SymlinkEntry>(patterned(13));
    round_trip::<XattrHead>(patterned(14));
}

#[test]
fn log_entries_decode_what_was_encoded() {
    use inkfs::log::{parse, Entry, EntryBuf};
    let w = EntryBuf::write(7, 1234, 3, 99_999, 42);
    match parse(w.as_bytes()).unwrap() {
        Entry::Write(e) => {
            assert_eq!(
                (e.file_page, e.block, e.pages, e.size, e.mtime_ns),
                (7, 1234, 3, 99_999, 42)
            )
        }
        other => panic!("{other:?}"),
    }
    let name = vec![b'n'; NAME_MAX];
    let d = EntryBuf::dir(true, 77, 5, 9, FileKind::Symlink, &name);
    match parse(d.as_bytes()).unwrap() {
        Entry::DirAdd { head, name: n } => {
            assert_eq!(
                (head.ino, head.seq, head.child_kind),
                (77, 5, FileKind::Symlink as u32 as u8)
            );
            assert_eq!(n, &name[..]);
        }
        other => panic!("{other:?}"),
    }
    let value = vec![7u8; XATTR_VALUE_MAX];
    let x = EntryBuf::xattr(true, b"user.big", &value, 3);
    assert!(x.as_bytes().len() as u64 <= LOG_PAGE_PAYLOAD);
    match parse(x.as_bytes()).unwrap() {
        Entry::XattrSet { name, value: v, .. } => {
            assert_eq!(name, b"user.big");
            assert_eq!(v, &value[..]);
        }
        other => panic!("{other:?}"),
    }
    // Any flipped byte is caught by the checksum.
    let mut bytes = d.as_bytes().to_vec();
    bytes[50] ^= 0x40;
    assert!(parse(&bytes).is_err());
}

fn formatted(size: u64) -> SimPool {
    let pm = SimPool::new(size);
    Fs::format(
        &pm,
        &FormatOptions {
            lanes: 2,
            ..Default::default()
        },
    )
    .unwrap();
    pm
}

fn bad_pool_message(pm: &SimPool) -> String {
    match read_superblock(pm) {
        Err(Error::BadPool(m)) => m,
        Ok(_) => panic!("accepted"),
        Err(e) => panic!("wrong error kind: {e}"),
    }
}

fn damage_both(pm: &SimPool, f: impl Fn(&mut Superblock)) {
    for block in [SUPER_PRIMARY_BLOCK, SUPER_BACKUP_BLOCK] {
        let mut sb: Superblock = read_pod(pm, block * BLOCK_SIZE);
        f(&mut sb);
        write_pod(pm, block * BLOCK_SIZE, &sb);
    }
}

#[test]
fn damaged_or_foreign_superblocks_are_refused_with_a_reason() {
    type Case = (&'static str, Box<dyn Fn(&SimPool) -> SimPool>, &'static str);
    let cases: Vec<Case> = vec![
        (
            "bad magic",
            Box::new(|pm| {
                damage_both(pm, |sb| sb.magic = *b"EXT4FS!!");
                SimPool::from_image(pm.current_image())
            }),
            "bad magic",
        ),
        (
            "blank pool",
            Box::new(|_| SimPool::new(8 << 20)),
            "no inkfs superblock",
        ),
        (
            "bad checksum",
            Box::new(|pm| {
                damage_both(pm, |sb| sb.lane_count += 1);
                SimPool::from_image(pm.current_image())
            }),
            "checksum",
        ),
        (
            "newer version",
            Box::new(|pm| {
                damage_both(pm, |sb| {
                    sb.version = FORMAT_VERSION + 1;
                    sb.seal();
                });
                SimPool::from_image(pm.current_image())
            }),
            "newer than this inkfs",
        ),
        (
            "truncated pool file",
            Box::new(|pm| {
                let mut img = pm.current_image();
                img.truncate(img.len() / 2);
                SimPool::from_image(img)
            }),
            "truncated",
        ),
        (
            "size disagrees with the pool",
            Box::new(|pm| {
                let mut img = pm.current_image();
                img.extend(std::iter::repeat_n(0u8, 1 << 20));
                SimPool::from_image(img)
            }),
            "size mismatch",
        ),
        (
            "pool smaller than a superblock",
            Box::new(|_| SimPool::new(4096)),
            "too small",
        ),
    ];
    for (what, make, needle) in cases {
        let pm = make(&formatted(8 << 20));
        let msg = bad_pool_message(&pm);
        assert!(
            msg.contains(needle),
            "{what}: message '{msg}' lacks '{needle}'"
        );
        // Mount refuses it the same way, without panicking.
        match Fs::mount(pm, MountOptions::default()) {
            Err(Error::BadPool(_)) => {}
            Err(e) => panic!("{what}: mount gave {e}"),
            Ok(_) => panic!("{what}: mounted"),
        }
    }
}

#[test]
fn backup_superblock_is_used_when_the_primary_is_damaged() {
    let pm = formatted(8 << 20);
    // Flip a byte of the primary only.
    let mut b = [0u8; 1];
    pm.read(40, &mut b);
    b[0] ^= 0xff;
    pm.write(40, &b);
    pm.persist(40, 1);
    let (sb, source) = read_superblock(&pm).unwrap();
    assert_eq!(source, SuperSource::Backup);
    assert_eq!(sb.version, FORMAT_VERSION);
    let fs = Fs::mount(pm, MountOptions::default()).unwrap();
    assert!(fs.mount_report().used_backup_superblock);
    let pm = fs.unmount().unwrap();
    // The mount rewrote the primary.
    let (_, source) = read_superblock(&pm).unwrap();
    assert_eq!(source, SuperSource::Primary);
}

/// Version 1 to 5 pools (every v1 log is a valid v2 log; a v2 inode
/// record's flags bytes were reserved, hence zero: no flags; a v3 record's
/// log_gen bytes too; a v4 superblock's data-device bytes too: no data
/// device; a v5 pool's logs all start in whole pages, as the root
/// directory's does here) mount; a read-only mount leaves their version alone, the first
/// read-write mount marks them with the current version (fast GC may then
/// write logs a v1 reader would refuse, chattr flags a v2 reader would
/// ignore instead of enforcing).
#[test]
fn older_pools_mount_and_are_upgraded_by_a_read_write_mount() {
    for old_version in [1, 2, 3, 4, 5] {
        let pm = SimPool::new(4 << 20);
        Fs::format(&pm, &FormatOptions::default()).unwrap();
        let fs = Fs::mount(pm, MountOptions::default()).unwrap();
        let (_, fh) = fs.create(1, b"kept", 0o644, 0, 0).unwrap();
        fs.write(&fh, 0, b"from version 1").unwrap();
        fs.release(fh);
        let pm = fs.unmount().unwrap();
        damage_both(&pm, |sb| {
            sb.version = old_version;
            sb.seal();
        });
        let ro = MountOptions {
            read_only: true,
            ..Default::default()
        };
        let fs = Fs::mount(pm, ro).unwrap();
        let ino = fs.lookup(1, b"kept").unwrap().ino;
        assert_eq!(fs.get_flags(ino).unwrap(), 0);
        let pm = fs.unmount().unwrap();
        assert_eq!(read_superblock(&pm).unwrap().0.version, old_version);
        let fs = Fs::mount(pm, MountOptions::default()).unwrap();
        let fh = fs.open(ino).unwrap();
        let mut buf = [0u8; 14];
        assert_eq!(fs.read(&fh, 0, &mut buf).unwrap(), 14);
        assert_eq!(&buf, b"from version 1");
        fs.release(fh);
        let pm = fs.unmount().unwrap();
        assert_eq!(read_superblock(&pm).unwrap().0.version, FORMAT_VERSION);
    }
    assert_eq!(FORMAT_VERSION, 6);
}
