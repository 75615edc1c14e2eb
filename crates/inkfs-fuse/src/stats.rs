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

use std::cell::Cell;
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::clock::{self, Tick};

/// Where servers put their sockets and pid files.
pub const RUN_DIR: &str = "/run/inkfs";

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

    /// A report, as text or JSON. `extra` are (key, value) lines the caller
    /// adds (mount point, pool, mode, free space, ...), values already
    /// formatted; in JSON they are strings unless they parse as numbers.
    pub fn report(&self, extra: &[(String, String)], json: bool) -> String {
        let uptime_s = self.started.elapsed().as_secs_f64();
        let mut out = String::new();
        if json {
            out.push('{');
            for (k, v) in extra {
                if v.parse::<f64>().is_ok() {
                    out.push_str(&format!("\"{}\":{},", json_escape(k), v));
                } else {
                    out.push_str(&format!("\"{}\":\"{}\",", json_escape(k), json_escape(v)));
                }
            }
            out.push_str(&format!(
                "\"uptime_s\":{uptime_s:.3},\"bytes_read\":{},\"bytes_written\":{},\"append_moved\":{},\"ops\":{{",
                self.bytes_read.sum(),
                self.bytes_written.sum(),
                self.append_moved.sum()
            ));
            let mut first = true;
            for &op in Op::ALL {
                let s = self.op(op);
                let count = s.count;
                if count == 0 {
                    continue;
                }
                if !first {
                    out.push(',');
                }
                first = false;
                let buckets: Vec<String> = s.buckets.iter().map(|b| b.to_string()).collect();
                out.push_str(&format!(
                    "\"{}\":{{\"count\":{count},\"errors\":{},\"total_ns\":{},\"max_ns\":{},\"p50_ns\":{},\"p99_ns\":{},\"log2_ns_buckets\":[{}]}}",
                    op.name(),
                    s.errors,
                    s.total_ns,
                    s.max_ns,
                    s.quantile_ns(0.5),
                    s.quantile_ns(0.99),
                    buckets.join(",")
                ));
            }
            out.push_str("}}\n");
        } else {
            for (k, v) in extra {
                out.push_str(&format!("{k:<16} {v}\n"));
            }
            out.push_str(&format!("{:<16} {uptime_s:.1} s\n", "uptime"));
            out.push_str(&format!(
                "{:<16} {}\n{:<16} {}\n",
                "bytes read",
                self.bytes_read.sum(),
                "bytes written",
                self.bytes_written.sum()
            ));
            out.push_str(&format!(
                "\n{:<12} {:>12} {:>8} {:>10} {:>10} {:>10} {:>12}\n",
                "op", "count", "errors", "avg_ns", "p50_ns<", "p99_ns<", "max_ns"
            ));
            for &op in Op::ALL {
                let s = self.op(op);
                let count = s.count;
                if count == 0 {
                    continue;
                }
                out.push_str(&format!(
                    "{:<12} {:>12} {:>8} {:>10} {:>10} {:>10} {:>12}\n",
                    op.name(),
                    count,
                    s.errors,
                    s.total_ns / count,
                    s.quantile_ns(0.5),
                    s.quantile_ns(0.99),
                    s.max_ns
                ));
            }
        }
        out
    }
}

fn json_escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o
}

/// FNV-1a: a stable hash of the mount point path (std's hasher is not
/// stable across releases, and client and server may be different builds).
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The socket a server for `mountpoint` (absolute, canonical) listens on,
/// in run directory `dir`.
pub fn socket_path(dir: &Path, mountpoint: &Path) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    dir.join(format!(
        "{:016x}.sock",
        fnv1a(mountpoint.as_os_str().as_bytes())
    ))
}

/// Produces the report when a client asks (`json` or not).
pub type Reporter = Arc<dyn Fn(bool) -> String + Send + Sync>;

/// The stats server: a thread answering each connection with one report.
pub struct StatsServer {
    path: PathBuf,
    /// Inode of our socket file (to remove only our own).
    ino: u64,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StatsServer {
    pub fn start(
        dir: &Path,
        mountpoint: &Path,
        reporter: Reporter,
    ) -> std::io::Result<StatsServer> {
        std::fs::create_dir_all(dir)?;
        let path = socket_path(dir, mountpoint);
        // A socket left by a killed server: nobody listens on it any more
        // (we hold the mount point, so no live server can).
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)?;
        let ino = std::fs::metadata(&path)?.ino();
        {
            use std::os::unix::fs::PermissionsExt;
            // Statistics are not secret: let any user read them.
            let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("inkfs-stats".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if stop2.load(Relaxed) {
                        break;
                    }
                    let Ok(mut conn) = conn else { continue };
                    let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
                    let _ = conn.set_write_timeout(Some(Duration::from_secs(2)));
                    let mut req = [0u8; 16];
                    let n = conn.read(&mut req).unwrap_or(0);
                    let json = req[..n].starts_with(b"json");
                    let _ = conn.write_all(reporter(json).as_bytes());
                }
            })?;
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

/// Ask the server of `mountpoint` (absolute) for its report, looking in
/// each of `dirs`. None: no server has a socket for that path.
pub fn query(dirs: &[PathBuf], mountpoint: &Path, json: bool) -> Option<Result<String, String>> {
    let path = dirs
        .iter()
        .map(|d| socket_path(d, mountpoint))
        .find(|p| p.exists())?;
    let mut conn = match UnixStream::connect(&path) {
        Ok(c) => c,
        Err(e) => {
            return Some(Err(format!(
                "{}: inkfs server is not running ({e}); stale socket {}",
                mountpoint.display(),
                path.display()
            )))
        }
    };
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let req: &[u8] = if json { b"json\n" } else { b"text\n" };
    if let Err(e) = conn.write_all(req) {
        return Some(Err(format!("asking {}: {e}", path.display())));
    }
    let mut out = String::new();
    match conn.read_to_string(&mut out) {
        Ok(_) => Some(Ok(out)),
        Err(e) => Some(Err(format!("reading {}: {e}", path.display()))),
    }
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
        let text = s.report(&[("mode".into(), "strict".into())], false);
        assert!(text.contains("read"), "{text}");
        let json = s.report(
            &[
                ("mode".into(), "strict".into()),
                ("free".into(), "12".into()),
            ],
            true,
        );
        assert!(
            json.starts_with("{\"mode\":\"strict\",\"free\":12,"),
            "{json}"
        );
        assert!(
            json.contains("\"read\":{\"count\":5,\"errors\":1"),
            "{json}"
        );
        assert!(s.op(Op::read).quantile_ns(0.99) > 0);
    }
}
