//! Directory leases (docs/KERNEL-FREE.md, "Stage 5: creates and removals
//! in a leased directory", and "Built: directory leases on the server"):
//! the words of the protocol, the client's book of the leases it holds,
//! and the server's engine calls.
//!
//! A client asks for directory D's lease with `+dir` on a namespace
//! request in D (`super::ns`); the answer carries the grant or the
//! refusal's reason in one more word, only when it was asked:
//!
//! ```text
//! client: ns SEQ CRED OP ARGS... +dir    (any request naming a directory
//!                                         first: create, mkdir, mknod,
//!                                         symlink, link, unlink, rmdir,
//!                                         rename: its DIR)
//! server: done SEQ ERRNO INO IGEN GEN dir=DGEN:KERNEL
//!     or: done SEQ ERRNO INO IGEN GEN dir=0:REASON
//! server: recall D DGEN                  (as for a file's lease)
//! client: released D DGEN
//! ```
//!
//! KERNEL is what the kernel held under D at the grant: `unknown` (it
//! holds nothing of D: no name, no listing), `-` (it knows D and counts no
//! child of it), `many` (more than [`KERNEL_CHILDREN_MAX`] counted
//! children, or more entries than the server walks), or the counted
//! children's inode numbers, comma-separated. During the lease the list
//! can only shrink (the kernel gains no child of D without a request that
//! recalls the lease). A server that understands `+dir` says `dirs=1` in
//! its attach grant (`super::attach::Grant::dirs`); a client sends it to
//! no other server, and a server answers with the extra word only a
//! request that carried it: older clients and servers are unchanged.
//!
//! Ownership: the lease table of the mount (crates/inkfs-fuse/src/lease.rs)
//! owns the grant; the client's [`DirLeases`] is its own view, which it
//! may only hold a grant in while the server has not recalled it: a
//! recall overtaking the request's answer (the recall on the session, the
//! answer on a ring) is remembered while the ask is in flight.
//!
//! With this increment the client writes nothing under the lease: its
//! creates and removals still go to the server (each recalls the lease:
//! the server's engine uses D), and the answer to a recall keeps no file
//! (`released D GEN`). Creates and removals made by the client are the
//! next increments.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Mutex, MutexGuard};

use super::Filesystem;
use crate::error::{errno, Result};
use crate::format::inode_flags::IMMUTABLE;
use crate::inode::read;
use crate::pmem::Pmem;
use crate::types::{DirEntry, FileKind};

/// Counted children of D a grant lists at most; beyond, `many`.
pub const KERNEL_CHILDREN_MAX: usize = 256;
/// Entries of a directory the server walks at a grant at most (to list
/// the kernel's children of D, or to find D's name in its parent); beyond,
/// `many` (or a refusal: `noname`).
pub const GRANT_WALK_MAX: usize = 1 << 16;

/// The word asking for the lease of the request's directory.
pub const ASK_WORD: &str = "+dir";

/// What the kernel held under D when the lease was granted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelView {
    /// Nothing: the kernel has no count of D.
    Unknown,
    /// It knows D and counts these children of it (maybe none).
    Children(Vec<u64>),
    /// More than [`KERNEL_CHILDREN_MAX`] (or D too large to walk).
    Many,
}

/// Why the server refused a directory lease (counted by reason in
/// `inkfs stat`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The request's directory is not a directory.
    NotDir,
    /// Removed (or an orphan kept by a handle).
    Gone,
    /// Immutable (`chattr +i`): nothing may change it.
    Immutable,
    /// The kernel's negative names of D are not known: the list
    /// overflowed less than the entry TTL ago (the root only: the others'
    /// are dropped by invalidating D's own entry).
    Overflow,
    /// A holder of D's lease was killed at the recall timeout less than
    /// [`TIMEOUT_REFUSAL_MS`] ago.
    Timeout,
    /// D's name in its parent was not found within [`GRANT_WALK_MAX`] entries
    /// (or D moved meanwhile): the kernel's dentries under it cannot be
    /// dropped.
    NoName,
    /// The mount is ending, or the client's session.
    Shutdown,
    /// Anything else (an engine error).
    Failed,
}

/// Refusals after a holder of D was killed at the recall timeout, in ms.
pub const TIMEOUT_REFUSAL_MS: u64 = 1000;

impl Refusal {
    pub const ALL: [Refusal; 8] = [
        Refusal::NotDir,
        Refusal::Gone,
        Refusal::Immutable,
        Refusal::Overflow,
        Refusal::Timeout,
        Refusal::NoName,
        Refusal::Shutdown,
        Refusal::Failed,
    ];

    /// Its word in an answer (and in `inkfs stat`).
    pub fn word(self) -> &'static str {
        match self {
            Refusal::NotDir => "notdir",
            Refusal::Gone => "gone",
            Refusal::Immutable => "immutable",
            Refusal::Overflow => "overflow",
            Refusal::Timeout => "timeout",
            Refusal::NoName => "noname",
            Refusal::Shutdown => "shutdown",
            Refusal::Failed => "failed",
        }
    }

    fn from_word(w: &str) -> Option<Refusal> {
        Refusal::ALL.into_iter().find(|r| r.word() == w)
    }

    /// The refusal for an errno of the server's checks (see
    /// [`Filesystem::dir_lease_check`]).
    pub fn from_errno(e: i32) -> Refusal {
        match e {
            libc::ENOTDIR => Refusal::NotDir,
            libc::ENOENT => Refusal::Gone,
            libc::EPERM => Refusal::Immutable,
            libc::EBUSY => Refusal::Overflow,
            libc::ETIMEDOUT => Refusal::Timeout,
            libc::ESTALE => Refusal::NoName,
            libc::ESHUTDOWN => Refusal::Shutdown,
            _ => Refusal::Failed,
        }
    }
}

/// The answer to `+dir`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DirAnswer {
    Granted { gen: u64, kernel: KernelView },
    Refused(Refusal),
}

impl DirAnswer {
    /// The answer's word, `dir=...`.
    pub fn word(&self) -> String {
        match self {
            DirAnswer::Refused(r) => format!("dir=0:{}", r.word()),
            DirAnswer::Granted { gen, kernel } => {
                let view = match kernel {
                    KernelView::Unknown => "unknown".to_string(),
                    KernelView::Many => "many".to_string(),
                    KernelView::Children(c) if c.is_empty() => "-".to_string(),
                    KernelView::Children(c) => c
                        .iter()
                        .map(|i| i.to_string())
                        .collect::<Vec<_>>()
                        .join(","),
                };
                format!("dir={gen}:{view}")
            }
        }
    }

    /// Parse a `dir=...` word (None: malformed).
    pub fn parse(word: &str) -> Option<DirAnswer> {
        let (gen, rest) = word.strip_prefix("dir=")?.split_once(':')?;
        let gen: u64 = gen.parse().ok()?;
        if gen == 0 {
            return Refusal::from_word(rest).map(DirAnswer::Refused);
        }
        let kernel = match rest {
            "unknown" => KernelView::Unknown,
            "many" => KernelView::Many,
            "-" => KernelView::Children(Vec::new()),
            list => {
                let c = list
                    .split(',')
                    .map(|i| i.parse().ok())
                    .collect::<Option<Vec<u64>>>()?;
                if c.len() > KERNEL_CHILDREN_MAX {
                    return None;
                }
                KernelView::Children(c)
            }
        };
        Some(DirAnswer::Granted { gen, kernel })
    }
}

/// A client's book of its directory leases (see the module comment).
#[derive(Default)]
pub struct DirLeases {
    map: Mutex<HashMap<u64, DirState>>,
    held: AtomicUsize,
    /// Recalls answered (for tests and statistics).
    recalls: AtomicU64,
}

#[derive(Default)]
struct DirState {
    /// Requests asking for this directory's lease now.
    asking: u32,
    /// The grant held, and the kernel's view at it.
    held: Option<(u64, KernelView)>,
    /// The latest grant recalled: an answer naming one not newer was
    /// given back already.
    recalled: u64,
}

impl DirState {
    fn idle(&self) -> bool {
        self.asking == 0 && self.held.is_none()
    }
}

impl DirLeases {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, DirState>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A request asking for `dir`'s lease is about to be sent: a recall
    /// arriving before its answer is remembered.
    pub fn ask(&self, dir: u64) {
        self.lock().entry(dir).or_default().asking += 1;
    }

    /// The answer to an ask of `dir` (None: no answer, the request
    /// failed): whether the lease is held now.
    pub fn answered(&self, dir: u64, answer: Option<&DirAnswer>) -> bool {
        let mut map = self.lock();
        let Some(st) = map.get_mut(&dir) else {
            debug_assert!(false, "an answer to no ask");
            return false;
        };
        st.asking = st.asking.saturating_sub(1);
        if let Some(DirAnswer::Granted { gen, kernel }) = answer {
            let newer = st.held.as_ref().is_none_or(|(g, _)| g < gen);
            if *gen > st.recalled && newer {
                if st.held.is_none() {
                    self.held.fetch_add(1, SeqCst);
                }
                st.held = Some((*gen, kernel.clone()));
            }
        }
        let held = st.held.is_some();
        if st.idle() {
            map.remove(&dir);
        }
        held
    }

    /// The server recalls grant `gen` of `ino`: true if `ino` is a
    /// directory this client holds or asked for (then the caller answers
    /// `released INO GEN`; nothing is kept in this increment), false if
    /// not (a file's lease).
    pub fn recall(&self, ino: u64, gen: u64) -> bool {
        let mut map = self.lock();
        let Some(st) = map.get_mut(&ino) else {
            return false;
        };
        st.recalled = st.recalled.max(gen);
        if st.held.as_ref().is_some_and(|(g, _)| *g <= gen) {
            st.held = None;
            self.held.fetch_sub(1, SeqCst);
        }
        if st.idle() {
            map.remove(&ino);
        }
        self.recalls.fetch_add(1, Relaxed);
        true
    }

    /// Every lease held, taken out of the book (the client detaches: each
    /// is given back with `released`).
    pub fn drain(&self) -> Vec<(u64, u64)> {
        let mut map = self.lock();
        let mut out = Vec::new();
        map.retain(|&ino, st| {
            if let Some((gen, _)) = st.held.take() {
                out.push((ino, gen));
            }
            !st.idle()
        });
        self.held.fetch_sub(out.len(), SeqCst);
        out
    }

    /// The grant held on `dir` and the kernel's view at it.
    pub fn held(&self, dir: u64) -> Option<(u64, KernelView)> {
        self.lock().get(&dir).and_then(|st| st.held.clone())
    }

    /// Directory leases held now.
    pub fn count(&self) -> usize {
        self.held.load(SeqCst)
    }

    /// Recalls of directory leases answered so far.
    pub fn recalls(&self) -> u64 {
        self.recalls.load(Relaxed)
    }
}

/// The server's side of directory leases, on the mount's engine.
impl<P: Pmem> Filesystem<P> {
    /// Whether `ino` may be leased as a directory: ENOTDIR if it is not
    /// one, ENOENT if it is gone or an orphan, EPERM if immutable.
    pub fn dir_lease_check(&self, ino: u64) -> Result<()> {
        let inode = self.fs.iget(ino)?;
        if inode.kind != FileKind::Dir {
            return errno(libc::ENOTDIR);
        }
        let st = read(&inode.state);
        if st.gone || st.orphan || st.attr.nlink == 0 {
            return errno(libc::ENOENT);
        }
        if st.flags & IMMUTABLE != 0 {
            return errno(libc::EPERM);
        }
        Ok(())
    }

    /// Directory `ino` caught up with what its lease holder committed
    /// (from the server's cached tail), its tail's line made durable: the
    /// engine's `Fs::settle_dir`. A directory gone meanwhile: Ok.
    pub fn dir_catch_up(&self, ino: u64) -> Result<()> {
        self.fs.settle_dir(ino)
    }

    /// Walk directory `ino`'s entries but `.` and `..` (the server's
    /// grant: the kernel's children, D's name in its parent), until `f`
    /// says stop; `..`'s inode number is returned (the parent).
    pub fn dir_walk(&self, ino: u64, f: &mut dyn FnMut(&DirEntry) -> bool) -> Result<u64> {
        let mut parent = 0;
        self.fs.readdir(ino, 0, &mut |e| {
            if e.name == b"." {
                return true;
            }
            if e.name == b".." {
                parent = e.ino;
                return true;
            }
            f(&e)
        })?;
        Ok(parent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_round_trip_and_junk_is_refused() {
        let all = [
            DirAnswer::Granted {
                gen: 7,
                kernel: KernelView::Unknown,
            },
            DirAnswer::Granted {
                gen: 8,
                kernel: KernelView::Many,
            },
            DirAnswer::Granted {
                gen: 9,
                kernel: KernelView::Children(vec![]),
            },
            DirAnswer::Granted {
                gen: 10,
                kernel: KernelView::Children(vec![5, u64::MAX]),
            },
        ]
        .into_iter()
        .chain(Refusal::ALL.into_iter().map(DirAnswer::Refused));
        for a in all {
            assert_eq!(DirAnswer::parse(&a.word()), Some(a.clone()), "{}", a.word());
        }
        let long = format!(
            "dir=3:{}",
            (0..=KERNEL_CHILDREN_MAX as u64)
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(",")
        );
        for bad in [
            "dir=",
            "dir=1",
            "dir=0:why",
            "dir=x:many",
            "dir=1:5,,6",
            "dir=1:",
            "dirs=1:many",
            long.as_str(),
        ] {
            assert_eq!(DirAnswer::parse(bad), None, "{bad}");
        }
        for r in Refusal::ALL {
            let e = match r {
                Refusal::NotDir => libc::ENOTDIR,
                Refusal::Gone => libc::ENOENT,
                Refusal::Immutable => libc::EPERM,
                Refusal::Overflow => libc::EBUSY,
                Refusal::Timeout => libc::ETIMEDOUT,
                Refusal::NoName => libc::ESTALE,
                Refusal::Shutdown => libc::ESHUTDOWN,
                Refusal::Failed => libc::EIO,
            };
            assert_eq!(Refusal::from_errno(e), r);
        }
    }

    fn granted(gen: u64) -> DirAnswer {
        DirAnswer::Granted {
            gen,
            kernel: KernelView::Unknown,
        }
    }

    /// A grant is held from its answer until its recall; a recall that
    /// overtook the answer (it came while the ask was in flight) keeps
    /// the answer's grant from being held; a refusal holds nothing.
    #[test]
    fn the_book_follows_grants_and_recalls() {
        let b = DirLeases::default();
        b.ask(5);
        assert!(b.answered(5, Some(&granted(3))));
        assert_eq!(b.count(), 1);
        assert_eq!(b.held(5).map(|h| h.0), Some(3));
        assert!(b.recall(5, 3));
        assert_eq!((b.count(), b.held(5)), (0, None));
        // Overtaken: the recall of grant 4 comes before its answer.
        b.ask(5);
        assert!(b.recall(5, 4));
        assert!(!b.answered(5, Some(&granted(4))), "a recalled grant held");
        assert_eq!(b.count(), 0);
        // A later grant is held again.
        b.ask(5);
        assert!(b.answered(5, Some(&granted(6))));
        // A recall of an older grant does not drop it.
        assert!(b.recall(5, 5));
        assert_eq!(b.count(), 1);
        // Refused, or no answer: nothing more held.
        b.ask(8);
        assert!(!b.answered(8, Some(&DirAnswer::Refused(Refusal::Overflow))));
        b.ask(9);
        assert!(!b.answered(9, None));
        // Not a directory this client asked for: a file's recall.
        assert!(!b.recall(9, 1));
        assert_eq!(b.drain(), vec![(5, 6)]);
        assert_eq!(b.count(), 0);
        assert!(b.lock().is_empty(), "idle entries kept");
        assert_eq!(b.recalls(), 3);
    }
}
