//! Helpers of the lane lease tests (lane_lease.rs, lane_unlink.rs): an
//! API client's requests, the server's counters, and the server's books
//! against a scan (what a live mount counts free must be what a
//! remount's recovery scan finds, with no double free counted and fsck
//! clean).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use inkfs::api::client::Client;
use inkfs::api::dirlease::DirAnswer;
use inkfs::api::ns::{Done, Op};
use inkfs::api::Credentials;

use super::preload::fsck_clean;
use super::{stats_json, Mounted, Pool};

pub fn root() -> Credentials {
    Credentials::root()
}

/// A counter of `inkfs stat --json`.
pub fn stat_u64(mnt: &Path, key: &str) -> u64 {
    let s = stats_json(mnt).expect("statistics");
    s[key].as_u64().unwrap_or_else(|| panic!("no {key} in {s}"))
}

/// Wait until `f` holds (a condition another process makes true).
pub fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < inkfs::testkit::WAIT_LIMIT, "never: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A create of `name` in `dir`, opened for writing.
pub fn create_op(dir: u64, name: &str) -> Op {
    create_with(dir, name, libc::O_WRONLY)
}

/// A create of `name` in `dir`, opened with `access`.
pub fn create_with(dir: u64, name: &str, access: i32) -> Op {
    Op::Create {
        dir,
        name: name.as_bytes().to_vec(),
        mode: 0o644,
        flags: libc::O_CREAT | access,
    }
}

/// (free blocks, inodes in use) of the mount's file system.
pub fn statvfs(mnt: &Path) -> (u64, u64) {
    let c = std::ffi::CString::new(mnt.as_os_str().as_encoded_bytes()).expect("a path");
    // SAFETY: all-zero is a valid statvfs; the kernel fills it.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a statvfs to fill.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    (st.f_bfree, st.f_files - st.f_ffree)
}

/// The mount's books against a scan: no double free counted
/// (`frees_refused`), then unmounted and mounted again (the recovery's
/// scan rebuilds the free lists), its free blocks and inodes are what the
/// live server counted, and fsck finds nothing.
pub fn books_match_a_scan(pool: &Pool, m: Mounted) -> Mounted {
    assert_eq!(stat_u64(m.path(), "frees_refused"), 0, "blocks freed twice");
    assert_eq!(
        stat_u64(m.path(), "lane_settles_failed"),
        0,
        "a lane's give-back, reaping or removal the engine failed"
    );
    let live = statvfs(m.path());
    let dir = m.unmount();
    fsck_clean(pool);
    let m = Mounted::at(pool, dir, "mode=strict");
    assert_eq!(
        statvfs(m.path()),
        live,
        "the server's books differ from a scan"
    );
    m
}

/// Take `dir`'s lease (and a lane) with a create of `name` in it.
pub fn lease(c: &Client, dir: u64, name: &str) {
    let d: Done = c
        .ns_dir_lease(&root(), create_op(dir, name))
        .expect("asked");
    assert_eq!(d.errno, 0, "create {name}");
    assert!(
        matches!(d.dir, Some(DirAnswer::Granted { .. })),
        "not granted: {:?}",
        d.dir
    );
}

/// A kill loop's child: this test binary running only `test`, told the
/// mount, D's inode number and the first file number through the
/// variables named in `env` (in that order); its stdout piped.
pub fn spawn_kill_loop_child(test: &str, env: [&str; 3], mnt: &Path, d: u64, from: u64) -> Child {
    Command::new(std::env::current_exe().expect("this test binary"))
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(env[0], mnt)
        .env(env[1], d.to_string())
        .env(env[2], from.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the client")
}

/// A kill loop child's number from variable `k` (set by its parent).
pub fn env_u64(k: &str) -> u64 {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .expect("a number")
}

/// The names a kill loop's child acknowledged (`@made NAME` lines) until
/// it was SIGKILLed after `acks` of them (or its output ended); it must
/// have said `@granted`.
pub fn run_and_kill(child: &mut Child, acks: usize) -> Vec<String> {
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let (mut line, mut made, mut granted) = (String::new(), Vec::new(), false);
    while out.read_line(&mut line).unwrap_or(0) > 0 {
        granted |= line.contains("@granted");
        if let Some(name) = line.trim_end().strip_prefix("@made ") {
            made.push(name.to_string());
            if made.len() >= acks {
                // SAFETY: a signal to our own child.
                unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
                break;
            }
        }
        line.clear();
    }
    let _ = child.wait();
    assert!(granted, "the child never got D's lease");
    made
}

/// Rounds of a kill loop: `INKFS_TEST_ROUNDS`, 8 by default.
pub fn kill_loop_rounds() -> u64 {
    std::env::var("INKFS_TEST_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8)
}

/// The end of a kill loop of `rounds` rounds on `m`: most of its clients'
/// lanes were reaped (the others given back by a recall before the
/// kill), the books equal a scan's, scrub and fsck find nothing.
pub fn kill_loop_end(pool: &Pool, m: Mounted, rounds: u64) {
    let reaped = stat_u64(m.path(), "lanes_reaped");
    assert!(reaped > rounds / 2, "{reaped} of {rounds} lanes reaped");
    let m = books_match_a_scan(pool, m);
    let scrub = inkfs_fuse::scrub::request(m.path(), &mut |_, _| {})
        .expect("an inkfs mount")
        .expect("scrub ran");
    assert!(scrub.findings.is_empty(), "{scrub:?}");
    m.unmount();
    fsck_clean(pool);
}
