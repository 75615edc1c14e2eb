//! End-to-end tests of the FUSE front end over the real engine (and, for
//! the POSIX walk, over the in-memory reference engine too, so a failure
//! can be pinned on the front end or on the engine). Root required; see
//! tests/common/mod.rs for the tools they need.

mod common;

use std::ffi::CString;
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("no NUL in test paths")
}

fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// A walk through the POSIX operations, with errno checks.
fn posix_walk(root: &Path) {
    let m = Root(root);
    // create / write / read / overwrite / append
    fs::write(m.p("f"), b"hello world").unwrap();
    assert_eq!(fs::read(m.p("f")).unwrap(), b"hello world");
    {
        let mut f = fs::OpenOptions::new().write(true).open(m.p("f")).unwrap();
        f.seek(SeekFrom::Start(6)).unwrap();
        f.write_all(b"WORLD").unwrap();
        f.sync_all().unwrap();
    }
    assert_eq!(fs::read(m.p("f")).unwrap(), b"hello WORLD");
    {
        let mut f = fs::OpenOptions::new().append(true).open(m.p("f")).unwrap();
        f.write_all(b"!!").unwrap();
    }
    assert_eq!(fs::read(m.p("f")).unwrap(), b"hello WORLD!!");
    // O_TRUNC on open
    fs::write(m.p("f"), b"short").unwrap();
    assert_eq!(fs::read(m.p("f")).unwrap(), b"short");
    // O_EXCL on an existing file
    let e = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(m.p("f"))
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EEXIST));
    // truncate up and down
    let f = fs::OpenOptions::new().write(true).open(m.p("f")).unwrap();
    f.set_len(100_000).unwrap();
    assert_eq!(fs::metadata(m.p("f")).unwrap().len(), 100_000);
    f.set_len(3).unwrap();
    drop(f);
    assert_eq!(fs::read(m.p("f")).unwrap(), b"sho");

    // directories
    fs::create_dir(m.p("d")).unwrap();
    fs::create_dir_all(m.p("d/e/f")).unwrap();
    assert_eq!(fs::metadata(m.p("d")).unwrap().nlink(), 3);
    assert_eq!(
        fs::remove_dir(m.p("d/e")).unwrap_err().raw_os_error(),
        Some(libc::ENOTEMPTY)
    );
    assert_eq!(
        fs::create_dir(m.p("d")).unwrap_err().raw_os_error(),
        Some(libc::EEXIST)
    );
    assert_eq!(
        fs::read(m.p("nope")).unwrap_err().raw_os_error(),
        Some(libc::ENOENT)
    );
    assert_eq!(
        fs::read_dir(m.p("f")).unwrap_err().raw_os_error(),
        Some(libc::ENOTDIR)
    );
    assert_eq!(
        fs::remove_file(m.p("d")).unwrap_err().raw_os_error(),
        Some(libc::EISDIR)
    );
    // a directory with many entries (readdir resumption)
    for i in 0..600 {
        fs::write(m.p(&format!("d/many-{i:04}")), i.to_string()).unwrap();
    }
    let mut names: Vec<String> = fs::read_dir(m.p("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names.len(), 601);
    assert_eq!(names[0], "e");

    // rename: plain, over an existing file, noreplace, exchange
    fs::write(m.p("r1"), b"one").unwrap();
    fs::write(m.p("r2"), b"two").unwrap();
    fs::rename(m.p("r1"), m.p("d/r1")).unwrap();
    fs::rename(m.p("d/r1"), m.p("r2")).unwrap();
    assert_eq!(fs::read(m.p("r2")).unwrap(), b"one");
    fs::write(m.p("r3"), b"three").unwrap();
    let (a, b) = (cpath(&m.p("r2")), cpath(&m.p("r3")));
    // SAFETY: valid NUL-terminated paths; AT_FDCWD with absolute paths.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    assert_eq!((rc, last_errno()), (-1, libc::EEXIST));
    // SAFETY: as above.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    assert_eq!(rc, 0, "RENAME_EXCHANGE: errno {}", last_errno());
    assert_eq!(fs::read(m.p("r2")).unwrap(), b"three");
    assert_eq!(fs::read(m.p("r3")).unwrap(), b"one");
    assert_eq!(
        fs::rename(m.p("d"), m.p("d/e/inside"))
            .unwrap_err()
            .raw_os_error(),
        Some(libc::EINVAL)
    );

    // hard links
    fs::hard_link(m.p("r3"), m.p("d/r3-link")).unwrap();
    assert_eq!(fs::metadata(m.p("r3")).unwrap().nlink(), 2);
    assert_eq!(
        fs::metadata(m.p("r3")).unwrap().ino(),
        fs::metadata(m.p("d/r3-link")).unwrap().ino()
    );
    fs::remove_file(m.p("r3")).unwrap();
    assert_eq!(fs::metadata(m.p("d/r3-link")).unwrap().nlink(), 1);
    assert_eq!(fs::read(m.p("d/r3-link")).unwrap(), b"one");
    assert_eq!(
        fs::hard_link(m.p("d"), m.p("dlink"))
            .unwrap_err()
            .raw_os_error(),
        Some(libc::EPERM)
    );

    // symlinks
    std::os::unix::fs::symlink("d/r3-link", m.p("sym")).unwrap();
    assert_eq!(fs::read_link(m.p("sym")).unwrap(), Path::new("d/r3-link"));
    assert_eq!(fs::read(m.p("sym")).unwrap(), b"one");
    assert!(fs::symlink_metadata(m.p("sym"))
        .unwrap()
        .file_type()
        .is_symlink());

    // unlinked but open file stays readable
    {
        let mut f = fs::File::open(m.p("r2")).unwrap();
        fs::remove_file(m.p("r2")).unwrap();
        let mut s = String::new();
        f.read_to_string(&mut s).unwrap();
        assert_eq!(s, "three");
    }

    // special files
    let fifo = cpath(&m.p("fifo"));
    // SAFETY: valid path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    assert!(fs::metadata(m.p("fifo")).unwrap().file_type().is_fifo());
    let dev = cpath(&m.p("null-dev"));
    // SAFETY: valid path; creating (not opening) a device node.
    let rc = unsafe { libc::mknod(dev.as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(1, 3)) };
    assert_eq!(rc, 0, "mknod chr: errno {}", last_errno());
    let md = fs::metadata(m.p("null-dev")).unwrap();
    assert!(md.file_type().is_char_device());
    assert_eq!(md.rdev(), libc::makedev(1, 3));
    let sock = std::os::unix::net::UnixListener::bind(m.p("sock"));
    assert!(sock.is_ok(), "bind a unix socket: {sock:?}");
    assert!(fs::metadata(m.p("sock")).unwrap().file_type().is_socket());

    // attributes: chmod, chown, utimens with UTIME_OMIT / UTIME_NOW
    fs::set_permissions(m.p("f"), fs::Permissions::from_mode(0o640)).unwrap();
    assert_eq!(fs::metadata(m.p("f")).unwrap().mode() & 0o7777, 0o640);
    std::os::unix::fs::chown(m.p("f"), Some(1234), Some(5678)).unwrap();
    let md = fs::metadata(m.p("f")).unwrap();
    assert_eq!((md.uid(), md.gid()), (1234, 5678));
    let fpath = cpath(&m.p("f"));
    let times = [
        libc::timespec {
            tv_sec: 1_000_000_000,
            tv_nsec: 123,
        },
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
    ];
    // SAFETY: valid path and a two-element timespec array.
    assert_eq!(
        unsafe { libc::utimensat(libc::AT_FDCWD, fpath.as_ptr(), times.as_ptr(), 0) },
        0
    );
    let md2 = fs::metadata(m.p("f")).unwrap();
    assert_eq!((md2.atime(), md2.atime_nsec()), (1_000_000_000, 123));
    assert_eq!(
        (md2.mtime(), md2.mtime_nsec()),
        (md.mtime(), md.mtime_nsec())
    );
    let times = [
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
    ];
    // SAFETY: as above.
    assert_eq!(
        unsafe { libc::utimensat(libc::AT_FDCWD, fpath.as_ptr(), times.as_ptr(), 0) },
        0
    );
    let md3 = fs::metadata(m.p("f")).unwrap();
    assert_eq!(md3.atime(), 1_000_000_000);
    assert!(md3.mtime() >= md.mtime());

    // xattrs, with size probing and ERANGE
    let name = CString::new("user.color").unwrap();
    // SAFETY: valid path, name and value buffers for the given lengths.
    let rc =
        unsafe { libc::setxattr(fpath.as_ptr(), name.as_ptr(), b"blue".as_ptr().cast(), 4, 0) };
    assert_eq!(rc, 0, "setxattr: errno {}", last_errno());
    // SAFETY: a null buffer with size 0 asks for the size.
    let n = unsafe { libc::getxattr(fpath.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) };
    assert_eq!(n, 4);
    let mut small = [0u8; 2];
    // SAFETY: buffer of 2 bytes, size 2.
    let n = unsafe { libc::getxattr(fpath.as_ptr(), name.as_ptr(), small.as_mut_ptr().cast(), 2) };
    assert_eq!((n, last_errno()), (-1, libc::ERANGE));
    let mut buf = [0u8; 64];
    // SAFETY: buffer of 64 bytes, size 64.
    let n = unsafe { libc::getxattr(fpath.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), 64) };
    assert_eq!(&buf[..n as usize], b"blue");
    // SAFETY: as above.
    let n = unsafe { libc::listxattr(fpath.as_ptr(), buf.as_mut_ptr().cast(), 64) };
    assert_eq!(&buf[..n as usize], b"user.color\0");
    // SAFETY: valid path and name; XATTR_CREATE on an existing name.
    let rc = unsafe {
        libc::setxattr(
            fpath.as_ptr(),
            name.as_ptr(),
            b"red".as_ptr().cast(),
            3,
            libc::XATTR_CREATE,
        )
    };
    assert_eq!((rc, last_errno()), (-1, libc::EEXIST));
    // SAFETY: valid path and name.
    assert_eq!(
        unsafe { libc::removexattr(fpath.as_ptr(), name.as_ptr()) },
        0
    );
    // SAFETY: as above.
    let n = unsafe { libc::getxattr(fpath.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), 64) };
    assert_eq!((n, last_errno()), (-1, libc::ENODATA));

    // sparse files: fallocate, punch hole, SEEK_DATA / SEEK_HOLE
    {
        let f = fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(m.p("sparse"))
            .unwrap();
        f.set_len(8 << 20).unwrap();
        assert!(
            fs::metadata(m.p("sparse")).unwrap().blocks() < 64,
            "truncate-extended file is sparse"
        );
        use std::os::unix::fs::FileExt;
        f.write_all_at(&[7u8; 4096], 4 << 20).unwrap();
        use std::os::fd::AsRawFd;
        // SAFETY: valid descriptor.
        let data = unsafe { libc::lseek(f.as_raw_fd(), 0, libc::SEEK_DATA) };
        assert_eq!(data, 4 << 20);
        // SAFETY: valid descriptor.
        let hole = unsafe { libc::lseek(f.as_raw_fd(), 4 << 20, libc::SEEK_HOLE) };
        assert_eq!(hole, (4 << 20) + 4096);
        // SAFETY: valid descriptor.
        assert_eq!(unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, 1 << 20) }, 0);
        assert!(
            fs::metadata(m.p("sparse")).unwrap().blocks() >= 2048,
            "fallocate allocates"
        );
        // SAFETY: valid descriptor.
        let rc = unsafe {
            libc::fallocate(
                f.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                4 << 20,
                4096,
            )
        };
        assert_eq!(rc, 0, "punch hole: errno {}", last_errno());
        let mut b = [1u8; 16];
        f.read_exact_at(&mut b, 4 << 20).unwrap();
        assert_eq!(b, [0u8; 16]);
        assert_eq!(f.metadata().unwrap().len(), 8 << 20);
    }
    let du = sh(&format!("du -k {}", m.p("sparse").display()));
    let kib: u64 = du.split_whitespace().next().unwrap().parse().unwrap();
    assert!((1024..2048).contains(&kib), "du of the sparse file: {du}");

    // statfs
    let st = nix_statfs(root);
    assert!(st.0 > 0 && st.1 > 0 && st.1 <= st.0, "statfs blocks {st:?}");
    // Available leaves out the server's keep (alloc::grant): 1/64 of the
    // pool, 256 blocks at least here.
    let keep = st.1 - st.2.min(st.1);
    assert!(
        st.2 < st.1 && (256..=16_384).contains(&keep),
        "statfs free/available {st:?}"
    );

    // mmap, shared and writable
    write_mapped(&m.p("mapped"), 4096, b"mapped!");
    let data = fs::read(m.p("mapped")).unwrap();
    assert_eq!(&data[4096..4103], b"mapped!");
}

/// Paths under a mount point, as [`Mounted::p`] gives them.
struct Root<'a>(&'a Path);

impl Root<'_> {
    fn p(&self, rel: &str) -> std::path::PathBuf {
        self.0.join(rel)
    }
}

/// statvfs's (blocks, free, available).
fn nix_statfs(p: &Path) -> (u64, u64, u64) {
    let c = cpath(p);
    // SAFETY: statvfs is plain data filled by the call.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid path and out-pointer.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    (st.f_blocks, st.f_bfree, st.f_bavail)
}

#[test]
fn posix_walk_inkfs() {
    let pool = Pool::new("posix", 256);
    let m = Mounted::new(&pool, "mode=strict");
    if preloading() {
        // The walk's own calls (std::fs, libc) through the library.
        in_preloaded_child("posix_walk_child", &m.path().display().to_string());
    } else {
        posix_walk(m.path());
    }
    // everything survives a clean unmount and remount
    let dir = m.unmount();
    let m = Mounted::at(&pool, dir, "");
    assert_eq!(fs::read(m.p("f")).unwrap(), b"sho");
    assert_eq!(fs::read(m.p("d/r3-link")).unwrap(), b"one");
    assert_eq!(fs::read_link(m.p("sym")).unwrap(), Path::new("d/r3-link"));
    assert_eq!(&fs::read(m.p("mapped")).unwrap()[4096..4103], b"mapped!");
    assert_eq!(fs::read_dir(m.p("d")).unwrap().count(), 602);
    assert_eq!(
        fs::metadata(m.p("null-dev")).unwrap().rdev(),
        libc::makedev(1, 3)
    );
    assert!(mounted_clean(m.path()));
}

/// The body of `posix_walk_inkfs` in a child with the library in (not a
/// test by itself: returns at once unless started as that child).
#[test]
fn posix_walk_child() {
    if let Some(dir) = child_arg() {
        posix_walk(Path::new(&dir));
    }
}

#[test]
fn cp_diff_tar() {
    let pool = Pool::new("cp", 512);
    // Through the page cache; under the library in strict mode, which it
    // serves (a posix-mode server refuses every attach).
    let opts = if preloading() {
        "mode=strict"
    } else {
        "mode=posix"
    };
    let m = Mounted::new(&pool, opts);
    let src = repo_root().join("crates");
    let out = tool("cp")
        .arg("-a")
        .arg(&src)
        .arg(m.p("crates"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cp -a: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    sh(&format!(
        "diff -r {} {}",
        src.display(),
        m.p("crates").display()
    ));
    sh(&format!(
        "cd {mnt} && tar cf t.tar crates && mkdir x && tar xf t.tar -C x && diff -r crates x/crates",
        mnt = m.path().display()
    ));
    let dir = m.unmount();
    let m = Mounted::at(&pool, dir, opts);
    sh(&format!(
        "diff -r {} {}",
        src.display(),
        m.p("x/crates").display()
    ));
}

#[test]
fn git_repository() {
    require_tool("git", "git");
    let pool = Pool::new("git", 256);
    let m = Mounted::new(&pool, "");
    sh(&format!(
        "cd {mnt} && git init -q repo && cd repo && git config user.email t@t && git config user.name t \
         && cp -a {src}/crates . && git add -A && git commit -qm one \
         && echo change >> crates/inkfs-fuse/Cargo.toml && git commit -qam two \
         && git gc -q && git fsck --strict && test $(git rev-list --count HEAD) = 2 \
         && git status --porcelain | wc -l | grep -qx 0",
        mnt = m.path().display(),
        src = repo_root().display()
    ));
}

#[test]
fn sqlite_delete_and_wal() {
    require_tool("sqlite3", "sqlite3");
    let pool = Pool::new("sqlite", 256);
    let m = Mounted::new(&pool, "mode=strict");
    for mode in ["DELETE", "WAL"] {
        let db = m.p(&format!("{mode}.db"));
        let mut script = format!(
            "PRAGMA journal_mode={mode};\nCREATE TABLE t(k INTEGER PRIMARY KEY, v TEXT);\n"
        );
        for i in 0..300 {
            script.push_str(&format!(
                "BEGIN; INSERT INTO t(v) VALUES (hex(randomblob({})));UPDATE t SET v = v || 'x' WHERE k % 7 = {}; COMMIT;\n",
                100 + i * 3,
                i % 7
            ));
        }
        script.push_str("DELETE FROM t WHERE k % 3 = 0; VACUUM;\nPRAGMA integrity_check;\nSELECT count(*) FROM t;\n");
        let mut child = tool("sqlite3")
            .arg(&db)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(script.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "sqlite3 {mode}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains("ok\n200"),
            "sqlite3 {mode} output: {stdout}"
        );
    }
    let dir = m.unmount();
    let m = Mounted::at(&pool, dir, "");
    for mode in ["DELETE", "WAL"] {
        let out = sh(&format!(
            "sqlite3 {} 'PRAGMA integrity_check; SELECT count(*) FROM t;'",
            m.p(&format!("{mode}.db")).display()
        ));
        assert_eq!(out, "ok\n200\n", "{mode} after remount");
    }
}

#[test]
fn xattr_tools() {
    require_tool("setfattr", "attr");
    let pool = Pool::new("xattr", 64);
    let m = Mounted::new(&pool, "");
    fs::write(m.p("f"), b"x").unwrap();
    let f = m.p("f");
    sh(&format!(
        "setfattr -n user.a -v hello {f} && setfattr -n user.b -v 0x0001ff {f}",
        f = f.display()
    ));
    let out = sh(&format!("getfattr -d -e hex {}", f.display()));
    assert!(
        out.contains("user.a=0x68656c6c6f") && out.contains("user.b=0x0001ff"),
        "{out}"
    );
    sh(&format!(
        "setfattr -x user.a {f} && ! getfattr -n user.a {f} 2>/dev/null",
        f = f.display()
    ));
}

#[test]
fn permissions_as_nobody() {
    require_tool("setpriv", "util-linux");
    let pool = Pool::new("perm", 64);
    // Under the library: a pool every user may map, and a control socket
    // every user reaches (`stats=all`), so nobody's calls are served by
    // the library and judged by the engine, not refused at attach.
    let opts = if preloading() {
        fs::set_permissions(&pool.path, fs::Permissions::from_mode(0o666)).unwrap();
        "stats=all"
    } else {
        ""
    };
    let m = Mounted::new(&pool, opts);
    let as_nobody = |script: &str| {
        tool("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "sh",
                "-c",
                script,
            ])
            .output()
            .unwrap()
    };
    fs::set_permissions(m.path(), fs::Permissions::from_mode(0o755)).unwrap();
    fs::create_dir(m.p("private")).unwrap();
    fs::set_permissions(m.p("private"), fs::Permissions::from_mode(0o700)).unwrap();
    fs::write(m.p("private/secret"), b"s").unwrap();
    fs::write(m.p("readonly"), b"r").unwrap();
    fs::set_permissions(m.p("readonly"), fs::Permissions::from_mode(0o644)).unwrap();
    fs::create_dir(m.p("tmp")).unwrap();
    fs::set_permissions(m.p("tmp"), fs::Permissions::from_mode(0o1777)).unwrap();
    fs::write(m.p("tmp/roots"), b"r").unwrap();
    let p = |r: &str| m.p(r).display().to_string();

    let denied = |script: String, what: &str| {
        let out = as_nobody(&script);
        assert!(!out.status.success(), "nobody could {what}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("Permission denied") || err.contains("Operation not permitted"),
            "{what}: {err}"
        );
    };
    denied(format!("ls {}", p("private")), "list a 0700 directory");
    denied(
        format!("cat {}", p("private/secret")),
        "read through a 0700 directory",
    );
    denied(
        format!("echo x > {}", p("readonly")),
        "write a 0644 root file",
    );
    denied(
        format!("touch {}", p("newfile")),
        "create in a 0755 root directory",
    );
    denied(
        format!("rm -f {}", p("tmp/roots")),
        "delete another user's file in a sticky dir",
    );
    denied(format!("chmod 777 {}", p("readonly")), "chmod a root file");
    // allowed: reading, and creating/deleting one's own file in the sticky dir
    let out = as_nobody(&format!(
        "cat {r} && echo mine > {t}/mine && rm {t}/mine && echo mine2 > {t}/mine2",
        r = p("readonly"),
        t = p("tmp")
    ));
    assert!(
        out.status.success(),
        "nobody: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let md = fs::metadata(m.p("tmp/mine2")).unwrap();
    assert_eq!((md.uid(), md.gid()), (65534, 65534));
    denied(
        format!("chown 0 {}", p("tmp/mine2")),
        "give a file away (chown)",
    );
    // A write by an unprivileged user drops set-user-ID (the server does it:
    // FUSE_HANDLE_KILLPRIV_V2), as does a chown.
    fs::write(m.p("tmp/suid"), b"#!/bin/sh\n").unwrap();
    fs::set_permissions(m.p("tmp/suid"), fs::Permissions::from_mode(0o4777)).unwrap();
    let out = as_nobody(&format!("echo x >> {}", p("tmp/suid")));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mode = fs::metadata(m.p("tmp/suid")).unwrap().permissions().mode();
    assert_eq!(
        mode & 0o7777,
        0o777,
        "set-user-ID kept after a write by nobody: {mode:o}"
    );
    fs::set_permissions(m.p("tmp/suid"), fs::Permissions::from_mode(0o4755)).unwrap();
    std::os::unix::fs::chown(m.p("tmp/suid"), Some(1), None).unwrap();
    let mode = fs::metadata(m.p("tmp/suid")).unwrap().permissions().mode();
    assert_eq!(
        mode & 0o7777,
        0o755,
        "set-user-ID kept after chown: {mode:o}"
    );
    // the kernel's check for access(2) too
    let out = as_nobody(&format!("test -w {}", p("readonly")));
    assert!(!out.status.success(), "access(W_OK) granted to nobody");
}

#[test]
fn kill9_keeps_fsynced_data() {
    // Posix mode serves every FSYNC; strict mode answers none (its writes
    // are durable on return), and still loses nothing fsynced or msynced.
    for opts in ["mode=posix", "mode=strict"] {
        kill9_keeps_fsynced_data_in(opts);
    }
}

/// Write a shared mapping of `path` and msync it.
fn write_mapped(path: &Path, at: usize, bytes: &[u8]) {
    use std::os::fd::AsRawFd;
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .unwrap();
    f.set_len(8192).unwrap();
    // SAFETY: mapping 8 KiB of a file that long; unmapped below and not
    // used after; `at + bytes.len()` is checked to fit.
    unsafe {
        assert!(at + bytes.len() <= 8192);
        let p = libc::mmap(
            std::ptr::null_mut(),
            8192,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(
            p,
            libc::MAP_FAILED,
            "shared writable mmap: errno {}",
            last_errno()
        );
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), p.cast::<u8>().add(at), bytes.len());
        assert_eq!(libc::msync(p, 8192, libc::MS_SYNC), 0);
        libc::munmap(p, 8192);
    }
}

/// The contents of file `w{i}` of the kill test, `len` bytes.
fn kill9_pattern(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i * 31 + j * 7) as u8).collect()
}

/// The kill test's writer: one fsync first (in strict mode the kernel has
/// then stopped sending FSYNC when the msync comes), an msynced mapping,
/// then files created, written and fsynced until a call fails (the server
/// is killed meanwhile) or 20 s pass; `synced(i, len)` after each fsync
/// that returned.
fn kill9_writer(root: &Path, mut synced: impl FnMut(usize, usize)) {
    fs::File::create(root.join("first"))
        .and_then(|f| f.sync_all())
        .unwrap();
    write_mapped(&root.join("mapped"), 4096, b"msynced");
    let t = Instant::now();
    for i in 0.. {
        if t.elapsed() > Duration::from_secs(20) {
            break;
        }
        let len = 1000 + (i * 4099) % 70_000;
        let r = (|| -> std::io::Result<()> {
            let mut f = fs::File::create(root.join(format!("w{i}")))?;
            f.write_all(&kill9_pattern(i, len))?;
            f.sync_all()?;
            Ok(())
        })();
        match r {
            Ok(()) => synced(i, len),
            Err(_) => break,
        }
    }
}

/// The writer in a child with the library in, printing each file it
/// fsynced (`SYNCED i len`) as it goes.
#[test]
fn kill9_writer_child() {
    if let Some(root) = child_arg() {
        kill9_writer(Path::new(&root), |i, len| println!("SYNCED {i} {len}"));
    }
}

/// Run the writer under the library (a child) while the server is killed:
/// what it fsynced, as it said it as it went.
fn kill9_writer_preloaded(
    root: &Path,
    done: &std::sync::atomic::AtomicUsize,
) -> Vec<(usize, usize)> {
    use std::io::BufRead;
    let child = PreloadedChild::new("kill9_writer_child", &root.display().to_string());
    let mut proc = child
        .command()
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run the writer");
    let mut synced = Vec::new();
    let mut text = String::new();
    let stdout = proc.stdout.take().expect("piped");
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line.expect("the writer's output");
        if let Some((i, len)) = line.strip_prefix("SYNCED ").and_then(|r| r.split_once(' ')) {
            synced.push((i.parse().expect("i"), len.parse().expect("len")));
            done.store(synced.len(), std::sync::atomic::Ordering::Relaxed);
        }
        text.push_str(&line);
        text.push('\n');
    }
    let mut out = proc.wait_with_output().expect("the writer's end");
    out.stdout = text.into_bytes();
    child.check(&out);
    synced
}

fn kill9_keeps_fsynced_data_in(opts: &str) {
    let pool = Pool::new("kill9", 256);
    let m = Mounted::new(&pool, opts);
    let root = m.path().to_path_buf();
    let pid = m.pid;
    // Kill the server while the writer is busy: once it has fsynced a few
    // dozen files (a fixed delay is too short on a loaded machine), a
    // little later still, so the kill lands mid-write.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = done.clone();
    let killer = std::thread::spawn(move || {
        let t = Instant::now();
        while seen.load(std::sync::atomic::Ordering::Relaxed) < 30
            && t.elapsed() < Duration::from_secs(15)
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(50));
        // SAFETY: kill has no memory preconditions.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    });
    // Under the library in strict mode (a posix-mode server refuses the
    // attach): the writes, fsyncs and creates served by the library, the
    // server killed under them.
    let synced = if preloading() && opts == "mode=strict" {
        kill9_writer_preloaded(&root, &done)
    } else {
        let mut synced = Vec::new();
        kill9_writer(&root, |i, len| {
            synced.push((i, len));
            done.store(synced.len(), std::sync::atomic::Ordering::Relaxed);
        });
        synced
    };
    killer.join().unwrap();
    assert!(
        synced.len() > 10,
        "only {} files written before the kill",
        synced.len()
    );
    let dir = m.kill9();
    assert!(
        fs::metadata(dir.path())
            .err()
            .and_then(|e| e.raw_os_error())
            == Some(libc::ENOTCONN),
        "a dead mount answers ENOTCONN"
    );
    let m = Mounted::at(&pool, dir, opts);
    let mapped = fs::read(m.p("mapped")).unwrap();
    assert_eq!(
        &mapped[4096..4103],
        b"msynced",
        "{opts}: msynced bytes lost"
    );
    for &(i, len) in &synced {
        let got = fs::read(m.p(&format!("w{i}"))).unwrap_or_else(|e| panic!("w{i} lost: {e}"));
        assert!(
            got == kill9_pattern(i, len),
            "{opts}: w{i}: contents differ after the crash"
        );
    }
    assert!(!mounted_clean(m.path()), "{opts}: a crash, recovered");
}

#[test]
fn read_only_and_double_mount() {
    let pool = Pool::new("ro", 64);
    let m = Mounted::new(&pool, "");
    fs::write(m.p("keep"), b"kept").unwrap();
    // a second server for the same pool is refused, naming the holder
    let other = tempfile::tempdir().unwrap();
    let out = mount_with(&pool.path, other.path(), "");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains(&format!("pid {}", m.pid)),
        "{err}"
    );
    // ...and so is a second server on the same mount point
    let other = Pool::new("stacked", 64);
    let out = mount_with(&other.path, m.path(), "");
    assert!(!out.status.success(), "stacked a server on a live mount");
    let dir = m.unmount();
    let m = Mounted::at(&pool, dir, "ro");
    assert_eq!(fs::read(m.p("keep")).unwrap(), b"kept");
    assert_eq!(
        fs::write(m.p("new"), b"x").unwrap_err().raw_os_error(),
        Some(libc::EROFS)
    );
    assert_eq!(
        fs::remove_file(m.p("keep")).unwrap_err().raw_os_error(),
        Some(libc::EROFS)
    );
}

#[test]
fn signals_and_fusermount_unmount_cleanly() {
    require_tool("fusermount3", "fuse3");
    let pool = Pool::new("sig", 64);
    let mut dir = tempfile::tempdir().unwrap();
    for how in ["SIGTERM", "SIGINT", "fusermount3", "umount"] {
        let m = Mounted::at(&pool, dir, "");
        fs::write(m.p(how), how).unwrap();
        let pid = m.pid;
        let path = m.path().to_path_buf();
        dir = match how {
            "umount" => m.unmount(),
            _ => {
                let m = std::mem::ManuallyDrop::new(m);
                match how {
                    // SAFETY: kill has no memory preconditions.
                    "SIGTERM" => unsafe {
                        libc::kill(pid as i32, libc::SIGTERM);
                    },
                    // SAFETY: as above.
                    "SIGINT" => unsafe {
                        libc::kill(pid as i32, libc::SIGINT);
                    },
                    _ => {
                        run(Command::new("fusermount3").arg("-u").arg(&path));
                    }
                }
                wait_exit(pid);
                // SAFETY: `m` is never used again and never dropped.
                unsafe { std::ptr::read(&m.dir) }
            }
        };
        assert!(!is_mounted(&path), "{how}: still mounted");
        let m = Mounted::at(&pool, dir, "");
        assert!(mounted_clean(m.path()), "after {how}");
        assert_eq!(fs::read(m.p(how)).unwrap(), how.as_bytes());
        dir = m.unmount();
    }
}

#[test]
fn mount_t_fuse_inkfs() {
    require_tool("mount", "mount");
    let pool = Pool::new("helper", 64);
    run(Command::new(BIN).args(["install-helper", "/sbin"]));
    // The helper names no build tree: `cargo clean` must not break fstab.
    let helper = fs::read_to_string("/sbin/mount.fuse.inkfs").unwrap();
    assert!(!helper.contains("/target/"), "{helper}");
    let dir = tempfile::tempdir().unwrap();
    // This crate's binary stands in for an installed `inkfs` (same code).
    run(Command::new("mount")
        .env("INKFS", BIN)
        .args(["-t", "fuse.inkfs"])
        .arg(&pool.path)
        .arg(dir.path())
        .args(["-o", "mode=sync,nofail,_netdev,noatime"]));
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap();
    let line = mounts
        .lines()
        .find(|l| l.split(' ').nth(1) == Some(&*dir.path().to_string_lossy()))
        .unwrap_or_else(|| panic!("not mounted: {mounts}"));
    assert!(line.contains(" fuse.inkfs "), "{line}");
    fs::write(dir.path().join("x"), b"via mount(8)").unwrap();
    let pid = server_pid(dir.path()).unwrap();
    run(Command::new("umount").arg(dir.path()));
    wait_exit(pid);

    // `mount -f` (fake: everything but the mount itself) gives the helper
    // `-f`, which is not `inkfs mount -f` (foreground): nothing is mounted
    // and mount(8) returns at once. (A server started by mistake would
    // serve until the timeout; it is unmounted before the assertions.)
    let fake = Command::new("timeout")
        .args(["20", "mount", "-f", "-t", "fuse.inkfs"])
        .env("INKFS", BIN)
        .arg(&pool.path)
        .arg(dir.path())
        .args(["-o", "mode=sync"])
        .output()
        .unwrap();
    let is_mounted = fs::read_to_string("/proc/self/mounts")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(1) == Some(&*dir.path().to_string_lossy()));
    if is_mounted {
        let _ = Command::new("umount").arg(dir.path()).output();
    }
    assert!(!is_mounted, "mount -f mounted the pool");
    assert!(
        fake.status.success(),
        "mount -f: {}: {}",
        fake.status,
        String::from_utf8_lossy(&fake.stderr)
    );
}

#[test]
fn stats_socket() {
    let pool = Pool::new("stats", 64);
    // Strict mode, whatever INKFS_TEST_MOUNT_OPTS says: every write
    // reaches the server (no writeback cache merges them) and every
    // overwrite is logged (posix mode overwrites in place, logging nothing).
    let m = Mounted::new(&pool, "mode=strict");
    fs::write(m.p("f"), vec![1u8; 100_000]).unwrap();
    let _ = fs::read(m.p("f")).unwrap();
    // A hot page: every overwrite appends a log entry, which GC reclaims.
    {
        use std::os::unix::fs::FileExt;
        let hot = fs::OpenOptions::new().write(true).open(m.p("f")).unwrap();
        for i in 0..600u32 {
            hot.write_all_at(&[i as u8; 4096], 0).unwrap();
        }
    }
    let json = inkfs_fuse::stat_mountpoint(m.path(), true)
        .unwrap()
        .unwrap();
    assert!(
        json.starts_with('{') && json.trim_end().ends_with('}'),
        "{json}"
    );
    assert!(json.contains("\"write\":{\"count\":"), "{json}");
    assert!(json.contains("\"bytes_written\":2557600,"), "{json}");
    assert!(json.contains("\"bytes_free\":"), "{json}");
    let field = |key: &str| -> u64 {
        let at = json
            .find(&format!("\"{key}\":"))
            .unwrap_or_else(|| panic!("no {key} in {json}"));
        let digits: String = json[at + key.len() + 3..]
            .chars()
            .take_while(|c| c.is_ascii_digit())
            .collect();
        digits.parse().unwrap()
    };
    // The hot file's log is small: compaction (cheaper than a scan there)
    // keeps it short.
    assert!(
        field("gc_compactions") + field("gc_fast_pages_freed") > 0,
        "{json}"
    );
    assert_eq!(field("gc_fast_refused"), 0, "{json}");
    assert!(field("log_pages_of_loaded_inodes") > 0, "{json}");
    let text = run(Command::new(BIN).arg("stat").arg(m.path())).stdout;
    assert!(String::from_utf8_lossy(&text).contains("create"));
    let plain = tempfile::tempdir().unwrap();
    assert!(inkfs_fuse::stat_mountpoint(plain.path(), false).is_none());
}

#[test]
fn close_costs_no_flush_round_trip() {
    // inkfs buffers nothing, so it answers the first FLUSH with ENOSYS and
    // the kernel sends no more: a close is one RELEASE, not two requests.
    let pool = Pool::new("noflush", 64);
    // Counts RELEASEs, which a kernel_open mount never receives.
    let m = Mounted::new(&pool, "nokernel_open");
    for i in 0..50u8 {
        fs::write(m.p(&format!("f{i}")), [i; 100]).unwrap();
    }
    for i in 0..50u8 {
        assert_eq!(fs::read(m.p(&format!("f{i}"))).unwrap(), [i; 100]);
    }
    // RELEASE is asynchronous: close(2) does not wait for it.
    let t = Instant::now();
    while op_count(&m, "release") < 100 {
        assert!(
            t.elapsed() < inkfs::testkit::WAIT_LIMIT,
            "100 closes, no 100 RELEASEs"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(op_count(&m, "flush") <= 1);
}

#[test]
fn fsync_costs_a_round_trip_only_in_uncached_posix_mode() {
    // Strict and sync modes persist every write before answering it, and so
    // does posix mode with the writeback cache (each write-back: fsync
    // writes the dirty pages back first), so they answer the first FSYNC
    // with ENOSYS and the kernel sends no more. Posix mode without the
    // cache makes in-place overwrites durable at fsync: every one must
    // reach the server.
    use std::io::{Seek, SeekFrom, Write};
    for (opts, max_fsyncs) in [
        ("mode=strict", 1),
        ("mode=sync", 1),
        ("mode=posix", 1),
        ("mode=posix,nowriteback_cache", u64::MAX),
    ] {
        let pool = Pool::new("fsyncs", 64);
        let m = Mounted::new(&pool, opts);
        let mut f = fs::File::create(m.p("f")).unwrap();
        let d = fs::File::open(m.path()).unwrap();
        for i in 0..50u8 {
            f.seek(SeekFrom::Start(i as u64 * 4096)).unwrap();
            f.write_all(&[i; 4096]).unwrap();
            f.sync_all().unwrap();
            f.sync_data().unwrap();
            d.sync_all().unwrap();
        }
        // The server counts a request just after answering it.
        let t = Instant::now();
        while max_fsyncs == u64::MAX
            && op_count(&m, "fsync") < 100
            && t.elapsed() < inkfs::testkit::WAIT_LIMIT
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        let (files, dirs) = (op_count(&m, "fsync"), op_count(&m, "fsyncdir"));
        if max_fsyncs == u64::MAX {
            assert_eq!(files, 100, "{opts}: every fsync must reach the server");
        } else {
            assert!(files <= max_fsyncs, "{opts}: {files} FSYNC requests");
            assert!(dirs <= max_fsyncs, "{opts}: {dirs} FSYNCDIR requests");
        }
        drop((f, d));
        let back = fs::read(m.p("f")).unwrap();
        assert!((0..50u8).all(|i| back[i as usize * 4096..][..4096] == [i; 4096]));
    }
}

#[test]
fn copy_file_range_is_served_in_the_pool() {
    // One COPY_FILE_RANGE request per call (the engine copies pool to
    // pool), where the kernel's fallback would send the bytes through READ
    // and WRITE requests; `cp` (coreutils >= 9) uses it. The result must be
    // byte-exact through the page cache, across a remount, in every mode.
    use std::os::fd::AsRawFd;
    for opts in ["mode=strict", "mode=sync", "mode=posix"] {
        let pool = Pool::new("copyrange", 64);
        let data: Vec<u8> = (0..3 * 1024 * 1024 + 777u32)
            .map(|i| (i % 251) as u8)
            .collect();
        {
            // One FUSE thread: it counts each request before it takes the
            // next, so once a later request has been answered every
            // earlier one is counted (with two, a count could land after
            // the copy began: a pause until the counts stopped moving was
            // a guess).
            let m = Mounted::new(&pool, &format!("{opts},threads=1"));
            fs::write(m.p("src"), &data).unwrap();
            // Cache the old destination bytes: the copy must replace them.
            fs::write(m.p("dst"), vec![9u8; 8192]).unwrap();
            assert_eq!(fs::read(m.p("dst")).unwrap(), vec![9u8; 8192]);
            let src = fs::File::open(m.p("src")).unwrap();
            let dst = fs::OpenOptions::new().write(true).open(m.p("dst")).unwrap();
            // The server counts a request just after answering it: one
            // request more (STATFS always reaches the server), answered,
            // and the writes above are all counted.
            // SAFETY: a path and a struct for the kernel to fill.
            let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
            let path = std::ffi::CString::new(m.path().as_os_str().as_encoded_bytes()).unwrap();
            assert_eq!(unsafe { libc::statvfs(path.as_ptr(), &mut sv) }, 0);
            let writes_before = op_count(&m, "write");
            let (mut a, mut b) = (1000i64, 100i64);
            let mut left = data.len() - 1000;
            let mut calls = 0;
            while left > 0 {
                let n = unsafe {
                    libc::copy_file_range(src.as_raw_fd(), &mut a, dst.as_raw_fd(), &mut b, left, 0)
                };
                assert!(
                    n > 0,
                    "{opts}: copy_file_range: {}",
                    std::io::Error::last_os_error()
                );
                left -= n as usize;
                calls += 1;
            }
            drop((src, dst));
            let mut want = vec![9u8; 100];
            want.extend_from_slice(&data[1000..]);
            assert!(
                fs::read(m.p("dst")).unwrap() == want,
                "{opts}: copy differs"
            );
            // cp's own path, whole file.
            let out = tool("cp").arg(m.p("src")).arg(m.p("cp")).output().unwrap();
            assert!(out.status.success(), "{opts}: cp: {out:?}");
            assert!(fs::read(m.p("cp")).unwrap() == data, "{opts}: cp differs");
            let t = Instant::now();
            while op_count(&m, "copy_file_range") < calls + 1
                && t.elapsed() < inkfs::testkit::WAIT_LIMIT
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            assert!(
                op_count(&m, "copy_file_range") > calls,
                "{opts}: copies served by the kernel"
            );
            assert_eq!(
                op_count(&m, "write"),
                writes_before,
                "{opts}: copied bytes went through WRITE"
            );
        }
        let m = Mounted::new(&pool, opts);
        let mut want = vec![9u8; 100];
        want.extend_from_slice(&data[1000..]);
        assert!(
            fs::read(m.p("dst")).unwrap() == want,
            "{opts}: copy lost at remount"
        );
        assert!(
            fs::read(m.p("cp")).unwrap() == data,
            "{opts}: cp lost at remount"
        );
    }
}

/// How many requests of kind `op` the mounted server has answered (0 if
/// none yet), from its live statistics.
fn op_count(m: &Mounted, op: &str) -> u64 {
    let json = inkfs_fuse::stat_mountpoint(m.path(), true)
        .unwrap()
        .unwrap();
    let key = format!("\"{op}\":{{\"count\":");
    let Some(at) = json.find(&key) else {
        return 0;
    };
    json[at + key.len()..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect::<String>()
        .parse()
        .unwrap_or_else(|_| panic!("{op} count in {json}"))
}

#[test]
fn cached_absence_never_hides_a_new_name() {
    // Each name is first looked up while absent (the kernel caches that for
    // the entry TTL), then created by one kind of call; it must be visible
    // at once, and a name removed must be gone at once.
    let pool = Pool::new("negative", 64);
    let m = Mounted::new(&pool, "");
    fs::write(m.p("src"), b"x").unwrap();
    fs::write(m.p("moved"), b"y").unwrap();
    let absent = |n: &str| {
        let e = fs::symlink_metadata(m.p(n)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{n}");
    };
    type Make<'a> = &'a dyn Fn(&Path);
    let made: [(&str, Make); 6] = [
        ("file", &|p| fs::write(p, b"z").unwrap()),
        ("dir", &|p| fs::create_dir(p).unwrap()),
        ("sym", &|p| std::os::unix::fs::symlink("src", p).unwrap()),
        ("hard", &|p| {
            fs::hard_link(p.with_file_name("src"), p).unwrap()
        }),
        ("renamed", &|p| {
            fs::rename(p.with_file_name("moved"), p).unwrap()
        }),
        ("fifo", &|p| {
            let c = cpath(p);
            // SAFETY: a valid C path.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        }),
    ];
    // The absence is cached: repeated probes do not reach the server
    // (a probe every TTL at most).
    let before = op_count(&m, "lookup");
    for _ in 0..100 {
        absent("nothing");
    }
    assert!(op_count(&m, "lookup") - before <= 3, "absence not cached");
    for (name, make) in made {
        for _ in 0..3 {
            absent(name);
        }
        make(&m.p(name));
        assert!(fs::symlink_metadata(m.p(name)).is_ok(), "{name} hidden");
    }
    absent("moved");
    fs::remove_file(m.p("file")).unwrap();
    absent("file");
    fs::write(m.p("file"), b"again").unwrap();
    assert_eq!(fs::read(m.p("file")).unwrap(), b"again");
}

#[test]
fn null_fs_with_fio() {
    require_root();
    require_tool("fio", "fio");
    let dir = tempfile::tempdir().unwrap();
    run(Command::new(BIN).arg("null-fs").arg(dir.path()));
    let f = dir.path().join("f");
    let r = (|| {
        fs::write(&f, vec![9u8; 1 << 20])?;
        assert_eq!(fs::metadata(&f)?.len(), 1 << 20);
        assert!(fs::read(&f)?.iter().all(|&b| b == 0));
        fs::OpenOptions::new().write(true).open(&f)?.sync_all()?;
        fs::remove_file(&f)?;
        assert!(fs::metadata(&f).is_err());
        let out = tool("fio")
            .args([
                "--name=null",
                "--rw=randwrite",
                "--bs=4k",
                "--size=16m",
                "--runtime=2",
                "--time_based",
            ])
            .arg(format!("--directory={}", dir.path().display()))
            .args(["--ioengine=psync", "--output-format=terse"])
            .output()?;
        assert!(
            out.status.success(),
            "fio: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::io::Result::Ok(())
    })();
    run(Command::new("umount").arg(dir.path()));
    r.unwrap();
}
