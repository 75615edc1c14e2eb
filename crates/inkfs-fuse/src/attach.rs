//! Attach requests on the control socket, the server's side
//! (docs/KERNEL-FREE.md, "Attaching"; the exchange: `inkfs::api::attach`).
//!
//! A client that could open the pool itself (its owner, root, a member of
//! its group when the pool is group read-write, anyone when it is world
//! read-write) gets the pool's descriptor, the epoch table and a slot in
//! it; others are refused with the reason. Posix mode is refused: its
//! writes may wait in the kernel's page cache, where a client would not
//! see them. A hybrid pool's client gets the data device's descriptor too
//! (the server's own description, as for the pool), and reads and writes
//! large files' data there itself.
//!
//! Each attached client has a thread here reading its connection: its lease
//! requests, reservations and returns (`crate::lease`), and the end of
//! file, however the client ended (exit, SIGKILL), which settles its leases
//! and reservation, releases its epoch slot, and reclaims the limbo. While
//! clients are attached a reclaimer thread also returns the limbo's blocks
//! every [`RECLAIM_EVERY`] (clients unpin without telling anyone); the
//! engine itself reclaims after each free. The request path gets only the
//! lease table's hold on the inodes a request uses (`crate::lease`).
//!
//! The epoch table lives in a sealed memfd made at mount; the engine holds
//! frees against it from the first attach on (before that they go straight
//! to the free lists). Nothing here keeps the engine alive: the unmount
//! takes it back after [`AttachService::shutdown`], which takes every lease
//! back, closes every client's session and waits for them to settle.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::net::Shutdown;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::Duration;

use inkfs::api::attach::{send_grant, Grant};
use inkfs::api::lease::{Msg, LINE_MAX, RANGES_PER_LINE};
use inkfs::api::ring::{RingSet, RINGS};
use inkfs::api::{Mode, SharedEpochs, Side};

use crate::kernel_refs::KernelRefs;
use crate::lease::{Holder, Leases};
use crate::stats::Stats;
use crate::Engine;

/// How often the limbo is reclaimed while clients are attached.
pub const RECLAIM_EVERY: Duration = Duration::from_millis(50);
/// Time allowed to send the grant.
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);
/// Supplementary groups of a peer looked at, at most (NGROUPS_MAX).
const GROUPS_MAX: usize = 65536;
/// How long the unmount waits for clients' sessions to settle their leases.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(10);

/// The attach service of one mount.
pub struct AttachService {
    inner: Arc<Inner>,
    reclaimer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

struct Inner {
    engine: Weak<Engine>,
    leases: Arc<Leases>,
    /// The kernel's references to inodes (removals pin what it holds).
    refs: Arc<KernelRefs>,
    /// The mount's statistics (clients' namespace requests are counted).
    stats: Arc<Stats>,
    epochs: Arc<SharedEpochs>,
    mode: Mode,
    state: Mutex<State>,
    /// Signalled when a client goes and at shutdown.
    changed: Condvar,
    next_id: AtomicU64,
}

#[derive(Default)]
struct State {
    stopping: bool,
    /// Attached clients' connections, by client id (to end them at
    /// shutdown).
    sessions: HashMap<u64, UnixStream>,
    /// A client went since the last reclaim.
    reclaim_due: bool,
}

impl AttachService {
    /// The service for `engine`, mounted in `mode`: the epoch table is made
    /// now (a memfd), shared with the engine at the first attach.
    pub fn new(
        engine: &Arc<Engine>,
        mode: Mode,
        leases: Arc<Leases>,
        refs: Arc<KernelRefs>,
        stats: Arc<Stats>,
    ) -> std::io::Result<AttachService> {
        let inner = Arc::new(Inner {
            engine: Arc::downgrade(engine),
            leases,
            refs,
            stats,
            epochs: Arc::new(SharedEpochs::create()?),
            mode,
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            next_id: AtomicU64::new(1),
        });
        let r = inner.clone();
        let reclaimer = std::thread::Builder::new()
            .name("inkfs-reclaim".into())
            .spawn(move || reclaim_loop(&r))?;
        Ok(AttachService {
            inner,
            reclaimer: Mutex::new(Some(reclaimer)),
        })
    }

    /// Takes the connections whose request was `attach`.
    pub fn handler(&self) -> crate::scrub::Handler {
        let inner = self.inner.clone();
        Arc::new(move |conn: UnixStream| {
            let inner = inner.clone();
            let spawned = std::thread::Builder::new()
                .name("inkfs-attach".into())
                .spawn(move || session(&inner, conn));
            if let Err(e) = spawned {
                eprintln!("inkfs: attach: cannot start a thread: {e}");
            }
        })
    }

    /// Clients attached now.
    pub fn attached(&self) -> usize {
        self.inner.lock().sessions.len()
    }

    /// Refuse new clients, end every session (the clients see the end of
    /// file), and stop the reclaimer: after this nothing here touches the
    /// engine.
    pub fn shutdown(&self) {
        // Leases first: a holder's write in flight finishes, and it writes
        // nothing once its session is closed.
        self.inner.leases.recall_all();
        {
            let mut st = self.inner.lock();
            st.stopping = true;
            for conn in st.sessions.values() {
                let _ = conn.shutdown(Shutdown::Both);
            }
        }
        self.inner.changed.notify_all();
        // Each session settles its client's leases as it ends: wait for
        // that, so that nothing here holds the engine at the unmount.
        let end = std::time::Instant::now() + SHUTDOWN_WAIT;
        let mut st = self.inner.lock();
        while !st.sessions.is_empty() && std::time::Instant::now() < end {
            st = self
                .inner
                .changed
                .wait_timeout(st, Duration::from_millis(50))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        drop(st);
        let reclaimer = self
            .reclaimer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(t) = reclaimer {
            let _ = t.join();
        }
    }
}

impl Drop for AttachService {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One client, on its own thread: the grant, then its session until the
/// end of file.
fn session(inner: &Arc<Inner>, conn: UnixStream) {
    let _ = conn.set_write_timeout(Some(WRITE_TIMEOUT));
    let refuse = |why: String| {
        use std::io::Write;
        let _ = (&conn).write_all(format!("error {}\n", why.replace('\n', " ")).as_bytes());
    };
    let rings = match RingSet::create() {
        Ok(r) => Arc::new(r),
        Err(e) => return refuse(format!("cannot make the request rings: {e}")),
    };
    let (grant, fds, pid) = match admit(inner, &conn) {
        Ok(g) => g,
        Err(why) => return refuse(why),
    };
    let data = fds.data.as_ref().map(|d| d.as_fd());
    let sent = send_grant(
        &conn,
        &grant,
        fds.pool.as_fd(),
        inner.epochs.fd(),
        rings.fd(),
        data,
    );
    // Our duplicates of the descriptors: the client has its own now.
    drop(fds);
    if sent.is_ok() {
        match conn.try_clone() {
            Ok(out) => {
                let holder = inner.leases.join(grant.id, pid, out);
                let lanes = Lanes {
                    inner: inner.clone(),
                    holder: holder.clone(),
                    rings: rings.clone(),
                    threads: Mutex::default(),
                };
                lanes.start(0);
                let worker = serve_leases(inner, &conn, &holder, &lanes);
                // The client is gone: its leases are settled first, so that
                // a request of its own still running (on a ring or the
                // worker) that waits for one of them ends; a request it
                // left on a ring is finished (or was never taken) once
                // the ring's thread ends.
                inner.leases.end(&holder);
                rings.close();
                if let Some(t) = worker {
                    let _ = t.join();
                }
                lanes.join();
                inner.leases.leave(&holder);
            }
            Err(e) => eprintln!("inkfs: attach: cannot keep the session: {e}"),
        }
    }
    end_session(inner, &grant);
}

/// The server's threads of one client's request rings: ring 0 from the
/// attach on, ring `k` from the client's `lane k` on (a client process
/// whose threads ask at once).
struct Lanes {
    inner: Arc<Inner>,
    holder: Arc<Holder>,
    rings: Arc<RingSet>,
    threads: Mutex<Vec<(usize, std::thread::JoinHandle<()>)>>,
}

impl Lanes {
    /// Serve ring `k` (once; nothing past the set's rings).
    fn start(&self, k: usize) {
        let Some(ring) = self.rings.ring(k) else {
            return;
        };
        let mut threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        if threads.iter().any(|&(i, _)| i == k) {
            return;
        }
        let (inner, holder, rings) = (self.inner.clone(), self.holder.clone(), self.rings.clone());
        let spawned = std::thread::Builder::new()
            .name("inkfs-ring".into())
            .spawn(move || {
                if let Some(ring) = rings.ring(k) {
                    serve_ring(&inner, &holder, ring);
                }
            });
        match spawned {
            Ok(t) => threads.push((k, t)),
            Err(e) => {
                eprintln!("inkfs: attach: cannot start a thread: {e}");
                // The client's request there gets EIO (and goes through
                // the mount) instead of waiting for nobody.
                ring.close();
            }
        }
    }

    /// Wait for every ring's thread (after the rings were closed).
    fn join(&self) {
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for (_, t) in threads {
            let _ = t.join();
        }
    }
}

/// The client's requests on one of its rings (`inkfs::api::ring`): lease
/// grants, reservations and namespace changes, answered in order, until
/// the session ends.
fn serve_ring(inner: &Inner, holder: &Arc<Holder>, ring: inkfs::api::ring::Ring<'_>) {
    let mut last = 0;
    // One buffer for every request's bytes and one for every answer.
    let (mut bytes, mut out) = (Vec::new(), String::new());
    while let Some(seq) = ring.next_request_into(last, &mut bytes) {
        last = seq;
        let msg = std::str::from_utf8(&bytes)
            .ok()
            .and_then(|t| Msg::parse(t.trim_end()));
        let answer = match msg {
            Some(Msg::Lease(ino)) => match inner.leases.grant(holder, ino, true) {
                Ok(gen) => Msg::Granted(ino, gen),
                Err(e) => Msg::Denied(ino, e),
            },
            Some(Msg::Reserve(n)) => reserve(inner, holder, n, Side::Pm),
            Some(Msg::ReserveDev(n)) => reserve(inner, holder, n, Side::Dev),
            Some(Msg::Slots(k)) => crate::lanes::more_slots(&inner.leases, holder, k),
            Some(Msg::Ns(req)) => {
                let Some(engine) = inner.engine.upgrade() else {
                    return;
                };
                Msg::Done(crate::ns::serve(
                    &engine,
                    &inner.leases,
                    inner.leases.inval(),
                    &inner.refs,
                    &inner.stats,
                    holder,
                    &req,
                ))
            }
            // Not a request: no answer the client could wait for makes
            // sense; it gets one it cannot take for another's.
            _ => Msg::Denied(0, libc::EINVAL),
        };
        out.clear();
        answer.write_line(&mut out);
        ring.answer(seq, out.as_bytes());
    }
}

/// The answer to a reservation request of `n` blocks on `side` (a hybrid
/// pool's data device: PM blocks when it is full).
fn reserve(inner: &Inner, holder: &Holder, n: u64, side: Side) -> Msg {
    let got = inner.leases.reserve(holder, n, side);
    if got.is_empty() {
        Msg::NoSpace
    } else {
        debug_assert!(got.len() <= RANGES_PER_LINE);
        Msg::Blocks(got)
    }
}

/// What a client's worker thread does, in the order the client asked.
enum Work {
    Lease(u64),
    Ns(Box<inkfs::api::ns::Request>),
    /// A hold ended on an orphan: free what nobody holds any more.
    Unheld,
}

/// The client's worker: its lease grants and namespace requests, in order
/// (see `serve_leases`).
fn work(inner: &Inner, holder: &Arc<Holder>, rx: std::sync::mpsc::Receiver<Work>) {
    for w in rx {
        let answer = match w {
            Work::Unheld => {
                if let Some(engine) = inner.engine.upgrade() {
                    engine.free_unheld_orphans();
                }
                continue;
            }
            Work::Lease(ino) => match inner.leases.grant(holder, ino, true) {
                Ok(gen) => Msg::Granted(ino, gen),
                Err(e) => Msg::Denied(ino, e),
            },
            Work::Ns(req) => {
                let Some(engine) = inner.engine.upgrade() else {
                    return;
                };
                let inval = inner.leases.inval();
                Msg::Done(crate::ns::serve(
                    &engine,
                    &inner.leases,
                    inval,
                    &inner.refs,
                    &inner.stats,
                    holder,
                    &req,
                ))
            }
        };
        if crate::lease::send(holder, &answer).is_err() {
            return;
        }
    }
}

/// The client's lease and namespace requests until its session ends (see
/// `inkfs::api::lease` and `inkfs::api::ns`). Grants and namespace
/// changes wait (for recalls, for requests using an inode), so they run on
/// a worker thread of their own: this one keeps reading, and so sees the
/// `released` of a recall they may be waiting for. Returns the worker,
/// which may still be running a request.
fn serve_leases(
    inner: &Arc<Inner>,
    conn: &UnixStream,
    holder: &Arc<Holder>,
    lanes: &Lanes,
) -> Option<std::thread::JoinHandle<()>> {
    let _ = conn.set_read_timeout(None);
    let (tx, rx) = std::sync::mpsc::channel::<Work>();
    let worker = {
        let inner = inner.clone();
        let holder = holder.clone();
        std::thread::Builder::new()
            .name("inkfs-client".into())
            .spawn(move || work(&inner, &holder, rx))
    };
    let worker = match worker {
        Ok(t) => Some(t),
        Err(e) => {
            eprintln!("inkfs: attach: cannot start a thread: {e}");
            None
        }
    };
    let mut lines = BufReader::new(conn);
    let mut line = String::new();
    loop {
        line.clear();
        // Bounded: a line longer than any message ends the session.
        match (&mut lines).take(LINE_MAX as u64 + 1).read_line(&mut line) {
            Ok(0) => break,
            Ok(n) if n > LINE_MAX || !line.ends_with('\n') => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
        match Msg::parse(line.trim_end()) {
            Some(Msg::Lease(ino)) if worker.is_some() => {
                let _ = tx.send(Work::Lease(ino));
            }
            Some(Msg::Lease(ino)) => {
                let _ = crate::lease::send(holder, &Msg::Denied(ino, libc::EAGAIN));
            }
            Some(Msg::Ns(req)) if worker.is_some() => {
                let _ = tx.send(Work::Ns(Box::new(req)));
            }
            Some(Msg::Ns(req)) => {
                let done = inkfs::api::ns::Done {
                    seq: req.seq,
                    errno: libc::EAGAIN,
                    ino: 0,
                    igen: 0,
                    gen: 0,
                    dir: None,
                    lane: None,
                };
                let _ = crate::lease::send(holder, &Msg::Done(done));
            }
            Some(Msg::Reserve(n)) => {
                let _ = crate::lease::send(holder, &reserve(inner, holder, n, Side::Pm));
            }
            Some(Msg::ReserveDev(n)) => {
                let _ = crate::lease::send(holder, &reserve(inner, holder, n, Side::Dev));
            }
            Some(Msg::Slots(k)) => {
                let _ =
                    crate::lease::send(holder, &crate::lanes::more_slots(&inner.leases, holder, k));
            }
            Some(Msg::Return(ranges)) => inner.leases.take_back(holder, &ranges),
            Some(Msg::Unused(ranges)) => inner.leases.take_back_unused(holder, &ranges),
            // On the worker: freeing recalls leases, whose `released`
            // this thread must stay free to read.
            Some(Msg::Unheld(_)) if worker.is_some() => {
                let _ = tx.send(Work::Unheld);
            }
            Some(Msg::Released(ino, gen)) => inner.leases.released(holder, ino, gen),
            Some(Msg::ReleasedDir(dir, gen, kept, removed)) => {
                // Its files kept enter the table before the directory is
                // settled: no one uses them unrecalled.
                inner.leases.adopt_kept(holder, dir, gen, &kept);
                inner.leases.released(holder, dir, gen);
                inner.leases.lanes.removed(removed);
            }
            // A removal under a directory lease (crate::lanes); on this
            // thread, after the `return`s written before it, with the
            // lease hook silent (nothing is recalled).
            Some(Msg::Orphan(ino, gen)) => crate::lanes::orphan(&inner.leases, holder, ino, gen),
            Some(Msg::Slot(ino)) => crate::lanes::slot(&inner.leases, holder, ino),
            Some(Msg::ReleasedLane(ret)) => {
                if let Err(why) = crate::lanes::released(&inner.leases, holder, &ret) {
                    // The client's fault: its session ends here, and the
                    // lane is reaped with the rest of what it held.
                    eprintln!(
                        "inkfs: client {}: a lane's return refused ({why}): session ended",
                        holder.id
                    );
                    let _ = conn.shutdown(Shutdown::Both);
                    holder.line_read();
                    break;
                }
            }
            Some(Msg::Lane(k)) if (k as usize) < RINGS => lanes.start(k as usize),
            // Anything else from a client is ignored.
            _ => {}
        }
        // Counted after acting on it: a lease given back with a request
        // waits for the `return`s written before it (Leases::settle_given).
        holder.line_read();
    }
    drop(tx);
    worker
}

/// The client is gone: its slot is free, and what it held can be reclaimed.
fn end_session(inner: &Inner, grant: &Grant) {
    // Its holds go with its slot: orphans only it kept are freed.
    inner.epochs.release_slot(grant.slot);
    if let Some(engine) = inner.engine.upgrade() {
        engine.free_unheld_orphans();
    }
    let mut st = inner.lock();
    st.sessions.remove(&grant.id);
    st.reclaim_due = true;
    drop(st);
    inner.changed.notify_all();
}

/// Duplicates of the descriptors a grant hands over.
struct GrantFds {
    pool: OwnedFd,
    /// A hybrid pool's data device.
    data: Option<OwnedFd>,
}

/// Check the peer and the mount, claim a slot and register the session:
/// the grant and duplicates of its descriptors, or why not.
fn admit(inner: &Inner, conn: &UnixStream) -> Result<(Grant, GrantFds, i32), String> {
    if inner.mode == Mode::Posix {
        return Err(
            "refused: this mount is in posix mode, where writes may wait in the \
                    kernel's page cache that an attached client does not see; attach \
                    serves strict and sync mounts"
                .into(),
        );
    }
    let peer = Peer::of(conn)?;
    let mut st = inner.lock();
    if st.stopping {
        return Err("the file system is being unmounted".into());
    }
    // Held only under the lock, which shutdown takes before the unmount.
    let engine = inner
        .engine
        .upgrade()
        .ok_or("the file system is being unmounted")?;
    let file = engine.pool().pool_file().file();
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot stat the pool: {e}"))?;
    peer.may_open(&meta)?;
    let pool = file
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| format!("cannot duplicate the pool's descriptor: {e}"))?;
    // A hybrid pool: the client reads and writes the data device too.
    let data_threshold = engine.data_threshold_bytes();
    let data = match data_threshold {
        None => None,
        Some(_) => Some(
            engine
                .data_device_fd()
                .ok_or("refused: this pool's data device has no descriptor to hand over")?
                .try_clone_to_owned()
                .map_err(|e| format!("cannot duplicate the data device's descriptor: {e}"))?,
        ),
    };
    let session = conn
        .try_clone()
        .map_err(|e| format!("cannot keep the session: {e}"))?;
    let slot = inner.epochs.claim_index().ok_or_else(|| {
        format!(
            "busy: {} clients attached, the most one mount serves",
            inkfs::api::attach::CLIENTS_MAX
        )
    })?;
    // From the first client on, frees wait for the clients' pins.
    engine.share_epochs(inner.epochs.clone());
    let id = inner.next_id.fetch_add(1, Relaxed);
    st.sessions.insert(id, session);
    Ok((
        Grant {
            id,
            slot,
            mode: inner.mode,
            data_threshold,
            gives: true,
            dirs: true,
            lanes: true,
            removes: true,
        },
        GrantFds { pool, data },
        peer.pid,
    ))
}

/// Return the limbo's blocks while clients are attached (every
/// [`RECLAIM_EVERY`]) and once after each client goes.
fn reclaim_loop(inner: &Inner) {
    let mut st = inner.lock();
    loop {
        if st.stopping {
            return;
        }
        let due = st.reclaim_due || !st.sessions.is_empty();
        st.reclaim_due = false;
        if due {
            drop(st);
            if let Some(engine) = inner.engine.upgrade() {
                engine.reclaim_limbo();
                // A hold let go without an `unheld` (the client could not
                // send it): its orphan is freed here.
                if engine.held_orphans() > 0 {
                    engine.free_unheld_orphans();
                }
            }
            st = inner.lock();
            if st.stopping {
                return;
            }
        }
        let wait = if st.sessions.is_empty() {
            Duration::from_secs(3600)
        } else {
            RECLAIM_EVERY
        };
        st = inner
            .changed
            .wait_timeout(st, wait)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

/// Who is at the other end of a connection (SO_PEERCRED, SO_PEERGROUPS).
struct Peer {
    pid: i32,
    uid: u32,
    gid: u32,
    groups: Vec<u32>,
}

impl Peer {
    fn of(conn: &UnixStream) -> Result<Peer, String> {
        let cred =
            crate::stats::peer_cred(conn).map_err(|e| format!("cannot tell who asks: {e}"))?;
        Ok(Peer {
            pid: cred.pid,
            uid: cred.uid,
            gid: cred.gid,
            groups: peer_groups(conn),
        })
    }

    /// The trust rule: could this peer open the pool for writing itself?
    fn may_open(&self, pool: &std::fs::Metadata) -> Result<(), String> {
        self.may_open_file(pool.uid(), pool.gid(), pool.mode())
    }

    /// [`Peer::may_open`] of a file owned by `owner`:`group` with `mode`.
    fn may_open_file(&self, owner: u32, group: u32, mode: u32) -> Result<(), String> {
        let in_group = self.gid == group || self.groups.contains(&group);
        let ok = self.uid == 0
            || self.uid == owner
            || (in_group && mode & 0o060 == 0o060)
            || mode & 0o006 == 0o006;
        if ok {
            return Ok(());
        }
        Err(format!(
            "permission denied: attach hands the pool itself over, so it serves only \
             those who could open the pool read-write (root, its owner uid {owner}, group \
             {group} when the pool is group read-write); uid {} cannot (pool mode {:04o})",
            self.uid,
            mode & 0o7777
        ))
    }
}

/// The peer's supplementary groups (SO_PEERGROUPS, Linux 4.13), empty if
/// the kernel cannot say.
fn peer_groups(conn: &UnixStream) -> Vec<u32> {
    /// SO_PEERGROUPS (asm-generic/socket.h; x86 and arm use it).
    const SO_PEERGROUPS: libc::c_int = 59;
    let mut groups = vec![0u32; 64];
    loop {
        let mut len = (groups.len() * 4) as libc::socklen_t;
        // SAFETY: getsockopt writes at most `len` bytes into `groups`,
        // which holds that many and lives for the call.
        let rc = unsafe {
            libc::getsockopt(
                conn.as_raw_fd(),
                libc::SOL_SOCKET,
                SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let n = len as usize / 4;
        if rc == 0 {
            groups.truncate(n.min(groups.len()));
            return groups;
        }
        let err = std::io::Error::last_os_error().raw_os_error();
        if err == Some(libc::ERANGE) && n > groups.len() && n <= GROUPS_MAX {
            groups.resize(n, 0);
            continue;
        }
        return Vec::new();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trust_rule() {
        let peer = |uid, gid, groups: &[u32]| Peer {
            pid: 0,
            uid,
            gid,
            groups: groups.to_vec(),
        };
        // (peer, owner, group, mode, may attach)
        let cases = [
            (peer(0, 0, &[]), 1000, 1000, 0o600, true),
            (peer(1000, 1000, &[]), 1000, 1000, 0o600, true),
            (peer(1001, 1001, &[]), 1000, 1000, 0o600, false),
            (peer(1001, 1001, &[]), 1000, 1000, 0o640, false),
            (peer(1001, 1000, &[]), 1000, 1000, 0o660, true),
            (peer(1001, 1001, &[50, 1000]), 1000, 1000, 0o660, true),
            (peer(1001, 1001, &[50]), 1000, 1000, 0o660, false),
            (peer(1001, 1001, &[]), 1000, 1000, 0o664, false),
            (peer(1001, 1001, &[]), 1000, 1000, 0o666, true),
        ];
        for (i, (p, owner, group, mode, want)) in cases.iter().enumerate() {
            let got = p.may_open_file(*owner, *group, *mode);
            assert_eq!(got.is_ok(), *want, "case {i}: {got:?}");
        }
    }
}
