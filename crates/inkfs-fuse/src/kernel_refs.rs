//! The kernel's references to inodes: its lookup counts, as the FUSE
//! protocol defines them, and the pins that keep a removed inode it still
//! refers to from being freed (docs/KERNEL-FREE.md, "Built: removals of
//! inodes the kernel holds").
//!
//! The kernel refers to an inode by its number (the FUSE node id) from the
//! reply that hands it an entry until its FORGET: each reply of LOOKUP,
//! CREATE, MKDIR, MKNOD, SYMLINK and LINK, and each entry of READDIRPLUS
//! but `.` and `..` (fs/fuse/readdir.c skips those, and entries with node
//! id 0, a negative lookup), adds one; FORGET and BATCH_FORGET take away
//! the count they carry. A process may use the inode through the kernel as
//! long as the count is above zero: a directory it holds open (the kernel
//! opens directories itself: `Caching::kernel_opendir`), a file it holds by
//! an O_PATH descriptor or a FIFO (no OPEN reaches us), its working
//! directory. Those calls reach the engine by number: freed and given to a
//! new inode, the number would take them to the wrong inode.
//!
//! So a removal that may take an inode's last name pins the inode while
//! the kernel's count of it is above zero ([`KernelRefs::removing`]), and
//! the FORGET that brings the count to zero lets it go (an orphan then:
//! the engine frees it at its last handle). That holds for removals an
//! attached client asks for (`crate::ns`), of which the kernel knows
//! nothing, and for those the kernel makes itself (`InkFuse::removing`):
//! a FIFO, an O_PATH descriptor or a working directory sends no OPEN, so
//! no handle of ours keeps the inode. (Regular files the kernel opened
//! are kept by the server's handle of each OPEN as well.)
//!
//! A removal racing a reply that hands the kernel the same inode: the
//! removal decides after the engine removed the name, under the inode's
//! shard lock, and a reply counts its entry under that lock before it is
//! sent. If the count came first, the removal sees it and pins; if the
//! decision came first, the reply's [`KernelRefs::hand`] sees that an
//! inode was freed since the reply's engine call began (`freed`, taken as a
//! [`Mark`] before it) and checks the inode is still linked with the
//! generation it replies: if not, the reply becomes ENOENT and hands the
//! kernel nothing.
//!
//! A client's change skips the invalidations the kernel cannot need
//! ([`KernelRefs::knows`], `crate::ns`): none for an inode the kernel has
//! no count of (it holds no attributes or pages of it), none for a name
//! under a directory it has no count of (a dentry, positive or negative,
//! holds its parent's inode, so the kernel holds none under an inode it
//! does not know, and no listing of it either). The race: a reply that
//! read the inode's attributes before the change and counts it after the
//! change found no count would leave the kernel stale attributes that no
//! invalidation corrects. So `knows` bumps `skipped` under the inode's
//! shard lock when it answers no, and [`KernelRefs::hand`] reads `skipped`
//! before the engine call (in the [`Mark`]) and again after counting: if
//! it moved, the reply reads the attributes again. Either the count came
//! first and the change sent its invalidation (as before), or the skip
//! came first, the reply's count (under the same lock) sees the bump, and
//! its second read follows the change. Names need no such check: a reply
//! that hands the kernel a name under a directory is to a request about
//! that directory, which the kernel holds (counted) from before the
//! request until after the reply; so a change that found the directory
//! unknown precedes the reply that handed the directory, and every
//! request under it reads the changed state.
//!
//! A count above zero does not mean the kernel has the inode yet: the
//! reply is counted before it is sent, and the kernel makes its inode
//! (`fuse_iget`) after it got the reply. An invalidation sent between the
//! two finds no inode (ENOENT) and does nothing, and the reply then
//! installs attributes read before the change. So an invalidation of a
//! client's change that the kernel answers ENOENT is sent again while
//! `knows` still says yes, until it lands or the count falls to zero
//! (`crate::inval`, "An inode the kernel is still taking in", argues it
//! against the kernel's `attr_version`): a count of a reply not taken in
//! lasts until its FORGET, which comes only after the kernel took the
//! reply in; and `knows` answering no at the end records a skip like any
//! other, for the replies racing it.
//!
//! Ownership: the mount server's (one table per mount, shared by the FUSE
//! handlers and the attach service's request threads); DRAM only. At a
//! crash of the server the pins vanish with it and recovery frees the
//! orphans they kept (FORMAT.md's orphan list); at unmount the kernel
//! forgets everything ([`KernelRefs::close`] lets every pin go).
//!
//! No global lock: 64 shards by inode number, one shard lock per counted
//! entry and per FORGET, four atomic loads per reply (`freed` and
//! `skipped`, before and after), one shard lock per invalidation decided.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use inkfs::api::{self, Attr, Pin};

use crate::handles::IntHasher;
use crate::Engine;

const SHARDS: usize = 64;

/// The root's node id: the kernel's reference to it is made at mount, not
/// by a reply, and never forgotten; it cannot be removed.
const ROOT: u64 = 1;

/// What the kernel has of one inode.
#[derive(Debug, Default)]
struct Entry {
    /// Its lookup count (above zero while the entry exists).
    lookups: u64,
    /// The pin keeping it after its last name went, until the count ends.
    pin: Option<Pin>,
}

type Shard = HashMap<u64, Entry, BuildHasherDefault<IntHasher>>;

/// The mount's table (see the module comment).
pub struct KernelRefs {
    shards: Box<[Mutex<Shard>]>,
    /// Removals decided without a pin (the kernel had no count): bumped
    /// under the inode's shard lock, after the engine removed the name.
    freed: AtomicU64,
    /// Invalidations skipped (`KernelRefs::knows` said no): bumped under
    /// the inode's shard lock, after the engine made the change.
    skipped: AtomicU64,
    /// Replies that read their attributes again after a skip.
    refreshed: AtomicU64,
    /// Pins held now (for the statistics and the tests).
    pinned: AtomicU64,
    /// The kernel is gone (unmount): no more pins are kept.
    closed: AtomicBool,
    /// See `KernelRefs::mismatches`.
    mismatches: AtomicU64,
    /// See `KernelRefs::races`.
    rechecked: AtomicU64,
    withdrawn: AtomicU64,
    /// The names under the root the kernel may hold negative
    /// (crate::dirlease: a directory lease of the root drops them).
    negatives: crate::dirlease::RootNegatives,
}

/// Who removes a name (`KernelRefs::removing`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Remover {
    /// The kernel (a FUSE request): it holds the directory's lock, so its
    /// own lookups and listings of the name wait for the removal's end.
    Kernel,
    /// An attached client (`crate::ns`): the kernel may be looking the
    /// name up meanwhile (see `KernelRefs::hand`).
    Client,
}

/// The `freed` and `skipped` counts before a reply's engine call (see
/// `KernelRefs::hand`).
#[derive(Clone, Copy, Debug)]
#[must_use]
pub struct Mark {
    freed: u64,
    skipped: u64,
}

impl Default for KernelRefs {
    fn default() -> Self {
        KernelRefs {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            freed: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            refreshed: AtomicU64::new(0),
            pinned: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            mismatches: AtomicU64::new(0),
            rechecked: AtomicU64::new(0),
            withdrawn: AtomicU64::new(0),
            negatives: Default::default(),
        }
    }
}

impl KernelRefs {
    fn shard(&self, ino: u64) -> MutexGuard<'_, Shard> {
        // A poisoned shard only means a panic elsewhere; every change to
        // the map is one call, so it is still consistent.
        self.shards[(ino % SHARDS as u64) as usize]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Take before the engine call whose result a reply hands the kernel.
    #[inline]
    pub fn mark(&self) -> Mark {
        Mark {
            freed: self.freed.load(Ordering::SeqCst),
            skipped: self.skipped.load(Ordering::SeqCst),
        }
    }

    /// Count one entry of `a` in a reply about to be sent, whose engine
    /// call began at `mark`. ENOENT (nothing counted, the reply must not
    /// hand the inode out): a client's removal freed it meanwhile. A
    /// client's change that skipped its invalidation meanwhile: `a` is
    /// read again (see the module comment).
    pub fn hand(&self, engine: &Engine, a: &mut Attr, mark: Mark) -> api::Result<()> {
        self.count(a.ino);
        if a.ino == ROOT {
            return Ok(());
        }
        let freed = self.freed.load(Ordering::SeqCst) != mark.freed;
        let skipped = self.skipped.load(Ordering::SeqCst) != mark.skipped;
        if !freed && !skipped {
            return Ok(());
        }
        let now = engine.getattr(a.ino);
        if freed {
            // A removal decided since: if it was this inode's, it had no
            // count to see, and the inode is unlinked (or freed, or
            // another by now).
            self.rechecked.fetch_add(1, Ordering::Relaxed);
            let alive = now
                .as_ref()
                .is_ok_and(|now| now.generation == a.generation && now.nlink > 0);
            if !alive {
                self.withdrawn.fetch_add(1, Ordering::Relaxed);
                self.forget(engine, a.ino, 1);
                return Err(api::Error::Errno(libc::ENOENT));
            }
        }
        match now {
            // The same inode still (a reused number is another's, whose
            // change this reply does not carry): its attributes as of
            // after the count, which follows every skip it could miss.
            Ok(now) if skipped && now.generation == a.generation => {
                self.refreshed.fetch_add(1, Ordering::Relaxed);
                *a = now;
            }
            _ => {}
        }
        Ok(())
    }

    /// Whether the kernel refers to `ino` now, for a client's change of it
    /// made just before: no means the change needs no invalidation of it
    /// (see the module comment), and is recorded for the replies racing
    /// it. The root is always known.
    pub fn knows(&self, ino: u64) -> bool {
        if ino == ROOT {
            return true;
        }
        let shard = self.shard(ino);
        if shard.contains_key(&ino) {
            return true;
        }
        // Under the shard lock: a reply counting `ino` after this sees it.
        self.skipped.fetch_add(1, Ordering::SeqCst);
        drop(shard);
        false
    }

    /// Whether the kernel counts `ino` now, with no side effect (a
    /// directory lease's grant listing D's children: a reply that counts
    /// one after this answers a request naming D, which the grant sees).
    pub fn counted(&self, ino: u64) -> bool {
        ino == ROOT || self.shard(ino).contains_key(&ino)
    }

    /// The root's negative names (crate::dirlease).
    pub fn negatives(&self) -> &crate::dirlease::RootNegatives {
        &self.negatives
    }

    /// Invalidations skipped since the mount (`knows` said no), and
    /// replies that read their attributes again after one.
    pub fn skips(&self) -> (u64, u64) {
        (
            self.skipped.load(Ordering::Relaxed),
            self.refreshed.load(Ordering::Relaxed),
        )
    }

    /// Count one entry of `ino` with no check against removals: a damaged
    /// inode's, which READDIRPLUS lists with no attributes (they cannot be
    /// read, so neither can a check).
    pub fn count(&self, ino: u64) {
        if ino != ROOT {
            self.shard(ino).entry(ino).or_default().lookups += 1;
        }
    }

    /// An entry counted by `hand` that the reply could not carry after all
    /// (a full READDIRPLUS buffer).
    pub fn unhand(&self, engine: &Engine, ino: u64) {
        if ino != ROOT {
            self.forget(engine, ino, 1);
        }
    }

    /// FORGET (and each node of BATCH_FORGET): the kernel drops `nlookup`
    /// references; at zero the inode's pin goes (freeing an orphan).
    pub fn forget(&self, engine: &Engine, ino: u64, nlookup: u64) {
        let pin = {
            let mut shard = self.shard(ino);
            let Some(e) = shard.get_mut(&ino) else {
                // Only the root is referred to without a reply we counted.
                if ino != ROOT {
                    self.mismatch(ino, nlookup, 0);
                }
                return;
            };
            if nlookup > e.lookups {
                self.mismatch(ino, nlookup, e.lookups);
            }
            e.lookups = e.lookups.saturating_sub(nlookup);
            if e.lookups > 0 {
                return;
            }
            shard.remove(&ino).and_then(|e| e.pin)
        };
        self.unpin(engine, pin);
    }

    /// A removal of `ino` by `who` (its last name may go): `remove` runs
    /// with the inode pinned, and the pin stays while the kernel refers to
    /// it and it has no name left (see the module comment). `ino` None:
    /// the name was not there (the removal fails by itself).
    pub fn removing<T>(
        &self,
        engine: &Engine,
        ino: Option<u64>,
        who: Remover,
        remove: impl FnOnce() -> api::Result<T>,
    ) -> api::Result<T> {
        // Pinned across the removal, so that the decision after it can
        // still keep the inode (a lookup may count it until then).
        let pin = ino.and_then(|i| engine.pin(i).ok());
        let r = remove();
        self.keep_if_held(engine, pin, who);
        r
    }

    /// After a removal with `pin` taken before it: keep the pin while the
    /// kernel refers to the inode and it has no name left, else let it go.
    fn keep_if_held(&self, engine: &Engine, pin: Option<Pin>, who: Remover) {
        let Some(pin) = pin else { return };
        let ino = pin.ino();
        let unlinked = engine.getattr(ino).is_ok_and(|a| a.nlink == 0);
        let spare = {
            let mut shard = self.shard(ino);
            match shard.get_mut(&ino) {
                Some(e) if unlinked && !self.closed.load(Ordering::SeqCst) => {
                    debug_assert!(e.lookups > 0);
                    let old = e.pin.replace(pin);
                    if old.is_none() {
                        self.pinned.fetch_add(1, Ordering::Relaxed);
                    }
                    old
                }
                _ => {
                    if who == Remover::Client {
                        // Under the shard lock: a reply counting `ino`
                        // after this sees the bump.
                        self.freed.fetch_add(1, Ordering::SeqCst);
                    }
                    Some(pin)
                }
            }
        };
        if let Some(p) = spare {
            engine.unpin(p);
        }
    }

    /// The kernel forgot more of `ino` than it was counted: an entry
    /// handed out without being counted (a bug here), whose pin may have
    /// gone early. Counted for the statistics (the test suite checks it
    /// stays 0 at every unmount).
    fn mismatch(&self, ino: u64, nlookup: u64, counted: u64) {
        self.mismatches.fetch_add(1, Ordering::Relaxed);
        debug_assert!(false, "FORGET of {ino}: {nlookup} > {counted} counted");
    }

    /// FORGETs of more than was counted, since the mount (should stay 0).
    pub fn mismatches(&self) -> u64 {
        self.mismatches.load(Ordering::Relaxed)
    }

    /// Replies that met a client's removal (`hand` checked the inode
    /// again), and those of them whose inode had gone (answered ENOENT).
    pub fn races(&self) -> (u64, u64) {
        (
            self.rechecked.load(Ordering::Relaxed),
            self.withdrawn.load(Ordering::Relaxed),
        )
    }

    fn unpin(&self, engine: &Engine, pin: Option<Pin>) {
        if let Some(p) = pin {
            self.pinned.fetch_sub(1, Ordering::Relaxed);
            engine.unpin(p);
        }
    }

    /// Whether `ino` is pinned here (a removed inode the kernel holds).
    pub fn is_pinned(&self, ino: u64) -> bool {
        self.shard(ino).get(&ino).is_some_and(|e| e.pin.is_some())
    }

    /// Pins held now.
    pub fn pinned(&self) -> u64 {
        self.pinned.load(Ordering::Relaxed)
    }

    /// Inodes the kernel refers to now (the root aside).
    pub fn known(&self) -> u64 {
        (0..SHARDS).map(|i| self.shard(i as u64).len() as u64).sum()
    }

    /// The kernel is gone (DESTROY, unmount): every pin goes, and none is
    /// kept from now on.
    pub fn close(&self, engine: &Engine) {
        self.closed.store(true, Ordering::SeqCst);
        for i in 0..SHARDS {
            let pins: Vec<Pin> = self
                .shard(i as u64)
                .drain()
                .filter_map(|(_, e)| e.pin)
                .collect();
            for p in pins {
                self.unpin(engine, Some(p));
            }
        }
    }
}
