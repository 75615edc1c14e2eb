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

/// The value of `key:` in `inkfs stat POOL`'s aligned output.
fn field(t: &str, key: &str) -> String {
    t.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .unwrap_or_else(|| panic!("no {key}: in {t}"))
        .trim()
        .to_string()
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
    let version = inkfs::format::FORMAT_VERSION.to_string();
    assert_eq!(field(&t, "format version"), version, "{t}");
    assert_eq!(field(&t, "errors"), "none recorded", "{t}");
    assert!(
        field(&t, "format version").parse::<u32>().unwrap() >= 2,
        "{t}"
    );
    assert!(
        field(&t, "backend").contains("DRAM"),
        "a /dev/shm pool is the DRAM backend: {t}"
    );
    assert_eq!(field(&t, "state"), "clean", "{t}");
    assert_eq!(field(&t, "inodes in use"), "1", "{t}");
    // Values start in one column.
    let value_column = |l: &str| {
        let c = l.find(':').expect("label:") + 1;
        c + l[c..].len() - l[c..].trim_start().len()
    };
    let columns: std::collections::BTreeSet<usize> = t.lines().map(value_column).collect();
    assert_eq!(columns.len(), 1, "values not aligned: {t}");
    let o = inkfs(&["stat", pool.s(), "--json"]);
    let t = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(t.starts_with('{') && t.trim_end().ends_with('}'), "{t}");
    assert!(t.contains("\"size_bytes\":67108864"), "{t}");
    assert!(t.contains("\"state\":\"clean\""), "{t}");
    assert!(
        t.contains("\"errors_count\":0,\"first_error\":null,\"last_error\":null"),
        "{t}"
    );
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
    assert_eq!(
        field(&t, "inodes in use"),
        "1",
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
        "run",
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
        assert!(
            std::env::var_os("CI").is_none(),
            "CI: no hugetlbfs mount with 16 free 2 MiB pages (.ci/run sets one up)"
        );
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
    assert!(t.contains("DRAM") && field(&t, "state") == "clean", "{t}");
}

#[test]
fn mkfs_refuses_lane_counts_out_of_range() {
    let pool = Pool::new("lanes");
    for bad in ["0", "257", "-1", "four"] {
        let o = inkfs(&["mkfs", pool.s(), "--size", "16M", "--lanes", bad]);
        assert!(!o.status.success(), "--lanes {bad} accepted: {}", text(&o));
        assert!(text(&o).contains("--lanes takes 1 to 256"), "{}", text(&o));
        assert!(!pool.0.exists(), "--lanes {bad} left a pool behind");
    }
    let o = inkfs(&["mkfs", pool.s(), "--size", "16M", "--lanes", "1"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains(", 1 lanes,"), "{}", text(&o));
}

/// `--states` caps the exploration also when `--images` fixes the images
/// per crash point (it used to run the whole catalogue).
#[test]
fn crashtest_images_honours_the_state_budget() {
    let o = inkfs(&[
        "crashtest",
        "--images",
        "1",
        "--states",
        "10",
        "--mode",
        "strict",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let t = text(&o);
    let line = t
        .lines()
        .find(|l| l.contains("crash states checked"))
        .unwrap_or_else(|| panic!("no summary line: {t}"));
    let states: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in: {line}"));
    assert_eq!(states, 10, "{line}");
    let runs: u64 = line
        .split(" runs)")
        .next()
        .and_then(|head| head.rsplit('(').next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no run count in: {line}"));
    assert!(runs < 10, "{runs} runs for 10 states: {line}");
}

/// A data file on a disk file system, removed on drop.
struct DataFile(PathBuf);
impl DataFile {
    fn new(tag: &str) -> DataFile {
        let p = PathBuf::from(format!(
            "/var/tmp/inkfs-cli-test-{}-{tag}.data",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&p);
        DataFile(p)
    }
    fn s(&self) -> &str {
        self.0.to_str().unwrap()
    }
}
impl Drop for DataFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn hybrid_mkfs_stat_fsck_and_refusals() {
    let pool = Pool::new("hybrid");
    let data = DataFile::new("hybrid");
    // A data file that does not exist needs a size.
    let o = inkfs(&["mkfs", pool.s(), "--size", "64M", "--data", data.s()]);
    assert!(!o.status.success());
    assert!(text(&o).contains("--data-size"), "{}", text(&o));
    assert!(!pool.0.exists(), "a failed mkfs left the pool file");
    let o = inkfs(&[
        "mkfs",
        pool.s(),
        "--size",
        "64M",
        "--data",
        data.s(),
        "--data-size",
        "32M",
        "--data-threshold",
        "128k",
        "--data-unit",
        "256k",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let o = inkfs(&["stat", "--json", pool.s()]);
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let d = &v["data_device"];
    assert_eq!(d["path"].as_str(), Some(data.s()), "{v}");
    assert_eq!(d["blocks"].as_u64(), Some(8192), "{v}");
    assert_eq!(d["threshold_bytes"].as_u64(), Some(128 << 10), "{v}");
    assert_eq!(d["unit_bytes"].as_u64(), Some(256 << 10), "{v}");
    let dev_total = d["blocks_total"].as_u64().unwrap();
    let pm_total = v["pm_blocks_total"].as_u64().unwrap();
    assert_eq!(
        v["blocks_total"].as_u64(),
        Some(dev_total + pm_total),
        "{v}"
    );
    let t = text(&inkfs(&["stat", pool.s()]));
    assert!(
        field(&t, "device data blocks").starts_with(&format!("{dev_total} total")),
        "{t}"
    );
    assert!(
        field(&t, "PM data blocks").starts_with(&format!("{pm_total} total")),
        "{t}"
    );
    // fsck finds it clean, counting the device apart.
    let o = inkfs(&["fsck", "--json", pool.s()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let f: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(f["data_blocks_total"].as_u64(), Some(dev_total), "{f}");
    // The device holds a label now: a second mkfs onto it is refused.
    let other = Pool::new("hybrid-other");
    let o = inkfs(&["mkfs", other.s(), "--size", "64M", "--data", data.s()]);
    assert!(!o.status.success());
    assert!(text(&o).contains("--force"), "{}", text(&o));
    // Another pool's device: fsck and stat say which, fsck exits 4.
    let other_data = DataFile::new("hybrid-other");
    let o = inkfs(&[
        "mkfs",
        other.s(),
        "--size",
        "64M",
        "--data",
        other_data.s(),
        "--data-size",
        "16M",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let o = inkfs(&["fsck", pool.s(), "--data", other_data.s()]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    assert!(text(&o).contains("another pool"), "{}", text(&o));
    let o = inkfs(&["stat", pool.s(), "--data", other_data.s()]);
    assert!(!o.status.success());
    assert!(text(&o).contains("another pool"), "{}", text(&o));
    // A missing device.
    std::fs::remove_file(&data.0).unwrap();
    let o = inkfs(&["fsck", pool.s()]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    assert!(text(&o).contains("missing"), "{}", text(&o));
}

/// The preload library cargo built for this test run (a dev-dependency).
fn preload_lib() -> PathBuf {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_inkfs"));
    let dir = bin.parent().expect("target directory");
    [dir.join("deps"), dir.to_path_buf()]
        .into_iter()
        .map(|d| d.join("libinkfs_preload.so"))
        .find(|p| p.is_file())
        .expect("libinkfs_preload.so is built with the tests")
}

#[test]
fn run_execs_the_program_with_the_library_preloaded() {
    let lib = preload_lib();
    let stats = tempfile::NamedTempFile::new().expect("stats file");
    let o = Command::new(env!("CARGO_BIN_EXE_inkfs"))
        .args(["run", "--lib", lib.to_str().unwrap(), "--"])
        .args(["sh", "-c", "echo \"$LD_PRELOAD\"; cat /dev/null; exit 3"])
        .env("LD_PRELOAD", "")
        .env("INKFS_PRELOAD_STATS", stats.path())
        .output()
        .expect("run inkfs run");
    // The program's own exit status (exec, not a child).
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    let canon = lib.canonicalize().expect("canonical");
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        canon.to_str().unwrap()
    );
    // The library loaded in cat, which sh ran (it reports at exit; sh
    // leaves by _exit).
    let report = std::fs::read_to_string(stats.path()).expect("stats");
    assert!(report.contains("read_local="), "{report:?}");
    // A program that does not exist: one line, exit 1.
    let o = inkfs(&[
        "run",
        "--lib",
        lib.to_str().unwrap(),
        "--",
        "/no/such/program",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).starts_with("inkfs run: running /no/such/program: "),
        "{}",
        text(&o)
    );
}

/// A hybrid mkfs that fails after creating the data file removes it (and
/// the pool file it created); a data file that was there before is left.
#[test]
fn failed_hybrid_mkfs_removes_the_data_file_it_created() {
    let pool = Pool::new("hybrid-fail");
    let data = DataFile::new("hybrid-fail");
    // 16 KiB: created, then refused by the format (64 blocks at least).
    let o = inkfs(&[
        "mkfs",
        pool.s(),
        "--size",
        "64M",
        "--data",
        data.s(),
        "--data-size",
        "16k",
    ]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("data device of 4 blocks"), "{}", text(&o));
    assert!(
        !data.0.exists(),
        "a failed mkfs left the data file it created"
    );
    assert!(!pool.0.exists(), "a failed mkfs left the pool file");
    // An existing (zero) data file, --force: mkfs did not create it.
    std::fs::write(&data.0, vec![0u8; 16384]).unwrap();
    let o = inkfs(&[
        "mkfs",
        pool.s(),
        "--size",
        "64M",
        "--data",
        data.s(),
        "--data-size",
        "16k",
        "--force",
    ]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        data.0.exists(),
        "mkfs removed a data file it did not create"
    );
}
