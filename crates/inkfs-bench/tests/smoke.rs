//! CI's check of the benchmark harness: its own tests (`bench/run
//! --selftest`: parsers, ratios, set-up and tear-down of every contender,
//! cleanup after Ctrl-C and after a hard kill), then `bench/run --smoke`
//! end to end (every workload a few seconds, every contender), without
//! judging the figures. Needs root, /dev/fuse and loop devices, as the FUSE
//! tests do; the tools it drives (fio, sqlite3, redis-server,
//! rocksdb-tools, python3-matplotlib) are installed by .ci/run — a missing
//! one is reported as "not run" by the harness, not failed.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// target/<profile>/inkfs, built by `cargo test --workspace` (inkfs-cli's
/// own tests need it).
fn inkfs_bin() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let p = exe.parent()?.parent()?.join("inkfs");
    p.exists().then_some(p)
}

fn usable() -> Result<PathBuf, String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("not root".into());
    }
    if !Path::new("/dev/fuse").exists() {
        return Err("no /dev/fuse".into());
    }
    if Command::new("python3").arg("--version").output().is_err() {
        return Err("no python3".into());
    }
    inkfs_bin().ok_or_else(|| {
        "target/<profile>/inkfs not built (run `cargo test --workspace` or build inkfs-cli first)".into()
    })
}

/// Outside CI a test that cannot run says so and passes; under CI (which
/// must run everything) it fails.
fn skip_or_fail(why: &str) {
    if std::env::var_os("CI").is_some() {
        panic!("benchmark harness smoke test cannot run in CI: {why}");
    }
    eprintln!("skipped: {why}");
}

/// The harness's output and its pid (bench/run execs the harness, which
/// names its work directory /dev/shm/inkbench-PID after it).
fn bench_run(args: &[&str], inkfs: &Path) -> (std::process::Output, u32) {
    let child = Command::new(repo().join("bench/run"))
        .args(args)
        .env("INKBENCH_INKFS", inkfs)
        .env("INKBENCH_WORK", env!("CARGO_BIN_EXE_inkbench-work"))
        .current_dir(repo())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run bench/run");
    let pid = child.id();
    (child.wait_with_output().expect("wait for bench/run"), pid)
}

/// One test, so the harness's own tests (which mount, kill and clean up
/// work directories) never run at the same time as the smoke run.
#[test]
fn harness_selftest_then_smoke_run() {
    let inkfs = match usable() {
        Ok(p) => p,
        Err(why) => return skip_or_fail(&why),
    };
    selftest(&inkfs);
    smoke_run(&inkfs);
}

fn selftest(inkfs: &Path) {
    let (out, _) = bench_run(&["--selftest"], inkfs);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert!(out.status.success(), "bench/run --selftest failed:\n{text}");
}

fn smoke_run(inkfs: &Path) {
    if cfg!(debug_assertions) {
        return skip_or_fail("the smoke run needs release binaries (cargo test --release)");
    }
    let out_dir = std::env::temp_dir().join(format!("inkbench-smoke-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out_dir);
    let (out, harness) = bench_run(
        &[
            "--smoke",
            "--quiet",
            "--inkfs-bin",
            inkfs.to_str().unwrap(),
            "--work-bin",
            env!("CARGO_BIN_EXE_inkbench-work"),
            "--out",
            out_dir.to_str().unwrap(),
        ],
        inkfs,
    );
    let md = std::fs::read_to_string(out_dir.join("results.md")).unwrap_or_default();
    let json = std::fs::read_to_string(out_dir.join("results.json")).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&out_dir);
    println!("{}", String::from_utf8_lossy(&out.stdout));
    println!("{md}");
    assert!(
        out.status.success(),
        "bench/run --smoke exited with {:?}:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    for w in [
        "micro",
        "fio",
        "filebench",
        "sqlite",
        "rocksdb",
        "redis",
        "meta",
    ] {
        assert!(
            json.contains(&format!("\"{w}\": {{")),
            "no {w} in results.json"
        );
    }
    assert!(
        md.contains("### Issue 5") || md.contains("Not run: fio"),
        "{md}"
    );
    // Nothing of this run left mounted (other harnesses, such as a
    // benchmark running beside the tests, have their own directories).
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    let ours = format!("/dev/shm/inkbench-{harness}/");
    assert!(!mounts.contains(&ours), "mount left behind:\n{mounts}");
}
