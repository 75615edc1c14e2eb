//! The credentials of the process behind a FUSE request.
//!
//! A request carries the caller's fsuid, fsgid and thread id, but not its
//! supplementary groups, which the engine's permission checks need (a user
//! may read a group-readable file through a group that is not its primary
//! one). They come from `/proc/TID/status`, read once per (thread, uid,
//! gid) and kept for [`TTL`]: a process that changes its groups without
//! changing its ids (setgroups needs root, and daemons call it before they
//! drop to another uid, which changes the key) is seen with its old groups
//! for at most that long. The kernel's own check (`default_permissions`)
//! stands in front with the exact groups either way.
//!
//! Namespace requests look here; reads and writes go through open files
//! and never do.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use inkfs::api::Credentials;

/// How long a process's groups are trusted without reading them again.
pub const TTL: Duration = Duration::from_secs(1);
/// Entries kept at most per shard; a full shard is emptied (the next
/// requests re-read their groups).
const SHARD_ENTRIES_MAX: usize = 1024;
const SHARDS: usize = 16;

/// (thread id, fsuid, fsgid)
type Key = (u32, u32, u32);
/// The credentials read for a key, and when.
type Shard = RwLock<HashMap<Key, (Arc<Credentials>, Instant)>>;

pub struct CredCache {
    shards: Vec<Shard>,
    root: Arc<Credentials>,
}

impl Default for CredCache {
    fn default() -> Self {
        CredCache {
            shards: (0..SHARDS).map(|_| RwLock::default()).collect(),
            root: Arc::new(Credentials::root()),
        }
    }
}

impl CredCache {
    /// The credentials of thread `pid` running as `uid`/`gid`. The umask is
    /// 0: FUSE hands it with each creation request, and the front end
    /// applies it there.
    pub fn get(&self, pid: u32, uid: u32, gid: u32) -> Arc<Credentials> {
        if uid == 0 && gid == 0 {
            // Root passes every check whatever its groups.
            return self.root.clone();
        }
        let key = (pid, uid, gid);
        let shard = &self.shards[pid as usize % SHARDS];
        if let Some((c, at)) = shard.read().unwrap_or_else(|p| p.into_inner()).get(&key) {
            if at.elapsed() < TTL {
                return c.clone();
            }
        }
        let cred = Arc::new(Credentials {
            uid,
            gid,
            groups: groups_of(pid),
            umask: 0,
        });
        let mut map = shard.write().unwrap_or_else(|p| p.into_inner());
        if map.len() >= SHARD_ENTRIES_MAX {
            map.clear();
        }
        map.insert(key, (cred.clone(), Instant::now()));
        cred
    }
}

/// The supplementary groups of thread `pid` (`Groups:` in its status);
/// none if it is gone or unreadable (the check then uses the primary group
/// only, stricter than the kernel's, never looser).
fn groups_of(pid: u32) -> Vec<u32> {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return Vec::new();
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .map(|g| {
            g.split_whitespace()
                .filter_map(|n| n.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_groups_are_read_and_cached() {
        let pid = std::process::id();
        // SAFETY: getgroups with a zero size only returns the count.
        let n = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
        let cache = CredCache::default();
        let c = cache.get(pid, 1234, 5678);
        assert_eq!(c.groups.len(), n.max(0) as usize);
        assert!(Arc::ptr_eq(&c, &cache.get(pid, 1234, 5678)), "cached");
        assert!(
            !Arc::ptr_eq(&c, &cache.get(pid, 1234, 5679)),
            "keyed by gid"
        );
        assert!(cache.get(pid, 0, 0).is_root());
        assert!(cache.get(u32::MAX, 7, 7).groups.is_empty(), "a gone thread");
    }
}
