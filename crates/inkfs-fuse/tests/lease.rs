//! Clients that write file data themselves under write leases
//! (docs/KERNEL-FREE.md, "Writing: per-inode leases"), on real mounts.
//!
//! The client is this test binary re-executed with `INKFS_LEASE_CHILD` set
//! to the mount point, running the `lease_child` "test": it attaches, then
//! obeys one command per line on stdin and answers with one line starting
//! with `@` on stdout (a write loop answers `@ack I` after each write).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use inkfs::api::client::Client;
use inkfs::api::{Credentials, File, OpenFlags, ROOT_INO};

const CHILD_ENV: &str = "INKFS_LEASE_CHILD";

// ---------------------------------------------------------------------
// The client process
// ---------------------------------------------------------------------

/// Not a test by itself: the client process (see the module comment).
#[test]
fn lease_child() {
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
    println!("@attached {}", client.id());
    let mut file: Option<File> = None;
    for line in std::io::stdin().lines().map_while(Result::ok) {
        let w: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| w.get(i).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
        let answer = match w.as_slice() {
            ["open", name, how] => {
                let flags = match *how {
                    "ro" => libc::O_RDONLY,
                    "append" => libc::O_WRONLY | libc::O_APPEND,
                    "trunc" => libc::O_RDWR | libc::O_TRUNC,
                    _ => libc::O_RDWR,
                };
                let r = client
                    .lookup(&me(), ROOT_INO, name.as_bytes())
                    .and_then(|a| client.open(&me(), a.ino, OpenFlags::new(flags)));
                match r {
                    Ok(f) => {
                        if let Some(old) = file.replace(f) {
                            client.release(old);
                        }
                        "open ok".into()
                    }
                    Err(e) => format!("open errno {}", e.errno()),
                }
            }
            ["pwrite", ..] => {
                let f = file.as_ref().expect("open first");
                let data = vec![num(3) as u8; num(2) as usize];
                match client.pwrite(f, num(1), &data) {
                    Ok(wr) => format!("pwrite {} {}", wr.offset, wr.len),
                    Err(e) => format!("pwrite errno {}", e.errno()),
                }
            }
            ["write", ..] => {
                let f = file.as_ref().expect("open first");
                let data = vec![num(3) as u8; num(2) as usize];
                match client.write(f, num(1), &data) {
                    Ok(n) => format!("write {n}"),
                    Err(e) => format!("write errno {}", e.errno()),
                }
            }
            ["trunc", ..] => {
                let f = file.as_ref().expect("open first");
                match client.truncate(&me(), f, num(1)) {
                    Ok(a) => format!("trunc {}", a.size),
                    Err(e) => format!("trunc errno {}", e.errno()),
                }
            }
            ["fsync"] => {
                let f = file.as_ref().expect("open first");
                match client.fsync(f, false) {
                    Ok(()) => "fsync ok".into(),
                    Err(e) => format!("fsync errno {}", e.errno()),
                }
            }
            ["cat", name] => cat(&client, name),
            ["held"] => format!("held {}", client.leases_held()),
            // N overwrites of the first LEN bytes with byte B: dead entries.
            ["overwrite", ..] => {
                let f = file.as_ref().expect("open first");
                let data = vec![num(3) as u8; num(2) as usize];
                let failed = (0..num(1))
                    .filter(|_| client.pwrite(f, 0, &data).is_err())
                    .count();
                format!("overwrite {failed}")
            }
            ["alive"] => format!("alive {}", client.server_alive()),
            ["sent"] => format!("sent {}", client.messages_sent()),
            ["waited"] => format!("waited {}", client.refills_waited_for()),
            // Until the refill ahead of need in flight (if any) has landed.
            ["settle"] => {
                let t = std::time::Instant::now();
                while client.refilling() && t.elapsed() < std::time::Duration::from_secs(10) {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                format!("settle {}", client.refilling())
            }
            // N overwrites of the first 4 KiB, each followed by fdatasync.
            ["syncloop", ..] => {
                let f = file.as_ref().expect("open first");
                let failed = (0..num(1))
                    .filter(|&i| {
                        client.pwrite(f, 0, &[i as u8; 4096]).is_err()
                            || client.fsync(f, true).is_err()
                    })
                    .count();
                format!("syncloop {failed}")
            }
            // N appends of LEN bytes, each a record: TAG then its number.
            ["appendloop", ..] => {
                let f = file.as_ref().expect("open first");
                let (n, len, tag) = (num(1), num(2) as usize, num(3) as u8);
                let mut failed = 0;
                for i in 0..n {
                    if client.append(f, &record(tag, i as u32, len)).is_err() {
                        failed += 1;
                    }
                }
                format!("appendloop {failed}")
            }
            // Records of LEN bytes at I*LEN for I in 0..N, acknowledged one
            // by one, the byte of round R (overwriting earlier rounds).
            ["writeloop", ..] => {
                let f = file.as_ref().expect("open first");
                let (n, len, round) = (num(1), num(2) as usize, num(3) as u8);
                for i in 0..n {
                    match client.pwrite(f, i * len as u64, &record(round, i as u32, len)) {
                        Ok(_) => println!("@ack {i}"),
                        Err(e) => println!("@fail {i} {}", e.errno()),
                    }
                }
                "writeloop done".into()
            }
            // Fill the file until no space: the bytes acknowledged.
            ["fill", ..] => {
                let f = file.as_ref().expect("open first");
                let chunk = vec![num(1) as u8; 256 << 10];
                let mut at = 0u64;
                let errno = loop {
                    match client.pwrite(f, at, &chunk) {
                        Ok(w) => at += w.len as u64,
                        Err(e) => break e.errno(),
                    }
                };
                format!("fill {at} {errno}")
            }
            ["pin"] => {
                // A call that never ends: the pin (and the server's limbo
                // behind it) stays until the kill.
                client.call(|_| {
                    println!("@pinned");
                    loop {
                        std::thread::sleep(std::time::Duration::from_secs(60));
                    }
                })
            }
            ["quit"] => break,
            _ => format!("unknown {line}"),
        };
        println!("@{answer}");
    }
    if let Some(f) = file.take() {
        client.release(f);
    }
    std::process::exit(0);
}

fn me() -> Credentials {
    Credentials::current_process()
}

/// A record: its tag byte, its number, and the tag again to the end.
fn record(tag: u8, i: u32, len: usize) -> Vec<u8> {
    let mut r = vec![tag; len];
    r[1..5].copy_from_slice(&i.to_le_bytes());
    r
}

/// `cat LEN SUM` of the whole file, read by the client.
fn cat(client: &Client, name: &str) -> String {
    let r: inkfs::api::Result<Vec<u8>> = client.call(|fs| {
        let a = fs.lookup(&me(), ROOT_INO, name.as_bytes())?;
        let f = fs.open(&me(), a.ino, OpenFlags::new(libc::O_RDONLY))?;
        let mut buf = vec![0u8; a.size as usize];
        let n = fs.read(&f, 0, &mut buf);
        fs.release(f);
        buf.truncate(n?);
        Ok(buf)
    });
    match r {
        Ok(b) => format!("cat {} {}", b.len(), sum(&b)),
        Err(e) => format!("cat errno {}", e.errno()),
    }
}

fn sum(b: &[u8]) -> u64 {
    b.iter().map(|&x| x as u64).sum()
}

// ---------------------------------------------------------------------
// The test side
// ---------------------------------------------------------------------

struct ClientProc {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl ClientProc {
    fn start(mnt: &Path) -> ClientProc {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "lease_child", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, mnt)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the client");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut p = ClientProc {
            child,
            stdin,
            stdout,
        };
        let first = p.answer();
        assert!(first.starts_with("attached "), "{first}");
        p
    }

    /// The next `@` line without the `@` ("" if the client is gone).
    fn answer(&mut self) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            if self.stdout.read_line(&mut line).unwrap_or(0) == 0 {
                return String::new();
            }
            if let Some(at) = line.find('@') {
                return line[at + 1..].trim_end().to_string();
            }
        }
    }

    fn tell(&mut self, cmd: &str) {
        writeln!(self.stdin, "{cmd}").expect("client input");
    }

    fn ask(&mut self, cmd: &str) -> String {
        self.tell(cmd);
        self.answer()
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
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

fn fsck_clean(pool: &Pool) {
    let pm = inkfs::pmem::MappedPool::open(&pool.path, &Default::default()).unwrap();
    let report = inkfs::fsck::check(&pm, &Default::default()).unwrap();
    assert!(report.is_clean(), "{report:?}");
}

fn stat_u64(mnt: &Path, key: &str) -> u64 {
    let s = stats_json(mnt).expect("statistics");
    s[key].as_u64().unwrap_or_else(|| panic!("no {key} in {s}"))
}

/// Poll `f` until it holds (`WAIT_LIMIT` at most: 10 s can be short on
/// a loaded machine).
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < inkfs::testkit::WAIT_LIMIT, "never: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A client's writes are seen through the mount at once, data and size,
/// although the kernel had the file's pages and attributes cached (an hour
/// of TTL, pages kept across opens): the grant invalidated them, and every
/// request on the inode recalls the lease. No sleeps.
#[test]
fn a_client_write_is_seen_through_the_mount_at_once() {
    require_root();
    for mode in ["strict", "sync"] {
        let pool = Pool::new(&format!("lease-see-{mode}"), 64);
        let m = Mounted::new(&pool, &format!("mode={mode}"));
        let f = m.p("f");
        std::fs::write(&f, vec![1u8; 10000]).unwrap();
        // Cached by the kernel: pages (kept across opens) and attributes.
        let kept = std::fs::File::open(&f).unwrap();
        assert_eq!(std::fs::read(&f).unwrap(), vec![1u8; 10000]);
        let mut c = ClientProc::start(m.path());
        assert_eq!(c.ask("open f rw"), "open ok", "{mode}");
        for round in 0..20u64 {
            let (off, len, byte) = (round * 3000, 5000 + round * 100, round + 2);
            assert_eq!(
                c.ask(&format!("pwrite {off} {len} {byte}")),
                format!("pwrite {off} {len}"),
                "{mode} round {round}"
            );
            let got = std::fs::read(&f).unwrap();
            let size = std::fs::metadata(&f).unwrap().len();
            assert_eq!(size, got.len() as u64, "{mode} round {round}");
            assert!(size >= off + len, "{mode} round {round}: size {size}");
            let written = &got[off as usize..(off + len) as usize];
            assert!(
                written.iter().all(|&b| b == byte as u8),
                "{mode} round {round}: the mount shows stale bytes"
            );
            // Through the descriptor opened before the writes too.
            let mut buf = vec![0u8; len as usize];
            kept.read_exact_at(&mut buf, off).unwrap();
            assert!(buf.iter().all(|&b| b == byte as u8), "{mode} round {round}");
        }
        // Shrink and grow: the size shows too.
        assert_eq!(c.ask("trunc 4096"), "trunc 4096", "{mode}");
        assert_eq!(std::fs::metadata(&f).unwrap().len(), 4096, "{mode}");
        assert_eq!(c.ask("trunc 100000"), "trunc 100000", "{mode}");
        assert_eq!(std::fs::metadata(&f).unwrap().len(), 100000, "{mode}");
        let got = std::fs::read(&f).unwrap();
        assert!(
            got[4096..].iter().all(|&b| b == 0),
            "{mode}: grown part not zero"
        );
        assert_eq!(c.ask("fsync"), "fsync ok");
        drop(kept);
        c.quit();
        drop(m);
        fsck_clean(&pool);
    }
}

/// A write through the mount to a leased inode recalls the lease; the
/// client then sees that write, and takes the lease again for its next.
#[test]
fn a_write_through_the_mount_recalls_the_lease() {
    require_root();
    let pool = Pool::new("lease-recall", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let f = m.p("f");
    std::fs::write(&f, vec![0u8; 8192]).unwrap();
    let mut c = ClientProc::start(m.path());
    assert_eq!(c.ask("open f rw"), "open ok");
    for round in 0..10u8 {
        assert_eq!(c.ask("pwrite 0 4096 7"), "pwrite 0 4096");
        assert_eq!(c.ask("held"), "held 1", "round {round}");
        assert_eq!(stat_u64(m.path(), "leases_held"), 1, "round {round}");
        // The mount writes the second page: the lease comes back first.
        let w = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
        w.write_all_at(&[round + 20; 4096], 4096).unwrap();
        drop(w);
        assert_eq!(c.ask("held"), "held 0", "round {round}");
        assert_eq!(stat_u64(m.path(), "leases_held"), 0, "round {round}");
        let want = 4096 * 7 + 4096 * (round as u64 + 20);
        assert_eq!(c.ask("cat f"), format!("cat 8192 {want}"), "round {round}");
    }
    assert_eq!(stat_u64(m.path(), "clients_attached"), 1);
    // Through a read-only handle: EBADF, as Linux, and no lease asked.
    assert_eq!(c.ask("open f ro"), "open ok");
    assert_eq!(
        c.ask("pwrite 0 1 1"),
        format!("pwrite errno {}", libc::EBADF)
    );
    assert_eq!(c.ask("held"), "held 0");
    // O_TRUNC truncates under the lease; the mount sees it at once.
    assert_eq!(std::fs::metadata(&f).unwrap().len(), 8192);
    assert_eq!(c.ask("open f trunc"), "open ok");
    assert_eq!(c.ask("held"), "held 1");
    assert_eq!(std::fs::metadata(&f).unwrap().len(), 0);
    assert_eq!(c.ask("held"), "held 0");
    c.quit();
    drop(m);
    fsck_clean(&pool);
}

/// Two clients writing one file alternate the lease: each write lands, and
/// the file ends as the last writes left it.
#[test]
fn two_clients_writing_one_file_alternate_the_lease() {
    require_root();
    let pool = Pool::new("lease-two", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let f = m.p("f");
    std::fs::write(&f, vec![0u8; 8192]).unwrap();
    let mut a = ClientProc::start(m.path());
    let mut b = ClientProc::start(m.path());
    assert_eq!(a.ask("open f rw"), "open ok");
    assert_eq!(b.ask("open f rw"), "open ok");
    for round in 0..30u64 {
        let (x, y) = (round % 200 + 1, round % 200 + 2);
        assert_eq!(a.ask(&format!("pwrite 0 4096 {x}")), "pwrite 0 4096");
        assert_eq!(b.ask(&format!("pwrite 4096 4096 {y}")), "pwrite 4096 4096");
        assert_eq!(a.ask("held"), "held 0", "round {round}: a kept it");
        assert_eq!(b.ask("held"), "held 1", "round {round}");
        let want = 4096 * (x + y);
        assert_eq!(a.ask("cat f"), format!("cat 8192 {want}"), "round {round}");
        let got = std::fs::read(&f).unwrap();
        assert_eq!(sum(&got), want, "round {round}: through the mount");
    }
    a.quit();
    b.quit();
    drop(m);
    fsck_clean(&pool);
}

/// Check a file of `len`-byte records with tags in `tags`, `n` of each:
/// every record whole, each (tag, number) exactly once.
fn check_records(data: &[u8], len: usize, tags: &[u8], n: u32) {
    assert_eq!(data.len(), len * tags.len() * n as usize, "file size");
    let mut seen = std::collections::HashSet::new();
    for (k, r) in data.chunks(len).enumerate() {
        let tag = r[0];
        let i = u32::from_le_bytes(r[1..5].try_into().unwrap());
        assert!(tags.contains(&tag), "record {k}: tag {tag}");
        assert!(i < n, "record {k}: number {i}");
        assert!(r[5..].iter().all(|&b| b == tag), "record {k} torn");
        assert!(seen.insert((tag, i)), "record {k}: ({tag}, {i}) twice");
    }
}

/// O_APPEND from two clients at once (and the mount): records interleave
/// whole, none lost, none overwritten.
#[test]
fn appends_of_two_clients_interleave_whole() {
    require_root();
    let pool = Pool::new("lease-append", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let f = m.p("log");
    std::fs::write(&f, b"").unwrap();
    let mut a = ClientProc::start(m.path());
    let mut b = ClientProc::start(m.path());
    assert_eq!(a.ask("open log append"), "open ok");
    assert_eq!(b.ask("open log append"), "open ok");
    let (n, len) = (300u32, 1000usize);
    a.tell(&format!("appendloop {n} {len} 65"));
    b.tell(&format!("appendloop {n} {len} 66"));
    let path = f.clone();
    let mount_appends = std::thread::spawn(move || {
        let mut w = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        for i in 0..n {
            w.write_all(&record(67, i, len)).unwrap();
        }
    });
    assert_eq!(a.answer(), "appendloop 0");
    assert_eq!(b.answer(), "appendloop 0");
    mount_appends.join().unwrap();
    check_records(&std::fs::read(&f).unwrap(), len, &[65, 66, 67], n);
    a.quit();
    b.quit();
    drop(m);
    fsck_clean(&pool);
}

/// Clients taking an O_APPEND file's lease from one another, record by
/// record: each recall settles the lease and the server then collects the
/// log (compacts it, the log being mostly dead entries of rewritten tail
/// blocks). A grant made during that compaction let the next client
/// append to the log being replaced, and its acknowledged records were
/// lost with it (or its next appends failed): 7 runs in 150 failed so
/// before the fix, none in 300 after. A stress test, not deterministic.
#[test]
fn appends_of_clients_survive_the_log_collected_at_each_recall() {
    require_root();
    let pool = Pool::new("lease-append-gc", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let f = m.p("log");
    std::fs::write(&f, b"").unwrap();
    let tags = [65u8, 66, 67, 68];
    let mut clients: Vec<ClientProc> = tags.iter().map(|_| ClientProc::start(m.path())).collect();
    for c in clients.iter_mut() {
        assert_eq!(c.ask("open log append"), "open ok");
    }
    let (n, len) = (1000u32, 100usize);
    for (c, tag) in clients.iter_mut().zip(tags) {
        c.tell(&format!("appendloop {n} {len} {tag}"));
    }
    for c in clients.iter_mut() {
        assert_eq!(c.answer(), "appendloop 0");
    }
    check_records(&std::fs::read(&f).unwrap(), len, &tags, n);
    for c in clients {
        c.quit();
    }
    drop(m);
    fsck_clean(&pool);
}

/// Why the records above stay whole: an O_APPEND write(2) through the
/// mount reaches the server as one request, placed at the end of file at
/// once, in strict, sync and posix-without-writeback modes. Through the
/// page cache the kernel cut each 1000-byte record at the page boundary it
/// crossed (a page it had not read ends a request), and a lease granted
/// between the two pieces let a client's record land inside the mount's:
/// the test above then failed a few runs in a hundred under load.
#[test]
fn an_append_through_the_mount_is_one_request() {
    require_root();
    let pool = Pool::new("lease-append-one", 32);
    for mode in ["strict", "sync", "posix,nowriteback_cache"] {
        let m = Mounted::new(&pool, &format!("mode={mode}"));
        let f = m.p(&format!("log-{}", mode.len()));
        std::fs::write(&f, b"").unwrap();
        let (n, len) = (64u32, 1000usize);
        let mut w = std::fs::OpenOptions::new().append(true).open(&f).unwrap();
        let before = write_requests(m.path());
        for i in 0..n {
            w.write_all(&record(67, i, len)).unwrap();
        }
        // The server counts a request after its reply: the last one may
        // be counted a moment after its write returned.
        let t = std::time::Instant::now();
        let mut sent = write_requests(m.path()) - before;
        while sent < u64::from(n) && t.elapsed() < inkfs::testkit::WAIT_LIMIT {
            std::thread::sleep(std::time::Duration::from_millis(5));
            sent = write_requests(m.path()) - before;
        }
        assert_eq!(sent, u64::from(n), "{mode}: WRITE requests for {n} appends");
        drop(w);
        check_records(&std::fs::read(&f).unwrap(), len, &[67], n);
        drop(m);
    }
    fsck_clean(&pool);
}

/// The server's count of WRITE requests so far.
fn write_requests(mnt: &Path) -> u64 {
    let s = stats_json(mnt).expect("statistics");
    s["ops"]["write"]["count"].as_u64().unwrap_or(0)
}

/// A client that fills the pool gets ENOSPC when its reservation and the
/// server's free lists are empty; what it wrote before stays, and the pool
/// is clean.
#[test]
fn a_full_pool_gives_the_client_enospc_and_loses_nothing() {
    require_root();
    let pool = Pool::new("lease-full", 32);
    let m = Mounted::new(&pool, "mode=strict");
    let f = m.p("f");
    std::fs::write(&f, b"").unwrap();
    let mut c = ClientProc::start(m.path());
    assert_eq!(c.ask("open f rw"), "open ok");
    let said = c.ask("fill 9");
    let w: Vec<&str> = said.split_whitespace().collect();
    assert_eq!(w[0], "fill", "{said}");
    assert_eq!(w[2], libc::ENOSPC.to_string(), "{said}");
    let acked: u64 = w[1].parse().unwrap();
    assert!(acked > 8 << 20, "{said}");
    let got = std::fs::read(&f).unwrap();
    assert_eq!(got.len() as u64, acked, "the acknowledged bytes, no more");
    assert!(got.iter().all(|&b| b == 9));
    // The mount can still write once the client goes (its reservation
    // comes back), and the file is whole.
    c.quit();
    std::fs::write(m.p("after"), vec![1u8; 4096]).unwrap();
    drop(m);
    fsck_clean(&pool);
}

/// Rounds of a client SIGKILLed while it writes, at a random point: what
/// it acknowledged is there, records are whole (strict mode), its lease is
/// taken back (the mount writes the file at once), and fsck finds the pool
/// clean at the end. `INKFS_LEASE_KILL_ROUNDS` sets the count (200).
#[test]
fn clients_killed_while_writing_lose_only_unacknowledged_writes() {
    require_root();
    kill_rounds("strict", kill_round_count(200));
}

/// The same in sync mode, where an overwrite is made in place: a record
/// the client was writing when it died may mix its old and new bytes (as
/// after a crash), never anything else. 100 rounds by default.
#[test]
fn clients_killed_while_writing_in_place_lose_only_unacknowledged_writes() {
    require_root();
    kill_rounds("sync", kill_round_count(200) / 2);
}

fn kill_round_count(default: u64) -> u64 {
    std::env::var("INKFS_LEASE_KILL_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn kill_rounds(mode: &str, rounds: u64) {
    let pool = Pool::new(&format!("lease-kill-{mode}"), 64);
    let m = Mounted::new(&pool, &format!("mode={mode}"));
    let f = m.p("f");
    let (n, len) = (64u64, 3000usize);
    std::fs::write(&f, b"").unwrap();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    // What each record holds for sure: the round of its last acknowledged
    // write (0: never written).
    let mut acked = vec![0u8; n as usize];
    let (mut mid_loop, mut unacked_seen, mut mid_write) = (0u64, 0u64, 0u64);
    let mut torn_seen = 0u64;
    for round in 1..=rounds {
        let tag = (round % 250 + 1) as u8;
        let mut c = ClientProc::start(m.path());
        assert_eq!(c.ask("open f rw"), "open ok");
        c.tell(&format!("writeloop {n} {len} {tag}"));
        let stop_after = next() % (n + 8);
        let mut pending = None;
        for _ in 0..stop_after.min(n) {
            let a = c.answer();
            let i: usize = a
                .strip_prefix("ack ")
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("round {round}: {a}"));
            acked[i] = tag;
            pending = Some(i + 1);
        }
        // Killed between two writes or in the middle of one.
        std::thread::sleep(Duration::from_micros(next() % 300));
        let pid = c.pid();
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        drop(c);
        let data = std::fs::read(&f).unwrap();
        let mut this_round = 0;
        for (i, want) in acked.iter_mut().enumerate() {
            let at = i * len;
            if *want == 0 && data.len() <= at {
                continue;
            }
            assert!(data.len() >= at + len, "round {round}: record {i} cut");
            let r = &data[at..at + len];
            let in_flight = pending.is_none_or(|p| i >= p);
            let whole = |t: u8| {
                r[0] == t && r[1..5] == (i as u32).to_le_bytes() && r[5..].iter().all(|&b| b == t)
            };
            let zero = r.iter().all(|&b| b == 0);
            // Sync mode, in flight: each byte the old record's or the new.
            let num = (i as u32).to_le_bytes();
            let mixed = || {
                r.iter().enumerate().all(|(k, &b)| {
                    let new = if (1..5).contains(&k) { num[k - 1] } else { tag };
                    let old = match (*want, k) {
                        (0, _) => 0,
                        (_, 1..=4) => num[k - 1],
                        (w, _) => w,
                    };
                    b == new || b == old
                })
            };
            let torn = mode == "sync" && in_flight && !whole(tag) && mixed();
            let ok = (*want == 0 && zero)
                || (*want != 0 && whole(*want))
                || (in_flight && whole(tag))
                || torn;
            assert!(
                ok,
                "round {round} record {i}: acknowledged {want}, found {:?}",
                &r[..8]
            );
            if whole(tag) && *want != tag {
                *want = tag;
                unacked_seen += 1;
            }
            if whole(tag) {
                this_round += 1;
            }
            if torn && !(*want == 0 && zero) && !(*want != 0 && whole(*want)) {
                // Made whole again through the mount, so that the next
                // round starts from a known record.
                let w = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
                w.write_all_at(&record(tag, i as u32, len), at as u64)
                    .unwrap();
                *want = tag;
                torn_seen += 1;
            }
        }
        if this_round < n {
            // Killed before its last write committed.
            mid_write += 1;
        }
        if pending.is_some_and(|p| p < n as usize) {
            mid_loop += 1;
        }
        // The dead client's lease came back: the mount writes the file
        // (past the records) at once.
        let w = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
        w.write_all_at(&[round as u8], n * len as u64).unwrap();
        drop(w);
    }
    eprintln!(
        "{mode}, {rounds} rounds: {mid_loop} killed after some acknowledged writes, \
         {mid_write} before their last write committed, \
         {unacked_seen} records written but not acknowledged found whole, \
         {torn_seen} found torn (sync)"
    );
    assert!(mid_loop > rounds / 4, "the kills did not land mid-loop");
    // How many kills land inside a write depends on the machine's load
    // (on a loaded one the client is descheduled between writes more
    // often): the test asks that some did, not a share.
    assert!(mid_write > 0, "the kills did not land mid-write");
    eventually("no client attached", || {
        stat_u64(m.path(), "clients_attached") == 0
    });
    drop(m);
    fsck_clean(&pool);
}

/// Whether every thread of process `pid` is stopped (state T).
fn all_threads_stopped(pid: i32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.filter_map(Result::ok).all(|t| {
        std::fs::read_to_string(t.path().join("stat")).is_ok_and(|s| {
            // The state follows the command name's closing parenthesis.
            s.rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('T'))
        })
    })
}

/// A client stopped (SIGSTOP) while it holds a lease does not answer the
/// recall: the mount's write waits out the recall timeout, the server
/// kills the client, and the write goes through; the client's acknowledged
/// write stays.
#[test]
fn a_stopped_client_is_killed_at_the_recall_timeout() {
    require_root();
    let pool = Pool::new("lease-stopped", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let f = m.p("f");
    std::fs::write(&f, vec![0u8; 8192]).unwrap();
    let mut c = ClientProc::start(m.path());
    assert_eq!(c.ask("open f rw"), "open ok");
    assert_eq!(c.ask("pwrite 0 4096 5"), "pwrite 0 4096");
    let pid = c.pid();
    // SAFETY: signals to our own child.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    // kill(2) returns before every thread has stopped.
    eventually("the client stopped", || all_threads_stopped(pid));
    let t = Instant::now();
    let w = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
    w.write_all_at(&[6u8; 4096], 4096).unwrap();
    let waited = t.elapsed();
    assert!(
        waited >= inkfs_fuse::lease::RECALL_TIMEOUT - Duration::from_millis(100),
        "the write waited {waited:?}"
    );
    assert!(waited < inkfs_fuse::lease::RECALL_TIMEOUT * 3, "{waited:?}");
    let status = c.child.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    let got = std::fs::read(&f).unwrap();
    assert_eq!(sum(&got), 4096 * 5 + 4096 * 6);
    drop(w);
    drop(m);
    fsck_clean(&pool);
}

/// Unmounting takes every lease back before it closes the clients'
/// sessions: what the client wrote is in the pool, its next write gets
/// EIO instead of landing behind a server that is gone, and the pool is
/// clean.
#[test]
fn unmounting_takes_the_leases_back() {
    require_root();
    let pool = Pool::new("lease-unmount", 64);
    let m = Mounted::new(&pool, "mode=strict");
    std::fs::write(m.p("f"), b"").unwrap();
    let mut c = ClientProc::start(m.path());
    assert_eq!(c.ask("open f rw"), "open ok");
    assert_eq!(c.ask("pwrite 0 5000 3"), "pwrite 0 5000");
    assert_eq!(c.ask("held"), "held 1");
    let dir = m.unmount();
    assert_eq!(c.ask("held"), "held 0");
    assert_eq!(
        c.ask("pwrite 0 10 4"),
        format!("pwrite errno {}", libc::EIO)
    );
    c.quit();
    fsck_clean(&pool);
    let m = Mounted::at(&pool, dir, "mode=strict");
    assert_eq!(std::fs::read(m.p("f")).unwrap(), vec![3u8; 5000]);
}

/// A scrub while a client writes under a lease finds nothing: the server's
/// cached inode is behind the record while the client holds the lease,
/// which is not damage.
#[test]
fn a_scrub_while_a_client_writes_is_clean() {
    require_root();
    let pool = Pool::new("lease-scrub", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let f = m.p("f");
    std::fs::write(&f, vec![0u8; 4096]).unwrap();
    // The server has the inode loaded (this read), then the client leases it.
    assert_eq!(std::fs::read(&f).unwrap().len(), 4096);
    let mut c = ClientProc::start(m.path());
    assert_eq!(c.ask("open f rw"), "open ok");
    assert_eq!(c.ask("pwrite 0 4096 1"), "pwrite 0 4096");
    for round in 0..20 {
        c.tell("writeloop 200 3000 2");
        // The service may still be ending the last scrub after its answer.
        let mut report = None;
        let t = Instant::now();
        while report.is_none() {
            match inkfs_fuse::scrub::request(m.path(), &mut |_, _| {}).expect("an inkfs mount") {
                Ok(r) => report = Some(r),
                Err(e) if e.contains("already running") && t.elapsed().as_secs() < 5 => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Err(e) => panic!("scrub: {e}"),
            }
        }
        let report = report.unwrap();
        assert!(report.findings.is_empty(), "round {round}: {report:?}");
        loop {
            let a = c.answer();
            if a == "writeloop done" {
                break;
            }
            assert!(a.starts_with("ack "), "{a}");
        }
    }
    let s = stats_json(m.path()).unwrap();
    assert_eq!(s["errors"].as_u64().unwrap_or(0), 0, "{s}");
    c.quit();
    drop(m);
    fsck_clean(&pool);
}

/// The server killed while a client holds a lease: the client's committed
/// writes stay, its next write gets EIO (nothing lands behind a dead
/// server), and once it is gone a new mount recovers the pool, clean.
#[test]
fn a_killed_server_stops_the_clients_writes() {
    require_root();
    let pool = Pool::new("lease-server-kill", 64);
    let m = Mounted::new(&pool, "mode=strict");
    std::fs::write(m.p("f"), b"").unwrap();
    let mut c = ClientProc::start(m.path());
    assert_eq!(c.ask("open f rw"), "open ok");
    assert_eq!(c.ask("pwrite 0 6000 4"), "pwrite 0 6000");
    let dir = m.kill9();
    // Once the client has seen its session end (a write racing the
    // server's death commits as it would before a crash).
    assert_eq!(c.ask("alive"), "alive false");
    assert_eq!(
        c.ask("pwrite 0 10 5"),
        format!("pwrite errno {}", libc::EIO)
    );
    c.quit();
    let _ = std::process::Command::new("umount")
        .arg(dir.path())
        .output();
    let m = Mounted::at(&pool, dir, "mode=strict");
    assert_eq!(std::fs::read(m.p("f")).unwrap(), vec![4u8; 6000]);
    drop(m);
    fsck_clean(&pool);
}

/// A served write + fdatasync asks nothing of the server once the client
/// holds the lease and a reservation: fdatasync sends nothing (every write
/// is durable already), and the blocks overwrites displace are recycled
/// for the file's next overwrites, not sent back one message at a time
/// (each message was a system call and woke the server: most of a durable
/// write's time).
#[test]
fn a_write_and_fdatasync_loop_sends_the_server_nothing() {
    require_root();
    for mode in ["strict", "sync"] {
        let pool = Pool::new("lease-quiet", 64);
        let m = Mounted::new(&pool, &format!("mode={mode}"));
        std::fs::write(m.p("f"), vec![1u8; 4096]).unwrap();
        let mut c = ClientProc::start(m.path());
        assert_eq!(c.ask("open f rw"), "open ok");
        // The lease and a reservation, and the first displaced blocks.
        assert_eq!(c.ask("syncloop 200"), "syncloop 0", "{mode}");
        let sent = c.ask("sent");
        assert_eq!(c.ask("syncloop 2000"), "syncloop 0", "{mode}");
        assert_eq!(c.ask("sent"), sent, "{mode}: messages during the loop");
        assert_eq!(c.ask("cat f"), format!("cat 4096 {}", 4096 * (1999 % 256)));
        c.quit();
        drop(m);
        fsck_clean(&pool);
    }
}

/// Appends that go through the client's reservation several times over
/// find it refilled ahead of need by the reserve thread: only the first
/// write (the reservation empty at attach) waits for the server. The
/// blocks reserved ahead are the client's like any reservation: at its
/// death (SIGKILL) the server takes them back, and once the file is gone
/// the pool's free space is what it was before the client attached.
#[test]
fn appends_find_the_reservation_refilled_ahead_and_a_death_returns_it() {
    require_root();
    let pool = Pool::new("lease-ahead", 128);
    let m = Mounted::new(&pool, "mode=strict");
    std::fs::write(m.p("f"), b"").unwrap();
    let before = free_blocks(m.path());
    let mut c = ClientProc::start(m.path());
    assert_eq!(c.ask("open f append"), "open ok");
    assert_eq!(c.ask("appendloop 256 4096 7"), "appendloop 0");
    let first: usize = c
        .ask("waited")
        .trim_start_matches("waited ")
        .parse()
        .unwrap();
    assert!(first <= 1, "waited {first} times for the first reservation");
    // 3 reservations' worth (1024 blocks each), in steps of a quarter of
    // one, each after the refill asked for in the step before has landed:
    // a step wakes the thread with 512 blocks at most left, more than the
    // rest of the step takes, so no write runs dry however late the
    // thread runs, unless it does not refill at all.
    for step in 0..12 {
        assert_eq!(c.ask("settle"), "settle false", "step {step}");
        assert_eq!(
            c.ask("appendloop 256 4096 7"),
            "appendloop 0",
            "step {step}"
        );
    }
    assert_eq!(
        c.ask("waited"),
        format!("waited {first}"),
        "a write ran dry"
    );
    assert_eq!(c.ask("settle"), "settle false");
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(c.pid(), libc::SIGKILL) };
    drop(c);
    eventually("the client reaped", || {
        stat_u64(m.path(), "clients_attached") == 0
    });
    std::fs::remove_file(m.p("f")).unwrap();
    // The removal's space comes back once the server has freed the inode.
    // (A few blocks of slack: the removal's entry may take a new page of
    // the root's log; a reservation kept would be hundreds.)
    eventually("the reservation and the file's blocks back", || {
        free_blocks(m.path()) + 8 >= before
    });
    drop(m);
    fsck_clean(&pool);
}

/// Free blocks of the mount's file system (statvfs).
fn free_blocks(mnt: &Path) -> u64 {
    let c = std::ffi::CString::new(mnt.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: all-zero is a valid statvfs; the kernel fills it.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a statvfs to fill.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    st.f_bfree
}

/// A client overwriting one block again and again fills its log with dead
/// entries, which it cannot collect (compaction commits through the
/// server's journal): it gives the lease back when compaction is due, the
/// server collects the log, and the client goes on. The log stays bounded.
#[test]
fn a_client_log_full_of_dead_entries_is_collected_by_the_server() {
    require_root();
    let pool = Pool::new("lease-gc", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let f = m.p("f");
    std::fs::write(&f, vec![0u8; 4096]).unwrap();
    let mut c = ClientProc::start(m.path());
    assert_eq!(c.ask("open f rw"), "open ok");
    assert_eq!(c.ask("overwrite 50000 4096 7"), "overwrite 0");
    assert!(stat_u64(m.path(), "gc_compactions") >= 2, "no compaction");
    assert_eq!(std::fs::read(&f).unwrap(), vec![7u8; 4096]);
    assert_eq!(c.ask("cat f"), format!("cat 4096 {}", 4096 * 7));
    c.quit();
    drop(m);
    fsck_clean(&pool);
}

/// A process that drops a client holding a lease and lives on is not
/// killed when the lease is recalled before the server has seen that
/// session end (the recall's send fails on the closed session: the server
/// waits for the end, which settles the lease, instead of SIGKILLing the
/// client's pid, which is this live process). Under load the window was
/// wide enough that preload_ns.rs's create-with-lease test killed its own
/// test binary now and then. Rounds: `INKFS_DROPPED_CLIENT_ROUNDS`
/// (default 200).
#[test]
fn a_client_dropped_while_holding_a_lease_does_not_get_its_process_killed() {
    use inkfs::api::ns::Op;
    require_root();
    let pool = Pool::new("lease-dropped", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let me = Credentials::root();
    let rounds: usize = std::env::var("INKFS_DROPPED_CLIENT_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    for round in 0..rounds {
        let client = Client::attach_mountpoint(m.path(), None).expect("attach");
        let name = format!("f{round}");
        let d = client
            .ns(
                &me,
                Op::Create {
                    dir: ROOT_INO,
                    name: name.clone().into_bytes(),
                    mode: 0o644,
                    flags: libc::O_CREAT | libc::O_WRONLY,
                },
            )
            .expect("asked");
        assert_eq!(d.errno, 0, "round {round}");
        assert!(client.holds_lease(d.ino), "round {round}: leased");
        drop(client);
        // At once: the recall may find the session closed and not yet
        // ended on the server's side.
        std::fs::write(m.p(&name), b"through the mount").expect("write");
    }
    assert_eq!(stat_u64(m.path(), "leases_held"), 0);
    drop(m);
    fsck_clean(&pool);
}

/// The server's guard on reservations: four clients on a small pool
/// whose appends ask for reservations together (2048 blocks at a first
/// dry write, 1024 more ahead of need: more than the pool's 8,000 free
/// blocks in all) leave the server room for its own operations: creates
/// and writes through the mount, made while the clients hold their
/// reservations, get no ENOSPC. A client killed mid-append and the others
/// detaching give their blocks back: once the files are gone the free
/// count is what it was, and fsck finds the pool clean.
#[test]
fn clients_reserving_at_once_leave_the_server_room_and_a_kill_returns_theirs() {
    require_root();
    let pool = Pool::new("lease-guard", 32);
    let m = Mounted::new(&pool, "mode=strict");
    let before = free_blocks(m.path());
    let mut cs: Vec<ClientProc> = (0..4)
        .map(|i| {
            std::fs::write(m.p(&format!("c{i}")), b"").unwrap();
            let mut c = ClientProc::start(m.path());
            assert_eq!(c.ask(&format!("open c{i} append")), "open ok");
            c
        })
        .collect();
    // All at once: 2 MiB each, in 64 KiB appends.
    for (i, c) in cs.iter_mut().enumerate() {
        c.tell(&format!("appendloop 32 65536 {}", i + 1));
    }
    for (i, c) in cs.iter_mut().enumerate() {
        assert_eq!(c.answer(), "appendloop 0", "client {i}");
        assert_eq!(c.ask("settle"), "settle false", "client {i}");
    }
    // The clients hold their reservations; the mount's own creates and
    // writes find room.
    std::fs::create_dir(m.p("d")).unwrap();
    for k in 0..400 {
        std::fs::write(m.p(&format!("d/f{k}")), [k as u8; 100])
            .unwrap_or_else(|e| panic!("create {k} through the mount: {e}"));
    }
    std::fs::write(m.p("big"), vec![7u8; 512 << 10]).expect("512 KiB through the mount");
    assert!(free_blocks(m.path()) > 0);
    // One client killed mid-append, the others detach.
    let mut dead = cs.remove(0);
    dead.tell("appendloop 64 65536 9");
    std::thread::sleep(Duration::from_millis(3));
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(dead.pid(), libc::SIGKILL) };
    drop(dead);
    for c in cs {
        c.quit();
    }
    eventually("the clients reaped", || {
        stat_u64(m.path(), "clients_attached") == 0
    });
    for i in 0..4 {
        std::fs::remove_file(m.p(&format!("c{i}"))).unwrap();
    }
    std::fs::remove_file(m.p("big")).unwrap();
    std::fs::remove_dir_all(m.p("d")).unwrap();
    // A few blocks of slack: the root's and d's log pages.
    eventually("every reservation and the files' blocks back", || {
        free_blocks(m.path()) + 16 >= before
    });
    drop(m);
    fsck_clean(&pool);
}

/// A client's unused reservation given back at a recall is free at once,
/// not held in the server's limbo like blocks a reader may hold: with
/// another client pinned in a call (the limbo cannot drain), the recall
/// puts the reservation back in the free count (2048 blocks asked at the
/// first write, a few used), and the limbo does not grow by it.
#[test]
fn an_unused_reservation_given_back_is_free_at_once() {
    require_root();
    let pool = Pool::new("lease-unused", 64);
    let m = Mounted::new(&pool, "mode=strict");
    std::fs::write(m.p("f"), b"").unwrap();
    let mut c = ClientProc::start(m.path());
    assert_eq!(c.ask("open f append"), "open ok");
    assert_eq!(c.ask("appendloop 16 4096 3"), "appendloop 0");
    assert_eq!(c.ask("settle"), "settle false");
    let mut pinned = ClientProc::start(m.path());
    assert_eq!(pinned.ask("pin"), "pinned");
    let free = free_blocks(m.path());
    let limbo = stat_u64(m.path(), "limbo_blocks");
    // A write through the mount recalls the lease: the client holds no
    // other, so its reservation (over 1000 unused blocks) goes back.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(m.p("f"))
        .unwrap();
    f.write_all(&[1u8; 4096]).unwrap();
    drop(f);
    eventually("the unused reservation free at once", || {
        free_blocks(m.path()) >= free + 1000
    });
    // What the client freed (its file's preallocation) may wait there.
    let grown = stat_u64(m.path(), "limbo_blocks").saturating_sub(limbo);
    assert!(grown < 1000, "{grown} blocks went to the limbo");
    drop(pinned);
    c.quit();
    drop(m);
    fsck_clean(&pool);
}
