//! `inkfs selftest POOL`: exercise a real pool through the library, without
//! FUSE — write a known tree, unmount cleanly, mount again, verify every
//! byte, check with fsck, remove the tree. Meant for new hardware (a DAX
//! device, a MAP_SYNC file) where the backend itself is what is on trial.

use std::path::PathBuf;

use inkfs::api::{
    Credentials, Filesystem, MountOptions, OpenFlags, Rename, RenameFlags, SetAttr, ROOT_INO,
};
use inkfs::fsck::{self, FsckOptions};
use inkfs::pmem::{MappedPool, Pmem, PoolBusy, PoolFile, PoolOpenOptions};

const DIR: &[u8] = b"inkfs-selftest";

/// Deterministic contents for file `i` of `len` bytes.
fn pattern(i: u64, len: usize) -> Vec<u8> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ i;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

const SIZES: [usize; 7] = [0, 1, 4095, 4096, 4097, 65536 + 17, 1 << 20];

fn e<T>(what: &str, r: inkfs::api::Result<T>) -> Result<T, String> {
    r.map_err(|err| format!("{what}: {err}"))
}

/// Test a pool's hardware through the library: write, remount, verify
///
/// Writes a tree of files in /inkfs-selftest through the library (no
/// FUSE), unmounts cleanly, mounts again, verifies every byte, checks the
/// pool with fsck and removes the tree: for new hardware (a DAX device, a
/// MAP_SYNC file), where the backend itself is on trial. The pool must be
/// made (`inkfs mkfs`) and not open elsewhere.
#[derive(clap::Args, Debug)]
pub struct SelftestArgs {
    /// The pool: a file or a DAX device
    pub pool: PathBuf,
}

pub fn selftest(a: &SelftestArgs) -> Result<(), String> {
    let path = &a.pool;
    let rw = PoolOpenOptions {
        create_size_bytes: None,
        read_only: false,
    };
    // Claimed once for the whole test: a pool that another process has
    // open is refused, and none can take it between the unmount and the
    // remount. Each mapping goes through its own duplicate descriptor,
    // which shares the claim.
    let claim = PoolFile::open(path, &rw).map_err(|err| match PoolBusy::of(&err) {
        Some(_) => format!("{}: {err}; not testing it", path.display()),
        None => format!("{}: {err}", path.display()),
    })?;
    let open = || {
        claim
            .try_clone()
            .and_then(|f| MappedPool::map(f, &rw))
            .map_err(|err| format!("{}: {err}", path.display()))
    };
    let pm = open()?;
    let info = pm.info();
    println!(
        "selftest: {} ({}, flush {})",
        path.display(),
        info.kind.describe(),
        info.flush.name()
    );

    // As root, through the same API (and permission checks) as every
    // front end.
    let me = Credentials::root();
    let fs = e("mount", Filesystem::mount(pm, MountOptions::default()))?;
    if fs.lookup(&me, ROOT_INO, DIR).is_ok() {
        return Err(format!(
            "{} already holds /{}; remove it first",
            path.display(),
            String::from_utf8_lossy(DIR)
        ));
    }
    let dir = e("mkdir", fs.mkdir(&me, ROOT_INO, DIR, 0o755))?.ino;
    for (i, &len) in SIZES.iter().enumerate() {
        let flags = OpenFlags::new(libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL);
        let name = format!("f{i}");
        let (_, file) = e("create", fs.create(&me, dir, name.as_bytes(), 0o644, flags))?;
        let data = pattern(i as u64, len);
        // Written in uneven pieces so partial pages and appends are covered.
        let mut off = 0;
        while off < len {
            let n = (len - off).min(1000 + 3 * off % 7000);
            e("write", fs.write(&file, off as u64, &data[off..off + n]))?;
            off += n;
        }
        e("fsync", fs.fsync(&file, false))?;
        fs.release(file);
    }
    let rename = Rename {
        from_dir: dir,
        from: b"f1",
        to_dir: dir,
        to: b"f1-renamed",
        flags: RenameFlags::default(),
    };
    e("rename", fs.rename(&me, &rename))?;
    let f2 = e("lookup", fs.lookup(&me, dir, b"f2"))?.ino;
    e("link", fs.link(&me, f2, dir, b"f2-link"))?;
    let truncate = SetAttr {
        size: Some(100),
        ..Default::default()
    };
    e("truncate", fs.setattr(&me, f2, &truncate, None))?;
    e("unmount", fs.unmount().map(drop))?;

    let fs = e(
        "remount",
        Filesystem::mount(open()?, MountOptions::default()),
    )?;
    if !fs.mount_report().was_clean {
        return Err("the pool was not clean after a clean unmount".into());
    }
    for (i, &len) in SIZES.iter().enumerate() {
        let name = match i {
            1 => "f1-renamed".to_string(),
            _ => format!("f{i}"),
        };
        let want = if i == 2 {
            pattern(2, len)[..100].to_vec()
        } else {
            pattern(i as u64, len)
        };
        verify(&fs, dir, &name, &want)?;
    }
    verify(&fs, dir, "f2-link", &pattern(2, SIZES[2])[..100])?;
    if e("getattr", fs.lookup(&me, dir, b"f2"))?.nlink != 2 {
        return Err("f2 should have two links".into());
    }
    let pm = e("unmount", fs.unmount())?;
    let report = e("fsck", fsck::check(&pm, &FsckOptions::default()))?;
    if !report.is_clean() {
        return Err(format!("fsck found problems: {:?}", report.problems));
    }

    let fs = e("mount", Filesystem::mount(pm, MountOptions::default()))?;
    let mut names = Vec::new();
    let d = e("opendir", fs.opendir(&me, dir))?;
    let listed = fs.readdir(&d, 0, &mut |entry| {
        if entry.name != b"." && entry.name != b".." {
            names.push(entry.name);
        }
        true
    });
    fs.release(d);
    e("readdir", listed)?;
    for n in names {
        e("unlink", fs.unlink(&me, dir, &n))?;
    }
    e("rmdir", fs.rmdir(&me, ROOT_INO, DIR))?;
    e("unmount", fs.unmount().map(drop))?;
    println!(
        "selftest: passed ({} files written, remounted, verified; fsck clean)",
        SIZES.len()
    );
    Ok(())
}

fn verify<P: Pmem>(fs: &Filesystem<P>, dir: u64, name: &str, want: &[u8]) -> Result<(), String> {
    let me = Credentials::root();
    let attr = e("lookup", fs.lookup(&me, dir, name.as_bytes()))?;
    if attr.size != want.len() as u64 {
        return Err(format!(
            "{name}: size {} after remount, expected {}",
            attr.size,
            want.len()
        ));
    }
    let file = e(
        "open",
        fs.open(&me, attr.ino, OpenFlags::new(libc::O_RDONLY)),
    )?;
    let mut got = vec![0u8; want.len()];
    let n = e("read", fs.read(&file, 0, &mut got))?;
    fs.release(file);
    if n != want.len() || got != want {
        let at = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(n);
        return Err(format!(
            "{name}: contents differ after remount (first difference at byte {at})"
        ));
    }
    Ok(())
}
