//! Lane leases, the server's side (docs/KERNEL-FREE.md, "Built: lane
//! grants and the client's creates end to end"; the words:
//! `inkfs::api::lanelease`; the engine's side: crates/inkfs/src/
//! lanelease.rs).
//!
//! A client that asks for a directory's lease with `+lane` gets one of the
//! pool's lanes with it, if it holds none (`grant`): the first lane
//! `Fs::lease_lane` accepts (it keeps the owner's last one). None left:
//! the directory is refused too (`nolane`, counted), so a client holds a
//! directory lease with a lane or none. The lane comes back at
//! `released lane K` (`released`, `Fs::take_back_lane`; a return the
//! engine refuses is the client's fault: its session is ended, and the
//! lane reaped), or at the client's death (`reap`, `Fs::reap_lane`).
//!
//! Ownership: which client holds which lane is the lease table's
//! (`Holder::lane`, DRAM, locked for a grant, a give-back or a reaping);
//! the lane's state while leased is the engine's. The client's
//! reservation pays for the new inodes' logs and data and for the leased
//! directories' new log pages: those blocks leave its books when the
//! server sees them named (a directory's settle, the lane's take-back,
//! the reaping), so that the rest of the reservation, returned at the
//! session's end, holds none of them.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use inkfs::api::lanelease::{LaneGrant, LaneReturn, LANE_SLOTS_MAX};
use inkfs::api::lease::{Msg, RangeSet};

use crate::lease::{Holder, Leases};
use crate::Engine;

/// Lane leases' counters for `inkfs stat`.
#[derive(Default)]
pub struct LaneBooks {
    leased: AtomicU64,
    given_back: AtomicU64,
    reaped: AtomicU64,
    /// Files made under directory leases that became file leases at the
    /// directory's give-back (`kept=`).
    kept: AtomicU64,
    /// Returns the engine refused (the session was ended for it).
    refused: AtomicU64,
    /// Slots handed out by `slots K` (after the grant's).
    slots_given: AtomicU64,
    /// Removals made by clients under directory leases (`removed=` of a
    /// directory's `released`; a client that died does not tell).
    removed: AtomicU64,
    /// `orphan INO GEN`: removed files another process held, adopted.
    orphans: AtomicU64,
    /// `slot INO`: older files a client removed, freed here.
    slots_freed: AtomicU64,
    /// `orphan` or `slot` messages that named nothing to adopt or free.
    removals_refused: AtomicU64,
    /// Settles the engine could not finish (a chain, log or record that
    /// does not load): blocks kept out of the free lists until fsck or
    /// the next mount rather than freed while perhaps named.
    failed: AtomicU64,
}

impl LaneBooks {
    /// A settle the engine failed: said on the server's stderr, counted
    /// for `inkfs stat` (a test or an operator sees it without the log).
    pub(crate) fn failed(&self, why: std::fmt::Arguments) {
        eprintln!("inkfs: {why}");
        self.failed.fetch_add(1, Relaxed);
    }

    /// Settles the engine could not finish so far.
    pub fn failures(&self) -> u64 {
        self.failed.load(Relaxed)
    }

    pub(crate) fn kept(&self) {
        self.kept.fetch_add(1, Relaxed);
    }

    /// (leased, given back, reaped, files kept, returns refused).
    pub fn counts(&self) -> (u64, u64, u64, u64, u64) {
        (
            self.leased.load(Relaxed),
            self.given_back.load(Relaxed),
            self.reaped.load(Relaxed),
            self.kept.load(Relaxed),
            self.refused.load(Relaxed),
        )
    }

    /// Slots handed out by `slots K` so far.
    pub fn slots_given(&self) -> u64 {
        self.slots_given.load(Relaxed)
    }

    /// Clients' removals under directory leases told so far.
    pub(crate) fn removed(&self, n: u64) {
        self.removed.fetch_add(n, Relaxed);
    }

    /// (removals told, orphans adopted, slots freed, messages refused).
    pub fn removals(&self) -> (u64, u64, u64, u64) {
        (
            self.removed.load(Relaxed),
            self.orphans.load(Relaxed),
            self.slots_freed.load(Relaxed),
            self.removals_refused.load(Relaxed),
        )
    }
}

/// A lane for `holder`, asked with a directory lease: Some(grant) if one
/// was leased to it now, None if it holds one already, Err if none can be
/// leased (every lane but the owner's last is leased).
pub(crate) fn grant(
    leases: &Leases,
    engine: &Engine,
    holder: &Holder,
) -> Result<Option<LaneGrant>, ()> {
    let mut lane = holder.lane.lock().unwrap_or_else(|e| e.into_inner());
    if lane.is_some() {
        return Ok(None);
    }
    if holder.is_dead() {
        return Err(());
    }
    for k in 0..engine.lane_count() {
        if let Ok(g) = engine.lease_lane(k, LANE_SLOTS_MAX) {
            *lane = Some(k);
            leases.lanes.leased.fetch_add(1, Relaxed);
            return Ok(Some(g));
        }
    }
    Err(())
}

/// `slots K`: more free slots of the lane leased to `holder`
/// (`Fs::lease_more_slots`); none if it holds another lane or none, or
/// the grant's bound is reached.
pub(crate) fn more_slots(leases: &Leases, holder: &Holder, k: u32) -> Msg {
    let lane = holder.lane.lock().unwrap_or_else(|e| e.into_inner());
    let slots = match (leases.engine(), *lane == Some(k)) {
        (Some(engine), true) => engine
            .lease_more_slots(k, LANE_SLOTS_MAX)
            .unwrap_or_default(),
        _ => Vec::new(),
    };
    if !slots.is_empty() {
        leases
            .lanes
            .slots_given
            .fetch_add(slots.len() as u64, Relaxed);
    }
    Msg::SlotsGiven(k, slots)
}

/// A lane just leased with a directory lease that was then refused: back
/// to the owner before the client learns of it (nothing used).
pub(crate) fn untake(leases: &Leases, engine: &Engine, holder: &Holder, g: &LaneGrant) {
    let ret = LaneReturn {
        lane: g.lane,
        unused_slots: g.slots.clone(),
        table_end: g.table_end,
        ..LaneReturn::default()
    };
    let _silent = crate::lease::silent();
    let mut lane = holder.lane.lock().unwrap_or_else(|e| e.into_inner());
    match engine.take_back_lane(&ret) {
        Ok(_) => {
            *lane = None;
            leases.lanes.given_back.fetch_add(1, Relaxed);
        }
        // Left leased to the holder: its reaping takes it back.
        Err(e) => leases
            .lanes
            .failed(format_args!("lane {}: not taken back unused: {e}", g.lane)),
    }
}

/// `released lane K ...` from a live client: the lane back
/// (`Fs::take_back_lane`), the blocks its new inodes name and its partly
/// used chunk blocks out of its reservation. Err: the return disagrees
/// with the grant or the media (the engine changed nothing): the caller
/// ends the client's session, whose end reaps the lane.
pub(crate) fn released(leases: &Leases, holder: &Holder, ret: &LaneReturn) -> Result<(), String> {
    let Some(engine) = leases.engine() else {
        return Ok(());
    };
    let _silent = crate::lease::silent();
    let mut lane = holder.lane.lock().unwrap_or_else(|e| e.into_inner());
    if *lane != Some(ret.lane) {
        leases.lanes.refused.fetch_add(1, Relaxed);
        return Err(format!("lane {} is not leased to it", ret.lane));
    }
    let settled = engine.take_back_lane(ret).map_err(|e| {
        leases.lanes.refused.fetch_add(1, Relaxed);
        format!("lane {}: {e}", ret.lane)
    })?;
    *lane = None;
    drop(lane);
    leases.lanes.given_back.fetch_add(1, Relaxed);
    // Every block it carved into log chunks, once (docs/KERNEL-FREE.md,
    // "The books of a client's chunk blocks"): the engine lists them.
    let chunks: Vec<(u64, u64)> = settled.chunk_blocks.iter().map(|&b| (b, 1)).collect();
    holder.unreserve(&chunks);
    // The table blocks the client added to the chain (from its
    // reservation; those of the chain before it are in no reservation).
    match engine.lane_table_blocks(ret.lane) {
        Ok(blocks) => {
            let table: Vec<(u64, u64)> = blocks.iter().map(|&b| (b, 1)).collect();
            holder.unreserve(&table);
        }
        Err(e) => {
            leases
                .lanes
                .failed(format_args!("lane {}: its table chain: {e}", ret.lane));
            let all = leases.reserved_of(holder);
            holder.unreserve(&all);
        }
    }
    for ino in settled.live {
        // Its log chunk's block is in `chunk_blocks` (above).
        match engine.whole_blocks_named(ino) {
            Ok(named) => holder.unreserve(&named),
            // Its blocks stay in the reservation's books: returned at the
            // session's end they would be freed while named. Out of the
            // books unreturned instead (fsck reports them if unnamed).
            Err(e) => {
                leases.lanes.failed(format_args!(
                    "lane {}: inode {ino} made under it: {e}",
                    ret.lane
                ));
                let all = leases.reserved_of(holder);
                holder.unreserve(&all);
            }
        }
    }
    Ok(())
}

/// The whole blocks (log pages but chunks, data) of the inodes a client
/// linked into a directory under its lease, at the lease's settle: they
/// leave its books then (docs/KERNEL-FREE.md, "The books of a client's
/// chunk blocks", files made under a directory lease). From that moment
/// the client's authority over them is a file lease's at most (`kept=`,
/// adopted before D is settled: they are its grant's blocks), and anyone
/// may free them (the server's removal of a file made under an earlier
/// lease, a later grant's settle of a displaced block), once. Left in the
/// books they were freed twice: by that free, and with the reservation's
/// rest at the session's end. A log chunk's block stays the lane's
/// (settled at its take-back or reaping); an inode gone since (removed
/// under the lease: its blocks came back in `return`s) names nothing.
pub(crate) fn made_blocks(engine: &Engine, made: &[u64]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for &ino in made {
        match engine.whole_blocks_named(ino) {
            Ok(named) => out.extend(named),
            Err(e) if e.errno() == libc::ENOENT => {}
            // Its log does not load (damage: the pool wants fsck): its
            // blocks stay in the books, as before this settle named any.
            Err(e) => eprintln!("inkfs: inode {ino} made under a directory lease: {e}"),
        }
    }
    out
}

/// The holder died (or its session was ended) holding a lane: the
/// reaping (docs/KERNEL-FREE.md, "What each crash leaves (stage 5)",
/// steps 2 and 4-6: `Fs::reap_lane`) with its leased directories and its
/// reservation less what the files it holds leases of name (those are
/// settled as file leases after). The whole reservation passed leaves its
/// books: named by the new inodes or directories, or returned by the
/// engine. Called with the lease hook silent, before any of its
/// directories is settled; once (the lane is taken under its lock).
pub(crate) fn reap(leases: &Leases, engine: &Engine, holder: &Holder) {
    if !holder.is_dead() {
        return;
    }
    let mut lane = holder.lane.lock().unwrap_or_else(|e| e.into_inner());
    let Some(k) = *lane else {
        return;
    };
    let (files, dirs) = leases.leases_of(holder);
    let mut rest = RangeSet::from_ranges(&leases.reserved_of(holder));
    for ino in files {
        // A file's own settle adopts it again; here only what it names.
        if let Ok(refs) = engine.lease_refs(ino) {
            for (s, l) in refs {
                rest.remove(s, l);
            }
        }
    }
    let reservation = rest.ranges();
    match engine.reap_lane(k, &dirs, &reservation) {
        Ok(_) => leases.lanes.reaped.fetch_add(1, Relaxed),
        Err(e) => {
            // The lane stays leased (the pool wants fsck); its blocks are
            // kept out of the free lists rather than freed while named.
            leases.lanes.failed(format_args!(
                "reaping lane {k} of client {}: {e}",
                holder.id
            ));
            0
        }
    };
    holder.unreserve(&reservation);
    *lane = None;
}

/// `orphan INO GEN` from a live client (docs/KERNEL-FREE.md, "Built:
/// client-local removals on the wire"): it removed inode INO under a
/// directory lease and another process holds it. Its file lease (if the
/// client held one on the server) ends without a settle (the inode is
/// unlinked; its blocks stay named by its log), the blocks it names leave
/// the client's books (written from its reservation: returned with the
/// rest at the session's end they would be freed while named), and the
/// engine adopts it: freed at the last hold (`Fs::adopt_client_orphan`),
/// or now if no hold is left. Once: a second `orphan` finds the inode
/// adopted or freed (a wrong generation: nothing).
pub(crate) fn orphan(leases: &Leases, holder: &Holder, ino: u64, gen: u64) {
    let Some(engine) = leases.engine() else {
        return;
    };
    let _silent = crate::lease::silent();
    // Against the reaping: the lane's lock, as a give-back takes it.
    let lane = holder.lane.lock().unwrap_or_else(|e| e.into_inner());
    leases.forget_removed(holder, ino);
    let ok = lane.is_some() && engine.is_orphan(ino).unwrap_or(false);
    if ok {
        // Its log chunk's block stays in the books: settled with the
        // lane (the take-back's `chunk_blocks`, or the reaping), and the
        // engine holds its chunk's free until then (lanechunks.rs).
        match engine.whole_blocks_named(ino) {
            Ok(named) => holder.unreserve(&named),
            // Kept out of the free lists rather than freed while named.
            Err(e) => {
                leases
                    .lanes
                    .failed(format_args!("client {}: orphan {ino}: {e}", holder.id));
                let all = leases.reserved_of(holder);
                holder.unreserve(&all);
            }
        }
    }
    match ok.then(|| engine.adopt_client_orphan(ino, gen)) {
        Some(Ok(_)) => leases.lanes.orphans.fetch_add(1, Relaxed),
        _ => leases.lanes.removals_refused.fetch_add(1, Relaxed),
    };
}

/// `slot INO` from a live client: it removed and freed the older inode
/// INO under a directory lease (its record FREE, its log still naming
/// its blocks). Its file lease ends without a settle, the engine frees
/// its blocks into the limbo and its slot (`Fs::free_client_victim`:
/// exactly once, keyed on the slot still used), and the blocks freed
/// leave the client's books (those it wrote under the file's lease came
/// from its reservation). Only from a client holding a lane (the only
/// one that can have made the removal).
pub(crate) fn slot(leases: &Leases, holder: &Holder, ino: u64) {
    let Some(engine) = leases.engine() else {
        return;
    };
    let _silent = crate::lease::silent();
    let lane = holder.lane.lock().unwrap_or_else(|e| e.into_inner());
    leases.forget_removed(holder, ino);
    let freed = match lane.is_some().then(|| engine.free_client_victim(ino)) {
        Some(Ok(freed)) => freed,
        Some(Err(e)) => {
            leases
                .lanes
                .failed(format_args!("client {}: slot {ino}: {e}", holder.id));
            leases.lanes.removals_refused.fetch_add(1, Relaxed);
            return;
        }
        None => {
            leases.lanes.removals_refused.fetch_add(1, Relaxed);
            return;
        }
    };
    holder.unreserve(&freed);
    leases.lanes.slots_freed.fetch_add(1, Relaxed);
}
