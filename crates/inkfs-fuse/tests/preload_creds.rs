//! The library's cached credentials (crates/inkfs-preload/src/creds.rs)
//! never serve a call with ids, groups or a umask the process no longer
//! has: a preloaded program that checks files as root (filling the
//! cache), then changes its umask, its groups and its ids (glibc's set*id
//! for every thread, a raw `syscall` for one) gets what the kernel gives
//! the same program without the library, call for call, and the calls
//! were the library's to answer (its counters).

mod common;

use std::os::unix::fs::PermissionsExt;

use common::preload::*;
use common::*;

/// Run as root with the test directory as its argument: each line is a
/// call and its errno (0: allowed) or the mode it made.
const SCRIPT: &str = r#"
import ctypes, os, sys, threading
d = sys.argv[1]
secret, grp, shut = f"{d}/secret", f"{d}/grp", f"{d}/shut"
def call(name, f):
    try:
        f()
        print(name, 0)
    except OSError as e:
        print(name, e.errno)
def read(p):
    return lambda: os.close(os.open(p, os.O_RDONLY))
def create(p):
    return lambda: os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o666))
def mode(p):
    print(p.rsplit("/", 1)[1], oct(os.stat(p).st_mode & 0o7777))

# As root: the cache holds root's credentials in this thread and another.
call("root-read-secret", read(secret))
call("root-create", create(f"{shut}/by-root"))
worker_go = threading.Event()
worker_ready = threading.Event()
def worker():
    call("worker-root-read-secret", read(secret))
    worker_ready.set()
    worker_go.wait()
    call("worker-after-setuid-read-secret", read(secret))
    call("worker-after-setuid-stat-in-shut", lambda: os.stat(f"{shut}/by-root"))
t = threading.Thread(target=worker)
t.start()
worker_ready.wait()

# The umask, as the next create sees it.
for m in (0o022, 0o077, 0o002):
    os.umask(m)
    call(f"create-{m:o}", create(f"{d}/u{m:o}"))
    mode(f"{d}/u{m:o}")
    os.mkdir(f"{d}/m{m:o}", 0o777)
    mode(f"{d}/m{m:o}")

# Groups and effective ids, changed and changed back (the saved id is 0).
os.setgroups([2000])
os.setegid(1000)
os.seteuid(1000)
call("euid1000-groups2000-read-grp", read(grp))
call("euid1000-read-secret", read(secret))
call("euid1000-create-in-shut", create(f"{shut}/by-1000"))
os.seteuid(0)
call("back-to-root-read-secret", read(secret))
os.setgroups([])
os.seteuid(1000)
call("euid1000-no-groups-read-grp", read(grp))
os.seteuid(0)
os.setgroups([2000])

# A raw system call changes this thread's ids alone.
libc = ctypes.CDLL(None, use_errno=True)
SYS_setresuid = 117
assert libc.syscall(SYS_setresuid, -1, 1000, -1) == 0
call("raw-euid1000-read-secret", read(secret))
call("raw-euid1000-read-grp", read(grp))
assert libc.syscall(SYS_setresuid, -1, 0, -1) == 0
call("raw-back-read-secret", read(secret))

# For good, every thread: the worker, which cached root, is refused too;
# access(2) checks the real ids, now 1000 as well.
os.setgid(1000)
os.setuid(1000)
call("setuid-read-secret", read(secret))
call("setuid-access-secret", lambda: os.access(secret, os.R_OK) or (_ for _ in ()).throw(PermissionError(13, "access")))
call("setuid-create-in-shut", create(f"{shut}/late"))
call("setuid-read-grp", read(grp))
worker_go.set()
t.join()
"#;

/// The expected answers (errno 13: EACCES); the modes are 0666 and 0777
/// less each umask.
const EXPECT: &str = "\
root-read-secret 0
root-create 0
worker-root-read-secret 0
create-22 0
u22 0o644
m22 0o755
create-77 0
u77 0o600
m77 0o700
create-2 0
u2 0o664
m2 0o775
euid1000-groups2000-read-grp 0
euid1000-read-secret 13
euid1000-create-in-shut 13
back-to-root-read-secret 0
euid1000-no-groups-read-grp 13
raw-euid1000-read-secret 13
raw-euid1000-read-grp 0
raw-back-read-secret 0
setuid-read-secret 13
setuid-access-secret 13
setuid-create-in-shut 13
setuid-read-grp 0
worker-after-setuid-read-secret 13
worker-after-setuid-stat-in-shut 0
";

/// Sorted lines (the worker's last lines may come before or after the
/// main thread's).
fn lines(s: &str) -> Vec<&str> {
    let mut v: Vec<&str> = s.lines().collect();
    v.sort_unstable();
    v
}

/// Fresh files for a run in `dir`: `secret` root's 0600, `grp` 0640 of
/// group 2000, `shut` a directory only root may write.
fn build(dir: &std::path::Path) {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir(dir).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    for (name, mode) in [("secret", 0o600), ("grp", 0o640)] {
        let p = dir.join(name);
        std::fs::write(&p, b"x").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    std::os::unix::fs::chown(dir.join("grp"), Some(0), Some(2000)).unwrap();
    std::fs::create_dir(dir.join("shut")).unwrap();
    std::fs::set_permissions(dir.join("shut"), std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn run(dir: &std::path::Path, stats: Option<&std::path::Path>) -> String {
    run_python(SCRIPT, dir, stats)
}

#[test]
fn credential_and_umask_changes_are_seen_by_the_next_call() {
    require_root();
    let pool = Pool::new("creds", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let stats = stats_file("creds");
    // The counters are written at exit, by uid 1000.
    std::fs::set_permissions(stats.path(), std::fs::Permissions::from_mode(0o666)).unwrap();

    build(&m.p("kernel"));
    let kernel = run(&m.p("kernel"), None);
    assert_eq!(
        lines(&kernel),
        lines(EXPECT),
        "through the kernel:\n{kernel}"
    );

    build(&m.p("library"));
    let library = run(&m.p("library"), Some(stats.path()));
    assert_eq!(
        lines(&library),
        lines(EXPECT),
        "under the library:\n{library}"
    );

    // The library answered (not the kernel): the 11 opens and creates
    // that succeed (a refusal the library answers is not counted; one
    // allowed by stale credentials would be, and would show above), the
    // mkdirs, the stats and access.
    let n = counts(stats.path());
    assert_eq!(c(&n, "attach_refused"), 0, "{n:?}");
    assert!(c(&n, "open_local") >= 11, "opens not served: {n:?}");
    assert!(c(&n, "ns_local") >= 3, "mkdirs not served: {n:?}");
    assert!(c(&n, "stat_local") >= 7, "stats not served: {n:?}");
}
