//! Attributes: the stat family, chmod, chown, utimensat, access, statfs.

use std::ffi::{c_char, c_int};

use inkfs::api::{Attr, Follow, SetAttr, TimeSet, MAY_EXEC, MAY_READ, MAY_WRITE};

use crate::boundary::{cstr, fail, ffi, load, store, zeroed, CResult, Errno};
use crate::mount::{mount, Mount};

/// Block size st_blksize reports and statfs counts in.
const BLOCK_SIZE: u32 = 4096;
/// f_type of statfs: "INKF".
pub const INKFS_SUPER_MAGIC: u32 = 0x494e_4b46;

/// The inode a path-or-descriptor call names: `path` from `dirfd`, or
/// with AT_EMPTY_PATH and an empty path the descriptor `dirfd` itself.
fn target(m: &Mount, dirfd: c_int, path: &[u8], flags: c_int) -> CResult<Attr> {
    if path.is_empty() && flags & libc::AT_EMPTY_PATH != 0 {
        if dirfd == libc::AT_FDCWD {
            return Ok(m.fs.getattr(inkfs::api::ROOT_INO)?);
        }
        let o = m.fd(dirfd)?;
        return Ok(m.fs.getattr(o.file.ino())?);
    }
    let follow = if flags & libc::AT_SYMLINK_NOFOLLOW != 0 {
        Follow::No
    } else {
        Follow::Yes
    };
    let at = m.at(dirfd, path)?;
    Ok(m.fs.resolve(&m.cred(), at, path, follow)?)
}

fn split_ns(ns: i64) -> (i64, i64) {
    (ns.div_euclid(1_000_000_000), ns.rem_euclid(1_000_000_000))
}

fn stat_of(m: &Mount, a: &Attr) -> libc::stat {
    let mut st: libc::stat = zeroed();
    st.st_dev = m.dev;
    st.st_ino = a.ino;
    st.st_nlink = a.nlink.into();
    st.st_mode = a.mode;
    st.st_uid = a.uid;
    st.st_gid = a.gid;
    st.st_rdev = a.rdev;
    st.st_size = a.size as i64;
    st.st_blksize = BLOCK_SIZE.into();
    st.st_blocks = a.blocks as i64;
    (st.st_atime, st.st_atime_nsec) = split_ns(a.atime_ns);
    (st.st_mtime, st.st_mtime_nsec) = split_ns(a.mtime_ns);
    (st.st_ctime, st.st_ctime_nsec) = split_ns(a.ctime_ns);
    st
}

/// fstatat(2): flags AT_SYMLINK_NOFOLLOW (lstat), AT_EMPTY_PATH (the
/// descriptor itself with an empty path), AT_NO_AUTOMOUNT (ignored).
/// st_dev is the pool's (from its UUID), st_blksize 4096.
#[no_mangle]
pub unsafe extern "C" fn inkfs_fstatat(
    fs: *mut Mount,
    dirfd: c_int,
    path: *const c_char,
    buf: *mut libc::stat,
    flags: c_int,
) -> c_int {
    ffi(-1, || {
        let m = mount(fs)?;
        let known = libc::AT_SYMLINK_NOFOLLOW | libc::AT_EMPTY_PATH | libc::AT_NO_AUTOMOUNT;
        if flags & !known != 0 {
            return fail(libc::EINVAL);
        }
        let path = cstr(path)?;
        if buf.is_null() {
            return fail(libc::EFAULT);
        }
        let a = target(m, dirfd, path, flags)?;
        store(buf, stat_of(m, &a))?;
        Ok(0)
    })
}

/// stat(2).
#[no_mangle]
pub unsafe extern "C" fn inkfs_stat(
    fs: *mut Mount,
    path: *const c_char,
    buf: *mut libc::stat,
) -> c_int {
    inkfs_fstatat(fs, libc::AT_FDCWD, path, buf, 0)
}

/// lstat(2).
#[no_mangle]
pub unsafe extern "C" fn inkfs_lstat(
    fs: *mut Mount,
    path: *const c_char,
    buf: *mut libc::stat,
) -> c_int {
    inkfs_fstatat(fs, libc::AT_FDCWD, path, buf, libc::AT_SYMLINK_NOFOLLOW)
}

/// fstat(2).
#[no_mangle]
pub unsafe extern "C" fn inkfs_fstat(fs: *mut Mount, fd: c_int, buf: *mut libc::stat) -> c_int {
    ffi(-1, || {
        let m = mount(fs)?;
        if buf.is_null() {
            return fail(libc::EFAULT);
        }
        let a = m.fs.getattr(m.fd(fd)?.file.ino())?;
        store(buf, stat_of(m, &a))?;
        Ok(0)
    })
}

fn setattr_at(m: &Mount, dirfd: c_int, path: &[u8], flags: c_int, set: &SetAttr) -> CResult<()> {
    let a = target(m, dirfd, path, flags)?;
    m.fs.setattr(&m.cred(), a.ino, set, None)?;
    Ok(())
}

fn setattr_fd(m: &Mount, fd: c_int, set: &SetAttr) -> CResult<()> {
    let o = m.fd(fd)?;
    m.fs.setattr(&m.cred(), o.file.ino(), set, None)?;
    Ok(())
}

fn mode_attr(mode: libc::mode_t) -> SetAttr {
    SetAttr {
        mode: Some(mode & 0o7777),
        ..SetAttr::default()
    }
}

/// fchmodat(2): flags 0 or AT_SYMLINK_NOFOLLOW (which, on a symbolic
/// link, fails with EOPNOTSUPP as on Linux).
#[no_mangle]
pub unsafe extern "C" fn inkfs_fchmodat(
    fs: *mut Mount,
    dirfd: c_int,
    path: *const c_char,
    mode: libc::mode_t,
    flags: c_int,
) -> c_int {
    ffi(-1, || {
        let m = mount(fs)?;
        if flags & !(libc::AT_SYMLINK_NOFOLLOW | libc::AT_EMPTY_PATH) != 0 {
            return fail(libc::EINVAL);
        }
        let path = cstr(path)?;
        let a = target(m, dirfd, path, flags)?;
        if a.kind == inkfs::api::FileKind::Symlink {
            return fail(libc::EOPNOTSUPP);
        }
        m.fs.setattr(&m.cred(), a.ino, &mode_attr(mode), None)?;
        Ok(0)
    })
}

/// chmod(2).
#[no_mangle]
pub unsafe extern "C" fn inkfs_chmod(
    fs: *mut Mount,
    path: *const c_char,
    mode: libc::mode_t,
) -> c_int {
    inkfs_fchmodat(fs, libc::AT_FDCWD, path, mode, 0)
}

/// fchmod(2).
#[no_mangle]
pub unsafe extern "C" fn inkfs_fchmod(fs: *mut Mount, fd: c_int, mode: libc::mode_t) -> c_int {
    ffi(-1, || {
        setattr_fd(mount(fs)?, fd, &mode_attr(mode))?;
        Ok(0)
    })
}

fn owner_attr(uid: libc::uid_t, gid: libc::gid_t) -> SetAttr {
    SetAttr {
        uid: (uid != libc::uid_t::MAX).then_some(uid),
        gid: (gid != libc::gid_t::MAX).then_some(gid),
        ..SetAttr::default()
    }
}

/// fchownat(2): -1 leaves an id unchanged; flags AT_SYMLINK_NOFOLLOW,
/// AT_EMPTY_PATH.
#[no_mangle]
pub unsafe extern "C" fn inkfs_fchownat(
    fs: *mut Mount,
    dirfd: c_int,
    path: *const c_char,
    uid: libc::uid_t,
    gid: libc::gid_t,
    flags: c_int,
) -> c_int {
    ffi(-1, || {
        let m = mount(fs)?;
        if flags & !(libc::AT_SYMLINK_NOFOLLOW | libc::AT_EMPTY_PATH) != 0 {
            return fail(libc::EINVAL);
        }
        let path = cstr(path)?;
        setattr_at(m, dirfd, path, flags, &owner_attr(uid, gid))?;
        Ok(0)
    })
}

/// chown(2).
#[no_mangle]
pub unsafe extern "C" fn inkfs_chown(
    fs: *mut Mount,
    path: *const c_char,
    uid: libc::uid_t,
    gid: libc::gid_t,
) -> c_int {
    inkfs_fchownat(fs, libc::AT_FDCWD, path, uid, gid, 0)
}

/// lchown(2).
#[no_mangle]
pub unsafe extern "C" fn inkfs_lchown(
    fs: *mut Mount,
    path: *const c_char,
    uid: libc::uid_t,
    gid: libc::gid_t,
) -> c_int {
    inkfs_fchownat(
        fs,
        libc::AT_FDCWD,
        path,
        uid,
        gid,
        libc::AT_SYMLINK_NOFOLLOW,
    )
}

/// fchown(2).
#[no_mangle]
pub unsafe extern "C" fn inkfs_fchown(
    fs: *mut Mount,
    fd: c_int,
    uid: libc::uid_t,
    gid: libc::gid_t,
) -> c_int {
    ffi(-1, || {
        setattr_fd(mount(fs)?, fd, &owner_attr(uid, gid))?;
        Ok(0)
    })
}

fn time_set(t: libc::timespec) -> CResult<Option<TimeSet>> {
    match t.tv_nsec {
        libc::UTIME_OMIT => Ok(None),
        libc::UTIME_NOW => Ok(Some(TimeSet::Now)),
        ns if (0..1_000_000_000).contains(&ns) => {
            let at = t
                .tv_sec
                .checked_mul(1_000_000_000)
                .and_then(|s| s.checked_add(ns))
                .ok_or(Errno(libc::EINVAL))?;
            Ok(Some(TimeSet::At(at)))
        }
        _ => fail(libc::EINVAL),
    }
}

/// The SetAttr of a utimensat `times` array (NULL: both now).
fn times_attr(times: *const libc::timespec) -> CResult<SetAttr> {
    let (atime, mtime) = match load(times) {
        None => (Some(TimeSet::Now), Some(TimeSet::Now)),
        Some(a) => {
            // SAFETY: a non-NULL `times` points at two timespecs
            // (utimensat's contract); the first was read above.
            let m = unsafe { times.add(1).read() };
            (time_set(a)?, time_set(m)?)
        }
    };
    Ok(SetAttr {
        atime,
        mtime,
        ..SetAttr::default()
    })
}

/// utimensat(2): `times` NULL (both now) or two timespecs (atime, mtime)
/// with UTIME_NOW and UTIME_OMIT; flags AT_SYMLINK_NOFOLLOW,
/// AT_EMPTY_PATH. A path of NULL with a descriptor is futimens.
#[no_mangle]
pub unsafe extern "C" fn inkfs_utimensat(
    fs: *mut Mount,
    dirfd: c_int,
    path: *const c_char,
    times: *const libc::timespec,
    flags: c_int,
) -> c_int {
    ffi(-1, || {
        let m = mount(fs)?;
        if flags & !(libc::AT_SYMLINK_NOFOLLOW | libc::AT_EMPTY_PATH) != 0 {
            return fail(libc::EINVAL);
        }
        let set = times_attr(times)?;
        let a = match crate::boundary::cstr_opt(path)? {
            None => m.fs.getattr(m.fd(dirfd)?.file.ino())?,
            Some(p) => target(m, dirfd, p, flags)?,
        };
        if set.atime.is_none() && set.mtime.is_none() {
            return Ok(0);
        }
        m.fs.setattr(&m.cred(), a.ino, &set, None)?;
        Ok(0)
    })
}

/// futimens(2).
#[no_mangle]
pub unsafe extern "C" fn inkfs_futimens(
    fs: *mut Mount,
    fd: c_int,
    times: *const libc::timespec,
) -> c_int {
    inkfs_utimensat(fs, fd, std::ptr::null(), times, 0)
}

/// faccessat(2): `mode` F_OK or a mask of R_OK, W_OK, X_OK; flags
/// AT_EACCESS (the only ids there are are the mount's credentials, so it
/// changes nothing), AT_SYMLINK_NOFOLLOW, AT_EMPTY_PATH.
#[no_mangle]
pub unsafe extern "C" fn inkfs_faccessat(
    fs: *mut Mount,
    dirfd: c_int,
    path: *const c_char,
    mode: c_int,
    flags: c_int,
) -> c_int {
    ffi(-1, || {
        let m = mount(fs)?;
        let known = libc::AT_EACCESS | libc::AT_SYMLINK_NOFOLLOW | libc::AT_EMPTY_PATH;
        if flags & !known != 0 || mode & !(libc::R_OK | libc::W_OK | libc::X_OK) != 0 {
            return fail(libc::EINVAL);
        }
        let path = cstr(path)?;
        let a = target(m, dirfd, path, flags)?;
        let mut mask = 0;
        if mode & libc::R_OK != 0 {
            mask |= MAY_READ;
        }
        if mode & libc::W_OK != 0 {
            mask |= MAY_WRITE;
        }
        if mode & libc::X_OK != 0 {
            mask |= MAY_EXEC;
        }
        m.fs.access(&m.cred(), a.ino, mask)?;
        Ok(0)
    })
}

/// access(2).
#[no_mangle]
pub unsafe extern "C" fn inkfs_access(fs: *mut Mount, path: *const c_char, mode: c_int) -> c_int {
    inkfs_faccessat(fs, libc::AT_FDCWD, path, mode, 0)
}

fn statfs_of(m: &Mount) -> libc::statfs {
    let s = m.fs.statfs();
    let mut st: libc::statfs = zeroed();
    st.f_type = INKFS_SUPER_MAGIC.into();
    st.f_bsize = s.block_size.into();
    st.f_frsize = s.block_size.into();
    st.f_blocks = s.blocks;
    st.f_bfree = s.blocks_free;
    st.f_bavail = s.blocks_avail;
    st.f_files = s.files;
    st.f_ffree = s.files_free;
    st.f_namelen = s.name_max.into();
    let fsid = [m.dev as u32 as i32, (m.dev >> 32) as u32 as i32];
    // SAFETY: fsid_t is two ints (its field is private in libc, so it is
    // built from its bytes).
    st.f_fsid = unsafe { std::mem::transmute::<[i32; 2], libc::fsid_t>(fsid) };
    st
}

/// statfs(2) of the mount (`path` must exist): f_type INKFS_SUPER_MAGIC,
/// blocks of 4096 bytes.
#[no_mangle]
pub unsafe extern "C" fn inkfs_statfs(
    fs: *mut Mount,
    path: *const c_char,
    buf: *mut libc::statfs,
) -> c_int {
    ffi(-1, || {
        let m = mount(fs)?;
        let path = cstr(path)?;
        if buf.is_null() {
            return fail(libc::EFAULT);
        }
        target(m, libc::AT_FDCWD, path, 0)?;
        store(buf, statfs_of(m))?;
        Ok(0)
    })
}

/// fstatfs(2).
#[no_mangle]
pub unsafe extern "C" fn inkfs_fstatfs(fs: *mut Mount, fd: c_int, buf: *mut libc::statfs) -> c_int {
    ffi(-1, || {
        let m = mount(fs)?;
        if buf.is_null() {
            return fail(libc::EFAULT);
        }
        m.fd(fd)?;
        store(buf, statfs_of(m))?;
        Ok(0)
    })
}
