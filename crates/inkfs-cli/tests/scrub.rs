//! `inkfs scrub` end to end: exit codes 0/4/8/16 of the real binary against
//! a real mount (`inkfs mount`, FUSE: needs root and fuse3), and `inkfs
//! stat POOL` / `inkfs fsck` on the error record the scrub leaves.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use inkfs::format::*;
use inkfs::pmem::{read_pod, MappedPool, PoolFile, PoolOpenOptions};
use inkfs::types::MountOptions;
use inkfs::Fs;

fn inkfs(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_inkfs"))
        .args(args)
        .output()
        .expect("run inkfs")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn code(o: &Output) -> i32 {
    o.status.code().expect("exited normally")
}

/// A pool in /dev/shm with a few files and a mount point; unmounted and
/// removed on drop.
struct Setup {
    pool: PathBuf,
    mnt: tempfile::TempDir,
    pid: Option<u32>,
    /// Inode numbers of dir/f0 .. dir/f9.
    files: Vec<u64>,
}

impl Setup {
    fn new(tag: &str) -> Setup {
        // SAFETY: geteuid has no preconditions and cannot fail.
        assert_eq!(unsafe { libc::geteuid() }, 0, "needs root (FUSE)");
        let pool = PathBuf::from(format!(
            "/dev/shm/inkfs-scrub-test-{}-{tag}.pool",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&pool);
        let mut s = Setup {
            pool,
            mnt: tempfile::Builder::new()
                .prefix("inkfs-scrub-")
                .tempdir()
                .unwrap(),
            pid: None,
            files: Vec::new(),
        };
        let o = inkfs(&["mkfs", s.p(), "--size", "64M"]);
        assert!(o.status.success(), "{}", text(&o));
        let fs = Fs::mount(s.open(), MountOptions::default()).unwrap();
        let d = fs.mkdir(ROOT_INO, b"dir", 0o755, 0, 0).unwrap().ino;
        for i in 0..10u32 {
            let (a, fh) = fs
                .create(d, format!("f{i}").as_bytes(), 0o644, 0, 0)
                .unwrap();
            fs.write(&fh, 0, &vec![i as u8; 3000]).unwrap();
            fs.release(fh);
            s.files.push(a.ino);
        }
        fs.unmount().unwrap();
        s
    }
    fn p(&self) -> &str {
        self.pool.to_str().unwrap()
    }
    fn m(&self) -> &str {
        self.mnt.path().to_str().unwrap()
    }
    /// A read-only view of the pool that takes no claim: the pool may be
    /// mounted (the damage goes in under the server, as a media error would).
    fn peek(&self) -> MappedPool {
        let file = PoolFile::open_unlocked(&self.pool).unwrap();
        MappedPool::map(
            file,
            &PoolOpenOptions {
                create_size_bytes: None,
                read_only: true,
            },
        )
        .unwrap()
    }
    fn open(&self) -> MappedPool {
        MappedPool::open(
            &self.pool,
            &PoolOpenOptions {
                create_size_bytes: None,
                read_only: false,
            },
        )
        .unwrap()
    }
    fn mount(&mut self) {
        let o = inkfs(&["mount", self.p(), self.m()]);
        assert!(o.status.success(), "{}", text(&o));
        let o = inkfs(&["stat", self.m(), "--json"]);
        let t = String::from_utf8_lossy(&o.stdout).to_string();
        let at = t.find("\"pid\":").expect("pid in stat") + 6;
        let digits: String = t[at..].chars().take_while(|c| c.is_ascii_digit()).collect();
        self.pid = Some(digits.parse().unwrap());
    }
    fn unmount(&mut self) {
        let Some(pid) = self.pid.take() else { return };
        let _ = Command::new("umount").arg(self.mnt.path()).output();
        let t = Instant::now();
        while Path::new(&format!("/proc/{pid}")).exists() && t.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    /// Flip a byte in the first log entry of the inode `dir/f{i}` (a file
    /// the kernel never asked for, so the server never loaded it).
    fn damage(&self, i: usize) -> u64 {
        let ino = self.files[i];
        let pm = self.peek();
        let sb: Superblock = read_pod(&pm, 0);
        let (lane, slot) = ino_to_lane_slot(ino, sb.lane_count);
        let table = lane_first_block(lane) + LANE_INODE_TABLE_BLOCK;
        let rec: InodeRecord = read_pod(&pm, table * BLOCK_SIZE + slot * INODE_RECORD_SIZE);
        drop(pm);
        let off = inkfs::format::LogPageSpan::of(rec.log_head).base + 20;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&self.pool)
            .unwrap();
        let mut b = [0u8; 1];
        f.read_exact_at(&mut b, off).unwrap();
        f.write_all_at(&[b[0] ^ 0x5a], off).unwrap();
        ino
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        self.unmount();
        let _ = std::fs::remove_file(&self.pool);
    }
}

#[test]
fn scrub_exit_codes_and_the_record_it_leaves() {
    let mut s = Setup::new("codes");
    s.mount();

    // 0: clean, with a summary; --json is one object.
    let o = inkfs(&["scrub", s.m()]);
    assert_eq!(code(&o), 0, "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(out.contains("checked 12 inodes"), "{out}");
    assert!(out.contains(": clean ("), "{out}");
    // Not a terminal: plain progress lines, ending at 100%.
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(err.lines().last().unwrap_or("").contains("100%"), "{err}");
    let o = inkfs(&["scrub", s.m(), "--json", "-q"]);
    assert_eq!(code(&o), 0, "{}", text(&o));
    let j = String::from_utf8_lossy(&o.stdout).to_string();
    assert_eq!(j.lines().count(), 1, "{j}");
    for want in [
        "\"exit_code\":0",
        "\"clean\":true",
        "\"inodes\":12",
        "\"problems\":[]",
    ] {
        assert!(j.contains(want), "{want} in {j}");
    }
    assert!(o.stderr.is_empty(), "-q printed progress");

    // 4: damage in a file nobody opened, found on the live mount.
    let ino = s.damage(3);
    let o = inkfs(&["scrub", s.m()]);
    assert_eq!(code(&o), 4, "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        out.contains(&format!("error: inode {ino}: ")) && out.contains("checksum"),
        "{out}"
    );
    assert!(out.contains("read-only now"), "{out}");
    let o = inkfs(&["scrub", s.m(), "--json"]);
    assert_eq!(code(&o), 4, "{}", text(&o));
    let j = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        j.contains(&format!("\"reason\":\"log\",\"inode\":{ino}")),
        "{j}"
    );
    assert!(j.contains("\"read_only\":true"), "{j}");

    // 8: not a mount point; 16: usage.
    let plain = tempfile::tempdir().unwrap();
    let o = inkfs(&["scrub", plain.path().to_str().unwrap()]);
    assert_eq!(code(&o), 8, "{}", text(&o));
    assert!(text(&o).contains("not the mount point of an inkfs server"));
    assert_eq!(code(&inkfs(&["scrub"])), 16);
    assert_eq!(code(&inkfs(&["scrub", s.m(), "--bogus"])), 16);

    // The record the scrub left: stat shows it, fsck reports it.
    s.unmount();
    let o = inkfs(&["stat", s.p()]);
    assert!(o.status.success(), "{}", text(&o));
    let t = text(&o);
    assert!(
        t.contains("errors:") && t.contains(&format!("inode {ino}, log")),
        "{t}"
    );
    let o = inkfs(&["stat", s.p(), "--json"]);
    let t = text(&o);
    assert!(t.contains("\"errors_count\":2"), "{t}");
    assert!(
        t.contains(&format!("\"inode\":{ino},\"reason\":\"log\"")),
        "{t}"
    );
    let o = inkfs(&["fsck", s.p()]);
    assert_eq!(code(&o), 4, "{}", text(&o));
    assert!(
        text(&o).contains("records 2 errors met while mounted"),
        "{}",
        text(&o)
    );
    let o = inkfs(&["mount", s.p(), s.m()]);
    assert!(!o.status.success());
    assert!(text(&o).contains("inkfs fsck -y"), "{}", text(&o));
}
