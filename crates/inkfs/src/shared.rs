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
struct RecordView {
    state: u64,
    head: u64,
    tail: u64,
    generation: u64,
    flags: u64,
    log_gen: u64,
}

impl RecordView {
    fn read<P: Pmem>(pm: &P, rec_off: u64) -> RecordView {
        let rec: InodeRecord = read_pod(pm, rec_off);
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
        let (sb, _) = superblock::read_superblock(&pm)?;
        if sb.state != STATE_MOUNTED {
            return Err(Error::BadPool(
                "the pool is not mounted: nothing to attach to".into(),
            ));
        }
        let geo = Geometry::of(&sb);
        let parts = Parts {
            sb,
            geo,
            tables: InodeTables::open(&geo),
            // Nothing is this process's to allocate until the owner grants it.
            blocks: BlockAllocator::new_all_used(geo.lane_count, geo.first_data_block, geo.total_blocks),
            slots: InodeSlots::new(geo.lane_count),
            report: MountReport::default(),
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

    /// Serve readers in other processes that pin epochs in `table`: this
    /// engine then checks cached inodes against their records (the readers'
    /// clients may write too) and holds the blocks it frees until no reader
    /// can hold them.
    pub fn share_epochs(&self, table: Arc<EpochTable>) {
        let _ = self.epochs.set(table);
        self.set_shared(true);
    }

    /// Blocks freed and waiting for readers to move on.
    pub fn limbo_blocks(&self) -> u64 {
        self.limbo.blocks()
    }

    /// Return to the free lists every held block no reader can hold now.
    pub fn reclaim_limbo(&self) {
        if let Some(table) = self.epochs.get() {
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
        if !self.is_shared() {
            return Ok(());
        }
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
            // Freed (and perhaps reused) by another process: this object is
            // stale; a new lookup loads whatever the slot holds now.
            st.gone = true;
            self.cache.remove(inode.ino);
            return errno(libc::ENOENT);
        }
        let incremental = now.head == st.log.head && now.log_gen == st.log_gen;
        if incremental && now.tail != st.log.tail {
            let geo = self.geo;
            let summary = log::walk_from(&self.pm, &geo, inode.ino, st.log.tail, now.tail, |off, e| {
                inode::apply_entry(&self.pm, &geo, st, e, &mut |_, _| {}).map_err(|m| {
                    crate::Error::Corrupt(format!("inode {} log offset {off}: {m}", inode.ino))
                })
            })
            .map_err(|e| self.corruption(ErrorReason::Log, Some(inode.ino), e))?;
            st.log.tail = now.tail;
            st.log.pages += summary.pages.len() as u64;
            st.log_entries += summary.entries;
        } else if !incremental {
            let rec: InodeRecord = read_pod(&self.pm, inode.rec_off);
            let fresh = inode::load(&self.pm, &self.geo, inode.ino, &rec)
                .map_err(|e| self.corruption(ErrorReason::Log, Some(inode.ino), e))?;
            // DRAM-only facts of this process survive: its open handles
            // and its own block reservation.
            let (open_count, prealloc) = (st.open_count, st.prealloc);
            *st = fresh;
            st.open_count = open_count;
            st.prealloc = prealloc;
        }
        st.flags = now.flags as u32;
        st.orphan = now.state == INODE_ORPHAN;
        debug_assert!(now.matches(st) || !incremental);
        Ok(())
    }
}
