//! Inodes that clients hold open without the owner knowing
//! (docs/KERNEL-FREE.md, "Unlinked files a process holds open"), the
//! engine's side of both parties.
//!
//! A client of the kernel-free path opens a file in the pool with no
//! request to the server (the preload library's placeholder descriptors),
//! and publishes the inode number in its slot of the shared epoch table
//! (`EpochTable::hold`) before it uses it. So the owner must not free an
//! inode whose last name goes while clients are attached without looking
//! at those holds:
//!
//! - the last unlink (unlink, rmdir, rename over it) of an inode turns it
//!   ORPHAN while any client is attached, whether or not the owner has it
//!   open (in the unlink's journal transaction, as for an open file);
//! - after the commit and a full fence, the owner frees it at once (one
//!   persisted FREE store) unless it has it open or a slot holds it;
//! - a held one joins `held_orphans`, which the owner walks again
//!   ([`Fs::free_unheld_orphans`]) when a client lets a hold go or goes.
//!
//! The client's side: store the hold, full fence, then check the inode's
//! record (still linked, the generation it looked up: [`Fs::is_linked`]).
//! Either it sees the ORPHAN state and lets go, or the owner sees its hold
//! (Dekker's order, both fences SeqCst). A crash leaves ORPHAN inodes,
//! which recovery frees (FORMAT.md's orphan list); holds are shared
//! memory only.

use std::sync::atomic::{fence, Ordering::SeqCst};

use crate::fs::Fs;
use crate::inode::{lock, read, write};
use crate::pmem::Pmem;

impl<P: Pmem> Fs<P> {
    /// Whether clients are attached (they may hold inodes): an inode losing
    /// its last name then goes ORPHAN first.
    pub(crate) fn clients_may_hold(&self) -> bool {
        self.epoch_table().is_some_and(|t| t.claimed_count() > 0)
    }

    /// Whether a client holds `ino` now. Call after the store that made it
    /// ORPHAN (the fence here orders that store before the loads).
    pub(crate) fn client_holds(&self, ino: u64) -> bool {
        fence(SeqCst);
        // A client engine scans the table it pins in (rmlocal.rs).
        self.epoch_table()
            .or_else(|| self.client_epoch_table())
            .is_some_and(|t| t.held(ino))
    }

    /// An orphan nobody else frees (no handle of the owner's) that a client
    /// holds: look at it again when holds change.
    pub(crate) fn keep_held_orphan(&self, ino: u64) {
        let mut v = lock(&self.held_orphans);
        if !v.contains(&ino) {
            v.push(ino);
        }
    }

    /// Client-held orphans waiting to be freed.
    pub fn held_orphans(&self) -> usize {
        lock(&self.held_orphans).len()
    }

    /// Free every client-held orphan that no client holds any more and
    /// the owner has no handle on: the owner calls it when a client lets a
    /// hold go, when a client's session ends (its slot's holds cleared
    /// first), and now and then. The count freed.
    pub fn free_unheld_orphans(&self) -> usize {
        let todo: Vec<u64> = lock(&self.held_orphans).clone();
        let mut freed = 0;
        for ino in todo {
            // iget: a client's lease on it is recalled first (the
            // owner's lease table), so no lease outlives the inode.
            let done = match self.iget(ino) {
                Ok(inode) => {
                    let mut st = write(&inode.state);
                    if st.gone || !st.orphan {
                        true
                    } else if st.open_count > 0 || self.client_holds(ino) || !self.may_write() {
                        // Its last close frees it, or a client still has
                        // it, or this engine writes nothing any more (the
                        // next read-write mount's recovery frees it).
                        st.open_count > 0
                    } else {
                        self.free_inode_now(&inode, &mut st);
                        freed += 1;
                        true
                    }
                }
                // Freed and reused meanwhile, or damaged: not ours to keep.
                Err(_) => true,
            };
            if done {
                lock(&self.held_orphans).retain(|&i| i != ino);
            }
        }
        freed
    }

    /// The client's check after it stored a hold on `ino`: the inode is
    /// still linked, with generation `generation` (the one its lookup
    /// found), so the hold protects the file it opened.
    pub fn is_linked(&self, ino: u64, generation: u64) -> bool {
        // As the record says now: the owner's cached object of a slot a
        // client freed and made again under its lane is stale.
        self.iget_current(ino).is_ok_and(|inode| {
            let st = read(&inode.state);
            !st.gone && !st.orphan && st.generation == generation
        })
    }

    /// Whether orphan `ino` is in use: the owner has a handle on it, or a
    /// client holds it (a lease may then be granted on it: its writes must
    /// go on).
    pub fn orphan_in_use(&self, ino: u64) -> bool {
        let open = self
            .iget_cached(ino)
            .is_ok_and(|inode| read(&inode.state).open_count > 0);
        open || self.client_holds(ino)
    }
}
