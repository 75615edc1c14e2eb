//! A pool shared with other processes (the kernel-free path,
//! docs/KERNEL-FREE.md): catching up with what they committed.
//!
//! Another process may append to an inode's log (a client holding the
//! inode's write lease), or the server may change it (a namespace change,
//! log GC). Neither tells this process. Before using a cached inode, this
//! process therefore compares the inode record on media with what it
//! replayed: the same head, tail, generation, flags and GC generation mean
//! its DRAM state is current; a longer log is replayed from the cached
//! tail on; anything else (a new head after compaction, pages GC unlinked,
//! a freed or reused slot) is replayed from the head, or the inode is gone.
//!
//! A committed entry never changes and nothing past the tail is read, so a
//! reader always sees a state some commit produced. The cost when nothing
//! changed is one cache line of the record, read only while sharing is on
//! (one relaxed load of a flag otherwise).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::alloc::{BlockAllocator, InodeSlots};
use crate::epoch::EpochTable;
use crate::error::{errno, Error, Result};
use crate::format::*;
use crate::fs::{Fs, MountReport, Parts};
use crate::inode::{self, read, write, Inode, InodeState, InodeTables};
use crate::log;
use crate::pmem::{read_pod, Pmem};
use crate::superblock::{self, Geometry};
use crate::types::{Mode, MountOptions};

/// The fields of an inode record that say whether a cached state is current
/// (the first cache line of the record holds them all).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RecordView {
    state: u64,
    head: u64,
    tail: u64,
    generation: u64,
    flags: u64,
    log_gen: u64,
}

/// How long a reader waits for a record whose log does not replay to
/// change (the owner between two stores of a log switch) before it calls
/// the log corrupt.
const SETTLE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);
/// Changes of a record one load follows at most before giving up.
const SETTLE_CHANGES_MAX: u32 = 1000;

impl RecordView {
    fn read<P: Pmem>(pm: &P, rec_off: u64) -> RecordView {
        RecordView::of(&read_pod(pm, rec_off))
    }

    fn of(rec: &InodeRecord) -> RecordView {
        RecordView {
            state: rec.state,
            head: rec.log_head,
            tail: rec.log_tail,
            generation: rec.generation,
            flags: rec.flags,
            log_gen: rec.log_gen,
        }
    }

    fn matches(&self, st: &InodeState) -> bool {
        self.state != INODE_FREE
            && self.tail == st.log.tail
            && self.head == st.log.head
            && self.log_gen == st.log_gen
            && self.generation == st.generation
            && self.flags == st.flags as u64
            && (self.state == INODE_ORPHAN) == st.orphan
    }
}

impl<P: Pmem> Fs<P> {
    /// An engine over a pool another process has mounted and owns (the
    /// server of docs/KERNEL-FREE.md): it reads everything, catching up
    /// with the owner's changes at each access, and changes nothing (no
    /// journal replay, no scan, no superblock write, no allocation: writes
    /// come with leases and reservations the owner grants). Refused unless
    /// the pool is mounted (its superblock says so).
    pub fn attach(pm: P, mode: Mode) -> Result<Fs<P>> {
        Self::attach_with(pm, mode, None)
    }

    /// [`Fs::attach`] to a pool that may keep file data on a data device
    /// (a hybrid pool): `data` is the device (the owner's, handed over) and
    /// the owner's placement threshold. Its label is checked against the
    /// pool; without it a hybrid pool is refused.
    pub fn attach_with(
        pm: P,
        mode: Mode,
        data: Option<(std::sync::Arc<dyn crate::blockdev::BlockDev>, u64)>,
    ) -> Result<Fs<P>> {
        let (sb, _) = superblock::read_superblock(&pm)?;
        if sb.state != STATE_MOUNTED {
            return Err(Error::BadPool(
                "the pool is not mounted: nothing to attach to".into(),
            ));
        }
        let data = match (sb.has_data_device(), data) {
            (false, None) => None,
            (false, Some(_)) => {
                return Err(Error::BadPool(
                    "a data device was given, but this pool has none".into(),
                ))
            }
            (true, None) => {
                return Err(Error::BadPool(
                    "this pool keeps file data on a data device (a hybrid pool): \
                     attaching needs that device too"
                        .into(),
                ))
            }
            (true, Some((dev, threshold))) => Some(crate::blockdev::attach::client_store(
                dev,
                &sb,
                sb.lane_count,
                threshold,
                crate::blockdev::attach::client_cache(),
            )?),
        };
        let geo = Geometry::of(&sb);
        let parts = Parts {
            sb,
            geo,
            tables: InodeTables::open(&geo),
            // Nothing is this process's to allocate until the owner grants it.
            blocks: BlockAllocator::new_all_used(geo.lane_count, geo.first_data_block, geo.total_blocks),
            slots: InodeSlots::new(geo.lane_count),
            report: MountReport::default(),
            data,
        };
        let opts = MountOptions {
            mode,
            read_only: true,
            ..Default::default()
        };
        let fs = Fs::assemble(pm, parts, &opts);
        fs.set_shared(true);
        fs.iget(ROOT_INO)?;
        Ok(fs)
    }

    /// Serve readers in other processes that pin epochs in `table` (on
    /// the heap, or in memory shared with them: shm.rs): this engine then
    /// checks cached inodes against their records (the readers' clients
    /// may write too) and holds the blocks it frees until no reader can
    /// hold them. The first table given stays for the engine's life.
    pub fn share_epochs<T: AsRef<EpochTable> + Send + Sync + 'static>(&self, table: Arc<T>) {
        let _ = self.epochs.set(table);
        if let Some(t) = self.epochs.get() {
            // From the first client on, its device writes and the
            // server's are announced to each other's caches.
            self.data_use_stamps(t.clone());
        }
        self.set_shared(true);
    }

    /// The table of readers' epochs, once shared.
    pub(crate) fn epoch_table(&self) -> Option<&EpochTable> {
        self.epochs.get().map(|t| (**t).as_ref())
    }

    /// Blocks freed and waiting for readers to move on.
    pub fn limbo_blocks(&self) -> u64 {
        self.limbo.blocks()
    }

    /// Return to the free lists every held block no reader can hold now.
    pub fn reclaim_limbo(&self) {
        if let Some(table) = self.epoch_table() {
            self.limbo
                .reclaim(table, |start, len| self.free_now(start, len));
        }
    }

    /// Whether other processes may change this pool's inodes (clients of
    /// the kernel-free path attached, or this engine is such a client).
    pub fn is_shared(&self) -> bool {
        self.shared.load(Ordering::Relaxed)
    }

    /// Start (or stop) checking cached inodes against their records.
    /// Turning it on makes every later access catch up with changes other
    /// processes committed.
    pub fn set_shared(&self, on: bool) {
        self.shared.store(on, Ordering::Relaxed);
    }

    /// Bring `inode`'s DRAM state up to date with its record, if this pool
    /// is shared; ENOENT if another process freed the inode.
    pub(crate) fn revalidate(&self, inode: &Inode) -> Result<()> {
        if let Some(hook) = self.lease_hook.get() {
            // A client's lease on it is recalled first (the mount's table).
            hook.before_use(inode.ino);
        }
        if !self.is_shared() || self.client_known_current(inode) {
            return Ok(());
        }
        self.catch_up_now(inode)
    }

    /// Bring `inode`'s DRAM state up to date with its record whether or
    /// not this pool is shared (a mount server taking a lease back: it
    /// checks nothing else, lease.rs).
    pub(crate) fn catch_up_now(&self, inode: &Inode) -> Result<()> {
        let now = RecordView::read(&self.pm, inode.rec_off);
        {
            let st = read(&inode.state);
            if st.gone {
                return errno(libc::ENOENT);
            }
            if now.matches(&st) {
                return Ok(());
            }
        }
        let mut st = write(&inode.state);
        // Read again under the lock: a writer of this process may have
        // committed meanwhile.
        let now = RecordView::read(&self.pm, inode.rec_off);
        if st.gone {
            return errno(libc::ENOENT);
        }
        if now.matches(&st) {
            return Ok(());
        }
        self.catch_up(inode, &mut st, now)
    }

    fn catch_up(&self, inode: &Inode, st: &mut InodeState, now: RecordView) -> Result<()> {
        if now.state == INODE_FREE || now.generation != st.generation {
            return self.gone(inode, st);
        }
        let incremental = now.head == st.log.head && now.log_gen == st.log_gen;
        if incremental && now.tail != st.log.tail && self.replay_tail(inode, st, now).is_ok() {
            st.flags = now.flags as u32;
            st.orphan = now.state == INODE_ORPHAN;
            debug_assert!(now.matches(st));
            return Ok(());
        }
        if incremental && now.tail == st.log.tail {
            st.flags = now.flags as u32;
            st.orphan = now.state == INODE_ORPHAN;
            return Ok(());
        }
        // From the head: the log was switched or pages left it (or the
        // tail did not replay: read again from the head, which also
        // waits out a record caught mid-change).
        let rec: InodeRecord = read_pod(&self.pm, inode.rec_off);
        let (fresh, seen) = self.load_log(inode.ino, inode.rec_off, &rec)?;
        if seen.state == INODE_FREE || seen.generation != st.generation {
            return self.gone(inode, st);
        }
        // DRAM-only facts of this process survive: its open handles and
        // its own block reservation and recycled blocks.
        let (open_count, prealloc) = (st.open_count, st.prealloc);
        let recycled = std::mem::take(&mut st.recycled);
        *st = fresh;
        st.open_count = open_count;
        st.prealloc = prealloc;
        st.recycled = recycled;
        st.flags = seen.flags as u32;
        st.orphan = seen.state == INODE_ORPHAN;
        Ok(())
    }

    /// Freed (and perhaps reused) by another process: this object is
    /// stale; a new lookup loads whatever the slot holds now.
    fn gone(&self, inode: &Inode, st: &mut InodeState) -> Result<()> {
        st.gone = true;
        self.cache.remove_stale(inode);
        errno(libc::ENOENT)
    }

    /// Replay the entries committed after the cached tail, up to `now`'s.
    fn replay_tail(&self, inode: &Inode, st: &mut InodeState, now: RecordView) -> Result<()> {
        let geo = self.geo;
        let summary = log::walk_from(&self.pm, &geo, inode.ino, st.log.head, st.log.tail, now.tail, |off, e| {
            inode::apply_entry(&self.pm, &geo, st, e, &mut |_, _| {}).map_err(|m| {
                crate::Error::Corrupt(format!("inode {} log offset {off}: {m}", inode.ino))
            })
        })?;
        st.log.tail = now.tail;
        st.log.pages += summary.pages.len() as u64;
        st.log_entries += summary.entries;
        Ok(())
    }

    /// Replay inode `ino`'s log from the head as `rec` (read at `rec_off`)
    /// describes it, and the record fields that state matches.
    ///
    /// In a shared pool the owner may be switching the record to a new log
    /// while this process reads it: compaction stores the new head, then
    /// the new tail, then the GC generation, so a record read between the
    /// first two names a tail outside its head's chain, and the replay
    /// fails. The old log's pages are not reused meanwhile (the owner frees
    /// them after the switch, into the limbo, and this reader is pinned),
    /// so the reader waits for the record to change and replays again;
    /// only a record that stays as it is for [`SETTLE_WAIT`] and still
    /// fails to replay is corrupt.
    pub(crate) fn load_log(
        &self,
        ino: u64,
        rec_off: u64,
        rec: &InodeRecord,
    ) -> Result<(InodeState, RecordView)> {
        let mut rec = *rec;
        for _ in 0..SETTLE_CHANGES_MAX {
            let err = match inode::load(&self.pm, &self.geo, ino, &rec) {
                Ok(st) => return Ok((st, RecordView::of(&rec))),
                Err(e) if !self.is_shared() => e,
                Err(e) => match self.changed_record(rec_off, RecordView::of(&rec)) {
                    Some(newer) => {
                        rec = newer;
                        continue;
                    }
                    None => e,
                },
            };
            return Err(self.corruption(ErrorReason::Log, Some(ino), err));
        }
        Err(self.corruption(
            ErrorReason::Log,
            Some(ino),
            Error::Corrupt(format!(
                "inode {ino}: record changed {SETTLE_CHANGES_MAX} times without a log that replays"
            )),
        ))
    }

    /// The record at `rec_off` once it differs from `seen`, or None if it
    /// stays as it is for [`SETTLE_WAIT`].
    fn changed_record(&self, rec_off: u64, seen: RecordView) -> Option<InodeRecord> {
        let start = std::time::Instant::now();
        for round in 0u32.. {
            let rec: InodeRecord = read_pod(&self.pm, rec_off);
            if RecordView::of(&rec) != seen {
                return Some(rec);
            }
            if start.elapsed() >= SETTLE_WAIT {
                return None;
            }
            if round < 64 {
                std::hint::spin_loop();
            } else {
                // The owner's thread may be off its CPU between two stores.
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pmem::{MappedPool, PoolOpenOptions};
    use crate::types::FormatOptions;

    /// A record caught between the two stores of a log switch (the new
    /// head, the old tail) is waited out: the reader's call succeeds once
    /// the owner stores the new tail, instead of reporting the log corrupt.
    #[test]
    fn a_record_caught_mid_switch_is_waited_out() {
        let path = std::path::PathBuf::from(format!(
            "/dev/shm/inkfs-midswitch-{}.pool",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&path);
        let opts = PoolOpenOptions {
            create_size_bytes: Some(32 << 20),
            read_only: false,
        };
        let pm = MappedPool::open(&path, &opts).unwrap();
        let _ = std::fs::remove_file(&path);
        Fs::format(&pm, &FormatOptions::default()).unwrap();
        let owner = Fs::mount(pm, Default::default()).unwrap();
        let ro = PoolOpenOptions {
            create_size_bytes: None,
            read_only: true,
        };
        let file = owner.pmem().pool_file().try_clone().unwrap();
        let reader = Fs::attach(MappedPool::map(file, &ro).unwrap(), Mode::Strict).unwrap();
        let (a, fh) = owner.create(ROOT_INO, b"f", 0o644, 0, 0).unwrap();
        for i in 0..50u8 {
            owner.write(&fh, 0, &[i; 4096]).unwrap();
        }
        let read_all = |fs: &Fs<MappedPool>| {
            let h = fs.open(a.ino)?;
            let mut buf = vec![0u8; 4096];
            let n = fs.read(&h, 0, &mut buf);
            fs.release(h);
            n.map(|n| buf[..n].to_vec())
        };
        assert_eq!(read_all(&reader).unwrap(), [49u8; 4096]);
        // The owner compacts the log, then the test puts the old tail back
        // beside the new head: the state between the switch's two stores.
        let inode = owner.iget(a.ino).unwrap();
        let (old_tail, new_tail) = {
            let mut st = write(&inode.state);
            let old_tail = st.log.tail;
            crate::gc::compact(&owner, &inode, &mut st).unwrap();
            (old_tail, st.log.tail)
        };
        assert_ne!(old_tail, new_tail);
        let tail_at = inode.rec_off + INODE_TAIL_FIELD;
        owner.pm.write_u64(tail_at, old_tail);
        // The clock starts before the owner's thread does: started after
        // the spawn, a test thread kept off the CPU meanwhile measured less
        // than the thread's pause and failed under load. The read cannot
        // succeed before the second store, a pause after `t`.
        let t = std::time::Instant::now();
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(std::time::Duration::from_millis(100));
                owner.pm.write_u64(tail_at, new_tail);
            });
            assert_eq!(read_all(&reader).unwrap(), [49u8; 4096]);
            assert!(t.elapsed() >= std::time::Duration::from_millis(100));
        });
        assert_eq!(reader.error_stats().count, 0, "no error noted");
        owner.release(fh);
    }
}
