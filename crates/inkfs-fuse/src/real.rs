//! The real engine behind the front end: `inkfs::Fs` over a mapped pool.

use std::path::Path;

use inkfs::pmem::{MappedPool, Pmem, PoolBusy, PoolOpenOptions};
use inkfs::scrub::{ScrubProgress, ScrubReport};
use inkfs::types::{
    Attr, DirEntry, FallocFlags, MountOptions, RenameFlags, SetAttr, StatFs, Whence, XattrFlags,
};
use inkfs::{FileHandle, Fs, Result};

use crate::engine::Engine;
use crate::memfs::MemFs;
use crate::mount::{run_engine, MountConfig, Notify};
use crate::stats::Field;

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
        uid: u32,
        gid: u32,
    ) -> Result<()> {
        Fs::rename_as(self, parent, name, newparent, newname, flags, uid, gid)
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
        // `Fs::fsync`); a read-only mount has nothing to persist. (A mount
        // turned read-only by errors=remount-ro still may: posix fsync
        // makes its committed writes durable.)
        self.mode() != inkfs::types::Mode::Posix || self.is_mounted_read_only()
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
    fn report_lines(&self) -> Vec<Field> {
        let g = self.gc_stats();
        let e = self.error_stats();
        let (inodes, pages) = self.loaded_log_pages();
        let mut fields = vec![
            Field::count("inodes_loaded", "inodes in memory", inodes)
                .explained("read from their logs since mount"),
            Field::count(
                "log_pages_of_loaded_inodes",
                "log pages of those inodes",
                pages,
            ),
            Field::count("gc_fast_scans", "log GC: fast scans", g.fast_scans)
                .explained("logs searched for pages holding only dead entries"),
            Field::count(
                "gc_fast_pages_freed",
                "log GC: fast pages freed",
                g.fast_pages_freed,
            ),
            Field::count(
                "gc_fast_refused",
                "log GC: fast scans refused",
                g.fast_refused,
            ),
            Field::count("gc_compactions", "log GC: compactions", g.compactions)
                .explained("logs rewritten without their dead entries"),
            Field::count(
                "gc_compaction_pages_freed",
                "log GC: compaction pages freed",
                g.compaction_pages_freed,
            ),
            Field::flag(
                "pool_populating",
                "page pre-mapping",
                self.pmem().populating(),
                "running (a background thread maps the pool's pages; until it is done, \
                 a first write to a page may take a page fault)",
                "done, or not needed for this backend",
            ),
            // Corruption met while mounted (errors=), this mount's count.
            Field::count("fs_errors", "errors met while mounted", e.count)
                .explained("corruption found by operations or scrub since mount"),
            Field::count(
                "fs_errors_recorded",
                "errors in the pool's record",
                e.recorded.count,
            )
            .explained("kept in the superblock until inkfs fsck -y clears them"),
            Field::flag(
                "remounted_read_only",
                "turned read-only",
                e.remounted_ro,
                "yes: errors=remount-ro met corruption; writes get EROFS",
                "no",
            ),
            Field::text("errors_policy", "on errors", e.policy.name())
                .explained("errors= mount option"),
        ];
        if let Some(last) = e.recorded.last {
            fields.push(Field::text("last_error", "last error", last.describe()));
        }
        fields
    }
    fn is_read_only(&self) -> bool {
        Fs::is_read_only(self)
    }
    fn scrub(&self, progress: &mut dyn FnMut(ScrubProgress) -> bool) -> Result<ScrubReport> {
        Ok(Fs::scrub(self, progress))
    }
}

/// Open and claim the pool of `cfg`: exclusively for a read-write mount,
/// shared for `ro`.
pub fn open_pool(cfg: &MountConfig) -> std::result::Result<MappedPool, String> {
    let opts = PoolOpenOptions {
        create_size_bytes: None,
        read_only: cfg.read_only,
    };
    MappedPool::open(&cfg.pool, &opts).map_err(|e| match PoolBusy::of(&e) {
        Some(_) => format!("{}: {e}; not mounting it", cfg.pool.display()),
        None => format!("{}: {e}", cfg.pool.display()),
    })
}

/// Mount the engine on `pm` (the pool of `cfg`, opened by [`open_pool`];
/// None for memfs) and serve it on `mnt`.
pub fn serve_pool(
    cfg: &MountConfig,
    mnt: &Path,
    notify: &mut Notify,
    pm: Option<MappedPool>,
) -> i32 {
    let Some(pm) = pm else {
        let info = vec![Field::text(
            "engine",
            "engine",
            "memfs (in-memory reference, not persistent)",
        )];
        return run_engine(
            MemFs::new(cfg.read_only),
            cfg,
            mnt,
            info,
            notify,
            |_| Ok(()),
        );
    };
    let backend = pm.info();
    let fs = match Fs::mount(
        pm,
        MountOptions {
            mode: cfg.mode,
            read_only: cfg.read_only,
            errors: cfg.errors,
        },
    ) {
        Ok(f) => f,
        Err(e) => {
            notify.fail(&format!("{}: {e}", cfg.pool.display()));
            return 1;
        }
    };
    let recorded = fs.error_stats().recorded;
    if !recorded.is_clear() {
        // Only a read-only mount gets here with a record (the engine
        // refuses a read-write one): say why the pool needs fsck.
        eprintln!(
            "inkfs: warning: {}: {}; mounted read-only, run `inkfs fsck -y` on it after unmounting",
            cfg.pool.display(),
            recorded.describe()
        );
    }
    // DRAM pools: take tmpfs's first-touch page faults in the background
    // now rather than one per fresh block inside write requests.
    fs.pmem().populate_in_background();
    let r = fs.mount_report().clone();
    let info = vec![
        Field::text("engine", "engine", "inkfs"),
        Field::text("backend", "backend", backend.kind.describe()),
        Field::text("flush", "flush method", backend.flush.name()),
        Field::bytes("pool_bytes", "pool size", backend.size_bytes),
        Field::flag(
            "mounted_clean",
            "state at mount",
            r.was_clean,
            "clean",
            "crashed: recovered by this mount",
        ),
        Field::count(
            "journals_replayed",
            "journals replayed at mount",
            r.journals_replayed.into(),
        )
        .explained("operations on several inodes that a crash cut short, finished"),
        Field::count(
            "orphans_reclaimed",
            "orphans freed at mount",
            r.orphans_reclaimed,
        )
        .explained("files still open after their unlink when the pool was last used"),
    ];
    run_engine(fs, cfg, mnt, info, notify, |fs| {
        // The session is over: a new mount of this pool waits for the
        // claim from here on instead of being refused.
        fs.pmem().pool_file().finishing();
        fs.unmount().map(|_pool| ()).map_err(|e| e.to_string())
    })
}
