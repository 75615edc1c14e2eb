//! Live statistics, NOVA `stats.c` style: per-operation counts, error counts
//! and log2 latency histograms, kept in relaxed atomics (no locks on the
//! request path), served over a unix socket.
//!
//! Why a socket and not a file or an xattr in the mounted tree: a control
//! file (`MOUNTPOINT/.inkfs-stats`) shows up in `ls -a`, `find`, `cp -a` and
//! `diff -r`; an xattr on the root would have to live in the `user.`
//! namespace (the kernel refuses unknown prefixes before FUSE sees them), where
//! it collides with the user's own attributes and shows up in `getfattr -d`.
//! A socket under `/run/inkfs/` keeps the file-system namespace exactly what
//! the user stored, and it still answers when the file system itself is
//! wedged (a hung request does not block the stats thread), which is when
//! statistics are most wanted.
//!
//! ## The socket protocol
//!
//! One request per connection, all text:
//! - the client sends one line, at most [`REQUEST_BYTES_MAX`] bytes: a
//!   request word, then blank-separated arguments, then `\n` (or it shuts
//!   its side down). Words today: `text` (the report for people), `json`
//!   (the same for scripts), and `scrub` and `attach`, after which the
//!   connection belongs to their own protocols (`scrub.rs`, `attach.rs`;
//!   an attached client's session then holds it open outside the limits
//!   below, one epoch slot each) instead of the status line below.
//! - the server answers with a status line and closes: `ok\n` followed by
//!   the body, or `error MESSAGE\n`. The client reads to the end.
//!
//! A new request type is one arm in the mount's [`Handler`] (`mount.rs`,
//! `run_engine`) and a word for the client to send ([`query`]).
//!
//! ## Who is served, and how many at once
//!
//! - Only the mount's owner (the server's effective uid) and root, unless
//!   the mount was given `-o stats=all`: the socket file is mode 0600 in a
//!   directory only its owner may write (`/run/inkfs` for root, a private
//!   `/tmp/inkfs-UID` otherwise), and the server checks each peer's uid
//!   (SO_PEERCRED) and refuses others with an `error` line.
//! - At most [`CLIENTS_MAX`] clients are served at once, each on its own
//!   short-lived thread; a uid other than the owner and root gets at most
//!   [`CLIENTS_PER_UID_MAX`] of them, and [`CLIENTS_RESERVED`] are kept for
//!   the owner and root, so idle connections of other users cannot make
//!   `inkfs stat` wait. A client has [`REQUEST_TIMEOUT`] to send its whole
//!   request line. A client over the limits gets `error busy ...` at once
//!   (the client in [`query`] retries for a few seconds).

use std::cell::Cell;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

use crate::clock::{self, Tick};

/// Where servers put their sockets and pid files.
pub use inkfs::api::attach::RUN_DIR;

/// Latency buckets: bucket i counts requests that took [2^i, 2^(i+1)) ns;
/// 40 buckets reach about 18 minutes.
pub const BUCKETS: usize = 40;

macro_rules! ops {
    ($($name:ident),* $(,)?) => {
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[allow(non_camel_case_types)]
        pub enum Op { $($name),* }
        impl Op {
            pub const ALL: &'static [Op] = &[$(Op::$name),*];
            pub fn name(self) -> &'static str {
                match self { $(Op::$name => stringify!($name)),* }
            }
        }
    };
}

ops!(
    lookup,
    forget,
    getattr,
    setattr,
    readlink,
    mknod,
    mkdir,
    unlink,
    rmdir,
    symlink,
    rename,
    link,
    open,
    read,
    write,
    flush,
    release,
    fsync,
    opendir,
    readdir,
    readdirplus,
    releasedir,
    fsyncdir,
    statfs,
    setxattr,
    getxattr,
    listxattr,
    removexattr,
    access,
    create,
    fallocate,
    lseek,
    copy_file_range,
    ioctl,
    // Attached clients' namespace requests (attach.rs, ns.rs).
    client_create,
    client_mkdir,
    client_mknod,
    client_symlink,
    client_link,
    client_unlink,
    client_rmdir,
    client_rename,
    client_setattr,
    client_setxattr,
    client_removexattr,
);

pub const OPS: usize = Op::ALL.len();

/// One operation's counters in one shard.
struct OpStats {
    count: AtomicU64,
    errors: AtomicU64,
    total_ns: AtomicU64,
    max_ns: AtomicU64,
    buckets: [AtomicU64; BUCKETS],
}

impl OpStats {
    fn new() -> OpStats {
        OpStats {
            count: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            total_ns: AtomicU64::new(0),
            max_ns: AtomicU64::new(0),
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// One operation's counters summed over the shards.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpTotals {
    pub count: u64,
    pub errors: u64,
    pub total_ns: u64,
    pub max_ns: u64,
    pub buckets: Vec<u64>,
}

impl OpTotals {
    /// The upper bound (ns) of the bucket holding the `q`-quantile.
    pub fn quantile_ns(&self, q: f64) -> u64 {
        let total: u64 = self.buckets.iter().sum();
        if total == 0 {
            return 0;
        }
        let want = ((total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, c) in self.buckets.iter().enumerate() {
            seen += c;
            if seen >= want {
                return 1u64 << (i + 1);
            }
        }
        1u64 << BUCKETS
    }
}

/// Shards per counter set. A worker thread adds to shard (its number mod
/// SHARDS), so with up to SHARDS workers no two threads write the same
/// cache line on the request path (counters shared by two server threads
/// cost a cache-line transfer per update, several per request).
const SHARDS: usize = 8;

static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);
thread_local! {
    static MY_SHARD: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// This thread's shard number (assigned round-robin on first use).
fn my_shard() -> usize {
    MY_SHARD.with(|s| {
        if s.get() == usize::MAX {
            s.set(NEXT_SHARD.fetch_add(1, Relaxed) % SHARDS);
        }
        s.get()
    })
}

/// A counter many threads add to and few read: one padded slot per shard.
pub struct Counter {
    slots: [Padded<AtomicU64>; SHARDS],
}

#[repr(align(128))]
struct Padded<T>(T);

impl Default for Counter {
    fn default() -> Self {
        Counter {
            slots: std::array::from_fn(|_| Padded(AtomicU64::new(0))),
        }
    }
}

impl Counter {
    #[inline]
    pub fn add(&self, n: u64) {
        self.slots[my_shard()].0.fetch_add(n, Relaxed);
    }

    pub fn sum(&self) -> u64 {
        self.slots.iter().map(|s| s.0.load(Relaxed)).sum()
    }
}

/// Statistics of one mounted file system.
pub struct Stats {
    /// Per shard, per operation.
    ops: Box<[Padded<[OpStats; OPS]>]>,
    /// Requests served, all kinds (the poller watches it).
    pub requests: Arc<Counter>,
    pub bytes_read: Counter,
    pub bytes_written: Counter,
    /// O_APPEND writes the engine placed at another offset than the kernel
    /// expected (should stay 0: the kernel serialises writers per inode).
    pub append_moved: Counter,
    /// The kernel's time write-backs to files held after their last name
    /// went, answered without writing them (`InkFuse::held_file_times`).
    pub held_times_skipped: Counter,
    pub started: Instant,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            ops: (0..SHARDS)
                .map(|_| Padded(std::array::from_fn(|_| OpStats::new())))
                .collect(),
            requests: Arc::new(Counter::default()),
            bytes_read: Counter::default(),
            bytes_written: Counter::default(),
            append_moved: Counter::default(),
            held_times_skipped: Counter::default(),
            started: {
                clock::calibrate();
                Instant::now()
            },
        }
    }
}

impl Stats {
    /// Record one finished request.
    #[inline]
    pub fn record(&self, op: Op, started: Tick, ok: bool) {
        let ns = clock::elapsed_ns(started);
        let s = &self.ops[my_shard()].0[op as usize];
        self.requests.add(1);
        s.count.fetch_add(1, Relaxed);
        if !ok {
            s.errors.fetch_add(1, Relaxed);
        }
        s.total_ns.fetch_add(ns, Relaxed);
        s.max_ns.fetch_max(ns, Relaxed);
        let bucket = (63 - ns.max(1).leading_zeros() as usize).min(BUCKETS - 1);
        s.buckets[bucket].fetch_add(1, Relaxed);
    }

    /// `op`'s counters, summed over the shards.
    pub fn op(&self, op: Op) -> OpTotals {
        let mut t = OpTotals {
            buckets: vec![0; BUCKETS],
            ..OpTotals::default()
        };
        for shard in self.ops.iter() {
            let s = &shard.0[op as usize];
            t.count += s.count.load(Relaxed);
            t.errors += s.errors.load(Relaxed);
            t.total_ns += s.total_ns.load(Relaxed);
            t.max_ns = t.max_ns.max(s.max_ns.load(Relaxed));
            for (sum, b) in t.buckets.iter_mut().zip(&s.buckets) {
                *sum += b.load(Relaxed);
            }
        }
        t
    }

    /// The counters of the whole mount as report fields.
    pub fn fields(&self) -> Vec<Field> {
        let uptime_s = self.started.elapsed().as_secs_f64();
        vec![
            Field {
                key: "uptime_s",
                label: "uptime",
                value: Value::from((uptime_s * 1000.0).round() / 1000.0),
                text: format!("{uptime_s:.1} s"),
            },
            Field::bytes("bytes_read", "bytes read", self.bytes_read.sum()),
            Field::bytes("bytes_written", "bytes written", self.bytes_written.sum()),
            Field::count(
                "append_moved",
                "O_APPEND writes moved",
                self.append_moved.sum(),
            )
            .explained("placed elsewhere than the kernel expected; should stay 0"),
            Field::count(
                "held_times_skipped",
                "held times skipped",
                self.held_times_skipped.sum(),
            )
            .explained("the kernel's time write-backs to files with no name left, not written"),
        ]
    }

    /// A report, as text (aligned `label: value` lines, then a table of
    /// operations) or JSON (one object: each field's key, then `ops`).
    /// `extra` come first (mount point, pool, mode, free space, ...).
    pub fn report(&self, extra: &[Field], json: bool) -> String {
        let mut fields = extra.to_vec();
        fields.extend(self.fields());
        let ops: Vec<(Op, OpTotals)> = Op::ALL
            .iter()
            .map(|&op| (op, self.op(op)))
            .filter(|(_, s)| s.count > 0)
            .collect();
        if json {
            let mut obj = Map::new();
            for f in fields {
                obj.insert(f.key.to_string(), f.value);
            }
            let mut by_op = Map::new();
            for (op, s) in &ops {
                by_op.insert(
                    op.name().to_string(),
                    serde_json::json!({
                        "count": s.count,
                        "errors": s.errors,
                        "total_ns": s.total_ns,
                        "max_ns": s.max_ns,
                        "p50_ns": s.quantile_ns(0.5),
                        "p99_ns": s.quantile_ns(0.99),
                        "log2_ns_buckets": s.buckets,
                    }),
                );
            }
            obj.insert("ops".into(), Value::Object(by_op));
            return format!("{}\n", Value::Object(obj));
        }
        let mut out = aligned(&fields);
        out.push_str(&format!(
            "\n{:<16} {:>12} {:>8} {:>10} {:>10} {:>10} {:>12}\n",
            "operation", "count", "errors", "mean ns", "p50 ns", "p99 ns", "max ns"
        ));
        for (op, s) in &ops {
            out.push_str(&format!(
                "{:<16} {:>12} {:>8} {:>10} {:>10} {:>10} {:>12}\n",
                op.name(),
                s.count,
                s.errors,
                s.total_ns / s.count,
                s.quantile_ns(0.5),
                s.quantile_ns(0.99),
                s.max_ns
            ));
        }
        if ops.is_empty() {
            out.push_str("(no requests yet)\n");
        } else {
            out.push_str(
                "p50, p99: upper bound of the power-of-two latency bucket holding that quantile\n",
            );
        }
        out
    }
}

/// One line of a report: a stable key and a typed value for JSON, a label
/// and a worded value for people.
#[derive(Clone, Debug, PartialEq)]
pub struct Field {
    /// JSON key: snake_case, kept stable for scripts.
    pub key: &'static str,
    /// What a person reads: lower case words.
    pub label: &'static str,
    pub value: Value,
    /// The value for a person: units, and what it means when a number
    /// alone would not say.
    pub text: String,
}

impl Field {
    pub fn text(key: &'static str, label: &'static str, text: impl Into<String>) -> Field {
        let text = text.into();
        Field {
            key,
            label,
            value: Value::from(text.clone()),
            text,
        }
    }

    pub fn count(key: &'static str, label: &'static str, n: u64) -> Field {
        Field {
            key,
            label,
            value: Value::from(n),
            text: n.to_string(),
        }
    }

    /// A byte count, also shown in binary units.
    pub fn bytes(key: &'static str, label: &'static str, n: u64) -> Field {
        Field {
            key,
            label,
            value: Value::from(n),
            text: human_bytes(n),
        }
    }

    /// A yes/no fact, worded for each answer.
    pub fn flag(key: &'static str, label: &'static str, b: bool, yes: &str, no: &str) -> Field {
        Field {
            key,
            label,
            value: Value::from(b),
            text: (if b { yes } else { no }).to_string(),
        }
    }

    /// Add what the value means: "0 (should stay 0)".
    pub fn explained(mut self, meaning: &str) -> Field {
        self.text = format!("{} ({meaning})", self.text);
        self
    }
}

/// "512 B", "67108864 B (64.0 MiB)".
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    format!("{n} B ({v:.1} {})", UNITS[unit])
}

/// `label: value` lines, the values starting in one column.
pub fn aligned(fields: &[Field]) -> String {
    let width = fields.iter().map(|f| f.label.len()).max().unwrap_or(0) + 1;
    let mut out = String::new();
    for f in fields {
        out.push_str(&format!("{:<width$} {}\n", format!("{}:", f.label), f.text));
    }
    out
}

/// The socket a server for `mountpoint` (absolute, canonical) listens on,
/// in run directory `dir` (named in the engine's API: attaching clients
/// find it too).
pub use inkfs::api::attach::socket_path;

/// Longest request line (a word and its arguments), in bytes.
pub const REQUEST_BYTES_MAX: usize = 256;
/// Time a client has to send its whole request line.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Time allowed to each write of an answer.
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);
/// Clients served at once.
pub const CLIENTS_MAX: usize = 16;
/// Of [`CLIENTS_MAX`], kept for the owner and root.
pub const CLIENTS_RESERVED: usize = 4;
/// Clients served at once for one uid other than the owner and root.
pub const CLIENTS_PER_UID_MAX: usize = 4;
/// How long [`query`] retries a server that answers `error busy`.
const BUSY_RETRY: Duration = Duration::from_secs(5);

/// A client's request: its first word, and the words after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub word: String,
    pub args: Vec<String>,
}

impl Request {
    pub fn parse(line: &str) -> Result<Request, String> {
        let mut words = line.split_whitespace();
        let word = words.next().ok_or("empty request")?.to_string();
        Ok(Request {
            word,
            args: words.map(str::to_string).collect(),
        })
    }
}

/// Answers one request: the body of an `ok` answer, or the message of an
/// `error` one. Dispatches on [`Request::word`].
pub type Handler = Arc<dyn Fn(&Request) -> Result<String, String> + Send + Sync>;

/// Request words whose connections leave this protocol for their own
/// (`scrub`, `attach`), with the handler that takes each connection.
pub type Takers = Arc<Vec<(&'static str, crate::scrub::Handler)>>;

/// Who may ask the server (`-o stats=owner|all`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Access {
    /// The mount's owner (the server's effective uid) and root.
    #[default]
    OwnerAndRoot,
    /// Any local user (still at most [`CLIENTS_PER_UID_MAX`] at once each).
    Everyone,
}

/// The clients being served, per uid, against the limits.
struct Admission {
    owner: u32,
    access: Access,
    slots: Mutex<Slots>,
}

#[derive(Default)]
struct Slots {
    total: usize,
    per_uid: HashMap<u32, usize>,
}

/// A client being served; gives its place back when dropped.
struct Slot {
    admission: Arc<Admission>,
    uid: u32,
}

impl Admission {
    /// Take a place for a client of `uid` (None: unknown), or say why not.
    fn admit(self: &Arc<Self>, uid: Option<u32>) -> Result<Slot, String> {
        let Some(uid) = uid else {
            return Err("permission denied: cannot tell which user is asking".into());
        };
        let privileged = uid == 0 || uid == self.owner;
        if !privileged && self.access == Access::OwnerAndRoot {
            return Err(format!(
                "permission denied: the statistics of this mount are served to its owner \
                 (uid {}) and root only (mount with -o stats=all to serve every user)",
                self.owner
            ));
        }
        let mut s = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let limit = if privileged {
            CLIENTS_MAX
        } else {
            CLIENTS_MAX - CLIENTS_RESERVED
        };
        let mine = s.per_uid.get(&uid).copied().unwrap_or(0);
        if s.total >= limit || (!privileged && mine >= CLIENTS_PER_UID_MAX) {
            return Err(format!(
                "busy: {} clients being served ({mine} of uid {uid}); try again",
                s.total
            ));
        }
        s.total += 1;
        *s.per_uid.entry(uid).or_default() += 1;
        Ok(Slot {
            admission: self.clone(),
            uid,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut s = self
            .admission
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        s.total -= 1;
        if let Some(n) = s.per_uid.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                s.per_uid.remove(&self.uid);
            }
        }
    }
}

/// Who is at the other end of `conn` (SO_PEERCRED): the pid, uid and gid
/// the kernel recorded when it connected, which the peer cannot forge.
pub(crate) fn peer_cred(conn: &UnixStream) -> std::io::Result<libc::ucred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: u32::MAX,
        gid: u32::MAX,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt fills at most `len` bytes of `cred`, a valid
    // ucred that lives for the whole call.
    let rc = unsafe {
        libc::getsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(cred)
}

/// The uid of the process at the other end.
fn peer_uid(conn: &UnixStream) -> Option<u32> {
    peer_cred(conn).ok().map(|c| c.uid)
}

/// Make `dir` (if needed) and check that only this user can write in it:
/// a socket in a directory others can write could be replaced by theirs.
fn prepare_dir(dir: &Path) -> std::io::Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    // Others must be able to pass through to reach a socket they may use
    // (stats=all), never to list or write.
    let mode = if euid == 0 { 0o755 } else { 0o711 };
    match std::fs::DirBuilder::new().mode(mode).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.is_dir() || meta.uid() != euid || meta.mode() & 0o022 != 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "{}: not a directory owned by uid {euid} and writable by it alone",
                dir.display()
            ),
        ));
    }
    Ok(())
}

/// The stats server: a thread accepting connections, and one short-lived
/// thread per client being served (see the module comment for the limits).
pub struct StatsServer {
    path: PathBuf,
    /// Inode of our socket file (to remove only our own).
    ino: u64,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StatsServer {
    /// `handler` answers the requests of the module comment; `scrub`
    /// takes the connections that ask for a scrub (scrub.rs), if the
    /// engine has one.
    pub fn start(
        dir: &Path,
        mountpoint: &Path,
        access: Access,
        handler: Handler,
        takers: Takers,
    ) -> std::io::Result<StatsServer> {
        prepare_dir(dir)?;
        let path = socket_path(dir, mountpoint);
        // A socket left by a killed server: nobody listens on it any more
        // (we hold the mount point, so no live server can).
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)?;
        let ino = std::fs::metadata(&path)?.ino();
        // Until this chmod the umask decides; the peer check below does
        // not depend on it.
        let mode = match access {
            Access::OwnerAndRoot => 0o600,
            Access::Everyone => 0o666,
        };
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
        let admission = Arc::new(Admission {
            // SAFETY: geteuid has no preconditions and cannot fail.
            owner: unsafe { libc::geteuid() },
            access,
            slots: Mutex::new(Slots::default()),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("inkfs-stats".into())
            .spawn(move || accept_loop(&listener, &stop2, &admission, &handler, &takers))?;
        Ok(StatsServer {
            path,
            ino,
            stop,
            thread: Some(thread),
        })
    }

    pub fn stop(&mut self) {
        self.stop.store(true, Relaxed);
        // Remove the name first (only if it is still ours), then wake the
        // accept loop; the thread is not joined: it holds nothing that
        // needs an orderly end, and a wake-up that goes astray must not
        // hang the unmount.
        if std::fs::metadata(&self.path).map(|m| m.ino()).ok() == Some(self.ino) {
            let _ = std::fs::remove_file(&self.path);
        }
        if let Some(t) = self.thread.take() {
            let _ = UnixStream::connect(&self.path);
            drop(t);
        }
    }
}

impl Drop for StatsServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_loop(
    listener: &UnixListener,
    stop: &AtomicBool,
    admission: &Arc<Admission>,
    handler: &Handler,
    takers: &Takers,
) {
    for conn in listener.incoming() {
        if stop.load(Relaxed) {
            break;
        }
        let conn = match conn {
            Ok(c) => c,
            Err(_) => {
                // Out of descriptors or memory: do not spin.
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        match admission.admit(peer_uid(&conn)) {
            Err(msg) => refuse(conn, &msg),
            Ok(slot) => {
                let handler = handler.clone();
                let takers = takers.clone();
                // If the thread cannot start, the closure (the connection
                // and the slot) is dropped: the client sees the end.
                let _ = std::thread::Builder::new()
                    .name("inkfs-stats-client".into())
                    .spawn(move || {
                        serve_client(conn, &handler, &takers);
                        drop(slot);
                    });
            }
        }
    }
}

/// Tell a client it is not served, without ever waiting for it.
fn refuse(mut conn: UnixStream, msg: &str) {
    let _ = conn.set_nonblocking(true);
    let _ = conn.write_all(error_line(msg).as_bytes());
}

fn error_line(msg: &str) -> String {
    format!("error {}\n", msg.replace('\n', " "))
}

fn serve_client(mut conn: UnixStream, handler: &Handler, takers: &Takers) {
    let request = read_request(&mut conn, Instant::now() + REQUEST_TIMEOUT)
        .and_then(|line| Request::parse(&line));
    if let Ok(req) = &request {
        if let Some((_, take)) = takers.iter().find(|(word, _)| req.word == *word) {
            // A scrub or an attach speaks its own protocol (scrub.rs,
            // attach.rs) from its own thread, and checks who may ask
            // itself.
            take(conn);
            return;
        }
    }
    let answer = request.and_then(|req| handler(&req));
    let out = match answer {
        Ok(body) => format!("ok\n{body}"),
        Err(msg) => error_line(&msg),
    };
    let _ = conn.set_write_timeout(Some(WRITE_TIMEOUT));
    let _ = conn.write_all(out.as_bytes());
}

/// The request line, read by `deadline` (however the client trickles it).
fn read_request(conn: &mut UnixStream, deadline: Instant) -> Result<String, String> {
    let mut line = Vec::new();
    let mut chunk = [0u8; REQUEST_BYTES_MAX + 1];
    while !line.contains(&b'\n') && line.len() <= REQUEST_BYTES_MAX {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err("timed out waiting for the request line".into());
        }
        let _ = conn.set_read_timeout(Some(left));
        match conn.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => line.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err("timed out waiting for the request line".into())
            }
            Err(e) => return Err(format!("reading the request: {e}")),
        }
    }
    let end = line.iter().position(|&b| b == b'\n').unwrap_or(line.len());
    if end > REQUEST_BYTES_MAX {
        return Err(format!("request longer than {REQUEST_BYTES_MAX} bytes"));
    }
    String::from_utf8(line[..end].to_vec()).map_err(|_| "the request is not UTF-8".into())
}

/// Send `request` (a request line without its newline) to the server of
/// `mountpoint` (absolute), looking for its socket in each of `dirs`.
/// None: no server has a socket for that path; `Some(Ok(body))`: its
/// answer; `Some(Err)`: why there is none (a message for people).
pub fn query(dirs: &[PathBuf], mountpoint: &Path, request: &str) -> Option<Result<String, String>> {
    let path = dirs
        .iter()
        .map(|d| socket_path(d, mountpoint))
        .find(|p| p.exists())?;
    let started = Instant::now();
    loop {
        match ask(&path, mountpoint, request) {
            Err(msg) if msg.starts_with("busy") && started.elapsed() < BUSY_RETRY => {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(msg) => return Some(Err(format!("{}: {msg}", mountpoint.display()))),
            Ok(body) => return Some(Ok(body)),
        }
    }
}

/// One request on one connection.
fn ask(path: &Path, mountpoint: &Path, request: &str) -> Result<String, String> {
    let mut conn = UnixStream::connect(path).map_err(|e| match e.raw_os_error() {
        Some(libc::EACCES) => format!(
            "permission denied: the statistics of this mount are served to its owner{} and \
             root only (socket {})",
            mount_owner(mountpoint).map_or(String::new(), |u| format!(" (uid {u})")),
            path.display()
        ),
        _ => format!(
            "inkfs server is not running ({e}); stale socket {}",
            path.display()
        ),
    })?;
    let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
    // A server that refuses us may answer and close before reading what
    // we send: our write may then fail, and our read end in ECONNRESET
    // after its answer. The answer is what counts.
    let sent = conn.write_all(format!("{request}\n").as_bytes());
    let mut raw = Vec::new();
    let read = conn.read_to_end(&mut raw);
    if raw.is_empty() {
        sent.map_err(|e| format!("asking {}: {e}", path.display()))?;
        read.map_err(|e| format!("reading {}: {e}", path.display()))?;
    } else if let Err(e) = read {
        if e.raw_os_error() != Some(libc::ECONNRESET) {
            return Err(format!("reading {}: {e}", path.display()));
        }
    }
    let out = String::from_utf8_lossy(&raw).into_owned();
    if let Some(body) = out.strip_prefix("ok\n") {
        Ok(body.to_string())
    } else if let Some(msg) = out.strip_prefix("error ") {
        Err(msg.trim_end().to_string())
    } else if out.is_empty() {
        Err(format!("no answer from {}", path.display()))
    } else {
        // A server from before the status line: the body alone.
        Ok(out)
    }
}

/// The uid that mounted `mountpoint` (FUSE's `user_id=` in
/// /proc/self/mountinfo), if it is a FUSE mount.
pub fn mount_owner(mountpoint: &Path) -> Option<u32> {
    let want = mountpoint.to_str()?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        // mountinfo escapes blanks in the mount point as \040.
        let target = left.split(' ').nth(4)?.replace("\\040", " ");
        if target != want {
            return None;
        }
        let options = right.split(' ').nth(2)?;
        options
            .split(',')
            .find_map(|o| o.strip_prefix("user_id="))
            .and_then(|u| u.parse().ok())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_and_report() {
        let s = Stats::default();
        let t = clock::now();
        s.record(Op::read, t, true);
        s.record(Op::read, t, false);
        s.bytes_read.add(4096);
        assert_eq!(s.op(Op::read).count, 2);
        assert_eq!(s.op(Op::read).errors, 1);
        // Other threads add to other shards; the totals see all of them.
        std::thread::scope(|sc| {
            for _ in 0..3 {
                sc.spawn(|| s.record(Op::read, t, true));
            }
        });
        assert_eq!(s.op(Op::read).count, 5);
        assert_eq!(s.requests.sum(), 5);
        assert_eq!(s.op(Op::read).buckets.iter().sum::<u64>(), 5);
        let extra = [
            Field::text("mode", "consistency mode", "strict"),
            Field::bytes("free", "space free", 12 << 20),
            Field::flag("read_only", "read-only", false, "yes", "no"),
        ];
        let text = s.report(&extra, false);
        // Aligned "label: value" lines, then the table.
        let head: Vec<&str> = text.lines().take_while(|l| !l.is_empty()).collect();
        let column = |l: &str| {
            let c = l.find(':').unwrap() + 1;
            c + l[c..].len() - l[c..].trim_start().len()
        };
        assert!(head.iter().all(|l| column(l) == column(head[0])), "{text}");
        assert!(
            head.contains(&"space free:            12582912 B (12.0 MiB)"),
            "{text}"
        );
        assert!(
            head.contains(&"bytes read:            4096 B (4.0 KiB)"),
            "{text}"
        );
        assert!(text.contains("\nread "), "{text}");
        let json = s.report(&extra, true);
        assert!(
            json.starts_with("{\"mode\":\"strict\",\"free\":12582912,\"read_only\":false,"),
            "{json}"
        );
        assert!(
            json.contains("\"read\":{\"count\":5,\"errors\":1"),
            "{json}"
        );
        let parsed: Value = serde_json::from_str(&json).expect("valid JSON");
        assert_eq!(parsed["bytes_read"], 4096);
        assert!(s.op(Op::read).quantile_ns(0.99) > 0);
    }

    fn serve(access: Access) -> (tempfile::TempDir, PathBuf, StatsServer) {
        let dir = tempfile::tempdir().expect("tempdir");
        let mnt = PathBuf::from("/test/mount");
        let handler: Handler = Arc::new(|req: &Request| match req.word.as_str() {
            "text" => Ok(format!("report {}\n", req.args.join(" "))),
            other => Err(format!("unknown request '{other}'")),
        });
        let server = StatsServer::start(
            &dir.path().join("run"),
            &mnt,
            access,
            handler,
            Default::default(),
        )
        .expect("start");
        (dir, mnt, server)
    }

    #[test]
    fn requests_are_dispatched_and_errors_framed() {
        let (dir, mnt, _server) = serve(Access::OwnerAndRoot);
        let dirs = [dir.path().join("run")];
        assert_eq!(
            query(&dirs, &mnt, "text a b"),
            Some(Ok("report a b\n".into()))
        );
        let err = query(&dirs, &mnt, "frobnicate").unwrap().unwrap_err();
        assert!(err.ends_with("unknown request 'frobnicate'"), "{err}");
        let err = query(&dirs, &mnt, "").unwrap().unwrap_err();
        assert!(err.ends_with("empty request"), "{err}");
        let long = "text ".to_string() + &"x".repeat(REQUEST_BYTES_MAX);
        let err = query(&dirs, &mnt, &long).unwrap().unwrap_err();
        assert!(err.contains("longer than"), "{err}");
        assert!(query(&dirs, Path::new("/other"), "text").is_none());
        let mode = std::fs::metadata(socket_path(&dirs[0], &mnt))
            .unwrap()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "owner and root only");
    }

    #[test]
    fn idle_clients_do_not_hold_up_others() {
        let (dir, mnt, _server) = serve(Access::OwnerAndRoot);
        let dirs = [dir.path().join("run")];
        let path = socket_path(&dirs[0], &mnt);
        // More idle clients than the server serves at once: the owner's
        // own clients are only limited by CLIENTS_MAX, so the request
        // waits (retrying "busy") for the idle ones to time out, but is
        // answered, and the server keeps serving afterwards.
        let idle: Vec<UnixStream> = (0..CLIENTS_MAX + 4)
            .map(|_| UnixStream::connect(&path).expect("connect"))
            .collect();
        let t = Instant::now();
        assert_eq!(query(&dirs, &mnt, "text"), Some(Ok("report \n".into())));
        assert!(
            t.elapsed() < REQUEST_TIMEOUT + BUSY_RETRY,
            "{:?}",
            t.elapsed()
        );
        // An idle client is told why it was dropped.
        let mut first = &idle[0];
        let mut said = String::new();
        first.read_to_string(&mut said).unwrap();
        assert!(
            said.starts_with("error timed out") || said.starts_with("error busy"),
            "{said}"
        );
    }

    #[test]
    fn admission_limits_other_users_and_keeps_room_for_owner_and_root() {
        let adm = Arc::new(Admission {
            owner: 1000,
            access: Access::Everyone,
            slots: Mutex::new(Slots::default()),
        });
        let mine: Vec<Slot> = (0..CLIENTS_PER_UID_MAX)
            .map(|_| adm.admit(Some(2000)).expect("within the per-uid limit"))
            .collect();
        assert!(adm.admit(Some(2000)).err().unwrap().starts_with("busy"));
        // Other users fill the shared places...
        let mut others = Vec::new();
        for uid in 3000.. {
            match adm.admit(Some(uid)) {
                Ok(s) => others.push(s),
                Err(e) => {
                    assert!(e.starts_with("busy"), "{e}");
                    break;
                }
            }
        }
        assert_eq!(mine.len() + others.len(), CLIENTS_MAX - CLIENTS_RESERVED);
        // ...never the reserved ones.
        let reserved: Vec<Slot> = (0..CLIENTS_RESERVED)
            .map(|i| {
                adm.admit(Some(if i % 2 == 0 { 0 } else { 1000 }))
                    .expect("reserved")
            })
            .collect();
        assert!(adm.admit(Some(0)).is_err(), "CLIENTS_MAX in all");
        drop(reserved);
        drop(others);
        drop(mine);
        assert_eq!(adm.slots.lock().unwrap().total, 0);
        assert!(adm.slots.lock().unwrap().per_uid.is_empty());
        let owner_only = Arc::new(Admission {
            owner: 1000,
            access: Access::OwnerAndRoot,
            slots: Mutex::new(Slots::default()),
        });
        let e = owner_only.admit(Some(2000)).err().unwrap();
        assert!(e.starts_with("permission denied"), "{e}");
        assert!(owner_only.admit(Some(1000)).is_ok());
        assert!(owner_only.admit(Some(0)).is_ok());
        assert!(owner_only.admit(None).is_err());
    }
}
