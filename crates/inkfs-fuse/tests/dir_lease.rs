//! Directory leases on real mounts (docs/KERNEL-FREE.md, "Built: directory
//! leases on the server"): an API client asks for a directory's lease with
//! a namespace request (`Client::ns_dir_lease`), and every FUSE request
//! naming the directory or a name in it, another client's request in it,
//! and the unmount take it back; the grant drops what the kernel cached
//! under it (negative names included); a stopped holder is killed at the
//! recall timeout. In-process clients answer their recalls on their own
//! threads; the stopped holder is this test binary re-executed
//! (`dir_lease_child`).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use inkfs::api::client::Client;
use inkfs::api::dirlease::{DirAnswer, KernelView, Refusal};
use inkfs::api::ns::{Done, Op};
use inkfs::api::{Credentials, ROOT_INO};

const CHILD_ENV: &str = "INKFS_DIR_LEASE_CHILD";
const CHILD_DIR_ENV: &str = "INKFS_DIR_LEASE_CHILD_DIR";

fn root() -> Credentials {
    Credentials::root()
}

fn stat_u64(mnt: &Path, key: &str) -> u64 {
    let s = stats_json(mnt).expect("statistics");
    s[key].as_u64().unwrap_or_else(|| panic!("no {key} in {s}"))
}

fn lookups(mnt: &Path) -> u64 {
    let s = stats_json(mnt).expect("statistics");
    s["ops"]["lookup"]["count"].as_u64().unwrap_or(0)
}

/// A create (read-only: no file lease comes with it) of `name` in `dir`,
/// asking for `dir`'s lease.
fn create_asking(c: &Client, dir: u64, name: &str) -> Done {
    c.ns_dir_lease(
        &root(),
        Op::Create {
            dir,
            name: name.as_bytes().to_vec(),
            mode: 0o644,
            flags: libc::O_CREAT | libc::O_RDONLY,
        },
    )
    .expect("asked")
}

/// Ask for `dir`'s lease (with a create of `name`) and expect it granted:
/// what the kernel held under it.
fn grant(c: &Client, dir: u64, name: &str) -> KernelView {
    let d = create_asking(c, dir, name);
    assert_eq!(d.errno, 0, "create {name}");
    match d.dir {
        Some(DirAnswer::Granted { gen, kernel }) => {
            assert_eq!(c.dir_lease(dir).map(|h| h.0), Some(gen));
            kernel
        }
        other => panic!("not granted: {other:?}"),
    }
}

fn mount(name: &str) -> (Pool, Mounted) {
    require_root();
    let pool = Pool::new(name, 64);
    // Attached clients are served in strict and sync modes.
    let m = Mounted::new(&pool, "mode=strict");
    (pool, m)
}

/// A shell whose working directory is D, made before the lease: its
/// relative names reach the server as requests naming D (the kernel's
/// dentry of D stays its working directory when the grant invalidates D's
/// entry), not as a lookup of D in its parent first.
struct Shell {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Shell {
    fn in_dir(dir: &Path) -> Shell {
        let mut child = Command::new("bash")
            .arg("--noprofile")
            .arg("--norc")
            .current_dir(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("bash");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut sh = Shell {
            child,
            stdin,
            stdout,
        };
        // Bash stats its working directory as it starts: done before the
        // caller takes a lease, or that GETATTR of D recalls it at an
        // instant the test does not expect (seen on a loaded CI machine).
        assert_eq!(sh.run("true"), 0, "the shell starts");
        sh
    }

    /// Run `cmd`; its exit status.
    fn run(&mut self, cmd: &str) -> i32 {
        writeln!(self.stdin, "{cmd} >/dev/null 2>&1; echo @done $?").expect("shell input");
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                self.stdout.read_line(&mut line).expect("shell output") > 0,
                "the shell ended"
            );
            if let Some(rest) = line.trim_end().strip_prefix("@done ") {
                return rest.parse().expect("status");
            }
        }
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Each kind of FUSE request naming D or a name in D recalls D's lease,
/// and is answered after the client gave it back: the client's recall
/// count has moved when the command returns (no waiting), and it holds the
/// lease no more. (Under the kernel most of these reach the server first
/// as a LOOKUP of the name in D, which recalls; those that do not, the
/// GETATTR, SETATTR, READDIR and xattrs of D itself, are each a request
/// on D.) Fails with the recall of directory entries turned off (the
/// lease table's hook skipping them): the count does not move.
#[test]
fn every_request_naming_the_directory_recalls_its_lease() {
    let (_pool, m) = mount("dl-kinds");
    std::fs::create_dir(m.p("D")).unwrap();
    std::fs::create_dir(m.p("E")).unwrap();
    std::fs::write(m.p("E/out"), b"x").unwrap();
    let d = std::fs::metadata(m.p("D")).unwrap().ino();
    let mut sh = Shell::in_dir(&m.p("D"));
    let c = Client::attach_mountpoint(m.path(), None).expect("attach");
    // (command run with D as working directory, its expected status)
    let kinds: &[(&str, i32)] = &[
        ("stat missing", 1),
        ("stat .", 0),
        ("ls -a .", 0),
        ("chmod 0750 .", 0),
        ("touch made", 0),
        ("mkfifo fifo", 0),
        ("mkdir sub", 0),
        ("ln -s target sl", 0),
        ("ln g0 hard", 0),
        ("rm hard", 0),
        ("rmdir sub", 0),
        ("mv g1 ../E/g1", 0),
        ("mv ../E/out in", 0),
        ("setfattr -n user.k -v v .", 0),
        ("getfattr -n user.k .", 0),
        ("chattr +d .", 0),
    ];
    for (i, (cmd, status)) in kinds.iter().enumerate() {
        grant(&c, d, &format!("g{i}"));
        assert_eq!(c.dir_leases_held(), 1);
        let recalls = c.dir_recalls();
        assert_eq!(sh.run(cmd), *status, "{cmd}");
        assert_eq!(c.dir_recalls(), recalls + 1, "{cmd}: not recalled");
        assert_eq!(c.dir_lease(d), None, "{cmd}: still held");
    }
    assert_eq!(stat_u64(m.path(), "dir_leases_held"), 0);
    assert_eq!(
        stat_u64(m.path(), "dir_leases_recalled"),
        kinds.len() as u64
    );
    assert_eq!(stat_u64(m.path(), "dir_leases_granted"), kinds.len() as u64);
    drop(c);
    drop(sh);
    m.unmount();
}

/// Another client's namespace request in D recalls the first client's
/// lease of D (its engine uses D); the first client's detach gives back
/// the lease it holds with `released`; the unmount recalls a lease still
/// held.
#[test]
fn another_client_the_detach_and_the_unmount_take_the_lease_back() {
    let (_pool, m) = mount("dl-other");
    std::fs::create_dir(m.p("D")).unwrap();
    let d = std::fs::metadata(m.p("D")).unwrap().ino();
    let a = Client::attach_mountpoint(m.path(), None).expect("attach a");
    let b = Client::attach_mountpoint(m.path(), None).expect("attach b");
    grant(&a, d, "a0");
    let before = a.dir_recalls();
    let done = b
        .ns(
            &root(),
            Op::Mkdir {
                dir: d,
                name: b"by-b".to_vec(),
                mode: 0o755,
            },
        )
        .expect("asked");
    assert_eq!(done.errno, 0);
    assert_eq!(a.dir_recalls(), before + 1, "b's mkdir did not recall");
    assert_eq!(a.dir_lease(d), None);
    // b takes it; a's request in D takes it from b.
    grant(&b, d, "b0");
    let done = a
        .ns(
            &root(),
            Op::Unlink {
                dir: d,
                name: b"b0".to_vec(),
            },
        )
        .expect("asked");
    assert_eq!(done.errno, 0);
    assert_eq!(b.dir_lease(d), None, "a's unlink did not recall b's lease");
    // The detach: `released` on the session, not the session's end.
    grant(&a, d, "a1");
    let released = stat_u64(m.path(), "leases_released");
    drop(a);
    let t = Instant::now();
    while stat_u64(m.path(), "dir_leases_held") != 0 {
        assert!(t.elapsed() < Duration::from_secs(10), "never given back");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(stat_u64(m.path(), "leases_released"), released + 1);
    // The unmount: recalled, answered by the client (its count moves).
    grant(&b, d, "b1");
    let recalls = b.dir_recalls();
    let dir = m.unmount();
    assert_eq!(b.dir_recalls(), recalls + 1, "the unmount did not recall");
    assert_eq!(b.dir_leases_held(), 0);
    drop(b);
    drop(dir);
}

/// The grant makes the kernel forget the negative names it cached under
/// D (and names removed through it): the next stat of such a name through
/// the mount reaches the server (a LOOKUP), which without the grant's
/// invalidation the kernel answers itself for an hour. D below the root
/// (its entry in its parent invalidated: `d_invalidate` prunes them) and
/// the root (its recorded names invalidated one by one). Fails with
/// either invalidation turned off.
#[test]
fn a_grant_drops_the_kernels_negative_names() {
    let (_pool, m) = mount("dl-negative");
    std::fs::create_dir(m.p("D")).unwrap();
    let d = std::fs::metadata(m.p("D")).unwrap().ino();
    std::fs::write(m.p("D/gone"), b"x").unwrap();
    std::fs::write(m.p("rootgone"), b"x").unwrap();
    std::fs::remove_file(m.p("D/gone")).unwrap();
    std::fs::remove_file(m.p("rootgone")).unwrap();
    let missing = ["D/x", "D/gone", "x", "rootgone"];
    for p in missing {
        assert!(std::fs::symlink_metadata(m.p(p)).is_err(), "{p}");
    }
    // Cached now: no request.
    let l = lookups(m.path());
    for p in missing {
        assert!(std::fs::symlink_metadata(m.p(p)).is_err(), "{p}");
    }
    assert_eq!(lookups(m.path()), l, "the kernel did not cache them");
    assert!(stat_u64(m.path(), "root_negative_names") >= 2);
    let c = Client::attach_mountpoint(m.path(), None).expect("attach");
    for (dir, names) in [(d, ["D/x", "D/gone"]), (ROOT_INO, ["x", "rootgone"])] {
        for p in names {
            let view = grant(&c, dir, "made");
            assert!(
                matches!(view, KernelView::Children(_)),
                "the kernel knows the directory: {view:?}"
            );
            let l = lookups(m.path());
            assert!(std::fs::symlink_metadata(m.p(p)).is_err(), "{p}");
            assert!(
                lookups(m.path()) > l,
                "{p}: answered from a negative entry after the grant"
            );
            assert_eq!(c.dir_lease(dir), None, "{p}: the lookup did not recall");
            c.ns(
                &root(),
                Op::Unlink {
                    dir,
                    name: b"made".to_vec(),
                },
            )
            .expect("asked");
        }
    }
    drop(c);
    m.unmount();
}

/// What the grant says the kernel holds under D: nothing when it never
/// looked D up (a directory the client made), the children it counts
/// once it has, "many" past the bound.
#[test]
fn the_grant_carries_the_kernels_view() {
    let (_pool, m) = mount("dl-view");
    let c = Client::attach_mountpoint(m.path(), None).expect("attach");
    let d = c
        .ns(
            &root(),
            Op::Mkdir {
                dir: ROOT_INO,
                name: b"unseen".to_vec(),
                mode: 0o755,
            },
        )
        .expect("asked");
    assert_eq!(d.errno, 0);
    assert_eq!(grant(&c, d.ino, "f"), KernelView::Unknown);
    // The kernel looks D and one child up: counted.
    let f = std::fs::metadata(m.p("unseen/f")).unwrap().ino();
    match grant(&c, d.ino, "g") {
        KernelView::Children(list) => assert_eq!(list, vec![f]),
        other => panic!("{other:?}"),
    }
    // Past the bound of listed children: "many".
    // 257 new children (f may be forgotten: the last grant pruned the
    // unused dentries under D).
    for i in 0..=inkfs::api::dirlease::KERNEL_CHILDREN_MAX {
        std::fs::write(m.p(&format!("unseen/c{i}")), b"").unwrap();
    }
    assert_eq!(grant(&c, d.ino, "h"), KernelView::Many);
    drop(c);
    m.unmount();
}

/// Past the root's bound of recorded negative names, the root's lease is
/// refused (counted by reason) and, while a client is attached, its
/// negative lookups are answered with a zero TTL (each stat of a missing
/// name reaches the server); with no client attached they are cached as
/// before. Fails with either turned off.
#[test]
fn an_overflowed_root_is_refused_and_uncached() {
    let (_pool, m) = mount("dl-overflow");
    let last = format!("n{}", inkfs_fuse::dirlease::NEGATIVES_MAX);
    for i in 0..=inkfs_fuse::dirlease::NEGATIVES_MAX {
        assert!(std::fs::symlink_metadata(m.p(&format!("n{i}"))).is_err());
    }
    // No client attached: past the bound, still cached as before.
    let l = lookups(m.path());
    assert!(std::fs::symlink_metadata(m.p(&last)).is_err());
    assert_eq!(lookups(m.path()), l, "uncached with no client attached");
    let c = Client::attach_mountpoint(m.path(), None).expect("attach");
    let done = create_asking(&c, ROOT_INO, "made");
    assert_eq!(done.errno, 0);
    assert_eq!(done.dir, Some(DirAnswer::Refused(Refusal::Overflow)));
    assert_eq!(c.dir_leases_held(), 0);
    assert_eq!(stat_u64(m.path(), "dir_leases_refused_overflow"), 1);
    let l = lookups(m.path());
    for _ in 0..3 {
        assert!(std::fs::symlink_metadata(m.p("probe")).is_err());
    }
    assert_eq!(lookups(m.path()), l + 3, "negative lookups still cached");
    // Below the root, unaffected.
    std::fs::create_dir(m.p("D")).unwrap();
    let d = std::fs::metadata(m.p("D")).unwrap().ino();
    grant(&c, d, "f");
    drop(c);
    m.unmount();
}

/// Refusals: not a directory, immutable; and an old client (no `+dir`)
/// gets the old answer and no lease.
#[test]
fn refusals_and_an_old_client() {
    let (_pool, m) = mount("dl-refuse");
    std::fs::create_dir(m.p("D")).unwrap();
    std::fs::write(m.p("file"), b"x").unwrap();
    let d = std::fs::metadata(m.p("D")).unwrap().ino();
    let f = std::fs::metadata(m.p("file")).unwrap().ino();
    let c = Client::attach_mountpoint(m.path(), None).expect("attach");
    let old = c
        .ns(
            &root(),
            Op::Mknod {
                dir: d,
                name: b"p".to_vec(),
                mode: libc::S_IFIFO | 0o600,
                rdev: 0,
            },
        )
        .expect("asked");
    assert_eq!((old.errno, old.dir.clone()), (0, None));
    assert_eq!(c.dir_leases_held(), 0);
    let done = create_asking(&c, f, "x");
    assert_eq!(done.errno, libc::ENOTDIR);
    assert_eq!(done.dir, Some(DirAnswer::Refused(Refusal::NotDir)));
    run(Command::new("chattr").arg("+i").arg(m.p("D")));
    let done = create_asking(&c, d, "x");
    assert_eq!(done.errno, libc::EPERM);
    assert_eq!(done.dir, Some(DirAnswer::Refused(Refusal::Immutable)));
    run(Command::new("chattr").arg("-i").arg(m.p("D")));
    grant(&c, d, "x");
    // chattr of D recalls it.
    run(Command::new("chattr").arg("+i").arg(m.p("D")));
    assert_eq!(c.dir_lease(d), None, "chattr did not recall");
    run(Command::new("chattr").arg("-i").arg(m.p("D")));
    assert_eq!(stat_u64(m.path(), "dir_leases_refused_notdir"), 1);
    assert_eq!(stat_u64(m.path(), "dir_leases_refused_immutable"), 1);
    assert_eq!(stat_u64(m.path(), "dir_leases_granted"), 1);
    drop(c);
    m.unmount();
}

// ---------------------------------------------------------------------
// A stopped holder
// ---------------------------------------------------------------------

/// Not a test by itself: a client that takes D's lease (D's inode number
/// in [`CHILD_DIR_ENV`]), says `@granted`, then waits for its stdin to
/// end.
#[test]
fn dir_lease_child() {
    let Ok(mnt) = std::env::var(CHILD_ENV) else {
        return;
    };
    let d: u64 = std::env::var(CHILD_DIR_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .expect("the directory");
    let c = Client::attach_mountpoint(Path::new(&mnt), None).expect("attach");
    grant(&c, d, "child");
    println!("@granted");
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    std::process::exit(0);
}

/// A holder stopped by SIGSTOP: a stat in D through the mount waits for
/// the recall timeout, then the server kills the holder through its pidfd
/// and answers; a grant of D in the next second is refused (`timeout`).
#[test]
fn a_stopped_holder_is_killed_at_the_recall_timeout() {
    let (_pool, m) = mount("dl-stopped");
    std::fs::create_dir(m.p("D")).unwrap();
    let d = std::fs::metadata(m.p("D")).unwrap().ino();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "dir_lease_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, m.path())
        .env(CHILD_DIR_ENV, d.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the holder");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("@granted") {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the holder ended");
    }
    assert_eq!(stat_u64(m.path(), "dir_leases_held"), 1);
    // Attached now: its ask below comes right after the timeout.
    let c = Client::attach_mountpoint(m.path(), None).expect("attach");
    // SAFETY: kill has no memory preconditions.
    unsafe { libc::kill(child.id() as i32, libc::SIGSTOP) };
    let t = Instant::now();
    assert!(std::fs::symlink_metadata(m.p("D/x")).is_err());
    let waited = t.elapsed();
    assert!(
        waited >= inkfs_fuse::lease::RECALL_TIMEOUT - Duration::from_millis(100),
        "answered before the timeout: {waited:?}"
    );
    let done = create_asking(&c, d, "after");
    let status = child.wait().expect("wait");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    assert_eq!(done.dir, Some(DirAnswer::Refused(Refusal::Timeout)));
    assert_eq!(stat_u64(m.path(), "dir_leases_refused_timeout"), 1);
    // It held a lane with D (its grant asked `+lane`): reaped. (The
    // refused ask above leased one and gave it back at once.)
    assert_eq!(stat_u64(m.path(), "lanes_reaped"), 1);
    assert_eq!(
        stat_u64(m.path(), "lanes_leased"),
        1 + stat_u64(m.path(), "lanes_given_back")
    );
    drop(c);
    m.unmount();
}
