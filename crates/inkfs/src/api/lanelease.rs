//! Lane grants on the attach session (docs/KERNEL-FREE.md, "Stage 5:
//! creates and removals in a leased directory", "The lane's hand-over";
//! "Built: lane grants and the client's creates end to end"): the words of
//! the protocol, and the engine's lane calls on a [`Filesystem`].
//!
//! A client whose server said `lanes=1` in its attach grant
//! (`super::attach::Grant::lanes`) asks for a lane with the directory
//! lease it asks for (`+dir +lane` on a namespace request, `super::ns`);
//! the answer then carries, when the directory was granted and the client
//! held no lane yet, one more word after `dir=`:
//!
//! ```text
//! server: done SEQ ERRNO INO IGEN GEN dir=DGEN:KERNEL lane=K:END:S,S,...
//!     or: done SEQ ERRNO INO IGEN GEN dir=0:nolane   (no lane could be
//!                                                     leased to it)
//! client: released D DGEN kept=INO:IGEN,...           (D's lease back; the
//!                                                     files it created
//!                                                     under it and keeps
//!                                                     writing become file
//!                                                     leases of grant DGEN)
//! client: slots K                                   (no slot left: more)
//! server: slots-given K S,S,...                     (`-`: none; its
//!                                                     creates go to the
//!                                                     server then)
//! client: released D DGEN kept=... removed=N        (N: removals it made
//!                                                     under the lease;
//!                                                     `removes=1` only)
//! client: orphan INO GEN                            (a removal left INO
//!                                                     held by another
//!                                                     process)
//! client: slot INO                                  (a removal freed the
//!                                                     older inode INO)
//! client: released lane K END slots=S,... chunks=B:M,... freed=ID,...
//!                                                     (its last directory
//!                                                     lease went: the lane
//!                                                     back, its unused
//!                                                     slots, its table's
//!                                                     end, its partly used
//!                                                     chunk blocks)
//! ```
//!
//! `K` is the lane, `END` its inode table chain's last block, `S` the
//! free slots handed out (`-` for none), `B:M` a chunk block and the
//! bitmap of its chunks in use, `ID` the head chunk of a file made and
//! removed under the lease (crates/inkfs/src/rmlocal.rs). A server that
//! never said `lanes=1` gets none of these words, and a client that never
//! asked `+lane` gets none; `orphan`, `slot` and `removed=` go only to a
//! server that said `removes=1` (`super::attach::Grant::removes`; the
//! client's side: `super::client`'s `remove` module): older clients and
//! servers are unchanged.
//!
//! Ownership: the server's lease table owns which client holds which lane
//! (one lane per client at most); the engine's `Fs::lease_lane` owns the
//! lane's state while leased (crates/inkfs/src/lanelease.rs has the
//! table). The hand-over back is `released lane` (a live client), or the
//! reaping of a dead one (`Fs::reap_lane`).

use super::Filesystem;
use crate::error::Result;
use crate::pmem::Pmem;

pub use crate::lanelease::{
    LaneGrant, LaneReturn, LaneSettled, LANE_SLOTS_GRANTED_MAX, LANE_SLOTS_MAX,
};

/// The word asking for a lane with a directory lease.
pub const LANE_ASK_WORD: &str = "+lane";
/// Files at most a client keeps leased at a directory's give-back
/// (`kept=`); it gives the others back with the directory.
pub const KEPT_MAX: usize = 64;

fn list<T: std::fmt::Display>(items: impl Iterator<Item = T>) -> String {
    let s = items.map(|i| i.to_string()).collect::<Vec<_>>().join(",");
    if s.is_empty() {
        "-".to_string()
    } else {
        s
    }
}

fn parse_list(s: &str, max: usize) -> Option<Vec<u64>> {
    if s == "-" {
        return Some(Vec::new());
    }
    let v = s
        .split(',')
        .map(|i| i.parse().ok())
        .collect::<Option<Vec<u64>>>()?;
    (v.len() <= max).then_some(v)
}

fn parse_pairs(s: &str, max: usize) -> Option<Vec<(u64, u64)>> {
    if s == "-" {
        return Some(Vec::new());
    }
    let v = s
        .split(',')
        .map(|p| {
            let (a, b) = p.split_once(':')?;
            Some((a.parse().ok()?, b.parse().ok()?))
        })
        .collect::<Option<Vec<(u64, u64)>>>()?;
    (v.len() <= max).then_some(v)
}

/// The block of a log chunk's id (a `freed=` word's head chunk): None
/// for an id that is no chunk.
pub fn chunk_block_of(id: u64) -> Option<u64> {
    match crate::format::log_page_id(id) {
        Some((block, Some(_))) => Some(block),
        _ => None,
    }
}

/// Slots in a `slots-given` line (`-` for none).
pub fn slot_list(slots: &[u64]) -> String {
    list(slots.iter())
}

/// Parse a `slots-given` line's list.
pub fn parse_slot_list(s: &str) -> Option<Vec<u64>> {
    parse_list(s, LANE_SLOTS_MAX)
}

/// A grant's word in a namespace answer, `lane=K:END:S,S,...`.
pub fn grant_word(g: &LaneGrant) -> String {
    format!("lane={}:{}:{}", g.lane, g.table_end, list(g.slots.iter()))
}

/// Parse a `lane=...` word (None: malformed).
pub fn parse_grant_word(word: &str) -> Option<LaneGrant> {
    let mut p = word.strip_prefix("lane=")?.splitn(3, ':');
    let lane = p.next()?.parse().ok()?;
    let table_end = p.next()?.parse().ok()?;
    let slots = parse_list(p.next()?, LANE_SLOTS_MAX)?;
    Some(LaneGrant {
        lane,
        slots,
        table_end,
    })
}

/// The words after `released` of a directory's give-back with the files
/// kept and the removals made under it (`D DGEN kept=... removed=N`; no
/// `kept=` when there are none, no `removed=` when none: a client that
/// removed nothing itself sends the older line).
pub fn released_dir_words(dir: u64, gen: u64, kept: &[(u64, u64)], removed: u64) -> String {
    let mut out = format!("{dir} {gen}");
    if !kept.is_empty() {
        let k = kept
            .iter()
            .map(|(i, g)| format!("{i}:{g}"))
            .collect::<Vec<_>>()
            .join(",");
        out.push_str(" kept=");
        out.push_str(&k);
    }
    if removed > 0 {
        out.push_str(&format!(" removed={removed}"));
    }
    out
}

/// Parse a `kept=...` word.
pub fn parse_kept_word(word: &str) -> Option<Vec<(u64, u64)>> {
    parse_pairs(word.strip_prefix("kept=")?, KEPT_MAX)
}

/// Parse what follows `released D DGEN`: a `kept=` word, then a
/// `removed=` word, each optional, in that order, nothing after.
pub fn parse_released_dir_rest(
    mut w: std::str::SplitAsciiWhitespace<'_>,
) -> Option<(Vec<(u64, u64)>, u64)> {
    let mut next = w.next();
    let mut kept = Vec::new();
    if let Some(k) = next.filter(|k| k.starts_with("kept=")) {
        kept = parse_kept_word(k)?;
        next = w.next();
    }
    let mut removed = 0;
    if let Some(r) = next {
        removed = r.strip_prefix("removed=")?.parse().ok()?;
        next = w.next();
    }
    next.is_none().then_some((kept, removed))
}

/// The words after `released` of a lane's give-back (`lane K END
/// slots=... chunks=...`).
pub fn released_lane_words(r: &LaneReturn) -> String {
    let chunks = r
        .chunks
        .iter()
        .map(|(b, m)| format!("{b}:{m}"))
        .collect::<Vec<_>>()
        .join(",");
    format!(
        "lane {} {} slots={} chunks={} freed={}",
        r.lane,
        r.table_end,
        list(r.unused_slots.iter()),
        if chunks.is_empty() { "-" } else { &chunks },
        list(r.freed_chunks.iter())
    )
}

/// Parse the words after `released lane`.
pub fn parse_released_lane(mut w: std::str::SplitAsciiWhitespace<'_>) -> Option<LaneReturn> {
    let lane = w.next()?.parse().ok()?;
    let table_end = w.next()?.parse().ok()?;
    let unused_slots = parse_list(w.next()?.strip_prefix("slots=")?, LANE_SLOTS_MAX)?;
    // A client carves chunk blocks one at a time; a handful are partly
    // used at once (bounded like the slots).
    let chunks = parse_pairs(w.next()?.strip_prefix("chunks=")?, LANE_SLOTS_MAX)?;
    // Head chunks of files made and removed under the lease (rmlocal.rs):
    // at most one a handed-out slot.
    let freed_chunks = parse_list(w.next()?.strip_prefix("freed=")?, LANE_SLOTS_GRANTED_MAX)?;
    if w.next().is_some() {
        return None;
    }
    Some(LaneReturn {
        lane,
        unused_slots,
        table_end,
        freed_chunks,
        chunks,
    })
}

/// The server's side of lane leases, on the mount's engine
/// (crates/inkfs/src/lanelease.rs).
impl<P: Pmem> Filesystem<P> {
    /// The pool's lanes.
    pub fn lane_count(&self) -> u32 {
        self.fs.geometry().lane_count
    }

    /// The lane inode `ino`'s record is in.
    pub fn lane_of_ino(&self, ino: u64) -> u32 {
        crate::format::ino_to_lane_slot(ino.max(1), self.lane_count()).0
    }

    /// Lease lane `lane` to a client (`Fs::lease_lane`).
    pub fn lease_lane(&self, lane: u32, slots_max: usize) -> Result<LaneGrant> {
        self.fs.lease_lane(lane, slots_max)
    }

    /// A live client's lane back (`Fs::take_back_lane`).
    pub fn take_back_lane(&self, ret: &LaneReturn) -> Result<LaneSettled> {
        self.fs.take_back_lane(ret)
    }

    /// Every block inode `ino` names, caught up with its record first:
    /// its log pages (a log chunk as its whole block), a file's data, a
    /// symlink's block. What a client's lease made of its reservation
    /// (the new files' logs and data, a leased directory's new log pages):
    /// out of the client's books before its reservation is returned.
    /// Nothing for an inode gone.
    pub fn blocks_named(&self, ino: u64) -> Result<Vec<(u64, u64)>> {
        use crate::format::log_page_id;
        // A log chunk's id names its block with a tag; a data extent's
        // block has none, so the same mapping leaves it as it is.
        Ok(self
            .pages_named(ino)?
            .into_iter()
            .filter_map(|(id, n)| log_page_id(id).map(|(block, _)| (block, n)))
            .collect())
    }

    /// Directory `ino` caught up with what its lease holder committed
    /// (`Fs::settle_dir_made`), and the inodes the holder linked into it
    /// under the lease (its new files: their blocks leave its books).
    pub fn dir_catch_up_made(&self, ino: u64) -> Result<Vec<u64>> {
        self.fs.settle_dir_made(ino)
    }

    /// [`Filesystem::blocks_named`] but the log chunks: the whole blocks
    /// only (a chunk block is settled as one, at a lane's return or
    /// reaping). For a client's orphan (`orphan INO GEN`).
    pub fn whole_blocks_named(&self, ino: u64) -> Result<Vec<(u64, u64)>> {
        use crate::format::log_page_id;
        Ok(self
            .pages_named(ino)?
            .into_iter()
            .filter(|&(id, _)| matches!(log_page_id(id), Some((_, None))))
            .collect())
    }

    /// Inode `ino`'s log pages (chunk ids as they are) and data, caught
    /// up with its record first; nothing for an inode gone.
    fn pages_named(&self, ino: u64) -> Result<Vec<(u64, u64)>> {
        match self.fs.iget_current(ino) {
            Ok(inode) => self.fs.inode_blocks(&inode),
            Err(e) if e.errno() == libc::ENOENT => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    /// The blocks of lane `lane`'s inode table chain (a client grows it
    /// from its reservation while it holds the lane).
    pub fn lane_table_blocks(&self, lane: u32) -> Result<Vec<u64>> {
        self.fs.tables.blocks(&self.fs.pm, lane)
    }

    /// More slots of leased lane `lane` (`Fs::lease_more_slots`).
    pub fn lease_more_slots(&self, lane: u32, slots_max: usize) -> Result<Vec<u64>> {
        self.fs.lease_more_slots(lane, slots_max)
    }

    /// `orphan INO GEN` from a client (`Fs::adopt_client_orphan`): true
    /// if freed now.
    pub fn adopt_client_orphan(&self, ino: u64, generation: u64) -> Result<bool> {
        self.fs.adopt_client_orphan(ino, generation)
    }

    /// `slot INO` from a client (`Fs::free_client_victim`): the blocks
    /// freed.
    pub fn free_client_victim(&self, ino: u64) -> Result<Vec<(u64, u64)>> {
        self.fs.free_client_victim(ino)
    }

    /// A dead client's lane back (`Fs::reap_lane`).
    pub fn reap_lane(
        &self,
        lane: u32,
        dirs: &[u64],
        reservation: &[(u64, u64)],
    ) -> Result<LaneSettled> {
        self.fs.reap_lane(lane, dirs, reservation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::lease::{Msg, LINE_MAX};

    #[test]
    fn words_round_trip_and_junk_is_refused() {
        let full = LaneGrant {
            lane: 3,
            slots: (0..LANE_SLOTS_MAX as u64)
                .map(|s| s + u32::MAX as u64)
                .collect(),
            table_end: u64::MAX,
        };
        for g in [
            LaneGrant {
                lane: 1,
                slots: vec![],
                table_end: 9,
            },
            full.clone(),
        ] {
            let w = grant_word(&g);
            assert_eq!(parse_grant_word(&w), Some(g));
        }
        let ret = LaneReturn {
            lane: 2,
            unused_slots: full.slots.clone(),
            table_end: 77,
            freed_chunks: vec![u64::MAX / 3, 9],
            chunks: vec![(100, 5), (101, 1)],
        };
        let m = Msg::ReleasedLane(ret.clone());
        let line = m.line();
        assert!(line.len() <= LINE_MAX, "{}", line.len());
        assert_eq!(Msg::parse(line.trim_end()), Some(m));
        let empty = Msg::ReleasedLane(LaneReturn {
            lane: 0,
            ..LaneReturn::default()
        });
        assert_eq!(Msg::parse(empty.line().trim_end()), Some(empty));
        for m in [
            Msg::Slots(3),
            Msg::SlotsGiven(3, vec![]),
            Msg::SlotsGiven(3, full.slots.clone()),
        ] {
            assert_eq!(Msg::parse(m.line().trim_end()), Some(m));
        }
        for m in [
            Msg::ReleasedDir(5, 6, vec![(7, 8), (9, 10)], 0),
            Msg::ReleasedDir(5, 6, vec![(7, 8)], 3),
            Msg::ReleasedDir(5, 6, vec![], u64::MAX),
        ] {
            assert_eq!(Msg::parse(m.line().trim_end()), Some(m));
        }
        // No files kept, none removed: the old line, word for word.
        assert_eq!(
            Msg::ReleasedDir(5, 6, vec![], 0).line(),
            Msg::Released(5, 6).line()
        );
        // A client that removed nothing itself (an older one, or one whose
        // server did not say `removes=1`) sends no `removed=`.
        assert!(!Msg::ReleasedDir(5, 6, vec![(7, 8)], 0)
            .line()
            .contains("removed"));
        for bad in [
            "lane=",
            "lane=1:2",
            "lane=x:2:-",
            "lane=1:2:3,,4",
            "lane=1:2:",
        ] {
            assert_eq!(parse_grant_word(bad), None, "{bad}");
        }
        for bad in [
            "released lane",
            "released lane 1",
            "released lane 1 2 slots=- ",
            "released lane 1 2 slots=x chunks=-",
            "released lane 1 2 slots=- chunks=5",
            "released lane 1 2 slots=- chunks=-",
            "released lane 1 2 slots=- chunks=- freed=- more",
            "released 5 6 kept=7",
            "released 5 6 removed=x",
            "released 5 6 removed=1 kept=7:8",
            "released 5 6 kept=7:8 removed=1 more",
            "released 5 6 kept=7:8 kept=9:1",
            "slots",
            "slots-given 3",
            "slots-given 3 1,,2",
        ] {
            assert_eq!(Msg::parse(bad), None, "{bad}");
        }
        let too_many = format!(
            "released 5 6 kept={}",
            (0..=KEPT_MAX)
                .map(|i| format!("{i}:1"))
                .collect::<Vec<_>>()
                .join(",")
        );
        assert_eq!(Msg::parse(&too_many), None);
    }
}
