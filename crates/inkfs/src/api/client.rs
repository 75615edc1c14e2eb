//! A client of a mount server: this process reads the pool an `inkfs
//! mount` serves straight from its own mapping, without a round trip
//! through the kernel, and writes the data of regular files under write
//! leases (docs/KERNEL-FREE.md; stage 2).
//!
//! [`attach`] finds the mount a path is on, asks its server on the control
//! socket ([`super::attach`]), and gets the pool's descriptor (sharing the
//! server's claim), the shared epoch table and a slot in it. The pool is
//! mapped read-only, and the engine over it (`Fs::attach`) checks
//! each inode against its record before use (but an inode whose lease
//! it holds: nobody else changes that record, `Fs::client_mark_current`),
//! so every call sees a state some commit of the server produced. Each call that reads the pool pins
//! the client's epoch slot for its length: blocks the server frees
//! meanwhile stay out of the free lists until the call is over.
//!
//! Writes ([`Client::write`], [`Client::pwrite`], [`Client::append`],
//! [`Client::truncate`], an `O_TRUNC` open) take the inode's write lease
//! from the server first (kept until the server recalls it) and use blocks
//! the server reserved for this client; they commit exactly as the engine
//! does, so they are durable and (strict mode) atomic on return. A thread
//! of the client reads the session: answers to its requests, and recalls,
//! which another thread answers once the write in flight on the inode is
//! over (`inkfs::api::lease` has the messages). Everything else that
//! changes the file system (namespace, chmod, chown, xattrs) is the
//! server's: [`Client::ns`] asks it to make such a change with given
//! credentials (`inkfs::api::ns`); through [`Client::call`] those calls get
//! EROFS. Requests that wait for an answer travel on the client's ring
//! (`inkfs::api::ring`), recalls and their answers on the session.
//!
//! A hybrid pool's grant hands the data device over too: the client reads
//! large files' data there with `pread`, and writes it there itself under
//! the lease (device blocks reserved with `reserve-dev`, written, flushed,
//! then committed).
//!
//! Coherence: in strict and sync modes the pool is current when a write
//! through the mount returns, so a client sees it from its next call on.
//! In sync mode an overwrite is made in place, so a read that runs while
//! the overwrite does may see part of it (as a read racing a write on most
//! file systems); in strict mode it never does. Posix mode is refused by
//! the server: its writes may wait in the kernel's page cache.
//!
//! A client is one per process and mount, shared by the process's threads
//! (`Sync`): one engine and its caches, one session, one set of leases and
//! one reservation. Each thread pins a word of the client's epoch slot of
//! its own, and takes one of its request rings for each round trip
//! (`super::lanes`).

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use super::attach::{self as wire, Answer, Grant};
use super::dirlease::{DirLeases, KernelView};
use super::lanes::{Class, PinWords, RingLanes};
use super::lease::{Msg, LINE_MAX};
use super::ns;
use super::ring::RingSet;
use super::{File, Filesystem, Follow, OpenFlags, Written, ROOT_INO};
use crate::blockdev::{BlockDev, FileDev, Side};
use crate::error::{errno, Error, Result};
use crate::fs::Fs;
use crate::inthash::IntMap;
use crate::perm::Credentials;
use crate::pmem::{MappedPool, PoolFile, PoolOpenOptions};
use crate::shm::SharedEpochs;
use crate::types::{Attr, DirEntry, FileKind, Mode, SetAttr};

/// When to ask for a directory's lease.
mod ask;
/// Attribute changes of a leased directory, made by the client.
mod attr;
/// Finding the server of a path: its FUSE mount and control socket.
mod discover;
/// Creates under a directory lease, and its give-back.
mod local;
/// Directories made under a directory lease.
mod mkdir;
/// Removals under a directory lease.
mod remove;

pub use discover::mount_of;
use discover::{find_socket, refused};

pub use ask::{AskTable, Ended, ASK_AFTER_MAX, ASK_AFTER_MIN};

/// Whether a namespace request through the ring asks for its
/// directory's lease (`ask`).
#[derive(Clone, Copy)]
enum Ask {
    Never,
    Always,
    Adaptive,
}

/// `INKFS_CLIENT_CHANNEL=session`: requests on the session's socket
/// instead of the rings (to measure one against the other), one at a time
/// per process: with one thread only (a namespace request waiting there
/// for a recall of this client's lease may wait for a lease request
/// queued behind it, which holds the lease cell the recall needs).
pub const CHANNEL_ENV: &str = "INKFS_CLIENT_CHANNEL";

/// How long the server has to answer an attach.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);
/// Blocks asked for at a time for the reservation (4 MiB); a write that
/// needs more asks for what it needs.
const RESERVE_BLOCKS: u64 = 1024;
/// Below this many free PM blocks in the reservation, a write wakes the
/// reserve thread to ask for [`RESERVE_BLOCKS`] more, so the write that
/// would have run dry finds them there instead of waiting for the server
/// (a round trip, and populating the new blocks' pages: ~1.3 ms).
const REFILL_AHEAD_BELOW: u64 = RESERVE_BLOCKS / 2;
/// A write that found no space asks for more this many times before it
/// reports ENOSPC.
const RESERVE_TRIES: u32 = 3;
/// PM blocks a write to the data device wants at hand for its log pages;
/// fewer, and the refill asks for PM blocks too.
const LOG_BLOCKS_MIN: u64 = 16;

/// An inode a client holds (see [`Client::hold`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hold {
    pub slot: usize,
    pub entry: usize,
    pub ino: u64,
}

/// A client of the inkfs mount a path is on.
pub struct Client {
    shared: Arc<Shared>,
    /// Requests that wait for an answer go to one of these
    /// (`super::ring`), taken by the asking thread for the round trip...
    rings: RingSet,
    lanes: RingLanes,
    /// ...unless `INKFS_CLIENT_CHANNEL=session` asked for the session
    /// (measurements of one against the other).
    use_ring: bool,
    epochs: Arc<SharedEpochs>,
    grant: Grant,
    mountpoint: PathBuf,
    /// The session: the server reaps this client when it closes.
    conn: UnixStream,
    /// The words of this client's epoch slot its threads pin.
    pins: Arc<PinWords>,
    /// The last namespace request's number.
    seq: AtomicU64,
    /// The session's reader and the recall thread.
    threads: Vec<std::thread::JoinHandle<()>>,
    /// The process that attached (a child after fork has neither the
    /// threads nor the session of its own).
    pid: u32,
}

/// What the client's threads share.
struct Shared {
    fs: Filesystem<MappedPool>,
    /// The session, for sending (one message at a time).
    out: Mutex<UnixStream>,
    /// The answer to the request in flight.
    answer: Mutex<Option<Msg>>,
    answered: Condvar,
    /// The server closed the session.
    closed: AtomicBool,
    /// Per inode: whether this client holds its lease; locked for the
    /// whole of a write, so a recall waits for the write in flight. By
    /// inode number in [`LEASE_SHARDS`] maps: threads writing different
    /// files rarely meet on one lock.
    leases: [Mutex<IntMap<Arc<Mutex<LeaseState>>>>; LEASE_SHARDS],
    /// One request at a time on the session (`INKFS_CLIENT_CHANNEL=session`).
    asking: Mutex<()>,
    /// Leases held now.
    held: AtomicUsize,
    /// One reservation request at a time: threads that ran out together
    /// wait for the first one's blocks instead of each asking (48 threads
    /// asking 2048 blocks each at once took a small pool's last blocks,
    /// and the server's own creates failed with ENOSPC).
    refilling: Mutex<()>,
    /// Reservations received so far: a thread that found no space sees,
    /// once it has `refilling`, whether another thread refilled meanwhile.
    refills: AtomicU64,
    /// Writes to the session so far (each a system call the server answers
    /// or reads): what a served write or fsync should not cost.
    sent: AtomicUsize,
    /// Lines written to the session so far (counted under `out`, after
    /// each write): a lease given back with a removal request names how
    /// many the server must have read first (`ns::Give`).
    lines: AtomicU64,
    /// The server takes leases given back with removal requests (its
    /// grant said `gives=1`).
    gives: bool,
    /// The directory leases it holds (`super::dirlease`).
    dirs: DirLeases,
    /// The reservation's refill ahead of need (`Shared::refill_ahead`).
    refill: Refill,
}

/// The reserve thread and its one pending request. A write that leaves
/// the reservation low sets `pending` and unparks the thread (once per
/// refill, not per write); the thread asks the server on the session,
/// adds what it got, and clears `pending`. The blocks are this client's
/// from the moment the server sends them, exactly as a write's own
/// reservation: the server takes them back at the session's end or the
/// client's death, whether or not the thread added them yet.
#[derive(Default)]
struct Refill {
    pending: AtomicBool,
    thread: std::sync::OnceLock<std::thread::Thread>,
    /// Refills a write waited for (it found the reservation empty).
    waited: AtomicUsize,
    /// A write of this client went to the data device (a hybrid pool):
    /// the device side is refilled ahead too from then on.
    dev_writer: AtomicBool,
}

impl Refill {
    /// The session is closed (set before): the reserve thread ends.
    fn stop(&self) {
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }
}

/// Shards of the lease table.
const LEASE_SHARDS: usize = 16;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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
        let conn = UnixStream::connect(&sock).map_err(|e| {
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
        let mut conn = UnixStream::from(high(conn.into())?);
        let granted = match (wire::recv_grant(&mut conn), sent) {
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
        let wire::Granted {
            grant,
            pool: pool_fd,
            epochs: epochs_fd,
            ring,
            data: data_fd,
        } = granted;
        let epochs = Arc::new(SharedEpochs::from_fd(high(epochs_fd)?)?);
        let rings = RingSet::from_fd(high(ring)?)?;
        let pool_fd = high(pool_fd)?;
        let label = mountpoint.join("(pool of this mount)");
        let file = PoolFile::from_fd(pool_fd, &label)?;
        // A hybrid pool: the server's data device, read and written by
        // this client as the server does (the engine checks its label).
        let data = match (data_fd, grant.data_threshold) {
            (Some(fd), Some(threshold)) => {
                let label = mountpoint.join("(data device of this mount)");
                let dev: Arc<dyn BlockDev> = Arc::new(FileDev::from_shared_fd(high(fd)?, &label)?);
                Some((dev, threshold))
            }
            _ => None,
        };
        // Writable when the server's own descriptor is (a read-only mount
        // leases nothing).
        let writable = !file.is_read_only();
        let opts = PoolOpenOptions {
            create_size_bytes: None,
            read_only: !writable,
        };
        let pm = MappedPool::map(file, &opts)?;
        // Attaching reads the root's log: pinned, like any call.
        let fs = {
            let _pin = epochs
                .pin_at(grant.slot)
                .ok_or_else(|| refused(mountpoint, "epoch slot out of range"))?;
            if writable {
                Fs::attach_client_with(pm, grant.mode, data)?
            } else {
                Fs::attach_with(pm, grant.mode, data)?
            }
        };
        // Blocks this client's overwrites displace are kept for the same
        // file's next overwrites once no other reader can hold them.
        fs.client_use_epochs(epochs.clone(), grant.slot);
        // A hybrid pool: device writes announced, the cache checked (it
        // keeps nothing before this; attaching read no device block).
        fs.data_use_stamps(epochs.clone());
        let shared = Arc::new(Shared {
            fs: Filesystem { fs },
            out: Mutex::new(clone_high(&conn)?),
            answer: Mutex::new(None),
            answered: Condvar::new(),
            closed: AtomicBool::new(false),
            leases: std::array::from_fn(|_| Mutex::default()),
            asking: Mutex::new(()),
            held: AtomicUsize::new(0),
            refilling: Mutex::new(()),
            refills: AtomicU64::new(0),
            sent: AtomicUsize::new(0),
            lines: AtomicU64::new(0),
            gives: grant.gives,
            dirs: DirLeases::default(),
            refill: Refill::default(),
        });
        let threads = start_threads(&shared, clone_high(&conn)?)?;
        let use_ring = std::env::var_os(CHANNEL_ENV).is_none_or(|v| v != "session");
        Ok(Client {
            shared,
            rings,
            lanes: RingLanes::new(),
            use_ring,
            pins: PinWords::new(epochs.clone(), grant.slot),
            epochs,
            grant,
            mountpoint: mountpoint.to_path_buf(),
            conn,
            seq: AtomicU64::new(0),
            threads,
            pid: std::process::id(),
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
        if self.shared.closed.load(SeqCst) {
            return false;
        }
        let mut b = [0u8; 1];
        let flags = MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT;
        match recv(self.conn.as_raw_fd(), &mut b, flags) {
            // The end of file: once the session's reader has seen it too,
            // writes fail with EIO (a short wait, only when the server is
            // gone).
            Ok(0) => {
                for _ in 0..1000 {
                    if self.shared.closed.load(SeqCst) {
                        break;
                    }
                    std::thread::sleep(Duration::from_micros(100));
                }
                false
            }
            // A message the reader has not taken yet.
            Ok(_) => true,
            Err(e) => e == nix::errno::Errno::EAGAIN,
        }
    }

    /// Whether this client's session has ended (its reader saw the end of
    /// file): no system call, unlike [`Client::server_alive`].
    pub fn session_closed(&self) -> bool {
        self.shared.closed.load(SeqCst)
    }

    /// Write leases this client holds now.
    pub fn leases_held(&self) -> usize {
        self.shared.held.load(SeqCst)
    }

    /// Directory leases this client holds now (`super::dirlease`).
    pub fn dir_leases_held(&self) -> usize {
        self.shared.dirs.count()
    }

    /// The grant this client holds on directory `dir`'s lease, and what
    /// the kernel held under `dir` then.
    pub fn dir_lease(&self, dir: u64) -> Option<(u64, KernelView)> {
        self.shared.dirs.held(dir)
    }

    /// Recalls of directory leases this client answered so far.
    pub fn dir_recalls(&self) -> u64 {
        self.shared.dirs.recalls()
    }

    /// Messages this client has written to its session so far (requests,
    /// returned blocks, answers to recalls): each a system call and work
    /// for the server, which a served write or fsync avoids.
    pub fn messages_sent(&self) -> usize {
        self.shared.sent.load(SeqCst)
    }

    /// Reservation refills a write of this client waited for, having found
    /// no space (the reserve thread's refills ahead of need are not).
    pub fn refills_waited_for(&self) -> usize {
        self.shared.refill.waited.load(Relaxed)
    }

    /// Whether a refill ahead of need is on its way (asked for and not yet
    /// added to the reservation).
    pub fn refilling(&self) -> bool {
        self.shared.refill.pending.load(SeqCst)
    }

    /// Run `f` on the engine with this client's epoch pinned: the blocks
    /// `f` reads are not reused before it returns. Every call of the
    /// engine's API may be made in it; writing ones get EROFS.
    pub fn call<R>(&self, f: impl FnOnce(&Filesystem<MappedPool>) -> R) -> R {
        // This thread's word of the slot (nested calls reuse its pin).
        let _pin = self.pins.pin();
        f(&self.shared.fs)
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

    /// Open inode `ino` (the permission rules of open(2)); `O_TRUNC`
    /// truncates under the inode's write lease, whatever the access mode
    /// (Linux truncates at `O_RDONLY|O_TRUNC` too, given write
    /// permission). A write access mode gets EROFS on a read-only mount.
    pub fn open(&self, cred: &Credentials, ino: u64, flags: OpenFlags) -> Result<File> {
        let is_file = || self.getattr(ino).is_ok_and(|a| a.kind == FileKind::File);
        if flags.has(libc::O_TRUNC) && is_file() {
            return self.leased(ino, None, 0, |fs| fs.open(cred, ino, flags));
        }
        if flags.writable() {
            // Opening writes nothing: only the engine's read-only check
            // is lifted.
            let _w = self.shared.fs.fs.client_writes();
            return self.call(|fs| fs.open(cred, ino, flags));
        }
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

    /// write(2)/pwrite(2) as a process makes it (at the end of file if the
    /// file is `O_APPEND`, else at `off`), under the inode's write lease:
    /// the bytes written.
    pub fn write(&self, file: &File, off: u64, data: &[u8]) -> Result<usize> {
        self.file_op(file, data.len() as u64, |fs| fs.write(file, off, data))
            .map(|w| w.len)
    }

    /// pwrite(2): at `off` whatever `O_APPEND` says.
    pub fn pwrite(&self, file: &File, off: u64, data: &[u8]) -> Result<Written> {
        self.file_op(file, data.len() as u64, |fs| fs.write_at(file, off, data))
    }

    /// An `O_APPEND` write: at the end of file as it stands under the
    /// lease (so appends of several clients interleave whole).
    pub fn append(&self, file: &File, data: &[u8]) -> Result<Written> {
        self.file_op(file, data.len() as u64, |fs| fs.append(file, data))
    }

    /// ftruncate(2) through `file` (open for writing).
    pub fn truncate(&self, cred: &Credentials, file: &File, size: u64) -> Result<Attr> {
        let set = SetAttr {
            size: Some(size),
            ..SetAttr::default()
        };
        self.file_op(file, 0, |fs| fs.setattr(cred, file.ino(), &set, Some(file)))
    }

    /// A change of the regular file open as `file` (writing `bytes` of
    /// data): under its lease when the file is open for writing; otherwise
    /// the engine refuses it as Linux does (EBADF, EISDIR, EINVAL...)
    /// without asking the server.
    fn file_op<R>(
        &self,
        file: &File,
        bytes: u64,
        op: impl Fn(&Filesystem<MappedPool>) -> Result<R>,
    ) -> Result<R> {
        if file.kind() != FileKind::File || !file.flags().writable() {
            return self.call(&op);
        }
        self.leased(file.ino(), Some(file), bytes, op)
    }

    /// fsync(2)/fdatasync(2): every write is durable on return already
    /// (strict and sync modes), so this asks nothing of the server: the
    /// blocks this client freed go back in batches (`Fs::client_freed_due`)
    /// and at each recall, not per call (a message per fsync was most of a
    /// durable write's time: a system call, and the server woken). Nor
    /// does it pin the epoch slot when the engine's fsync has nothing to do
    /// (`Filesystem::fsync_is_noop`: it reads no block then; the pin, a
    /// locked store and two thread-local lookups, was most of a served
    /// fdatasync's own time). A posix-mode pool (refused at attach) would
    /// write the log: pinned as any call.
    pub fn fsync(&self, file: &File, datasync: bool) -> Result<()> {
        if self.fsync_is_noop() {
            return self.shared.fs.fsync(file, datasync);
        }
        self.call(|fs| fs.fsync(file, datasync))
    }

    /// Whether [`Client::fsync`] has nothing to do on this client's pool
    /// (strict and sync mode: every write returned durable), whatever the
    /// file: a front end may answer fsync without finding the file's
    /// handle.
    pub fn fsync_is_noop(&self) -> bool {
        self.shared.fs.fsync_is_noop()
    }

    /// The lease cell of `ino`.
    fn lease_cell(&self, ino: u64) -> Arc<Mutex<LeaseState>> {
        self.shared.lease_cell(ino)
    }

    /// The lease cell of `file`'s inode as `file` keeps it for this
    /// client (set at its first write here): a write then skips the
    /// table's shard lock and the `Arc`'s count. Sound because a cell
    /// stays in the table for the client's life (a recall changes what
    /// it holds, never which cell it is), and keyed by this client's id:
    /// a forked child's copy of the file, used through the child's own
    /// client, finds the parent's id there and looks its cell up in the
    /// table. None when the file belongs to another client.
    fn file_cell<'f>(&self, file: &'f File) -> Option<&'f Mutex<LeaseState>> {
        let id = self.id();
        let (owner, cell) = file
            .client_cell()
            .get_or_init(|| (id, self.lease_cell(file.ino())));
        (*owner == id).then_some(&**cell)
    }

    /// Run `op`, which writes inode `ino` (open as `file`, if it is;
    /// `bytes` of data), under its write lease: asked for first if this
    /// client does not hold it; more reservation asked for when it finds
    /// no space.
    fn leased<R>(
        &self,
        ino: u64,
        file: Option<&File>,
        bytes: u64,
        op: impl Fn(&Filesystem<MappedPool>) -> Result<R>,
    ) -> Result<R> {
        debug_assert!(file.is_none_or(|f| f.ino() == ino));
        let looked_up;
        let cell = match file.and_then(|f| self.file_cell(f)) {
            Some(c) => c,
            None => {
                looked_up = self.lease_cell(ino);
                &*looked_up
            }
        };
        let mut held = lock(cell);
        if self.shared.closed.load(SeqCst) {
            // The server ended the session (it took every lease back
            // first): nothing may be written any more.
            return errno(libc::EIO);
        }
        if !held.held {
            match self.ask(&Msg::Lease(ino))? {
                Msg::Granted(i, gen) if i == ino => {
                    // A recall of this grant cannot have come first: it
                    // waits for this lock.
                    debug_assert!(gen > held.recalled);
                    held.take(gen, &self.shared.held);
                }
                Msg::Denied(i, e) if i == ino => return errno(e),
                other => return Err(protocol_error(&other)),
            }
        }
        let mut tries = 0;
        loop {
            // Read with the lease held, before the write checks the record.
            let count = self.shared.fs.fs.client_lease_count();
            let refills = self.shared.refills.load(SeqCst);
            let r = {
                let _w = self.shared.fs.fs.client_writes();
                self.call(&op)
            };
            if let (Ok(_), Some(f)) = (&r, file) {
                // Current now, and only this client changes it until the
                // lease goes back: later calls skip the record's check.
                self.shared.fs.fs.client_mark_current(&f.handle, count);
            }
            if self.shared.fs.fs.client_freed_due() {
                self.send_freed()?;
            }
            let log_due = || match file {
                Some(f) => self.shared.fs.fs.client_log_due_of(&f.handle),
                None => self.shared.fs.fs.client_log_due(ino),
            };
            if r.is_ok() && log_due() {
                // Mostly dead entries: the server collects the log once it
                // has the lease back (the next write asks for it again).
                // Given back: a create's answer naming this grant, which
                // the server may send until the `released` reaches it, is
                // not held again.
                let gen = held.gen;
                held.recalled = held.recalled.max(gen);
                held.drop_lease(&self.shared.held);
                self.shared.give_back(ino, gen, false);
            }
            if r.is_ok() {
                self.shared.refill_ahead_if_low(bytes);
            }
            match r {
                Err(e) if e.errno() == libc::ENOSPC && tries < RESERVE_TRIES => {
                    tries += 1;
                    // What this client freed goes back first: the server
                    // may have nothing else.
                    self.send_freed()?;
                    self.refill(bytes, tries, refills)?;
                }
                r => return r,
            }
        }
    }

    /// Ask the server to make namespace change `op` with credentials
    /// `cred` (docs/KERNEL-FREE.md, "Stage 4: the channel"): its answer,
    /// whose `errno` is the engine's (0: made). A create's write lease
    /// comes with it (held from now on unless recalled meanwhile). `Err`:
    /// the request could not be asked (too long for a line, the session
    /// closed): make the call through the mount instead.
    pub fn ns(&self, cred: &Credentials, op: ns::Op) -> Result<ns::Done> {
        self.ns_asking(cred, op, Ask::Never)
    }

    /// [`Client::ns`], asking for the lease of the directory the request
    /// names first too (`super::dirlease`; nothing asked of a server
    /// whose grant did not say `dirs=1`): the answer's `dir` says whether
    /// it was granted, and the client holds it until it is recalled or the
    /// client detaches.
    pub fn ns_dir_lease(&self, cred: &Credentials, op: ns::Op) -> Result<ns::Done> {
        self.ns_asking(cred, op, Ask::Always)
    }

    fn ns_asking(&self, cred: &Credentials, op: ns::Op, ask_dir: Ask) -> Result<ns::Done> {
        let seq = self.seq.fetch_add(1, SeqCst) + 1;
        if let Some(done) = self.create_under_lease(cred, seq, &op) {
            return Ok(done);
        }
        if let Some(done) = self.unlink_under_lease(cred, seq, &op) {
            return Ok(done);
        }
        if let Some(done) = self.mkdir_under_lease(cred, seq, &op) {
            return Ok(done);
        }
        let mut req = ns::Request {
            seq,
            cred: cred.clone(),
            op,
            give: Vec::new(),
            dir_lease: false,
            lane_lease: false,
        };
        if !req.fits() {
            return errno(libc::E2BIG);
        }
        let create = matches!(req.op, ns::Op::Create { .. });
        match &req.op {
            ns::Op::Unlink { dir, name } => req.give.extend(self.give_back_before_free(*dir, name)),
            // A rename uses the file it moves (its ctime) and the one at
            // the new name (replaced, or moved too by an exchange), even
            // when it is refused: git renames the lock file it just wrote
            // over its index (0.3-7 ms with the moved file's recall).
            ns::Op::Rename {
                dir,
                name,
                to_dir,
                to,
                ..
            } => {
                let from = self.give_back_before_free(*dir, name);
                let to = self.give_back_before_free(*to_dir, to);
                req.give.extend(from.into_iter().chain(to));
            }
            _ => {}
        }
        // After the give-backs: an unlink is counted toward the ask only
        // if it carries its file's (`ask::made_under_lease`).
        let asked = self
            .asks_dir(ask_dir, &req)
            .filter(|&d| self.shared.dirs.ask(d));
        req.dir_lease = asked.is_some();
        req.lane_lease = req.dir_lease && self.grant.lanes;
        let answer = self.ask(&Msg::Ns(req));
        if let Some(dir) = asked {
            let d = answer.as_ref().ok().and_then(|m| match m {
                Msg::Done(d) if d.seq == seq => Some(d),
                _ => None,
            });
            self.dir_answered(dir, d);
        }
        match answer? {
            Msg::Done(d) if d.seq == seq => {
                if create && d.errno == 0 && d.gen != 0 {
                    self.shared.granted_with_answer(d.ino, d.gen);
                }
                Ok(d)
            }
            other => Err(protocol_error(&other)),
        }
    }

    /// Before a request that removes name `name` of directory `dir` (or
    /// renames the file it names): if it names a regular file whose lease
    /// this client holds, give the
    /// lease back now (its returns and `released` on the session, ahead of
    /// the request), as a recall's answer would. The server's engine uses
    /// the inode to remove the name (its link count, or its free), and
    /// recalls its lease first (`LeaseHook::before_use`); answered here,
    /// the recall finds the `released` already sent (or settled) instead
    /// of waiting for this client's session reader and recall threads to
    /// wake (an unlink of a file the process wrote, as varmail's,
    /// webproxy's and fileserver's deletes, took 0.5 ms at the median with
    /// 100 threads on 2 cores). A request that fails gave it back for
    /// nothing: the next write asks for it again.
    ///
    /// With a server that takes them (`Grant::gives`), the lease goes back
    /// with the request itself (the returned [`ns::Give`]): no `released`
    /// on the session, which the server's session thread had to read and
    /// settle while the request's thread waited for it (an unlink cost
    /// 2.4-3× a create, bench/results-notes/nsdesign.md).
    fn give_back_before_free(&self, dir: u64, name: &[u8]) -> Option<ns::Give> {
        let a = self
            .call(|fs| fs.lookup(&Credentials::root(), dir, name))
            .ok()?;
        if a.kind != FileKind::File {
            return None;
        }
        let cell = lock(self.shared.lease_shard(a.ino)).get(&a.ino).cloned()?;
        // After the writes in flight, as a recall.
        let mut held = lock(&cell);
        if !held.held {
            return None;
        }
        let gen = held.gen;
        held.recalled = held.recalled.max(gen);
        held.drop_lease(&self.shared.held);
        if self.shared.gives {
            return Some(self.shared.give_with_request(a.ino, gen));
        }
        self.shared.give_back(a.ino, gen, false);
        None
    }

    /// chmod, chown, utimens of inode `ino` by this client, in the inode's
    /// log, if this client holds its write lease (docs/KERNEL-FREE.md,
    /// "Attribute changes by the lease holder"): `None` if it does not (ask
    /// the server: [`Client::ns`]). The engine's rules with `cred` (the
    /// owner for chmod and explicit times, set-id bits dropped by a chown,
    /// the inode's flags). `set` must not change the size.
    pub fn setattr_leased(
        &self,
        cred: &Credentials,
        ino: u64,
        set: &SetAttr,
    ) -> Option<Result<Attr>> {
        debug_assert!(set.size.is_none(), "a truncate is not an attribute change");
        if set.size.is_some() || !self.holds_lease(ino) {
            return None;
        }
        // Recalled since: `leased` asks for it again (correct, only slower).
        Some(self.leased(ino, None, 0, |fs| fs.setattr(cred, ino, set, None)))
    }

    /// Hold inode `ino` (docs/KERNEL-FREE.md, "Unlinked files a process
    /// holds open"): its number published in this client's slot, then
    /// checked still linked with generation `generation` (the one the
    /// lookup found). `None`: it is not (let the kernel open it), or this
    /// slot's holds are all taken. While held, the server frees it at no
    /// unlink.
    pub fn hold(&self, ino: u64, generation: u64) -> Option<Hold> {
        let entry = self.epochs.hold(self.grant.slot, ino)?;
        let hold = Hold {
            slot: self.grant.slot,
            entry,
            ino,
        };
        // After the hold's SeqCst store: the record, as the server left it.
        if self.call(|fs| fs.is_linked(ino, generation)) {
            Some(hold)
        } else {
            self.epochs.unhold(hold.slot, hold.entry, ino);
            None
        }
    }

    /// Let `hold` go (through any client of the mount: the table is
    /// shared). If its inode lost its last name meanwhile, the server is
    /// told, so that it frees it now (it also looks every 50 ms).
    pub fn unhold(&self, hold: Hold) {
        self.epochs.unhold(hold.slot, hold.entry, hold.ino);
        std::sync::atomic::fence(SeqCst);
        let orphan = self.call(|fs| fs.is_orphan(hold.ino).unwrap_or(false));
        if orphan {
            let _ = self.shared.send(&Msg::Unheld(hold.ino));
        }
    }

    /// Send a request on the ring and wait for its answer (EIO if the
    /// server is gone).
    fn ask(&self, msg: &Msg) -> Result<Msg> {
        if self.shared.closed.load(SeqCst) {
            return errno(libc::EIO);
        }
        if !self.use_ring {
            let _one = lock(&self.shared.asking);
            return self.shared.request(msg.clone());
        }
        let line = msg.line();
        // A ring of this thread's for the round trip (a new one is asked
        // for on the session when all those served are busy); a namespace
        // request never takes the lease requests' ring (`lanes::LEASE_RING`).
        let class = match msg {
            Msg::Ns(_) => Class::Ns,
            _ => Class::Lease,
        };
        let lane = self
            .lanes
            .take(class, |k| self.shared.send(&Msg::Lane(k as u32)).is_ok())
            .ok_or(Error::Errno(libc::EIO))?;
        let ring = self.rings.ring(lane.k).ok_or(Error::Errno(libc::EIO))?;
        let answer = ring
            .call(line.as_bytes(), || self.shared.closed.load(SeqCst))
            .map_err(Error::Io)?;
        drop(lane);
        let text = std::str::from_utf8(&answer).map_err(|_| Error::Errno(libc::EIO))?;
        Msg::parse(text.trim_end()).ok_or_else(|| {
            Error::Io(std::io::Error::other(format!(
                "the server's answer {text:?} is not a message"
            )))
        })
    }

    /// Whether this client holds `ino`'s write lease now.
    pub fn holds_lease(&self, ino: u64) -> bool {
        let cell = lock(self.shared.lease_shard(ino)).get(&ino).cloned();
        cell.is_some_and(|c| lock(&c).held)
    }

    /// Request rings served for this client now (one until two threads ask
    /// at once).
    pub fn rings_served(&self) -> usize {
        self.lanes.started()
    }

    /// Ask for the blocks a write of `bytes` found missing: its data's
    /// side (a hybrid pool's data device for a write the placement puts
    /// there), and PM for its log pages. A side the server has too few
    /// blocks of is marked full in the engine, whose writes then spill to
    /// the other (as the server's own do).
    /// `seen`: the reservations received before the write that found no
    /// space; if another's came since (a thread's that ran out too, or
    /// the reserve thread's refill ahead of need), the write tries again
    /// without asking.
    fn refill(&self, bytes: u64, tries: u32, seen: u64) -> Result<()> {
        let _one = lock(&self.shared.refilling);
        if self.shared.refills.load(SeqCst) != seen {
            return Ok(());
        }
        self.shared.refill.waited.fetch_add(1, Relaxed);
        let fs = &self.shared.fs.fs;
        let blocks = blocks_for(bytes);
        let want = blocks.max(RESERVE_BLOCKS) << tries;
        if fs.place(bytes) == Side::Dev {
            let (pm_free, dev_free) = fs.reservation_free();
            let dev_short = dev_free < blocks;
            if dev_short {
                self.reserve(Side::Dev, want)?;
            }
            if pm_free < LOG_BLOCKS_MIN || !dev_short {
                self.reserve(Side::Pm, RESERVE_BLOCKS)?;
            }
            return Ok(());
        }
        match self.reserve(Side::Pm, want) {
            Err(e) if e.errno() == libc::ENOSPC && fs.is_hybrid() => {
                fs.set_client_side_full(Side::Pm, true);
                self.reserve(Side::Dev, want)
            }
            r => r,
        }
    }

    /// Ask for `want` more blocks on `side`: ENOSPC if the server has none
    /// (for the data device: on neither side; it gives PM blocks when the
    /// device is full). A side that gave fewer than asked for is full for
    /// this client until a later request gets all it asks for.
    fn reserve(&self, side: Side, want: u64) -> Result<()> {
        let ask = match side {
            Side::Pm => Msg::Reserve(want),
            Side::Dev => Msg::ReserveDev(want),
        };
        match self.ask(&ask)? {
            Msg::Blocks(ranges) => self.shared.add_granted(side, want, &ranges),
            Msg::NoSpace => errno(libc::ENOSPC),
            other => Err(protocol_error(&other)),
        }
    }

    /// Send the blocks this client freed to the server.
    fn send_freed(&self) -> Result<()> {
        let freed = self.shared.fs.fs.take_client_freed();
        self.shared.send_ranges(&freed, None, &[])
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        if std::process::id() != self.pid {
            // A forked child's copy: the session and the threads are the
            // parent's (a shutdown would end the parent's session). Only
            // the descriptors close.
            for t in self.threads.drain(..) {
                std::mem::forget(t);
            }
            return;
        }
        // Directory leases first, the lane with the last (`super::dirlease`).
        self.give_back_dirs();
        // The reservation's unused blocks, freed at once (at the session's
        // end they would go through the server's limbo); a refill landing
        // after this goes with the rest, settled at the session's end.
        let fs = &self.shared.fs.fs;
        let _ = self
            .shared
            .send_ranges(&fs.take_client_freed(), None, &fs.drain_reservation());
        let _ = self.conn.shutdown(std::net::Shutdown::Both);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// One inode's cell in a client's lease table, shared with the files
/// that keep it (`File::client_cell`).
pub(crate) type LeaseCell = Arc<Mutex<LeaseState>>;

/// This client's view of one inode's write lease.
#[derive(Default, Debug)]
pub(crate) struct LeaseState {
    held: bool,
    /// The grant held (when `held`).
    gen: u64,
    /// The latest grant the server recalled: a grant learnt of later (from
    /// a create's answer, which a recall may overtake) that is not newer
    /// was given back already.
    recalled: u64,
}

impl LeaseState {
    /// Grant `gen` is held now.
    fn take(&mut self, gen: u64, count: &AtomicUsize) {
        if !self.held {
            count.fetch_add(1, SeqCst);
        }
        self.held = true;
        self.gen = gen;
    }

    fn drop_lease(&mut self, count: &AtomicUsize) {
        if self.held {
            self.held = false;
            count.fetch_sub(1, SeqCst);
        }
    }
}

impl Shared {
    fn lease_shard(&self, ino: u64) -> &Mutex<IntMap<Arc<Mutex<LeaseState>>>> {
        &self.leases[(ino % LEASE_SHARDS as u64) as usize]
    }

    fn lease_cell(&self, ino: u64) -> Arc<Mutex<LeaseState>> {
        lock(self.lease_shard(ino)).entry(ino).or_default().clone()
    }

    /// Blocks the server granted for `want` on `side` (a request of the
    /// write that ran dry or of the reserve thread, under `refilling`):
    /// into the reservation, and counted. A side that gave fewer than
    /// asked for is full for this client until a later request gets all
    /// it asks for.
    fn add_granted(&self, side: Side, want: u64, ranges: &[(u64, u64)]) -> Result<()> {
        let got: u64 = ranges
            .iter()
            .filter(|&&(start, _)| Side::of(start) == side)
            .map(|r| r.1)
            .sum();
        self.fs.fs.set_client_side_full(side, got < want);
        let r = self.fs.fs.add_reservation(ranges);
        self.refills.fetch_add(1, SeqCst);
        r
    }

    /// After a write of `bytes`: if a side of the reservation is low,
    /// wake the reserve thread (unless it is already on its way). A few
    /// relaxed loads per write; the unpark (a futex wake if the thread
    /// sleeps) once per refill. On a hybrid pool the device side counts
    /// once a write was placed there (a client that writes only small
    /// files never holds device blocks ahead of need).
    fn refill_ahead_if_low(&self, bytes: u64) {
        let fs = &self.fs.fs;
        if fs.is_hybrid() && !self.refill.dev_writer.load(Relaxed) && fs.place(bytes) == Side::Dev {
            self.refill.dev_writer.store(true, Relaxed);
        }
        if self.refill.pending.load(Relaxed)
            || self.low_sides() == [false, false]
            || self.refill.pending.swap(true, SeqCst)
        {
            return;
        }
        if let Some(t) = self.refill.thread.get() {
            t.unpark();
        }
    }

    /// Which sides of the reservation (PM, device) to refill ahead: fewer
    /// than [`REFILL_AHEAD_BELOW`] free blocks, and not a side the server
    /// said is full (the writes spill to the other; one that runs dry
    /// asks, and finds out whether it still is). The device only for a
    /// client that writes there.
    fn low_sides(&self) -> [bool; 2] {
        let fs = &self.fs.fs;
        let (pm_free, dev_free) = fs.reservation_free();
        let hybrid = fs.is_hybrid();
        [
            pm_free < REFILL_AHEAD_BELOW && !(hybrid && fs.client_side_full(Side::Pm)),
            hybrid
                && self.refill.dev_writer.load(Relaxed)
                && dev_free < REFILL_AHEAD_BELOW
                && !fs.client_side_full(Side::Dev),
        ]
    }

    /// The reserve thread: one refill per wake-up with `pending` set, on
    /// the session (a ring is a writing thread's; the session's requests
    /// go one at a time under `asking`), until the session ends. What the
    /// server could not give is left for the write that runs dry to ask
    /// for and report (ENOSPC).
    fn refill_ahead(&self) {
        // The reader's unpark at the session's end comes after `closed`
        // is set: checked before each park, a wake-up is never missed
        // (an unpark before the park makes it return at once).
        while !self.closed.load(SeqCst) {
            std::thread::park();
            if !self.refill.pending.load(SeqCst) {
                continue;
            }
            {
                // The one refill path: a write that ran dry meanwhile
                // waits for these blocks instead of asking too.
                let _one = lock(&self.refilling);
                // Another refill may have landed since the wake-up.
                let low = self.low_sides();
                for (side, ask) in [
                    (Side::Pm, Msg::Reserve(RESERVE_BLOCKS)),
                    (Side::Dev, Msg::ReserveDev(RESERVE_BLOCKS)),
                ] {
                    if !low[side as usize] {
                        continue;
                    }
                    let answer = {
                        let _session = lock(&self.asking);
                        self.request(ask)
                    };
                    if let Ok(Msg::Blocks(ranges)) = answer {
                        // Only fails on ranges outside the pool (a server
                        // bug); the writes then ask for their own, which
                        // report it. A device request the server answers
                        // with PM blocks (the device full) marks the
                        // device full here, as a write's own does.
                        let _ = self.add_granted(side, RESERVE_BLOCKS, &ranges);
                    }
                }
            }
            self.refill.pending.store(false, SeqCst);
        }
    }

    /// A namespace request's answer granted the lease of `ino` (grant
    /// `gen`): held unless it was recalled meanwhile.
    fn granted_with_answer(&self, ino: u64, gen: u64) {
        let cell = self.lease_cell(ino);
        let mut st = lock(&cell);
        if gen > st.recalled && (!st.held || st.gen <= gen) {
            st.take(gen, &self.held);
        }
    }

    fn send(&self, msg: &Msg) -> Result<()> {
        self.sent.fetch_add(1, SeqCst);
        let out = lock(&self.out);
        self.write_lines(&out, &msg.line())
    }

    /// Write `lines` to the session (`out`, locked by the caller) and count
    /// them.
    fn write_lines(&self, out: &UnixStream, lines: &str) -> Result<()> {
        let mut w = out;
        w.write_all(lines.as_bytes())
            .map_err(|_| Error::Errno(libc::EIO))?;
        let n = lines.bytes().filter(|&b| b == b'\n').count() as u64;
        self.lines.fetch_add(n, SeqCst);
        Ok(())
    }

    /// Give `ino`'s lease (grant `gen`, dropped by the caller under its
    /// cell's lock) back with the removal request about to be sent: the
    /// blocks this client freed go first, in `return` lines on the
    /// session, as before a `released`, and the give names the lines
    /// written so far, read under the same lock, so that every `return`
    /// written before (this thread's and any other's) is among them. A
    /// thread that took freed blocks out before this one and writes them
    /// after is not waited for; the server then frees those of the
    /// inode's blocks at the settle, and ignores them, loudly, when they
    /// arrive (each block freed once).
    fn give_with_request(&self, ino: u64, gen: u64) -> ns::Give {
        let fs = &self.fs.fs;
        fs.client_release_inode(ino);
        let freed = fs.take_client_freed();
        let mut lines = String::new();
        for m in Msg::split(&freed, Msg::Return) {
            m.write_line(&mut lines);
        }
        let out = lock(&self.out);
        if !lines.is_empty() {
            self.sent.fetch_add(1, SeqCst);
            // A failed write: the session is closing, and so the request
            // fails as well.
            let _ = self.write_lines(&out, &lines);
        }
        ns::Give {
            ino,
            gen,
            lines: self.lines.load(SeqCst),
        }
    }

    /// `return` lines for the blocks it freed, then `then` (a `released`),
    /// then `unused` lines for the reservation it gives back unused, all in
    /// one write (one system call).
    fn send_ranges(
        &self,
        freed: &[(u64, u64)],
        then: Option<&Msg>,
        unused: &[(u64, u64)],
    ) -> Result<()> {
        if freed.is_empty() && then.is_none() && unused.is_empty() {
            return Ok(());
        }
        let mut lines = String::new();
        for m in Msg::split(freed, Msg::Return) {
            m.write_line(&mut lines);
        }
        if let Some(m) = then {
            m.write_line(&mut lines);
        }
        for m in Msg::split(unused, Msg::Unused) {
            m.write_line(&mut lines);
        }
        self.sent.fetch_add(1, SeqCst);
        let out = lock(&self.out);
        self.write_lines(&out, &lines)
    }

    /// Send a request and wait for its answer (EIO if the server is gone).
    fn request(&self, msg: Msg) -> Result<Msg> {
        *lock(&self.answer) = None;
        self.send(&msg)?;
        let mut answer = lock(&self.answer);
        loop {
            if let Some(a) = answer.take() {
                return Ok(a);
            }
            if self.closed.load(SeqCst) {
                return errno(libc::EIO);
            }
            answer = self
                .answered
                .wait_timeout(answer, Duration::from_millis(100))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// The server recalls grant `gen` of `ino`'s lease: once the write in
    /// flight on it is over, give it back with the blocks this client freed
    /// (and, holding no other lease, its unused reservation).
    fn recall(&self, ino: u64, gen: u64) {
        if self.dirs.recall(ino, gen) {
            self.give_back_dir(ino, gen);
            return;
        }
        let cell = self.lease_cell(ino);
        let mut st = lock(&cell);
        st.recalled = st.recalled.max(gen);
        if st.held && st.gen <= gen {
            st.drop_lease(&self.held);
        }
        self.give_back(ino, gen, true);
    }

    /// Give grant `gen` of `ino`'s lease back (its lock held, marked not
    /// held). `recalled`: the server asked for it; the unused reservation
    /// goes back too once no lease is left. Not when this client gives a
    /// lease back of its own accord (before a removal or rename, a log
    /// due for GC): it goes on writing, and blocks given back go through
    /// the server's limbo before they are free again, so a busy client
    /// draining and asking again at each rename emptied a small pool into
    /// the limbo (creates failed with ENOSPC while df showed it nearly
    /// empty).
    fn give_back(&self, ino: u64, gen: u64, recalled: bool) {
        let fs = &self.fs.fs;
        fs.client_release_inode(ino);
        let freed = fs.take_client_freed();
        // Blocks it never used go back apart from those it freed: the
        // server frees them at once instead of through its limbo (no
        // reader can have seen a block no commit referred to). Until the
        // server reads the message they are still booked as this client's
        // reservation: a death before that returns them with the rest.
        // After the `released`, in the same write: the server has settled
        // the inode by then, so a block the inode refers to has left the
        // books and no wrong `unused` line could free it.
        let unused = if recalled && self.held.load(SeqCst) == 0 {
            fs.drain_reservation()
        } else {
            Vec::new()
        };
        let _ = self.send_ranges(&freed, Some(&Msg::Released(ino, gen)), &unused);
    }
}

/// Where a client's own descriptors go: this far below the soft limit of
/// open files (at least 64), so that the program that made the client (an
/// unmodified one, under the preload library) gets the descriptor numbers
/// it would get without it.
const HIGH_BELOW_LIMIT: u64 = 128;

/// `fd` moved to the lowest free number at or above the client's floor
/// (close-on-exec): a library's own descriptor out of the program's way.
pub fn high(fd: OwnedFd) -> Result<OwnedFd> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we own.
    let cur = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        lim.rlim_cur
    } else {
        1024
    };
    let floor = cur.saturating_sub(HIGH_BELOW_LIMIT).clamp(64, 1 << 20) as libc::c_int;
    // SAFETY: F_DUPFD_CLOEXEC on a descriptor we own; no memory involved.
    let raw = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, floor) };
    if raw < 0 {
        // No number free up there: keep the one it has.
        return Ok(fd);
    }
    // SAFETY: a descriptor the kernel just gave us, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// Another descriptor of the session, at a high number as [`high`].
fn clone_high(conn: &UnixStream) -> Result<UnixStream> {
    Ok(UnixStream::from(high(conn.try_clone()?.into())?))
}

/// Blocks a write of `len` bytes may need (data and a log page or two).
fn blocks_for(len: u64) -> u64 {
    len.div_ceil(crate::format::BLOCK_SIZE) + 2
}

fn protocol_error(got: &Msg) -> Error {
    Error::Io(std::io::Error::other(format!(
        "the server answered {:?} out of turn",
        got.line().trim_end()
    )))
}

/// The session's reader (answers to the waiting request, recalls to the
/// recall thread) and the recall thread.
fn start_threads(
    shared: &Arc<Shared>,
    conn: UnixStream,
) -> Result<Vec<std::thread::JoinHandle<()>>> {
    let (tx, rx) = std::sync::mpsc::channel::<(u64, u64)>();
    let s = shared.clone();
    let recaller = std::thread::Builder::new()
        .name("inkfs-recall".into())
        .spawn(move || {
            for (ino, gen) in rx {
                s.recall(ino, gen);
            }
        })?;
    let s = shared.clone();
    let reserver = std::thread::Builder::new()
        .name("inkfs-reserve".into())
        .spawn(move || s.refill_ahead())?;
    // Set once, before any write can look.
    let _ = shared.refill.thread.set(reserver.thread().clone());
    let s = shared.clone();
    let reader = std::thread::Builder::new()
        .name("inkfs-session".into())
        .spawn(move || {
            read_session(&s, &conn, &tx);
            // The server is gone (or ended the session): leases with it.
            s.fs.fs.client_leases_changed();
            s.closed.store(true, SeqCst);
            s.answered.notify_all();
            s.refill.stop();
        });
    let reader = match reader {
        Ok(r) => r,
        Err(e) => {
            // No session reader: the reserve thread would wait forever.
            shared.closed.store(true, SeqCst);
            shared.refill.stop();
            return Err(e.into());
        }
    };
    Ok(vec![reader, recaller, reserver])
}

fn read_session(s: &Shared, conn: &UnixStream, recalls: &std::sync::mpsc::Sender<(u64, u64)>) {
    let mut lines = BufReader::new(conn);
    let mut line = String::new();
    loop {
        line.clear();
        match (&mut lines).take(LINE_MAX as u64 + 1).read_line(&mut line) {
            Ok(0) => return,
            Ok(n) if n > LINE_MAX || !line.ends_with('\n') => return,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        }
        match Msg::parse(line.trim_end()) {
            Some(Msg::Recall(ino, gen)) => {
                let _ = recalls.send((ino, gen));
            }
            Some(
                m @ (Msg::Granted(..)
                | Msg::Denied(..)
                | Msg::Blocks(_)
                | Msg::NoSpace
                | Msg::SlotsGiven(..)
                | Msg::Done(_)),
            ) => {
                *lock(&s.answer) = Some(m);
                s.answered.notify_all();
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client is shared by a process's threads (the preload library's).
    #[test]
    fn a_client_is_send_and_sync() {
        fn shared<T: Send + Sync>() {}
        shared::<Client>();
    }
}
