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
        let (t0, c0) = (Instant::now(), read_counter()?);
        while t0.elapsed() < CALIBRATION {
            std::hint::spin_loop();
        }
        let (ns, c1) = (t0.elapsed().as_nanos() as u64, read_counter()?);
        let ticks = c1.checked_sub(c0).filter(|&t| t > 0)?;
        Some(Rate {
            ns_per_tick_q32: (((ns as u128) << 32) / ticks as u128) as u64,
        })
    })
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

    /// A measured sleep reads as that sleep, within scheduling slack.
    #[test]
    fn elapsed_matches_the_monotonic_clock() {
        calibrate();
        for ms in [1u64, 5, 20] {
            let (t, i) = (now(), Instant::now());
            std::thread::sleep(Duration::from_millis(ms));
            let (ours, real) = (elapsed_ns(t), i.elapsed().as_nanos() as u64);
            let diff = ours.abs_diff(real);
            assert!(
                diff < real / 50 + 20_000,
                "{ms} ms: clock says {ours} ns, monotonic clock {real} ns"
            );
        }
    }
}
