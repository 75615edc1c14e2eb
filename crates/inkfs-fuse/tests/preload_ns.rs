//! Namespace calls of the preload library made by the server through the
//! attach session (docs/KERNEL-FREE.md, "Stage 4"): programs give the same
//! output with and without the library, the calls are served (the
//! library's counters), the mount and other processes see each change at
//! once (the kernel's dentry and attribute caches never show a stale name),
//! and errors are the kernel's, errno for errno, for several users.

mod common;

use std::path::Path;

use common::preload::*;
use common::*;

/// A script that builds, changes and removes a tree with coreutils and
/// python's os calls, printing what it made (nothing time-dependent).
fn tree_script(dir: &str) -> String {
    format!(
        "set -e; rm -rf {dir}; mkdir {dir}; cd {dir}; \
         mkdir -p a/b/c a/d; mkdir a/b/c/e; touch a/f1 a/b/f2; echo hi > a/d/f3; \
         ln a/f1 a/hard; ln -s ../f1 a/b/sym; ln -sf f9 a/sym2; \
         mv a/b/f2 a/d/f2; mv a/d a/dd; chmod -R go-rx a/dd; chmod 4711 a/f1; \
         touch -d '2001-02-03 04:05:06.789' a/f1 a/dd; touch -m -d '1999-01-01' a/b; \
         mkfifo a/fifo; \
         {PYTHON} -c \"import os; os.mkdir('p', 0o700); os.rename('p', 'q'); os.symlink('q', 'ql'); \
os.link('a/dd/f3', 'q/h3'); os.replace('a/hard', 'q/h3'); os.chmod('q', 0o751); \
os.utime('q/h3', ns=(1, 2_000_000_003)); os.rmdir('a/b/c/e'); os.unlink('a/sym2'); \
print(sorted(os.listdir('q')), oct(os.stat('q').st_mode), os.stat('q/h3').st_nlink, os.stat('q/h3').st_mtime_ns)\"; \
         rm -r a/b/c; \
         find . | sort | while read f; do stat -c '%n %A %h %s %F' \"$f\"; done; \
         stat -c '%n %Y' a/f1 a/dd q/h3; \
         readlink a/b/sym ql; cat a/dd/f3; cd /; rm -r {dir}; test ! -e {dir} && echo gone"
    )
}

#[test]
fn namespace_calls_give_the_same_output_and_are_served() {
    let pool = Pool::new("ns-same", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let stats = stats_file("ns-same");
    let dir = m.p("t").display().to_string();
    let out = same(&tree_script(&dir), stats.path());
    assert!(out.ends_with("gone\n"), "{out}");
    assert!(
        out.contains("./a/f1 -rws--x--x 2 0"),
        "chmod 4711 and the hard link: {out}"
    );
    let n = counts(stats.path());
    // mkdir -p (4), mkdir, ln x3, mv x2, chmod -R (4), chmod, mkfifo,
    // python (9), rm -r: at least these.
    assert!(c(&n, "ns_local") >= 30, "namespace calls not served: {n:?}");
    let report = stats_json(m.path()).expect("stats");
    let served = |op: &str| report["ops"][op]["count"].as_u64().unwrap_or(0);
    assert!(served("client_mkdir") >= 5, "{}", report["ops"]);
    assert!(served("client_rename") >= 3, "{}", report["ops"]);
}

/// The mount (a process without the library) and a second preloaded
/// process see each change the first makes at once: no sleeps, and the
/// kernel's negative and positive dentries are dropped before the answer.
#[test]
fn names_changed_by_the_library_are_seen_at_once_by_the_mount_and_others() {
    let pool = Pool::new("ns-coherent", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let stats = stats_file("ns-coherent");
    let d = m.path().display().to_string();
    let lib = lib().display().to_string();
    let pre = format!(
        "LD_PRELOAD={lib} INKFS_PRELOAD_STATS={}",
        stats.path().display()
    );
    // Each line: make the kernel cache the name's state through the mount
    // (stat, ls), change it under the library, look again through the
    // mount and through another preloaded process.
    let script = format!(
        "set -e; cd {d}; \
         for i in 1 2 3 4 5 6 7 8; do \
           ! stat x$i 2>/dev/null; env {pre} mkdir x$i; stat -c '%n %F' x$i; env {pre} stat -c 'lib %n %F' x$i; \
           ls -ld x$i >/dev/null; env {pre} mv x$i y$i; ! stat x$i 2>/dev/null; stat -c '%n %F' y$i; \
           env {pre} ln -s y$i z$i; readlink z$i; ls z$i/. >/dev/null; \
           env {pre} rmdir y$i; ! stat y$i 2>/dev/null; ! ls z$i/. 2>/dev/null; env {pre} sh -c '! stat y$i 2>/dev/null'; \
           echo data > f$i; cat f$i >/dev/null; env {pre} chmod 640 f$i; stat -c '%n %a' f$i; \
           env {pre} rm f$i z$i; ! cat f$i 2>/dev/null; ls; \
         done; echo done"
    );
    let out = sh(&script);
    assert!(out.ends_with("done\n"), "{out}");
    for i in 1..=8 {
        assert!(
            out.contains(&format!("x{i} directory\nlib x{i} directory\n")),
            "{out}"
        );
        assert!(out.contains(&format!("y{i} directory\ny{i}\n")), "{out}");
        assert!(out.contains(&format!("f{i} 640\n")), "{out}");
    }
    let n = counts(stats.path());
    // mkdir, mv, ln -s, rmdir, chmod, rm (2): 7 per round.
    assert!(c(&n, "ns_local") >= 56, "{n:?}");
    assert_eq!(c(&n, "ns_kernel"), 0, "{n:?}");
}

/// Each case prints its errno name (or "ok"); run with and without the
/// library by several users, the outputs must match, case for case.
const PY_ERRNOS: &str = r#"
import errno, os, sys
base = sys.argv[1]
def t(name, f, *a):
    try:
        f(*a); r = "ok"
    except OSError as e:
        r = errno.errorcode.get(e.errno, str(e.errno))
    print(name, r)
me = os.getuid()
w = f"{base}/pub/w{me}"
t("mkdir-own", os.mkdir, w)
t("mkdir-exists", os.mkdir, w)
t("mkdir-missing-parent", os.mkdir, f"{w}/no/x")
open(f"{w}/file", "w").close() if os.path.isdir(w) else None
t("mkdir-under-file", os.mkdir, f"{w}/file/x")
t("unlink-missing", os.unlink, f"{w}/nothing")
t("unlink-dir", os.unlink, w)
t("rmdir-file", os.rmdir, f"{w}/file")
t("rmdir-missing", os.rmdir, f"{w}/nothing")
t("rmdir-nonempty", os.rmdir, w)
t("rmdir-dot", os.rmdir, f"{w}/.")
t("name-too-long", os.mkdir, f"{w}/" + "n" * 256)
t("name-255", os.mkdir, f"{w}/" + "n" * 255)
t("rmdir-255", os.rmdir, f"{w}/" + "n" * 255)
t("symlink-exists", os.symlink, "x", f"{w}/file")
t("symlink-loop", os.symlink, "loop", f"{w}/loop")
t("mkdir-through-loop", os.mkdir, f"{w}/loop/x")
t("link-dir", os.link, w, f"{w}/dirlink")
t("link-exists", os.link, f"{w}/file", f"{w}/file")
t("rename-into-self", os.rename, w, f"{w}/sub")
os.makedirs(f"{w}/full/x", exist_ok=True)
os.makedirs(f"{w}/empty", exist_ok=True)
t("rename-over-nonempty", os.rename, f"{w}/empty", f"{w}/full")
t("rename-file-over-dir", os.rename, f"{w}/file", f"{w}/empty")
t("rename-dir-over-file", os.rename, f"{w}/empty", f"{w}/file")
t("rename-off-mount", os.rename, f"{w}/file", f"/tmp/inkfs-ns-exdev-{me}")
t("rename-missing", os.rename, f"{w}/nothing", f"{w}/x")
t("chmod-root-dir", os.chmod, base, 0o1777)
t("chown-root-dir", os.chown, base, me, -1)
t("utime-root-dir", os.utime, base, (1, 2))
t("utime-now-root-dir", os.utime, base, None)
t("mkdir-in-root-dir", os.mkdir, f"{base}/private/x")
t("unlink-in-private", os.unlink, f"{base}/private/f")
t("unlink-sticky-others", os.unlink, f"{base}/sticky/rootfile")
t("rename-sticky-others", os.rename, f"{base}/sticky/rootfile", f"{base}/sticky/mine")
t("mkdir-sticky", os.mkdir, f"{base}/sticky/d{me}")
t("rmdir-sticky-own", os.rmdir, f"{base}/sticky/d{me}")
t("chmod-others-file", os.chmod, f"{base}/sticky/rootfile", 0o777)
t("symlink-in-private", os.symlink, "x", f"{base}/private/l")
t("rename-exchange", os.rename, f"{w}/full", f"{w}/empty")
t("cleanup", os.system, f"rm -rf {w}")
"#;

#[test]
fn errors_are_the_kernels_for_each_user() {
    require_tool("setpriv", "util-linux");
    let pool = Pool::new("ns-errnos", 64);
    // World read-write: the trust rule admits every user (so their calls
    // are served, not only root's).
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&pool.path, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    // stats=all: other users reach the control socket the attach is on.
    let m = Mounted::new(&pool, "mode=strict,stats=all");
    let base = m.path().display().to_string();
    // Root's fixtures, made again before every run (root's own run
    // removes some of them).
    let setup = || {
        sh(&format!(
            "cd {base} && rm -rf private sticky pub && chmod 755 . && chown 0:0 . && touch -d @5 . && \
             mkdir -m 777 pub && \
             mkdir -m 700 private && touch private/f && \
             mkdir -m 1777 sticky && touch sticky/rootfile && chmod 666 sticky/rootfile"
        ))
    };
    let out = tempfile::tempdir().expect("tempdir");
    let py = out.path().join("errnos.py");
    std::fs::write(&py, PY_ERRNOS).expect("script");
    std::fs::set_permissions(out.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let stats = stats_file("ns-errnos");
    std::fs::set_permissions(stats.path(), std::fs::Permissions::from_mode(0o666)).expect("chmod");
    for (uid, gid) in [(0, 0), (1000, 1000), (1001, 100)] {
        let script = format!(
            "setpriv --reuid={uid} --regid={gid} --clear-groups {PYTHON} {} {base}",
            py.display()
        );
        setup();
        let plain = sh_run(&script, None);
        setup();
        let pre = sh_run(&script, Some(stats.path()));
        assert!(plain.0 && pre.0, "{plain:?} {pre:?}");
        assert_eq!(plain.1, pre.1, "uid {uid}: errors differ under the library");
        let text = pre.1;
        assert!(text.contains("mkdir-exists EEXIST"), "{text}");
        assert!(text.contains("name-too-long ENAMETOOLONG"), "{text}");
        if uid != 0 {
            assert!(text.contains("unlink-sticky-others EPERM"), "{text}");
            assert!(text.contains("mkdir-in-root-dir EACCES"), "{text}");
            assert!(text.contains("chmod-root-dir EPERM"), "{text}");
        }
    }
    let n = counts(stats.path());
    assert!(c(&n, "ns_local") >= 60, "{n:?}");
    assert_eq!(c(&n, "attach_refused"), 0, "{n:?}");
}

/// Requests through the client's API: a create with a write access mode
/// comes with the file's write lease.
#[test]
fn a_create_through_the_session_comes_with_its_lease() {
    use inkfs::api::client::Client;
    use inkfs::api::ns::Op;
    use inkfs::api::{Credentials, ROOT_INO};
    let pool = Pool::new("ns-create-lease", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let client = Client::attach_mountpoint(m.path(), None).expect("attach");
    let me = Credentials::root();
    let create = |name: &[u8], flags: i32| {
        client
            .ns(
                &me,
                Op::Create {
                    dir: ROOT_INO,
                    name: name.to_vec(),
                    mode: 0o644,
                    flags: libc::O_CREAT | flags,
                },
            )
            .expect("asked")
    };
    let d = create(b"w", libc::O_WRONLY);
    assert_eq!(d.errno, 0);
    assert_ne!(d.gen, 0, "a writable create is leased");
    assert!(client.holds_lease(d.ino));
    assert_eq!(client.leases_held(), 1);
    let r = create(b"r", libc::O_RDONLY);
    assert_eq!((r.errno, r.gen), (0, 0), "a read-only create is not leased");
    let again = create(b"w", libc::O_WRONLY | libc::O_EXCL);
    assert_eq!(again.errno, libc::EEXIST);
    // Another client's O_CREAT of the existing name opens it and takes
    // the lease (the first client gives it back); the request's own hold
    // on the inode is over before the grant waits for holds to end.
    let other = Client::attach_mountpoint(m.path(), None).expect("attach");
    let o = other
        .ns(
            &me,
            Op::Create {
                dir: ROOT_INO,
                name: b"w".to_vec(),
                mode: 0o644,
                flags: libc::O_CREAT | libc::O_WRONLY,
            },
        )
        .expect("asked");
    assert_eq!((o.errno, o.ino), (0, d.ino));
    assert!(o.gen > d.gen, "granted anew");
    assert!(other.holds_lease(d.ino));
    assert!(!client.holds_lease(d.ino), "recalled from the first");
    drop(other);
    // The mount sees the file; using it there recalls the lease.
    assert!(Path::new(&m.p("w")).exists());
    std::fs::write(m.p("w"), b"through the mount").expect("write");
    assert!(!client.holds_lease(d.ino), "not held");
}

/// tar x under the library: the same tree (names, modes, owners, sizes,
/// times, link targets) as without it, with each file's futimens, fchown
/// and fchmod made by the client under the lease its writes took.
#[test]
fn tar_extracts_the_same_tree_with_attributes_made_under_the_lease() {
    require_tool("tar", "tar");
    let pool = Pool::new("ns-tar", 128);
    let m = Mounted::new(&pool, "mode=strict");
    let src = repo_root().join("crates/inkfs-preload");
    let work = tempfile::tempdir().expect("tempdir");
    let tar = work.path().join("t.tar");
    sh(&format!(
        "tar -C {} -cf {} . && cd {} && mkdir -p odd && ln -s nowhere odd/dangling && chmod 4755 odd && \
         tar -rf {} odd",
        src.display(),
        tar.display(),
        work.path().display(),
        tar.display()
    ));
    let stats = stats_file("ns-tar");
    let d = m.path().display().to_string();
    let list = "find . -mindepth 1 -printf '%P %m %u %g %s %T@ %y %l\\n' | sort";
    let script = format!(
        "rm -rf {d}/x && mkdir {d}/x && tar -xf {} -C {d}/x && cd {d}/x && {list}",
        tar.display()
    );
    let out = same(&script, stats.path());
    // The tree the library made, seen through the mount (the kernel's
    // caches): the same.
    let kernel_view = sh_run(&format!("cd {d}/x && {list}"), None);
    assert_eq!(kernel_view.1, out, "the mount shows another tree");
    let files = out.lines().filter(|l| l.contains(" f ")).count();
    assert!(files >= 10, "{out}");
    let n = counts(stats.path());
    assert!(
        c(&n, "attr_local") >= 2 * files as u64,
        "tar's attribute changes not made under the lease: {n:?} for {files} files"
    );
    assert!(c(&n, "write_local") >= files as u64, "{n:?}");
}

/// Attribute changes by descriptor under the lease follow the engine's
/// rules for the caller (a user who is not root): the same results with
/// and without the library, and they are made under the lease.
const PY_FDATTRS: &str = r#"
import errno, os, sys
d = sys.argv[1]
def t(name, f, *a):
    try:
        f(*a); r = "ok"
    except OSError as e:
        r = errno.errorcode.get(e.errno, str(e.errno))
    print(name, r)
def tk(name, f, *a, **k):
    try:
        f(*a, **k); r = "ok"
    except OSError as e:
        r = errno.errorcode.get(e.errno, str(e.errno))
    print(name, r)
p = f"{d}/f{os.getuid()}"
fd = os.open(p, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
os.write(fd, b"data")
t("fchmod-setgid", os.fchmod, fd, 0o2755)
tk("futimens", os.utime, fd, ns=(5_000_000_001, 7_000_000_002))
t("fchown-to-root", os.fchown, fd, 0, -1)
t("fchown-other-group", os.fchown, fd, -1, 4242)
t("fchown-own", os.fchown, fd, os.getuid(), os.getgid())
os.write(fd, b"more")
t("chmod-path", os.chmod, p, 0o600)
t("utime-path-now", os.utime, p, None)
st = os.fstat(fd)
print(oct(st.st_mode), st.st_uid == os.getuid(), st.st_size)
print(os.stat(p).st_atime_ns > 5_000_000_001)
os.close(fd)
os.unlink(p)
"#;

#[test]
fn attribute_changes_by_descriptor_follow_the_rules_for_the_caller() {
    require_tool("setpriv", "util-linux");
    let pool = Pool::new("ns-fdattr", 64);
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&pool.path, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let m = Mounted::new(&pool, "mode=strict,stats=all");
    sh(&format!("chmod 1777 {}", m.path().display()));
    let out = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(out.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let py = out.path().join("fdattrs.py");
    std::fs::write(&py, PY_FDATTRS).expect("script");
    let stats = stats_file("ns-fdattr");
    std::fs::set_permissions(stats.path(), std::fs::Permissions::from_mode(0o666)).expect("chmod");
    for (uid, gid) in [(0, 0), (1000, 1000)] {
        let script = format!(
            "setpriv --reuid={uid} --regid={gid} --clear-groups {PYTHON} {} {}",
            py.display(),
            m.path().display()
        );
        let text = same(&script, stats.path());
        if uid != 0 {
            assert!(text.contains("fchown-to-root EPERM"), "{text}");
            assert!(text.contains("fchown-other-group EPERM"), "{text}");
            // A set-group-ID bit of a group the caller is not in: kept,
            // the caller's own group here.
            assert!(text.contains("fchmod-setgid ok"), "{text}");
        }
    }
    let n = counts(stats.path());
    assert!(c(&n, "attr_local") >= 10, "{n:?}");
}

/// Threads of one process through the client's API at once: one client
/// (one slot, one session) shared by all, each thread's requests on a ring
/// it takes for the round trip; every answer is its own request's.
#[test]
fn threads_share_one_client_and_its_rings() {
    use inkfs::api::client::Client;
    use inkfs::api::ns::Op;
    use inkfs::api::ring::RINGS;
    use inkfs::api::{Credentials, ROOT_INO};
    const THREADS: usize = 24;
    const FILES: usize = 20;
    let pool = Pool::new("ns-threads-api", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let client = Client::attach_mountpoint(m.path(), None).expect("attach");
    let me = Credentials::root();
    let made: Vec<Vec<(String, u64)>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..THREADS)
            .map(|t| {
                let (client, me) = (&client, &me);
                s.spawn(move || {
                    (0..FILES)
                        .map(|i| {
                            let name = format!("t{t}-{i}");
                            let d = client
                                .ns(
                                    me,
                                    Op::Create {
                                        dir: ROOT_INO,
                                        name: name.clone().into_bytes(),
                                        mode: 0o644,
                                        flags: libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
                                    },
                                )
                                .expect("asked");
                            assert_eq!(d.errno, 0, "{name}");
                            assert_ne!(d.gen, 0, "{name}: leased");
                            // The inode the engine finds under the name is
                            // the one this thread's answer named.
                            let found = client
                                .lookup(me, ROOT_INO, name.as_bytes())
                                .expect("lookup");
                            assert_eq!(found.ino, d.ino, "{name}");
                            (name, d.ino)
                        })
                        .collect()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("thread")).collect()
    });
    let mut inos: Vec<u64> = made.iter().flatten().map(|&(_, i)| i).collect();
    inos.sort_unstable();
    inos.dedup();
    assert_eq!(inos.len(), THREADS * FILES, "one inode per create");
    assert_eq!(client.leases_held(), THREADS * FILES);
    let served = client.rings_served();
    assert!((1..=RINGS).contains(&served), "{served}");
    for (name, _) in made.iter().flatten() {
        assert!(Path::new(&m.p(name)).exists(), "{name} through the mount");
    }
}

const PY_MANY_THREADS: &str = r#"
import os, sys, threading
m = sys.argv[1]
# More threads than the eight client cells the library had: each creates,
# writes, reads back, renames and removes files of its own.
def work(t):
    d = "%s/d%d" % (m, t)
    os.mkdir(d)
    for i in range(10):
        p = "%s/f%d" % (d, i)
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, b"%d/%d\n" % (t, i) * 100)
        os.close(fd)
        fd = os.open(p, os.O_RDONLY)
        got = os.read(fd, 1 << 16)
        os.close(fd)
        assert got == b"%d/%d\n" % (t, i) * 100, (t, i)
        os.rename(p, p + ".r")
        if i % 2:
            os.unlink(p + ".r")
ts = [threading.Thread(target=work, args=(t,)) for t in range(48)]
[t.start() for t in ts]; [t.join() for t in ts]
print("ready", flush=True)
sys.stdin.read()
"#;

/// 48 threads of one process under the library: every call served (none
/// waits for a client and falls back to the kernel), through one client
/// of the mount (one attach, one slot).
#[test]
fn many_threads_are_served_through_one_client() {
    use std::io::Write;
    let pool = Pool::new("ns-many-threads", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let stats = stats_file("many-threads");
    let mut child = python_when_ready(PY_MANY_THREADS, m.path(), stats.path());
    let report = stats_json(m.path()).expect("statistics");
    assert_eq!(report["clients_attached"].as_u64(), Some(1), "{report}");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"")
        .expect("close");
    assert!(child.wait().expect("wait").success());
    let n = counts(stats.path());
    // 48 mkdirs, 480 creates and opens, 480 renames, 240 unlinks.
    assert!(c(&n, "ns_local") >= 48 + 480 + 480 + 240, "{n:?}");
    assert_eq!(c(&n, "ns_kernel"), 0, "{n:?}");
    assert_eq!(c(&n, "write_kernel"), 0, "{n:?}");
    assert_eq!(c(&n, "read_kernel"), 0, "{n:?}");
    assert_eq!(c(&n, "attach_refused"), 0, "{n:?}");
    for t in 0..48 {
        for i in (0..10).step_by(2) {
            let p = m.p(&format!("d{t}/f{i}.r"));
            let want = format!("{t}/{i}\n").repeat(100);
            assert_eq!(std::fs::read_to_string(&p).expect("read"), want, "{p:?}");
        }
    }
}

/// A request that removes a name of a file the client writes, which the
/// server's engine recalls the lease for, finds it given back first
/// (`Client::ns`); the client writes the file again after (a new grant),
/// and the data, the names and the pool are right after. (Whether the
/// server still sent a recall is not observable here: the test is of the
/// hand-over, the gain is measured by the benchmarks.)
#[test]
fn removing_a_leased_files_name_gives_its_lease_back_first() {
    use inkfs::api::client::Client;
    use inkfs::api::ns::{Done, Op};
    use inkfs::api::{Credentials, OpenFlags, ROOT_INO};
    let pool = Pool::new("ns-give-back", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let client = Client::attach_mountpoint(m.path(), None).expect("attach");
    let me = Credentials::root();
    let ask = |op: Op| -> Done { client.ns(&me, op).expect("asked") };
    let name = |s: &str| s.as_bytes().to_vec();
    let write = |ino: u64, data: &[u8]| {
        let f = client
            .open(&me, ino, OpenFlags::new(libc::O_WRONLY))
            .expect("open");
        client.write(&f, 0, data).expect("write");
        client.release(f);
        assert!(client.holds_lease(ino));
    };
    let made = |n: &str| {
        let d = ask(Op::Create {
            dir: ROOT_INO,
            name: name(n),
            mode: 0o644,
            flags: libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
        });
        assert_eq!(d.errno, 0, "{n}");
        write(d.ino, n.as_bytes());
        d.ino
    };
    let a = made("a");
    let link = ask(Op::Link {
        ino: a,
        dir: ROOT_INO,
        name: name("a2"),
    });
    assert_eq!(link.errno, 0);
    write(a, b"A");
    let gone = ask(Op::Unlink {
        dir: ROOT_INO,
        name: name("a"),
    });
    assert_eq!(gone.errno, 0);
    assert!(!client.holds_lease(a));
    assert_eq!(std::fs::read(m.p("a2")).expect("read"), b"A");
    write(a, b"B");
    let gone = ask(Op::Unlink {
        dir: ROOT_INO,
        name: name("a2"),
    });
    assert_eq!(gone.errno, 0);
    assert!(!client.holds_lease(a));
    // A rename over a leased file, refused (NOREPLACE) then made.
    made("b");
    let c = made("c");
    let rename = |from: &str, to: &str, flags: u32| {
        ask(Op::Rename {
            dir: ROOT_INO,
            name: name(from),
            to_dir: ROOT_INO,
            to: name(to),
            flags,
        })
        .errno
    };
    assert_eq!(rename("b", "c", libc::RENAME_NOREPLACE), libc::EEXIST);
    assert!(!client.holds_lease(c));
    write(c, b"C");
    assert_eq!(rename("b", "c", 0), 0);
    assert!(!client.holds_lease(c), "c's last name went");
    assert_eq!(std::fs::read(m.p("c")).expect("read"), b"b");
    assert!(!m.p("b").exists());
    drop(client);
    drop(m);
    fsck_clean(&pool);
}

/// Two answers the permission table under the library found wrong
/// (permissions.rs, `permission_table_through_the_library`): an open with
/// `O_RDONLY|O_TRUNC` truncates (Linux does, given write permission), and
/// a write by a user without CAP_FSETID drops the file's set-user-ID and
/// set-group-ID bits (root's write keeps them), as through the kernel.
#[test]
fn rdonly_trunc_truncates_and_unprivileged_writes_drop_set_id_bits() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    require_tool("setpriv", "util-linux");
    let pool = Pool::new("ns-trunc-setid", 64);
    // Every user attaches (as in the errno test above).
    std::fs::set_permissions(&pool.path, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let m = Mounted::new(&pool, "mode=strict,stats=all");
    let stats = stats_file("ns-trunc-setid");
    std::fs::set_permissions(stats.path(), std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let base = m.path().display().to_string();
    for (uid, gid, mode) in [(0, 0, 0o106777), (1000, 1000, 0o100777)] {
        for lib in [false, true] {
            sh(&format!(
                "cd {base} && rm -rf t && mkdir -m 777 t && echo data > t/trunc && chmod 666 t/trunc && \
                 echo data > t/setid && chmod 6777 t/setid"
            ));
            let script = format!(
                "cd {base} && setpriv --reuid={uid} --regid={gid} --clear-groups {PYTHON} -c \"import os
os.close(os.open('t/trunc', os.O_RDONLY | os.O_TRUNC))
fd = os.open('t/setid', os.O_WRONLY); os.write(fd, b'x'); os.close(fd)
print(os.stat('t/trunc').st_size, oct(os.stat('t/setid').st_mode))\""
            );
            let (ok, out, err) = sh_run(&script, lib.then(|| stats.path()));
            assert!(ok, "uid {uid}, library {lib}: {err}");
            assert_eq!(out, format!("0 {mode:#o}\n"), "uid {uid}, library {lib}");
            // And the mount (no library) agrees.
            let size = std::fs::metadata(m.p("t/trunc")).expect("stat").len();
            let setid = std::fs::metadata(m.p("t/setid")).expect("stat").mode();
            assert_eq!((size, setid), (0, mode), "uid {uid}, library {lib}");
        }
    }
    let n = counts(stats.path());
    assert_eq!(c(&n, "attach_refused"), 0, "{n:?}");
    assert!(c(&n, "open_local") >= 4, "opens not served: {n:?}");
    assert!(c(&n, "write_local") >= 2, "writes not served: {n:?}");
}

/// A directory the kernel holds (a process without the library has it
/// open) and a preloaded `rmdir` removes keeps its inode, as when the
/// kernel removes it (the server's `pin_victim`): the number is not
/// reused, and an fchmod through the kernel's descriptor changes that
/// directory, not a new file. Found running roundtrips.rs's
/// `a_removed_directory_held_open_is_still_itself` under the library: the
/// server's namespace request freed the directory at once; it now pins it
/// while the kernel's lookup count of it is above zero
/// (crates/inkfs-fuse/src/kernel_refs.rs), until the FORGET.
#[test]
fn a_directory_the_kernel_holds_outlives_its_rmdir_under_the_library() {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let pool = Pool::new("ns-held-dir", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let stats = stats_file("ns-held-dir");
    std::fs::create_dir(m.p("d")).expect("mkdir");
    let held = std::fs::File::open(m.p("d")).expect("open the directory");
    let ino = held.metadata().expect("fstat").ino();
    let (ok, _, err) = sh_run(&format!("rmdir {}", m.p("d").display()), Some(stats.path()));
    assert!(ok, "{err}");
    assert_eq!(c(&counts(stats.path()), "ns_local"), 1, "rmdir not served");
    for i in 0..8 {
        let p = m.p(&format!("n{i}"));
        std::fs::write(&p, b"x").expect("write");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let n = std::fs::metadata(&p).expect("stat").ino();
        assert_ne!(n, ino, "n{i} took the number of a directory still open");
    }
    // SAFETY: fchmod on an open descriptor.
    let r = unsafe { libc::fchmod(held.as_raw_fd(), 0o700) };
    assert_eq!(r, 0, "fchmod: {}", std::io::Error::last_os_error());
    let md = held.metadata().expect("fstat");
    assert_eq!((md.mode() & 0o7777, md.nlink()), (0o700, 0));
}

/// Free blocks and inodes in use on the mount (statfs through the mount:
/// the server's counts).
fn space(mnt: &Path) -> (u64, u64) {
    let c = std::ffi::CString::new(mnt.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: all-zero is a valid statvfs; the kernel fills it.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and our buffer.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    (st.f_bfree, st.f_files - st.f_ffree)
}

fn report_count(mnt: &Path, key: &str) -> u64 {
    let r = stats_json(mnt).expect("statistics of the mount");
    r[key].as_u64().unwrap_or_else(|| panic!("no {key} in {r}"))
}

/// Removals of files the process wrote give each file's write lease back
/// with the request itself (docs/KERNEL-FREE.md, "Built: a removal
/// carries its lease"): no `released` line on the session, one give per
/// file for unlinks and for both files of a rename over another (then
/// read, not written: its unlink has no lease to give); the
/// files rewritten in place first (strict mode's copy-on-write displaces
/// blocks, whose `return` lines the server reads before it settles the
/// lease), and after it all the inodes and the space come back and the
/// pool is clean.
#[test]
fn removals_give_the_lease_back_with_the_request() {
    let pool = Pool::new("ns-give", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let stats = stats_file("ns-give");
    let dir = m.p("g");
    std::fs::create_dir(&dir).expect("mkdir");
    let (blocks_before, inodes_before) = space(m.path());
    let (released, given, dirs_recalled) = (
        report_count(m.path(), "leases_released"),
        report_count(m.path(), "leases_given_with_requests"),
        report_count(m.path(), "dir_leases_recalled"),
    );
    let script = format!(
        "{PYTHON} -c \"import os
d = '{}'
for i in range(40):
    fd = os.open(f'{{d}}/f{{i}}', os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, b'a' * 20000)
    os.pwrite(fd, b'b' * 6000, 3000)
    os.close(fd)
for i in range(30):
    os.unlink(f'{{d}}/f{{i}}')
for i in range(30, 40, 2):
    os.rename(f'{{d}}/f{{i}}', f'{{d}}/f{{i + 1}}')
for i in range(31, 40, 2):
    assert open(f'{{d}}/f{{i}}', 'rb').read(3001)[2999:] == b'ab'
    os.unlink(f'{{d}}/f{{i}}')
assert os.listdir(d) == []\"",
        dir.display()
    );
    // 40 creates, 30 unlinks, 5 renames, 5 unlinks.
    preloaded(&script, stats.path(), 80);
    // Each unlink's file, both files of each rename; the renamed files'
    // leases went back with the renames, so their unlinks give none. With
    // the library's ask on, unlinks of files the process holds count
    // toward asking for the directory's lease (docs/KERNEL-FREE.md,
    // "Built: mkdir under a directory lease"), and those made under it
    // end the file's lease in the client (`lane_unlinks`, told at the
    // directory's give-back, read by the session's thread: a bounded
    // wait): each removal either carries its give or is made locally.
    let given_now = || report_count(m.path(), "leases_given_with_requests") - given;
    if lib_asks_dir_leases() {
        let t = std::time::Instant::now();
        while given_now() + report_count(m.path(), "lane_unlinks") < 30 + 2 * 5 {
            assert!(
                t.elapsed() < inkfs::testkit::WAIT_LIMIT,
                "gives: {}",
                given_now()
            );
            std::thread::yield_now();
        }
        assert_eq!(
            given_now() + report_count(m.path(), "lane_unlinks"),
            30 + 2 * 5,
            "leases given back with the removals, or removed locally"
        );
    } else {
        assert_eq!(
            given_now(),
            30 + 2 * 5,
            "leases given back with the removals"
        );
    }
    // The directory's leases the library asked for (its unlinks recall
    // them) are given back on the session: no file's is.
    assert_eq!(
        report_count(m.path(), "leases_released") - released,
        report_count(m.path(), "dir_leases_recalled") - dirs_recalled,
        "no file's lease given back on the session"
    );
    assert_eq!(report_count(m.path(), "leases_held"), 0);
    let t = std::time::Instant::now();
    loop {
        let (blocks, inodes) = space(m.path());
        // The directory's log may keep a page it grew by.
        if inodes == inodes_before && blocks_before.saturating_sub(blocks) < 16 {
            break;
        }
        assert!(
            t.elapsed() < inkfs::testkit::WAIT_LIMIT,
            "space not back: blocks {blocks_before} -> {blocks}, inodes {inodes_before} -> {inodes}"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    drop(m);
    fsck_clean(&pool);
}
