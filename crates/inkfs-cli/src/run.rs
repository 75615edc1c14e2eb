//! `inkfs run -- CMD [ARGS...]`: run a program with the preload library,
//! so its reads, stats and directory listings of files under inkfs mounts
//! are served from the pool in the process (docs/KERNEL-FREE.md, "Built:
//! the preload library").

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

/// The library's file name.
pub const LIB_NAME: &str = "libinkfs_preload.so";

/// Run a program with the preload library (LD_PRELOAD): its reads, stats
/// and directory listings of files under inkfs mounts (strict or sync mode)
/// are served from the pool mapped in the process; everything else goes
/// to the kernel as without it
#[derive(clap::Args)]
#[command(
    after_help = "Example: inkfs run -- sqlite3 /mnt/ink/db 'select count(*) from t'\n\n\
The library is looked for next to this binary, then in ../lib from it; \
--lib names another. Statically linked programs (and Go programs) do not \
load it and use the mount as before."
)]
pub struct RunArgs {
    /// The preload library to use instead of the one installed with inkfs
    #[arg(long, value_name = "PATH")]
    pub lib: Option<PathBuf>,
    /// The program and its arguments
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    pub cmd: Vec<OsString>,
}

/// The installed library: next to the running binary (a cargo target
/// directory, or an install's bin/ holding both), then its ../lib.
fn find_lib() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    [dir.join(LIB_NAME), dir.join("../lib").join(LIB_NAME)]
        .into_iter()
        .find(|p| p.is_file())
}

/// LD_PRELOAD with `lib` first (kept once), then what was there.
fn preload_value(lib: &Path, old: Option<OsString>) -> OsString {
    let mut v = OsString::from(lib);
    if let Some(old) = old {
        let lib_os = lib.as_os_str();
        let rest: Vec<&std::ffi::OsStr> = std::os::unix::ffi::OsStrExt::as_bytes(old.as_os_str())
            .split(|&b| b == b':' || b == b' ')
            .filter(|s| !s.is_empty())
            .map(std::os::unix::ffi::OsStrExt::from_bytes)
            .filter(|s| *s != lib_os)
            .collect();
        for r in rest {
            v.push(":");
            v.push(r);
        }
    }
    v
}

/// Exec the program (returns only on failure).
pub fn run(a: &RunArgs) -> Result<(), String> {
    let lib = match &a.lib {
        Some(l) => l.clone(),
        None => find_lib().ok_or_else(|| {
            format!(
                "{LIB_NAME} not found next to this binary or in ../lib from it (use --lib PATH)"
            )
        })?,
    };
    let lib = lib
        .canonicalize()
        .map_err(|e| format!("{}: {e}", lib.display()))?;
    let (prog, args) = a.cmd.split_first().ok_or("no program given")?;
    let err = std::process::Command::new(prog)
        .args(args)
        .env(
            "LD_PRELOAD",
            preload_value(&lib, std::env::var_os("LD_PRELOAD")),
        )
        .exec();
    Err(format!("running {}: {err}", Path::new(prog).display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preload_list() {
        let lib = Path::new("/x/libinkfs_preload.so");
        assert_eq!(preload_value(lib, None), "/x/libinkfs_preload.so");
        assert_eq!(
            preload_value(lib, Some("/a.so /x/libinkfs_preload.so:/b.so".into())),
            "/x/libinkfs_preload.so:/a.so:/b.so"
        );
    }
}
