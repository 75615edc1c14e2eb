//! Attribute changes under a directory lease, and the server's answer to
//! a holder's second ask (docs/KERNEL-FREE.md, "Built: attribute changes
//! under a directory lease"): tar's sequence (create, write, futimens,
//! fchmod, fchown of each file, then utimensat, chown and chmod of the
//! directory) under the library with the ask on keeps the directory's
//! lease, and the mount shows the new attributes at once; the API
//! client's own change of a leased directory follows the engine's rules
//! and is seen by another client from the pool; a second ask by the
//! holder of a lease is answered at once (`held`), not held by the server
//! until the holder gives the lease back.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::{mpsc, Arc};

use common::preload::*;
use common::*;
use inkfs::api::client::Client;
use inkfs::api::dirlease::{DirAnswer, Refusal};
use inkfs::api::ns::Op;
use inkfs::api::{Credentials, SetAttr, TimeSet};

/// tar's sequence in directory `argv[1]`: eight files, each created,
/// written, its times set by descriptor (futimens), its mode (fchmod) and
/// owner (fchown); then the directory's times by path (utimensat), its
/// owner (chown) and mode (chmod). Then `ready`, and it waits for its
/// stdin to end, holding what it holds.
const PY_TAR: &str = "import os, sys
d = sys.argv[1]
T = 1_600_000_000 * 10**9
for i in range(8):
    fd = os.open(f'{d}/f{i}', os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    os.write(fd, b'%d' % i)
    os.utime(fd, ns=(T + i, T + i))
    os.fchmod(fd, 0o640)
    os.fchown(fd, 0, 0)
    os.close(fd)
os.utime(d, ns=(T + 100, T + 200))
os.chown(d, 0, 0)
os.chmod(d, 0o750)
print('ready', flush=True)
sys.stdin.read()
";

const T: i64 = 1_600_000_000;

/// The library's ask on (crates/inkfs-preload/src/names.rs).
const ASK: &[(&str, &str)] = &[("INKFS_PRELOAD_DIR_LEASE", "1")];

/// A read-only create of `name` in `dir` (no file lease comes with it).
fn create_op(dir: u64, name: Vec<u8>) -> Op {
    Op::Create {
        dir,
        name,
        mode: 0o644,
        flags: libc::O_CREAT | libc::O_RDONLY,
    }
}

fn counter(mnt: &Path, key: &str) -> u64 {
    let s = stats_json(mnt).expect("statistics");
    s[key].as_u64().unwrap_or_else(|| panic!("no {key} in {s}"))
}

fn ring_setattrs(mnt: &Path) -> u64 {
    let s = stats_json(mnt).expect("statistics");
    s["ops"]["client_setattr"]["count"].as_u64().unwrap_or(0)
}

/// The sequence under the library, the ask on: its fifth create asks for
/// the directory's lease, and nothing after it gives the lease back: the
/// server counts it held and not recalled while the program waits, and
/// no setattr reached the ring (the files' under their write leases, the
/// directory's under its lease). A stat through the mount right after
/// (no sleep) shows the directory's and a file's new mode and times: the
/// lookup recalls the lease, the server catches the directory up. Fails
/// with the library sending a leased directory's setattr to the server:
/// the lease is recalled before `ready` (held 0, recalled 1, three ring
/// setattrs).
#[test]
fn a_tar_like_sequence_keeps_the_directory_lease() {
    require_root();
    let pool = Pool::new("askattr-tar", 128);
    let m = Mounted::new(&pool, "mode=strict");
    std::fs::create_dir(m.p("d")).expect("mkdir");
    let (granted, recalled, setattrs) = (
        counter(m.path(), "dir_leases_granted"),
        counter(m.path(), "dir_leases_recalled"),
        ring_setattrs(m.path()),
    );
    let stats = stats_file("askattr-tar");
    let mut child = python_when_ready_with(PY_TAR, &m.p("d"), stats.path(), ASK);
    assert_eq!(counter(m.path(), "dir_leases_granted") - granted, 1);
    assert_eq!(counter(m.path(), "dir_leases_held"), 1, "the lease ended");
    assert_eq!(
        counter(m.path(), "dir_leases_recalled") - recalled,
        0,
        "an attribute change recalled the lease"
    );
    assert_eq!(
        ring_setattrs(m.path()) - setattrs,
        0,
        "setattrs on the ring"
    );

    // Through the mount, at once.
    let d = std::fs::metadata(m.p("d")).expect("stat d");
    assert_eq!(d.permissions().mode() & 0o7777, 0o750);
    assert_eq!((d.atime(), d.atime_nsec()), (T, 100));
    assert_eq!((d.mtime(), d.mtime_nsec()), (T, 200));
    assert_eq!((d.uid(), d.gid()), (0, 0));
    assert_eq!(counter(m.path(), "dir_leases_recalled") - recalled, 1);
    for i in [0, 7] {
        let f = std::fs::metadata(m.p(&format!("d/f{i}"))).expect("stat file");
        assert_eq!(f.permissions().mode() & 0o7777, 0o640, "f{i}");
        assert_eq!((f.mtime(), f.mtime_nsec()), (T, i), "f{i}");
        let got = std::fs::read_to_string(m.p(&format!("d/f{i}"))).expect("read");
        assert_eq!(got, i.to_string());
    }
    drop(child.stdin.take());
    assert!(child.wait().expect("wait").success());
    let n = counts(stats.path());
    assert!(c(&n, "attr_local") >= 8 * 3 + 3, "{n:?}");
    drop(m);
    fsck_clean(&pool);
}

fn root() -> Credentials {
    Credentials::root()
}

/// A create (read-only) of `name` in `dir` that asks for `dir`'s lease,
/// granted.
fn granted(c: &Client, dir: u64, name: &str) {
    let op = create_op(dir, name.as_bytes().to_vec());
    let d = c.ns_dir_lease(&root(), op).expect("asked");
    assert_eq!(d.errno, 0, "create {name}");
    assert!(
        matches!(d.dir, Some(DirAnswer::Granted { .. })),
        "not granted: {:?}",
        d.dir
    );
}

/// The API client's change of a directory whose lease it holds: made in
/// its engine (the lease stays held, no ring request), with the engine's
/// rules (a user's chmod of root's directory EPERM; a chown of a
/// set-group-ID directory keeps the bit; ctime moves); another client
/// sees the new attributes from the pool (it catches the directory up
/// from its cached tail), the mount too, after a recall. A directory not
/// leased is the server's (None). Fails with `setattr_dir_leased`
/// answering None: nothing is changed locally.
#[test]
fn the_holder_changes_its_directory_under_the_lease() {
    require_root();
    let pool = Pool::new("askattr-api", 64);
    let m = Mounted::new(&pool, "mode=strict");
    std::fs::create_dir(m.p("D")).expect("mkdir");
    std::fs::create_dir(m.p("E")).expect("mkdir");
    let d = std::fs::metadata(m.p("D")).expect("stat").ino();
    let e = std::fs::metadata(m.p("E")).expect("stat").ino();
    let c = Client::attach_mountpoint(m.path(), None).expect("attach");
    let other = Client::attach_mountpoint(m.path(), None).expect("attach");
    let seen_before = other.getattr(d).expect("getattr");
    granted(&c, d, "x");
    let setattrs = ring_setattrs(m.path());
    let recalls = c.dir_recalls();

    let mode = |m: u32| SetAttr {
        mode: Some(m),
        ..SetAttr::default()
    };
    let a = c
        .setattr_dir_leased(&root(), d, &mode(0o2770))
        .expect("made by the holder")
        .expect("chmod");
    assert_eq!(a.mode & 0o7777, 0o2770);
    assert!(a.ctime_ns > seen_before.ctime_ns, "ctime not moved");
    let user = Credentials::user(1000, 1000);
    let refused = c.setattr_dir_leased(&user, d, &mode(0o777));
    assert_eq!(
        refused.map(|r| r.map_err(|e| e.errno())).map(|r| r.err()),
        Some(Some(libc::EPERM)),
        "a user's chmod of root's directory"
    );
    let chown = SetAttr {
        uid: Some(1000),
        gid: Some(1000),
        ..SetAttr::default()
    };
    let a = c
        .setattr_dir_leased(&root(), d, &chown)
        .expect("made by the holder")
        .expect("chown");
    assert_eq!((a.uid, a.gid), (1000, 1000));
    assert_eq!(a.mode & 0o7777, 0o2770, "a directory keeps its set-id bits");
    let times = SetAttr {
        atime: Some(TimeSet::At(T * 1_000_000_000 + 5)),
        mtime: Some(TimeSet::At(T * 1_000_000_000 + 6)),
        ..SetAttr::default()
    };
    // Its owner now: a user may set explicit times.
    c.setattr_dir_leased(&user, d, &times)
        .expect("made by the holder")
        .expect("utimens");
    assert!(
        c.setattr_dir_leased(&root(), e, &mode(0o700)).is_none(),
        "a directory not leased"
    );
    assert_eq!(c.local_dir_setattrs(), 3);
    assert!(c.dir_lease(d).is_some(), "the lease went");
    assert_eq!(c.dir_recalls(), recalls);
    assert_eq!(ring_setattrs(m.path()), setattrs, "a ring request");

    // Another client, from the pool (no message, no recall).
    let seen = other.getattr(d).expect("getattr");
    assert_eq!(
        (seen.mode & 0o7777, seen.uid, seen.gid),
        (0o2770, 1000, 1000)
    );
    assert_eq!(seen.mtime_ns, T * 1_000_000_000 + 6);
    assert!(c.dir_lease(d).is_some());
    // The mount: its lookup recalls the lease, the server catches up.
    let md = std::fs::metadata(m.p("D")).expect("stat");
    assert_eq!(md.permissions().mode() & 0o7777, 0o2770);
    assert_eq!((md.uid(), md.gid()), (1000, 1000));
    assert_eq!((md.mtime(), md.mtime_nsec()), (T, 6));
    assert_eq!(c.dir_lease(d), None, "not recalled");
    drop(other);
    drop(c);
    drop(m);
    fsck_clean(&pool);
}

/// A raw client that asks for a directory's lease it holds already (the
/// API client's book never sends that since h/askon; an older library
/// did, from two threads at once): the server answers at once, `held`,
/// and the lease stays held. The request's own work fails before it uses
/// the directory (a name too long), so nothing recalls the lease on the
/// way. Fails without the server's answer: the ask waits for a give-back
/// the asker never makes (until the recall timeout's kill, or the
/// unmount), and the bound below ends the test.
#[test]
fn a_holders_second_ask_is_answered_at_once() {
    require_root();
    let pool = Pool::new("askattr-twice", 64);
    let m = Mounted::new(&pool, "mode=strict");
    std::fs::create_dir(m.p("D")).expect("mkdir");
    let d = std::fs::metadata(m.p("D")).expect("stat").ino();
    let c = Arc::new(Client::attach_mountpoint(m.path(), None).expect("attach"));
    granted(&c, d, "x");
    let (tx, rx) = mpsc::channel();
    let asker = Arc::clone(&c);
    std::thread::spawn(move || {
        let op = create_op(d, vec![b'n'; 300]);
        let _ = tx.send(asker.ns_ask_unchecked(&root(), op));
    });
    let done = rx
        .recv_timeout(inkfs::testkit::WAIT_LIMIT)
        .expect("the second ask was not answered")
        .expect("asked");
    assert_eq!(done.errno, libc::ENAMETOOLONG);
    assert_eq!(done.dir, Some(DirAnswer::Refused(Refusal::Held)));
    assert!(c.dir_lease(d).is_some(), "the lease went");
    assert_eq!(counter(m.path(), "dir_leases_held"), 1);
    assert_eq!(counter(m.path(), "dir_leases_refused_held"), 1);
    // Still the holder's: its creates there are its own.
    let before = c.local_creates();
    let made = c
        .ns(
            &root(),
            Op::Create {
                dir: d,
                name: b"after".to_vec(),
                mode: 0o644,
                flags: libc::O_CREAT | libc::O_WRONLY,
            },
        )
        .expect("create");
    assert_eq!(made.errno, 0);
    assert_eq!(c.local_creates(), before + 1, "not made under the lease");
    let mut names: Vec<_> = std::fs::read_dir(m.p("D"))
        .expect("ls")
        .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
        .collect();
    names.sort();
    assert_eq!(names, ["after", "x"]);
    drop(c);
    drop(m);
    fsck_clean(&pool);
}

/// A program visiting directories once (tar's order) holds at most
/// `HELD_MAX` directory leases: each new grant past it gives the oldest
/// back (a `released`, no recall), so the ask table keeps room and every
/// directory with enough creates gets its lease. Twenty directories of
/// six files: twenty-one grants (the top directory's, asked by its fifth
/// mkdir, and each new directory's at its first create: h/askmkdir),
/// sixteen held while the program waits, none recalled. Fails without
/// the bound: twenty-one held.
#[test]
fn a_program_holds_a_bounded_number_of_directory_leases() {
    const PY: &str = "import os, sys
top = sys.argv[1]
for d in range(20):
    os.mkdir(f'{top}/d{d}')
    for i in range(6):
        fd = os.open(f'{top}/d{d}/f{i}', os.O_CREAT | os.O_WRONLY, 0o644)
        os.write(fd, b'x')
        os.close(fd)
print('ready', flush=True)
sys.stdin.read()
";
    require_root();
    let pool = Pool::new("askattr-bound", 128);
    let m = Mounted::new(&pool, "mode=strict");
    std::fs::create_dir(m.p("t")).expect("mkdir");
    let (granted, recalled) = (
        counter(m.path(), "dir_leases_granted"),
        counter(m.path(), "dir_leases_recalled"),
    );
    let stats = stats_file("askattr-bound");
    let mut child = python_when_ready_with(PY, &m.p("t"), stats.path(), ASK);
    assert_eq!(counter(m.path(), "dir_leases_granted") - granted, 21);
    // The released lines of the four given back are read by the session's
    // thread: the count settles once they are (a bounded wait, no sleep
    // standing in for it).
    let t = std::time::Instant::now();
    while counter(m.path(), "dir_leases_held") != inkfs::api::dirlease::HELD_MAX as u64 {
        assert!(
            t.elapsed() < inkfs::testkit::WAIT_LIMIT,
            "held: {}",
            counter(m.path(), "dir_leases_held")
        );
        std::thread::yield_now();
    }
    assert_eq!(counter(m.path(), "dir_leases_recalled") - recalled, 0);
    drop(child.stdin.take());
    assert!(child.wait().expect("wait").success());
    for d in [0, 19] {
        assert_eq!(
            std::fs::read_dir(m.p(&format!("t/d{d}")))
                .expect("ls")
                .count(),
            6
        );
    }
    drop(m);
    fsck_clean(&pool);
}
