//! Deferred tails: posix appends to fresh device blocks committed after
//! one device flush shared by many (docs/DESIGN.md, "Posix appends
//! without a device flush each"; the ordering rule of docs/FORMAT.md is
//! kept: device blocks are durable before the tail naming them is stored).
//!
//! A posix append whose pages are all fresh device blocks (it displaces
//! nothing: not an append into a partial last page, which copies that
//! page on write) may ask to be deferred (`Fs::write_deferring`): its data
//! and its entries are written past the log tail, and the tail on media
//! stays where it is. DRAM moves on (the file map, the size, the inode's
//! log cursor), so the engine's own readers see the write. The inode is
//! noted here with its DRAM tail. Later, either:
//! - the *round* (`Fs::commit_deferred`, run by the caller's flusher or by
//!   `Fs::sync`): note every pending inode's tail, flush the device once,
//!   then store and persist those tails (the commit, after the flush). A
//!   write deferred before the round began is durable when it returns;
//! - or a *settle* (`Fs::settle_tail`): any other store of that inode's
//!   tail first flushes the device and stores the pending tail. It runs
//!   in `Fs::log_append` (every commit of an entry to the inode: setattr,
//!   truncate, fallocate, xattrs, chattr, the LINK_CHANGE of link, unlink
//!   and rename whose journal records the tail, compaction, and a
//!   non-deferred write), in `persist_tail` (fsync, an overwrite past the
//!   durable size), before fast GC, and at a clean unmount.
//!
//! Recovery is unchanged: entries past a tail are not the file's. A crash
//! loses the deferred appends not yet committed, a prefix of the file's
//! appends since its last durable point, as posix mode allows (MODES.md).
//!
//! Invariant (checked where tails are stored, `Fs::commit_tail` and
//! `Fs::commit_journal`): no tail of an inode with a pending entry here is
//! stored except by the round or a settle, which store the pending tail
//! after a device flush. While an entry exists its `tail` equals the
//! inode's DRAM tail (every other change of the log settles first).
//!
//! The inode cache never drops a live inode (only a freed one, which is
//! forgotten here first), so a pending inode's DRAM state is never
//! reloaded from its record meanwhile.
//!
//! Ownership: the set lives in the DRAM of the pool's one writer process
//! (the mount's server or a library that owns the pool). Clients of the
//! kernel-free path are refused on posix mounts (inkfs-fuse `attach.rs`,
//! `admit`), so no other process stores these inodes' tails; nothing is
//! handed over. A crash drops the set with everything it names.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::error::Result;
use crate::format::INODE_TAIL_FIELD;
use crate::fs::{FileHandle, Fs};
use crate::pmem::Pmem;
use crate::types::Mode;

/// One inode whose DRAM tail is ahead of its tail on media.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Pending {
    rec_off: u64,
    /// The inode's DRAM tail after its last deferred append.
    tail: u64,
    /// Unique per insertion: a round stores a tail it noted only if the
    /// entry was not settled (and maybe made again, for a rewritten log)
    /// meanwhile.
    gen: u64,
}

/// A pending tail as a round noted it before its flush.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Noted {
    ino: u64,
    pending: Pending,
}

/// The pool's pending tails (see the module documentation).
#[derive(Default)]
pub struct DeferredTails {
    /// Entries in `map`: the write path's only look when nothing is
    /// pending (strict and sync modes, PM-only writes).
    count: AtomicUsize,
    next_gen: AtomicU64,
    map: Mutex<HashMap<u64, Pending>>,
    /// Appends deferred, rounds run, tails the rounds stored, settles
    /// (a tail stored by another operation's commit), since mount.
    pub(crate) appends: AtomicU64,
    pub(crate) rounds: AtomicU64,
    pub(crate) round_tails: AtomicU64,
    pub(crate) settles: AtomicU64,
}

impl DeferredTails {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Pending>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether any inode has a pending tail.
    #[inline]
    pub(crate) fn any(&self) -> bool {
        self.count.load(Ordering::Acquire) > 0
    }

    /// A deferred append of `ino` left its DRAM tail at `tail` (called
    /// under the inode's lock, after its entries are written and fenced).
    pub(crate) fn note(&self, ino: u64, rec_off: u64, tail: u64) {
        let mut m = self.lock();
        let next = &self.next_gen;
        let p = m.entry(ino).or_insert_with(|| Pending {
            rec_off,
            tail,
            gen: next.fetch_add(1, Ordering::Relaxed),
        });
        debug_assert_eq!(p.rec_off, rec_off, "one record per inode");
        p.tail = tail;
        self.count.store(m.len(), Ordering::Release);
        self.appends.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether `ino` has a pending tail.
    pub(crate) fn pending(&self, ino: u64) -> bool {
        self.any() && self.lock().contains_key(&ino)
    }

    /// Whether the inode whose record is at `rec_off` has a pending tail
    /// (for the invariant's checks).
    pub(crate) fn pending_record(&self, rec_off: u64) -> bool {
        self.any() && self.lock().values().any(|p| p.rec_off == rec_off)
    }

    /// Settle `ino` after a device flush: `store(rec_off, tail)` its
    /// pending tail, under the set's lock (a round's stores take it too),
    /// and forget it. False when it had none (a round got there first).
    pub(crate) fn settle(&self, ino: u64, store: impl FnOnce(u64, u64)) -> bool {
        let mut m = self.lock();
        let Some(p) = m.remove(&ino) else {
            return false;
        };
        store(p.rec_off, p.tail);
        self.count.store(m.len(), Ordering::Release);
        self.settles.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// The inode is freed: its pending entries name blocks of no file,
    /// and its record must not be stored to (the slot may be reused).
    pub(crate) fn forget(&self, ino: u64) {
        if self.any() {
            let mut m = self.lock();
            m.remove(&ino);
            self.count.store(m.len(), Ordering::Release);
        }
    }

    /// A round's first step: every pending tail as it stands now.
    pub(crate) fn note_all(&self, out: &mut Vec<Noted>) {
        out.clear();
        if !self.any() {
            return;
        }
        out.extend(
            self.lock()
                .iter()
                .map(|(&ino, &pending)| Noted { ino, pending }),
        );
    }

    /// A round's last step, after its device flush: `store(rec_off,
    /// tail)` each noted tail whose entry was not settled meanwhile;
    /// entries not appended to since they were noted are done.
    pub(crate) fn commit_noted(&self, noted: &[Noted], mut store: impl FnMut(u64, u64)) {
        if noted.is_empty() {
            return;
        }
        let mut m = self.lock();
        for n in noted {
            let Some(p) = m.get(&n.ino) else { continue };
            if p.gen != n.pending.gen {
                continue;
            }
            store(p.rec_off, n.pending.tail);
            self.round_tails.fetch_add(1, Ordering::Relaxed);
            if p.tail == n.pending.tail {
                m.remove(&n.ino);
            }
        }
        self.count.store(m.len(), Ordering::Release);
    }
}

impl<P: Pmem> Fs<P> {
    /// The pool's deferred tails (None: no data device, nothing defers).
    pub(crate) fn deferred(&self) -> Option<&DeferredTails> {
        self.data.as_ref().map(|d| &d.deferred)
    }

    /// A posix-mode write-back (the FUSE mount's, from its page cache):
    /// `write_dropping`, except that an append to fresh device blocks is
    /// deferred (blockdev/deferred.rs): not committed on return, but by
    /// the next [`Fs::commit_deferred`] (or an earlier settle). Returns
    /// whether the write left device data to flush before it is durable
    /// (a deferred append, or an overwrite in place on the device); if
    /// not, it is as `write_dropping` left it (a posix write: durable at
    /// fsync). Other modes and PM-only pools never defer.
    pub fn write_deferring(
        &self,
        fh: &FileHandle,
        off: u64,
        data: &[u8],
        drops_setid: bool,
    ) -> Result<bool> {
        self.check_writable()?;
        Self::file_state_check(&fh.inode)?;
        self.revalidate(&fh.inode)?;
        if data.is_empty() {
            return Ok(false);
        }
        let defer = self.mode == Mode::Posix && self.data.is_some() && !self.is_client();
        let mut st = crate::inode::write(&fh.inode.state);
        self.write_locked(fh, &mut st, off, data, drops_setid, defer)
    }

    /// `commit_attr` for an inode with a deferred tail: the SET_ATTR entry
    /// appended past it and fenced, the new DRAM tail noted for the next
    /// round (no flush, no tail store).
    pub(crate) fn commit_attr_deferred(
        &self,
        inode: &crate::inode::Inode,
        st: &mut crate::inode::InodeState,
        a: crate::format::AttrEntry,
    ) -> Result<()> {
        let Some(d) = self.deferred() else {
            return self.commit_attr(inode, st, a);
        };
        let mut cur = st.log;
        let mut pages = crate::log::NewPages::default();
        let entry = crate::log::EntryBuf::attr(false, a);
        if let Err(e) = self.log_append_unsettled(inode.ino, &mut cur, &entry, &mut pages) {
            pages.release(&self.blocks);
            return Err(e);
        }
        self.pm.fence();
        d.note(inode.ino, inode.rec_off, cur.tail);
        st.log = cur;
        st.log_entries += 1;
        st.attr = a;
        st.attr_dirty = false;
        Ok(())
    }

    /// Store a committed tail and persist it: the fence first makes the
    /// entries (fenced by their writer already) and everything before
    /// durable on this thread's side too.
    fn store_tail_persisted(&self, rec_off: u64, tail: u64) {
        self.pm.fence();
        self.pm.write_u64(rec_off + INODE_TAIL_FIELD, tail);
        self.pm.persist(rec_off + INODE_TAIL_FIELD, 8);
    }

    /// Before any other store of `ino`'s tail: if it has a pending tail,
    /// flush the device (its deferred appends' blocks) and store that tail.
    /// The caller holds the inode's lock, so no deferred append of it runs
    /// meanwhile. An error (the flush failed) leaves it pending: the
    /// caller's operation must fail before committing anything.
    pub(crate) fn settle_tail(&self, ino: u64) -> Result<()> {
        let Some(d) = self.deferred() else {
            return Ok(());
        };
        if !d.pending(ino) {
            return Ok(());
        }
        self.dev_sync()?;
        d.settle(ino, |rec_off, tail| self.store_tail_persisted(rec_off, tail));
        debug_assert!(!d.pending(ino));
        Ok(())
    }

    /// One round: every append deferred before this call is committed and
    /// durable when it returns Ok (one device flush for all of them). An
    /// error (the flush failed) stores nothing: those appends stay
    /// pending, and the next round or settle tries again.
    pub fn commit_deferred(&self) -> Result<()> {
        let Some(d) = self.deferred() else {
            return Ok(());
        };
        let mut noted = Vec::new();
        d.note_all(&mut noted);
        // Every device write of the noted appends completed before they
        // were noted (under the inode's lock): this flush covers them.
        self.dev_sync()?;
        d.rounds.fetch_add(1, Ordering::Relaxed);
        d.commit_noted(&noted, |rec_off, tail| {
            self.store_tail_persisted(rec_off, tail)
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_stores_what_it_noted_unless_settled_meanwhile() {
        let d = DeferredTails::default();
        d.note(5, 500, 10);
        d.note(6, 600, 20);
        let mut noted = Vec::new();
        d.note_all(&mut noted);
        // Meanwhile: 5 is appended to again, 6 is settled and deferred
        // anew (a new generation: its log may have been rewritten).
        d.note(5, 500, 11);
        assert!(d.settle(6, |r, t| assert_eq!((r, t), (600, 20))));
        d.note(6, 600, 30);
        let mut stored = Vec::new();
        d.commit_noted(&noted, |r, t| stored.push((r, t)));
        assert_eq!(stored, vec![(500, 10)]);
        // 5 stays pending at its newer tail, 6 at its new one.
        assert!(d.pending(5) && d.pending(6));
        let mut again = Vec::new();
        d.note_all(&mut again);
        stored.clear();
        d.commit_noted(&again, |r, t| stored.push((r, t)));
        stored.sort();
        assert_eq!(stored, vec![(500, 11), (600, 30)]);
        assert!(!d.any());
    }

    #[test]
    fn a_forgotten_inode_is_never_stored_to() {
        let d = DeferredTails::default();
        d.note(7, 700, 1);
        let mut noted = Vec::new();
        d.note_all(&mut noted);
        d.forget(7);
        d.commit_noted(&noted, |_, _| panic!("stored the tail of a freed inode"));
        assert!(!d.any() && !d.settle(7, |_, _| panic!("nothing pending")));
    }
}
