//! Opening and closing: openat (path walk, O_CREAT with a symbolic link as
//! the last component followed as Linux follows it), close, dup, fcntl.

use std::ffi::{c_char, c_int, c_long};
use std::sync::Arc;

use inkfs::api::{Credentials, File, FileKind, Follow, OpenFlags, SYMLINKS_MAX};

use crate::boundary::{cstr, fail, ffi, CResult};
use crate::mount::{mount, Mount};
use crate::ofd::Ofd;

/// The open flags this library knows; others are ignored, as Linux
/// ignores unknown open flags.
fn check_flags(flags: c_int) -> CResult<()> {
    if flags & libc::O_TMPFILE == libc::O_TMPFILE {
        // The engine has no anonymous-inode call yet.
        return fail(libc::EOPNOTSUPP);
    }
    if flags & libc::O_PATH != 0 {
        return fail(libc::EOPNOTSUPP);
    }
    if flags & libc::O_ACCMODE == libc::O_ACCMODE {
        return fail(libc::EINVAL);
    }
    if flags & libc::O_CREAT != 0 && flags & libc::O_DIRECTORY != 0 {
        // Linux 6.4 and later.
        return fail(libc::EINVAL);
    }
    Ok(())
}

/// What openat opens: the engine's File for `path` from `at`.
pub(crate) fn open_file(
    m: &Mount,
    cred: &Credentials,
    at: u64,
    path: &[u8],
    flags: c_int,
    mode: u32,
) -> CResult<File> {
    check_flags(flags)?;
    let of = OpenFlags::new(flags);
    if flags & libc::O_CREAT != 0 {
        return open_creat(m, cred, at, path, of, mode);
    }
    let follow = if flags & libc::O_NOFOLLOW != 0 {
        Follow::No
    } else {
        Follow::Yes
    };
    let a = m.fs.resolve(cred, at, path, follow)?;
    if flags & libc::O_DIRECTORY != 0 && a.kind != FileKind::Dir {
        return fail(libc::ENOTDIR);
    }
    Ok(m.fs.open(cred, a.ino, of)?)
}

/// open with O_CREAT: the last component is looked up first (an existing
/// file opens even in a directory the caller may not write), a symbolic
/// link there is followed (and its target created if missing) unless
/// O_EXCL or O_NOFOLLOW say otherwise, as Linux's open_last_lookups does.
fn open_creat(
    m: &Mount,
    cred: &Credentials,
    mut at: u64,
    path: &[u8],
    flags: OpenFlags,
    mode: u32,
) -> CResult<File> {
    let bits = flags.bits();
    let mut path = path.to_vec();
    let mut links = SYMLINKS_MAX;
    loop {
        if crate::names::last(&path) != crate::names::Last::Name {
            // ".", ".." or "/": an existing directory (open_last_lookups
            // walks into it, then do_open refuses it).
            m.fs.resolve(cred, at, &path, Follow::Yes)?;
            return fail(if bits & libc::O_EXCL != 0 {
                libc::EEXIST
            } else {
                libc::EISDIR
            });
        }
        let r = m.fs.resolve_parent(cred, at, &path)?;
        if r.trailing_slash {
            return fail(libc::EISDIR);
        }
        match m.fs.lookup(cred, r.dir, &r.name) {
            Ok(a) => {
                if bits & libc::O_EXCL != 0 {
                    return fail(libc::EEXIST);
                }
                match a.kind {
                    FileKind::Symlink if bits & libc::O_NOFOLLOW != 0 => return fail(libc::ELOOP),
                    FileKind::Symlink => {
                        if links == 0 {
                            return fail(libc::ELOOP);
                        }
                        links -= 1;
                        path = m.fs.readlink(a.ino)?;
                        at = r.dir;
                        continue;
                    }
                    FileKind::Dir => return fail(libc::EISDIR),
                    _ => return Ok(m.fs.open(cred, a.ino, flags)?),
                }
            }
            Err(e) if e.errno() == libc::ENOENT => {
                let (_, file) = m.fs.create(cred, r.dir, &r.name, mode, flags)?;
                return Ok(file);
            }
            Err(e) => return Err(e.into()),
        }
    }
}

fn fd_flags_of(open_flags: c_int) -> i32 {
    if open_flags & libc::O_CLOEXEC != 0 {
        libc::FD_CLOEXEC
    } else {
        0
    }
}

/// openat(2): `path` from the directory open at `dirfd` (AT_FDCWD: the
/// pool's root; an absolute path always starts at the pool's root).
/// Flags: the access mode, O_CREAT, O_EXCL, O_TRUNC, O_APPEND,
/// O_DIRECTORY, O_NOFOLLOW, O_NOATIME, O_SYNC, O_DSYNC, O_CLOEXEC,
/// O_NONBLOCK, O_DIRECT; O_TMPFILE and O_PATH fail with EOPNOTSUPP.
/// `mode` is used with O_CREAT (less the umask). Returns the lowest free
/// descriptor of this mount, or -1 with errno.
#[no_mangle]
pub unsafe extern "C" fn inkfs_openat(
    fs: *mut Mount,
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mode: libc::mode_t,
) -> c_int {
    ffi(-1, || {
        let m = mount(fs)?;
        let path = cstr(path)?;
        let cred = m.cred();
        let at = m.at(dirfd, path)?;
        let file = open_file(m, &cred, at, path, flags, mode)?;
        m.insert(Arc::new(Ofd::new(file)), 0, fd_flags_of(flags))
    })
}

/// open(2): openat from the pool's root.
#[no_mangle]
pub unsafe extern "C" fn inkfs_open(
    fs: *mut Mount,
    path: *const c_char,
    flags: c_int,
    mode: libc::mode_t,
) -> c_int {
    inkfs_openat(fs, libc::AT_FDCWD, path, flags, mode)
}

/// creat(2): open with O_CREAT|O_WRONLY|O_TRUNC.
#[no_mangle]
pub unsafe extern "C" fn inkfs_creat(
    fs: *mut Mount,
    path: *const c_char,
    mode: libc::mode_t,
) -> c_int {
    inkfs_openat(
        fs,
        libc::AT_FDCWD,
        path,
        libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC,
        mode,
    )
}

/// close(2): the descriptor is free at once; the file is closed when no
/// other descriptor (dup) and no call in flight uses it.
#[no_mangle]
pub unsafe extern "C" fn inkfs_close(fs: *mut Mount, fd: c_int) -> c_int {
    ffi(-1, || {
        let m = mount(fs)?;
        let ofd = m.fds.remove(fd)?;
        m.put(ofd);
        Ok(0)
    })
}

/// dup(2): the lowest free descriptor, sharing `fd`'s offset and status
/// flags.
#[no_mangle]
pub unsafe extern "C" fn inkfs_dup(fs: *mut Mount, fd: c_int) -> c_int {
    ffi(-1, || {
        let m = mount(fs)?;
        let ofd = m.fd(fd)?.arc();
        m.insert(ofd, 0, 0)
    })
}

/// dup3(2) (dup2 with `flags` 0 or O_CLOEXEC; `newfd` == `oldfd` is
/// EINVAL): `newfd` names `oldfd`'s description, closing what it named.
#[no_mangle]
pub unsafe extern "C" fn inkfs_dup3(
    fs: *mut Mount,
    oldfd: c_int,
    newfd: c_int,
    flags: c_int,
) -> c_int {
    ffi(-1, || {
        let m = mount(fs)?;
        if flags & !libc::O_CLOEXEC != 0 || oldfd == newfd {
            return fail(libc::EINVAL);
        }
        dup_to(m, oldfd, newfd, fd_flags_of(flags))
    })
}

fn dup_to(m: &Mount, oldfd: c_int, newfd: c_int, fd_flags: i32) -> CResult<c_int> {
    let ofd = m.fd(oldfd)?.arc();
    match m.fds.install(newfd, ofd.clone(), fd_flags) {
        Ok(old) => {
            drop(ofd);
            if let Some(old) = old {
                m.put(old);
            }
            Ok(newfd)
        }
        Err(e) => {
            m.put(ofd);
            Err(e)
        }
    }
}

/// dup2(2): as dup3, except that `newfd` == `oldfd` returns it (if open).
#[no_mangle]
pub unsafe extern "C" fn inkfs_dup2(fs: *mut Mount, oldfd: c_int, newfd: c_int) -> c_int {
    ffi(-1, || {
        let m = mount(fs)?;
        if oldfd == newfd {
            m.fd(oldfd)?;
            return Ok(newfd);
        }
        dup_to(m, oldfd, newfd, 0)
    })
}

/// fcntl(2) for F_GETFL, F_SETFL (O_APPEND, O_NONBLOCK, O_NOATIME,
/// O_DIRECT), F_GETFD, F_SETFD, F_DUPFD and F_DUPFD_CLOEXEC; other
/// commands fail with EINVAL. `arg` is the third argument (ignored where
/// the command takes none).
#[no_mangle]
pub unsafe extern "C" fn inkfs_fcntl(fs: *mut Mount, fd: c_int, cmd: c_int, arg: c_long) -> c_int {
    ffi(-1, || {
        let m = mount(fs)?;
        match cmd {
            libc::F_GETFL => {
                // As Linux: O_LARGEFILE always (64-bit), O_CLOEXEC never
                // (it is the descriptor's, F_GETFD).
                let bits = m.fd(fd)?.file.flags().bits();
                Ok((bits & !libc::O_CLOEXEC) | libc::O_LARGEFILE)
            }
            libc::F_SETFL => {
                let o = m.fd(fd)?;
                o.file.set_status_flags(OpenFlags::new(arg as c_int))?;
                Ok(0)
            }
            libc::F_GETFD => m.fds.fd_flags(fd),
            libc::F_SETFD => {
                m.fds.set_fd_flags(fd, arg as i32)?;
                Ok(0)
            }
            libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => {
                let min = c_int::try_from(arg).map_err(|_| crate::boundary::Errno(libc::EINVAL))?;
                let ofd = m.fd(fd)?.arc();
                let fl = if cmd == libc::F_DUPFD_CLOEXEC {
                    libc::FD_CLOEXEC
                } else {
                    0
                };
                m.insert(ofd, min, fl)
            }
            _ => fail(libc::EINVAL),
        }
    })
}
