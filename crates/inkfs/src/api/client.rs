//! A read-only client of a mount server: this process reads the pool an
//! `inkfs mount` serves straight from its own mapping, without a round
//! trip through the kernel (docs/KERNEL-FREE.md; stage 2, reads only).
//!
//! [`attach`] finds the mount a path is on, asks its server on the control
//! socket ([`super::attach`]), and gets the pool's descriptor (sharing the
//! server's claim), the shared epoch table and a slot in it. The pool is
//! mapped read-only, and the engine over it (`Fs::attach`) checks
//! each inode against its record before use, so every call sees a state
//! some commit of the server produced. Each call pins the client's epoch
//! slot for its length: blocks the server frees meanwhile stay out of the
//! free lists until the call is over. Writing calls get EROFS (writes
//! under leases are later work).
//!
//! Coherence: in strict and sync modes the pool is current when a write
//! through the mount returns, so a client sees it from its next call on.
//! In sync mode an overwrite is made in place, so a read that runs while
//! the overwrite does may see part of it (as a read racing a write on most
//! file systems); in strict mode it never does. Posix mode is refused by
//! the server: its writes may wait in the kernel's page cache.
//!
//! A client is one thread's (`Send`, not `Sync`): its one epoch slot is
//! pinned by one call at a time. Attach once per thread.

use std::cell::Cell;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::attach::{self as wire, Answer, Grant};
use super::{File, Filesystem, Follow, OpenFlags, ROOT_INO};
use crate::error::{errno, Error, Result};
use crate::fs::Fs;
use crate::perm::Credentials;
use crate::pmem::{MappedPool, PoolFile, PoolOpenOptions};
use crate::shm::SharedEpochs;
use crate::types::{Attr, DirEntry, Mode};

/// How long the server has to answer an attach.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// A read-only client of the inkfs mount a path is on.
pub struct Client {
    fs: Filesystem<MappedPool>,
    epochs: SharedEpochs,
    grant: Grant,
    mountpoint: PathBuf,
    /// The session: the server reaps this client when it closes.
    conn: UnixStream,
    /// A call is running (and pinned): nested calls reuse its pin.
    pinned: Cell<bool>,
}

/// Attach to the inkfs mount that `path` is on (found in
/// /proc/self/mountinfo): ENOTSUP if it is on none, EIO with the server's
/// reason if the server refuses.
pub fn attach(path: &Path) -> Result<Client> {
    let (mountpoint, owner) = mount_of(path)?;
    Client::attach_mountpoint(&mountpoint, owner)
}

impl Client {
    /// Attach to the server of the inkfs mount at `mountpoint` (absolute,
    /// canonical), run by uid `owner` if known (its socket is in that
    /// user's run directory).
    pub fn attach_mountpoint(mountpoint: &Path, owner: Option<u32>) -> Result<Client> {
        let sock = find_socket(mountpoint, owner).ok_or_else(|| {
            refused(
                mountpoint,
                "no control socket: not an inkfs mount, or its server is gone",
            )
        })?;
        let mut conn = UnixStream::connect(&sock).map_err(|e| {
            refused(
                mountpoint,
                &format!("connecting to {}: {e}", sock.display()),
            )
        })?;
        conn.set_read_timeout(Some(ANSWER_TIMEOUT))?;
        conn.set_write_timeout(Some(ANSWER_TIMEOUT))?;
        // A server that refuses at once (busy) may close before reading
        // the request: the answer still counts, so a failed send is only
        // reported when there is none. MSG_NOSIGNAL: no SIGPIPE for the
        // program this library runs in.
        let sent = wire::send_request(&conn);
        let (grant, pool_fd, epochs_fd) = match (wire::recv_grant(&mut conn), sent) {
            (Ok(granted), _) => granted,
            (Err(refusal @ Answer::Refused(_)), _) => {
                return Err(refused(mountpoint, &refusal.to_string()))
            }
            // No answer, and the request did not go out: that is why.
            (Err(_), Err(e)) | (Err(Answer::Io(e)), Ok(())) => return Err(Error::Io(e)),
            (Err(other), Ok(())) => return Err(refused(mountpoint, &other.to_string())),
        };
        // The session is idle from here on: no timeouts on it.
        conn.set_read_timeout(None)?;
        conn.set_write_timeout(None)?;
        let epochs = SharedEpochs::from_fd(epochs_fd)?;
        let label = mountpoint.join("(pool of this mount)");
        let file = PoolFile::from_fd(pool_fd, &label)?;
        let ro = PoolOpenOptions {
            create_size_bytes: None,
            read_only: true,
        };
        let pm = MappedPool::map(file, &ro)?;
        // Attaching reads the root's log: pinned, like any call.
        let fs = {
            let _pin = epochs
                .pin_at(grant.slot)
                .ok_or_else(|| refused(mountpoint, "epoch slot out of range"))?;
            Fs::attach(pm, grant.mode)?
        };
        Ok(Client {
            fs: Filesystem { fs },
            epochs,
            grant,
            mountpoint: mountpoint.to_path_buf(),
            conn,
            pinned: Cell::new(false),
        })
    }

    /// The number the server gave this client.
    pub fn id(&self) -> u64 {
        self.grant.id
    }
    /// The epoch slot this client pins.
    pub fn slot(&self) -> usize {
        self.grant.slot
    }
    /// The mount's consistency mode.
    pub fn mode(&self) -> Mode {
        self.grant.mode
    }
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Whether the server still holds this client's session (false once it
    /// unmounted or died: the pool then stays as it last committed it, and
    /// nobody else can mount it while this client holds its descriptor).
    pub fn server_alive(&self) -> bool {
        use nix::sys::socket::{recv, MsgFlags};
        use std::os::fd::AsRawFd;
        let mut b = [0u8; 1];
        let flags = MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT;
        match recv(self.conn.as_raw_fd(), &mut b, flags) {
            Ok(0) => false,
            Ok(_) => true,
            Err(e) => e == nix::errno::Errno::EAGAIN,
        }
    }

    /// Run `f` on the engine with this client's epoch pinned: the blocks
    /// `f` reads are not reused before it returns. Every call of the
    /// engine's API may be made in it; writing ones get EROFS.
    pub fn call<R>(&self, f: impl FnOnce(&Filesystem<MappedPool>) -> R) -> R {
        if self.pinned.get() {
            return f(&self.fs);
        }
        // The slot index was checked at attach.
        let _pin = self.epochs.pin_at(self.grant.slot);
        self.pinned.set(true);
        let _unset = Unset(&self.pinned);
        f(&self.fs)
    }

    /// The inode `path` names (a path on the host: absolute, or relative
    /// to the current directory), which must be on this client's mount.
    pub fn resolve_path(&self, cred: &Credentials, path: &Path, follow: Follow) -> Result<Attr> {
        let abs = std::path::absolute(path)?;
        let Ok(rel) = abs.strip_prefix(&self.mountpoint) else {
            return errno(libc::EXDEV);
        };
        use std::os::unix::ffi::OsStrExt;
        let rel = rel.as_os_str().as_bytes();
        let rel: &[u8] = if rel.is_empty() { b"." } else { rel };
        self.call(|fs| fs.resolve(cred, ROOT_INO, rel, follow))
    }

    /// `name` in directory `dir`.
    pub fn lookup(&self, cred: &Credentials, dir: u64, name: &[u8]) -> Result<Attr> {
        self.call(|fs| fs.lookup(cred, dir, name))
    }

    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        self.call(|fs| fs.getattr(ino))
    }

    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        self.call(|fs| fs.readlink(ino))
    }

    /// Open inode `ino`; a write access mode or `O_TRUNC` gets EROFS.
    pub fn open(&self, cred: &Credentials, ino: u64, flags: OpenFlags) -> Result<File> {
        self.call(|fs| fs.open(cred, ino, flags))
    }

    pub fn read(&self, file: &File, off: u64, buf: &mut [u8]) -> Result<usize> {
        self.call(|fs| fs.read(file, off, buf))
    }

    pub fn release(&self, file: File) {
        self.call(|fs| fs.release(file))
    }

    pub fn opendir(&self, cred: &Credentials, ino: u64) -> Result<File> {
        self.call(|fs| fs.opendir(cred, ino))
    }

    /// The entries of an open directory after `cookie` (as
    /// [`Filesystem::readdir`]), in one pinned call.
    pub fn readdir(
        &self,
        dir: &File,
        cookie: u64,
        f: &mut dyn FnMut(DirEntry) -> bool,
    ) -> Result<()> {
        self.call(|fs| fs.readdir(dir, cookie, f))
    }

    /// Writing is not served yet: EROFS.
    pub fn write(&self, _file: &File, _off: u64, _data: &[u8]) -> Result<usize> {
        errno(libc::EROFS)
    }
}

/// Clears the "pinned" mark when a call ends, however it ends.
struct Unset<'a>(&'a Cell<bool>);

impl Drop for Unset<'_> {
    fn drop(&mut self) {
        self.0.set(false);
    }
}

fn refused(mountpoint: &Path, why: &str) -> Error {
    Error::Io(std::io::Error::other(format!(
        "attaching to the inkfs mount {}: {why}",
        mountpoint.display()
    )))
}

/// The control socket of the server of `mountpoint`: in root's run
/// directory, this user's, or the mount owner's.
fn find_socket(mountpoint: &Path, owner: Option<u32>) -> Option<PathBuf> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    let mut dirs = vec![PathBuf::from(wire::RUN_DIR)];
    for uid in [Some(euid), owner].into_iter().flatten() {
        dirs.push(PathBuf::from(format!("/tmp/inkfs-{uid}")));
    }
    dirs.iter()
        .map(|d| wire::socket_path(d, mountpoint))
        .find(|p| p.exists())
}

/// The FUSE mount `path` is on, and its owner (user_id=): the mount point
/// in /proc/self/mountinfo that is the longest prefix of the canonical
/// path. ENOTSUP if that mount is not a FUSE one.
pub fn mount_of(path: &Path) -> Result<(PathBuf, Option<u32>)> {
    let path = path.canonicalize()?;
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    let best = info
        .lines()
        .filter_map(parse_mountinfo)
        .filter(|m| path.starts_with(&m.0))
        .max_by_key(|m| m.0.as_os_str().len());
    match best {
        Some((mnt, fstype, owner)) if fstype.starts_with("fuse.") => Ok((mnt, owner)),
        _ => errno(libc::ENOTSUP),
    }
}

/// One mountinfo line: mount point, file system type, user_id option.
fn parse_mountinfo(line: &str) -> Option<(PathBuf, String, Option<u32>)> {
    let (left, right) = line.split_once(" - ")?;
    let target = unescape(left.split(' ').nth(4)?);
    let mut right = right.split(' ');
    let fstype = right.next()?.to_string();
    let options = right.nth(1).unwrap_or("");
    let owner = options
        .split(',')
        .find_map(|o| o.strip_prefix("user_id="))
        .and_then(|u| u.parse().ok());
    Some((PathBuf::from(target), fstype, owner))
}

/// mountinfo writes blanks, tabs, newlines and backslashes as octal
/// escapes (\040, \011, \012, \134).
fn unescape(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines() {
        let l = "36 35 0:31 / /mnt/a\\040b rw,nosuid - fuse.inkfs /dev/shm/p rw,user_id=1000,group_id=1000";
        let (m, t, o) = parse_mountinfo(l).unwrap();
        assert_eq!(m, Path::new("/mnt/a b"));
        assert_eq!(t, "fuse.inkfs");
        assert_eq!(o, Some(1000));
        assert!(parse_mountinfo("garbage").is_none());
    }

    #[test]
    fn a_path_on_no_fuse_mount_is_enotsup() {
        let e = attach(Path::new("/proc/self")).err().expect("refused");
        assert_eq!(e.errno(), libc::ENOTSUP);
    }
}
