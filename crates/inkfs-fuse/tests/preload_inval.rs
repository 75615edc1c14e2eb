//! The kernel invalidations of the library's namespace changes
//! (crates/inkfs-fuse/src/ns.rs, `needed`; docs/KERNEL-FREE.md, "Built:
//! no invalidation for what the kernel never saw"): a change of names and
//! inodes the kernel never looked up sends none; one the kernel has cached
//! (looked up, or listed by READDIRPLUS) shows through the mount at once.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::preload::*;
use common::*;

fn report_count(mnt: &Path, key: &str) -> u64 {
    let r = stats_json(mnt).expect("statistics of the mount");
    r[key].as_u64().unwrap_or_else(|| panic!("no {key} in {r}"))
}

/// Invalidations sent and skipped so far.
fn invals(mnt: &Path) -> (u64, u64) {
    (
        report_count(mnt, "invalidations"),
        report_count(mnt, "invalidations_skipped"),
    )
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).expect("stat").mode() & 0o7777
}

/// Directories, a symbolic link, a chmod, a rename and removals under a
/// directory the kernel never saw: one invalidation (the new name in the
/// root, which the kernel always holds), the thirteen others skipped.
#[test]
fn changes_the_kernel_never_saw_send_no_invalidation() {
    let pool = Pool::new("inval-unseen", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let stats = stats_file("inval-unseen");
    let base = m.path().display();
    let (sent, skipped) = invals(m.path());
    preloaded(
        &format!(
            "cd {base} && mkdir d && mkdir d/a d/b && ln -s x d/s && chmod 700 d/a \
             && mv d/s d/b/t && rm d/b/t && rmdir d/a d/b"
        ),
        stats.path(),
        // mkdir 3, symlink, chmod, rename, unlink, rmdir 2.
        9,
    );
    let (sent_after, skipped_after) = invals(m.path());
    // mkdir d/a, d/b, the link: an entry each; the chmod: the inode; the
    // rename: both names and the inode; each removal: the name (under an
    // unknown directory) and the removed inode.
    assert_eq!(
        (sent_after - sent, skipped_after - skipped),
        (1, 13),
        "invalidations (sent, skipped)"
    );
    assert_eq!(report_count(m.path(), "kernel_refs_mismatched"), 0);
}

/// What the kernel cached, changed by the library, shows through the
/// mount at once (the kernel's caches last an hour): a file's mode after a
/// stat, a name removed and one renamed into a directory the kernel
/// listed with READDIRPLUS, and the entries' attributes from that listing.
#[test]
fn changes_of_what_the_kernel_cached_show_at_once() {
    let pool = Pool::new("inval-cached", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let stats = stats_file("inval-cached");
    let base = m.path().display();
    preloaded(
        &format!("cd {base} && mkdir d && touch d/f d/g d/h && chmod 644 d/f d/g d/h && mkdir e"),
        stats.path(),
        // mkdir 2, three creates, three chmods.
        8,
    );
    // Looked up through the kernel: d/f by a stat; d/g and d/h only by
    // the listing (READDIRPLUS).
    assert_eq!(mode(&m.p("d/f")), 0o644);
    let mut names: Vec<_> = std::fs::read_dir(m.p("d"))
        .expect("list")
        .map(|e| e.expect("entry").file_name())
        .collect();
    names.sort();
    assert_eq!(names, ["f", "g", "h"]);
    let r = stats_json(m.path()).expect("statistics");
    assert!(
        r["ops"]["readdirplus"]["count"].as_u64().unwrap_or(0) > 0,
        "the listing was not a READDIRPLUS: {}",
        r["ops"]
    );
    let lookups = r["ops"]["lookup"]["count"].as_u64().unwrap_or(0);
    assert_eq!(mode(&m.p("d/g")), 0o644);
    let r = stats_json(m.path()).expect("statistics");
    assert_eq!(
        r["ops"]["lookup"]["count"].as_u64().unwrap_or(0),
        lookups,
        "d/g was looked up: its count is not READDIRPLUS's"
    );
    let (sent, _) = invals(m.path());
    preloaded(
        &format!("cd {base} && chmod 600 d/f d/g && rm d/h && mv e/../d/f e/f2 && touch e/new"),
        stats.path(),
        // chmod 2, unlink, rename, create.
        5,
    );
    assert_eq!(mode(&m.p("e/f2")), 0o600, "d/f's chmod not seen");
    assert_eq!(mode(&m.p("d/g")), 0o600, "listed d/g's chmod not seen");
    assert!(!m.p("d/h").exists(), "removed d/h still seen");
    assert!(!m.p("d/f").exists(), "renamed d/f still seen");
    let mut names: Vec<_> = std::fs::read_dir(m.p("d"))
        .expect("list")
        .map(|e| e.expect("entry").file_name())
        .collect();
    names.sort();
    assert_eq!(names, ["g"], "the listing of d");
    assert!(
        invals(m.path()).0 > sent,
        "nothing sent for cached names and inodes"
    );
    assert_eq!(report_count(m.path(), "kernel_refs_mismatched"), 0);
}

/// Stats through the mount concurrent with the library's chmods of files
/// the kernel had not seen, in the opposite order, so that the two cross:
/// files looked up before their chmod need its invalidation, files looked
/// up after it need none, and a LOOKUP that read the old mode and counts
/// the file after the chmod skipped its invalidation must hand the new
/// mode (`KernelRefs::hand` reads again; a window of a few µs, met about
/// once in ten runs here: `kernel_refs_refreshed` is printed, and
/// tests/kernel_refs.rs makes it deterministic). Once both are done every
/// file should show its new mode through the mount.
///
/// Ignored: it fails in 2-3 runs of 8, with main's server as with this
/// one (one file, where the two orders cross, keeps its old mode): a
/// LOOKUP counted before the chmod's decision, so the invalidation is
/// sent, but its reply not yet taken in by the kernel, which has no inode
/// to invalidate (`fuse_reverse_inval_inode` answers ENOENT) and then
/// installs the old mode from the reply. docs/KERNEL-FREE.md, "Built: no
/// invalidation for what the kernel never saw", says what would close it.
#[test]
#[ignore = "a first LOOKUP's reply overtaken by the invalidation keeps the old mode (on main too)"]
fn lookups_racing_skipped_invalidations_leave_no_stale_mode() {
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Command, Stdio};
    const N: usize = 400;
    let pool = Pool::new("inval-race", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let stats = stats_file("inval-race");
    let script = format!(
        "import os, sys\n\
         d = sys.argv[1]\n\
         os.mkdir(d + '/r')\n\
         for i in range({N}):\n\
         \x20   os.close(os.open(d + '/r/f%d' % i, os.O_CREAT | os.O_RDONLY, 0o644))\n\
         print('ready', flush=True)\n\
         sys.stdin.readline()\n\
         for i in range({N}):\n\
         \x20   os.chmod(d + '/r/f%d' % i, 0o600)\n"
    );
    let mut child = Command::new(PYTHON)
        .arg("-c")
        .arg(&script)
        .arg(m.path())
        .env("LD_PRELOAD", lib())
        .env("INKFS_PRELOAD_STATS", stats.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read");
    assert_eq!(line, "ready\n", "the script failed");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"go\n")
        .expect("go");
    // Meanwhile, through the kernel, from the other end.
    for i in (0..N).rev() {
        let _ = std::fs::metadata(m.p(&format!("r/f{i}")));
    }
    assert!(child.wait().expect("wait").success());
    // The mkdir, N creates, N chmods: all served.
    assert_eq!(c(&counts(stats.path()), "ns_local"), 2 * N as u64 + 1);
    let stale: Vec<_> = (0..N)
        .filter(|i| mode(&m.p(&format!("r/f{i}"))) != 0o600)
        .collect();
    let refreshed = stats_json(m.path()).expect("statistics")["kernel_refs_refreshed"].as_u64();
    eprintln!("refreshed {refreshed:?} replies");
    assert!(
        stale.is_empty(),
        "old mode through the mount: {stale:?} (refreshed {refreshed:?})"
    );
}
