//! Counts of what the library served from the pool and what it passed to
//! the kernel, for calls on files under a mount (calls elsewhere are not
//! counted). With `INKFS_PRELOAD_STATS=FILE` in the environment, each
//! process appends one line to FILE when it exits through exit() (not
//! _exit, which runs no destructor):
//! `pid=P read_local=N read_kernel=N stat_local=N stat_kernel=N
//! dir_local=N dir_kernel=N write_kernel=N attach_refused=N write_local=N
//! sync_local=N ns_local=N ns_kernel=N attr_local=N open_local=N
//! materialized=N map_local=N stat_absent=N`. That is how the tests tell a
//! read served from the pool from one the kernel served.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

pub static READ_LOCAL: AtomicU64 = AtomicU64::new(0);
pub static READ_KERNEL: AtomicU64 = AtomicU64::new(0);
pub static STAT_LOCAL: AtomicU64 = AtomicU64::new(0);
pub static STAT_KERNEL: AtomicU64 = AtomicU64::new(0);
pub static DIR_LOCAL: AtomicU64 = AtomicU64::new(0);
pub static DIR_KERNEL: AtomicU64 = AtomicU64::new(0);
pub static WRITE_KERNEL: AtomicU64 = AtomicU64::new(0);
/// Writes (write, pwrite and their vector forms) and ftruncates served
/// through the client under the inode's write lease.
pub static WRITE_LOCAL: AtomicU64 = AtomicU64::new(0);
/// fsync, fdatasync and sync_file_range answered by the client with no
/// kernel call.
pub static SYNC_LOCAL: AtomicU64 = AtomicU64::new(0);
/// Mounts whose server refused this process (or could not be reached).
pub static ATTACH_REFUSED: AtomicU64 = AtomicU64::new(0);
/// Namespace calls (and chmod, chown, utimens) the server made through the
/// client's session, errors it answered included.
pub static NS_LOCAL: AtomicU64 = AtomicU64::new(0);
/// Namespace calls on a mount's paths that went to the kernel.
pub static NS_KERNEL: AtomicU64 = AtomicU64::new(0);
/// chmod, chown and utimens made by this process's client under the
/// inode's write lease (no message).
pub static ATTR_LOCAL: AtomicU64 = AtomicU64::new(0);
/// Opens (creates included) served with a placeholder descriptor: no
/// kernel open.
pub static OPEN_LOCAL: AtomicU64 = AtomicU64::new(0);
/// Placeholders materialized (a call needed the kernel's file).
pub static MATERIALIZED: AtomicU64 = AtomicU64::new(0);
/// Private read-only mappings of served files made as copies of the
/// pool's bytes (map.rs): no kernel open, no READ request.
pub static MAP_LOCAL: AtomicU64 = AtomicU64::new(0);
/// Path stats, statx, access and readlink answered ENOENT from the pool
/// (a name no directory on the way holds: path.rs, `Stop::Absent`), and
/// opens of such a path: no kernel call, no FUSE lookup.
pub static STAT_ABSENT: AtomicU64 = AtomicU64::new(0);

const ALL: [&AtomicU64; 17] = [
    &READ_LOCAL,
    &READ_KERNEL,
    &STAT_LOCAL,
    &STAT_KERNEL,
    &DIR_LOCAL,
    &DIR_KERNEL,
    &WRITE_KERNEL,
    &ATTACH_REFUSED,
    &WRITE_LOCAL,
    &SYNC_LOCAL,
    &NS_LOCAL,
    &NS_KERNEL,
    &ATTR_LOCAL,
    &OPEN_LOCAL,
    &MATERIALIZED,
    &MAP_LOCAL,
    &STAT_ABSENT,
];

pub const ENV: &str = "INKFS_PRELOAD_STATS";

/// The stats file named at load (NUL-terminated), if any.
static PATH: [AtomicU64; 64] = [const { AtomicU64::new(0) }; 64];
static PATH_LEN: AtomicUsize = AtomicUsize::new(0);

/// Whether a stats file was named at load: only then are calls counted.
/// Set once by [`init`] (the constructor, before any call is served), read
/// by every counted call; a forked child inherits it, an exec'd program
/// sets it again from its environment.
static COUNTING: AtomicBool = AtomicBool::new(false);

/// Count one call in `c`, if this process reports its counts. Without a
/// stats file nobody reads them, and the count was a locked add on a line
/// every thread of the process shares, at each served write and fdatasync:
/// one plain load of a flag that never changes after load instead.
#[inline]
pub fn bump(c: &AtomicU64) {
    if COUNTING.load(Ordering::Relaxed) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// In a forked child: its counts start at 0 (the parent reports its own).
pub fn reset() {
    for c in ALL {
        c.store(0, Ordering::Relaxed);
    }
}

/// At load: remember where to report (the environment may change later).
pub fn init() {
    let Some(v) = std::env::var_os(ENV) else {
        return;
    };
    use std::os::unix::ffi::OsStrExt;
    let b = v.as_bytes();
    if b.is_empty() || b.len() >= PATH.len() * 8 {
        return;
    }
    let mut buf = [0u8; 512];
    buf[..b.len()].copy_from_slice(b);
    for (i, w) in PATH.iter().enumerate() {
        let chunk: [u8; 8] = buf[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]);
        w.store(u64::from_ne_bytes(chunk), Ordering::Relaxed);
    }
    PATH_LEN.store(b.len(), Ordering::Release);
    COUNTING.store(true, Ordering::Relaxed);
}

/// At exit: append this process's line.
pub fn report() {
    let len = PATH_LEN.load(Ordering::Acquire);
    if len == 0 {
        return;
    }
    let mut path = [0u8; 513];
    for (i, w) in PATH.iter().enumerate() {
        path[i * 8..i * 8 + 8].copy_from_slice(&w.load(Ordering::Relaxed).to_ne_bytes());
    }
    path[len] = 0;
    let mut line = [0u8; 512];
    let mut cur = std::io::Cursor::new(&mut line[..]);
    let v = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let _ = writeln!(
        cur,
        "pid={} read_local={} read_kernel={} stat_local={} stat_kernel={} dir_local={} dir_kernel={} write_kernel={} attach_refused={} write_local={} sync_local={} ns_local={} ns_kernel={} attr_local={} open_local={} materialized={} map_local={} stat_absent={}",
        std::process::id(),
        v(&READ_LOCAL),
        v(&READ_KERNEL),
        v(&STAT_LOCAL),
        v(&STAT_KERNEL),
        v(&DIR_LOCAL),
        v(&DIR_KERNEL),
        v(&WRITE_KERNEL),
        v(&ATTACH_REFUSED),
        v(&WRITE_LOCAL),
        v(&SYNC_LOCAL),
        v(&NS_LOCAL),
        v(&NS_KERNEL),
        v(&ATTR_LOCAL),
        v(&OPEN_LOCAL),
        v(&MATERIALIZED),
        v(&MAP_LOCAL),
        v(&STAT_ABSENT),
    );
    let n = cur.position() as usize;
    // SAFETY: NUL-terminated path, our own buffer; real calls only.
    unsafe {
        let fd = crate::real::openat(
            libc::AT_FDCWD,
            path.as_ptr().cast(),
            libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT | libc::O_CLOEXEC,
            0o644,
        );
        if fd >= 0 {
            crate::real::write(fd, line.as_ptr().cast(), n);
            crate::real::close(fd);
        }
    }
}
