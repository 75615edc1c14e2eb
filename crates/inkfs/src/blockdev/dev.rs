//! The data device itself: the [`BlockDev`] trait the engine writes file
//! data through, page-aligned buffers, and [`FileDev`], the backend for a
//! block device or a file on another file system.
//!
//! Durability contract (the block-device crash model, docs/FORMAT.md
//! "Crash model"): a completed `write_at` may sit in a volatile cache (the
//! device's, or the kernel's page cache when O_DIRECT is not available);
//! until a `flush` that started after it completes, a crash may keep it or
//! lose it, whole or in part, independently of every other write. A
//! completed `flush` makes every write completed before it started
//! durable. The crash simulator (`pmem::SimDevice`) produces exactly these
//! outcomes.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::os::unix::io::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};

use crate::format::BLOCK_SIZE;

/// One block in DRAM, aligned as O_DIRECT needs (4096 covers every
/// logical block size Linux devices have).
#[derive(Clone)]
#[repr(C, align(4096))]
pub struct Page(pub [u8; BLOCK_SIZE as usize]);

const _: () = assert!(std::mem::size_of::<Page>() == BLOCK_SIZE as usize);

impl Page {
    pub fn zeroed() -> Page {
        Page([0; BLOCK_SIZE as usize])
    }
}

/// A run of zeroed pages.
pub fn pages(n: usize) -> Vec<Page> {
    vec![Page::zeroed(); n]
}

/// The bytes of a run of pages, contiguous.
pub fn as_bytes(pages: &[Page]) -> &[u8] {
    // SAFETY: `Page` is repr(C) around a byte array with no padding (size
    // asserted equal to its array), so a slice of pages is that many
    // contiguous, initialised bytes.
    unsafe { std::slice::from_raw_parts(pages.as_ptr().cast::<u8>(), std::mem::size_of_val(pages)) }
}

/// `buf` seen as whole pages, when it is one: page-aligned in memory and a
/// whole number of pages long (a device read can then land in it directly,
/// with no bounce buffer).
pub fn as_pages_mut(buf: &mut [u8]) -> Option<&mut [Page]> {
    let page = BLOCK_SIZE as usize;
    if buf.is_empty()
        || !buf.len().is_multiple_of(page)
        || !(buf.as_ptr() as usize).is_multiple_of(page)
    {
        return None;
    }
    // SAFETY: the bytes are aligned for `Page` (checked above), `Page` is
    // repr(C) around a byte array of exactly `page` bytes, and the slice
    // covers `len / page` of them; the borrow is `buf`'s.
    Some(unsafe {
        std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<Page>(), buf.len() / page)
    })
}

/// The bytes of a run of pages, contiguous and writable.
pub fn as_bytes_mut(pages: &mut [Page]) -> &mut [u8] {
    // SAFETY: as `as_bytes`; every bit pattern is a valid byte.
    unsafe {
        std::slice::from_raw_parts_mut(
            pages.as_mut_ptr().cast::<u8>(),
            std::mem::size_of_val(pages),
        )
    }
}

/// A block device as the engine uses it: whole, aligned blocks in and out,
/// and a flush. Offsets are bytes from the device's start, multiples of
/// `BLOCK_SIZE`.
pub trait BlockDev: Send + Sync + std::fmt::Debug + 'static {
    /// Bytes the device holds.
    fn size_bytes(&self) -> u64;
    /// Read `buf.len()` pages at `off`.
    fn read_at(&self, off: u64, buf: &mut [Page]) -> io::Result<()>;
    /// Write `data` at `off`: in the device's volatile cache on return.
    fn write_at(&self, off: u64, data: &[Page]) -> io::Result<()>;
    /// Make every write completed before this call durable.
    fn flush(&self) -> io::Result<()>;
    /// What it is, for `inkfs stat`: e.g. "file /var/tmp/d (O_DIRECT)".
    fn describe(&self) -> String;
    /// The descriptor to hand to another process that reads and writes
    /// the device as this one does (an attached client of the kernel-free
    /// path); None for a device with no descriptor (memory, simulator).
    fn shared_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }
}

/// A block device or a regular file, opened with O_DIRECT where the file
/// system allows it (else through the page cache; `flush` is fdatasync
/// either way, which also writes that cache back).
#[derive(Debug)]
pub struct FileDev {
    file: File,
    path: PathBuf,
    direct: bool,
    block_device: bool,
    size_bytes: u64,
}

impl FileDev {
    /// Open an existing data device, locked against a second opener
    /// (shared for `read_only`). The lock is the kernel's (flock), dropped
    /// with the last descriptor, so a killed holder frees it. A read-only
    /// open of a device a writer holds goes ahead without the lock: who
    /// may read is the pool's claim to decide (fsck and stat read a pool
    /// in use without claiming it, and say so), and a writer's exclusive
    /// lock still keeps mkfs from formatting a device in use.
    pub fn open(path: &Path, read_only: bool) -> io::Result<FileDev> {
        let file = open_maybe_direct(path, read_only, false)?;
        Self::from_file(file, path, read_only)
    }

    /// Create a data file of `size_bytes` (mkfs): a new file, or an
    /// existing one truncated to that size. Its blocks are allocated
    /// (fallocate) so that a full device is found at mkfs, not by a write.
    pub fn create(path: &Path, size_bytes: u64) -> io::Result<FileDev> {
        let file = open_maybe_direct(path, false, true)?;
        let dev = Self::from_file(file, path, false)?;
        if dev.block_device {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is a block device: its size is its own", path.display()),
            ));
        }
        dev.file.set_len(0)?;
        dev.file.set_len(size_bytes)?;
        // SAFETY: a plain system call on a descriptor this function owns.
        let r = unsafe { libc::fallocate(dev.file.as_raw_fd(), 0, 0, size_bytes as libc::off_t) };
        if r != 0 {
            let e = io::Error::last_os_error();
            // A file system without fallocate keeps a sparse file: writes
            // allocate as they go (ENOSPC then comes from a write).
            if e.raw_os_error() != Some(libc::EOPNOTSUPP) {
                return Err(e);
            }
        }
        Ok(FileDev { size_bytes, ..dev })
    }

    /// The data device another process opened and handed over (a mount
    /// server's, to its attached client; `label` names it in messages).
    /// The descriptor shares that process's open file description: its
    /// lock (taken by the opener: none is taken here), its access mode and
    /// its O_DIRECT flag.
    pub fn from_shared_fd(fd: OwnedFd, label: &Path) -> io::Result<FileDev> {
        let file = File::from(fd);
        let meta = file.metadata()?;
        let block_device = meta.file_type().is_block_device();
        if !block_device && !meta.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: not a block device or a regular file", label.display()),
            ));
        }
        let size_bytes = if block_device {
            // SAFETY: lseek on an owned descriptor. The offset is shared
            // with the opener, which never uses it (reads and writes take
            // explicit offsets).
            let end = unsafe { libc::lseek(file.as_raw_fd(), 0, libc::SEEK_END) };
            if end < 0 {
                return Err(io::Error::last_os_error());
            }
            end as u64
        } else {
            meta.len()
        };
        // SAFETY: fcntl F_GETFL on an owned descriptor.
        let fl = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
        Ok(FileDev {
            file,
            path: label.to_path_buf(),
            direct: fl >= 0 && fl & libc::O_DIRECT != 0,
            block_device,
            size_bytes,
        })
    }

    fn from_file(file: File, path: &Path, read_only: bool) -> io::Result<FileDev> {
        let meta = file.metadata()?;
        let block_device = meta.file_type().is_block_device();
        if !block_device && !meta.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} is neither a block device nor a regular file",
                    path.display()
                ),
            ));
        }
        let op = if read_only {
            libc::LOCK_SH
        } else {
            libc::LOCK_EX
        };
        // SAFETY: a plain system call on a descriptor this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), op | libc::LOCK_NB) } != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) && !read_only {
                return Err(io::Error::new(
                    io::ErrorKind::ResourceBusy,
                    format!(
                        "data device {} is in use by another process",
                        path.display()
                    ),
                ));
            }
            if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(e);
            }
        }
        let size_bytes = if block_device {
            // SAFETY: lseek on an owned descriptor; read_at/write_at take
            // explicit offsets, so the file position does not matter.
            let end = unsafe { libc::lseek(file.as_raw_fd(), 0, libc::SEEK_END) };
            if end < 0 {
                return Err(io::Error::last_os_error());
            }
            end as u64
        } else {
            meta.len()
        };
        // SAFETY: fcntl F_GETFL on an owned descriptor.
        let fl = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
        Ok(FileDev {
            file,
            path: path.to_path_buf(),
            direct: fl >= 0 && fl & libc::O_DIRECT != 0,
            block_device,
            size_bytes,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether writes bypass the page cache (O_DIRECT).
    pub fn is_direct(&self) -> bool {
        self.direct
    }
}

/// Open with O_DIRECT, or without it where the file system refuses it
/// (EINVAL: tmpfs before Linux 6.6, some FUSE file systems).
fn open_maybe_direct(path: &Path, read_only: bool, create: bool) -> io::Result<File> {
    let open = |flags: i32| {
        OpenOptions::new()
            .read(true)
            .write(!read_only)
            .create(create)
            .custom_flags(flags | libc::O_CLOEXEC)
            .open(path)
    };
    match open(libc::O_DIRECT) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => open(0),
        r => r,
    }
}

impl BlockDev for FileDev {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read_at(&self, off: u64, buf: &mut [Page]) -> io::Result<()> {
        debug_assert!(off.is_multiple_of(BLOCK_SIZE));
        self.file.read_exact_at(as_bytes_mut(buf), off)
    }

    fn write_at(&self, off: u64, data: &[Page]) -> io::Result<()> {
        debug_assert!(off.is_multiple_of(BLOCK_SIZE));
        self.file.write_all_at(as_bytes(data), off)
    }

    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn describe(&self) -> String {
        format!(
            "{} {} ({})",
            if self.block_device {
                "block device"
            } else {
                "file"
            },
            self.path.display(),
            if self.direct {
                "O_DIRECT"
            } else {
                "page cache"
            }
        )
    }

    fn shared_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.file.as_fd())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_are_aligned_and_contiguous() {
        let mut p = pages(3);
        assert_eq!(p.as_ptr() as usize % 4096, 0);
        as_bytes_mut(&mut p)[4096] = 7;
        assert_eq!(p[1].0[0], 7);
        assert_eq!(as_bytes(&p).len(), 3 * 4096);
    }

    #[test]
    fn file_dev_round_trip_and_lock() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        let dev = FileDev::create(&path, 1 << 20).unwrap();
        assert_eq!(dev.size_bytes(), 1 << 20);
        let mut w = pages(2);
        w[1].0[5] = 9;
        dev.write_at(8192, &w).unwrap();
        dev.flush().unwrap();
        let mut r = pages(2);
        dev.read_at(8192, &mut r).unwrap();
        assert_eq!(r[1].0[5], 9);
        let busy = FileDev::open(&path, false).unwrap_err();
        assert_eq!(busy.kind(), io::ErrorKind::ResourceBusy, "{busy}");
        // A reader goes ahead (unlocked) while the writer holds it.
        let reader = FileDev::open(&path, true).unwrap();
        let mut r = pages(1);
        reader.read_at(8192 + 4096, &mut r).unwrap();
        assert_eq!(r[0].0[5], 9);
        drop((dev, reader));
        let again = FileDev::open(&path, true).unwrap();
        assert_eq!(again.size_bytes(), 1 << 20);
        let two = FileDev::open(&path, true).unwrap();
        drop((again, two));
    }

    /// A device handed over by descriptor (an attached client's) reads and
    /// writes what the opener does, with the opener's flags and no lock
    /// of its own.
    #[test]
    fn a_shared_descriptor_is_the_same_device() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        let dev = FileDev::create(&path, 1 << 20).unwrap();
        let fd = dev.shared_fd().unwrap().try_clone_to_owned().unwrap();
        let other = FileDev::from_shared_fd(fd, Path::new("(handed over)")).unwrap();
        assert_eq!(other.size_bytes(), 1 << 20);
        assert_eq!(other.is_direct(), dev.is_direct());
        let mut w = pages(1);
        w[0].0[7] = 3;
        other.write_at(4096, &w).unwrap();
        other.flush().unwrap();
        let mut r = pages(1);
        dev.read_at(4096, &mut r).unwrap();
        assert_eq!(r[0].0[7], 3);
        // Straight into an aligned buffer of the caller's.
        let mut raw = pages(2);
        let bytes = as_bytes_mut(&mut raw);
        assert!(as_pages_mut(&mut bytes[1..4097]).is_none());
        assert!(as_pages_mut(&mut bytes[..4095]).is_none());
        let p = as_pages_mut(&mut bytes[..4096]).unwrap();
        other.read_at(4096, p).unwrap();
        assert_eq!(raw[0].0[7], 3);
    }
}
