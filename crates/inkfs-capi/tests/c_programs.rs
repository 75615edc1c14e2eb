//! The C side: the library installed by install.sh into a temporary
//! prefix, C programs compiled against it with the system's cc and
//! `pkg-config --cflags --libs inkfs`, and run. Needs cc (build-essential)
//! and pkg-config; the differential run as another uid needs root.

mod common;

use std::ffi::CStr;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use common::{errno, PoolPath};
use inkfs_capi::*;

fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The prefix install.sh installed into, once for the whole test binary.
fn prefix() -> &'static Path {
    static PREFIX: OnceLock<PathBuf> = OnceLock::new();
    PREFIX.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("inkfs-capi-prefix")
            .tempdir()
            .expect("temporary prefix")
            .keep();
        // The library this test binary was built with is already in
        // target/release (or target/debug): install.sh rebuilds release,
        // which is a no-op under `cargo test --release`.
        let out = Command::new(crate_dir().join("install.sh"))
            .arg(&dir)
            .output()
            .expect("run install.sh");
        assert!(
            out.status.success(),
            "install.sh failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        dir
    })
}

fn pkg_config(args: &[&str]) -> Vec<String> {
    let out = Command::new("pkg-config")
        .args(args)
        .arg("inkfs")
        .env("PKG_CONFIG_PATH", prefix().join("lib/pkgconfig"))
        .output()
        .expect("pkg-config is needed (Debian package pkg-config)");
    assert!(out.status.success(), "pkg-config {args:?} inkfs failed");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// Compile `source` into a program in the prefix, as a user would:
/// `cc SOURCE $(pkg-config --cflags --libs inkfs)`, plus an rpath so it
/// runs without LD_LIBRARY_PATH. `static_link`: against libinkfs.a.
fn compile(source: &Path, name: &str, static_link: bool) -> PathBuf {
    let exe = prefix().join(name);
    let mut cmd = Command::new("cc");
    cmd.args(["-O1", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(source)
        .args(pkg_config(&["--cflags"]));
    if static_link {
        cmd.arg(prefix().join("lib/libinkfs.a")).args(
            pkg_config(&["--static", "--libs-only-l"])
                .into_iter()
                .filter(|l| l != "-linkfs"),
        );
    } else {
        cmd.args(pkg_config(&["--libs"]))
            .arg(format!("-Wl,-rpath,{}", prefix().join("lib").display()));
    }
    let out = cmd
        .output()
        .expect("cc is needed (Debian package build-essential)");
    assert!(
        out.status.success(),
        "cc {}:\n{}",
        source.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

fn needed_libs(exe: &Path) -> String {
    let out = Command::new("readelf").arg("-d").arg(exe).output();
    out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

fn run_hello(exe: &Path) {
    let pool = PoolPath::new("hello");
    let out = Command::new(exe).arg(&pool.0).output().expect("run hello");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "hello failed:\n{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("read back 24 bytes: hello, persistent world"));
    assert!(stdout.contains("greeting.txt") && stdout.contains("link@"));
    assert!(stdout.ends_with("ok\n"), "{stdout}");
}

#[test]
fn hello_builds_with_pkg_config_and_runs() {
    let exe = compile(&crate_dir().join("examples/hello.c"), "hello", false);
    assert!(
        needed_libs(&exe).contains("libinkfs.so.0"),
        "linked against the shared library by its soname"
    );
    run_hello(&exe);
}

#[test]
fn hello_links_statically() {
    let exe = compile(&crate_dir().join("examples/hello.c"), "hello-static", true);
    assert!(
        !needed_libs(&exe).contains("libinkfs"),
        "a static link needs no libinkfs.so"
    );
    run_hello(&exe);
}

fn is_root() -> bool {
    // SAFETY: geteuid has no failure mode.
    unsafe { libc::geteuid() == 0 }
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Run the differential program once; its report is printed either way.
fn differential(seed: u64, ops: u64, uid: Option<u32>) {
    // One program per test: the tests run in parallel.
    let name = format!("differential-{}", uid.unwrap_or(0));
    let exe = compile(&crate_dir().join("tests/c/differential.c"), &name, false);
    let pool = PoolPath::new("diff");
    let dir = tempfile::Builder::new()
        .prefix("inkfs-capi-diff")
        .tempdir_in("/dev/shm")
        .expect("a directory on /dev/shm (tmpfs)");
    let mut cmd = Command::new(&exe);
    cmd.arg(&pool.0)
        .arg(dir.path())
        .arg(seed.to_string())
        .arg(ops.to_string());
    if let Some(uid) = uid {
        cmd.env("DIFF_UID", uid.to_string());
    }
    let out = cmd.output().expect("run differential");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!(
        "differential seed {seed}, {ops} ops, uid {}:\n{stdout}{}",
        uid.map_or("0".into(), |u| u.to_string()),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && stdout.contains(&format!("ops: {ops}, divergences: 0")),
        "libinkfs and Linux diverged (INKFS_CAPI_SEED={seed} replays it)"
    );
}

/// A few thousand random operations through libinkfs and through libc on
/// tmpfs, compared call by call (tests/c/differential.c). INKFS_CAPI_SEED
/// and INKFS_CAPI_OPS change the run.
#[test]
fn differential_against_linux_as_root() {
    let seed = env_or("INKFS_CAPI_SEED", 0x1f5);
    differential(seed, env_or("INKFS_CAPI_OPS", 6000), None);
}

/// The same as an unprivileged user (uid 1000 on both sides), so that
/// permission errors are compared too.
#[test]
fn differential_against_linux_as_a_user() {
    if !is_root() {
        assert!(
            std::env::var_os("CI").is_none(),
            "needs root (to switch both sides to uid 1000)"
        );
        eprintln!("skipped: needs root");
        return;
    }
    let seed = env_or("INKFS_CAPI_SEED", 0x1f5) + 1;
    differential(seed, env_or("INKFS_CAPI_OPS", 6000), Some(1000));
}

fn mount(pool: &PoolPath) -> *mut Mount {
    // SAFETY: a valid C string; NULL options.
    unsafe { inkfs_mount(pool.c().as_ptr(), std::ptr::null()) }
}

fn last_error() -> String {
    // SAFETY: inkfs_last_error returns a valid C string of this thread.
    unsafe { CStr::from_ptr(inkfs_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// Issue 15's pool-lock rule: a pool mounted by another live process is
/// refused (EBUSY, naming it), and mounts once that process is SIGKILLed
/// (recovering what it left).
#[test]
fn a_pool_held_by_a_live_process_is_refused_until_it_is_killed() {
    let hold = compile(&crate_dir().join("tests/c/hold.c"), "hold", false);
    let pool = PoolPath::new("lock");
    // SAFETY: a valid C string.
    assert_eq!(unsafe { inkfs_mkfs(pool.c().as_ptr(), 32 << 20, 2) }, 0);
    let mut child = Command::new(&hold)
        .arg(&pool.0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start hold");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped"))
        .read_line(&mut line)
        .expect("read from hold");
    assert_eq!(line.trim(), format!("mounted {}", child.id()));

    let fs = mount(&pool);
    assert!(
        fs.is_null(),
        "a pool held by a live process must be refused"
    );
    assert_eq!(errno(), libc::EBUSY);
    let why = last_error();
    assert!(
        why.contains(&format!("pid {}", child.id())),
        "the refusal names the holder: {why}"
    );

    child.kill().expect("SIGKILL hold");
    child.wait().expect("reap hold");
    let fs = mount(&pool);
    assert!(
        !fs.is_null(),
        "mount after the holder died: errno {} ({})",
        errno(),
        last_error()
    );
    let mut st: libc::stat = zeroed_stat();
    // SAFETY: a live mount, a valid C string and a writable stat.
    let r = unsafe { inkfs_stat(fs, c"held".as_ptr(), &mut st) };
    assert_eq!((r, st.st_size), (0, 1), "what the killed holder wrote");
    // SAFETY: the handle from inkfs_mount, given back once.
    assert_eq!(unsafe { inkfs_unmount(fs) }, 0);
}

/// The claim is on the pool itself: a second mount in the same process is
/// refused too, and allowed after the unmount.
#[test]
fn a_pool_mounted_in_this_process_is_refused_a_second_time() {
    let pool = PoolPath::new("twice");
    // SAFETY: a valid C string.
    assert_eq!(unsafe { inkfs_mkfs(pool.c().as_ptr(), 32 << 20, 2) }, 0);
    let first = mount(&pool);
    assert!(!first.is_null());
    assert!(mount(&pool).is_null());
    assert_eq!(errno(), libc::EBUSY);
    // SAFETY: the handle from inkfs_mount, given back once.
    assert_eq!(unsafe { inkfs_unmount(first) }, 0);
    let again = mount(&pool);
    assert!(!again.is_null(), "errno {}", errno());
    // SAFETY: as above.
    assert_eq!(unsafe { inkfs_unmount(again) }, 0);
}

fn zeroed_stat() -> libc::stat {
    // SAFETY: all-zero bytes are a valid struct stat.
    unsafe { std::mem::zeroed() }
}
