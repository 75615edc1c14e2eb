//! Reading directories: `inkfs_dir_t` streams (opendir, readdir,
//! telldir, seekdir, closedir) yielding `struct dirent`, and getdents64 on
//! a descriptor. Positions are the engine's readdir cookies: an entry's
//! cookie resumes after it, a name is never returned twice in one pass,
//! and "." and ".." come first.

use std::collections::VecDeque;
use std::ffi::{c_char, c_int, c_long, c_void};
use std::sync::Arc;

use inkfs::api::{DirEntry, FileKind};

use crate::boundary::{bytes_mut, fail, ffi, CResult, Errno};
use crate::mount::{mount, mount_arc, Mount};

/// Entries fetched from the engine at a time by a directory stream.
const BATCH: usize = 64;

/// An open directory stream (`inkfs_dir_t` in C): a descriptor of its
/// mount and the entries read ahead.
pub struct DirStream {
    mount: Arc<Mount>,
    fd: c_int,
    /// Read ahead, not yet returned.
    pending: VecDeque<DirEntry>,
    /// Where the stream is: after the last entry returned (telldir).
    cookie: u64,
    /// Where the read-ahead resumes: after the last entry fetched.
    fetched: u64,
    end: bool,
    /// What readdir returns a pointer to, overwritten by the next call.
    ent: libc::dirent,
}

fn d_type(kind: FileKind) -> u8 {
    match kind {
        FileKind::File => libc::DT_REG,
        FileKind::Dir => libc::DT_DIR,
        FileKind::Symlink => libc::DT_LNK,
        FileKind::Fifo => libc::DT_FIFO,
        FileKind::Socket => libc::DT_SOCK,
        FileKind::CharDev => libc::DT_CHR,
        FileKind::BlockDev => libc::DT_BLK,
    }
}

impl DirStream {
    fn new(mount: Arc<Mount>, fd: c_int) -> DirStream {
        DirStream {
            mount,
            fd,
            pending: VecDeque::with_capacity(BATCH),
            cookie: 0,
            fetched: 0,
            end: false,
            ent: libc::dirent {
                d_ino: 0,
                d_off: 0,
                d_reclen: 0,
                d_type: 0,
                d_name: [0; 256],
            },
        }
    }

    fn refill(&mut self) -> CResult<()> {
        let o = self.mount.fd(self.fd)?;
        let mut got = 0;
        let pending = &mut self.pending;
        self.mount.fs.readdir(&o.file, self.fetched, &mut |e| {
            pending.push_back(e);
            got += 1;
            got < BATCH
        })?;
        if let Some(last) = self.pending.back() {
            self.fetched = last.cookie;
        }
        self.end = got < BATCH;
        Ok(())
    }

    fn next(&mut self) -> CResult<*mut libc::dirent> {
        if self.pending.is_empty() && !self.end {
            self.refill()?;
        }
        let Some(e) = self.pending.pop_front() else {
            return Ok(std::ptr::null_mut());
        };
        self.cookie = e.cookie;
        let name = &e.name[..e.name.len().min(255)];
        self.ent.d_ino = e.ino;
        self.ent.d_off = e.cookie as i64;
        self.ent.d_reclen = std::mem::size_of::<libc::dirent>() as u16;
        self.ent.d_type = d_type(e.kind);
        for (d, &s) in self.ent.d_name.iter_mut().zip(name) {
            *d = s as c_char;
        }
        self.ent.d_name[name.len()] = 0;
        Ok(&mut self.ent)
    }

    fn seek(&mut self, cookie: u64) {
        self.pending.clear();
        self.cookie = cookie;
        self.fetched = cookie;
        self.end = false;
    }
}

fn stream<'a>(d: *mut DirStream) -> CResult<&'a mut DirStream> {
    if d.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: a non-NULL `inkfs_dir_t *` is one inkfs_opendir or
    // inkfs_fdopendir returned and inkfs_closedir has not freed; a stream
    // is used by one thread at a time (the header's contract, as for DIR).
    Ok(unsafe { &mut *d })
}

/// fdopendir(3): a stream on the directory open at `fd`, which the stream
/// now owns (inkfs_closedir closes it). NULL with errno (ENOTDIR, EBADF).
#[no_mangle]
pub unsafe extern "C" fn inkfs_fdopendir(fs: *mut Mount, fd: c_int) -> *mut DirStream {
    ffi(std::ptr::null_mut(), || {
        let m = mount_arc(fs)?;
        if !m.fd(fd)?.is_dir() {
            return fail(libc::ENOTDIR);
        }
        Ok(Box::into_raw(Box::new(DirStream::new(m, fd))))
    })
}

/// opendir(3): open `path` (O_RDONLY|O_DIRECTORY) and return a stream on
/// it. A mount cannot be unmounted while one of its streams is open.
#[no_mangle]
pub unsafe extern "C" fn inkfs_opendir(fs: *mut Mount, path: *const c_char) -> *mut DirStream {
    let fd = crate::open::inkfs_openat(
        fs,
        libc::AT_FDCWD,
        path,
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        0,
    );
    if fd < 0 {
        return std::ptr::null_mut();
    }
    let d = inkfs_fdopendir(fs, fd);
    if d.is_null() {
        // SAFETY: errno is this thread's; saved across the close.
        let e = unsafe { *libc::__errno_location() };
        crate::open::inkfs_close(fs, fd);
        crate::boundary::set_errno(e);
    }
    d
}

/// readdir(3): the next entry (d_ino, d_off: the cookie after it, d_type,
/// d_name), valid until the next call on the stream; NULL at the end
/// (errno unchanged) or on error (errno set).
#[no_mangle]
pub unsafe extern "C" fn inkfs_readdir(dir: *mut DirStream) -> *mut libc::dirent {
    ffi(std::ptr::null_mut(), || stream(dir)?.next())
}

/// telldir(3): the stream's position, for inkfs_seekdir.
#[no_mangle]
pub unsafe extern "C" fn inkfs_telldir(dir: *mut DirStream) -> c_long {
    ffi(-1, || Ok(stream(dir)?.cookie as c_long))
}

/// seekdir(3): back (or on) to a position telldir or d_off returned.
#[no_mangle]
pub unsafe extern "C" fn inkfs_seekdir(dir: *mut DirStream, loc: c_long) {
    ffi((), || {
        stream(dir)?.seek(loc as u64);
        Ok(())
    })
}

/// rewinddir(3).
#[no_mangle]
pub unsafe extern "C" fn inkfs_rewinddir(dir: *mut DirStream) {
    inkfs_seekdir(dir, 0)
}

/// dirfd(3): the stream's descriptor (still owned by the stream).
#[no_mangle]
pub unsafe extern "C" fn inkfs_dirfd(dir: *mut DirStream) -> c_int {
    ffi(-1, || Ok(stream(dir)?.fd))
}

/// closedir(3): close the stream and its descriptor; the stream is freed
/// even if the descriptor was already closed (then -1, EBADF).
#[no_mangle]
pub unsafe extern "C" fn inkfs_closedir(dir: *mut DirStream) -> c_int {
    ffi(-1, || {
        stream(dir)?;
        // SAFETY: `dir` came from Box::into_raw in inkfs_fdopendir and is
        // handed back once (the contract above).
        let d = unsafe { Box::from_raw(dir) };
        let ofd = d.mount.fds.remove(d.fd)?;
        d.mount.put(ofd);
        Ok(0)
    })
}

/// The fixed part of a struct linux_dirent64: d_ino, d_off, d_reclen,
/// d_type.
const DIRENT64_HEADER: usize = 8 + 8 + 2 + 1;

/// getdents64(2): as many `struct linux_dirent64` records as fit in
/// `count` bytes at `dirp`, from the descriptor's offset (a cookie, which
/// advances); 0 at the end; EINVAL if not even one fits.
#[no_mangle]
pub unsafe extern "C" fn inkfs_getdents64(
    fs: *mut Mount,
    fd: c_int,
    dirp: *mut c_void,
    count: libc::size_t,
) -> libc::ssize_t {
    ffi(-1, || {
        let m = mount(fs)?;
        let o = m.fd(fd)?;
        if !o.is_dir() {
            return fail(libc::ENOTDIR);
        }
        let buf = bytes_mut(dirp, count.min(crate::boundary::RW_MAX))?;
        let mut pos = o.pos();
        let mut used = 0;
        let mut last = *pos;
        let mut too_small = false;
        m.fs.readdir(&o.file, *pos, &mut |e| {
            let reclen = (DIRENT64_HEADER + e.name.len() + 1).next_multiple_of(8);
            if used + reclen > buf.len() {
                too_small = used == 0;
                return false;
            }
            let rec = &mut buf[used..used + reclen];
            rec[0..8].copy_from_slice(&e.ino.to_ne_bytes());
            rec[8..16].copy_from_slice(&(e.cookie as i64).to_ne_bytes());
            rec[16..18].copy_from_slice(&(reclen as u16).to_ne_bytes());
            rec[18] = d_type(e.kind);
            rec[DIRENT64_HEADER..DIRENT64_HEADER + e.name.len()].copy_from_slice(&e.name);
            rec[DIRENT64_HEADER + e.name.len()..].fill(0);
            used += reclen;
            last = e.cookie;
            true
        })?;
        if too_small {
            return Err(Errno(libc::EINVAL));
        }
        *pos = last;
        Ok(used as libc::ssize_t)
    })
}
