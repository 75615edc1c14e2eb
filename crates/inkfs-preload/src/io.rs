//! Data calls: read, write and their vector and positional forms, lseek,
//! and the kernel's own copy calls (sendfile, copy_file_range, splice)
//! that move a file position.
//!
//! A served descriptor's file position is the library's ([`Ofd::offset`]);
//! the kernel descriptor's own offset is stale until an exec hands the
//! descriptor over (process.rs). So every call that uses or moves the
//! position is here: reads are served from the pool at the library's
//! offset, or (no client, the engine could not open the file) made
//! with pread on the kernel descriptor at that offset. Writes (and
//! ftruncate) of a descriptor open for writing go through the client under
//! the inode's write lease (mounts.rs: the process's one client holds
//! it); when the client cannot (lease refused, any error: it then wrote
//! nothing) the kernel descriptor does it, with pwrite at the
//! library's offset, or for O_APPEND through the kernel's write, after
//! which the library takes the kernel's new offset.
//!
//! A sequential read advances the offset by compare-and-swap from the
//! value it read at: two threads or processes reading one shared
//! description never get the same bytes (one retries at the new offset).

use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::Ordering;

use libc::{iovec, off64_t, size_t, ssize_t};

use crate::table::{self, Ofd};
use crate::{guard, mounts, real, stats};

/// What a call on a descriptor does: the one place that decides.
#[derive(Clone, Copy)]
pub enum Route {
    /// Not a served descriptor (or the library is busy on this thread):
    /// the real libc function, as without the library.
    Kernel,
    /// A served open file; the library's offset is the file position.
    Served(usize, &'static Ofd),
}

/// The kind of call being routed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Read,
    /// Writes, ftruncate, fsync: served through the client under the
    /// inode's write lease; the descriptor's access mode is checked where
    /// the write is made (a read-only one goes to the kernel, which
    /// refuses it).
    Write,
    Seek,
    Stat,
    Dir,
}

/// Also while this thread is inside the library (a signal handler that
/// interrupted it): the callers then use the kernel descriptor at the
/// library's offset, touching no client (nothing that allocates or locks).
pub fn route(fd: c_int, op: Op) -> Route {
    match table::local(fd) {
        Some((i, o)) => match op {
            _ if op != Op::Stat && o.is_path() => Route::Kernel,
            Op::Read if o.is_dir() || !o.readable() => Route::Kernel,
            Op::Write if o.is_dir() => Route::Kernel,
            Op::Dir if !o.is_dir() => Route::Kernel,
            _ => Route::Served(i, o),
        },
        None => Route::Kernel,
    }
}

fn set_errno(e: c_int) {
    // SAFETY: this thread's errno.
    unsafe { *libc::__errno_location() = e };
}

fn fail(e: c_int) -> ssize_t {
    set_errno(e);
    -1
}

/// Read into `iov` at `off` from the pool. `None`: take the kernel path.
pub(crate) fn pool_read(idx: usize, ofd: &Ofd, iov: &[iovec], off: u64) -> Option<usize> {
    let m = mounts::by_index(ofd.mount.load(Ordering::Relaxed) as usize)?;
    let lease = m.checkout()?;
    let r = lease.with_file(idx, ofd, |c, f| {
        c.call(|fs| {
            let mut total = 0usize;
            for v in iov {
                if v.iov_len == 0 {
                    continue;
                }
                // SAFETY: the program gave this buffer for the read.
                let buf = unsafe { std::slice::from_raw_parts_mut(v.iov_base.cast(), v.iov_len) };
                let n = fs.read(f, off + total as u64, buf)?;
                total += n;
                if n < buf.len() {
                    break;
                }
            }
            Ok::<usize, inkfs::api::Error>(total)
        })
    })?;
    r.ok()
}

/// pread(v) on the kernel descriptor.
fn kernel_read(fd: c_int, iov: &[iovec], off: u64) -> ssize_t {
    // SAFETY: the program's buffers, passed on as given.
    unsafe {
        if iov.len() == 1 {
            real::pread64(
                crate::lazy::kernel(fd),
                iov[0].iov_base,
                iov[0].iov_len,
                off as off64_t,
            )
        } else {
            real::preadv64(
                crate::lazy::kernel(fd),
                iov.as_ptr(),
                iov.len() as c_int,
                off as off64_t,
            )
        }
    }
}

/// A positional read on a served file: from the pool if `pool` (and a
/// client is free), else the kernel descriptor.
fn read_at(fd: c_int, idx: usize, ofd: &Ofd, iov: &[iovec], off: u64, pool: bool) -> ssize_t {
    let served = if pool {
        pool_read(idx, ofd, iov, off)
    } else {
        None
    };
    match served {
        Some(n) => {
            stats::bump(&stats::READ_LOCAL);
            n as ssize_t
        }
        None => {
            stats::bump(&stats::READ_KERNEL);
            kernel_read(fd, iov, off)
        }
    }
}

/// A read at the file position, which it advances.
fn read_seq(fd: c_int, idx: usize, ofd: &Ofd, iov: &[iovec], pool: bool) -> ssize_t {
    loop {
        let off = ofd.offset.load(Ordering::Acquire);
        let r = read_at(fd, idx, ofd, iov, off, pool);
        if r <= 0 {
            return r;
        }
        if ofd
            .offset
            .compare_exchange(off, off + r as u64, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
            || !ofd.is_local()
        {
            return r;
        }
    }
}

fn one(buf: *mut c_void, n: size_t) -> [iovec; 1] {
    [iovec {
        iov_base: buf,
        iov_len: n,
    }]
}

/// The program's iovec array (None: a count the kernel would refuse).
unsafe fn iovs<'a>(iov: *const iovec, cnt: c_int) -> Option<&'a [iovec]> {
    if iov.is_null() || !(1..=libc::UIO_MAXIOV).contains(&cnt) {
        return None;
    }
    // SAFETY: the program's array of `cnt` iovecs.
    Some(unsafe { std::slice::from_raw_parts(iov, cnt as usize) })
}

#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    if let Route::Served(idx, ofd) = route(fd, Op::Read) {
        if let Some(r) = guard::serve(|pool| read_seq(fd, idx, ofd, &one(buf, n), pool)) {
            return r;
        }
    }
    // SAFETY: as called.
    unsafe { real::read(crate::lazy::kernel(fd), buf, n) }
}

extern "C" {
    fn __chk_fail() -> !;
}

#[no_mangle]
pub unsafe extern "C" fn __read_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    len: size_t,
) -> ssize_t {
    if n > len {
        // SAFETY: glibc's fortify failure report; does not return.
        unsafe { __chk_fail() }
    }
    // SAFETY: as called.
    unsafe { read(fd, buf, n) }
}

#[no_mangle]
pub unsafe extern "C" fn pread64(fd: c_int, buf: *mut c_void, n: size_t, off: off64_t) -> ssize_t {
    if off >= 0 {
        if let Route::Served(idx, ofd) = route(fd, Op::Read) {
            if let Some(r) = guard::run(|| read_at(fd, idx, ofd, &one(buf, n), off as u64, true)) {
                return r;
            }
        }
    }
    // SAFETY: as called.
    unsafe { real::pread64(crate::lazy::kernel(fd), buf, n, off) }
}

#[no_mangle]
pub unsafe extern "C" fn pread(fd: c_int, buf: *mut c_void, n: size_t, off: off64_t) -> ssize_t {
    // SAFETY: as called.
    unsafe { pread64(fd, buf, n, off) }
}

#[no_mangle]
pub unsafe extern "C" fn __pread64_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    off: off64_t,
    len: size_t,
) -> ssize_t {
    if n > len {
        // SAFETY: as in __read_chk.
        unsafe { __chk_fail() }
    }
    // SAFETY: as called.
    unsafe { pread64(fd, buf, n, off) }
}

#[no_mangle]
pub unsafe extern "C" fn __pread_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    off: off64_t,
    len: size_t,
) -> ssize_t {
    // SAFETY: as called.
    unsafe { __pread64_chk(fd, buf, n, off, len) }
}

#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    if let (Route::Served(idx, ofd), Some(v)) = (route(fd, Op::Read), unsafe { iovs(iov, cnt) }) {
        if let Some(r) = guard::serve(|pool| read_seq(fd, idx, ofd, v, pool)) {
            return r;
        }
    }
    // SAFETY: as called.
    unsafe { real::readv(crate::lazy::kernel(fd), iov, cnt) }
}

#[no_mangle]
pub unsafe extern "C" fn preadv64(
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
    off: off64_t,
) -> ssize_t {
    if off >= 0 {
        if let (Route::Served(idx, ofd), Some(v)) = (route(fd, Op::Read), unsafe { iovs(iov, cnt) })
        {
            if let Some(r) = guard::run(|| read_at(fd, idx, ofd, v, off as u64, true)) {
                return r;
            }
        }
    }
    // SAFETY: as called.
    unsafe { real::preadv64(crate::lazy::kernel(fd), iov, cnt, off) }
}

#[no_mangle]
pub unsafe extern "C" fn preadv(fd: c_int, iov: *const iovec, cnt: c_int, off: off64_t) -> ssize_t {
    // SAFETY: as called.
    unsafe { preadv64(fd, iov, cnt, off) }
}

#[no_mangle]
pub unsafe extern "C" fn preadv64v2(
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
    off: off64_t,
    flags: c_int,
) -> ssize_t {
    if flags == 0 {
        if off == -1 {
            // SAFETY: as called.
            return unsafe { readv(fd, iov, cnt) };
        }
        // SAFETY: as called.
        return unsafe { preadv64(fd, iov, cnt, off) };
    }
    // Flags (RWF_NOWAIT...): the kernel, at the library's offset for -1.
    if off == -1 {
        if let Route::Served(_, ofd) = route(fd, Op::Read) {
            let at = ofd.offset.load(Ordering::Acquire);
            // SAFETY: as called, with an explicit offset.
            let r = unsafe {
                real::preadv64v2(crate::lazy::kernel(fd), iov, cnt, at as off64_t, flags)
            };
            if r > 0 {
                let _ = ofd.offset.compare_exchange(
                    at,
                    at + r as u64,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                );
            }
            return r;
        }
    }
    // SAFETY: as called.
    unsafe { real::preadv64v2(crate::lazy::kernel(fd), iov, cnt, off, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn preadv2(
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
    off: off64_t,
    flags: c_int,
) -> ssize_t {
    // SAFETY: as called.
    unsafe { preadv64v2(fd, iov, cnt, off, flags) }
}

/// A gathered writev's bytes above this stay in no per-thread buffer.
const GATHER_KEEP_BYTES: usize = 1 << 20;

thread_local! {
    /// The buffer a thread's writev gathers into, kept between calls: no
    /// allocation per served writev (but the first, and one above
    /// [`GATHER_KEEP_BYTES`]).
    static GATHER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `f` of the bytes of a write: the program's one buffer, or its iovecs
/// gathered into one (the client writes one slice; gathered, an O_APPEND
/// writev stays one record).
fn with_bytes<R>(iov: &[iovec], f: impl FnOnce(&[u8]) -> R) -> R {
    let raw = |v: &iovec| {
        // SAFETY: the program gave this buffer for the write.
        unsafe { std::slice::from_raw_parts(v.iov_base.cast::<u8>(), v.iov_len) }
    };
    let mut parts = iov.iter().filter(|v| v.iov_len > 0);
    match (parts.next(), parts.next()) {
        (None, _) => f(&[]),
        (Some(v), None) => f(raw(v)),
        _ => GATHER.with(|cell| match cell.try_borrow_mut() {
            Ok(mut buf) => {
                buf.clear();
                for v in iov {
                    buf.extend_from_slice(raw(v));
                }
                let r = f(&buf);
                if buf.capacity() > GATHER_KEEP_BYTES {
                    *buf = Vec::new();
                }
                r
            }
            // Only a served call gathers, and served calls do not nest
            // (guard.rs): never taken, but never a panic either.
            Err(_) => f(&iov.iter().flat_map(raw).copied().collect::<Vec<u8>>()),
        }),
    }
}

/// Where a served write goes in the file.
#[derive(Clone, Copy)]
enum At {
    /// At this offset.
    Offset(u64),
    /// At the end of file as it stands under the lease (O_APPEND).
    End,
}

/// Write `data` through the client, under the inode's write lease: the
/// offset it went to, or `None` (nothing written: the caller writes
/// through the kernel). The client commits a write whole or not at all
/// (an error leaves nothing written), so a fallback never writes twice.
/// The one error that follows a commit (returning freed blocks to a server
/// that just died) leaves a kernel path that fails too (the mount is gone).
fn pool_write(idx: usize, ofd: &Ofd, data: &[u8], at: At) -> Option<u64> {
    if data.is_empty()
        || !ofd.writable()
        || crate::sync::maybe_mapped(ofd.ino.load(Ordering::Relaxed))
    {
        return None;
    }
    let m = mounts::by_index(ofd.mount.load(Ordering::Relaxed) as usize)?;
    let lease = m.checkout()?;
    let r = lease.with_file(idx, ofd, |c, f| match at {
        At::Offset(off) => c.pwrite(f, off, data),
        At::End => c.append(f, data),
    })?;
    let w = r.ok()?;
    debug_assert_eq!(w.len, data.len(), "the client writes whole or fails");
    (w.len == data.len()).then_some(w.offset)
}

/// pwrite(v) on the kernel descriptor.
fn kernel_pwrite(fd: c_int, iov: &[iovec], off: u64) -> ssize_t {
    stats::bump(&stats::WRITE_KERNEL);
    // SAFETY: the program's buffers, at an explicit offset.
    unsafe {
        if iov.len() == 1 {
            real::pwrite64(
                crate::lazy::kernel(fd),
                iov[0].iov_base,
                iov[0].iov_len,
                off as off64_t,
            )
        } else {
            real::pwritev64(
                crate::lazy::kernel(fd),
                iov.as_ptr(),
                iov.len() as c_int,
                off as off64_t,
            )
        }
    }
}

/// A write at the file position (or the end of file, O_APPEND), which it
/// advances: through the client if `pool` and it can, else the kernel
/// descriptor at the library's offset.
fn write_seq(fd: c_int, idx: usize, ofd: &Ofd, iov: &[iovec], pool: bool) -> ssize_t {
    if ofd.append() {
        let served = pool
            .then(|| {
                with_bytes(iov, |d| {
                    pool_write(idx, ofd, d, At::End).map(|at| (at, d.len()))
                })
            })
            .flatten();
        if let Some((at, len)) = served {
            stats::bump(&stats::WRITE_LOCAL);
            ofd.offset.store(at + len as u64, Ordering::Release);
            return len as ssize_t;
        }
        stats::bump(&stats::WRITE_KERNEL);
        // The kernel appends at its end of file and moves its offset there.
        // SAFETY: the program's buffers, passed on.
        let r = unsafe { real::writev(crate::lazy::kernel(fd), iov.as_ptr(), iov.len() as c_int) };
        if r >= 0 {
            // SAFETY: no memory involved.
            let k = unsafe { real::lseek64(crate::lazy::kernel(fd), 0, libc::SEEK_CUR) };
            if k >= 0 {
                ofd.offset.store(k as u64, Ordering::Release);
            }
        }
        return r;
    }
    let len: u64 = iov.iter().map(|v| v.iov_len as u64).sum();
    // Take the bytes [off, off + len) of the file position first: threads
    // or processes sharing the description write one after the other.
    let off = ofd.offset.fetch_add(len, Ordering::AcqRel);
    if pool && with_bytes(iov, |d| pool_write(idx, ofd, d, At::Offset(off))).is_some() {
        stats::bump(&stats::WRITE_LOCAL);
        return len as ssize_t;
    }
    let r = kernel_pwrite(fd, iov, off);
    let done = r.max(0) as u64;
    if done < len {
        // Give back what was not written (unless the offset moved since).
        let _ =
            ofd.offset
                .compare_exchange(off + len, off + done, Ordering::AcqRel, Ordering::Acquire);
    }
    r
}

/// pwrite(v) on a served descriptor: at `off` (at the end of file if the
/// descriptor is O_APPEND, as Linux does), the file position untouched.
fn write_at(fd: c_int, idx: usize, ofd: &Ofd, iov: &[iovec], off: u64) -> ssize_t {
    let at = if ofd.append() {
        At::End
    } else {
        At::Offset(off)
    };
    let served = with_bytes(iov, |d| pool_write(idx, ofd, d, at).map(|_| d.len()));
    if let Some(len) = served {
        stats::bump(&stats::WRITE_LOCAL);
        return len as ssize_t;
    }
    kernel_pwrite(fd, iov, off)
}

#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    if let Route::Served(idx, ofd) = route(fd, Op::Write) {
        // Without the pool: kernel calls and atomics only, also right
        // inside the library (a signal handler).
        if let Some(r) = guard::serve(|pool| write_seq(fd, idx, ofd, &one(buf.cast_mut(), n), pool))
        {
            return r;
        }
    }
    // SAFETY: as called.
    unsafe { real::write(crate::lazy::kernel(fd), buf, n) }
}

#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    if let (Route::Served(idx, ofd), Some(v)) = (route(fd, Op::Write), unsafe { iovs(iov, cnt) }) {
        if let Some(r) = guard::serve(|pool| write_seq(fd, idx, ofd, v, pool)) {
            return r;
        }
    }
    // SAFETY: as called.
    unsafe { real::writev(crate::lazy::kernel(fd), iov, cnt) }
}

#[no_mangle]
pub unsafe extern "C" fn pwrite64(
    fd: c_int,
    buf: *const c_void,
    n: size_t,
    off: off64_t,
) -> ssize_t {
    if off >= 0 && !guard::inside() {
        if let Route::Served(idx, ofd) = route(fd, Op::Write) {
            if let Some(r) =
                guard::run(|| write_at(fd, idx, ofd, &one(buf.cast_mut(), n), off as u64))
            {
                return r;
            }
        }
    }
    // SAFETY: as called.
    unsafe { real::pwrite64(crate::lazy::kernel(fd), buf, n, off) }
}

#[no_mangle]
pub unsafe extern "C" fn pwrite(fd: c_int, buf: *const c_void, n: size_t, off: off64_t) -> ssize_t {
    // SAFETY: as called.
    unsafe { pwrite64(fd, buf, n, off) }
}

#[no_mangle]
pub unsafe extern "C" fn pwritev64(
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
    off: off64_t,
) -> ssize_t {
    if off >= 0 && !guard::inside() {
        if let (Route::Served(idx, ofd), Some(v)) =
            (route(fd, Op::Write), unsafe { iovs(iov, cnt) })
        {
            if let Some(r) = guard::run(|| write_at(fd, idx, ofd, v, off as u64)) {
                return r;
            }
        }
    }
    // SAFETY: as called.
    unsafe { real::pwritev64(crate::lazy::kernel(fd), iov, cnt, off) }
}

#[no_mangle]
pub unsafe extern "C" fn pwritev(
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
    off: off64_t,
) -> ssize_t {
    // SAFETY: as called.
    unsafe { pwritev64(fd, iov, cnt, off) }
}

/// pwritev2 flags a served write honours: every write through the client
/// is durable on return (strict and sync modes), which is what RWF_DSYNC
/// and RWF_SYNC ask.
const SERVED_RWF: c_int = libc::RWF_DSYNC | libc::RWF_SYNC;

#[no_mangle]
pub unsafe extern "C" fn pwritev64v2(
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
    off: off64_t,
    flags: c_int,
) -> ssize_t {
    if flags & !SERVED_RWF == 0 {
        if off == -1 {
            // SAFETY: as called.
            return unsafe { writev(fd, iov, cnt) };
        }
        // SAFETY: as called.
        return unsafe { pwritev64(fd, iov, cnt, off) };
    }
    if off == -1 {
        if let (Route::Served(_, ofd), Some(_)) = (route(fd, Op::Write), unsafe { iovs(iov, cnt) })
        {
            // Other flags (RWF_NOWAIT, RWF_APPEND...): the kernel, at the
            // library's offset.
            stats::bump(&stats::WRITE_KERNEL);
            let at = ofd.offset.load(Ordering::Acquire) as off64_t;
            // SAFETY: as called, at the library's offset.
            let r = unsafe { real::pwritev64v2(crate::lazy::kernel(fd), iov, cnt, at, flags) };
            if r > 0 && !ofd.append() && flags & libc::RWF_APPEND == 0 {
                ofd.offset
                    .store((at + r as off64_t) as u64, Ordering::Release);
            }
            return r;
        }
    }
    // SAFETY: as called.
    unsafe { real::pwritev64v2(crate::lazy::kernel(fd), iov, cnt, off, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn pwritev2(
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
    off: off64_t,
    flags: c_int,
) -> ssize_t {
    // SAFETY: as called.
    unsafe { pwritev64v2(fd, iov, cnt, off, flags) }
}

/// ftruncate through the client, under the inode's write lease. `None`:
/// the kernel does it (not open for writing, a length the kernel refuses,
/// any error of the client, which then changed nothing).
fn pool_truncate(idx: usize, ofd: &Ofd, len: off64_t) -> Option<c_int> {
    if len < 0
        || !ofd.writable()
        || ofd.is_dir()
        || crate::sync::maybe_mapped(ofd.ino.load(Ordering::Relaxed))
    {
        return None;
    }
    let m = mounts::by_index(ofd.mount.load(Ordering::Relaxed) as usize)?;
    let lease = m.checkout()?;
    // The caller's ids: the engine drops set-user-ID and set-group-ID bits
    // as Linux does for them.
    let cred = crate::creds::get(crate::creds::Ids::Effective)?;
    lease
        .with_file(idx, ofd, |c, f| c.truncate(&cred, f, len as u64))?
        .ok()?;
    stats::bump(&stats::WRITE_LOCAL);
    Some(0)
}

#[no_mangle]
pub unsafe extern "C" fn ftruncate64(fd: c_int, len: off64_t) -> c_int {
    if !guard::inside() {
        if let Route::Served(idx, ofd) = route(fd, Op::Write) {
            if let Some(Some(r)) = guard::run(|| pool_truncate(idx, ofd, len)) {
                return r;
            }
            stats::bump(&stats::WRITE_KERNEL);
        }
    }
    // SAFETY: no memory involved.
    unsafe { real::ftruncate64(crate::lazy::kernel(fd), len) }
}

#[no_mangle]
pub unsafe extern "C" fn ftruncate(fd: c_int, len: off64_t) -> c_int {
    // SAFETY: as called.
    unsafe { ftruncate64(fd, len) }
}

/// The size of a served file: from the pool, else the kernel's fstat.
fn file_size(fd: c_int, ofd: &Ofd) -> Option<u64> {
    let from_pool = (|| {
        if guard::inside() {
            // A signal handler: no client.
            return None;
        }
        let m = mounts::by_index(ofd.mount.load(Ordering::Relaxed) as usize)?;
        let lease = m.checkout()?;
        lease
            .client()
            .getattr(ofd.ino.load(Ordering::Relaxed))
            .ok()
            .map(|a| a.size)
    })();
    from_pool.or_else(|| {
        // SAFETY: all-zero is a valid stat64; the kernel fills it.
        let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
        (unsafe { real::fstat64(crate::lazy::kernel(fd), &mut st) } == 0)
            .then_some(st.st_size as u64)
    })
}

fn seek(fd: c_int, ofd: &Ofd, off: off64_t, whence: c_int) -> off64_t {
    let set = |new: Option<i64>| -> off64_t {
        match new {
            Some(n) if n >= 0 => {
                ofd.offset.store(n as u64, Ordering::Release);
                n
            }
            _ => fail(libc::EINVAL) as off64_t,
        }
    };
    match whence {
        libc::SEEK_SET => set(Some(off)),
        libc::SEEK_CUR => loop {
            let cur = ofd.offset.load(Ordering::Acquire);
            let Some(new) = (cur as i64).checked_add(off).filter(|n| *n >= 0) else {
                return fail(libc::EINVAL) as off64_t;
            };
            if ofd
                .offset
                .compare_exchange(cur, new as u64, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return new;
            }
        },
        libc::SEEK_END if !ofd.is_dir() => match file_size(fd, ofd) {
            Some(size) => set((size as i64).checked_add(off)),
            None => fail(libc::EIO) as off64_t,
        },
        _ => {
            // SEEK_DATA, SEEK_HOLE, a directory's end: the kernel decides,
            // the library takes the position it gives.
            // SAFETY: no memory involved.
            let r = unsafe { real::lseek64(crate::lazy::kernel(fd), off, whence) };
            if r >= 0 {
                ofd.offset.store(r as u64, Ordering::Release);
            }
            r
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn lseek64(fd: c_int, off: off64_t, whence: c_int) -> off64_t {
    if let Route::Served(_, ofd) = route(fd, Op::Seek) {
        if let Some(r) = guard::serve(|_| seek(fd, ofd, off, whence)) {
            return r;
        }
    }
    // SAFETY: no memory involved.
    unsafe { real::lseek64(crate::lazy::kernel(fd), off, whence) }
}

#[no_mangle]
pub unsafe extern "C" fn lseek(fd: c_int, off: off64_t, whence: c_int) -> off64_t {
    // SAFETY: as called.
    unsafe { lseek64(fd, off, whence) }
}

/// A kernel copy call with file positions: a served side without an
/// explicit offset uses (and advances) the library's offset.
fn with_positions(
    inp: c_int,
    off_in: *mut off64_t,
    out: c_int,
    off_out: *mut off64_t,
    call: impl FnOnce(*mut off64_t, *mut off64_t) -> ssize_t,
) -> ssize_t {
    let side = |fd: c_int, p: *mut off64_t| match (route(fd, Op::Seek), p.is_null()) {
        (Route::Served(_, o), true) if !o.is_dir() && !o.append() => Some(o),
        _ => None,
    };
    let (si, so) = (side(inp, off_in), side(out, off_out));
    let mut pi = si.map_or(0, |o| o.offset.load(Ordering::Acquire) as off64_t);
    let mut po = so.map_or(0, |o| o.offset.load(Ordering::Acquire) as off64_t);
    let r = call(
        if si.is_some() { &mut pi } else { off_in },
        if so.is_some() { &mut po } else { off_out },
    );
    if r >= 0 {
        if let Some(o) = si {
            o.offset.store(pi as u64, Ordering::Release);
        }
        if let Some(o) = so {
            o.offset.store(po as u64, Ordering::Release);
        }
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn copy_file_range(
    inp: c_int,
    off_in: *mut off64_t,
    out: c_int,
    off_out: *mut off64_t,
    n: size_t,
    flags: c_uint,
) -> ssize_t {
    with_positions(inp, off_in, out, off_out, |a, b| {
        // SAFETY: offsets are the program's or our locals.
        unsafe {
            real::copy_file_range(
                crate::lazy::kernel(inp),
                a,
                crate::lazy::kernel(out),
                b,
                n,
                flags,
            )
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn splice(
    inp: c_int,
    off_in: *mut off64_t,
    out: c_int,
    off_out: *mut off64_t,
    n: size_t,
    flags: c_uint,
) -> ssize_t {
    with_positions(inp, off_in, out, off_out, |a, b| {
        // SAFETY: as in copy_file_range.
        unsafe {
            real::splice(
                crate::lazy::kernel(inp),
                a,
                crate::lazy::kernel(out),
                b,
                n,
                flags,
            )
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn sendfile64(
    out: c_int,
    inp: c_int,
    off: *mut off64_t,
    n: size_t,
) -> ssize_t {
    // The output side has no offset argument: put the kernel's where the
    // library's is, and take it back after.
    let out_ofd = match route(out, Op::Write) {
        Route::Served(_, o) if !o.append() => Some(o),
        _ => None,
    };
    if let Some(o) = out_ofd {
        // SAFETY: no memory involved.
        unsafe {
            real::lseek64(
                crate::lazy::kernel(out),
                o.offset.load(Ordering::Acquire) as off64_t,
                libc::SEEK_SET,
            )
        };
    }
    let r = with_positions(inp, off, -1, std::ptr::null_mut(), |a, _| {
        // SAFETY: as in copy_file_range.
        unsafe { real::sendfile64(crate::lazy::kernel(out), crate::lazy::kernel(inp), a, n) }
    });
    if let (Some(o), true) = (out_ofd, r >= 0) {
        // SAFETY: no memory involved.
        let k = unsafe { real::lseek64(crate::lazy::kernel(out), 0, libc::SEEK_CUR) };
        if k >= 0 {
            o.offset.store(k as u64, Ordering::Release);
        }
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn sendfile(out: c_int, inp: c_int, off: *mut off64_t, n: size_t) -> ssize_t {
    // SAFETY: as called.
    unsafe { sendfile64(out, inp, off, n) }
}
