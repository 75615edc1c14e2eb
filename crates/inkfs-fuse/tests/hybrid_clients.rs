//! The kernel-free path on hybrid pools (docs/KERNEL-FREE.md, "Hybrid
//! pools"): attached clients read large files' data from the data device
//! and write it there themselves under write leases, coherently with the
//! mount (whose DRAM cache of device blocks must not serve what a client
//! overwrote), with dead clients leaking nothing; and the preload library
//! serving programs on such a mount.
//!
//! The client is this test binary re-executed with `INKFS_HYBRID_CHILD`
//! set to the mount point, running the `hybrid_child` "test": it attaches,
//! then obeys one command per line on stdin and answers with one line
//! starting with `@` on stdout (a write loop answers `@ack I` after each
//! write). Pools are in /dev/shm, data files in /var/tmp (the disk).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use inkfs::api::client::Client;
use inkfs::api::{Credentials, File, OpenFlags, ROOT_INO};

const CHILD_ENV: &str = "INKFS_HYBRID_CHILD";
/// Writes of at least this many bytes go to the data device.
const THRESHOLD: u32 = 64 << 10;
const PYTHON: &str = "/usr/bin/python3";

// ---------------------------------------------------------------------
// The client process
// ---------------------------------------------------------------------

/// Not a test by itself: the client process (see the module comment).
#[test]
fn hybrid_child() {
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
            ["open", name] => {
                let r = client
                    .lookup(&me(), ROOT_INO, name.as_bytes())
                    .and_then(|a| client.open(&me(), a.ino, OpenFlags::new(libc::O_RDWR)));
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
            // pwrite OFF LEN BYTE
            ["pwrite", ..] => {
                let f = file.as_ref().expect("open first");
                let data = vec![num(3) as u8; num(2) as usize];
                match client.pwrite(f, num(1), &data) {
                    Ok(wr) => format!("pwrite {} {}", wr.offset, wr.len),
                    Err(e) => format!("pwrite errno {}", e.errno()),
                }
            }
            ["sum", name] => sum_of(&client, name),
            // The client's own DRAM cache of device blocks: hits, misses.
            ["hits"] => {
                let d: inkfs::api::Result<Option<inkfs::blockdev::DataStats>> =
                    client.call(|fs| Ok(fs.data_stats()));
                let d = d.ok().flatten().unwrap_or_default();
                format!("hits {} {}", d.cache_hits, d.cache_misses)
            }
            // Records of LEN bytes at I*LEN for I in 0..N, acknowledged one
            // by one, the byte of round R.
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
            // N records of LEN bytes from offset FROM (appends to a file
            // that ends there), the byte TAG: `wrote 0`, or the errno.
            ["writefrom", ..] => {
                let f = file.as_ref().expect("open first");
                let (from, n, len, tag) = (num(1), num(2), num(3) as usize, num(4) as u8);
                let mut errno = 0;
                for i in 0..n {
                    if let Err(e) = client.pwrite(f, from + i * len as u64, &vec![tag; len]) {
                        errno = e.errno();
                        break;
                    }
                }
                format!("wrote {errno}")
            }
            ["waited"] => format!("waited {}", client.refills_waited_for()),
            // Wait for a refill ahead of need on its way to land.
            ["settle"] => {
                let t = Instant::now();
                while client.refilling() && t.elapsed() < Duration::from_secs(10) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                format!("settle {}", client.refilling())
            }
            // Fill the file until no space: the bytes acknowledged, errno.
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

/// `sum LEN SUM` of the whole file, read by the client.
fn sum_of(client: &Client, name: &str) -> String {
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
        Ok(b) => format!("sum {} {}", b.len(), sum(&b)),
        Err(e) => format!("sum errno {}", e.errno()),
    }
}

fn sum(b: &[u8]) -> u64 {
    // Position-weighted: a block read from the wrong place changes it.
    b.iter()
        .enumerate()
        .map(|(i, &x)| x as u64 * (i as u64 % 7919 + 1))
        .sum()
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
            .args(["--exact", "hybrid_child", "--nocapture", "--test-threads=1"])
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

/// fsck of the hybrid pool once its mount is gone: nothing to repair on
/// either side (a device block a dead client kept would be a leak).
fn fsck_clean(h: &HybridPool) {
    let pm = inkfs::pmem::MappedPool::open(&h.pool.path, &Default::default()).unwrap();
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

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed ^ (i >> 12) as u8)
        .collect()
}

/// The client and the mount see each other's device-side data at once,
/// in strict mode (copy on write: fresh device blocks) and sync mode (in
/// place: the very blocks the mount has in its DRAM cache). The mount read
/// the file first, so its cache holds the old contents of every block the
/// client then overwrites: the lease's return must drop them (it failed
/// that way before `Fs::lease_refs` did). A large write of the client
/// lands on the device (its free space shrinks), a small one on PM.
#[test]
fn clients_and_the_mount_see_each_others_device_data_at_once() {
    require_root();
    for mode in ["strict", "sync"] {
        let h = HybridPool::new(&format!("hyc-see-{mode}"), 64, 64, THRESHOLD);
        let m = Mounted::new(&h.pool, &format!("mode={mode}"));
        let f = m.p("f");
        let mut model = pattern(1, (1 << 20) + 4321);
        std::fs::write(&f, &model).unwrap();
        // Read through the mount: its cache holds every block now.
        assert!(std::fs::read(&f).unwrap() == model);
        let mut c = ClientProc::start(m.path());
        assert_eq!(c.ask("open f"), "open ok");
        assert_eq!(
            c.ask("sum f"),
            format!("sum {} {}", model.len(), sum(&model))
        );
        // The client overwrites a device-side range (above the threshold).
        assert_eq!(c.ask("pwrite 300001 200000 171"), "pwrite 300001 200000");
        model[300_001..500_001].fill(171);
        assert!(
            std::fs::read(&f).unwrap() == model,
            "{mode}: the mount after a client's large overwrite"
        );
        // The mount overwrites (the lease is recalled first); the client
        // reads it at its next call.
        let w = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
        w.write_all_at(&[205; 150_000], 450_000).unwrap();
        drop(w);
        model[450_000..600_000].fill(205);
        assert_eq!(
            c.ask("sum f"),
            format!("sum {} {}", model.len(), sum(&model)),
            "{mode}"
        );
        // A small write (PM) and a large one past the end (the device).
        assert_eq!(c.ask("pwrite 7 100 9"), "pwrite 7 100");
        model[7..107].fill(9);
        let end = model.len() as u64;
        assert_eq!(
            c.ask(&format!("pwrite {end} 524288 77")),
            format!("pwrite {end} 524288")
        );
        model.extend(std::iter::repeat_n(77u8, 524_288));
        assert!(
            std::fs::read(&f).unwrap() == model,
            "{mode}: the mount after a client's append"
        );
        assert_eq!(std::fs::metadata(&f).unwrap().len(), model.len() as u64);
        c.quit();
        // And from the device after a remount (no cache at all).
        let dir = m.unmount();
        let m = Mounted::at(&h.pool, dir, &format!("mode={mode}"));
        assert!(
            std::fs::read(m.p("f")).unwrap() == model,
            "{mode}: after a remount"
        );
        drop(m);
        fsck_clean(&h);
        // Where the client put its writes: the large append's pages on
        // the data device; the small write's page on PM in strict mode
        // (copied on write, placed by size), where it was (the device) in
        // sync mode (in place).
        let extents = extents_of(&h, "f");
        let side = |off: u64| {
            extents
                .iter()
                .find(|e| e.logical <= off && off < e.logical + e.length)
                .map(|e| e.flags.device)
        };
        assert_eq!(side(7), Some(mode == "sync"), "{mode}: {extents:?}");
        for off in (end.next_multiple_of(4096)..model.len() as u64).step_by(4096) {
            assert_eq!(side(off), Some(true), "{mode} offset {off}: {extents:?}");
        }
    }
}

fn hits(c: &mut ClientProc) -> u64 {
    let a = c.ask("hits");
    a.split_whitespace()
        .nth(1)
        .and_then(|x| x.parse().ok())
        .unwrap_or_else(|| panic!("{a}"))
}

/// A client's cache of device blocks (and its readahead) never serves
/// what another process wrote since: in sync mode the mount's and another
/// client's overwrites in place of blocks the reader has cached show at
/// its next read, in strict mode their copies on write; and blocks a
/// truncate freed and another file reused read as that file's. Each check
/// follows a read that hit the reader's cache, so a cache that kept stale
/// copies would fail it. (Posix mounts attach no client.)
#[test]
fn a_clients_cached_device_blocks_never_hide_anothers_overwrite() {
    require_root();
    for mode in ["sync", "strict"] {
        let h = HybridPool::new(&format!("hyc-cache-{mode}"), 64, 64, THRESHOLD);
        let m = Mounted::new(&h.pool, &format!("mode={mode}"));
        let f = m.p("f");
        let mut model = pattern(3, 2 << 20);
        std::fs::write(&f, &model).unwrap();
        let mut r = ClientProc::start(m.path());
        let want = |model: &[u8]| format!("sum {} {}", model.len(), sum(model));
        assert_eq!(r.ask("sum f"), want(&model));
        let before = hits(&mut r);
        assert_eq!(r.ask("sum f"), want(&model));
        assert!(
            hits(&mut r) >= before + 256,
            "{mode}: the second read hit the reader's cache"
        );
        // The mount overwrites in place (device-side blocks, 4 KiB-aligned
        // and not).
        let w = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
        w.write_all_at(&[41; 100_000], 777_777).unwrap();
        w.write_all_at(&[42; 4096], 0).unwrap();
        drop(w);
        model[777_777..877_777].fill(41);
        model[..4096].fill(42);
        assert_eq!(
            r.ask("sum f"),
            want(&model),
            "{mode}: after the mount's overwrite"
        );
        assert_eq!(r.ask("sum f"), want(&model), "{mode}: cached again");
        // Another client overwrites in place under its lease.
        let mut w = ClientProc::start(m.path());
        assert_eq!(w.ask("open f"), "open ok");
        assert_eq!(w.ask("pwrite 1048576 131072 43"), "pwrite 1048576 131072");
        model[1 << 20..(1 << 20) + 131_072].fill(43);
        assert_eq!(
            r.ask("sum f"),
            want(&model),
            "{mode}: after another client's overwrite"
        );
        w.quit();
        // Truncated (its device blocks freed), and another file written
        // large: the reader, who had f's blocks cached, reads g whole.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&f)
            .unwrap()
            .set_len(0)
            .unwrap();
        let g = pattern(9, 2 << 20);
        std::fs::write(m.p("g"), &g).unwrap();
        assert_eq!(
            r.ask("sum g"),
            want(&g),
            "{mode}: g, in blocks f may have had"
        );
        assert_eq!(r.ask("sum f"), "sum 0 0");
        r.quit();
        drop(m);
        fsck_clean(&h);
    }
}

/// Free blocks of the mount's file system (statvfs: both sides).
fn free_blocks(mnt: &Path) -> u64 {
    let c = std::ffi::CString::new(mnt.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: all-zero is a valid statvfs; the kernel fills it.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a statvfs to fill.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    st.f_bfree
}

/// A client appending large records to a hybrid pool finds its device
/// reservation refilled ahead of need by the reserve thread, as PM's is
/// (lease.rs's test of it): only its first device write waits for the
/// server. Killed (SIGKILL) just after a write that woke the thread, the
/// device blocks it held and any the refill was bringing go back: once
/// the file is gone the free space is what it was before it attached,
/// and fsck finds no leak on either side.
#[test]
fn device_appends_find_the_reservation_refilled_ahead_and_a_death_returns_it() {
    require_root();
    let h = HybridPool::new("hyc-ahead", 64, 96, THRESHOLD);
    let m = Mounted::new(&h.pool, "mode=sync");
    std::fs::write(m.p("f"), b"").unwrap();
    let before = free_blocks(m.path());
    let mut c = ClientProc::start(m.path());
    assert_eq!(c.ask("open f"), "open ok");
    const REC: u64 = 128 << 10;
    let mut at = 0u64;
    let mut write = |c: &mut ClientProc, n: u64| {
        assert_eq!(c.ask(&format!("writefrom {at} {n} {REC} 5")), "wrote 0");
        at += n * REC;
    };
    write(&mut c, 2);
    let first: usize = c
        .ask("waited")
        .trim_start_matches("waited ")
        .parse()
        .unwrap();
    assert!(
        first <= 2,
        "waited {first} times for the first reservations"
    );
    // 3 device reservations' worth (1024 blocks each) in steps of a
    // quarter of one (8 records of 32 blocks), each after the refill
    // asked for in the step before landed: no write runs dry unless the
    // device side is not refilled ahead.
    for step in 0..12 {
        assert_eq!(c.ask("settle"), "settle false", "step {step}");
        write(&mut c, 8);
    }
    assert_eq!(
        c.ask("waited"),
        format!("waited {first}"),
        "a device write ran dry"
    );
    // One more step, and killed at once: a refill may be on its way.
    write(&mut c, 8);
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(c.child.id() as i32, libc::SIGKILL) };
    drop(c);
    eventually("the client reaped", || {
        stat_u64(m.path(), "clients_attached") == 0
    });
    assert!(std::fs::metadata(m.p("f")).unwrap().len() >= at - REC);
    std::fs::remove_file(m.p("f")).unwrap();
    eventually("the reservations and the file's blocks back", || {
        free_blocks(m.path()) + 8 >= before
    });
    drop(m);
    fsck_clean(&h);
}

/// The extents of file `name` (in the root), read from the unmounted pool.
fn extents_of(h: &HybridPool, name: &str) -> Vec<inkfs::api::FiemapExtent> {
    let fs = inkfs::api::Filesystem::open_pool(&h.pool.path, Default::default()).expect("mount");
    let a = fs.lookup(&me(), ROOT_INO, name.as_bytes()).expect("lookup");
    let file = fs
        .open(&me(), a.ino, OpenFlags::new(libc::O_RDONLY))
        .expect("open");
    let extents = fs.fiemap(&file, 0, u64::MAX).expect("fiemap");
    fs.release(file);
    fs.unmount().expect("unmount");
    extents
}

/// A full data device: a client's large writes spill to PM (as the
/// mount's do), then fail with ENOSPC once both sides are full, losing
/// nothing acknowledged.
#[test]
fn a_client_spills_to_pm_when_the_device_is_full_then_gets_enospc() {
    require_root();
    let h = HybridPool::new("hyc-full", 24, 4, THRESHOLD);
    let m = Mounted::new(&h.pool, "mode=strict");
    std::fs::write(m.p("f"), b"").unwrap();
    let device_bytes = stat_u64(m.path(), "data_bytes_free");
    let mut c = ClientProc::start(m.path());
    assert_eq!(c.ask("open f"), "open ok");
    let a = c.ask("fill 7");
    let (acked, errno) = match a.split_whitespace().collect::<Vec<_>>()[..] {
        ["fill", at, e] => (at.parse::<u64>().unwrap(), e.parse::<i32>().unwrap()),
        _ => panic!("{a}"),
    };
    assert_eq!(errno, libc::ENOSPC, "{a}");
    assert!(
        acked > device_bytes,
        "{acked} bytes acknowledged, the device holds {device_bytes}: no spill to PM"
    );
    c.quit();
    let got = std::fs::read(m.p("f")).unwrap();
    assert_eq!(got.len() as u64, acked);
    assert!(got.iter().all(|&b| b == 7));
    drop(m);
    fsck_clean(&h);
}

/// Clients SIGKILLed while writing records large enough for the device
/// (so each write is: device blocks written, the device flushed, the log
/// committed), at random moments: whatever was acknowledged is there,
/// whole; a record in flight is the old one or the new one (strict) or a
/// mix of their bytes (sync, in place); the lease comes back (the mount
/// writes the file at once); and fsck finds no leaked block on either
/// side at the end. `INKFS_HYBRID_KILL_ROUNDS` rounds per mode (12).
#[test]
fn clients_killed_writing_device_records_lose_only_unacknowledged_ones() {
    require_root();
    let rounds = std::env::var("INKFS_HYBRID_KILL_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(12u64);
    for mode in ["strict", "sync"] {
        kill_rounds(mode, rounds);
    }
}

fn kill_rounds(mode: &str, rounds: u64) {
    let h = HybridPool::new(&format!("hyc-kill-{mode}"), 64, 64, THRESHOLD);
    let m = Mounted::new(&h.pool, &format!("mode={mode}"));
    let f = m.p("f");
    let (n, len) = (16u64, 96usize << 10);
    std::fs::write(&f, b"").unwrap();
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    // The round of each record's last acknowledged write (0: never).
    let mut acked = vec![0u8; n as usize];
    let mut mid_loop = 0u64;
    for round in 1..=rounds {
        let tag = (round % 250 + 1) as u8;
        let mut c = ClientProc::start(m.path());
        assert_eq!(c.ask("open f"), "open ok");
        c.tell(&format!("writeloop {n} {len} {tag}"));
        let stop_after = next() % (n + 2);
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
        // Between two writes, or inside one (a device write and its flush
        // take a fraction of a millisecond).
        std::thread::sleep(Duration::from_micros(next() % 2000));
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(c.child.id() as i32, libc::SIGKILL) };
        drop(c);
        let data = std::fs::read(&f).unwrap();
        let num = |i: usize| (i as u32).to_le_bytes();
        for (i, want) in acked.iter_mut().enumerate() {
            let at = i * len;
            if *want == 0 && data.len() <= at {
                continue;
            }
            assert!(
                data.len() >= at + len,
                "{mode} round {round}: record {i} cut"
            );
            let r = &data[at..at + len];
            let in_flight = pending.is_none_or(|p| i >= p);
            let whole = |t: u8| r[0] == t && r[1..5] == num(i) && r[5..].iter().all(|&b| b == t);
            let old_ok = (*want == 0 && r.iter().all(|&b| b == 0)) || (*want != 0 && whole(*want));
            let mixed = || {
                r.iter().enumerate().all(|(k, &b)| {
                    let new = if (1..5).contains(&k) {
                        num(i)[k - 1]
                    } else {
                        tag
                    };
                    let old = match (*want, k) {
                        (0, _) => 0,
                        (_, 1..=4) => num(i)[k - 1],
                        (w, _) => w,
                    };
                    b == new || b == old
                })
            };
            let torn = mode == "sync" && in_flight && mixed();
            assert!(
                old_ok || (in_flight && whole(tag)) || torn,
                "{mode} round {round} record {i}: acknowledged {want}, found {:?}",
                &r[..8]
            );
            if !old_ok {
                // Made whole through the mount, so that the next round
                // starts from a known record.
                let w = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
                w.write_all_at(&record(tag, i as u32, len), at as u64)
                    .unwrap();
                *want = tag;
            }
        }
        if pending.is_some_and(|p| p < n as usize) {
            mid_loop += 1;
        }
        // The dead client's lease came back: the mount writes at once.
        let w = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
        w.write_all_at(&[round as u8], n * len as u64).unwrap();
    }
    eprintln!("{mode}: {rounds} rounds, {mid_loop} killed mid-loop");
    assert!(mid_loop > 0, "{mode}: no kill landed mid-loop");
    eventually("no client attached", || {
        stat_u64(m.path(), "clients_attached") == 0
    });
    drop(m);
    fsck_clean(&h);
}

// ---------------------------------------------------------------------
// The preload library on a hybrid mount
// ---------------------------------------------------------------------

/// The library cargo built for this test run (a dev-dependency of this
/// crate): in the deps directory, else next to the binaries.
fn lib() -> PathBuf {
    let dir = Path::new(BIN).parent().expect("target directory");
    [dir.join("deps"), dir.to_path_buf()]
        .into_iter()
        .map(|d| d.join("libinkfs_preload.so"))
        .find(|p| p.is_file())
        .expect("libinkfs_preload.so is built with the tests (dev-dependency)")
}

/// `cmd` under the library, counting into a fresh stats file: its output
/// and the counters summed over its processes.
fn preloaded(cmd: &mut Command) -> (String, std::collections::BTreeMap<String, u64>) {
    let stats = tempfile::NamedTempFile::new().expect("stats file");
    let out = run(cmd
        .env("LD_PRELOAD", lib())
        .env("INKFS_PRELOAD_STATS", stats.path()));
    let mut counts = std::collections::BTreeMap::new();
    let text = std::fs::read_to_string(stats.path()).unwrap_or_default();
    for word in text.split_whitespace() {
        if let Some((k, v)) = word.split_once('=') {
            if k != "pid" {
                *counts.entry(k.to_string()).or_insert(0) += v.parse::<u64>().unwrap_or(0);
            }
        }
    }
    (String::from_utf8_lossy(&out.stdout).into_owned(), counts)
}

fn count(c: &std::collections::BTreeMap<String, u64>, key: &str) -> u64 {
    c.get(key).copied().unwrap_or(0)
}

/// Copy `src` to `dst` in 128 KiB writes, fsync, and print the sha256 of
/// `check` read back in 100,000-byte reads (unaligned, crossing blocks).
const PY_COPY: &str = r#"
import hashlib, os, sys
src, dst, check = sys.argv[1:4]
data = open(src, "rb").read()
fd = os.open(dst, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
n = 0
while n < len(data):
    n += os.write(fd, data[n:n + 131072])
os.fsync(fd)
os.close(fd)
h = hashlib.sha256()
with open(check, "rb", buffering=0) as f:
    while True:
        b = f.read(100000)
        if not b:
            break
        h.update(b)
print(h.hexdigest())
"#;

fn sha256(path: &Path) -> String {
    let out = run(Command::new("sha256sum").arg(path));
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or("")
        .to_string()
}

/// A large file written through the mount reads the same through the
/// library, served from the data device (no read through the kernel);
/// a large file the library writes (served, to the device) reads the same
/// through the mount at once; in strict and sync modes.
#[test]
fn the_library_and_the_mount_read_and_write_the_same_device_data() {
    require_root();
    for mode in ["strict", "sync"] {
        let h = HybridPool::new(&format!("hyc-pre-{mode}"), 64, 64, THRESHOLD);
        let m = Mounted::new(&h.pool, &format!("mode={mode}"));
        let src = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(src.path(), pattern(3, (5 << 20) + 1234)).unwrap();
        std::fs::copy(src.path(), m.p("through-mount")).unwrap();
        let want = sha256(src.path());
        // The library writes `lib` and reads the mount's file back.
        let (out, n) = preloaded(
            Command::new(PYTHON)
                .arg("-c")
                .arg(PY_COPY)
                .arg(src.path())
                .arg(m.p("lib"))
                .arg(m.p("through-mount")),
        );
        assert_eq!(
            out.trim(),
            want,
            "{mode}: the library read the mount's file"
        );
        assert!(count(&n, "read_local") >= 50, "{mode}: {n:?}");
        assert_eq!(count(&n, "read_kernel"), 0, "{mode}: {n:?}");
        assert!(count(&n, "write_local") >= 40, "{mode}: {n:?}");
        assert_eq!(count(&n, "write_kernel"), 0, "{mode}: {n:?}");
        assert_eq!(count(&n, "attach_refused"), 0, "{mode}: {n:?}");
        // The mount reads what the library wrote, at once.
        assert_eq!(
            sha256(&m.p("lib")),
            want,
            "{mode}: the mount read the library's file"
        );
        // And the library reads it too (another process: no state kept).
        let (out, n) = preloaded(Command::new("sha256sum").arg(m.p("lib")));
        assert!(out.starts_with(&want), "{mode}: {out}");
        assert!(count(&n, "read_local") > 0, "{mode}: {n:?}");
        drop(m);
        fsck_clean(&h);
    }
}

const PY_KILLED: &str = r#"
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
i = 0
while True:
    rec = b"%08d" % i + bytes([i % 251 + 1]) * (131072 - 9) + b"\n"
    os.write(fd, rec)
    os.write(1, b"%d\n" % i)
    i += 1
"#;

/// A preloaded program appending 128 KiB records (each on the device),
/// SIGKILLed mid-loop: every acknowledged record is there, whole and in
/// order, at most one more; fsck clean (the dead client's device blocks
/// came back).
#[test]
fn a_preloaded_device_writer_killed_mid_loop_leaves_its_acknowledged_records() {
    require_root();
    for mode in ["strict", "sync"] {
        let h = HybridPool::new(&format!("hyc-prekill-{mode}"), 64, 128, THRESHOLD);
        let m = Mounted::new(&h.pool, &format!("mode={mode}"));
        let f = m.p("k");
        let server_wrote = stat_u64(m.path(), "data_bytes_written");
        let mut child = Command::new(PYTHON)
            .arg("-c")
            .arg(PY_KILLED)
            .arg(&f)
            .env("LD_PRELOAD", lib())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn");
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        let mut acked = 0u64;
        let mut line = String::new();
        while acked < 150 {
            line.clear();
            assert!(out.read_line(&mut line).expect("ack") > 0, "writer ended");
            acked = line.trim().parse().expect("number");
        }
        child.kill().expect("SIGKILL");
        child.wait().expect("wait");
        // The writes were the library's (the server wrote no record of
        // them to the device: none fell back to the mount).
        let server_wrote = stat_u64(m.path(), "data_bytes_written") - server_wrote;
        assert!(
            server_wrote < 1 << 20,
            "{mode}: the server wrote {server_wrote} bytes"
        );
        let data = std::fs::read(&f).expect("read through the mount");
        let rec = 131_072usize;
        assert_eq!(data.len() % rec, 0, "{mode}: a torn last record");
        let n = (data.len() / rec) as u64;
        for (i, r) in data.chunks(rec).enumerate() {
            let fill = (i % 251 + 1) as u8;
            assert!(
                r[..8] == *format!("{i:08}").as_bytes()
                    && r[8..rec - 1].iter().all(|&b| b == fill)
                    && r[rec - 1] == b'\n',
                "{mode}: record {i}"
            );
        }
        let rest: Vec<u64> = out
            .lines()
            .map(|l| l.expect("line").trim().parse().expect("number"))
            .collect();
        let last = rest.last().copied().unwrap_or(acked);
        assert!(
            last < n && n <= last + 2,
            "{mode}: {n} records, last acknowledged {last}"
        );
        drop(m);
        fsck_clean(&h);
    }
}
