//! Durability calls on served descriptors: fsync, fdatasync,
//! sync_file_range, and the shared mappings that decide whether the kernel
//! must still be asked.
//!
//! The library serves only strict and sync mounts (the server refuses
//! posix mode), where every write is durable when it returns: a write
//! through the client commits as the engine does, and a write through the
//! mount is sent to the server synchronously (no writeback cache). So
//! fsync has nothing to make durable but what the kernel itself holds: the
//! dirty pages of a shared writable mapping (`mmap` of the kernel
//! descriptor, which the library leaves to the kernel). Those reach the
//! server only through the kernel's write-back, which `fsync(2)` starts.
//!
//! A shared mapping also takes the inode's writes back to the kernel in
//! this process (io.rs asks [`maybe_mapped`]): the mapping and the kernel's
//! page cache stay one, and the kernel's size of the file stays right (a
//! client's write past the end would leave the kernel's size short: a
//! page fault there is a SIGBUS).
//!
//! Hence: a served fsync/fdatasync makes no kernel call and, in strict
//! and sync mode (`Client::fsync_is_noop`), does nothing but these
//! checks, unless this process has a shared mapping of the inode
//! (noted by the `mmap` interposer below), in which case the kernel's
//! fsync runs as without the library. sync_file_range is the same, with
//! nothing to ask of the client. A shared mapping made by another process
//! is that process's to msync or fsync (docs/KERNEL-FREE.md, limits).

use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use libc::{off64_t, size_t};

use crate::io::{route, Op, Route};
use crate::table::Ofd;
use crate::{guard, mounts, real, stats};

/// Inode numbers (on any FUSE mount) this process mapped shared; 0 free.
static MAPPED: [AtomicU64; 64] = [const { AtomicU64::new(0) }; 64];
/// More were mapped than [`MAPPED`] holds: every fsync goes to the kernel.
static MAPPED_MANY: AtomicBool = AtomicBool::new(false);
/// Whether any inode was ever noted: most processes map no file of a
/// mount shared, and every served write asks (one load instead of 64).
static MAPPED_ANY: AtomicBool = AtomicBool::new(false);

fn note_mapped(ino: u64) {
    // Before the entry: a write that sees the entry sees this too (and
    // one that races the mmap call may take either path, as before).
    MAPPED_ANY.store(true, Ordering::Release);
    for m in &MAPPED {
        match m.compare_exchange(0, ino, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return,
            Err(v) if v == ino => return,
            Err(_) => {}
        }
    }
    MAPPED_MANY.store(true, Ordering::Release);
}

/// Whether the kernel may hold dirty pages of `ino` from a shared mapping
/// of this process.
pub fn maybe_mapped(ino: u64) -> bool {
    if !MAPPED_ANY.load(Ordering::Acquire) {
        return false;
    }
    MAPPED_MANY.load(Ordering::Acquire) || MAPPED.iter().any(|m| m.load(Ordering::Acquire) == ino)
}

/// The inode of `fd` if it is a file on a FUSE mount of this process,
/// after a kernel fstat of it.
fn fuse_inode(fd: c_int) -> Option<u64> {
    // The kernel's fstat makes the kernel's idea of the size current: the
    // server invalidated its attributes when it granted this process's
    // client the lease, so the kernel asks the server, which recalls the
    // lease first. A page fault past the kernel's (stale) end of file would
    // be a SIGBUS: a file the client just extended (SQLite's -shm) is
    // mapped right after.
    // SAFETY: all-zero is a valid stat64; the kernel fills it.
    let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
    if unsafe { real::fstat64(crate::lazy::kernel(fd), &mut st) } != 0 {
        return None;
    }
    if let Some((_, o)) = crate::table::get(fd) {
        return Some(o.ino.load(Ordering::Relaxed));
    }
    // Not registered (opened before the library saw it, or by glibc).
    mounts::by_dev(st.st_dev).map(|_| st.st_ino)
}

/// Any mapping of a file: the kernel's size of it made current first;
/// a shared one noted (its inode's writes and fsyncs are then the
/// kernel's in this process, so the mapping, the page cache and the file
/// never disagree).
#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off64_t,
) -> *mut c_void {
    // A private copy of a served file's bytes, if it may be (map.rs).
    if fd >= 0 {
        if let Some(p) = crate::map::private_copy(len, prot, flags, fd, off) {
            return p;
        }
    }
    // Noted before the mapping exists: a write or fsync racing it uses the
    // kernel. The library's own mappings (the pool) are made inside it.
    if fd >= 0 && flags & libc::MAP_ANONYMOUS == 0 && !guard::inside() {
        let _ = guard::run(|| {
            if let Some(ino) = fuse_inode(fd) {
                if flags & libc::MAP_SHARED != 0 {
                    note_mapped(ino);
                }
            }
        });
    }
    // SAFETY: as called.
    unsafe { real::mmap64(addr, len, prot, flags, crate::lazy::kernel(fd), off) }
}

#[no_mangle]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off64_t,
) -> *mut c_void {
    // SAFETY: as called.
    unsafe { mmap64(addr, len, prot, flags, fd, off) }
}

/// A served fsync: `Some(0)` if the client answered it, `None` to ask the
/// kernel.
fn pool_fsync(idx: usize, ofd: &Ofd, datasync: bool) -> Option<c_int> {
    let ino = ofd.ino.load(Ordering::Relaxed);
    if ofd.is_dir() || maybe_mapped(ino) {
        return None;
    }
    let m = mounts::by_index(ofd.mount.load(Ordering::Relaxed) as usize)?;
    let lease = m.checkout()?;
    if lease.client().fsync_is_noop() {
        // Strict and sync mode: every write through the client returned
        // with its commit fenced, and every write through the kernel went
        // to the server synchronously (no writeback cache), which
        // committed it as durably before answering; a shared mapping's
        // pages, the one thing the kernel may hold, took the kernel path
        // above. Nothing is left to make durable, and the engine's fsync
        // would not look at the file: no look-up of its handle either
        // (the open-file entry's read lock, and its open at a first use).
        stats::bump(&stats::SYNC_LOCAL);
        return Some(0);
    }
    // A pool whose fsync writes (posix mode, which the server refuses to
    // clients today): the inode's writing client does it.
    lease
        .with_file(idx, ofd, |c, f| c.fsync(f, datasync))?
        .ok()?;
    stats::bump(&stats::SYNC_LOCAL);
    Some(0)
}

fn served_fsync(fd: c_int, datasync: bool) -> Option<c_int> {
    match route(fd, Op::Write) {
        // `run` gives None on a thread already inside the library.
        Route::Served(idx, ofd) => guard::run(|| pool_fsync(idx, ofd, datasync)).flatten(),
        Route::Kernel => None,
    }
}

#[no_mangle]
pub unsafe extern "C" fn fsync(fd: c_int) -> c_int {
    if let Some(r) = served_fsync(fd, false) {
        return r;
    }
    // SAFETY: no memory involved.
    unsafe { real::fsync(crate::lazy::kernel(fd)) }
}

#[no_mangle]
pub unsafe extern "C" fn fdatasync(fd: c_int) -> c_int {
    if let Some(r) = served_fsync(fd, true) {
        return r;
    }
    // SAFETY: no memory involved.
    unsafe { real::fdatasync(crate::lazy::kernel(fd)) }
}

const SFR_FLAGS: c_uint = libc::SYNC_FILE_RANGE_WAIT_BEFORE
    | libc::SYNC_FILE_RANGE_WRITE
    | libc::SYNC_FILE_RANGE_WAIT_AFTER;

#[no_mangle]
pub unsafe extern "C" fn sync_file_range(
    fd: c_int,
    off: off64_t,
    n: off64_t,
    flags: c_uint,
) -> c_int {
    // Arguments the kernel refuses are the kernel's to refuse.
    if off >= 0 && n >= 0 && flags & !SFR_FLAGS == 0 && !guard::inside() {
        if let Route::Served(_, ofd) = route(fd, Op::Write) {
            // Nothing is waiting in the kernel but a shared mapping's pages.
            if !ofd.is_dir() && !maybe_mapped(ofd.ino.load(Ordering::Relaxed)) {
                stats::bump(&stats::SYNC_LOCAL);
                return 0;
            }
        }
    }
    // SAFETY: no memory involved.
    unsafe { real::sync_file_range(crate::lazy::kernel(fd), off, n, flags) }
}
