//! The namespace: mkdir, unlink, rmdir, rename, link, symlink, readlink,
//! mknod. Paths are resolved by the engine (`Filesystem::resolve*`), and
//! the trailing-slash rules of Linux's path walk are applied here.

use std::ffi::{c_char, c_int, c_uint};

use inkfs::api::{FileKind, Follow, Rename, RenameFlags, Resolved};

use crate::boundary::{bytes_mut, cstr, fail, ffi, ssize, CResult};
use crate::mount::{mount, Mount};

/// What a path's last component is, as Linux's path walk classifies it
/// (LAST_NORM, LAST_DOT, LAST_DOTDOT, LAST_ROOT): calls that create or
/// remove a name refuse the others, each with its own errno.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Last {
    Name,
    Dot,
    DotDot,
    Root,
}

pub(crate) fn last(path: &[u8]) -> Last {
    let trimmed = match path.iter().rposition(|&b| b != b'/') {
        Some(end) => &path[..=end],
        None => return Last::Root,
    };
    let name = trimmed.rsplit(|&b| b == b'/').next().unwrap_or(trimmed);
    match name {
        b"." => Last::Dot,
        b".." => Last::DotDot,
        _ => Last::Name,
    }
}

/// A component other than a name where a new name is made: EEXIST
/// (filename_create).
fn refuse_new(path: &[u8]) -> CResult<()> {
    if last(path) != Last::Name {
        return fail(libc::EEXIST);
    }
    Ok(())
}

fn parent(m: &Mount, dirfd: c_int, path: &[u8]) -> CResult<Resolved> {
    let at = m.at(dirfd, path)?;
    Ok(m.fs.resolve_parent(&m.cred(), at, path)?)
}

/// A name to create something other than a directory at: a trailing
/// slash makes it fail as Linux's filename_create does (EEXIST if the
/// name exists, else ENOENT).
fn new_name(m: &Mount, dirfd: c_int, path: &[u8]) -> CResult<Resolved> {
    let r = parent(m, dirfd, path)?;
    refuse_new(path)?;
    if r.trailing_slash {
        return match m.fs.lookup(&m.cred(), r.dir, &r.name) {
            Ok(_) => fail(libc::EEXIST),
            Err(e) if e.errno() == libc::ENOENT => fail(libc::ENOENT),
            Err(e) => Err(e.into()),
        };
    }
    Ok(r)
}

/// mkdirat(2).
#[no_mangle]
pub unsafe extern "C" fn inkfs_mkdirat(
    fs: *mut Mount,
    dirfd: c_int,
    path: *const c_char,
    mode: libc::mode_t,
) -> c_int {
    ffi(-1, || {
        let m = mount(fs)?;
        let path = cstr(path)?;
        let r = parent(m, dirfd, path)?;
        refuse_new(path)?;
        m.fs.mkdir(&m.cred(), r.dir, &r.name, mode)?;
        Ok(0)
    })
}

/// mkdir(2).
#[no_mangle]
pub unsafe extern "C" fn inkfs_mkdir(
    fs: *mut Mount,
    path: *const c_char,
    mode: libc::mode_t,
) -> c_int {
    inkfs_mkdirat(fs, libc::AT_FDCWD, path, mode)
}

/// mknodat(2): a regular file, FIFO, socket, or (root only) device node.
/// FIFOs, sockets and devices can be created and listed but not opened
/// through the library (ENXIO).
#[no_mangle]
pub unsafe extern "C" fn inkfs_mknodat(
    fs: *mut Mount,
    dirfd: c_int,
    path: *const c_char,
    mode: libc::mode_t,
    dev: libc::dev_t,
) -> c_int {
    ffi(-1, || {
        let m = mount(fs)?;
        let r = new_name(m, dirfd, cstr(path)?)?;
        let mode = if mode & libc::S_IFMT == 0 {
            mode | libc::S_IFREG
        } else {
            mode
        };
        m.fs.mknod(&m.cred(), r.dir, &r.name, mode, dev)?;
        Ok(0)
    })
}

/// unlinkat(2): flags 0 (unlink) or AT_REMOVEDIR (rmdir).
#[no_mangle]
pub unsafe extern "C" fn inkfs_unlinkat(
    fs: *mut Mount,
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
) -> c_int {
    ffi(-1, || {
        let m = mount(fs)?;
        if flags & !libc::AT_REMOVEDIR != 0 {
            return fail(libc::EINVAL);
        }
        let path = cstr(path)?;
        let r = parent(m, dirfd, path)?;
        let cred = m.cred();
        if flags & libc::AT_REMOVEDIR != 0 {
            match last(path) {
                Last::Name => {}
                Last::Dot => return fail(libc::EINVAL),
                Last::DotDot => return fail(libc::ENOTEMPTY),
                Last::Root => return fail(libc::EBUSY),
            }
            m.fs.rmdir(&cred, r.dir, &r.name)?;
            return Ok(0);
        }
        if last(path) != Last::Name {
            return fail(libc::EISDIR);
        }
        if r.trailing_slash {
            // "name/": a directory is EISDIR, anything else ENOTDIR.
            let a = m.fs.lookup(&cred, r.dir, &r.name)?;
            return fail(if a.kind == FileKind::Dir {
                libc::EISDIR
            } else {
                libc::ENOTDIR
            });
        }
        m.fs.unlink(&cred, r.dir, &r.name)?;
        Ok(0)
    })
}

/// unlink(2).
#[no_mangle]
pub unsafe extern "C" fn inkfs_unlink(fs: *mut Mount, path: *const c_char) -> c_int {
    inkfs_unlinkat(fs, libc::AT_FDCWD, path, 0)
}

/// rmdir(2).
#[no_mangle]
pub unsafe extern "C" fn inkfs_rmdir(fs: *mut Mount, path: *const c_char) -> c_int {
    inkfs_unlinkat(fs, libc::AT_FDCWD, path, libc::AT_REMOVEDIR)
}

/// Trailing slashes in a rename are allowed on directories only; the
/// checks come in do_renameat2's order, interleaved with the ones the
/// engine makes (source exists, NOREPLACE, EXCHANGE's target exists).
fn slashes_in_rename(m: &Mount, from: &Resolved, to: &Resolved, flags: RenameFlags) -> CResult<()> {
    let cred = m.cred();
    let old = m.fs.lookup(&cred, from.dir, &from.name)?;
    let new = match m.fs.lookup(&cred, to.dir, &to.name) {
        Ok(a) => Some(a),
        Err(e) if e.errno() == libc::ENOENT => None,
        Err(e) => return Err(e.into()),
    };
    if flags.noreplace && new.is_some() {
        return fail(libc::EEXIST);
    }
    if flags.exchange {
        match new {
            None => return fail(libc::ENOENT),
            Some(a) if a.kind != FileKind::Dir && to.trailing_slash => return fail(libc::ENOTDIR),
            _ => {}
        }
    }
    if old.kind != FileKind::Dir && (from.trailing_slash || (!flags.exchange && to.trailing_slash))
    {
        return fail(libc::ENOTDIR);
    }
    Ok(())
}

/// renameat2(2): flags RENAME_NOREPLACE, RENAME_EXCHANGE, RENAME_WHITEOUT.
#[no_mangle]
pub unsafe extern "C" fn inkfs_renameat2(
    fs: *mut Mount,
    olddirfd: c_int,
    oldpath: *const c_char,
    newdirfd: c_int,
    newpath: *const c_char,
    flags: c_uint,
) -> c_int {
    ffi(-1, || {
        let m = mount(fs)?;
        let flags = RenameFlags::from_bits(flags)?;
        let (oldpath, newpath) = (cstr(oldpath)?, cstr(newpath)?);
        let from = parent(m, olddirfd, oldpath)?;
        let to = parent(m, newdirfd, newpath)?;
        if last(oldpath) != Last::Name {
            return fail(libc::EBUSY);
        }
        if last(newpath) != Last::Name {
            return fail(if flags.noreplace {
                libc::EEXIST
            } else {
                libc::EBUSY
            });
        }
        let cred = m.cred();
        if from.trailing_slash || to.trailing_slash {
            slashes_in_rename(m, &from, &to, flags)?;
        }
        let r = Rename {
            from_dir: from.dir,
            from: &from.name,
            to_dir: to.dir,
            to: &to.name,
            flags,
        };
        m.fs.rename(&cred, &r)?;
        Ok(0)
    })
}

/// renameat(2).
#[no_mangle]
pub unsafe extern "C" fn inkfs_renameat(
    fs: *mut Mount,
    olddirfd: c_int,
    oldpath: *const c_char,
    newdirfd: c_int,
    newpath: *const c_char,
) -> c_int {
    inkfs_renameat2(fs, olddirfd, oldpath, newdirfd, newpath, 0)
}

/// rename(2).
#[no_mangle]
pub unsafe extern "C" fn inkfs_rename(
    fs: *mut Mount,
    oldpath: *const c_char,
    newpath: *const c_char,
) -> c_int {
    inkfs_renameat2(fs, libc::AT_FDCWD, oldpath, libc::AT_FDCWD, newpath, 0)
}

/// linkat(2): flags AT_SYMLINK_FOLLOW (link what a symbolic link points
/// at, not the link) and AT_EMPTY_PATH (link the descriptor `olddirfd`).
#[no_mangle]
pub unsafe extern "C" fn inkfs_linkat(
    fs: *mut Mount,
    olddirfd: c_int,
    oldpath: *const c_char,
    newdirfd: c_int,
    newpath: *const c_char,
    flags: c_int,
) -> c_int {
    ffi(-1, || {
        let m = mount(fs)?;
        if flags & !(libc::AT_SYMLINK_FOLLOW | libc::AT_EMPTY_PATH) != 0 {
            return fail(libc::EINVAL);
        }
        let old = cstr(oldpath)?;
        let cred = m.cred();
        let ino = if old.is_empty() && flags & libc::AT_EMPTY_PATH != 0 {
            m.fd(olddirfd)?.file.ino()
        } else {
            let follow = if flags & libc::AT_SYMLINK_FOLLOW != 0 {
                Follow::Yes
            } else {
                Follow::No
            };
            let at = m.at(olddirfd, old)?;
            m.fs.resolve(&cred, at, old, follow)?.ino
        };
        let to = new_name(m, newdirfd, cstr(newpath)?)?;
        m.fs.link(&cred, ino, to.dir, &to.name)?;
        Ok(0)
    })
}

/// link(2).
#[no_mangle]
pub unsafe extern "C" fn inkfs_link(
    fs: *mut Mount,
    oldpath: *const c_char,
    newpath: *const c_char,
) -> c_int {
    inkfs_linkat(fs, libc::AT_FDCWD, oldpath, libc::AT_FDCWD, newpath, 0)
}

/// symlinkat(2): `target` is stored as given (an absolute one is followed
/// from the pool's root).
#[no_mangle]
pub unsafe extern "C" fn inkfs_symlinkat(
    fs: *mut Mount,
    target: *const c_char,
    newdirfd: c_int,
    linkpath: *const c_char,
) -> c_int {
    ffi(-1, || {
        let m = mount(fs)?;
        let target = cstr(target)?;
        let r = new_name(m, newdirfd, cstr(linkpath)?)?;
        if target.is_empty() {
            return fail(libc::ENOENT);
        }
        m.fs.symlink(&m.cred(), r.dir, &r.name, target)?;
        Ok(0)
    })
}

/// symlink(2).
#[no_mangle]
pub unsafe extern "C" fn inkfs_symlink(
    fs: *mut Mount,
    target: *const c_char,
    linkpath: *const c_char,
) -> c_int {
    inkfs_symlinkat(fs, target, libc::AT_FDCWD, linkpath)
}

/// readlinkat(2): the target, cut to `bufsiz` bytes, not NUL-terminated;
/// returns its length.
#[no_mangle]
pub unsafe extern "C" fn inkfs_readlinkat(
    fs: *mut Mount,
    dirfd: c_int,
    path: *const c_char,
    buf: *mut c_char,
    bufsiz: libc::size_t,
) -> libc::ssize_t {
    ffi(-1, || {
        let m = mount(fs)?;
        let path = cstr(path)?;
        if bufsiz == 0 || bufsiz > isize::MAX as usize {
            return fail(libc::EINVAL);
        }
        let at = m.at(dirfd, path)?;
        let a = m.fs.resolve(&m.cred(), at, path, Follow::No)?;
        if a.kind != FileKind::Symlink {
            return fail(libc::EINVAL);
        }
        let target = m.fs.readlink(a.ino)?;
        let out = bytes_mut(buf.cast(), bufsiz)?;
        let n = target.len().min(out.len());
        out[..n].copy_from_slice(&target[..n]);
        Ok(ssize(n))
    })
}

/// readlink(2).
#[no_mangle]
pub unsafe extern "C" fn inkfs_readlink(
    fs: *mut Mount,
    path: *const c_char,
    buf: *mut c_char,
    bufsiz: libc::size_t,
) -> libc::ssize_t {
    inkfs_readlinkat(fs, libc::AT_FDCWD, path, buf, bufsiz)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_components_are_classified_as_linux_does() {
        assert_eq!(last(b"a"), Last::Name);
        assert_eq!(last(b"a/b/"), Last::Name);
        assert_eq!(last(b"a/."), Last::Dot);
        assert_eq!(last(b"./"), Last::Dot);
        assert_eq!(last(b"a/..//"), Last::DotDot);
        assert_eq!(last(b".."), Last::DotDot);
        assert_eq!(last(b"/"), Last::Root);
        assert_eq!(last(b"///"), Last::Root);
        assert_eq!(last(b"a/.b"), Last::Name);
    }
}
