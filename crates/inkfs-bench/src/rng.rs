//! A small deterministic generator (xorshift64*) and the distributions the
//! workloads draw from. No dependency, same sequence on every machine.

pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in 0..n (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        (((self.next_u64() >> 11) as u128 * n as u128) >> 53) as u64
    }
    /// Uniform in (0, 1).
    pub fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    pub fn normal(&mut self) -> f64 {
        let (u, v) = (self.unit(), self.unit());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
    /// Gamma(shape, 1), Marsaglia–Tsang (shape >= 1; boosted below 1).
    pub fn gamma(&mut self, shape: f64) -> f64 {
        if shape < 1.0 {
            let u = self.unit();
            return self.gamma(shape + 1.0) * u.powf(1.0 / shape);
        }
        let d = shape - 1.0 / 3.0;
        let c = 1.0 / (9.0 * d).sqrt();
        loop {
            let x = self.normal();
            let v = 1.0 + c * x;
            if v <= 0.0 {
                continue;
            }
            let v = v * v * v;
            let u = self.unit();
            if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
                return d * v;
            }
        }
    }
    /// filebench's file sizes: gamma-distributed around `mean` (shape
    /// `filesizegamma`/1000 = 1.5), capped at 16 × the mean.
    pub fn file_size(&mut self, mean: u64, shape: f64) -> u64 {
        if mean == 0 {
            return 0;
        }
        let s = self.gamma(shape) * mean as f64 / shape;
        (s as u64).min(mean * 16)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn gamma_mean_is_close() {
        let mut r = Rng::new(7);
        let n = 20_000;
        let sum: u64 = (0..n).map(|_| r.file_size(16384, 1.5)).sum();
        let mean = sum as f64 / n as f64;
        assert!((mean - 16384.0).abs() < 16384.0 * 0.05, "mean {mean}");
    }
    #[test]
    fn below_in_range() {
        let mut r = Rng::new(1);
        for _ in 0..1000 {
            assert!(r.below(10) < 10);
        }
    }
}
