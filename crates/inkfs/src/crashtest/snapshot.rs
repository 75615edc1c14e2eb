//! A canonical snapshot of a whole file system (path → node), the
//! consistency checks made while taking it, and a readable diff. Shared by
//! the crash-exploration suite and the crash tests (`tests/common`).

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;

use crate::fs::Fs;
use crate::pmem::Pmem;
use crate::types::*;
use crate::Error;

/// Deterministic file contents: `len` bytes of a pattern picked by `salt`
/// (never a zero byte, so zeros in a file always mean a hole or zeroing).
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

/// A hash of a pool image telling crash images apart (two independent
/// 64-bit lanes over the non-zero 8-byte words).
pub fn image_hash(img: &[u8]) -> u128 {
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

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub ino: u64,
    /// Inode generation (tells a reused inode number apart); zeroed by
    /// [`Snap::timeless`], so comparisons ignore it by default.
    pub generation: u64,
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
    /// Inode flags (chattr): a lost or torn flag change shows here.
    pub flags: u32,
    pub atime: i64,
    pub mtime: i64,
    /// Changed with every change of the inode (a chattr changes only the
    /// flags and this: a torn one shows here).
    pub ctime: i64,
    /// Readdir cookie of the entry naming this node in its directory (0
    /// for the root): positions must survive crashes, remounts and GC.
    pub cookie: u64,
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
pub fn snapshot<P: Pmem>(fs: &Fs<P>) -> Result<Snap, String> {
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
        let mut last_cookie = 0;
        for e in entries {
            // Cookies rise strictly along a listing ("." 1, ".." 2, then the
            // children's positions + 3) and fit a signed 64-bit offset.
            if e.cookie <= last_cookie || e.cookie > i64::MAX as u64 {
                return Err(format!(
                    "{path}/: cookie {} after {last_cookie} (\"{}\")",
                    e.cookie,
                    String::from_utf8_lossy(&e.name)
                ));
            }
            last_cookie = e.cookie;
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
            let mut node = node_of(fs, &a, &child)?;
            node.cookie = e.cookie;
            snap.nodes.insert(child.clone(), node);
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

fn node_of<P: Pmem>(fs: &Fs<P>, a: &Attr, path: &str) -> Result<Node, String> {
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
    let flags = fs
        .get_flags(a.ino)
        .map_err(|e| format!("get_flags {path}: {}", e2s(e)))?;
    Ok(Node {
        ino: a.ino,
        generation: a.generation,
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
        flags,
        atime: a.atime_ns,
        mtime: a.mtime_ns,
        ctime: a.ctime_ns,
        cookie: 0,
    })
}

impl Snap {
    /// Without timestamps (what comparisons see by default).
    pub fn timeless(&self) -> Snap {
        let mut s = self.clone();
        for n in s.nodes.values_mut() {
            n.atime = 0;
            n.mtime = 0;
            n.ctime = 0;
            n.generation = 0;
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
                f!(generation);
                f!(kind);
                f!(mode);
                f!(nlink);
                f!(uid);
                f!(gid);
                f!(rdev);
                f!(size);
                f!(flags);
                f!(atime);
                f!(mtime);
                f!(ctime);
                f!(cookie);
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
