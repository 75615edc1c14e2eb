//! The real engine behind the front end: `inkfs::Fs` over a mapped pool.

use std::path::Path;

use crate::memfs::MemFs;
use crate::mount::{run_engine, MountConfig, Notify};

/// The pool name that mounts the in-memory reference engine instead of a
/// pool (a testing aid: nothing is persisted).
pub const MEMFS_POOL: &str = "memfs:";

/// Open the pool of `cfg`, mount the engine and serve it on `mnt`.
pub fn serve_pool(cfg: &MountConfig, mnt: &Path, notify: &mut Notify) -> i32 {
    if cfg.pool.as_os_str() == MEMFS_POOL {
        let info = vec![("engine".to_string(), "memfs (in-memory reference, not persistent)".to_string())];
        return run_engine(MemFs::new(cfg.read_only), cfg, mnt, info, notify, |_| Ok(()));
    }
    notify.fail("the inkfs engine is not available in this build yet");
    1
}
