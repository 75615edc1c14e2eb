//! The FUSE mounts this process may serve, and the clients attached to
//! them.
//!
//! The mount table is read from /proc/self/mountinfo once, when the
//! library is loaded (lib.rs says why not later).
//! Each FUSE mount is a candidate: whether it is an inkfs mount that lets
//! this process in is the attach's answer, asked at the first call that
//! would be served on it. A refused or failed attach marks the mount
//! "kernel only" for the life of the process.
//!
//! Threads: a [`Client`] pins one epoch slot and is one thread's. Each
//! mount has [`CLIENTS`] cells, attached lazily; a call checks one out with
//! a compare-and-swap (idle -> busy) and gives it back when done. A call
//! that finds every cell busy and none left to attach takes the kernel
//! path. So a process uses one slot of the mount's 64 per thread that
//! actually runs a served call concurrently, at most [`CLIENTS`].
//!
//! Writes: a write lease is a client's (its session's), so two cells of
//! one process writing one inode would recall the lease from each other
//! at every write. Every write, truncate and fsync of inode `ino` in this
//! process therefore goes through cell `ino % CLIENTS`
//! ([`Mount::checkout_writer`]), waiting for it if another thread has it
//! checked out; reads take any idle cell (they need no lease).

use std::cell::UnsafeCell;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::OnceLock;

use inkfs::api::client::Client;
use inkfs::api::{Credentials, File, OpenFlags};

use crate::table::{Ofd, MAX_OFD};

/// Clients per mount per process (each one of the mount's 64 slots):
/// eight, so that threads of one process rarely wait for a cell (a
/// placeholder's calls and namespace requests hold one for the whole call).
pub const CLIENTS: usize = 8;
/// How long a write waits for its inode's client cell before it goes
/// through the kernel instead.
const WRITER_WAIT: std::time::Duration = std::time::Duration::from_millis(50);
/// How long a call on a placeholder waits for a client: the kernel path
/// would materialize it.
const LAZY_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

const EMPTY: u8 = 0;
const ATTACHING: u8 = 1;
const IDLE: u8 = 2;
const BUSY: u8 = 3;
/// Attach failed, or its process forked away from it: never used.
const DEAD: u8 = 4;

/// One FUSE mount of the process.
pub struct Mount {
    /// The mount point, as mountinfo names it (canonical).
    pub path: Vec<u8>,
    /// Its st_dev.
    pub dev: u64,
    owner: Option<u32>,
    /// mountinfo's mount id (statx's stx_mnt_id).
    pub mnt_id: u64,
    pub noexec: bool,
    /// Without allow_other the kernel lets only the mount's owner in.
    allow_other: bool,
    /// Another mount lies under this one: paths are not resolved here
    /// (descriptors still are).
    pub has_submounts: bool,
    /// Attach refused or the server gone: everything to the kernel.
    refused: AtomicBool,
    cells: [Cell; CLIENTS],
    /// A real statx of the mount's root, for the fields a statx answer
    /// copies (mask, attributes, mount id).
    pub root_statx: OnceLock<Option<libc::statx>>,
    /// Bumped at every cell's release, and the threads waiting for any
    /// cell (futex, as [`Cell::freed`]).
    any_freed: AtomicU32,
    any_waiters: AtomicU32,
    /// Inodes whose writer is not cell `ino % CLIENTS`: a file created
    /// through a cell holds its lease there (lazy.rs). `ino << 8 | cell`,
    /// direct-mapped by inode number; a displaced entry costs one lease
    /// moving between this process's cells.
    writers: [AtomicU64; WRITERS],
}

/// Entries of [`Mount::writers`].
const WRITERS: usize = 1024;

struct Cell {
    state: AtomicU8,
    slot: UnsafeCell<Option<Box<Slot>>>,
    /// Bumped each time the cell goes back to idle (a futex word threads
    /// waiting for this cell sleep on), and how many wait.
    freed: AtomicU32,
    waiters: AtomicU32,
}

/// An attached client and the engine handles it opened, by open-file
/// index (each tagged with the entry's generation).
struct Slot {
    client: Client,
    files: Vec<Option<(u32, File)>>,
}

// SAFETY: a cell's slot is only touched by the thread that moved its state
// to ATTACHING or BUSY (a compare-and-swap), until it stores IDLE again.
unsafe impl Sync for Cell {}

/// A checked-out client: given back when dropped.
pub struct Lease<'a> {
    mount: &'a Mount,
    cell: &'a Cell,
    slot: &'a mut Slot,
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        self.cell.state.store(IDLE, Ordering::Release);
        // Threads waiting for this cell, or for any: one of them takes it
        // (waking them all for one cell: few wait for a given cell).
        self.cell.freed.fetch_add(1, Ordering::SeqCst);
        if self.cell.waiters.load(Ordering::SeqCst) != 0 {
            futex_wake(&self.cell.freed, i32::MAX);
        }
        let m = self.mount;
        m.any_freed.fetch_add(1, Ordering::SeqCst);
        if m.any_waiters.load(Ordering::SeqCst) != 0 {
            futex_wake(&m.any_freed, 1);
        }
    }
}

/// Wake up to `n` threads sleeping on `word` (this process's).
fn futex_wake(word: &AtomicU32, n: i32) {
    // SAFETY: a futex wake on a word of ours; no memory is written.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            n,
        );
    }
}

/// Sleep while `word` holds `seen`, at most until `deadline`, counted in
/// `waiters` meanwhile (the waker looks at it after changing the word).
fn futex_wait(word: &AtomicU32, waiters: &AtomicU32, seen: u32, deadline: std::time::Instant) {
    let left = deadline.saturating_duration_since(std::time::Instant::now());
    if left.is_zero() {
        return;
    }
    waiters.fetch_add(1, Ordering::SeqCst);
    if word.load(Ordering::SeqCst) == seen {
        let ts = libc::timespec {
            tv_sec: left.as_secs() as libc::time_t,
            tv_nsec: left.subsec_nanos() as libc::c_long,
        };
        // SAFETY: a futex wait on a word of ours with a timeout we own.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                seen,
                &ts as *const libc::timespec,
            );
        }
    }
    waiters.fetch_sub(1, Ordering::SeqCst);
}

impl Lease<'_> {
    pub fn client(&self) -> &Client {
        &self.slot.client
    }

    /// Run `f` with the engine's handle for open file `idx` (opened at
    /// first use). `None` if the engine cannot open it (the call then
    /// takes the kernel path).
    pub fn with_file<R>(
        &mut self,
        idx: usize,
        ofd: &Ofd,
        f: impl FnOnce(&Client, &File) -> R,
    ) -> Option<R> {
        self.file(idx, ofd)?;
        let (_, file) = self.slot.files.get(idx)?.as_ref()?;
        Some(f(&self.slot.client, file))
    }

    /// The engine's handle for open file `idx` (opened at first use), with
    /// the descriptor's access mode. The kernel checked the permissions
    /// when the program opened its descriptor, so the handle is opened
    /// without checks (root's credentials); its writes drop set-id bits
    /// unless the process's effective uid is root when the handle is
    /// opened (Linux asks the writer's CAP_FSETID at each write: one
    /// system call per handle here, not per write).
    fn file(&mut self, idx: usize, ofd: &Ofd) -> Option<&File> {
        let gen = ofd.gen.load(Ordering::Acquire);
        let entry = self.slot.files.get_mut(idx)?;
        if entry.as_ref().is_some_and(|(g, _)| *g != gen) {
            if let Some((_, old)) = entry.take() {
                self.slot.client.release(old);
            }
        }
        if entry.is_none() {
            let ino = ofd.ino.load(Ordering::Acquire);
            let root = Credentials::root();
            let f = if ofd.is_dir() {
                self.slot.client.opendir(&root, ino)
            } else {
                // The descriptor's access mode (never O_TRUNC or O_CREAT:
                // the kernel's open did those). O_APPEND is decided per
                // call from the entry's flags, which F_SETFL may change.
                let acc = ofd.flags.load(Ordering::Relaxed) as i32 & libc::O_ACCMODE;
                self.slot
                    .client
                    .open(&root, ino, OpenFlags::new(acc))
                    .map(|mut f| {
                        // SAFETY: geteuid cannot fail.
                        f.set_drops_setid(unsafe { libc::geteuid() } != 0);
                        f
                    })
            };
            *entry = Some((gen, f.ok()?));
        }
        entry.as_ref().map(|(_, f)| f)
    }
}

impl Mount {
    /// A client of this mount for one call, or `None`: the call takes the
    /// kernel path.
    pub fn checkout(&self) -> Option<Lease<'_>> {
        if self.refused.load(Ordering::Relaxed) {
            return None;
        }
        for cell in &self.cells {
            if cell
                .state
                .compare_exchange(IDLE, BUSY, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return Some(lease(self, cell));
            }
        }
        for (i, cell) in self.cells.iter().enumerate() {
            if cell
                .state
                .compare_exchange(EMPTY, ATTACHING, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            return self.attach_cell(i, cell);
        }
        None
    }

    /// The client that writes inode `ino` in this process: always the
    /// same cell (`ino % CLIENTS`), so one client of the process holds an
    /// inode's write lease and two threads writing one file never recall
    /// it from each other. Waits while the cell is busy (a read or a write
    /// of another thread: short), up to [`WRITER_WAIT`]; `None` after
    /// that, or if the cell cannot attach: the write then goes through
    /// the kernel descriptor (correct, only slower: the server recalls the
    /// lease).
    pub fn checkout_writer(&self, ino: u64) -> Option<Lease<'_>> {
        self.checkout_writer_within(ino, WRITER_WAIT)
    }

    /// A client for a call on open file `ofd`: a placeholder's waits for
    /// one (up to [`LAZY_WAIT`]), as the kernel path would materialize it
    /// (two round trips through the kernel and a real open file from then
    /// on); any other's takes the kernel path at once if none is idle.
    pub fn checkout_for(&self, ofd: &Ofd) -> Option<Lease<'_>> {
        if ofd.lazy.load(Ordering::Relaxed) == 0 {
            return self.checkout();
        }
        self.checkout_within(LAZY_WAIT)
    }

    /// [`Mount::checkout_writer`] for open file `ofd` (a placeholder's
    /// waits up to [`LAZY_WAIT`]).
    pub fn checkout_writer_for(&self, ofd: &Ofd) -> Option<Lease<'_>> {
        let ino = ofd.ino.load(Ordering::Relaxed);
        if ofd.lazy.load(Ordering::Relaxed) == 0 {
            return self.checkout_writer(ino);
        }
        self.checkout_writer_within(ino, LAZY_WAIT)
    }

    fn checkout_writer_within(&self, ino: u64, wait: std::time::Duration) -> Option<Lease<'_>> {
        if self.refused.load(Ordering::Relaxed) {
            return None;
        }
        let i = self.writer_of(ino);
        let cell = &self.cells[i];
        let mut deadline: Option<std::time::Instant> = None;
        loop {
            let seen = cell.freed.load(Ordering::SeqCst);
            match cell
                .state
                .compare_exchange(IDLE, BUSY, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => return Some(lease(self, cell)),
                Err(EMPTY) => {
                    if cell
                        .state
                        .compare_exchange(EMPTY, ATTACHING, Ordering::Acquire, Ordering::Relaxed)
                        .is_ok()
                    {
                        return self.attach_cell(i, cell);
                    }
                }
                Err(DEAD) => return None,
                Err(_) => {}
            }
            let end = *deadline.get_or_insert_with(|| std::time::Instant::now() + wait);
            if std::time::Instant::now() >= end {
                return None;
            }
            // Asleep until the cell is given back (not spinning: on a
            // small machine the holder needs the core).
            futex_wait(&cell.freed, &cell.waiters, seen, end);
        }
    }

    /// The cell that writes inode `ino` in this process.
    fn writer_of(&self, ino: u64) -> usize {
        let w = self.writers[(ino as usize) % WRITERS].load(Ordering::Relaxed);
        if w != 0 && w >> 8 == ino {
            (w & 0xff) as usize % CLIENTS
        } else {
            (ino % CLIENTS as u64) as usize
        }
    }

    /// Inode `ino`'s lease is `lease`'s cell's (granted with its create):
    /// that cell writes it from now on.
    pub fn note_writer(&self, ino: u64, lease: &Lease<'_>) {
        let Some(i) = self.cells.iter().position(|c| std::ptr::eq(c, lease.cell)) else {
            return;
        };
        if ino >> 56 == 0 {
            self.writers[(ino as usize) % WRITERS].store(ino << 8 | i as u64, Ordering::Relaxed);
        }
    }

    /// Any client, waiting up to [`LAZY_WAIT`] for one to be idle: for
    /// what the kernel would do at a higher price (an open without the
    /// kernel, a namespace request: through the kernel each is a FUSE
    /// round trip or more, and a kernel-opened file's calls take the
    /// kernel path whenever no cell is idle).
    pub fn checkout_lazy(&self) -> Option<Lease<'_>> {
        self.checkout_within(LAZY_WAIT)
    }

    /// Any client, waiting up to [`WRITER_WAIT`] for one to be idle (a
    /// close letting a hold go).
    pub fn checkout_wait(&self) -> Option<Lease<'_>> {
        self.checkout_within(WRITER_WAIT)
    }

    fn checkout_within(&self, wait: std::time::Duration) -> Option<Lease<'_>> {
        let end = std::time::Instant::now() + wait;
        loop {
            let seen = self.any_freed.load(Ordering::SeqCst);
            if let Some(l) = self.checkout() {
                return Some(l);
            }
            if self.refused.load(Ordering::Relaxed) || std::time::Instant::now() >= end {
                return None;
            }
            futex_wait(&self.any_freed, &self.any_waiters, seen, end);
        }
    }

    /// Attach the client of `cell` (number `i`), which this thread moved
    /// to ATTACHING.
    fn attach_cell<'a>(&'a self, i: usize, cell: &'a Cell) -> Option<Lease<'a>> {
        match self.attach() {
            Some(slot) => {
                // SAFETY: this thread owns the cell (ATTACHING).
                unsafe { *cell.slot.get() = Some(Box::new(slot)) };
                cell.state.store(BUSY, Ordering::Release);
                Some(lease(self, cell))
            }
            None => {
                cell.state.store(DEAD, Ordering::Release);
                // The first refusal is the mount's answer; later ones
                // (64 slots taken) only cost this cell.
                if i == 0 {
                    self.refused.store(true, Ordering::Relaxed);
                    crate::stats::bump(&crate::stats::ATTACH_REFUSED);
                }
                None
            }
        }
    }

    fn attach(&self) -> Option<Slot> {
        use std::os::unix::ffi::OsStrExt;
        let path = Path::new(std::ffi::OsStr::from_bytes(&self.path));
        // The client starts threads of its own (the session's reader, the
        // recall answerer). They must never run the program's signal
        // handlers: a process-directed signal (SIGALRM of a timer, SIGCHLD)
        // would otherwise run its handler on them, concurrently with one
        // on the program's own thread, which a single-threaded program
        // never expects. Threads inherit the creating thread's mask, so
        // every signal is blocked while they start, and the mask restored.
        let client = {
            let _mask = BlockSignals::new();
            Client::attach_mountpoint(path, self.owner).ok()?
        };
        let mut files = Vec::new();
        files.resize_with(MAX_OFD, || None);
        Some(Slot { client, files })
    }

    /// Whether the kernel lets this process into the mount at all (a FUSE
    /// mount without allow_other admits only its owner): paths are not
    /// resolved here for anyone else.
    pub fn admits_caller(&self) -> bool {
        // SAFETY: geteuid cannot fail.
        self.allow_other || self.owner == Some(unsafe { libc::geteuid() })
    }

    /// Whether an attach was refused (or the server left): nothing on
    /// this mount is served.
    pub fn is_refused(&self) -> bool {
        self.refused.load(Ordering::Relaxed)
    }

    /// Whether the mount's server still serves this process: checked on
    /// path calls (a mount point whose server left shows the directory
    /// under it). A dead server makes the mount kernel-only.
    pub fn alive(&self, lease: &Lease<'_>) -> bool {
        if lease.client().server_alive() {
            return true;
        }
        self.refused.store(true, Ordering::Relaxed);
        false
    }

    /// After fork, in the child: the parent's clients are the parent's
    /// (its slots, its sessions). Forget them without running their
    /// destructors (their mappings and descriptors are copies; exec or exit
    /// closes them) and attach anew at the next call.
    fn forget_clients(&self) {
        for cell in &self.cells {
            // SAFETY: the child has one thread; nobody else uses the cell.
            if let Some(slot) = unsafe { (*cell.slot.get()).take() } {
                std::mem::forget(slot);
            }
            cell.state.store(EMPTY, Ordering::Release);
        }
    }
}

/// Every signal blocked in this thread until dropped (the previous mask
/// restored).
struct BlockSignals(libc::sigset_t);

impl BlockSignals {
    fn new() -> BlockSignals {
        // SAFETY: sigset_t is plain data; sigfillset and pthread_sigmask
        // only write the sets given.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
            BlockSignals(old)
        }
    }
}

impl Drop for BlockSignals {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved in `new`.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut()) };
    }
}

fn lease<'a>(mount: &'a Mount, cell: &'a Cell) -> Lease<'a> {
    // SAFETY: the caller moved the cell to BUSY, so this thread owns the
    // slot until the lease is dropped; a BUSY cell always has a slot.
    let slot = unsafe { (*cell.slot.get()).as_deref_mut() };
    Lease {
        mount,
        cell,
        slot: slot.expect("a busy cell has a client"),
    }
}

static MOUNTS: OnceLock<Vec<Mount>> = OnceLock::new();

/// The process's FUSE mounts (read at the first call).
pub fn all() -> &'static [Mount] {
    MOUNTS.get_or_init(read_mounts)
}

/// The mounts, if already read (fd calls never read them).
pub fn known() -> &'static [Mount] {
    MOUNTS.get().map(|v| v.as_slice()).unwrap_or(&[])
}

pub fn by_index(i: usize) -> Option<&'static Mount> {
    all().get(i)
}

/// The index of mount `m` in the table.
pub fn index_of(m: &Mount) -> Option<(usize, &'static Mount)> {
    all().iter().enumerate().find(|(_, x)| std::ptr::eq(*x, m))
}

pub fn by_dev(dev: u64) -> Option<(usize, &'static Mount)> {
    all().iter().enumerate().find(|(_, m)| m.dev == dev)
}

/// In the child after fork.
pub fn after_fork() {
    for m in known() {
        m.forget_clients();
    }
}

fn read_mounts() -> Vec<Mount> {
    let Ok(info) = std::fs::read("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let lines: Vec<Line> = info.split(|&b| b == b'\n').filter_map(parse).collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        if !l.fstype.starts_with(b"fuse.") {
            continue;
        }
        // Mounted over later: not what the path shows.
        if lines[i + 1..].iter().any(|o| o.target == l.target) {
            continue;
        }
        let has_submounts = lines.iter().any(|o| is_under(&o.target, &l.target));
        out.push(Mount {
            path: l.target.clone(),
            dev: libc::makedev(l.major, l.minor),
            owner: l.owner,
            mnt_id: l.id,
            noexec: l.noexec,
            allow_other: l.allow_other,
            has_submounts,
            refused: AtomicBool::new(false),
            cells: [const {
                Cell {
                    state: AtomicU8::new(EMPTY),
                    slot: UnsafeCell::new(None),
                    freed: AtomicU32::new(0),
                    waiters: AtomicU32::new(0),
                }
            }; CLIENTS],
            any_freed: AtomicU32::new(0),
            any_waiters: AtomicU32::new(0),
            root_statx: OnceLock::new(),
            writers: [const { AtomicU64::new(0) }; WRITERS],
        });
    }
    out
}

/// Whether `p` is strictly below the mount point `m`.
fn is_under(p: &[u8], m: &[u8]) -> bool {
    p.len() > m.len() && p.starts_with(m) && (m == b"/" || p[m.len()] == b'/')
}

struct Line {
    id: u64,
    major: u32,
    minor: u32,
    target: Vec<u8>,
    noexec: bool,
    fstype: Vec<u8>,
    owner: Option<u32>,
    allow_other: bool,
}

/// One mountinfo line: `id parent major:minor root target opts ... -
/// fstype source superopts`.
fn parse(line: &[u8]) -> Option<Line> {
    let text = std::str::from_utf8(line).ok()?;
    let (left, right) = text.split_once(" - ")?;
    let mut l = left.split(' ');
    let id = l.next()?.parse().ok()?;
    let _parent = l.next()?;
    let (major, minor) = l.next()?.split_once(':')?;
    let _root = l.next()?;
    let target = unescape(l.next()?);
    let opts = l.next()?;
    let mut r = right.split(' ');
    let fstype = r.next()?.as_bytes().to_vec();
    let _source = r.next();
    let superopts = r.next().unwrap_or("");
    let owner = superopts
        .split(',')
        .find_map(|o| o.strip_prefix("user_id="))
        .and_then(|u| u.parse().ok());
    let allow_other = superopts.split(',').any(|o| o == "allow_other");
    Some(Line {
        id,
        major: major.parse().ok()?,
        minor: minor.parse().ok()?,
        target,
        noexec: opts.split(',').any(|o| o == "noexec"),
        fstype,
        owner,
        allow_other,
    })
}

/// mountinfo writes blanks, tabs, newlines and backslashes as \ooo.
fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() {
            let oct = &b[i + 1..i + 4];
            if oct.iter().all(|c| (b'0'..=b'7').contains(c)) {
                out.push((oct[0] - b'0') * 64 + (oct[1] - b'0') * 8 + (oct[2] - b'0'));
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

/// The mount a path names and the path inside it: `path` absolute, or
/// relative to the current directory. `None`: not under a served mount.
pub fn locate_abs(path: &[u8]) -> Option<(usize, &'static Mount, &[u8])> {
    all()
        .iter()
        .enumerate()
        .filter(|(_, m)| !m.has_submounts)
        .find_map(|(i, m)| {
            let rest = path.strip_prefix(m.path.as_slice())?;
            if rest.is_empty() || rest[0] == b'/' || m.path == b"/" {
                Some((i, m, rest))
            } else {
                None
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_line() {
        let l = b"36 35 0:31 / /mnt/a\\040b rw,nosuid,noexec - fuse.inkfs /dev/shm/p rw,user_id=1000,group_id=1000";
        let m = parse(l).expect("parsed");
        assert_eq!(m.id, 36);
        assert_eq!((m.major, m.minor), (0, 31));
        assert_eq!(m.target, b"/mnt/a b");
        assert!(m.noexec);
        assert_eq!(m.fstype, b"fuse.inkfs");
        assert_eq!(m.owner, Some(1000));
        assert!(!m.allow_other);
        assert!(parse(b"garbage").is_none());
    }

    #[test]
    fn under() {
        assert!(is_under(b"/a/b", b"/a"));
        assert!(!is_under(b"/ab", b"/a"));
        assert!(!is_under(b"/a", b"/a"));
        assert!(is_under(b"/x", b"/"));
    }
}
