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
use inkfs::rmlocal::{ClientUnlink, KernelHeld, NotLocal};
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
    grant_with(p, dir, slots, KernelHeld::Many)
}

/// [`grant`] with what the kernel holds in `dir` (rule 4 of a removal).
fn grant_with(
    p: &Pair,
    dir: u64,
    slots: usize,
    kernel: KernelHeld,
) -> (LaneGrant, Vec<(u64, u64)>) {
    let lane = p.owner.geometry().lane_count - 1;
    let g = p.owner.lease_lane(lane, slots).unwrap();
    assert!(p.owner.lane_leased(lane));
    p.client.client_take_lane(&g).unwrap();
    let reserved = p.owner.reserve_blocks(RESERVE, 64);
    p.client.add_reservation(&reserved).unwrap();
    p.client.client_lease_dir_with(dir, kernel).unwrap();
    (g, reserved)
}

/// What the client sends with its freed batches (`freed`, `slot INO`),
/// handled by the owner as the server does.
fn send_freed(p: &Pair) -> Vec<(u64, u64)> {
    let freed = p.client.take_client_freed();
    p.owner.return_blocks(&freed);
    for ino in p.client.take_client_freed_slots() {
        p.owner.free_client_victim(ino).unwrap();
    }
    freed
}

/// The client gives `dir` and the lane back, and what it freed and did
/// not use; the owner settles.
fn give_back(p: &Pair, dir: u64) {
    p.client.client_give_back_dir(dir);
    let ret = p.client.client_give_back_lane().unwrap();
    send_freed(p);
    let unused = p.client.drain_reservation();
    p.owner.free_unused_blocks(&unused);
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
        // Directories are the client's too since h/askmkdir (a slot:
        // tested in crates/inkfs-fuse/tests/lease_mkdir.rs); symlinks
        // are still the server's.
        assert_eq!(
            errno_of(p.client.symlink(d, b"sub", b"target", 0, 0)),
            Some(libc::EROFS),
            "symlinks are the server's"
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
        ..Default::default()
    };
    assert_eq!(errno_of(p.owner.take_back_lane(&bad)), Some(libc::EINVAL));
    for g in &granted {
        let ret = inkfs::lanelease::LaneReturn {
            lane: g.lane,
            unused_slots: g.slots.clone(),
            table_end: g.table_end,
            ..Default::default()
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

// ---------------------------------------------------------------------
// Removals under the lease (docs/KERNEL-FREE.md, "Built: a client's
// removals in the engine")
// ---------------------------------------------------------------------

/// The caller holds every victim's write lease (rule 3).
fn leased(_: u64) -> bool {
    true
}

fn unlink(p: &Pair, dir: u64, name: &str) -> ClientUnlink {
    let _w = p.client.client_writes().unwrap();
    p.client
        .client_unlink(None, dir, name.as_bytes(), &leased)
        .unwrap()
}

/// Files the owner creates in `dir` before the lease, with data: the
/// first half on the lane the lease takes, the rest on lane 0 (the
/// owner's other lanes leased away meanwhile).
fn older_files(p: &Pair, dir: u64, n: usize) -> Vec<u64> {
    let lanes = p.owner.geometry().lane_count;
    let on_lane = |lane: u32, i: usize| {
        let others: Vec<LaneGrant> = (0..lanes)
            .filter(|&l| l != lane)
            .map(|l| p.owner.lease_lane(l, 0).unwrap())
            .collect();
        let ino = old_file(p, dir, i);
        for g in others {
            let ret = inkfs::lanelease::LaneReturn {
                lane: g.lane,
                table_end: g.table_end,
                ..Default::default()
            };
            p.owner.take_back_lane(&ret).unwrap();
        }
        assert_eq!((ino - 1) % lanes as u64, lane as u64);
        ino
    };
    (0..n)
        .map(|i| on_lane(if i < n / 2 { lanes - 1 } else { 0 }, i))
        .collect()
}

fn old_file(p: &Pair, dir: u64, i: usize) -> u64 {
    {
        {
            let (a, fh) = p
                .owner
                .create(dir, format!("old{i}").as_bytes(), 0o644, 0, 0)
                .unwrap();
            p.owner.write(&fh, 0, &vec![9u8; 6000]).unwrap();
            p.owner.release(fh);
            a.ino
        }
    }
}

/// The client creates `names` in `dir`, each with 5000 bytes.
fn client_creates(p: &Pair, dir: u64, names: &[String]) -> Vec<u64> {
    let _w = p.client.client_writes().unwrap();
    names
        .iter()
        .map(|n| {
            let (a, fh) = p.client.create(dir, n.as_bytes(), 0o644, 0, 0).unwrap();
            p.client.write(&fh, 0, &vec![3u8; 5000]).unwrap();
            p.client.release(fh);
            a.ino
        })
        .collect()
}

fn sorted(v: impl IntoIterator<Item = String>) -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = v.into_iter().map(String::into_bytes).collect();
    v.sort();
    v
}

/// The client removes half of its own creates and some older files of
/// the owner's (the kernel holds nothing in the directory), creates again
/// in the slots it freed, and gives the lane back: the names are the
/// owner's, and the owner's statfs (inodes and blocks) is exactly what a
/// recovery scan finds, before the lease, after it, and after the owner
/// works in the directory again.
#[test]
fn a_clients_removals_are_accounted_exactly() {
    let p = pair("rm");
    let d = p.owner.mkdir(ROOT, b"d", 0o755, 0, 0).unwrap().ino;
    let old = older_files(&p, d, 6);
    let before = p.owner.statfs();
    assert_eq!(before, scanned(&p).0);
    grant_with(&p, d, 16, KernelHeld::Nothing);
    let mine: Vec<String> = (0..10).map(|i| format!("f{i}")).collect();
    let inos = client_creates(&p, d, &mine);
    for i in (0..10).step_by(2) {
        assert_eq!(unlink(&p, d, &format!("f{i}")), ClientUnlink::Freed);
    }
    for i in 0..4 {
        assert_eq!(unlink(&p, d, &format!("old{i}")), ClientUnlink::Freed);
    }
    // The client sees its removals at once; a removed name is ENOENT.
    assert_eq!(
        p.client.lookup_ino(d, b"f0").err().map(|e| e.errno()),
        Some(libc::ENOENT)
    );
    assert_eq!(
        p.client
            .client_unlink(None, d, b"f0", &leased)
            .err()
            .map(|e| e.errno()),
        Some(libc::EROFS),
        "outside a lease write"
    );
    {
        let _w = p.client.client_writes().unwrap();
        assert_eq!(
            p.client
                .client_unlink(None, d, b"f0", &leased)
                .err()
                .map(|e| e.errno()),
            Some(libc::ENOENT)
        );
    }
    // Creates again: the slots of its removed creates are handed out
    // again (the lowest first); the older files' slots are the owner's
    // (`slot INO`), of the leased lane (old0-2) or not (old3).
    let again = client_creates(&p, d, &["g0".to_string(), "g1".to_string()]);
    assert_eq!(again, [inos[0], inos[2]], "the lowest freed slots reused");
    assert!(!again.contains(&old[0]));
    give_back(&p, d);
    let want = sorted(
        (1..10)
            .step_by(2)
            .map(|i| format!("f{i}"))
            .chain((4..6).map(|i| format!("old{i}")))
            .chain(["g0".to_string(), "g1".to_string()]),
    );
    assert_eq!(names(&p.owner, d), want);
    assert_eq!(names(&p.client, d), want);
    for i in 0..4 {
        assert_eq!(
            p.owner
                .lookup_ino(d, format!("old{i}").as_bytes())
                .err()
                .map(|e| e.errno()),
            Some(libc::ENOENT)
        );
    }
    let after = p.owner.statfs();
    assert_eq!(used_inodes(&after), used_inodes(&before) + 5 + 2 - 4);
    let (scan, errors) = scanned(&p);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(after, scan, "the owner's books against the scan");
    // The owner removes and creates in the directory again, and the
    // books stay the scan's.
    p.owner.unlink(d, b"f1").unwrap();
    p.owner.unlink(d, b"g0").unwrap();
    let (_, fh) = p.owner.create(d, b"owner", 0o644, 0, 0).unwrap();
    p.owner.release(fh);
    let (scan, errors) = scanned(&p);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(p.owner.statfs(), scan);
}

/// The client removes files and dies holding the lane (its engine
/// dropped, after its freed batches reached the owner); the owner reaps
/// the lane: every slot is accounted once (a slot freed and used again,
/// one freed and left), the books are the scan's.
#[test]
fn a_dead_clients_removals_are_reaped_exactly() {
    let p = pair("rmreap");
    let d = p.owner.mkdir(ROOT, b"d", 0o755, 0, 0).unwrap().ino;
    let olds = older_files(&p, d, 8);
    let before = p.owner.statfs();
    let (g, reserved) = grant_with(&p, d, 12, KernelHeld::Nothing);
    let lanes = p.owner.geometry().lane_count as u64;
    assert_eq!(
        olds.iter()
            .filter(|&&i| (i - 1) % lanes == g.lane as u64)
            .count(),
        4
    );
    let mine: Vec<String> = (0..6).map(|i| format!("f{i}")).collect();
    client_creates(&p, d, &mine);
    // The server's books: what the client returned leaves its
    // reservation (the mount's `Leases::take_back`).
    let mut books = inkfs::lease::RangeSet::from_ranges(&reserved);
    let mut send = |p: &Pair| {
        for (s, l) in send_freed(p) {
            for (a, b) in books.intersect(s, l) {
                books.remove(a, b);
            }
        }
    };
    // Half of the removals reach the owner before the client dies
    // (`freed` and `slot INO`), half do not: the reap finds those.
    for name in ["f0", "old0", "old4"] {
        assert_eq!(unlink(&p, d, name), ClientUnlink::Freed, "{name}");
    }
    send(&p);
    for name in ["f1", "f2", "old1", "old2", "old3"] {
        assert_eq!(unlink(&p, d, name), ClientUnlink::Freed, "{name}");
    }
    client_creates(&p, d, &["g0".to_string()]);
    let reserved = books.ranges();
    let Pair {
        owner,
        client,
        path,
    } = p;
    drop(client);
    let settled = owner.reap_lane(g.lane, &[d], &reserved).unwrap();
    assert!(!owner.lane_leased(g.lane));
    let want = sorted(
        ["f3", "f4", "f5", "g0", "old5", "old6", "old7"]
            .iter()
            .map(|s| s.to_string()),
    );
    assert_eq!(names(&owner, d), want);
    assert_eq!(settled.live.len(), 4, "{settled:?}");
    assert_eq!(settled.older_freed, 3, "{settled:?}");
    let after = owner.statfs();
    assert_eq!(used_inodes(&after), used_inodes(&before) + 4 - 5);
    let p = Pair {
        client: client_of(&owner),
        owner,
        path,
    };
    let (scan, errors) = scanned(&p);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(after, scan, "the owner's books against the scan");
}

/// A file another process holds open (its hold in the epoch table) and
/// the client removes: the removal says so, the file stays readable
/// there, the owner adopts the orphan and frees it at the last unhold.
#[test]
fn a_held_file_stays_readable_and_is_freed_at_its_last_unhold() {
    let p = pair("rmheld");
    let table = inkfs::epoch::EpochTable::new_shared();
    p.owner.share_epochs(table.clone());
    let own = table.claim_index().unwrap();
    p.client.client_use_epochs(table.clone(), own);
    let d = p.owner.mkdir(ROOT, b"d", 0o755, 0, 0).unwrap().ino;
    let before = p.owner.statfs();
    let (_, _) = grant_with(&p, d, 8, KernelHeld::Nothing);
    let inos = client_creates(&p, d, &["held".to_string(), "free".to_string()]);
    // A second process: its own mapping, its slot, its hold, a handle.
    let other = client_of(&p.owner);
    let slot = table.claim_index().unwrap();
    let at = table.hold(slot, inos[0]).unwrap();
    let fh = other.open(inos[0]).unwrap();
    let generation = match unlink(&p, d, "held") {
        ClientUnlink::Held { ino, generation } => {
            assert_eq!(ino, inos[0]);
            generation
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(unlink(&p, d, "free"), ClientUnlink::Freed);
    // Readable there, unnamed everywhere.
    let mut buf = vec![0u8; 5000];
    assert_eq!(other.read(&fh, 0, &mut buf).unwrap(), 5000);
    assert_eq!(buf, vec![3u8; 5000]);
    assert_eq!(
        p.owner.lookup_ino(d, b"held").err().map(|e| e.errno()),
        Some(libc::ENOENT)
    );
    // `orphan INO GEN`: held, so kept; a wrong generation is nothing.
    assert!(!p
        .owner
        .adopt_client_orphan(inos[0], generation + 1)
        .unwrap());
    assert!(!p.owner.adopt_client_orphan(inos[0], generation).unwrap());
    assert_eq!(p.owner.held_orphans(), 1);
    give_back(&p, d);
    assert_eq!(p.owner.free_unheld_orphans(), 0, "still held");
    other.release(fh);
    table.unhold(slot, at, inos[0]);
    table.release_slot(slot);
    assert_eq!(p.owner.free_unheld_orphans(), 1, "the last unhold");
    assert_eq!(p.owner.held_orphans(), 0);
    p.owner.reclaim_limbo();
    let after = p.owner.statfs();
    assert_eq!(used_inodes(&after), used_inodes(&before));
    let (scan, errors) = scanned(&p);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(after, scan);
}

/// Each rule that keeps a removal from the client gives its reason, and
/// nothing changes; what the owner answers with an errno the client
/// answers the same.
#[test]
fn a_removal_failing_a_rule_is_not_local() {
    let p = pair("rmrules");
    let d = p.owner.mkdir(ROOT, b"d", 0o755, 0, 0).unwrap().ino;
    let sticky = p.owner.mkdir(ROOT, b"t", 0o1777, 0, 0).unwrap().ino;
    let old = older_files(&p, d, 3);
    p.owner.link(old[0], d, b"twice").unwrap();
    p.owner.mkdir(d, b"sub", 0o755, 0, 0).unwrap();
    let (_, fh) = p
        .owner
        .create(sticky, b"theirs", 0o644, 1001, 1001)
        .unwrap();
    p.owner.release(fh);
    let not_local = |r: ClientUnlink| match r {
        ClientUnlink::NotLocal(why) => Some(why),
        _ => None,
    };
    // No lease of d, no lane.
    assert_eq!(not_local(unlink(&p, d, "old1")), Some(NotLocal::NoDirLease));
    p.client.client_lease_dir(d).unwrap();
    assert_eq!(not_local(unlink(&p, d, "old1")), Some(NotLocal::NoLane));
    p.client.client_give_back_dir(d);
    // The kernel holds old1 (on the grant's list).
    let (_, _) = grant_with(&p, d, 4, KernelHeld::Children(vec![old[1]]));
    p.client
        .client_lease_dir_with(sticky, KernelHeld::Nothing)
        .unwrap();
    let cases = [
        ("old0", NotLocal::Links),
        ("twice", NotLocal::Links),
        ("sub", NotLocal::NotRegular),
        ("old1", NotLocal::KernelHolds),
    ];
    for (name, why) in cases {
        assert_eq!(not_local(unlink(&p, d, name)), Some(why), "{name}");
    }
    {
        let _w = p.client.client_writes().unwrap();
        assert_eq!(
            p.client
                .client_unlink(None, d, b"old2", &|_| false)
                .unwrap(),
            ClientUnlink::NotLocal(NotLocal::NoVictimLease)
        );
    }
    // Errnos as the owner's: ENOENT, EACCES (no write permission on d),
    // EPERM (the sticky bit), ENAMETOOLONG.
    let user = Credentials {
        uid: 1000,
        gid: 1000,
        groups: vec![1000],
        umask: 0o022,
    };
    let long = "x".repeat(256);
    let owner_says =
        |dir: u64, name: &str| errno_of(p.owner.unlink_cred(&user, dir, name.as_bytes()));
    let client_says = |dir: u64, name: &str| {
        let _w = p.client.client_writes().unwrap();
        errno_of(
            p.client
                .client_unlink(Some(&user), dir, name.as_bytes(), &leased),
        )
    };
    for (dir, name, want) in [
        (d, "nothing", libc::ENOENT),
        (d, "old2", libc::EACCES),
        (sticky, "theirs", libc::EPERM),
        (d, long.as_str(), libc::ENAMETOOLONG),
    ] {
        assert_eq!(owner_says(dir, name), Some(want), "{name}");
        assert_eq!(client_says(dir, name), Some(want), "{name}");
    }
    // "Many": the client's own create goes, an older file does not.
    p.client.client_give_back_dir(d);
    p.client.client_lease_dir(d).unwrap();
    client_creates(&p, d, &["new".to_string()]);
    assert_eq!(
        not_local(unlink(&p, d, "old2")),
        Some(NotLocal::KernelHolds)
    );
    assert_eq!(unlink(&p, d, "new"), ClientUnlink::Freed);
    // Links and renames stay the server's.
    {
        let _w = p.client.client_writes().unwrap();
        assert_eq!(errno_of(p.client.unlink(d, b"old2")), Some(libc::EROFS));
        assert_eq!(errno_of(p.client.link(old[2], d, b"l")), Some(libc::EROFS));
    }
    p.client.client_give_back_dir(sticky);
    p.owner.settle_dir(sticky).unwrap();
    give_back(&p, d);
    let mut want = sorted(["old0", "old1", "old2", "twice", "sub"].map(String::from));
    want.sort();
    assert_eq!(names(&p.owner, d), want);
    let (scan, errors) = scanned(&p);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(p.owner.statfs(), scan);
}

/// Issue 16's lost creates (docs/KERNEL-FREE.md, "Built: a late `slots`
/// answer"): a client asks `slots K` with its lane's slots used up; the
/// lane goes back (the last directory's recall) before the answer lands,
/// its unused slots, the answer's among them, FREE again in the owner's
/// list; a new grant of the same lane hands some of them out again; the
/// late answer must not add them to the new lease, or two creates get one
/// slot and the second fails ("handed out while in use": EIO to the
/// program, whose thread's file was then missing from its listing).
/// Replayed here in the order the wire delivered it.
#[test]
fn slots_answered_for_an_earlier_lane_lease_are_not_taken() {
    let p = pair("lateslots");
    let d = p.owner.mkdir(ROOT, b"d", 0o755, 0, 0).unwrap().ino;
    let (g, _) = grant(&p, d, 1);
    let (lane, taken) = p.client.client_lane_lease().unwrap();
    assert_eq!(lane, g.lane);
    client_creates(&p, d, &["a".to_string()]);
    assert_eq!(p.client.client_lane_slots(), 0);
    // The server answers `slots K` for the first lease...
    let late = p.owner.lease_more_slots(lane, 4).unwrap();
    assert!(!late.is_empty());
    // ...the lane goes back, and is granted again, before it lands.
    give_back(&p, d);
    let (g2, _) = grant(&p, d, 8);
    assert_eq!(g2.lane, lane);
    assert!(
        late.iter().any(|s| g2.slots.contains(s)),
        "no slot handed out twice: the test shows nothing ({late:?}, {:?})",
        g2.slots
    );
    let now = p.client.client_lane_lease().unwrap();
    assert_ne!(now.1, taken);
    assert!(p.client.client_add_slots(lane, taken, &late).is_err());
    assert_eq!(p.client.client_lane_slots(), 8);
    // Every slot held is the client's alone: each create finds it FREE.
    let names: Vec<String> = (0..8).map(|i| format!("f{i}")).collect();
    client_creates(&p, d, &names);
    // An answer to the lease held now is taken.
    let more = p.owner.lease_more_slots(lane, 2).unwrap();
    p.client.client_add_slots(lane, now.1, &more).unwrap();
    assert_eq!(p.client.client_lane_slots(), more.len());
    give_back(&p, d);
    assert_eq!(names_of(&p, d), 9);
    let (_, problems) = scanned(&p);
    assert!(problems.is_empty(), "{problems:?}");
}

fn names_of(p: &Pair, d: u64) -> usize {
    names(&p.owner, d).len()
}
