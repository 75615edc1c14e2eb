//! Corruption met while mounted, handled as ext4 handles it with `errors=`
//! (docs/DESIGN.md "Errors met while mounted").
//!
//! A clean mount reads no log (docs/DESIGN.md "Recovery"), so damage is met
//! at run time: when an inode is first loaded, when its blocks are freed,
//! when GC reads its log, when a scrub checks it. Each of those places hands
//! the error to [`Fs::corruption`], the one place that
//! - counts it (`Fs::error_stats`, shown by `inkfs stat MOUNTPOINT`);
//! - says so on stderr and in the system log (rate-limited);
//! - records it in the superblock (count, first and last time, inode,
//!   reason), with the superblock's own ordering: the primary persisted,
//!   then the backup, each sealed by its checksum, so a crash leaves the
//!   old record or the new one;
//! - under `errors=remount-ro`, turns the file system read-only.
//!
//! The next read-write mount refuses a pool whose record is not empty,
//! until `inkfs fsck -y` finds it clean and clears the record (e2fsck
//! forced by ext4's ERROR_FS).
//!
//! Read-only: one atomic flag, set before the record is written and read by
//! every mutating call at its start (`Fs::check_writable`). A call already
//! past that check finishes, and commits atomically as every call does;
//! every call that starts after the flag is set fails with EROFS, reads go
//! on. From then on the engine writes only the error record until the
//! unmount: an orphan's last close leaves it to the unmount, and GC stops.
//! The unmount is the usual clean one (orphans freed, allocator saved,
//! state clean; the record kept): every call committed atomically, so the
//! allocator is consistent, and a clean pool mounts read-only without the
//! crash scan, which a damaged log would make refuse the pool. The user can
//! copy data off a read-only mount before running fsck.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::format::ErrorReason;
use crate::fs::Fs;
use crate::inode::lock;
use crate::pmem::Pmem;
use crate::superblock;
use crate::time::now_ns;
use crate::types::{ErrorRecord, ErrorStats, ErrorsPolicy};

/// At most this many error messages per window; the rest are counted and
/// summarised with the next one printed (a damaged inode met in a loop
/// must not flood the system log).
const MESSAGES_PER_WINDOW: u32 = 10;
const WINDOW: Duration = Duration::from_secs(60);

/// The engine's error state (one per mount).
pub(crate) struct Health {
    policy: ErrorsPolicy,
    /// Errors met during this mount.
    count: AtomicU64,
    /// Set once by the first error under `errors=remount-ro`.
    remounted_ro: AtomicBool,
    /// Set when the mount is complete: damage met by the mount itself
    /// fails the mount, which tells its caller; nothing is recorded.
    armed: AtomicBool,
    messages: Mutex<RateLimit>,
}

#[derive(Default)]
struct RateLimit {
    window_start: Option<Instant>,
    in_window: u32,
    suppressed: u64,
}

impl RateLimit {
    /// Whether to print a message now, and how many were suppressed since
    /// the last one printed.
    fn admit(&mut self, now: Instant) -> Option<u64> {
        match self.window_start {
            Some(start) if now.duration_since(start) < WINDOW => {}
            _ => {
                self.window_start = Some(now);
                self.in_window = 0;
            }
        }
        if self.in_window >= MESSAGES_PER_WINDOW {
            self.suppressed += 1;
            return None;
        }
        self.in_window += 1;
        Some(std::mem::take(&mut self.suppressed))
    }
}

impl Health {
    pub(crate) fn new(policy: ErrorsPolicy) -> Health {
        Health {
            policy,
            count: AtomicU64::new(0),
            remounted_ro: AtomicBool::new(false),
            armed: AtomicBool::new(false),
            messages: Mutex::new(RateLimit::default()),
        }
    }

    /// The mount is complete: from now on damage goes through the policy.
    pub(crate) fn arm(&self) {
        self.armed.store(true, Ordering::Release);
    }

    /// True once `errors=remount-ro` has turned the file system read-only.
    #[inline]
    pub(crate) fn is_remounted_ro(&self) -> bool {
        // Acquire pairs with the SeqCst swap in `Fs::note_corruption`: a
        // call that sees the flag also sees the error that set it.
        self.remounted_ro.load(Ordering::Acquire)
    }
}

impl<P: Pmem> Fs<P> {
    /// The one place corruption met while mounted goes through: if `e` is
    /// `Error::Corrupt`, count, report and record it and apply the
    /// `errors=` policy. Returns `e` unchanged, so a call site reads
    /// `.map_err(|e| self.corruption(ErrorReason::Log, Some(ino), e))`.
    pub(crate) fn corruption(&self, reason: ErrorReason, ino: Option<u64>, e: Error) -> Error {
        if let Error::Corrupt(msg) = &e {
            self.note_corruption(reason, ino, msg);
        }
        e
    }

    /// `corruption` for a damage found without an `Error` (scrub).
    pub(crate) fn note_corruption(&self, reason: ErrorReason, ino: Option<u64>, msg: &str) {
        let h = &self.health;
        if !h.armed.load(Ordering::Acquire) {
            return;
        }
        let n = h.count.fetch_add(1, Ordering::Relaxed) + 1;
        // Read-only first: every call that starts from here on is refused,
        // while the record is being written.
        let turned_ro = !self.read_only
            && h.policy == ErrorsPolicy::RemountRo
            && !h.remounted_ro.swap(true, Ordering::SeqCst);
        if !self.read_only {
            self.record_error(reason, ino);
        }
        let id = self.pool_id();
        let what = match ino {
            Some(ino) => format!("inode {ino}, {}", reason.name()),
            None => reason.name().to_string(),
        };
        let admitted = lock(&h.messages).admit(Instant::now());
        if let Some(suppressed) = admitted {
            if suppressed > 0 {
                say(&format!(
                    "inkfs {id}: {suppressed} more error message(s) suppressed"
                ));
            }
            let after = match (self.read_only, h.policy) {
                (true, _) => "read-only mount: not recorded in the superblock",
                (false, ErrorsPolicy::RemountRo) => "errors=remount-ro",
                (false, ErrorsPolicy::Continue) => "errors=continue: still serving",
            };
            say(&format!(
                "inkfs {id}: error {n} of this mount: corruption met ({what}): {msg} ({after})"
            ));
        }
        if turned_ro {
            // Always said, once: it changes what every later call gets.
            say(&format!(
                "inkfs {id}: errors=remount-ro: the file system is now read-only; \
                 unmount it and run `inkfs fsck -y` on the pool"
            ));
        }
    }

    /// Add one error to the superblock's record and persist it, primary
    /// then backup (`superblock::write_superblocks`): a crash leaves one
    /// intact copy holding the old record or the new one.
    fn record_error(&self, reason: ErrorReason, ino: Option<u64>) {
        debug_assert!(!self.read_only, "a read-only mount writes nothing");
        let now = now_ns().max(0) as u64;
        let ino = ino.unwrap_or(0);
        // The superblock mutex orders concurrent errors (and every other
        // superblock write of a mounted pool).
        let mut sb = lock(&self.sb);
        if sb.errors_count == 0 {
            sb.first_error_unix_ns = now;
            sb.first_error_ino = ino;
            sb.first_error_reason = reason.code();
        }
        sb.errors_count = sb.errors_count.saturating_add(1);
        sb.last_error_unix_ns = now;
        sb.last_error_ino = ino;
        sb.last_error_reason = reason.code();
        sb.seal();
        superblock::write_superblocks(&self.pm, &sb);
    }

    /// Corruption met while mounted: the count, the policy and the
    /// superblock's record.
    pub fn error_stats(&self) -> ErrorStats {
        ErrorStats {
            policy: self.health.policy,
            count: self.health.count.load(Ordering::Relaxed),
            recorded: ErrorRecord::of(&lock(&self.sb)),
            remounted_ro: self.health.is_remounted_ro(),
        }
    }

    /// The pool's identity in messages: its uuid (the engine does not know
    /// the path it was opened by).
    fn pool_id(&self) -> String {
        let u = lock(&self.sb).uuid;
        let hex: String = u.iter().map(|b| format!("{b:02x}")).collect();
        format!(
            "pool {}-{}-{}-{}-{}",
            &hex[0..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..32]
        )
    }
}

/// One line on stderr and in the system log (LOG_ERR, facility daemon).
/// No openlog: that would change the identity of the whole process's log
/// lines when the engine runs inside another program (the preload
/// library); syslog(3) then names the program itself.
fn say(line: &str) {
    eprintln!("{line}");
    let Ok(c) = std::ffi::CString::new(line.replace('\0', " ")) else {
        return;
    };
    // SAFETY: a constant "%s" format with one NUL-terminated string
    // argument that lives for the whole call.
    unsafe { libc::syslog(libc::LOG_ERR | libc::LOG_DAEMON, c"%s".as_ptr(), c.as_ptr()) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_rate_limited_and_suppressions_counted() {
        let mut r = RateLimit::default();
        let t0 = Instant::now();
        for _ in 0..MESSAGES_PER_WINDOW {
            assert_eq!(r.admit(t0), Some(0));
        }
        assert_eq!(r.admit(t0), None);
        assert_eq!(r.admit(t0 + Duration::from_secs(1)), None);
        // A new window: the first message says how many were dropped.
        assert_eq!(r.admit(t0 + WINDOW), Some(2));
        assert_eq!(r.admit(t0 + WINDOW), Some(0));
    }
}
