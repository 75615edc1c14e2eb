//! inkfs FUSE front end.
//!
//! - [`mount_main`]: `inkfs mount POOL MOUNTPOINT [-f] [-o OPTIONS]`; its
//!   arguments, [`MountArgs`], [`NullArgs`] and [`InstallHelperArgs`], are
//!   clap `Args` that the `inkfs` CLI and this crate's binary share
//! - [`stat_mountpoint`]: live statistics of a running server (`inkfs stat`)
//! - [`scrub::request`]: an online check run by a running server
//!   (`inkfs scrub`)
//! - [`null_main`]: a do-nothing FUSE file system, FUSE's own floor for
//!   benchmarks (`inkfs null-fs MOUNTPOINT`)
//! - [`install_helper_main`]: installs `/sbin/mount.fuse.inkfs` so that
//!   `mount -t fuse.inkfs` and /etc/fstab work
//!
//! Module map: `fs` (FUSE request handlers: each a call of `inkfs::api`),
//! `creds` (the caller's credentials, groups included), `fileattr` (the
//! chattr/lsattr ioctls), `handles` (fh table), `serve` (the pool claimed,
//! mounted and served), `stats` (counters, histograms, the stats socket),
//! `scrub` (scrub requests on that socket, both ends), `attach` (attach
//! requests on that socket: the kernel-free path's clients), `inval`
//! (telling the kernel what changed behind its back), `open` (regular
//! files opened by the kernel alone: one handle per inode), `kernel_refs` (the
//! kernel's lookup counts, the removed inodes kept for it, the
//! invalidations a client's change can skip), `mount`
//! (options, daemon, dead mounts), `nullfs`, `writeback` (a hybrid posix
//! mount's write-backs answered after one shared device flush).

pub mod attach;
pub mod clock;
mod creds;
pub mod dirlease;
pub mod fileattr;
pub mod fs;
pub mod handles;
pub mod inval;
pub mod kernel_refs;
pub mod lanes;
pub mod lease;
pub mod mount;
pub mod ns;
pub mod nullfs;
pub mod open;
pub mod poll;
pub mod scrub;
mod serve;
pub mod stats;
pub mod writeback;

use std::path::{Path, PathBuf};

/// The engine the mount serves: `inkfs::api` over a mapped pool.
pub type Engine = inkfs::api::Filesystem<inkfs::pmem::MappedPool>;

pub use mount::{mount_main, MountArgs};
pub use nullfs::{null_main, NullArgs};

/// Statistics of the inkfs server mounted on `path`, as text or JSON.
/// None: `path` is not the mount point of a running (or crashed) inkfs
/// server; `Some(Err)`: it is one, but its server did not answer (or does
/// not serve this user).
pub fn stat_mountpoint(path: &Path, json: bool) -> Option<Result<String, String>> {
    request_mountpoint(path, if json { "json" } else { "text" })
}

/// Send one request line (`text`, `json`, ...; the protocol is described in
/// `stats.rs`) to the server of the mount at `path`.
pub fn request_mountpoint(path: &Path, request: &str) -> Option<Result<String, String>> {
    let (dirs, abs) = socket_dirs(path)?;
    stats::query(&dirs, &abs, request)
}

/// Where the server of mount point `path` may have its socket: the run
/// directories to look in, and the absolute mount point it is named after.
fn socket_dirs(path: &Path) -> Option<(Vec<PathBuf>, PathBuf)> {
    // A dead mount cannot be canonicalised (ENOTCONN): fall back to the
    // absolute path, which is what its server was started with in the
    // common case.
    let abs = match path.canonicalize() {
        Ok(p) => p,
        Err(_) => std::path::absolute(path).ok()?,
    };
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    let mut dirs = vec![
        PathBuf::from(stats::RUN_DIR),
        PathBuf::from(format!("/tmp/inkfs-{euid}")),
    ];
    // Root asking about a user's mount: that user's directory.
    if let Some(owner) = stats::mount_owner(&abs).filter(|&o| o != 0 && o != euid) {
        dirs.push(PathBuf::from(format!("/tmp/inkfs-{owner}")));
    }
    Some((dirs, abs))
}

/// The socket of the inkfs server mounted on `path`, if there is one.
pub(crate) fn server_socket(path: &Path) -> Option<PathBuf> {
    let (dirs, abs) = socket_dirs(path)?;
    dirs.iter()
        .map(|d| stats::socket_path(d, &abs))
        .find(|p| p.exists())
}

/// The mount(8) helper script, installed as /sbin/mount.fuse.inkfs.
pub const MOUNT_HELPER: &str = include_str!("../mount.fuse.inkfs");

/// Install the mount(8) helper mount.fuse.inkfs, for `mount -t fuse.inkfs`
/// and /etc/fstab
///
/// The helper runs the `inkfs` found on the standard PATH at mount time,
/// not the one in a build tree (a `cargo clean` must not break fstab
/// mounts); this says so when no installed `inkfs` is there yet.
#[derive(clap::Args, Clone, Debug)]
pub struct InstallHelperArgs {
    /// The directory to install it in
    #[arg(default_value = "/sbin")]
    pub dir: PathBuf,
}

/// `inkfs install-helper [DIR]`; returns the exit status (0, or 1).
pub fn install_helper_main(args: &InstallHelperArgs) -> i32 {
    let dir = &args.dir;
    let path = dir.join("mount.fuse.inkfs");
    let res = std::fs::write(&path, MOUNT_HELPER).and_then(|()| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
    });
    if let Err(e) = res {
        eprintln!("inkfs install-helper: {}: {e}", path.display());
        return 1;
    }
    match installed_inkfs() {
        Some(bin) => println!("installed {} (runs {})", path.display(), bin.display()),
        None => println!(
            "installed {}; it runs `inkfs` from the standard PATH, where there is none yet:\n  \
             install -m755 {} /usr/local/sbin/   (or: cargo install --path crates/inkfs-cli --root /usr/local)",
            path.display(),
            std::env::current_exe()
                .map(|e| e.display().to_string())
                .unwrap_or_else(|_| "target/release/inkfs".into())
        ),
    }
    0
}

/// The `inkfs` the helper will run: the first on the PATH mount(8) and
/// systemd give it.
fn installed_inkfs() -> Option<PathBuf> {
    [
        "/usr/local/sbin",
        "/usr/local/bin",
        "/usr/sbin",
        "/usr/bin",
        "/sbin",
        "/bin",
    ]
    .iter()
    .map(|d| Path::new(d).join("inkfs"))
    .find(|p| p.is_file())
}
