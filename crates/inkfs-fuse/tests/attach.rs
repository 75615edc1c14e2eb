//! Read-only clients of the kernel-free path (docs/KERNEL-FREE.md, stage
//! 2): another process attaches to a real mount over its control socket
//! and reads the pool straight from its own mapping
//! (`inkfs::api::client`).
//!
//! The client is this test binary re-executed with `INKFS_ATTACH_CHILD`
//! set to the mount point, running the `attach_child` "test": it attaches,
//! then obeys one command per line on stdin and answers with one line
//! starting with `@` on stdout.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use inkfs::api::client::Client;
use inkfs::api::{Credentials, OpenFlags, ROOT_INO};

const CHILD_ENV: &str = "INKFS_ATTACH_CHILD";
const NOBODY: u32 = 65534;
/// The file the mount rewrites while the client reads it.
const FILE_BYTES: usize = 64 << 10;

// ---------------------------------------------------------------------
// The client process
// ---------------------------------------------------------------------

/// Not a test by itself: the client process (see the module comment).
#[test]
fn attach_child() {
    let Ok(mnt) = std::env::var(CHILD_ENV) else {
        return;
    };
    let client = match Client::attach_mountpoint(Path::new(&mnt), None) {
        Ok(c) => c,
        Err(e) => {
            println!("@refused {e}");
            std::process::exit(0);
        }
    };
    println!("@attached {} {}", client.id(), client.slot());
    for line in std::io::stdin().lines().map_while(Result::ok) {
        let words: Vec<&str> = line.split_whitespace().collect();
        let answer = match words.as_slice() {
            ["cat", name] => cat(&client, name),
            ["sum", name] => match read_file(&client, name) {
                Ok(b) => format!("sum {}", b.iter().map(|&x| x as u64).sum::<u64>()),
                Err(e) => format!("sum errno {}", e.errno()),
            },
            ["ls"] => ls(&client),
            ["hammer", name, ms] => hammer(&client, name, ms.parse().unwrap_or(500)),
            ["hammerdir", ms] => hammer_dir(&client, ms.parse().unwrap_or(500)),
            ["write", name] => try_write(&client, name),
            ["alive"] => format!("alive {}", client.server_alive()),
            ["pin"] => {
                // A call that never ends: the pin stays until the kill.
                client.call(|_| {
                    println!("@pinned");
                    loop {
                        std::thread::sleep(Duration::from_secs(60));
                    }
                })
            }
            ["quit"] => break,
            _ => format!("unknown {line}"),
        };
        println!("@{answer}");
    }
    std::process::exit(0);
}

fn me() -> Credentials {
    Credentials::current_process()
}

/// The whole file `name` of the root, as one pinned call.
fn read_file(client: &Client, name: &str) -> inkfs::api::Result<Vec<u8>> {
    client.call(|fs| {
        let a = fs.lookup(&me(), ROOT_INO, name.as_bytes())?;
        let f = fs.open(&me(), a.ino, OpenFlags::new(libc::O_RDONLY))?;
        let mut buf = vec![0u8; a.size as usize];
        let n = fs.read(&f, 0, &mut buf);
        fs.release(f);
        buf.truncate(n?);
        Ok(buf)
    })
}

/// `cat LEN FIRST_BYTE` or `cat ERRNO`.
fn cat(client: &Client, name: &str) -> String {
    match read_file(client, name) {
        Ok(b) => format!("cat {} {}", b.len(), b.first().copied().unwrap_or(0)),
        Err(e) => format!("cat errno {}", e.errno()),
    }
}

/// The names of the root directory, sorted, in one pass.
fn names(client: &Client) -> inkfs::api::Result<Vec<String>> {
    let d = client.opendir(&me(), ROOT_INO)?;
    let mut out = Vec::new();
    let r = client.readdir(&d, 0, &mut |e| {
        if e.name != b"." && e.name != b".." {
            out.push(String::from_utf8_lossy(&e.name).into_owned());
        }
        true
    });
    client.release(d);
    r.map(|()| out)
}

fn ls(client: &Client) -> String {
    match names(client) {
        Ok(mut n) => {
            n.sort();
            format!("ls {}", n.join(" "))
        }
        Err(e) => format!("ls errno {}", e.errno()),
    }
}

/// Read `name` whole, again and again for `ms`: every read must be one
/// pattern the mount wrote (all bytes equal, full length).
fn hammer(client: &Client, name: &str, ms: u64) -> String {
    let (mut reads, mut torn, mut errors) = (0u64, 0u64, 0u64);
    let mut values = std::collections::BTreeSet::new();
    let mut last_error = String::from("-");
    let end = Instant::now() + Duration::from_millis(ms);
    while Instant::now() < end {
        match read_file(client, name) {
            Ok(b) => {
                reads += 1;
                let whole = b.len() == FILE_BYTES && b.iter().all(|&x| x == b[0]);
                if whole {
                    values.insert(b[0]);
                } else {
                    torn += 1;
                }
            }
            Err(e) => {
                errors += 1;
                last_error = format!("{}", e.errno());
            }
        }
    }
    format!(
        "hammer reads={reads} torn={torn} errors={errors} values={} last_error={last_error}",
        values.len()
    )
}

/// Readdir passes of the root for `ms`: no name twice in a pass, and the
/// pair `a.N`/`b.N` the mount keeps (it creates b.N+1 before unlinking
/// a.N... see the test) is always seen as some committed state: the
/// count of names in a pass is 1 or 2, never 0.
fn hammer_dir(client: &Client, ms: u64) -> String {
    let (mut passes, mut dups, mut empty) = (0u64, 0u64, 0u64);
    let mut seen = std::collections::BTreeSet::new();
    let end = Instant::now() + Duration::from_millis(ms);
    while Instant::now() < end {
        let Ok(n) = names(client) else {
            dups += 1;
            continue;
        };
        passes += 1;
        let moving: Vec<&String> = n.iter().filter(|s| s.starts_with("n.")).collect();
        let unique: std::collections::BTreeSet<&String> = n.iter().collect();
        if unique.len() != n.len() {
            dups += 1;
        }
        if moving.is_empty() {
            empty += 1;
        }
        seen.extend(moving.into_iter().cloned());
    }
    format!(
        "hammerdir passes={passes} dups={dups} empty={empty} names={}",
        seen.len()
    )
}

fn try_write(client: &Client, name: &str) -> String {
    let r = client.call(|fs| {
        let a = fs.lookup(&me(), ROOT_INO, name.as_bytes())?;
        fs.open(&me(), a.ino, OpenFlags::new(libc::O_WRONLY))
            .map(|f| fs.release(f))
    });
    let created = client.call(|fs| {
        fs.create(
            &me(),
            ROOT_INO,
            b"new",
            0o644,
            OpenFlags::new(libc::O_WRONLY),
        )
        .map(|(_, f)| fs.release(f))
    });
    let errno = |r: inkfs::api::Result<()>| r.err().map_or(0, |e| e.errno());
    format!("write {} {}", errno(r), errno(created))
}

// ---------------------------------------------------------------------
// The test side
// ---------------------------------------------------------------------

/// A client process attached to a mount.
struct ClientProc {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl ClientProc {
    /// Start a client of `mnt` as `uid` (None: as this process); returns
    /// it and its first line (`attached ID SLOT` or `refused MESSAGE`).
    fn start(mnt: &Path, uid: Option<u32>) -> (ClientProc, String) {
        let mut c = Command::new(std::env::current_exe().unwrap());
        c.args(["--exact", "attach_child", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, mnt)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        if let Some(uid) = uid {
            c.uid(uid).gid(uid);
        }
        let mut child = c.spawn().expect("spawn the client");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut p = ClientProc {
            child,
            stdin,
            stdout,
        };
        let first = p.answer();
        (p, first)
    }

    /// The next `@` line, without the `@`.
    fn answer(&mut self) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.stdout.read_line(&mut line).expect("client output");
            assert!(n > 0, "the client ended without answering");
            if let Some(at) = line.find('@') {
                return line[at + 1..].trim_end().to_string();
            }
        }
    }

    fn ask(&mut self, cmd: &str) -> String {
        writeln!(self.stdin, "{cmd}").expect("client input");
        self.answer()
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn quit(mut self) {
        let _ = writeln!(self.stdin, "quit");
        let _ = self.child.wait();
    }
}

impl Drop for ClientProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn stat_u64(mnt: &Path, key: &str) -> u64 {
    let s = stats_json(mnt).expect("statistics");
    s[key].as_u64().unwrap_or_else(|| panic!("no {key} in {s}"))
}

/// Poll `f` until it holds (`WAIT_LIMIT` at most: 5 s was short on a
/// loaded machine).
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < inkfs::testkit::WAIT_LIMIT, "never: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn fsck_clean(pool: &Pool) {
    let pm = inkfs::pmem::MappedPool::open(&pool.path, &Default::default()).unwrap();
    let report = inkfs::fsck::check(&pm, &Default::default()).unwrap();
    assert!(report.is_clean(), "{report:?}");
}

/// Every change the mount makes is seen by the client's next call, in
/// strict and sync modes: file contents, names created and unlinked.
/// Writing calls get EROFS. The client's session shows in `inkfs stat`
/// and goes with it.
#[test]
fn a_client_sees_each_change_once_the_mount_returns() {
    for mode in ["strict", "sync"] {
        let pool = Pool::new(&format!("attach-see-{mode}"), 64);
        let m = Mounted::new(&pool, &format!("mode={mode}"));
        std::fs::write(m.p("f"), b"").unwrap();
        let (mut c, first) = ClientProc::start(m.path(), None);
        assert!(first.starts_with("attached "), "{mode}: {first}");
        assert_eq!(stat_u64(m.path(), "clients_attached"), 1, "{mode}");
        let mut want: Vec<String> = vec!["f".into()];
        for i in 0..20u8 {
            let data = vec![i + 1; 1000 + 4096 * i as usize];
            std::fs::write(m.p("f"), &data).unwrap();
            assert_eq!(
                c.ask("cat f"),
                format!("cat {} {}", data.len(), i + 1),
                "{mode} round {i}"
            );
            std::fs::write(m.p(&format!("g{i}")), b"x").unwrap();
            want.push(format!("g{i}"));
            if i % 3 == 2 {
                std::fs::remove_file(m.p(&format!("g{}", i - 1))).unwrap();
                want.retain(|n| n != &format!("g{}", i - 1));
            }
            want.sort();
            assert_eq!(
                c.ask("ls"),
                format!("ls {}", want.join(" ")),
                "{mode} round {i}"
            );
        }
        std::fs::remove_file(m.p("f")).unwrap();
        assert_eq!(c.ask("cat f"), format!("cat errno {}", libc::ENOENT));
        std::fs::write(m.p("f"), b"again").unwrap();
        assert_eq!(c.ask("cat f"), format!("cat 5 {}", b'a'));
        assert_eq!(
            c.ask("write f"),
            format!("write {} {}", libc::EROFS, libc::EROFS),
            "{mode}: a read-only client"
        );
        c.quit();
        eventually("the session ends with the client", || {
            stat_u64(m.path(), "clients_attached") == 0
        });
        drop(m.unmount());
        fsck_clean(&pool);
    }
}

/// Strict mode: a file the mount rewrites whole, over and over, is never
/// seen torn by a client reading it meanwhile, and a directory where names
/// come and go is never seen with a name twice or with neither of the
/// two names the mount keeps (it creates the next before it unlinks the
/// last).
#[test]
fn a_client_reading_while_the_mount_writes_sees_only_committed_states() {
    // Roomy: a client off its CPU while pinned holds every block the
    // writer frees meanwhile (the writes wait for it, up to LIMBO_WAIT).
    let pool = Pool::new("attach-race", 256);
    let m = Mounted::new(&pool, "mode=strict");
    std::fs::write(m.p("f"), vec![0u8; FILE_BYTES]).unwrap();
    std::fs::write(m.p("n.0"), b"").unwrap();
    let (mut c, first) = ClientProc::start(m.path(), None);
    assert!(first.starts_with("attached "), "{first}");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (path, stop) = (m.p("f"), stop.clone());
        std::thread::spawn(move || {
            let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
            let mut round = 0u8;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                round = round.wrapping_add(1);
                f.write_all_at(&vec![round; FILE_BYTES], 0).unwrap();
            }
            round
        })
    };
    let said = c.ask("hammer f 1000");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let rounds = writer.join().unwrap();
    let field = |s: &str, k: &str| -> u64 {
        s.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{k}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {k} in {s}"))
    };
    assert_eq!(field(&said, "torn"), 0, "{said}");
    assert_eq!(field(&said, "errors"), 0, "{said}");
    assert!(field(&said, "reads") > 10, "{said}");
    assert!(
        field(&said, "values") >= 2,
        "the client saw the writes ({said}, {rounds} rounds)"
    );
    // Names: n.(i+1) created, then n.i unlinked, while the client lists.
    stop.store(false, std::sync::atomic::Ordering::Relaxed);
    let namer = {
        let (dir, stop) = (m.path().to_path_buf(), stop.clone());
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::fs::write(dir.join(format!("n.{}", i + 1)), b"").unwrap();
                std::fs::remove_file(dir.join(format!("n.{i}"))).unwrap();
                i += 1;
            }
            i
        })
    };
    let said = c.ask("hammerdir 1000");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let steps = namer.join().unwrap();
    assert_eq!(field(&said, "dups"), 0, "{said}");
    assert_eq!(field(&said, "empty"), 0, "{said}");
    assert!(
        field(&said, "names") >= 2,
        "names came and went ({said}, {steps} steps)"
    );
    c.quit();
    drop(m.unmount());
    fsck_clean(&pool);
}

/// Blocks the mount frees while a client is mid-call wait in the limbo; a
/// client killed mid-call has its slot released, and they return to the
/// free lists. With the client attached but between calls, frees are not
/// held at all.
#[test]
fn a_killed_client_releases_its_slot_and_the_blocks_it_held() {
    let pool = Pool::new("attach-kill", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let data = vec![1u8; 1 << 20];
    std::fs::write(m.p("f"), &data).unwrap();
    let (mut c, first) = ClientProc::start(m.path(), None);
    assert!(first.starts_with("attached "), "{first}");
    let free_before = stat_u64(m.path(), "bytes_free");
    // Attached, between calls: an overwrite's old blocks are free at once.
    std::fs::write(m.p("f"), vec![2u8; 1 << 20]).unwrap();
    assert_eq!(
        stat_u64(m.path(), "limbo_blocks"),
        0,
        "an idle client holds nothing"
    );
    assert_eq!(stat_u64(m.path(), "bytes_free"), free_before);
    // Mid-call: the old blocks are held.
    assert_eq!(c.ask("pin"), "pinned");
    std::fs::write(m.p("f"), vec![3u8; 1 << 20]).unwrap();
    let held = stat_u64(m.path(), "limbo_blocks");
    assert!(held >= 256, "1 MiB rewritten: {held} blocks held");
    assert!(stat_u64(m.path(), "bytes_free") < free_before);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        stat_u64(m.path(), "limbo_blocks"),
        held,
        "held while the client is pinned"
    );
    c.kill9();
    eventually("the slot is released and the limbo empties", || {
        stat_u64(m.path(), "limbo_blocks") == 0 && stat_u64(m.path(), "clients_attached") == 0
    });
    assert_eq!(stat_u64(m.path(), "bytes_free"), free_before);
    // The slot is free for the next client.
    let (mut c, first) = ClientProc::start(m.path(), None);
    assert!(first.starts_with("attached "), "{first}");
    assert_eq!(c.ask("cat f"), format!("cat {} 3", 1 << 20));
    c.quit();
    drop(m.unmount());
    fsck_clean(&pool);
}

/// A client stalled mid-call holds the blocks the mount frees meanwhile:
/// a write that needs them waits for the client (here: until it is
/// killed) instead of failing with ENOSPC, and fails only after
/// `inkfs::api::LIMBO_WAIT` if the client never moves on.
#[test]
fn a_stalled_client_delays_the_writes_that_need_its_space() {
    let pool = Pool::new("attach-full", 16);
    let m = Mounted::new(&pool, "mode=strict");
    let free = stat_u64(m.path(), "bytes_free");
    // Three copies of the file do not fit: the third rewrite needs the
    // blocks the first two freed.
    let size = (free / 3 + 4096) & !4095;
    std::fs::write(m.p("f"), vec![1u8; size as usize]).unwrap();
    let rewrite = |v: u8| std::fs::write(m.p("f"), vec![v; size as usize]);
    // Never unpinned: the write fails, after the wait.
    let (mut c, first) = ClientProc::start(m.path(), None);
    assert!(first.starts_with("attached "), "{first}");
    assert_eq!(c.ask("pin"), "pinned");
    rewrite(2).unwrap();
    let t = Instant::now();
    let e = rewrite(3).expect_err("no room while the client holds the old copies");
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    assert!(t.elapsed() >= inkfs::api::LIMBO_WAIT, "{:?}", t.elapsed());
    // The client goes mid-wait: the write succeeds. The clock starts
    // before the killer does (started after the spawn, a test thread kept
    // off the CPU meanwhile measured less than the killer's pause): the
    // write cannot succeed before the kill.
    let t = Instant::now();
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        c.kill9();
    });
    rewrite(4).expect("written once the client's blocks came back");
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    killer.join().unwrap();
    let (mut c, _) = ClientProc::start(m.path(), None);
    assert_eq!(c.ask("cat f"), format!("cat {size} 4"));
    c.quit();
    drop(m.unmount());
    fsck_clean(&pool);
}

/// The trust rule: a peer that could not open the pool itself is refused
/// (the socket serves every user with stats=all, the pool is 0600), and
/// served once the pool's mode lets it open the pool.
#[test]
fn a_peer_that_could_not_open_the_pool_is_refused() {
    let pool = Pool::new("attach-trust", 64);
    std::fs::set_permissions(&pool.path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let m = Mounted::new(&pool, "mode=strict,stats=all");
    let mnt = m.path().to_path_buf();
    let (_c, first) = ClientProc::start(&mnt, Some(NOBODY));
    assert!(first.starts_with("refused "), "{first}");
    assert!(first.contains("permission denied"), "{first}");
    assert!(first.contains(&format!("uid {NOBODY} cannot")), "{first}");
    assert!(first.contains("pool mode 0600"), "{first}");
    assert_eq!(stat_u64(&mnt, "clients_attached"), 0);
    std::fs::set_permissions(&pool.path, std::fs::Permissions::from_mode(0o666)).unwrap();
    std::fs::write(m.p("f"), b"hello").unwrap();
    let (mut c, first) = ClientProc::start(&mnt, Some(NOBODY));
    assert!(first.starts_with("attached "), "{first}");
    assert_eq!(c.ask("cat f"), format!("cat 5 {}", b'h'));
    c.quit();
    drop(m.unmount());
    fsck_clean(&pool);
}

/// Posix mode is refused, saying why.
#[test]
fn posix_mode_refuses_attach() {
    let pool = Pool::new("attach-posix", 64);
    let m = Mounted::new(&pool, "mode=posix");
    let (_c, first) = ClientProc::start(m.path(), None);
    assert!(first.starts_with("refused "), "{first}");
    assert!(first.contains("posix mode"), "{first}");
}

/// A hybrid pool (large files' data on a data device) attaches: the grant
/// hands the data device over too, and the client reads a file whose data
/// is there as the mount does.
#[test]
fn a_hybrid_pool_attaches_with_its_data_device() {
    let h = HybridPool::new("attach-hybrid", 32, 32, 64 << 10);
    let m = Mounted::new(&h.pool, "mode=strict");
    let data: Vec<u8> = (0..(1u32 << 20) + 333)
        .map(|i| (i % 251) as u8 + 1)
        .collect();
    std::fs::write(m.p("big"), &data).unwrap();
    let (mut c, first) = ClientProc::start(m.path(), None);
    assert!(first.starts_with("attached "), "{first}");
    assert_eq!(c.ask("cat big"), format!("cat {} 1", data.len()));
    assert_eq!(
        c.ask("sum big"),
        format!("sum {}", data.iter().map(|&b| b as u64).sum::<u64>())
    );
    c.quit();
}

/// The client's descriptor shares the server's claim: with the server
/// killed, no new mount gets the pool while the client lives; once it is
/// gone the pool mounts (recovered) and checks clean. An unmount with a
/// client attached ends the client's session and still unmounts cleanly.
#[test]
fn the_clients_descriptor_keeps_the_claim() {
    let pool = Pool::new("attach-claim", 64);
    let m = Mounted::new(&pool, "mode=strict");
    std::fs::write(m.p("f"), b"kept").unwrap();
    let (mut c, first) = ClientProc::start(m.path(), None);
    assert!(first.starts_with("attached "), "{first}");
    let dir = m.kill9();
    let out = mount_with(&pool.path, dir.path(), "mode=strict");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "mounted while a client holds the pool"
    );
    assert!(
        err.contains(&c.pid().to_string()),
        "the refusal names the client: {err}"
    );
    // The client still reads the pool as the server left it.
    assert_eq!(c.ask("cat f"), format!("cat 4 {}", b'k'));
    assert_eq!(c.ask("alive"), "alive false");
    c.kill9();
    let m = Mounted::at(&pool, dir, "mode=strict");
    assert!(!mounted_clean(m.path()), "the server was killed: recovered");
    assert_eq!(std::fs::read(m.p("f")).unwrap(), b"kept");
    // Unmount with a client attached.
    let (mut c, first) = ClientProc::start(m.path(), None);
    assert!(first.starts_with("attached "), "{first}");
    drop(m.unmount());
    assert_eq!(c.ask("alive"), "alive false");
    c.quit();
    fsck_clean(&pool);
}
