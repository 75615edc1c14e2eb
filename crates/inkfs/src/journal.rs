//! The lite redo journal: makes several 8-byte stores (log tails, inode
//! states and flags) atomic, for operations that touch more than one inode
//! or more than one field of an inode record.
//!
//! Protocol (docs/FORMAT.md "Redo journal"), for one lane's journal block:
//! 1. the log entries of every inode involved are already written past
//!    their tails and flushed; write the redo records and the sequence
//!    number, flush — **fence**. A crash here: no commit word, nothing
//!    happened (entries past old tails are ignored).
//! 2. store the commit word (record count + crc32c of seq and records),
//!    flush — **fence**. This is the commit point: after it, recovery
//!    replays the records.
//! 3. apply the records (8-byte atomic stores), flush — **fence**. A crash
//!    here is repaired by replaying (the stores are idempotent).
//! 4. clear the commit word, flush — **fence**. Must be durable before any
//!    applied field changes again, or a replay would roll it back.

use crate::error::{Error, Result};
use crate::format::*;
use crate::pmem::{read_pod, Pmem};
use crate::superblock::Geometry;

/// One lane's journal (used under that lane's mutex).
#[derive(Debug)]
pub struct Journal {
    /// Byte offset of the journal block.
    off: u64,
    seq: u64,
}

impl Journal {
    pub fn open<P: Pmem + ?Sized>(pm: &P, lane: u32) -> Journal {
        let off = (lane_first_block(lane) + LANE_JOURNAL_BLOCK) * BLOCK_SIZE;
        let header: JournalHeader = read_pod(pm, off);
        Journal {
            off,
            seq: header.seq,
        }
    }

    /// Apply `records` atomically (all or none survive a crash).
    pub fn commit<P: Pmem + ?Sized>(&mut self, pm: &P, records: &[JournalRecord]) {
        debug_assert!(!records.is_empty() && records.len() <= JOURNAL_MAX_RECORDS);
        debug_assert!(records
            .iter()
            .all(|r| r.offset % 8 == 0 && r.offset + 8 <= pm.size_bytes()));
        debug_assert_eq!(pm.read_u64(self.off + 8), 0, "journal busy");
        // The sequence only salts the crc: any value is valid, so it wraps.
        let seq = self.seq.wrapping_add(1);
        let rec_off = self.off + std::mem::size_of::<JournalHeader>() as u64;
        for (i, r) in records.iter().enumerate() {
            pm.write(rec_off + i as u64 * 16, r.as_bytes());
        }
        pm.write_u64(self.off, seq);
        pm.flush(rec_off, records.len() as u64 * 16);
        pm.flush(self.off, 8);
        pm.fence();

        let crc = journal_crc(seq, records);
        pm.write_u64(self.off + 8, journal_commit_word(records.len() as u32, crc));
        pm.persist(self.off + 8, 8);

        apply(pm, records);

        pm.write_u64(self.off + 8, 0);
        pm.persist(self.off + 8, 8);
        self.seq = seq;
    }
}

fn apply<P: Pmem + ?Sized>(pm: &P, records: &[JournalRecord]) {
    for r in records {
        pm.write_u64(r.offset, r.value);
        pm.flush(r.offset, 8);
    }
    pm.fence();
}

/// Write lane `lane`'s journal block back as it reads now, and fence: a
/// journal taken from a dead client (lanelease.rs), whose commit word may
/// be visible but not durable (killed between its store and that line's
/// write-back). Replaying records whose commit is not durable would let a
/// power cut keep some of them and lose the commit that makes the rest.
pub fn persist_block<P: Pmem + ?Sized>(pm: &P, lane: u32) {
    let off = (lane_first_block(lane) + LANE_JOURNAL_BLOCK) * BLOCK_SIZE;
    let len = std::mem::size_of::<JournalHeader>() as u64 + JOURNAL_MAX_RECORDS as u64 * 16;
    pm.flush(off, len);
    pm.fence();
}

/// What recovery found in one journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JournalState {
    Empty,
    /// A committed transaction was replayed.
    Replayed {
        records: u32,
    },
    /// A commit word whose crc does not match: the transaction never
    /// committed (torn commit) and was discarded.
    Discarded,
}

/// What a lane's journal block holds (recovery and fsck read it alike).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pending {
    /// The commit word is zero.
    Empty,
    /// A commit word whose count is out of range (1 ..=
    /// `JOURNAL_MAX_RECORDS`) or whose crc does not match: not a commit.
    Torn,
    /// A committed transaction's records.
    Committed(Vec<JournalRecord>),
}

/// Read lane `lane`'s journal block.
pub fn pending<P: Pmem + ?Sized>(pm: &P, lane: u32) -> Pending {
    let off = (lane_first_block(lane) + LANE_JOURNAL_BLOCK) * BLOCK_SIZE;
    let header: JournalHeader = read_pod(pm, off);
    if header.commit == 0 {
        return Pending::Empty;
    }
    let count = (header.commit & 0xffff_ffff) as usize;
    let crc = (header.commit >> 32) as u32;
    if count == 0 || count > JOURNAL_MAX_RECORDS {
        return Pending::Torn;
    }
    let rec_off = off + std::mem::size_of::<JournalHeader>() as u64;
    let records: Vec<JournalRecord> = (0..count)
        .map(|i| read_pod(pm, rec_off + i as u64 * 16))
        .collect();
    if journal_crc(header.seq, &records) != crc {
        return Pending::Torn;
    }
    Pending::Committed(records)
}

/// Why committed record `r` may not be applied, if it may not: it must
/// store into the state, head, tail or flags field of an inode record
/// (`is_record_field` vets the target) a value that field can hold: a
/// known state, a head naming a log page or chunk of the data area, a tail `Geometry::is_log_tail`
/// accepts, known flag bits.
pub fn check_record(
    r: &JournalRecord,
    geo: &Geometry,
    is_record_field: impl Fn(u64) -> bool,
) -> std::result::Result<(), String> {
    if !is_record_field(r.offset) {
        return Err(format!(
            "record targets offset {} outside any inode record",
            r.offset
        ));
    }
    let (field, ok) = match r.offset % INODE_RECORD_SIZE {
        INODE_STATE_FIELD => ("state", inode_state_valid(r.value)),
        INODE_HEAD_FIELD => ("log head", geo.is_log_page(r.value)),
        INODE_TAIL_FIELD => ("log tail", geo.is_log_tail(r.value)),
        INODE_FLAGS_FIELD => ("flags", r.value & !(inode_flags::KNOWN as u64) == 0),
        _ => {
            return Err(format!(
                "record targets offset {}, not a state, head, tail or flags field",
                r.offset
            ))
        }
    };
    if !ok {
        return Err(format!(
            "record sets the {field} at offset {} to {}, out of range",
            r.offset, r.value
        ));
    }
    Ok(())
}

/// Replay or discard lane `lane`'s journal. Every record is vetted first
/// (`check_record`, with `valid_offset` vetting its target): one out of
/// range refuses the pool before anything is applied.
pub fn recover<P: Pmem + ?Sized>(
    pm: &P,
    geo: &Geometry,
    lane: u32,
    read_only: bool,
    valid_offset: impl Fn(u64) -> bool,
) -> Result<JournalState> {
    let state = match pending(pm, lane) {
        Pending::Empty => return Ok(JournalState::Empty),
        Pending::Torn => JournalState::Discarded,
        Pending::Committed(records) => {
            for r in &records {
                check_record(r, geo, &valid_offset)
                    .map_err(|m| Error::Corrupt(format!("lane {lane} journal: {m}")))?;
            }
            if !read_only {
                apply(pm, &records);
            }
            JournalState::Replayed {
                records: records.len() as u32,
            }
        }
    };
    if !read_only {
        let off = (lane_first_block(lane) + LANE_JOURNAL_BLOCK) * BLOCK_SIZE;
        pm.write_u64(off + 8, 0);
        pm.persist(off + 8, 8);
    }
    Ok(state)
}
