//! The descriptor table: which of the process's descriptors the library
//! serves, and their open-file state.
//!
//! Two levels, as in the kernel. `FDS` maps a descriptor number to an
//! entry of the open-file table; it is private memory (a static), so a
//! forked child gets its own copy, as it gets its own descriptor table. The
//! open-file table itself ([`Ofd`], the library's "open file description":
//! inode, offset, status flags) is a shared anonymous mapping made at the
//! first served open, so after fork parent and child read and move one
//! offset, as the kernel shares one file position; dup'ed descriptors
//! point at the same entry. Both are fixed-size and preallocated: the read
//! path does one atomic load here, no lock, no allocation.
//!
//! Descriptors at or above [`MAX_FD`], and opens past [`MAX_OFD`] open
//! files, are simply not served (the kernel descriptor works as ever).

use std::cell::Cell;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

/// Descriptors below this number can be served.
pub const MAX_FD: usize = 4096;
/// Open files (descriptions) served at once, across a process tree.
pub const MAX_OFD: usize = 4096;

/// `Ofd::state`: unused.
pub const FREE: u32 = 0;
/// Being filled by the thread that took it.
const CLAIMED: u32 = 1;
/// Served: the library's offset is the file position.
pub const LOCAL: u32 = 2;
/// Handed to the kernel (the descriptor went through an exec): every call
/// goes to the kernel descriptor, whose offset is the file position.
pub const KERNEL: u32 = 3;

/// One open file description, in the shared mapping.
#[repr(C)]
pub struct Ofd {
    pub state: AtomicU32,
    /// Descriptors (in any process) that point here.
    pub refs: AtomicU32,
    /// Bumped at each reuse: a cached engine handle for an older use of
    /// this entry is stale.
    pub gen: AtomicU32,
    /// Index in the process's mount table (identical in a forked child).
    pub mount: AtomicU32,
    /// Status flags (O_ACCMODE, O_APPEND...), as F_GETFL shows them.
    pub flags: AtomicU32,
    /// S_IFREG or S_IFDIR.
    pub kind: AtomicU32,
    pub ino: AtomicU64,
    /// The file position; for a directory, the readdir cookie.
    pub offset: AtomicU64,
    /// 0: a kernel file is behind every descriptor of it; 1: placeholders
    /// (lazy.rs); 2: being materialized.
    pub lazy: AtomicU32,
}

const _: () = assert!(std::mem::size_of::<Ofd>() == 48);

impl Ofd {
    pub fn is_local(&self) -> bool {
        self.state.load(Ordering::Acquire) == LOCAL
    }
    pub fn is_dir(&self) -> bool {
        self.kind.load(Ordering::Relaxed) == libc::S_IFDIR
    }
    pub fn readable(&self) -> bool {
        self.flags.load(Ordering::Relaxed) as i32 & libc::O_ACCMODE != libc::O_WRONLY
    }
    pub fn writable(&self) -> bool {
        self.flags.load(Ordering::Relaxed) as i32 & libc::O_ACCMODE != libc::O_RDONLY
    }
    pub fn append(&self) -> bool {
        self.flags.load(Ordering::Relaxed) as i32 & libc::O_APPEND != 0
    }
    /// An O_PATH descriptor: only fstat is served (and it may be the
    /// directory of a path); everything else is the kernel's EBADF.
    pub fn is_path(&self) -> bool {
        self.flags.load(Ordering::Relaxed) as i32 & libc::O_PATH != 0
    }
}

thread_local! {
    /// The entry this thread registered last: where its next scan for a
    /// free entry starts (a hint only; any free entry is right).
    static LAST: Cell<usize> = const { Cell::new(0) };
}

/// Descriptor number -> 1 + index of its [`Ofd`] (0: not served).
static FDS: [AtomicU32; MAX_FD] = [const { AtomicU32::new(0) }; MAX_FD];
/// The shared open-file table (null until the first served open).
static OFDS: AtomicPtr<Ofd> = AtomicPtr::new(std::ptr::null_mut());

fn ofds() -> Option<&'static [Ofd]> {
    let p = OFDS.load(Ordering::Acquire);
    if p.is_null() {
        return None;
    }
    // SAFETY: a mapping of MAX_OFD entries, never unmapped; all-zero bytes
    // are a valid (FREE) Ofd.
    Some(unsafe { std::slice::from_raw_parts(p, MAX_OFD) })
}

/// The shared table, mapped at the first call.
fn ofds_or_map() -> Option<&'static [Ofd]> {
    if let Some(t) = ofds() {
        return Some(t);
    }
    let len = MAX_OFD * std::mem::size_of::<Ofd>();
    // SAFETY: a fresh anonymous mapping; no memory of ours is involved.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    if OFDS
        .compare_exchange(
            std::ptr::null_mut(),
            p.cast(),
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_err()
    {
        // Another thread mapped it first.
        // SAFETY: our own mapping, never published.
        unsafe { libc::munmap(p, len) };
    }
    ofds()
}

/// The served open file behind `fd`, if any.
#[inline]
pub fn get(fd: i32) -> Option<(usize, &'static Ofd)> {
    let i = FDS.get(usize::try_from(fd).ok()?)?.load(Ordering::Acquire);
    if i == 0 {
        return None;
    }
    let idx = i as usize - 1;
    Some((idx, &ofds()?[idx]))
}

/// The served open file behind `fd` if the library serves it now (not
/// handed to the kernel).
#[inline]
pub fn local(fd: i32) -> Option<(usize, &'static Ofd)> {
    get(fd).filter(|(_, o)| o.is_local())
}

/// A new open file for `fd`: inode `ino` of mount `mount`, `kind` S_IFREG
/// or S_IFDIR, status flags `flags`, offset 0, `lazy` if `fd` is a
/// placeholder (lazy.rs). Its index and generation (`Ofd::gen` for this
/// use of the entry), or `None` if the table is full or `fd` out of range
/// (the descriptor is then not served).
pub fn register(
    fd: i32,
    mount: usize,
    ino: u64,
    kind: u32,
    flags: i32,
    lazy: bool,
) -> Option<(usize, u32)> {
    if is_std(fd) {
        return None;
    }
    let slot = usize::try_from(fd).ok().and_then(|f| FDS.get(f))?;
    let table = ofds_or_map()?;
    // From the entry this thread took last (usually freed again by its
    // close: its lines are in this core's cache), reading each state
    // before claiming it: a scan from entry 0 with a compare-exchange on
    // every entry was a locked write to each line the other threads' open
    // files live in (8 % of a 100-thread webserver's samples).
    let start = LAST.with(Cell::get);
    for idx in (start..MAX_OFD).chain(0..start) {
        let o = &table[idx];
        if o.state.load(Ordering::Relaxed) != FREE
            || o.state
                .compare_exchange(FREE, CLAIMED, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            continue;
        }
        LAST.with(|l| l.set(idx));
        let gen = o.gen.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
        o.refs.store(1, Ordering::Relaxed);
        o.mount.store(mount as u32, Ordering::Relaxed);
        o.flags.store(flags as u32, Ordering::Relaxed);
        o.kind.store(kind, Ordering::Relaxed);
        o.ino.store(ino, Ordering::Relaxed);
        o.offset.store(0, Ordering::Relaxed);
        o.lazy.store(lazy as u32, Ordering::Relaxed);
        o.state.store(LOCAL, Ordering::Release);
        // A stale number of a descriptor closed behind our back would be
        // overwritten here: drop its reference first.
        release_index(slot.swap(idx as u32 + 1, Ordering::AcqRel));
        return Some((idx, gen));
    }
    None
}

/// `fd` is closed (or about to be reused): forget it.
pub fn release(fd: i32) {
    if let Some(slot) = usize::try_from(fd).ok().and_then(|f| FDS.get(f)) {
        let i = slot.swap(0, Ordering::SeqCst);
        release_index(i);
        // The caller closes `fd` next. A materialization of its entry in
        // progress on another thread (a change of directory, fork, exec:
        // lazy.rs) may have read `fd` in this table before the swap and
        // dup3 its file onto it: let it finish first, so that the close
        // closes that file rather than the dup3 bringing a closed number
        // back. SeqCst with the materialization's claim (lazy 1 -> 2) and
        // its read of this table: either this load sees the claim, or
        // that read sees the slot empty.
        if let Some(o) = i.checked_sub(1).and_then(|idx| ofds()?.get(idx as usize)) {
            // Bounded as `lazy::materialize`'s own wait (a signal
            // handler's close inside a materialization of this thread).
            let t = std::time::Instant::now();
            while o.lazy.load(Ordering::SeqCst) == 2
                && t.elapsed() < std::time::Duration::from_secs(1)
            {
                std::thread::yield_now();
            }
        }
    }
}

fn release_index(i: u32) {
    if i == 0 {
        return;
    }
    let Some(table) = ofds() else { return };
    let o = &table[i as usize - 1];
    if o.refs.fetch_sub(1, Ordering::AcqRel) == 1 {
        // Its hold and path (placeholders, directories) go with it.
        crate::lazy::forget(i as usize - 1);
        o.state.store(FREE, Ordering::Release);
    }
}

/// `new` is a duplicate of `old` (dup, dup2, F_DUPFD): it shares `old`'s
/// open file, if served. Whatever `new` was is forgotten.
pub fn dup(old: i32, new: i32) {
    if old == new {
        return;
    }
    let Some(slot) = usize::try_from(new).ok().and_then(|f| FDS.get(f)) else {
        return;
    };
    let target = match get(old) {
        Some((idx, o)) => {
            o.refs.fetch_add(1, Ordering::AcqRel);
            idx as u32 + 1
        }
        None => 0,
    };
    release_index(slot.swap(target, Ordering::AcqRel));
    if target != 0 && is_std(new) {
        hand_to_kernel(new);
    }
}

/// Descriptors 0, 1 and 2: glibc's stdin, stdout and stderr FILEs read
/// and write them with its internal read and write, which the library
/// never sees (the kernel's offset moves, the library's does not). So an
/// open that returns one of them is not served, and a served open file
/// dup'ed onto one (a shell's `>`, `<&3`) is handed to the kernel for good,
/// as at exec: one offset, the kernel's, for every descriptor sharing it.
fn is_std(fd: i32) -> bool {
    (0..=2).contains(&fd)
}

/// Hand `fd`'s open file to the kernel: the kernel descriptor takes the
/// library's offset, then every call on the open file (in any process
/// sharing it) goes to the kernel.
pub fn hand_to_kernel(fd: i32) {
    let Some((_, o)) = local(fd) else { return };
    let off = o.offset.load(Ordering::Acquire);
    // SAFETY: no memory involved.
    unsafe { crate::real::lseek64(crate::lazy::kernel(fd), off as i64, libc::SEEK_SET) };
    o.state.store(KERNEL, Ordering::Release);
}

/// Every served descriptor: `(fd, index, open file)`.
pub fn each(mut f: impl FnMut(i32, usize, &'static Ofd)) {
    let Some(table) = ofds() else { return };
    for (fd, slot) in FDS.iter().enumerate() {
        // SeqCst: `release`'s wait for a materialization depends on it.
        let i = slot.load(Ordering::SeqCst);
        if i != 0 {
            f(fd as i32, i as usize - 1, &table[i as usize - 1]);
        }
    }
}

/// Before fork: the child's copy of the descriptor table will hold one
/// more reference to each open file.
pub fn fork_refs(delta: i32) {
    each(|_, _, o| {
        if delta > 0 {
            o.refs.fetch_add(1, Ordering::AcqRel);
        } else {
            o.refs.fetch_sub(1, Ordering::AcqRel);
        }
    });
}
