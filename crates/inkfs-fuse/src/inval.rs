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
//!   one: "no such name") in a directory; the next lookup asks us.
//! - [`Change::Deleted`]: as `Entry`, for a name that was removed, and
//!   inotify watchers of the directory are told.
//!
//! `Attr` is sent at once, from any thread, a request handler's included:
//! the kernel takes no lock for it that a request in flight may hold. The
//! others can block in the kernel (on write-back, which needs this
//! server's worker threads, or on the directory's lock, which the kernel
//! may hold while it waits for a request being served), so they go to one
//! thread of their own, in order; a caller never waits for them.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;

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

/// Where notifications go: the FUSE session's [`fuser::Notifier`], or a
/// recorder in tests.
pub trait Sink: Send + Sync + 'static {
    /// `off` < 0: attributes only.
    fn inval_inode(&self, ino: u64, off: i64, len: i64) -> io::Result<()>;
    fn inval_entry(&self, parent: u64, name: &OsStr) -> io::Result<()>;
    fn delete(&self, parent: u64, child: u64, name: &OsStr) -> io::Result<()>;
}

impl Sink for fuser::Notifier {
    fn inval_inode(&self, ino: u64, off: i64, len: i64) -> io::Result<()> {
        fuser::Notifier::inval_inode(self, fuser::INodeNo(ino), off, len)
    }
    fn inval_entry(&self, parent: u64, name: &OsStr) -> io::Result<()> {
        fuser::Notifier::inval_entry(self, fuser::INodeNo(parent), name)
    }
    fn delete(&self, parent: u64, child: u64, name: &OsStr) -> io::Result<()> {
        fuser::Notifier::delete(self, fuser::INodeNo(parent), fuser::INodeNo(child), name)
    }
}

/// Send one change to `sink`. ENOENT means the kernel holds nothing of it
/// (nothing to invalidate), which fuser already treats as success.
fn send(sink: &dyn Sink, change: &Change) -> io::Result<()> {
    // The kernel takes offsets as loff_t: a range past i64::MAX is "to the
    // end", as len 0 is.
    let signed = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    match change {
        Change::Attr { ino } => sink.inval_inode(*ino, -1, 0),
        Change::Data { ino, off, len } => sink.inval_inode(*ino, signed(*off), signed(*len)),
        Change::Entry { parent, name } => sink.inval_entry(*parent, OsStr::from_bytes(name)),
        Change::Deleted {
            parent,
            child,
            name,
        } => sink.delete(*parent, *child, OsStr::from_bytes(name)),
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
    sent: AtomicU64,
    failed: AtomicU64,
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
                    let ok = send(&*worker_sink, &change).is_ok();
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
        let ok = send(&*a.sink, &change).is_ok();
        self.count(ok);
    }

    /// Send `change` now, whatever its kind, and return once the kernel
    /// has it. Only for a caller no request in flight can be waiting on
    /// (the lease table's grant: a request that used the inode would hold
    /// the grant back), in a mode without the writeback cache (nothing to
    /// write back first).
    pub fn changed_now(&self, change: Change) {
        let Some(a) = self.attached.get() else {
            return;
        };
        let ok = send(&*a.sink, &change).is_ok();
        self.count(ok);
    }

    fn count(&self, ok: bool) {
        if ok { &self.sent } else { &self.failed }.fetch_add(1, Relaxed);
    }

    /// Sent and failed so far (a failure: the kernel refused, e.g. the
    /// mount is going away).
    pub fn counts(&self) -> (u64, u64) {
        (self.sent.load(Relaxed), self.failed.load(Relaxed))
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
                // A range past i64::MAX is sent as "to the end".
                ("inode".into(), 7, 4096, i64::MAX),
                ("delete".into(), 1, 12, 0),
            ]
        );
        // The delete was refused (ENODEV): counted as failed.
        assert_eq!(inv.counts(), (3, 1));
        // After shutdown, queued kinds are sent inline; nothing is lost.
        inv.changed(Change::Entry {
            parent: 2,
            name: b"y".to_vec(),
        });
        assert_eq!(rec.log.lock().unwrap().len(), 5);
    }
}
