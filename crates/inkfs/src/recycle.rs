//! A client's recycled blocks: the blocks a lease holder's copy-on-write
//! overwrites and truncates displace from an inode, kept for that inode's
//! next overwrites and appends instead of going back to the server
//! (docs/KERNEL-FREE.md, "Built: write leases", Reservation).
//!
//! Why: a strict-mode overwrite writes a fresh block and frees the old
//! one. Sent back, every freed block cost the server a message's share of
//! work (its books, its limbo, its allocator: ~2.5 µs of server CPU per
//! random 4 KiB overwrite, measured), and the client's next reservation
//! brought blocks its mapping had never touched (a page fault or a
//! populate per page). Kept, an overwrite loop cycles through the same few
//! hundred blocks, already mapped and already in the books; an
//! append-and-truncate loop (a log, a WAL) appends on the blocks its last
//! truncate cut.
//!
//! Why per inode: the server's books of a lease are "the blocks the inode
//! referred to at the grant" and "the blocks reserved for the client". A
//! block displaced from inode X and reused by X is either referred to by X
//! at the settling (fine: it stays X's) or displaced again and returned
//! (fine: it was X's). Reused by another inode Y, the settling of X would
//! free it while Y refers to it. So each inode keeps its own list, in its
//! DRAM state, and the list goes back to the server with the lease
//! (`Fs::client_release_inode`).
//!
//! Readers: another process pinned before the commit that displaced a
//! block may still read it. Each block is tagged with the global epoch at
//! its free (after a full fence: the commit's tail is visible first), and
//! is reused only once no other slot is pinned at or below its tag
//! (`EpochTable::oldest_pinned_but_mine`: another reader is any pin
//! word but the writing thread's own, its process's other threads too), checked once per batch.
//!
//! Crash: nothing here is on media. A displaced block is free once the
//! commit that displaced it is durable (strict and sync commits end with a
//! fence; clients are refused in posix mode), so reusing it is what the
//! engine's own allocator does with a freed block.

use std::collections::VecDeque;

/// Blocks one inode keeps at most; displaced blocks past it go back to the
/// server as before (a truncate or a large overwrite frees more than the
/// next overwrites need).
pub const RECYCLE_BLOCKS_MAX: u64 = 4096;

/// Blocks waiting before a scan of the epoch table is worth it: reuse
/// starts once this many are waiting, and each scan then frees a batch
/// (the crash simulator's client sequence uses 1, so that its few
/// overwrites reuse blocks).
pub const RECYCLE_BATCH_BLOCKS: u64 = 64;

/// One inode's recycled blocks (a client's DRAM state, never on media).
#[derive(Debug, Default)]
pub struct Recycled {
    /// Freed and tagged: (start, len, tag), oldest first (tags grow).
    waiting: VecDeque<(u64, u64, u64)>,
    waiting_blocks: u64,
    /// Out of every other reader's reach: (start, len), oldest first.
    ready: VecDeque<(u64, u64)>,
    ready_blocks: u64,
}

impl Recycled {
    /// Blocks held (waiting and ready).
    pub fn blocks(&self) -> u64 {
        self.waiting_blocks + self.ready_blocks
    }

    pub fn is_empty(&self) -> bool {
        self.blocks() == 0
    }

    /// Keep the first blocks of `[start, start + len)`, freed at epoch
    /// `tag`, as many as fit under [`RECYCLE_BLOCKS_MAX`]: how many were
    /// kept (the caller frees the rest as before). A truncate frees whole
    /// extents, often longer than the room left: keeping part of one is
    /// what lets the appends after it run on mapped blocks.
    pub fn keep(&mut self, start: u64, len: u64, tag: u64) -> u64 {
        debug_assert!(len > 0);
        let len = len.min(RECYCLE_BLOCKS_MAX.saturating_sub(self.blocks()));
        if len == 0 {
            return 0;
        }
        debug_assert!(self.waiting.back().is_none_or(|w| w.2 <= tag), "tags grow");
        match self.waiting.back_mut() {
            // A sequential overwrite frees block after block.
            Some((s, l, t)) if *t == tag && *s + *l == start => *l += len,
            _ => self.waiting.push_back((start, len, tag)),
        }
        self.waiting_blocks += len;
        len
    }

    /// Whether a scan of the epoch table should come before the next take
    /// (`batch` blocks or more waiting, none ready).
    pub fn wants_scan(&self, batch: u64) -> bool {
        self.ready.is_empty() && self.waiting_blocks >= batch.max(1)
    }

    /// After a scan: every waiting block tagged below `oldest` (the oldest
    /// epoch another reader is pinned at) is ready.
    pub fn promote(&mut self, oldest: u64) {
        while let Some(&(start, len, tag)) = self.waiting.front() {
            if tag >= oldest {
                break;
            }
            self.waiting.pop_front();
            self.waiting_blocks -= len;
            self.ready.push_back((start, len));
            self.ready_blocks += len;
        }
    }

    /// Up to `want` ready blocks, contiguous: (start, len), or None.
    pub fn take(&mut self, want: u64) -> Option<(u64, u64)> {
        debug_assert!(want > 0);
        let (start, len) = self.ready.front_mut()?;
        let got = want.min(*len);
        let at = *start;
        if got == *len {
            self.ready.pop_front();
        } else {
            *start += got;
            *len -= got;
        }
        self.ready_blocks -= got;
        Some((at, got))
    }

    /// Every block held, for the server (the lease goes).
    pub fn drain(&mut self, mut free: impl FnMut(u64, u64)) {
        for (start, len, _) in self.waiting.drain(..) {
            free(start, len);
        }
        for (start, len) in self.ready.drain(..) {
            free(start, len);
        }
        self.waiting_blocks = 0;
        self.ready_blocks = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_wait_for_readers_then_come_back_in_order() {
        let mut r = Recycled::default();
        assert_eq!(r.keep(100, 1, 5), 1);
        assert_eq!(r.keep(101, 1, 5), 1, "adjacent, same tag: merged");
        assert_eq!(r.keep(200, 62, 6), 62);
        assert_eq!(r.blocks(), 64);
        assert!(r.wants_scan(RECYCLE_BATCH_BLOCKS));
        assert_eq!(r.take(1), None, "nothing ready before a scan");
        // A reader pinned at 6 may hold what was freed at 6.
        r.promote(6);
        assert!(!r.wants_scan(RECYCLE_BATCH_BLOCKS), "some are ready");
        assert_eq!(r.take(1), Some((100, 1)));
        assert_eq!(r.take(8), Some((101, 1)), "one contiguous run at a time");
        assert_eq!(r.take(1), None);
        assert!(!r.wants_scan(RECYCLE_BATCH_BLOCKS), "62 waiting: below a batch");
        assert!(r.wants_scan(62));
        assert_eq!(r.keep(300, 2, 7), 2);
        r.promote(u64::MAX);
        assert_eq!(r.take(100), Some((200, 62)));
        assert_eq!(r.take(100), Some((300, 2)));
        assert!(r.is_empty());
    }

    #[test]
    fn a_full_list_keeps_what_fits_and_drain_gives_everything_back() {
        let mut r = Recycled::default();
        assert_eq!(r.keep(1000, RECYCLE_BLOCKS_MAX - 1, 1), RECYCLE_BLOCKS_MAX - 1);
        assert_eq!(r.keep(9000, 2, 2), 1, "only what fits under the bound");
        assert_eq!(r.keep(9001, 1, 2), 0, "full");
        assert_eq!(r.blocks(), RECYCLE_BLOCKS_MAX);
        r.promote(2);
        assert_eq!(r.take(10), Some((1000, 10)));
        let mut back = Vec::new();
        r.drain(|s, l| back.push((s, l)));
        assert_eq!(back, [(9000, 1), (1010, RECYCLE_BLOCKS_MAX - 11)]);
        assert!(r.is_empty());
    }
}
