//! The real engine behind the front end: `inkfs::Fs` over a mapped pool.

use std::path::Path;

use inkfs::pmem::{MappedPool, Pmem, PoolOpenOptions};
use inkfs::types::{
    Attr, DirEntry, FallocFlags, MountOptions, RenameFlags, SetAttr, StatFs, Whence, XattrFlags,
};
use inkfs::{FileHandle, Fs, Result};

use crate::engine::Engine;
use crate::memfs::MemFs;
use crate::mount::{run_engine, MountConfig, Notify};

/// The pool name that mounts the in-memory reference engine instead of a
/// pool (a testing aid: nothing is persisted).
pub const MEMFS_POOL: &str = "memfs:";

impl<P: Pmem> Engine for Fs<P> {
    type Handle = FileHandle;

    fn handle_ino(&self, fh: &FileHandle) -> u64 {
        fh.ino()
    }
    fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr> {
        Fs::lookup(self, parent, name)
    }
    fn getattr(&self, ino: u64) -> Result<Attr> {
        Fs::getattr(self, ino)
    }
    fn setattr(&self, ino: u64, set: &SetAttr) -> Result<Attr> {
        Fs::setattr(self, ino, set)
    }
    fn mknod(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u64,
        uid: u32,
        gid: u32,
    ) -> Result<Attr> {
        Fs::mknod(self, parent, name, mode, rdev, uid, gid)
    }
    fn create(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        uid: u32,
        gid: u32,
    ) -> Result<(Attr, FileHandle)> {
        Fs::create(self, parent, name, mode, uid, gid)
    }
    fn mkdir(&self, parent: u64, name: &[u8], mode: u32, uid: u32, gid: u32) -> Result<Attr> {
        Fs::mkdir(self, parent, name, mode, uid, gid)
    }
    fn symlink(&self, parent: u64, name: &[u8], target: &[u8], uid: u32, gid: u32) -> Result<Attr> {
        Fs::symlink(self, parent, name, target, uid, gid)
    }
    fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        Fs::readlink(self, ino)
    }
    fn link(&self, ino: u64, newparent: u64, newname: &[u8]) -> Result<Attr> {
        Fs::link(self, ino, newparent, newname)
    }
    fn unlink(&self, parent: u64, name: &[u8]) -> Result<()> {
        Fs::unlink(self, parent, name)
    }
    fn rmdir(&self, parent: u64, name: &[u8]) -> Result<()> {
        Fs::rmdir(self, parent, name)
    }
    fn rename(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: RenameFlags,
    ) -> Result<()> {
        Fs::rename(self, parent, name, newparent, newname, flags)
    }
    fn readdir(&self, ino: u64, cookie: u64, f: &mut dyn FnMut(DirEntry) -> bool) -> Result<()> {
        Fs::readdir(self, ino, cookie, f)
    }
    fn open(&self, ino: u64) -> Result<FileHandle> {
        Fs::open(self, ino)
    }
    fn open_with(&self, ino: u64, flags: i32) -> Result<FileHandle> {
        Fs::open_with(self, ino, flags)
    }
    fn get_flags(&self, ino: u64) -> Result<u32> {
        Fs::get_flags(self, ino)
    }
    fn set_flags(&self, ino: u64, flags: u32, privileged: bool) -> Result<()> {
        Fs::set_flags(self, ino, flags, privileged)
    }
    fn release(&self, fh: FileHandle) {
        Fs::release(self, fh)
    }
    fn read_in_place(
        &self,
        fh: &FileHandle,
        off: u64,
        len: usize,
        reply: &mut dyn FnMut(&[u8]),
    ) -> Result<bool> {
        Ok(Fs::read_in_place(self, fh, off, len, |b| reply(b))?.is_some())
    }
    fn read(&self, fh: &FileHandle, off: u64, buf: &mut [u8]) -> Result<usize> {
        Fs::read(self, fh, off, buf)
    }
    fn write(&self, fh: &FileHandle, off: u64, data: &[u8]) -> Result<usize> {
        Fs::write(self, fh, off, data)
    }
    fn append(&self, fh: &FileHandle, data: &[u8]) -> Result<(u64, usize)> {
        Fs::append(self, fh, data)
    }
    fn fsync(&self, fh: &FileHandle, datasync: bool) -> Result<()> {
        Fs::fsync(self, fh, datasync)
    }
    fn fsync_is_noop(&self) -> bool {
        // Strict and sync modes persist every call before it returns (see
        // `Fs::fsync`); a read-only mount has nothing to persist.
        self.mode() != inkfs::types::Mode::Posix || self.is_read_only()
    }
    fn fallocate(&self, fh: &FileHandle, off: u64, len: u64, flags: FallocFlags) -> Result<()> {
        Fs::fallocate(self, fh, off, len, flags)
    }
    fn copy_range(
        &self,
        src: &FileHandle,
        src_off: u64,
        dst: &FileHandle,
        dst_off: u64,
        len: u64,
    ) -> Result<u64> {
        Fs::copy_range(self, src, src_off, dst, dst_off, len)
    }
    fn seek(&self, fh: &FileHandle, off: u64, whence: Whence) -> Result<u64> {
        Fs::seek(self, fh, off, whence)
    }
    fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], flags: XattrFlags) -> Result<()> {
        Fs::setxattr(self, ino, name, value, flags)
    }
    fn getxattr(&self, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        Fs::getxattr(self, ino, name)
    }
    fn listxattr(&self, ino: u64) -> Result<Vec<Vec<u8>>> {
        Fs::listxattr(self, ino)
    }
    fn removexattr(&self, ino: u64, name: &[u8]) -> Result<()> {
        Fs::removexattr(self, ino, name)
    }
    fn statfs(&self) -> StatFs {
        Fs::statfs(self)
    }
    fn sync(&self) -> Result<()> {
        Fs::sync(self)
    }
    fn report_lines(&self) -> Vec<(String, String)> {
        let g = self.gc_stats();
        let (inodes, pages) = self.loaded_log_pages();
        [
            ("inodes_loaded", inodes),
            ("log_pages_of_loaded_inodes", pages),
            ("gc_fast_scans", g.fast_scans),
            ("gc_fast_pages_freed", g.fast_pages_freed),
            ("gc_fast_refused", g.fast_refused),
            ("gc_compactions", g.compactions),
            ("gc_compaction_pages_freed", g.compaction_pages_freed),
            ("pool_populating", u64::from(self.pmem().populating())),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }
}

/// Open the pool of `cfg`, mount the engine and serve it on `mnt`.
pub fn serve_pool(cfg: &MountConfig, mnt: &Path, notify: &mut Notify) -> i32 {
    if cfg.pool.as_os_str() == MEMFS_POOL {
        let info = vec![(
            "engine".to_string(),
            "memfs (in-memory reference, not persistent)".to_string(),
        )];
        return run_engine(
            MemFs::new(cfg.read_only),
            cfg,
            mnt,
            info,
            notify,
            |_| Ok(()),
        );
    }
    let opts = PoolOpenOptions {
        create_size_bytes: None,
        read_only: cfg.read_only,
    };
    let pm = match MappedPool::open(&cfg.pool, &opts) {
        Ok(p) => p,
        Err(e) => {
            notify.fail(&format!("{}: {e}", cfg.pool.display()));
            return 1;
        }
    };
    let backend = pm.info();
    let fs = match Fs::mount(
        pm,
        MountOptions {
            mode: cfg.mode,
            read_only: cfg.read_only,
        },
    ) {
        Ok(f) => f,
        Err(e) => {
            notify.fail(&format!("{}: {e}", cfg.pool.display()));
            return 1;
        }
    };
    // DRAM pools: take tmpfs's first-touch page faults in the background
    // now rather than one per fresh block inside write requests.
    fs.pmem().populate_in_background();
    let r = fs.mount_report().clone();
    let info = vec![
        ("engine".to_string(), "inkfs".to_string()),
        ("backend".to_string(), backend.kind.describe().to_string()),
        ("flush".to_string(), backend.flush.name().to_string()),
        ("pool_bytes".to_string(), backend.size_bytes.to_string()),
        ("mounted_clean".to_string(), r.was_clean.to_string()),
        (
            "journals_replayed".to_string(),
            r.journals_replayed.to_string(),
        ),
        (
            "orphans_reclaimed".to_string(),
            r.orphans_reclaimed.to_string(),
        ),
    ];
    run_engine(fs, cfg, mnt, info, notify, |fs| {
        fs.unmount().map(|_pool| ()).map_err(|e| e.to_string())
    })
}
