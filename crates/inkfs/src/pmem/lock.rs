//! The claim on a pool: an open-file-description (OFD) lock on the pool file
//! or device itself, taken by every open.
//!
//! Why this lock and not another:
//! - On the pool itself, not on a file in a side directory: every opener
//!   meets it, whatever its uid or run directory, and nothing is left on
//!   disk when the holder goes.
//! - Released by the kernel with the last reference to the open file
//!   description (every descriptor closed *and* every mapping of it gone),
//!   so a SIGKILLed holder frees its pool; a pool whose superblock says
//!   MOUNTED while the lock is free is a crash, recovered at the next mount.
//! - Owned by the open file description, not by the process (unlike POSIX
//!   record locks, which a process holds once and loses at the first close
//!   of any descriptor of the file): a descriptor handed to another process
//!   over a unix socket, or duplicated, shares the claim
//!   ([`PoolFile::from_fd`]), while a second `open(2)` of the same pool is
//!   refused, in another process or in this one.
//! - Byte ranges and `F_OFD_GETLK` (which `flock` lacks): `inkfs stat` can
//!   ask whether the pool is in use without taking anything, so it never
//!   makes a mount that starts meanwhile fail, and a holder can say "I am
//!   finishing" (below).
//!
//! The lock covers two bytes; nothing is ever stored for the lock's sake
//! (a lock may lie past the end of a file):
//!
//! | byte | held by                                   | meaning            |
//! |------|-------------------------------------------|--------------------|
//! | 0    | write lock: the read-write open; read lock: each read-only open | the claim |
//! | 1    | the same, until the holder calls [`PoolFile::finishing`] | still serving |
//!
//! A mount server lets go of byte 1 as soon as its FUSE session has ended,
//! while it saves the allocator. An opener refused on byte 0 that finds
//! byte 1 free waits (up to [`FINISHING_WAIT`]) instead of failing, so that
//! `umount M && inkfs mount P M` works. It also waits when every holder's
//! main thread has exited (a killed process whose last threads are still
//! tearing down).
//!
//! `F_OFD_GETLK` reports pid -1 for OFD locks, so the holders of a refused
//! open are found in `/proc/PID/fdinfo/FD`, which lists the locks each open
//! file description holds (`lock: 1: OFDLCK ADVISORY WRITE -1 MAJ:MIN:INO
//! START END`). A process this user may not inspect (another user's, when
//! not root) stays anonymous, and the message says so.

use std::fmt;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::map::OpenOptions;

/// The claim byte (see the module comment).
const CLAIM_BYTE: i64 = 0;
/// The "still serving" byte.
const SERVING_BYTE: i64 = 1;

/// How long an opener waits for a holder that is finishing (a mount server
/// saving its allocator after `umount`, a killed process tearing down).
pub const FINISHING_WAIT: Duration = Duration::from_secs(10);

/// How long any refused open is retried before it is reported. Between
/// fork and exec, a child (of any thread of the holder's process) holds
/// copies of the holder's descriptors, and so shares its claim for a
/// moment after the holder let go; the exec closes them (O_CLOEXEC).
const SPAWN_WAIT: Duration = Duration::from_millis(200);

/// Longest command line quoted in a message.
const COMMAND_CHARS_MAX: usize = 160;
/// Holders named in a message; the rest are counted.
const HOLDERS_NAMED_MAX: usize = 3;

/// A process that holds a pool's claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    /// Its command line (`comm` in brackets when it has none), shortened.
    pub command: String,
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // SAFETY: getpid has no preconditions and cannot fail.
        let me = unsafe { libc::getpid() } as u32;
        if self.pid == me {
            write!(f, "pid {} (this process: {})", self.pid, self.command)
        } else {
            write!(f, "pid {} ({})", self.pid, self.command)
        }
    }
}

/// Who holds a pool that could not be claimed, or that [`probe`] found in
/// use. Carried inside the `io::Error` of a refused open (kind
/// `WouldBlock`); get it back with [`PoolBusy::of`].
#[derive(Clone, Debug)]
pub struct PoolBusy {
    /// Held for writing (a read-write open), or only for reading.
    pub exclusive: bool,
    /// The holders this process could see (several when a descriptor was
    /// inherited or passed on). Empty when none was visible.
    pub holders: Vec<Holder>,
    /// Some processes could not be inspected (another user's, when not
    /// root): the holder may be among them.
    pub hidden: bool,
    /// The holder has let go of its "serving" byte: it is finishing.
    pub finishing: bool,
}

impl PoolBusy {
    /// The holder details of an error returned by a refused open.
    pub fn of(e: &io::Error) -> Option<&PoolBusy> {
        e.get_ref()?.downcast_ref::<PoolBusy>()
    }

    /// "pid 12 (inkfs mount /dev/shm/p /mnt/x)", the holders named; or an
    /// honest "another process" when none could be seen.
    pub fn holders_text(&self) -> String {
        if self.holders.is_empty() {
            // SAFETY: geteuid has no preconditions and cannot fail.
            let euid = unsafe { libc::geteuid() };
            return if self.hidden {
                format!(
                    "another process (not visible to uid {euid}: OFD locks record no pid, and \
                     that process's /proc entries are not readable; root can see it)"
                )
            } else {
                "another process (not found in /proc: it may have just exited)".into()
            };
        }
        let mut text = self
            .holders
            .iter()
            .take(HOLDERS_NAMED_MAX)
            .map(Holder::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        if self.holders.len() > HOLDERS_NAMED_MAX {
            text += &format!(" and {} more", self.holders.len() - HOLDERS_NAMED_MAX);
        }
        text
    }
}

impl fmt::Display for PoolBusy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let how = if self.exclusive {
            "in use by"
        } else {
            "open read-only by"
        };
        write!(f, "pool {how} {}", self.holders_text())?;
        if self.finishing {
            write!(f, ", which is finishing its unmount")?;
        }
        Ok(())
    }
}

impl std::error::Error for PoolBusy {}

/// An open pool file or device and its claim: exclusive when open for
/// writing, shared when read-only, none for [`PoolFile::open_unlocked`].
/// The claim lasts as long as this value, any duplicate of its descriptor
/// ([`PoolFile::try_clone`], a descriptor passed to another process) and any
/// mapping of it.
#[derive(Debug)]
pub struct PoolFile {
    file: File,
    path: PathBuf,
    read_only: bool,
    locked: bool,
}

impl PoolFile {
    /// Open (with `create_size_bytes`, create) the pool at `path` and claim
    /// it: a write lock when `read_only` is false, else a read lock. A pool
    /// in use is refused with an error of kind `WouldBlock` carrying a
    /// [`PoolBusy`] — after waiting, if its holder is finishing.
    pub fn open(path: &Path, opts: &OpenOptions) -> io::Result<PoolFile> {
        let file = open_file(path, opts)?;
        claim_waiting(&file, !opts.read_only)?;
        Ok(PoolFile {
            file,
            path: path.to_path_buf(),
            read_only: opts.read_only,
            locked: true,
        })
    }

    /// Open the pool read-only WITHOUT claiming it, to look at a pool that
    /// another process may be changing (`inkfs stat`, `inkfs fsck` without
    /// -y on a pool in use, which says so). What is read may be torn.
    pub fn open_unlocked(path: &Path) -> io::Result<PoolFile> {
        let opts = OpenOptions {
            create_size_bytes: None,
            read_only: true,
        };
        Ok(PoolFile {
            file: open_file(path, &opts)?,
            path: path.to_path_buf(),
            read_only: true,
            locked: false,
        })
    }

    /// Wrap a descriptor that shares the open file description of a
    /// holder: one passed over a unix socket (SCM_RIGHTS) by a process that
    /// holds the pool, or a `dup` of a [`PoolFile`]'s. It shares that claim
    /// (re-asserting it is a no-op for its own description). A descriptor
    /// from a fresh `open(2)` of the pool is a new description: it gets
    /// the claim only if the pool is free, and is refused otherwise.
    /// Read-only or read-write follows the descriptor's access mode.
    pub fn from_fd(fd: OwnedFd, path: &Path) -> io::Result<PoolFile> {
        let file = File::from(fd);
        // SAFETY: F_GETFL on a descriptor we own; no memory is involved.
        let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
        if flags < 0 {
            return Err(io::Error::last_os_error());
        }
        let read_only = flags & libc::O_ACCMODE == libc::O_RDONLY;
        if !try_claim(&file, !read_only)? {
            return Err(busy_error(&file, !read_only));
        }
        Ok(PoolFile {
            file,
            path: path.to_path_buf(),
            read_only,
            locked: true,
        })
    }

    /// A second descriptor for the same open file description: it shares
    /// the claim, which lasts until both are gone.
    pub fn try_clone(&self) -> io::Result<PoolFile> {
        Ok(PoolFile {
            file: self.file.try_clone()?,
            path: self.path.clone(),
            read_only: self.read_only,
            locked: self.locked,
        })
    }

    pub fn file(&self) -> &File {
        &self.file
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// Whether this file holds a claim (false for `open_unlocked`).
    pub fn is_locked(&self) -> bool {
        self.locked
    }

    /// Say that this holder is finishing: keep the claim, but let an
    /// opener that is refused wait for it rather than fail (a mount server
    /// whose session ended, saving its allocator). Cannot be undone.
    pub fn finishing(&self) {
        if self.locked {
            let _ = ofd(&self.file, libc::F_OFD_SETLK, libc::F_UNLCK, SERVING_BYTE);
        }
    }
}

/// Who holds the pool at `path`, without claiming anything: None if it is
/// free. For `inkfs stat`, which must not make a mount starting meanwhile
/// fail. The answer may be stale by the time it is read.
pub fn probe(path: &Path) -> io::Result<Option<PoolBusy>> {
    let opts = OpenOptions {
        create_size_bytes: None,
        read_only: true,
    };
    let file = open_file(path, &opts)?;
    match conflicting(&file, true, CLAIM_BYTE)? {
        None => Ok(None),
        Some(_) => Ok(Some(busy(&file, true))),
    }
}

pub(crate) fn open_file(path: &Path, opts: &OpenOptions) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(!opts.read_only)
        .create(opts.create_size_bytes.is_some())
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
}

/// `fcntl(cmd)` with an OFD lock description of byte `byte`; returns the
/// description as the kernel left it (F_OFD_GETLK fills it in).
fn ofd(file: &File, cmd: libc::c_int, l_type: libc::c_int, byte: i64) -> io::Result<libc::flock> {
    // SAFETY: flock is plain data; all-zero is a valid value (l_pid must
    // be 0 for OFD commands).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = l_type as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = byte;
    fl.l_len = 1;
    // SAFETY: fcntl on a descriptor we own with a valid flock struct that
    // lives for the whole call.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), cmd, &mut fl) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(fl)
    }
}

/// The type of a lock that would conflict with `exclusive` on `byte` (held
/// by another open file description), if any.
fn conflicting(file: &File, exclusive: bool, byte: i64) -> io::Result<Option<libc::c_int>> {
    let want = if exclusive {
        libc::F_WRLCK
    } else {
        libc::F_RDLCK
    };
    let fl = ofd(file, libc::F_OFD_GETLK, want, byte)?;
    Ok((fl.l_type as libc::c_int != libc::F_UNLCK).then_some(fl.l_type as libc::c_int))
}

/// Take the claim and the serving byte; false if another open file
/// description holds a conflicting lock.
fn try_claim(file: &File, exclusive: bool) -> io::Result<bool> {
    let l_type = if exclusive {
        libc::F_WRLCK
    } else {
        libc::F_RDLCK
    };
    for byte in [CLAIM_BYTE, SERVING_BYTE] {
        match ofd(file, libc::F_OFD_SETLK, l_type, byte) {
            Ok(_) => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES)) => {
                // Holding the claim without the serving byte would make us
                // look like a finishing holder: give both back.
                let _ = ofd(file, libc::F_OFD_SETLK, libc::F_UNLCK, CLAIM_BYTE);
                return Ok(false);
            }
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("cannot lock the pool (fcntl F_OFD_SETLK): {e}"),
                ))
            }
        }
    }
    Ok(true)
}

/// Claim, retrying briefly (a child between fork and exec) and for longer
/// while the holder is finishing.
fn claim_waiting(file: &File, exclusive: bool) -> io::Result<()> {
    let start = Instant::now();
    loop {
        if try_claim(file, exclusive)? {
            return Ok(());
        }
        let waited = start.elapsed();
        if waited < SPAWN_WAIT {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        // Cheap first (two F_OFD_GETLK): a finishing holder is waited for
        // without scanning /proc on every round.
        if waited < FINISHING_WAIT && holder_finishing(file, exclusive) {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        let info = busy(file, exclusive);
        if waited < FINISHING_WAIT && (info.finishing || holders_exiting(&info)) {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        return Err(io::Error::new(io::ErrorKind::WouldBlock, info));
    }
}

fn busy_error(file: &File, exclusive: bool) -> io::Error {
    io::Error::new(io::ErrorKind::WouldBlock, busy(file, exclusive))
}

/// Whether the holder of a lock conflicting with `exclusive` has let go
/// of its serving byte. The serving byte is tested for a write lock: any
/// holder of it conflicts.
fn holder_finishing(file: &File, exclusive: bool) -> bool {
    let claim = conflicting(file, exclusive, CLAIM_BYTE).ok().flatten();
    let serving = conflicting(file, true, SERVING_BYTE).ok().flatten();
    claim.is_some() && serving.is_none()
}

/// Describe whoever holds a lock that conflicts with `exclusive`.
fn busy(file: &File, exclusive: bool) -> PoolBusy {
    let claim = conflicting(file, exclusive, CLAIM_BYTE).ok().flatten();
    let (holders, hidden) = match file.metadata() {
        Ok(meta) => find_holders(meta.dev(), meta.ino()),
        Err(_) => (Vec::new(), true),
    };
    PoolBusy {
        exclusive: claim.is_none_or(|t| t == libc::F_WRLCK),
        holders,
        hidden,
        finishing: holder_finishing(file, exclusive),
    }
}

/// True if every visible holder's main thread has exited: a killed
/// process whose remaining threads (and with them its descriptors and
/// mappings) are still going away.
fn holders_exiting(info: &PoolBusy) -> bool {
    !info.holders.is_empty() && info.holders.iter().all(|h| leader_gone(h.pid))
}

fn leader_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name's closing parenthesis.
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => true,
    }
}

/// The processes holding an OFD lock on the inode `ino` of device `dev`,
/// and whether some processes could not be inspected.
fn find_holders(dev: u64, ino: u64) -> (Vec<Holder>, bool) {
    let want = format!(
        "{:02x}:{:02x}:{ino}",
        libc::major(dev as libc::dev_t),
        libc::minor(dev as libc::dev_t)
    );
    let mut holders = Vec::new();
    let mut hidden = false;
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return (holders, true);
    };
    for entry in procs.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        match holds_lock(pid, &want) {
            Some(true) => holders.push(Holder {
                pid,
                command: command_of(pid),
            }),
            Some(false) => {}
            None => hidden = true,
        }
    }
    (holders, hidden)
}

/// Whether process `pid` has a descriptor holding an OFD lock on `want`
/// ("MAJ:MIN:INO" as /proc prints it); None if it cannot be inspected.
fn holds_lock(pid: u32, want: &str) -> Option<bool> {
    let fdinfo = match std::fs::read_dir(format!("/proc/{pid}/fdinfo")) {
        Ok(d) => d,
        // Exited meanwhile: not a holder.
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Some(false),
        Err(_) => return None,
    };
    for fd in fdinfo.flatten() {
        let Ok(text) = std::fs::read_to_string(fd.path()) else {
            continue;
        };
        let held = text.lines().any(|line| {
            let mut words = line.split_whitespace();
            // "lock: -> 1: ..." lines are processes waiting for it.
            line.starts_with("lock:")
                && !line.contains("->")
                && words.any(|w| w == "OFDLCK")
                && words.nth(3).is_some_and(|w| w == want)
        });
        if held {
            return Some(true);
        }
    }
    Some(false)
}

/// The command line of `pid`, blank-separated and shortened; its `comm`
/// in brackets if it has none (a zombie, a kernel thread).
fn command_of(pid: u32) -> String {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let args: Vec<String> = cmdline
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let mut text = if args.is_empty() {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        format!("[{}]", comm.trim())
    } else {
        args.join(" ")
    };
    if text.chars().count() > COMMAND_CHARS_MAX {
        text = text.chars().take(COMMAND_CHARS_MAX).collect::<String>() + "...";
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_message_names_holders_or_says_why_not() {
        let b = PoolBusy {
            exclusive: true,
            holders: vec![Holder {
                pid: 1,
                command: "inkfs mount /p /m".into(),
            }],
            hidden: false,
            finishing: false,
        };
        assert_eq!(b.to_string(), "pool in use by pid 1 (inkfs mount /p /m)");
        let b = PoolBusy {
            holders: Vec::new(),
            hidden: true,
            exclusive: false,
            ..b
        };
        let text = b.to_string();
        assert!(
            text.starts_with("pool open read-only by another process (not visible to uid"),
            "{text}"
        );
    }

    #[test]
    fn lock_line_parsing_matches_only_the_inode() {
        let dir = tempfile::tempdir_in("/dev/shm").expect("tempdir");
        let path = dir.path().join("p");
        std::fs::write(&path, b"x").expect("write");
        let file = PoolFile::open(
            &path,
            &OpenOptions {
                create_size_bytes: None,
                read_only: false,
            },
        )
        .expect("open");
        let meta = file.file().metadata().expect("stat");
        let (holders, _) = find_holders(meta.dev(), meta.ino());
        let me = std::process::id();
        assert!(holders.iter().any(|h| h.pid == me), "{holders:?}");
        let (others, _) = find_holders(meta.dev(), meta.ino() + 1_000_000);
        assert!(!others.iter().any(|h| h.pid == me), "{others:?}");
    }
}
