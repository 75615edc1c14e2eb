//! The request rings of an attached client (docs/KERNEL-FREE.md, "Stage 4:
//! the channel", version 2): each one request at a time in a region of
//! shared memory, with no system call while both sides are running.
//!
//! The server makes a sealed memfd per client at attach holding
//! [`RINGS`] rings ([`RingSet`]) and passes it with the grant; both map it.
//! The server serves ring 0 from the attach on, and ring `k` once the
//! client asks for it on its session (`lane k`): a client process's
//! threads each take a free ring for a request, so up to [`RINGS`] of its
//! requests run at once, each on a server thread of its own. The client
//! needs no answer to `lane k`: a request it writes in a ring nobody
//! serves yet waits there until the server's thread starts and finds it.
//! In each ring the client writes a request (the same text
//! line as on the session: `super::lease::Msg`) into the request area,
//! stores its length, and bumps `req`; it wakes the server's thread with
//! a futex only if that thread said it sleeps. The server copies the
//! request out (the client could change it under the server's feet),
//! runs it, writes the answer line, and sets `ans` to the request's
//! number, waking the client only if it sleeps. Each side may spin a
//! little first ([`CLIENT_SPIN`], [`SERVER_SPIN`]), while spinning pays
//! in this process (adaptive): on a machine with a core for each, a round
//! trip is then two cache-line transfers. Each side also publishes the
//! CPU it runs on in the ring's header (`client_cpu`, `server_cpu`: rseq's
//! word, no system call), so that a waiter can tell when the other side
//! shares its CPU and cannot be running: `INKFS_RING_SAME_CPU=yield` or
//! `=sleep` then yields the CPU or sleeps instead of spinning. Both were
//! measured against the spin and lost or tied (bench/results-notes/
//! nsperf.md, "Fourth pass"), so the spin stays the default. At most half
//! the machine's cores' worth of threads of one process spin at once (one
//! on 2 cores): a spinner takes a core from the program, or from the other
//! side it waits for; the others sleep at once.
//!
//! Sleeping is Dekker's: a side announces it sleeps (`*_sleeps`, SeqCst),
//! then looks at the word it waits on once more, then waits on it with a
//! futex that sleeps only if the word still holds the value it saw; the
//! other side stores the word (SeqCst), then looks at the announcement.
//! One of the two sees the other.
//!
//! The region holds atomics and bytes only: whatever a confused client
//! stores there, the server reads a bounded, copied request and a length
//! it clamps, and the CPU and sleep words only choose whether the server's
//! thread spins or yields (for at most [`SERVER_SPIN`]) or sleeps, when
//! `INKFS_RING_SAME_CPU` asks it to look at them. Leases' recalls and the
//! client's `released` answers stay on the session (a recall must reach a
//! client whose one thread is waiting here), as do block returns and
//! `unheld`, which need no answer.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{
    AtomicU32, AtomicUsize, Ordering::Acquire, Ordering::Relaxed, Ordering::Release,
    Ordering::SeqCst,
};
use std::time::{Duration, Instant};

use super::lease::LINE_MAX;

/// How long the client spins for an answer before it sleeps, and the
/// server's thread for the next request after an answer (`linger`).
/// Adaptive (`Spin::take`): a side keeps spinning while its spins end with
/// what it waited for, and stops (trying again now and then) when they do
/// not (the other side is off its core). Measured on the shared 2-vCPU
/// machine (bench/results-notes/namespace.md): fixed spins were 2-3x
/// faster than sleeping at once in some runs and 2-3x slower in others, at
/// the same load average. `INKFS_RING_SPIN=US` sets both (0: never spin).
pub const CLIENT_SPIN: Duration = Duration::from_micros(30);
pub const SERVER_SPIN: Duration = Duration::from_micros(30);

/// The spin of this process: `INKFS_RING_SPIN=US` microseconds, else `default`.
fn spin_for(default: Duration) -> Duration {
    static US: AtomicUsize = AtomicUsize::new(usize::MAX);
    let mut us = US.load(Relaxed);
    if us == usize::MAX {
        us = std::env::var("INKFS_RING_SPIN")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(usize::MAX - 1);
        US.store(us, Relaxed);
    }
    if us == usize::MAX - 1 {
        default
    } else {
        Duration::from_micros(us as u64)
    }
}

/// What a waiter does while the other side shares its CPU
/// (`INKFS_RING_SAME_CPU`, for measuring one against another): spin as
/// when the other side runs elsewhere (`spin`, the default: the policy
/// before the CPU words), yield the CPU (`yield`), or sleep at once
/// (`sleep`; a just-woken other side is yielded to). Measured on the
/// shared 2-vCPU machine (bench/results-notes/nsperf.md, "Fourth pass"):
/// neither alternative beat the spin there, yielding within the spread of
/// it, sleeping slower.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum SameCpu {
    Yield,
    Sleep,
    Spin,
}

/// This process's [`SameCpu`].
fn same_cpu() -> SameCpu {
    // 0: not read yet; 1 + the variant.
    static MODE: AtomicUsize = AtomicUsize::new(0);
    let mut m = MODE.load(Relaxed);
    if m == 0 {
        m = match std::env::var("INKFS_RING_SAME_CPU").as_deref() {
            Ok("sleep") => 2,
            Ok("yield") => 3,
            _ => 1,
        };
        MODE.store(m, Relaxed);
    }
    match m {
        2 => SameCpu::Sleep,
        3 => SameCpu::Yield,
        _ => SameCpu::Spin,
    }
}

/// Threads of this process spinning on a ring now.
static SPINNING: AtomicUsize = AtomicUsize::new(0);
/// At most this many of them (0: not computed yet).
static SPINNERS_MAX: AtomicUsize = AtomicUsize::new(0);
/// How well spinning has paid lately in this process: +1 for a spin that
/// ended with what it waited for, -4 for one that ran out (0 to 16).
static SPIN_SCORE: AtomicUsize = AtomicUsize::new(8);
/// Waits so far (every 32nd spins whatever the score: a probe).
static WAITS: AtomicUsize = AtomicUsize::new(0);

/// A turn at spinning, if spinning pays and fewer than the cap spin now
/// (see the module comment); its end when dropped.
struct Spin;

impl Spin {
    fn take(budget: Duration) -> Option<Spin> {
        if budget.is_zero() {
            return None;
        }
        let probe = WAITS.fetch_add(1, Relaxed).is_multiple_of(32);
        if SPIN_SCORE.load(Relaxed) == 0 && !probe {
            return None;
        }
        let mut max = SPINNERS_MAX.load(Relaxed);
        if max == 0 {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            max = (cores / 2).max(1);
            SPINNERS_MAX.store(max, Relaxed);
        }
        if SPINNING.fetch_add(1, SeqCst) < max {
            Some(Spin)
        } else {
            SPINNING.fetch_sub(1, SeqCst);
            None
        }
    }

    /// The spin ended: with what it waited for (`paid`) or not.
    fn end(self, paid: bool) {
        let s = SPIN_SCORE.load(Relaxed);
        SPIN_SCORE.store(
            if paid {
                (s + 1).min(16)
            } else {
                s.saturating_sub(4)
            },
            Relaxed,
        );
    }
}

impl Drop for Spin {
    fn drop(&mut self) {
        SPINNING.fetch_sub(1, SeqCst);
    }
}

/// A sleeper wakes this often to see whether the other side is gone.
const SLEEP_SLICE: Duration = Duration::from_millis(50);

/// Bytes of the request area and of the answer area.
const AREA_BYTES: usize = LINE_MAX.div_ceil(4096) * 4096;
/// One ring: a header page, the request area, the answer area.
pub const RING_BYTES: usize = 4096 + 2 * AREA_BYTES;
/// Rings per client: requests of one client process that run at once (on
/// 2 cores, 8 server threads already take turns).
pub const RINGS: usize = 8;
/// The region: [`RINGS`] rings.
pub const SET_BYTES: usize = RINGS * RING_BYTES;

/// The header page.
#[repr(C)]
struct Header {
    /// The last request's number (the client's futex word).
    req: AtomicU32,
    /// The number of the request last answered (the server's futex word).
    ans: AtomicU32,
    req_len: AtomicU32,
    ans_len: AtomicU32,
    /// The server's thread sleeps (or is about to) on `req`.
    server_sleeps: AtomicU32,
    /// The client sleeps (or is about to) on `ans`.
    client_sleeps: AtomicU32,
    /// The server stopped serving this ring.
    closed: AtomicU32,
    /// The CPU the client last ran on in a call, plus one (0: unknown; a
    /// client of an older build never sets it). A hint for `linger`.
    client_cpu: AtomicU32,
    /// The CPU the server's thread last ran on while awake, plus one.
    server_cpu: AtomicU32,
}

const _: () = assert!(std::mem::size_of::<Header>() <= 4096);

/// One client's rings, mapped.
pub struct RingSet {
    base: NonNull<u8>,
    fd: OwnedFd,
}

// SAFETY: the mapping is owned by the value; the headers are atomics, and
// the areas are only touched by the side whose turn it is (see the module
// comment), through copies.
unsafe impl Send for RingSet {}
// SAFETY: see Send.
unsafe impl Sync for RingSet {}

/// One ring of a [`RingSet`].
#[derive(Clone, Copy)]
pub struct Ring<'a> {
    base: NonNull<u8>,
    _set: std::marker::PhantomData<&'a RingSet>,
}

// SAFETY: a view into a RingSet's mapping (Sync), which outlives it.
unsafe impl Send for Ring<'_> {}
// SAFETY: see Send.
unsafe impl Sync for Ring<'_> {}

fn futex(word: &AtomicU32, op: libc::c_int, val: u32, timeout: Option<Duration>) {
    let ts = timeout.map(|d| libc::timespec {
        tv_sec: d.as_secs() as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    });
    let tp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: a futex call on a word of a live shared mapping (not
    // private: two processes wait and wake on it), with a timeout we own.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            op,
            val,
            tp,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

fn wake(word: &AtomicU32) {
    futex(word, libc::FUTEX_WAKE, 1, None);
}

/// Wait until `word` is no longer `seen` (or `slice` passed).
fn sleep_on(word: &AtomicU32, seen: u32, slice: Duration) {
    futex(word, libc::FUTEX_WAIT, seen, Some(slice));
}

/// The CPU this thread runs on, plus one (0: unknown). glibc reads it
/// from the thread's rseq area: no system call.
fn cpu() -> u32 {
    // SAFETY: no arguments, no memory handed over.
    let c = unsafe { libc::sched_getcpu() };
    u32::try_from(c).map_or(0, |c| c.wrapping_add(1))
}

/// A yield (`INKFS_RING_SAME_CPU=yield` or `=sleep`) that took longer
/// than this gave the CPU to a third party (another program's busy
/// thread): the peer did not run, so stop and sleep, whose wake-up the
/// scheduler lets preempt such a thread.
const YIELD_LOST: Duration = Duration::from_micros(50);

/// One side's words, as [`linger`] uses them.
struct Peer<'a> {
    /// Where this side publishes its CPU.
    mine: &'a AtomicU32,
    /// Where the other side publishes its CPU.
    theirs: &'a AtomicU32,
    /// The other side's sleep announcement (set: this side woke it, and
    /// it has not run since).
    they_sleep: &'a AtomicU32,
}

/// Wait up to `budget` for `ready()` without sleeping (how it ended:
/// [`Waited`]), publishing this side's CPU. By default it spins. With
/// `INKFS_RING_SAME_CPU` set ([`SameCpu`]), it spins only while the other
/// side last ran on another CPU, and so may be running there; while it
/// last ran on this one it cannot be running (this thread is), and a spin
/// only holds it off the CPU until the budget or the scheduler's tick ends
/// it (on 2 cores the two sides share one whenever the machine has other
/// work: the scheduler's wake-up placement puts a woken thread beside its
/// waker): there it yields the CPU, or leaves for the caller to sleep; so
/// too while the other side, woken by this one, has not run yet. A yield
/// that comes back late gave the CPU to a third program: then it leaves
/// too, and the caller sleeps.
fn linger(peer: &Peer<'_>, budget: Duration, ready: impl Fn() -> bool) -> Waited {
    // SAFETY: no arguments.
    linger_with(peer, budget, same_cpu(), ready, || unsafe {
        libc::sched_yield();
    })
}

/// How a [`linger`] ended.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Waited {
    /// With what it waited for.
    Ready,
    /// Without: the budget ran out, or a yield came back late.
    Out,
    /// At once, to sleep: the other side last ran on this CPU
    /// (`INKFS_RING_SAME_CPU=sleep`).
    Here,
}

impl Spin {
    /// End a turn as `linger` ended it (a wait given up for the other
    /// side's CPU says nothing of whether waiting pays).
    fn ended(self, w: Waited) {
        match w {
            Waited::Ready => self.end(true),
            Waited::Out => self.end(false),
            Waited::Here => {}
        }
    }
}

/// [`linger`], with the yield given (the tests count them).
fn linger_with(
    peer: &Peer<'_>,
    budget: Duration,
    mode: SameCpu,
    ready: impl Fn() -> bool,
    mut yield_now: impl FnMut(),
) -> Waited {
    let until = Instant::now() + budget;
    let out = |ready: &dyn Fn() -> bool| if ready() { Waited::Ready } else { Waited::Out };
    loop {
        if ready() {
            return Waited::Ready;
        }
        let me = cpu();
        peer.mine.store(me, Relaxed);
        let here = me != 0 && peer.theirs.load(Relaxed) == me;
        // Woken by this side and not run since (`they_sleep` still set):
        // perhaps queued on this CPU, a waker's CPU being the scheduler's
        // first choice when the other is busy. Sleeping for it would be
        // catching: it would find this side asleep in turn, and sleep
        // too, and so on for every request after (measured: 2-3x slower
        // than main). So it is yielded to in either mode: if it runs
        // elsewhere the yield comes back at once and the next turn spins.
        let woken = peer.they_sleep.load(Relaxed) != 0;
        if here && mode == SameCpu::Sleep {
            return Waited::Here;
        }
        if (here || woken) && mode != SameCpu::Spin {
            let t = Instant::now();
            yield_now();
            let now = Instant::now();
            if now - t > YIELD_LOST || now >= until {
                return out(&ready);
            }
        } else {
            for _ in 0..32 {
                std::hint::spin_loop();
            }
            if Instant::now() >= until {
                return out(&ready);
            }
        }
    }
}

impl RingSet {
    /// New rings in a sealed memfd (the server, at attach).
    pub fn create() -> io::Result<RingSet> {
        let fd = crate::shm::sealed_memfd(c"inkfs-ring", SET_BYTES)?;
        RingSet::map(fd)
    }

    /// Map the rings the server passed (the client): refused unless their
    /// size is sealed and is this build's.
    pub fn from_fd(fd: OwnedFd) -> io::Result<RingSet> {
        crate::shm::check_sealed(&fd, SET_BYTES, "the request ring set")?;
        RingSet::map(fd)
    }

    fn map(fd: OwnedFd) -> io::Result<RingSet> {
        // SAFETY: a new shared mapping of a descriptor we own, of the
        // size it was sealed at; the kernel picks the address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                SET_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base =
            NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(RingSet { base, fd })
    }

    /// The memfd, to pass to the client.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Ring `k` (`None` past [`RINGS`]).
    pub fn ring(&self, k: usize) -> Option<Ring<'_>> {
        if k >= RINGS {
            return None;
        }
        // SAFETY: ring k lies within the mapping (SET_BYTES long).
        let p = unsafe { self.base.as_ptr().add(k * RING_BYTES) };
        Some(Ring {
            base: NonNull::new(p)?,
            _set: std::marker::PhantomData,
        })
    }

    /// Stop serving every ring (see [`Ring::close`]).
    pub fn close(&self) {
        for k in 0..RINGS {
            if let Some(r) = self.ring(k) {
                r.close();
            }
        }
    }
}

impl<'a> Ring<'a> {
    fn header(&self) -> &'a Header {
        // SAFETY: the ring's first page, within the set's mapping, which
        // outlives 'a; a Header is atomics (any bits are a value).
        unsafe { &*self.base.as_ptr().cast::<Header>() }
    }

    fn area(&self, answer: bool) -> *mut u8 {
        let off = 4096 + if answer { AREA_BYTES } else { 0 };
        // SAFETY: within this ring (RING_BYTES long).
        unsafe { self.base.as_ptr().add(off) }
    }

    /// Copy `bytes` (at most an area) into an area, and return its length.
    fn put(&self, answer: bool, bytes: &[u8]) -> u32 {
        let n = bytes.len().min(AREA_BYTES);
        // SAFETY: the area holds AREA_BYTES; the other side does not use
        // it until the sequence word below says so (its turn).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.area(answer), n) };
        n as u32
    }

    /// Copy `len` bytes (clamped to the area) out of an area.
    fn take(&self, answer: bool, len: u32) -> Vec<u8> {
        let mut v = Vec::new();
        self.take_into(answer, len, &mut v);
        v
    }

    /// [`Ring::take`] into `v` (its old bytes dropped, its allocation
    /// kept: the server's thread reuses one buffer for every request).
    fn take_into(&self, answer: bool, len: u32, v: &mut Vec<u8>) {
        let n = (len as usize).min(AREA_BYTES);
        v.clear();
        v.resize(n, 0);
        // SAFETY: as in `put`; a copy, so the other side changing the
        // area afterwards changes nothing we hold.
        unsafe { std::ptr::copy_nonoverlapping(self.area(answer), v.as_mut_ptr(), n) };
    }

    // ---- the client's side ---------------------------------------------

    /// Send one request line and wait for its answer line. `gone()` is
    /// asked while it sleeps: true ends the wait with EIO (the server's
    /// session ended). One request at a time per ring: the caller owns the
    /// ring for the call (`api::client` hands rings out to threads).
    pub fn call(&self, line: &[u8], gone: impl Fn() -> bool) -> io::Result<Vec<u8>> {
        let h = self.header();
        if line.len() > AREA_BYTES {
            return Err(io::Error::from_raw_os_error(libc::E2BIG));
        }
        let n = self.put(false, line);
        h.req_len.store(n, Release);
        let seq = h.req.load(Acquire).wrapping_add(1);
        h.req.store(seq, SeqCst);
        if h.server_sleeps.load(SeqCst) != 0 {
            wake(&h.req);
        }
        let ready = || h.ans.load(Acquire) == seq || h.closed.load(Acquire) != 0;
        h.client_cpu.store(cpu(), Relaxed);
        if !ready() {
            if let Some(s) = Spin::take(spin_for(CLIENT_SPIN)) {
                let peer = Peer {
                    mine: &h.client_cpu,
                    theirs: &h.server_cpu,
                    they_sleep: &h.server_sleeps,
                };
                s.ended(linger(&peer, spin_for(CLIENT_SPIN), ready));
            }
        }
        loop {
            let a = h.ans.load(Acquire);
            if a == seq {
                break;
            }
            if h.closed.load(Acquire) != 0 {
                return Err(io::Error::from_raw_os_error(libc::EIO));
            }
            h.client_sleeps.store(1, SeqCst);
            if h.ans.load(SeqCst) != seq {
                sleep_on(&h.ans, a, SLEEP_SLICE);
            }
            h.client_sleeps.store(0, SeqCst);
            if h.ans.load(Acquire) != seq && gone() {
                return Err(io::Error::from_raw_os_error(libc::EIO));
            }
        }
        Ok(self.take(true, h.ans_len.load(Acquire)))
    }

    // ---- the server's side ---------------------------------------------

    /// Wait for the next request after number `last`: its number and its
    /// bytes, or `None` once [`Ring::close`] was called.
    pub fn next_request(&self, last: u32) -> Option<(u32, Vec<u8>)> {
        let mut bytes = Vec::new();
        self.next_request_into(last, &mut bytes)
            .map(|seq| (seq, bytes))
    }

    /// [`Ring::next_request`], its bytes copied into `bytes` (replacing
    /// what it held; no allocation once it is large enough).
    pub fn next_request_into(&self, last: u32, bytes: &mut Vec<u8>) -> Option<u32> {
        let h = self.header();
        let ready = || h.req.load(Acquire) != last || h.closed.load(Acquire) != 0;
        if !ready() {
            if let Some(s) = Spin::take(spin_for(SERVER_SPIN)) {
                let peer = Peer {
                    mine: &h.server_cpu,
                    theirs: &h.client_cpu,
                    they_sleep: &h.client_sleeps,
                };
                s.ended(linger(&peer, spin_for(SERVER_SPIN), ready));
            }
        }
        loop {
            if h.closed.load(Acquire) != 0 {
                return None;
            }
            let r = h.req.load(Acquire);
            if r != last {
                // Where the client finds this thread while it works.
                h.server_cpu.store(cpu(), Relaxed);
                self.take_into(false, h.req_len.load(Acquire), bytes);
                return Some(r);
            }
            h.server_sleeps.store(1, SeqCst);
            if h.req.load(SeqCst) == last && h.closed.load(SeqCst) == 0 {
                sleep_on(&h.req, last, SLEEP_SLICE);
            }
            h.server_sleeps.store(0, SeqCst);
        }
    }

    /// Answer request number `seq` with `line`.
    pub fn answer(&self, seq: u32, line: &[u8]) {
        let h = self.header();
        let n = self.put(true, line);
        h.ans_len.store(n, Release);
        h.ans.store(seq, SeqCst);
        if h.client_sleeps.load(SeqCst) != 0 {
            wake(&h.ans);
        }
    }

    /// Stop serving: [`Ring::next_request`] returns `None`, and a client
    /// waiting for an answer gets EIO.
    pub fn close(&self) {
        let h = self.header();
        h.closed.store(1, SeqCst);
        wake(&h.req);
        wake(&h.ans);
    }
}

impl Drop for RingSet {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, of this length; no Ring view
        // outlives self (their lifetime is the set's).
        unsafe { libc::munmap(self.base.as_ptr().cast(), SET_BYTES) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::FromRawFd;

    #[test]
    fn requests_and_answers_cross_between_two_mappings() {
        let server = std::sync::Arc::new(RingSet::create().unwrap());
        let client = RingSet::from_fd(server.fd().try_clone_to_owned().unwrap()).unwrap();
        // Ring 0 and the last one, each served by a thread of its own.
        let servers: Vec<_> = [0, RINGS - 1]
            .into_iter()
            .map(|k| {
                let s = server.clone();
                std::thread::spawn(move || {
                    let r = s.ring(k).unwrap();
                    let mut last = 0;
                    let mut served = 0;
                    while let Some((seq, req)) = r.next_request(last) {
                        last = seq;
                        let mut a = format!("re {k}: ").into_bytes();
                        a.extend_from_slice(&req);
                        r.answer(seq, &a);
                        served += 1;
                    }
                    served
                })
            })
            .collect();
        std::thread::scope(|sc| {
            for k in [0, RINGS - 1] {
                let ring = client.ring(k).unwrap();
                sc.spawn(move || {
                    for i in 0..2000 {
                        // Some requests after a pause: the server sleeps in
                        // between.
                        if i % 500 == 0 {
                            std::thread::sleep(Duration::from_millis(3));
                        }
                        let q = format!("request {i}\n");
                        let a = ring.call(q.as_bytes(), || false).unwrap();
                        assert_eq!(a, format!("re {k}: request {i}\n").into_bytes());
                    }
                });
            }
        });
        server.close();
        for t in servers {
            assert_eq!(t.join().unwrap(), 2000);
        }
        // Closed: a call fails at once, on every ring.
        for k in 0..RINGS {
            let e = client.ring(k).unwrap().call(b"x\n", || false).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EIO));
        }
        assert!(client.ring(RINGS).is_none());
    }

    /// Pin the calling thread to the first CPU it may run on; that CPU.
    fn pin_here() -> usize {
        // SAFETY: cpu_set_t is plain bits; the calls get its size.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            assert_eq!(
                libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set),
                0
            );
            let c = (0..libc::CPU_SETSIZE as usize)
                .find(|&c| libc::CPU_ISSET(c, &set))
                .expect("a CPU");
            libc::CPU_ZERO(&mut set);
            libc::CPU_SET(c, &mut set);
            assert_eq!(
                libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set),
                0
            );
            c
        }
    }

    #[test]
    fn a_waiter_leaves_the_cpu_to_a_peer_on_it_and_spins_for_one_elsewhere() {
        use SameCpu::{Sleep, Spin, Yield};
        use Waited::{Here, Out, Ready};
        let c = pin_here();
        assert_eq!(cpu(), c as u32 + 1, "sched_getcpu disagrees with the pin");
        let (mine, theirs, sleeps) = (AtomicU32::new(0), AtomicU32::new(0), AtomicU32::new(0));
        let peer = Peer {
            mine: &mine,
            theirs: &theirs,
            they_sleep: &sleeps,
        };
        let budget = Duration::from_millis(2);
        let yields = std::cell::Cell::new(0);
        let count = || yields.set(yields.get() + 1);
        // Ready already: no wait at all.
        assert_eq!(linger_with(&peer, budget, Yield, || true, count), Ready);
        assert_eq!(yields.get(), 0);
        // The peer last ran on another CPU: spin out the budget, no yield.
        theirs.store(c as u32 + 2, SeqCst);
        let t = Instant::now();
        assert_eq!(linger_with(&peer, budget, Yield, || false, count), Out);
        assert!(t.elapsed() >= budget);
        assert_eq!(yields.get(), 0);
        assert_eq!(
            mine.load(SeqCst),
            c as u32 + 1,
            "the waiter says where it runs"
        );
        // On this CPU: yields until the budget ends.
        theirs.store(c as u32 + 1, SeqCst);
        assert_eq!(linger_with(&peer, budget, Yield, || false, count), Out);
        assert!(yields.get() > 0);
        // ... or sleeps at once, or spins, as the mode says.
        yields.set(0);
        assert_eq!(linger_with(&peer, budget, Sleep, || false, count), Here);
        let t = Instant::now();
        assert_eq!(linger_with(&peer, budget, Spin, || false, count), Out);
        assert!(t.elapsed() >= budget);
        assert_eq!(yields.get(), 0);
        // Elsewhere, but woken and not run since: yields too, in the
        // sleeping mode as well (a sleep there would be answered by a
        // sleep: see linger_with).
        theirs.store(c as u32 + 2, SeqCst);
        sleeps.store(1, SeqCst);
        assert_eq!(linger_with(&peer, budget, Yield, || false, count), Out);
        assert!(yields.get() > 0);
        yields.set(0);
        assert_eq!(linger_with(&peer, budget, Sleep, || false, count), Out);
        assert!(yields.get() > 0);
        // What the peer sent during a yield ends the wait with it.
        let sent = std::cell::Cell::new(false);
        let send = || sent.set(true);
        assert_eq!(
            linger_with(&peer, budget, Yield, || sent.get(), send),
            Ready
        );
        // A yield that came back late (a third program had the CPU): one
        // yield, then the caller sleeps, however much budget is left.
        yields.set(0);
        let slow = || {
            yields.set(yields.get() + 1);
            std::thread::sleep(YIELD_LOST * 2);
        };
        let long = Duration::from_secs(5);
        assert_eq!(linger_with(&peer, long, Yield, || false, slow), Out);
        assert_eq!(yields.get(), 1);
    }

    #[test]
    fn round_trips_complete_with_both_sides_on_one_cpu() {
        let server = std::sync::Arc::new(RingSet::create().unwrap());
        let client = RingSet::from_fd(server.fd().try_clone_to_owned().unwrap()).unwrap();
        let s = server.clone();
        let t = std::thread::spawn(move || {
            pin_here();
            let r = s.ring(1).unwrap();
            let mut last = 0;
            while let Some((seq, req)) = r.next_request(last) {
                last = seq;
                r.answer(seq, &req);
            }
        });
        let c = std::thread::spawn(move || {
            pin_here();
            let ring = client.ring(1).unwrap();
            for i in 0..2000 {
                let q = format!("{i}\n");
                assert_eq!(ring.call(q.as_bytes(), || false).unwrap(), q.into_bytes());
            }
        });
        c.join().unwrap();
        server.close();
        t.join().unwrap();
    }

    #[test]
    fn an_unsealed_or_wrong_sized_region_is_refused() {
        // SAFETY: the name is a NUL-terminated literal.
        let raw = unsafe { libc::memfd_create(c"t".as_ptr(), libc::MFD_CLOEXEC) };
        // SAFETY: a new descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: ftruncate on a descriptor we own.
        assert_eq!(unsafe { libc::ftruncate(raw, SET_BYTES as libc::off_t) }, 0);
        assert!(RingSet::from_fd(fd).is_err());
    }
}
