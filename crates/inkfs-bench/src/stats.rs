//! Latency samples and their JSON summary.

use std::time::Instant;

use serde_json::{json, Value};

#[derive(Default)]
pub struct Lat {
    pub ns: Vec<u64>,
}

impl Lat {
    pub fn push(&mut self, since: Instant) {
        self.ns.push(since.elapsed().as_nanos() as u64);
    }
    /// {"n","mean_ns","p50_ns","p90_ns","p99_ns","max_ns","samples_ns":[...]}
    /// with at most `keep` samples (evenly strided, in time order).
    pub fn json(&self, keep: usize) -> Value {
        let mut s = self.ns.clone();
        s.sort_unstable();
        let n = s.len();
        let pct = |p: f64| {
            if n == 0 {
                0
            } else {
                s[((n - 1) as f64 * p).round() as usize]
            }
        };
        let mean = if n == 0 {
            0.0
        } else {
            s.iter().sum::<u64>() as f64 / n as f64
        };
        let stride = n.div_ceil(keep.max(1)).max(1);
        let samples: Vec<u64> = self.ns.iter().step_by(stride).copied().collect();
        json!({
            "n": n,
            "mean_ns": round(mean, 1),
            "p50_ns": pct(0.5),
            "p90_ns": pct(0.9),
            "p99_ns": pct(0.99),
            "max_ns": s.last().copied().unwrap_or(0),
            "samples_ns": samples,
        })
    }
}

/// `x` rounded to `digits` decimals, as the figures were printed before
/// they went through serde_json (`{:.1}`, ...). A non-finite `x` (a rate
/// over zero seconds) becomes JSON null.
pub fn round(x: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (x * scale).round() / scale
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn percentiles() {
        let l = Lat {
            ns: (1..=100).rev().collect(),
        };
        let j = l.json(10).to_string();
        assert!(j.starts_with("{\"n\":100,\"mean_ns\":50.5,"), "{j}");
        assert!(j.contains("\"p50_ns\":51") || j.contains("\"p50_ns\":50"));
        assert!(j.contains("\"max_ns\":100"));
        assert!(
            j.ends_with("\"samples_ns\":[100,90,80,70,60,50,40,30,20,10]}"),
            "{j}"
        );
        assert_eq!(round(2.0 / 3.0, 2), 0.67);
        assert_eq!(json!(round(1.0 / 0.0, 1)), Value::Null);
    }
}
