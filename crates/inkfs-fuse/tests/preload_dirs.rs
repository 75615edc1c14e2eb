//! Directories opened without the kernel and private mappings served as
//! copies (docs/KERNEL-FREE.md, "Built: directories and private mappings
//! without the kernel"): listing, walking and removing a tree under the
//! library gives the kernel's answers and costs the mount no FUSE request
//! (but find's and rm's statfs); a directory descriptor works as the directory
//! of relative calls, `..` included, and for fchdir (materialized); a
//! private read-only mapping of a served file is the file's bytes with no
//! kernel open.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::preload::*;
use common::*;

/// FUSE requests the server has answered so far, by kind (every kind but
/// the clients' own requests, statfs and forget).
fn fuse_requests(mnt: &Path) -> BTreeMap<String, u64> {
    let s = stats_json(mnt).expect("statistics");
    let ops = s["ops"].as_object().expect("ops");
    ops.iter()
        .filter(|(k, _)| !k.starts_with("client_") && *k != "statfs" && *k != "forget")
        .map(|(k, v)| (k.clone(), v["count"].as_u64().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

const PY_DIRS: &str = r#"
import errno, fcntl, os, sys
d = sys.argv[1] + "/t"
os.makedirs(f"{d}/a/b/c")
os.makedirs(f"{d}/x")
for p in ["a/f1", "a/b/f2", "a/b/c/f3", "x/f4"]:
    with open(f"{d}/{p}", "w") as f:
        f.write(p)
os.symlink("a/b", f"{d}/link")
print("listdir", sorted(os.listdir(d)), sorted(os.listdir(f"{d}/a/")))
print("scandir", sorted((e.name, e.is_dir(follow_symlinks=False)) for e in os.scandir(f"{d}/a")))
for top, dirs, files in sorted(os.walk(d)):
    print("walk", top[len(d):], sorted(dirs), sorted(files))
fd = os.open(f"{d}/a/b", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
print("same inode", os.fstat(fd).st_ino == os.stat(f"{d}/a/b").st_ino, oct(os.fstat(fd).st_mode))
print("flags", oct(fcntl.fcntl(fd, fcntl.F_GETFL) & (os.O_ACCMODE | os.O_DIRECTORY)))
print("cloexec", bool(fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC))
print("listdir fd", sorted(os.listdir(fd)))
print("stat at", os.stat("f2", dir_fd=fd).st_size)
up = os.open("..", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
print("dotdot", os.fstat(up).st_ino == os.stat(f"{d}/a").st_ino, sorted(os.listdir(up)))
upup = os.open("c/../..", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
print("c/../..", os.fstat(upup).st_ino == os.stat(f"{d}/a").st_ino)
os.close(upup)
os.close(up)
g = os.open("c/f3", os.O_RDONLY, dir_fd=fd)
print("open at", os.read(g, 100))
os.close(g)
os.unlink("c/f3", dir_fd=fd)
print("after unlink at", sorted(os.listdir(f"{d}/a/b/c")))
for what, call in [
    ("read dir", lambda: os.read(fd, 1)),
    ("open dir for writing", lambda: os.open(f"{d}/a", os.O_WRONLY)),
    ("O_DIRECTORY of a file", lambda: os.open(f"{d}/a/f1", os.O_RDONLY | os.O_DIRECTORY)),
    ("O_DIRECTORY|O_NOFOLLOW of a symlink", lambda: os.open(f"{d}/link", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)),
    ("opendir of nothing", lambda: os.listdir(f"{d}/nothing")),
    ("opendir of a file", lambda: os.listdir(f"{d}/a/f1")),
]:
    try:
        call()
        print(what, "ok")
    except OSError as e:
        print(what, errno.errorcode[e.errno])
print("through a symlink", sorted(os.listdir(f"{d}/link")))
# A directory descriptor kept across the removal of its directory: no
# entries, as the kernel's.
h = os.open(f"{d}/x", os.O_RDONLY | os.O_DIRECTORY)
os.unlink(f"{d}/x/f4")
os.rmdir(f"{d}/x")
print("removed but open", os.listdir(h), os.path.exists(f"{d}/x"))
os.close(h)
# fchdir needs the kernel's directory: materialized.
os.chdir(fd)
print("fchdir", os.getcwd() == f"{d}/a/b", sorted(os.listdir(".")))
os.chdir("/")
os.close(fd)
sys.stdout.flush()
os.system(f"rm -rf {d}")
print("gone", os.path.exists(d))
"#;

#[test]
fn directories_opened_under_the_library_give_the_kernels_answers() {
    let pool = Pool::new("dirs-same", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let work = tempfile::tempdir().expect("tempdir");
    let py = work.path().join("dirs.py");
    std::fs::write(&py, PY_DIRS).expect("script");
    let stats = stats_file("dirs-same");
    let out = same(
        &format!("{PYTHON} {} {}", py.display(), m.path().display()),
        stats.path(),
    );
    assert!(out.contains("gone False"), "{out}");
    let n = counts(stats.path());
    // Directories opened without the kernel: every listing above, the
    // descriptors, and rm's (at least one per directory).
    assert!(c(&n, "open_local") >= 15, "{n:?}");
    assert!(c(&n, "dir_local") >= 10, "{n:?}");
    // The fchdir, and nothing else.
    assert_eq!(c(&n, "materialized"), 1, "{n:?}");
}

const PY_MAKE: &str = r#"
import os, sys
d = sys.argv[1] + "/w"
for i in range(1, 7):
    os.makedirs(f"{d}/d{i}/e/f")
    for p in [f"{d}/d{i}/e/f/file", f"{d}/d{i}/top"]:
        with open(p, "w") as fh:
            fh.write(f"{i}\n")
"#;

const PY_WALK: &str = r#"
import os, sys
d = sys.argv[1] + "/w"
n = 0
for top, dirs, files in os.walk(d):
    for f in files:
        with open(os.path.join(top, f), "rb") as fh:
            n += len(fh.read())
    n += len(os.listdir(top))
print(n)
"#;

/// A tree made by a preloaded program, then walked, read and removed by
/// others (python, find, ls -R, rm -rf) costs the mount no FUSE request
/// (but find's and rm's statfs, of the mount's root).
#[test]
fn a_tree_walked_and_removed_under_the_library_costs_no_fuse_request() {
    let pool = Pool::new("dirs-walk", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let d = m.path().display().to_string();
    let work = tempfile::tempdir().expect("tempdir");
    let py = work.path().join("walk.py");
    std::fs::write(&py, PY_WALK).expect("script");
    let make = work.path().join("make.py");
    std::fs::write(&make, PY_MAKE).expect("script");
    let stats = stats_file("dirs-walk");
    let (ok, _, err) = sh_run(
        &format!("{PYTHON} {} {d}", make.display()),
        Some(stats.path()),
    );
    assert!(ok, "{err}");
    let before = fuse_requests(m.path());
    let (ok, out, err) = sh_run(
        &format!(
            "set -e; {PYTHON} {} {d}; find {d}/w -type f | wc -l; ls -R {d}/w | wc -l; \
             rm -rf {d}/w; ls {d}",
            py.display()
        ),
        Some(stats.path()),
    );
    assert!(ok, "{err}");
    assert_eq!(out, "54\n12\n67\n", "{out}");
    // find's and rm's statfs of the mount's root: the kernel may look at
    // the root's attributes for it (the ring's changes in the root
    // dropped them): a GETATTR each at most, nothing else.
    let mut after = fuse_requests(m.path());
    let getattr = |m: &BTreeMap<String, u64>| m.get("getattr").copied().unwrap_or(0);
    assert!(
        getattr(&after) <= getattr(&before) + 2,
        "{before:?} -> {after:?}"
    );
    after.remove("getattr");
    let mut before_rest = before.clone();
    before_rest.remove("getattr");
    assert_eq!(
        after, before_rest,
        "FUSE requests for a tree walked, read and removed under the library"
    );
    let n = counts(stats.path());
    assert_eq!(c(&n, "materialized"), 0, "{n:?}");
    assert!(c(&n, "open_local") >= 18 * 3, "{n:?}");
}

const PY_MAP: &str = r#"
import mmap, os, sys
p = sys.argv[1] + "/m"
data = bytes(range(256)) * 40 + b"tail"
with open(p, "wb") as f:
    f.write(data)
fd = os.open(p, os.O_RDONLY)
m = mmap.mmap(fd, 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
print("read-only", len(m), m[:] == data)
m.close()
m = mmap.mmap(fd, 4096, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ, offset=4096)
print("at 4096", len(m), m[:] == data[4096:8192])
m.close()
os.close(fd)
fd = os.open(p, os.O_RDWR)
m = mmap.mmap(fd, 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
m[0:5] = b"XXXXX"
print("private write", m[:5], open(p, "rb").read(5) == data[:5])
m.close()
os.close(fd)
os.unlink(p)
"#;

/// A private mapping of a served file is a copy of its bytes: no kernel
/// open, no READ request; private writes stay private.
#[test]
fn a_private_mapping_of_a_served_file_is_its_bytes_without_the_kernel() {
    let pool = Pool::new("dirs-map", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let work = tempfile::tempdir().expect("tempdir");
    let py = work.path().join("map.py");
    std::fs::write(&py, PY_MAP).expect("script");
    let script = format!("{PYTHON} {} {}", py.display(), m.path().display());
    let stats = stats_file("dirs-map");
    let out = same(&script, stats.path());
    assert_eq!(
        out,
        "read-only 10244 True\nat 4096 4096 True\nprivate write b'XXXXX' True\n"
    );
    let n = counts(stats.path());
    assert_eq!(c(&n, "map_local"), 3, "{n:?}");
    assert_eq!(c(&n, "materialized"), 0, "{n:?}");
    let stats = stats_file("dirs-map-2");
    let before = fuse_requests(m.path());
    let (ok, _, err) = sh_run(&script, Some(stats.path()));
    assert!(ok, "{err}");
    assert_eq!(fuse_requests(m.path()), before, "FUSE requests");
}
