//! Shared helpers of the crash-consistency tests: a canonical snapshot of a
//! whole file system, consistency checks, and the crash-point driver.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use inkfs::pmem::{Pmem, SimPool};
use inkfs::types::*;
use inkfs::{Error, Fs};

pub const BLOCK: u64 = 4096;

pub fn opts(mode: Mode) -> MountOptions {
    MountOptions {
        mode,
        read_only: false,
    }
}

/// A freshly formatted, mounted pool of `bytes` bytes (2 lanes).
pub fn fresh(mode: Mode, bytes: u64) -> Fs<SimPool> {
    let pm = SimPool::new(bytes);
    Fs::format(
        &pm,
        &FormatOptions {
            lanes: 2,
            ..Default::default()
        },
    )
    .expect("format");
    Fs::mount(pm, opts(mode)).expect("mount fresh pool")
}

/// Deterministic file contents: `len` bytes of a pattern picked by `salt`.
pub fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u32)
                .wrapping_mul(31)
                .wrapping_add(salt as u32 * 7 + (i as u32 >> 12)) as u8
                | 1
        })
        .collect()
}

// ---------------------------------------------------------------- snapshot

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub ino: u64,
    pub kind: FileKind,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u64,
    pub size: u64,
    pub content: Vec<u8>,
    pub target: Vec<u8>,
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    pub atime: i64,
    pub mtime: i64,
}

/// Canonical state of a file system: path → node. Timestamps are recorded
/// but ignored by comparisons unless asked for.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Snap {
    pub nodes: BTreeMap<String, Node>,
}

fn e2s(e: Error) -> String {
    format!("{e:?}")
}

/// Walk the namespace from the root. Errors describe an inconsistency
/// (a name whose inode cannot be read, a wrong "..", a kind mismatch, a
/// link count that disagrees with the names).
pub fn snapshot(fs: &Fs<SimPool>) -> Result<Snap, String> {
    let mut snap = Snap::default();
    let mut stack = vec![(1u64, String::new(), 1u64)];
    let mut dirs_seen = HashSet::new();
    let root = fs
        .getattr(1)
        .map_err(|e| format!("getattr root: {}", e2s(e)))?;
    snap.nodes.insert("/".into(), node_of(fs, &root, "/")?);
    while let Some((dir, path, parent)) = stack.pop() {
        if !dirs_seen.insert(dir) {
            return Err(format!("directory {dir} reachable twice (at {path})"));
        }
        let mut entries = Vec::new();
        fs.readdir(dir, 0, &mut |e: DirEntry| {
            entries.push(e);
            true
        })
        .map_err(|e| format!("readdir {path}/: {}", e2s(e)))?;
        let mut subdirs = 0u32;
        let mut names = HashSet::new();
        for e in entries {
            if e.name == b"." {
                if e.ino != dir {
                    return Err(format!("{path}/. is {} not {dir}", e.ino));
                }
                continue;
            }
            if e.name == b".." {
                if e.ino != parent {
                    return Err(format!("{path}/.. is {} not {parent}", e.ino));
                }
                continue;
            }
            if !names.insert(e.name.clone()) {
                return Err(format!("{path}: name listed twice"));
            }
            let name = String::from_utf8_lossy(&e.name).into_owned();
            let child = format!("{path}/{name}");
            let ino = fs
                .lookup_ino(dir, &e.name)
                .map_err(|er| format!("lookup {child}: {}", e2s(er)))?;
            if ino != e.ino {
                return Err(format!("{child}: readdir says {} lookup {ino}", e.ino));
            }
            let a = fs
                .getattr(ino)
                .map_err(|er| format!("getattr {child} (ino {ino}): {}", e2s(er)))?;
            if a.kind != e.kind {
                return Err(format!(
                    "{child}: readdir kind {:?} inode {:?}",
                    e.kind, a.kind
                ));
            }
            if a.kind == FileKind::Dir {
                subdirs += 1;
                stack.push((ino, child.clone(), dir));
            }
            snap.nodes.insert(child.clone(), node_of(fs, &a, &child)?);
        }
        let key = if path.is_empty() {
            "/".to_string()
        } else {
            path.clone()
        };
        let me = &snap.nodes[&key];
        if me.nlink != 2 + subdirs {
            return Err(format!(
                "directory {key}: nlink {} but {subdirs} subdirectories",
                me.nlink
            ));
        }
    }
    // Link counts of non-directories: one per name.
    let mut names_per_ino: BTreeMap<u64, (u32, u32, String)> = BTreeMap::new();
    for (p, n) in &snap.nodes {
        if n.kind != FileKind::Dir {
            let e = names_per_ino
                .entry(n.ino)
                .or_insert((0, n.nlink, p.clone()));
            e.0 += 1;
        }
    }
    for (ino, (names, nlink, p)) in names_per_ino {
        if names != nlink {
            return Err(format!(
                "inode {ino} ({p}): nlink {nlink} but {names} names"
            ));
        }
    }
    Ok(snap)
}

fn node_of(fs: &Fs<SimPool>, a: &Attr, path: &str) -> Result<Node, String> {
    let mut content = Vec::new();
    let mut target = Vec::new();
    match a.kind {
        FileKind::File => {
            let fh = fs
                .open(a.ino)
                .map_err(|e| format!("open {path}: {}", e2s(e)))?;
            content = vec![0u8; a.size as usize];
            let n = fs.read(&fh, 0, &mut content);
            fs.release(fh);
            let n = n.map_err(|e| format!("read {path}: {}", e2s(e)))?;
            if n != a.size as usize {
                return Err(format!("{path}: read {n} of {} bytes", a.size));
            }
        }
        FileKind::Symlink => {
            target = fs
                .readlink(a.ino)
                .map_err(|e| format!("readlink {path}: {}", e2s(e)))?;
            if target.len() as u64 != a.size {
                return Err(format!(
                    "{path}: symlink size {} target {}",
                    a.size,
                    target.len()
                ));
            }
        }
        _ => {}
    }
    let mut xattrs = BTreeMap::new();
    for name in fs
        .listxattr(a.ino)
        .map_err(|e| format!("listxattr {path}: {}", e2s(e)))?
    {
        let v = fs
            .getxattr(a.ino, &name)
            .map_err(|e| format!("getxattr {path}: {}", e2s(e)))?;
        xattrs.insert(name, v);
    }
    Ok(Node {
        ino: a.ino,
        kind: a.kind,
        mode: a.mode,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        size: a.size,
        content,
        target,
        xattrs,
        atime: a.atime_ns,
        mtime: a.mtime_ns,
    })
}

impl Snap {
    /// Without timestamps (what comparisons see by default).
    pub fn timeless(&self) -> Snap {
        let mut s = self.clone();
        for n in s.nodes.values_mut() {
            n.atime = 0;
            n.mtime = 0;
        }
        s
    }
    /// Also without file contents (metadata only).
    pub fn metadata(&self) -> Snap {
        let mut s = self.timeless();
        for n in s.nodes.values_mut() {
            n.content.clear();
        }
        s
    }
}

fn short(b: &[u8]) -> String {
    if b.len() <= 24 {
        format!("{:?}", String::from_utf8_lossy(b))
    } else {
        let h = b.iter().fold(0xcbf29ce484222325u64, |h, &x| {
            (h ^ x as u64).wrapping_mul(0x100000001b3)
        });
        format!("<{} bytes, fnv {h:016x}>", b.len())
    }
}

/// Human-readable differences from `a` (expected) to `b` (found).
pub fn diff(a: &Snap, b: &Snap) -> String {
    let mut out = String::new();
    for (p, n) in &a.nodes {
        match b.nodes.get(p) {
            None => writeln!(out, "  - {p} missing ({:?} ino {})", n.kind, n.ino).unwrap(),
            Some(m) if m != n => {
                let mut parts = Vec::new();
                macro_rules! f {
                    ($f:ident) => {
                        if n.$f != m.$f {
                            parts.push(format!("{} {:?} -> {:?}", stringify!($f), n.$f, m.$f));
                        }
                    };
                }
                f!(ino);
                f!(kind);
                f!(mode);
                f!(nlink);
                f!(uid);
                f!(gid);
                f!(rdev);
                f!(size);
                f!(atime);
                f!(mtime);
                if n.content != m.content {
                    let first = n
                        .content
                        .iter()
                        .zip(&m.content)
                        .position(|(x, y)| x != y)
                        .unwrap_or(n.content.len().min(m.content.len()));
                    parts.push(format!(
                        "content {} -> {} (first difference at byte {first})",
                        short(&n.content),
                        short(&m.content)
                    ));
                }
                if n.target != m.target {
                    parts.push(format!(
                        "target {} -> {}",
                        short(&n.target),
                        short(&m.target)
                    ));
                }
                if n.xattrs != m.xattrs {
                    parts.push(format!("xattrs {:?} -> {:?}", n.xattrs, m.xattrs));
                }
                writeln!(out, "  ~ {p}: {}", parts.join("; ")).unwrap();
            }
            _ => {}
        }
    }
    for (p, n) in &b.nodes {
        if !a.nodes.contains_key(p) {
            writeln!(
                out,
                "  + {p} extra ({:?} ino {} size {})",
                n.kind, n.ino, n.size
            )
            .unwrap();
        }
    }
    if out.is_empty() {
        out.push_str("  (no difference)\n");
    }
    out
}

// ------------------------------------------------------------ comparisons

/// How a recovered state may relate to the states the operation passed
/// through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Exactly one of the checkpoint states (timestamps ignored).
    Exact,
    /// Exactly one of the checkpoint states, timestamps included.
    ExactWithTimes,
    /// Metadata of one checkpoint; each file byte from some checkpoint
    /// (in-place overwrites that are not atomic).
    DataMix,
}

/// Whether `found` is acceptable; `Err` explains why not.
pub fn matches(found: &Snap, states: &[Snap], expect: Expect) -> Result<usize, String> {
    match expect {
        Expect::Exact | Expect::ExactWithTimes => {
            let f = if expect == Expect::Exact {
                found.timeless()
            } else {
                found.clone()
            };
            for (i, s) in states.iter().enumerate() {
                let s = if expect == Expect::Exact {
                    s.timeless()
                } else {
                    s.clone()
                };
                if s == f {
                    return Ok(i);
                }
            }
            Err("state equals none of the expected states".into())
        }
        Expect::DataMix => {
            let fm = found.metadata();
            let Some(i) = states.iter().position(|s| s.metadata() == fm) else {
                return Err("metadata equals none of the expected states".into());
            };
            for (p, n) in &found.nodes {
                if n.kind != FileKind::File {
                    continue;
                }
                for (off, &b) in n.content.iter().enumerate() {
                    let ok = states.iter().any(|s| {
                        s.nodes
                            .get(p)
                            .map_or(b == 0, |m| m.content.get(off).copied().unwrap_or(0) == b)
                    });
                    if !ok {
                        return Err(format!("{p}: byte {off} = {b:#x} is in no expected state"));
                    }
                }
            }
            Ok(i)
        }
    }
}

// ------------------------------------------------------------- counting

pub static STATES: [AtomicU64; 3] = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];
pub static DISTINCT: [AtomicU64; 3] = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];

pub fn mode_index(m: Mode) -> usize {
    match m {
        Mode::Strict => 0,
        Mode::Sync => 1,
        Mode::Posix => 2,
    }
}

pub fn image_hash(img: &[u8]) -> u128 {
    // Two independent 64-bit lanes over 8-byte words: fast and plenty to
    // tell crash images apart.
    let mut a = 0x9E37_79B9_7F4A_7C15u64;
    let mut b = 0xC2B2_AE3D_27D4_EB4Fu64;
    for (i, w) in img.chunks_exact(8).enumerate() {
        let x = u64::from_le_bytes(w.try_into().unwrap());
        if x == 0 {
            continue;
        }
        let x = x ^ (i as u64).wrapping_mul(0x2545_F491_4F6C_DD1D);
        a = (a ^ x).wrapping_mul(0x100_0000_01b3).rotate_left(29);
        b = b.wrapping_add(x).wrapping_mul(0xff51_afd7_ed55_8ccd) ^ (b >> 31);
    }
    (a as u128) << 64 | b as u128
}

// -------------------------------------------------- checking a recovery

/// Everything that must hold for one crash image. Returns the index of the
/// matching state, or a failure description.
pub struct Ctx<'a> {
    pub mode: Mode,
    pub states: &'a [Snap],
    pub expect: Expect,
    /// Free blocks the live file system reported in each state (a
    /// recovered image must report one of them).
    pub free: &'a [u64],
    pub check_free_matches_state: bool,
    /// The end of the trace must recover exactly the final state.
    pub final_durable: bool,
}

pub fn check_image(ctx: &Ctx<'_>, image: Vec<u8>) -> Result<usize, String> {
    let fs = Fs::mount(SimPool::from_image(image), opts(ctx.mode))
        .map_err(|e| format!("mount failed: {e:?}"))?;
    let snap = snapshot(&fs).map_err(|e| format!("inconsistent after recovery: {e}"))?;
    let which = matches(&snap, ctx.states, ctx.expect).map_err(|why| {
        let mut s = format!("{why}\n");
        for (i, st) in ctx.states.iter().enumerate() {
            let (a, b) = if ctx.expect == Expect::ExactWithTimes {
                (st.clone(), snap.clone())
            } else {
                (st.timeless(), snap.timeless())
            };
            write!(s, " diff from state {i} to recovered:\n{}", diff(&a, &b)).unwrap();
        }
        s
    })?;
    let free = fs.statfs().blocks_free;
    if ctx.check_free_matches_state && !ctx.free.contains(&free) {
        return Err(format!(
            "recovered state {which} has {free} free blocks; the live file system had {:?}",
            ctx.free
        ));
    }
    // Clean unmount and remount: same state, same free space.
    let pm = fs
        .unmount()
        .map_err(|e| format!("unmount after recovery: {e:?}"))?;
    // fsck of the recovered, cleanly unmounted pool: no problem of any kind.
    let r = inkfs::fsck::check(&pm, &inkfs::fsck::FsckOptions::default())
        .map_err(|e| format!("fsck: {e}"))?;
    if !r.problems.is_empty() {
        return Err(format!("fsck after recovery: {:#?}", r.problems));
    }
    let fs = Fs::mount(pm, opts(ctx.mode)).map_err(|e| format!("clean remount failed: {e:?}"))?;
    if !fs.mount_report().allocator_restored {
        return Err("clean remount did not restore the allocator".into());
    }
    let again = snapshot(&fs).map_err(|e| format!("inconsistent after remount: {e}"))?;
    if again != snap {
        return Err(format!(
            "remount changed the state:\n{}",
            diff(&snap, &again)
        ));
    }
    let free2 = fs.statfs().blocks_free;
    if free2 != free {
        return Err(format!(
            "free blocks: {free} after recovery, {free2} after a clean remount"
        ));
    }
    usable(&fs, &snap)?;
    Ok(which)
}

/// The recovered file system accepts new work, and no file hides stale
/// bytes past its end (growing a file must show zeros).
pub fn usable(fs: &Fs<SimPool>, snap: &Snap) -> Result<(), String> {
    let data = pattern(10_000, 99);
    let (_, fh) = fs
        .create(1, b"__probe", 0o600, 0, 0)
        .map_err(|e| format!("create after recovery: {e:?}"))?;
    fs.write(&fh, 0, &data)
        .map_err(|e| format!("write after recovery: {e:?}"))?;
    fs.fsync(&fh, false).map_err(|e| format!("fsync: {e:?}"))?;
    let mut back = vec![0u8; 10_000];
    fs.read(&fh, 0, &mut back)
        .map_err(|e| format!("read after recovery: {e:?}"))?;
    fs.release(fh);
    if back != data {
        return Err("probe file reads back different data".into());
    }
    // Every file's tail page: zeros past the end once the file grows.
    for (p, n) in &snap.nodes {
        if n.kind != FileKind::File || n.size % BLOCK == 0 {
            continue;
        }
        let grown = (n.size / BLOCK + 1) * BLOCK;
        fs.setattr(
            n.ino,
            &SetAttr {
                size: Some(grown),
                ..Default::default()
            },
        )
        .map_err(|e| format!("grow {p}: {e:?}"))?;
        let fh = fs.open(n.ino).map_err(|e| format!("open {p}: {e:?}"))?;
        let mut buf = vec![0u8; (grown - n.size) as usize];
        let r = fs.read(&fh, n.size, &mut buf);
        fs.release(fh);
        r.map_err(|e| format!("read {p}: {e:?}"))?;
        if let Some(i) = buf.iter().position(|&b| b != 0) {
            return Err(format!(
                "{p}: byte {} past the old end of file ({}) reads {:#x} after growing, not zero",
                n.size + i as u64,
                n.size,
                buf[i]
            ));
        }
    }
    fs.unlink(1, b"__probe")
        .map_err(|e| format!("unlink probe: {e:?}"))?;
    Ok(())
}

/// One failure, with what is needed to reproduce it.
pub struct Failure {
    pub point: usize,
    pub index: u64,
    pub seed: u64,
    pub description: String,
    pub why: String,
}

/// Run every crash point and image of `trace`; return failures and counts.
pub struct Sweep {
    pub failures: Vec<Failure>,
    pub checked: u64,
    pub distinct: u64,
}

pub fn sweep(trace: &inkfs::pmem::SimTrace, ctx: &Ctx<'_>, max_images: usize, seed: u64) -> Sweep {
    let mut seen: HashSet<u128> = HashSet::new();
    let mut out = Sweep {
        failures: Vec::new(),
        checked: 0,
        distinct: 0,
    };
    let points = trace.fence_count();
    // The end of the trace: durable on return, so only the final state.
    let last = ctx.states.len() - 1;
    let final_ctx = Ctx {
        mode: ctx.mode,
        states: &ctx.states[last..],
        expect: if ctx.expect == Expect::ExactWithTimes {
            Expect::ExactWithTimes
        } else {
            Expect::Exact
        },
        free: &ctx.free[last..],
        check_free_matches_state: ctx.check_free_matches_state,
        final_durable: true,
    };
    for point in 0..=points {
        let c = if point == points && ctx.final_durable {
            &final_ctx
        } else {
            ctx
        };
        if point == points {
            seen.clear();
        }
        for img in trace.crash_images(point, max_images, seed) {
            out.checked += 1;
            if !seen.insert(image_hash(&img.image)) {
                continue; // already checked (and any failure recorded)
            }
            out.distinct += 1;
            if let Err(why) = check_image(c, img.image) {
                out.failures.push(Failure {
                    point,
                    index: img.index,
                    seed: img.seed,
                    description: img.description,
                    why,
                });
            }
        }
    }
    let m = mode_index(ctx.mode);
    STATES[m].fetch_add(out.checked, Ordering::Relaxed);
    DISTINCT[m].fetch_add(out.distinct, Ordering::Relaxed);
    out
}

pub fn free_blocks(fs: &Fs<SimPool>) -> u64 {
    fs.statfs().blocks_free
}

/// Unused; keeps the Pmem trait import meaningful for helpers.
pub fn pool_size(fs: &Fs<SimPool>) -> u64 {
    fs.pmem().size_bytes()
}
