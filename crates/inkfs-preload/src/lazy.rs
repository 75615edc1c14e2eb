//! Opens without the kernel: placeholder descriptors (docs/KERNEL-FREE.md,
//! "Opens without the kernel: placeholder descriptors").
//!
//! A regular file opened on a served mount (created through the server's
//! ring, or found in the pool and checked with the caller's credentials by
//! the engine's open rules) gets a placeholder: a duplicate of an O_PATH
//! descriptor of /dev/null (the number open(2) would give, no FUSE
//! request), registered as a served open file with no kernel file behind
//! it. Every call the library serves works on it as on any served
//! descriptor; a call the library does not intercept fails with EBADF (the
//! kernel refuses an O_PATH descriptor) instead of touching another file;
//! a call that needs the real file **materializes** it first
//! ([`kernel`]): the library opens the file on the mount by the path it
//! was opened with (checked to be the same inode), and dup3s it onto every
//! number of the open file in this process.
//!
//! The inode is **held** (its number in this client's slot of the shared
//! table) from before the placeholder is handed out until the open file's
//! last close, so the server never frees it while it is open, even once
//! its last name is gone (holds.rs of the engine). fork and exec
//! materialize first (process.rs): lazy descriptors and holds are one
//! process's.
//!
//! What this process keeps of each such open file (its path, its hold) is
//! private memory indexed by the open-file entry (`INFO`): a forked
//! child drops its copy of the holds (they are its parent's).

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicUsize, Ordering};

use inkfs::api::client::Hold;
use inkfs::api::ns::Op;
use inkfs::api::{FileKind, OpenFlags};

use crate::mounts::{self, Mount};
use crate::path::{self, CwdBuf, Kept};
use crate::table::{self, Ofd, MAX_OFD};
use crate::{cwd, guard, names, real, stats};

/// The O_PATH descriptor of /dev/null placeholders are duplicates of.
static NULL_FD: AtomicI32 = AtomicI32::new(-1);
/// A real directory (`/`, read-only), which a directory's placeholder
/// number names while glibc's fdopendir checks it ([`fdopendir`]).
static DIR_FD: AtomicI32 = AtomicI32::new(-1);

/// `INKFS_PRELOAD_LAZY=0`: every open goes to the kernel first, as in
/// stage 3; `INKFS_PRELOAD_LAZY=files`: directories do (as before they
/// had placeholders too), to measure one against the other.
pub const ENV: &str = "INKFS_PRELOAD_LAZY";
/// 0: no placeholders; 1: regular files'; 2: directories' too.
static ENABLED: AtomicI32 = AtomicI32::new(2);

/// Open flags a placeholder is made for; others go to the kernel
/// (O_TMPFILE's own bit: O_TMPFILE includes O_DIRECTORY, which a
/// directory's placeholder is made for).
const KERNEL_ONLY: c_int = libc::O_PATH | (libc::O_TMPFILE & !libc::O_DIRECTORY) | libc::O_ASYNC;
/// Open flags F_GETFL shows of a directory beside [`STATUS`] (the
/// kernel's does).
const DIR_STATUS: c_int = libc::O_DIRECTORY | libc::O_NOFOLLOW;
/// Status flags F_GETFL shows of a served open file.
const STATUS: c_int = libc::O_ACCMODE
    | libc::O_APPEND
    | libc::O_NONBLOCK
    | libc::O_DSYNC
    | libc::O_SYNC
    | libc::O_DIRECT
    | libc::O_NOATIME
    | libc::O_LARGEFILE;

/// Errors of the engine's open that are the kernel's answer too.
const OPEN_ERRORS: [c_int; 7] = [
    libc::EACCES,
    libc::EPERM,
    libc::EROFS,
    libc::ETXTBSY,
    libc::EFBIG,
    libc::ENOSPC,
    libc::EISDIR,
];

/// What this process keeps of an open file: the path it was opened by
/// (NUL-terminated) and its hold.
pub struct Info {
    path: Box<[u8]>,
    /// `path` is relative to the current directory, and the entry may still
    /// be lazy: counted in [`RELATIVE`] while set. Cleared once the entry
    /// has its kernel file.
    relative: AtomicBool,
    hold: Option<(usize, Hold)>,
}

/// Entries of this process whose `Info::relative` is set: a change of
/// the current directory has placeholders to materialize first only
/// while this is not 0 ([`settle_relative`]).
static RELATIVE: AtomicUsize = AtomicUsize::new(0);

impl Info {
    fn new(kept: Kept, hold: Option<(usize, Hold)>) -> Info {
        if kept.relative {
            RELATIVE.fetch_add(1, Ordering::SeqCst);
        }
        Info {
            path: kept.path,
            relative: AtomicBool::new(kept.relative),
            hold,
        }
    }

    /// No longer kept by a relative path's rule (materialized, or let go).
    fn settled(&self) {
        if self.relative.swap(false, Ordering::SeqCst) {
            RELATIVE.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Scans of other threads' entries in progress ([`Scanning`]): while not
/// 0, a last close lets go of its `Info` only once they are over.
static SCANNING: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Of [`SCANNING`], this thread's (a signal handler's close inside a
    /// scan must not wait for that scan).
    static OWN_SCANNING: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// A pass over every entry's `Info` from a thread that does not own those
/// descriptors (a change of directory, fork, exec), which another thread
/// may close meanwhile: [`forget`] takes the `Info` out of its slot, then
/// waits for the scans in progress before freeing it. SeqCst on both
/// sides: a scan that read the pointer began before the swap, so the
/// closing thread's read of the count after its swap sees it.
struct Scanning(());

impl Scanning {
    fn begin() -> Scanning {
        SCANNING.fetch_add(1, Ordering::SeqCst);
        let _ = OWN_SCANNING.try_with(|n| n.set(n.get() + 1));
        Scanning(())
    }
}

impl Drop for Scanning {
    fn drop(&mut self) {
        let _ = OWN_SCANNING.try_with(|n| n.set(n.get() - 1));
        SCANNING.fetch_sub(1, Ordering::SeqCst);
    }
}

/// `p`, just swapped out of its `INFO` slot (SeqCst), once no scan that
/// may have read it before is in progress.
fn taken(p: *mut Info) -> Option<Box<Info>> {
    if p.is_null() {
        return None;
    }
    let own = OWN_SCANNING.try_with(|n| n.get()).unwrap_or(0);
    while SCANNING.load(Ordering::SeqCst) > own {
        std::thread::yield_now();
    }
    // SAFETY: a Box this module leaked, swapped out of its slot, and no
    // scan that could have read it is left: ours alone.
    Some(unsafe { Box::from_raw(p) })
}

/// Per open-file entry (this process's copy).
static INFO: [AtomicPtr<Info>; MAX_OFD] = [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_OFD];

/// At load.
pub fn init() {
    match std::env::var_os(ENV) {
        Some(v) if v == "0" => ENABLED.store(0, Ordering::Relaxed),
        Some(v) if v == "files" => ENABLED.store(1, Ordering::Relaxed),
        _ => {}
    }
    // SAFETY: a NUL-terminated literal path.
    let fd = unsafe {
        real::openat(
            libc::AT_FDCWD,
            c"/dev/null".as_ptr(),
            libc::O_PATH | libc::O_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return;
    }
    // Out of the program's way (the numbers it gets are the kernel's).
    use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd};
    // SAFETY: a descriptor we just opened, owned by nothing else.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    if let Ok(h) = inkfs::api::client::high(owned) {
        NULL_FD.store(h.into_raw_fd(), Ordering::Relaxed);
    }
    // SAFETY: a NUL-terminated literal path.
    let root = unsafe {
        real::openat(
            libc::AT_FDCWD,
            c"/".as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            0,
        )
    };
    if root >= 0 {
        // SAFETY: a descriptor we just opened, owned by nothing else.
        let owned = unsafe { OwnedFd::from_raw_fd(root) };
        if let Ok(h) = inkfs::api::client::high(owned) {
            DIR_FD.store(h.into_raw_fd(), Ordering::Relaxed);
        }
    }
}

/// Keep `info` for open-file entry `idx` (replacing what was there).
pub fn set_info(idx: usize, info: Info) {
    if let Some(slot) = INFO.get(idx) {
        let old = slot.swap(Box::into_raw(Box::new(info)), Ordering::SeqCst);
        if let Some(old) = taken(old) {
            old.settled();
        }
    }
}

/// Keep the path entry `idx` (a directory) was opened by.
pub fn keep_path(idx: usize, path: Box<[u8]>) {
    set_info(idx, Info::new(Kept::absolute(path), None));
}

/// The absolute path entry `idx` was opened by (without its NUL), if
/// kept. Valid while the entry is open (a program closing a descriptor
/// while another thread uses it is the program's bug, as with the
/// kernel).
pub fn path_of(idx: usize) -> Option<&'static [u8]> {
    let info = info(idx)?;
    if info.relative.load(Ordering::Acquire) {
        return None;
    }
    info.path.split_last().map(|(_, p)| p)
}

/// What entry `idx` keeps, if anything.
fn info(idx: usize) -> Option<&'static Info> {
    let p = INFO.get(idx)?.load(Ordering::Acquire);
    if p.is_null() {
        return None;
    }
    // SAFETY: a leaked Box, freed only by `forget` at the entry's last
    // close (and by `set_info` replacing it, at an entry's registration).
    Some(unsafe { &*p })
}

/// Before the current directory changes (cwd.rs, `changing`, once no
/// open from the old one is in flight): materialize every placeholder
/// kept by a path relative to it, which the kernel resolves from the
/// directory it is now. One that cannot be (its file renamed meanwhile)
/// stays lazy, as one kept by an absolute path would; a later
/// materialization's inode check refuses whatever its path then names.
/// System calls only, and nothing when no such placeholder exists.
pub fn settle_relative() {
    if RELATIVE.load(Ordering::SeqCst) == 0 {
        return;
    }
    let _scan = Scanning::begin();
    table::each(|_, idx, o| {
        let relative = info(idx).is_some_and(|i| i.relative.load(Ordering::Acquire));
        if relative && o.lazy.load(Ordering::Acquire) != 0 {
            let _ = materialize(idx, o);
        }
    });
}

/// Entry `idx`'s last descriptor is closed: let its hold go (telling the
/// server if the inode was unlinked meanwhile) and drop what was kept.
pub fn forget(idx: usize) {
    let Some(slot) = INFO.get(idx) else { return };
    let Some(info) = taken(slot.swap(std::ptr::null_mut(), Ordering::SeqCst)) else {
        return;
    };
    info.settled();
    if let Some((mi, hold)) = info.hold {
        let done = guard::run(|| {
            let m = mounts::by_index(mi)?;
            let lease = m.checkout()?;
            lease.client().unhold(hold);
            Some(())
        });
        // No client now (`None`): the hold stays until this process's
        // sessions end (the server then frees the inode if unlinked).
        let _ = done;
    }
}

/// In a forked child: its parent's holds are not its own (its lazy
/// descriptors were materialized before the fork; the kernel's open files
/// keep the inodes).
pub fn after_fork() {
    for slot in &INFO {
        let p = slot.swap(std::ptr::null_mut(), Ordering::AcqRel);
        if !p.is_null() {
            // SAFETY: this process's copy of a leaked Box.
            drop(unsafe { Box::from_raw(p) });
        }
    }
    // The parent's counts, copied: the child keeps no Info, and only its
    // one thread can be scanning.
    RELATIVE.store(0, Ordering::SeqCst);
    SCANNING.store(
        OWN_SCANNING.try_with(|n| n.get()).unwrap_or(0),
        Ordering::SeqCst,
    );
}

fn fail(e: c_int) -> c_int {
    names::set_errno(e);
    -1
}

/// An open's answer for a name no directory on the way holds (path.rs,
/// `Stop::Absent`): ENOENT, counted.
fn absent() -> c_int {
    stats::bump(&stats::STAT_ABSENT);
    fail(libc::ENOENT)
}

/// A placeholder descriptor (close-on-exec if asked): the lowest free
/// number from 3 on, as open(2) would give... unless 0-2 are free, which
/// open(2) would give and the library never serves: then `None`.
fn placeholder(cloexec: bool) -> Option<c_int> {
    let null = NULL_FD.load(Ordering::Relaxed);
    if null < 0 {
        return None;
    }
    let cmd = if cloexec {
        libc::F_DUPFD_CLOEXEC
    } else {
        libc::F_DUPFD
    };
    // SAFETY: no memory involved.
    let fd = unsafe { real::fcntl(null, cmd, 0) };
    if fd < 0 {
        return None;
    }
    if fd <= 2 || fd as usize >= table::MAX_FD {
        // SAFETY: our own fresh descriptor.
        unsafe { real::close(fd) };
        return None;
    }
    Some(fd)
}

/// open(2) of `p` (relative to `dirfd`) without the kernel, if the library
/// can: the descriptor (or -1 with errno, an answer the kernel would
/// give), or `None` for the kernel.
pub fn open(dirfd: c_int, bytes: &[u8], flags: c_int, mode: libc::mode_t) -> Option<c_int> {
    let enabled = ENABLED.load(Ordering::Relaxed);
    if enabled == 0 || flags & KERNEL_ONLY != 0 {
        return None;
    }
    let dirs = enabled >= 2;
    let creating = flags & libc::O_CREAT != 0;
    let want_dir = flags & libc::O_DIRECTORY != 0;
    if want_dir && (creating || !dirs) {
        return None;
    }
    let mut cwd = CwdBuf::new();
    let t = path::locate(dirfd, bytes, &mut cwd)?;
    if t.mount.is_refused() {
        return None;
    }
    let (mi, _) = mounts::index_of(t.mount)?;
    if want_dir {
        return open_dir(&t, mi, dirfd, flags);
    }
    let cred = if creating {
        names::creator()?
    } else {
        crate::creds::get(crate::creds::Ids::Effective)?
    };
    let lease = t.mount.checkout()?;
    if lease.client().session_closed() {
        // The server is gone: no placeholder for a pool nobody serves.
        t.mount.alive(&lease);
        return None;
    }
    // From the current directory: no change of it settles the
    // placeholders kept by relative paths until this open has registered
    // its own (`Target::kept` checks no change began before this).
    let _opening = t.from_cwd().map(|_| cwd::Opening::begin());
    let looked = lease.client().call(|fs| {
        // The lookup checks search permission on `dir`: a refusal goes
        // to the kernel below, and an ENOENT (a create's cue) comes
        // after the check passed.
        let (dir, name) = path::walk_parent_to_look_up(fs, &cred, &t)?;
        Ok((dir, name, fs.lookup(&cred, dir, name)))
    });
    let (dir, name, found) = match looked {
        Ok(found) => found,
        // A directory on the way is absent: ENOENT, created or not (the
        // kernel's answer, one FUSE lookup later).
        Err(path::Stop::Absent) => return Some(absent()),
        Err(path::Stop::Kernel) => return None,
    };
    // The path kept to materialize by, for an answer that makes a
    // descriptor (a miss needs none): a file's relative to the current
    // directory if the walk started there (no getcwd), a directory's
    // absolute (the path of a directory descriptor is the start of the
    // paths relative to it).
    let path = || t.kept(|| path_of(table::local(dirfd)?.0));
    let abs_path = || t.absolute(|| path_of(table::local(dirfd)?.0));
    match found {
        Ok(a) => {
            if creating && flags & libc::O_EXCL != 0 {
                return Some(fail(libc::EEXIST));
            }
            if a.kind == FileKind::Dir && dirs && !creating {
                return directory(t.mount, mi, a.ino, a.generation, flags, &cred, abs_path()?);
            }
            if a.kind != FileKind::File {
                return None;
            }
            existing(t.mount, mi, a.ino, a.generation, flags, &cred, path()?)
        }
        Err(e) if e.errno() == libc::ENOENT && creating => {
            create(t.mount, mi, dir, name, flags, mode, &cred, path()?)
        }
        // The pool is the truth: no such name (the kernel would say so,
        // one request later).
        Err(e) if e.errno() == libc::ENOENT => Some(absent()),
        Err(_) => None,
    }
}

/// open(2) with O_DIRECTORY of what `t` names (no O_CREAT): the whole
/// path walked in the pool, a trailing slash and "." included (the
/// kernel's answer for what the walk hands over: a symlink to follow, a
/// missing name, `..` above the start...).
fn open_dir(t: &path::Target<'_>, mi: usize, dirfd: c_int, flags: c_int) -> Option<c_int> {
    let cred = crate::creds::get(crate::creds::Ids::Effective)?;
    let lease = t.mount.checkout()?;
    if lease.client().session_closed() {
        t.mount.alive(&lease);
        return None;
    }
    let follow = flags & libc::O_NOFOLLOW == 0;
    let a = match lease
        .client()
        .call(|fs| path::walk_or_absent(fs, &cred, t, follow))
    {
        Ok(a) => a,
        Err(path::Stop::Absent) => return Some(absent()),
        Err(path::Stop::Kernel) => return None,
    };
    if a.kind != FileKind::Dir {
        return None;
    }
    let path = t.absolute(|| path_of(table::local(dirfd)?.0))?;
    directory(t.mount, mi, a.ino, a.generation, flags, &cred, path)
}

/// An existing directory opened for reading (listing it, or as the
/// directory of relative paths): read permission as the kernel checks
/// it, the hold (an rmdir by anyone leaves it an orphan until the last
/// close, as the kernel keeps a removed directory open), the placeholder.
/// Any other access mode, O_TRUNC, O_NOATIME: the kernel's answer.
fn directory(
    m: &'static Mount,
    mi: usize,
    ino: u64,
    generation: u64,
    flags: c_int,
    cred: &inkfs::api::Credentials,
    path: Box<[u8]>,
) -> Option<c_int> {
    if flags & libc::O_ACCMODE != libc::O_RDONLY
        || flags & (libc::O_CREAT | libc::O_TRUNC | libc::O_NOATIME) != 0
    {
        return None;
    }
    let lease = m.checkout()?;
    let c = lease.client();
    match c.call(|fs| fs.access(cred, ino, inkfs::api::MAY_READ)) {
        Ok(()) => {}
        Err(e) if e.errno() == libc::EACCES => return Some(fail(libc::EACCES)),
        Err(_) => return None,
    }
    let hold = c.hold(ino, generation)?;
    let Some(fd) = placeholder(flags & libc::O_CLOEXEC != 0) else {
        c.unhold(hold);
        return None;
    };
    let status = (flags & (STATUS | DIR_STATUS)) | libc::O_LARGEFILE;
    Some(
        register(
            fd,
            mi,
            ino,
            libc::S_IFDIR,
            status,
            Kept::absolute(path),
            hold,
        )
        .0,
    )
}

/// A DIR for `fd` if it is a directory's placeholder (`None`: not one,
/// or glibc refused):
/// glibc's fdopendir checks the descriptor with its own fstat and fcntl,
/// inside glibc where the library does not see them, and on the
/// placeholder (/dev/null) that fails with ENOTDIR. So for the length of
/// that call the number names a real directory (`/`, `DIR_FD`), and the
/// placeholder again before the DIR is handed out; glibc made the number
/// close-on-exec (fdopendir does), and the placeholder is made so too.
/// The DIR's listing is the library's (dir.rs finds it by its number).
pub fn fdopendir(fd: c_int) -> Option<*mut libc::DIR> {
    let (_, o) = table::get(fd)?;
    if o.lazy.load(Ordering::Acquire) == 0 || !o.is_dir() {
        return None;
    }
    let root = DIR_FD.load(Ordering::Relaxed);
    let null = NULL_FD.load(Ordering::Relaxed);
    if root < 0 || null < 0 {
        return None;
    }
    // SAFETY: no memory of ours involved; both descriptors are the
    // library's, `fd` the program's placeholder, which only this call
    // uses now (a program using a descriptor it passes to fdopendir from
    // another thread at the same time is wrong with the kernel too).
    unsafe {
        if real::dup3(root, fd, libc::O_CLOEXEC) < 0 {
            return None;
        }
        let d = real::fdopendir(fd);
        real::dup3(null, fd, libc::O_CLOEXEC);
        // Refused (no memory; or the program closed the library's `/`
        // descriptor and reused its number for something else): the
        // caller takes the kernel's way.
        (!d.is_null()).then_some(d)
    }
}

/// An existing regular file: the engine's open rules with the caller's
/// credentials (O_TRUNC under the write lease), the hold, the
/// placeholder.
fn existing(
    m: &'static Mount,
    mi: usize,
    ino: u64,
    generation: u64,
    flags: c_int,
    cred: &inkfs::api::Credentials,
    path: Kept,
) -> Option<c_int> {
    let oflags = OpenFlags::new(flags & !(libc::O_CREAT | libc::O_EXCL));
    // O_TRUNC truncates whatever the access mode (O_RDONLY|O_TRUNC too),
    // under the lease the process's client holds.
    let lease = m.checkout()?;
    let c = lease.client();
    let file = match c.open(cred, ino, oflags) {
        Ok(file) => file,
        // The permission rules, the immutable and append-only flags, a
        // truncate with no space: the engine's answer is the kernel's.
        Err(e) if OPEN_ERRORS.contains(&e.errno()) => return Some(fail(e.errno())),
        // Anything else (a lease refused, the server gone, a race with an
        // unlink): the kernel's answer.
        Err(_) => return None,
    };
    let Some(hold) = c.hold(ino, generation) else {
        c.release(file);
        return None;
    };
    let Some(fd) = placeholder(flags & libc::O_CLOEXEC != 0) else {
        c.release(file);
        c.unhold(hold);
        return None;
    };
    let status = (flags & STATUS) | libc::O_LARGEFILE;
    let (fd, entry) = register(fd, mi, ino, libc::S_IFREG, status, path, hold);
    keep_handle(&lease, entry, flags, file);
    Some(fd)
}

/// Open flags that change nothing in an engine handle once it is open
/// (the open acted on them, or they are the descriptor's): a handle
/// opened with only these beside the access mode is the one
/// `Lease::with_file` would open for the descriptor.
const OPEN_ONLY: c_int = libc::O_ACCMODE
    | libc::O_CREAT
    | libc::O_EXCL
    | libc::O_TRUNC
    | libc::O_CLOEXEC
    | libc::O_LARGEFILE
    | libc::O_NOCTTY
    | libc::O_NOFOLLOW;

/// After a served open of `fd` with `flags`: keep the engine handle
/// `file` its permission check opened as the open file's handle, when it
/// is the one the first read or write would open (root's check aside,
/// which the caller's passed); otherwise release it. Saves an engine
/// open and release per opened file (webserver: each file is opened,
/// read whole and closed).
fn keep_handle(
    lease: &mounts::Lease<'_>,
    entry: Option<(usize, u32)>,
    flags: c_int,
    file: inkfs::api::File,
) {
    // The set-id rule needs no check: the caller's effective uid decided
    // it, as it decides `open_file`'s (the same cached ids).
    let same = flags & !OPEN_ONLY == 0 && file.flags().bits() & !OPEN_ONLY == 0;
    match entry {
        Some((idx, gen)) if same => lease.adopt_file(idx, gen, file),
        _ => lease.client().release(file),
    }
}

/// A new file (or, raced, one that appeared): made by the server, with
/// its write lease when opened for writing.
#[allow(clippy::too_many_arguments)]
fn create(
    m: &'static Mount,
    mi: usize,
    dir: u64,
    name: &[u8],
    flags: c_int,
    mode: libc::mode_t,
    cred: &inkfs::api::Credentials,
    path: Kept,
) -> Option<c_int> {
    let lease = m.checkout()?;
    let c = lease.client();
    let op = Op::Create {
        dir,
        name: name.to_vec(),
        mode: mode & 0o7777,
        flags,
    };
    let done = crate::names::ns(c, cred, op).ok()?;
    stats::bump(&stats::NS_LOCAL);
    if done.errno != 0 {
        return Some(fail(done.errno));
    }
    // Removed by someone else between the create and this hold: the open
    // made the file and cannot hand it out (a difference from the
    // kernel's open, which would).
    let Some(hold) = c.hold(done.ino, done.igen) else {
        return Some(fail(libc::ENOENT));
    };
    let Some(fd) = placeholder(flags & libc::O_CLOEXEC != 0) else {
        c.unhold(hold);
        // The kernel opens what the server made (no O_EXCL: it exists).
        return None;
    };
    let status = (flags & STATUS) | libc::O_LARGEFILE;
    Some(register(fd, mi, done.ino, libc::S_IFREG, status, path, hold).0)
}

/// Register placeholder `fd` of inode `ino` (`kind`: S_IFREG or
/// S_IFDIR) with its status flags, path and hold: `fd`, with its open-file
/// entry and that entry's generation if it is served.
fn register(
    fd: c_int,
    mi: usize,
    ino: u64,
    kind: u32,
    status: c_int,
    path: Kept,
    hold: Hold,
) -> (c_int, Option<(usize, u32)>) {
    let entry = table::register(fd, mi, ino, kind, status, true);
    match entry {
        Some((idx, _)) => {
            set_info(idx, Info::new(path, Some((mi, hold))));
            stats::bump(&stats::OPEN_LOCAL);
        }
        None => {
            // Not served after all (table full): the kernel file then.
            // Materializing needs the entry; open it in the kernel here.
            let kfd = kernel_open(&path.path, kernel_flags(status, kind));
            if kfd >= 0 {
                // SAFETY: both ours; dup3 replaces the placeholder.
                unsafe {
                    let fdflags = real::fcntl(fd, libc::F_GETFD, 0);
                    let cloexec = if fdflags > 0 && fdflags & libc::FD_CLOEXEC != 0 {
                        libc::O_CLOEXEC
                    } else {
                        0
                    };
                    real::dup3(kfd, fd, cloexec);
                    real::close(kfd);
                }
            }
            if let Some(m) = mounts::by_index(mi) {
                if let Some(lease) = m.checkout() {
                    lease.client().unhold(hold);
                }
            }
        }
    }
    (fd, entry)
}

/// The flags to open a placeholder's file in the kernel with: its status
/// flags, and O_DIRECTORY for a directory (the path must still name one).
fn kernel_flags(status: c_int, kind: u32) -> c_int {
    let dir = if kind == libc::S_IFDIR {
        libc::O_DIRECTORY
    } else {
        0
    };
    (status & !libc::O_LARGEFILE) | dir
}

/// Open `path` (NUL-terminated) in the kernel with the flags of the
/// original open, less those that create or truncate.
fn kernel_open(path: &[u8], flags: c_int) -> c_int {
    let f = (flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC)) | libc::O_CLOEXEC;
    // SAFETY: a NUL-terminated path we own.
    unsafe { real::openat(libc::AT_FDCWD, path.as_ptr().cast(), f, 0) }
}

/// The descriptor to make a kernel call with: `fd` itself, after
/// materializing it if it is a placeholder; -1 (the kernel's EBADF) if it
/// is one that cannot be materialized (its file renamed or removed since
/// it was opened).
pub fn kernel(fd: c_int) -> c_int {
    let Some((idx, ofd)) = table::get(fd) else {
        return fd;
    };
    if ofd.lazy.load(Ordering::Acquire) == 0 {
        return fd;
    }
    if materialize(idx, ofd) {
        fd
    } else {
        -1
    }
}

/// Give open-file entry `idx` a kernel file: open it by its path and dup3
/// it onto each of this process's descriptors of the entry.
fn materialize(idx: usize, ofd: &Ofd) -> bool {
    // One thread at a time: 1 (lazy) -> 2 (being materialized) -> 0.
    let t = std::time::Instant::now();
    loop {
        match ofd
            .lazy
            .compare_exchange(1, 2, Ordering::SeqCst, Ordering::Acquire)
        {
            Ok(_) => break,
            Err(0) => return true,
            Err(_) if t.elapsed() > std::time::Duration::from_secs(1) => return false,
            Err(_) => std::thread::yield_now(),
        }
    }
    // System calls only, no allocation: an exec in a vfork child runs this.
    let info = info(idx);
    let ok = (|| {
        // A relative path: the current directory is the one the open was
        // made in (a change materializes first); the inode check below
        // refuses anything else (a thread that left CLONE_FS).
        let p: &[u8] = &info?.path;
        let flags = ofd.flags.load(Ordering::Relaxed) as c_int;
        let kind = ofd.kind.load(Ordering::Relaxed);
        let kfd = kernel_open(p, kernel_flags(flags, kind));
        if kfd < 0 {
            return None;
        }
        // The same inode, on the mount: not a file that took the name.
        // SAFETY: all-zero is a valid stat64; the kernel fills it.
        let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
        let m = mounts::by_index(ofd.mount.load(Ordering::Relaxed) as usize);
        let same = unsafe { real::fstat64(kfd, &mut st) } == 0
            && st.st_ino == ofd.ino.load(Ordering::Relaxed)
            && m.is_some_and(|m| m.dev == st.st_dev);
        if same {
            table::each(|fd, i, _| {
                if i == idx {
                    // SAFETY: no memory involved.
                    let fdflags = unsafe { real::fcntl(fd, libc::F_GETFD, 0) };
                    let cloexec = if fdflags > 0 && fdflags & libc::FD_CLOEXEC != 0 {
                        libc::O_CLOEXEC
                    } else {
                        0
                    };
                    // SAFETY: no memory involved; replaces the placeholder.
                    unsafe { real::dup3(kfd, fd, cloexec) };
                }
            });
        }
        // SAFETY: our own descriptor.
        unsafe { real::close(kfd) };
        same.then_some(())
    })()
    .is_some();
    if ok {
        if let Some(info) = info {
            info.settled();
        }
    }
    ofd.lazy.store(if ok { 0 } else { 1 }, Ordering::Release);
    if ok {
        stats::bump(&stats::MATERIALIZED);
    }
    ok
}

/// Materialize every lazy descriptor of this process that `want` picks
/// (fork: all; exec: those that survive it). No allocation.
pub fn materialize_all(mut want: impl FnMut(c_int) -> bool) {
    let _scan = Scanning::begin();
    table::each(|fd, idx, o| {
        if o.lazy.load(Ordering::Acquire) != 0 && want(fd) {
            let _ = materialize(idx, o);
        }
    });
}

/// Whether `fd` is a placeholder (no kernel file yet).
pub fn is_lazy(fd: c_int) -> bool {
    table::get(fd).is_some_and(|(_, o)| o.lazy.load(Ordering::Acquire) != 0)
}

/// F_GETFL of a placeholder: the library's status flags.
pub fn status_flags(fd: c_int) -> Option<c_int> {
    let (_, o) = table::get(fd)?;
    (o.lazy.load(Ordering::Acquire) != 0).then(|| o.flags.load(Ordering::Relaxed) as c_int)
}

/// F_SETFL of a placeholder: the flags F_SETFL may change, kept by the
/// library (O_APPEND, O_NONBLOCK, O_DIRECT, O_NOATIME; O_ASYNC needs the
/// real file: materialized first).
pub fn set_status_flags(fd: c_int, arg: c_int) -> Option<c_int> {
    let (_, o) = table::get(fd)?;
    if o.lazy.load(Ordering::Acquire) == 0 || arg & libc::O_ASYNC != 0 {
        return None;
    }
    let settable = libc::O_APPEND | libc::O_NONBLOCK | libc::O_DIRECT | libc::O_NOATIME;
    let old = o.flags.load(Ordering::Relaxed) as c_int;
    o.flags.store(
        ((old & !settable) | (arg & settable)) as u32,
        Ordering::Release,
    );
    Some(0)
}

/// `/proc/self/fd/N` or `/dev/fd/N` (also `/proc/PID/fd/N` of this
/// process): N, so that its file is materialized before the kernel
/// resolves the link.
pub fn fd_link(p: &[u8]) -> Option<c_int> {
    let rest = p
        .strip_prefix(b"/proc/self/fd/")
        .or_else(|| p.strip_prefix(b"/dev/fd/"))
        .or_else(|| {
            let r = p.strip_prefix(b"/proc/")?;
            let slash = r.iter().position(|&b| b == b'/')?;
            let pid: u32 = std::str::from_utf8(&r[..slash]).ok()?.parse().ok()?;
            (pid == std::process::id()).then_some(())?;
            r[slash..].strip_prefix(b"/fd/")
        })?;
    std::str::from_utf8(rest).ok()?.parse().ok()
}
