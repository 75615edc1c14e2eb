//! Lane leases (docs/KERNEL-FREE.md, "Stage 5: creates and removals in a
//! leased directory", option A; "Built: the engine's namespace under a
//! lane lease"): the owner hands one of its lanes (the lane's journal, a
//! batch of its free inode slots, its inode table chain's end) to a client
//! engine, which then runs the engine's own `make_node` on that lane in a
//! directory whose lease it holds.
//!
//! **Who owns what while lane K is leased.**
//!
//! | state | owner | back to the owner |
//! | --- | --- | --- |
//! | K's journal block | the client (its engine's `journals[K]`) | `take_back_lane`, or `reap_lane` (replayed or discarded, cleared durably) |
//! | the slots handed out ([`LaneGrant::slots`]) | the client | unused ones at `take_back_lane`; at `reap_lane` each is read: LIVE stays in use, FREE is freed |
//! | K's other free slots, and slots of K the owner frees meanwhile | the owner (not handed out: its threads skip K) | – |
//! | K's inode table chain past [`LaneGrant::table_end`] | the client (grown from its reservation) | walked from the end the owner knew |
//! | K's block region | the owner (the client allocates from its reservation only) | – |
//! | the directory D whose lease the client holds: its tail and log | the client | the owner catches D up ([`Fs::settle_dir`]) |
//!
//! **The owner's threads and a leased lane.** A thread picks its lane
//! (`Fs::lane`) among those not leased. An operation that takes a slot of
//! its lane and may grow the lane's table (`make_node`) holds a
//! [`LaneUse`] for it: a count of users the lease waits to drain after it
//! marks the lane leased (Dekker's order: the user counts itself, then
//! reads the mark; the lease marks, then reads the count). A journal
//! commit checks the mark again under the journal's mutex, which the lease
//! takes after marking: a commit that got the mutex first ends before the
//! lease proceeds, one that gets it later sees the mark and picks another
//! lane. One lane always stays the owner's.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

use crate::blockset::RangeSet;
use crate::error::{errno, Error, Result};
use crate::format::*;
use crate::fs::Fs;
use crate::inode::{lock, read, write, Body, Inode};
use crate::journal::{self, Journal, JournalState};
use crate::log;
use crate::pmem::{read_pod, Pmem};
use crate::types::FileKind;

/// Slots at most in one grant (docs/KERNEL-FREE.md: the client asks for
/// more when it runs low).
pub const LANE_SLOTS_MAX: usize = 256;
/// Slots one lease of a lane hands out at most, more slots included (a
/// bound on what a take-back or a reaping reads).
pub const LANE_SLOTS_GRANTED_MAX: usize = 64 * LANE_SLOTS_MAX;

/// The owner's state of one lane, one cache line each (the mark is read
/// by every `Fs::lane`).
#[repr(align(128))]
#[derive(Default)]
pub(crate) struct LaneOwner {
    /// Leased to a client: the owner's threads do not use it.
    leased: AtomicBool,
    /// Owner's operations holding a [`LaneUse`] of this lane.
    users: AtomicU32,
    /// What was handed out with the lease (None: the owner's).
    grant: Mutex<Option<LaneGrant>>,
    /// Chunks of the handed-out slots' inodes the owner freed while the
    /// lane is leased (lanechunks.rs).
    held: crate::lanechunks::HeldChunks,
}

/// Every lane's owner state, and the lock that orders grants and
/// take-backs (not on any read or write path).
pub(crate) struct LaneOwners {
    lanes: Box<[LaneOwner]>,
    admin: Mutex<()>,
}

impl LaneOwners {
    pub(crate) fn new(lane_count: u32) -> LaneOwners {
        LaneOwners {
            lanes: (0..lane_count.max(1)).map(|_| LaneOwner::default()).collect(),
            admin: Mutex::new(()),
        }
    }

    #[inline]
    pub(crate) fn is_leased(&self, lane: u32) -> bool {
        self.lanes
            .get(lane as usize)
            .is_some_and(|o| o.leased.load(SeqCst))
    }

    pub(crate) fn held_chunks(&self, lane: u32) -> Option<&crate::lanechunks::HeldChunks> {
        self.lanes.get(lane as usize).map(|o| &o.held)
    }

    fn leased_count(&self) -> usize {
        self.lanes.iter().filter(|o| o.leased.load(SeqCst)).count()
    }
}

/// An owner's operation on its lane's slots and table: the lane is not
/// leased away until it ends.
pub(crate) struct LaneUse<'a>(&'a LaneOwner);

impl Drop for LaneUse<'_> {
    fn drop(&mut self) {
        self.0.users.fetch_sub(1, SeqCst);
    }
}

/// What the owner hands a client with lane `lane`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaneGrant {
    pub lane: u32,
    /// Free slots of the lane, ascending (their records are FREE or not
    /// yet in the table).
    pub slots: Vec<u64>,
    /// The last block of the lane's inode table chain.
    pub table_end: u64,
}

/// What a client gives back with its lane.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LaneReturn {
    pub lane: u32,
    /// Slots of the grant it did not use.
    pub unused_slots: Vec<u64>,
    /// The chain's last block now.
    pub table_end: u64,
    /// Head chunks (log page ids) of the inodes it created and removed
    /// (rmlocal.rs): the owner frees them into its limbo once the chunk
    /// blocks are its own again.
    pub freed_chunks: Vec<u64>,
    /// Blocks it carved into log chunks that have chunks free, with the
    /// bitmap of those in use (to the owner's chunk maps).
    pub chunks: Vec<(u64, u64)>,
}

/// What the owner found taking a lane back (given back or reaped).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LaneSettled {
    /// Inodes the client created in the handed-out slots (LIVE).
    pub live: Vec<u64>,
    /// Handed-out slots that came back free.
    pub slots_freed: u64,
    /// Handed-out slots found ORPHAN, freed (or kept for a client's hold).
    pub orphans: u64,
    /// Table blocks the client added to the chain.
    pub table_blocks_added: u64,
    /// Take-back: every block the client carved into log chunks (the
    /// blocks of its partly used ones, of its removed inodes' head chunks,
    /// of the head chunks of the handed-out slots' inodes, and of the
    /// chunks the owner held for the lane): each leaves the client's
    /// books here, and only here (docs/KERNEL-FREE.md, "The books of a
    /// client's chunk blocks").
    pub chunk_blocks: Vec<u64>,
    /// Reap: older inodes the client removed and freed whose `slot INO`
    /// the owner had not heard, freed by the reap.
    pub older_freed: u64,
    /// The lane's journal, reaped: what was in it.
    pub journal: Option<JournalState>,
    /// Blocks of the reservation no committed log names, returned (reap).
    pub blocks_returned: u64,
}

/// A client engine's lane lease and directory leases.
#[derive(Default)]
pub(crate) struct ClientLane {
    held: Mutex<Option<HeldLane>>,
    /// Lane leases taken so far: numbers each [`HeldLane`], so that an
    /// answer asked under one lease is not taken into a later one of the
    /// same lane ([`Fs::client_add_slots`]).
    takes: std::sync::atomic::AtomicU64,
    /// Directories whose write lease this client holds (the directory
    /// lease: the per-inode lease with its directory flag).
    pub(crate) dirs: Mutex<Vec<crate::rmlocal::DirLease>>,
    /// Older inodes its removals freed (their records FREE): the owner
    /// frees their blocks and slots (`slot INO`, rmlocal.rs).
    pub(crate) slots_out: Mutex<Vec<u64>>,
    /// Head chunks of the inodes it created and removed, for the owner
    /// with the lane ([`LaneReturn::freed_chunks`]).
    pub(crate) chunks_freed: Mutex<Vec<u64>>,
}

impl ClientLane {
    /// Whether `ino` is in a slot of the held lane's grant (an inode this
    /// client created under this lane lease, or a slot not used yet).
    pub(crate) fn granted(&self, lane: u32, slot: u64) -> bool {
        lock(&self.held)
            .as_ref()
            .is_some_and(|h| h.lane == lane && h.granted.binary_search(&slot).is_ok())
    }

    /// A granted slot its removal freed: handed out again (false if it is
    /// not one).
    pub(crate) fn take_freed_slot(&self, lane: u32, slot: u64) -> bool {
        let mut held = lock(&self.held);
        let Some(h) = held.as_mut().filter(|h| h.lane == lane) else {
            return false;
        };
        if h.granted.binary_search(&slot).is_err() {
            return false;
        }
        h.put_back(slot);
        true
    }
}

struct HeldLane {
    lane: u32,
    /// Which of the client's lane leases this is (`ClientLane::takes`).
    taken: u64,
    /// Handed-out slots not used yet, descending (the lowest is popped).
    slots: Vec<u64>,
    /// The grant's slots, ascending.
    granted: Vec<u64>,
}

impl HeldLane {
    /// A handed-out slot free again: into `slots` at its place (kept
    /// descending). Not a push and a sort: a client's removal under the
    /// lease puts one back each time, and sorting a thousand slots was a
    /// third of a removal's time (bench/results-notes/hybask.md).
    fn put_back(&mut self, slot: u64) {
        let at = self.slots.partition_point(|&s| s > slot);
        // Descending on both sides (a slot twice would be two inodes in
        // one record).
        debug_assert!(self.slots.get(at) != Some(&slot), "slot {slot} freed twice");
        debug_assert!(at == 0 || self.slots[at - 1] > slot);
        self.slots.insert(at, slot);
    }
}

/// The block of a log chunk's id (None: a whole page, or no page).
fn chunk_block(id: u64) -> Option<u64> {
    match log_page_id(id) {
        Some((block, Some(_))) => Some(block),
        _ => None,
    }
}

/// How a handed-out slot's record was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotState {
    /// FREE, or beyond the table.
    Free,
    Live,
    Orphan,
}

impl<P: Pmem> Fs<P> {
    // -----------------------------------------------------------------
    // The owner's threads
    // -----------------------------------------------------------------

    /// A lane not leased, from `lane` on (one always is).
    #[cold]
    pub(crate) fn lane_not_leased(&self, lane: u32) -> u32 {
        let n = self.geo.lane_count;
        let found = (1..n)
            .map(|i| (lane + i) % n)
            .find(|&l| !self.lane_owners.is_leased(l));
        debug_assert!(found.is_some(), "every lane leased");
        found.unwrap_or(lane)
    }

    /// This thread's lane, held against a lease until the guard goes (an
    /// owner's operation taking a slot and perhaps growing the table).
    pub(crate) fn use_lane(&self) -> (u32, LaneUse<'_>) {
        loop {
            let lane = self.lane();
            let o = &self.lane_owners.lanes[lane as usize];
            o.users.fetch_add(1, SeqCst);
            if !o.leased.load(SeqCst) {
                return (lane, LaneUse(o));
            }
            o.users.fetch_sub(1, SeqCst);
        }
    }

    /// Lock a lane's journal that is not leased (the thread's own, or the
    /// next one if its own got leased meanwhile).
    pub(crate) fn owner_journal(&self) -> (u32, std::sync::MutexGuard<'_, Journal>) {
        loop {
            let lane = self.lane();
            let j = lock(&self.journals[lane as usize]);
            // Marked before the lease takes this mutex: seen here if the
            // lease got the mutex first.
            if !self.lane_owners.is_leased(lane) {
                return (lane, j);
            }
        }
    }

    /// Whether lane `lane` is leased to a client now.
    pub fn lane_leased(&self, lane: u32) -> bool {
        self.lane_owners.is_leased(lane)
    }

    // -----------------------------------------------------------------
    // The owner: grant, take back, reap
    // -----------------------------------------------------------------

    /// Lease lane `lane` to a client: marked leased (the owner's threads
    /// pick another), its in-flight operations waited out (their lane use,
    /// then its journal's mutex), then up to `slots_max` (at most
    /// [`LANE_SLOTS_MAX`]) of its free slots taken out of the owner's
    /// allocator and handed out with the table chain's end. EBUSY if the
    /// lane is leased already or is the last lane the owner has; EINVAL
    /// for no such lane or on a client engine.
    pub fn lease_lane(&self, lane: u32, slots_max: usize) -> Result<LaneGrant> {
        if self.is_client() {
            return errno(libc::EINVAL);
        }
        self.check_writable()?;
        let Some(o) = self.lane_owners.lanes.get(lane as usize) else {
            return errno(libc::EINVAL);
        };
        let _admin = lock(&self.lane_owners.admin);
        let mut grant = lock(&o.grant);
        if grant.is_some() || self.lane_owners.leased_count() + 1 >= self.geo.lane_count as usize {
            return errno(libc::EBUSY);
        }
        o.leased.store(true, SeqCst);
        while o.users.load(SeqCst) != 0 {
            std::thread::yield_now();
        }
        // Transactions in flight on the lane end before its journal is
        // the client's.
        let j = lock(&self.journals[lane as usize]);
        let end = match self.tables.blocks(&self.pm, lane) {
            Ok(blocks) => blocks.last().copied(),
            Err(e) => {
                o.leased.store(false, SeqCst);
                return Err(e);
            }
        };
        let Some(table_end) = end else {
            o.leased.store(false, SeqCst);
            return Err(Error::Corrupt(format!("lane {lane}: no inode table")));
        };
        let mut slots = Vec::new();
        for _ in 0..slots_max.min(LANE_SLOTS_MAX) {
            let slot = self.slots.alloc(lane);
            // A slot the allocator calls free whose record is not FREE
            // (damage: the media disagree with the scan that built the
            // allocator) stays used, for fsck to look at, and is not
            // handed out.
            if let Ok(SlotState::Free) = self.slot_state(lane, slot) {
                slots.push(slot);
            }
        }
        drop(j);
        o.held.arm(&slots);
        let g = LaneGrant {
            lane,
            slots,
            table_end,
        };
        *grant = Some(g.clone());
        Ok(g)
    }

    /// Lane `lane` comes back from a live client (`released lane K`): its
    /// journal is idle and every transaction it made is durable. Each
    /// handed-out slot is read: FREE ones return to the owner's list,
    /// LIVE ones stay in use (the client's creates); the chain is walked
    /// from the end the owner knew and must end at `ret.table_end`; the
    /// client's partly used chunk blocks join the owner's maps. EINVAL if
    /// the lane is not leased or `ret` disagrees with the grant or the
    /// media (nothing is changed then).
    pub fn take_back_lane(&self, ret: &LaneReturn) -> Result<LaneSettled> {
        let lane = ret.lane;
        let Some(o) = self.lane_owners.lanes.get(lane as usize) else {
            return errno(libc::EINVAL);
        };
        let _admin = lock(&self.lane_owners.admin);
        let mut guard = lock(&o.grant);
        let Some(grant) = guard.as_ref() else {
            return errno(libc::EINVAL);
        };
        debug_assert!(o.leased.load(SeqCst));
        if ret.unused_slots.iter().any(|s| !grant.slots.contains(s)) {
            return errno(libc::EINVAL);
        }
        let added = self.walk_lane_chain(lane, grant.table_end, false)?;
        let end = added.last().copied().unwrap_or(grant.table_end);
        if end != ret.table_end {
            return errno(libc::EINVAL);
        }
        let states = self.slot_states(grant)?;
        let claims_used = states
            .iter()
            .any(|&(slot, st)| st != SlotState::Free && ret.unused_slots.contains(&slot));
        let bad_chunk = ret.chunks.iter().any(|&(b, m)| {
            !self.geo.is_data_range(b, 1) || m == 0 || m >= LOG_CHUNKS_FULL || self.blocks.is_free(b)
        });
        let bad_freed = ret.freed_chunks.iter().any(|&id| {
            !matches!(log_page_id(id), Some((b, Some(_))) if self.geo.is_data_range(b, 1))
        });
        if claims_used || bad_chunk || bad_freed {
            return errno(libc::EINVAL);
        }
        // Every block the client carved into chunks: a block with a chunk
        // free is in `chunks`; a full one has a chunk named by a
        // handed-out slot's inode, or freed by the client (`freed_chunks`)
        // or by the owner (held, below). Read before `settle_slots` frees
        // the orphans.
        let mut carved: BTreeSet<u64> = ret.chunks.iter().map(|&(b, _)| b).collect();
        carved.extend(ret.freed_chunks.iter().filter_map(|&id| chunk_block(id)));
        for &(slot, st) in &states {
            if st != SlotState::Free {
                let ino = lane_slot_to_ino(lane, slot, self.geo.lane_count);
                carved.extend(self.log_chunk_block(ino)?);
            }
        }
        for &(b, m) in &ret.chunks {
            // Merged: head chunks of the client's removed inodes may have
            // reached the owner's maps through its limbo already.
            self.blocks
                .merge_chunk_block(b, m)
                .map_err(|_| Error::Errno(libc::EINVAL))?;
        }
        let mut settled = self.settle_slots(lane, &states);
        // After the maps have the client's chunk blocks: each chunk by its
        // id, into the limbo (readers may still read the removed inode);
        // the owner's held ones too (its orphans freed just now included).
        let held = o.held.disarm();
        carved.extend(held.iter().filter_map(|&id| chunk_block(id)));
        for &id in ret.freed_chunks.iter().chain(&held) {
            self.free_blocks(id, 1);
        }
        settled.table_blocks_added = added.len() as u64;
        settled.chunk_blocks = carved.into_iter().collect();
        self.end_lane_lease(o, &mut guard);
        Ok(settled)
    }

    /// More free slots of leased lane `lane` for its client (`slots K`,
    /// asked when it has none left): up to `slots_max` (at most
    /// [`LANE_SLOTS_MAX`]), taken out of the owner's allocator as at the
    /// grant and added to it, so that a take-back or a reaping reads them
    /// too. None once the grant holds [`LANE_SLOTS_GRANTED_MAX`] (the
    /// client's creates then go to the owner). EINVAL if `lane` is not
    /// leased.
    pub fn lease_more_slots(&self, lane: u32, slots_max: usize) -> Result<Vec<u64>> {
        let Some(o) = self.lane_owners.lanes.get(lane as usize) else {
            return errno(libc::EINVAL);
        };
        let _admin = lock(&self.lane_owners.admin);
        let mut guard = lock(&o.grant);
        let Some(grant) = guard.as_mut() else {
            return errno(libc::EINVAL);
        };
        let room = LANE_SLOTS_GRANTED_MAX.saturating_sub(grant.slots.len());
        let mut got = Vec::new();
        for _ in 0..slots_max.min(LANE_SLOTS_MAX).min(room) {
            let slot = self.slots.alloc(lane);
            // As at the grant: a slot whose record is not FREE stays used.
            if let Ok(SlotState::Free) = self.slot_state(lane, slot) {
                got.push(slot);
            }
        }
        grant.slots.extend_from_slice(&got);
        o.held.arm(&got);
        Ok(got)
    }

    /// Lane `lane` back from a dead client (docs/KERNEL-FREE.md, "What
    /// each crash leaves (stage 5)", the reaping's steps 2 and 4-6), with
    /// `dirs` the directories it held leases of and `reservation` the
    /// blocks reserved for it that no file lease's settle found named
    /// (the rest of its reservation). In this order:
    ///
    /// 1. the chain is walked from the end the owner knew and each block
    ///    the client added, and the link to it, written back (a client
    ///    killed between its link store and that line's write-back leaves
    ///    the link visible, not durable), fence: the journal's records
    ///    may target records in those blocks;
    /// 2. the lane's journal block is written back as the client left it,
    ///    fence, then replayed (a committed transaction) or discarded with
    ///    the mount's own recovery code: a client killed after its commit
    ///    word's store, before that line's write-back, leaves a commit
    ///    only visible, and the replay's stores could otherwise persist
    ///    without it (found by the kill variant of the crash simulator:
    ///    a name whose inode is FREE); one killed after the clearing
    ///    store leaves a cleared word that a power cut could undo, and
    ///    replay the old transaction over what the owner changes next;
    /// 3. `dirs` and the handed-out slots' records written back, fence;
    ///    each directory caught up;
    /// 4. each handed-out slot read: LIVE stays in use (its log and data
    ///    are named), FREE returns to the owner's list, ORPHAN is freed
    ///    (or kept for a client's hold);
    /// 5. the reservation minus what those logs, the directories' logs and
    ///    the new table blocks name is returned (into the limbo: readers
    ///    may hold blocks the client displaced), and the chunk blocks with
    ///    chunks free join the owner's maps.
    ///
    /// An error (a damaged chain, a record or log that does not load)
    /// leaves the lane leased: the pool then wants fsck.
    pub fn reap_lane(&self, lane: u32, dirs: &[u64], reservation: &[(u64, u64)]) -> Result<LaneSettled> {
        let Some(o) = self.lane_owners.lanes.get(lane as usize) else {
            return errno(libc::EINVAL);
        };
        let _admin = lock(&self.lane_owners.admin);
        let mut guard = lock(&o.grant);
        let Some(grant) = guard.clone() else {
            return errno(libc::EINVAL);
        };
        // 1. The chain.
        let added = self.walk_lane_chain(lane, grant.table_end, true)?;
        self.pm.fence();
        // 2. The journal: durable as the client left it, then replayed.
        journal::persist_block(&self.pm, lane);
        let state = journal::recover(&self.pm, &self.geo, lane, false, |off| {
            self.tables.is_record_field(&self.pm, off).unwrap_or(false)
        })?;
        // 3. What the client stored in the records it may have written.
        let mut dir_inodes = Vec::new();
        for &d in dirs {
            let inode = self.iget_cached(d)?;
            self.pm.flush(inode.rec_off, INODE_RECORD_SIZE);
            let log = read(&inode.state).log;
            dir_inodes.push((inode, log.head, log.tail));
        }
        for &slot in &grant.slots {
            let ino = lane_slot_to_ino(lane, slot, self.geo.lane_count);
            if let Some(off) = self.tables.record_offset(&self.pm, ino)? {
                self.pm.flush(off, INODE_RECORD_SIZE);
            }
        }
        self.pm.fence();
        let mut victims = Vec::new();
        for (inode, head, tail) in &dir_inodes {
            match self.catch_up_now(inode) {
                Ok(()) => victims.extend(self.removed_between(inode, *head, *tail)?),
                Err(e) if e.errno() == libc::ENOENT => {}
                Err(e) => return Err(e),
            }
        }
        // 4. The slots handed out; what they and the directories name.
        let states = self.slot_states(&grant)?;
        let mut named = RangeSet::new();
        let mut chunks: std::collections::BTreeMap<u64, u64> = Default::default();
        let mut name = |id: u64, len: u64| match log_page_id(id) {
            Some((block, Some(chunk))) => *chunks.entry(block).or_default() |= 1 << chunk,
            _ => named.insert(id, len),
        };
        for &b in &added {
            name(b, 1);
        }
        for &(slot, st) in &states {
            if st != SlotState::Free {
                let ino = lane_slot_to_ino(lane, slot, self.geo.lane_count);
                // Current, not as cached: the client may have freed and
                // reused the slot since the owner last loaded it (a stale
                // head walks a chain that is not this inode's).
                for (s, l) in self.inode_blocks(&self.iget_current(ino)?)? {
                    name(s, l);
                }
            }
        }
        for (inode, _, _) in &dir_inodes {
            for (s, l) in self.inode_blocks(inode)? {
                name(s, l);
            }
        }
        // The chunks the owner held for the lane stay in use through the
        // merge below: freed after it, into the limbo.
        for id in o.held.peek() {
            name(id, 1);
        }
        // The older inodes the client removed (not in handed-out slots):
        // freed, or kept for a hold. The blocks it wrote to them under
        // their file leases came from its reservation: not its rest.
        let older: Vec<u64> = victims
            .into_iter()
            .filter(|&ino| {
                let (l, slot) = ino_to_lane_slot(ino, self.geo.lane_count);
                l != lane || !grant.slots.contains(&slot)
            })
            .collect();
        let (orphans, freed, older_named) = self.settle_older_victims(&older);
        // 5. The reservation's rest.
        let mut rest = RangeSet::from_ranges(reservation);
        let named_ranges = named.ranges();
        for &(s, l) in named_ranges.iter().chain(&older_named) {
            rest.remove(s, l);
        }
        for (&block, &mask) in &chunks {
            if !rest.intersect(block, 1).is_empty() {
                rest.remove(block, 1);
                // Used for the block lists from now on; its free chunks
                // are the owner's to hand out (merged: a removed inode's
                // head chunk may have reached the maps already).
                let _ = self.blocks.merge_chunk_block(block, mask);
            }
        }
        let mut settled = self.settle_slots(lane, &states);
        for id in o.held.disarm() {
            self.free_blocks(id, 1);
        }
        settled.orphans += orphans;
        settled.older_freed = freed;
        settled.table_blocks_added = added.len() as u64;
        settled.journal = Some(state);
        settled.blocks_returned = rest.blocks();
        self.return_blocks(&rest.ranges());
        self.end_lane_lease(o, &mut guard);
        Ok(settled)
    }

    /// Directory `dir` comes back from a client that held its lease: the
    /// owner's DRAM view caught up from its cached tail, the record's tail
    /// line written back, fence (as `lease_refs` does for a file: a holder
    /// killed between its tail store and the write-back leaves a tail
    /// visible and not durable, which nothing may be built on). A
    /// directory removed meanwhile: Ok, nothing to settle.
    pub fn settle_dir(&self, dir: u64) -> Result<()> {
        self.settle_dir_made(dir).map(drop)
    }

    /// [`Fs::settle_dir`], and the inodes the holder linked into `dir`
    /// meanwhile and still has there (its DIR_ADD entries past the
    /// owner's cached tail that no later DIR_REMOVE undid, each once):
    /// the files it made under the lease, whose blocks its reservation
    /// paid for and which the lease's end hands to the owner
    /// (docs/KERNEL-FREE.md, "Built: the books with the ask on"). Nothing
    /// for a directory removed meanwhile.
    pub fn settle_dir_made(&self, dir: u64) -> Result<Vec<u64>> {
        let inode = self.iget_cached(dir)?;
        if inode.kind != FileKind::Dir {
            return errno(libc::ENOTDIR);
        }
        let (head, from) = {
            let st = read(&inode.state);
            (st.log.head, st.log.tail)
        };
        match self.catch_up_now(&inode) {
            Err(e) if e.errno() == libc::ENOENT && inode.is_gone() => return Ok(Vec::new()),
            r => r?,
        }
        self.pm.flush(inode.rec_off + INODE_TAIL_FIELD, 8);
        self.pm.fence();
        self.added_between(&inode, head, from)
    }

    /// Walk `lane`'s chain from `known_end` on: the blocks after it, each
    /// one's trailer and the link to it written back when `flush`.
    fn walk_lane_chain(&self, lane: u32, known_end: u64, flush: bool) -> Result<Vec<u64>> {
        let blocks = self.tables.blocks(&self.pm, lane)?;
        let Some(at) = blocks.iter().position(|&b| b == known_end) else {
            return Err(Error::Corrupt(format!(
                "lane {lane}: table block {known_end} left the chain"
            )));
        };
        if flush {
            for &b in &blocks[at..] {
                self.pm.flush(b * BLOCK_SIZE + TABLE_TRAILER_OFFSET, 128);
            }
        }
        Ok(blocks[at + 1..].to_vec())
    }

    fn slot_state(&self, lane: u32, slot: u64) -> Result<SlotState> {
        let ino = lane_slot_to_ino(lane, slot, self.geo.lane_count);
        // An object the owner cached before the client freed (and perhaps
        // reused) the slot is stale: caught up, or gone, before anyone
        // reads the slot's inode through it (a client's removal of an
        // older file of this lane).
        if let Some(cached) = self.cache.get(ino) {
            match self.catch_up_now(&cached) {
                Err(e) if e.errno() != libc::ENOENT => return Err(e),
                _ => {}
            }
        }
        let Some(off) = self.tables.record_offset(&self.pm, ino)? else {
            return Ok(SlotState::Free);
        };
        let rec: InodeRecord = read_pod(&self.pm, off);
        Ok(match rec.state {
            INODE_FREE => SlotState::Free,
            INODE_ORPHAN => SlotState::Orphan,
            _ => SlotState::Live,
        })
    }

    fn slot_states(&self, grant: &LaneGrant) -> Result<Vec<(u64, SlotState)>> {
        grant
            .slots
            .iter()
            .map(|&s| Ok((s, self.slot_state(grant.lane, s)?)))
            .collect()
    }

    /// Free slots go back to the owner's list, orphans are freed.
    fn settle_slots(&self, lane: u32, states: &[(u64, SlotState)]) -> LaneSettled {
        let mut out = LaneSettled::default();
        for &(slot, st) in states {
            let ino = lane_slot_to_ino(lane, slot, self.geo.lane_count);
            match st {
                SlotState::Free => {
                    // An inode the owner cached under this number is
                    // stale (a client's removal freed it) or gone; a slot
                    // the owner freed itself meanwhile (a held orphan it
                    // adopted) is free already.
                    let forgot = self.forget_freed_inode(ino);
                    debug_assert!(forgot, "the owner has freed inode {ino} open");
                    if self.slots.is_used(lane, slot) {
                        let _ = self.slots.free(lane, slot);
                        out.slots_freed += 1;
                    }
                }
                SlotState::Live => out.live.push(ino),
                SlotState::Orphan => {
                    out.orphans += 1;
                    // Current (see step 4): freeing a stale object would
                    // free another life's blocks.
                    if let Ok(inode) = self.iget_current(ino) {
                        let mut st = write(&inode.state);
                        if !st.gone && st.open_count == 0 {
                            if self.client_holds(ino) {
                                self.keep_held_orphan(ino);
                            } else {
                                self.free_inode_now(&inode, &mut st);
                            }
                        }
                    }
                }
            }
        }
        out
    }

    /// Older inodes (not in handed-out slots) a dead client removed: one
    /// it left ORPHAN (held, or killed before its hold check) is freed or
    /// kept for a hold; one it freed whose `slot INO` the owner did not
    /// hear yet (its slot still used here) is freed as that message frees
    /// it (`Fs::free_client_victim`). The counts (orphans, freed), and the
    /// blocks each names (a log chunk as its whole block): those the
    /// client wrote under the victim's file lease came from its
    /// reservation, and must not be returned with its rest.
    fn settle_older_victims(&self, victims: &[u64]) -> (u64, u64, Vec<(u64, u64)>) {
        let (mut orphans, mut freed, mut named) = (0, 0, Vec::new());
        for &ino in victims {
            if let Ok(blocks) = self.free_victim_record(ino) {
                freed += 1;
                named.extend(blocks);
                continue;
            }
            let Ok(inode) = self.iget_current(ino) else { continue };
            if let Ok(blocks) = self.inode_blocks(&inode) {
                // Whole blocks only: a chunk block is settled as one.
                named.extend(
                    blocks
                        .into_iter()
                        .filter(|&(id, _)| matches!(log_page_id(id), Some((_, None)))),
                );
            }
            let mut st = write(&inode.state);
            if st.gone || !st.orphan || st.open_count > 0 {
                continue;
            }
            orphans += 1;
            if self.client_holds(ino) {
                self.keep_held_orphan(ino);
            } else {
                self.free_inode_now(&inode, &mut st);
            }
        }
        (orphans, freed, named)
    }

    /// Inode `ino` as its record says now, whether or not the pool is
    /// shared: the owner's cached object caught up, or loaded again if it
    /// was stale (a client under a lane lease freed the inode and perhaps
    /// made another in its slot: the owner hears of neither, and its
    /// `iget` does not catch up). ENOENT for a slot free now.
    pub(crate) fn iget_current(&self, ino: u64) -> Result<Arc<Inode>> {
        // A stale cached object is dropped from the cache by `iget` (which
        // loads again only on a shared pool) or by the catch-up: either
        // way, load what the slot holds today (ENOENT if it is free).
        let reload = || {
            let fresh = self.iget_cached(ino)?;
            self.catch_up_now(&fresh)?;
            Ok(fresh)
        };
        let inode = match self.iget(ino) {
            Ok(inode) => inode,
            Err(e) if e.errno() == libc::ENOENT => return reload(),
            Err(e) => return Err(e),
        };
        match self.catch_up_now(&inode) {
            Ok(()) => Ok(inode),
            Err(e) if e.errno() == libc::ENOENT && inode.is_gone() => reload(),
            Err(e) => Err(e),
        }
    }

    /// Whether slot `slot` of `lane` is handed out to a client now.
    pub(crate) fn slot_handed_out(&self, lane: u32, slot: u64) -> bool {
        self.lane_owners
            .lanes
            .get(lane as usize)
            .is_some_and(|o| lock(&o.grant).as_ref().is_some_and(|g| g.slots.contains(&slot)))
    }

    /// The blocks and log pages (chunk ids as they are) an inode names.
    pub(crate) fn inode_blocks(&self, inode: &Arc<Inode>) -> Result<Vec<(u64, u64)>> {
        let st = read(&inode.state);
        if st.gone {
            return Ok(Vec::new());
        }
        let mut out: Vec<(u64, u64)> = log::chain_pages(&self.pm, &self.geo, st.log.head, st.log.pages)?
            .into_iter()
            .map(|p| (p, 1))
            .collect();
        match &st.body {
            Body::File(map) => out.extend(map.iter().map(|e| (e.block, e.pages))),
            Body::Symlink { block, .. } if *block != 0 => out.push((*block, 1)),
            _ => {}
        }
        Ok(out)
    }

    fn end_lane_lease(&self, o: &LaneOwner, grant: &mut Option<LaneGrant>) {
        let Some(g) = grant.take() else { return };
        // The client committed with its own sequence numbers.
        *lock(&self.journals[g.lane as usize]) = Journal::open(&self.pm, g.lane);
        o.leased.store(false, SeqCst);
    }

    // -----------------------------------------------------------------
    // The client
    // -----------------------------------------------------------------

    /// A client engine takes lane `grant.lane` (see the module comment):
    /// its journal is re-read, its chain must end where the grant says.
    /// EINVAL on an engine that is not a client's or holds a lane already.
    pub fn client_take_lane(&self, grant: &LaneGrant) -> Result<()> {
        let Some(side) = &self.client else {
            return errno(libc::EINVAL);
        };
        if grant.lane >= self.geo.lane_count {
            return errno(libc::EINVAL);
        }
        let mut held = lock(&side.lane.held);
        if held.is_some() {
            return errno(libc::EINVAL);
        }
        let end = self.tables.blocks(&self.pm, grant.lane)?.last().copied();
        if end != Some(grant.table_end) {
            return Err(Error::Corrupt(format!(
                "lane {}: the chain ends at {end:?}, the grant says {}",
                grant.lane, grant.table_end
            )));
        }
        *lock(&self.journals[grant.lane as usize]) = Journal::open(&self.pm, grant.lane);
        let mut slots = grant.slots.clone();
        slots.sort_unstable_by(|a, b| b.cmp(a));
        let mut granted = grant.slots.clone();
        granted.sort_unstable();
        let taken = side.lane.takes.fetch_add(1, SeqCst) + 1;
        *held = Some(HeldLane {
            lane: grant.lane,
            taken,
            slots,
            granted,
        });
        Ok(())
    }

    /// A client engine gives its lane back: the slots it did not use, the
    /// chain's end, its partly used chunk blocks. EBUSY while it holds a
    /// directory lease (the lane goes with the last one); EINVAL without a
    /// lane.
    pub fn client_give_back_lane(&self) -> Result<LaneReturn> {
        let Some(side) = &self.client else {
            return errno(libc::EINVAL);
        };
        if !lock(&side.lane.dirs).is_empty() {
            return errno(libc::EBUSY);
        }
        let mut held = lock(&side.lane.held);
        let Some(h) = held.as_ref() else {
            return errno(libc::EINVAL);
        };
        // No create is between its slot and its commit: each holds its
        // directory's lock and a directory lease, and none is left.
        let lane = h.lane;
        let table_end = self
            .tables
            .blocks(&self.pm, lane)?
            .last()
            .copied()
            .ok_or_else(|| Error::Corrupt(format!("lane {lane}: no inode table")))?;
        let mut unused = held.take().map(|h| h.slots).unwrap_or_default();
        unused.sort_unstable();
        Ok(LaneReturn {
            lane,
            unused_slots: unused,
            table_end,
            freed_chunks: std::mem::take(&mut *lock(&side.lane.chunks_freed)),
            chunks: self.blocks.take_chunk_blocks(),
        })
    }

    /// More slots of the lane this client engine holds (`slots K`'s
    /// answer to a request sent while it held lease `taken` of the lane,
    /// [`Fs::client_lane_lease`]). EINVAL if it holds another lane, none,
    /// or a later lease of the same lane: the lane may have gone back
    /// while the request was in flight, its unused slots (these among
    /// them, FREE) returned to the owner's list, and a new grant of it
    /// handed some of them out again, so two creates would be given one
    /// slot (the second found it in use: EIO). Slots refused here are
    /// FREE in the owner's books of that grant, which its take-back
    /// returns to its list as any unused slot.
    pub fn client_add_slots(&self, lane: u32, taken: u64, slots: &[u64]) -> Result<()> {
        let Some(side) = &self.client else {
            return errno(libc::EINVAL);
        };
        let mut held = lock(&side.lane.held);
        match held.as_mut() {
            Some(h) if h.lane == lane && h.taken == taken => {
                h.slots.extend_from_slice(slots);
                h.slots.sort_unstable_by(|a, b| b.cmp(a));
                // Part of the grant as the first slots are: an inode made
                // in one is the client's to free as the reservation's
                // (`ClientLane::granted`, rmlocal.rs), as the owner's
                // grant, which `lease_more_slots` extended, says.
                h.granted.extend_from_slice(slots);
                h.granted.sort_unstable();
                Ok(())
            }
            _ => errno(libc::EINVAL),
        }
    }

    /// The lane this client engine holds and which of its lane leases
    /// that is (for [`Fs::client_add_slots`]).
    pub fn client_lane_lease(&self) -> Option<(u32, u64)> {
        let side = self.client.as_ref()?;
        lock(&side.lane.held).as_ref().map(|h| (h.lane, h.taken))
    }

    /// The lane this client engine holds.
    pub fn client_lane(&self) -> Option<u32> {
        let side = self.client.as_ref()?;
        lock(&side.lane.held).as_ref().map(|h| h.lane)
    }

    /// Handed-out slots this client has not used yet.
    pub fn client_lane_slots(&self) -> usize {
        self.client
            .as_ref()
            .map_or(0, |c| lock(&c.lane.held).as_ref().map_or(0, |h| h.slots.len()))
    }

    /// A client engine now holds directory `dir`'s lease (granted by the
    /// owner): its creates in `dir` run here, and its removals of what it
    /// creates meanwhile (the kernel's list unknown: "many", see
    /// [`Fs::client_lease_dir_with`]). The directory is caught up with its
    /// record first.
    pub fn client_lease_dir(&self, dir: u64) -> Result<()> {
        self.client_lease_dir_with(dir, crate::rmlocal::KernelHeld::Many)
    }

    /// [`Fs::client_lease_dir`] with what the grant said the kernel holds
    /// in `dir` (rule 4 of a removal, rmlocal.rs).
    pub fn client_lease_dir_with(&self, dir: u64, kernel: crate::rmlocal::KernelHeld) -> Result<()> {
        let Some(side) = &self.client else {
            return errno(libc::EINVAL);
        };
        let inode = self.iget(dir)?;
        if inode.kind != FileKind::Dir {
            return errno(libc::ENOTDIR);
        }
        self.catch_up_now(&inode)?;
        let mut dirs = lock(&side.lane.dirs);
        dirs.retain(|l| l.ino != dir);
        dirs.push(crate::rmlocal::DirLease::new(dir, kernel));
        Ok(())
    }

    /// Whether this client engine holds directory `dir`'s lease (taken by
    /// [`Fs::client_lease_dir`], not given back since): the client may
    /// then change `dir`'s own attributes in its log (api/client/attr.rs).
    pub fn client_holds_dir_lease(&self, dir: u64) -> bool {
        self.client
            .as_ref()
            .is_some_and(|side| lock(&side.lane.dirs).iter().any(|l| l.ino == dir))
    }

    /// A client engine gives directory `dir`'s lease back: under the
    /// directory's lock, so a create in flight in it ends first.
    pub fn client_give_back_dir(&self, dir: u64) {
        let Some(side) = &self.client else { return };
        let inode = self.cache.get(dir);
        let _st = inode.as_ref().map(|i| write(&i.state));
        lock(&side.lane.dirs).retain(|l| l.ino != dir);
        self.client_leases_changed();
    }

    /// For `make_node` in a client engine: may it create a `kind` in
    /// `dir` (called under `dir`'s lock)? EROFS without the directory's
    /// lease or a lane, and for anything but a regular file or a
    /// directory (the server makes those; a directory: "Built: mkdir
    /// under a directory lease" in docs/KERNEL-FREE.md).
    pub(crate) fn client_may_create(&self, dir: u64, kind: FileKind) -> Result<()> {
        let Some(side) = &self.client else {
            return Ok(());
        };
        let kind_ok = matches!(kind, FileKind::File | FileKind::Dir);
        if !kind_ok || !lock(&side.lane.dirs).iter().any(|l| l.ino == dir) {
            return errno(libc::EROFS);
        }
        if lock(&side.lane.held).is_none() {
            return errno(libc::EROFS);
        }
        Ok(())
    }

    /// A slot for a new inode: the client's from its lane's handed-out
    /// ones (EAGAIN when none is left: the create goes to the server, or
    /// the client asks for more), the owner's from its own lane.
    pub(crate) fn new_slot(&self) -> Result<(u32, u64, Option<LaneUse<'_>>)> {
        if let Some(side) = &self.client {
            let mut held = lock(&side.lane.held);
            let Some(h) = held.as_mut() else {
                return errno(libc::EROFS);
            };
            let Some(slot) = h.slots.pop() else {
                return errno(libc::EAGAIN);
            };
            return Ok((h.lane, slot, None));
        }
        let (lane, used) = self.use_lane();
        let slot = self.slots.alloc(lane);
        Ok((lane, slot, Some(used)))
    }

    /// A slot from [`Fs::new_slot`] that was not used.
    pub(crate) fn free_new_slot(&self, lane: u32, slot: u64) {
        if let Some(side) = &self.client {
            if let Some(h) = lock(&side.lane.held).as_mut() {
                debug_assert_eq!(h.lane, lane);
                h.put_back(slot);
            }
            return;
        }
        let _ = self.slots.free(lane, slot);
    }

    /// The journal a create commits through: the client's leased lane's,
    /// the owner's own.
    pub(crate) fn commit_journal_of_slot(&self, lane: u32, records: &[JournalRecord]) {
        if self.is_client() {
            debug_assert_eq!(self.client_lane(), Some(lane));
            let mut j = lock(&self.journals[lane as usize]);
            j.commit(&self.pm, records);
            return;
        }
        self.commit_journal(records);
    }
}

#[cfg(test)]
mod tests {
    use super::HeldLane;

    /// Slots put back land at their place: `new_slot` pops the lowest
    /// free one, whatever order they came back in.
    #[test]
    fn slots_put_back_stay_descending() {
        let mut h = HeldLane {
            lane: 1,
            taken: 1,
            slots: vec![90, 50, 10],
            granted: Vec::new(),
        };
        for s in [70, 5, 95, 30] {
            h.put_back(s);
        }
        assert_eq!(h.slots, vec![95, 90, 70, 50, 30, 10, 5]);
        assert_eq!(h.slots.pop(), Some(5));
    }
}
