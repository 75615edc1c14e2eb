//! Data calls: read and write in their positioned and vectored forms,
//! lseek, fsync, truncate, fallocate, copy_file_range. None of them
//! allocates or makes a system call (one exception: an O_APPEND writev of
//! several buffers gathers them, so the append lands in one piece).

use std::ffi::{c_int, c_uint, c_void};

use inkfs::api::{FallocFlags, Follow, SetAttr, Whence};

use crate::boundary::{
    bytes, bytes_mut, cstr, fail, ffi, iovecs, ssize, CResult, Errno, IOV_MAX, RW_MAX,
};
use crate::mount::{mount, Mount, OpenRef};
use crate::ofd::lock_two;

fn offset(off: libc::off_t) -> CResult<u64> {
    u64::try_from(off).map_err(|_| Errno(libc::EINVAL))
}

fn no_dir(o: &OpenRef<'_>) -> CResult<()> {
    if o.is_dir() {
        return fail(libc::EISDIR);
    }
    Ok(())
}

fn read_at(m: &Mount, o: &OpenRef<'_>, off: u64, buf: &mut [u8]) -> CResult<usize> {
    let n = buf.len().min(RW_MAX);
    Ok(m.fs.read(&o.file, off, &mut buf[..n])?)
}

/// A write at `off` (or, O_APPEND, at the end of file): where it landed
/// and how much.
fn write_at(m: &Mount, o: &OpenRef<'_>, off: u64, data: &[u8]) -> CResult<(u64, usize)> {
    let n = data.len().min(RW_MAX);
    let w = m.fs.write(&o.file, off, &data[..n])?;
    Ok((w.offset, w.len))
}

/// read(2): from the file offset, which advances by what was read.
#[no_mangle]
pub unsafe extern "C" fn inkfs_read(
    fs: *mut Mount,
    fd: c_int,
    buf: *mut c_void,
    count: libc::size_t,
) -> libc::ssize_t {
    ffi(-1, || {
        let m = mount(fs)?;
        let o = m.fd(fd)?;
        no_dir(&o)?;
        let buf = bytes_mut(buf, count.min(RW_MAX))?;
        let mut pos = o.pos();
        let n = read_at(m, &o, *pos, buf)?;
        *pos += n as u64;
        Ok(ssize(n))
    })
}

/// pread(2): at `offset`; the file offset is unchanged.
#[no_mangle]
pub unsafe extern "C" fn inkfs_pread(
    fs: *mut Mount,
    fd: c_int,
    buf: *mut c_void,
    count: libc::size_t,
    offset_bytes: libc::off_t,
) -> libc::ssize_t {
    ffi(-1, || {
        let m = mount(fs)?;
        let o = m.fd(fd)?;
        no_dir(&o)?;
        let off = offset(offset_bytes)?;
        let buf = bytes_mut(buf, count.min(RW_MAX))?;
        Ok(ssize(read_at(m, &o, off, buf)?))
    })
}

/// write(2): at the file offset (O_APPEND: at the end of file, decided
/// under the inode's lock), which then points past the bytes written.
/// Durable on return in strict and sync modes, and with O_SYNC/O_DSYNC.
#[no_mangle]
pub unsafe extern "C" fn inkfs_write(
    fs: *mut Mount,
    fd: c_int,
    buf: *const c_void,
    count: libc::size_t,
) -> libc::ssize_t {
    ffi(-1, || {
        let m = mount(fs)?;
        let o = m.fd(fd)?;
        let data = bytes(buf, count.min(RW_MAX))?;
        let mut pos = o.pos();
        let (at, n) = write_at(m, &o, *pos, data)?;
        *pos = at + n as u64;
        Ok(ssize(n))
    })
}

/// pwrite(2): at `offset` (O_APPEND: at the end of file, as Linux does);
/// the file offset is unchanged.
#[no_mangle]
pub unsafe extern "C" fn inkfs_pwrite(
    fs: *mut Mount,
    fd: c_int,
    buf: *const c_void,
    count: libc::size_t,
    offset_bytes: libc::off_t,
) -> libc::ssize_t {
    ffi(-1, || {
        let m = mount(fs)?;
        let o = m.fd(fd)?;
        let off = offset(offset_bytes)?;
        let data = bytes(buf, count.min(RW_MAX))?;
        Ok(ssize(write_at(m, &o, off, data)?.1))
    })
}

/// The buffers of an iovec array, in order, cut so that they add up to at
/// most RW_MAX bytes (EINVAL if their lengths overflow ssize_t).
fn iov_total(iov: &[libc::iovec]) -> CResult<usize> {
    let mut total: usize = 0;
    for v in iov {
        total = total
            .checked_add(v.iov_len)
            .filter(|&t| t <= isize::MAX as usize)
            .ok_or(Errno(libc::EINVAL))?;
    }
    Ok(total.min(RW_MAX))
}

/// Read into the iovecs from `off` onwards; stops at a short read. An
/// error after some bytes were read returns those bytes.
fn readv_at(m: &Mount, o: &OpenRef<'_>, mut off: u64, iov: &[libc::iovec]) -> CResult<usize> {
    let mut left = iov_total(iov)?;
    let mut done = 0;
    for v in iov {
        if left == 0 {
            break;
        }
        let buf = bytes_mut(v.iov_base, v.iov_len.min(left))?;
        let want = buf.len();
        let n = match read_at(m, o, off, buf) {
            Ok(n) => n,
            Err(_) if done > 0 => break,
            Err(e) => return Err(e),
        };
        done += n;
        left -= n;
        off += n as u64;
        if n < want {
            break;
        }
    }
    Ok(done)
}

/// Write the iovecs at `off` onwards (O_APPEND: at the end of file, in one
/// piece); where the first byte landed and how many were written.
fn writev_at(
    m: &Mount,
    o: &OpenRef<'_>,
    mut off: u64,
    iov: &[libc::iovec],
) -> CResult<(u64, usize)> {
    let mut left = iov_total(iov)?;
    let nonempty = iov.iter().filter(|v| v.iov_len > 0).count();
    if o.file.flags().bits() & libc::O_APPEND != 0 && nonempty > 1 {
        // Gathered, so no other append lands between two buffers.
        let mut all = Vec::with_capacity(left);
        for v in iov {
            let take = v.iov_len.min(left);
            all.extend_from_slice(bytes(v.iov_base, take)?);
            left -= take;
        }
        return write_at(m, o, off, &all);
    }
    let mut first = None;
    let mut done = 0;
    for v in iov {
        if left == 0 {
            break;
        }
        let data = bytes(v.iov_base, v.iov_len.min(left))?;
        if data.is_empty() {
            continue;
        }
        let (at, n) = match write_at(m, o, off, data) {
            Ok(w) => w,
            Err(_) if done > 0 => break,
            Err(e) => return Err(e),
        };
        first.get_or_insert(at);
        done += n;
        left -= n;
        off = at + n as u64;
        if n < data.len() {
            break;
        }
    }
    Ok((first.unwrap_or(off), done))
}

/// readv(2).
#[no_mangle]
pub unsafe extern "C" fn inkfs_readv(
    fs: *mut Mount,
    fd: c_int,
    iov: *const libc::iovec,
    iovcnt: c_int,
) -> libc::ssize_t {
    ffi(-1, || {
        let m = mount(fs)?;
        let o = m.fd(fd)?;
        no_dir(&o)?;
        let iov = iovecs(iov, iovcnt)?;
        let mut pos = o.pos();
        let n = readv_at(m, &o, *pos, iov)?;
        *pos += n as u64;
        Ok(ssize(n))
    })
}

/// writev(2).
#[no_mangle]
pub unsafe extern "C" fn inkfs_writev(
    fs: *mut Mount,
    fd: c_int,
    iov: *const libc::iovec,
    iovcnt: c_int,
) -> libc::ssize_t {
    ffi(-1, || {
        let m = mount(fs)?;
        let o = m.fd(fd)?;
        let iov = iovecs(iov, iovcnt)?;
        let mut pos = o.pos();
        let (at, n) = writev_at(m, &o, *pos, iov)?;
        if n > 0 {
            *pos = at + n as u64;
        }
        Ok(ssize(n))
    })
}

/// preadv(2).
#[no_mangle]
pub unsafe extern "C" fn inkfs_preadv(
    fs: *mut Mount,
    fd: c_int,
    iov: *const libc::iovec,
    iovcnt: c_int,
    offset_bytes: libc::off_t,
) -> libc::ssize_t {
    ffi(-1, || {
        let m = mount(fs)?;
        let o = m.fd(fd)?;
        no_dir(&o)?;
        let off = offset(offset_bytes)?;
        let iov = iovecs(iov, iovcnt)?;
        Ok(ssize(readv_at(m, &o, off, iov)?))
    })
}

/// pwritev(2).
#[no_mangle]
pub unsafe extern "C" fn inkfs_pwritev(
    fs: *mut Mount,
    fd: c_int,
    iov: *const libc::iovec,
    iovcnt: c_int,
    offset_bytes: libc::off_t,
) -> libc::ssize_t {
    ffi(-1, || {
        let m = mount(fs)?;
        let o = m.fd(fd)?;
        let off = offset(offset_bytes)?;
        let iov = iovecs(iov, iovcnt)?;
        Ok(ssize(writev_at(m, &o, off, iov)?.1))
    })
}

const _: () = assert!(IOV_MAX == 1024);

/// lseek(2): SEEK_SET, SEEK_CUR, SEEK_END, SEEK_DATA, SEEK_HOLE (ENXIO at
/// or past the end of file). A directory's offset is a readdir cookie:
/// SEEK_SET to one returned by getdents64 or telldir, or SEEK_CUR by 0.
#[no_mangle]
pub unsafe extern "C" fn inkfs_lseek(
    fs: *mut Mount,
    fd: c_int,
    offset_bytes: libc::off_t,
    whence: c_int,
) -> libc::off_t {
    ffi(-1, || {
        let m = mount(fs)?;
        let o = m.fd(fd)?;
        let mut pos = o.pos();
        let cur = *pos as i128;
        let off = offset_bytes as i128;
        let new = match whence {
            libc::SEEK_SET => off,
            libc::SEEK_CUR => cur + off,
            libc::SEEK_END if !o.is_dir() => m.fs.getattr(o.file.ino())?.size as i128 + off,
            libc::SEEK_DATA | libc::SEEK_HOLE if !o.is_dir() => {
                let from = u64::try_from(offset_bytes).map_err(|_| Errno(libc::ENXIO))?;
                let w = if whence == libc::SEEK_DATA {
                    Whence::Data
                } else {
                    Whence::Hole
                };
                m.fs.seek(&o.file, from, w)? as i128
            }
            _ => return fail(libc::EINVAL),
        };
        if new < 0 || new > i64::MAX as i128 {
            return fail(libc::EINVAL);
        }
        *pos = new as u64;
        Ok(new as libc::off_t)
    })
}

/// fsync(2): make the file's data and metadata durable (nothing to do in
/// strict and sync modes: every call already is).
#[no_mangle]
pub unsafe extern "C" fn inkfs_fsync(fs: *mut Mount, fd: c_int) -> c_int {
    ffi(-1, || {
        let m = mount(fs)?;
        m.fs.fsync(&m.fd(fd)?.file, false)?;
        Ok(0)
    })
}

/// fdatasync(2).
#[no_mangle]
pub unsafe extern "C" fn inkfs_fdatasync(fs: *mut Mount, fd: c_int) -> c_int {
    ffi(-1, || {
        let m = mount(fs)?;
        m.fs.fsync(&m.fd(fd)?.file, true)?;
        Ok(0)
    })
}

/// syncfs(2): every pending posix-mode write durable.
#[no_mangle]
pub unsafe extern "C" fn inkfs_syncfs(fs: *mut Mount) -> c_int {
    ffi(-1, || {
        mount(fs)?.fs.sync()?;
        Ok(0)
    })
}

fn size_attr(len: libc::off_t) -> CResult<SetAttr> {
    Ok(SetAttr {
        size: Some(offset(len)?),
        ..SetAttr::default()
    })
}

/// ftruncate(2): the descriptor must be open for writing (EINVAL).
#[no_mangle]
pub unsafe extern "C" fn inkfs_ftruncate(fs: *mut Mount, fd: c_int, length: libc::off_t) -> c_int {
    ffi(-1, || {
        let m = mount(fs)?;
        let set = size_attr(length)?;
        let o = m.fd(fd)?;
        if o.is_dir() {
            return fail(libc::EINVAL);
        }
        m.fs.setattr(&m.cred(), o.file.ino(), &set, Some(&o.file))?;
        Ok(0)
    })
}

/// truncate(2): needs write permission on the file.
#[no_mangle]
pub unsafe extern "C" fn inkfs_truncate(
    fs: *mut Mount,
    path: *const std::ffi::c_char,
    length: libc::off_t,
) -> c_int {
    ffi(-1, || {
        let m = mount(fs)?;
        let path = cstr(path)?;
        let set = size_attr(length)?;
        let cred = m.cred();
        let a =
            m.fs.resolve(&cred, m.at(libc::AT_FDCWD, path)?, path, Follow::Yes)?;
        match a.kind {
            inkfs::api::FileKind::Dir => return fail(libc::EISDIR),
            inkfs::api::FileKind::File => {}
            _ => return fail(libc::EINVAL),
        }
        m.fs.setattr(&cred, a.ino, &set, None)?;
        Ok(0)
    })
}

/// fallocate(2): mode 0, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE (with
/// KEEP_SIZE), FALLOC_FL_ZERO_RANGE, FALLOC_FL_COLLAPSE_RANGE,
/// FALLOC_FL_INSERT_RANGE; others EOPNOTSUPP.
#[no_mangle]
pub unsafe extern "C" fn inkfs_fallocate(
    fs: *mut Mount,
    fd: c_int,
    mode: c_int,
    offset_bytes: libc::off_t,
    len: libc::off_t,
) -> c_int {
    ffi(-1, || {
        let m = mount(fs)?;
        if offset_bytes < 0 || len <= 0 {
            return fail(libc::EINVAL);
        }
        let flags = FallocFlags::from_bits(mode)?;
        let o = m.fd(fd)?;
        m.fs.fallocate(&o.file, offset_bytes as u64, len as u64, flags)?;
        Ok(0)
    })
}

/// copy_file_range(2) between two descriptors of the same mount. A NULL
/// `off_in`/`off_out` uses and advances that descriptor's offset; a
/// non-NULL one is read and advanced instead. `flags` must be 0.
#[no_mangle]
pub unsafe extern "C" fn inkfs_copy_file_range(
    fs: *mut Mount,
    fd_in: c_int,
    off_in: *mut libc::off_t,
    fd_out: c_int,
    off_out: *mut libc::off_t,
    len: libc::size_t,
    flags: c_uint,
) -> libc::ssize_t {
    ffi(-1, || {
        let m = mount(fs)?;
        if flags != 0 {
            return fail(libc::EINVAL);
        }
        let (src, dst) = (m.fd(fd_in)?, m.fd(fd_out)?);
        if src.is_dir() || dst.is_dir() {
            return fail(libc::EISDIR);
        }
        let len = len.min(RW_MAX) as u64;
        let explicit = |p: *mut libc::off_t| -> CResult<Option<u64>> {
            match crate::boundary::load(p.cast_const()) {
                None => Ok(None),
                Some(v) => offset(v).map(Some),
            }
        };
        let (in_at, out_at) = (explicit(off_in)?, explicit(off_out)?);
        // The offsets used come from the pointers or, locked, from the
        // descriptions (lock_two: source's first, destination's second,
        // None when both are one description).
        let (mut gs, mut gd) = lock_two(&src, &dst);
        let src_pos = in_at.unwrap_or(*gs);
        let dst_pos = out_at.unwrap_or_else(|| gd.as_deref().copied().unwrap_or(*gs));
        let n =
            m.fs.copy_range(&src.file, src_pos, &dst.file, dst_pos, len)?;
        if in_at.is_none() {
            *gs = src_pos + n;
        }
        if out_at.is_none() {
            match gd.as_deref_mut() {
                Some(g) => *g = dst_pos + n,
                None => *gs = dst_pos + n,
            }
        }
        if let Some(v) = in_at {
            crate::boundary::store(off_in, (v + n) as libc::off_t)?;
        }
        if let Some(v) = out_at {
            crate::boundary::store(off_out, (v + n) as libc::off_t)?;
        }
        Ok(n as libc::ssize_t)
    })
}
