//! Wall-clock time in the on-media unit (i64 nanoseconds since the epoch).

/// Now, in nanoseconds since the Unix epoch (clock_gettime via the vDSO:
/// no system call), at the clock's full precision: a write's mtime tells
/// it apart from the one before (make, rsync, git compare them). Read
/// with `clock_gettime` directly: `SystemTime::now` and `duration_since`
/// reach the same vDSO call through a `Duration` and a 128-bit multiply,
/// a third of the read's cost at every durable write.
pub fn now_ns() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is ours to fill; CLOCK_REALTIME always exists (the call
    // cannot fail with a valid pointer and clock).
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    debug_assert_eq!(rc, 0, "clock_gettime(CLOCK_REALTIME)");
    ts.tv_sec
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec)
}

/// `unix_ns` as an ISO 8601 UTC time to the second ("2026-11-22T10:31:07Z"),
/// for messages a user reads (error records, fsck).
pub fn utc_string(unix_ns: u64) -> String {
    let secs = unix_ns / 1_000_000_000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::{now_ns, utc_string};

    #[test]
    fn now_is_the_system_clock_in_nanoseconds() {
        let std_ns = |t: std::time::SystemTime| {
            t.duration_since(std::time::UNIX_EPOCH).expect("after 1970").as_nanos() as i64
        };
        let before = std_ns(std::time::SystemTime::now());
        let now = now_ns();
        let after = std_ns(std::time::SystemTime::now());
        assert!(before <= now && now <= after, "{before} {now} {after}");
    }

    #[test]
    fn utc_strings() {
        assert_eq!(utc_string(0), "1970-01-01T00:00:00Z");
        // date -u -d @951782400 → 2000-02-29 00:00:00 (a leap day).
        assert_eq!(utc_string(951_782_400_000_000_000), "2000-02-29T00:00:00Z");
        // date -u -d @1795347067 → 2026-11-22 11:31:07.
        assert_eq!(
            utc_string(1_795_347_067_123_456_789),
            "2026-11-22T11:31:07Z"
        );
    }
}
