//! Directory listings through the kernel: one pass (getdents until the
//! end, resumed by the kernel from the offset of the last entry returned)
//! never shows a name twice, while another thread keeps creating a file and
//! renaming it over existing names; and telldir/seekdir resume where they
//! left off. The outside reproducer of this bug saw 14761 duplicates in
//! 2653 scans of a 5000-file directory. Root required (FUSE mounts).

mod common;

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;

const FILES: usize = 5000;

fn name(i: usize) -> String {
    format!("name-{i:05}")
}

fn populate(dir: &Path, n: usize) {
    fs::create_dir(dir).unwrap();
    for i in 0..n {
        fs::File::create(dir.join(name(i))).unwrap();
    }
}

#[test]
fn renames_over_existing_names_never_show_a_name_twice_in_one_listing() {
    let pool = Pool::new("readdir-dups", 256);
    let m = Mounted::new(&pool, "");
    let dir = m.p("d");
    if preloading() {
        // The listings and renames through the library.
        in_preloaded_child("scans_while_renaming_child", &dir.display().to_string());
    } else {
        scans_while_renaming(&dir);
    }

    // After a remount: every name once.
    let mnt = m.unmount();
    let m = Mounted::at(&pool, mnt, "");
    let mut names: Vec<_> = fs::read_dir(m.p("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    let n = names.len();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), n, "a name listed twice after remount");
    // The writer always finished its rename: no "tmp" left.
    assert_eq!(n, FILES);
}

/// The body of the test above in a child with the library in (returns at
/// once unless started as that child).
#[test]
fn scans_while_renaming_child() {
    if let Some(dir) = child_arg() {
        scans_while_renaming(Path::new(&dir));
    }
}

/// Fill `dir`, then list it in whole passes while a thread renames a new
/// file over its names: no pass shows a name twice or misses one.
fn scans_while_renaming(dir: &Path) {
    let dir = dir.to_path_buf();
    populate(&dir, FILES);

    let stop = Arc::new(AtomicBool::new(false));
    let renames = Arc::new(AtomicU64::new(0));
    let writer = {
        let (dir, stop, renames) = (dir.clone(), stop.clone(), renames.clone());
        std::thread::spawn(move || {
            let mut x = 0x2545_f491_4f6c_dd1du64;
            while !stop.load(Ordering::Relaxed) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let tmp = dir.join("tmp");
                fs::File::create(&tmp).unwrap();
                fs::rename(&tmp, dir.join(name(x as usize % FILES))).unwrap();
                renames.fetch_add(1, Ordering::Relaxed);
            }
        })
    };

    // Scans, each a full read_dir (the kernel pages through it in requests
    // of about a hundred entries, each resumed from the last offset).
    let start = Instant::now();
    let (mut scans, mut overlapped, mut duplicates) = (0u64, 0u64, 0u64);
    let mut first_duplicate = None;
    let mut missing = Vec::new();
    while start.elapsed() < Duration::from_secs(4) || overlapped < 10 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "only {overlapped} of {scans} scans overlapped a rename"
        );
        let r0 = renames.load(Ordering::Relaxed);
        let mut seen: HashMap<Vec<u8>, u32> = HashMap::new();
        for e in fs::read_dir(&dir).unwrap() {
            *seen
                .entry(e.unwrap().file_name().as_bytes().to_vec())
                .or_insert(0) += 1;
        }
        if renames.load(Ordering::Relaxed) > r0 {
            overlapped += 1;
        }
        scans += 1;
        for (n, &c) in &seen {
            if c > 1 {
                duplicates += c as u64 - 1;
                first_duplicate.get_or_insert_with(|| String::from_utf8_lossy(n).into_owned());
            }
        }
        // Renamed over, never absent: each is listed in every scan.
        missing.extend(
            (0..FILES)
                .map(name)
                .filter(|n| !seen.contains_key(n.as_bytes()))
                .take(3),
        );
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    let renamed = renames.load(Ordering::Relaxed);
    eprintln!(
        "{scans} scans ({overlapped} during renames), {renamed} renames, {duplicates} duplicates"
    );
    assert_eq!(
        duplicates, 0,
        "{duplicates} duplicate sightings in {scans} scans (first: {first_duplicate:?})"
    );
    assert!(missing.is_empty(), "names missing from a scan: {missing:?}");
}

/// The entries after a telldir position, read with readdir(3).
fn rest_after(d: *mut libc::DIR, pos: libc::c_long) -> Vec<Vec<u8>> {
    // SAFETY: `d` is an open DIR stream; the dirent pointer readdir returns
    // is valid until the next readdir on it, and its name is NUL-terminated.
    unsafe {
        libc::seekdir(d, pos);
        let mut out = Vec::new();
        loop {
            let e = libc::readdir(d);
            if e.is_null() {
                return out;
            }
            out.push(CStr::from_ptr((*e).d_name.as_ptr()).to_bytes().to_vec());
        }
    }
}

/// telldir/seekdir: seeking back to a position resumes with the same
/// entries; a name listed before that position and renamed over since is
/// not listed again after it (it keeps its place).
#[test]
fn seekdir_resumes_after_the_told_entry() {
    let pool = Pool::new("readdir-seek", 64);
    let m = Mounted::new(&pool, "");
    let dir = m.p("d");
    if preloading() {
        in_preloaded_child("seekdir_child", &dir.display().to_string());
    } else {
        seekdir_resumes(&dir);
    }
}

/// The body of the test above in a child with the library in.
#[test]
fn seekdir_child() {
    if let Some(dir) = child_arg() {
        seekdir_resumes(Path::new(&dir));
    }
}

fn seekdir_resumes(dir: &Path) {
    populate(dir, 1000);
    let c = CString::new(dir.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path; the stream is closed below.
    let d = unsafe { libc::opendir(c.as_ptr()) };
    assert!(!d.is_null());
    let mut before = Vec::new();
    // SAFETY: as in rest_after.
    let pos = unsafe {
        for _ in 0..300 {
            let e = libc::readdir(d);
            assert!(!e.is_null());
            before.push(CStr::from_ptr((*e).d_name.as_ptr()).to_bytes().to_vec());
        }
        libc::telldir(d)
    };
    assert!(pos > 0);
    let rest = rest_after(d, pos);
    assert_eq!(before.len() + rest.len(), 1002); // with "." and ".."
    assert_eq!(
        rest_after(d, pos),
        rest,
        "seekdir did not resume at the same entry"
    );

    // Rename over names listed before `pos` (not "." or ".."): none comes
    // back after it.
    let seen_early: Vec<&Vec<u8>> = before
        .iter()
        .filter(|n| n.as_slice() != b"." && n.as_slice() != b"..")
        .take(50)
        .collect();
    for n in &seen_early {
        fs::File::create(dir.join("tmp")).unwrap();
        fs::rename(dir.join("tmp"), dir.join(std::str::from_utf8(n).unwrap())).unwrap();
    }
    let again = rest_after(d, pos);
    // SAFETY: `d` came from opendir and is closed once.
    unsafe { libc::closedir(d) };
    let back: Vec<String> = again
        .iter()
        .filter(|n| seen_early.contains(n))
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .collect();
    assert!(back.is_empty(), "listed again after seekdir: {back:?}");
    assert_eq!(again, rest);
}
