//! The books of blocks with the preload library's directory-lease ask on
//! (issue 16; docs/KERNEL-FREE.md, "The books of a client's chunk
//! blocks", "Built: the books with the ask on"): programs that make and
//! remove files with data in more directories than a client holds leases
//! of at once (`HELD_MAX`, 16: each grant past it gives the oldest lease
//! back, the lane kept) leave no block freed twice, no `slot` or `orphan`
//! refused, books equal to a remount's scan, and fsck clean.

mod common;

use std::path::Path;
use std::process::Command;

use common::lanes::{books_match_a_scan, eventually, stat_u64};
use common::preload::*;
use common::*;

/// The library's switch (crates/inkfs-preload/src/names.rs).
const DIR_LEASE_ENV: &str = "INKFS_PRELOAD_DIR_LEASE";

/// bench/results/issue16-stop33-ask/repro-ask-fsck.py, with rewrites:
/// `argv[2]` directories, six files of `argv[3]` bytes each made in every
/// one, then of the previous round's, three removed and three rewritten
/// (truncated and written again: their first blocks displaced), eight
/// rounds.
const PY_ROUNDS: &str = "import os, sys
d = sys.argv[1]; ndirs = int(sys.argv[2]); size = int(sys.argv[3])
for k in range(ndirs): os.mkdir(f'{d}/d{k}')
for r in range(8):
    for k in range(ndirs):
        for j in range(6):
            p = f'{d}/d{k}/f{r}-{j}'
            fd = os.open(p, os.O_CREAT | os.O_WRONLY, 0o644); os.write(fd, b'x' * size); os.close(fd)
        if r > 0:
            for j in range(6):
                p = f'{d}/d{k}/f{r-1}-{j}'
                if j % 2:
                    fd = os.open(p, os.O_WRONLY | os.O_TRUNC); os.write(fd, b'y' * size); os.close(fd)
                else:
                    os.unlink(p)
";

/// Fileserver's shape, bounded by operations (not time): `argv[2]`
/// threads, each over all `argv[3]` directories in its own order,
/// creating a file with 16 KiB, appending 4 KiB to it, reading it, then
/// of the file it made 20 steps before (in another directory, whose
/// lease the client has likely given back meanwhile): half removed, a
/// quarter rewritten (truncated, 8 KiB), a quarter kept.
const PY_THREADS: &str = "import os, sys, threading
d = sys.argv[1]; nthreads = int(sys.argv[2]); ndirs = int(sys.argv[3])
for k in range(ndirs): os.mkdir(f'{d}/d{k}')
errors = []
def work(t):
    try:
        made = []
        for i in range(120):
            k = (i * 7 + t * 3) % ndirs
            p = f'{d}/d{k}/t{t}-{i}'
            fd = os.open(p, os.O_CREAT | os.O_WRONLY, 0o644); os.write(fd, b'a' * 16384); os.close(fd)
            fd = os.open(p, os.O_WRONLY | os.O_APPEND); os.write(fd, b'b' * 4096); os.close(fd)
            with open(p, 'rb') as f: assert len(f.read()) == 20480
            made.append((i, p))
            if len(made) > 20:
                j, q = made.pop(0)
                if j % 4 == 2:
                    fd = os.open(q, os.O_WRONLY | os.O_TRUNC); os.write(fd, b'c' * 8192); os.close(fd)
                elif j % 4:
                    os.unlink(q)
    except Exception as e:
        errors.append(repr(e))
ts = [threading.Thread(target=work, args=(t,)) for t in range(nthreads)]
for t in ts: t.start()
for t in ts: t.join()
if errors: sys.exit('; '.join(errors[:3]))
";

/// Run `py` under the library with the ask on, wait for its session to
/// end, and check the books: nothing refused, equal to a scan, fsck clean.
fn run_and_check(name: &str, py: &str, args: &[&str]) {
    let pool = Pool::new(name, 512);
    let m = Mounted::new(&pool, "mode=strict");
    let o = Command::new(PYTHON)
        .arg("-c")
        .arg(py)
        .arg(m.path())
        .args(args)
        .env("LD_PRELOAD", lib())
        .env(DIR_LEASE_ENV, "1")
        .output()
        .expect("python");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mnt: &Path = m.path();
    eventually("the client's session ended", || {
        stat_u64(mnt, "clients_attached") == 0
    });
    assert!(
        stat_u64(mnt, "dir_leases_granted") > 16,
        "fewer grants than the bound: the give-back of the oldest lease not exercised"
    );
    assert_eq!(
        stat_u64(mnt, "lane_removals_refused"),
        0,
        "a `slot` or `orphan` refused"
    );
    assert_eq!(stat_u64(mnt, "frees_refused"), 0, "blocks freed twice");
    drop(books_match_a_scan(&pool, m));
}

/// The single-threaded reproduction: 40 directories (more than the 16
/// leases a client holds), six 4 KiB files each, eight rounds. Before
/// the fix the `slot`s of files made in slots a `slots K` answer handed
/// out were refused (their blocks and head chunks leaked: fsck), and
/// files made under an earlier lease of a directory, removed through the
/// ring, were freed twice.
#[test]
fn files_made_and_removed_across_more_directories_than_leases() {
    run_and_check("askbooks-rounds", PY_ROUNDS, &["40", "4096"]);
}

/// Fileserver's shape with threads: eight threads creating, appending,
/// reading and removing across 24 directories.
#[test]
fn threads_making_and_removing_across_directories() {
    run_and_check("askbooks-threads", PY_THREADS, &["8", "24"]);
}
