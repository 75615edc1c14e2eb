//! Shared helpers for the FUSE end-to-end tests.
//!
//! They run the real daemon (`inkfs-fuse`, this crate's binary, the same
//! code as `inkfs mount`), as root (FUSE mounts, setpriv, mknod), with pools
//! in /dev/shm. Tools they drive must be installed; a missing one fails
//! the test with the package to install (never a silent skip):
//!   apt-get install fuse3 sqlite3 attr git fio util-linux tar
//!
//! With `INKFS_TEST_PRELOAD=1` ([`PRELOAD_ENV`]) every tool a test drives
//! (whatever [`tool`] and [`sh`] start: shells, cp, tar, git, sqlite3,
//! fio, setpriv'd shells...) runs with the preload library in, counting
//! into the test's statistics file; the server, `mount`, `umount` and fsck
//! never do (they are started with `Command::new`). Each [`Mounted`]
//! checks at its end that the tools run meanwhile were served by the
//! library at least once ([`PreloadWindow`]): a silent fallback to the
//! kernel does not pass as coverage. A test that checks the kernel path
//! itself opts out with [`kernel_only`] and a reason.

#![allow(dead_code)]

pub mod lanes;
pub mod preload;

use std::cell::Cell;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_inkfs-fuse");

/// `INKFS_TEST_PRELOAD=1`: the tools the tests drive run under the preload
/// library (module docs).
pub const PRELOAD_ENV: &str = "INKFS_TEST_PRELOAD";

thread_local! {
    /// This test (its thread) drives its tools through the kernel.
    static KERNEL_ONLY: Cell<bool> = const { Cell::new(false) };
}

/// Whether the tools this test drives run under the preload library:
/// `INKFS_TEST_PRELOAD=1`, the test did not opt out, and this is not one
/// of the library's own tests (preload*.rs choose for each command).
pub fn preloading() -> bool {
    std::env::var(PRELOAD_ENV).is_ok_and(|v| v == "1")
        && !KERNEL_ONLY.with(Cell::get)
        && !library_test()
}

/// The library's own tests (preload*.rs) say for each command whether the
/// library is in; `INKFS_TEST_PRELOAD` leaves them as they are.
fn library_test() -> bool {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .is_some_and(|n| n.starts_with("preload"))
}

/// This test checks the kernel's path (its request counts, page cache,
/// caches) or runs where the library is refused: under
/// `INKFS_TEST_PRELOAD=1` its tools run without the library. `why` is
/// printed (with `--nocapture`) so a run says what it left out.
pub fn kernel_only(why: &str) {
    if std::env::var(PRELOAD_ENV).is_ok_and(|v| v == "1") {
        eprintln!("{}: tools through the kernel: {why}", test_name());
    }
    KERNEL_ONLY.with(|k| k.set(true));
}

/// The running test's name (libtest names each test's thread after it).
fn test_name() -> String {
    std::thread::current()
        .name()
        .unwrap_or("unnamed")
        .replace("::", "-")
}

/// Where this test's preloaded tools count what the library served
/// (`INKFS_PRELOAD_STATS`): one file per test, in a directory of this test
/// process, writable by every user (tools run as other users append too).
pub fn preload_stats() -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("inkfs-test-preload-{}", std::process::id()));
    if !dir.is_dir() {
        let _ = std::fs::create_dir(&dir);
        let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777));
    }
    let path = dir.join(format!("{}.stats", test_name()));
    if !path.exists() {
        let _ = std::fs::write(&path, b"");
        let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666));
    }
    path
}

/// A command for a tool the test drives, as a user would run it: under
/// `INKFS_TEST_PRELOAD=1` with the preload library in and its counters
/// going to [`preload_stats`]. Never for the server, mount, umount or
/// fsck: those use `Command::new`.
pub fn tool(program: impl AsRef<OsStr>) -> Command {
    let mut c = Command::new(program);
    if preloading() {
        c.env("LD_PRELOAD", preload::lib())
            .env("INKFS_PRELOAD_STATS", preload_stats());
    }
    c
}

/// Set in a child [`in_preloaded_child`] starts: the argument of the test
/// body it runs.
pub const CHILD_ENV: &str = "INKFS_TEST_CHILD";

/// Run test `name` of this test binary again, in a child process with the
/// preload library in, `arg` in its [`CHILD_ENV`]: the test body's own
/// file calls (std::fs, libc) then go through the library. A child, not
/// this process: the library reads the mount table when it is loaded, so
/// in this process it would never know the mounts a test makes. The child
/// must pass, and the library must have served some of its calls.
pub fn in_preloaded_child(name: &str, arg: &str) {
    let child = PreloadedChild::new(name, arg);
    let out = child.command().output().expect("run the child test");
    child.check(&out);
}

/// A child of this test binary running test `name` with the library in
/// ([`in_preloaded_child`]), for a test that talks to it while it runs
/// ([`PreloadedChild::command`] to spawn it, [`PreloadedChild::check`]
/// on its output).
pub struct PreloadedChild {
    name: String,
    arg: String,
    stats: PathBuf,
    from: u64,
}

impl PreloadedChild {
    pub fn new(name: &str, arg: &str) -> PreloadedChild {
        let stats = preload_stats();
        let from = std::fs::metadata(&stats).map(|m| m.len()).unwrap_or(0);
        PreloadedChild {
            name: name.to_string(),
            arg: arg.to_string(),
            stats,
            from,
        }
    }

    /// The child's command: this test binary, the one test, the library.
    pub fn command(&self) -> Command {
        let me = std::env::current_exe().expect("this test binary");
        let mut c = Command::new(me);
        c.args(["--exact", &self.name, "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, &self.arg)
            .env("LD_PRELOAD", preload::lib())
            .env("INKFS_PRELOAD_STATS", &self.stats);
        c
    }

    /// The child passed, and the library served some of its calls.
    pub fn check(&self, out: &Output) {
        let name = &self.name;
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("test result: ok. 1 passed"),
            "{name} under the library ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let counts = preload_counts_from(&self.stats, self.from);
        let served: u64 = counts
            .iter()
            .filter(|(k, _)| k.ends_with("_local"))
            .map(|(_, v)| v)
            .sum();
        // A posix-mode run (`INKFS_TEST_MOUNT_OPTS=mode=posix...`): the
        // server refuses every attach by design, and the child's calls
        // went through the kernel; the refusal must have been met.
        let posix_run = std::env::var(MOUNT_OPTS_ENV).is_ok_and(|o| o.contains("mode=posix"));
        let refused = posix_run && counts.get("attach_refused").is_some_and(|n| *n > 0);
        eprintln!(
            "{name}: the test's own calls under the library{}: {counts:?}",
            if refused {
                " (posix mode: refused)"
            } else {
                ""
            }
        );
        assert!(
            served > 0 || refused,
            "{name}: nothing served by the library: {counts:?}"
        );
    }
}

/// In a child started by [`in_preloaded_child`]: its argument. `None`
/// otherwise (the test is only a child's body and returns at once).
pub fn child_arg() -> Option<String> {
    std::env::var(CHILD_ENV).ok()
}

/// The counters of the lines `from` bytes on into `stats`, summed.
pub fn preload_counts_from(stats: &Path, from: u64) -> std::collections::BTreeMap<String, u64> {
    let text = std::fs::read(stats).unwrap_or_default();
    let tail = text.get(from as usize..).unwrap_or_default();
    let mut sum = std::collections::BTreeMap::new();
    for word in String::from_utf8_lossy(tail).split_whitespace() {
        if let Some((k, v)) = word.split_once('=') {
            if k != "pid" {
                *sum.entry(k.to_string()).or_insert(0) += v.parse::<u64>().unwrap_or(0);
            }
        }
    }
    sum
}

/// What the test's preloaded tools reported while a mount was up: at the
/// mount's end, if any tool reported, the library must have served at
/// least one call (a read, stat, listing, write, fsync, open, namespace
/// or attribute change from the pool); all through the kernel would be a
/// silent fallback passing as coverage.
pub struct PreloadWindow {
    stats: PathBuf,
    from: u64,
    /// A posix-mode mount: its server refuses every attach (its writes
    /// may wait in the kernel's page cache, which a client cannot see),
    /// so the tools fall back by design and nothing is asserted.
    refused: bool,
}

impl PreloadWindow {
    fn start(mnt: &Path) -> Option<PreloadWindow> {
        if !preloading() {
            return None;
        }
        let stats = preload_stats();
        let from = std::fs::metadata(&stats).map(|m| m.len()).unwrap_or(0);
        let refused = stats_json(mnt).is_some_and(|r| r["mode"] == "posix");
        Some(PreloadWindow {
            stats,
            from,
            refused,
        })
    }

    fn check(&self, mnt: &Path) {
        if std::thread::panicking() {
            return;
        }
        let counts = preload_counts_from(&self.stats, self.from);
        if counts.is_empty() {
            return;
        }
        let served: u64 = counts
            .iter()
            .filter(|(k, _)| k.ends_with("_local"))
            .map(|(_, v)| v)
            .sum();
        eprintln!(
            "{}: {} under the library{}: {counts:?}",
            test_name(),
            mnt.display(),
            if self.refused {
                " (posix mode: refused)"
            } else {
                ""
            }
        );
        assert!(
            served > 0 || self.refused,
            "{}: the tools run on {} under {PRELOAD_ENV}=1 were never served by the library \
             (all through the kernel): {counts:?}",
            test_name(),
            mnt.display()
        );
    }
}

pub fn require_root() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "the FUSE end-to-end tests must run as root"
    );
}

/// Fail (not skip) if `tool` is missing, naming the Debian package.
pub fn require_tool(tool: &str, package: &str) {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(found, "`{tool}` is missing: apt-get install {package}");
}

pub fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `sh -ec script` (a tool: under the library with `INKFS_TEST_PRELOAD=1`),
/// which must succeed; its standard output.
pub fn sh(script: &str) -> String {
    String::from_utf8_lossy(&run(tool("sh").arg("-ec").arg(script)).stdout).into_owned()
}

/// A formatted pool file in /dev/shm, removed on drop.
pub struct Pool {
    pub path: PathBuf,
}

impl Pool {
    pub fn new(name: &str, size_mib: u64) -> Pool {
        let path = PathBuf::from(format!(
            "/dev/shm/inkfs-fuse-test-{name}-{}.pool",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&path);
        let opts = inkfs::pmem::PoolOpenOptions {
            create_size_bytes: Some(size_mib << 20),
            read_only: false,
        };
        let pm = inkfs::pmem::MappedPool::open(&path, &opts).expect("create pool");
        inkfs::Fs::format(&pm, &inkfs::types::FormatOptions::default()).expect("format pool");
        drop(pm);
        Pool { path }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A hybrid pool: the pool in /dev/shm, its data file in /var/tmp (a disk
/// file system, so O_DIRECT and fdatasync are real); both removed on drop.
pub struct HybridPool {
    pub pool: Pool,
    pub data: PathBuf,
}

impl HybridPool {
    /// `pool_mib` of PM, `data_mib` of data device; writes of at least
    /// `threshold_bytes` go to the device.
    pub fn new(name: &str, pool_mib: u64, data_mib: u64, threshold_bytes: u32) -> HybridPool {
        let pool = Pool::new(name, pool_mib);
        let data = PathBuf::from(format!(
            "/var/tmp/inkfs-fuse-test-{name}-{}.data",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&data);
        let pm = inkfs::pmem::MappedPool::open(&pool.path, &Default::default()).expect("open pool");
        let dev =
            inkfs::blockdev::FileDev::create(&data, data_mib << 20).expect("create data file");
        inkfs::api::Filesystem::format_hybrid(
            &pm,
            &Default::default(),
            &inkfs::api::HybridFormat {
                device: &dev,
                path: &data,
                blocks: None,
                threshold_bytes,
                unit_blocks: 256,
            },
        )
        .expect("format hybrid pool");
        HybridPool { pool, data }
    }
}

impl Drop for HybridPool {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.data);
    }
}

/// Options every mount of a test run starts from (`INKFS_TEST_MOUNT_OPTS`,
/// e.g. `mode=posix` to run the whole suite in posix mode with the
/// writeback cache); a test's own options come after them and win.
pub const MOUNT_OPTS_ENV: &str = "INKFS_TEST_MOUNT_OPTS";

pub fn mount_with(pool: &Path, mnt: &Path, opts: &str) -> Output {
    let mut c = Command::new(BIN);
    c.arg("mount").arg(pool).arg(mnt);
    if let Ok(base) = std::env::var(MOUNT_OPTS_ENV) {
        if !base.is_empty() {
            c.arg("-o").arg(base);
        }
    }
    if !opts.is_empty() {
        c.arg("-o").arg(opts);
    }
    c.output().expect("run inkfs-fuse mount")
}

/// A mounted file system on a fresh directory; unmounted on drop.
pub struct Mounted {
    pub dir: tempfile::TempDir,
    pub pid: u32,
    preload: Option<PreloadWindow>,
}

impl Mounted {
    pub fn new(pool: &Pool, opts: &str) -> Mounted {
        require_root();
        let dir = tempfile::Builder::new()
            .prefix("inkfs-mnt-")
            .tempdir()
            .expect("tempdir");
        Self::at(pool, dir, opts)
    }

    pub fn at(pool: &Pool, dir: tempfile::TempDir, opts: &str) -> Mounted {
        let out = mount_with(&pool.path, dir.path(), opts);
        assert!(
            out.status.success(),
            "mount failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Self::adopt(dir)
    }

    /// The mount a test made itself at `dir` (its server's pid from the
    /// statistics socket).
    pub fn adopt(dir: tempfile::TempDir) -> Mounted {
        let pid = server_pid(dir.path()).expect("server pid from the stats socket");
        let preload = PreloadWindow::start(dir.path());
        Mounted { dir, pid, preload }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn p(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// `umount` and wait for the server to finish its clean unmount.
    /// Returns the mount point directory for a later remount.
    pub fn unmount(self) -> tempfile::TempDir {
        check_kernel_refs(self.dir.path());
        let this = std::mem::ManuallyDrop::new(self);
        run(Command::new("umount").arg(this.dir.path()));
        wait_exit(this.pid);
        if let Some(w) = &this.preload {
            w.check(this.dir.path());
        }
        // SAFETY: `this` is never used again and never dropped; the field
        // is moved out exactly once.
        unsafe { std::ptr::read(&this.dir) }
    }

    /// SIGKILL the server, leaving a dead mount behind.
    pub fn kill9(self) -> tempfile::TempDir {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: kill has no memory preconditions.
        unsafe { libc::kill(this.pid as i32, libc::SIGKILL) };
        wait_exit(this.pid);
        if let Some(w) = &this.preload {
            w.check(this.dir.path());
        }
        // SAFETY: as in `unmount`.
        unsafe { std::ptr::read(&this.dir) }
    }
}

/// The server's count of the kernel's lookups never fell short of a
/// FORGET (crates/inkfs-fuse/src/kernel_refs.rs): checked at every
/// unmount of the suite.
fn check_kernel_refs(mnt: &Path) {
    if std::thread::panicking() {
        return;
    }
    // (No report: the mount is dead or gone already.)
    let mismatched = stats_json(mnt).and_then(|r| r["kernel_refs_mismatched"].as_u64());
    assert!(
        mismatched.unwrap_or(0) == 0,
        "the server's lookup counts fell short of the kernel's FORGETs {mismatched:?} times"
    );
}

impl Drop for Mounted {
    fn drop(&mut self) {
        check_kernel_refs(self.dir.path());
        let _ = Command::new("umount").arg(self.dir.path()).output();
        if !wait_exit_for(self.pid, Duration::from_secs(10)) {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(self.dir.path())
                .output();
            // SAFETY: kill has no memory preconditions.
            unsafe { libc::kill(self.pid as i32, libc::SIGKILL) };
        }
        if let Some(w) = &self.preload {
            w.check(self.dir.path());
        }
    }
}

/// The server's JSON statistics report, parsed.
pub fn stats_json(mnt: &Path) -> Option<serde_json::Value> {
    let report = inkfs_fuse::stat_mountpoint(mnt, true)?.ok()?;
    serde_json::from_str(&report).ok()
}

/// Whether the mount at `mnt` has the writeback cache (posix mode).
pub fn writeback_cache(mnt: &Path) -> bool {
    let report = stats_json(mnt).expect("statistics of the mount");
    report["writeback_cache"]
        .as_bool()
        .unwrap_or_else(|| panic!("no writeback_cache in {report}"))
}

pub fn server_pid(mnt: &Path) -> Option<u32> {
    stats_json(mnt)?["pid"].as_u64().map(|p| p as u32)
}

/// Whether the mount found the pool cleanly unmounted.
pub fn mounted_clean(mnt: &Path) -> bool {
    let report = stats_json(mnt).expect("statistics of the mount");
    report["mounted_clean"]
        .as_bool()
        .unwrap_or_else(|| panic!("no mounted_clean in {report}"))
}

fn alive(pid: u32) -> bool {
    // Alive while any of its threads is: a killed process's leader turns
    // zombie first, and its descriptors (the pool lock) close with the last
    // thread. A zombie with no live thread (exited, not yet reaped by
    // whoever adopted it) counts as gone.
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().any(|t| {
        std::fs::read_to_string(t.path().join("stat")).is_ok_and(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
    })
}

pub fn wait_exit_for(pid: u32, limit: Duration) -> bool {
    let t = Instant::now();
    while alive(pid) {
        if t.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

pub fn wait_exit(pid: u32) {
    assert!(
        wait_exit_for(pid, Duration::from_secs(30)),
        "server {pid} did not exit"
    );
}

pub fn is_mounted(mnt: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let want = mnt.to_string_lossy();
    mounts.lines().any(|l| l.split(' ').nth(1) == Some(&want))
}

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repo root")
}
