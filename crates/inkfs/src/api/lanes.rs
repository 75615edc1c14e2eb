//! What the threads of one client process take turns at (docs/KERNEL-FREE.md,
//! "Built: one client per process"): the pin words of its epoch slot and
//! its request rings.
//!
//! A client (`super::client::Client`) is one per process and mount, shared
//! by all the process's threads: one engine and its caches, one session,
//! one set of leases and one reservation. What a call needs for itself:
//!
//! - **a pin word** ([`PinWords`]): every engine call is pinned (epoch.rs).
//!   A thread takes a word of the client's slot at its first call and keeps
//!   it until it exits (a thread-local), so a pin is two stores and no
//!   wait. Past [`PERMANENT_MAX`] threads holding words, a thread borrows a
//!   word for each call (waiting for one when none is free): the last
//!   `epoch::PINS_PER_SLOT` - [`PERMANENT_MAX`] words are only ever borrowed, so
//!   a borrower waits at most for another borrower's call.
//! - **a ring** ([`RingLanes`]), only to ask the server something (a
//!   namespace change, a lease, a reservation): taken for the round trip,
//!   preferring the one this thread used last (its server thread's caches
//!   are warm). Ring 0 is served from the attach on; ring `k` once a
//!   thread found rings `0..k` busy and asked the server for it (`lane k`
//!   on the session). The last ring ([`LEASE_RING`]) is never a namespace
//!   request's: a lease or reservation request is made under the lease
//!   cell's lock that this client's answer to a recall waits for, and a
//!   namespace request may wait on the server for such a recall; were all
//!   rings namespace requests', the lease request would wait for them and
//!   they for it.
//!
//! Before, a process had up to eight whole clients, each one thread's
//! (its own attach, engine, replays of every inode, leases, and a slot):
//! threads waited for a client for the whole of each call, and an inode's
//! writes all went through one of them, so that two clients of one process
//! did not take its lease from each other. 100 threads of webproxy ran at a
//! third of 8 threads' rate.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use crate::epoch::{Pin, PINS_PER_SLOT};
use crate::shm::SharedEpochs;

use super::ring::RINGS;

/// Pin words a thread may keep for its life; the rest are borrowed per
/// call.
pub const PERMANENT_MAX: usize = PINS_PER_SLOT - 16;

/// A waiter wakes this often to look again (a missed wake-up costs this,
/// never a hang).
const WAIT_SLICE: Duration = Duration::from_millis(20);

/// Clients made in this process so far (each [`PinWords`] gets a number:
/// a thread's words are found by it).
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The pin words of one client's slot, handed out to its threads.
pub struct PinWords {
    id: u64,
    epochs: Arc<SharedEpochs>,
    slot: usize,
    /// One bit per word: taken by a thread.
    taken: [AtomicU64; PINS_PER_SLOT / 64],
    /// Words kept by threads now.
    permanent: AtomicUsize,
    /// Bumped at each release of a borrowed word; threads waiting for one
    /// sleep on it (a futex, as `Wait`).
    wait: Wait,
}

const _: () = assert!(PINS_PER_SLOT.is_multiple_of(64) && PERMANENT_MAX < PINS_PER_SLOT);

/// A word this thread holds of some client's slot.
struct Held {
    words: Arc<PinWords>,
    w: usize,
    /// Calls of this thread in progress on the client (nested ones reuse
    /// the outer call's pin).
    depth: u32,
    /// Borrowed for the call in progress (given back when it ends).
    borrowed: bool,
}

impl Drop for Held {
    fn drop(&mut self) {
        // The thread exits (or a borrow ends): the word is free again. Its
        // value is 0 (no call in progress), so nothing in the shared table
        // changes.
        self.words.give_back(self.w, !self.borrowed);
    }
}

thread_local! {
    /// This thread's pin words, one per client it has called.
    static MINE: RefCell<Vec<Held>> = const { RefCell::new(Vec::new()) };
    /// The ring this thread used last (a hint).
    static LAST_RING: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// A pinned call; unpinned when dropped (the outermost of nested ones).
pub struct Pinned<'a> {
    words: &'a PinWords,
    pin: Option<Pin<'a>>,
    /// The thread's entry counts this call (its depth is one level less
    /// at the end).
    tracked: bool,
    /// A word borrowed outside the thread's entries (its thread-locals are
    /// gone: the thread is exiting), given back at the unpin.
    loose: Option<usize>,
}

impl Drop for Pinned<'_> {
    fn drop(&mut self) {
        drop(self.pin.take());
        if let Some(w) = self.loose {
            self.words.give_back(w, false);
        }
        if !self.tracked {
            return;
        }
        let id = self.words.id;
        // One level out; a borrowed word goes back once the outermost call
        // ends (dropped outside the borrow of the entries).
        let done = MINE.try_with(|m| {
            let mut m = m.borrow_mut();
            let i = m.iter().position(|h| h.words.id == id)?;
            m[i].depth -= 1;
            (m[i].depth == 0 && m[i].borrowed).then(|| m.swap_remove(i))
        });
        drop(done);
    }
}

impl PinWords {
    pub fn new(epochs: Arc<SharedEpochs>, slot: usize) -> Arc<PinWords> {
        Arc::new(PinWords {
            id: NEXT_ID.fetch_add(1, SeqCst),
            epochs,
            slot,
            taken: std::array::from_fn(|_| AtomicU64::new(0)),
            permanent: AtomicUsize::new(0),
            wait: Wait::default(),
        })
    }

    /// Pin this thread's word for one call (nested calls reuse the pin).
    pub fn pin(self: &Arc<Self>) -> Pinned<'_> {
        let mine = MINE.try_with(|m| {
            let mut m = m.borrow_mut();
            let h = m.iter_mut().find(|h| h.words.id == self.id)?;
            h.depth += 1;
            Some((h.depth > 1, h.w))
        });
        let (w, tracked, loose) = match mine {
            Ok(Some((true, _))) => {
                return Pinned {
                    words: self,
                    pin: None,
                    tracked: true,
                    loose: None,
                }
            }
            Ok(Some((false, w))) => (w, true, None),
            Ok(None) => match self.take_word() {
                Ok(w) => (w, true, None),
                Err(w) => (w, false, Some(w)),
            },
            // The thread is exiting (its thread-locals are gone).
            Err(_) => {
                let w = self.borrow_word();
                (w, false, Some(w))
            }
        };
        Pinned {
            words: self,
            pin: self.epochs.pin_word(self.slot, w),
            tracked,
            loose,
        }
    }

    /// A word for this thread, recorded in its entries at depth 1: its own
    /// for its life if fewer than [`PERMANENT_MAX`] are kept, else one
    /// borrowed for the call (waited for). `Err`: borrowed and not
    /// recorded (the entries are gone), to give back at the unpin.
    fn take_word(self: &Arc<Self>) -> Result<usize, usize> {
        let (w, borrowed) = match self.claim(true) {
            Some(w) => (w, false),
            None => (self.borrow_word(), true),
        };
        let held = Held {
            words: self.clone(),
            w,
            depth: 1,
            borrowed,
        };
        match MINE.try_with(|m| m.borrow_mut().push(held)) {
            Ok(()) => Ok(w),
            // `held` went with the closure, giving the word back: take one
            // again, loose.
            Err(_) => Err(self.borrow_word()),
        }
    }

    /// A word borrowed for one call, waiting for one when none is free.
    fn borrow_word(&self) -> usize {
        loop {
            let seen = self.wait.word.load(SeqCst);
            if let Some(w) = self.claim(false) {
                return w;
            }
            self.wait.sleep(seen);
        }
    }

    /// A free word (`keep`: for a thread's life, only among the first
    /// [`PERMANENT_MAX`] and while fewer are kept).
    fn claim(&self, keep: bool) -> Option<usize> {
        if keep && self.permanent.load(SeqCst) >= PERMANENT_MAX {
            return None;
        }
        let limit = if keep { PERMANENT_MAX } else { PINS_PER_SLOT };
        for (i, t) in self.taken.iter().enumerate() {
            loop {
                let bits = t.load(SeqCst);
                let free = !bits;
                if free == 0 {
                    break;
                }
                let b = free.trailing_zeros() as usize;
                let w = i * 64 + b;
                if w >= limit {
                    return None;
                }
                if t.compare_exchange(bits, bits | 1 << b, SeqCst, SeqCst)
                    .is_ok()
                {
                    if keep {
                        self.permanent.fetch_add(1, SeqCst);
                    }
                    return Some(w);
                }
            }
        }
        None
    }

    fn give_back(&self, w: usize, kept: bool) {
        if let Some(t) = self.taken.get(w / 64) {
            t.fetch_and(!(1 << (w % 64)), SeqCst);
        }
        if kept {
            self.permanent.fetch_sub(1, SeqCst);
        }
        self.wait.wake();
    }
}

/// A futex word and its sleepers (this process's).
#[derive(Default)]
struct Wait {
    word: AtomicU32,
    sleepers: AtomicU32,
}

impl Wait {
    /// Sleep while the word is `seen` (at most [`WAIT_SLICE`]).
    fn sleep(&self, seen: u32) {
        self.sleepers.fetch_add(1, SeqCst);
        if self.word.load(SeqCst) == seen {
            let ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: WAIT_SLICE.as_nanos() as libc::c_long,
            };
            // SAFETY: a futex wait on a word of ours with a timeout we own.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    self.word.as_ptr(),
                    libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                    seen,
                    &ts as *const libc::timespec,
                );
            }
        }
        self.sleepers.fetch_sub(1, SeqCst);
    }

    /// Wake one sleeper, if any (after the change it waits for).
    fn wake(&self) {
        self.word.fetch_add(1, SeqCst);
        if self.sleepers.load(SeqCst) != 0 {
            // SAFETY: a futex wake on a word of ours; no memory is written.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    self.word.as_ptr(),
                    libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
                    1,
                );
            }
        }
    }
}

/// The client's request rings, handed to threads one round trip at a
/// time.
#[derive(Default)]
pub struct RingLanes {
    busy: [AtomicBool; RINGS],
    /// Rings `0..started` are served (or asked for).
    started: AtomicUsize,
    /// Threads waiting for a ring, of each class (namespace requests, and
    /// the others): the last ring is the others' only.
    wait_ns: Wait,
    wait_any: Wait,
}

/// The ring only requests made under a lease cell's lock (a lease, a
/// reservation) take: a namespace request may wait on the server for a
/// recall of this client's lease, whose answer waits for that lock, held
/// by a thread that must not wait for the namespace request's ring.
pub const LEASE_RING: usize = RINGS - 1;

/// What a request may wait for on the server (see [`LEASE_RING`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Class {
    /// A namespace change: may wait for this client's recalls.
    Ns,
    /// A lease or a reservation: never waits for this client.
    Lease,
}

/// A ring taken for one round trip; given back when dropped.
pub struct Lane<'a> {
    lanes: &'a RingLanes,
    pub k: usize,
}

impl Drop for Lane<'_> {
    fn drop(&mut self) {
        self.lanes.busy[self.k].store(false, SeqCst);
        // One waiter of each class that may take it.
        if self.k != LEASE_RING {
            self.lanes.wait_ns.wake();
        }
        self.lanes.wait_any.wake();
    }
}

impl RingLanes {
    /// Ring 0 is served from the attach on.
    pub fn new() -> RingLanes {
        let l = RingLanes::default();
        l.started.store(1, SeqCst);
        l
    }

    /// A free ring for a request of class `class` (a namespace request
    /// never gets [`LEASE_RING`]): this thread's last one if free, else
    /// any served one, else a new one (`ask(k)` asks the server to serve
    /// ring `k`: false if it could not be asked, and the ring is not
    /// used), else the first to be given back.
    pub fn take(&self, class: Class, ask: impl Fn(usize) -> bool) -> Option<Lane<'_>> {
        let hint = LAST_RING.try_with(|c| c.get()).unwrap_or(0);
        let (limit, wait) = match class {
            Class::Ns => (LEASE_RING, &self.wait_ns),
            Class::Lease => (RINGS, &self.wait_any),
        };
        loop {
            let seen = wait.word.load(SeqCst);
            let n = self.started.load(SeqCst).min(RINGS);
            let usable = n.min(limit);
            let order = std::iter::once(hint)
                .chain(0..usable)
                .filter(|&k| k < usable);
            for k in order {
                if self.busy[k]
                    .compare_exchange(false, true, SeqCst, SeqCst)
                    .is_ok()
                {
                    let _ = LAST_RING.try_with(|c| c.set(k));
                    return Some(Lane { lanes: self, k });
                }
            }
            if n < limit
                && self
                    .started
                    .compare_exchange(n, n + 1, SeqCst, SeqCst)
                    .is_ok()
            {
                // Ring n is new: nobody else can have taken it.
                self.busy[n].store(true, SeqCst);
                let lane = Lane { lanes: self, k: n };
                if !ask(n) {
                    return None;
                }
                let _ = LAST_RING.try_with(|c| c.set(n));
                return Some(lane);
            }
            if n < limit {
                continue;
            }
            wait.sleep(seen);
        }
    }

    /// Rings served now.
    pub fn started(&self) -> usize {
        self.started.load(SeqCst).min(RINGS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Barrier, Mutex};

    fn words() -> (Arc<SharedEpochs>, Arc<PinWords>) {
        let epochs = Arc::new(SharedEpochs::create().expect("shm"));
        let slot = epochs.claim_index().expect("a slot");
        let words = PinWords::new(epochs.clone(), slot);
        (epochs, words)
    }

    fn taken(w: &PinWords) -> u32 {
        w.taken.iter().map(|t| t.load(SeqCst).count_ones()).sum()
    }

    #[test]
    fn a_threads_pin_is_seen_by_others_and_nests() {
        let (epochs, words) = words();
        assert_eq!(epochs.oldest_pinned_but_mine(words.slot), u64::MAX);
        let outer = words.pin();
        let e = epochs.now();
        {
            let _inner = words.pin();
            // Nested: the same word, still pinned once the inner call ends.
        }
        // Not its own pin for the pinning thread; another thread's for
        // every other.
        assert_eq!(epochs.oldest_pinned_but_mine(words.slot), u64::MAX);
        // ...but a writer of another slot on this thread sees it (the
        // pin is a reader's to it).
        let other = epochs.claim_index().expect("a slot");
        assert_eq!(epochs.oldest_pinned_but_mine(other), e);
        let seen =
            std::thread::scope(|s| s.spawn(|| epochs.oldest_pinned_but_mine(words.slot)).join());
        assert_eq!(seen.expect("thread"), e);
        drop(outer);
        let seen =
            std::thread::scope(|s| s.spawn(|| epochs.oldest_pinned_but_mine(words.slot)).join());
        assert_eq!(seen.expect("thread"), u64::MAX);
        // The thread keeps its word between calls.
        assert_eq!(taken(&words), 1);
    }

    #[test]
    fn threads_past_the_kept_words_borrow_and_every_word_comes_back() {
        let (epochs, words) = words();
        // All pinned at once: the first PERMANENT_MAX keep a word, the
        // rest borrow one; every pin is seen.
        let n = PERMANENT_MAX + 8;
        let all = Barrier::new(n + 1);
        let done = Barrier::new(n + 1);
        // (Joined one by one: a scope's end does not wait for its threads'
        // thread-locals to be dropped, a join does.)
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..n)
                .map(|_| {
                    s.spawn(|| {
                        let _p = words.pin();
                        all.wait();
                        done.wait();
                    })
                })
                .collect();
            all.wait();
            assert_eq!(taken(&words), n as u32);
            assert_eq!(words.permanent.load(SeqCst), PERMANENT_MAX);
            let seen = s.spawn(|| epochs.oldest_pinned_but_mine(words.slot)).join();
            assert_ne!(seen.expect("thread"), u64::MAX);
            done.wait();
            hs.into_iter().for_each(|h| h.join().expect("thread"));
        });
        assert_eq!(taken(&words), 0, "words given back at thread exit");
        assert_eq!(words.permanent.load(SeqCst), 0);
        // More threads than words, each pinning many times: borrowers wait
        // for each other's calls, never for a kept word.
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..(PINS_PER_SLOT + 40))
                .map(|_| {
                    s.spawn(|| {
                        for _ in 0..50 {
                            let _p = words.pin();
                            std::hint::spin_loop();
                        }
                    })
                })
                .collect();
            hs.into_iter().for_each(|h| h.join().expect("thread"));
        });
        assert_eq!(taken(&words), 0);
        assert_eq!(words.permanent.load(SeqCst), 0);
    }

    #[test]
    fn a_ring_is_one_threads_at_a_time_and_each_is_asked_for_once() {
        let lanes = RingLanes::new();
        let asked = Mutex::new(Vec::new());
        let inside: [AtomicBool; RINGS] = std::array::from_fn(|_| AtomicBool::new(false));
        std::thread::scope(|s| {
            for t in 0..(2 * RINGS) {
                let (lanes, asked, inside) = (&lanes, &asked, &inside);
                s.spawn(move || {
                    let class = if t % 2 == 0 { Class::Ns } else { Class::Lease };
                    for _ in 0..200 {
                        let lane = lanes
                            .take(class, |k| {
                                asked.lock().expect("lock").push(k);
                                true
                            })
                            .expect("a ring");
                        assert!(!inside[lane.k].swap(true, SeqCst), "ring {} twice", lane.k);
                        assert!(class == Class::Lease || lane.k != LEASE_RING);
                        std::thread::yield_now();
                        inside[lane.k].store(false, SeqCst);
                    }
                });
            }
        });
        let asked = asked.into_inner().expect("lock");
        // Ring 0 is served from the start; each other one asked for once.
        assert_eq!(asked, (1..lanes.started()).collect::<Vec<_>>());
        assert!(lanes.started() <= RINGS);
        // Namespace requests holding every ring they may take leave the
        // last one to a lease request.
        let lanes = RingLanes::new();
        let ns: Vec<_> = (0..LEASE_RING)
            .map(|_| lanes.take(Class::Ns, |_| true).expect("a ring"))
            .collect();
        let lease = lanes.take(Class::Lease, |_| true).expect("a ring");
        assert_eq!(lease.k, LEASE_RING);
        drop((ns, lease));
        // A ring that could not be asked for is not used.
        let lanes = RingLanes::new();
        let first = lanes.take(Class::Ns, |_| false).expect("ring 0");
        assert_eq!(first.k, 0);
        assert!(lanes.take(Class::Ns, |_| false).is_none());
    }
}
