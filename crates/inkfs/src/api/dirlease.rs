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
//! Creates under the lease (docs/KERNEL-FREE.md, "Built: lane grants and
//! the client's creates end to end"): with D's lease and a lane
//! (`super::lanelease`), the client's engine is told of both at the grant
//! (`Fs::client_take_lane`, `Fs::client_lease_dir`), and a create in D
//! runs there ([`DirLeases::create_local`]); the files made are leased to
//! the client with D's grant number. At the give-back (a recall, or the
//! detach) the engine lets D go first (`Fs::client_give_back_dir`, under
//! D's lock: a create in flight ends), then the files made that the
//! client still writes are listed (`kept=`, at most
//! [`super::lanelease::KEPT_MAX`]; the server enters them in its lease
//! table before it settles D), and with the last directory the lane goes
//! back too (`released lane`). Removals under the lease: `Made::removed`
//! and crates/inkfs/src/api/client/remove.rs.
//!
//! The order against a recall: [`DirLeases::recall`] marks the grant
//! recalled first; then the give-back takes the client's `local` lock,
//! which a create under the lease holds from its check of the grant to
//! its file's entry in the client's lease table, so a create either ends
//! before the kept list is made (and is in it) or finds no grant (and
//! goes to the server).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Mutex, MutexGuard};

use super::client::{AskTable, Ended};
use super::lanelease::{LaneGrant, LaneReturn, KEPT_MAX};
use super::{Filesystem, OpenFlags};
use crate::error::{errno, Result};
use crate::format::inode_flags::IMMUTABLE;
use crate::inode::read;
use crate::inthash::IntMap;
use crate::perm::Credentials;
use crate::pmem::Pmem;
use crate::rmlocal::KernelHeld;
use crate::types::{Attr, DirEntry, FileKind, SetAttr};

/// Counted children of D a grant lists at most; beyond, `many`.
pub const KERNEL_CHILDREN_MAX: usize = 256;
/// Entries of a directory the server walks at a grant at most (to list
/// the kernel's children of D, or to find D's name in its parent); beyond,
/// `many` (or a refusal: `noname`).
pub const GRANT_WALK_MAX: usize = 1 << 16;

/// Directory leases a client holds at most: past them, a new grant gives
/// the oldest held back ([`DirLeases::oldest_beyond`]). Without a bound,
/// a program that visits directories once (tar: it makes a directory's
/// files, sets its attributes, and never comes back) held every lease it
/// got until its exit, and the ask table's ways, which a held directory
/// keeps, filled: its later directories asked for nothing (the meta
/// tree's untar: 82 grants instead of 395, 336 creates under the leases
/// instead of 1,580). A give-back is one `released` line, no round trip.
pub const HELD_MAX: usize = 16;

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
    /// No lane could be leased to the client that asked for one with the
    /// directory (`+lane`; `super::lanelease`): every lane but the
    /// owner's last is leased.
    NoLane,
    /// Anything else (an engine error).
    Failed,
    /// The client that asked holds the lease already (a second ask of
    /// one directory: two of its threads at once, or an ask racing its
    /// own `released`): answered at once, the grant held unchanged.
    Held,
}

/// Refusals after a holder of D was killed at the recall timeout, in ms.
pub const TIMEOUT_REFUSAL_MS: u64 = 1000;

impl Refusal {
    pub const ALL: [Refusal; 10] = [
        Refusal::NotDir,
        Refusal::Gone,
        Refusal::Immutable,
        Refusal::Overflow,
        Refusal::Timeout,
        Refusal::NoName,
        Refusal::Shutdown,
        Refusal::NoLane,
        Refusal::Failed,
        Refusal::Held,
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
            Refusal::NoLane => "nolane",
            Refusal::Failed => "failed",
            Refusal::Held => "held",
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
            libc::EAGAIN => Refusal::NoLane,
            libc::EALREADY => Refusal::Held,
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
    map: Mutex<IntMap<DirState>>,
    held: AtomicUsize,
    /// Recalls answered (for tests and statistics).
    recalls: AtomicU64,
    /// Held by a create or a removal under a lease and by a give-back
    /// (see the module comment): what each directory's lease made and
    /// removed.
    local: Mutex<IntMap<Made>>,
    /// Creates made under directory leases (for tests and statistics).
    creates: AtomicU64,
    /// Attribute changes of leased directories made by the client (for
    /// tests and statistics).
    setattrs: AtomicU64,
    /// Removals made under directory leases (the same).
    removals: AtomicU64,
    /// Directories made under directory leases (the same).
    mkdirs: AtomicU64,
    /// When to ask for each directory's lease: told here how each
    /// ask was answered and how each lease ended (`super::client`'s
    /// `ask` module).
    asks: AskTable,
}

/// What became of a create tried under a directory lease.
#[derive(Debug)]
pub enum Local {
    /// Made: its attributes and the grant its write lease is held by (0:
    /// made read-only, no lease).
    Made(Attr, u64),
    /// Refused as the server would refuse it (EACCES, ENAMETOOLONG...).
    Failed(i32),
    /// No space in the reservation: ask for more, then try again.
    NoSpace,
    /// Not here: no lease or lane, no slot left, the name exists (its
    /// open is the server's), or the lease went meanwhile.
    Server,
}

/// What one directory's lease made and removed so far (the client's
/// book, under its `local` lock).
#[derive(Debug, Default)]
pub struct Made {
    /// The files created under it and not removed under it: inode ->
    /// (generation, order made). A map, not a list: a removal under the
    /// lease looks its victim up and forgets it, and a list's scans of a
    /// thousand files made were a removal's cost (bench/results-notes/
    /// hybdel.md). An inode number is in it once: its slot is made again
    /// only after its removal, which under the lease is this client's
    /// (`forget`) or a request naming the directory (its recall ends the
    /// book's entry).
    files: IntMap<(u64, u64)>,
    /// The next create's order (the give-back lists files as made).
    made_next: u64,
    /// Removals made under it (`removed=` at its give-back).
    pub removed: u64,
}

impl Made {
    /// Inode `ino`, generation `generation`, made under the lease.
    pub fn add(&mut self, ino: u64, generation: u64) {
        let order = self.made_next;
        self.made_next += 1;
        let old = self.files.insert(ino, (generation, order));
        debug_assert!(
            old.is_none(),
            "inode {ino} made twice under one lease: {old:?}"
        );
    }

    /// Whether inode `ino` of generation `generation` was made under the
    /// lease (and not removed since).
    pub fn has(&self, ino: u64, generation: u64) -> bool {
        self.files.get(&ino).is_some_and(|&(g, _)| g == generation)
    }

    /// Inode `ino` removed under the lease.
    pub fn forget(&mut self, ino: u64) {
        self.files.remove(&ino);
    }

    /// How many files made under the lease are left.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    /// Whether no file made under the lease is left.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// The files made under the lease, (inode, generation), in the order
    /// made (the give-back keeps the first [`KEPT_MAX`] still written).
    pub fn into_files(self) -> Vec<(u64, u64)> {
        let mut v: Vec<(u64, u64, u64)> = self
            .files
            .into_iter()
            .map(|(i, (g, o))| (o, i, g))
            .collect();
        v.sort_unstable();
        v.into_iter().map(|(_, i, g)| (i, g)).collect()
    }
}

/// What a directory's give-back sends: `released D GEN kept=... removed=N`
/// and, with the last directory, the lane.
#[derive(Debug, Default)]
pub struct GiveBack {
    pub kept: Vec<(u64, u64)>,
    /// Removals made under the lease.
    pub removed: u64,
    /// Files made under the lease given back with it (beyond
    /// [`KEPT_MAX`], or not written any more): the caller drops their
    /// write leases.
    pub dropped: Vec<u64>,
    pub lane: Option<LaneReturn>,
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
    fn lock(&self) -> MutexGuard<'_, IntMap<DirState>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A request asking for `dir`'s lease is about to be sent: a recall
    /// arriving before its answer is remembered. False (nothing to ask:
    /// the request goes without `+dir`) if the lease is held or another
    /// thread's ask of it is in flight: a second ask by the holder gains
    /// nothing (the server answers it at once with `held`, since h/askattr;
    /// before, it held such an ask until the holder gave the lease back,
    /// which this client never did: every thread asking for one
    /// directory at once, filebench's 100 creating in one directory, hung
    /// there).
    pub fn ask(&self, dir: u64) -> bool {
        let mut map = self.lock();
        let st = map.entry(dir).or_default();
        if st.asking > 0 || st.held.is_some() {
            return false;
        }
        st.asking = 1;
        true
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
        if answer.is_some() {
            self.asks.answered(dir, held);
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
        // Not held but asked for: the grant in flight is recalled already.
        let ended = st.held.as_ref().is_none_or(|(g, _)| *g <= gen);
        if ended && st.held.take().is_some() {
            self.held.fetch_sub(1, SeqCst);
        }
        if ended {
            self.asks.ended(ino, Ended::Recalled);
        }
        if st.idle() {
            map.remove(&ino);
        }
        self.recalls.fetch_add(1, Relaxed);
        true
    }

    /// The oldest lease held (the lowest grant number) taken out of the
    /// book, if more than `max` are held: the caller gives it back with
    /// `released` (see [`HELD_MAX`]). Its k halves as at any give-back;
    /// an answer naming its grant later is not taken.
    pub fn oldest_beyond(&self, max: usize) -> Option<(u64, u64)> {
        if self.count() <= max {
            return None;
        }
        let mut map = self.lock();
        let (&ino, _) = map
            .iter()
            .filter_map(|(ino, st)| st.held.as_ref().map(|(g, _)| (ino, *g)))
            .min_by_key(|&(_, g)| g)?;
        let st = map.get_mut(&ino)?;
        let (gen, _) = st.held.take()?;
        st.recalled = st.recalled.max(gen);
        self.held.fetch_sub(1, SeqCst);
        self.asks.ended(ino, Ended::GivenBack);
        if st.idle() {
            map.remove(&ino);
        }
        Some((ino, gen))
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
        for &(ino, _) in &out {
            self.asks.ended(ino, Ended::GivenBack);
        }
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

    /// When to ask for each directory's lease.
    pub fn asks(&self) -> &AskTable {
        &self.asks
    }

    /// Recalls of directory leases answered so far.
    pub fn recalls(&self) -> u64 {
        self.recalls.load(Relaxed)
    }

    /// Creates made under directory leases so far.
    pub fn local_creates(&self) -> u64 {
        self.creates.load(Relaxed)
    }

    /// A leased directory's attributes changed by the client.
    pub fn attr_made(&self) {
        self.setattrs.fetch_add(1, Relaxed);
    }

    /// Attribute changes of leased directories made so far.
    pub fn local_setattrs(&self) -> u64 {
        self.setattrs.load(Relaxed)
    }

    /// Directories made under directory leases so far.
    pub fn local_mkdirs(&self) -> u64 {
        self.mkdirs.load(Relaxed)
    }

    /// Removals made under directory leases so far.
    pub fn local_removals(&self) -> u64 {
        self.removals.load(Relaxed)
    }

    /// One more removal made under a directory lease.
    pub(crate) fn removed_one(&self) {
        self.removals.fetch_add(1, Relaxed);
    }

    fn local(&self) -> MutexGuard<'_, IntMap<Made>> {
        self.local.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The book of what each lease made and removed, locked: a removal
    /// under a lease holds it from its look at the grant to its end, as a
    /// create does (crates/inkfs/src/api/client/remove.rs).
    pub(crate) fn local_book(&self) -> MutexGuard<'_, IntMap<Made>> {
        self.local()
    }

    /// The answer to an ask of `dir` that came with `lane` (a lane leased
    /// with it): the client's engine takes the lane and, if the grant is
    /// held, D's lease (under `local`, so a recall's give-back comes
    /// after). Whether D is held, and a lane to give back now (the
    /// client holds no directory lease: a grant recalled before its
    /// answer).
    pub fn answered_with<P: Pmem>(
        &self,
        fs: &Filesystem<P>,
        dir: u64,
        answer: Option<&DirAnswer>,
        lane: Option<&LaneGrant>,
    ) -> (bool, Option<LaneReturn>) {
        let _local = self.local();
        if let Some(g) = lane {
            if let Err(e) = fs.fs.client_take_lane(g) {
                // The server leased a lane this engine cannot take (it
                // holds one, or the chain disagrees): it gets it back
                // at the detach, or its reaping.
                eprintln!("inkfs: client: lane {} not taken: {e}", g.lane);
            }
        }
        let held = self.answered(dir, answer);
        // Rule 4 of a removal (crates/inkfs/src/rmlocal.rs): what the
        // kernel held under D at the grant.
        let kernel = match self.held(dir).map(|h| h.1) {
            Some(KernelView::Unknown) => KernelHeld::Nothing,
            Some(KernelView::Children(c)) => KernelHeld::Children(c),
            _ => KernelHeld::Many,
        };
        if held {
            if let Err(e) = fs.fs.client_lease_dir_with(dir, kernel) {
                // Held, unused: its creates go to the server.
                eprintln!("inkfs: client: directory {dir}'s lease not used: {e}");
            }
        }
        let back = if self.count() == 0 && fs.fs.client_lane().is_some() {
            fs.fs.client_give_back_lane().ok()
        } else {
            None
        };
        (held, back)
    }

    /// A create of `name` in `dir` under `dir`'s lease, in the client's
    /// engine `fs` (pinned by the caller), if this client holds the lease
    /// and a lane with a slot left; `made(ino, gen)` enters the new
    /// file's write lease (grant `gen`, D's) in the client's table before
    /// any give-back of D can list the files kept.
    #[allow(clippy::too_many_arguments)]
    pub fn create_local<P: Pmem>(
        &self,
        fs: &Filesystem<P>,
        cred: &Credentials,
        dir: u64,
        name: &[u8],
        mode: u32,
        flags: i32,
        made: impl FnOnce(u64, u64),
    ) -> Local {
        let mut local = self.local();
        let Some((gen, _)) = self.held(dir) else {
            return Local::Server;
        };
        if fs.fs.client_lane_slots() == 0 {
            return Local::Server;
        }
        // An existing name: the open of it is the server's (its
        // truncation, its lease).
        match fs.lookup(&Credentials::root(), dir, name) {
            Err(e) if e.errno() == libc::ENOENT => {}
            _ => return Local::Server,
        }
        let flags = OpenFlags::new(flags | libc::O_CREAT | libc::O_EXCL);
        let made_file = {
            let _w = fs.fs.client_writes();
            fs.create(cred, dir, name, mode & 0o7777, flags)
        };
        match made_file {
            Ok((a, file)) => {
                // Leased to the client when made for writing, as the
                // server's create leases it (`made` enters it).
                let writable = file.flags().writable();
                fs.release(file);
                local.entry(dir).or_default().add(a.ino, a.generation);
                self.creates.fetch_add(1, Relaxed);
                if !writable {
                    return Local::Made(a, 0);
                }
                made(a.ino, gen);
                Local::Made(a, gen)
            }
            // No lease or lane any more, no slot: the server's.
            Err(e) if [libc::EROFS, libc::EAGAIN, libc::EEXIST].contains(&e.errno()) => {
                Local::Server
            }
            Err(e) if e.errno() == libc::ENOSPC => Local::NoSpace,
            Err(e) => Local::Failed(e.errno()),
        }
    }

    /// A mkdir of `name` in `dir` under `dir`'s lease, in the client's
    /// engine `fs` (pinned by the caller), if this client holds the lease
    /// and a lane with a slot left: the engine's own `make_node`, as a
    /// create's (docs/KERNEL-FREE.md, "Built: mkdir under a directory
    /// lease"). The new directory is no file lease (nothing to keep at the
    /// give-back: the lane's take-back finds its slot LIVE and takes its
    /// blocks into the owner's books, `d`'s settle its entry); `Made`'s
    /// grant is 0. Under D's lease the engine's view of D is the
    /// authority: EEXIST is answered here, as an unlink's ENOENT is.
    pub fn mkdir_local<P: Pmem>(
        &self,
        fs: &Filesystem<P>,
        cred: &Credentials,
        dir: u64,
        name: &[u8],
        mode: u32,
    ) -> Local {
        let _local = self.local();
        if self.held(dir).is_none() || fs.fs.client_lane_slots() == 0 {
            return Local::Server;
        }
        let made = {
            let _w = fs.fs.client_writes();
            fs.mkdir(cred, dir, name, mode & 0o7777)
        };
        match made {
            Ok(a) => {
                self.mkdirs.fetch_add(1, Relaxed);
                Local::Made(a, 0)
            }
            // No lease or lane any more (the engine refused it), no slot.
            Err(e) if [libc::EROFS, libc::EAGAIN].contains(&e.errno()) => Local::Server,
            Err(e) if e.errno() == libc::ENOSPC => Local::NoSpace,
            Err(e) => Local::Failed(e.errno()),
        }
    }

    /// An attribute change of directory `dir` itself (chmod, chown,
    /// utimens: tar's, after it made the files in it) under `dir`'s lease,
    /// in the client's engine `fs` (pinned by the caller): one SET_ATTR
    /// entry in `dir`'s log, published by its tail as a create's DIR_ADD
    /// is, with the engine's rules for `cred` (owner for chmod and
    /// explicit times, CAP_CHOWN, a directory's set-id bits kept by a
    /// chown) and the ctime. None if this client does not hold the lease
    /// (the server makes it, recalling the lease if another holds it).
    /// Under `local`, as a create: a recall's give-back comes before or
    /// after it, never during (docs/KERNEL-FREE.md, "Built: attribute
    /// changes under a directory lease").
    pub fn setattr_local<P: Pmem>(
        &self,
        fs: &Filesystem<P>,
        cred: &Credentials,
        dir: u64,
        set: &SetAttr,
    ) -> Option<Result<Attr>> {
        debug_assert!(set.size.is_none(), "a directory has no size to set");
        let _local = self.local();
        self.held(dir)?;
        // Held in the book but not taken by the engine (its catch-up
        // failed at the grant): the server's, as that directory's creates.
        if !fs.fs.client_holds_dir_lease(dir) {
            return None;
        }
        let _w = fs.fs.client_writes();
        Some(fs.setattr(cred, dir, set, None))
    }

    /// Give directory `dir`'s lease (grant `gen`, taken out of the book by
    /// [`DirLeases::recall`] or [`DirLeases::drain`]) back in the client's
    /// engine `fs`: what to send (see the module comment). `holds(ino)`:
    /// whether the client still holds the write lease of a file made
    /// under it with grant `gen`.
    pub fn give_back<P: Pmem>(
        &self,
        fs: &Filesystem<P>,
        dir: u64,
        holds: impl Fn(u64) -> bool,
    ) -> GiveBack {
        let mut local = self.local();
        fs.fs.client_give_back_dir(dir);
        let made = local.remove(&dir).unwrap_or_default();
        let mut out = GiveBack {
            removed: made.removed,
            ..GiveBack::default()
        };
        for (ino, igen) in made.into_files() {
            if holds(ino) && out.kept.len() < KEPT_MAX {
                out.kept.push((ino, igen));
            } else {
                out.dropped.push(ino);
            }
        }
        if self.count() == 0 && fs.fs.client_lane().is_some() {
            match fs.fs.client_give_back_lane() {
                Ok(r) => out.lane = Some(r),
                // EBUSY: a directory lease taken meanwhile keeps it.
                Err(e) if e.errno() == libc::EBUSY => {}
                Err(e) => eprintln!("inkfs: client: the lane not given back: {e}"),
            }
        }
        out
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
    fn a_book_lists_files_as_made_without_those_removed() {
        let mut m = Made::default();
        for ino in [40u64, 7, 300, 12, 9] {
            m.add(ino, ino + 1000);
        }
        m.forget(300);
        m.forget(5); // never made: nothing
        assert!(m.has(7, 1007));
        assert!(!m.has(7, 1008), "another generation of the slot");
        assert!(!m.has(300, 1300), "removed");
        assert_eq!(m.len(), 4);
        m.add(300, 2300); // its slot made again
        assert_eq!(
            m.into_files(),
            vec![(40, 1040), (7, 1007), (12, 1012), (9, 1009), (300, 2300)]
        );
    }

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
                Refusal::NoLane => libc::EAGAIN,
                Refusal::Failed => libc::EIO,
                Refusal::Held => libc::EALREADY,
            };
            assert_eq!(Refusal::from_errno(e), r);
        }
    }

    /// Past `max` leases held, the oldest grant comes out of the book,
    /// once.
    #[test]
    fn the_oldest_lease_goes_back_past_the_bound() {
        let b = DirLeases::default();
        for (dir, gen) in [(10, 7), (11, 3), (12, 9)] {
            assert!(b.ask(dir));
            assert!(b.answered(dir, Some(&granted(gen))));
        }
        assert_eq!(b.oldest_beyond(3), None);
        assert_eq!(b.oldest_beyond(2), Some((11, 3)));
        assert_eq!(b.count(), 2);
        assert_eq!(b.held(11), None);
        assert_eq!(b.oldest_beyond(2), None);
        // Asked again: a new grant (the server answers `held` until it
        // has read the `released`) is the newest.
        assert!(b.ask(11));
        assert!(b.answered(11, Some(&granted(12))));
        assert_eq!(b.oldest_beyond(2), Some((10, 7)));
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

    /// One ask of a directory at a time, and none while it is held: the
    /// server holds a second ask by the lease's holder until the holder
    /// gives the lease back (threads creating in one directory at once
    /// hung on it). A recall, a refusal or no answer lets the next ask go.
    #[test]
    fn a_directory_is_asked_for_once_at_a_time() {
        let b = DirLeases::default();
        assert!(b.ask(5));
        assert!(!b.ask(5), "a second ask in flight");
        assert!(b.ask(6), "another directory");
        assert!(b.answered(5, Some(&granted(3))));
        assert!(!b.ask(5), "asked while held");
        assert!(b.recall(5, 3));
        assert!(b.ask(5), "recalled: asked again");
        assert!(!b.answered(5, Some(&DirAnswer::Refused(Refusal::Overflow))));
        assert!(b.ask(5), "refused: asked again");
        assert!(!b.answered(5, None));
        assert!(!b.answered(6, None));
        assert!(b.lock().is_empty(), "idle entries kept");
    }
}
