//! Programs under the preload library on a `kernel_open` mount (posix
//! mode with the writeback cache, files opened by the kernel:
//! crates/inkfs-fuse/src/open.rs). The server refuses to attach them in
//! posix mode (their reads would miss the dirty pages of the kernel's
//! cache), so every call they make goes through the kernel, as every call
//! of a process without the library does: they see each other's writes
//! and sizes at once, in both directions, while both hold the file open,
//! and a file unlinked while open stays readable while a preloaded
//! program creates a new file under its name. Root required (FUSE).

mod common;

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::FileExt;

use common::preload::*;
use common::*;

const OPTS: &str = "mode=posix,kernel_open";

fn mount(pool: &Pool) -> Mounted {
    let m = Mounted::new(pool, OPTS);
    let s = stats_json(m.path()).expect("statistics of the mount");
    assert_eq!(s["kernel_open"], true, "kernel_open is on: {s}");
    m
}

/// A preloaded writer and reader of one file, stepped by the test: each
/// line on its stdin is a command, each answer one line on its stdout.
/// `w OFFSET BYTE COUNT` writes, `r OFFSET COUNT` prints the bytes read
/// (as a string) and `s` the size fstat gives, all on one descriptor
/// kept open (never closed, never synced: the data stays in the page
/// cache unless the kernel writes it back on its own).
const PY_PEER: &str = r#"
import os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
print("ready", flush=True)
for line in sys.stdin:
    w = line.split()
    if w[0] == "w":
        os.pwrite(fd, w[2].encode() * int(w[3]), int(w[1])); print("ok", flush=True)
    elif w[0] == "r":
        print(os.pread(fd, int(w[2]), int(w[1])).decode(), flush=True)
    elif w[0] == "s":
        print(os.fstat(fd).st_size, flush=True)
"#;

struct Peer {
    child: std::process::Child,
    input: std::process::ChildStdin,
    output: BufReader<std::process::ChildStdout>,
}

impl Peer {
    fn start(path: &std::path::Path, stats: &std::path::Path) -> Peer {
        let mut child = std::process::Command::new(PYTHON)
            .arg("-c")
            .arg(PY_PEER)
            .arg(path)
            .env("LD_PRELOAD", lib())
            .env("INKFS_PRELOAD_STATS", stats)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python");
        let input = child.stdin.take().expect("stdin");
        let output = BufReader::new(child.stdout.take().expect("stdout"));
        let mut p = Peer {
            child,
            input,
            output,
        };
        assert_eq!(p.answer(), "ready", "the peer failed to start");
        p
    }

    fn answer(&mut self) -> String {
        let mut line = String::new();
        self.output.read_line(&mut line).expect("peer's answer");
        line.trim_end().to_string()
    }

    fn ask(&mut self, command: &str) -> String {
        writeln!(self.input, "{command}").expect("peer's stdin");
        self.answer()
    }

    fn finish(self) {
        let Peer {
            mut child, input, ..
        } = self;
        drop(input);
        let status = child.wait().expect("peer");
        assert!(status.success(), "the peer failed: {status}");
    }
}

/// A preloaded process and the test (through the kernel) both hold one
/// file open: each one's writes and the size they make are seen by the
/// other at once, with no close, sync or sleep between.
#[test]
fn a_preloaded_peer_and_the_kernel_see_each_others_writes() {
    let pool = Pool::new("koc-peer", 64);
    let m = mount(&pool);
    let p = m.p("shared");
    let stats = stats_file("koc-peer");
    let mut peer = Peer::start(&p, stats.path());
    let mut mine = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&p)
        .expect("open the peer's file");

    // The peer writes; the test reads it and its size.
    assert_eq!(peer.ask("w 0 a 5000"), "ok");
    assert_eq!(mine.metadata().unwrap().len(), 5000, "the peer's size");
    let mut got = String::new();
    mine.read_to_string(&mut got).unwrap();
    assert_eq!(got, "a".repeat(5000), "the peer's bytes");

    // The test writes past the end; the peer reads it and the new size.
    mine.write_all_at(&[b'b'; 3000], 7000).unwrap();
    assert_eq!(
        peer.ask("s"),
        "10000",
        "the kernel's size, seen by the peer"
    );
    assert_eq!(peer.ask("r 6999 4"), "\0bbb", "the kernel's bytes");
    assert_eq!(peer.ask("r 4998 3"), "aa\0");

    // And back, over each other's bytes.
    assert_eq!(peer.ask("w 6000 c 2000"), "ok");
    let mut buf = [0u8; 4];
    mine.read_exact_at(&mut buf, 7998).unwrap();
    assert_eq!(&buf, b"ccbb");
    assert_eq!(mine.metadata().unwrap().len(), 10_000);

    peer.finish();
    drop(mine);
    assert_eq!(fs::metadata(&p).unwrap().len(), 10_000);
    let n = counts(stats.path());
    assert_eq!(c(&n, "read_local"), 0, "posix mode: nothing served: {n:?}");
    assert_eq!(c(&n, "write_local"), 0, "{n:?}");
    assert!(c(&n, "attach_refused") > 0, "the refusal was met: {n:?}");
    m.unmount();
}

/// A file the test holds open is unlinked by a preloaded program that
/// then creates a new file under the name: the open descriptor reads the
/// old file, the name the new one, and the old inode is freed once the
/// descriptor is closed.
#[test]
fn an_unlinked_open_file_outlives_its_name_taken_by_a_preloaded_program() {
    let pool = Pool::new("koc-unlinked", 64);
    let m = mount(&pool);
    let p = m.p("name");
    fs::write(&p, vec![b'o'; 20_000]).unwrap();
    let old = fs::File::open(&p).unwrap();
    let stats = stats_file("koc-unlinked");
    let (ok, _, err) = sh_run(
        &format!("rm {0} && printf new > {0} && cat {0}", p.display()),
        Some(stats.path()),
    );
    assert!(ok, "the preloaded program failed: {err}");
    assert_eq!(fs::read(&p).unwrap(), b"new", "the new file at the name");
    let mut back = vec![0u8; 20_000];
    old.read_exact_at(&mut back, 0).unwrap();
    assert!(back.iter().all(|&b| b == b'o'), "the old file's bytes");
    assert_eq!(old.metadata().unwrap().len(), 20_000);
    let s = stats_json(m.path()).unwrap();
    assert_eq!(s["kernel_pins"], 1, "the old inode held while open: {s}");
    drop(old);
    // The kernel forgets an unlinked inode at its last close; the pin goes
    // with its FORGET, which the server receives asynchronously.
    let deadline = std::time::Instant::now() + inkfs::testkit::WAIT_LIMIT;
    while stats_json(m.path()).unwrap()["kernel_pins"] != 0 && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let s = stats_json(m.path()).unwrap();
    assert_eq!(s["kernel_pins"], 0, "freed after the last close: {s}");
    assert_eq!(s["held_orphans"], 0, "no orphan left: {s}");
    let n = counts(stats.path());
    assert!(c(&n, "attach_refused") > 0, "the refusal was met: {n:?}");
    let dir = m.unmount();
    drop(dir);
    fsck_clean(&pool);
}
