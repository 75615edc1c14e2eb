//! Extended attributes: get, set, list and remove, by path (following a
//! symbolic link), by path without following one (the l* calls) and by
//! descriptor (the f* calls). `user.`, `trusted.` (root) and `security.`
//! names, as the engine keeps them.

use std::ffi::{c_char, c_int, c_void};

use inkfs::api::{Follow, XattrFlags};

use crate::boundary::{bytes, bytes_mut, cstr, fail, ffi, CResult};
use crate::mount::{mount, Mount};

/// Where an xattr call acts.
enum On<'a> {
    Path(&'a [u8], Follow),
    Fd(c_int),
}

fn ino(m: &Mount, on: On<'_>) -> CResult<u64> {
    match on {
        On::Path(p, follow) => {
            let at = m.at(libc::AT_FDCWD, p)?;
            Ok(m.fs.resolve(&m.cred(), at, p, follow)?.ino)
        }
        On::Fd(fd) => Ok(m.fd(fd)?.file.ino()),
    }
}

/// Copy `data` out as getxattr/listxattr do: size 0 asks for the length;
/// a buffer too small is ERANGE.
fn give(data: &[u8], out: *mut c_void, size: libc::size_t) -> CResult<libc::ssize_t> {
    if size == 0 {
        return Ok(data.len() as libc::ssize_t);
    }
    if data.len() > size {
        return fail(libc::ERANGE);
    }
    let out = bytes_mut(out, data.len())?;
    out.copy_from_slice(data);
    Ok(data.len() as libc::ssize_t)
}

fn get(
    fs: *mut Mount,
    on: impl FnOnce() -> CResult<On<'static>>,
    name: *const c_char,
    value: *mut c_void,
    size: libc::size_t,
) -> libc::ssize_t {
    ffi(-1, || {
        let m = mount(fs)?;
        let name = cstr(name)?;
        let ino = ino(m, on()?)?;
        let v = m.fs.getxattr(&m.cred(), ino, name)?;
        give(&v, value, size)
    })
}

fn set(
    fs: *mut Mount,
    on: impl FnOnce() -> CResult<On<'static>>,
    name: *const c_char,
    value: *const c_void,
    size: libc::size_t,
    flags: c_int,
) -> c_int {
    ffi(-1, || {
        let m = mount(fs)?;
        let name = cstr(name)?;
        let flags = XattrFlags::from_bits(flags)?;
        if size > 65536 {
            return fail(libc::E2BIG);
        }
        let value = bytes(value, size)?;
        let ino = ino(m, on()?)?;
        m.fs.setxattr(&m.cred(), ino, name, value, flags)?;
        Ok(0)
    })
}

fn list(
    fs: *mut Mount,
    on: impl FnOnce() -> CResult<On<'static>>,
    out: *mut c_char,
    size: libc::size_t,
) -> libc::ssize_t {
    ffi(-1, || {
        let m = mount(fs)?;
        let ino = ino(m, on()?)?;
        let names = m.fs.listxattr(&m.cred(), ino)?;
        let mut all = Vec::with_capacity(names.iter().map(|n| n.len() + 1).sum());
        for n in &names {
            all.extend_from_slice(n);
            all.push(0);
        }
        give(&all, out.cast(), size)
    })
}

fn remove(fs: *mut Mount, on: impl FnOnce() -> CResult<On<'static>>, name: *const c_char) -> c_int {
    ffi(-1, || {
        let m = mount(fs)?;
        let name = cstr(name)?;
        let ino = ino(m, on()?)?;
        m.fs.removexattr(&m.cred(), ino, name)?;
        Ok(0)
    })
}

fn by_path(p: *const c_char, follow: Follow) -> impl FnOnce() -> CResult<On<'static>> {
    move || Ok(On::Path(cstr(p)?, follow))
}

fn by_fd(fd: c_int) -> impl FnOnce() -> CResult<On<'static>> {
    move || Ok(On::Fd(fd))
}

/// getxattr(2): the value's length; `size` 0 asks for the length only;
/// ERANGE if `size` is too small, ENODATA if there is no such attribute.
#[no_mangle]
pub unsafe extern "C" fn inkfs_getxattr(
    fs: *mut Mount,
    path: *const c_char,
    name: *const c_char,
    value: *mut c_void,
    size: libc::size_t,
) -> libc::ssize_t {
    get(fs, by_path(path, Follow::Yes), name, value, size)
}

/// lgetxattr(2).
#[no_mangle]
pub unsafe extern "C" fn inkfs_lgetxattr(
    fs: *mut Mount,
    path: *const c_char,
    name: *const c_char,
    value: *mut c_void,
    size: libc::size_t,
) -> libc::ssize_t {
    get(fs, by_path(path, Follow::No), name, value, size)
}

/// fgetxattr(2).
#[no_mangle]
pub unsafe extern "C" fn inkfs_fgetxattr(
    fs: *mut Mount,
    fd: c_int,
    name: *const c_char,
    value: *mut c_void,
    size: libc::size_t,
) -> libc::ssize_t {
    get(fs, by_fd(fd), name, value, size)
}

/// setxattr(2): flags 0, XATTR_CREATE (EEXIST if present) or
/// XATTR_REPLACE (ENODATA if absent).
#[no_mangle]
pub unsafe extern "C" fn inkfs_setxattr(
    fs: *mut Mount,
    path: *const c_char,
    name: *const c_char,
    value: *const c_void,
    size: libc::size_t,
    flags: c_int,
) -> c_int {
    set(fs, by_path(path, Follow::Yes), name, value, size, flags)
}

/// lsetxattr(2).
#[no_mangle]
pub unsafe extern "C" fn inkfs_lsetxattr(
    fs: *mut Mount,
    path: *const c_char,
    name: *const c_char,
    value: *const c_void,
    size: libc::size_t,
    flags: c_int,
) -> c_int {
    set(fs, by_path(path, Follow::No), name, value, size, flags)
}

/// fsetxattr(2).
#[no_mangle]
pub unsafe extern "C" fn inkfs_fsetxattr(
    fs: *mut Mount,
    fd: c_int,
    name: *const c_char,
    value: *const c_void,
    size: libc::size_t,
    flags: c_int,
) -> c_int {
    set(fs, by_fd(fd), name, value, size, flags)
}

/// listxattr(2): the names the caller may see, each NUL-terminated; the
/// total length; `size` 0 asks for the length only.
#[no_mangle]
pub unsafe extern "C" fn inkfs_listxattr(
    fs: *mut Mount,
    path: *const c_char,
    list_out: *mut c_char,
    size: libc::size_t,
) -> libc::ssize_t {
    list(fs, by_path(path, Follow::Yes), list_out, size)
}

/// llistxattr(2).
#[no_mangle]
pub unsafe extern "C" fn inkfs_llistxattr(
    fs: *mut Mount,
    path: *const c_char,
    list_out: *mut c_char,
    size: libc::size_t,
) -> libc::ssize_t {
    list(fs, by_path(path, Follow::No), list_out, size)
}

/// flistxattr(2).
#[no_mangle]
pub unsafe extern "C" fn inkfs_flistxattr(
    fs: *mut Mount,
    fd: c_int,
    list_out: *mut c_char,
    size: libc::size_t,
) -> libc::ssize_t {
    list(fs, by_fd(fd), list_out, size)
}

/// removexattr(2).
#[no_mangle]
pub unsafe extern "C" fn inkfs_removexattr(
    fs: *mut Mount,
    path: *const c_char,
    name: *const c_char,
) -> c_int {
    remove(fs, by_path(path, Follow::Yes), name)
}

/// lremovexattr(2).
#[no_mangle]
pub unsafe extern "C" fn inkfs_lremovexattr(
    fs: *mut Mount,
    path: *const c_char,
    name: *const c_char,
) -> c_int {
    remove(fs, by_path(path, Follow::No), name)
}

/// fremovexattr(2).
#[no_mangle]
pub unsafe extern "C" fn inkfs_fremovexattr(
    fs: *mut Mount,
    fd: c_int,
    name: *const c_char,
) -> c_int {
    remove(fs, by_fd(fd), name)
}
