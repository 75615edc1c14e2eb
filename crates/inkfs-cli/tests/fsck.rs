//! `inkfs fsck` end to end: exit codes 0/1/4/8 of the real binary on pools
//! in /dev/shm.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use inkfs::format::{Superblock, ROOT_INO};
use inkfs::pmem::{read_pod, MappedPool, PoolOpenOptions};
use inkfs::types::MountOptions;
use inkfs::Fs;

fn inkfs(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_inkfs"))
        .args(args)
        .output()
        .expect("run inkfs")
}

struct Pool(PathBuf);
impl Pool {
    fn new(tag: &str) -> Pool {
        let p = PathBuf::from(format!(
            "/dev/shm/inkfs-fsck-test-{}-{tag}.pool",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&p);
        Pool(p)
    }
    fn s(&self) -> &str {
        self.0.to_str().unwrap()
    }
    /// mkfs, then a few files through the engine.
    fn populated(tag: &str) -> Pool {
        let pool = Pool::new(tag);
        let o = inkfs(&["mkfs", pool.s(), "--size", "64M", "--lanes", "4"]);
        assert!(o.status.success(), "{}", text(&o));
        let pm = MappedPool::open(
            &pool.0,
            &PoolOpenOptions {
                create_size_bytes: None,
                read_only: false,
            },
        )
        .unwrap();
        let fs = Fs::mount(pm, MountOptions::default()).unwrap();
        let d = fs.mkdir(ROOT_INO, b"dir", 0o755, 0, 0).unwrap().ino;
        for i in 0..20u32 {
            let (_, fh) = fs
                .create(d, format!("f{i}").as_bytes(), 0o644, 0, 0)
                .unwrap();
            fs.write(&fh, 0, &vec![i as u8; 1000 * i as usize + 1])
                .unwrap();
            fs.release(fh);
        }
        fs.unmount().unwrap();
        pool
    }
    fn first_data_block(&self) -> u64 {
        let pm = MappedPool::open(
            &self.0,
            &PoolOpenOptions {
                create_size_bytes: None,
                read_only: true,
            },
        )
        .unwrap();
        let sb: Superblock = read_pod(&pm, 0);
        sb.first_data_block
    }
    fn flip(&self, off: u64) {
        flip(&self.0, off)
    }
}
impl Drop for Pool {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn flip(path: &Path, off: u64) {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, off).unwrap();
    b[0] ^= 0x5a;
    f.write_all_at(&b, off).unwrap();
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

#[test]
fn clean_pool_exits_0() {
    let pool = Pool::populated("clean");
    let o = inkfs(&["fsck", pool.s()]);
    assert_eq!(code(&o), 0, "{}", text(&o));
    let t = text(&o);
    assert!(t.contains("22 inodes checked"), "{t}");
    assert!(t.contains(": state: clean\n"), "{t}");
    assert!(t.contains(": no errors found ("), "{t}");
    let o = inkfs(&["fsck", pool.s(), "--json"]);
    assert_eq!(code(&o), 0, "{}", text(&o));
    let t = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(t.starts_with('{') && t.trim_end().ends_with('}'), "{t}");
    assert_eq!(t.lines().count(), 1, "{t}");
    for want in [
        "\"clean\":true",
        "\"exit_code\":0",
        "\"files\":20",
        "\"directories\":2",
        "\"problems\":[]",
    ] {
        assert!(t.contains(want), "{want} in {t}");
    }
    let o = inkfs(&["fsck", pool.s(), "-y", "-q"]);
    assert_eq!(code(&o), 0, "{}", text(&o));
    assert!(o.stdout.is_empty(), "{}", text(&o));
}

#[test]
fn damaged_superblock_exits_4_then_1_then_0() {
    let pool = Pool::populated("sb");
    pool.flip(100);
    let o = inkfs(&["fsck", pool.s()]);
    assert_eq!(code(&o), 4, "{}", text(&o));
    assert!(text(&o).contains("primary superblock"), "{}", text(&o));
    assert!(text(&o).contains("[fixable with -y]"), "{}", text(&o));
    let o = inkfs(&["fsck", pool.s(), "--repair", "--json"]);
    assert_eq!(code(&o), 1, "{}", text(&o));
    let t = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(t.contains("\"kind\":\"superblock\""), "{t}");
    assert!(t.contains("\"repaired\":true"), "{t}");
    assert!(t.contains("\"errors_fixed\":1"), "{t}");
    let o = inkfs(&["fsck", pool.s()]);
    assert_eq!(code(&o), 0, "{}", text(&o));
}

#[test]
fn unrepairable_damage_exits_4_even_with_repair() {
    let pool = Pool::populated("log");
    // A byte inside the root directory's first log entry (its first page
    // is the first data block).
    pool.flip(pool.first_data_block() * 4096 + 20);
    let o = inkfs(&["fsck", pool.s(), "-y"]);
    assert_eq!(code(&o), 4, "{}", text(&o));
    let t = text(&o);
    assert!(t.contains("inode 1:") && t.contains("[not fixed]"), "{t}");
    let o = inkfs(&["fsck", pool.s(), "--json"]);
    assert_eq!(code(&o), 4, "{}", text(&o));
    let t = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(t.contains("\"kind\":\"log\""), "{t}");
    assert!(t.contains("\"inode\":1"), "{t}");
}

#[test]
fn operational_errors_exit_8() {
    let o = inkfs(&["fsck", "/dev/shm/inkfs-fsck-test-does-not-exist.pool"]);
    assert_eq!(code(&o), 8, "{}", text(&o));
    let zeros = Pool::new("zeros");
    std::fs::write(&zeros.0, vec![0u8; 1 << 20]).unwrap();
    let o = inkfs(&["fsck", zeros.s()]);
    assert_eq!(code(&o), 8, "{}", text(&o));
    assert!(text(&o).contains("inkfs"), "{}", text(&o));
    let o = inkfs(&["fsck", zeros.s(), "--json"]);
    assert_eq!(code(&o), 8, "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("\"error\":"));
    let o = inkfs(&["fsck"]);
    assert_eq!(code(&o), 16, "{}", text(&o));
    let o = inkfs(&["fsck", zeros.s(), "--bogus"]);
    assert_eq!(code(&o), 16, "{}", text(&o));
}

#[test]
fn mounted_pool_repair_is_refused() {
    let pool = Pool::populated("mounted");
    // What `inkfs mount` holds while serving the pool: the claim on the
    // pool and a superblock that says MOUNTED.
    let pm = MappedPool::open(&pool.0, &PoolOpenOptions::default()).unwrap();
    let fs = Fs::mount(pm, MountOptions::default()).unwrap();
    let me = format!("pid {}", std::process::id());
    let o = inkfs(&["fsck", pool.s(), "-y"]);
    assert_eq!(code(&o), 8, "{}", text(&o));
    assert!(
        text(&o).contains(&format!("pool in use by {me}")) && text(&o).contains("refusing"),
        "{}",
        text(&o)
    );
    let o = inkfs(&["fsck", pool.s()]);
    assert_eq!(code(&o), 0, "{}", text(&o));
    let t = text(&o);
    assert!(t.contains("warning"), "{t}");
    assert!(t.contains(&format!(": state: mounted by {me}")), "{t}");
    assert!(t.contains("checked while in use"), "{t}");
    let o = inkfs(&["fsck", pool.s(), "--json"]);
    let j = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        j.contains("\"state\":\"mounted\"") && j.contains("\"checked_while_in_use\":true"),
        "{j}"
    );
    fs.unmount().unwrap();
    let o = inkfs(&["fsck", pool.s(), "-y"]);
    assert_eq!(code(&o), 0, "{}", text(&o));
    assert!(!text(&o).contains("warning"), "{}", text(&o));
}

/// Timing on a pool of 10,000 files (run with
/// `cargo test --release -p inkfs-cli --test fsck -- --ignored --nocapture`).
#[test]
#[ignore]
fn timing_10k_files() {
    let pool = Pool::new("10k");
    let o = inkfs(&["mkfs", pool.s(), "--size", "1G"]);
    assert!(o.status.success(), "{}", text(&o));
    let pm = MappedPool::open(
        &pool.0,
        &PoolOpenOptions {
            create_size_bytes: None,
            read_only: false,
        },
    )
    .unwrap();
    let fs = Fs::mount(pm, MountOptions::default()).unwrap();
    let data = vec![7u8; 6000];
    for d in 0..100 {
        let dir = fs
            .mkdir(ROOT_INO, format!("d{d}").as_bytes(), 0o755, 0, 0)
            .unwrap()
            .ino;
        for f in 0..100 {
            let (_, fh) = fs
                .create(dir, format!("f{f}").as_bytes(), 0o644, 0, 0)
                .unwrap();
            fs.write(&fh, 0, &data).unwrap();
            fs.release(fh);
        }
    }
    fs.unmount().unwrap();
    for args in [vec!["fsck", pool.s()], vec!["fsck", pool.s(), "-y"]] {
        let t = std::time::Instant::now();
        let o = inkfs(&args);
        let el = t.elapsed();
        assert_eq!(code(&o), 0, "{}", text(&o));
        println!("{args:?}: {el:?}\n{}", text(&o));
    }
}
