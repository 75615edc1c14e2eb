//! Calls one at a time, for what the differential run cannot compare
//! with Linux: descriptors (dup, fcntl), directory streams and
//! getdents64, NULL pointers, credentials, mount options, statfs, the
//! fallocate modes tmpfs lacks, unmount's rules.

mod common;

use std::collections::BTreeSet;
use std::ffi::{c_int, CStr};

use common::{c, ck, errno, Pool, PoolPath};
use inkfs_capi::*;

const RW: c_int = libc::O_RDWR;
const CREAT: c_int = libc::O_CREAT | libc::O_RDWR;

/// A directory opened with O_TRUNC is EISDIR whatever the access mode
/// (O_TRUNC asks for write access): inkfs::api::open let O_RDONLY|O_TRUNC
/// through before, opening the directory.
#[test]
fn o_trunc_on_a_directory_is_eisdir() {
    let p = Pool::new("calls-trunc-dir");
    p.mkdir("d", 0o755).unwrap();
    assert_eq!(
        p.open("d", libc::O_RDONLY | libc::O_TRUNC, 0),
        Err(libc::EISDIR)
    );
    assert_eq!(p.open("d", libc::O_RDONLY, 0).map(|fd| fd >= 0), Ok(true));
}

#[test]
fn dup_shares_the_offset_and_fcntl_flags() {
    let p = Pool::new("calls-dup");
    let fd = p.open("f", CREAT, 0o644).unwrap();
    // SAFETY (every unsafe block below): a live mount and valid pointers.
    let dup = ck(unsafe { inkfs_dup(p.fs, fd) }).unwrap();
    assert_ne!(dup, fd);
    p.write(fd, b"hello").unwrap();
    assert_eq!(p.lseek(dup, 0, libc::SEEK_CUR), Ok(5), "one offset");
    // F_SETFL through one descriptor is seen through the other.
    let fl = ck(unsafe { inkfs_fcntl(p.fs, fd, libc::F_GETFL, 0) }).unwrap();
    assert_eq!(fl & libc::O_ACCMODE, libc::O_RDWR);
    ck(unsafe { inkfs_fcntl(p.fs, dup, libc::F_SETFL, (fl | libc::O_APPEND) as _) }).unwrap();
    let fl = ck(unsafe { inkfs_fcntl(p.fs, fd, libc::F_GETFL, 0) }).unwrap();
    assert_ne!(fl & libc::O_APPEND, 0);
    p.pwrite(fd, b"!", 0).unwrap();
    assert_eq!(
        p.stat("f").unwrap().st_size,
        6,
        "pwrite appends with O_APPEND, as Linux"
    );
    // dup2 onto an open descriptor closes what it named.
    let other = p.open("g", CREAT, 0o644).unwrap();
    assert_eq!(ck(unsafe { inkfs_dup2(p.fs, fd, other) }), Ok(other));
    assert_eq!(
        p.lseek(other, 0, libc::SEEK_CUR),
        Ok(5),
        "pwrite left the offset"
    );
    // F_DUPFD: lowest free at or above the argument; F_GETFD: cloexec.
    let high = ck(unsafe { inkfs_fcntl(p.fs, fd, libc::F_DUPFD_CLOEXEC, 100) }).unwrap();
    assert_eq!(high, 100);
    assert_eq!(
        ck(unsafe { inkfs_fcntl(p.fs, high, libc::F_GETFD, 0) }),
        Ok(libc::FD_CLOEXEC)
    );
    assert_eq!(
        ck(unsafe { inkfs_dup3(p.fs, fd, fd, 0) }),
        Err(libc::EINVAL)
    );
    for d in [fd, dup, other, high] {
        p.close(d).unwrap();
    }
    assert_eq!(p.close(fd), Err(libc::EBADF));
    // The lowest free number is handed out again.
    assert_eq!(p.open("f", RW, 0), Ok(fd.min(dup).min(other)));
}

#[test]
fn unsupported_open_flags_are_refused() {
    let p = Pool::new("calls-flags");
    assert_eq!(
        p.open(".", libc::O_TMPFILE | libc::O_RDWR, 0o600),
        Err(libc::EOPNOTSUPP)
    );
    assert_eq!(p.open(".", libc::O_PATH, 0), Err(libc::EOPNOTSUPP));
    assert_eq!(
        p.open("f", libc::O_CREAT | libc::O_DIRECTORY, 0o600),
        Err(libc::EINVAL)
    );
    assert_eq!(p.open("f", 3, 0), Err(libc::EINVAL), "access mode 3");
}

#[test]
fn null_pointers_and_bad_descriptors_are_errors() {
    let p = Pool::new("calls-null");
    let null = std::ptr::null_mut();
    // SAFETY (every unsafe block below): NULLs are what is being tested;
    // the rest is a live mount and valid pointers.
    unsafe {
        assert_eq!(
            ck(inkfs_open(p.fs, std::ptr::null(), 0, 0)),
            Err(libc::EFAULT)
        );
        assert_eq!(
            ck(inkfs_open(null, c("f").as_ptr(), 0, 0)),
            Err(libc::EINVAL)
        );
        assert_eq!(ck(inkfs_unmount(null)), Err(libc::EINVAL));
        assert!(inkfs_mount(std::ptr::null(), std::ptr::null()).is_null());
        assert_eq!(errno(), libc::EFAULT);
        let fd = p.open("f", CREAT, 0o644).unwrap();
        assert_eq!(
            ck(inkfs_read(p.fs, fd, null.cast(), 10) as i64),
            Err(libc::EFAULT)
        );
        assert_eq!(ck(inkfs_read(p.fs, fd, null.cast(), 0) as i64), Ok(0));
        assert_eq!(
            ck(inkfs_write(p.fs, fd, std::ptr::null(), 1) as i64),
            Err(libc::EFAULT)
        );
        assert_eq!(
            ck(inkfs_fstat(p.fs, fd, std::ptr::null_mut())),
            Err(libc::EFAULT)
        );
        assert_eq!(
            ck(inkfs_read(p.fs, 4242, null.cast(), 0) as i64),
            Err(libc::EBADF)
        );
        assert_eq!(
            ck(inkfs_read(p.fs, -1, null.cast(), 0) as i64),
            Err(libc::EBADF)
        );
        assert_eq!(
            ck(inkfs_pread(p.fs, fd, null.cast(), 0, -1) as i64),
            Err(libc::EINVAL)
        );
        assert!(inkfs_readdir(std::ptr::null_mut()).is_null());
        assert_eq!(errno(), libc::EINVAL);
        let bad = MountOpts {
            mode: 7,
            ..MountOpts::default()
        };
        assert!(inkfs_mount(p.path.c().as_ptr(), &bad).is_null());
        assert_eq!(errno(), libc::EINVAL);
    }
}

fn list_stream(p: &Pool, path: &str) -> Vec<(String, u8)> {
    // SAFETY: a live mount, a valid C string; entries are read before the
    // next call on the stream.
    unsafe {
        let d = inkfs_opendir(p.fs, c(path).as_ptr());
        assert!(!d.is_null(), "opendir: {}", errno());
        let mut v = Vec::new();
        loop {
            let e = inkfs_readdir(d);
            if e.is_null() {
                break;
            }
            let name = CStr::from_ptr((*e).d_name.as_ptr())
                .to_string_lossy()
                .into_owned();
            v.push((name, (*e).d_type));
        }
        assert_eq!(inkfs_closedir(d), 0);
        v
    }
}

#[test]
fn directory_streams_and_getdents64() {
    let p = Pool::new("calls-dir");
    p.mkdir("d", 0o755).unwrap();
    p.mkdir("d/sub", 0o755).unwrap();
    for i in 0..150 {
        let fd = p.open(&format!("d/file-{i:03}"), CREAT, 0o644).unwrap();
        p.close(fd).unwrap();
    }
    let names = list_stream(&p, "d");
    assert_eq!(names.len(), 153, ". .. sub and 150 files");
    assert_eq!(names[0], (".".into(), libc::DT_DIR));
    assert_eq!(names[1], ("..".into(), libc::DT_DIR));
    let set: BTreeSet<_> = names.iter().map(|(n, _)| n.clone()).collect();
    assert_eq!(set.len(), 153, "no name twice");
    assert!(names.contains(&("sub".into(), libc::DT_DIR)));
    assert!(names.contains(&("file-149".into(), libc::DT_REG)));

    // telldir/seekdir: resume after the 70th entry.
    // SAFETY: a live mount; the stream is used by this thread only.
    unsafe {
        let d = inkfs_opendir(p.fs, c("d").as_ptr());
        let mut at = 0;
        let mut seventieth = String::new();
        for i in 0..70 {
            let e = inkfs_readdir(d);
            assert!(!e.is_null());
            if i == 69 {
                at = inkfs_telldir(d);
                seventieth = CStr::from_ptr((*e).d_name.as_ptr())
                    .to_string_lossy()
                    .into();
            }
        }
        let next = CStr::from_ptr((*inkfs_readdir(d)).d_name.as_ptr()).to_owned();
        inkfs_rewinddir(d);
        assert_eq!(CStr::from_ptr((*inkfs_readdir(d)).d_name.as_ptr()), c".");
        inkfs_seekdir(d, at);
        assert_eq!(
            CStr::from_ptr((*inkfs_readdir(d)).d_name.as_ptr()),
            next.as_c_str()
        );
        assert_ne!(seventieth, next.to_string_lossy());
        // Unmount is refused while a stream is open.
        let fs = p.fs;
        assert_eq!(ck(inkfs_unmount(fs)), Err(libc::EBUSY));
        assert_eq!(inkfs_closedir(d), 0);
    }

    // getdents64 in small buffers: the same names, the offset advancing.
    let fd = p.open("d", libc::O_RDONLY | libc::O_DIRECTORY, 0).unwrap();
    let mut buf = vec![0u8; 512];
    let mut got = BTreeSet::new();
    loop {
        // SAFETY: a live mount and a writable buffer.
        let n = unsafe { inkfs_getdents64(p.fs, fd, buf.as_mut_ptr().cast(), buf.len()) };
        let n = ck(n as i64).unwrap() as usize;
        if n == 0 {
            break;
        }
        let mut off = 0;
        while off < n {
            let reclen = u16::from_ne_bytes([buf[off + 16], buf[off + 17]]) as usize;
            let name = CStr::from_bytes_until_nul(&buf[off + 19..off + reclen]).unwrap();
            assert!(
                got.insert(name.to_string_lossy().into_owned()),
                "twice: {name:?}"
            );
            off += reclen;
        }
    }
    assert_eq!(got, set);
    // SAFETY: as above; 8 bytes cannot hold an entry.
    let n = unsafe { inkfs_getdents64(p.fs, fd, buf.as_mut_ptr().cast(), 8) };
    assert!(n == 0, "at the end, even a small buffer reads 0");
    assert_eq!(p.lseek(fd, 0, libc::SEEK_SET), Ok(0));
    // SAFETY: as above.
    let n = unsafe { inkfs_getdents64(p.fs, fd, buf.as_mut_ptr().cast(), 8) };
    assert_eq!((n, errno()), (-1, libc::EINVAL));
    p.close(fd).unwrap();
}

#[test]
fn copy_file_range_advances_the_offsets_it_uses() {
    let p = Pool::new("calls-copy");
    let src = p.open("src", CREAT, 0o644).unwrap();
    p.write(src, &[7u8; 10000]).unwrap();
    p.lseek(src, 1000, libc::SEEK_SET).unwrap();
    let dst = p.open("dst", CREAT, 0o644).unwrap();
    let null = std::ptr::null_mut();
    // SAFETY: a live mount; NULL offsets use the descriptors'.
    let n = unsafe { inkfs_copy_file_range(p.fs, src, null, dst, null, 5000, 0) };
    assert_eq!(n, 5000);
    assert_eq!(p.lseek(src, 0, libc::SEEK_CUR), Ok(6000));
    assert_eq!(p.lseek(dst, 0, libc::SEEK_CUR), Ok(5000));
    let mut off_in: libc::off_t = 9000;
    // SAFETY: as above, with one explicit offset, which advances instead.
    let n = unsafe { inkfs_copy_file_range(p.fs, src, &mut off_in, dst, null, 5000, 0) };
    assert_eq!((n, off_in), (1000, 10000), "short at the end of the source");
    assert_eq!(p.lseek(src, 0, libc::SEEK_CUR), Ok(6000), "unchanged");
    assert_eq!(p.stat("dst").unwrap().st_size, 6000);
    // SAFETY: as above.
    let n = unsafe { inkfs_copy_file_range(p.fs, src, null, dst, null, 1, 1) };
    assert_eq!((n, errno()), (-1, libc::EINVAL), "flags must be 0");
}

#[test]
fn statfs_times_and_fallocate_modes() {
    let p = Pool::new("calls-misc");
    // SAFETY (every unsafe block below): a live mount and valid pointers.
    let mut sf: libc::statfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { inkfs_statfs(p.fs, c("/").as_ptr(), &mut sf) }, 0);
    assert_eq!(sf.f_type, INKFS_SUPER_MAGIC as _);
    assert_eq!((sf.f_bsize, sf.f_namelen), (4096, 255));
    assert!(sf.f_bfree > 0 && sf.f_bfree <= sf.f_blocks);

    let fd = p.open("f", CREAT, 0o644).unwrap();
    let times = [
        libc::timespec {
            tv_sec: 1_000_000,
            tv_nsec: 5,
        },
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
    ];
    let before = p.stat("f").unwrap();
    assert_eq!(unsafe { inkfs_futimens(p.fs, fd, times.as_ptr()) }, 0);
    let st = p.stat("f").unwrap();
    assert_eq!((st.st_atime, st.st_atime_nsec), (1_000_000, 5));
    assert_eq!(
        (st.st_mtime, st.st_mtime_nsec),
        (before.st_mtime, before.st_mtime_nsec)
    );
    let bad = [libc::timespec {
        tv_sec: 0,
        tv_nsec: 2_000_000_000,
    }; 2];
    assert_eq!(
        ck(unsafe { inkfs_utimensat(p.fs, AT_FDCWD, c("f").as_ptr(), bad.as_ptr(), 0) }),
        Err(libc::EINVAL)
    );

    // Collapse and insert range, which the FUSE mount cannot offer.
    let data: Vec<u8> = (0..4 * 4096).map(|i| (i / 4096) as u8 + 1).collect();
    p.pwrite(fd, &data, 0).unwrap();
    assert_eq!(
        unsafe { inkfs_fallocate(p.fs, fd, libc::FALLOC_FL_COLLAPSE_RANGE, 4096, 4096) },
        0
    );
    let mut buf = vec![0u8; 3 * 4096];
    assert_eq!(p.pread(fd, &mut buf, 0), Ok(3 * 4096));
    assert!(buf[..4096].iter().all(|&b| b == 1) && buf[4096..8192].iter().all(|&b| b == 3));
    assert_eq!(
        unsafe { inkfs_fallocate(p.fs, fd, libc::FALLOC_FL_INSERT_RANGE, 0, 4096) },
        0
    );
    assert_eq!(p.stat("f").unwrap().st_size, 4 * 4096);
    assert_eq!(
        ck(unsafe { inkfs_fallocate(p.fs, fd, 0x100, 0, 1) }),
        Err(libc::EOPNOTSUPP)
    );
    assert_eq!(
        ck(unsafe { inkfs_fallocate(p.fs, fd, 0, 0, 0) }),
        Err(libc::EINVAL)
    );
    assert_eq!(ck(unsafe { inkfs_fsync(p.fs, fd) }), Ok(0));
    assert_eq!(ck(unsafe { inkfs_fdatasync(p.fs, fd) }), Ok(0));
    assert_eq!(ck(unsafe { inkfs_syncfs(p.fs) }), Ok(0));
}

const AT_FDCWD: c_int = libc::AT_FDCWD;

#[test]
fn credentials_and_umask_are_the_mounts() {
    let p = Pool::new("calls-cred");
    // SAFETY (every unsafe block below): a live mount and valid pointers.
    let old = unsafe { inkfs_umask(p.fs, 0o077) };
    assert_ne!(old, libc::mode_t::MAX);
    let fd = p.open("private", CREAT, 0o666).unwrap();
    p.close(fd).unwrap();
    assert_eq!(p.stat("private").unwrap().st_mode & 0o777, 0o600);
    p.mkdir("mine", 0o700).unwrap();

    // As uid 1000 (not the root directory's owner, nor in its group).
    let groups = [4242 as libc::gid_t];
    assert_eq!(
        unsafe { inkfs_set_credentials(p.fs, 1000, 1000, 1, groups.as_ptr()) },
        0
    );
    assert_eq!(p.open("theirs", CREAT, 0o644), Err(libc::EACCES));
    assert_eq!(p.stat("mine/x").err(), Some(libc::EACCES));
    assert_eq!(
        ck(unsafe { inkfs_access(p.fs, c("private").as_ptr(), libc::R_OK) }),
        Err(libc::EACCES)
    );
    assert_eq!(
        ck(unsafe { inkfs_chmod(p.fs, c("private").as_ptr(), 0o644) }),
        Err(libc::EPERM)
    );
    assert_eq!(
        ck(unsafe { inkfs_set_credentials(p.fs, 1, 1, 1, std::ptr::null()) }),
        Err(libc::EFAULT)
    );

    // Back to the process's own (root, for this test run; whoever runs it
    // owns the root directory, which mkfs gave the caller).
    assert_eq!(unsafe { inkfs_refresh_credentials(p.fs) }, 0);
    let fd = p.open("theirs", CREAT, 0o644).unwrap();
    p.close(fd).unwrap();
}

#[test]
fn read_only_mounts_refuse_changes() {
    let p = Pool::new("calls-ro");
    let fd = p.open("f", CREAT, 0o644).unwrap();
    p.write(fd, b"kept").unwrap();
    p.close(fd).unwrap();
    let path = p.unmount_keep();
    let opts = MountOpts {
        read_only: 1,
        ..MountOpts::default()
    };
    // SAFETY: a valid C string and options.
    let fs = unsafe { inkfs_mount(path.c().as_ptr(), &opts) };
    assert!(!fs.is_null());
    let ro = Pool { fs, path };
    assert_eq!(ro.open("f", libc::O_WRONLY, 0), Err(libc::EROFS));
    assert_eq!(ro.mkdir("d", 0o755), Err(libc::EROFS));
    let fd = ro.open("f", libc::O_RDONLY, 0).unwrap();
    let mut buf = [0u8; 8];
    assert_eq!(ro.read(fd, &mut buf), Ok(4));
    ro.unmount().unwrap();
}

#[test]
fn mkfs_and_mount_refuse_what_they_cannot_use() {
    let path = PoolPath::new("calls-mkfs");
    std::fs::write(&path.0, vec![0u8; 1 << 20]).unwrap();
    // SAFETY: valid C strings.
    unsafe {
        assert_eq!(
            ck(inkfs_mkfs(path.c().as_ptr(), 32 << 20, 2)),
            Err(libc::EEXIST)
        );
        assert!(inkfs_mount(path.c().as_ptr(), std::ptr::null()).is_null());
        assert_eq!(errno(), libc::EINVAL, "not an inkfs pool");
        let why = CStr::from_ptr(inkfs_last_error())
            .to_string_lossy()
            .into_owned();
        assert!(!why.is_empty());
        let missing = PoolPath::new("calls-missing");
        assert!(inkfs_mount(missing.c().as_ptr(), std::ptr::null()).is_null());
        assert_eq!(errno(), libc::ENOENT);
    }
}

#[test]
fn an_unlinked_open_file_lives_until_its_last_close() {
    let p = Pool::new("calls-orphan");
    let fd = p.open("f", CREAT, 0o644).unwrap();
    // SAFETY: a live mount.
    let dup = unsafe { inkfs_dup(p.fs, fd) };
    p.write(fd, &[9u8; 100_000]).unwrap();
    // SAFETY: a live mount and a valid C string.
    assert_eq!(unsafe { inkfs_unlink(p.fs, c("f").as_ptr()) }, 0);
    assert_eq!(p.stat("f").err(), Some(libc::ENOENT));
    p.close(fd).unwrap();
    let mut buf = vec![0u8; 100_000];
    assert_eq!(
        p.pread(dup, &mut buf, 0),
        Ok(100_000),
        "still open through the dup"
    );
    assert!(buf.iter().all(|&b| b == 9));
    p.close(dup).unwrap();
    // Unmount closes what is still open.
    let fd = p.open("g", CREAT, 0o644).unwrap();
    p.write(fd, b"x").unwrap();
    p.unmount().unwrap();
}

#[test]
fn writev_with_o_append_lands_in_one_piece() {
    let p = Pool::new("calls-writev");
    let fd = p.open("f", CREAT | libc::O_APPEND, 0o644).unwrap();
    p.write(fd, b"0123").unwrap();
    let parts: [&[u8]; 3] = [b"ab", b"", b"cdef"];
    let iov: Vec<libc::iovec> = parts
        .iter()
        .map(|s| libc::iovec {
            iov_base: s.as_ptr() as *mut _,
            iov_len: s.len(),
        })
        .collect();
    // SAFETY: a live mount; the iovecs point at live slices.
    let n = unsafe { inkfs_writev(p.fs, fd, iov.as_ptr(), 3) };
    assert_eq!(n, 6);
    assert_eq!(p.lseek(fd, 0, libc::SEEK_CUR), Ok(10));
    let mut buf = [0u8; 10];
    assert_eq!(p.pread(fd, &mut buf, 0), Ok(10));
    assert_eq!(&buf, b"0123abcdef");
    // SAFETY: as above; more iovecs than IOV_MAX.
    assert_eq!(
        ck(unsafe { inkfs_writev(p.fs, fd, iov.as_ptr(), 1025) } as i64),
        Err(libc::EINVAL)
    );
}
