//! The path a placeholder keeps to be materialized by, when the file was
//! opened by a path relative to the current directory
//! (crates/inkfs-preload/src/lazy.rs, `settle_relative`; path.rs,
//! `Target::kept`): the relative path itself, not the current
//! directory's name read with getcwd at the open. A preloaded program
//! opens files relatively, another process renames a directory above the
//! current one, the program changes directory, and each descriptor's
//! kernel file (`/proc/self/fd/N`, which materializes it) is the file it
//! opened: what the same program prints without the library, line for
//! line.
//!
//! With the old rule (the current directory's name at the open) the
//! first materialization after the rename fails (the kept name is gone);
//! without the materialization before a change of directory, one after
//! it resolves the relative path from the new directory.

mod common;

use common::preload::*;
use common::*;

/// Run with the test directory as its argument: one line per call.
const SCRIPT: &str = r#"
import os, subprocess, sys
d = sys.argv[1]
def link(fd):
    try:
        return os.readlink("/proc/self/fd/%d" % fd)[len(d):]
    except OSError as e:
        return "errno %d" % e.errno
def size(fd):
    return os.fstat(fd).st_size

# Another process, without the library, started before the opens (a fork
# materializes every placeholder first): it renames when told to.
plain = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "INKFS_PRELOAD_STATS")}
mover = subprocess.Popen(
    [sys.executable, "-c", "import os, subprocess, sys; sys.stdin.readline(); os.rename(sys.argv[1] + '/a', sys.argv[1] + '/z'); print('moved', flush=True); sys.stdin.read()", d],
    env=plain, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
os.chdir(d + "/a/b")
f = os.open("f", os.O_RDONLY)
g = os.open("../b/./g", os.O_RDONLY)
h = os.open("c/../h", os.O_RDONLY)
print("opened", size(f), size(g), size(h))
mover.stdin.write(b"go\n")
mover.stdin.flush()
assert mover.stdout.readline() == b"moved\n"
print("renamed above, f", link(f))
os.chdir(d)
print("changed, g", link(g))
print("changed, h", link(h), len(os.read(h, 100)))
k = os.open("z/b/f", os.O_RDONLY)
print("from the new one, k", link(k), size(k))
os.chdir("z/b")
print("back, k", link(k))
for fd in (f, g, h, k):
    os.close(fd)
mover.stdin.close()
mover.wait()
"#;

fn build(dir: &std::path::Path) {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir.join("a/b/c")).unwrap();
    std::fs::write(dir.join("a/b/f"), b"1").unwrap();
    std::fs::write(dir.join("a/b/g"), b"22").unwrap();
    std::fs::write(dir.join("a/b/h"), b"333").unwrap();
}

#[test]
fn a_relative_opens_placeholder_is_materialized_as_the_file_it_opened() {
    require_root();
    let pool = Pool::new("kept", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let stats = stats_file("kept");
    same_as_kernel(
        SCRIPT,
        &m.p("t"),
        stats.path(),
        build,
        &[
            "opened 1 2 3",
            "renamed above, f /z/b/f",
            "changed, g /z/b/g",
            "changed, h /z/b/h 3",
            "from the new one, k /z/b/f 1",
            "back, k /z/b/f",
        ],
    );
    let n = counts(stats.path());
    assert_eq!(c(&n, "attach_refused"), 0, "{n:?}");
    assert!(c(&n, "open_local") >= 4, "the opens were not served: {n:?}");
    // f by its readlink, g and h at the chdir, k by its readlink.
    assert_eq!(c(&n, "materialized"), 4, "{n:?}");
}

/// The head of the race programs: the test directory as `d`, the current
/// directory `d/x`, and a thread that changes directory between `d/y`
/// and `d/x` from `start()` until `end(t)`.
const MOVER: &str = r#"
import os, sys, threading
d = sys.argv[1]
os.chdir(d + "/x")
stop = []
def mover():
    while not stop:
        os.chdir(d + "/y")
        os.chdir(d + "/x")
def start():
    t = threading.Thread(target=mover)
    t.start()
    return t
def end(t):
    stop.append(1)
    t.join()
"#;

/// Python program MOVER + `body` run through the kernel and under the
/// library on `x/f` and `y/f` (of 1 and 2 bytes): the same output, which
/// holds `want`, and the library served the opens.
fn race(name: &str, body: &str, want: &str) {
    require_root();
    let pool = Pool::new(name, 64);
    let m = Mounted::new(&pool, "mode=strict");
    let stats = stats_file(name);
    let build = |dir: &std::path::Path| {
        let _ = std::fs::remove_dir_all(dir);
        for (sub, n) in [("x", 1), ("y", 2)] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
            std::fs::write(dir.join(sub).join("f"), vec![b'x'; n]).unwrap();
        }
    };
    let script = format!("{MOVER}{body}");
    same_as_kernel(&script, &m.p("t"), stats.path(), build, &[want]);
    let n = counts(stats.path());
    assert!(c(&n, "open_local") >= 1, "no open was served: {n:?}");
}

/// One thread opens `f` relatively, again and again, while another
/// changes directory between two directories each holding an `f` of its
/// own size: every descriptor's kernel file (materialized by its
/// `/proc/self/fd` link) is the file the open found (its size, served
/// from the pool at the open). Exercises `cwd::Opening` against
/// `cwd::changing`: an open whose placeholder a change did not settle,
/// and which then materialized from the other directory, would fail its
/// inode check (a link to /dev/null). A race, so it can only fail
/// sometimes: with the change's wait for the opens in flight taken out
/// it printed "wrong 2" in one run of three.
#[test]
fn a_relative_open_racing_a_change_of_directory_keeps_a_path_to_its_file() {
    let body = r#"
t = start()
bad = 0
for i in range(3000):
    fd = os.open("f", os.O_RDONLY)
    size = os.fstat(fd).st_size
    try:
        link = os.readlink("/proc/self/fd/%d" % fd)
        if not link.startswith(d) or os.stat(link).st_size != size:
            bad += 1
    except OSError:
        bad += 1
    os.close(fd)
end(t)
print("wrong", bad)
"#;
    race("kept-race", body, "wrong 0");
}

/// One thread opens `f` relatively and closes it at once, again and
/// again, while another changes directory: a change materializes the
/// placeholders kept by relative paths, and a close racing that
/// materialization must not leave the number open (a dup3 after the
/// close would bring it back). The program's descriptors at the end are
/// the ones it had at the start. The window is narrow: with table.rs's
/// wait in `release` taken out it passed four runs of four, so this
/// checks the whole, not that wait.
#[test]
fn a_close_racing_a_change_of_directory_leaves_no_descriptor_open() {
    let body = r#"
# The library's own descriptors (its session with the server) come with
# the first call on the mount.
os.close(os.open("f", os.O_RDONLY))
before = len(os.listdir("/proc/self/fd"))
t = start()
for i in range(5000):
    os.close(os.open("f", os.O_RDONLY))
end(t)
print("left open", len(os.listdir("/proc/self/fd")) - before)
"#;
    race("kept-close", body, "left open 0");
}
