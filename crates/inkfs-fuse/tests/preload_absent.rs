//! A name no directory holds is answered ENOENT by the library itself
//! (crates/inkfs-preload/src/path.rs, `Stop::Absent`), with the kernel's
//! answer for every other case: a preloaded program that stats, lstats,
//! statx-es, accesses, readlinks and opens missing names (the last one, one
//! on the way, after a trailing slash, before a `..`, by absolute and
//! relative path) prints what the same program prints without the
//! library, call for call; the misses were the library's (its counters),
//! and the cases it must leave to the kernel (a name under a file:
//! ENOTDIR; a symlink on the way; a directory the caller may not search:
//! EACCES) went to the kernel.

mod common;

use std::os::unix::fs::PermissionsExt;

use common::preload::*;
use common::*;

/// Run as root with the test directory as its argument: one line per
/// call, its result (a size, a target, an errno).
const SCRIPT: &str = r#"
import ctypes, os, sys
d = sys.argv[1]
libc = ctypes.CDLL(None, use_errno=True)
libc.statx.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p]
buf = ctypes.create_string_buffer(256)
def call(name, f):
    try:
        print(name, f())
    except OSError as e:
        print(name, "errno", e.errno)
def statx(p):
    def s():
        if libc.statx(-100, p.encode(), 0x100, 0x7ff, buf) != 0:
            raise OSError(ctypes.get_errno(), "statx")
        return "ok"
    return s
def access(p, mode):
    def a():
        if libc.access(p.encode(), mode) != 0:
            raise OSError(ctypes.get_errno(), "access")
        return "ok"
    return a
def opened(p, flags):
    def o():
        os.close(os.open(p, flags, 0o644))
        return "opened"
    return o
os.chdir(d)
# Counted by the test: misses the library answers.
absent = ["missing", "a/missing", "missing/x", "a/missing/x/y", "missing/",
          "a/missing/..", "a/sub/missing", d + "/a/missing", d + "/missing/x"]
for p in absent:
    call("stat " + p, lambda: os.stat(p).st_size)
    call("lstat " + p, lambda: os.lstat(p).st_size)
    call("statx " + p, statx(p))
    call("access F_OK " + p, access(p, os.F_OK))
    call("access R_OK " + p, access(p, os.R_OK))
    call("readlink " + p, lambda: os.readlink(p))
    call("open " + p, opened(p, os.O_RDONLY))
# Opens: a create under a missing directory, a directory open.
call("creat missing/x", opened("missing/x", os.O_WRONLY | os.O_CREAT))
call("opendir a/missing/", opened("a/missing/", os.O_RDONLY | os.O_DIRECTORY))
# Served answers beside them (found, and readlink of a file: EINVAL).
call("stat a/f", lambda: os.stat("a/f").st_size)
call("readlink a/f", lambda: os.readlink("a/f"))
call("readlink l", lambda: os.readlink("l"))
# The kernel's: a name under a file (ENOTDIR), a symlink on the way.
call("stat a/f/x", lambda: os.stat("a/f/x").st_size)
call("lstat a/f/missing", lambda: os.lstat("a/f/missing").st_size)
call("stat l/missing", lambda: os.stat("l/missing").st_size)
call("stat l/f", lambda: os.stat("l/f").st_size)
# A directory the caller may not search: EACCES, not ENOENT.
os.setgid(65534)
os.setuid(65534)
call("stat locked/missing", lambda: os.stat("locked/missing").st_size)
call("stat locked/f", lambda: os.stat("locked/f").st_size)
call("stat a/missing as nobody", lambda: os.stat("a/missing").st_size)
"#;

/// Calls of the script the library must answer ENOENT itself (nine
/// paths, six calls by path each and an open of seven of them: an open
/// of "missing/" or "a/missing/.." is the kernel's; then the create and
/// the directory open), and path stats it must leave to the kernel
/// (four, then the two under the locked directory).
const ABSENT: u64 = 9 * 6 + 7 + 2;
const KERNEL_STATS: u64 = 4 + 2;

fn build(dir: &std::path::Path) {
    let _ = std::fs::remove_dir_all(dir);
    for sub in ["a/sub", "locked"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
    }
    std::fs::write(dir.join("a/f"), b"abc").unwrap();
    std::fs::write(dir.join("locked/f"), b"abcd").unwrap();
    std::os::unix::fs::symlink("a", dir.join("l")).unwrap();
    std::fs::set_permissions(dir.join("locked"), std::fs::Permissions::from_mode(0o700)).unwrap();
    // Searchable by the script once it is nobody.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn a_missing_name_is_the_librarys_enoent_and_the_rest_the_kernels() {
    require_root();
    let pool = Pool::new("absent", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let stats = stats_file("absent");
    same_as_kernel(
        SCRIPT,
        &m.p("t"),
        stats.path(),
        build,
        &[
            "stat a/missing errno 2",
            "stat missing/x errno 2",
            "readlink a/missing/.. errno 2",
            "creat missing/x errno 2",
            "readlink a/f errno 22",
            "stat a/f/x errno 20",
            "stat l/f 3",
            "stat locked/missing errno 13",
            "stat a/missing as nobody errno 2",
        ],
    );

    let n = counts(stats.path());
    assert_eq!(c(&n, "attach_refused"), 0, "{n:?}");
    // The misses: each the library's (one more as nobody).
    assert_eq!(c(&n, "stat_absent"), ABSENT + 1, "misses not served: {n:?}");
    // And nothing else went to the kernel but what must.
    assert_eq!(c(&n, "stat_kernel"), KERNEL_STATS, "{n:?}");
}
