//! Latency samples and their JSON summary.

use std::time::Instant;

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
    pub fn json(&self, keep: usize) -> String {
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
        let samples: Vec<String> = self
            .ns
            .iter()
            .step_by(stride)
            .map(|v| v.to_string())
            .collect();
        format!(
            "{{\"n\":{n},\"mean_ns\":{mean:.1},\"p50_ns\":{},\"p90_ns\":{},\"p99_ns\":{},\"max_ns\":{},\"samples_ns\":[{}]}}",
            pct(0.5),
            pct(0.9),
            pct(0.99),
            s.last().copied().unwrap_or(0),
            samples.join(",")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn percentiles() {
        let l = Lat {
            ns: (1..=100).rev().collect(),
        };
        let j = l.json(10);
        assert!(j.contains("\"n\":100"));
        assert!(j.contains("\"p50_ns\":51") || j.contains("\"p50_ns\":50"));
        assert!(j.contains("\"max_ns\":100"));
        assert!(j.contains("\"mean_ns\":50.5"));
    }
}
