//! Shared by the crate's Rust tests: a pool in /dev/shm made with
//! inkfs_mkfs and mounted with inkfs_mount (through the same extern "C"
//! functions a C program calls), and errno-returning wrappers.
#![allow(dead_code)]

use std::ffi::{c_int, CString};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use inkfs_capi::*;

pub fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// `Ok(value)` or `Err(errno)` of a call returning -1 on failure.
pub fn ck<T: Into<i64> + Copy>(r: T) -> Result<T, i32> {
    if r.into() < 0 {
        Err(errno())
    } else {
        Ok(r)
    }
}

pub fn c(s: &str) -> CString {
    CString::new(s).expect("no NUL in test strings")
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A fresh pool path in /dev/shm, removed when dropped.
pub struct PoolPath(pub PathBuf);

impl PoolPath {
    pub fn new(tag: &str) -> PoolPath {
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        PoolPath(PathBuf::from(format!(
            "/dev/shm/inkfs-capi-{tag}-{}-{n}.pool",
            std::process::id()
        )))
    }
    pub fn c(&self) -> CString {
        c(self.0.to_str().expect("UTF-8 path"))
    }
}

impl Drop for PoolPath {
    fn drop(&mut self) {
        if self.0.as_os_str().is_empty() {
            return;
        }
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A mounted pool; unmounted (and its file removed) when dropped.
pub struct Pool {
    pub fs: *mut Mount,
    pub path: PoolPath,
}

// SAFETY: inkfs_t is thread-safe (the header's contract); the tests share
// the handle between threads and unmount only after joining them.
unsafe impl Send for Pool {}
unsafe impl Sync for Pool {}

impl Pool {
    pub fn new(tag: &str) -> Pool {
        Pool::with(tag, None)
    }

    pub fn with(tag: &str, opts: Option<MountOpts>) -> Pool {
        let path = PoolPath::new(tag);
        let p = path.c();
        // SAFETY: p is a valid C string for the calls.
        let r = unsafe { inkfs_mkfs(p.as_ptr(), 64 << 20, 2) };
        assert_eq!(r, 0, "mkfs: errno {}", errno());
        let o = opts.as_ref().map_or(std::ptr::null(), |o| o as *const _);
        // SAFETY: p is a valid C string, o NULL or a valid options struct.
        let fs = unsafe { inkfs_mount(p.as_ptr(), o) };
        assert!(!fs.is_null(), "mount: errno {}", errno());
        Pool { fs, path }
    }

    pub fn open(&self, path: &str, flags: c_int, mode: u32) -> Result<c_int, i32> {
        // SAFETY: a live mount and a valid C string.
        ck(unsafe { inkfs_open(self.fs, c(path).as_ptr(), flags, mode) })
    }

    pub fn close(&self, fd: c_int) -> Result<c_int, i32> {
        // SAFETY: a live mount.
        ck(unsafe { inkfs_close(self.fs, fd) })
    }

    pub fn write(&self, fd: c_int, data: &[u8]) -> Result<isize, i32> {
        // SAFETY: a live mount; data is valid for its length.
        ck(unsafe { inkfs_write(self.fs, fd, data.as_ptr().cast(), data.len()) } as i64)
            .map(|n| n as isize)
    }

    pub fn pwrite(&self, fd: c_int, data: &[u8], off: i64) -> Result<isize, i32> {
        // SAFETY: a live mount; data is valid for its length.
        ck(unsafe { inkfs_pwrite(self.fs, fd, data.as_ptr().cast(), data.len(), off) } as i64)
            .map(|n| n as isize)
    }

    pub fn read(&self, fd: c_int, buf: &mut [u8]) -> Result<usize, i32> {
        // SAFETY: a live mount; buf is writable for its length.
        ck(unsafe { inkfs_read(self.fs, fd, buf.as_mut_ptr().cast(), buf.len()) } as i64)
            .map(|n| n as usize)
    }

    pub fn pread(&self, fd: c_int, buf: &mut [u8], off: i64) -> Result<usize, i32> {
        // SAFETY: a live mount; buf is writable for its length.
        ck(unsafe { inkfs_pread(self.fs, fd, buf.as_mut_ptr().cast(), buf.len(), off) } as i64)
            .map(|n| n as usize)
    }

    pub fn lseek(&self, fd: c_int, off: i64, whence: c_int) -> Result<i64, i32> {
        // SAFETY: a live mount.
        ck(unsafe { inkfs_lseek(self.fs, fd, off, whence) })
    }

    pub fn stat(&self, path: &str) -> Result<libc::stat, i32> {
        // SAFETY: zeroed is a valid stat; the call fills it.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a live mount, a valid C string, a writable stat.
        ck(unsafe { inkfs_stat(self.fs, c(path).as_ptr(), &mut st) })?;
        Ok(st)
    }

    pub fn mkdir(&self, path: &str, mode: u32) -> Result<c_int, i32> {
        // SAFETY: a live mount and a valid C string.
        ck(unsafe { inkfs_mkdir(self.fs, c(path).as_ptr(), mode) })
    }

    pub fn unmount(mut self) -> Result<c_int, i32> {
        let fs = std::mem::replace(&mut self.fs, std::ptr::null_mut());
        // SAFETY: the handle from inkfs_mount, given back once.
        ck(unsafe { inkfs_unmount(fs) })
    }
}

impl Pool {
    /// Unmount, keeping the pool file (its guard is returned).
    pub fn unmount_keep(mut self) -> PoolPath {
        let fs = std::mem::replace(&mut self.fs, std::ptr::null_mut());
        // SAFETY: the handle from inkfs_mount, given back once.
        assert_eq!(
            unsafe { inkfs_unmount(fs) },
            0,
            "unmount: errno {}",
            errno()
        );
        std::mem::replace(&mut self.path, PoolPath(PathBuf::new()))
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if !self.fs.is_null() {
            // SAFETY: the handle from inkfs_mount, given back once.
            unsafe { inkfs_unmount(self.fs) };
        }
    }
}
