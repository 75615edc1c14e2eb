//! Every command that opens a pool meets its claim: while another process
//! holds the pool (a child that mounted it through the library), `mkfs
//! --force`, `selftest`, `fsck -y` and a second `mount` are refused naming
//! the holder's pid, `fsck` checks it read-only and says so, and `stat`
//! names the holder; as root and as the pool's non-root owner. After the
//! holder is SIGKILLed, `stat` and `fsck` agree that it crashed, and the
//! pool opens and recovers. No lock file appears in a side directory.
//!
//! The holder is this test binary re-executed with `INKFS_CLI_HOLD=POOL`,
//! running the `hold_child` "test".

use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use inkfs::pmem::{MappedPool, PoolOpenOptions};
use inkfs::types::MountOptions;
use inkfs::Fs;

const HOLD_ENV: &str = "INKFS_CLI_HOLD";
const NOBODY: u32 = 65534;

fn inkfs(args: &[&str], uid: Option<u32>) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_inkfs"));
    c.args(args);
    if let Some(uid) = uid {
        c.uid(uid).gid(uid);
    }
    c.output().expect("run inkfs")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The value of `key:` in `inkfs stat POOL`'s aligned output.
fn field(t: &str, key: &str) -> String {
    t.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .unwrap_or_else(|| panic!("no {key}: in {t}"))
        .trim()
        .to_string()
}

struct Pool(PathBuf);
impl Pool {
    fn new(tag: &str) -> Pool {
        let p = PathBuf::from(format!(
            "/dev/shm/inkfs-cli-lock-{}-{tag}.pool",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&p);
        let o = inkfs(&["mkfs", p.to_str().unwrap(), "--size", "16M"], None);
        assert!(o.status.success(), "{}", text(&o));
        Pool(p)
    }
    fn s(&self) -> &str {
        self.0.to_str().unwrap()
    }
}
impl Drop for Pool {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Not a test by itself: the holder (returns at once unless
/// `INKFS_CLI_HOLD` is set). Mounts the pool read-write, as `inkfs mount`
/// does, writes a file, says `@held` and waits for stdin to close.
#[test]
fn hold_child() {
    let Ok(path) = std::env::var(HOLD_ENV) else {
        return;
    };
    let pm = MappedPool::open(Path::new(&path), &PoolOpenOptions::default()).expect("open");
    let fs = Fs::mount(pm, MountOptions::default()).expect("mount");
    let (_, fh) = fs.create(1, b"kept", 0o644, 0, 0).expect("create");
    fs.write(&fh, 0, b"kept").expect("write");
    println!("@held");
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    std::process::exit(0);
}

fn hold(pool: &Pool, uid: Option<u32>) -> Child {
    let mut c = Command::new(std::env::current_exe().expect("test binary"));
    c.args(["--exact", "hold_child", "--nocapture", "--test-threads=1"])
        .env(HOLD_ENV, &pool.0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if let Some(uid) = uid {
        c.uid(uid).gid(uid);
    }
    let mut child = c.spawn().expect("spawn holder");
    let out = child.stdout.take().expect("piped");
    let held = BufReader::new(out)
        .lines()
        .map_while(Result::ok)
        .any(|l| l.contains("@held"));
    assert!(held, "the holder did not start");
    child
}

/// The lock files the old side-directory scheme left, for this pool.
fn side_lock_files(pool: &Path) -> Vec<PathBuf> {
    let m = std::fs::metadata(pool).expect("pool");
    let name = format!("pool-{:x}-{:x}.lock", m.dev(), m.ino());
    let mut dirs = vec![PathBuf::from("/run/inkfs")];
    for uid in [0, NOBODY] {
        dirs.push(PathBuf::from(format!("/tmp/inkfs-{uid}")));
    }
    dirs.into_iter()
        .map(|d| d.join(&name))
        .filter(|p| p.exists())
        .collect()
}

#[test]
fn every_command_refuses_a_pool_another_process_holds() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "this test must run as root (it runs commands as uid {NOBODY})"
    );
    for uid in [None, Some(NOBODY)] {
        let who = uid.map_or("root".to_string(), |u| format!("uid {u}"));
        let pool = Pool::new(&format!("{}", uid.unwrap_or(0)));
        if let Some(u) = uid {
            std::os::unix::fs::chown(&pool.0, Some(u), Some(u)).expect("chown");
        }
        let mut holder = hold(&pool, uid);
        let pid = format!("pid {} (", holder.id());
        let mnt = tempfile::tempdir().expect("tempdir");
        let refused = |args: &[&str], code: Option<i32>| {
            let o = inkfs(args, uid);
            let t = text(&o);
            assert!(!o.status.success(), "{who}: {args:?} ran: {t}");
            if code.is_some() {
                assert_eq!(o.status.code(), code, "{who}: {args:?}: {t}");
            }
            assert!(
                t.contains("pool in use by ") && t.contains(&pid),
                "{who}: {args:?} does not name the holder: {t}"
            );
            assert!(!t.contains("panicked"), "{t}");
        };
        refused(&["mkfs", pool.s(), "--size", "16M", "--force"], None);
        refused(&["mkfs", pool.s(), "--size", "32M", "--force"], None);
        refused(&["selftest", pool.s()], None);
        refused(&["fsck", "-y", pool.s()], Some(8));
        refused(
            &["mount", pool.s(), mnt.path().to_str().unwrap(), "-f"],
            None,
        );
        // A read-only check is allowed, and says what it checked.
        let o = inkfs(&["fsck", pool.s()], uid);
        let t = text(&o);
        assert_eq!(o.status.code(), Some(0), "{who}: {t}");
        assert!(
            t.contains(&format!("state: mounted by {pid}")) && t.contains("checked while in use"),
            "{who}: {t}"
        );
        let o = inkfs(&["stat", pool.s()], uid);
        let t = text(&o);
        assert!(o.status.success(), "{who}: {t}");
        assert!(t.contains(&format!("mounted by {pid}")), "{who}: {t}");

        // SAFETY: kill has no memory preconditions; the pid is our child.
        unsafe { libc::kill(holder.id() as i32, libc::SIGKILL) };
        holder.wait().expect("reap");
        let crashed = "crashed: will recover at next mount";
        let t = text(&inkfs(&["stat", pool.s()], uid));
        assert_eq!(field(&t, "state"), crashed, "{who}: {t}");
        let o = inkfs(&["fsck", pool.s()], uid);
        let t = text(&o);
        assert_eq!(o.status.code(), Some(0), "{who}: {t}");
        assert!(t.contains(&format!("state: {crashed}")), "{who}: {t}");
        // The pool opens: the selftest mounts (recovering it), writes,
        // remounts, verifies and checks it.
        let o = inkfs(&["selftest", pool.s()], uid);
        assert!(o.status.success(), "{who}: {}", text(&o));
        let t = text(&inkfs(&["stat", pool.s()], uid));
        assert_eq!(field(&t, "inodes in use"), "2", "{who}: the file kept: {t}");
        assert!(
            side_lock_files(&pool.0).is_empty(),
            "{who}: lock files left: {:?}",
            side_lock_files(&pool.0)
        );
    }
}
