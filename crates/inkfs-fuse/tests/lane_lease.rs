//! Lane grants and the client's creates end to end, on real mounts
//! (docs/KERNEL-FREE.md, "Built: lane grants and the client's creates end
//! to end"): an API client that holds directory D's lease and a lane
//! (`Client::ns_dir_lease`, `+dir +lane`) creates files in D without a
//! ring request (`Client::ns`); the mount sees them at once (the recall),
//! the files it keeps writing become file leases at the give-back, the
//! lane comes back with the last directory; a client killed at any point
//! is reaped (its lane's journal replayed, its reservation settled), and
//! every name it acknowledged stays. The killed client is this test binary
//! re-executed (`lane_lease_child`).

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::lanes::*;
use common::preload::fsck_clean;
use common::*;
use inkfs::api::client::Client;
use inkfs::api::dirlease::{DirAnswer, Refusal};
use inkfs::api::OpenFlags;

const CHILD_ENV: &str = "INKFS_LANE_LEASE_CHILD";
const CHILD_DIR_ENV: &str = "INKFS_LANE_LEASE_CHILD_DIR";
const CHILD_FROM_ENV: &str = "INKFS_LANE_LEASE_CHILD_FROM";

fn client_creates(mnt: &Path) -> u64 {
    let s = stats_json(mnt).expect("statistics");
    s["ops"]["client_create"]["count"].as_u64().unwrap_or(0)
}

/// Create `name` in `dir` (under the lease when held) and write `data`
/// to it: its inode number.
fn make(c: &Client, dir: u64, name: &str, data: &[u8]) -> u64 {
    // Made read-only when nothing is written: no file lease, none kept.
    let access = if data.is_empty() {
        libc::O_RDONLY
    } else {
        libc::O_WRONLY
    };
    let d = c
        .ns(&root(), create_with(dir, name, access))
        .expect("asked");
    assert_eq!(d.errno, 0, "create {name}");
    if !data.is_empty() {
        let f = c
            .open(&root(), d.ino, OpenFlags::new(libc::O_WRONLY))
            .expect("open");
        assert_eq!(c.write(&f, 0, data).expect("write"), data.len());
        c.release(f);
    }
    d.ino
}

/// Creates under D's lease go to no ring; the mount sees each name at
/// once, also one it had looked up missing before the grant, with the
/// data written under the lease; a listing shows them all; the files the
/// client wrote are kept leased at the give-back (a write through the
/// mount recalls them as any file); the lane comes back with D; the books
/// match a scan. Fails without the local create (the ring's count moves),
/// without `kept=` (a write through the mount finds no lease to recall:
/// the client's later write is lost... its count stays 0), and without
/// the reservation's settle of the new inodes' blocks (the books differ
/// from the scan: blocks named by the new files returned at the detach).
#[test]
fn creates_under_the_lease_are_seen_through_the_mount() {
    require_root();
    let pool = Pool::new("ll-seen", 64);
    let m = Mounted::new(&pool, "mode=strict");
    std::fs::create_dir(m.p("D")).unwrap();
    let d = std::fs::metadata(m.p("D")).unwrap().ino();
    // Looked up missing: a negative dentry the grant must drop.
    assert!(std::fs::metadata(m.p("D/n0")).is_err());
    let (blocks0, inodes0) = statvfs(m.path());
    let c = Client::attach_mountpoint(m.path(), None).expect("attach");
    lease(&c, d, "first");
    assert_eq!(stat_u64(m.path(), "lanes_leased"), 1);
    let ring = client_creates(m.path());
    let n = 20;
    for i in 0..n {
        let data = if i % 2 == 0 {
            vec![i as u8; 5000]
        } else {
            Vec::new()
        };
        make(&c, d, &format!("n{i}"), &data);
    }
    assert_eq!(c.local_creates(), n as u64, "creates went to the server");
    assert_eq!(client_creates(m.path()), ring, "ring requests made");
    // Through the mount: the recall, and the names.
    let meta = std::fs::metadata(m.p("D/n0")).expect("n0 through the mount");
    assert_eq!(meta.len(), 5000);
    assert_eq!(c.dir_leases_held(), 0);
    assert_eq!(std::fs::read(m.p("D/n2")).unwrap(), vec![2u8; 5000]);
    // A write through the mount recalls the kept lease; the client's
    // next write asks for it again, which recalls the mount's view: the
    // mount reads the client's bytes over its own.
    let n4 = c.lookup(&root(), d, b"n4").expect("n4").ino;
    assert!(c.holds_lease(n4), "n4 not kept");
    std::fs::write(m.p("D/n4"), b"mount").unwrap();
    assert!(!c.holds_lease(n4), "the mount's write did not recall n4");
    assert_eq!(std::fs::read(m.p("D/n4")).unwrap(), b"mount");
    let f = c
        .open(&root(), n4, OpenFlags::new(libc::O_WRONLY))
        .expect("open n4");
    assert_eq!(c.write(&f, 0, b"CLIENT").expect("write"), 6);
    c.release(f);
    assert_eq!(std::fs::read(m.p("D/n4")).unwrap(), b"CLIENT");
    let mut names: Vec<String> = std::fs::read_dir(m.p("D"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names.len(), n + 1, "{names:?}");
    assert_eq!(stat_u64(m.path(), "lanes_given_back"), 1);
    // The written ones were kept as file leases: n/2 (a listing through
    // the mount recalls each, as any file's).
    assert_eq!(stat_u64(m.path(), "dir_files_kept"), n as u64 / 2);
    drop(c);
    eventually("no client attached", || {
        stat_u64(m.path(), "clients_attached") == 0
    });
    // Once the client is gone: the lane's handed-out slots count as used
    // while it holds them.
    let (blocks, inodes) = statvfs(m.path());
    assert_eq!(inodes - inodes0, n as u64 + 1, "inodes not exact");
    // The data (two blocks a written file) at least; the exact count is
    // the scan's, below.
    assert!(blocks0 - blocks >= n as u64, "{blocks0} -> {blocks}");
    let m = books_match_a_scan(&pool, m);
    assert_eq!(std::fs::read(m.p("D/n18")).unwrap(), vec![18u8; 5000]);
    m.unmount();
    fsck_clean(&pool);
}

/// Past the grant's slots the client asks for more (`slots K`) and its
/// creates stay local; the take-back reads the added slots too (the books
/// match a scan). Fails without `slots K` (the creates past the grant's
/// 256 go to the ring).
#[test]
fn more_slots_keep_the_creates_local() {
    require_root();
    let pool = Pool::new("ll-slots", 64);
    let m = Mounted::new(&pool, "mode=strict");
    std::fs::create_dir(m.p("D")).unwrap();
    let d = std::fs::metadata(m.p("D")).unwrap().ino();
    let c = Client::attach_mountpoint(m.path(), None).expect("attach");
    lease(&c, d, "first");
    let n = 2 * inkfs::api::lanelease::LANE_SLOTS_MAX + 10;
    for i in 0..n {
        make(&c, d, &format!("s{i}"), b"");
    }
    assert_eq!(c.local_creates(), n as u64, "creates went to the server");
    assert!(stat_u64(m.path(), "lane_slots_given") >= (n - 256) as u64);
    assert_eq!(std::fs::read_dir(m.p("D")).unwrap().count(), n + 1);
    assert_eq!(stat_u64(m.path(), "lanes_given_back"), 1);
    drop(c);
    eventually("no client attached", || {
        stat_u64(m.path(), "clients_attached") == 0
    });
    let m = books_match_a_scan(&pool, m);
    m.unmount();
    fsck_clean(&pool);
}

/// A client that asks no lane (`Client::ns_dir_lease` of a client whose
/// server said no `lanes=1` sends no `+lane`; here: a grant refused for
/// want of a lane) makes its creates through the ring; with every lane
/// but the owner's last leased, a grant is refused `nolane` and counted.
#[test]
fn no_lane_free_refuses_the_directory() {
    require_root();
    let pool = Pool::new("ll-nolane", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let lanes = {
        let c = Client::attach_mountpoint(m.path(), None).expect("attach");
        c.call(|fs| fs.lane_count())
    };
    assert!(lanes >= 2, "{lanes} lanes");
    let mut clients = Vec::new();
    for k in 0..lanes {
        let dir = format!("D{k}");
        std::fs::create_dir(m.p(&dir)).unwrap();
        let d = std::fs::metadata(m.p(&dir)).unwrap().ino();
        let c = Client::attach_mountpoint(m.path(), None).expect("attach");
        let done = c.ns_dir_lease(&root(), create_op(d, "x")).expect("asked");
        assert_eq!(done.errno, 0);
        if k + 1 < lanes {
            assert!(matches!(done.dir, Some(DirAnswer::Granted { .. })), "{k}");
        } else {
            assert_eq!(done.dir, Some(DirAnswer::Refused(Refusal::NoLane)));
            // Its creates go to the server.
            make(&c, d, "y", b"");
            assert_eq!(c.local_creates(), 0);
        }
        clients.push(c);
    }
    assert_eq!(stat_u64(m.path(), "dir_leases_refused_no_lane"), 1);
    assert_eq!(stat_u64(m.path(), "lanes_leased"), lanes as u64 - 1);
    drop(clients);
    eventually("no client attached", || {
        stat_u64(m.path(), "clients_attached") == 0
    });
    assert_eq!(stat_u64(m.path(), "lanes_given_back"), lanes as u64 - 1);
    m.unmount();
    fsck_clean(&pool);
}

// ---------------------------------------------------------------------
// The kill loop
// ---------------------------------------------------------------------

/// Not a test by itself: a client that takes D's lease and a lane (D's
/// inode number in [`CHILD_DIR_ENV`]), then creates and writes files
/// `f<i>` from [`CHILD_FROM_ENV`] on, printing `@made NAME` after each
/// one's create and write returned, until it is killed.
#[test]
fn lane_lease_child() {
    let Ok(mnt) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (d, from) = (env_u64(CHILD_DIR_ENV), env_u64(CHILD_FROM_ENV));
    let c = Client::attach_mountpoint(Path::new(&mnt), None).expect("attach");
    lease(&c, d, &format!("lease{from}"));
    println!("@granted");
    for i in from.. {
        let name = format!("f{i}");
        make(&c, d, &name, name.as_bytes());
        println!("@made {name}");
    }
}

fn spawn_child(mnt: &Path, d: u64, from: u64) -> std::process::Child {
    spawn_kill_loop_child(
        "lane_lease_child",
        [CHILD_ENV, CHILD_DIR_ENV, CHILD_FROM_ENV],
        mnt,
        d,
        from,
    )
}

/// A client creating and writing files under D's lease, SIGKILLed after a
/// varying number of acknowledged files, up to 300 (past the grant's
/// slots: `slots K`; the kill lands anywhere in the
/// next create or write): after each round the server has reaped it
/// (its lane, its reservation), every acknowledged name is present
/// through the mount with its data, and a new client leases the lane
/// again. At the end the books match a scan, fsck and scrub are clean.
/// `INKFS_TEST_ROUNDS` sets the rounds (8). Fails without the reaping of
/// the lane (`lanes_reaped` stays 0, and the next client's lane grant
/// finds every lane leased after a few rounds), and without the reaping's
/// place before the directory's settle (fsck: a name whose inode is FREE
/// or a directory log page freed).
#[test]
fn a_client_killed_under_the_lease_is_reaped() {
    require_root();
    let rounds = kill_loop_rounds();
    let pool = Pool::new("ll-kill", 64);
    let m = Mounted::new(&pool, "mode=strict");
    std::fs::create_dir(m.p("D")).unwrap();
    let d = std::fs::metadata(m.p("D")).unwrap().ino();
    let mut acked = Vec::new();
    let mut seed = std::process::id() as u64 | 1;
    for round in 0..rounds {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let acks = 1 + (seed % 300) as usize;
        let mut child = spawn_child(m.path(), d, round * 1000);
        let made = run_and_kill(&mut child, acks);
        eventually("the client reaped", || {
            stat_u64(m.path(), "clients_attached") == 0
        });
        // Each lane leased came back: reaped, or given back by a recall
        // of D before the kill.
        let (reaped, back) = (
            stat_u64(m.path(), "lanes_reaped"),
            stat_u64(m.path(), "lanes_given_back"),
        );
        assert_eq!(
            stat_u64(m.path(), "lanes_leased"),
            reaped + back,
            "round {round}"
        );
        assert_eq!(
            reaped + back,
            round + 1,
            "round {round}: {reaped} reaped, {back} back"
        );
        acked.extend(made);
        for name in &acked {
            let got = std::fs::read(m.p(&format!("D/{name}")))
                .unwrap_or_else(|e| panic!("round {round}: {name}: {e}"));
            assert_eq!(got, name.as_bytes(), "round {round}: {name}");
        }
    }
    assert!(acked.len() as u64 >= rounds, "too few creates acknowledged");
    let reaped = stat_u64(m.path(), "lanes_reaped");
    eprintln!(
        "{rounds} rounds: {reaped} lanes reaped, {} files acknowledged",
        acked.len()
    );
    kill_loop_end(&pool, m, rounds);
}

/// The server killed while a client creates under D's lease: the remount
/// recovers (every lane's journal, the client's included), the names the
/// client acknowledged are there, fsck is clean.
#[test]
fn the_server_killed_under_a_lane_lease() {
    require_root();
    let pool = Pool::new("ll-server", 64);
    let m = Mounted::new(&pool, "mode=strict");
    std::fs::create_dir(m.p("D")).unwrap();
    let d = std::fs::metadata(m.p("D")).unwrap().ino();
    let mut child = spawn_child(m.path(), d, 0);
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let mut made = Vec::new();
    while made.len() < 25 {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the client ended");
        if let Some(name) = line.trim_end().strip_prefix("@made ") {
            made.push(name.to_string());
        }
    }
    let dir = m.kill9();
    // The client sees its session end and stops writing; its descriptor
    // of the pool goes with it.
    let _ = child.kill();
    let _ = child.wait();
    let m = Mounted::at(&pool, dir, "mode=strict");
    for name in &made {
        let got =
            std::fs::read(m.p(&format!("D/{name}"))).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(got, name.as_bytes(), "{name}");
    }
    m.unmount();
    fsck_clean(&pool);
}
