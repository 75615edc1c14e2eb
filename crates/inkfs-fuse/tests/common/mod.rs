//! Shared helpers for the FUSE end-to-end tests.
//!
//! They run the real daemon (`inkfs-fuse`, this crate's binary, the same
//! code as `inkfs mount`), as root (FUSE mounts, setpriv, mknod), with pools
//! in /dev/shm. Tools they drive must be installed; a missing one fails
//! the test with the package to install (never a silent skip):
//!   apt-get install fuse3 sqlite3 attr git fio util-linux tar

#![allow(dead_code)]

pub mod preload;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_inkfs-fuse");

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

pub fn sh(script: &str) -> String {
    String::from_utf8_lossy(&run(Command::new("sh").arg("-ec").arg(script)).stdout).into_owned()
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
        let pid = server_pid(dir.path()).expect("server pid from the stats socket");
        Mounted { dir, pid }
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
        let this = std::mem::ManuallyDrop::new(self);
        run(Command::new("umount").arg(this.dir.path()));
        wait_exit(this.pid);
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
        // SAFETY: as in `unmount`.
        unsafe { std::ptr::read(&this.dir) }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).output();
        if !wait_exit_for(self.pid, Duration::from_secs(10)) {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(self.dir.path())
                .output();
            // SAFETY: kill has no memory preconditions.
            unsafe { libc::kill(self.pid as i32, libc::SIGKILL) };
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
