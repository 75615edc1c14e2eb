//! Epochs: blocks freed while readers in other processes may still be
//! reading them wait in a limbo until every such reader has moved on
//! (docs/KERNEL-FREE.md, "Reading: no message at all").
//!
//! A reader (a client of the kernel-free path) pins for the length of each
//! call: one of its slot's pin words holds the global epoch it saw when the
//! call began, 0 when it is between calls. A slot has [`PINS_PER_SLOT`]
//! pin words, so that the threads of one client process pin at once, each
//! its own word (layout 3; before, one word per slot made a client one
//! thread's, and a process took a slot per thread). The owner tags each block it frees with the global
//! epoch and advances it. A reader pinned at E may hold a pointer to a
//! block freed with tag T only if it pinned before the free: E <= T. So a
//! block goes back to the free lists once every slot is 0 or later than its
//! tag. A reader catches up with the log after pinning (shared.rs), before
//! it looks at any block, so what it read between calls holds no pointer
//! the limbo must protect.
//!
//! The table holds atomics only, with a fixed layout, so that it can live
//! in memory shared between processes.
//!
//! It also holds each reader's **holds**: the inodes a client process has
//! open without the owner knowing (the preload library's placeholder
//! descriptors, docs/KERNEL-FREE.md "Unlinked files a process holds
//! open"). The owner does not free an unlinked inode any slot holds; the
//! holds of a slot are cleared when the owner releases it (the reader is
//! gone).

use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::Mutex;

thread_local! {
    /// The hold entry this thread took last: where its next scan for a
    /// free one starts (a hint only: any free entry is right).
    static LAST_HOLD: Cell<usize> = const { Cell::new(0) };
}

/// The table an engine holds its frees against: on the heap, or mapped
/// from memory shared with the readers (shm.rs).
pub type SharedTable = std::sync::Arc<dyn AsRef<EpochTable> + Send + Sync>;

/// Readers one table serves at most.
pub const READERS_MAX: usize = 64;

/// Pin words of one slot: threads of one reader pinned at once, each its
/// own word (more wait for a word: `api::client`).
pub const PINS_PER_SLOT: usize = 128;

/// Inodes one reader holds at most (a process: one slot for all its
/// threads).
pub const HOLDS_PER_SLOT: usize = 1024;

/// Bytes of an [`EpochTable`]: what a process mapping one another process
/// made (shm.rs) checks before it looks inside.
pub const TABLE_BYTES: usize = std::mem::size_of::<EpochTable>();
const _: () = assert!(
    TABLE_BYTES
        == 8 + READERS_MAX * 4
            + READERS_MAX * 4
            + READERS_MAX * PINS_PER_SLOT * 8
            + READERS_MAX * 4
            + READERS_MAX * HOLDS_PER_SLOT * 8
            + 2 * crate::blockdev::stamps::BUCKETS * 8
);
/// The table's layout, as the attach protocol names it: a client built
/// with another layout is refused rather than pinning the wrong word.
/// 2: the holds. 3: pin words per slot (a thread each). 4: the data
/// device's write stamps (blockdev/stamps.rs).
pub const TABLE_LAYOUT: u32 = 4;

/// The global epoch and one slot per reader.
#[repr(C)]
pub struct EpochTable {
    global: AtomicU64,
    /// 0: free; 1: taken by a reader.
    claimed: [AtomicU32; READERS_MAX],
    /// Per slot: one past the highest pin word its reader ever used (scans
    /// stop there).
    pins_top: [AtomicU32; READERS_MAX],
    /// Per slot and word: 0, not in a call; else the epoch a thread of the
    /// reader pinned.
    pinned: [[AtomicU64; PINS_PER_SLOT]; READERS_MAX],
    /// Per slot: one past the highest hold entry ever taken (scans stop
    /// there).
    holds_top: [AtomicU32; READERS_MAX],
    /// Per slot: inode numbers held (0: a free entry).
    holds: [[AtomicU64; HOLDS_PER_SLOT]; READERS_MAX],
    /// Announced writes of a hybrid pool's data device, which the DRAM
    /// caches of its blocks in every process check.
    dev_writes: crate::blockdev::stamps::WriteStamps,
}

impl Default for EpochTable {
    fn default() -> Self {
        EpochTable {
            // 0 means "not pinned": epochs start at 1.
            global: AtomicU64::new(1),
            claimed: std::array::from_fn(|_| AtomicU32::new(0)),
            pins_top: std::array::from_fn(|_| AtomicU32::new(0)),
            pinned: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
            holds_top: std::array::from_fn(|_| AtomicU32::new(0)),
            holds: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
            dev_writes: Default::default(),
        }
    }
}

impl EpochTable {
    /// A new table on the heap (built there: it is over half a MiB, too
    /// much for a thread's stack).
    pub fn new_shared() -> std::sync::Arc<EpochTable> {
        let layout = std::alloc::Layout::new::<EpochTable>();
        // SAFETY: a zeroed allocation of an EpochTable's layout (not zero
        // sized), owned by the Box from here on; an EpochTable is atomics
        // only, for which all-zero bytes are a value.
        let t: Box<EpochTable> = unsafe {
            let p = std::alloc::alloc_zeroed(layout).cast::<EpochTable>();
            if p.is_null() {
                std::alloc::handle_alloc_error(layout);
            }
            Box::from_raw(p)
        };
        t.start_zeroed();
        // Moved heap to heap (never through the stack).
        std::sync::Arc::from(t)
    }

    /// Make a table of all-zero bytes (a fresh shared mapping) a new table:
    /// every field is valid at 0 but the global epoch, which starts at 1.
    pub fn start_zeroed(&self) {
        self.global.store(1, SeqCst);
    }

    /// The data device's write stamps (blockdev/stamps.rs).
    pub fn dev_writes(&self) -> &crate::blockdev::stamps::WriteStamps {
        &self.dev_writes
    }

    /// A slot for a new reader, or None when all are taken.
    pub fn claim(&self) -> Option<ReaderSlot<'_>> {
        (0..READERS_MAX).find_map(|i| {
            self.claimed[i]
                .compare_exchange(0, 1, SeqCst, SeqCst)
                .ok()
                .map(|_| ReaderSlot { table: self, i })
        })
    }

    /// Claim a slot on behalf of a reader in another process (the server
    /// claims for the client it attaches, so that it knows which slot to
    /// release when the client dies, whatever the client says): its index,
    /// or None when all are taken. Released by [`EpochTable::release_slot`].
    pub fn claim_index(&self) -> Option<usize> {
        (0..READERS_MAX).find(|&i| {
            self.claimed[i]
                .compare_exchange(0, 1, SeqCst, SeqCst)
                .is_ok()
        })
    }

    /// Pin slot `i` (claimed for this reader by [`EpochTable::claim_index`])
    /// for one call, with its first word; None if `i` is out of range.
    pub fn pin_at(&self, i: usize) -> Option<Pin<'_>> {
        self.pin_word(i, 0)
    }

    /// Pin word `w` of slot `i` for one call (a thread of the slot's
    /// reader that owns that word; `api::client` hands them out); None if
    /// either is out of range.
    pub fn pin_word(&self, i: usize, w: usize) -> Option<Pin<'_>> {
        let word = self.pinned.get(i)?.get(w)?;
        // Scans of the slot reach this word from now on (a relaxed load
        // first: the top is raised once per word, not per call).
        if self.pins_top[i].load(Relaxed) <= w as u32 {
            self.pins_top[i].fetch_max(w as u32 + 1, SeqCst);
        }
        debug_assert_eq!(word.load(SeqCst), 0, "pins do not nest");
        word.store(self.global.load(SeqCst), SeqCst);
        CURRENT_PIN.with(|c| c.set(word as *const AtomicU64));
        Some(Pin { slot: word })
    }

    /// The global epoch now: a block freed now, tagged with it, may be
    /// held by a reader pinned at it or before.
    pub fn now(&self) -> u64 {
        self.global.load(SeqCst)
    }

    /// The oldest epoch any reader is pinned at but the calling thread's
    /// pin in slot `own` (the writer's slot), or `u64::MAX` when none is: a
    /// block tagged below it is out of every other reader's reach (a
    /// writer excludes its own pin: between its calls it holds no pointer,
    /// and within one it knows what it freed). Other threads of the
    /// writer's process count: they may be reading the blocks it
    /// displaced. So does a pin of this thread in another slot (a reader
    /// it also is), and, when its pins nest, its own (conservative).
    pub fn oldest_pinned_but_mine(&self, own: usize) -> u64 {
        let current = CURRENT_PIN.with(|c| c.get());
        let in_own = self
            .pinned
            .get(own)
            .is_some_and(|words| words.as_ptr_range().contains(&current));
        let mine = if in_own { current } else { std::ptr::null() };
        self.pin_words()
            .filter(|p| !std::ptr::eq(*p, mine))
            .map(|p| p.load(SeqCst))
            .filter(|&e| e != 0)
            .min()
            .unwrap_or(u64::MAX)
    }

    /// Every pin word a reader of a claimed slot may have used.
    fn pin_words(&self) -> impl Iterator<Item = &AtomicU64> {
        (0..READERS_MAX)
            .filter(|&i| self.claimed[i].load(SeqCst) != 0)
            .flat_map(|i| {
                let top = (self.pins_top[i].load(SeqCst) as usize).min(PINS_PER_SLOT);
                self.pinned[i][..top].iter()
            })
    }

    /// Slots claimed now.
    pub fn claimed_count(&self) -> usize {
        self.claimed.iter().filter(|c| c.load(SeqCst) != 0).count()
    }

    /// Release slot `i` of a reader that is gone without releasing it (a
    /// client the server reaped): its pin and its holds go.
    pub fn release_slot(&self, i: usize) {
        if i < READERS_MAX {
            for p in &self.pinned[i] {
                p.store(0, SeqCst);
            }
            self.pins_top[i].store(0, SeqCst);
            for h in &self.holds[i] {
                h.store(0, SeqCst);
            }
            self.holds_top[i].store(0, SeqCst);
            self.claimed[i].store(0, SeqCst);
        }
    }

    /// Slot `slot` holds inode `ino` (a reader about to use it without
    /// the owner knowing): the entry's index, or None when the slot's
    /// entries are all taken (or `ino` is 0). The reader must then check
    /// that the inode is still what it looked up, after this store (the
    /// SeqCst pairs with the owner's fence between its unlink and its
    /// [`EpochTable::held`]).
    pub fn hold(&self, slot: usize, ino: u64) -> Option<usize> {
        let entries = self.holds.get(slot)?;
        if ino == 0 {
            return None;
        }
        // From this thread's last entry (free again once its hold was let
        // go), not from entry 0 past every other thread's holds: a
        // process of 100 threads each holding a file read 13 cache lines
        // the other cores keep writing per hold. A load before each
        // exchange: taken entries are read, not written.
        let start = LAST_HOLD.with(Cell::get).min(entries.len());
        let i = (start..entries.len()).chain(0..start).find(|&i| {
            let e = &entries[i];
            e.load(Relaxed) == 0 && e.compare_exchange(0, ino, SeqCst, SeqCst).is_ok()
        })?;
        LAST_HOLD.with(|l| l.set(i));
        // The top only grows while the slot is claimed, so a top that
        // covers the entry needs no locked write of the word every
        // holding thread of the process shares. The SeqCst load after the
        // exchange orders as the fetch_max did: an owner whose `held`
        // read a top below `i + 1` read it before the write that raised
        // it, hence before this load, and its unlink (fenced before that
        // read) is what the caller's check after this store sees.
        let top = &self.holds_top[slot];
        if top.load(SeqCst) <= i as u32 {
            top.fetch_max(i as u32 + 1, SeqCst);
        }
        Some(i)
    }

    /// Entry `i` of slot `slot`, holding `ino`, is let go.
    pub fn unhold(&self, slot: usize, i: usize, ino: u64) {
        if let Some(e) = self.holds.get(slot).and_then(|s| s.get(i)) {
            let _ = e.compare_exchange(ino, 0, SeqCst, SeqCst);
        }
    }

    /// Whether any claimed slot holds inode `ino` (the owner, after a full
    /// fence that follows the store that unlinked it).
    pub fn held(&self, ino: u64) -> bool {
        (0..READERS_MAX).any(|s| {
            if self.claimed[s].load(SeqCst) == 0 {
                return false;
            }
            let top = (self.holds_top[s].load(SeqCst) as usize).min(HOLDS_PER_SLOT);
            self.holds[s][..top].iter().any(|e| e.load(SeqCst) == ino)
        })
    }

    /// The oldest epoch a reader is pinned at, or None when none is. A
    /// slot released meanwhile is skipped: its reader is gone (its words
    /// were cleared before its claim).
    fn oldest_pinned(&self) -> Option<u64> {
        self.pin_words()
            .map(|p| p.load(SeqCst))
            .filter(|&e| e != 0)
            .min()
    }
}

impl AsRef<EpochTable> for EpochTable {
    fn as_ref(&self) -> &EpochTable {
        self
    }
}

/// A reader's slot; released when dropped.
pub struct ReaderSlot<'a> {
    table: &'a EpochTable,
    i: usize,
}

impl ReaderSlot<'_> {
    pub fn index(&self) -> usize {
        self.i
    }

    /// Pin for one call: blocks freed from now on stay allocated until the
    /// guard is dropped.
    pub fn pin(&self) -> Pin<'_> {
        self.table
            .pin_word(self.i, 0)
            .expect("a claimed slot's first word")
    }
}

impl Drop for ReaderSlot<'_> {
    fn drop(&mut self) {
        self.table.release_slot(self.i);
    }
}

/// A pinned call; unpins when dropped.
pub struct Pin<'a> {
    slot: &'a AtomicU64,
}

thread_local! {
    /// The pin word this thread pinned last (null: none yet), for
    /// [`EpochTable::oldest_pinned_but_mine`]; cleared at the unpin.
    static CURRENT_PIN: std::cell::Cell<*const AtomicU64> =
        const { std::cell::Cell::new(std::ptr::null()) };
}

impl Drop for Pin<'_> {
    fn drop(&mut self) {
        CURRENT_PIN.with(|c| c.set(std::ptr::null()));
        // Release, not SeqCst: nothing this thread does later must wait for
        // the unpin to be seen (a reclaimer that still sees the pin only
        // holds blocks a little longer), and a SeqCst store is a locked
        // exchange on every served call. The pin itself stays SeqCst: the
        // reads that follow it must not pass it.
        self.slot.store(0, std::sync::atomic::Ordering::Release);
    }
}

/// Blocks freed while readers may hold them: (start, len, tag).
#[derive(Default)]
pub struct Limbo {
    waiting: Mutex<VecDeque<(u64, u64, u64)>>,
}

impl Limbo {
    /// Hold `len` blocks at `start` until no reader can hold them.
    pub fn hold(&self, table: &EpochTable, start: u64, len: u64) {
        let tag = table.global.fetch_add(1, SeqCst);
        crate::inode::lock(&self.waiting).push_back((start, len, tag));
    }

    /// Hand every block no reader can hold any more to `free` (oldest
    /// first: tags only grow).
    pub fn reclaim(&self, table: &EpochTable, mut free: impl FnMut(u64, u64)) {
        let oldest = table.oldest_pinned();
        let mut waiting = crate::inode::lock(&self.waiting);
        while let Some(&(start, len, tag)) = waiting.front() {
            if oldest.is_some_and(|e| e <= tag) {
                break;
            }
            waiting.pop_front();
            free(start, len);
        }
    }

    /// Hand every waiting block to `free`, readers or not (unmount: the
    /// readers are gone with the mount).
    pub fn drain(&self, mut free: impl FnMut(u64, u64)) {
        for (start, len, _) in crate::inode::lock(&self.waiting).drain(..) {
            free(start, len);
        }
    }

    /// Blocks waiting.
    pub fn blocks(&self) -> u64 {
        crate::inode::lock(&self.waiting).iter().map(|w| w.1).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_are_seen_while_claimed_and_go_with_the_slot() {
        let t = EpochTable::new_shared();
        let a = t.claim_index().unwrap();
        let b = t.claim_index().unwrap();
        assert!(!t.held(7));
        let i = t.hold(a, 7).unwrap();
        let j = t.hold(a, 9).unwrap();
        assert_ne!(i, j);
        assert!(t.held(7) && t.held(9));
        t.unhold(a, i, 8); // not what it holds: nothing changes
        assert!(t.held(7));
        t.unhold(a, i, 7);
        assert!(!t.held(7));
        assert_eq!(t.hold(a, 0), None);
        for n in 0..HOLDS_PER_SLOT as u64 - 1 {
            assert!(t.hold(b, 1000 + n).is_some());
        }
        assert!(t.hold(b, 5000).is_some(), "the last entry");
        assert_eq!(t.hold(b, 5001), None, "full");
        t.release_slot(a);
        assert!(!t.held(9), "a released slot's holds are gone");
        assert!(t.held(5000));
        t.release_slot(b);
        assert!(!t.held(5000));
        assert_eq!(t.hold(99, 1), None, "no such slot");
    }

    #[test]
    fn a_thread_reuses_its_entry_and_its_holds_are_seen_wherever_its_scan_starts() {
        let t = EpochTable::new_shared();
        let a = t.claim_index().unwrap();
        // This thread's scan starts at its last entry: let it be a high one.
        let low: Vec<usize> = (0..600).map(|n| t.hold(a, 100 + n).unwrap()).collect();
        let high = t.hold(a, 7).unwrap();
        for (n, &i) in low.iter().enumerate() {
            t.unhold(a, i, 100 + n as u64);
        }
        t.unhold(a, high, 7);
        assert_eq!(t.hold(a, 8), Some(high), "the entry it let go, not entry 0");
        assert!(t.held(8));
        // A slot claimed afresh has its top at 0: a hold from the same
        // high start must raise it, or the owner would not see it.
        t.release_slot(a);
        let b = t.claim_index().unwrap();
        let i = t.hold(b, 9).unwrap();
        assert!(i >= high, "the scan started at the hint: {i}");
        assert!(t.held(9), "a hold above a reset top is seen");
        t.release_slot(b);
    }

    #[test]
    fn a_pinned_reader_holds_what_was_freed_after_it_pinned() {
        let t = EpochTable::new_shared();
        let limbo = Limbo::default();
        let reader = t.claim().unwrap();
        let mut freed = Vec::new();
        limbo.hold(&t, 10, 1); // before any pin: free at once
        limbo.reclaim(&t, |s, _| freed.push(s));
        assert_eq!(freed, [10]);
        let pin = reader.pin();
        limbo.hold(&t, 20, 1);
        limbo.reclaim(&t, |s, _| freed.push(s));
        assert_eq!(freed, [10], "held while the reader that could see it is pinned");
        let late = t.claim().unwrap();
        let late_pin = late.pin();
        drop(pin);
        limbo.reclaim(&t, |s, _| freed.push(s));
        assert_eq!(freed, [10, 20], "a reader pinned after the free does not hold it");
        drop(late_pin);
        drop(late);
        drop(reader);
        assert!(t.claim().is_some());
    }
}
