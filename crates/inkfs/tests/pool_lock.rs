//! The claim on a pool (`pmem/lock.rs`): one read-write open at a time, in
//! this process or another, whatever the uid; read-only opens share; a
//! descriptor that shares the holder's open file description shares its
//! claim; a SIGKILLed holder's pool opens and recovers; an opener waits for
//! a holder that says it is finishing.
//!
//! Children are this test binary re-executed with `INKFS_LOCK_CHILD` set,
//! running the `lock_child` "test": `hold|POOL` claims and mounts the pool,
//! writes a file, prints `@held` and waits for its stdin to close (or to be
//! killed); `try|POOL` tries a read-write open and prints `@opened` or
//! `@refused MESSAGE`.

use std::io::{BufRead, BufReader, Read};
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use inkfs::pmem::{MappedPool, PoolBusy, PoolFile, PoolOpenOptions};
use inkfs::types::{FormatOptions, MountOptions};
use inkfs::Fs;

const CHILD_ENV: &str = "INKFS_LOCK_CHILD";
const NOBODY: u32 = 65534;

fn rw() -> PoolOpenOptions {
    PoolOpenOptions {
        create_size_bytes: None,
        read_only: false,
    }
}

fn ro() -> PoolOpenOptions {
    PoolOpenOptions {
        create_size_bytes: None,
        read_only: true,
    }
}

/// A formatted 16 MiB pool in /dev/shm, removed on drop.
struct Pool(PathBuf);

impl Pool {
    fn new(tag: &str) -> Pool {
        let path = PathBuf::from(format!(
            "/dev/shm/inkfs-lock-test-{}-{tag}.pool",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&path);
        let pm = MappedPool::open(
            &path,
            &PoolOpenOptions {
                create_size_bytes: Some(16 << 20),
                read_only: false,
            },
        )
        .expect("create pool");
        Fs::format(&pm, &FormatOptions::default()).expect("format");
        Pool(path)
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The refusal of `r`, which must be one.
fn refusal<T>(r: std::io::Result<T>) -> (std::io::Error, PoolBusy) {
    let e = match r {
        Ok(_) => panic!("the open was not refused"),
        Err(e) => e,
    };
    assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "{e}");
    let busy = PoolBusy::of(&e)
        .unwrap_or_else(|| panic!("no holder details in {e}"))
        .clone();
    (e, busy)
}

/// Not a test by itself: the body of the child processes (returns at once
/// unless `INKFS_LOCK_CHILD` is set).
#[test]
fn lock_child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (what, path) = spec.split_once('|').expect("WHAT|POOL");
    let path = Path::new(path);
    match what {
        "hold" => {
            let pm = MappedPool::open(path, &rw()).expect("child: open");
            let fs = Fs::mount(pm, MountOptions::default()).expect("child: mount");
            let (_, fh) = fs.create(1, b"kept", 0o644, 0, 0).expect("create");
            // Strict mode: durable when write returns.
            fs.write(&fh, 0, b"written before the kill").expect("write");
            println!("@held");
            let mut sink = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut sink);
            std::process::exit(0);
        }
        "try" => {
            match MappedPool::open(path, &rw()) {
                Ok(_) => println!("@opened"),
                Err(e) => println!("@refused {e}"),
            }
            std::process::exit(0);
        }
        other => panic!("bad {CHILD_ENV}: {other}"),
    }
}

fn child(what: &str, pool: &Path, uid: Option<u32>) -> Command {
    let mut c = Command::new(std::env::current_exe().expect("test binary"));
    c.args(["--exact", "lock_child", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, format!("{what}|{}", pool.display()))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if let Some(uid) = uid {
        // std drops supplementary groups when root sets a uid.
        c.uid(uid).gid(uid);
    }
    c
}

/// The child's first `@` line (libtest prints its own words before it).
fn first_report(child: &mut Child) -> String {
    let out = child.stdout.take().expect("piped stdout");
    for line in BufReader::new(out).lines() {
        let line = line.expect("child stdout");
        if let Some(at) = line.find('@') {
            return line[at..].to_string();
        }
    }
    panic!("the child reported nothing");
}

fn require_root() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "this test must run as root (it runs children as uid {NOBODY})"
    );
}

fn chown(path: &Path, uid: u32) {
    std::os::unix::fs::chown(path, Some(uid), Some(uid)).expect("chown");
}

#[test]
fn a_second_open_in_this_process_is_refused_and_named() {
    let pool = Pool::new("self");
    let held = MappedPool::open(&pool.0, &rw()).expect("open");
    let me = std::process::id();
    let (e, busy) = refusal(MappedPool::open(&pool.0, &rw()));
    assert!(busy.exclusive);
    assert!(busy.holders.iter().any(|h| h.pid == me), "{busy:?}");
    assert!(
        e.to_string()
            .starts_with(&format!("pool in use by pid {me} (this process: ")),
        "{e}"
    );
    // A writer excludes readers too.
    refusal(MappedPool::open(&pool.0, &ro()));
    drop(held);
    // Readers share, and exclude a writer.
    let r1 = MappedPool::open(&pool.0, &ro()).expect("first reader");
    let r2 = MappedPool::open(&pool.0, &ro()).expect("second reader");
    let (e, busy) = refusal(MappedPool::open(&pool.0, &rw()));
    assert!(!busy.exclusive);
    assert!(
        e.to_string().starts_with("pool open read-only by pid"),
        "{e}"
    );
    drop((r1, r2));
    drop(MappedPool::open(&pool.0, &rw()).expect("free again"));
}

#[test]
fn a_descriptor_of_the_same_open_file_description_shares_the_claim() {
    let pool = Pool::new("fd");
    let claim = PoolFile::open(&pool.0, &rw()).expect("open");
    // What a process receiving the pool's descriptor over a unix socket
    // gets: another descriptor of the same open file description.
    let passed = OwnedFd::from(claim.file().try_clone().expect("dup"));
    let shared = PoolFile::from_fd(passed, &pool.0).expect("shares the claim");
    assert!(!shared.is_read_only());
    let pm = MappedPool::map(shared, &rw()).expect("map the shared claim");
    drop(claim);
    // The original is gone; the shared descriptor (and its mapping) keep
    // the claim.
    refusal(MappedPool::open(&pool.0, &rw()));
    // A fresh open(2) is another description: refused, not shared.
    let fresh = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&pool.0)
        .expect("open(2)");
    refusal(PoolFile::from_fd(OwnedFd::from(fresh), &pool.0));
    drop(pm);
    drop(MappedPool::open(&pool.0, &rw()).expect("free once all are gone"));
}

#[test]
fn an_opener_waits_for_a_finishing_holder_and_only_for_it() {
    let pool = Pool::new("finish");
    // Not finishing: refused (after the short retry for a child between
    // fork and exec).
    let held = MappedPool::open(&pool.0, &rw()).expect("open");
    // Refused without the wait a finishing holder gets (a bound on the
    // mechanism, not on speed: 2 s failed only when the machine was slow).
    let t = Instant::now();
    refusal(MappedPool::open(&pool.0, &rw()));
    assert!(
        t.elapsed() < inkfs::pmem::FINISHING_WAIT,
        "{:?}",
        t.elapsed()
    );
    // Finishing: the opener waits, and gets the pool once it is let go.
    held.pool_file().finishing();
    let (e, busy) = refusal(PoolFile::from_fd(
        OwnedFd::from(
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&pool.0)
                .expect("open(2)"),
        ),
        &pool.0,
    ));
    assert!(busy.finishing, "{e}");
    assert!(
        e.to_string().ends_with("which is finishing its unmount"),
        "{e}"
    );
    // The clock starts before the releaser does (started after the spawn,
    // a test thread kept off the CPU meanwhile measured less than the
    // releaser's pause): the open cannot succeed before the drop.
    let t = Instant::now();
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(400));
        drop(held);
    });
    let pm = MappedPool::open(&pool.0, &rw()).expect("waited for the finishing holder");
    assert!(
        t.elapsed() >= Duration::from_millis(400),
        "{:?}",
        t.elapsed()
    );
    releaser.join().unwrap();
    drop(pm);
}

/// Another process holds the pool: as root and as the pool's non-root
/// owner, every open is refused and names the holder; once the holder is
/// SIGKILLed, the pool opens and recovers what it wrote.
#[test]
fn another_process_holds_the_pool_until_killed() {
    require_root();
    for uid in [None, Some(NOBODY)] {
        let who = uid.map_or("root".to_string(), |u| format!("uid {u}"));
        let pool = Pool::new(&format!("other-{}", uid.unwrap_or(0)));
        if let Some(u) = uid {
            chown(&pool.0, u);
        }
        let mut holder = child("hold", &pool.0, uid).spawn().expect("spawn holder");
        assert_eq!(first_report(&mut holder), "@held", "{who}");
        let pid = format!("pid {} (", holder.id());

        // Refused in this (root) process, naming the holder...
        let (e, busy) = refusal(MappedPool::open(&pool.0, &rw()));
        assert!(e.to_string().contains(&pid), "{who}: {e}");
        assert!(
            busy.holders[0].command.contains("lock_child"),
            "{who}: {busy:?}"
        );
        refusal(MappedPool::open(&pool.0, &ro()));
        // ...and in a process of the holder's uid.
        let mut other = child("try", &pool.0, uid).spawn().expect("spawn");
        let said = first_report(&mut other);
        let _ = other.wait();
        assert!(
            said.starts_with("@refused pool in use by ") && said.contains(&pid),
            "{who}: {said}"
        );

        // SAFETY: kill has no memory preconditions; the pid is our child.
        unsafe { libc::kill(holder.id() as i32, libc::SIGKILL) };
        holder.wait().expect("reap holder");
        let pm = MappedPool::open(&pool.0, &rw()).expect("free after the kill");
        let fs = Fs::mount(pm, MountOptions::default()).expect("recover");
        assert!(!fs.mount_report().was_clean, "{who}: a crash, recovered");
        let ino = fs.lookup(1, b"kept").expect("kept survives").ino;
        let fh = fs.open(ino).expect("open kept");
        let mut buf = vec![0u8; 64];
        let n = fs.read(&fh, 0, &mut buf).expect("read");
        assert_eq!(&buf[..n], b"written before the kill", "{who}");
        fs.release(fh);
        fs.unmount().expect("unmount");
    }
}
