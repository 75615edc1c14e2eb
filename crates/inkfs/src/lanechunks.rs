//! Log chunks of a leased lane's inodes that the owner frees while the
//! lane is leased (docs/KERNEL-FREE.md, "Built: client-local removals on
//! the wire", "The books of a client's chunk blocks").
//!
//! A client under a lane lease starts each new inode's log in a chunk of
//! a block it carved from its reservation. Until the lane comes back that
//! block is the client's: its chunk map (the chunks still free there are
//! its to hand out), the server's books of its reservation (the block
//! leaves them once, at the lane's take-back or reaping), and, for a
//! client that dies, the reaping's merge of the chunks the logs still
//! name. The owner may free such a chunk before then: it removes a file
//! the client made under an earlier directory lease (rule 3 sends that
//! removal to the server), frees an orphan the client adopted out at its
//! last hold, or drops the head page of such a file's log in a
//! collection. Freed into the owner's maps at once, the block would be
//! in them (its other chunks given to the owner's creates) while still
//! in the client's books and maps: a reaping's merge would then clear
//! the owner's new chunks, and a block whose every chunk the owner freed
//! would be free while the books still return it at the session's end.
//! So such a chunk is held here, per lane, and freed (into the limbo)
//! when the lane is settled, after the block's chunk bits are the
//! owner's: `take_back_lane` and `reap_lane` (lanelease.rs).
//!
//! Ownership: the held list is the owner engine's, one per lane, behind
//! a leaf lock (taken under a lane's grant lock by the take-back and the
//! reaping, and alone by the frees). It is armed with the grant's slots
//! at `lease_lane` and `lease_more_slots`, and disarmed (emptied) by the
//! settle that ends the lease. Not on the read or write path: only frees
//! of log chunks look at it.

use std::collections::BTreeSet;
use std::sync::Mutex;

use crate::format::{ino_to_lane_slot, log_page_id};
use crate::fs::Fs;
use crate::inode::lock;
use crate::pmem::Pmem;

/// One lane's chunks held while it is leased.
#[derive(Default)]
pub(crate) struct HeldChunks {
    inner: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    /// The slots handed out with the lease (empty: not leased).
    slots: BTreeSet<u64>,
    /// Chunk ids the owner freed of inodes in those slots.
    chunks: Vec<u64>,
}

impl HeldChunks {
    /// Arm for `slots` handed out (at the grant, and for more slots).
    pub(crate) fn arm(&self, slots: &[u64]) {
        lock(&self.inner).slots.extend(slots.iter().copied());
    }

    /// Disarm at the lease's end: the chunks held, for the caller to free.
    pub(crate) fn disarm(&self) -> Vec<u64> {
        let mut h = lock(&self.inner);
        h.slots.clear();
        std::mem::take(&mut h.chunks)
    }

    /// The chunks held so far (the reaping's merge keeps them in use
    /// until they are freed after it).
    pub(crate) fn peek(&self) -> Vec<u64> {
        lock(&self.inner).chunks.clone()
    }

    fn hold(&self, slot: u64, id: u64) -> bool {
        let mut h = lock(&self.inner);
        if !h.slots.contains(&slot) {
            return false;
        }
        debug_assert!(!h.chunks.contains(&id), "chunk {id:#x} held twice");
        h.chunks.push(id);
        true
    }
}

impl<P: Pmem> Fs<P> {
    /// A log page of inode `ino` the owner frees: true if it is a chunk
    /// of an inode in a slot handed out with a lane still leased (held
    /// until the lane's settle, see the module comment). Whole pages, a
    /// client engine's frees, and inodes of slots not handed out: false.
    pub(crate) fn hold_leased_chunk(&self, ino: u64, id: u64) -> bool {
        if self.is_client() || !matches!(log_page_id(id), Some((_, Some(_)))) {
            return false;
        }
        let (lane, slot) = ino_to_lane_slot(ino, self.geo.lane_count);
        self.lane_owners.is_leased(lane)
            && self
                .lane_owners
                .held_chunks(lane)
                .is_some_and(|h| h.hold(slot, id))
    }
}
