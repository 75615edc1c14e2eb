//! Relative paths walked from the library's copy of the current
//! directory's inode (crates/inkfs-preload/src/cwd.rs) give the kernel's
//! answers: a preloaded program that changes directory by every route
//! (chdir, fchdir, a raw `syscall`, glibc's fts walking with chdir, nftw
//! with FTW_CHDIR, another thread's chdir) and whose current directory
//! another process renames and removes prints what the same program
//! prints without the library, call for call; and the library answered
//! the relative stats itself (its counters).
//!
//! Every directory holds a file `f` of a size of its own, so a relative
//! stat answered from a stale directory is a success with the wrong size,
//! not a miss the kernel would then answer.
//!
//! And a path stat after the server's death (the library no longer asks
//! its socket at every stat) is the kernel's.

mod common;

use std::os::unix::fs::PermissionsExt;

use common::preload::*;
use common::*;

/// Run as root with the test directory as its argument: one line per
/// call, its result (a size, an errno, a listing).
const SCRIPT: &str = r#"
import ctypes, os, subprocess, sys, threading
d = sys.argv[1]
libc = ctypes.CDLL(None, use_errno=True)
plain = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "INKFS_PRELOAD_STATS")}
def other(*cmd):
    # Another process, without the library.
    subprocess.run(list(cmd), env=plain, check=True)
def call(name, f):
    try:
        print(name, f())
    except OSError as e:
        print(name, "errno", e.errno)
def size(p):
    return lambda: os.stat(p).st_size
def lsize(p):
    return lambda: os.lstat(p).st_size
def read(p):
    def r():
        fd = os.open(p, os.O_RDONLY)
        try:
            return len(os.read(fd, 100))
        finally:
            os.close(fd)
    return r
def where():
    return os.getcwd()[len(d):] or "/"
def look(tag):
    print(tag, "cwd", where())
    call(tag + " f", size("f"))
    call(tag + " read f", read("f"))
    call(tag + " ../f", lsize("../f"))
    call(tag + " access f", lambda: os.access("f", os.R_OK))

os.chdir(d)
look("start")
os.chdir("d1")
look("chdir d1")
os.chdir("d2/d3")
look("chdir d2/d3")
os.chdir("../..")
look("chdir ../..")

# fchdir, of a directory the library opened (a placeholder) and of one
# the kernel opened (O_PATH).
fd = os.open(f"{d}/d1/d2", os.O_RDONLY | os.O_DIRECTORY)
os.fchdir(fd)
os.close(fd)
look("fchdir d1/d2")
fd = os.open(f"{d}/d1", os.O_PATH)
os.fchdir(fd)
os.close(fd)
look("fchdir O_PATH d1")

# Raw system calls (x86-64: chdir 80, fchdir 81).
libc.syscall.restype = ctypes.c_long
assert libc.syscall(80, f"{d}/d1/d2/d3".encode()) == 0
look("syscall chdir d1/d2/d3")
fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
assert libc.syscall(81, fd) == 0, ctypes.get_errno()
os.close(fd)
look("syscall fchdir top")

# Another thread: its copy is made, then the main thread moves.
ready, go, done = threading.Event(), threading.Event(), threading.Event()
def worker():
    call("thread before f", size("f"))
    ready.set()
    go.wait()
    call("thread after f", size("f"))
    call("thread after read f", read("f"))
    done.set()
t = threading.Thread(target=worker)
t.start()
ready.wait()
os.chdir(f"{d}/d1/d2")
go.set()
done.wait()
t.join()
os.chdir(d)

# glibc's fts, walking with chdir (no FTS_NOCHDIR): between fts_read
# calls the current directory is the entry's.
class FTSENT(ctypes.Structure):
    _fields_ = [("cycle", ctypes.c_void_p), ("parent", ctypes.c_void_p),
                ("link", ctypes.c_void_p), ("number", ctypes.c_long),
                ("pointer", ctypes.c_void_p), ("accpath", ctypes.c_char_p),
                ("path", ctypes.c_char_p), ("errno", ctypes.c_int),
                ("symfd", ctypes.c_int), ("pathlen", ctypes.c_ushort),
                ("namelen", ctypes.c_ushort), ("ino", ctypes.c_ulong),
                ("dev", ctypes.c_ulong), ("nlink", ctypes.c_ulong),
                ("level", ctypes.c_short), ("info", ctypes.c_ushort)]
libc.fts_open.restype = ctypes.c_void_p
libc.fts_open.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.c_int, ctypes.c_void_p]
libc.fts_read.restype = ctypes.POINTER(FTSENT)
libc.fts_read.argtypes = [ctypes.c_void_p]
libc.fts_close.argtypes = [ctypes.c_void_p]
FTS_PHYSICAL, FTS_F, FTS_D = 0x10, 8, 1
argv = (ctypes.c_char_p * 2)(f"{d}/d1".encode(), None)
fts = libc.fts_open(argv, FTS_PHYSICAL, None)
while True:
    e = libc.fts_read(fts)
    if not e:
        break
    e = e.contents
    name = e.path.decode()[len(d):]
    if e.info == FTS_F:
        call(f"fts {name} accpath {e.accpath.decode()}", size(e.accpath.decode()))
        call(f"fts {name} in f", size("f"))
    elif e.info == FTS_D:
        print(f"fts dir {name} cwd", where())
libc.fts_close(fts)
look("after fts")

# nftw with FTW_CHDIR: the function runs in the entry's directory.
NFTW_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p)
FTW_F, FTW_PHYS, FTW_CHDIR = 0, 1, 4
def visit(path, st, kind, ftw):
    name = path.decode()[len(d):]
    if kind == FTW_F:
        base = name.rsplit("/", 1)[1]
        call(f"nftw {name} cwd {where()} base", size(base))
        call(f"nftw {name} f", size("f"))
    return 0
fn = NFTW_FN(visit)
assert libc.nftw(f"{d}/d1".encode(), fn, 8, FTW_PHYS | FTW_CHDIR) == 0
look("after nftw")

# Search permission from the current directory only, as the kernel: the
# directory above it is root's 0700.
os.chdir(f"{d}/locked/open")
os.seteuid(1000)
look("euid 1000 in locked/open")
call("euid 1000 ../open/f", size("../open/f"))
os.seteuid(0)

# The current directory renamed by another process: still the same one.
os.chdir(f"{d}/ren/a")
look("in ren/a")
other("mv", f"{d}/ren/a", f"{d}/ren/b")
look("renamed to ren/b")
call("create g", lambda: os.close(os.open("g", os.O_CREAT | os.O_WRONLY, 0o644)) or "made")
call("mkdir h", lambda: os.mkdir("h") or "made")
call("list", lambda: sorted(os.listdir(".")))
call("list b", lambda: sorted(os.listdir(f"{d}/ren/b")))

# ... and removed: empty, and no new entry in it (ENOENT, as the kernel).
os.chdir(f"{d}/gone")
call("in gone .", lambda: os.stat(".").st_nlink)
other("rmdir", f"{d}/gone")
call("removed . nlink", lambda: os.stat(".").st_nlink)
call("removed f", size("f"))
call("removed create", lambda: os.close(os.open("x", os.O_CREAT | os.O_WRONLY, 0o644)) or "made")
call("removed mkdir", lambda: os.mkdir("y") or "made")
call("removed list", lambda: sorted(os.listdir(".")))
call("removed ../f", size("../f"))
os.chdir(d)
look("back")
"#;

/// Fresh files for a run in `dir` (each `f` of its own size).
fn build(dir: &std::path::Path) {
    let _ = std::fs::remove_dir_all(dir);
    let file = |rel: &str, n: usize| std::fs::write(dir.join(rel), vec![b'x'; n]).unwrap();
    for sub in ["d1/d2/d3", "ren/a", "gone", "locked/open"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
    }
    file("f", 1);
    file("d1/f", 2);
    file("d1/d2/f", 3);
    file("d1/d2/d3/f", 4);
    file("d1/d2/d3/g", 40);
    file("ren/f", 50);
    file("ren/a/f", 5);
    file("locked/f", 60);
    file("locked/open/f", 6);
    std::fs::set_permissions(dir.join("locked"), std::fs::Permissions::from_mode(0o700)).unwrap();
}

#[test]
fn relative_paths_follow_every_change_of_the_current_directory() {
    require_root();
    let pool = Pool::new("cwd", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let stats = stats_file("cwd");
    same_as_kernel(
        SCRIPT,
        &m.p("t"),
        stats.path(),
        build,
        &[
            "chdir d2/d3 f 4",
            "fchdir d1/d2 f 3",
            "syscall chdir d1/d2/d3 f 4",
            "thread after f 3",
            "fts /d1/d2/d3/f accpath f 4",
            "fts /d1/d2/d3/g in f 4",
            "nftw /d1/d2/f cwd /d1/d2 base 3",
            "nftw /d1/d2/d3/g f 4",
            "renamed to ren/b f 5",
            "removed create errno 2",
        ],
    );

    let n = counts(stats.path());
    assert_eq!(c(&n, "attach_refused"), 0, "{n:?}");
    assert!(
        c(&n, "stat_local") >= 40,
        "relative stats not served: {n:?}"
    );
}

/// Stats a path on each line it reads: its size, or the errno.
const STAT_LOOP: &str = r#"
import os, sys
for line in sys.stdin:
    p = line.strip()
    try:
        print(p.rsplit("/", 1)[1], os.stat(p).st_size, flush=True)
    except OSError as e:
        print(p.rsplit("/", 1)[1], "errno", e.errno, flush=True)
"#;

/// A path stat after the server died and its mount point was unmounted
/// is the kernel's answer (the directory under the mount point), not the
/// pool's, even for a process that was stopped meanwhile: the library's
/// periodic check of the server's socket (crates/inkfs-preload/src/
/// mounts.rs, `Mount::serving`) sees the death at the first call after
/// the process resumes, whether or not the session's reader thread ran
/// first.
#[test]
fn a_path_stat_after_the_servers_death_is_the_kernels() {
    use std::io::{BufRead, BufReader, Write};
    require_root();
    let pool = Pool::new("cwd-dead", 64);
    let m = Mounted::new(&pool, "mode=strict");
    std::fs::write(m.p("f"), b"12345").unwrap();
    let stats = stats_file("cwd-dead");
    let mut child = std::process::Command::new(PYTHON)
        .arg("-c")
        .arg(STAT_LOOP)
        .env("LD_PRELOAD", lib())
        .env("INKFS_PRELOAD_STATS", stats.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python");
    let mut to = child.stdin.take().expect("stdin");
    let mut from = BufReader::new(child.stdout.take().expect("stdout"));
    let mut ask = |p: &std::path::Path| {
        writeln!(to, "{}", p.display()).expect("ask");
        let mut line = String::new();
        from.read_line(&mut line).expect("answer");
        line.trim().to_string()
    };
    let f = m.p("f");
    assert_eq!(ask(&f), "f 5", "served from the pool while the server runs");

    // Stopped while the server dies and its mount goes away.
    // SAFETY: signals to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGSTOP) };
    let dir = m.kill9();
    run(std::process::Command::new("umount").arg(dir.path()));
    // Longer than the library's interval between two checks of the
    // socket (4 ms on a clock of 4 ms ticks).
    std::thread::sleep(std::time::Duration::from_millis(20));
    // SAFETY: as above.
    unsafe { libc::kill(child.id() as i32, libc::SIGCONT) };
    assert_eq!(
        ask(&f),
        "f errno 2",
        "the directory under the mount point has no f: the pool answered"
    );
    drop(to);
    assert!(child.wait().expect("wait").success());
    let n = counts(stats.path());
    assert!(
        c(&n, "stat_local") >= 1,
        "the first stat was not served: {n:?}"
    );
    drop(dir);
}
