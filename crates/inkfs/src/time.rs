//! Wall-clock time in the on-media unit (i64 nanoseconds since the epoch).

/// Now, in nanoseconds since the Unix epoch (clock_gettime via the vDSO:
/// no system call).
pub fn now_ns() -> i64 {
    match std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => d.as_nanos().min(i64::MAX as u128) as i64,
        Err(e) => -(e.duration().as_nanos().min(i64::MAX as u128) as i64),
    }
}
