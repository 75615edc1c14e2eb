//! Directory leases, the server's side (docs/KERNEL-FREE.md, "Built:
//! directory leases on the server"; the words: `inkfs::api::dirlease`).
//!
//! The lease table holds a directory's lease as a file's (crate::lease:
//! an entry flagged `dir`, recalled by the engine's hook before any use of
//! the directory, settled at `released` or the holder's death). What is
//! particular to a directory is here:
//!
//! - **The grant's preparation** (`prepare`): the directory must be
//!   LIVE, not an orphan, not immutable, and no holder of it may have been
//!   killed at the recall timeout in the last second. Then what the kernel
//!   holds under it: nothing if it does not know the directory (a dentry,
//!   positive or negative, holds its parent; so does a cached listing);
//!   else the children it counts (at most
//!   [`inkfs::api::dirlease::KERNEL_CHILDREN_MAX`], "many" beyond), and
//!   the kernel is made to forget the names it may hold under it, so that
//!   no name a client creates under the lease stays hidden behind a
//!   negative dentry: the directory's attributes and cached listing
//!   (`inval_inode`), and its entry in its parent (`inval_entry`), which
//!   the kernel's `d_invalidate` follows by pruning every unused dentry
//!   under it, negative ones included (measured: a stat of D/x through
//!   the mount reaches the server again after it, also from a process
//!   whose working directory is D; `inval_inode` alone does not). The
//!   root has no entry in a parent: its negative names are recorded as
//!   the kernel makes them ([`RootNegatives`]) and each is invalidated.
//!   Every invalidation is sent synchronously, with the landing loop of
//!   crate::inval, before the grant.
//! - **The counters** of `inkfs stat` ([`DirBooks`]): granted, recalled,
//!   refused by reason ("no lane free" among them: crate::lanes).
//!
//! Ownership: the mount server's, DRAM only; nothing of it survives the
//! server (a client's lease ends with its session, or the server's).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use inkfs::api::dirlease::TIMEOUT_REFUSAL_MS;
use inkfs::api::dirlease::{KernelView, Refusal, GRANT_WALK_MAX, KERNEL_CHILDREN_MAX};

use crate::fs::CACHE_TTL;
use crate::inval::Change;
use crate::lease::Leases;
use crate::Engine;

/// The root's node id.
const ROOT: u64 = 1;
/// Negative names of the root kept at most; past them the root's negative
/// lookups are answered with a zero TTL, and its lease is refused until
/// the kernel's older negative entries have expired.
pub const NEGATIVES_MAX: usize = 64;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The lease table's counters of directory leases, and the recent recall
/// timeouts.
#[derive(Default)]
pub struct DirBooks {
    granted: AtomicU64,
    recalled: AtomicU64,
    refused: [AtomicU64; Refusal::ALL.len()],
    /// Directories whose holder was killed at the recall timeout, when.
    timeouts: Mutex<HashMap<u64, Instant>>,
}

impl DirBooks {
    pub(crate) fn granted(&self) {
        self.granted.fetch_add(1, Relaxed);
    }

    pub(crate) fn recalled(&self) {
        self.recalled.fetch_add(1, Relaxed);
    }

    pub(crate) fn refused(&self, why: Refusal) {
        let i = Refusal::ALL.iter().position(|&r| r == why).unwrap_or(0);
        self.refused[i].fetch_add(1, Relaxed);
    }

    /// A holder of `dir` was killed at the recall timeout.
    pub(crate) fn timed_out(&self, dir: u64) {
        let mut t = lock(&self.timeouts);
        let now = Instant::now();
        t.retain(|_, at| now.duration_since(*at) < refusal_window());
        t.insert(dir, now);
    }

    fn timed_out_recently(&self, dir: u64) -> bool {
        lock(&self.timeouts)
            .get(&dir)
            .is_some_and(|at| at.elapsed() < refusal_window())
    }

    /// (granted, recalled, refused by reason in `Refusal::ALL`'s order).
    pub fn counts(&self) -> (u64, u64, Vec<(Refusal, u64)>) {
        let refused = Refusal::ALL
            .iter()
            .zip(&self.refused)
            .map(|(&r, n)| (r, n.load(Relaxed)))
            .collect();
        (
            self.granted.load(Relaxed),
            self.recalled.load(Relaxed),
            refused,
        )
    }
}

/// The `inkfs stat` key of a refusal's count.
pub fn refusal_key(why: Refusal) -> &'static str {
    match why {
        Refusal::NotDir => "dir_leases_refused_notdir",
        Refusal::Gone => "dir_leases_refused_gone",
        Refusal::Immutable => "dir_leases_refused_immutable",
        Refusal::Overflow => "dir_leases_refused_overflow",
        Refusal::Timeout => "dir_leases_refused_timeout",
        Refusal::NoName => "dir_leases_refused_noname",
        Refusal::Shutdown => "dir_leases_refused_shutdown",
        Refusal::NoLane => "dir_leases_refused_no_lane",
        Refusal::Failed => "dir_leases_refused_failed",
        Refusal::Held => "dir_leases_refused_held",
    }
}

/// Its label in the text report.
pub fn refusal_label(why: Refusal) -> &'static str {
    match why {
        Refusal::NotDir => "directory leases refused: not a directory",
        Refusal::Gone => "directory leases refused: removed",
        Refusal::Immutable => "directory leases refused: immutable",
        Refusal::Overflow => "directory leases refused: negative names overflowed",
        Refusal::Timeout => "directory leases refused: a recall timed out",
        Refusal::NoName => "directory leases refused: name in parent not found",
        Refusal::Shutdown => "directory leases refused: ending",
        Refusal::NoLane => "directory leases refused: no lane free",
        Refusal::Failed => "directory leases refused: error",
        Refusal::Held => "directory leases refused: held by the asker",
    }
}

fn refusal_window() -> Duration {
    Duration::from_millis(TIMEOUT_REFUSAL_MS)
}

/// The names under the root the kernel may hold as negative dentries:
/// each it was answered "no such name" for (a LOOKUP), or removed through
/// the kernel (UNLINK, RMDIR, a RENAME's old name), since the root's last
/// lease and less than `CACHE_TTL` ago (older ones have expired in the
/// kernel). Owned by the mount's `KernelRefs` (the root's count never
/// goes to zero: the list is emptied by a grant, and by age).
///
/// The zero TTL past the bound applies only while clients are attached
/// (the caller decides: `InkFuse::lookup`): a mount no client uses keeps
/// caching every negative name for the hour, as before, and a client's
/// grant of the root is then refused until an hour after the last name
/// that did not fit.
#[derive(Default)]
pub struct RootNegatives {
    inner: Mutex<Negatives>,
}

#[derive(Default)]
struct Negatives {
    /// Each name, and when it was last recorded.
    names: Vec<(Box<[u8]>, Instant)>,
    /// A name could not be recorded at this instant: the kernel may hold
    /// negative names not listed until `CACHE_TTL` after it.
    overflowed: Option<Instant>,
}

impl Negatives {
    fn overflowed(&self) -> bool {
        self.overflowed.is_some_and(|t| t.elapsed() < CACHE_TTL)
    }
}

impl RootNegatives {
    /// The kernel may cache `name` under the root as negative from now
    /// for `CACHE_TTL`: false if the list is full (the kernel may then
    /// hold a name not listed: the root's lease is refused for the hour;
    /// the caller may answer a lookup with a zero TTL instead, so that no
    /// such dentry is made).
    pub fn record(&self, name: &[u8]) -> bool {
        let mut n = lock(&self.inner);
        let now = Instant::now();
        n.names
            .retain(|(_, at)| now.duration_since(*at) < CACHE_TTL);
        if let Some(k) = n.names.iter_mut().find(|k| &k.0[..] == name) {
            k.1 = now;
            return true;
        }
        if n.names.len() >= NEGATIVES_MAX {
            n.overflowed = Some(now);
            return false;
        }
        n.names.push((name.into(), now));
        true
    }

    /// Whether a negative lookup under the root is answered with a zero
    /// TTL now (the list overflowed less than `CACHE_TTL` ago).
    pub fn zero_ttl(&self) -> bool {
        lock(&self.inner).overflowed()
    }

    /// Names recorded now (statistics, tests).
    pub fn len(&self) -> usize {
        lock(&self.inner).names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The names to invalidate at a grant of the root's lease, taken out
    /// of the list; None if the list overflowed less than `CACHE_TTL` ago
    /// (the kernel may hold names it does not list).
    fn take(&self) -> Option<Vec<Box<[u8]>>> {
        let mut n = lock(&self.inner);
        if n.overflowed() {
            return None;
        }
        n.overflowed = None;
        Some(
            std::mem::take(&mut n.names)
                .into_iter()
                .map(|k| k.0)
                .collect(),
        )
    }
}

/// Prepare the grant of directory `ino`'s lease (see the module comment):
/// what the kernel held under it, once it has forgotten the names it may
/// hold there; or the errno of the refusal (`Refusal::from_errno`).
pub(crate) fn prepare(leases: &Leases, engine: &Engine, ino: u64) -> Result<KernelView, i32> {
    engine.dir_lease_check(ino).map_err(|e| e.errno())?;
    if leases.dirs.timed_out_recently(ino) {
        return Err(libc::ETIMEDOUT);
    }
    let inval = leases.inval();
    // Without the kernel's counts nothing can be said of what it holds.
    let refs = inval.refs().ok_or(libc::EIO)?;
    if !refs.knows(ino) {
        // No dentry under it, no listing, no attributes: nothing to drop.
        return Ok(KernelView::Unknown);
    }
    // The entries first, the counts after: no lock of the kernel's table
    // is taken under the directory's.
    let mut entries = Vec::new();
    let parent = engine
        .dir_walk(ino, &mut |e| {
            entries.push(e.ino);
            entries.len() <= GRANT_WALK_MAX
        })
        .map_err(|e| e.errno())?;
    let mut many = entries.len() > GRANT_WALK_MAX;
    let mut children = Vec::new();
    for child in entries {
        if many {
            break;
        }
        if refs.counted(child) {
            children.push(child);
            many = children.len() > KERNEL_CHILDREN_MAX;
        }
    }
    // The names first: a name found missing before the listing was
    // dropped must not come back from it.
    if ino == ROOT {
        let names = refs.negatives().take().ok_or(libc::EBUSY)?;
        for name in names {
            inval.changed_now(Change::Entry {
                parent: ROOT,
                name: name.into_vec(),
            });
        }
    } else {
        let name = name_in(engine, parent, ino)?.ok_or(libc::ESTALE)?;
        inval.changed_now(Change::Entry { parent, name });
    }
    // Its attributes and cached listing (its pages).
    inval.changed_now(Change::Data {
        ino,
        off: 0,
        len: 0,
    });
    Ok(if many {
        KernelView::Many
    } else {
        KernelView::Children(children)
    })
}

/// The name of directory `ino` in its parent `parent` (a directory has
/// one), walking at most `GRANT_WALK_MAX` entries.
fn name_in(engine: &Engine, parent: u64, ino: u64) -> Result<Option<Vec<u8>>, i32> {
    let mut found = None;
    let mut walked = 0usize;
    engine
        .dir_walk(parent, &mut |e| {
            walked += 1;
            if e.ino == ino {
                found = Some(e.name.clone());
                return false;
            }
            walked < GRANT_WALK_MAX
        })
        .map_err(|e| e.errno())?;
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names are recorded once each up to the bound; past it the root
    /// answers negative lookups with a zero TTL and no grant can take the
    /// list; a take empties it.
    #[test]
    fn the_root_list_overflows_into_a_zero_ttl_and_a_refusal() {
        let r = RootNegatives::default();
        assert!(r.record(b"a"));
        assert!(r.record(b"a"));
        assert_eq!(r.len(), 1);
        assert_eq!(r.take().map(|v| v.len()), Some(1));
        assert!(r.is_empty());
        for i in 0..NEGATIVES_MAX {
            assert!(r.record(format!("n{i}").as_bytes()));
        }
        assert!(!r.zero_ttl());
        assert!(r.record(b"n0"), "a name listed already needs no room");
        assert!(!r.record(b"one-more"));
        assert!(r.zero_ttl());
        assert!(r.take().is_none(), "an overflowed list taken");
        assert_eq!(r.len(), NEGATIVES_MAX);
    }

    #[test]
    fn refusals_are_counted_by_reason() {
        let b = DirBooks::default();
        b.refused(Refusal::Overflow);
        b.refused(Refusal::Overflow);
        b.refused(Refusal::Gone);
        b.granted();
        let (g, r, by) = b.counts();
        assert_eq!((g, r), (1, 0));
        let n = |w| by.iter().find(|(x, _)| *x == w).map(|x| x.1);
        assert_eq!(n(Refusal::Overflow), Some(2));
        assert_eq!(n(Refusal::Gone), Some(1));
        assert_eq!(n(Refusal::NotDir), Some(0));
        assert!(!b.timed_out_recently(5));
        b.timed_out(5);
        assert!(b.timed_out_recently(5));
        assert!(!b.timed_out_recently(6));
    }
}
