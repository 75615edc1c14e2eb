//! A pool shared between an owner (the mounted engine) and a reader in
//! another process's role (`Fs::attach` over a second mapping of the same
//! pool, with its own DRAM state): the reader sees every change the owner
//! commits, at its next access, without a message; blocks the owner frees
//! while the reader is pinned are not reused under it (docs/KERNEL-FREE.md).

use inkfs::epoch::EpochTable;
use inkfs::pmem::{MappedPool, PoolOpenOptions};
use inkfs::testkit::Rng;
use inkfs::types::*;
use inkfs::{Error, Fs};

const ROOT: u64 = 1;

struct Shared {
    owner: Fs<MappedPool>,
    reader: Fs<MappedPool>,
    _path: PoolPath,
}

/// The pool file, removed when the test ends.
struct PoolPath(std::path::PathBuf);

impl Drop for PoolPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn shared(tag: &str, mode: Mode) -> Shared {
    let path = std::path::PathBuf::from(format!(
        "/dev/shm/inkfs-shared-{tag}-{}.pool",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);
    let pm = MappedPool::open(
        &path,
        &PoolOpenOptions {
            create_size_bytes: Some(64 << 20),
            read_only: false,
        },
    )
    .unwrap();
    Fs::format(&pm, &FormatOptions::default()).unwrap();
    let owner = Fs::mount(
        pm,
        MountOptions {
            mode,
            ..Default::default()
        },
    )
    .unwrap();
    // A second mapping through a duplicate of the claimed descriptor, read
    // only: the reader's own view of the pool, as another process has it.
    let file = owner.pmem().pool_file().try_clone().unwrap();
    let ro = PoolOpenOptions {
        create_size_bytes: None,
        read_only: true,
    };
    let reader = Fs::attach(MappedPool::map(file, &ro).unwrap(), mode).unwrap();
    owner.set_shared(true);
    Shared {
        owner,
        reader,
        _path: PoolPath(path),
    }
}

fn read_all(fs: &Fs<MappedPool>, ino: u64) -> Vec<u8> {
    let fh = fs.open(ino).unwrap();
    let size = fs.fgetattr(&fh).unwrap().size as usize;
    let mut buf = vec![0u8; size];
    let n = fs.read(&fh, 0, &mut buf).unwrap();
    fs.release(fh);
    buf.truncate(n);
    buf
}

fn names(fs: &Fs<MappedPool>, dir: u64) -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    fs.readdir(dir, 0, &mut |e| {
        if e.name != b"." && e.name != b".." {
            v.push(e.name);
        }
        true
    })
    .unwrap();
    v.sort();
    v
}

#[test]
fn the_reader_sees_every_committed_change() {
    let s = shared("seq", Mode::Strict);
    let (o, r) = (&s.owner, &s.reader);
    let d = o.mkdir(ROOT, b"d", 0o755, 0, 0).unwrap().ino;
    assert_eq!(r.lookup(ROOT, b"d").unwrap().ino, d);
    let (a, fh) = o.create(d, b"f", 0o644, 0, 0).unwrap();
    o.write(&fh, 0, b"hello").unwrap();
    assert_eq!(read_all(r, a.ino), b"hello");
    // The reader holds the file open while it changes.
    let rfh = r.open(a.ino).unwrap();
    o.append(&fh, b", world").unwrap();
    let mut buf = [0u8; 64];
    let n = r.read(&rfh, 0, &mut buf).unwrap();
    assert_eq!(&buf[..n], b"hello, world");
    o.write(&fh, 1 << 20, b"far").unwrap();
    assert_eq!(r.fgetattr(&rfh).unwrap().size, (1 << 20) + 3);
    o.setattr(
        a.ino,
        &SetAttr {
            size: Some(5),
            mode: Some(0o600),
            ..Default::default()
        },
    )
    .unwrap();
    let ra = r.fgetattr(&rfh).unwrap();
    assert_eq!((ra.size, ra.mode & 0o7777), (5, 0o600));
    o.setxattr(a.ino, b"user.k", b"v", XattrFlags::Any).unwrap();
    assert_eq!(r.getxattr(a.ino, b"user.k").unwrap(), b"v");
    o.release(fh);
    r.release(rfh);
    // Namespace changes.
    o.rename(d, b"f", ROOT, b"g", RenameFlags::default())
        .unwrap();
    assert_eq!(names(r, d), Vec::<Vec<u8>>::new());
    assert_eq!(r.lookup(ROOT, b"g").unwrap().ino, a.ino);
    assert!(matches!(r.lookup(d, b"f"), Err(Error::Errno(libc::ENOENT))));
    o.unlink(ROOT, b"g").unwrap();
    // The file is gone: by name, and by number through the stale object.
    assert!(matches!(
        r.lookup(ROOT, b"g"),
        Err(Error::Errno(libc::ENOENT))
    ));
    assert!(matches!(r.getattr(a.ino), Err(Error::Errno(libc::ENOENT))));
    // The slot is reused by a new inode: the reader sees the new one.
    let (b, fh) = o.create(ROOT, b"h", 0o644, 0, 0).unwrap();
    o.write(&fh, 0, b"new").unwrap();
    o.release(fh);
    assert_eq!(read_all(r, b.ino), b"new");
    // The reader changes nothing.
    assert!(matches!(
        r.mkdir(ROOT, b"x", 0o755, 0, 0),
        Err(Error::Errno(libc::EROFS))
    ));
}

/// Log GC unlinks pages (fast GC) and rewrites logs (compaction) under a
/// reader that cached positions in them: it must replay from the head.
#[test]
fn the_reader_follows_log_gc() {
    let s = shared("gc", Mode::Strict);
    let (o, r) = (&s.owner, &s.reader);
    let (a, fh) = o.create(ROOT, b"hot", 0o644, 0, 0).unwrap();
    o.write(&fh, 0, &vec![7u8; 8192]).unwrap();
    // Many live entries (one per page written apart), so the log stays
    // mostly live and fast GC, not compaction, removes the hot page's
    // dead entries.
    const LIVE: u64 = 600;
    for i in 0..LIVE {
        o.write(&fh, (4 + 2 * i) * 4096, &[i as u8; 100]).unwrap();
    }
    let d = o.mkdir(ROOT, b"churn", 0o755, 0, 0).unwrap().ino;
    let mut live = Vec::new();
    for round in 0..3000u32 {
        // A hot page: every overwrite appends an entry that supersedes the
        // last (fast GC unlinks whole dead pages; compaction rewrites).
        let v = (round % 251) as u8;
        o.write(&fh, 4096, &[v; 4096]).unwrap();
        let name = format!("n{round}").into_bytes();
        let (_, h) = o.create(d, &name, 0o644, 0, 0).unwrap();
        o.release(h);
        live.push(name);
        if live.len() > 5 {
            o.unlink(d, &live.remove(0)).unwrap();
        }
        if round % 97 == 0 {
            let data = read_all(r, a.ino);
            assert_eq!(&data[..4096], &[7u8; 4096][..]);
            assert_eq!(&data[4096..8192], &[v; 4096][..], "round {round}");
            for i in (0..LIVE).step_by(37) {
                let at = ((4 + 2 * i) * 4096) as usize;
                assert_eq!(&data[at..at + 100], &[i as u8; 100][..], "round {round}");
            }
            let mut want = live.clone();
            want.sort();
            assert_eq!(names(r, d), want, "round {round}");
        }
    }
    o.release(fh);
    let gc = o.gc_stats();
    assert!(gc.fast_pages_freed > 0 && gc.compactions > 0, "{gc:?}");
}

/// While a reader is pinned, the blocks it may be reading stay what they
/// were: the owner overwrites the file copy-on-write (freeing the old
/// blocks) and writes another file (which would take the freed blocks
/// first), and the old blocks still hold the old bytes until the reader
/// unpins. Without the limbo the other file's bytes appear in them.
#[test]
fn a_pinned_reader_keeps_the_blocks_it_may_read() {
    const PAGES: u64 = 16;
    let s = shared("pin", Mode::Strict);
    let table = EpochTable::new_shared();
    s.owner.share_epochs(table.clone());
    let (a, fh) = s.owner.create(ROOT, b"f", 0o644, 0, 0).unwrap();
    s.owner
        .write(&fh, 0, &vec![1u8; (PAGES * 4096) as usize])
        .unwrap();
    let (_, other) = s.owner.create(ROOT, b"other", 0o644, 0, 0).unwrap();
    let slot = table.claim().unwrap();
    let mut rng = Rng::new(7);
    for round in 0..20u8 {
        let pin = slot.pin();
        // What the reader sees now: the file's blocks.
        let old: Vec<_> = s.reader.fiemap(a.ino, 0, PAGES * 4096).unwrap();
        assert!(!old.is_empty());
        s.owner
            .write(&fh, 0, &vec![round + 2; (PAGES * 4096) as usize])
            .unwrap();
        for _ in 0..PAGES {
            s.owner
                .write(&other, rng.below(64) * 4096, &[0xEE; 4096])
                .unwrap();
        }
        for e in &old {
            let mut buf = vec![0u8; e.length as usize];
            inkfs::pmem::Pmem::read(s.reader.pmem(), e.physical, &mut buf);
            assert!(
                buf.iter().all(|&b| b == round + 1),
                "round {round}: a block the pinned reader could read was reused"
            );
        }
        drop(pin);
        assert_eq!(read_all(&s.reader, a.ino)[..4096], [round + 2; 4096][..]);
    }
    s.owner.release(fh);
    s.owner.release(other);
    drop(slot);
    s.owner.reclaim_limbo();
    assert_eq!(
        s.owner.limbo_blocks(),
        0,
        "nothing pinned: the limbo empties"
    );
}

/// A client engine's overwrites keep the blocks they displace for the
/// file's next overwrites (recycle.rs), but never reuse one while another
/// reader, pinned before the commit that displaced it, may read it: the
/// blocks the pinned reader saw keep their bytes through many overwrites,
/// and once it unpins they are reused.
#[test]
fn a_clients_recycled_blocks_wait_for_pinned_readers() {
    const PAGES: u64 = 4;
    let s = shared("recycle", Mode::Strict);
    let (a, fh) = s.owner.create(ROOT, b"f", 0o644, 0, 0).unwrap();
    s.owner
        .write(&fh, 0, &vec![1u8; (PAGES * 4096) as usize])
        .unwrap();
    s.owner.release(fh);
    // The client: a writable mapping of its own, blocks reserved for it,
    // the readers' table with a slot of its own, reuse from the first block.
    let file = s.owner.pmem().pool_file().try_clone().unwrap();
    let rw = PoolOpenOptions {
        create_size_bytes: None,
        read_only: false,
    };
    let client = Fs::attach_client(MappedPool::map(file, &rw).unwrap(), Mode::Strict).unwrap();
    client
        .add_reservation(&s.owner.reserve_blocks(256, 64))
        .unwrap();
    let table = EpochTable::new_shared();
    let own = table.claim_index().unwrap();
    client.client_use_epochs(table.clone(), own);
    client.client_recycle_batch(1);
    let cfh = client.open(a.ino).unwrap();
    let slot = table.claim().unwrap();
    let write = |byte: u8| {
        let _w = client.client_writes();
        client
            .write(&cfh, 0, &vec![byte; (PAGES * 4096) as usize])
            .unwrap();
    };
    // Pinned before the overwrite that displaces what it sees.
    let pin = slot.pin();
    let old = s.reader.fiemap(a.ino, 0, PAGES * 4096).unwrap();
    assert!(!old.is_empty());
    for round in 2..12u8 {
        write(round);
    }
    for e in &old {
        let mut buf = vec![0u8; e.length as usize];
        inkfs::pmem::Pmem::read(s.reader.pmem(), e.physical, &mut buf);
        assert!(
            buf.iter().all(|&b| b == 1),
            "a block the pinned reader could read was reused"
        );
    }
    let reused_pinned = client.client_recycled_reused();
    drop(pin);
    for round in 12..20u8 {
        write(round);
    }
    assert!(
        client.client_recycled_reused() > reused_pinned,
        "no reuse once the reader unpinned"
    );
    assert_eq!(
        read_all(&s.reader, a.ino),
        vec![19u8; (PAGES * 4096) as usize]
    );
    client.release(cfh);
}

/// The client side of `shared()`'s pool: a writable mapping of its own,
/// `blocks` reserved for it, the readers' table with a slot of its own,
/// reuse of recycled blocks from the first one.
fn client_of(s: &Shared, blocks: u64) -> (Fs<MappedPool>, std::sync::Arc<EpochTable>) {
    let file = s.owner.pmem().pool_file().try_clone().unwrap();
    let rw = PoolOpenOptions {
        create_size_bytes: None,
        read_only: false,
    };
    let client = Fs::attach_client(MappedPool::map(file, &rw).unwrap(), Mode::Strict).unwrap();
    client
        .add_reservation(&s.owner.reserve_blocks(blocks, 64))
        .unwrap();
    let table = EpochTable::new_shared();
    let own = table.claim_index().unwrap();
    client.client_use_epochs(table.clone(), own);
    client.client_recycle_batch(1);
    (client, table)
}

fn physical_blocks(fs: &Fs<MappedPool>, ino: u64, len: u64) -> Vec<u64> {
    let mut v: Vec<u64> = fs
        .fiemap(ino, 0, len)
        .unwrap()
        .iter()
        .flat_map(|e| (0..e.length / 4096).map(move |i| e.physical / 4096 + i))
        .collect();
    v.sort_unstable();
    v
}

/// A client's appends after a truncate take the blocks the truncate cut
/// (recycle.rs: already mapped, and the server never hears of them), but
/// never one a reader pinned before the truncate may still read.
#[test]
fn a_clients_appends_after_a_truncate_reuse_the_cut_blocks_once_readers_moved_on() {
    const PAGES: u64 = 8;
    let len = PAGES * 4096;
    let s = shared("recycle-append", Mode::Strict);
    let (a, fh) = s.owner.create(ROOT, b"log", 0o644, 0, 0).unwrap();
    s.owner.release(fh);
    let (client, table) = client_of(&s, 256);
    let cfh = client.open(a.ino).unwrap();
    let appends = |byte: u8| {
        let _w = client.client_writes();
        for _ in 0..PAGES {
            client.append(&cfh, &[byte; 4096]).unwrap();
        }
    };
    let truncate = || {
        let _w = client.client_writes();
        let set = SetAttr {
            size: Some(0),
            ..SetAttr::default()
        };
        client.setattr(a.ino, &set).unwrap();
    };
    appends(1);
    let first = physical_blocks(&s.reader, a.ino, len);
    assert_eq!(first.len() as u64, PAGES);
    // A reader pinned before the truncate may still read the cut blocks.
    let slot = table.claim().unwrap();
    let pin = slot.pin();
    truncate();
    appends(2);
    for &b in &first {
        let mut buf = vec![0u8; 4096];
        inkfs::pmem::Pmem::read(s.reader.pmem(), b * 4096, &mut buf);
        assert!(
            buf.iter().all(|&x| x == 1),
            "block {b}, cut while a reader was pinned, was reused under it"
        );
    }
    assert_eq!(client.client_recycled_reused(), 0);
    drop(pin);
    // Unpinned: the next cut blocks come back to the appends after it.
    let second = physical_blocks(&s.reader, a.ino, len);
    truncate();
    appends(3);
    let third = physical_blocks(&s.reader, a.ino, len);
    assert!(
        client.client_recycled_reused() >= PAGES,
        "appends after the truncate took fresh blocks: reused {}",
        client.client_recycled_reused()
    );
    assert!(
        third
            .iter()
            .all(|b| second.contains(b) || first.contains(b)),
        "appends took blocks no truncate cut: {third:?} (cut {first:?}, {second:?})"
    );
    assert_eq!(read_all(&s.reader, a.ino), vec![3u8; len as usize]);
    assert_eq!(
        s.reader.fiemap(a.ino, 0, len).unwrap().len(),
        1,
        "appends on cut blocks stay in one extent"
    );
    client.release(cfh);
}

/// A write under a lease marks the inode current (`Fs::client_mark_current`):
/// later uses skip the check of its record, which only the lease holder
/// changes while it holds the lease; when any lease goes back
/// (`Fs::client_leases_changed`) every inode is checked again.
#[test]
fn a_clients_mark_skips_the_record_check_until_a_lease_goes_back() {
    let s = shared("lease-mark", Mode::Strict);
    let (a, fh) = s.owner.create(ROOT, b"f", 0o644, 0, 0).unwrap();
    let (client, _table) = client_of(&s, 64);
    let cfh = client.open(a.ino).unwrap();
    let count = client.client_lease_count();
    assert_ne!(count, 0);
    {
        let _w = client.client_writes();
        client.append(&cfh, &[1u8; 100]).unwrap();
    }
    client.client_mark_current(&cfh, count);
    // The owner writes behind the lease (the server would have recalled
    // it first): the marked state is not checked against the record...
    s.owner.append(&fh, &[2u8; 50]).unwrap();
    assert_eq!(
        client.getattr(a.ino).unwrap().size,
        100,
        "mark not honoured"
    );
    // ...until a lease goes back.
    client.client_leases_changed();
    assert_eq!(client.getattr(a.ino).unwrap().size, 150);
    // A mark taken before a give-back is stale at once.
    client.client_mark_current(&cfh, count);
    s.owner.append(&fh, &[3u8; 50]).unwrap();
    assert_eq!(client.getattr(a.ino).unwrap().size, 200);
    // An engine that is not a client's marks nothing.
    s.reader
        .client_mark_current(&s.reader.open(a.ino).unwrap(), 1);
    s.owner.release(fh);
    client.release(cfh);
}

/// The limbo costs nothing: after the readers are gone and the owner
/// unmounts, the pool is exactly as full as its files say (fsck clean).
#[test]
fn limbo_blocks_return_at_unmount() {
    let s = shared("limbo", Mode::Strict);
    let table = EpochTable::new_shared();
    s.owner.share_epochs(table.clone());
    let slot = table.claim().unwrap();
    let pin = slot.pin();
    let (_, fh) = s.owner.create(ROOT, b"f", 0o644, 0, 0).unwrap();
    for i in 0..50u8 {
        s.owner.write(&fh, 0, &[i; 8192]).unwrap();
    }
    s.owner.release(fh);
    assert!(
        s.owner.limbo_blocks() > 0,
        "overwrites freed blocks while pinned"
    );
    drop(pin);
    drop(slot);
    let Shared {
        owner,
        reader,
        _path,
    } = s;
    drop(reader);
    let pm = owner.unmount().unwrap();
    let report = inkfs::fsck::check(&pm, &Default::default()).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
}

/// A name removed and made again by the owner, its inode slot reused: the
/// reader's first lookup of the name finds the new inode, not ENOENT from
/// the stale object it had cached for that number.
#[test]
fn a_reused_inode_slot_is_found_at_the_first_lookup() {
    let s = shared("reuse", Mode::Strict);
    let (o, r) = (&s.owner, &s.reader);
    let (a, fh) = o.create(ROOT, b"f", 0o644, 0, 0).unwrap();
    o.write(&fh, 0, b"old").unwrap();
    o.release(fh);
    assert_eq!(read_all(r, a.ino), b"old");
    let mut reused = false;
    for round in 0..8 {
        o.unlink(ROOT, b"f").unwrap();
        let (b, fh) = o.create(ROOT, b"f", 0o644, 0, 0).unwrap();
        o.write(&fh, 0, b"new").unwrap();
        o.release(fh);
        reused |= b.ino == a.ino;
        let found = r
            .lookup(ROOT, b"f")
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(found.ino, b.ino);
        assert_eq!(read_all(r, b.ino), b"new");
    }
    assert!(reused, "the owner reused the slot (the case under test)");
}

/// A reader in another thread (its own engine, as in another process)
/// reads a file while the owner rewrites it and compacts its log over and
/// over: every read succeeds and sees one whole write. Compaction switches
/// the record's head, then its tail: a reader that reads the record
/// between the two stores must wait for the second, not report the log
/// corrupt (EIO).
#[test]
fn a_reader_racing_compactions_never_fails() {
    const BYTES: usize = 16 << 10;
    let s = shared("race", Mode::Strict);
    let table = EpochTable::new_shared();
    s.owner.share_epochs(table.clone());
    let (a, fh) = s.owner.create(ROOT, b"f", 0o644, 0, 0).unwrap();
    s.owner.write(&fh, 0, &[0u8; BYTES]).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let reads_seen = std::sync::atomic::AtomicU64::new(0);
    let slot = table.claim().unwrap();
    let (reads, failures) = std::thread::scope(|scope| {
        let reader = scope.spawn(|| {
            let (mut reads, mut failures) = (0u64, Vec::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _pin = slot.pin();
                let mut buf = vec![0u8; BYTES];
                let got = s.reader.open(a.ino).and_then(|h| {
                    let n = s.reader.read(&h, 0, &mut buf);
                    s.reader.release(h);
                    n
                });
                match got {
                    Ok(n) if n == BYTES && buf.iter().all(|&b| b == buf[0]) => {
                        reads += 1;
                        reads_seen.store(reads, std::sync::atomic::Ordering::Relaxed);
                    }
                    Ok(n) => failures.push(format!("torn read of {n} bytes")),
                    Err(e) => failures.push(e.to_string()),
                }
            }
            (reads, failures)
        });
        let start = std::time::Instant::now();
        let mut round = 0u8;
        let mut written = Ok(());
        // For the time, and until the race has had its chances (reads
        // and compactions counted below) however slow the machine: a
        // fixed time is a speed claim. A reader that never reads again
        // ends the loop at the wait limit, and the counts then fail.
        let raced = || {
            s.owner.gc_stats().compactions > 10
                && reads_seen.load(std::sync::atomic::Ordering::Relaxed) > 100
        };
        while written.is_ok()
            && (start.elapsed() < std::time::Duration::from_millis(1500) || !raced())
            && start.elapsed() < inkfs::testkit::WAIT_LIMIT
        {
            round = round.wrapping_add(1);
            // A reader off its CPU while pinned holds every block freed
            // meanwhile (epochs' nature): let it catch up now and then
            // rather than fill the pool.
            while round.is_multiple_of(64) && s.owner.limbo_blocks() > 4096 {
                s.owner.reclaim_limbo();
                std::thread::sleep(std::time::Duration::from_micros(100));
            }
            written = s.owner.write(&fh, 0, &[round; BYTES]).map(|_| ());
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let r = reader.join().unwrap();
        written.unwrap_or_else(|e| {
            panic!(
                "owner's write {round}: {e} (limbo {} blocks; reader: {} reads, failures {:?})",
                s.owner.limbo_blocks(),
                r.0,
                &r.1[..r.1.len().min(3)]
            )
        });
        r
    });
    s.owner.release(fh);
    assert!(
        s.owner.gc_stats().compactions > 10,
        "{:?}",
        s.owner.gc_stats()
    );
    assert!(reads > 100, "{reads} reads");
    assert!(
        failures.is_empty(),
        "{} failures in {reads} reads: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
}

/// A file a reader holds (a client's placeholder descriptor: its number in
/// the reader's slot) outlives its last name until the hold goes, though
/// the owner has no handle on it; without a hold, the last unlink frees it
/// at once (ORPHAN committed, then FREE). The reader's check after its
/// hold sees an unlinked or reused inode.
#[test]
fn a_held_inode_outlives_its_last_name_until_the_hold_goes() {
    let s = shared("holds", Mode::Strict);
    let table = EpochTable::new_shared();
    s.owner.share_epochs(table.clone());
    let slot = table.claim_index().unwrap();
    let (a, fh) = s.owner.create(ROOT, b"f", 0o644, 0, 0).unwrap();
    s.owner.write(&fh, 0, &vec![5u8; 64 << 10]).unwrap();
    s.owner.release(fh);
    let free0 = s.owner.statfs().blocks_free;
    // The reader holds it, then checks it is still the file it looked up.
    let entry = table.hold(slot, a.ino).unwrap();
    assert!(s.reader.is_linked(a.ino, a.generation));
    s.owner.unlink(ROOT, b"f").unwrap();
    assert!(s.reader.lookup(ROOT, b"f").is_err());
    assert!(!s.reader.is_linked(a.ino, a.generation), "unlinked now");
    // Still readable through the reader, still taking its blocks.
    assert_eq!(read_all(&s.reader, a.ino), vec![5u8; 64 << 10]);
    assert_eq!(s.owner.free_unheld_orphans(), 0, "held: not freed");
    assert_eq!(s.owner.held_orphans(), 1);
    assert!(s.owner.statfs().blocks_free < free0 + 16);
    table.unhold(slot, entry, a.ino);
    assert_eq!(s.owner.free_unheld_orphans(), 1);
    assert_eq!(s.owner.held_orphans(), 0);
    s.owner.reclaim_limbo();
    assert!(
        s.owner.statfs().blocks_free >= free0 + 16,
        "its blocks came back"
    );
    // No hold: the last unlink frees at once.
    let (b, fh) = s.owner.create(ROOT, b"g", 0o644, 0, 0).unwrap();
    s.owner.release(fh);
    s.owner.unlink(ROOT, b"g").unwrap();
    assert_eq!(s.owner.held_orphans(), 0);
    assert!(s.owner.getattr(b.ino).is_err(), "freed");
    // A hold on a number since reused by another file: the check fails.
    let (c, fh) = s.owner.create(ROOT, b"h", 0o644, 0, 0).unwrap();
    s.owner.release(fh);
    if c.ino == a.ino {
        assert!(!s.reader.is_linked(c.ino, a.generation));
    }
    assert!(s.reader.is_linked(c.ino, c.generation));
    // Holds go with the reader's slot.
    let _ = table.hold(slot, c.ino).unwrap();
    s.owner.unlink(ROOT, b"h").unwrap();
    assert_eq!(s.owner.held_orphans(), 1);
    table.release_slot(slot);
    assert_eq!(s.owner.free_unheld_orphans(), 1);
    let pm = s.owner.unmount().unwrap();
    let report = inkfs::fsck::check(&pm, &Default::default()).unwrap();
    assert!(report.is_clean(), "{report:?}");
}
