//! A client engine creating files in a directory under a lane lease
//! (docs/KERNEL-FREE.md, "Built: the engine's namespace under a lane
//! lease"): the owner (the mounted engine) and a client engine over a
//! second, writable mapping of one pool, as another process has it. The
//! owner grants the lease as the mount's lease table will (`lease_lane`, a
//! reservation, the directory's lease), the client creates and writes, and
//! the lane comes back (`take_back_lane`) or the client dies and the owner
//! reaps it (`reap_lane`). The owner's books are checked against a
//! recovery scan of a copy of the pool: the allocator a crash would
//! rebuild from the media must be the one the owner keeps.

use inkfs::fsck::{self, FsckOptions};
use inkfs::lanelease::LaneGrant;
use inkfs::perm::Credentials;
use inkfs::pmem::{MappedPool, PoolOpenOptions};
use inkfs::types::*;
use inkfs::Fs;

const ROOT: u64 = 1;
const RESERVE: u64 = 512;

/// The pool file, removed when the test ends.
struct PoolPath(std::path::PathBuf);

impl Drop for PoolPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

struct Pair {
    owner: Fs<MappedPool>,
    client: Fs<MappedPool>,
    path: PoolPath,
}

fn pair(tag: &str) -> Pair {
    let path = std::path::PathBuf::from(format!(
        "/dev/shm/inkfs-lanelease-{tag}-{}.pool",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);
    let pm = MappedPool::open(
        &path,
        &PoolOpenOptions {
            create_size_bytes: Some(32 << 20),
            read_only: false,
        },
    )
    .unwrap();
    Fs::format(&pm, &FormatOptions::default()).unwrap();
    let owner = Fs::mount(pm, MountOptions::default()).unwrap();
    let client = client_of(&owner);
    Pair {
        owner,
        client,
        path: PoolPath(path),
    }
}

fn client_of(owner: &Fs<MappedPool>) -> Fs<MappedPool> {
    let file = owner.pmem().pool_file().try_clone().unwrap();
    let rw = PoolOpenOptions {
        create_size_bytes: None,
        read_only: false,
    };
    Fs::attach_client(MappedPool::map(file, &rw).unwrap(), Mode::Strict).unwrap()
}

/// The last lane (never lane 0 of the root): leased with `slots` slots,
/// blocks reserved, directory `dir`'s lease.
fn grant(p: &Pair, dir: u64, slots: usize) -> (LaneGrant, Vec<(u64, u64)>) {
    let lane = p.owner.geometry().lane_count - 1;
    let g = p.owner.lease_lane(lane, slots).unwrap();
    assert!(p.owner.lane_leased(lane));
    p.client.client_take_lane(&g).unwrap();
    let reserved = p.owner.reserve_blocks(RESERVE, 64);
    p.client.add_reservation(&reserved).unwrap();
    p.client.client_lease_dir(dir).unwrap();
    (g, reserved)
}

/// The client gives `dir` and the lane back, and what it freed and did
/// not use; the owner settles.
fn give_back(p: &Pair, dir: u64) {
    p.client.client_give_back_dir(dir);
    let ret = p.client.client_give_back_lane().unwrap();
    let freed = p.client.take_client_freed();
    let unused = p.client.drain_reservation();
    p.owner.free_unused_blocks(&unused);
    p.owner.return_blocks(&freed);
    p.owner.settle_dir(dir).unwrap();
    let settled = p.owner.take_back_lane(&ret).unwrap();
    assert!(!p.owner.lane_leased(ret.lane));
    let _ = settled;
}

fn names(fs: &Fs<MappedPool>, dir: u64) -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    fs.readdir(dir, 0, &mut |e| {
        if e.name != b"." && e.name != b".." {
            v.push(e.name.clone());
        }
        true
    })
    .unwrap();
    v.sort();
    v
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

/// What a recovery scan of a copy of the pool finds (the allocator
/// rebuilt from the media), and fsck's errors on that copy.
fn scanned(p: &Pair) -> (StatFs, Vec<String>) {
    let copy = PoolPath(p.path.0.with_extension("copy"));
    std::fs::copy(&p.path.0, &copy.0).unwrap();
    let opts = PoolOpenOptions {
        create_size_bytes: None,
        read_only: false,
    };
    let pm = MappedPool::open(&copy.0, &opts).unwrap();
    let r = fsck::check(&pm, &FsckOptions::default()).unwrap();
    let errors = r
        .problems
        .iter()
        .filter(|x| x.severity == fsck::Severity::Error)
        .map(|x| x.to_string())
        .collect();
    let fs = Fs::mount(pm, MountOptions::default()).unwrap();
    assert!(
        !fs.mount_report().allocator_restored,
        "a scan, not the save area"
    );
    (fs.statfs(), errors)
}

fn used_inodes(s: &StatFs) -> u64 {
    s.files - s.files_free
}

/// The client's creates under the lease: seen by the owner once the lane
/// comes back, with their data; more creates than the first table block
/// of the lane holds, so the client grows the lane's chain; inodes and
/// blocks accounted exactly (the owner's statfs is the scan's).
#[test]
fn a_clients_creates_are_the_owners_after_the_lane_comes_back() {
    let p = pair("back");
    let d = p.owner.mkdir(ROOT, b"d", 0o755, 0, 0).unwrap().ino;
    let before = p.owner.statfs();
    let (g, _) = grant(&p, d, 64);
    assert_eq!(g.slots.len(), 64);
    let n = 40;
    let mut inos = Vec::new();
    {
        let _w = p.client.client_writes().unwrap();
        for i in 0..n {
            let name = format!("f{i}");
            let (a, fh) = p.client.create(d, name.as_bytes(), 0o644, 0, 0).unwrap();
            assert_eq!(
                (a.ino - 1) % p.owner.geometry().lane_count as u64,
                g.lane as u64
            );
            p.client.write(&fh, 0, &vec![i as u8; 5000]).unwrap();
            p.client.release(fh);
            inos.push(a.ino);
        }
    }
    assert_eq!(p.client.client_lane_slots(), 64 - n);
    // The client sees its own names at once.
    assert_eq!(names(&p.client, d).len(), n);
    give_back(&p, d);
    let want: Vec<Vec<u8>> = {
        let mut v: Vec<Vec<u8>> = (0..n).map(|i| format!("f{i}").into_bytes()).collect();
        v.sort();
        v
    };
    assert_eq!(names(&p.owner, d), want);
    for (i, &ino) in inos.iter().enumerate() {
        assert_eq!(
            p.owner.lookup_ino(d, format!("f{i}").as_bytes()).unwrap(),
            ino
        );
        assert_eq!(read_all(&p.owner, ino), vec![i as u8; 5000]);
    }
    let after = p.owner.statfs();
    assert_eq!(used_inodes(&after), used_inodes(&before) + n as u64);
    let (scan, errors) = scanned(&p);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(after, scan, "the owner's books against the scan");
    // The owner creates and removes in the lane's directory itself, and
    // the lane is leasable again.
    let (_, fh) = p.owner.create(d, b"owner", 0o644, 0, 0).unwrap();
    p.owner.release(fh);
    p.owner.unlink(d, b"f0").unwrap();
    let (_, _) = grant(&p, d, 8);
    {
        let _w = p.client.client_writes().unwrap();
        let (_, fh) = p.client.create(d, b"again", 0o644, 0, 0).unwrap();
        p.client.release(fh);
        assert_eq!(
            p.client
                .create(d, b"owner", 0o644, 0, 0)
                .err()
                .map(|e| e.errno()),
            Some(libc::EEXIST),
            "the client sees the owner's create"
        );
    }
    give_back(&p, d);
    assert!(p.owner.lookup_ino(d, b"again").is_ok());
    assert_eq!(
        p.owner.lookup_ino(d, b"f0").err().map(|e| e.errno()),
        Some(libc::ENOENT)
    );
    let (scan, errors) = scanned(&p);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(p.owner.statfs(), scan);
}

/// The client dies holding the lane and the directory (its engine
/// dropped: nothing given back); the owner reaps the lane. Its creates
/// are there, the unused slots and the reservation's rest are free: the
/// books are the scan's.
#[test]
fn a_dead_clients_lane_is_reaped_with_every_slot_and_block_accounted() {
    let p = pair("reap");
    let d = p.owner.mkdir(ROOT, b"d", 0o755, 0, 0).unwrap().ino;
    let before = p.owner.statfs();
    let (g, reserved) = grant(&p, d, 48);
    let n = 35;
    {
        let _w = p.client.client_writes().unwrap();
        for i in 0..n {
            let (_, fh) = p
                .client
                .create(d, format!("f{i}").as_bytes(), 0o644, 0, 0)
                .unwrap();
            p.client.write(&fh, 0, &vec![7u8; 9000]).unwrap();
            // Overwritten: the displaced blocks are in no log.
            p.client.write(&fh, 0, &vec![i as u8; 4096]).unwrap();
            p.client.release(fh);
        }
    }
    let Pair {
        owner,
        client,
        path,
    } = p;
    drop(client);
    let settled = owner.reap_lane(g.lane, &[d], &reserved).unwrap();
    assert_eq!(settled.live.len(), n);
    assert_eq!(settled.slots_freed, 48 - n as u64);
    assert!(settled.table_blocks_added >= 1, "{settled:?}");
    assert!(settled.blocks_returned > 0);
    assert!(!owner.lane_leased(g.lane));
    assert_eq!(names(&owner, d).len(), n);
    for i in 0..n {
        let ino = owner.lookup_ino(d, format!("f{i}").as_bytes()).unwrap();
        let mut want = vec![7u8; 9000];
        want[..4096].fill(i as u8);
        assert_eq!(read_all(&owner, ino), want);
    }
    let after = owner.statfs();
    assert_eq!(used_inodes(&after), used_inodes(&before) + n as u64);
    let p = Pair {
        client: client_of(&owner),
        owner,
        path,
    };
    let (scan, errors) = scanned(&p);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(after, scan, "the owner's books against the scan");
    // A new client takes the lane again.
    grant(&p, d, 4);
    {
        let _w = p.client.client_writes().unwrap();
        let (_, fh) = p.client.create(d, b"next", 0o644, 0, 0).unwrap();
        p.client.release(fh);
    }
    give_back(&p, d);
    assert!(p.owner.lookup_ino(d, b"next").is_ok());
    assert_eq!(p.owner.statfs(), scanned(&p).0);
}

fn errno_of<T>(r: inkfs::Result<T>) -> Option<i32> {
    r.err().map(|e| e.errno())
}

/// The client's engine answers as the owner's: EEXIST, EACCES,
/// ENAMETOOLONG; and refuses (EROFS, EAGAIN) what it may not make itself,
/// never panicking.
#[test]
fn the_clients_errors_are_the_owners() {
    let p = pair("errors");
    let d = p.owner.mkdir(ROOT, b"d", 0o755, 0, 0).unwrap().ino;
    let other = p.owner.mkdir(ROOT, b"other", 0o777, 0, 0).unwrap().ino;
    let (_, fh) = p.owner.create(d, b"taken", 0o644, 0, 0).unwrap();
    p.owner.release(fh);
    let user = Credentials {
        uid: 1000,
        gid: 1000,
        groups: vec![1000],
        umask: 0o022,
    };
    let root = Credentials::root();
    let long = vec![b'x'; 256];
    // The owner's answers.
    let owner_eexist = errno_of(p.owner.create_cred(&root, d, b"taken", 0o644));
    let owner_eacces = errno_of(p.owner.create_cred(&user, d, b"mine", 0o644));
    let owner_long = errno_of(p.owner.create_cred(&root, d, &long, 0o644));
    assert_eq!(
        (owner_eexist, owner_eacces, owner_long),
        (
            Some(libc::EEXIST),
            Some(libc::EACCES),
            Some(libc::ENAMETOOLONG)
        )
    );

    // Without any lease: EROFS (a client engine writes nothing outside a
    // lease write), and inside a lease write but without a lane or the
    // directory's lease, EROFS too.
    assert_eq!(
        errno_of(p.client.create(d, b"a", 0o644, 0, 0)),
        Some(libc::EROFS)
    );
    {
        let _w = p.client.client_writes().unwrap();
        assert_eq!(
            errno_of(p.client.create(d, b"a", 0o644, 0, 0)),
            Some(libc::EROFS)
        );
    }
    p.client.client_lease_dir(d).unwrap();
    {
        let _w = p.client.client_writes().unwrap();
        assert_eq!(
            errno_of(p.client.create(d, b"a", 0o644, 0, 0)),
            Some(libc::EROFS),
            "no lane"
        );
    }
    p.client.client_give_back_dir(d);
    let (_, _) = grant(&p, d, 2);
    {
        let _w = p.client.client_writes().unwrap();
        assert_eq!(
            errno_of(p.client.create(other, b"a", 0o644, 0, 0)),
            Some(libc::EROFS),
            "no lease of that directory"
        );
        assert_eq!(
            errno_of(p.client.mkdir(d, b"sub", 0o755, 0, 0)),
            Some(libc::EROFS),
            "directories are the server's"
        );
        assert_eq!(
            errno_of(p.client.create_cred(&root, d, b"taken", 0o644)),
            owner_eexist
        );
        assert_eq!(
            errno_of(p.client.create_cred(&user, d, b"mine", 0o644)),
            owner_eacces
        );
        assert_eq!(
            errno_of(p.client.create_cred(&root, d, &long, 0o644)),
            owner_long
        );
        // Two slots: the third create has none left.
        for name in [&b"s1"[..], b"s2"] {
            let (_, fh) = p.client.create_cred(&root, d, name, 0o644).unwrap();
            p.client.release(fh);
        }
        assert_eq!(
            errno_of(p.client.create(d, b"s3", 0o644, 0, 0)),
            Some(libc::EAGAIN)
        );
    }
    // The lane goes back only with the last directory lease.
    assert_eq!(
        errno_of(p.client.client_give_back_lane()),
        Some(libc::EBUSY)
    );
    give_back(&p, d);
    assert_eq!(
        names(&p.owner, d),
        vec![b"s1".to_vec(), b"s2".to_vec(), b"taken".to_vec()]
    );
    let (scan, errors) = scanned(&p);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(p.owner.statfs(), scan);
}

/// The owner's side refuses what it cannot grant: the last lane it has,
/// a lane leased twice, a take-back that names a slot it did not hand
/// out, a lane not leased.
#[test]
fn the_owner_refuses_bad_lane_requests() {
    let p = pair("refuse");
    let lanes = p.owner.geometry().lane_count;
    let mut granted = Vec::new();
    for lane in 1..lanes {
        granted.push(p.owner.lease_lane(lane, 1).unwrap());
    }
    assert_eq!(
        errno_of(p.owner.lease_lane(0, 1)),
        Some(libc::EBUSY),
        "the last lane"
    );
    assert_eq!(
        errno_of(p.owner.lease_lane(1, 1)),
        Some(libc::EBUSY),
        "leased already"
    );
    assert_eq!(errno_of(p.owner.lease_lane(lanes, 1)), Some(libc::EINVAL));
    // The owner's own creates go to its remaining lane meanwhile.
    let (a, fh) = p.owner.create(ROOT, b"mine", 0o644, 0, 0).unwrap();
    p.owner.release(fh);
    assert_eq!((a.ino - 1) % lanes as u64, 0);
    let g = &granted[0];
    let bad = inkfs::lanelease::LaneReturn {
        lane: g.lane,
        unused_slots: vec![g.slots[0] + 1000],
        table_end: g.table_end,
        chunks: Vec::new(),
    };
    assert_eq!(errno_of(p.owner.take_back_lane(&bad)), Some(libc::EINVAL));
    for g in &granted {
        let ret = inkfs::lanelease::LaneReturn {
            lane: g.lane,
            unused_slots: g.slots.clone(),
            table_end: g.table_end,
            chunks: Vec::new(),
        };
        p.owner.take_back_lane(&ret).unwrap();
    }
    let ret = inkfs::lanelease::LaneReturn {
        lane: 1,
        ..Default::default()
    };
    assert_eq!(
        errno_of(p.owner.take_back_lane(&ret)),
        Some(libc::EINVAL),
        "not leased"
    );
    let (scan, errors) = scanned(&p);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(p.owner.statfs(), scan);
}
