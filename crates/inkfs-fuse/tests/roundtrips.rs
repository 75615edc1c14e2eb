//! Requests the kernel need not send, and what must still hold without
//! them (issue 19): directories opened by the kernel alone (no OPENDIR or
//! RELEASEDIR, listings kept in its page cache) in every mode, and the
//! kernel's time write-backs to files with no name left answered without
//! writing, under posix mode's writeback cache. Root required (FUSE).

mod common;

use std::collections::BTreeSet;
use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;

/// The server's count of `op` requests so far.
fn count(mnt: &Path, op: &str) -> u64 {
    let s = stats_json(mnt).expect("statistics of the mount");
    s["ops"][op]["count"].as_u64().unwrap_or(0)
}

fn names(dir: &Path) -> BTreeSet<String> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect()
}

fn inodes_free(mnt: &Path) -> u64 {
    stats_json(mnt).expect("statistics of the mount")["inodes_free"]
        .as_u64()
        .expect("inodes_free")
}

/// Wait until the server's free inode count is `want` (the kernel forgets
/// inodes asynchronously), then check it.
fn wait_inodes_free(mnt: &Path, want: u64, what: &str) {
    let deadline = Instant::now() + inkfs::testkit::WAIT_LIMIT;
    while inodes_free(mnt) != want && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(inodes_free(mnt), want, "{what}");
}

/// Listing a directory costs no OPENDIR or RELEASEDIR (the kernel is told
/// once, by ENOSYS, to open directories itself), a second listing of an
/// unchanged directory costs no request at all (the kernel's cache), and
/// every change made through the mount shows in the next listing. In
/// strict and posix mode.
#[test]
fn directories_are_listed_without_opendir_and_stay_right() {
    kernel_only("counts the FUSE requests of listings; its one tool runs as a user the trust rule keeps out of the pool");
    require_tool("setpriv", "util-linux");
    for opts in ["mode=strict", "mode=posix"] {
        let pool = Pool::new("rt-opendir", 64);
        let m = Mounted::new(&pool, opts);
        let d = m.p("d");
        fs::create_dir(&d).unwrap();
        let mut want = BTreeSet::new();
        for i in 0..300 {
            let n = format!("f{i:03}");
            fs::write(d.join(&n), b"x").unwrap();
            want.insert(n);
        }
        assert_eq!(names(&d), want, "{opts}: first listing");
        let opendirs = count(m.path(), "opendir");
        let listings = count(m.path(), "readdir") + count(m.path(), "readdirplus");
        for _ in 0..5 {
            assert_eq!(names(&d), want, "{opts}: listing again");
        }
        assert!(
            count(m.path(), "opendir") <= 1,
            "{opts}: OPENDIR sent after the server answered ENOSYS"
        );
        assert_eq!(count(m.path(), "opendir"), opendirs, "{opts}");
        assert_eq!(count(m.path(), "releasedir"), 0, "{opts}: RELEASEDIR sent");
        assert_eq!(
            count(m.path(), "readdir") + count(m.path(), "readdirplus"),
            listings,
            "{opts}: an unchanged directory listed again from the server"
        );
        // Each kind of change through the mount shows at once.
        fs::write(d.join("new"), b"y").unwrap();
        want.insert("new".into());
        assert_eq!(names(&d), want, "{opts}: after a create");
        fs::remove_file(d.join("f007")).unwrap();
        want.remove("f007");
        assert_eq!(names(&d), want, "{opts}: after an unlink");
        fs::rename(d.join("f008"), d.join("g008")).unwrap();
        want.remove("f008");
        want.insert("g008".into());
        assert_eq!(names(&d), want, "{opts}: after a rename");
        fs::rename(d.join("f009"), m.p("moved")).unwrap();
        want.remove("f009");
        assert_eq!(names(&d), want, "{opts}: after a rename out");
        assert!(names(m.path()).contains("moved"), "{opts}: rename target");
        fs::create_dir(d.join("sub")).unwrap();
        want.insert("sub".into());
        assert_eq!(names(&d), want, "{opts}: after a mkdir");
        fs::remove_dir(d.join("sub")).unwrap();
        want.remove("sub");
        assert_eq!(names(&d), want, "{opts}: after an rmdir");
        // Reading a directory still needs read permission, checked by the
        // kernel at open: the server no longer sees the open.
        fs::set_permissions(&d, fs::Permissions::from_mode(0o311)).unwrap();
        let as_nobody = tool("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "ls"])
            .arg(&d)
            .output()
            .expect("run setpriv");
        assert!(
            !as_nobody.status.success(),
            "{opts}: listed without read permission"
        );
    }
}

/// Without `default_permissions` the server checks opendir's read
/// permission itself: OPENDIR must still be sent there.
#[test]
fn opendir_is_asked_where_the_server_checks_permissions() {
    let pool = Pool::new("rt-opendir-noperm", 64);
    let m = Mounted::new(&pool, "nodefault_permissions");
    fs::create_dir(m.p("d")).unwrap();
    fs::write(m.p("d/a"), b"x").unwrap();
    for _ in 0..3 {
        assert_eq!(names(&m.p("d")), BTreeSet::from(["a".to_string()]));
    }
    assert!(count(m.path(), "opendir") >= 3, "OPENDIR not asked");
    // The kernel sends RELEASEDIR after the close returned, and the server
    // counts a request just after answering it: wait for the counts to
    // meet (the last one was seen behind by one under load).
    let deadline = Instant::now() + inkfs::testkit::WAIT_LIMIT;
    while count(m.path(), "opendir") != count(m.path(), "releasedir") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(count(m.path(), "opendir"), count(m.path(), "releasedir"));
}

/// A directory held open across its rmdir keeps its inode, as on any Linux
/// file system, although no handle of the server's holds it: fchmod and
/// fstat through the descriptor reach that directory, never an inode that
/// took its number, and it is freed once the kernel lets it go.
#[test]
fn a_removed_directory_held_open_is_still_itself() {
    let pool = Pool::new("rt-rmdir-open", 64);
    let m = Mounted::new(&pool, "");
    let before = inodes_free(m.path());
    fs::create_dir(m.p("d")).unwrap();
    let held = fs::File::open(m.p("d")).unwrap();
    let ino = held.metadata().unwrap().ino();
    fs::remove_dir(m.p("d")).unwrap();
    // New inodes, one of which would take the freed number.
    for i in 0..8 {
        fs::write(m.p(&format!("n{i}")), b"x").unwrap();
        fs::set_permissions(m.p(&format!("n{i}")), fs::Permissions::from_mode(0o600)).unwrap();
    }
    for i in 0..8 {
        let md = fs::metadata(m.p(&format!("n{i}"))).unwrap();
        assert_ne!(
            md.ino(),
            ino,
            "n{i} took the number of a directory still open"
        );
    }
    // SAFETY: fchmod on an open descriptor.
    let r = unsafe { libc::fchmod(held.as_raw_fd(), 0o700) };
    assert_eq!(r, 0, "fchmod: {}", std::io::Error::last_os_error());
    for i in 0..8 {
        let mode = fs::metadata(m.p(&format!("n{i}"))).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o600, "n{i} changed by an fchmod of another inode");
    }
    let md = held.metadata().unwrap();
    assert_eq!(md.mode() & 0o7777, 0o700);
    assert_eq!(md.nlink(), 0);
    drop(held);
    for i in 0..8 {
        fs::remove_file(m.p(&format!("n{i}"))).unwrap();
    }
    wait_inodes_free(m.path(), before, "a removed directory was never freed");
}

/// Posix mode with the cache: the ctime the kernel stamps on a file it
/// unlinked, and the times of writes to an unlinked file still open, are
/// answered without being written; what a process sees of the file stays
/// right (the kernel's own times, an explicit atime), syncfs reports no
/// error, and the file is freed once closed.
#[test]
fn times_of_unlinked_files_are_not_written_and_stay_right() {
    let pool = Pool::new("rt-held-times", 64);
    let m = Mounted::new(&pool, "mode=posix");
    assert!(
        writeback_cache(m.path()),
        "posix mode mounts with the cache"
    );
    let skipped = || {
        stats_json(m.path()).expect("statistics")["held_times_skipped"]
            .as_u64()
            .expect("held_times_skipped")
    };
    let before = inodes_free(m.path());
    let s0 = skipped();
    for i in 0..4 {
        let p = m.p(&format!("f{i}"));
        fs::write(&p, vec![i as u8; 5000]).unwrap();
        fs::remove_file(&p).unwrap();
    }
    assert!(skipped() >= s0 + 4, "the unlink ctimes were written");

    // A file unlinked while open: its writes and times still show.
    let p = m.p("open");
    let mut f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    std::io::Write::write_all(&mut f, b"first").unwrap();
    fs::remove_file(&p).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let mtime_ns = |md: &fs::Metadata| md.mtime() * 1_000_000_000 + md.mtime_nsec();
    let t0 = mtime_ns(&f.metadata().unwrap());
    std::io::Write::write_all(&mut f, b" second").unwrap();
    f.sync_all().unwrap();
    let md = f.metadata().unwrap();
    assert_eq!(md.len(), 12);
    assert_eq!(md.nlink(), 0);
    let t1 = mtime_ns(&md);
    assert!(t1 > t0, "the write's mtime was lost ({t0} -> {t1})");
    // An explicit atime takes the ordinary path and shows.
    let times = [
        libc::timespec {
            tv_sec: 1_000_000,
            tv_nsec: 5,
        },
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
    ];
    // SAFETY: futimens on an open descriptor with two valid timespecs.
    let r = unsafe { libc::futimens(f.as_raw_fd(), times.as_ptr()) };
    assert_eq!(r, 0, "futimens: {}", std::io::Error::last_os_error());
    assert_eq!(f.metadata().unwrap().atime(), 1_000_000);
    let mut back = String::new();
    std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(0)).unwrap();
    std::io::Read::read_to_string(&mut f, &mut back).unwrap();
    assert_eq!(back, "first second");
    drop(f);

    let d = fs::File::open(m.path()).unwrap();
    // SAFETY: syncfs on an open descriptor.
    let r = unsafe { libc::syncfs(d.as_raw_fd()) };
    assert_eq!(r, 0, "syncfs: {}", std::io::Error::last_os_error());
    wait_inodes_free(m.path(), before, "an unlinked file was never freed");
}
