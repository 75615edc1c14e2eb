//! The lease table of a mount: which attached client may write which
//! regular file itself (docs/KERNEL-FREE.md, "Writing: per-inode leases";
//! the messages: `inkfs::api::lease`).
//!
//! - **Recall.** The engine tells the table before it uses any inode
//!   (`LeaseHook::before_use`, from its revalidation): a lease on it is
//!   recalled there, and the caller waits for the holder's `released`
//!   (or its death) before it goes on. A holder that does not answer in
//!   [`RECALL_TIMEOUT`] is killed (SIGKILL through the pidfd taken at
//!   attach), and its death settles the lease.
//! - **Busy.** A FUSE request holds every inode it used until it has
//!   answered (`Leases::scope`): no lease is granted on an inode a request
//!   is using, so the server and a client never write one log at once, and
//!   no request's reply lands in the kernel's caches after the grant's
//!   invalidation.
//! - **Grant** (a thread per client, so that the client's session keeps
//!   reading answers meanwhile): wait until no request uses the inode,
//!   recall it from another holder, note the blocks the inode refers to,
//!   invalidate the kernel's caches of it (pages and attributes; none if
//!   the kernel holds no reference to it: `Leases::prepare`), and grant
//!   only if no request touched it since; else start again.
//! - **Settling** (at `released`, or at the holder's death): the server's
//!   cached inode catches up from its own tail; the blocks it referred to
//!   at the grant and does not any more, and that the client did not
//!   return, go to the limbo; blocks of the client's reservation the inode
//!   now refers to leave the reservation. At death, the rest of the
//!   reservation goes to the limbo too. Then the server collects the log,
//!   the inode busy meanwhile (no grant while the log is replaced).
//!
//! - **Directories** (docs/KERNEL-FREE.md, "Built: directory leases on the
//!   server"): an entry for a directory's inode number, flagged `dir`,
//!   granted with a namespace request that asks (`+dir`, crate::ns) by
//!   [`Leases::grant_dir`] and recalled, settled and timed out as a
//!   file's. Its grant checks the directory (LIVE, no orphan, not
//!   immutable), says what the kernel holds under it, and drops the
//!   kernel's names under it (crate::dirlease); its settling catches the
//!   server's directory up from its cached tail, and the blocks its log
//!   names leave the client's reservation (its new entries' pages). A
//!   dead holder's lane is reaped before its directories are settled
//!   (crate::lanes).
//!
//! The fast path (no client attached) is one relaxed load.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use inkfs::api::dirlease::{KernelView, Refusal};
use inkfs::api::lease::{LeaseHook, Msg, RangeSet};
use inkfs::api::Side;

use crate::inval::{Change, Invalidator};
use crate::Engine;

/// How long a lease holder has to answer a recall before it is killed.
pub const RECALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Blocks a client's reservation request gets at most at once.
pub const RESERVE_MAX: u64 = 1 << 16;
/// Shards of the table (a power of two).
const SHARDS: usize = 16;

thread_local! {
    /// The inodes the current FUSE request holds busy (None: not in a
    /// request).
    static SCOPE: RefCell<Option<Vec<u64>>> = const { RefCell::new(None) };
    /// The last request's list, emptied, for the next one (no allocation
    /// per request).
    static SPARE: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
    /// This thread is the table's own (granting, settling): the engine's
    /// uses of inodes recall nothing.
    static SILENT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// One attached client, as the table knows it.
pub struct Holder {
    pub id: u64,
    /// Its session, for recalls and answers (one writer at a time).
    out: Mutex<UnixStream>,
    /// To kill it if it does not answer a recall (None: could not be
    /// opened; the client then cannot be forced, and a recall waits).
    pidfd: Option<OwnedFd>,
    books: Mutex<Books>,
    dead: AtomicBool,
    /// Lines of its session the session's reader has acted on, for a
    /// lease given back with a request (`Leases::settle_given`).
    lines: Mutex<u64>,
    lines_read: Condvar,
    /// Threads waiting on `lines_read` now (changed with `lines` locked,
    /// as a shard's `waiting`: the reader wakes nobody when it is 0).
    lines_waiting: AtomicUsize,
    /// The lane leased to it (crate::lanes), locked for a grant, a
    /// give-back or a reaping of it.
    pub(crate) lane: Mutex<Option<u32>>,
}

impl Holder {
    /// The session's reader has acted on one more line.
    pub fn line_read(&self) {
        let mut n = lock(&self.lines);
        *n += 1;
        if self.lines_waiting.load(Relaxed) != 0 {
            self.lines_read.notify_all();
        }
    }

    /// Wait until the session's reader has acted on `want` lines: false if
    /// they did not come within [`RECALL_TIMEOUT`] (a client that named
    /// lines it never wrote) or the session ended.
    fn wait_lines(&self, want: u64) -> bool {
        let deadline = Instant::now() + RECALL_TIMEOUT;
        let mut n = lock(&self.lines);
        while *n < want {
            let now = Instant::now();
            if self.dead.load(SeqCst) || now >= deadline {
                return false;
            }
            self.lines_waiting.fetch_add(1, Relaxed);
            let wait = (deadline - now).min(Duration::from_millis(100));
            n = self
                .lines_read
                .wait_timeout(n, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            self.lines_waiting.fetch_sub(1, Relaxed);
        }
        true
    }

    /// Blocks of its reservation now named by an inode (or returned): out
    /// of its books.
    pub(crate) fn unreserve(&self, ranges: &[(u64, u64)]) {
        let mut books = lock(&self.books);
        for &(s, l) in ranges {
            books.reserved.remove(s, l);
        }
    }

    /// A lease of `ino` granted to it, the inode naming `named` (its
    /// `before`): those blocks are the inode's, out of the reservation's
    /// books (docs/KERNEL-FREE.md, "Built: the books with the ask on").
    /// A block a file made under a directory lease still had there (the
    /// directory's settle not seen yet) was otherwise freed twice: by the
    /// `return` of it, taken from the books, and by the lease's settle,
    /// which frees what `before` has and the file no longer names.
    fn lease_named(&self, ino: u64, named: &[(u64, u64)]) {
        let mut books = lock(&self.books);
        for &(s, l) in named {
            books.reserved.remove(s, l);
        }
        books.leases.insert(ino);
    }

    /// Whether the client died (its session ended).
    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(SeqCst)
    }
}

#[derive(Default)]
struct Books {
    /// Blocks reserved for it and not yet seen in an inode.
    reserved: RangeSet,
    /// Inodes it holds leases on.
    leases: HashSet<u64>,
}

#[derive(Default)]
struct Entry {
    holder: Option<Arc<Holder>>,
    /// The number of the holder's grant (`inkfs::api::lease`).
    gen: u64,
    /// The blocks the inode referred to at the grant, less those returned.
    before: RangeSet,
    /// FUSE requests using the inode now.
    busy: u32,
    /// A grant is being prepared.
    granting: bool,
    /// Used since the grant being prepared began.
    touched: bool,
    /// A recall was sent.
    recalling: bool,
    /// A directory's lease (or one being prepared).
    dir: bool,
}

impl Entry {
    fn idle(&self) -> bool {
        self.holder.is_none() && self.busy == 0 && !self.granting
    }
}

struct Shard {
    map: Mutex<HashMap<u64, Entry>>,
    changed: Condvar,
    /// Threads waiting on `changed` now. Changed and read only with `map`
    /// locked (Relaxed is enough: the lock orders it), so a change made
    /// under the lock that finds it 0 has no waiter to wake: one that
    /// looked at its entry before the change counted itself before it let
    /// the lock go. A request's end (`Leases::unbusy`, twice per ring
    /// request) then makes no system call: std's `notify_all` always
    /// makes one (bench/results-notes/srvcpu.md).
    waiting: AtomicUsize,
}

impl Shard {
    /// Wait for a change to this shard's entries, at most 100 ms: the
    /// caller looks at its entry again either way.
    fn wait_changed<'a>(
        &self,
        map: MutexGuard<'a, HashMap<u64, Entry>>,
    ) -> MutexGuard<'a, HashMap<u64, Entry>> {
        self.wait_for(map, Duration::from_millis(100))
    }

    /// Wait for a change, at most `timeout`, counted in `waiting`.
    fn wait_for<'a>(
        &self,
        map: MutexGuard<'a, HashMap<u64, Entry>>,
        timeout: Duration,
    ) -> MutexGuard<'a, HashMap<u64, Entry>> {
        self.waiting.fetch_add(1, Relaxed);
        let map = self
            .changed
            .wait_timeout(map, timeout)
            .unwrap_or_else(|e| e.into_inner())
            .0;
        self.waiting.fetch_sub(1, Relaxed);
        map
    }

    /// Wake the waiters of a change made under `_map`, the shard's lock
    /// (held: see `waiting`), if there are any.
    fn wake_waiters(&self, _map: &MutexGuard<'_, HashMap<u64, Entry>>) {
        if self.waiting.load(Relaxed) != 0 {
            self.changed.notify_all();
        }
    }
}

pub struct Leases {
    engine: Weak<Engine>,
    inval: Arc<Invalidator>,
    /// Clients attached (the fast path's one load).
    attached: AtomicUsize,
    /// The mount is ending: no more grants.
    closing: AtomicBool,
    /// The next grant's number.
    next_gen: AtomicU64,
    shards: Vec<Shard>,
    /// Leases given back by `released` on a session (a recall's answer,
    /// or a give-back ahead of a removal by an older client), and with a
    /// removal request (`Leases::settle_given`): for `inkfs stat`.
    released: AtomicU64,
    given: AtomicU64,
    /// Directory leases: counters, and the recall timeouts of the last
    /// second (crate::dirlease).
    pub(crate) dirs: crate::dirlease::DirBooks,
    /// Lane leases' counters (crate::lanes).
    pub(crate) lanes: crate::lanes::LaneBooks,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Leases {
    pub fn new(engine: &Arc<Engine>, inval: Arc<Invalidator>) -> Arc<Leases> {
        let leases = Arc::new(Leases {
            engine: Arc::downgrade(engine),
            inval,
            attached: AtomicUsize::new(0),
            closing: AtomicBool::new(false),
            next_gen: AtomicU64::new(1),
            released: AtomicU64::new(0),
            given: AtomicU64::new(0),
            dirs: Default::default(),
            lanes: Default::default(),
            shards: (0..SHARDS)
                .map(|_| Shard {
                    map: Mutex::default(),
                    changed: Condvar::new(),
                    waiting: AtomicUsize::new(0),
                })
                .collect(),
        });
        engine.set_lease_hook(leases.clone());
        leases
    }

    /// How the kernel is told of changes made outside it.
    pub fn inval(&self) -> &Invalidator {
        &self.inval
    }

    fn shard(&self, ino: u64) -> &Shard {
        &self.shards[(ino as usize) & (SHARDS - 1)]
    }

    /// One hold on `ino` (a request's, or settle's while it collects the
    /// log) ends: forget an entry nothing uses any more, and wake a grant
    /// waiting for the inode to be idle.
    fn unbusy(&self, ino: u64) {
        let shard = self.shard(ino);
        let mut map = lock(&shard.map);
        if let Some(e) = map.get_mut(&ino) {
            e.busy = e.busy.saturating_sub(1);
            if e.idle() {
                map.remove(&ino);
            }
        }
        shard.wake_waiters(&map);
    }

    /// A client attached: its books, with the pid to kill it by.
    pub fn join(&self, id: u64, pid: i32, out: UnixStream) -> Arc<Holder> {
        self.attached.fetch_add(1, SeqCst);
        Arc::new(Holder {
            id,
            out: Mutex::new(out),
            pidfd: pidfd_open(pid),
            books: Mutex::default(),
            dead: AtomicBool::new(false),
            lines: Mutex::new(0),
            lines_read: Condvar::new(),
            lines_waiting: AtomicUsize::new(0),
            lane: Mutex::new(None),
        })
    }

    /// The mount's engine, while it lasts.
    pub(crate) fn engine(&self) -> Option<Arc<Engine>> {
        self.engine.upgrade()
    }

    /// The holder's leases now: (files, directories).
    pub(crate) fn leases_of(&self, holder: &Holder) -> (Vec<u64>, Vec<u64>) {
        let leased: Vec<u64> = lock(&holder.books).leases.iter().copied().collect();
        let (mut files, mut dirs) = (Vec::new(), Vec::new());
        for ino in leased {
            let map = lock(&self.shard(ino).map);
            match map.get(&ino) {
                Some(e) if e.holder.as_ref().is_some_and(|h| h.id == holder.id) => {
                    if e.dir {
                        dirs.push(ino);
                    } else {
                        files.push(ino);
                    }
                }
                _ => {}
            }
        }
        (files, dirs)
    }

    /// The holder's blocks reserved and not yet seen in an inode.
    pub(crate) fn reserved_of(&self, holder: &Holder) -> Vec<(u64, u64)> {
        lock(&holder.books).reserved.ranges()
    }

    /// `released D GEN kept=...`: the files `kept` (inode, generation)
    /// that the holder made under directory `dir`'s grant `gen` and keeps
    /// writing become its file leases of grant `gen`, before D is settled
    /// (docs/KERNEL-FREE.md, "What the holder finishes before
    /// `released`"). Each must be a live regular file of the lane leased
    /// to the holder with that generation, leased to no one; any other is
    /// skipped, loudly (the server then owns it as any file nobody
    /// leases, and the client's later writes ask for its lease).
    pub fn adopt_kept(&self, holder: &Arc<Holder>, dir: u64, gen: u64, kept: &[(u64, u64)]) {
        let _silent = Silent::on();
        let Some(engine) = self.engine.upgrade() else {
            return;
        };
        let holds_dir = {
            let map = lock(&self.shard(dir).map);
            map.get(&dir).is_some_and(|e| {
                e.dir && e.gen == gen && e.holder.as_ref().is_some_and(|h| h.id == holder.id)
            })
        };
        let lane = *lock(&holder.lane);
        for &(ino, igen) in kept {
            let ok =
                holds_dir && lane == Some(engine.lane_of_ino(ino)) && engine.is_linked(ino, igen);
            // Caught up and its tail durable (`lease_refs`): the blocks it
            // names now are those a later settle compares with.
            let refs = match ok.then(|| engine.lease_refs(ino)) {
                Some(Ok(r)) => r,
                _ => {
                    eprintln!(
                        "inkfs: client {} kept inode {ino}:{igen} it did not make under its lease of {dir}: ignored",
                        holder.id
                    );
                    continue;
                }
            };
            let shard = self.shard(ino);
            let mut map = lock(&shard.map);
            let e = map.entry(ino).or_default();
            if e.holder.is_some() || e.granting {
                continue;
            }
            e.holder = Some(holder.clone());
            e.gen = gen;
            e.before = RangeSet::from_ranges(&refs);
            e.recalling = false;
            e.dir = false;
            holder.lease_named(ino, &refs);
            self.lanes.kept();
        }
    }

    /// Clients attached now.
    pub fn attached(&self) -> usize {
        self.attached.load(Relaxed)
    }

    /// The FUSE request on this thread holds the inodes it uses until the
    /// returned guard goes (after its answer).
    pub fn scope(self: &Arc<Self>) -> Scope {
        if self.attached.load(Relaxed) == 0 {
            return Scope { leases: None };
        }
        let list = SPARE.take();
        debug_assert!(list.is_empty());
        SCOPE.set(Some(list));
        Scope {
            leases: Some(self.clone()),
        }
    }

    /// Wait until `ino` is leased to no one, recalling it from its holder.
    /// Called with the shard locked; returns it locked.
    fn recall_locked<'a>(
        &self,
        shard: &'a Shard,
        mut map: MutexGuard<'a, HashMap<u64, Entry>>,
        ino: u64,
    ) -> MutexGuard<'a, HashMap<u64, Entry>> {
        let mut deadline = None::<Instant>;
        let mut killed = false;
        // A directory's holder killed here: its refusal window starts
        // again once the lease is settled (the wait for the holder's end
        // may be long on a loaded machine).
        let mut killed_dir = false;
        loop {
            let settled = match map.get(&ino) {
                None => true,
                Some(e) => e.holder.is_none(),
            };
            if settled {
                if killed_dir {
                    self.dirs.timed_out(ino);
                }
                return map;
            }
            let Some(e) = map.get_mut(&ino) else {
                return map;
            };
            let Some(holder) = e.holder.clone() else {
                return map;
            };
            if holder.dead.load(SeqCst) {
                // Its session is over: nothing of it writes any more, and
                // nobody else would answer for it.
                drop(map);
                self.settle(&holder, ino, None);
                map = lock(&shard.map);
                continue;
            }
            if !e.recalling {
                e.recalling = true;
                if e.dir {
                    self.dirs.recalled();
                }
                // A send that fails finds the session closed, not the
                // client dead: a process may drop one client and live on
                // (killing its pid here killed such a process). The
                // server's side of the session sees the end and settles
                // the lease (`Leases::end`, which wakes this wait); the
                // timeout below stays for a session that never ends.
                let _ = send(&holder, &Msg::Recall(ino, e.gen));
            }
            let until = *deadline.get_or_insert_with(|| Instant::now() + RECALL_TIMEOUT);
            let now = Instant::now();
            if now >= until && !killed {
                eprintln!(
                    "inkfs: client {} did not give back the lease of inode {ino} in {:?}: killed",
                    holder.id, RECALL_TIMEOUT
                );
                kill(&holder);
                killed = true;
                if e.dir {
                    // No grant of it for a while: the directory's users
                    // through the mount just waited the whole timeout.
                    self.dirs.timed_out(ino);
                    killed_dir = true;
                }
            }
            let wait = if killed {
                Duration::from_millis(100)
            } else {
                until - now
            };
            map = shard.wait_for(map, wait);
        }
    }

    /// Grant `ino`'s lease to `holder` (see the module comment): the
    /// grant's number, or the errno it is denied with. `asked`: the client
    /// asked for it, so it does not hold it any more if the table says it
    /// does (its `released` is on its way, on the session, while the
    /// request came on the ring): wait for that, then grant anew. Else (a
    /// lease that comes with a create) a grant it holds already is its
    /// answer.
    pub fn grant(&self, holder: &Arc<Holder>, ino: u64, asked: bool) -> Result<u64, i32> {
        self.grant_entry(holder, ino, asked, false)
            .map(|(gen, _)| gen)
    }

    /// Grant directory `ino`'s lease to `holder`, asked for with a
    /// namespace request (`+dir`): the grant's number and what the kernel
    /// held under the directory, or why not (counted).
    pub fn grant_dir(&self, holder: &Arc<Holder>, ino: u64) -> Result<(u64, KernelView), Refusal> {
        match self.grant_entry(holder, ino, true, true) {
            Ok((gen, view)) => {
                self.dirs.granted();
                Ok((gen, view.unwrap_or(KernelView::Many)))
            }
            Err(e) => {
                let why = Refusal::from_errno(e);
                self.dirs.refused(why);
                Err(why)
            }
        }
    }

    /// [`Leases::grant`] of a file's (`dir` false) or a directory's lease:
    /// its number and, for a directory, the kernel's view at the grant.
    fn grant_entry(
        &self,
        holder: &Arc<Holder>,
        ino: u64,
        asked: bool,
        dir: bool,
    ) -> Result<(u64, Option<KernelView>), i32> {
        let _silent = Silent::on();
        let engine = self.engine.upgrade().ok_or(libc::ESHUTDOWN)?;
        let shard = self.shard(ino);
        loop {
            {
                let mut map = lock(&shard.map);
                loop {
                    if holder.dead.load(SeqCst) || self.closing.load(SeqCst) {
                        return Err(libc::ESHUTDOWN);
                    }
                    let e = map.entry(ino).or_default();
                    if e.holder.as_ref().is_some_and(|h| h.id == holder.id) {
                        if !asked {
                            return Ok((e.gen, None));
                        }
                        if dir {
                            // The holder asks for a directory it holds (a
                            // second thread's ask, or one after a give-back
                            // whose `released` this session has not read
                            // yet): answered at once, `held`. Waiting here
                            // for its give-back would wait on the asker
                            // itself, which may never give it back (its
                            // ring blocked until the recall timeout); in
                            // the second case its book has the lease as
                            // ended already, and its next ask is granted.
                            return Err(libc::EALREADY);
                        }
                        map = shard.wait_changed(map);
                        continue;
                    }
                    if e.holder.is_some() {
                        map = self.recall_locked(shard, map, ino);
                        continue;
                    }
                    if e.busy > 0 || e.granting {
                        map = shard.wait_changed(map);
                        continue;
                    }
                    e.granting = true;
                    e.touched = false;
                    break;
                }
            }
            let prepared = if dir {
                crate::dirlease::prepare(self, &engine, ino).map(|v| (RangeSet::new(), Some(v)))
            } else {
                self.prepare(&engine, ino).map(|b| (b, None))
            };
            let mut map = lock(&shard.map);
            let e = map.entry(ino).or_default();
            e.granting = false;
            let (before, view) = match prepared {
                Ok(b) => b,
                Err(errno) => {
                    if e.idle() {
                        map.remove(&ino);
                    }
                    shard.wake_waiters(&map);
                    return Err(errno);
                }
            };
            if e.touched || e.busy > 0 || e.holder.is_some() {
                // A request used it meanwhile: its answer may have filled
                // the kernel's caches after the invalidation.
                shard.wake_waiters(&map);
                continue;
            }
            if holder.dead.load(SeqCst) {
                map.remove(&ino);
                shard.wake_waiters(&map);
                return Err(libc::ESHUTDOWN);
            }
            e.holder = Some(holder.clone());
            e.gen = self.next_gen.fetch_add(1, Relaxed);
            let named = before.ranges();
            e.before = before;
            e.recalling = false;
            e.dir = dir;
            holder.lease_named(ino, &named);
            return Ok((e.gen, view));
        }
    }

    /// The blocks `ino` refers to now, once the kernel has forgotten what
    /// it cached of it.
    fn prepare(&self, engine: &Engine, ino: u64) -> Result<RangeSet, i32> {
        if engine.is_orphan(ino).map_err(|e| e.errno())? && !engine.orphan_in_use(ino) {
            // Unlinked and kept by nobody: it is being freed. (One a
            // handle or a client's hold keeps may be leased: every path
            // that frees an orphan takes its lease back first.)
            return Err(libc::ENOENT);
        }
        let refs = engine.lease_refs(ino).map_err(|e| e.errno())?;
        // Pages and attributes, at once: no request uses the inode, so the
        // kernel waits on nothing of ours for it. None if the kernel holds
        // no reference to the inode (a file a client made, that the kernel
        // never looked up): every reply that used the inode before the
        // grant began (`busy` back at 0) counted it before it ended, so no
        // count means the kernel forgot all of them; a reply using it from
        // now on marks it `touched` (the grant starts again, and decides
        // again), and after the grant recalls the lease. A reply counted
        // and not yet taken in: the invalidation is sent until it lands
        // (crate::inval).
        self.inval.client_changed(Change::Data {
            ino,
            off: 0,
            len: 0,
        });
        Ok(RangeSet::from_ranges(&refs))
    }

    /// The holder removed file `ino` itself (`orphan` or `slot`,
    /// crate::lanes): its lease of it, if it holds one, ends without a
    /// settle. There is nothing to catch up (the inode is unlinked or
    /// freed), and what the inode named at the grant is freed with the
    /// inode, once: the blocks it displaced since came back in `return`s
    /// before this message.
    pub(crate) fn forget_removed(&self, holder: &Holder, ino: u64) {
        let shard = self.shard(ino);
        let mut map = lock(&shard.map);
        let Some(e) = map.get_mut(&ino) else {
            return;
        };
        if e.dir || e.holder.as_ref().map(|h| h.id) != Some(holder.id) {
            return;
        }
        e.holder = None;
        e.before = RangeSet::new();
        e.recalling = false;
        lock(&holder.books).leases.remove(&ino);
        if e.idle() {
            map.remove(&ino);
        }
        shard.wake_waiters(&map);
    }

    /// A `released` line of the holder's session: settle it.
    pub fn released(&self, holder: &Holder, ino: u64, gen: u64) {
        self.released.fetch_add(1, Relaxed);
        self.settle(holder, ino, Some(gen));
    }

    /// Leases the holder gave back with a removal request
    /// (`inkfs::api::ns::Give`), before the request's engine call (whose
    /// recall then finds nothing to recall): each is settled as at its
    /// `released`, once the session's reader has acted on the lines the
    /// client had written when it gave the lease back: the `return`s of
    /// the blocks it freed are among them, and are taken back under the
    /// lease, as when they came before a `released`. A client that named
    /// lines it never wrote has its lease settled after
    /// [`RECALL_TIMEOUT`] anyway.
    pub fn settle_given(&self, holder: &Holder, gives: &[inkfs::api::ns::Give]) {
        for g in gives {
            let _ = holder.wait_lines(g.lines);
            self.given.fetch_add(1, Relaxed);
            self.settle(holder, g.ino, Some(g.gen));
        }
    }

    /// Leases given back so far: (by `released`, with requests).
    pub fn give_backs(&self) -> (u64, u64) {
        (self.released.load(Relaxed), self.given.load(Relaxed))
    }

    /// The holder gave `ino`'s grant `gen` back (`None`: it died, every
    /// grant): catch the server's inode up and settle the blocks (see the
    /// module comment). A `released` of an older grant than the one held
    /// now is ignored.
    pub fn settle(&self, holder: &Holder, ino: u64, gen: Option<u64>) {
        let _silent = Silent::on();
        let Some(engine) = self.engine.upgrade() else {
            return;
        };
        let shard = self.shard(ino);
        let dir = lock(&shard.map).get(&ino).is_some_and(|e| e.dir);
        if dir && gen.is_none() {
            // A dead holder's lane is reaped before its directory is
            // caught up: its journal may hold a commit of a create in D.
            crate::lanes::reap(self, &engine, holder);
        }
        // A directory's holder wrote its new entries' log pages from its
        // reservation: caught up, the blocks its log names leave the
        // reservation (they are the directory's now), and so do those of
        // the files it made under the lease (crate::lanes::made_blocks).
        let after = if dir {
            engine.dir_catch_up_made(ino).and_then(|made| {
                let mut refs = engine.blocks_named(ino)?;
                refs.extend(crate::lanes::made_blocks(&engine, &made));
                Ok(refs)
            })
        } else {
            engine.lease_refs(ino)
        };
        // A file made under a lane lease has its head chunk in a block its
        // holder carved: that block stays in the holder's books until the
        // lane is settled (lanes.rs, `released`; the reaping), and the
        // server's frees of its chunks are held until then
        // (crates/inkfs/src/lanechunks.rs).
        let mut map = lock(&shard.map);
        let Some(e) = map.get_mut(&ino) else {
            return;
        };
        if e.holder.as_ref().map(|h| h.id) != Some(holder.id) || gen.is_some_and(|g| g != e.gen) {
            return;
        }
        let mut freed = std::mem::take(&mut e.before);
        let mut books = lock(&holder.books);
        match &after {
            Ok(refs) => {
                for &(start, len) in refs {
                    freed.remove(start, len);
                    books.reserved.remove(start, len);
                }
            }
            Err(err) => {
                // The log no longer replays: keep every block (a remount's
                // scan settles them) rather than free one still in use.
                eprintln!("inkfs: settling the lease of inode {ino}: {err}");
                freed = RangeSet::new();
            }
        }
        books.leases.remove(&ino);
        drop(books);
        e.holder = None;
        e.recalling = false;
        e.dir = false;
        // The holder collected nothing: the log's GC is due now, before
        // anyone leases it again. Busy meanwhile, as under a request: a
        // client granted the lease during the compaction would append to
        // the log being replaced, and its records would be lost with it.
        let collect = after.is_ok();
        if collect {
            e.busy += 1;
        }
        if e.idle() {
            map.remove(&ino);
        }
        shard.wake_waiters(&map);
        drop(map);
        engine.return_blocks(&freed.ranges());
        if collect {
            // A request waiting for this recall may get there first; it
            // collects after its own operation.
            let _ = engine.collect_log(ino);
            self.unbusy(ino);
        }
    }

    /// A reservation request: up to `want` blocks (limited to
    /// [`RESERVE_MAX`]) on `side` (a hybrid pool's data device: PM blocks
    /// when it is full), or none.
    pub fn reserve(&self, holder: &Holder, want: u64, side: Side) -> Vec<(u64, u64)> {
        let Some(engine) = self.engine.upgrade() else {
            return Vec::new();
        };
        let want = want.clamp(1, RESERVE_MAX);
        let take = |want| match side {
            Side::Pm => engine.reserve_blocks(want),
            Side::Dev => engine.reserve_dev_blocks(want),
        };
        let mut got = take(want);
        if got.is_empty() && engine.limbo_blocks() > 0 {
            // Freed blocks waiting for readers: the session's own reader
            // (this client) is not in a call while it waits for this.
            let end = Instant::now() + inkfs::api::LIMBO_WAIT;
            while got.is_empty() && Instant::now() < end {
                engine.reclaim_limbo();
                got = take(want);
                if got.is_empty() {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
        let mut books = lock(&holder.books);
        for &(s, l) in &got {
            books.reserved.insert(s, l);
        }
        got
    }

    /// Blocks the client returns: those it may give (reserved for it, or
    /// referred to by an inode it holds at the grant) go to the limbo;
    /// anything else is ignored, loudly (a double free would corrupt).
    pub fn take_back(&self, holder: &Holder, ranges: &[(u64, u64)]) {
        let Some(engine) = self.engine.upgrade() else {
            return;
        };
        let mut ok = Vec::new();
        let leased: Vec<u64> = lock(&holder.books).leases.iter().copied().collect();
        for &(start, len) in ranges {
            let mut rest = RangeSet::from_ranges(&[(start, len)]);
            {
                let mut books = lock(&holder.books);
                for (s, l) in books.reserved.intersect(start, len) {
                    books.reserved.remove(s, l);
                    rest.remove(s, l);
                    ok.push((s, l));
                }
            }
            for &ino in &leased {
                if rest.is_empty() {
                    break;
                }
                let mut map = lock(&self.shard(ino).map);
                let Some(e) = map.get_mut(&ino) else { continue };
                if e.holder.as_ref().map(|h| h.id) != Some(holder.id) {
                    continue;
                }
                for (s, l) in rest.ranges() {
                    for (a, b) in e.before.intersect(s, l) {
                        e.before.remove(a, b);
                        rest.remove(a, b);
                        ok.push((a, b));
                    }
                }
            }
            if !rest.is_empty() {
                eprintln!(
                    "inkfs: client {} returned blocks it does not hold ({:?}): ignored",
                    holder.id,
                    rest.ranges()
                );
            }
        }
        engine.return_blocks(&ok);
    }

    /// Blocks of its reservation the client gives back unused: those
    /// still reserved for it leave its books and are free at once (no
    /// reader can hold a block never committed: `Fs::free_unused_blocks`);
    /// anything else is ignored, loudly (a block it committed belongs to
    /// an inode or the limbo, and freeing it now would corrupt). Under
    /// the books' lock, so the client's death (`leave`) cannot return the
    /// same blocks again.
    pub fn take_back_unused(&self, holder: &Holder, ranges: &[(u64, u64)]) {
        let Some(engine) = self.engine.upgrade() else {
            return;
        };
        let mut ok = Vec::new();
        let mut refused = Vec::new();
        {
            let mut books = lock(&holder.books);
            for &(start, len) in ranges {
                let mut rest = RangeSet::from_ranges(&[(start, len)]);
                for (s, l) in books.reserved.intersect(start, len) {
                    books.reserved.remove(s, l);
                    rest.remove(s, l);
                    ok.push((s, l));
                }
                refused.extend(rest.ranges());
            }
        }
        if !refused.is_empty() {
            eprintln!(
                "inkfs: client {} gave back as unused blocks not reserved for it ({refused:?}): ignored",
                holder.id
            );
        }
        engine.free_unused_blocks(&ok);
    }

    /// The client's session ended: it is dead to the table (no grant to it
    /// any more, a recall of its leases settles them at once), and every
    /// lease it holds is settled. Its threads on the server (worker, ring)
    /// may still be running a request, which may wait for one of these
    /// leases: they can end now.
    pub fn end(&self, holder: &Holder) {
        holder.dead.store(true, SeqCst);
        if let Some(engine) = self.engine.upgrade() {
            // Its lane first (docs/KERNEL-FREE.md, "What each crash
            // leaves (stage 5)"): its journal replayed before any of its
            // directories is caught up.
            let _silent = Silent::on();
            crate::lanes::reap(self, &engine, holder);
        }
        let leased: Vec<u64> = lock(&holder.books).leases.iter().copied().collect();
        for ino in leased {
            self.settle(holder, ino, None);
        }
        // Every waiter, unconditionally: `dead` was stored without the
        // shards' locks, so a waiter may be between its look at it and
        // its count in `waiting` (rare: once per session).
        for s in &self.shards {
            s.changed.notify_all();
        }
    }

    /// The client is gone and its threads on the server have ended: settle
    /// what a grant in flight gave it after [`Leases::end`], and return the
    /// rest of its reservation.
    pub fn leave(&self, holder: &Holder) {
        self.end(holder);
        let rest = std::mem::take(&mut lock(&holder.books).reserved);
        if let Some(engine) = self.engine.upgrade() {
            engine.return_blocks(&rest.ranges());
        }
        self.attached.fetch_sub(1, SeqCst);
        for s in &self.shards {
            s.changed.notify_all();
        }
    }

    /// The mount is ending: grant nothing more, and take every lease back
    /// (each holder finishes the write in flight first), so that no client
    /// writes once its session is closed.
    pub fn recall_all(&self) {
        self.closing.store(true, SeqCst);
        for shard in &self.shards {
            let leased: Vec<u64> = lock(&shard.map)
                .iter()
                .filter(|(_, e)| e.holder.is_some())
                .map(|(&ino, _)| ino)
                .collect();
            for ino in leased {
                let map = lock(&shard.map);
                drop(self.recall_locked(shard, map, ino));
            }
        }
    }

    /// Leases held now (for statistics and tests): (files, directories).
    pub fn held(&self) -> (usize, usize) {
        let mut n = (0, 0);
        for s in &self.shards {
            for e in lock(&s.map).values().filter(|e| e.holder.is_some()) {
                if e.dir {
                    n.1 += 1;
                } else {
                    n.0 += 1;
                }
            }
        }
        n
    }
}

impl LeaseHook for Leases {
    fn is_leased(&self, ino: u64) -> bool {
        if self.attached.load(Relaxed) == 0 {
            return false;
        }
        lock(&self.shard(ino).map)
            .get(&ino)
            .is_some_and(|e| e.holder.is_some())
    }

    fn before_use(&self, ino: u64) {
        if self.attached.load(Relaxed) == 0 || SILENT.get() {
            return;
        }
        let in_scope = SCOPE.with(|s| s.borrow().as_ref().map(|v| v.contains(&ino)));
        if in_scope == Some(true) {
            return; // this request holds it already
        }
        let shard = self.shard(ino);
        let mut map = lock(&shard.map);
        if map.get(&ino).is_some_and(|e| e.holder.is_some()) {
            map = self.recall_locked(shard, map, ino);
        }
        if in_scope.is_none() {
            // Outside a request (statistics, scrub): a read that leaves
            // nothing in the kernel's caches.
            if let Some(e) = map.get_mut(&ino) {
                e.touched = true;
            }
            return;
        }
        let e = map.entry(ino).or_default();
        e.touched = true;
        e.busy += 1;
        drop(map);
        SCOPE.with(|s| {
            if let Some(v) = s.borrow_mut().as_mut() {
                v.push(ino);
            }
        });
    }
}

/// This thread is the table's own until the guard goes: the engine's
/// uses of inodes recall nothing (crate::lanes: the take-back of a lane
/// reads inodes whose leases the same client may hold, and the session's
/// reader that would read its `released` is this thread).
pub(crate) fn silent() -> impl Drop {
    Silent::on()
}

/// A FUSE request's hold on the inodes it used (see `Leases::scope`).
pub struct Scope {
    leases: Option<Arc<Leases>>,
}

impl Drop for Scope {
    fn drop(&mut self) {
        let Some(leases) = self.leases.take() else {
            return;
        };
        let mut held = SCOPE.take().unwrap_or_default();
        for &ino in &held {
            leases.unbusy(ino);
        }
        held.clear();
        SPARE.set(held);
    }
}

/// Marks this thread as the table's own while it lives.
struct Silent(bool);

impl Silent {
    fn on() -> Silent {
        Silent(SILENT.replace(true))
    }
}

impl Drop for Silent {
    fn drop(&mut self) {
        SILENT.set(self.0);
    }
}

/// Send one message to a client.
pub fn send(holder: &Holder, msg: &Msg) -> std::io::Result<()> {
    let out = lock(&holder.out);
    (&*out).write_all(msg.line().as_bytes())
}

/// SIGKILL the client through its pidfd (a pid could have been reused).
fn kill(holder: &Holder) {
    let Some(fd) = &holder.pidfd else {
        return;
    };
    // SAFETY: pidfd_send_signal with a pidfd we own, no siginfo.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0u32,
        )
    };
    if rc != 0 {
        // Its lease stays its own: settling it while it may still write
        // would let two writers at one log.
        eprintln!(
            "inkfs: cannot kill client {}: {}",
            holder.id,
            std::io::Error::last_os_error()
        );
    }
    // Its session ends (the end of file) once it is dead, and that settles
    // its leases: not before.
}

/// A pidfd of process `pid` (None if it cannot be opened).
fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags; it returns a new
    // descriptor we then own, or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0u32) };
    if fd < 0 {
        return None;
    }
    // SAFETY: a descriptor the kernel just gave us, owned by nothing else.
    Some(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard() -> Shard {
        Shard {
            map: Mutex::default(),
            changed: Condvar::new(),
            waiting: AtomicUsize::new(0),
        }
    }

    /// A waiter counted in `waiting` is woken by a change made under the
    /// lock (long before its timeout), and a change with nobody waiting
    /// finds the count 0 (so it makes no system call).
    #[test]
    fn a_change_wakes_the_counted_waiter_and_only_then_notifies() {
        let s = Arc::new(shard());
        {
            let map = lock(&s.map);
            assert_eq!(s.waiting.load(Relaxed), 0);
            s.wake_waiters(&map);
        }
        let waiter = {
            let s = s.clone();
            std::thread::spawn(move || {
                let t = Instant::now();
                let mut map = lock(&s.map);
                while !map.contains_key(&7) {
                    map = s.wait_for(map, Duration::from_secs(20));
                }
                t.elapsed()
            })
        };
        // Until the waiter counted itself (under the lock, before waiting).
        while s.waiting.load(Relaxed) == 0 {
            std::thread::yield_now();
        }
        {
            let mut map = lock(&s.map);
            map.insert(7, Entry::default());
            s.wake_waiters(&map);
        }
        let waited = waiter.join().unwrap();
        assert!(waited < Duration::from_secs(10), "not woken: {waited:?}");
        assert_eq!(s.waiting.load(Relaxed), 0);
    }

    fn holder() -> Arc<Holder> {
        let (out, _) = UnixStream::pair().unwrap();
        Arc::new(Holder {
            id: 1,
            out: Mutex::new(out),
            pidfd: None,
            books: Mutex::default(),
            dead: AtomicBool::new(false),
            lines: Mutex::new(0),
            lines_read: Condvar::new(),
            lines_waiting: AtomicUsize::new(0),
            lane: Mutex::new(None),
        })
    }

    /// A lease given back with a request is settled only once the session's
    /// reader has acted on the lines the client wrote before it (its
    /// `return`s), and a session's end stops the wait.
    #[test]
    fn a_give_waits_for_the_session_lines_written_before_it() {
        let h = holder();
        let waiter = {
            let h = h.clone();
            std::thread::spawn(move || h.wait_lines(3))
        };
        h.line_read();
        h.line_read();
        std::thread::sleep(Duration::from_millis(50));
        assert!(!waiter.is_finished(), "settled before the third line");
        h.line_read();
        assert!(waiter.join().unwrap());
        // Lines already read: no wait.
        assert!(h.wait_lines(2));
        let waiter = {
            let h = h.clone();
            std::thread::spawn(move || h.wait_lines(9))
        };
        h.dead.store(true, SeqCst);
        assert!(!waiter.join().unwrap(), "a dead session's lines never come");
        assert_eq!(h.lines_waiting.load(Relaxed), 0);
    }
}
