//! The preload library asks for directory leases (docs/KERNEL-FREE.md,
//! "Built: the library asks for directory leases"): the adaptive rule
//! seen from the server's counters (`inkfs stat --json`) while preloaded
//! programs create files with `INKFS_PRELOAD_DIR_LEASE=1`, and nothing
//! asked without it (the default) or with `=0`.

mod common;

use std::path::Path;
use std::process::Command;

use common::preload::*;
use common::*;

/// Creates `argv[2]` files in directory `argv[1]`, each written; with
/// `argv[3]` = `stat`, each new name is then looked up through the mount
/// by a process without the library (`env -u LD_PRELOAD stat`), which
/// recalls the directory's lease if the program holds it.
const PY_CREATE: &str = "import os, subprocess, sys
d, n, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
env = {k: v for k, v in os.environ.items() if k != 'LD_PRELOAD'}
for i in range(n):
    p = f'{d}/f{i}'
    fd = os.open(p, os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, b'%d\\n' % i)
    os.close(fd)
    if mode == 'stat':
        subprocess.run(['stat', '-c', '%s', p], env=env, check=True, stdout=subprocess.DEVNULL)
print(len(os.listdir(d)))
";

/// The library's switch (crates/inkfs-preload/src/names.rs).
const DIR_LEASE_ENV: &str = "INKFS_PRELOAD_DIR_LEASE";

/// The server's counters: creates made through the ring, directory
/// leases granted and recalled.
fn counters(mnt: &Path) -> (u64, u64, u64) {
    let r = stats_json(mnt).expect("statistics of the mount");
    let n = |k: &str| r[k].as_u64().unwrap_or_else(|| panic!("no {k} in {r}"));
    (
        r["ops"]["client_create"]["count"].as_u64().unwrap_or(0),
        n("dir_leases_granted"),
        n("dir_leases_recalled"),
    )
}

/// `PY_CREATE` on `dir` under the library (`env` added; the ask on
/// unless `env` sets it): its output.
fn create_files(dir: &Path, n: u32, mode: &str, env: &[(&str, &str)]) -> String {
    let stats = stats_file("dir-lease");
    let mut c = Command::new(PYTHON);
    c.arg("-c")
        .arg(PY_CREATE)
        .arg(dir)
        .arg(n.to_string())
        .arg(mode)
        .env("LD_PRELOAD", lib())
        .env("INKFS_PRELOAD_STATS", stats.path())
        .env(DIR_LEASE_ENV, "1");
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().expect("python");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let n_served = c_of(stats.path(), "ns_local");
    assert!(n_served >= u64::from(n), "creates not served: {n_served}");
    String::from_utf8(o.stdout).expect("utf-8")
}

fn c_of(stats: &Path, key: &str) -> u64 {
    c(&counts(stats), key)
}

/// A program creating many files in one directory asks for its lease
/// with its fifth request through the ring (after k = 4) and makes the
/// rest itself; the mount then sees every file with its bytes. With
/// `INKFS_PRELOAD_DIR_LEASE=0`, or without it, it asks nothing and every
/// create is a ring request.
#[test]
fn many_creates_in_one_directory_take_its_lease_after_k_requests() {
    let pool = Pool::new("libask-many", 128);
    let m = Mounted::new(&pool, "mode=strict");
    for d in ["on", "off"] {
        std::fs::create_dir(m.p(d)).expect("mkdir");
    }
    let before = counters(m.path());
    assert_eq!(create_files(&m.p("on"), 200, "-", &[]), "200\n");
    let on = counters(m.path());
    assert_eq!(
        on.0 - before.0,
        5,
        "creates through the ring: k, then the ask"
    );
    assert_eq!(on.1 - before.1, 1, "one lease granted");
    // The mount sees every name and its bytes (the lookups recall the
    // lease, if the program's end did not give it back already).
    for i in [0, 4, 5, 199] {
        let got = std::fs::read_to_string(m.p(&format!("on/f{i}"))).expect("read");
        assert_eq!(got, format!("{i}\n"));
    }
    assert_eq!(std::fs::read_dir(m.p("on")).expect("ls").count(), 200);

    assert_eq!(
        create_files(&m.p("off"), 50, "-", &[(DIR_LEASE_ENV, "0")]),
        "50\n"
    );
    let off = counters(m.path());
    assert_eq!(off.0 - on.0, 50, "every create through the ring");
    assert_eq!(off.1 - on.1, 0, "a lease asked for");
    // Unset: off too (the default).
    std::fs::create_dir(m.p("unset")).expect("mkdir");
    let stats = stats_file("dir-lease-unset");
    let mut c = Command::new(PYTHON);
    c.arg("-c")
        .arg(PY_CREATE)
        .arg(m.p("unset"))
        .arg("50")
        .arg("-")
        .env("LD_PRELOAD", lib())
        .env("INKFS_PRELOAD_STATS", stats.path())
        .env_remove(DIR_LEASE_ENV);
    assert!(c.status().expect("python").success());
    let unset = counters(m.path());
    assert_eq!(unset.0 - off.0, 50, "every create through the ring");
    assert_eq!(unset.1 - off.1, 0, "a lease asked for by default");
    drop(m);
    fsck_clean(&pool);
}

/// A directory the mount keeps touching backs off: each new name is
/// looked up through the mount at once, which recalls the lease; k
/// doubles after each recall (4, 8, 16, 32), so 64 creates ask four
/// times (at the 5th, 14th, 31st and 64th ring request) instead of
/// twelve with a fixed k, and every create goes through the ring.
#[test]
fn a_directory_the_mount_keeps_touching_backs_off() {
    require_tool("stat", "coreutils");
    let pool = Pool::new("libask-backoff", 128);
    let m = Mounted::new(&pool, "mode=strict");
    std::fs::create_dir(m.p("d")).expect("mkdir");
    let before = counters(m.path());
    assert_eq!(create_files(&m.p("d"), 64, "stat", &[]), "64\n");
    let after = counters(m.path());
    assert_eq!(after.0 - before.0, 64, "a create made under a lease");
    assert_eq!(after.1 - before.1, 4, "leases granted: k did not double");
    assert_eq!(after.2 - before.2, 4, "leases recalled");
    drop(m);
    fsck_clean(&pool);
}

/// Files made and written under a's lease, then removed (through the
/// ring: the server recalls a, adopts the kept files, settles each
/// file's lease and frees it) while b's lease keeps the lane leased; the
/// program exits holding it (`_exit`: no exit hook gives it back) and
/// the server reaps the lane. The server
/// freed the removed files' head chunks, and with them the chunk blocks
/// the program carved from its reservation: the reaping must not free
/// them again with the reservation's rest. Fails without the settle's
/// release of the head chunk's block from the client's books (the
/// server's `frees_refused` counts the double frees).
#[test]
fn files_made_under_a_lease_and_removed_by_the_server_are_freed_once() {
    const PY: &str = "import os, sys
r = sys.argv[1]
for d in ('a', 'b'):
    for i in range(20):
        fd = os.open(f'{r}/{d}/f{i}', os.O_CREAT | os.O_WRONLY, 0o644)
        os.write(fd, b'x' * 20000)
        os.close(fd)
for i in range(20):
    os.unlink(f'{r}/a/f{i}')
os._exit(0)
";
    let pool = Pool::new("libask-rm", 128);
    let m = Mounted::new(&pool, "mode=strict");
    for d in ["a", "b"] {
        std::fs::create_dir(m.p(d)).expect("mkdir");
    }
    let stats = stats_file("dir-lease-rm");
    let o = Command::new(PYTHON)
        .arg("-c")
        .arg(PY)
        .arg(m.path())
        .env("LD_PRELOAD", lib())
        .env("INKFS_PRELOAD_STATS", stats.path())
        .env(DIR_LEASE_ENV, "1")
        .output()
        .expect("python");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r = |k: &str| stats_json(m.path()).expect("statistics")[k].as_u64();
    let t = std::time::Instant::now();
    while r("clients_attached") != Some(0) {
        assert!(
            t.elapsed() < inkfs::testkit::WAIT_LIMIT,
            "the client never ended"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(r("dir_leases_granted"), Some(2));
    assert_eq!(r("lanes_reaped"), Some(1), "the lane was not reaped");
    assert_eq!(r("frees_refused"), Some(0), "blocks freed twice");
    assert_eq!(std::fs::read_dir(m.p("a")).expect("ls").count(), 0);
    assert_eq!(std::fs::read(m.p("b/f19")).expect("read").len(), 20000);
    drop(m);
    fsck_clean(&pool);
}

/// A program that exits holding a directory's lease and its lane gives
/// them back in its exit hook (crates/inkfs-preload/src/mounts.rs
/// `at_exit`): the server settles them, reaps nothing, and the next
/// process finds the directory settled. One that ends without exit
/// handlers (`_exit`) leaves them to the reaping at its session's end,
/// which is clean too: the files' bytes, no block freed twice, fsck.
#[test]
fn a_program_exiting_with_a_lease_gives_it_back() {
    const PY: &str = "import os, sys
d, how = sys.argv[1], sys.argv[2]
for i in range(20):
    fd = os.open(f'{d}/f{i}', os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, b'%d' % i)
    os.close(fd)
if how == '_exit':
    os._exit(0)
";
    let pool = Pool::new("libask-exit", 128);
    let m = Mounted::new(&pool, "mode=strict");
    let r = |k: &str| {
        let s = stats_json(m.path()).expect("statistics");
        s[k].as_u64().unwrap_or_else(|| panic!("no {k} in {s}"))
    };
    let mut reaped = r("lanes_reaped");
    for (d, how, reaps) in [("exit", "exit", 0), ("kill", "_exit", 1)] {
        std::fs::create_dir(m.p(d)).expect("mkdir");
        let granted = r("dir_leases_granted");
        let o = Command::new(PYTHON)
            .arg("-c")
            .arg(PY)
            .arg(m.p(d))
            .arg(how)
            .env("LD_PRELOAD", lib())
            .env(DIR_LEASE_ENV, "1")
            .output()
            .expect("python");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let t = std::time::Instant::now();
        while r("clients_attached") != 0 {
            assert!(
                t.elapsed() < inkfs::testkit::WAIT_LIMIT,
                "the client never ended"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(r("dir_leases_granted") - granted, 1, "{d}: no lease taken");
        assert_eq!(r("lanes_reaped") - reaped, reaps, "{d}: lanes reaped");
        reaped = r("lanes_reaped");
        assert_eq!(r("dir_leases_held"), 0, "{d}");
        assert_eq!(r("frees_refused"), 0, "{d}: blocks freed twice");
        for i in 0..20 {
            let got = std::fs::read_to_string(m.p(&format!("{d}/f{i}"))).expect("read");
            assert_eq!(got, i.to_string(), "{d}/f{i}");
        }
        assert_eq!(std::fs::read_dir(m.p(d)).expect("ls").count(), 20);
    }
    drop(m);
    fsck_clean(&pool);
}

/// Threads of one process creating in one directory at once: many of
/// their first creates ask for its lease together. One ask at a time
/// goes (`DirLeases::ask`); the server held every other ask by the
/// lease's holder until the holder gave it back, which it never did: the
/// program hung (filebench webproxy, 100 threads). Forty rounds of 32
/// python threads creating 10 files each in a fresh directory: without
/// the fix, three runs of three hung.
#[test]
fn threads_creating_in_one_directory_ask_once() {
    // A thread's uncaught exception ends only that thread: the hook makes
    // it fail the program, so an error (EIO from a create) is reported as
    // itself, not as a short listing.
    const PY: &str = "import os, sys, threading
d = sys.argv[1]
go = threading.Barrier(32)
def died(a):
    sys.stderr.write(f'{a.thread.name}: {a.exc_value!r}\\n')
    os._exit(3)
threading.excepthook = died
def work(t):
    go.wait()
    for i in range(10):
        fd = os.open(f'{d}/t{t}-{i}', os.O_CREAT | os.O_WRONLY, 0o644)
        os.write(fd, b'x')
        os.close(fd)
ts = [threading.Thread(target=work, args=(t,)) for t in range(32)]
for t in ts: t.start()
for t in ts: t.join()
print(len(os.listdir(d)))
";
    let pool = Pool::new("libask-threads", 256);
    let m = Mounted::new(&pool, "mode=strict");
    for round in 0..40 {
        let d = m.p(&format!("r{round}"));
        std::fs::create_dir(&d).expect("mkdir");
        let mut child = Command::new(PYTHON)
            .arg("-c")
            .arg(PY)
            .arg(&d)
            .env("LD_PRELOAD", lib())
            .env(DIR_LEASE_ENV, "1")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("python");
        let t = std::time::Instant::now();
        while child.try_wait().expect("wait").is_none() {
            if t.elapsed() > inkfs::testkit::WAIT_LIMIT {
                let _ = child.kill();
                let _ = child.wait();
                panic!("round {round}: the program hung");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let o = child.wait_with_output().expect("output");
        assert!(
            o.status.success(),
            "round {round}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&o.stdout), "320\n", "round {round}");
    }
    drop(m);
    fsck_clean(&pool);
}
