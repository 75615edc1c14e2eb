//! Client-local removals end to end, on real mounts (docs/KERNEL-FREE.md,
//! "Built: client-local removals on the wire"): an API client that holds
//! directory D's lease and a lane unlinks files in D in its own engine
//! (`Client::ns` with `Op::Unlink`), without a ring request; the server
//! hears `slot INO` for an older file it freed and `orphan INO GEN` for
//! one another process holds open; a file the kernel holds goes to the
//! server; a client or server killed among removals leaves every
//! acknowledged removal done and every acknowledged create there, the
//! books equal to a scan's. The killed client is this test binary
//! re-executed (`lane_unlink_child`).

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use common::lanes::*;
use common::preload::fsck_clean;
use common::*;
use inkfs::api::client::Client;
use inkfs::api::ns::Op;
use inkfs::api::OpenFlags;

const CHILD_ENV: &str = "INKFS_LANE_UNLINK_CHILD";
const CHILD_DIR_ENV: &str = "INKFS_LANE_UNLINK_CHILD_DIR";
const CHILD_FROM_ENV: &str = "INKFS_LANE_UNLINK_CHILD_FROM";

/// Unlinks the mount's server made for clients (ring requests).
fn ring_unlinks(mnt: &Path) -> u64 {
    let s = stats_json(mnt).expect("statistics");
    s["ops"]["client_unlink"]["count"].as_u64().unwrap_or(0)
}

fn unlink_op(dir: u64, name: &str) -> Op {
    Op::Unlink {
        dir,
        name: name.as_bytes().to_vec(),
    }
}

/// Create `name` in `dir` (under the lease when held) and write `data`
/// to it: its inode number and generation.
fn make(c: &Client, dir: u64, name: &str, data: &[u8]) -> (u64, u64) {
    let d = c.ns(&root(), create_op(dir, name)).expect("asked");
    assert_eq!(d.errno, 0, "create {name}");
    let f = c
        .open(&root(), d.ino, OpenFlags::new(libc::O_WRONLY))
        .expect("open");
    assert_eq!(c.write(&f, 0, data).expect("write"), data.len());
    c.release(f);
    (d.ino, d.igen)
}

fn unlink(c: &Client, dir: u64, name: &str) {
    let d = c.ns(&root(), unlink_op(dir, name)).expect("asked");
    assert_eq!(d.errno, 0, "unlink {name}");
}

fn detached(m: &Mounted) {
    eventually("no client attached", || {
        stat_u64(m.path(), "clients_attached") == 0
    });
}

/// A directory made through the mount, and its inode number.
fn dir(m: &Mounted, name: &str) -> u64 {
    std::fs::create_dir(m.p(name)).unwrap();
    std::fs::metadata(m.p(name)).unwrap().ino()
}

/// Files created and written under D's lease, half of them removed under
/// it: no ring request for the removals, the names gone through the
/// mount (its lookup recalls D) and the others there with their data, the
/// count told at D's give-back; once the client is gone the inodes in use
/// are back where they were but for the files kept, and the books equal a
/// scan's, fsck clean. The removals send the server nothing: their
/// freed blocks wait for a batch, here D's give-back (the books then
/// equal a scan's). Fails without the local removal (the ring's count
/// moves), without the local ENOENT (the same), without the unreserve of
/// the `freed=` head chunks' blocks at the lane's return (fsck: a saved
/// chunk block on the free list), and with a message per removal (the
/// client's count of messages moves).
#[test]
fn removals_of_files_made_under_the_lease() {
    require_root();
    let pool = Pool::new("rmw-made", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let d = dir(&m, "D");
    let (blocks0, inodes0) = statvfs(m.path());
    let c = Client::attach_mountpoint(m.path(), None).expect("attach");
    lease(&c, d, "first");
    let ring = ring_unlinks(m.path());
    let n = 40;
    for i in 0..n {
        make(
            &c,
            d,
            &format!("n{i}"),
            &vec![i as u8; 5000 + 4096 * (i % 3)],
        );
    }
    let sent = c.messages_sent();
    for i in (0..n).step_by(2) {
        unlink(&c, d, &format!("n{i}"));
    }
    assert_eq!(c.messages_sent(), sent, "the removals sent messages");
    // A name already removed: ENOENT from the client's engine.
    let again = c.ns(&root(), unlink_op(d, "n0")).expect("asked");
    assert_eq!(again.errno, libc::ENOENT);
    assert_eq!(
        c.local_removals(),
        n as u64 / 2,
        "removals went to the server"
    );
    assert_eq!(ring_unlinks(m.path()), ring, "ring requests made");
    // Through the mount: the recall, and the names.
    assert!(std::fs::metadata(m.p("D/n0")).is_err(), "n0 still there");
    assert_eq!(c.dir_leases_held(), 0);
    for i in 0..n {
        let got = std::fs::read(m.p(&format!("D/n{i}")));
        if i % 2 == 0 {
            assert!(got.is_err(), "n{i} still there");
        } else {
            assert_eq!(got.unwrap(), vec![i as u8; 5000 + 4096 * (i % 3)]);
        }
    }
    assert_eq!(stat_u64(m.path(), "lane_unlinks"), n as u64 / 2);
    assert_eq!(stat_u64(m.path(), "lanes_given_back"), 1);
    drop(c);
    detached(&m);
    let (blocks, inodes) = statvfs(m.path());
    assert_eq!(inodes - inodes0, n as u64 / 2 + 1, "inodes not exact");
    assert!(blocks0 > blocks, "{blocks0} -> {blocks}");
    let m = books_match_a_scan(&pool, m);
    m.unmount();
    fsck_clean(&pool);
}

/// A file made before the lease (through the ring, written under its own
/// file lease), removed under D's lease: the client frees its record and
/// the server frees its blocks and slot at `slot INO` (counted). Its
/// lease ends with it. Fails without `slot` (never heard).
#[test]
fn an_older_file_is_freed_by_the_server() {
    require_root();
    let pool = Pool::new("rmw-older", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let d = dir(&m, "D");
    let (_, inodes0) = statvfs(m.path());
    let c = Client::attach_mountpoint(m.path(), None).expect("attach");
    let (old, _) = make(&c, d, "old", &[7u8; 20000]);
    assert!(c.holds_lease(old));
    lease(&c, d, "first");
    let ring = ring_unlinks(m.path());
    // More data under the lease, from the reservation.
    let f = c
        .open(&root(), old, OpenFlags::new(libc::O_WRONLY))
        .expect("open");
    c.write(&f, 20000, &[8u8; 9000]).expect("write");
    c.release(f);
    unlink(&c, d, "old");
    assert_eq!(c.local_removals(), 1);
    assert_eq!(ring_unlinks(m.path()), ring, "a ring request made");
    assert!(!c.holds_lease(old));
    eventually("slot heard", || stat_u64(m.path(), "lane_slots_freed") == 1);
    assert!(std::fs::metadata(m.p("D/old")).is_err());
    drop(c);
    detached(&m);
    // `first` stays.
    assert_eq!(statvfs(m.path()).1 - inodes0, 1, "inodes not exact");
    assert_eq!(stat_u64(m.path(), "lane_removals_refused"), 0);
    let m = books_match_a_scan(&pool, m);
    m.unmount();
    fsck_clean(&pool);
}

/// A file another attached process holds (its hold in the epoch table)
/// removed under the lease: it stays readable there, the server adopts it
/// (`orphan INO GEN`) and frees it at the last hold. Fails without
/// `orphan` (never heard).
#[test]
fn a_file_held_elsewhere_is_adopted_and_freed_at_its_close() {
    require_root();
    let pool = Pool::new("rmw-held", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let d = dir(&m, "D");
    let (_, inodes0) = statvfs(m.path());
    let c = Client::attach_mountpoint(m.path(), None).expect("attach");
    let other = Client::attach_mountpoint(m.path(), None).expect("attach");
    lease(&c, d, "first");
    let data = vec![5u8; 12000];
    let (ino, gen) = make(&c, d, "held", &data);
    let hold = other.hold(ino, gen).expect("held");
    let f = other
        .open(&root(), ino, OpenFlags::new(libc::O_RDONLY))
        .expect("open there");
    unlink(&c, d, "held");
    assert_eq!(c.local_removals(), 1);
    eventually("orphan heard", || {
        stat_u64(m.path(), "lane_orphans_adopted") == 1
    });
    let mut buf = vec![0u8; data.len()];
    assert_eq!(other.read(&f, 0, &mut buf).expect("read"), data.len());
    assert_eq!(buf, data, "the held file's bytes");
    other.release(f);
    // The lane back (its handed-out slots count as used while leased):
    // one more than `first`, the orphan.
    drop(c);
    eventually("the lane back", || {
        stat_u64(m.path(), "lanes_given_back") == 1
    });
    assert_eq!(statvfs(m.path()).1 - inodes0, 2);
    other.unhold(hold);
    eventually("the orphan freed", || statvfs(m.path()).1 - inodes0 == 1);
    drop(other);
    detached(&m);
    let m = books_match_a_scan(&pool, m);
    m.unmount();
    fsck_clean(&pool);
}

/// A file the kernel holds (an O_PATH descriptor through the mount, taken
/// before the grant: the grant lists it) goes to the server, which pins
/// it for the descriptor; a file created in the same directory under the
/// lease is still removed locally. Without the grant's kernel list given
/// to the engine (`client_lease_dir`'s "many"), the unheld file's removal
/// would go to the ring too (not run switched off).
#[test]
fn a_file_the_kernel_holds_goes_to_the_server() {
    require_root();
    let pool = Pool::new("rmw-kernel", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let d = dir(&m, "D");
    let c = Client::attach_mountpoint(m.path(), None).expect("attach");
    let (kept, _) = make(&c, d, "kernel", b"the kernel holds me");
    let (free, _) = make(&c, d, "free", b"nobody holds me");
    let opath = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH)
        .open(m.p("D/kernel"))
        .expect("O_PATH");
    assert_eq!(opath.metadata().unwrap().ino(), kept);
    // The mount forgets `free`'s dentry: dropped with D's at the grant.
    lease(&c, d, "first");
    let ring = ring_unlinks(m.path());
    // Written again under the lease: its file lease held (rule 3).
    for ino in [kept, free] {
        let f = c
            .open(&root(), ino, OpenFlags::new(libc::O_WRONLY))
            .expect("open");
        c.write(&f, 0, b"X").expect("write");
        c.release(f);
    }
    unlink(&c, d, "kernel");
    assert_eq!(c.local_removals(), 0, "the kernel's file removed locally");
    assert_eq!(ring_unlinks(m.path()), ring + 1);
    // The descriptor still reaches it (pinned by the server).
    assert_eq!(opath.metadata().unwrap().ino(), kept);
    assert!(std::fs::metadata(m.p("D/kernel")).is_err());
    drop(opath);
    lease(&c, d, "second");
    unlink(&c, d, "free");
    assert_eq!(
        c.local_removals(),
        1,
        "the unheld older file went to the server"
    );
    drop(c);
    detached(&m);
    let m = books_match_a_scan(&pool, m);
    m.unmount();
    fsck_clean(&pool);
}

/// Directories D and E made, a client holding both leases (E's keeps
/// its lane while D's is recalled), and another client: (D, the holder,
/// the other).
fn lane_kept_by_another_dir(m: &Mounted) -> (u64, Client, Client) {
    let d = dir(m, "D");
    let e = dir(m, "E");
    let c = Client::attach_mountpoint(m.path(), None).expect("attach");
    let other = Client::attach_mountpoint(m.path(), None).expect("attach");
    lease(&c, e, "keeps-the-lane");
    lease(&c, d, "first");
    (d, c, other)
}

/// Another client's ring request in D recalls D from `c` (its lane
/// stays with its other directory's lease).
fn recall_by_another(c: &Client, other: &Client, d: u64) {
    let r = other.ns(&root(), create_op(d, "theirs")).expect("asked");
    assert_eq!(r.errno, 0);
    assert!(c.dir_lease(d).is_none(), "D not recalled");
}

/// A file created under an earlier lease of D, with the lane kept (a
/// second directory's lease keeps it): its removal goes to the server (the
/// choice of crates/inkfs/src/api/client/remove.rs), and the books stay
/// exact after its file lease was settled in between.
#[test]
fn a_file_of_an_earlier_lease_goes_to_the_server() {
    require_root();
    let pool = Pool::new("rmw-earlier", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let (d, c, other) = lane_kept_by_another_dir(&m);
    let (ino, _) = make(&c, d, "f", &[1u8; 9000]);
    recall_by_another(&c, &other, d);
    assert!(c.holds_lease(ino), "f not kept");
    // The other client writes f: the kept lease recalled and settled.
    let f = other
        .open(&root(), ino, OpenFlags::new(libc::O_WRONLY))
        .expect("open");
    other.write(&f, 0, b"theirs").expect("write");
    other.release(f);
    assert!(!c.holds_lease(ino));
    // Written again by the client (its lease again), D leased again.
    let f = c
        .open(&root(), ino, OpenFlags::new(libc::O_WRONLY))
        .expect("open");
    c.write(&f, 9000, &[2u8; 9000]).expect("write");
    c.release(f);
    lease(&c, d, "second");
    let ring = ring_unlinks(m.path());
    unlink(&c, d, "f");
    assert_eq!(ring_unlinks(m.path()), ring + 1, "not the server's");
    assert_eq!(c.local_removals(), 0);
    drop(other);
    drop(c);
    detached(&m);
    let m = books_match_a_scan(&pool, m);
    m.unmount();
    fsck_clean(&pool);
}

/// Files made under an earlier lease of D, with the lane kept (E's lease
/// keeps it), removed through the mount: the server frees the head
/// chunks of a block the client carved while the lane is still leased.
/// Those frees are held until the lane comes back (crates/inkfs/src/
/// lanechunks.rs), so the block leaves the client's books once, at the
/// take-back (docs/KERNEL-FREE.md, "The books of a client's chunk
/// blocks"); freed at once, the block would go free with all four chunks
/// while the books still returned it at the session's end (a double
/// free, `frees_refused`).
#[test]
fn chunks_the_server_frees_under_a_leased_lane_wait_for_it() {
    require_root();
    let pool = Pool::new("rmw-chunks", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let (d, c, other) = lane_kept_by_another_dir(&m);
    // Eight files: two chunk blocks, both full.
    let names: Vec<String> = (0..8).map(|i| format!("f{i}")).collect();
    for n in &names {
        make(&c, d, n, n.as_bytes());
    }
    recall_by_another(&c, &other, d);
    let ring = ring_unlinks(m.path());
    for n in &names {
        std::fs::remove_file(m.p(&format!("D/{n}"))).expect("rm");
    }
    assert_eq!(ring_unlinks(m.path()), ring, "not the mount's removals");
    assert_eq!(
        stat_u64(m.path(), "lanes_given_back"),
        0,
        "the lane came back"
    );
    drop(other);
    drop(c);
    detached(&m);
    assert_eq!(stat_u64(m.path(), "lanes_given_back"), 1);
    let m = books_match_a_scan(&pool, m);
    m.unmount();
    fsck_clean(&pool);
}

// ---------------------------------------------------------------------
// The kill loops
// ---------------------------------------------------------------------

/// Not a test by itself: a client that takes D's lease and a lane (D's
/// inode number in [`CHILD_DIR_ENV`]), then creates and writes files
/// `f<i>` from [`CHILD_FROM_ENV`] on, printing `@made NAME` after each
/// one's create and write returned, and removes every other one after the
/// next is made, printing `@gone NAME` after its unlink returned, until
/// it is killed. Every tenth removal is of a file held by a second client
/// of the process (an `orphan`), let go after.
#[test]
fn lane_unlink_child() {
    let Ok(mnt) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (d, from) = (env_u64(CHILD_DIR_ENV), env_u64(CHILD_FROM_ENV));
    let c = Client::attach_mountpoint(Path::new(&mnt), None).expect("attach");
    let other = Client::attach_mountpoint(Path::new(&mnt), None).expect("attach");
    lease(&c, d, &format!("lease{from}"));
    println!("@granted");
    let mut prev: Option<(String, u64, u64)> = None;
    for i in from.. {
        let name = format!("f{i}");
        let (ino, gen) = make(&c, d, &name, name.as_bytes());
        println!("@made {name}");
        if let Some((p, pino, pgen)) = prev.take() {
            let hold = (i % 20 == 1).then(|| other.hold(pino, pgen)).flatten();
            println!("@removing {p}");
            unlink(&c, d, &p);
            println!("@gone {p}");
            if let Some(h) = hold {
                other.unhold(h);
            }
        } else {
            prev = Some((name, ino, gen));
        }
    }
}

fn spawn_child(mnt: &Path, d: u64, from: u64) -> std::process::Child {
    spawn_kill_loop_child(
        "lane_unlink_child",
        [CHILD_ENV, CHILD_DIR_ENV, CHILD_FROM_ENV],
        mnt,
        d,
        from,
    )
}

/// What a child acknowledged: (made, gone), read until `stop` says so
/// (then the child is killed) or its output ends. A removal begun and
/// not acknowledged (`@removing`) may or may not be done: out of both.
fn acks(
    child: &mut std::process::Child,
    mut stop: impl FnMut(usize) -> bool,
    kill: impl FnOnce(&mut std::process::Child),
) -> (Vec<String>, Vec<String>) {
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let (mut made, mut gone) = (Vec::new(), Vec::new());
    let mut kill = Some(kill);
    let mut removing = None;
    let mut granted = false;
    loop {
        line.clear();
        if out.read_line(&mut line).unwrap_or(0) == 0 {
            break;
        }
        let l = line.trim_end();
        if l.contains("@granted") {
            granted = true;
        }
        if let Some(name) = l.strip_prefix("@made ") {
            made.push(name.to_string());
        }
        if let Some(name) = l.strip_prefix("@removing ") {
            removing = Some(name.to_string());
        }
        if let Some(name) = l.strip_prefix("@gone ") {
            gone.push(name.to_string());
            removing = None;
        }
        if kill.is_some() && stop(made.len() + gone.len()) {
            let Some(k) = kill.take() else { continue };
            // What it printed before its death is still in the pipe:
            // read on to the end.
            k(child);
        }
    }
    let _ = child.wait();
    assert!(granted, "the child never got D's lease");
    made.retain(|n| Some(n) != removing.as_ref());
    (made, gone)
}

/// Every acknowledged create there with its data, every acknowledged
/// removal gone.
fn check_names(m: &Mounted, made: &[String], gone: &[String], what: &str) {
    for name in made {
        let got = std::fs::read(m.p(&format!("D/{name}")));
        if gone.contains(name) {
            assert!(got.is_err(), "{what}: {name} removed, still there");
        } else {
            let got = got.unwrap_or_else(|e| panic!("{what}: {name}: {e}"));
            assert_eq!(got, name.as_bytes(), "{what}: {name}");
        }
    }
}

/// A client creating, writing and removing files under D's lease,
/// SIGKILLed after a varying number of acknowledgements (up to 400, past
/// the grant's slots): after each round it is reaped, every acknowledged
/// create is there with its data, every acknowledged removal gone. At the
/// end the books match a scan, scrub and fsck are clean.
/// `INKFS_TEST_ROUNDS` sets the rounds (8). Its removals are of files
/// made under the lease (the reaping of older victims' blocks is not
/// reached here).
#[test]
fn a_client_killed_among_removals_is_reaped() {
    require_root();
    let rounds = kill_loop_rounds();
    let pool = Pool::new("rmw-kill", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let d = dir(&m, "D");
    let (mut made, mut gone) = (Vec::new(), Vec::new());
    let mut seed = std::process::id() as u64 | 1;
    for round in 0..rounds {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let want = 1 + (seed % 400) as usize;
        let mut child = spawn_child(m.path(), d, round * 1000);
        let (mm, gg) = acks(
            &mut child,
            |n| n >= want,
            |c| {
                // SAFETY: a signal to our own child.
                unsafe { libc::kill(c.id() as i32, libc::SIGKILL) };
            },
        );
        eventually("the client reaped", || {
            stat_u64(m.path(), "clients_attached") == 0
        });
        made.extend(mm);
        gone.extend(gg);
        check_names(&m, &made, &gone, &format!("round {round}"));
    }
    assert!(!gone.is_empty(), "no removal acknowledged");
    eprintln!(
        "{rounds} rounds: {} lanes reaped, {} made, {} removed",
        stat_u64(m.path(), "lanes_reaped"),
        made.len(),
        gone.len()
    );
    let m = books_match_a_scan(&pool, m);
    let scrub = inkfs_fuse::scrub::request(m.path(), &mut |_, _| {})
        .expect("an inkfs mount")
        .expect("scrub ran");
    assert!(scrub.findings.is_empty(), "{scrub:?}");
    m.unmount();
    fsck_clean(&pool);
}

/// The server killed while a client creates and removes under D's lease:
/// the remount recovers (every lane's journal, the client's included),
/// the acknowledged creates are there and the acknowledged removals gone,
/// fsck is clean.
#[test]
fn the_server_killed_among_removals() {
    require_root();
    let pool = Pool::new("rmw-server", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let d = dir(&m, "D");
    let mut child = spawn_child(m.path(), d, 0);
    let mut m = Some(m);
    let mut dir = None;
    let (made, gone) = acks(
        &mut child,
        |n| {
            if n >= 60 && dir.is_none() {
                dir = m.take().map(|m| m.kill9());
            }
            false
        },
        |_| {},
    );
    let m = Mounted::at(&pool, dir.expect("killed"), "mode=strict");
    check_names(&m, &made, &gone, "after the server's death");
    m.unmount();
    fsck_clean(&pool);
}
