//! mkdir under a directory lease (docs/KERNEL-FREE.md, "Built: mkdir
//! under a directory lease"): the holder of D's lease and a lane makes
//! `mkdir D/name` in its own engine, with the engine's rules, without a
//! ring request and without a recall of D; the mount sees the directory
//! (and what was made in it) at once after the calls return; a directory
//! made so asks for its own lease at its first create; a client killed
//! while making directories leaves each whole or absent.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use common::lanes::*;
use common::preload::*;
use common::*;
use inkfs::api::client::Client;
use inkfs::api::ns::{Done, Op};
use inkfs::api::{Credentials, OpenFlags};

/// The library's ask on (crates/inkfs-preload/src/names.rs).
const ASK: &[(&str, &str)] = &[("INKFS_PRELOAD_DIR_LEASE", "1")];

/// tar's order in directory `argv[1]`: five files (the fifth create asks
/// for the directory's lease), then three directories, each made, filled
/// with three files (created, written, their times set by descriptor),
/// its times and mode set by path after; then the top directory's times.
/// Then `ready`, and it waits for its stdin to end, holding its leases.
const PY_UNTAR: &str = "import os, sys
d = sys.argv[1]
T = 1_600_000_000 * 10**9
def fill(at, n):
    for i in range(n):
        fd = os.open(f'{at}/f{i}', os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        os.write(fd, f'{at}/f{i}'.encode())
        os.utime(fd, ns=(T + i, T + i))
        os.close(fd)
fill(d, 5)
for j in range(3):
    s = f'{d}/s{j}'
    os.mkdir(s, 0o755)
    fill(s, 3)
    os.utime(s, ns=(T + 10, T + 20))
    os.chmod(s, 0o750)
os.utime(d, ns=(T + 100, T + 200))
print('ready', flush=True)
sys.stdin.read()
";

const T: i64 = 1_600_000_000;

fn ring_op(mnt: &Path, op: &str) -> u64 {
    let s = stats_json(mnt).expect("statistics");
    s["ops"][op]["count"].as_u64().unwrap_or(0)
}

/// The sequence under the library, the ask on: the top directory's lease
/// is granted at its fifth create and never recalled while the program
/// runs (its three mkdirs are made under it, no ring mkdir); each new
/// directory asks at its first create (a grant each: 4 in all), so 5 + 3
/// creates go through the ring and 11 are made under leases. Right after
/// `ready` (no sleep) the mount lists the new directories with their
/// modes, times and link counts, and every file's bytes. Fails with the
/// mkdir sent to the server (three ring mkdirs, the top lease recalled
/// at the first), and without `born` (the new directories never ask:
/// one grant, nine more ring creates).
#[test]
fn an_untar_like_sequence_keeps_the_parent_lease() {
    require_root();
    let pool = Pool::new("askmkdir-untar", 128);
    let m = Mounted::new(&pool, "mode=strict");
    std::fs::create_dir(m.p("d")).expect("mkdir");
    let mnt = m.path();
    let (granted, recalled, mkdirs, creates) = (
        stat_u64(mnt, "dir_leases_granted"),
        stat_u64(mnt, "dir_leases_recalled"),
        ring_op(mnt, "client_mkdir"),
        ring_op(mnt, "client_create"),
    );
    let stats = stats_file("askmkdir-untar");
    let mut child = python_when_ready_with(PY_UNTAR, &m.p("d"), stats.path(), ASK);
    assert_eq!(ring_op(mnt, "client_mkdir") - mkdirs, 0, "ring mkdirs");
    assert_eq!(
        stat_u64(mnt, "dir_leases_recalled") - recalled,
        0,
        "a lease recalled while the program ran"
    );
    assert_eq!(stat_u64(mnt, "dir_leases_granted") - granted, 4, "grants");
    assert_eq!(stat_u64(mnt, "dir_leases_held"), 4, "leases held");
    assert_eq!(
        ring_op(mnt, "client_create") - creates,
        5 + 3,
        "ring creates"
    );

    // Through the mount, at once: the lookups recall the leases.
    let d = std::fs::metadata(m.p("d")).expect("stat d");
    assert_eq!(d.nlink(), 2 + 3, "d's links");
    assert_eq!((d.mtime(), d.mtime_nsec()), (T, 200));
    let mut names: Vec<String> = std::fs::read_dir(m.p("d"))
        .expect("list d")
        .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
        .collect();
    names.sort();
    assert_eq!(names, ["f0", "f1", "f2", "f3", "f4", "s0", "s1", "s2"]);
    for j in 0..3 {
        let s = std::fs::metadata(m.p(&format!("d/s{j}"))).expect("stat s");
        assert!(s.is_dir());
        assert_eq!(s.permissions().mode() & 0o7777, 0o750, "s{j}");
        assert_eq!((s.mtime(), s.mtime_nsec()), (T, 20), "s{j}");
        assert_eq!(s.nlink(), 2, "s{j}");
        let dotdot = std::fs::metadata(m.p(&format!("d/s{j}/.."))).expect("stat ..");
        assert_eq!(dotdot.ino(), d.ino(), "s{j}/..");
        for i in 0..3 {
            let f = format!("d/s{j}/f{i}");
            let got = std::fs::read_to_string(m.p(&f)).expect("read");
            assert!(got.ends_with(&format!("/s{j}/f{i}")), "{f}: {got}");
        }
    }
    drop(child.stdin.take());
    assert!(child.wait().expect("wait").success());
    let n = counts(stats.path());
    // Every create and mkdir answered without the kernel (through the
    // ring or made locally).
    assert_eq!(c(&n, "ns_local"), 5 + 3 * 3 + 3, "{n:?}");
    let m = books_match_a_scan(&pool, m);
    m.unmount();
    fsck_clean(&pool);
}

fn mkdir_op(dir: u64, name: &str, mode: u32) -> Op {
    Op::Mkdir {
        dir,
        name: name.as_bytes().to_vec(),
        mode,
    }
}

/// A mkdir through `c` as `cred`: its answer's errno.
fn mkdir_as(c: &Client, cred: &Credentials, dir: u64, name: &str, mode: u32) -> Done {
    c.ns(cred, mkdir_op(dir, name, mode)).expect("asked")
}

/// The API client's mkdir under D's lease follows the engine's rules,
/// locally (`local_mkdirs`, no ring mkdir, D not recalled): EEXIST for a
/// name that exists (a file made under the lease, or a directory made
/// before it), ENAMETOOLONG, EACCES for a user without write permission
/// on D; a set-group-ID D gives its group and its bit to the new
/// directory; the mode is what was asked (the library applies the
/// umask). Another client sees the new directory from the pool; the mount
/// too, after a recall, with D's link count. A directory not leased is
/// the server's. Fails with `mkdir_under_lease` answering None (every
/// mkdir a ring request, D recalled at the first).
#[test]
fn the_holder_makes_directories_under_the_lease() {
    require_root();
    let pool = Pool::new("askmkdir-api", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let mnt = m.path();
    std::fs::create_dir(m.p("D")).expect("mkdir");
    std::fs::create_dir(m.p("D/old")).expect("mkdir");
    std::fs::create_dir(m.p("E")).expect("mkdir");
    std::os::unix::fs::chown(m.p("D"), Some(0), Some(4242)).expect("chown");
    std::fs::set_permissions(m.p("D"), std::fs::Permissions::from_mode(0o2775)).expect("chmod");
    let d = std::fs::metadata(m.p("D")).expect("stat").ino();
    let e = std::fs::metadata(m.p("E")).expect("stat").ino();
    let c = Client::attach_mountpoint(mnt, None).expect("attach");
    let other = Client::attach_mountpoint(mnt, None).expect("attach");
    lease(&c, d, "x");
    let (mkdirs, recalled) = (
        ring_op(mnt, "client_mkdir"),
        stat_u64(mnt, "dir_leases_recalled"),
    );

    let made = mkdir_as(&c, &root(), d, "sub", 0o700);
    assert_eq!(made.errno, 0);
    assert_eq!(c.local_mkdirs(), 1, "not made under the lease");
    let a = c.getattr(made.ino).expect("getattr sub");
    assert_eq!(a.mode & 0o7777, 0o2700, "the set-group-ID bit inherited");
    assert_eq!(a.gid, 4242, "D's group");
    assert_eq!(a.nlink, 2);
    assert_eq!(c.getattr(d).expect("getattr D").nlink, 2 + 2);
    for (name, want) in [
        ("sub", libc::EEXIST),
        ("x", libc::EEXIST),
        ("old", libc::EEXIST),
        (&"n".repeat(256), libc::ENAMETOOLONG),
    ] {
        assert_eq!(mkdir_as(&c, &root(), d, name, 0o755).errno, want, "{name}");
    }
    let user = Credentials::user(1000, 1000);
    assert_eq!(mkdir_as(&c, &user, d, "u", 0o755).errno, libc::EACCES);
    assert_eq!(c.local_mkdirs(), 1);
    assert_eq!(ring_op(mnt, "client_mkdir") - mkdirs, 0, "ring mkdirs");
    assert_eq!(stat_u64(mnt, "dir_leases_recalled") - recalled, 0);

    // Another client, from the pool.
    let seen = other
        .lookup(&root(), d, b"sub")
        .expect("another client's lookup");
    assert_eq!(seen.ino, made.ino);
    // A directory not leased: the server's.
    assert_eq!(mkdir_as(&c, &root(), e, "s", 0o755).errno, 0);
    assert_eq!(ring_op(mnt, "client_mkdir") - mkdirs, 1);
    assert_eq!(c.local_mkdirs(), 1);

    // The mount, at once (the lookup recalls D).
    let s = std::fs::metadata(m.p("D/sub")).expect("stat D/sub");
    assert_eq!((s.ino(), s.gid(), s.nlink()), (made.ino, 4242, 2));
    assert_eq!(std::fs::metadata(m.p("D")).expect("stat D").nlink(), 4);
    assert_eq!(stat_u64(mnt, "dir_leases_recalled") - recalled, 1);
    std::fs::write(m.p("D/sub/through-the-mount"), b"m").expect("write in sub");
    drop((c, other));
    eventually("no client attached", || {
        stat_u64(mnt, "clients_attached") == 0
    });
    let m = books_match_a_scan(&pool, m);
    assert_eq!(
        std::fs::read(m.p("D/sub/through-the-mount")).expect("read"),
        b"m"
    );
    std::fs::remove_file(m.p("D/sub/through-the-mount")).expect("unlink");
    std::fs::remove_dir(m.p("D/sub")).expect("rmdir the client's directory");
    m.unmount();
    fsck_clean(&pool);
}

// ---------------------------------------------------------------------
// The kill loop
// ---------------------------------------------------------------------

const CHILD_MNT_ENV: &str = "INKFS_TEST_MKDIR_CHILD";
const CHILD_DIR_ENV: &str = "INKFS_TEST_MKDIR_DIR";
const CHILD_FROM_ENV: &str = "INKFS_TEST_MKDIR_FROM";

/// Not a test by itself: a client that takes D's lease and a lane, then
/// makes directories `s<i>` from [`CHILD_FROM_ENV`] on (every third also
/// a file `f<i>` with its name as bytes), printing `@made NAME` after each
/// call returned, until it is killed. Each mkdir must be made under the
/// lease (else it exits: no acknowledgement).
#[test]
fn lease_mkdir_child() {
    let Ok(mnt) = std::env::var(CHILD_MNT_ENV) else {
        return;
    };
    let (d, from) = (env_u64(CHILD_DIR_ENV), env_u64(CHILD_FROM_ENV));
    let c = Client::attach_mountpoint(Path::new(&mnt), None).expect("attach");
    lease(&c, d, &format!("lease{from}"));
    println!("@granted");
    for i in from.. {
        let name = format!("s{i}");
        let before = c.local_mkdirs();
        assert_eq!(mkdir_as(&c, &root(), d, &name, 0o755).errno, 0, "{name}");
        assert_eq!(c.local_mkdirs(), before + 1, "{name}: not made locally");
        println!("@made {name}");
        if i % 3 == 0 {
            let f = format!("f{i}");
            let done = c.ns(&root(), create_op(d, &f)).expect("create");
            assert_eq!(done.errno, 0);
            let file = c
                .open(&root(), done.ino, OpenFlags::new(libc::O_WRONLY))
                .expect("open");
            assert_eq!(c.write(&file, 0, f.as_bytes()).expect("write"), f.len());
            c.release(file);
            println!("@made {f}");
        }
    }
}

/// A client making directories (and some files) under D's lease,
/// SIGKILLed after a varying number of acknowledgements, up to 120 (past
/// the grant's slots: `slots K`): each round the server reaps its lane,
/// every acknowledged directory is there, whole (empty, two links, `..`
/// naming D) and every acknowledged file with its bytes; a directory
/// made and not acknowledged is whole or absent; D's link count is two
/// plus its directories; no mkdir reached the ring. At the end the books
/// equal a scan's, scrub and fsck are clean. `INKFS_TEST_ROUNDS` sets the
/// rounds (8). Fails with the mkdir not made under the lease (the child
/// acknowledges nothing).
#[test]
fn a_client_killed_making_directories_leaves_them_whole_or_absent() {
    require_root();
    let rounds = kill_loop_rounds();
    let pool = Pool::new("askmkdir-kill", 64);
    let m = Mounted::new(&pool, "mode=strict");
    std::fs::create_dir(m.p("D")).expect("mkdir");
    let d = std::fs::metadata(m.p("D")).expect("stat").ino();
    let mkdirs = ring_op(m.path(), "client_mkdir");
    let mut acked = Vec::new();
    let mut seed = std::process::id() as u64 | 1;
    for round in 0..rounds {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let acks = 1 + (seed % 120) as usize;
        let mut child = spawn_kill_loop_child(
            "lease_mkdir_child",
            [CHILD_MNT_ENV, CHILD_DIR_ENV, CHILD_FROM_ENV],
            m.path(),
            d,
            round * 1000,
        );
        let made = run_and_kill(&mut child, acks);
        assert!(!made.is_empty(), "round {round}: nothing acknowledged");
        eventually("the client reaped", || {
            stat_u64(m.path(), "clients_attached") == 0
        });
        acked.extend(made);
        let mut dirs = 0;
        for e in std::fs::read_dir(m.p("D")).expect("list D") {
            let e = e.expect("entry");
            let name = e.file_name().into_string().expect("utf-8");
            let meta = e.metadata().expect("stat");
            if !meta.is_dir() {
                continue;
            }
            dirs += 1;
            assert_eq!(meta.nlink(), 2, "round {round}: {name}");
            let inside = std::fs::read_dir(e.path()).expect("list").count();
            assert_eq!(inside, 0, "round {round}: {name} not empty");
            let up = std::fs::metadata(e.path().join("..")).expect("stat ..");
            assert_eq!(up.ino(), d, "round {round}: {name}/..");
        }
        let dm = std::fs::metadata(m.p("D")).expect("stat D");
        assert_eq!(dm.nlink(), 2 + dirs, "round {round}: D's links");
        for name in &acked {
            let p = m.p(&format!("D/{name}"));
            if name.starts_with('s') {
                assert!(p.is_dir(), "round {round}: {name} missing");
            } else {
                let got =
                    std::fs::read(&p).unwrap_or_else(|e| panic!("round {round}: {name}: {e}"));
                assert_eq!(got, name.as_bytes(), "round {round}: {name}");
            }
        }
    }
    assert_eq!(ring_op(m.path(), "client_mkdir"), mkdirs, "ring mkdirs");
    let reaped = stat_u64(m.path(), "lanes_reaped");
    eprintln!(
        "{rounds} rounds: {reaped} lanes reaped, {} names acknowledged",
        acked.len()
    );
    kill_loop_end(&pool, m, rounds);
}

// ---------------------------------------------------------------------
// Unlinks toward the ask
// ---------------------------------------------------------------------

/// Twelve files created and written in `argv[1]`, then `keep` when
/// `argv[2]` is `keep` (see
/// [`the_last_written_file_removed_under_a_later_lease_is_freed`]),
/// `ready`, then, after a line on stdin, the twelve removed in order;
/// then it exits.
const PY_WRITE_THEN_DELETE: &str = "import os, sys
d = sys.argv[1]
names = [f'f{i}' for i in range(12)]
if sys.argv[2:] == ['keep']:
    names.append('keep')
for n in names:
    fd = os.open(f'{d}/{n}', os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    os.write(fd, b'x' * 100)
    os.close(fd)
print('ready', flush=True)
sys.stdin.readline()
for i in range(12):
    os.unlink(f'{d}/f{i}')
";

/// A delete loop of the files the process wrote asks for the directory's
/// lease as a create loop does: the lease of `d` (granted at the fifth
/// create) is recalled by a stat of `d` through the mount, which doubles
/// `d`'s k to 8; the files' write leases stay the program's (kept at the
/// give-back); so its first eight unlinks go through the ring, the ninth
/// asks and is granted, the last three are made under the lease. An
/// `rm -rf`-like loop in another process (of files it never wrote: they
/// are the server's under the lease too) asks nothing: twelve ring
/// unlinks, no grant. Fails with unlinks not counted (`made_under_lease`:
/// one grant, twelve ring unlinks in the first loop) and with every
/// unlink counted (the second loop asks: a grant).
#[test]
fn unlinks_of_files_the_process_wrote_ask_for_the_lease() {
    require_root();
    let pool = Pool::new("askmkdir-unlink", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let mnt = m.path();
    std::fs::create_dir(m.p("d")).expect("mkdir");
    std::fs::create_dir(m.p("e")).expect("mkdir");
    for i in 0..12 {
        std::fs::write(m.p(&format!("e/f{i}")), b"y").expect("write e");
    }
    let (granted, unlinks) = (
        stat_u64(mnt, "dir_leases_granted"),
        ring_op(mnt, "client_unlink"),
    );
    let stats = stats_file("askmkdir-unlink");
    let mut child = write_then_delete(&m.p("d"), stats.path(), true);
    assert_eq!(stat_u64(mnt, "dir_leases_granted") - granted, 1);
    std::fs::metadata(m.p("d")).expect("stat d recalls its lease");
    assert_eq!(stat_u64(mnt, "dir_leases_held"), 0);
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(b"go\n").expect("go");
    }
    assert!(child.wait().expect("wait").success());
    assert_eq!(stat_u64(mnt, "dir_leases_granted") - granted, 2, "grants");
    assert_eq!(ring_op(mnt, "client_unlink") - unlinks, 9, "ring unlinks");
    assert_eq!(std::fs::read_dir(m.p("d")).expect("list d").count(), 1);

    // Another process's files: nothing to ask for.
    let (granted, unlinks) = (
        stat_u64(mnt, "dir_leases_granted"),
        ring_op(mnt, "client_unlink"),
    );
    let out = run_python_with(
        "import os, sys\nfor i in range(12): os.unlink(f'{sys.argv[1]}/f{i}')\n",
        &m.p("e"),
        ASK,
    );
    assert!(out, "the rm loop failed");
    assert_eq!(stat_u64(mnt, "dir_leases_granted") - granted, 0, "grants");
    assert_eq!(ring_op(mnt, "client_unlink") - unlinks, 12, "ring unlinks");
    let m = books_match_a_scan(&pool, m);
    m.unmount();
    fsck_clean(&pool);
}

/// [`PY_WRITE_THEN_DELETE`] in `d`, the ask on, once `ready`; `keep`
/// written last when `keep`.
fn write_then_delete(d: &Path, stats: &Path, keep: bool) -> std::process::Child {
    let args: &[&str] = if keep { &["keep"] } else { &[] };
    python_when_ready_args(PY_WRITE_THEN_DELETE, d, args, stats, ASK)
}

/// **Ignored: a bug of main's found here, not fixed on this branch** (the
/// free paths are h/askfree's). The file a preloaded process wrote last,
/// created under an earlier lease of `d` (the lane given back since, at
/// a recall), removed by the process under a later lease of `d`: the
/// client's engine finds it open (`client_orphaned`: the library still
/// has it open, or held), leaves it ORPHAN and sends `orphan INO GEN`,
/// which the server refuses (`lane_removals_refused` 1,
/// `lane_orphans_adopted` 0; its cached inode is not an orphan in its
/// DRAM view, `is_orphan`, presumably): after a clean unmount fsck finds
/// the orphan. Seen with main's ask rule too (the later lease asked by
/// creates, no unlink counted: 12 local removals, the same orphan).
///
/// Since c4200a1 (`iget_current`) the orphan is adopted
/// (`lane_removals_refused` 0 in 30 of 30 runs, h/askon), but the test
/// still fails about 1 run in 15 at [`books_match_a_scan`]: the live
/// server counted fewer free blocks than the scan after a remount
/// (14273 against 16307, 2034 blocks short; inodes equal; fsck clean).
/// Not yet known whether a lane's blocks come back late (the process
/// just exited) or never: kept ignored until that is found.
#[test]
#[ignore]
fn the_last_written_file_removed_under_a_later_lease_is_freed() {
    require_root();
    let pool = Pool::new("askmkdir-lastfile", 64);
    let m = Mounted::new(&pool, "mode=strict");
    std::fs::create_dir(m.p("d")).expect("mkdir");
    let stats = stats_file("askmkdir-lastfile");
    let mut child = write_then_delete(&m.p("d"), stats.path(), false);
    std::fs::metadata(m.p("d")).expect("stat d recalls its lease");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(b"go\n").expect("go");
    }
    assert!(child.wait().expect("wait").success());
    assert_eq!(stat_u64(m.path(), "lane_removals_refused"), 0);
    let m = books_match_a_scan(&pool, m);
    m.unmount();
    fsck_clean(&pool);
}

/// Python `script` on `arg` under the library with `env`: whether it
/// succeeded.
fn run_python_with(script: &str, arg: &Path, env: &[(&str, &str)]) -> bool {
    let mut c = std::process::Command::new(PYTHON);
    c.arg("-c").arg(script).arg(arg).env("LD_PRELOAD", lib());
    for (k, v) in env {
        c.env(k, v);
    }
    c.status().expect("python").success()
}
