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
//! Threads: one [`Client`] per mount per process, attached at the first
//! call that needs it and shared by all the process's threads
//! (`inkfs::api::lanes`: each thread pins a word of the client's epoch
//! slot of its own and takes a request ring for each round trip). So a
//! process uses one of the mount's 64 slots however many threads it runs,
//! no call waits for another thread's call to end, and one client holds
//! every write lease of the process: two threads writing one file share
//! its lease instead of recalling it from each other.
//!
//! The engine's handle of each open file is opened at the file's first
//! served call and kept (by open-file index, tagged with the entry's
//! generation) until the index is reused.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{OnceLock, RwLock};

use inkfs::api::client::Client;
use inkfs::api::{Credentials, File, OpenFlags};

use crate::table::{Ofd, MAX_OFD};

/// How long a call waits for another thread's attach to end before it
/// takes the kernel path (an attach is a few round trips on a socket).
const ATTACH_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

const EMPTY: u8 = 0;
const ATTACHING: u8 = 1;
const READY: u8 = 2;
/// Attach failed: never used.
const DEAD: u8 = 3;

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
    /// EMPTY, ATTACHING (one thread attaches, the others wait), READY
    /// (`slot` is set) or DEAD.
    state: AtomicU8,
    /// The attached client: set once (READY) and never freed while the
    /// process runs (a child after fork forgets it).
    slot: AtomicPtr<Slot>,
    /// Bumped when an attach ends, and the threads waiting for it (futex).
    attached: AtomicU32,
    attach_waiters: AtomicU32,
    /// A real statx of the mount's root, for the fields a statx answer
    /// copies (mask, attributes, mount id).
    pub root_statx: OnceLock<Option<libc::statx>>,
    /// When a path call last asked the server's socket (`serving`), in
    /// CLOCK_MONOTONIC_COARSE nanoseconds.
    socket_checked: AtomicU64,
}

/// How often a path call asks the server's socket whether it is still
/// there (`Mount::serving`), at most.
const SOCKET_CHECK_EVERY_NS: u64 = 4_000_000;

/// CLOCK_MONOTONIC_COARSE in nanoseconds: read from the vDSO, no system
/// call.
fn coarse_now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes the timespec given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// The attached client and the engine handles it opened, by open-file
/// index (each tagged with the entry's generation): read-locked for a
/// call on the file, write-locked to open or replace the handle.
struct Slot {
    client: Client,
    files: Box<[FileEntry]>,
}

/// An open file's engine handle and the generation it was opened for.
type FileEntry = RwLock<Option<(u32, File)>>;

/// The mount's client, for one call.
pub struct Lease<'a> {
    slot: &'a Slot,
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

    /// Run `f` with the engine's handle for open file `idx` (kept from a
    /// served open's permission check, [`Lease::adopt_file`], or opened
    /// at first use). `None` if the engine cannot open it (the call then
    /// takes the kernel path).
    pub fn with_file<R>(
        &self,
        idx: usize,
        ofd: &Ofd,
        f: impl FnOnce(&Client, &File) -> R,
    ) -> Option<R> {
        let gen = ofd.gen.load(Ordering::Acquire);
        let entry = self.slot.files.get(idx)?;
        let client = &self.slot.client;
        {
            let held = entry.read().unwrap_or_else(|e| e.into_inner());
            if let Some((g, file)) = &*held {
                if *g == gen {
                    return Some(f(client, file));
                }
            }
        }
        self.open_file(entry, gen, ofd)?;
        let held = entry.read().unwrap_or_else(|e| e.into_inner());
        match &*held {
            Some((g, file)) if *g == gen => Some(f(client, file)),
            // Reused again meanwhile: this call's descriptor is closed.
            _ => None,
        }
    }

    /// Keep `file` as the engine's handle of open file `idx` (generation
    /// `gen`): the handle a served open just made to check the caller's
    /// permissions, opened with the access mode alone (and what only the
    /// open itself uses: O_CREAT, O_EXCL, O_TRUNC, O_CLOEXEC...), so
    /// [`Lease::with_file`] need not open the same inode again at the
    /// first read or write. The entry's previous handle is released, as
    /// `open_file` would; if another thread opened this generation's
    /// handle meanwhile, `file` is released instead.
    pub fn adopt_file(&self, idx: usize, gen: u32, file: File) {
        let client = &self.slot.client;
        let Some(entry) = self.slot.files.get(idx) else {
            client.release(file);
            return;
        };
        let mut held = entry.write().unwrap_or_else(|e| e.into_inner());
        if held.as_ref().is_some_and(|(g, _)| *g == gen) {
            drop(held);
            client.release(file);
            return;
        }
        if let Some((_, old)) = held.replace((gen, file)) {
            client.release(old);
        }
    }

    /// Open the engine's handle of open file `ofd` (generation `gen`)
    /// into `entry`, with the descriptor's access mode, releasing the
    /// handle of the entry's previous user. The kernel checked the
    /// permissions when the program opened its descriptor, so the handle
    /// is opened without checks (root's credentials); its writes drop
    /// set-id bits unless the process's effective uid is root when the
    /// handle is opened (Linux asks the writer's CAP_FSETID at each write:
    /// one system call per handle here, not per write). `None`: the engine
    /// cannot open it.
    fn open_file(&self, entry: &FileEntry, gen: u32, ofd: &Ofd) -> Option<()> {
        let client = &self.slot.client;
        let mut held = entry.write().unwrap_or_else(|e| e.into_inner());
        if held.as_ref().is_some_and(|(g, _)| *g == gen) {
            // Another thread opened it meanwhile.
            return Some(());
        }
        if let Some((_, old)) = held.take() {
            client.release(old);
        }
        let ino = ofd.ino.load(Ordering::Acquire);
        let root = Credentials::root();
        let f = if ofd.is_dir() {
            client.opendir(&root, ino)
        } else {
            // The descriptor's access mode (never O_TRUNC or O_CREAT: the
            // kernel's open did those). O_APPEND is decided per call from
            // the entry's flags, which F_SETFL may change.
            let acc = ofd.flags.load(Ordering::Relaxed) as i32 & libc::O_ACCMODE;
            client.open(&root, ino, OpenFlags::new(acc)).map(|mut f| {
                // The caller's ids now (cached: creds.rs); unknown ones
                // (never: only the umask can be) drop the bits.
                let euid = crate::creds::get(crate::creds::Ids::Effective).map(|c| c.uid);
                f.set_drops_setid(euid != Some(0));
                f
            })
        };
        *held = Some((gen, f.ok()?));
        Some(())
    }
}

impl Mount {
    /// The mount's client for one call (attached at the first), or
    /// `None`: the call takes the kernel path.
    pub fn checkout(&self) -> Option<Lease<'_>> {
        let p = self.slot.load(Ordering::Acquire);
        if !p.is_null() {
            // SAFETY: set once from a leaked Box, never freed (the child
            // of a fork forgets it without freeing it).
            return Some(Lease {
                slot: unsafe { &*p },
            });
        }
        if self.refused.load(Ordering::Relaxed) {
            return None;
        }
        self.attach_or_wait()
    }

    /// Attach, or wait for the thread attaching (up to [`ATTACH_WAIT`]).
    #[cold]
    fn attach_or_wait(&self) -> Option<Lease<'_>> {
        let end = std::time::Instant::now() + ATTACH_WAIT;
        loop {
            let seen = self.attached.load(Ordering::SeqCst);
            match self.state.compare_exchange(
                EMPTY,
                ATTACHING,
                Ordering::Acquire,
                Ordering::Acquire,
            ) {
                Ok(_) => return self.attach_now(),
                Err(READY) => {
                    let p = self.slot.load(Ordering::Acquire);
                    debug_assert!(!p.is_null(), "a ready mount has a client");
                    // SAFETY: as in `checkout`.
                    return (!p.is_null()).then(|| Lease {
                        slot: unsafe { &*p },
                    });
                }
                Err(DEAD) => return None,
                Err(_) => {}
            }
            if std::time::Instant::now() >= end {
                return None;
            }
            futex_wait(&self.attached, &self.attach_waiters, seen, end);
        }
    }

    /// Attach the client (this thread moved the state to ATTACHING).
    fn attach_now(&self) -> Option<Lease<'_>> {
        let slot = self.attach().map(Box::new);
        let lease = match slot {
            Some(slot) => {
                let p = Box::into_raw(slot);
                self.slot.store(p, Ordering::Release);
                self.state.store(READY, Ordering::Release);
                // SAFETY: as in `checkout`.
                Some(Lease {
                    slot: unsafe { &*p },
                })
            }
            None => {
                self.refused.store(true, Ordering::Relaxed);
                crate::stats::bump(&crate::stats::ATTACH_REFUSED);
                self.state.store(DEAD, Ordering::Release);
                None
            }
        };
        self.attached.fetch_add(1, Ordering::SeqCst);
        if self.attach_waiters.load(Ordering::SeqCst) != 0 {
            futex_wake(&self.attached, i32::MAX);
        }
        lease
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
        let files = (0..MAX_OFD).map(|_| RwLock::new(None)).collect();
        Some(Slot { client, files })
    }

    /// Whether the kernel lets this process into the mount at all (a FUSE
    /// mount without allow_other admits only its owner): paths are not
    /// resolved here for anyone else.
    pub fn admits_caller(&self) -> bool {
        self.allow_other
            || self.owner.is_some_and(|o| {
                crate::creds::get(crate::creds::Ids::Effective).is_some_and(|c| c.uid == o)
            })
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

    /// Whether the mount's server still serves this process, for a path
    /// call (stat, access, readlink): the session's closed flag, which
    /// its reader sets at the socket's end of file (no system call), and
    /// the socket itself at most every `SOCKET_CHECK_EVERY_NS` (a
    /// process stopped while its server died sees it at its first call
    /// after, whether or not its reader ran first). A dead server makes
    /// the mount kernel-only (docs/KERNEL-FREE.md, "Built: relative
    /// paths from the current directory's inode", says what a call in
    /// the window in between answers).
    pub fn serving(&self, lease: &Lease<'_>) -> bool {
        if lease.client().session_closed() {
            self.refused.store(true, Ordering::Relaxed);
            return false;
        }
        let now = coarse_now_ns();
        let last = self.socket_checked.load(Ordering::Relaxed);
        if now.wrapping_sub(last) < SOCKET_CHECK_EVERY_NS {
            return true;
        }
        self.socket_checked.store(now, Ordering::Relaxed);
        self.alive(lease)
    }

    /// After fork, in the child: the parent's client is the parent's (its
    /// slot, its session). Forget it without running its destructor (its
    /// mappings and descriptors are copies; exec or exit closes them) and
    /// attach anew at the next call. An attach the parent had in progress
    /// on another thread never ends in the child: it starts over too.
    fn forget_clients(&self) {
        // The child has one thread: nobody else uses the mount. The Slot
        // is leaked on purpose.
        self.slot.store(std::ptr::null_mut(), Ordering::Release);
        if self.state.load(Ordering::Relaxed) != DEAD {
            self.state.store(EMPTY, Ordering::Release);
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

/// At the process's exit (lib.rs): each attached client gives its
/// directory leases and its lane back (`Client::give_back_dirs`), so the
/// next process to touch those directories finds them settled rather
/// than held by a session the server has yet to reap. A process that
/// ends without exit handlers (`_exit`, a signal, exec) leaves them to
/// the reaping at its session's end, as before.
pub fn at_exit() {
    for m in known() {
        if m.state.load(Ordering::Acquire) != READY {
            continue;
        }
        let p = m.slot.load(Ordering::Acquire);
        if p.is_null() {
            continue;
        }
        // SAFETY: a READY mount's slot is never freed while the process
        // runs (`Mount::slot`).
        unsafe { &*p }.client.give_back_dirs();
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
            state: AtomicU8::new(EMPTY),
            slot: AtomicPtr::new(std::ptr::null_mut()),
            attached: AtomicU32::new(0),
            attach_waiters: AtomicU32::new(0),
            root_statx: OnceLock::new(),
            socket_checked: AtomicU64::new(0),
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
