//! The clock request latencies are measured with.
//!
//! Every request is timed twice (start and end), so the clock is on the
//! request path. In this VM a vDSO `clock_gettime` costs ~70 ns (it was 8%
//! of the server's user time under a 4 KiB write + fsync load); the CPU's
//! time-stamp counter costs a fraction of that. It is used where it ticks at
//! a constant rate on every CPU (x86-64 with `constant_tsc` and
//! `nonstop_tsc`), converted to nanoseconds with a rate measured once per
//! process against the monotonic clock; elsewhere the monotonic clock is read
//! directly.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A point in time, in the clock's own units (see [`elapsed_ns`]).
#[derive(Clone, Copy, Debug)]
pub struct Tick(u64);

struct Rate {
    /// Nanoseconds per counter tick, ×2³².
    ns_per_tick_q32: u64,
}

/// `None`: no usable counter, the monotonic clock is read instead.
static RATE: OnceLock<Option<Rate>> = OnceLock::new();
static EPOCH: OnceLock<Instant> = OnceLock::new();

/// How long the rate is measured: a longer window, a finer rate (±0.1% at
/// 2 ms, which is well below a log2 histogram's resolution).
const CALIBRATION: Duration = Duration::from_millis(2);

fn rate() -> &'static Option<Rate> {
    RATE.get_or_init(|| {
        if !counter_is_invariant() {
            return None;
        }
        let (t0, c0) = paired()?;
        while t0.elapsed() < CALIBRATION {
            std::hint::spin_loop();
        }
        let (t1, c1) = paired()?;
        let ns = (t1 - t0).as_nanos() as u64;
        let ticks = c1.checked_sub(c0).filter(|&t| t > 0)?;
        Some(Rate {
            ns_per_tick_q32: (((ns as u128) << 32) / ticks as u128) as u64,
        })
    })
}

/// The monotonic clock and the counter read at one moment: the counter
/// between two readings of the clock that are at most `PAIR_GAP` apart
/// (the thread was not taken off its CPU in between: a preemption there
/// skewed the rate by its length, on a loaded machine by more than the
/// whole calibration window), the clock's reading taken as their middle.
fn paired() -> Option<(Instant, u64)> {
    const PAIR_GAP: Duration = Duration::from_micros(20);
    let mut best: Option<(Duration, Instant, u64)> = None;
    for _ in 0..100 {
        let a = Instant::now();
        let c = read_counter()?;
        let b = Instant::now();
        let gap = b - a;
        if best.is_none_or(|(g, _, _)| gap < g) {
            best = Some((gap, a + gap / 2, c));
        }
        if gap <= PAIR_GAP {
            break;
        }
    }
    best.map(|(_, at, c)| (at, c))
}

/// Measure the counter's rate now rather than on the first request.
pub fn calibrate() {
    let _ = rate();
    let _ = EPOCH.get_or_init(Instant::now);
}

#[inline]
pub fn now() -> Tick {
    match rate() {
        Some(_) => Tick(read_counter().unwrap_or(0)),
        None => Tick(EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64),
    }
}

/// Nanoseconds from `since` to now.
#[inline]
pub fn elapsed_ns(since: Tick) -> u64 {
    let later = now().0.saturating_sub(since.0);
    match rate() {
        Some(r) => ((later as u128 * r.ns_per_tick_q32 as u128) >> 32) as u64,
        None => later,
    }
}

#[cfg(target_arch = "x86_64")]
#[inline]
fn read_counter() -> Option<u64> {
    // SAFETY: RDTSC exists on every x86-64 CPU and has no memory effects.
    Some(unsafe { core::arch::x86_64::_rdtsc() })
}

#[cfg(not(target_arch = "x86_64"))]
fn read_counter() -> Option<u64> {
    None
}

/// The kernel's word that the counter runs at one rate in every P- and
/// C-state and on every CPU.
fn counter_is_invariant() -> bool {
    if !cfg!(target_arch = "x86_64") {
        return false;
    }
    let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else {
        return false;
    };
    let Some(flags) = info.lines().find(|l| l.starts_with("flags")) else {
        return false;
    };
    let has = |f: &str| flags.split_whitespace().any(|w| w == f);
    has("constant_tsc") && has("nonstop_tsc")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A measured sleep reads as that sleep, within the rate's error. Each
    /// reading of ours is bracketed by two of the monotonic clock: a thread
    /// taken off its CPU between two readings (a loaded machine) widens the
    /// bracket instead of failing the test.
    #[test]
    fn elapsed_matches_the_monotonic_clock() {
        calibrate();
        for ms in [1u64, 5, 20] {
            let (i0, t, i1) = (Instant::now(), now(), Instant::now());
            std::thread::sleep(Duration::from_millis(ms));
            let (j0, ours, j1) = (Instant::now(), elapsed_ns(t), Instant::now());
            let least = (j0 - i1).as_nanos() as u64;
            let most = (j1 - i0).as_nanos() as u64;
            // The rate's error (2%, far above calibration's) and 20 µs.
            let slack = most / 50 + 20_000;
            assert!(
                ours + slack >= least && ours <= most + slack,
                "{ms} ms: clock says {ours} ns, monotonic clock {least}-{most} ns"
            );
        }
    }
}
