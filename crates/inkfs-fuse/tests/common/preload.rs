//! Helpers of the preload library's tests (preload.rs, preload_ns.rs):
//! running a command with and without the library, and its counters.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{Pool, BIN};

pub const PYTHON: &str = "/usr/bin/python3";

/// Whether the library under test asks for directory leases (its
/// creates in a directory made under the lease after k = 4 through the
/// ring): off by default, on with `INKFS_PRELOAD_DIR_LEASE=1` in the
/// test's environment, which the programs it starts inherit
/// (crates/inkfs-preload/src/names.rs).
pub fn lib_asks_dir_leases() -> bool {
    std::env::var_os("INKFS_PRELOAD_DIR_LEASE").is_some_and(|v| v == "1")
}

/// The library cargo built for this test run (a dev-dependency of this
/// crate): in the deps directory, else next to the binaries.
pub fn lib() -> PathBuf {
    let dir = Path::new(BIN).parent().expect("target directory");
    let found = [dir.join("deps"), dir.to_path_buf()]
        .into_iter()
        .map(|d| d.join("libinkfs_preload.so"))
        .find(|p| p.is_file());
    found.expect("libinkfs_preload.so is built with the tests (dev-dependency)")
}

/// A run of `sh -c script`, preloaded (counting into `stats`) or not.
pub fn sh_run(script: &str, preload: Option<&Path>) -> (bool, String, String) {
    let mut c = Command::new("sh");
    c.arg("-c").arg(script);
    c.env_remove("LD_PRELOAD");
    c.env_remove("INKFS_PRELOAD_STATS");
    if let Some(stats) = preload {
        c.env("LD_PRELOAD", lib()).env("INKFS_PRELOAD_STATS", stats);
    }
    let o = c.output().expect("run sh");
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The counters of every process that reported into `stats`, summed.
pub fn counts(stats: &Path) -> BTreeMap<String, u64> {
    let text = std::fs::read_to_string(stats).unwrap_or_default();
    let mut sum = BTreeMap::new();
    for word in text.split_whitespace() {
        if let Some((k, v)) = word.split_once('=') {
            if k != "pid" {
                *sum.entry(k.to_string()).or_insert(0) += v.parse::<u64>().unwrap_or(0);
            }
        }
    }
    sum
}

pub fn c(counts: &BTreeMap<String, u64>, key: &str) -> u64 {
    counts.get(key).copied().unwrap_or(0)
}

/// `script` prints the same (and succeeds) preloaded and not.
pub fn same(script: &str, stats: &Path) -> String {
    let plain = sh_run(script, None);
    let pre = sh_run(script, Some(stats));
    assert!(plain.0, "{script} failed without the library: {}", plain.2);
    assert!(pre.0, "{script} failed under the library: {}", pre.2);
    assert_eq!(plain.1, pre.1, "{script}: output differs under the library");
    assert_eq!(plain.2, pre.2, "{script}: stderr differs under the library");
    pre.1
}

pub fn stats_file(name: &str) -> tempfile::NamedTempFile {
    tempfile::Builder::new()
        .prefix(&format!("inkfs-preload-{name}-"))
        .tempfile()
        .expect("stats file")
}

/// fsck of the pool (not mounted) finds nothing.
pub fn fsck_clean(pool: &Pool) {
    let pm = inkfs::pmem::MappedPool::open(&pool.path, &Default::default()).expect("open pool");
    let report = inkfs::fsck::check(&pm, &Default::default()).expect("fsck");
    assert!(report.is_clean(), "{report:?}");
}

/// `script` in sh under the library, which must serve its `ns` namespace
/// calls (none through the kernel).
pub fn preloaded(script: &str, stats: &Path, ns: u64) {
    let before = c(&counts(stats), "ns_local");
    let (ok, _, err) = sh_run(script, Some(stats));
    assert!(ok, "{script}: {err}");
    let n = counts(stats);
    assert_eq!(c(&n, "ns_local") - before, ns, "{script} not served: {n:?}");
}

/// A python `script` (with `arg`) under the library, its counters to
/// `stats`, once it printed `ready`: it waits there for the caller, who
/// writes its stdin (a go-ahead line) or closes it.
pub fn python_when_ready(script: &str, arg: &Path, stats: &Path) -> std::process::Child {
    python_when_ready_with(script, arg, stats, &[])
}

/// [`python_when_ready`] with `env` added to the program's environment.
pub fn python_when_ready_with(
    script: &str,
    arg: &Path,
    stats: &Path,
    env: &[(&str, &str)],
) -> std::process::Child {
    python_when_ready_args(script, arg, &[], stats, env)
}

/// [`python_when_ready_with`] with `more` arguments after `arg`.
pub fn python_when_ready_args(
    script: &str,
    arg: &Path,
    more: &[&str],
    stats: &Path,
    env: &[(&str, &str)],
) -> std::process::Child {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let mut c = Command::new(PYTHON);
    c.arg("-c")
        .arg(script)
        .arg(arg)
        .args(more)
        .env("LD_PRELOAD", lib())
        .env("INKFS_PRELOAD_STATS", stats)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    let mut child = c.spawn().expect("python");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read");
    assert_eq!(line, "ready\n", "the script failed");
    child
}

/// Python program `script` run on `dir` (its argument) and its standard
/// output: through the kernel when `stats` is None, else with the library
/// in, counting into `stats`. Fails the test if the program fails.
pub fn run_python(script: &str, dir: &Path, stats: Option<&Path>) -> String {
    let mut c = Command::new(PYTHON);
    c.arg("-c").arg(script).arg(dir).env_remove("LD_PRELOAD");
    if let Some(s) = stats {
        c.env("LD_PRELOAD", lib()).env("INKFS_PRELOAD_STATS", s);
    }
    let o = c.output().expect("python");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

/// Python program `script` on a tree `build` makes fresh in `dir`, run
/// through the kernel and then under the library (counting into `stats`,
/// made writable for whichever euid the program exits as): the two print
/// the same, line for line, and the kernel's run prints each of `wants`
/// (a script that silently did nothing would match too).
pub fn same_as_kernel(
    script: &str,
    dir: &Path,
    stats: &Path,
    build: impl Fn(&Path),
    wants: &[&str],
) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(stats, std::fs::Permissions::from_mode(0o666)).unwrap();
    build(dir);
    let kernel = run_python(script, dir, None);
    build(dir);
    let library = run_python(script, dir, Some(stats));
    let (k, l): (Vec<&str>, Vec<&str>) = (kernel.lines().collect(), library.lines().collect());
    for (i, (a, b)) in k.iter().zip(&l).enumerate() {
        assert_eq!(
            a, b,
            "line {i}: the kernel's, then the library's\n{library}"
        );
    }
    assert_eq!(k.len(), l.len(), "{kernel}\n---\n{library}");
    for want in wants {
        assert!(
            k.contains(want),
            "the kernel's run lacks {want:?}:\n{kernel}"
        );
    }
}
