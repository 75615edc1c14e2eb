//! The command-line tool end to end: mkfs then stat on pools in /dev/shm.

use std::path::PathBuf;
use std::process::{Command, Output};

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
            "/dev/shm/inkfs-cli-test-{}-{tag}.pool",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&p);
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

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn mkfs_then_stat() {
    let pool = Pool::new("stat");
    let o = inkfs(&["mkfs", pool.s(), "--size", "64M"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = inkfs(&["stat", pool.s()]);
    assert!(o.status.success(), "{}", text(&o));
    let t = text(&o);
    let version = format!("format version:  {}", inkfs::format::FORMAT_VERSION);
    assert!(t.contains(&version), "{t}");
    assert!(
        t.contains("DRAM"),
        "a /dev/shm pool is the DRAM backend: {t}"
    );
    assert!(t.contains("state:           clean"), "{t}");
    assert!(t.contains("inodes:          1"), "{t}");
    let o = inkfs(&["stat", pool.s(), "--json"]);
    let t = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(t.starts_with('{') && t.trim_end().ends_with('}'), "{t}");
    assert!(t.contains("\"size_bytes\":67108864"), "{t}");
    assert!(t.contains("\"state\":\"clean\""), "{t}");
}

#[test]
fn mkfs_refuses_existing_pool_and_foreign_data() {
    let pool = Pool::new("refuse");
    assert!(inkfs(&["mkfs", pool.s(), "--size", "16M"]).status.success());
    let o = inkfs(&["mkfs", pool.s(), "--size", "16M"]);
    assert!(!o.status.success());
    let t = text(&o);
    assert!(
        t.contains("holds an inkfs pool") && t.contains("--force"),
        "{t}"
    );
    assert_eq!(t.lines().count(), 1, "one clear line: {t}");
    assert!(inkfs(&["mkfs", pool.s(), "--size", "32M", "--force"])
        .status
        .success());
    let t = text(&inkfs(&["stat", pool.s()]));
    assert!(t.contains("32.0 MiB"), "{t}");

    let junk = Pool::new("junk");
    std::fs::write(&junk.0, vec![0xa5u8; 1 << 20]).unwrap();
    let o = inkfs(&["mkfs", junk.s()]);
    assert!(!o.status.success());
    assert!(text(&o).contains("not an inkfs pool"), "{}", text(&o));
    let o = inkfs(&["stat", junk.s()]);
    assert!(!o.status.success());
    assert!(text(&o).contains("bad magic"), "{}", text(&o));
}

#[test]
fn errors_are_one_line_without_panics() {
    let missing = Pool::new("missing");
    for args in [
        vec!["mkfs", missing.s()],
        vec!["mkfs", missing.s(), "--size", "12X"],
        vec!["stat", missing.s()],
        vec!["frobnicate"],
        vec!["mkfs", missing.s(), "--size", "4k"],
    ] {
        let o = inkfs(&args);
        assert!(!o.status.success(), "{args:?}");
        let t = text(&o);
        assert!(!t.contains("panicked"), "{args:?}: {t}");
        assert_eq!(t.lines().count(), 1, "{args:?}: {t}");
    }
}

#[test]
fn crashtest_one_workload_and_errors() {
    let o = inkfs(&[
        "crashtest",
        "--workload",
        "append_foo+rename_bar_over_foo",
        "--images",
        "4",
    ]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("crash states checked"), "{t}");
    assert!(t.contains("1 of 1 workloads (3 runs)"), "{t}");
    assert!(t.contains("0 violations"), "{t}");
    let o = inkfs(&["crashtest", "--workload", "no_such_op+x"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("no workload matches"), "{}", text(&o));
    let o = inkfs(&["crashtest", "--mode", "fast"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("unknown mode"), "{}", text(&o));
}

#[test]
fn selftest_passes_and_leaves_the_pool_clean() {
    let pool = Pool::new("selftest");
    assert!(inkfs(&["mkfs", pool.s(), "--size", "64M"]).status.success());
    let o = inkfs(&["selftest", pool.s()]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("selftest: passed"), "{}", text(&o));
    let o = inkfs(&["fsck", pool.s()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let t = text(&inkfs(&["stat", pool.s()]));
    assert!(
        t.contains("inodes:          1"),
        "the selftest tree was removed: {t}"
    );
}

#[test]
fn every_command_answers_help() {
    for cmd in [
        "mkfs",
        "stat",
        "mount",
        "fsck",
        "selftest",
        "null-fs",
        "install-helper",
    ] {
        let o = inkfs(&[cmd, "--help"]);
        assert!(o.status.success(), "{cmd} --help: {}", text(&o));
    }
}

#[test]
fn failed_mkfs_leaves_no_file_behind() {
    // More than /dev/shm can hold: the space check fails after the file
    // was created; the file must go again.
    let pool = Pool::new("enospc");
    let o = inkfs(&["mkfs", pool.s(), "--size", "1000T"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("No space left"), "{}", text(&o));
    assert!(!pool.0.exists(), "a failed mkfs left {} behind", pool.s());
}

/// A hugetlbfs mount with at least `pages` free huge pages, if this machine
/// has one (.ci/run sets one up at /dev/hugepages).
fn hugetlbfs_with_free_pages(pages: u64) -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    let dir = mounts
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| {
            f.len() > 2
                && f[2] == "hugetlbfs"
                && !f.get(3).is_some_and(|o| o.contains("pagesize=1G"))
        })
        .map(|f| PathBuf::from(f[1]))?;
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let free: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("HugePages_Free:"))?
        .trim()
        .parse()
        .ok()?;
    (free >= pages).then_some(dir)
}

#[test]
fn hugetlbfs_pool_is_dram_and_whole_pages() {
    let Some(dir) = hugetlbfs_with_free_pages(16) else {
        eprintln!("skipped: no hugetlbfs mount with 16 free 2 MiB pages");
        return;
    };
    let path = dir.join(format!("inkfs-cli-test-{}.pool", std::process::id()));
    let pool = Pool(path);
    let o = inkfs(&["mkfs", pool.s(), "--size", "3M"]);
    assert!(!o.status.success(), "3 MiB on 2 MiB pages: {}", text(&o));
    assert!(text(&o).contains("not a multiple"), "{}", text(&o));
    assert!(!pool.0.exists(), "the refused pool file was left behind");
    let o = inkfs(&["mkfs", pool.s(), "--size", "16M"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = inkfs(&["selftest", pool.s()]);
    assert!(o.status.success(), "{}", text(&o));
    let t = text(&inkfs(&["stat", pool.s()]));
    assert!(
        t.contains("DRAM") && t.contains("state:           clean"),
        "{t}"
    );
}
