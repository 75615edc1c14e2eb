//! The two ways a workload reaches a file system: POSIX calls on a directory
//! (any mounted contender), or the inkfs engine's library API (no kernel
//! crossing, no FUSE).

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use inkfs::api::{
    self, Credentials, Filesystem, FormatOptions, Mode, MountOptions, OpenFlags, SetAttr,
};
use inkfs::pmem::{MappedPool, Pmem, PoolOpenOptions};

pub trait Backend: Sync + Send {
    type Dir: Clone + Send + Sync;
    type File: Send;
    fn root(&self) -> Self::Dir;
    fn mkdir(&self, parent: &Self::Dir, name: &str) -> io::Result<Self::Dir>;
    /// Create (or truncate) and open read-write.
    fn create(&self, dir: &Self::Dir, name: &str) -> io::Result<Self::File>;
    fn open(&self, dir: &Self::Dir, name: &str) -> io::Result<Self::File>;
    /// Open for appends that may race with other threads' appends.
    fn open_append(&self, dir: &Self::Dir, name: &str) -> io::Result<Self::File>;
    fn close(&self, f: Self::File);
    fn pwrite(&self, f: &mut Self::File, off: u64, buf: &[u8]) -> io::Result<()>;
    fn append(&self, f: &mut Self::File, buf: &[u8]) -> io::Result<()>;
    fn pread(&self, f: &mut Self::File, off: u64, buf: &mut [u8]) -> io::Result<usize>;
    fn fsync(&self, f: &mut Self::File) -> io::Result<()>;
    /// Size as known to this handle (opened size plus its own writes).
    #[allow(dead_code)]
    fn size(&self, f: &Self::File) -> u64;
    /// ftruncate(2) through this handle.
    fn truncate(&self, f: &mut Self::File, size: u64) -> io::Result<()>;
    fn unlink(&self, dir: &Self::Dir, name: &str) -> io::Result<()>;
    /// stat(2) by name; returns the size.
    fn stat(&self, dir: &Self::Dir, name: &str) -> io::Result<u64>;
    /// List the whole directory; returns the number of entries.
    fn readdir(&self, dir: &Self::Dir) -> io::Result<usize>;
    /// Make everything written so far durable (syncfs / no-op).
    fn sync_all(&self) -> io::Result<()>;
}

// ---------------------------------------------------------------- POSIX

pub struct Posix {
    root: PathBuf,
}

pub struct PosixFile {
    f: File,
    size: u64,
    append_mode: bool,
}

impl Posix {
    pub fn new(root: &Path) -> io::Result<Posix> {
        std::fs::metadata(root)?;
        Ok(Posix {
            root: root.to_path_buf(),
        })
    }
}

impl Backend for Posix {
    type Dir = Arc<PathBuf>;
    type File = PosixFile;
    fn root(&self) -> Self::Dir {
        Arc::new(self.root.clone())
    }
    fn mkdir(&self, parent: &Self::Dir, name: &str) -> io::Result<Self::Dir> {
        let p = parent.join(name);
        std::fs::create_dir(&p)?;
        Ok(Arc::new(p))
    }
    fn create(&self, dir: &Self::Dir, name: &str) -> io::Result<PosixFile> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.join(name))?;
        Ok(PosixFile {
            f,
            size: 0,
            append_mode: false,
        })
    }
    fn open(&self, dir: &Self::Dir, name: &str) -> io::Result<PosixFile> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(dir.join(name))?;
        let size = f.metadata()?.len();
        Ok(PosixFile {
            f,
            size,
            append_mode: false,
        })
    }
    fn open_append(&self, dir: &Self::Dir, name: &str) -> io::Result<PosixFile> {
        let f = OpenOptions::new()
            .append(true)
            .create(true)
            .open(dir.join(name))?;
        Ok(PosixFile {
            f,
            size: 0,
            append_mode: true,
        })
    }
    fn close(&self, f: PosixFile) {
        drop(f)
    }
    fn pwrite(&self, f: &mut PosixFile, off: u64, buf: &[u8]) -> io::Result<()> {
        f.f.write_all_at(buf, off)?;
        f.size = f.size.max(off + buf.len() as u64);
        Ok(())
    }
    fn append(&self, f: &mut PosixFile, buf: &[u8]) -> io::Result<()> {
        if f.append_mode {
            f.f.write_all(buf)?;
        } else {
            f.f.write_all_at(buf, f.size)?;
        }
        f.size += buf.len() as u64;
        Ok(())
    }
    fn pread(&self, f: &mut PosixFile, off: u64, buf: &mut [u8]) -> io::Result<usize> {
        f.f.read_at(buf, off)
    }
    fn fsync(&self, f: &mut PosixFile) -> io::Result<()> {
        f.f.sync_all()
    }
    fn size(&self, f: &PosixFile) -> u64 {
        f.size
    }
    fn truncate(&self, f: &mut PosixFile, size: u64) -> io::Result<()> {
        f.f.set_len(size)?;
        f.size = size;
        Ok(())
    }
    fn unlink(&self, dir: &Self::Dir, name: &str) -> io::Result<()> {
        std::fs::remove_file(dir.join(name))
    }
    fn stat(&self, dir: &Self::Dir, name: &str) -> io::Result<u64> {
        Ok(std::fs::metadata(dir.join(name))?.len())
    }
    fn readdir(&self, dir: &Self::Dir) -> io::Result<usize> {
        let mut n = 0;
        for e in std::fs::read_dir(dir.as_path())? {
            e?;
            n += 1;
        }
        Ok(n)
    }
    fn sync_all(&self) -> io::Result<()> {
        let d = File::open(&self.root)?;
        // SAFETY: syncfs on a descriptor we own.
        if unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&d)) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

// ---------------------------------------------------------------- library

/// The engine through its API (`inkfs::api`), as root: what a program
/// linking the library gets, with no kernel crossing.
pub struct Lib {
    fs: Option<Filesystem<MappedPool>>,
    pool: PathBuf,
    cred: Credentials,
}

pub struct LibFile {
    file: api::File,
    size: u64,
}

fn e(err: api::Error) -> io::Error {
    io::Error::from_raw_os_error(err.errno())
}

impl Lib {
    /// Create a fresh pool file of `size` bytes, format and mount it.
    pub fn create(pool: &Path, size: u64, mode: Mode) -> io::Result<Lib> {
        let _ = std::fs::remove_file(pool);
        let pm = MappedPool::open(
            pool,
            &PoolOpenOptions {
                create_size_bytes: Some(size),
                read_only: false,
            },
        )?;
        // Steady state, as the FUSE server reaches it: a fresh tmpfs pool
        // would otherwise charge a page fault to the first store to each
        // page, which copy-on-write overwrites hit all the time.
        inkfs::pmem::prefault(&pm);
        Filesystem::format(&pm, &FormatOptions::default()).map_err(e)?;
        let fs = Filesystem::mount(
            pm,
            MountOptions {
                mode,
                read_only: false,
                ..Default::default()
            },
        )
        .map_err(e)?;
        Ok(Lib {
            fs: Some(fs),
            pool: pool.to_path_buf(),
            cred: Credentials::root(),
        })
    }
    fn fs(&self) -> &Filesystem<MappedPool> {
        self.fs.as_ref().expect("mounted")
    }
    pub fn describe(&self) -> String {
        let info = self.fs().pool().info();
        format!("{} ({})", info.kind.describe(), info.flush.name())
    }
    /// Unmount cleanly and delete the pool file.
    pub fn finish(mut self) -> io::Result<()> {
        let r = self.fs.take().map(|fs| fs.unmount().map(drop).map_err(e));
        let _ = std::fs::remove_file(&self.pool);
        r.unwrap_or(Ok(()))
    }
    fn open_with(&self, dir: &u64, name: &str, flags: i32) -> io::Result<LibFile> {
        let a = self
            .fs()
            .lookup(&self.cred, *dir, name.as_bytes())
            .map_err(e)?;
        let file = self
            .fs()
            .open(&self.cred, a.ino, OpenFlags::new(flags))
            .map_err(e)?;
        Ok(LibFile { file, size: a.size })
    }
}

impl Drop for Lib {
    fn drop(&mut self) {
        if let Some(fs) = self.fs.take() {
            let _ = fs.unmount();
        }
        let _ = std::fs::remove_file(&self.pool);
    }
}

impl Backend for Lib {
    type Dir = u64;
    type File = LibFile;
    fn root(&self) -> u64 {
        api::ROOT_INO
    }
    fn mkdir(&self, parent: &u64, name: &str) -> io::Result<u64> {
        Ok(self
            .fs()
            .mkdir(&self.cred, *parent, name.as_bytes(), 0o755)
            .map_err(e)?
            .ino)
    }
    fn create(&self, dir: &u64, name: &str) -> io::Result<LibFile> {
        let flags = OpenFlags::new(libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC);
        let (_, file) = self
            .fs()
            .create(&self.cred, *dir, name.as_bytes(), 0o644, flags)
            .map_err(e)?;
        Ok(LibFile { file, size: 0 })
    }
    fn open(&self, dir: &u64, name: &str) -> io::Result<LibFile> {
        self.open_with(dir, name, libc::O_RDWR)
    }
    fn open_append(&self, dir: &u64, name: &str) -> io::Result<LibFile> {
        match self.open_with(dir, name, libc::O_RDWR | libc::O_APPEND) {
            Err(err) if err.raw_os_error() == Some(libc::ENOENT) => self.create(dir, name),
            r => r,
        }
    }
    fn close(&self, f: LibFile) {
        self.fs().release(f.file)
    }
    fn pwrite(&self, f: &mut LibFile, off: u64, buf: &[u8]) -> io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            done += self
                .fs()
                .write_at(&f.file, off + done as u64, &buf[done..])
                .map_err(e)?
                .len;
        }
        f.size = f.size.max(off + buf.len() as u64);
        Ok(())
    }
    fn append(&self, f: &mut LibFile, buf: &[u8]) -> io::Result<()> {
        let n = self.fs().append(&f.file, buf).map_err(e)?.len;
        if n != buf.len() {
            return Err(io::Error::other("short append"));
        }
        f.size += n as u64;
        Ok(())
    }
    fn pread(&self, f: &mut LibFile, off: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.fs().read(&f.file, off, buf).map_err(e)
    }
    fn fsync(&self, f: &mut LibFile) -> io::Result<()> {
        self.fs().fsync(&f.file, false).map_err(e)
    }
    fn size(&self, f: &LibFile) -> u64 {
        f.size
    }
    fn truncate(&self, f: &mut LibFile, size: u64) -> io::Result<()> {
        let set = SetAttr {
            size: Some(size),
            ..Default::default()
        };
        self.fs()
            .setattr(&self.cred, f.file.ino(), &set, Some(&f.file))
            .map_err(e)?;
        f.size = size;
        Ok(())
    }
    fn unlink(&self, dir: &u64, name: &str) -> io::Result<()> {
        self.fs()
            .unlink(&self.cred, *dir, name.as_bytes())
            .map_err(e)
    }
    fn stat(&self, dir: &u64, name: &str) -> io::Result<u64> {
        Ok(self
            .fs()
            .lookup(&self.cred, *dir, name.as_bytes())
            .map_err(e)?
            .size)
    }
    fn readdir(&self, dir: &u64) -> io::Result<usize> {
        let d = self.fs().opendir(&self.cred, *dir).map_err(e)?;
        let mut n = 0usize;
        let r = self.fs().readdir(&d, 0, &mut |_| {
            n += 1;
            true
        });
        self.fs().release(d);
        r.map_err(e)?;
        Ok(n)
    }
    fn sync_all(&self) -> io::Result<()> {
        self.fs().sync().map_err(e)
    }
}
