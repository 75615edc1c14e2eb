//! Attribute changes: chmod, chown and utimens, by path and by
//! descriptor (fchmod, fchown, futimens, futimes, and utimensat or
//! fchmodat on a descriptor), of files under a served mount
//! (docs/KERNEL-FREE.md, "Attribute changes by the lease holder").
//!
//! A regular file whose write lease this process's client holds (a file
//! it created or wrote), and a directory whose directory lease it holds
//! (docs/KERNEL-FREE.md, "Built: attribute changes under a directory
//! lease"), are changed by the client itself, in the inode's log, with
//! the caller's credentials: no message at all (tar's futimens, fchown
//! and fchmod after writing a file, and its utimensat, fchownat and
//! fchmodat of each directory it extracted into). Anything else is
//! made by the server through the ring (names.rs's `ask`); what the
//! library does not resolve goes to the kernel.

use std::ffi::{c_char, c_int};
use std::sync::atomic::Ordering;

use inkfs::api::ns::Op;
use inkfs::api::{Credentials, FileKind, SetAttr, TimeSet};
use libc::{gid_t, mode_t, uid_t};

use crate::mounts::{self, Mount};
use crate::names::{ask, inode_of, set_errno};
use crate::path::{self, CwdBuf};
use crate::{guard, real, stats, table};

/// Change `set` of inode `ino` (a `kind`) of mount `m` with `cred`: by
/// this process's client if it holds the inode's lease, else by the
/// server. The libc return, or `None` for the kernel.
fn set_attr(
    m: &Mount,
    cred: &Credentials,
    ino: u64,
    kind: FileKind,
    set: SetAttr,
) -> Option<c_int> {
    if matches!(kind, FileKind::File | FileKind::Dir) {
        if let Some(lease) = m.checkout() {
            let c = lease.client();
            let local = match kind {
                FileKind::File => c.setattr_leased(cred, ino, &set),
                // A directory whose lease the client holds (tar's times,
                // owner and mode of a directory it extracted into): the
                // lease stays held.
                _ => c.setattr_dir_leased(cred, ino, &set),
            };
            if let Some(r) = local {
                stats::bump(&stats::ATTR_LOCAL);
                return Some(match r {
                    Ok(_) => 0,
                    Err(e) => {
                        set_errno(e.errno());
                        -1
                    }
                });
            }
        }
    }
    ask(m, cred, Op::Setattr { ino, set })
}

/// The same change by descriptor: a served one (its inode and mount from
/// the descriptor table). `None`: the kernel.
fn set_attr_fd(fd: c_int, set: SetAttr) -> Option<c_int> {
    let (_, ofd) = table::local(fd)?;
    if guard::inside() || ofd.is_path() {
        // (fchmod and friends of an O_PATH descriptor: the kernel's EBADF.)
        return None;
    }
    let r = guard::run(|| {
        let m = mounts::by_index(ofd.mount.load(Ordering::Relaxed) as usize)?;
        let cred = crate::creds::get(crate::creds::Ids::Effective)?;
        let kind = if ofd.is_dir() {
            FileKind::Dir
        } else {
            FileKind::File
        };
        set_attr(m, &cred, ofd.ino.load(Ordering::Relaxed), kind, set)
    })
    .flatten();
    if r.is_none() {
        stats::bump(&stats::NS_KERNEL);
    }
    r
}

/// chmod, chown or utimens of what `path` (relative to `dirfd`) names.
/// `None`: the kernel does it.
fn set_attr_at(dirfd: c_int, p: *const c_char, follow: bool, set: SetAttr) -> Option<c_int> {
    set_attr_at_kind(dirfd, p, follow, set, true)
}

/// [`set_attr_at`]; `symlinks`: a symlink itself may be changed (not a
/// chmod: the kernel's EOPNOTSUPP).
fn set_attr_at_kind(
    dirfd: c_int,
    p: *const c_char,
    follow: bool,
    set: SetAttr,
    symlinks: bool,
) -> Option<c_int> {
    if guard::inside() {
        return None;
    }
    let r = guard::run(|| {
        // SAFETY: the program's path string.
        let bytes = unsafe { path::bytes(p) }?;
        let cred = crate::creds::get(crate::creds::Ids::Effective)?;
        if let Some(n) = crate::lazy::fd_link(bytes).filter(|_| follow) {
            // `/proc/self/fd/N` of a served descriptor (GNU tar chmods the
            // directories it made so, through an O_PATH descriptor): its
            // inode.
            let (_, ofd) = table::local(n)?;
            let m = mounts::by_index(ofd.mount.load(Ordering::Relaxed) as usize)?;
            let kind = if ofd.is_dir() {
                FileKind::Dir
            } else {
                FileKind::File
            };
            return set_attr(m, &cred, ofd.ino.load(Ordering::Relaxed), kind, set);
        }
        let mut cwd = CwdBuf::new();
        let t = path::locate(dirfd, bytes, &mut cwd)?;
        let a = inode_of(&t, &cred, follow)?;
        if !symlinks && a.kind == FileKind::Symlink {
            return None;
        }
        set_attr(t.mount, &cred, a.ino, a.kind, set)
    })
    .flatten();
    if r.is_none() {
        stats::bump(&stats::NS_KERNEL);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn fchmodat(
    dirfd: c_int,
    p: *const c_char,
    mode: mode_t,
    flags: c_int,
) -> c_int {
    // AT_SYMLINK_NOFOLLOW (GNU tar's way for what it extracts): the same
    // unless the name is a symlink, whose mode Linux refuses to change
    // (EOPNOTSUPP): the kernel says so.
    if flags & !libc::AT_SYMLINK_NOFOLLOW == 0 && !p.is_null() {
        let set = SetAttr {
            mode: Some(mode & 0o7777),
            ..SetAttr::default()
        };
        let follow = flags == 0;
        if let Some(r) = set_attr_at_kind(dirfd, p, follow, set, follow) {
            return r;
        }
    }
    // SAFETY: as called.
    unsafe { real::fchmodat(crate::lazy::kernel(dirfd), p, mode, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn chmod(p: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: as called.
    unsafe { fchmodat(libc::AT_FDCWD, p, mode, 0) }
}

/// chown's "leave it": (uid_t)-1.
fn id_change(id: u32) -> Option<u32> {
    (id != u32::MAX).then_some(id)
}

#[no_mangle]
pub unsafe extern "C" fn fchownat(
    dirfd: c_int,
    p: *const c_char,
    uid: uid_t,
    gid: gid_t,
    flags: c_int,
) -> c_int {
    if flags & !libc::AT_SYMLINK_NOFOLLOW == 0 {
        let set = SetAttr {
            uid: id_change(uid),
            gid: id_change(gid),
            ..SetAttr::default()
        };
        let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
        if let Some(r) = set_attr_at(dirfd, p, follow, set) {
            return r;
        }
    }
    // SAFETY: as called.
    unsafe { real::fchownat(crate::lazy::kernel(dirfd), p, uid, gid, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn chown(p: *const c_char, uid: uid_t, gid: gid_t) -> c_int {
    // SAFETY: as called.
    unsafe { fchownat(libc::AT_FDCWD, p, uid, gid, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn lchown(p: *const c_char, uid: uid_t, gid: gid_t) -> c_int {
    // SAFETY: as called.
    unsafe { fchownat(libc::AT_FDCWD, p, uid, gid, libc::AT_SYMLINK_NOFOLLOW) }
}

/// One utimensat time: `None` to leave it (UTIME_OMIT), `Err` if invalid.
fn time_of(t: &libc::timespec) -> Result<Option<TimeSet>, ()> {
    match t.tv_nsec {
        libc::UTIME_OMIT => Ok(None),
        libc::UTIME_NOW => Ok(Some(TimeSet::Now)),
        ns if (0..1_000_000_000).contains(&ns) => t
            .tv_sec
            .checked_mul(1_000_000_000)
            .and_then(|s| s.checked_add(ns))
            .map(|v| Some(TimeSet::At(v)))
            .ok_or(()),
        _ => Err(()),
    }
}

/// The two times of a utimensat call (null: both now). `None`: an
/// invalid one (the kernel's EINVAL).
fn times_of(times: *const libc::timespec) -> Option<(Option<TimeSet>, Option<TimeSet>)> {
    if times.is_null() {
        return Some((Some(TimeSet::Now), Some(TimeSet::Now)));
    }
    // SAFETY: the program's array of two timespecs.
    let t = unsafe { std::slice::from_raw_parts(times, 2) };
    Some((time_of(&t[0]).ok()?, time_of(&t[1]).ok()?))
}

/// utimensat by path (`path` not null).
fn utimens_path(
    dirfd: c_int,
    p: *const c_char,
    times: *const libc::timespec,
    flags: c_int,
) -> Option<c_int> {
    if flags & !libc::AT_SYMLINK_NOFOLLOW != 0 || p.is_null() {
        return None;
    }
    let (atime, mtime) = times_of(times)?;
    if atime.is_none() && mtime.is_none() {
        // Both omitted: nothing changes (the kernel still checks the path).
        return None;
    }
    let set = SetAttr {
        atime,
        mtime,
        ..SetAttr::default()
    };
    set_attr_at(dirfd, p, flags & libc::AT_SYMLINK_NOFOLLOW == 0, set)
}

/// timeval pairs (utimes, lutimes, futimesat) as timespecs.
fn timevals(tv: *const libc::timeval) -> Option<[libc::timespec; 2]> {
    if tv.is_null() {
        return None;
    }
    // SAFETY: the program's array of two timevals.
    let t = unsafe { std::slice::from_raw_parts(tv, 2) };
    let one = |v: &libc::timeval| libc::timespec {
        tv_sec: v.tv_sec,
        tv_nsec: v.tv_usec * 1000,
    };
    Some([one(&t[0]), one(&t[1])])
}

#[no_mangle]
pub unsafe extern "C" fn utimes(p: *const c_char, tv: *const libc::timeval) -> c_int {
    let ts = timevals(tv);
    let ptr = ts.as_ref().map_or(std::ptr::null(), |t| t.as_ptr());
    if tv.is_null() || ts.is_some_and(|t| t.iter().all(|x| (0..1_000_000_000).contains(&x.tv_nsec)))
    {
        if let Some(r) = utimens_path(libc::AT_FDCWD, p, ptr, 0) {
            return r;
        }
    }
    // SAFETY: as called.
    unsafe { real::utimes(p, tv) }
}

#[no_mangle]
pub unsafe extern "C" fn lutimes(p: *const c_char, tv: *const libc::timeval) -> c_int {
    let ts = timevals(tv);
    let ptr = ts.as_ref().map_or(std::ptr::null(), |t| t.as_ptr());
    if tv.is_null() || ts.is_some_and(|t| t.iter().all(|x| (0..1_000_000_000).contains(&x.tv_nsec)))
    {
        if let Some(r) = utimens_path(libc::AT_FDCWD, p, ptr, libc::AT_SYMLINK_NOFOLLOW) {
            return r;
        }
    }
    // SAFETY: as called.
    unsafe { real::lutimes(p, tv) }
}

#[no_mangle]
pub unsafe extern "C" fn utime(p: *const c_char, buf: *const libc::utimbuf) -> c_int {
    let ts = (!buf.is_null()).then(|| {
        // SAFETY: the program's utimbuf.
        let b = unsafe { &*buf };
        [
            libc::timespec {
                tv_sec: b.actime,
                tv_nsec: 0,
            },
            libc::timespec {
                tv_sec: b.modtime,
                tv_nsec: 0,
            },
        ]
    });
    let ptr = ts.as_ref().map_or(std::ptr::null(), |t| t.as_ptr());
    if let Some(r) = utimens_path(libc::AT_FDCWD, p, ptr, 0) {
        return r;
    }
    // SAFETY: as called.
    unsafe { real::utime(p, buf) }
}

#[no_mangle]
pub unsafe extern "C" fn utimensat(
    dirfd: c_int,
    p: *const c_char,
    times: *const libc::timespec,
    flags: c_int,
) -> c_int {
    // A null path is EINVAL in glibc's utimensat (futimens is the call for
    // a descriptor): the kernel path gives that.
    if let Some(r) = utimens_path(dirfd, p, times, flags) {
        return r;
    }
    // SAFETY: as called.
    unsafe { real::utimensat(crate::lazy::kernel(dirfd), p, times, flags) }
}

/// futimens of a served descriptor.
fn futimens_served(fd: c_int, times: *const libc::timespec) -> Option<c_int> {
    let (atime, mtime) = times_of(times)?;
    if atime.is_none() && mtime.is_none() {
        return None;
    }
    set_attr_fd(
        fd,
        SetAttr {
            atime,
            mtime,
            ..SetAttr::default()
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn futimens(fd: c_int, times: *const libc::timespec) -> c_int {
    if let Some(r) = futimens_served(fd, times) {
        return r;
    }
    // SAFETY: as called.
    unsafe { real::futimens(crate::lazy::kernel(fd), times) }
}

#[no_mangle]
pub unsafe extern "C" fn futimes(fd: c_int, tv: *const libc::timeval) -> c_int {
    let ts = timevals(tv);
    let valid = ts.is_some_and(|t| t.iter().all(|x| (0..1_000_000_000).contains(&x.tv_nsec)));
    if tv.is_null() || valid {
        let ptr = ts.as_ref().map_or(std::ptr::null(), |t| t.as_ptr());
        if let Some(r) = futimens_served(fd, ptr) {
            return r;
        }
    }
    // SAFETY: as called.
    unsafe { real::futimes(crate::lazy::kernel(fd), tv) }
}

#[no_mangle]
pub unsafe extern "C" fn fchmod(fd: c_int, mode: mode_t) -> c_int {
    let set = SetAttr {
        mode: Some(mode & 0o7777),
        ..SetAttr::default()
    };
    if let Some(r) = set_attr_fd(fd, set) {
        return r;
    }
    // SAFETY: as called.
    unsafe { real::fchmod(crate::lazy::kernel(fd), mode) }
}

#[no_mangle]
pub unsafe extern "C" fn fchown(fd: c_int, uid: uid_t, gid: gid_t) -> c_int {
    let set = SetAttr {
        uid: id_change(uid),
        gid: id_change(gid),
        ..SetAttr::default()
    };
    if let Some(r) = set_attr_fd(fd, set) {
        return r;
    }
    // SAFETY: as called.
    unsafe { real::fchown(crate::lazy::kernel(fd), uid, gid) }
}
