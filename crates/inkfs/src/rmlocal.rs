//! A client's removals in a directory it holds the lease of
//! (docs/KERNEL-FREE.md, "Stage 5", "Removals"; "Built: a client's
//! removals in the engine"): the engine's side of both parties.
//!
//! **The client** (`Fs::client_unlink`) removes a name itself only when
//! the rules hold, checked under the locks of D and the victim: D's lease
//! and a lane (rule 1), a regular file with one link (2), the victim's
//! write lease (3, the caller's answer), the kernel holding no reference
//! to it (4: the list the grant carried, or "many", unless the client
//! created it under this lease), and no other process holding it open (5,
//! after the commit). A rule that fails is a [`NotLocal`] reason, never an
//! errno: the caller sends the request to the server. What the owner
//! would answer (ENOENT, EACCES, EPERM of the sticky bit, EISDIR) the
//! client answers the same.
//!
//! The order of a removal:
//!
//! 1. one journal transaction through the leased lane's journal: D's
//!    DIR_REMOVE (its new tail) and the victim's record ORPHAN, always
//!    (`namei::drop_link` on a client engine);
//! 2. a full fence, then the scan of every claimed slot's holds in the
//!    epoch table (`Fs::client_holds`, the owner's own check): Dekker's
//!    order with a holder's store-fence-read, so either the holder sees
//!    ORPHAN and lets go, or this scan sees its hold;
//! 3. no hold (and no handle of this engine): FREE stored and persisted.
//!    An inode the client created under this lane lease (a slot of the
//!    grant): its log pages and data blocks, all from its reservation,
//!    onto the client's `freed` list (the server's limbo: readers pinned
//!    at an older epoch may still read them), its head chunk kept for the
//!    owner with the lane ([`crate::lanelease::LaneReturn::freed_chunks`]),
//!    its slot handed out again. An older inode: its log still names its
//!    blocks (nobody frees them), and the owner frees them and the slot
//!    when it hears `slot INO` ([`Fs::free_client_victim`]);
//! 4. a hold: the victim stays ORPHAN and the removal returns
//!    [`ClientUnlink::Held`]: the owner must hear `orphan INO GEN`
//!    ([`Fs::adopt_client_orphan`]), and frees it at the last `unheld`.
//!
//! Why older inodes are the owner's to free: a client may die with its
//! `freed` batch unsent. The reaping (`Fs::reap_lane`) finds every inode
//! the client removed in its directories' logs (their DIR_REMOVE entries
//! past the owner's cached tails); a created one's blocks are the
//! reservation's rest, which the reaping returns; an older one whose slot
//! the owner still counts used is freed as `slot INO` would free it. So
//! each is freed exactly once, whether or not the client's messages came.
//!
//! A crash anywhere leaves either the name (before the commit) or no name
//! and the victim ORPHAN or FREE: recovery frees an ORPHAN, and rebuilds
//! the allocator from the live logs, so nothing leaks on media.
//!
//! **Who owns what.** The victim's record is the client's from the commit
//! until FREE is durable (or, held, until the owner adopts it); a created
//! victim's blocks and slot are the client's until they reach the owner
//! (the freed batch, the lane's return); an older victim's blocks and
//! slot stay the owner's books' all along, freed by the owner only.

use std::sync::Arc;

use crate::error::{errno, Result};
use crate::format::*;
use crate::fs::Fs;
use crate::inode::{lock, read, write, Inode, InodeState};
use crate::inthash::IntSet;
use crate::perm::{Actor, Credentials};
use crate::pmem::Pmem;
use crate::types::FileKind;

/// What the kernel held in D when D's lease was granted (rule 4's input,
/// from the server's lookup counts).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum KernelHeld {
    /// The kernel does not know D: no child of D is referenced.
    Nothing,
    /// The children of D the kernel counts (at most 256).
    Children(Vec<u64>),
    /// More than that: every child older than the lease is the server's
    /// to remove.
    #[default]
    Many,
}

/// Why a removal must go to the server instead (not an errno: the caller
/// sends the request, and the server answers it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotLocal {
    /// Rule 1: no lease of the directory.
    NoDirLease,
    /// Rule 1: no lane leased.
    NoLane,
    /// Rule 2: not a regular file.
    NotRegular,
    /// Rule 2: more than one link.
    Links,
    /// Rule 3: the caller does not hold the victim's write lease.
    NoVictimLease,
    /// Rule 4: the kernel may hold a reference to it (on the grant's
    /// list, or the grant said "many").
    KernelHolds,
}

impl std::fmt::Display for NotLocal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NotLocal::NoDirLease => "no lease of the directory",
            NotLocal::NoLane => "no lane",
            NotLocal::NotRegular => "not a regular file",
            NotLocal::Links => "more than one link",
            NotLocal::NoVictimLease => "the file's lease is not held",
            NotLocal::KernelHolds => "the kernel may hold it",
        })
    }
}

/// What a client's removal did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientUnlink {
    /// Removed and freed.
    Freed,
    /// Removed; another process holds it open (or this engine has it
    /// open): it stays ORPHAN, and the owner must hear `orphan INO GEN`.
    Held { ino: u64, generation: u64 },
    /// Not removed: the request goes to the server.
    NotLocal(NotLocal),
}

/// A directory lease of a client engine: what rule 4 needs.
pub(crate) struct DirLease {
    pub(crate) ino: u64,
    kernel: KernelHeld,
    /// Inodes this client created in the directory under this lease (the
    /// kernel cannot know them: every reply that would hand it one
    /// answers a request naming the directory, which recalls the lease).
    /// A set: a removal looks its victim up and forgets it (a list's
    /// scans were a removal's cost with a thousand files made).
    created: IntSet,
}

impl DirLease {
    pub(crate) fn new(ino: u64, kernel: KernelHeld) -> DirLease {
        DirLease {
            ino,
            kernel,
            created: IntSet::default(),
        }
    }

    /// Rule 4: whether the kernel may hold `victim`.
    fn kernel_may_hold(&self, victim: u64) -> bool {
        if self.created.contains(&victim) {
            return false;
        }
        match &self.kernel {
            KernelHeld::Nothing => false,
            KernelHeld::Children(list) => list.contains(&victim),
            KernelHeld::Many => true,
        }
    }
}

impl<P: Pmem> Fs<P> {
    // -----------------------------------------------------------------
    // The client
    // -----------------------------------------------------------------

    /// unlink(2) of `name` in `dir` by a client engine under `dir`'s lease
    /// and a lane (see the module comment), as `cred` (None: the engine,
    /// no permission checks); `victim_leased` says whether the caller
    /// holds an inode's write lease (rule 3). Inside a lease write
    /// ([`Fs::client_writes`]), else EROFS; EINVAL on an engine that is
    /// not a client's.
    pub fn client_unlink(
        &self,
        cred: Option<&Credentials>,
        dir: u64,
        name: &[u8],
        victim_leased: &dyn Fn(u64) -> bool,
    ) -> Result<ClientUnlink> {
        if !self.is_client() {
            return errno(libc::EINVAL);
        }
        self.check_writable()?;
        if name.len() > NAME_MAX {
            return errno(libc::ENAMETOOLONG);
        }
        // Before the lookup: without D's lease this engine's view of D is
        // not the authority (its ENOENT could be stale).
        if let Some(why) = self.client_may_remove_in(dir) {
            return Ok(ClientUnlink::NotLocal(why));
        }
        let actor = cred.map_or(Actor::Engine, Actor::Caller);
        self.with_victim(actor, dir, name, false, |d, child, locked| {
            // Again under D's lock: a give-back of D takes it too.
            if let Some(why) = self.client_may_remove_in(dir) {
                return Ok(ClientUnlink::NotLocal(why));
            }
            if let Some(why) = self.client_rules(d.ino, child, locked.get(child.ino), victim_leased) {
                return Ok(ClientUnlink::NotLocal(why));
            }
            let held = self.remove_locked(d, child, name, locked)?;
            self.client_forget_created(d.ino, child.ino);
            Ok(match held {
                Some((ino, generation)) => ClientUnlink::Held { ino, generation },
                None => ClientUnlink::Freed,
            })
        })
    }

    /// EROFS on a client engine: a namespace change it never makes itself
    /// (links, renames; its removals go through [`Fs::client_unlink`]).
    pub(crate) fn deny_client(&self) -> Result<()> {
        if self.is_client() {
            return errno(libc::EROFS);
        }
        Ok(())
    }

    /// Rule 1: the directory's lease and a lane.
    fn client_may_remove_in(&self, dir: u64) -> Option<NotLocal> {
        let side = self.client.as_ref()?;
        if !lock(&side.lane.dirs).iter().any(|l| l.ino == dir) {
            return Some(NotLocal::NoDirLease);
        }
        if self.client_lane().is_none() {
            return Some(NotLocal::NoLane);
        }
        None
    }

    /// Rules 2-4 for `victim` in `dir` (both locked).
    fn client_rules(
        &self,
        dir: u64,
        victim: &Inode,
        st: &InodeState,
        victim_leased: &dyn Fn(u64) -> bool,
    ) -> Option<NotLocal> {
        let side = self.client.as_ref()?;
        if victim.kind != FileKind::File {
            return Some(NotLocal::NotRegular);
        }
        if st.attr.nlink != 1 {
            return Some(NotLocal::Links);
        }
        if !victim_leased(victim.ino) {
            return Some(NotLocal::NoVictimLease);
        }
        let dirs = lock(&side.lane.dirs);
        let lease = dirs.iter().find(|l| l.ino == dir)?;
        lease
            .kernel_may_hold(victim.ino)
            .then_some(NotLocal::KernelHolds)
    }

    /// A client's create in `dir` committed inode `ino` (rule 4: the
    /// kernel cannot know it while the lease lasts).
    pub(crate) fn client_created(&self, dir: u64, ino: u64) {
        let Some(side) = &self.client else { return };
        if let Some(l) = lock(&side.lane.dirs).iter_mut().find(|l| l.ino == dir) {
            l.created.insert(ino);
        }
    }

    fn client_forget_created(&self, dir: u64, ino: u64) {
        let Some(side) = &self.client else { return };
        if let Some(l) = lock(&side.lane.dirs).iter_mut().find(|l| l.ino == dir) {
            l.created.remove(&ino);
        }
    }

    /// A client's journal transaction: through its leased lane's journal.
    pub(crate) fn client_commit(&self, records: &[JournalRecord]) {
        let lane = self.client_lane();
        debug_assert!(lane.is_some(), "a client committing without a lane");
        if let Some(lane) = lane {
            self.commit_journal_of_slot(lane, records);
        }
    }

    /// After a client's removal committed its victim ORPHAN (step 2 of
    /// the module comment): freed now unless held. Some (number,
    /// generation) when held: the owner must hear of it.
    pub(crate) fn client_orphaned(&self, victim: &Inode, st: &mut InodeState) -> Option<(u64, u64)> {
        // The fence in `client_holds` orders the commit's ORPHAN store
        // before the loads of the holds.
        if st.open_count > 0 || self.client_holds(victim.ino) {
            return Some((victim.ino, st.generation));
        }
        // Blocks it kept for reuse after overwrites, and its reserve, are
        // its reservation's: to the owner's limbo with it.
        let mut recycled = std::mem::take(&mut st.recycled);
        recycled.drain(|start, len| self.free_blocks(start, len));
        let (lane, slot) = ino_to_lane_slot(victim.ino, self.geo.lane_count);
        let own = self.client.as_ref().is_some_and(|c| c.lane.granted(lane, slot));
        if own {
            // Created under this lane lease: its blocks are the
            // reservation's (onto the freed list; its head chunk with the
            // lane), its slot is handed out again.
            self.free_inode_now(victim, st);
            return None;
        }
        // An older inode: its record FREE, durable; its blocks and slot
        // are the owner's to free (`slot INO`): the reaping of a dead
        // client finds what it did not hear by the slot still used.
        self.pm
            .write_u64(victim.rec_off + INODE_STATE_FIELD, INODE_FREE);
        self.pm.persist(victim.rec_off + INODE_STATE_FIELD, 8);
        self.drop_prealloc(st);
        st.gone = true;
        st.orphan = false;
        self.cache.remove(victim.ino);
        if let Some(side) = &self.client {
            lock(&side.lane.slots_out).push(victim.ino);
        }
        None
    }

    /// A slot a client's removal freed (its record FREE and durable):
    /// true if this engine is a client's, which hands it out again.
    pub(crate) fn client_free_slot(&self, lane: u32, slot: u64) -> bool {
        let Some(side) = &self.client else {
            return false;
        };
        let kept = side.lane.take_freed_slot(lane, slot);
        debug_assert!(kept, "a client freeing slot {slot} of lane {lane}, not granted");
        true
    }

    /// A head chunk of an inode a client created and removed: kept for
    /// the owner (given back with the lane). True if this engine is a
    /// client's.
    pub(crate) fn client_free_chunk(&self, id: u64) -> bool {
        let Some(side) = &self.client else {
            return false;
        };
        lock(&side.lane.chunks_freed).push(id);
        true
    }

    /// Whether this client engine holds directory `dir`'s lease and a
    /// lane (rule 1): its view of `dir` is then the authority.
    pub fn client_holds_dir(&self, dir: u64) -> bool {
        self.is_client() && self.client_may_remove_in(dir).is_none()
    }

    /// Whether `ino` is in a slot of this client's lane grant (an inode it
    /// created under this lane lease, or a slot not used yet): its removal
    /// would free its blocks as the reservation's (step 3 of the module
    /// comment). False on an engine that is not a client's.
    pub fn client_owns_slot(&self, ino: u64) -> bool {
        let (lane, slot) = ino_to_lane_slot(ino.max(1), self.geo.lane_count);
        self.client
            .as_ref()
            .is_some_and(|c| c.lane.granted(lane, slot))
    }

    /// Older inodes this client's removals freed since the last call: the
    /// owner frees each one's blocks and slot ([`Fs::free_client_victim`],
    /// `slot INO` with the next freed batch).
    pub fn take_client_freed_slots(&self) -> Vec<u64> {
        self.client
            .as_ref()
            .map(|c| std::mem::take(&mut *lock(&c.lane.slots_out)))
            .unwrap_or_default()
    }

    // -----------------------------------------------------------------
    // The owner
    // -----------------------------------------------------------------

    /// The owner hears `orphan INO GEN`: a client removed inode `ino` of
    /// generation `generation` and found it held. It joins the owner's
    /// client-held orphans (freed at the last `unheld`), or is freed now
    /// if nothing holds it any more. Nothing to do (Ok(false)) when the
    /// inode is not that orphan any more (freed and perhaps reused).
    /// Ok(true) when freed now.
    pub fn adopt_client_orphan(&self, ino: u64, generation: u64) -> Result<bool> {
        self.check_writable()?;
        if self.is_client() {
            return errno(libc::EINVAL);
        }
        // As the record says now: the owner's cached object may predate
        // the client's removal (and the slot's reuse).
        let Ok(inode) = self.iget_current(ino) else {
            return Ok(false);
        };
        let mut st = write(&inode.state);
        if st.gone || !st.orphan || st.generation != generation {
            return Ok(false);
        }
        if st.open_count > 0 || self.client_holds(ino) {
            if st.open_count == 0 {
                self.keep_held_orphan(ino);
            }
            return Ok(false);
        }
        self.free_inode_now(&inode, &mut st);
        Ok(true)
    }

    /// The owner hears `slot INO`: a client's removal freed the older
    /// inode `ino` (not in a slot handed out to it): its record is FREE
    /// and its log still names its blocks (no one freed them). They go to
    /// the limbo, the slot to the owner's list, a stale cached object of
    /// the inode goes. Exactly once: the slot is used until this frees
    /// it, and only the owner hands it out again. EINVAL for a handed-out
    /// slot, a record that is not FREE, or a slot free already; EBUSY if
    /// the owner has the inode open (it never should: rule 4). The blocks
    /// freed (a log chunk as its whole block): the server takes them out
    /// of the client's reservation books (written under its lease, they
    /// may still be there).
    pub fn free_client_victim(&self, ino: u64) -> Result<Vec<(u64, u64)>> {
        if self.is_client() {
            return errno(libc::EINVAL);
        }
        let (lane, slot) = ino_to_lane_slot(ino, self.geo.lane_count);
        if ino == 0 || lane >= self.geo.lane_count || self.slot_handed_out(lane, slot) {
            return errno(libc::EINVAL);
        }
        self.free_victim_record(ino)
    }

    /// [`Fs::free_client_victim`] of an inode known not to be in a
    /// handed-out slot (the reaping, which holds the lane's grant): the
    /// blocks freed.
    pub(crate) fn free_victim_record(&self, ino: u64) -> Result<Vec<(u64, u64)>> {
        let (lane, slot) = ino_to_lane_slot(ino, self.geo.lane_count);
        let Some(rec_off) = self.tables.record_offset(&self.pm, ino)? else {
            return errno(libc::EINVAL);
        };
        let rec: InodeRecord = crate::pmem::read_pod(&self.pm, rec_off);
        if rec.state != INODE_FREE || !self.slots.is_used(lane, slot) {
            return errno(libc::EINVAL);
        }
        // Durable before its blocks can be reused: a client killed between
        // its FREE store and that line's write-back leaves it visible only
        // (a power cut would then keep the inode ORPHAN, its log naming
        // blocks another file took).
        self.pm.persist(rec_off + INODE_STATE_FIELD, 8);
        if !self.forget_freed_inode(ino) {
            return errno(libc::EBUSY);
        }
        let kind = FileKind::from_u32(rec.kind).ok_or(crate::Error::Errno(libc::EINVAL))?;
        let st = crate::inode::load(&self.pm, &self.geo, ino, &rec)?;
        let victim = Inode {
            ino,
            kind,
            rec_off,
            state: std::sync::RwLock::new(st),
            lease_mark: Default::default(),
        };
        let mut st = write(&victim.state);
        let named = self.named_blocks(&st)?;
        self.release_inode_blocks(&victim, &mut st);
        Ok(named)
    }

    /// The whole blocks a loaded inode's state names: its log pages (not
    /// a log chunk: a chunk block is settled as one, at a lane's return
    /// or reaping) and its data or symlink block.
    fn named_blocks(&self, st: &InodeState) -> Result<Vec<(u64, u64)>> {
        let pages = crate::log::chain_pages(&self.pm, &self.geo, st.log.head, st.log.pages)?;
        let mut out: Vec<(u64, u64)> = pages
            .into_iter()
            .filter(|&p| matches!(log_page_id(p), Some((_, None))))
            .map(|p| (p, 1))
            .collect();
        match &st.body {
            crate::inode::Body::File(map) => out.extend(map.iter().map(|e| (e.block, e.pages))),
            crate::inode::Body::Symlink { block, .. } if *block != 0 => out.push((*block, 1)),
            _ => {}
        }
        Ok(out)
    }

    /// Inode `ino`'s record was freed by a client: the owner's cached
    /// object, if any, is stale and goes. False if the owner has it open.
    pub(crate) fn forget_freed_inode(&self, ino: u64) -> bool {
        let Some(inode) = self.cache.get(ino) else {
            return true;
        };
        let mut st = write(&inode.state);
        if st.gone {
            return true;
        }
        if st.open_count > 0 {
            return false;
        }
        st.gone = true;
        self.cache.remove_stale(&inode);
        true
    }

    /// The inodes a client removed from `dir` between the owner's cached
    /// tail `from` and the directory's tail now (its DIR_REMOVE entries),
    /// for the reaping of a dead client's lane.
    pub(crate) fn removed_between(&self, dir: &Arc<Inode>, head: u64, from: u64) -> Result<Vec<u64>> {
        let mut out = Vec::new();
        self.entries_between(dir, head, from, |added, ino| {
            if !added {
                out.push(ino);
            }
        })?;
        // Each once (a slot freed and made again under one lease).
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }

    /// The inodes a client linked into `dir` between the owner's cached
    /// tail `from` and the directory's tail now and did not remove since
    /// (DIR_ADD entries not followed by a DIR_REMOVE of the inode), for
    /// the settle of its directory lease ([`Fs::settle_dir_made`]). An
    /// inode removed under the lease is left out: its slot may hold
    /// another file by now (made again in another directory), whose
    /// blocks are not this lease's.
    pub(crate) fn added_between(&self, dir: &Arc<Inode>, head: u64, from: u64) -> Result<Vec<u64>> {
        let mut linked = std::collections::BTreeSet::new();
        self.entries_between(dir, head, from, |added, ino| {
            if added {
                linked.insert(ino);
            } else {
                linked.remove(&ino);
            }
        })?;
        Ok(linked.into_iter().collect())
    }

    /// Each DIR_ADD (true) and DIR_REMOVE (false) of `dir` past `from`,
    /// in log order, with the child's inode number.
    fn entries_between(
        &self,
        dir: &Arc<Inode>,
        head: u64,
        from: u64,
        mut f: impl FnMut(bool, u64),
    ) -> Result<()> {
        let to = read(&dir.state).log.tail;
        if to == from {
            return Ok(());
        }
        crate::log::walk_from(&self.pm, &self.geo, dir.ino, head, from, to, |_, e| {
            match e {
                crate::log::Entry::DirAdd { head, .. } => f(true, head.ino),
                crate::log::Entry::DirRemove { head, .. } => f(false, head.ino),
                _ => {}
            }
            Ok(())
        })?;
        Ok(())
    }
}
