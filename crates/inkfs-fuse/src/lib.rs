//! inkfs FUSE front end.
//!
//! - [`mount_main`]: `inkfs mount POOL MOUNTPOINT [-f] [-o OPTIONS]`
//! - [`stat_mountpoint`]: live statistics of a running server (`inkfs stat`)
//! - [`null_main`]: a do-nothing FUSE file system, FUSE's own floor for
//!   benchmarks (`inkfs null-fs MOUNTPOINT`)
//! - [`install_helper_main`]: installs `/sbin/mount.fuse.inkfs` so that
//!   `mount -t fuse.inkfs` and /etc/fstab work
//!
//! Module map: `engine` (the engine API the front end needs), `fs` (FUSE
//! request handlers), `fileattr` (the chattr/lsattr ioctls), `handles` (fh table), `stats` (counters, histograms,
//! the stats socket), `mount` (options, daemon, pool lock, dead mounts),
//! `nullfs`, `memfs` (in-memory reference engine for tests).

pub mod clock;
pub mod engine;
pub mod fileattr;
pub mod fs;
pub mod handles;
#[doc(hidden)]
pub mod memfs;
pub mod mount;
pub mod nullfs;
pub mod poll;
mod real;
pub mod stats;

use std::path::{Path, PathBuf};

pub use mount::mount_main;
pub use nullfs::null_main;

/// Statistics of the inkfs server mounted on `path`, as text or JSON.
/// None: `path` is not the mount point of a running (or crashed) inkfs
/// server; `Some(Err)`: it is one, but its server did not answer.
pub fn stat_mountpoint(path: &Path, json: bool) -> Option<Result<String, String>> {
    // A dead mount cannot be canonicalised (ENOTCONN): fall back to the
    // absolute path, which is what its server was started with in the
    // common case.
    let abs = match path.canonicalize() {
        Ok(p) => p,
        Err(_) => std::path::absolute(path).ok()?,
    };
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    let dirs = [
        PathBuf::from(stats::RUN_DIR),
        PathBuf::from(format!("/tmp/inkfs-{euid}")),
    ];
    stats::query(&dirs, &abs, json)
}

/// The mount(8) helper script, installed as /sbin/mount.fuse.inkfs.
pub const MOUNT_HELPER: &str = include_str!("../mount.fuse.inkfs");

/// `inkfs install-helper [DIR]`: install the mount(8) helper (default
/// /sbin) pointing at this very binary, so that `mount -t fuse.inkfs` and
/// /etc/fstab lines work.
pub fn install_helper_main(args: &[String]) -> i32 {
    let dir = args
        .first()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/sbin"));
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("inkfs install-helper: cannot find this program: {e}");
            return 1;
        }
    };
    let script = MOUNT_HELPER.replace(
        "INKFS=${INKFS:-inkfs}",
        &format!("INKFS=${{INKFS:-{}}}", exe.display()),
    );
    let path = dir.join("mount.fuse.inkfs");
    let res = std::fs::write(&path, script).and_then(|()| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
    });
    match res {
        Ok(()) => {
            println!("installed {} (runs {})", path.display(), exe.display());
            0
        }
        Err(e) => {
            eprintln!("inkfs install-helper: {}: {e}", path.display());
            1
        }
    }
}
