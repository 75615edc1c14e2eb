//! When a client asks for a directory's lease (docs/KERNEL-FREE.md, "When
//! a client asks", and "Built: the library asks for directory leases").
//!
//! Adaptive, per directory: after `k` namespace requests in D made
//! through the ring since D's last lease ended (`k` = [`ASK_AFTER_MIN`]
//! to start), the next request in D carries `+dir`; the lease comes with
//! its answer, so asking costs no round trip of its own. A lease of D
//! that the server recalled doubles D's `k` (up to [`ASK_AFTER_MAX`]): a
//! directory the mount or another process keeps touching stays on the
//! ring. One that ended by the client's own give-back halves it again.
//! Only the requests the client would make itself under the lease are
//! counted and ask (creates: see [`made_under_lease`]'s reasons).
//! A recall that the client's own request caused (a ring request in D
//! while it held D: a rename, an rmdir, a removal it does not make
//! itself, an open of an existing name with O_CREAT) counts as a recall:
//! it costs the same round trips and the lane's hand-over, and a
//! directory the client keeps changing through the ring gains nothing
//! from its lease. A refusal starts the count again (the next ask after
//! `k` more requests).
//!
//! The policy lives in the API client, not in the preload library: the
//! client is the one that sees the outcome of each lease (its book,
//! `super::super::dirlease`, takes the recalls and the give-backs), and
//! every user of [`Client::ns_adaptive`] (the library, a program on the
//! Rust API) gets the same rule. The C ABI (crates/inkfs-capi) opens the
//! pool as its owner and has no leases to ask for.
//!
//! The counters are a small fixed table in the client's process
//! ([`SLOTS`] words, two ways per directory): no system call, no lock,
//! no allocation on the request's path, and memory that does not grow
//! with the directories a process ever touches. A directory that finds
//! both its ways taken by directories whose leases are held is not
//! counted (it asks nothing until one of them ends); an idle one evicts a
//! way, forgetting that directory's `k` (it starts at 4 again). Each way
//! is one word changed by compare-and-swap, so two threads counting the
//! same directory lose no count; the table is a heuristic, and a race
//! between a lease's end and a new request only moves an ask by one
//! request.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};

use super::{Client, Msg};
use crate::api::ns;
use crate::error::Result;
use crate::perm::Credentials;

/// Requests through the ring in D before the first ask, and `k`'s floor.
pub const ASK_AFTER_MIN: u32 = 4;
/// `k`'s ceiling, reached after six recalls in a row.
pub const ASK_AFTER_MAX: u32 = 256;
/// Words in the table (a directory may sit in two of them).
pub const SLOTS: usize = 64;

// A word: the directory's inode number's low TAG_BITS bits (a directory
// whose number is beyond them shares its counts with another, which only
// moves an ask), then the count, then the flags, then log2(k).
const TAG_BITS: u32 = 40;
const TAG_MASK: u64 = (1 << TAG_BITS) - 1;
const COUNT_SHIFT: u32 = TAG_BITS;
const COUNT_MAX: u64 = 0xfff;
const HELD: u64 = 1 << 52;
const K_SHIFT: u32 = 56;
const K_LOG_MIN: u64 = ASK_AFTER_MIN.trailing_zeros() as u64;
const K_LOG_MAX: u64 = ASK_AFTER_MAX.trailing_zeros() as u64;
const _: () = assert!(ASK_AFTER_MIN.is_power_of_two() && ASK_AFTER_MAX.is_power_of_two());
const _: () = assert!(COUNT_MAX >= ASK_AFTER_MAX as u64);
const _: () = assert!(COUNT_SHIFT + 12 <= 52 && K_LOG_MAX < 16);
const _: () = assert!(SLOTS.is_power_of_two() && SLOTS >= 2);

/// How a lease of D ended, for [`AskTable::ended`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// The server recalled it.
    Recalled,
    /// The client gave it back on its own (the detach).
    GivenBack,
}

/// One directory's counters, unpacked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Way {
    tag: u64,
    count: u64,
    held: bool,
    k_log: u64,
}

impl Way {
    fn new(tag: u64) -> Way {
        Way {
            tag,
            count: 0,
            held: false,
            k_log: K_LOG_MIN,
        }
    }

    fn unpack(w: u64) -> Option<Way> {
        if w == 0 {
            return None;
        }
        Some(Way {
            tag: w & TAG_MASK,
            count: (w >> COUNT_SHIFT) & COUNT_MAX,
            held: w & HELD != 0,
            k_log: (w >> K_SHIFT).clamp(K_LOG_MIN, K_LOG_MAX),
        })
    }

    fn pack(self) -> u64 {
        debug_assert!(self.tag <= TAG_MASK && self.count <= COUNT_MAX);
        debug_assert!((K_LOG_MIN..=K_LOG_MAX).contains(&self.k_log));
        // k_log ≥ 2: a used way is never the empty word 0.
        self.tag
            | self.count << COUNT_SHIFT
            | if self.held { HELD } else { 0 }
            | self.k_log << K_SHIFT
    }
}

/// The per-directory counters of one client (see the module comment).
pub struct AskTable {
    ways: [AtomicU64; SLOTS],
}

impl Default for AskTable {
    fn default() -> Self {
        AskTable {
            ways: [const { AtomicU64::new(0) }; SLOTS],
        }
    }
}

impl AskTable {
    /// The two ways directory `dir` may sit in, and its tag.
    fn ways_of(&self, dir: u64) -> ([&AtomicU64; 2], u64) {
        let tag = dir & TAG_MASK;
        // Fibonacci hashing: neighbouring inode numbers spread.
        let h = (dir.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as usize & (SLOTS - 1);
        ([&self.ways[h], &self.ways[h ^ 1]], tag)
    }

    /// Change `dir`'s way with `f` (from its current state, or a fresh
    /// one in a way it may take when `insert`): the new state, or None if
    /// `dir` has no way (absent and not inserted, or both ways held by
    /// others).
    fn update(&self, dir: u64, insert: bool, mut f: impl FnMut(Way) -> Way) -> Option<Way> {
        let (ways, tag) = self.ways_of(dir);
        loop {
            let now = ways.map(|w| w.load(Relaxed));
            let mine = (0..2).find(|&i| Way::unpack(now[i]).is_some_and(|w| w.tag == tag));
            let (i, old) = match mine {
                Some(i) => (i, Way::unpack(now[i])?),
                None if !insert => return None,
                None => {
                    // An empty way first, else one whose lease is not held
                    // (its directory forgets its k).
                    let free = (0..2)
                        .find(|&i| now[i] == 0)
                        .or_else(|| (0..2).find(|&i| Way::unpack(now[i]).is_some_and(|w| !w.held)));
                    (free?, Way::new(tag))
                }
            };
            let new = f(old);
            debug_assert_eq!(new.tag, tag);
            if ways[i]
                .compare_exchange(now[i], new.pack(), Relaxed, Relaxed)
                .is_ok()
            {
                return Some(new);
            }
        }
    }

    /// A namespace request in `dir` goes through the ring: whether it asks
    /// for `dir`'s lease (`+dir`). Counted when `dir`'s lease is not held
    /// (when it is, the request recalls it: the recall is counted).
    pub fn ring_request(&self, dir: u64) -> bool {
        let mut ask = false;
        self.update(dir, true, |mut w| {
            ask = false;
            if w.held {
                // Nothing: the recall ends it.
            } else if w.count >= 1 << w.k_log {
                ask = true;
            } else {
                w.count += 1;
            }
            w
        });
        ask
    }

    /// The answer to an ask of `dir`: granted (held now) or not; either
    /// way the count starts again.
    pub fn answered(&self, dir: u64, granted: bool) {
        self.update(dir, granted, |mut w| {
            w.count = 0;
            w.held = granted;
            w
        });
    }

    /// A lease of `dir` (held, or asked for and recalled before its
    /// answer) ended: `k` doubles after a recall, halves after a
    /// give-back; the count starts again.
    pub fn ended(&self, dir: u64, how: Ended) {
        self.update(dir, how == Ended::Recalled, |mut w| {
            w.k_log = if how == Ended::Recalled {
                (w.k_log + 1).min(K_LOG_MAX)
            } else {
                w.k_log.saturating_sub(1).max(K_LOG_MIN)
            };
            w.count = 0;
            w.held = false;
            w
        });
    }

    /// Directory `dir` was just made by this client under its parent's
    /// lease (`super::mkdir`): its first request through the ring asks
    /// (the count starts at `k`, `k` at its floor: a way left by an older
    /// inode of the same number is forgotten). A directory made and then
    /// filled is tar's: without this, its first [`ASK_AFTER_MIN`] creates
    /// went through the ring, and one of four files or fewer never asked.
    pub fn born(&self, dir: u64) {
        self.update(dir, true, |w| Way {
            count: 1 << K_LOG_MIN,
            ..Way::new(w.tag)
        });
    }

    /// `dir`'s `k` now (for tests and statistics; [`ASK_AFTER_MIN`] when
    /// not in the table).
    pub fn ask_after(&self, dir: u64) -> u32 {
        let (ways, tag) = self.ways_of(dir);
        ways.iter()
            .filter_map(|w| Way::unpack(w.load(Relaxed)))
            .find(|w| w.tag == tag)
            .map_or(ASK_AFTER_MIN, |w| 1 << w.k_log)
    }
}

/// Whether the client would make a request like `op` itself under its
/// directory's lease: only those are counted, and only they ask. Creates,
/// mkdirs (`super::mkdir`), and the unlinks of files whose write lease
/// the client holds (`gives`: the request carries the file's give-back):
/// under D's lease those are made here (`super::remove`, rule 3 of
/// docs/KERNEL-FREE.md "Removals"), a delete loop of the files a process
/// wrote (fileserver's, varmail's). An unlink of a file the client does
/// not hold (`rm -rf` of a tree another process wrote) is the server's
/// under the lease too, and recalls it: asking with it would cost a
/// grant, a lane and a recall per directory and gain nothing, so it is
/// not counted (measured: docs/KERNEL-FREE.md, "Built: mkdir under a
/// directory lease"). A rename, rmdir or attribute change through the
/// ring is not counted either (a leased directory's own setattr is made
/// here without the ring: `super::attr`).
fn made_under_lease(op: &ns::Op, gives: bool) -> bool {
    match op {
        ns::Op::Create { .. } | ns::Op::Mkdir { .. } => true,
        ns::Op::Unlink { .. } => gives,
        _ => false,
    }
}

impl Client {
    /// [`Client::ns`], asking for the lease of the request's directory by
    /// the adaptive rule (see the module comment): a create in a directory
    /// whose lease it holds is made here; nothing is asked of a server
    /// whose grant did not say `dirs=1`.
    pub fn ns_adaptive(&self, cred: &Credentials, op: ns::Op) -> Result<ns::Done> {
        self.ns_asking(cred, op, super::Ask::Adaptive)
    }

    /// Send `op` with `+dir` (and `+lane` if the server leases lanes)
    /// whatever this client's book says, and take nothing of the answer
    /// into the book: a raw client's ask, for tests of the server's
    /// answer to an ask the book would not send (a second ask by the
    /// holder of the lease, which the server must answer at once).
    #[doc(hidden)]
    pub fn ns_ask_unchecked(&self, cred: &Credentials, op: ns::Op) -> Result<ns::Done> {
        let seq = self.seq.fetch_add(1, SeqCst) + 1;
        let req = ns::Request {
            seq,
            cred: cred.clone(),
            op,
            give: Vec::new(),
            dir_lease: true,
            lane_lease: self.grant.lanes,
        };
        match self.ask(&Msg::Ns(req))? {
            Msg::Done(d) if d.seq == seq => Ok(d),
            other => Err(super::protocol_error(&other)),
        }
    }

    /// Give back every directory lease this client holds, and with the
    /// last its lane (`super::super::dirlease`), as the client's end does:
    /// for a process about to exit (the preload library's exit hook), so
    /// the server settles them from the client's `released` lines instead
    /// of reaping the session (reading the lane's journal and the logs of
    /// the files made under it). Nothing in a forked child's copy of its
    /// parent's client (the leases are the parent's). The client stays
    /// usable: a later create asks again by the adaptive rule.
    pub fn give_back_dirs(&self) {
        if std::process::id() != self.pid {
            return;
        }
        for (dir, gen) in self.shared.dirs.drain() {
            self.shared.give_back_dir(dir, gen);
        }
    }

    /// Directory `dir`'s `k`: ring requests in it before the next ask.
    pub fn dir_ask_after(&self, dir: u64) -> u32 {
        self.shared.dirs.asks().ask_after(dir)
    }

    /// Whether the request `req` (going through the ring) asks for its
    /// directory's lease under `how`.
    pub(super) fn asks_dir(&self, how: super::Ask, req: &ns::Request) -> Option<u64> {
        let dir = req.dir()?;
        match how {
            super::Ask::Never => None,
            super::Ask::Always => Some(dir).filter(|_| self.grant.dirs),
            super::Ask::Adaptive
                if !self.grant.dirs || !made_under_lease(&req.op, !req.give.is_empty()) =>
            {
                None
            }
            super::Ask::Adaptive => Some(dir).filter(|&d| self.shared.dirs.asks().ring_request(d)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// k ring requests, then an ask; a recall doubles k up to 256, a
    /// give-back halves it down to 4.
    #[test]
    fn asks_after_k_requests_and_k_follows_how_leases_end() {
        let t = AskTable::default();
        let asks_at = |t: &AskTable, d: u64| (1..=600).find(|_| t.ring_request(d)).unwrap_or(0);
        assert_eq!(asks_at(&t, 7), 5, "the fifth request asks");
        t.answered(7, true);
        assert!(!t.ring_request(7), "held: no ask");
        t.ended(7, Ended::Recalled);
        assert_eq!(t.ask_after(7), 8);
        assert_eq!(asks_at(&t, 7), 9);
        for k in [16, 32, 64, 128, 256, 256] {
            t.answered(7, true);
            t.ended(7, Ended::Recalled);
            assert_eq!(t.ask_after(7), k);
        }
        assert_eq!(asks_at(&t, 7), 257);
        t.answered(7, true);
        t.ended(7, Ended::GivenBack);
        assert_eq!(t.ask_after(7), 128);
        t.answered(7, true);
        t.ended(7, Ended::GivenBack);
        assert_eq!(t.ask_after(7), 64);
        // A refusal: the count starts again, k unchanged.
        let at = asks_at(&t, 7);
        assert_eq!(at, 65);
        t.answered(7, false);
        assert_eq!(asks_at(&t, 7), 65);
        for _ in 0..10 {
            t.answered(7, true);
            t.ended(7, Ended::GivenBack);
        }
        assert_eq!(t.ask_after(7), ASK_AFTER_MIN);
        // Other directories are counted apart.
        assert_eq!(asks_at(&t, 8), 5);
    }

    /// A directory made under its parent's lease asks at its first
    /// request, with `k` at its floor whatever an older inode of its
    /// number left in the way.
    #[test]
    fn a_directory_made_here_asks_at_once() {
        let t = AskTable::default();
        for _ in 0..3 {
            t.answered(9, true);
            t.ended(9, Ended::Recalled);
        }
        assert_eq!(t.ask_after(9), 32);
        t.born(9);
        assert_eq!(t.ask_after(9), ASK_AFTER_MIN);
        assert!(t.ring_request(9), "the first request asks");
        t.born(10);
        assert!(t.ring_request(10));
        t.answered(10, false);
        assert_eq!((1..=5).find(|_| t.ring_request(10)), Some(5));
    }

    /// Bounded: many directories share the table; a directory whose
    /// lease is held keeps its way, and one with no way asks nothing.
    #[test]
    fn the_table_is_bounded_and_keeps_held_directories() {
        let t = AskTable::default();
        for d in 1..=10_000u64 {
            t.ring_request(d);
        }
        let used = t.ways.iter().filter(|w| w.load(Relaxed) != 0).count();
        assert!(used <= SLOTS);
        // Hold every way's directory: another directory finds no way.
        let held: Vec<u64> = t
            .ways
            .iter()
            .filter_map(|w| Way::unpack(w.load(Relaxed)))
            .map(|w| w.tag)
            .collect();
        for &d in &held {
            t.answered(d, true);
        }
        assert!(
            (20_000..20_100).all(|d| !t.ring_request(d)),
            "asked with no way"
        );
        for &d in &held {
            assert!(!t.ring_request(d), "a held directory asked");
            t.ended(d, Ended::GivenBack);
        }
        assert_eq!((1..=5).find(|_| t.ring_request(20_000)), Some(5));
    }
}
