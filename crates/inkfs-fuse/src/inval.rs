//! Telling the kernel that an inode or a name changed behind its back.
//!
//! The kernel keeps what this server told it: attributes and names for
//! `fs::CACHE_TTL` (negative lookups included), file pages across opens,
//! and, with posix mode's writeback cache, a regular file's size, mtime and
//! ctime between write-backs. Every change made through this kernel keeps
//! those caches right by itself (it updates or drops what the change
//! touches). A change made any other way must be pushed to it here: today
//! the few the engine makes on its own (set-id bits that a write or an
//! `O_TRUNC` open by an unprivileged caller drops, the ctime a `chattr`
//! sets); later every change a process makes by writing the pool directly
//! (the kernel-free path), which is to call [`Invalidator::changed`] with
//! what it changed.
//!
//! What each [`Change`] makes the kernel do (fs/fuse/inode.c and dir.c,
//! `fuse_reverse_inval_inode`, `fuse_reverse_inval_entry`):
//! - [`Change::Attr`]: the attributes are asked again at their next use.
//!   Under the writeback cache the kernel keeps its own size, mtime and
//!   ctime of a regular file while it holds the inode (it trusts them over
//!   ours), so a size or time changed elsewhere shows only once the kernel
//!   has let the inode go; a writer outside the kernel must not change a
//!   cached file's size while the kernel holds dirty pages of it.
//! - [`Change::Data`]: attributes, and the cached pages of a byte range.
//!   With the writeback cache the kernel first writes dirty pages of the
//!   range back, as WRITE requests to this server.
//! - [`Change::Entry`]: the kernel forgets a name (a dentry, or a negative
//!   one: "no such name") in a directory; the next lookup asks us. And the
//!   directory's cached listing (FOPEN_CACHE_DIR: the kernel lists
//!   directories from its page cache, `Caching::kernel_opendir`) is
//!   dropped, as the kernel drops it only when it held that name.
//! - [`Change::Deleted`]: as `Entry`, for a name that was removed, and
//!   inotify watchers of the directory are told.
//!
//! `Attr` is sent at once, from any thread, a request handler's included:
//! the kernel takes no lock for it that a request in flight may hold. The
//! others can block in the kernel (on write-back, which needs this
//! server's worker threads, or on the directory's lock, which the kernel
//! may hold while it waits for a request being served), so they go to one
//! thread of their own, in order; a caller never waits for them.
//!
//! **An inode the kernel is still taking in.** The kernel answers an
//! inode's invalidation with ENOENT when it has no inode of that number:
//! it never had one, it evicted it (its FORGET is on its way), or the
//! reply that hands it the inode is sent but not taken in yet
//! (`fuse_lookup_name` gets the reply, then `fuse_iget` makes the inode).
//! In that last case the reply then installs the attributes it carries,
//! read before the change, for the hour of `CACHE_TTL`, and nothing
//! corrects them. So [`Invalidator::changed_now`] sends an inode's
//! invalidation again while the kernel answers ENOENT and the server's
//! count of the inode (`KernelRefs::knows`) is above zero, until it lands
//! or the count falls to zero (the kernel forgot every reference it was
//! handed), within [`LANDING_TIMEOUT`]. Why that is enough, from the
//! kernel's code (fs/fuse/inode.c and dir.c):
//! - `fuse_reverse_inval_inode` finds the inode with `ilookup5`, which
//!   waits while it is new (`I_NEW`, until `fuse_iget`'s
//!   `unlock_new_inode`), then sets the inode's `attr_version` to a new
//!   connection-wide value and marks its attributes stale. Every reply
//!   takes the connection's `attr_version` before its request is sent,
//!   and `fuse_change_attributes` drops a reply's attributes when the
//!   inode's `attr_version` is newer: so once the invalidation lands, a
//!   reply whose engine call read the attributes before the change (its
//!   request was sent before the change, so before the invalidation) can
//!   no more install them, whether it was taken in before or after, and
//!   the window between `unlock_new_inode` and `fuse_change_attributes` in
//!   `fuse_iget` is closed the same way.
//! - A reply counted (`KernelRefs::hand`, before it is sent) keeps the
//!   count above zero until the kernel's FORGET of it, which comes only
//!   after `fuse_iget` took the reply in (or failed, then at once): so
//!   while a reply that may carry old attributes is not taken in, the
//!   count is above zero and the loop goes on; the kernel takes it in
//!   within a scheduling delay, and the next try lands.
//! - The count at zero: the kernel holds nothing of the inode, and
//!   `knows`, answering no, records a skip under the inode's shard lock,
//!   so a reply that read the attributes before the change and counts
//!   after that reads them again (as for a skipped invalidation).
//! - An inode the kernel evicts after the invalidation landed, looked up
//!   again by a reply whose request began before the change: the new inode
//!   has no `attr_version`, but the kernel's eviction counter (`evict_ctr`,
//!   taken with `attr_version`) tells `fuse_change_attributes_i` to leave
//!   the attributes marked stale (kernels 6.13 and later; this one is 6.18).
//!
//! Names need none of this: `fuse_reverse_inval_entry` takes the
//! directory's lock, which a LOOKUP or READDIRPLUS of a name in it holds
//! (shared) until its reply is taken in.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::kernel_refs::KernelRefs;

/// How long an inode's invalidation is tried again while the kernel is
/// taking the inode in (see the module comment): far above a scheduling
/// delay, and a bound should a kernel keep a reference it neither takes
/// in nor forgets (none known).
pub const LANDING_TIMEOUT: Duration = Duration::from_secs(2);

/// What changed behind the kernel's back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// The inode's attributes.
    Attr { ino: u64 },
    /// Its bytes `[off, off + len)` (`len` 0: to the end of file) and its
    /// attributes.
    Data { ino: u64, off: u64, len: u64 },
    /// The name `name` in directory `parent` (created, removed, renamed or
    /// pointed elsewhere).
    Entry { parent: u64, name: Vec<u8> },
    /// `name` in `parent`, which named `child`, is gone.
    Deleted {
        parent: u64,
        child: u64,
        name: Vec<u8>,
    },
}

/// Where notifications go: the FUSE session ([`KernelSink`]), or a
/// recorder in tests.
pub trait Sink: Send + Sync + 'static {
    /// `off` < 0: attributes only. An error of kind `NotFound`: the kernel
    /// has no inode `ino` (see the module comment).
    fn inval_inode(&self, ino: u64, off: i64, len: i64) -> io::Result<()>;
    fn inval_entry(&self, parent: u64, name: &OsStr) -> io::Result<()>;
    fn delete(&self, parent: u64, child: u64, name: &OsStr) -> io::Result<()>;
}

/// The FUSE session's sink. fuser's [`fuser::Notifier`] hides the
/// kernel's ENOENT (harmless to most servers), which tells an inode not
/// taken in yet (see the module comment): so an inode's invalidation is
/// written here, to the session's device (a duplicate of its descriptor),
/// and the rest goes through the notifier.
pub struct KernelSink {
    notifier: fuser::Notifier,
    dev: Option<std::fs::File>,
}

/// FUSE_NOTIFY_INVAL_INODE (include/uapi/linux/fuse.h).
const NOTIFY_INVAL_INODE: i32 = 2;

impl KernelSink {
    /// `dev`: the session's /dev/fuse descriptor, duplicated (None: every
    /// notification through `notifier`, ENOENT unseen).
    pub fn new(notifier: fuser::Notifier, dev: Option<std::os::fd::OwnedFd>) -> KernelSink {
        KernelSink {
            notifier,
            dev: dev.map(std::fs::File::from),
        }
    }
}

/// A notification to the kernel: `fuse_out_header` (len, error = the
/// notification's code, unique 0), then `fuse_notify_inval_inode_out`.
fn inval_inode_message(ino: u64, off: i64, len: i64) -> [u8; 40] {
    let mut m = [0u8; 40];
    m[0..4].copy_from_slice(&40u32.to_ne_bytes());
    m[4..8].copy_from_slice(&NOTIFY_INVAL_INODE.to_ne_bytes());
    m[16..24].copy_from_slice(&ino.to_ne_bytes());
    m[24..32].copy_from_slice(&off.to_ne_bytes());
    m[32..40].copy_from_slice(&len.to_ne_bytes());
    m
}

impl Sink for KernelSink {
    fn inval_inode(&self, ino: u64, off: i64, len: i64) -> io::Result<()> {
        let Some(dev) = &self.dev else {
            return fuser::Notifier::inval_inode(&self.notifier, fuser::INodeNo(ino), off, len);
        };
        let m = inval_inode_message(ino, off, len);
        // One write: the device takes a whole message or refuses it.
        match io::Write::write(&mut &*dev, &m)? {
            40 => Ok(()),
            n => Err(io::Error::other(format!("notification cut at {n} bytes"))),
        }
    }
    fn inval_entry(&self, parent: u64, name: &OsStr) -> io::Result<()> {
        self.notifier.inval_entry(fuser::INodeNo(parent), name)
    }
    fn delete(&self, parent: u64, child: u64, name: &OsStr) -> io::Result<()> {
        self.notifier
            .delete(fuser::INodeNo(parent), fuser::INodeNo(child), name)
    }
}

/// Send one change to `sink`, each inode's invalidation through `inode`
/// (which may wait for it to land, see the module comment).
fn send(
    sink: &dyn Sink,
    change: &Change,
    inode: &dyn Fn(u64, i64, i64) -> io::Result<()>,
) -> io::Result<()> {
    let listing = |parent: u64| inode(parent, 0, 0);
    // The kernel takes offsets as loff_t: a range past i64::MAX is "to the
    // end", as len 0 is.
    let signed = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    match change {
        Change::Attr { ino } => inode(*ino, -1, 0),
        Change::Data { ino, off, len } => inode(*ino, signed(*off), signed(*len)),
        // Both sent, the name first; the first failure is the result.
        Change::Entry { parent, name } => {
            let entry = sink.inval_entry(*parent, OsStr::from_bytes(name));
            let list = listing(*parent);
            entry.and(list)
        }
        Change::Deleted {
            parent,
            child,
            name,
        } => {
            let entry = sink.delete(*parent, *child, OsStr::from_bytes(name));
            let list = listing(*parent);
            entry.and(list)
        }
    }
}

/// An inode's invalidation sent once. ENOENT (the kernel has no such
/// inode) is no failure: it holds nothing of it, or, for a change the
/// kernel made itself, it is taking in a reply read after the change.
fn send_once(sink: &dyn Sink, ino: u64, off: i64, len: i64) -> io::Result<()> {
    match sink.inval_inode(ino, off, len) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

/// Between two tries of an invalidation the kernel is taking in: the
/// first ones only yield (the kernel's thread needs the CPU for a few µs),
/// then sleeps growing to 1.3 ms.
fn pause(tries: u32) {
    match tries {
        0..16 => std::thread::yield_now(),
        n => std::thread::sleep(Duration::from_micros(20u64 << (n - 16).min(6))),
    }
}

struct Attached {
    sink: Arc<dyn Sink>,
    /// To the thread that sends the changes that may block.
    queue: Mutex<Option<Sender<Change>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// The one way to tell the kernel about changes it did not make (see the
/// module comment). Changes reported before [`Invalidator::attach`] are
/// dropped: no kernel has cached anything of this mount yet.
#[derive(Default)]
pub struct Invalidator {
    attached: OnceLock<Attached>,
    /// The kernel's counts: what a client's change can skip, and whether
    /// an invalidation the kernel answers ENOENT must be sent again.
    refs: OnceLock<Arc<KernelRefs>>,
    sent: AtomicU64,
    failed: AtomicU64,
    /// Inode invalidations sent again (the kernel was taking it in).
    retried: AtomicU64,
    /// Of those, given up at `LANDING_TIMEOUT`.
    unreached: AtomicU64,
}

impl Invalidator {
    /// Start sending to `sink` (the session's notifier, once the session
    /// exists). A second call is ignored.
    pub fn attach(self: &Arc<Self>, sink: impl Sink) {
        let sink: Arc<dyn Sink> = Arc::new(sink);
        let (tx, rx) = channel::<Change>();
        let me = Arc::downgrade(self);
        let worker_sink = sink.clone();
        let spawned = std::thread::Builder::new()
            .name("inkfs-inval".into())
            .spawn(move || {
                for change in rx {
                    let once = |i, o, l| send_once(&*worker_sink, i, o, l);
                    let ok = send(&*worker_sink, &change, &once).is_ok();
                    match me.upgrade() {
                        Some(me) => me.count(ok),
                        None => return,
                    }
                }
            });
        let (queue, thread) = match spawned {
            Ok(handle) => (Some(tx), Some(handle)),
            Err(e) => {
                eprintln!("inkfs: invalidation thread: {e} (queued invalidations are sent inline)");
                (None, None)
            }
        };
        let _ = self.attached.set(Attached {
            sink,
            queue: Mutex::new(queue),
            thread: Mutex::new(thread),
        });
    }

    /// The kernel must forget what `change` covers. Never blocks on the
    /// kernel (see the module comment).
    pub fn changed(&self, change: Change) {
        let Some(a) = self.attached.get() else {
            return;
        };
        if !matches!(change, Change::Attr { .. }) {
            let queue = a.queue.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(tx) = queue.as_ref() {
                // Only fails once the thread is gone (shutdown): nothing
                // is cached any more then.
                let _ = tx.send(change);
                return;
            }
        }
        let once = |i, o, l| send_once(&*a.sink, i, o, l);
        let ok = send(&*a.sink, &change, &once).is_ok();
        self.count(ok);
    }

    /// Send `change` now, whatever its kind, and return once the kernel
    /// has it: an inode's invalidation the kernel answers ENOENT while it
    /// may be taking the inode in is sent again until it lands (see the
    /// module comment). Only for a caller no request in flight can be
    /// waiting on (the lease table's grant: a request that used the inode
    /// would hold the grant back; a client's namespace request, which
    /// holds no inode by then), in a mode without the writeback cache
    /// (nothing to write back first).
    pub fn changed_now(&self, change: Change) {
        let Some(a) = self.attached.get() else {
            return;
        };
        let landed = |i, o, l| self.land(&*a.sink, i, o, l);
        let ok = send(&*a.sink, &change, &landed).is_ok();
        self.count(ok);
    }

    /// A change an attached client made (or is about to make, for a
    /// lease's grant), just before: what of it the kernel can hold
    /// (`Invalidator::needed`) is sent now ([`Invalidator::changed_now`]).
    pub fn client_changed(&self, change: Change) {
        if let Some(c) = self.needed(change) {
            self.changed_now(c);
        }
    }

    /// The kernel's counts, once tracked.
    pub fn refs(&self) -> Option<&Arc<KernelRefs>> {
        self.refs.get()
    }

    /// Count the kernel's references with `refs` (the mount's table):
    /// before it, every change is sent, and sent once.
    pub fn track(&self, refs: Arc<KernelRefs>) {
        let _ = self.refs.set(refs);
    }

    /// What of `change`, made by a client just before, the kernel may hold
    /// (None: nothing). Decided by the kernel's counts (`KernelRefs::knows`,
    /// which says why a reply racing the change gets the new state): an
    /// inode it does not know has no attributes or pages in it; a
    /// directory it does not know has no names (positive or negative) nor
    /// a listing cached under it. A removed name under an unknown
    /// directory leaves the removed inode's attributes (its link count),
    /// should the kernel still know it by another way.
    fn needed(&self, change: Change) -> Option<Change> {
        let Some(refs) = self.refs.get() else {
            return Some(change);
        };
        match change {
            Change::Attr { ino } | Change::Data { ino, .. } => refs.knows(ino).then_some(change),
            Change::Entry { parent, .. } => refs.knows(parent).then_some(change),
            Change::Deleted { parent, child, .. } => {
                if refs.knows(parent) {
                    Some(change)
                } else {
                    refs.knows(child).then_some(Change::Attr { ino: child })
                }
            }
        }
    }

    /// Send an inode's invalidation until it lands, or the kernel's count
    /// of the inode falls to zero, or `LANDING_TIMEOUT` passes (an error
    /// then). See the module comment.
    fn land(&self, sink: &dyn Sink, ino: u64, off: i64, len: i64) -> io::Result<()> {
        let mut started = None;
        let mut tries = 0;
        loop {
            match sink.inval_inode(ino, off, len) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                r => return r,
            }
            // No inode in the kernel: forgotten (nothing to invalidate;
            // `knows` records the skip for the replies racing it), or a
            // reply counted and not taken in yet (try again).
            let Some(refs) = self.refs.get() else {
                return Ok(());
            };
            if !refs.knows(ino) {
                return Ok(());
            }
            let started = *started.get_or_insert_with(Instant::now);
            if started.elapsed() >= LANDING_TIMEOUT {
                self.unreached.fetch_add(1, Relaxed);
                return Err(io::Error::from(io::ErrorKind::TimedOut));
            }
            self.retried.fetch_add(1, Relaxed);
            pause(tries);
            tries += 1;
        }
    }

    fn count(&self, ok: bool) {
        if ok { &self.sent } else { &self.failed }.fetch_add(1, Relaxed);
    }

    /// Sent and failed so far (a failure: the kernel refused, e.g. the
    /// mount is going away).
    pub fn counts(&self) -> (u64, u64) {
        (self.sent.load(Relaxed), self.failed.load(Relaxed))
    }

    /// Inode invalidations sent again because the kernel was taking the
    /// inode in, and those given up at `LANDING_TIMEOUT` (should stay 0).
    pub fn landings(&self) -> (u64, u64) {
        (self.retried.load(Relaxed), self.unreached.load(Relaxed))
    }

    /// Send what is queued, then stop the thread (the session is over).
    pub fn shutdown(&self) {
        let Some(a) = self.attached.get() else {
            return;
        };
        drop(a.queue.lock().unwrap_or_else(|p| p.into_inner()).take());
        if let Some(t) = a.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = t.join();
        }
    }
}

impl Drop for Invalidator {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records what it is sent; `inval_entry` waits on a gate first, as
    /// the kernel may wait on a directory's lock.
    #[derive(Default)]
    struct Recorder {
        log: Mutex<Vec<(String, u64, i64, i64)>>,
        gate: Mutex<()>,
    }

    impl Sink for Arc<Recorder> {
        fn inval_inode(&self, ino: u64, off: i64, len: i64) -> io::Result<()> {
            self.log
                .lock()
                .unwrap()
                .push(("inode".into(), ino, off, len));
            Ok(())
        }
        fn inval_entry(&self, parent: u64, name: &OsStr) -> io::Result<()> {
            let _g = self.gate.lock().unwrap();
            let n = name.len() as i64;
            self.log
                .lock()
                .unwrap()
                .push(("entry".into(), parent, n, 0));
            Ok(())
        }
        fn delete(&self, parent: u64, child: u64, _name: &OsStr) -> io::Result<()> {
            self.log
                .lock()
                .unwrap()
                .push(("delete".into(), parent, child as i64, 0));
            Err(io::Error::from_raw_os_error(libc::ENODEV))
        }
    }

    #[test]
    fn nothing_is_sent_before_attach() {
        let inv = Arc::new(Invalidator::default());
        inv.changed(Change::Attr { ino: 5 });
        assert_eq!(inv.counts(), (0, 0));
    }

    #[test]
    fn attributes_go_at_once_and_the_rest_in_order_without_blocking() {
        let rec = Arc::new(Recorder::default());
        let inv = Arc::new(Invalidator::default());
        inv.attach(rec.clone());
        // The kernel "holds the directory's lock": the entry waits, and
        // the caller must not.
        let gate = rec.gate.lock().unwrap();
        inv.changed(Change::Entry {
            parent: 1,
            name: b"abc".to_vec(),
        });
        inv.changed(Change::Data {
            ino: 7,
            off: 4096,
            len: u64::MAX,
        });
        inv.changed(Change::Attr { ino: 9 });
        // Sent inline although the queue is stuck behind the entry.
        assert_eq!(*rec.log.lock().unwrap(), vec![("inode".into(), 9, -1, 0)]);
        drop(gate);
        inv.changed(Change::Deleted {
            parent: 1,
            child: 12,
            name: b"x".to_vec(),
        });
        inv.shutdown();
        assert_eq!(
            *rec.log.lock().unwrap(),
            vec![
                ("inode".into(), 9, -1, 0),
                ("entry".into(), 1, 3, 0),
                // The directory's cached listing goes too.
                ("inode".into(), 1, 0, 0),
                // A range past i64::MAX is sent as "to the end".
                ("inode".into(), 7, 4096, i64::MAX),
                ("delete".into(), 1, 12, 0),
                ("inode".into(), 1, 0, 0),
            ]
        );
        // The delete was refused (ENODEV): counted as failed.
        assert_eq!(inv.counts(), (3, 1));
        // After shutdown, queued kinds are sent inline; nothing is lost.
        inv.changed(Change::Entry {
            parent: 2,
            name: b"y".to_vec(),
        });
        assert_eq!(rec.log.lock().unwrap().len(), 8);
    }

    /// A kernel that answers ENOENT for an inode's first `misses`
    /// invalidations (a reply handing it the inode not taken in yet).
    struct Taking {
        misses: u64,
        calls: AtomicU64,
    }

    impl Sink for Arc<Taking> {
        fn inval_inode(&self, _ino: u64, _off: i64, _len: i64) -> io::Result<()> {
            if self.calls.fetch_add(1, Relaxed) < self.misses {
                return Err(io::Error::from_raw_os_error(libc::ENOENT));
            }
            Ok(())
        }
        fn inval_entry(&self, _parent: u64, _name: &OsStr) -> io::Result<()> {
            Ok(())
        }
        fn delete(&self, _parent: u64, _child: u64, _name: &OsStr) -> io::Result<()> {
            Ok(())
        }
    }

    fn taking(misses: u64) -> (Arc<Taking>, Arc<Invalidator>, Arc<KernelRefs>) {
        let k = Arc::new(Taking {
            misses,
            calls: AtomicU64::new(0),
        });
        let inv = Arc::new(Invalidator::default());
        inv.attach(k.clone());
        let refs = Arc::new(KernelRefs::default());
        inv.track(refs.clone());
        (k, inv, refs)
    }

    #[test]
    fn an_inode_the_kernel_is_taking_in_is_invalidated_until_it_lands() {
        let (k, inv, refs) = taking(3);
        // A reply handed the kernel inode 7 (counted) and is on its way.
        refs.count(7);
        inv.client_changed(Change::Attr { ino: 7 });
        assert_eq!(k.calls.load(Relaxed), 4, "sent until it landed");
        assert_eq!(inv.landings(), (3, 0));
        assert_eq!(inv.counts(), (1, 0));
        // The listing of a directory in the same state: the same.
        let (k, inv, refs) = taking(2);
        refs.count(9);
        inv.changed_now(Change::Entry {
            parent: 9,
            name: b"n".to_vec(),
        });
        assert_eq!(k.calls.load(Relaxed), 3);
        assert_eq!(inv.landings(), (2, 0));
    }

    #[test]
    fn an_inode_the_kernel_forgot_is_invalidated_once() {
        // Counted when the change decided, forgotten before it was sent:
        // the ENOENT stands, and the end of the count is a skip (for the
        // replies racing it).
        let (k, inv, refs) = taking(u64::MAX);
        inv.changed_now(Change::Data {
            ino: 8,
            off: 0,
            len: 0,
        });
        assert_eq!(k.calls.load(Relaxed), 1);
        assert_eq!(inv.landings(), (0, 0));
        assert_eq!(inv.counts(), (1, 0), "ENOENT is no failure");
        assert_eq!(refs.skips().0, 1);
        // Unknown from the start: nothing sent at all.
        inv.client_changed(Change::Attr { ino: 8 });
        assert_eq!(k.calls.load(Relaxed), 1);
        assert_eq!(refs.skips().0, 2);
    }

    #[test]
    fn without_counts_every_change_is_sent_once() {
        let k = Arc::new(Taking {
            misses: u64::MAX,
            calls: AtomicU64::new(0),
        });
        let inv = Arc::new(Invalidator::default());
        inv.attach(k.clone());
        inv.client_changed(Change::Attr { ino: 5 });
        assert_eq!(k.calls.load(Relaxed), 1);
        assert_eq!(inv.landings(), (0, 0));
    }

    #[test]
    fn the_kernels_message_is_fuse_notify_inval_inode() {
        let m = inval_inode_message(0x0102, -1, 7);
        assert_eq!(&m[0..4], &40u32.to_ne_bytes());
        assert_eq!(&m[4..8], &2i32.to_ne_bytes());
        assert_eq!(&m[8..16], &[0; 8], "unique 0: a notification");
        assert_eq!(&m[16..24], &0x0102u64.to_ne_bytes());
        assert_eq!(&m[24..32], &(-1i64).to_ne_bytes());
        assert_eq!(&m[32..40], &7i64.to_ne_bytes());
    }
}
