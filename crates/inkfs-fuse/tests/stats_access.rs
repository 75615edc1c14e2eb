//! Who may read a mount's statistics, and that nobody can stall them: a
//! user other than the mount's owner and root is refused with a clear
//! message; with `-o stats=all`, 50 idle connections of another user do
//! not keep root's `inkfs stat` waiting. The same holds for the pool lock
//! the mount takes: no lock file is left in a side directory.
//!
//! The idle clients are this test binary re-executed as uid 65534 with
//! `INKFS_IDLE_CLIENTS=SOCKET` set, running the `idle_clients_child` "test".

mod common;

use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use common::*;

const CHILD_ENV: &str = "INKFS_IDLE_CLIENTS";
const NOBODY: u32 = 65534;
const IDLE_CLIENTS: usize = 50;

/// Not a test by itself: connects `IDLE_CLIENTS` times to the socket named
/// by `INKFS_IDLE_CLIENTS`, sends nothing, says `@connected N` (how many
/// connects succeeded) and waits for stdin to close.
#[test]
fn idle_clients_child() {
    let Ok(socket) = std::env::var(CHILD_ENV) else {
        return;
    };
    let conns: Vec<UnixStream> = (0..IDLE_CLIENTS)
        .filter_map(|_| UnixStream::connect(&socket).ok())
        .collect();
    println!("@connected {}", conns.len());
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    drop(conns);
    std::process::exit(0);
}

fn socket_of(mnt: &Path) -> PathBuf {
    inkfs_fuse::stats::socket_path(
        Path::new(inkfs_fuse::stats::RUN_DIR),
        &mnt.canonicalize().unwrap(),
    )
}

fn stat_as(mnt: &Path, uid: Option<u32>) -> std::process::Output {
    let mut c = Command::new(BIN);
    c.arg("stat").arg(mnt);
    if let Some(uid) = uid {
        c.uid(uid).gid(uid);
    }
    c.output().expect("run stat")
}

#[test]
fn statistics_are_for_the_owner_and_root_by_default() {
    let pool = Pool::new("stats-owner", 64);
    let m = Mounted::new(&pool, "");
    let mode = std::fs::metadata(socket_of(m.path())).unwrap().mode();
    assert_eq!(mode & 0o777, 0o600, "socket mode");
    let out = stat_as(m.path(), Some(NOBODY));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "nobody read root's statistics");
    assert!(
        err.contains(
            "permission denied: the statistics of this mount are served to its owner \
                      (uid 0) and root only"
        ),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    let out = stat_as(m.path(), None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn idle_connections_of_another_user_do_not_block_roots_stat() {
    let pool = Pool::new("stats-idle", 64);
    let m = Mounted::new(&pool, "stats=all");
    let socket = socket_of(m.path());
    assert_eq!(
        std::fs::metadata(&socket).unwrap().mode() & 0o777,
        0o666,
        "stats=all"
    );
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "idle_clients_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, &socket)
        .uid(NOBODY)
        .gid(NOBODY)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn idle clients");
    let said = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .find_map(|l| l.find('@').map(|at| l[at..].to_string()))
        .expect("the child reported");
    assert_eq!(said, format!("@connected {IDLE_CLIENTS}"));
    // The idle clients take their few places and are turned away beyond
    // them: root is answered at once, not after their timeouts (2 s each,
    // one after another, before the server served clients concurrently).
    for _ in 0..3 {
        let t = Instant::now();
        let out = stat_as(m.path(), None);
        let took = t.elapsed();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("server pid:"),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        // Behind an idle client, root would wait its whole timeout: the
        // bound is that timeout, not a guess at how fast a stat runs
        // (1.5 s was one, on a machine that can be loaded).
        assert!(
            took < inkfs_fuse::stats::REQUEST_TIMEOUT,
            "root waited {took:?}"
        );
    }
    // So is nobody itself, once, with stats=all.
    let out = stat_as(m.path(), Some(NOBODY));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(child.stdin.take());
    let _ = child.wait();
}

#[test]
fn the_mount_leaves_no_lock_file_behind() {
    let pool = Pool::new("nolockfile", 64);
    let meta = std::fs::metadata(&pool.path).unwrap();
    let name = format!("pool-{:x}-{:x}.lock", meta.dev(), meta.ino());
    let lock_file = Path::new(inkfs_fuse::stats::RUN_DIR).join(name);
    let m = Mounted::new(&pool, "");
    assert!(!lock_file.exists(), "{} while mounted", lock_file.display());
    drop(m.unmount());
    assert!(!lock_file.exists(), "{} after unmount", lock_file.display());
}

/// `umount M && inkfs mount P M`: the old server may still be saving its
/// allocator (holding the pool) when the new one starts; the new one
/// waits for it, as the old server said it is finishing.
#[test]
fn a_mount_right_after_umount_waits_for_the_finishing_server() {
    let pool = Pool::new("remount", 64);
    let mut dir = tempfile::tempdir().unwrap();
    for round in 0..3 {
        let m = Mounted::at(&pool, dir, "");
        std::fs::write(m.p("f"), format!("round {round}")).unwrap();
        let old = m.pid;
        let m = std::mem::ManuallyDrop::new(m);
        run(Command::new("umount").arg(m.path()));
        // No wait for the old server to exit.
        // SAFETY: `m` is never used again and never dropped.
        dir = unsafe { std::ptr::read(&m.dir) };
        let out = mount_with(&pool.path, dir.path(), "");
        assert!(
            out.status.success(),
            "round {round}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        wait_exit(old);
        let m = Mounted::adopt(dir);
        assert!(mounted_clean(m.path()), "round {round}");
        assert_eq!(
            std::fs::read(m.p("f")).unwrap(),
            format!("round {round}").as_bytes()
        );
        dir = m.unmount();
    }
}
