//! The workloads' random numbers: `inkfs::testkit::Rng` in its xorshift64*
//! form, the generator these workloads have always drawn from (so a run
//! recorded with `--seed S` gets the same workload again), its draws in a
//! range made by scaling (`Rng::scaled_below`), and filebench's file-size
//! distribution.

pub use inkfs::testkit::Rng;

/// The generator of a workload run with `--seed seed`.
pub fn seeded(seed: u64) -> Rng {
    Rng::xorshift64star(seed)
}

/// filebench's file sizes: gamma-distributed around `mean` (shape
/// `filesizegamma`/1000 = 1.5), capped at 16 × the mean.
pub fn file_size(rng: &mut Rng, mean: u64, shape: f64) -> u64 {
    if mean == 0 {
        return 0;
    }
    let s = rng.gamma(shape) * mean as f64 / shape;
    (s as u64).min(mean * 16)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn file_size_mean_is_close() {
        let mut r = seeded(7);
        let n = 20_000;
        let sum: u64 = (0..n).map(|_| file_size(&mut r, 16384, 1.5)).sum();
        let mean = sum as f64 / n as f64;
        assert!((mean - 16384.0).abs() < 16384.0 * 0.05, "mean {mean}");
    }
    #[test]
    fn scaled_below_in_range() {
        let mut r = seeded(1);
        for _ in 0..1000 {
            assert!(r.scaled_below(10) < 10);
        }
    }
}
