//! fsx through the mount: a seeded random sequence of reads, writes,
//! truncates, mapped reads and writes, fallocate (allocate, punch, zero
//! range), copy_file_range, O_APPEND writes, fsyncs and reopens on one file,
//! each checked against an in-memory model of the file (its size after
//! every operation, the bytes every read returns, the whole file every few
//! hundred operations and after a remount). As xfstests' fsx does, in
//! posix mode through the kernel's page cache (FUSE's writeback cache) and
//! in strict mode without it. Root required (FUSE).
//!
//! `INKFS_FSX_OPS=N` runs N operations per mode (default 20000),
//! `INKFS_FSX_SEED=S` another seed (default 1; printed on failure with the
//! last operations).

mod common;

use std::collections::VecDeque;
use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use common::*;
use inkfs::testkit::Rng;

const PAGE: usize = 4096;
/// The file never grows past this (xfstests' fsx default is 256 KiB).
const MAX_LEN: usize = 512 * 1024;
/// Largest single operation.
const MAX_OP: usize = 64 * 1024;
/// Whole-file check every so many operations.
const CHECK_EVERY: usize = 500;

fn env_or(key: &str, default: u64) -> u64 {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Fsx {
    path: PathBuf,
    file: fs::File,
    appender: fs::File,
    model: Vec<u8>,
    rng: Rng,
    seed: u64,
    log: VecDeque<String>,
    ops: usize,
}

fn open_rw(path: &Path) -> fs::File {
    fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .unwrap()
}

fn open_append(path: &Path) -> fs::File {
    fs::OpenOptions::new().append(true).open(path).unwrap()
}

fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

impl Fsx {
    fn new(path: PathBuf, seed: u64) -> Fsx {
        let file = open_rw(&path);
        file.set_len(0).unwrap();
        Fsx {
            appender: open_append(&path),
            file,
            path,
            model: Vec::new(),
            rng: Rng::new(seed),
            seed,
            log: VecDeque::new(),
            ops: 0,
        }
    }

    fn fail(&self, what: String) -> ! {
        let log: Vec<&String> = self.log.iter().collect();
        panic!(
            "fsx seed {} op {}: {what}\nlast operations (oldest first):\n{}",
            self.seed,
            self.ops,
            log.iter()
                .map(|s| format!("  {s}"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }

    fn note(&mut self, s: String) {
        if self.log.len() == 40 {
            self.log.pop_front();
        }
        self.log.push_back(format!("#{} {s}", self.ops));
    }

    fn size(&self) -> usize {
        self.model.len()
    }

    /// A range to operate on: offsets anywhere up to MAX_LEN, sometimes
    /// page-aligned, sometimes ending right at the end of file.
    fn range(&mut self) -> (usize, usize) {
        let len = 1 + self.rng.below(MAX_OP as u64) as usize;
        let mut off = self.rng.below((MAX_LEN - len) as u64) as usize;
        if self.rng.chance(25) {
            off &= !(PAGE - 1);
        }
        if self.rng.chance(15) && self.size() > len {
            off = self.size() - len;
        }
        (off, len)
    }

    /// A range inside the file as it is (None if it is empty).
    fn range_inside(&mut self) -> Option<(usize, usize)> {
        if self.size() == 0 {
            return None;
        }
        let off = self.rng.below(self.size() as u64) as usize;
        let len = 1 + self.rng.below((self.size() - off).min(MAX_OP) as u64) as usize;
        Some((off, len))
    }

    fn check_bytes(&self, what: &str, off: usize, got: &[u8]) {
        let want = &self.model[off..off + got.len()];
        if got != want {
            let i = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
            self.fail(format!(
                "{what}: byte {} is {:#04x}, the model has {:#04x} (file size {})",
                off + i,
                got[i],
                want[i],
                self.size()
            ));
        }
    }

    fn check_size(&self, what: &str) {
        let size = self.file.metadata().unwrap().len() as usize;
        if size != self.size() {
            self.fail(format!(
                "{what}: size {size}, the model has {}",
                self.size()
            ));
        }
    }

    fn check_all(&self, what: &str) {
        let got = fs::read(&self.path).unwrap();
        if got.len() != self.size() {
            self.fail(format!(
                "{what}: read {} bytes, the model has {}",
                got.len(),
                self.size()
            ));
        }
        self.check_bytes(what, 0, &got);
    }

    fn grow_to(&mut self, end: usize) {
        if end > self.model.len() {
            self.model.resize(end, 0);
        }
    }

    fn step(&mut self) {
        self.ops += 1;
        match self.rng.below(100) {
            0..=17 => self.read(),
            18..=37 => self.write(),
            38..=46 => self.map_read(),
            47..=56 => self.map_write(),
            57..=63 => self.truncate(),
            64..=68 => self.punch(),
            69..=73 => self.zero_range(),
            74..=78 => self.allocate(),
            79..=84 => self.copy_range(),
            85..=90 => self.append(),
            91..=94 => self.sync(),
            _ => self.reopen(),
        }
        self.check_size("after it");
        if self.ops.is_multiple_of(CHECK_EVERY) {
            self.check_all("whole file");
        }
    }

    fn read(&mut self) {
        let Some((off, len)) = self.range_inside() else {
            return;
        };
        self.note(format!("read {off:#x}+{len:#x}"));
        let mut buf = vec![0u8; len];
        self.file.read_exact_at(&mut buf, off as u64).unwrap();
        self.check_bytes("read", off, &buf);
    }

    fn write(&mut self) {
        let (off, len) = self.range();
        let data = self.rng.bytes(len);
        self.note(format!("write {off:#x}+{len:#x} (size {:#x})", self.size()));
        self.file.write_all_at(&data, off as u64).unwrap();
        self.grow_to(off + len);
        self.model[off..off + len].copy_from_slice(&data);
    }

    /// A shared mapping of `[off, off+len)` from its page start; `f` gets
    /// the mapped bytes of the range.
    fn with_map(&self, off: usize, len: usize, write: bool, f: impl FnOnce(&mut [u8]) -> bool) {
        let start = off & !(PAGE - 1);
        let maplen = off + len - start;
        let prot = if write {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: the file is at least `off + len` long (the callers make
        // sure), so every byte handed to `f` is backed; the mapping is
        // private to this call and unmapped before it returns.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                maplen,
                prot,
                libc::MAP_SHARED,
                self.file.as_raw_fd(),
                start as i64,
            );
            if p == libc::MAP_FAILED {
                self.fail(format!("mmap: {}", errno()));
            }
            let bytes = std::slice::from_raw_parts_mut((p as *mut u8).add(off - start), len);
            let msync = f(bytes);
            if msync && libc::msync(p, maplen, libc::MS_SYNC) != 0 {
                self.fail(format!("msync: {}", errno()));
            }
            libc::munmap(p, maplen);
        }
    }

    fn map_read(&mut self) {
        let Some((off, len)) = self.range_inside() else {
            return;
        };
        self.note(format!("mapread {off:#x}+{len:#x}"));
        let mut got = vec![0u8; len];
        self.with_map(off, len, false, |b| {
            got.copy_from_slice(b);
            false
        });
        self.check_bytes("mapread", off, &got);
    }

    fn map_write(&mut self) {
        let (off, len) = self.range();
        let data = self.rng.bytes(len);
        let msync = self.rng.chance(50);
        self.note(format!(
            "mapwrite {off:#x}+{len:#x} (size {:#x}){}",
            self.size(),
            if msync { " msync" } else { "" }
        ));
        // As fsx: a mapped write past the end extends the file first.
        if off + len > self.size() {
            self.file.set_len((off + len) as u64).unwrap();
            self.grow_to(off + len);
        }
        self.with_map(off, len, true, |b| {
            b.copy_from_slice(&data);
            msync
        });
        self.model[off..off + len].copy_from_slice(&data);
    }

    fn truncate(&mut self) {
        let size = if self.rng.chance(50) {
            self.rng.below(MAX_LEN as u64) as usize
        } else {
            // Near the current end: partial pages at both sides.
            let s = self.size() as i64 + self.rng.below(2 * PAGE as u64) as i64 - PAGE as i64;
            s.clamp(0, MAX_LEN as i64) as usize
        };
        self.note(format!("truncate {:#x} -> {size:#x}", self.size()));
        self.file.set_len(size as u64).unwrap();
        self.model.resize(size, 0);
    }

    fn fallocate(&self, mode: i32, off: usize, len: usize) {
        // SAFETY: plain syscall on an open descriptor.
        let r = unsafe { libc::fallocate(self.file.as_raw_fd(), mode, off as i64, len as i64) };
        if r != 0 {
            self.fail(format!("fallocate {mode:#x}: {}", errno()));
        }
    }

    fn punch(&mut self) {
        let (off, len) = self.range();
        self.note(format!("punch {off:#x}+{len:#x} (size {:#x})", self.size()));
        self.fallocate(
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off,
            len,
        );
        let end = (off + len).min(self.size());
        if off < end {
            self.model[off..end].fill(0);
        }
    }

    fn zero_range(&mut self) {
        let (off, len) = self.range();
        let keep = self.rng.chance(50);
        self.note(format!(
            "zero {off:#x}+{len:#x} (size {:#x}){}",
            self.size(),
            if keep { " keep_size" } else { "" }
        ));
        let mode = libc::FALLOC_FL_ZERO_RANGE | if keep { libc::FALLOC_FL_KEEP_SIZE } else { 0 };
        self.fallocate(mode, off, len);
        if !keep {
            self.grow_to(off + len);
        }
        let end = (off + len).min(self.size());
        if off < end {
            self.model[off..end].fill(0);
        }
    }

    fn allocate(&mut self) {
        let (off, len) = self.range();
        let keep = self.rng.chance(50);
        self.note(format!(
            "falloc {off:#x}+{len:#x} (size {:#x}){}",
            self.size(),
            if keep { " keep_size" } else { "" }
        ));
        self.fallocate(if keep { libc::FALLOC_FL_KEEP_SIZE } else { 0 }, off, len);
        if !keep {
            self.grow_to(off + len);
        }
    }

    fn copy_range(&mut self) {
        let Some((src, len)) = self.range_inside() else {
            return;
        };
        // A destination that does not overlap the source.
        let dst = self.rng.below((MAX_LEN - len) as u64) as usize;
        if dst < src + len && src < dst + len {
            return;
        }
        self.note(format!(
            "copy {src:#x}+{len:#x} -> {dst:#x} (size {:#x})",
            self.size()
        ));
        let fd = self.file.as_raw_fd();
        let (mut from, mut to, mut left) = (src as i64, dst as i64, len);
        while left > 0 {
            // SAFETY: plain syscall; the offsets are ours and live.
            let n = unsafe { libc::copy_file_range(fd, &mut from, fd, &mut to, left, 0) };
            if n < 0 {
                self.fail(format!("copy_file_range: {}", errno()));
            }
            if n == 0 {
                self.fail("copy_file_range: copied nothing inside the file".into());
            }
            left -= n as usize;
        }
        let bytes = self.model[src..src + len].to_vec();
        self.grow_to(dst + len);
        self.model[dst..dst + len].copy_from_slice(&bytes);
    }

    fn append(&mut self) {
        let len = 1 + self.rng.below(MAX_OP as u64 / 4) as usize;
        if self.size() + len > MAX_LEN {
            return;
        }
        let data = self.rng.bytes(len);
        self.note(format!("append +{len:#x} (size {:#x})", self.size()));
        use std::io::Write;
        self.appender.write_all(&data).unwrap();
        self.model.extend_from_slice(&data);
    }

    fn sync(&mut self) {
        let data_only = self.rng.chance(50);
        self.note(if data_only { "fdatasync" } else { "fsync" }.into());
        let r = if data_only {
            self.file.sync_data()
        } else {
            self.file.sync_all()
        };
        if let Err(e) = r {
            self.fail(format!("fsync: {e}"));
        }
    }

    fn reopen(&mut self) {
        self.note("close and reopen".into());
        self.file = open_rw(&self.path);
        self.appender = open_append(&self.path);
        // A write-only descriptor writing part of a page: the kernel fills
        // the page through it.
        if self.rng.chance(50) {
            if let Some((off, _)) = self.range_inside() {
                let data = self.rng.bytes(7);
                let end = (off + 7).min(self.size());
                let w = fs::OpenOptions::new().write(true).open(&self.path).unwrap();
                w.write_all_at(&data[..end - off], off as u64).unwrap();
                self.note(format!("write-only write {off:#x}+{:#x}", end - off));
                self.model[off..end].copy_from_slice(&data[..end - off]);
            }
        }
    }
}

fn fsx_in(name: &str, opts: &str, ops: u64, seed: u64) {
    let pool = Pool::new(name, 256);
    let m = Mounted::new(&pool, opts);
    let cached = writeback_cache(m.path());
    assert_eq!(cached, opts.contains("posix"), "{opts}: writeback cache");
    // Under the library (strict and sync modes: it is refused in posix
    // mode), the operations run in a preloaded child, which leaves its
    // model in a file for the check after the remount.
    let model = if preloading() && !cached {
        let model = tempfile::NamedTempFile::new().expect("model file");
        let arg = format!(
            "{ops}|{seed}|{}|{}",
            model.path().display(),
            m.p("fsx.file").display()
        );
        in_preloaded_child("fsx_child", &arg);
        fs::read(model.path()).expect("the child's model")
    } else {
        fsx_run(m.p("fsx.file"), ops, seed)
    };
    let dir = m.unmount();
    let m = Mounted::at(&pool, dir, opts);
    let got = fs::read(m.p("fsx.file")).unwrap();
    assert_eq!(got.len(), model.len(), "{opts}: size after remount");
    if let Some(i) = got.iter().zip(&model).position(|(a, b)| a != b) {
        panic!("{opts} seed {seed}: byte {i} differs after remount");
    }
}

/// `ops` operations on `path`, checked as they go; the model at the end.
fn fsx_run(path: PathBuf, ops: u64, seed: u64) -> Vec<u8> {
    let mut fsx = Fsx::new(path, seed);
    for _ in 0..ops {
        fsx.step();
    }
    fsx.check_all("at the end");
    std::mem::take(&mut fsx.model)
}

/// `fsx_in`'s operations in a child with the library in (returns at once
/// unless started as that child): `ops|seed|model file|path`.
#[test]
fn fsx_child() {
    let Some(arg) = child_arg() else {
        return;
    };
    let mut parts = arg.splitn(4, '|');
    let mut next = || parts.next().expect("ops|seed|model|path");
    let ops: u64 = next().parse().expect("ops");
    let seed: u64 = next().parse().expect("seed");
    let model_file = PathBuf::from(next());
    let model = fsx_run(PathBuf::from(next()), ops, seed);
    fs::write(model_file, model).expect("write the model");
}

#[test]
fn fsx_posix_through_the_page_cache() {
    fsx_in(
        "fsx-posix",
        "mode=posix",
        env_or("INKFS_FSX_OPS", 20000),
        env_or("INKFS_FSX_SEED", 1),
    );
}

#[test]
fn fsx_strict_without_it() {
    fsx_in(
        "fsx-strict",
        "mode=strict",
        env_or("INKFS_FSX_OPS", 20000),
        env_or("INKFS_FSX_SEED", 1) + 1000,
    );
}
