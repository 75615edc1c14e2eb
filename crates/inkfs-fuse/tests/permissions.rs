//! The permission table (crates/inkfs/tests/common/perm_table.rs) through
//! the FUSE mount, each operation made by a real process running as the
//! table's user (a child of this test that drops to that uid, gid and
//! groups): the answers must be the ones the engine gives through its API
//! (crates/inkfs/tests/permissions.rs), which are Linux's. And the same
//! table through the preload library (the child runs with `LD_PRELOAD`),
//! each answer also compared with the same call through the kernel on a
//! twin of the case's tree. Needs root.

mod common;

#[path = "../../inkfs/tests/common/perm_table.rs"]
mod perm_table;

use std::ffi::CString;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

use common::*;
use perm_table::*;

const CHILD_ENV: &str = "INKFS_PERM_CHILD";

fn c(p: &Path) -> CString {
    CString::new(p.as_os_str().as_encoded_bytes()).unwrap()
}

fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// 0, or the errno of the failing call.
fn rc(r: libc::c_int) -> i32 {
    if r < 0 {
        last_errno()
    } else {
        0
    }
}

/// Run `op` under `base` with plain system calls (this process's
/// credentials): 0 or the errno.
fn run(base: &Path, op: Op) -> i32 {
    let p = |rel: &str| c(&base.join(rel));
    // SAFETY: every call gets NUL-terminated paths that live across the
    // call, and buffers of the sizes passed.
    unsafe {
        match op {
            Op::Open(rel, flags) => {
                let fd = libc::open(p(rel).as_ptr(), flags);
                if fd < 0 {
                    return last_errno();
                }
                libc::close(fd);
                0
            }
            Op::Create(rel, mode) => {
                let flags = libc::O_CREAT | libc::O_WRONLY | libc::O_EXCL;
                let fd = libc::open(p(rel).as_ptr(), flags, mode);
                if fd < 0 {
                    return last_errno();
                }
                libc::close(fd);
                0
            }
            Op::CreateMasked(rel, mode, umask) => {
                let old = libc::umask(umask);
                let e = run(base, Op::Create(rel, mode));
                libc::umask(old);
                e
            }
            Op::MkdirMasked(rel, mode, umask) => {
                let old = libc::umask(umask);
                let e = rc(libc::mkdir(p(rel).as_ptr(), mode));
                libc::umask(old);
                e
            }
            Op::Stat(rel) => {
                let mut st: libc::stat = std::mem::zeroed();
                rc(libc::stat(p(rel).as_ptr(), &mut st))
            }
            Op::Access(rel, mask) => rc(libc::access(p(rel).as_ptr(), mask as i32)),
            Op::Unlink(rel) => rc(libc::unlink(p(rel).as_ptr())),
            Op::Rmdir(rel) => rc(libc::rmdir(p(rel).as_ptr())),
            Op::Mkdir(rel, mode) => rc(libc::mkdir(p(rel).as_ptr(), mode)),
            Op::Rename(a, b) => rc(libc::rename(p(a).as_ptr(), p(b).as_ptr())),
            Op::Link(a, b) => rc(libc::link(p(a).as_ptr(), p(b).as_ptr())),
            Op::Symlink(target, rel) => {
                let t = CString::new(target).unwrap();
                rc(libc::symlink(t.as_ptr(), p(rel).as_ptr()))
            }
            Op::Mknod(rel, mode, rdev) => rc(libc::mknod(p(rel).as_ptr(), mode, rdev)),
            Op::Chmod(rel, mode) => rc(libc::chmod(p(rel).as_ptr(), mode)),
            Op::Chown(rel, uid, gid) => rc(libc::chown(
                p(rel).as_ptr(),
                uid.unwrap_or(u32::MAX),
                gid.unwrap_or(u32::MAX),
            )),
            Op::Utimes(rel, explicit) => {
                let t = if explicit {
                    libc::timespec {
                        tv_sec: 1,
                        tv_nsec: 0,
                    }
                } else {
                    libc::timespec {
                        tv_sec: 0,
                        tv_nsec: libc::UTIME_NOW,
                    }
                };
                let times = [t, t];
                rc(libc::utimensat(
                    libc::AT_FDCWD,
                    p(rel).as_ptr(),
                    times.as_ptr(),
                    0,
                ))
            }
            Op::Truncate(rel, size) => rc(libc::truncate(p(rel).as_ptr(), size as i64)),
            Op::SetXattr(rel, name) => {
                let n = CString::new(name).unwrap();
                rc(libc::setxattr(
                    p(rel).as_ptr(),
                    n.as_ptr(),
                    b"x".as_ptr().cast(),
                    1,
                    0,
                ))
            }
            Op::GetXattr(rel, name) => {
                let n = CString::new(name).unwrap();
                let mut buf = [0u8; 64];
                let r = libc::getxattr(p(rel).as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), 64);
                if r < 0 {
                    last_errno()
                } else {
                    0
                }
            }
            Op::RemoveXattr(rel, name) => {
                let n = CString::new(name).unwrap();
                rc(libc::removexattr(p(rel).as_ptr(), n.as_ptr()))
            }
            Op::ReadDir(rel) => {
                let d = libc::opendir(p(rel).as_ptr());
                if d.is_null() {
                    return last_errno();
                }
                while !libc::readdir(d).is_null() {}
                libc::closedir(d);
                0
            }
            Op::Write(rel) => {
                let fd = libc::open(p(rel).as_ptr(), libc::O_WRONLY);
                if fd < 0 {
                    return last_errno();
                }
                let r = libc::write(fd, b"x".as_ptr().cast(), 1);
                let e = if r < 0 { last_errno() } else { 0 };
                libc::close(fd);
                e
            }
        }
    }
}

/// Not a test by itself: the child that drops to a table user and runs one
/// case (returns at once unless `INKFS_PERM_CHILD` is set).
#[test]
fn perm_child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut parts = spec.splitn(3, '|');
    let case: usize = parts.next().unwrap().parse().unwrap();
    let who: usize = parts.next().unwrap().parse().unwrap();
    let base = Path::new(parts.next().unwrap());
    let (uid, gid, groups) = WHO[who].ids();
    // SAFETY: plain credential system calls on this process, which runs
    // nothing else (the harness thread waits for this test).
    unsafe {
        assert_eq!(libc::setgroups(groups.len(), groups.as_ptr()), 0);
        assert_eq!(libc::setgid(gid), 0);
        assert_eq!(libc::setuid(uid), 0);
        libc::umask(UMASK);
    }
    let e = run(base, CASES[case].op);
    println!("ERRNO {e}");
}

/// Build `tree` under `base` as root: contents, an xattr, owner, mode.
fn build(base: &Path, tree: &[Node]) {
    std::fs::create_dir(base).unwrap();
    std::fs::set_permissions(base, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    for n in tree {
        let path = base.join(n.path);
        if n.dir {
            std::fs::create_dir(&path).unwrap();
        } else {
            std::fs::write(&path, CONTENT).unwrap();
            let name = CString::new(XATTR.0).unwrap();
            // SAFETY: NUL-terminated strings and a buffer of the given size.
            let r = unsafe {
                libc::setxattr(
                    c(&path).as_ptr(),
                    name.as_ptr(),
                    XATTR.1.as_ptr().cast(),
                    XATTR.1.len(),
                    0,
                )
            };
            assert_eq!(r, 0, "setxattr {}", path.display());
        }
        std::os::unix::fs::chown(&path, Some(n.uid), Some(n.gid)).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(n.mode))
            .unwrap();
    }
}

fn check(base: &Path, who: Who, check: Check) -> Option<String> {
    let meta = |p: &str| std::fs::symlink_metadata(base.join(p)).unwrap();
    match check {
        Check::None => None,
        Check::Gid(p, gid) => {
            let want = gid.unwrap_or(who.ids().1);
            let got = meta(p).gid();
            (got != want).then(|| format!("{p}: gid {got}, expected {want}"))
        }
        Check::Mode(p, non_root, root_mode) => {
            let want = if who == Who::Root {
                root_mode
            } else {
                non_root
            };
            let got = meta(p).mode() & 0o7777;
            (got != want).then(|| format!("{p}: mode {got:o}, expected {want:o}"))
        }
    }
}

/// With the kernel checking first (`default_permissions`, the default).
#[test]
fn permission_table_through_the_mount() {
    permission_table("perm-kernel", "", false);
}

/// With the engine alone deciding (`nodefault_permissions`): the kernel
/// passes every request on, as a front end without a kernel would. Without
/// `default_permissions` FUSE checks nothing on a path walk through cached
/// names (fuse_permission), so the names the build step cached are dropped
/// before each case runs: every lookup then reaches the engine.
#[test]
fn permission_table_through_the_mount_engine_alone() {
    permission_table("perm-engine", "nodefault_permissions", false);
}

/// Through the preload library, as root and the table's three other users
/// (owner, group member through a supplementary group, anyone else): each
/// case's child runs with `LD_PRELOAD`, its opens, creates, namespace and
/// attribute calls served by the library (the client's requests, or the
/// lease holder's own log entries) with the child's credentials and
/// umask. The answer must be the table's, the same as the kernel's on a
/// twin of the tree (the child without the library), and the after-checks
/// (groups, modes) must hold through the mount. The pool is world
/// read-write and the control socket open to all (`stats=all`), so the
/// trust rule admits every user: the library's counters must show each
/// user attached and served. In strict mode whatever the run's base
/// options (a posix-mode server refuses every attach).
#[test]
fn permission_table_through_the_library() {
    permission_table("perm-library", "mode=strict,stats=all", true);
}

/// Forget every cached name and inode, so path walks ask the server.
fn drop_cached_names() {
    std::fs::write("/proc/sys/vm/drop_caches", "2").expect("drop_caches (needs root)");
}

/// Run case `i` as `w` in a child of this test binary (with the library
/// when `stats` names its counters file): the child's errno.
fn child_errno(i: usize, w: usize, base: &Path, stats: Option<&Path>) -> i32 {
    let me = std::env::current_exe().unwrap();
    let mut cmd = Command::new(&me);
    cmd.args(["--exact", "perm_child", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, format!("{i}|{w}|{}", base.display()))
        .env_remove("LD_PRELOAD");
    if let Some(stats) = stats {
        cmd.env("LD_PRELOAD", common::preload::lib())
            .env("INKFS_PRELOAD_STATS", stats);
    }
    let out = cmd.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        // The harness may print its own words before ours.
        .find_map(|l| l.split("ERRNO ").nth(1))
        .and_then(|e| e.trim().parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "{}: {:?}: no answer from the child:\n{text}\n{}",
                CASES[i].name,
                WHO[w],
                String::from_utf8_lossy(&out.stderr)
            )
        })
}

fn permission_table(tag: &str, opts: &str, library: bool) {
    use std::os::unix::fs::PermissionsExt;
    require_root();
    let pool = Pool::new(tag, 128);
    // Under the library: a pool every user may map (the trust rule).
    if library {
        std::fs::set_permissions(&pool.path, std::fs::Permissions::from_mode(0o666)).unwrap();
    }
    let m = Mounted::new(&pool, opts);
    // Each user's counters in a file of its own, in a directory that is
    // not sticky (protected_regular would refuse a user's O_CREAT of a
    // file another made in /tmp).
    let stats_dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(stats_dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let stats: Vec<std::path::PathBuf> = (0..WHO.len())
        .map(|w| {
            let p = stats_dir.path().join(format!("who-{w}"));
            std::fs::write(&p, b"").unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o666)).unwrap();
            p
        })
        .collect();
    let mut wrong = Vec::new();
    for (i, case) in CASES.iter().enumerate() {
        for w in 0..WHO.len() {
            build(&m.path().join(format!("c{i}-{w}")), case.tree);
            if library {
                build(&m.path().join(format!("k{i}-{w}")), case.tree);
            }
        }
        if opts.contains("nodefault_permissions") {
            drop_cached_names();
        }
        for (w, &who) in WHO.iter().enumerate() {
            let base = m.path().join(format!("c{i}-{w}"));
            let got = child_errno(i, w, &base, library.then(|| stats[w].as_path()));
            let want = case.expect[w];
            if library {
                let twin = m.path().join(format!("k{i}-{w}"));
                let kernel = child_errno(i, w, &twin, None);
                if got != kernel {
                    wrong.push(format!(
                        "{}: {who:?} got errno {got} under the library, {kernel} through the kernel",
                        case.name
                    ));
                    continue;
                }
                if kernel == 0 {
                    if let Some(why) = check(&twin, who, case.check) {
                        wrong.push(format!("{}: {who:?} through the kernel: {why}", case.name));
                    }
                }
            }
            if got != want {
                wrong.push(format!(
                    "{}: {who:?} got errno {got}, expected {want}",
                    case.name
                ));
            } else if got == 0 {
                if let Some(why) = check(&base, who, case.check) {
                    wrong.push(format!("{}: {who:?}: {why}", case.name));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    if library {
        let mut all = std::collections::BTreeMap::new();
        for (w, who) in WHO.iter().enumerate() {
            let n = common::preload::counts(&stats[w]);
            let served: u64 = n
                .iter()
                .filter(|(k, _)| k.ends_with("_local"))
                .map(|(_, v)| v)
                .sum();
            assert_eq!(
                common::preload::c(&n, "attach_refused"),
                0,
                "{who:?}: {n:?}"
            );
            assert!(served > 0, "{who:?}: nothing served by the library: {n:?}");
            for (k, v) in n {
                *all.entry(k).or_insert(0) += v;
            }
        }
        eprintln!("permission table under the library: {all:?}");
        // Each kind of call the table makes: opens and creates, namespace
        // and attribute requests (chmod, chown, utimens: through the
        // server, as no case's child holds the inode's lease), stats,
        // listings and writes.
        for key in [
            "open_local",
            "ns_local",
            "stat_local",
            "dir_local",
            "write_local",
        ] {
            assert!(common::preload::c(&all, key) > 0, "{key}: {all:?}");
        }
    }
}
