//! The file system object: mount and unmount, inode lookup by number,
//! attributes, handles, and the commit helpers every operation uses.

use std::cell::Cell;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use crate::alloc::{BlockAllocator, InodeSlots};
use crate::dir::NameHasher;
use crate::error::{errno, Error, Result};
use crate::filemap::IndexKind;
use crate::format::*;
use crate::inode::{lock, read, write, Body, Inode, InodeCache, InodeState, InodeTables};
use crate::journal::{self, Journal, JournalState};
use crate::log::{self, EntryBuf, LogCursor, NewPages};
use crate::pmem::{read_pod, Pmem};
use crate::recovery;
use crate::superblock::{self, Geometry, SuperSource};
use crate::time::now_ns;
use crate::perm::{self, Actor, Credentials};
use crate::types::*;

/// How the last mount found the pool.
#[derive(Clone, Debug, Default)]
pub struct MountReport {
    pub was_clean: bool,
    pub used_backup_superblock: bool,
    pub journals_replayed: u32,
    pub journals_discarded: u32,
    pub orphans_reclaimed: u64,
    pub inodes_scanned: u64,
    /// True if the allocator came from the save areas (no log scan).
    pub allocator_restored: bool,
}

/// An open file or directory. Reads and writes go straight to the inode,
/// without any table lookup.
#[derive(Debug)]
pub struct FileHandle {
    pub(crate) inode: Arc<Inode>,
    /// Writes through this handle drop the file's set-id bits: it was
    /// opened by a caller without CAP_FSETID (Linux decides by the writer's
    /// credentials at each write; the opener's stand in for them).
    pub(crate) drops_setid: bool,
}

impl FileHandle {
    pub(crate) fn new(inode: Arc<Inode>) -> FileHandle {
        FileHandle {
            inode,
            drops_setid: false,
        }
    }
    pub fn ino(&self) -> u64 {
        self.inode.ino
    }
}

/// The times of a setattr that a kernel cache in front of the engine
/// decided: FUSE's writeback cache keeps a regular file's mtime and ctime
/// itself between write-backs, stamps them at each write, and sends them as
/// explicit values, with its own write-back of them and with every setattr
/// (a "now" included). The kernel has checked the caller's right to set
/// them, so explicit times are judged as "now" is (owner or writer, and
/// allowed on an append-only file); `ctime` is the kernel's change time
/// (None: now).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct KernelTimes {
    pub(crate) ctime: Option<TimeNs>,
}

pub struct Fs<P: Pmem> {
    pub(crate) pm: P,
    pub(crate) geo: Geometry,
    pub(crate) mode: Mode,
    pub(crate) read_only: bool,
    /// The superblock as last written (its mutex orders every superblock
    /// write of a mounted pool: mount, error record, unmount).
    pub(crate) sb: Mutex<Superblock>,
    pub(crate) blocks: BlockAllocator,
    pub(crate) slots: InodeSlots,
    pub(crate) tables: InodeTables,
    pub(crate) cache: InodeCache,
    pub(crate) journals: Vec<Mutex<Journal>>,
    /// Serialises cross-directory renames of directories, so the
    /// "not into its own descendant" check cannot race (as Linux's
    /// s_vfs_rename_mutex).
    pub(crate) rename_lock: Mutex<()>,
    /// Readdir positions of new names (keyed by the pool's uuid).
    pub(crate) names: NameHasher,
    /// Blocks held in inodes' DRAM reservations (free for statfs: they
    /// return to the allocator at the last close, and are free after a crash).
    reserved_blocks: LaneCounter,
    pub(crate) gc: crate::gc::GcCounters,
    /// Corruption met while mounted: count, `errors=` policy, read-only.
    pub(crate) health: crate::health::Health,
    /// Other processes may change inodes (shared.rs): cached inodes are
    /// checked against their records before use.
    pub(crate) shared: std::sync::atomic::AtomicBool,
    /// Readers in other processes (epoch.rs): while set, freed blocks wait
    /// in `limbo` until no reader can hold them.
    pub(crate) epochs: std::sync::OnceLock<crate::epoch::SharedTable>,
    pub(crate) limbo: crate::epoch::Limbo,
    report: MountReport,
    /// Hybrid pools: the data device and everything about it
    /// (`blockdev/`); None when file data lives on PM only.
    pub(crate) data: Option<crate::blockdev::store::DataStore>,
    /// A mount server's lease table (lease.rs): told before an inode is
    /// used, so that a client's lease on it is recalled first.
    pub(crate) lease_hook: std::sync::OnceLock<Arc<dyn crate::lease::LeaseHook>>,
    /// A client engine of the kernel-free path (lease.rs): writes only
    /// under leases, frees to the server.
    pub(crate) client: Option<crate::lease::ClientSide>,
    /// Orphans only a client's hold keeps (holds.rs).
    pub(crate) held_orphans: Mutex<Vec<u64>>,
    /// Which lanes are leased to clients, and what was handed out with
    /// them (lanelease.rs).
    pub(crate) lane_owners: crate::lanelease::LaneOwners,
    /// Frees the allocator refused (a double free: DRAM books that
    /// disagree with each other), counted for `inkfs stat` and tests.
    pub(crate) frees_refused: AtomicU64,
}

/// What a mount (or an attach) puts together before the engine exists.
pub(crate) struct Parts {
    pub sb: Superblock,
    pub geo: Geometry,
    pub tables: InodeTables,
    pub blocks: BlockAllocator,
    pub slots: InodeSlots,
    pub report: MountReport,
    /// Hybrid pools: the block side (None: file data on PM only).
    pub data: Option<crate::blockdev::store::DataStore>,
}

/// A count kept per lane, one cache line each, and summed when read: the
/// threads that change it share no line. A lane's part may go negative (a
/// block reserved by one thread, taken by another); the sum may not.
struct LaneCounter(Box<[PaddedCount]>);

#[repr(align(128))]
struct PaddedCount(AtomicI64);

impl LaneCounter {
    fn new(lanes: u32) -> LaneCounter {
        LaneCounter(
            (0..lanes.max(1))
                .map(|_| PaddedCount(AtomicI64::new(0)))
                .collect(),
        )
    }
    fn add(&self, lane: u32, n: i64) {
        let part = &self.0[lane as usize % self.0.len()];
        part.0.fetch_add(n, Ordering::Relaxed);
    }
    fn sum(&self) -> u64 {
        let s: i64 = self.0.iter().map(|p| p.0.load(Ordering::Relaxed)).sum();
        // Parts are read one by one while others change: clamp a
        // transiently negative sum.
        s.max(0) as u64
    }
}

static NEXT_THREAD_LANE: AtomicU32 = AtomicU32::new(0);
thread_local! {
    static THREAD_LANE: Cell<u32> = const { Cell::new(u32::MAX) };
}

impl<P: Pmem> Fs<P> {
    /// Lay out an empty file system on `pm` (mkfs).
    pub fn format(pm: &P, opts: &FormatOptions) -> Result<Superblock> {
        superblock::format(pm, opts)
    }

    /// Lay out an empty hybrid pool on `pm` and `data.device` (mkfs).
    pub fn format_hybrid(
        pm: &P,
        opts: &FormatOptions,
        data: &crate::blockdev::HybridFormat<'_>,
    ) -> Result<Superblock> {
        crate::blockdev::attach::format_pool(pm, opts, data)
    }

    /// Open a formatted pool: instant after a clean unmount, a journal
    /// replay plus a scan of every live log after a crash. A pool whose
    /// superblock records errors met while mounted is refused read-write
    /// (BadPool, saying to run `inkfs fsck -y`); read-only is allowed.
    pub fn mount(pm: P, opts: MountOptions) -> Result<Fs<P>> {
        Self::mount_inner(pm, opts, false)
    }

    /// `mount` for fsck's repairs, which run on a pool whose error record
    /// is still set (fsck clears it only once a check finds the pool clean).
    pub(crate) fn mount_for_repair(pm: P, opts: MountOptions) -> Result<Fs<P>> {
        Self::mount_inner(pm, opts, true)
    }

    fn mount_inner(pm: P, opts: MountOptions, allow_recorded_errors: bool) -> Result<Fs<P>> {
        let (mut sb, source) = superblock::read_superblock(&pm)?;
        // Refused before anything is written (journal replay, recovery).
        if sb.errors_count != 0 && !opts.read_only && !allow_recorded_errors {
            return Err(Error::BadPool(format!(
                "{}; run `inkfs fsck -y` on it: a read-write mount needs a check that \
                 finds it clean first (a read-only mount is allowed)",
                ErrorRecord::of(&sb).describe()
            )));
        }
        let geo = Geometry::of(&sb);
        // A hybrid pool's data device is found and checked before
        // anything is written (journal replay, recovery): a missing or
        // wrong device refuses the mount with the pool untouched.
        let device = crate::blockdev::attach::open_device(&pm, &sb, &opts)?;
        let tables = InodeTables::open(&geo);
        let mut report = MountReport {
            was_clean: sb.state == STATE_CLEAN,
            used_backup_superblock: source == SuperSource::Backup,
            ..MountReport::default()
        };
        for lane in 0..geo.lane_count {
            match journal::recover(&pm, &geo, lane, opts.read_only, |off| {
                tables.is_record_field(&pm, off).unwrap_or(false)
            })? {
                JournalState::Empty => {}
                JournalState::Replayed { .. } => report.journals_replayed += 1,
                JournalState::Discarded => report.journals_discarded += 1,
            }
        }
        let mut restored = if sb.state == STATE_CLEAN && report.journals_replayed == 0 {
            BlockAllocator::restore(
                &pm,
                geo.lane_count,
                geo.first_data_block,
                geo.total_blocks,
                sb.mount_epoch,
            )
        } else {
            None
        };
        // The device's free lists come from its own save area; if it is
        // not valid, both sides are rebuilt by the scan.
        let mut dev_blocks = None;
        if let (Some(_), Some(dev)) = (&restored, &device) {
            dev_blocks = crate::blockdev::layout::restore(
                &**dev,
                geo.lane_count,
                sb.data_blocks,
                sb.mount_epoch,
            );
            if dev_blocks.is_none() {
                restored = None;
            }
        }
        let (blocks, slots) = match restored {
            Some(pair) => {
                report.allocator_restored = true;
                pair
            }
            None => {
                let rebuilt = recovery::rebuild(&pm, &geo, &tables, opts.read_only)?;
                report.orphans_reclaimed = rebuilt.orphans_reclaimed;
                report.inodes_scanned = rebuilt.inodes_scanned;
                dev_blocks = rebuilt.dev_blocks;
                (rebuilt.blocks, rebuilt.slots)
            }
        };
        let data = match (device, dev_blocks) {
            (Some(dev), Some(alloc)) => Some(crate::blockdev::attach::store(dev, &sb, &opts, alloc)),
            (None, _) => None,
            (Some(_), None) => {
                return Err(Error::Corrupt(
                    "no allocator for the data device (engine bug)".into(),
                ))
            }
        };
        if !opts.read_only {
            sb.state = STATE_MOUNTED;
            // Every older format is a subset of this one; from here on,
            // logs may use what this version allows.
            sb.version = FORMAT_VERSION;
            sb.mount_epoch += 1;
            sb.seal();
            superblock::write_superblocks(&pm, &sb);
        }
        let parts = Parts {
            sb,
            geo,
            tables,
            blocks,
            slots,
            report,
            data,
        };
        let fs = Fs::assemble(pm, parts, &opts);
        let root = fs.iget(ROOT_INO)?;
        if root.kind != FileKind::Dir {
            return Err(Error::Corrupt("the root inode is not a directory".into()));
        }
        // From here on damage is met while mounted; before, it failed the
        // mount itself, which says so to its caller.
        fs.health.arm();
        Ok(fs)
    }

    /// The engine over `pm` from what mounting (or attaching, shared.rs)
    /// found and built.
    pub(crate) fn assemble(pm: P, parts: Parts, opts: &MountOptions) -> Fs<P> {
        let Parts {
            sb,
            geo,
            tables,
            blocks,
            slots,
            report,
            data,
        } = parts;
        let journals = (0..geo.lane_count)
            .map(|l| Mutex::new(Journal::open(&pm, l)))
            .collect();
        Fs {
            pm,
            geo,
            mode: opts.mode,
            read_only: opts.read_only,
            sb: Mutex::new(sb),
            blocks,
            slots,
            tables,
            cache: InodeCache::default(),
            journals,
            rename_lock: Mutex::new(()),
            shared: Default::default(),
            epochs: Default::default(),
            limbo: Default::default(),
            names: NameHasher::new(&sb.uuid),
            reserved_blocks: LaneCounter::new(geo.lane_count),
            gc: Default::default(),
            health: crate::health::Health::new(opts.errors),
            report,
            data,
            lease_hook: Default::default(),
            client: None,
            held_orphans: Mutex::default(),
            lane_owners: crate::lanelease::LaneOwners::new(geo.lane_count),
            frees_refused: AtomicU64::new(0),
        }
    }

    /// Clean unmount: reclaim inodes still open after unlink, save the
    /// allocators, mark the superblock clean. Returns the pool.
    pub fn unmount(self) -> Result<P> {
        if self.read_only {
            return Ok(self.pm);
        }
        // Also after errors=remount-ro: every call committed atomically, so
        // the allocator is consistent and is saved, and the pool is marked
        // clean (the error record stays). A clean pool mounts read-only
        // without a scan, which a scan-refusing damaged log would forbid:
        // the user can copy data off before fsck.
        // Deferred posix appends commit first (one flush), as at syncfs.
        self.commit_deferred()?;
        for inode in self.cache.all() {
            let mut st = write(&inode.state);
            self.drop_prealloc(&mut st);
            if st.orphan && !st.gone {
                self.free_inode_now(&inode, &mut st);
            }
        }
        // Readers of other processes are gone with the mount.
        self.limbo.drain(|start, len| self.free_now(start, len));
        let mut sb = *lock(&self.sb);
        if let Some(d) = &self.data {
            // Data written in place (posix) becomes durable, then the
            // device's free lists are saved and flushed, all before the
            // superblock says clean: a crash before that store rebuilds
            // both sides by scanning.
            d.sync().map_err(crate::blockdev::engine::io_errno)?;
            d.save(sb.mount_epoch)?;
        }
        // If the free lists do not fit the save areas, the next mount
        // rebuilds them by scanning: slower, never wrong.
        let _saved = self
            .blocks
            .save(&self.pm, sb.mount_epoch, &self.slots)
            .map_err(|e| Error::Corrupt(format!("saving the allocator: {e:?}")))?;
        sb.state = STATE_CLEAN;
        sb.unmounted_unix_ns = now_ns() as u64;
        sb.seal();
        superblock::write_superblocks(&self.pm, &sb);
        self.pm.sync_all()?;
        Ok(self.pm)
    }

    pub fn pmem(&self) -> &P {
        &self.pm
    }
    /// Mounted read-only (`MountOptions::read_only`): nothing is written,
    /// not even an error record.
    pub fn is_mounted_read_only(&self) -> bool {
        self.read_only
    }
    /// Mounted read-only, or turned read-only by `errors=remount-ro`.
    pub fn is_read_only(&self) -> bool {
        !self.may_write()
    }
    pub fn mode(&self) -> Mode {
        self.mode
    }
    pub fn mount_report(&self) -> &MountReport {
        &self.report
    }
    pub fn geometry(&self) -> Geometry {
        self.geo
    }
    pub fn superblock(&self) -> Superblock {
        *lock(&self.sb)
    }

    /// This thread's lane (allocation, inode numbers, journal), never one
    /// leased to a client (lanelease.rs): assigned
    /// round-robin on first use, so threads spread without a system call.
    pub(crate) fn lane(&self) -> u32 {
        let raw = THREAD_LANE.with(|l| {
            if l.get() == u32::MAX {
                l.set(NEXT_THREAD_LANE.fetch_add(1, Ordering::Relaxed));
            }
            l.get()
        });
        let lane = raw % self.geo.lane_count;
        if self.lane_owners.is_leased(lane) {
            return self.lane_not_leased(lane);
        }
        lane
    }

    /// EROFS for a mutating call on a read-only mount or after
    /// `errors=remount-ro` turned the file system read-only.
    pub(crate) fn check_writable(&self) -> Result<()> {
        if self.may_write() {
            Ok(())
        } else {
            errno(libc::EROFS)
        }
    }

    /// Whether anything but an error record may be written.
    #[inline]
    pub(crate) fn may_write(&self) -> bool {
        // A client engine is read-only but for its lease writes (lease.rs);
        // a mounted engine never looks at that.
        (!self.read_only || self.client_writing()) && !self.health.is_remounted_ro()
    }

    // -----------------------------------------------------------------------
    // Inodes by number
    // -----------------------------------------------------------------------

    /// The loaded inode `ino`, reading its log on first access.
    /// Damage met on the way (its table, record or log) goes through the
    /// errors= path ([`Fs::corruption`]).
    pub(crate) fn iget(&self, ino: u64) -> Result<Arc<Inode>> {
        let inode = self.iget_cached(ino)?;
        match self.revalidate(&inode) {
            Ok(()) => Ok(inode),
            // Another process freed the inode this object was loaded from,
            // and may have reused its slot since: the stale object is out
            // of the cache now, so load what the slot holds today.
            Err(Error::Errno(libc::ENOENT)) if self.is_shared() && inode.is_gone() => {
                let fresh = self.iget_cached(ino)?;
                self.revalidate(&fresh)?;
                Ok(fresh)
            }
            Err(e) => Err(e),
        }
    }

    /// The loaded inode `ino` as this process last saw it (no catching up
    /// with other processes: see `shared.rs`).
    pub(crate) fn iget_cached(&self, ino: u64) -> Result<Arc<Inode>> {
        self.cache.get_or_load(ino, || {
            let rec_off = self
                .tables
                .record_offset(&self.pm, ino)
                .map_err(|e| self.corruption(ErrorReason::InodeTable, Some(ino), e))?
                .ok_or(Error::Errno(libc::ENOENT))?;
            let rec: InodeRecord = read_pod(&self.pm, rec_off);
            let bad_record =
                |m: String| self.corruption(ErrorReason::InodeRecord, Some(ino), Error::Corrupt(m));
            if !inode_state_valid(rec.state) {
                return Err(bad_record(format!(
                    "inode {ino}: record state {} invalid",
                    rec.state
                )));
            }
            if rec.state == INODE_FREE {
                return errno(libc::ENOENT);
            }
            if rec.ino != ino {
                return Err(bad_record(format!(
                    "inode record at {rec_off} names inode {}, expected {ino}",
                    rec.ino
                )));
            }
            let kind = FileKind::from_u32(rec.kind)
                .ok_or_else(|| bad_record(format!("inode {ino}: unknown kind {}", rec.kind)))?;
            // Waits out a record another process is changing (shared.rs).
            let (st, _) = self.load_log(ino, rec_off, &rec)?;
            Ok(Arc::new(Inode {
                ino,
                kind,
                rec_off,
                state: RwLock::new(st),
                lease_mark: Default::default(),
            }))
        })
    }

    pub(crate) fn attr_of(&self, inode: &Inode, st: &InodeState) -> Attr {
        let a = &st.attr;
        let (size, blocks, nlink) = match &st.body {
            Body::File(map) => (a.size, map.mapped_pages() * (BLOCK_SIZE / 512), a.nlink),
            Body::Dir(d) => (
                st.log.pages * BLOCK_SIZE,
                st.log.pages * (BLOCK_SIZE / 512),
                2 + d.subdirs(),
            ),
            Body::Symlink { target, .. } => (target.len() as u64, BLOCK_SIZE / 512, a.nlink),
            Body::Special => (0, 0, a.nlink),
        };
        let nlink = if st.orphan || st.gone { 0 } else { nlink };
        Attr {
            ino: inode.ino,
            generation: st.generation,
            kind: inode.kind,
            mode: a.mode,
            nlink,
            uid: a.uid,
            gid: a.gid,
            rdev: if inode.kind == FileKind::CharDev || inode.kind == FileKind::BlockDev {
                a.rdev_or_parent
            } else {
                0
            },
            size,
            blocks,
            atime_ns: a.atime_ns,
            mtime_ns: a.mtime_ns,
            ctime_ns: a.ctime_ns,
        }
    }

    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        let inode = self.iget(ino)?;
        let st = read(&inode.state);
        live(&st)?;
        Ok(self.attr_of(&inode, &st))
    }

    /// Pages in inode `ino`'s log (read-only; for tests and tools that
    /// watch log GC keep logs bounded).
    pub fn log_pages(&self, ino: u64) -> Result<u64> {
        let inode = self.iget(ino)?;
        let st = read(&inode.state);
        live(&st)?;
        Ok(st.log.pages)
    }

    /// Which structure indexes file `ino`'s pages in DRAM, and its extent
    /// count (read-only; for tests and tools).
    pub fn file_index(&self, ino: u64) -> Result<(IndexKind, usize)> {
        let inode = self.iget(ino)?;
        let st = read(&inode.state);
        live(&st)?;
        match st.file() {
            Some(m) => Ok((m.index_kind(), m.extent_count())),
            None => errno(libc::EINVAL),
        }
    }

    pub fn fgetattr(&self, fh: &FileHandle) -> Result<Attr> {
        self.revalidate(&fh.inode)?;
        let st = read(&fh.inode.state);
        Ok(self.attr_of(&fh.inode, &st))
    }

    /// chmod, chown, utimens, truncate: one SET_ATTR entry (plus the
    /// partial-page zeroing of a shrinking truncate), committed by the tail.
    pub fn setattr(&self, ino: u64, set: &SetAttr) -> Result<Attr> {
        self.setattr_as(Actor::Engine, ino, set)
    }

    /// setattr for `actor`. A caller's chmod, chown and utimes are checked
    /// under the inode's lock (setattr_prepare); truncate's permission is
    /// the front end's (write permission on the path, or a handle open for
    /// writing), as the VFS checks it before locking. A caller's chown of a
    /// non-directory, and its truncate unless it is root, drop the set-id
    /// bits in the same entry (notify_change's ATTR_KILL_*).
    pub(crate) fn setattr_as(&self, actor: Actor<'_>, ino: u64, set: &SetAttr) -> Result<Attr> {
        self.setattr_times_from(actor, ino, set, None)
    }

    /// setattr with the times a kernel cache in front decided (`kernel`:
    /// see [`KernelTimes`]), or, with `None`, as `setattr_as`.
    pub(crate) fn setattr_times_from(
        &self,
        actor: Actor<'_>,
        ino: u64,
        set: &SetAttr,
        kernel: Option<KernelTimes>,
    ) -> Result<Attr> {
        self.check_writable()?;
        let inode = self.iget(ino)?;
        self.setattr_inode(actor, &inode, set, kernel)
    }

    /// `setattr_times_from` that may defer its commit when the inode has a
    /// deferred tail (blockdev/deferred.rs): the SET_ATTR entry is
    /// appended past it and committed by the next round, with no flush of
    /// its own. True: deferred, durable once a `commit_deferred` that began
    /// after this call returned Ok. For the times a kernel's page cache
    /// writes back between its write-backs; a size change never defers.
    pub(crate) fn setattr_times_deferring(
        &self,
        actor: Actor<'_>,
        ino: u64,
        set: &SetAttr,
        kernel: Option<KernelTimes>,
    ) -> Result<(Attr, bool)> {
        self.check_writable()?;
        let inode = self.iget(ino)?;
        self.setattr_inode_deferring(actor, &inode, set, kernel, set.size.is_none())
    }

    pub(crate) fn setattr_inode(
        &self,
        actor: Actor<'_>,
        inode: &Arc<Inode>,
        set: &SetAttr,
        kernel: Option<KernelTimes>,
    ) -> Result<Attr> {
        self.setattr_inode_deferring(actor, inode, set, kernel, false)
            .map(|(a, _)| a)
    }

    fn setattr_inode_deferring(
        &self,
        actor: Actor<'_>,
        inode: &Arc<Inode>,
        set: &SetAttr,
        kernel: Option<KernelTimes>,
        defer: bool,
    ) -> Result<(Attr, bool)> {
        let mut st = write(&inode.state);
        live(&st)?;
        // As truncate(2): the kind first, then what the flags forbid.
        if set.size.is_some() {
            match inode.kind {
                FileKind::File => {}
                FileKind::Dir => return errno(libc::EISDIR),
                _ => return errno(libc::EINVAL),
            }
        }
        // Times a kernel cache stamped are judged as "now" (its clock, at
        // the caller's write or touch, checked by that kernel); their
        // values are applied as given below.
        let judged = match kernel {
            Some(_) => set.times_as_now(),
            None => *set,
        };
        crate::flags::deny_setattr(&st, &judged)?;
        let checked = match actor.caller() {
            Some(cred) => self.caller_setattr(cred, inode, &st, &judged)?,
            None => judged,
        };
        let set = &SetAttr {
            atime: set.atime,
            mtime: set.mtime,
            ..checked
        };
        let now = now_ns();
        let mut deferred = false;
        let mut a = st.attr;
        if let Some(mode) = set.mode {
            a.mode = (a.mode & libc::S_IFMT) | (mode & 0o7777);
        }
        if let Some(uid) = set.uid {
            a.uid = uid;
        }
        if let Some(gid) = set.gid {
            a.gid = gid;
        }
        let resolve = |t: TimeSet| match t {
            TimeSet::Now => now,
            TimeSet::At(ns) => ns,
        };
        if let Some(t) = set.atime {
            a.atime_ns = resolve(t);
        }
        if let Some(t) = set.mtime {
            a.mtime_ns = resolve(t);
        }
        a.ctime_ns = kernel.and_then(|k| k.ctime).unwrap_or(now);
        if let Some(size) = set.size {
            if size > MAX_FILE_BYTES {
                return errno(libc::EFBIG);
            }
            if set.mtime.is_none() {
                a.mtime_ns = now;
            }
            self.truncate_locked(inode, &mut st, a, size)?;
        } else if defer && self.deferred().is_some_and(|d| d.pending(inode.ino)) {
            self.commit_attr_deferred(inode, &mut st, a)?;
            deferred = true;
        } else {
            self.commit_attr(inode, &mut st, a)?;
        }
        self.maybe_compact(inode, &mut st);
        Ok((self.attr_of(inode, &st), deferred))
    }

    /// Make `a` the inode's attributes: one SET_ATTR entry, committed by a
    /// durable tail store (the attributes are then all persisted: nothing
    /// of a posix-mode mtime is left pending).
    pub(crate) fn commit_attr(&self, inode: &Inode, st: &mut InodeState, a: AttrEntry) -> Result<()> {
        let mut cur = st.log;
        let mut pages = NewPages::default();
        let entry = EntryBuf::attr(false, a);
        if let Err(e) = self.log_append(inode.ino, &mut cur, &entry, &mut pages) {
            pages.release(&self.blocks);
            return Err(e);
        }
        self.commit_tail(inode.rec_off, &cur, true);
        st.log = cur;
        st.log_entries += 1;
        st.attr = a;
        st.attr_dirty = false;
        Ok(())
    }

    /// The setattr a caller may make, as Linux's setattr_prepare and
    /// notify_change decide it: ownership for chmod (a set-group-ID bit
    /// outside the caller's groups is dropped), chown and explicit times;
    /// ownership or write permission for "now"; set-id bits dropped by a
    /// chown of a non-directory or an unprivileged truncate.
    fn caller_setattr(
        &self,
        cred: &Credentials,
        inode: &Inode,
        st: &InodeState,
        set: &SetAttr,
    ) -> Result<SetAttr> {
        let a = self.attr_of(inode, st);
        let mut set = *set;
        if let Some(mode) = set.mode {
            set.mode = Some(perm::chmod(cred, &a, mode)?);
        }
        perm::chown(cred, &a, set.uid, set.gid)?;
        if set.atime.is_some() || set.mtime.is_some() {
            let explicit = |t: Option<TimeSet>| matches!(t, Some(TimeSet::At(_)));
            perm::set_times(cred, &a, explicit(set.atime) || explicit(set.mtime))?;
        }
        let owner_change = set.uid.is_some() || set.gid.is_some();
        let unprivileged_truncate = set.size.is_some() && !cred.is_root();
        if set.mode.is_none() && inode.kind != FileKind::Dir && (owner_change || unprivileged_truncate)
        {
            set.mode = perm::killed_setid(a.mode);
        }
        Ok(set)
    }

    // -----------------------------------------------------------------------
    // Handles
    // -----------------------------------------------------------------------

    /// Open any inode (files for I/O, directories for fsync/readdir).
    /// Keeps an unlinked inode alive until `release`. No access check: an
    /// open(2) front end uses `open_with`, which applies the open flags'
    /// rules for immutable and append-only inodes (writes are checked
    /// again at each call either way).
    pub fn open(&self, ino: u64) -> Result<FileHandle> {
        let inode = self.iget(ino)?;
        let mut st = write(&inode.state);
        live(&st)?;
        st.open_count += 1;
        drop(st);
        Ok(FileHandle::new(inode))
    }

    /// Close a handle; the last close of an unlinked inode frees it,
    /// unless a client holds it (holds.rs).
    pub fn release(&self, fh: FileHandle) {
        if read(&fh.inode.state).orphan {
            // A held orphan may be leased (holds.rs): the lease comes back
            // before the inode may go.
            if let Some(hook) = self.lease_hook.get() {
                hook.before_use(fh.inode.ino);
            }
        }
        let mut st = write(&fh.inode.state);
        debug_assert!(st.open_count > 0);
        st.open_count = st.open_count.saturating_sub(1);
        if st.open_count == 0 {
            self.drop_prealloc(&mut st);
            // Read-only: after errors=remount-ro the unmount frees it (a
            // read-only mount never has one: a crash's are freed by the
            // next read-write mount).
            if st.orphan && !st.gone && self.may_write() {
                if self.client_holds(fh.inode.ino) {
                    self.keep_held_orphan(fh.inode.ino);
                } else {
                    self.free_inode_now(&fh.inode, &mut st);
                }
            }
        }
    }

    /// Give an inode's DRAM block reservation back to the allocator.
    pub(crate) fn drop_prealloc(&self, st: &mut InodeState) {
        let (start, len) = std::mem::take(&mut st.prealloc);
        if len > 0 {
            self.reserved_changed_at(start, -(len as i64));
            self.free_blocks(start, len);
        }
    }

    /// Blocks entered (`n > 0`) or left (`n < 0`) inodes' reservations.
    pub(crate) fn reserved_changed(&self, n: i64) {
        self.reserved_blocks.add(self.lane(), n);
    }

    /// Free an inode whose last link and last handle are gone: its record
    /// becomes FREE with one persisted store, then its blocks return to the
    /// allocator (a crash in between leaks nothing: the recovery scan
    /// rebuilds the allocator from live logs only).
    pub(crate) fn free_inode_now(&self, inode: &Inode, st: &mut InodeState) {
        debug_assert!(!st.gone);
        // Its deferred appends are no file's now; no round may store to
        // the record once it is FREE.
        if let Some(d) = self.deferred() {
            d.forget(inode.ino);
        }
        self.pm
            .write_u64(inode.rec_off + INODE_STATE_FIELD, INODE_FREE);
        self.pm.persist(inode.rec_off + INODE_STATE_FIELD, 8);
        self.release_inode_blocks(inode, st);
    }

    /// Return an inode's log pages and data blocks to the allocator and mark
    /// it gone (its record is already FREE on media).
    pub(crate) fn release_inode_blocks(&self, inode: &Inode, st: &mut InodeState) {
        if let Some(d) = self.deferred() {
            d.forget(inode.ino);
        }
        self.drop_prealloc(st);
        st.gone = true;
        st.orphan = false;
        match log::walk(
            &self.pm,
            &self.geo,
            inode.ino,
            st.log.head,
            st.log.tail,
            |_, _| Ok(()),
        ) {
            Ok(summary) => {
                for p in summary.pages {
                    // A chunk of a leased lane's client: held until the
                    // lane's settle (lanechunks.rs).
                    if !self.hold_leased_chunk(inode.ino, p) {
                        self.free_blocks_batched(p, 1);
                    }
                }
            }
            // The log was readable when the inode was loaded: damaged since.
            // Its pages stay allocated (a later scan frees them); the record
            // is already FREE.
            Err(e) => {
                self.corruption(ErrorReason::Log, Some(inode.ino), e);
            }
        }
        match &mut st.body {
            Body::File(map) => {
                for e in map.iter() {
                    self.free_blocks_batched(e.block, e.pages);
                }
                *map = Default::default();
            }
            Body::Symlink { block, .. } if *block != 0 => {
                self.free_blocks_batched(*block, 1);
            }
            _ => {}
        }
        // One look at the readers' pins for the whole inode, not one per
        // range (an unlink's largest cost after the removal itself:
        // bench/results-notes/srvcpu.md).
        self.reclaim_limbo();
        // Out of the cache before the slot can be handed out again, or this
        // removal could evict the slot's next inode.
        self.cache.remove(inode.ino);
        let (lane, slot) = ino_to_lane_slot(inode.ino, self.geo.lane_count);
        if !self.client_free_slot(lane, slot) {
            let _ = self.slots.free(lane, slot);
        }
    }

    /// Free `len` blocks from `start`, or (`len` 1) one log page by its
    /// page id, a chunk's included (`format::log_page_id`).
    pub(crate) fn free_blocks(&self, start: u64, len: u64) {
        if self.free_blocks_batched(start, len) {
            self.reclaim_limbo();
        }
    }

    /// [`Fs::free_blocks`] without the limbo's reclaim: true when the
    /// blocks went to the limbo, and the caller reclaims once after its
    /// last free ([`Fs::reclaim_limbo`]; later is always safe: a block
    /// leaves the limbo only once no pin older than its hold remains).
    fn free_blocks_batched(&self, start: u64, len: u64) -> bool {
        // A client's log chunk: the head chunk of an inode it created and
        // removed (rmlocal.rs), given back with the lane.
        if start >= LOG_CHUNK_ID_MIN && self.client_free_chunk(start) {
            debug_assert_eq!(len, 1);
            return false;
        }
        if self.client_free(start, len) {
            // A client's: the server holds them (lease.rs).
            return false;
        }
        if let Some(table) = self.epoch_table() {
            // Readers in other processes may still be reading them.
            self.limbo.hold(table, start, len);
            return true;
        }
        self.free_now(start, len);
        false
    }

    pub(crate) fn free_now(&self, start: u64, len: u64) {
        // To the allocator of the block's side (PM or the data device);
        // a log chunk's id (above every block number) to the chunk maps.
        let r = if start >= LOG_CHUNK_ID_MIN {
            debug_assert_eq!(len, 1);
            self.blocks.free_log_page(start)
        } else {
            self.free_on_side(start, len)
        };
        if let Err(e) = r {
            // A double free means DRAM state disagrees with itself; keep
            // going (the allocator refused the free), but say so loudly.
            self.frees_refused.fetch_add(1, Ordering::Relaxed);
            eprintln!("inkfs: internal error freeing blocks {start}+{len}: {e:?}");
            debug_assert!(false, "double free of {start}+{len}");
        }
    }

    /// Frees the allocator refused so far (double frees).
    pub fn frees_refused(&self) -> u64 {
        self.frees_refused.load(Ordering::Relaxed)
    }

    pub fn statfs(&self) -> StatFs {
        let data_blocks = self.geo.total_blocks - self.geo.first_data_block;
        let free = self.blocks.free_blocks() + self.reserved_blocks.sum();
        let used_inodes = self.slots.used_count();
        let (dev_blocks, dev_free) = self.data.as_ref().map_or((0, 0), |d| d.space());
        // A new inode's log starts in a chunk on PM (format 6): a free
        // chunk of a partly used block, or one of the chunks a free block
        // would be carved into. An upper bound, as on other file systems
        // that make inodes on demand: records and names take space too.
        let files_free = free * LOG_CHUNKS_PER_BLOCK + self.blocks.free_chunks();
        let keep = crate::alloc::grant::server_keep_blocks(self.blocks.capacity_blocks());
        StatFs {
            block_size: BLOCK_SIZE as u32,
            blocks: data_blocks + dev_blocks,
            blocks_free: free + dev_free,
            blocks_avail: free.saturating_sub(keep) + dev_free,
            files: used_inodes + files_free,
            files_free,
            name_max: NAME_MAX as u32,
            data_blocks: dev_blocks,
            data_blocks_free: dev_free,
        }
    }

    /// syncfs: every mode already persists metadata at each call; this makes
    /// pending posix-mode data durable.
    pub fn sync(&self) -> Result<()> {
        // Deferred posix appends commit after one flush (their own).
        self.commit_deferred()?;
        self.dev_sync()?;
        self.pm.fence();
        Ok(())
    }

    // -----------------------------------------------------------------------
    // Commit helpers
    // -----------------------------------------------------------------------

    /// Append one entry to a working cursor (not yet committed). The
    /// commit that follows stores the inode's tail: a pending deferred
    /// tail of the inode is settled first (blockdev/deferred.rs).
    pub(crate) fn log_append(
        &self,
        ino: u64,
        cur: &mut LogCursor,
        entry: &EntryBuf,
        pages: &mut NewPages,
    ) -> Result<u64> {
        self.settle_tail(ino)?;
        self.log_append_unsettled(ino, cur, entry, pages)
    }

    /// `log_append` without the settle: a deferred append's own entries.
    pub(crate) fn log_append_unsettled(
        &self,
        ino: u64,
        cur: &mut LogCursor,
        entry: &EntryBuf,
        pages: &mut NewPages,
    ) -> Result<u64> {
        log::append(
            &self.pm,
            &self.blocks,
            self.lane(),
            ino,
            cur,
            entry.as_bytes(),
            pages,
        )
    }

    /// Commit one log: fence (entries and data durable), then the 8-byte
    /// tail store, persisted unless the caller defers durability (posix
    /// data writes; fsync re-flushes the tail).
    pub(crate) fn commit_tail(&self, rec_off: u64, cur: &LogCursor, durable: bool) {
        debug_assert!(
            !self.deferred().is_some_and(|d| d.pending_record(rec_off)),
            "a tail stored over a deferred one not settled"
        );
        self.pm.fence();
        self.pm.write_u64(rec_off + INODE_TAIL_FIELD, cur.tail);
        self.pm.flush(rec_off + INODE_TAIL_FIELD, 8);
        if durable {
            self.pm.fence();
        }
    }

    /// Commit several 8-byte stores (tails, inode states) atomically
    /// through this lane's journal.
    pub(crate) fn commit_journal(&self, records: &[JournalRecord]) {
        // A client engine writes only its leased lane's journal
        // (lanelease.rs, `commit_journal_of_slot`).
        debug_assert!(!self.is_client(), "a client committing outside its lane");
        debug_assert!(
            records.iter().all(|r| {
                r.offset % INODE_RECORD_SIZE != INODE_TAIL_FIELD
                    || !self
                        .deferred()
                        .is_some_and(|d| d.pending_record(r.offset - INODE_TAIL_FIELD))
            }),
            "a journal storing a tail over a deferred one not settled"
        );
        let (_lane, mut j) = self.owner_journal();
        j.commit(&self.pm, records);
    }

    /// Log GC after an operation committed: unlink dead log pages, and
    /// compact the log when most of it is dead.
    pub(crate) fn maybe_compact(&self, inode: &Inode, st: &mut InodeState) {
        if self.is_client() {
            // Log GC is the server's, once it has the inode back.
            return;
        }
        crate::gc::maybe_collect(self, inode, st);
    }

    /// Inodes loaded in DRAM, and the log pages they hold (for statistics:
    /// walks the inode cache).
    pub fn loaded_log_pages(&self) -> (u64, u64) {
        let all = self.cache.all();
        let pages = all.iter().map(|i| read(&i.state).log.pages).sum();
        (all.len() as u64, pages)
    }

    /// Log GC activity since mount.
    pub fn gc_stats(&self) -> GcStats {
        self.gc.snapshot()
    }
}

/// Fail operations on an inode that was freed under a stale reference.
pub(crate) fn live(st: &InodeState) -> Result<()> {
    if st.gone {
        errno(libc::ENOENT)
    } else {
        Ok(())
    }
}

/// A journal record storing `value` in field `field` of the inode record at `rec_off`.
pub(crate) fn rec(rec_off: u64, field: u64, value: u64) -> JournalRecord {
    JournalRecord {
        offset: rec_off + field,
        value,
    }
}
