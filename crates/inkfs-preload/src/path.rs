//! Paths: which mount a path names, and its inode, resolved in the pool.
//!
//! Resolution here is deliberately narrow: it serves the plain case (names
//! and `.`/`..` inside one mount, symlinks only as the last component of
//! an lstat-like call) and hands everything else to the kernel: a symlink
//! to follow (its target may leave the mount), `..` above the mount's
//! root, a path through a mount inside the mount, any error but one (the
//! kernel's answer is the authoritative one: EACCES, ENOTDIR, ELOOP,
//! ENAMETOOLONG come from the kernel's own walk). A path that names the
//! mount through a symlink outside it is not recognised and goes to the
//! kernel too.
//!
//! The one error answered here is a name absent from a directory the walk
//! searched ([`Stop::Absent`], ENOENT): the pool is the truth of a served
//! mount's names (a mount with another mounted inside it is not served),
//! the walk searched every directory on the way with the caller's
//! permission, and followed no symlink to get there; the kernel would
//! answer the same ENOENT one FUSE lookup later (one round trip to the
//! server's threads per miss: `git status` makes dozens, each a wait
//! off the CPU).

use std::ffi::{c_char, c_int, CStr};
use std::mem::MaybeUninit;

use inkfs::api::{Attr, Credentials, FileKind, Filesystem, ROOT_INO};
use inkfs::pmem::MappedPool;

use crate::cwd::{self, Cwd};
use crate::mounts::{self, Mount};
use crate::{real, table};

/// Components a resolved path may have.
const MAX_PARTS: usize = 128;

/// A path located on a mount: resolve `parts[0]` then `parts[1]` from
/// `start` (the current directory's inode if `from_cwd` holds the
/// generation of cwd.rs it was read at).
pub struct Target<'a> {
    pub mount: &'static Mount,
    start: u64,
    from_cwd: Option<u64>,
    parts: [&'a [u8]; 2],
}

impl Target<'_> {
    /// The absolute path this target names, NUL-terminated, as written
    /// (no `..` or symlink resolved): the mount's path and the parts; one
    /// relative to a directory descriptor starts at `dir_path` (that
    /// directory's path, if the library kept it).
    pub fn absolute(&self, dir_path: impl FnOnce() -> Option<&'static [u8]>) -> Option<Box<[u8]>> {
        let mut buf = CwdBuf::new();
        let head: &[u8] = if let Some(generation) = self.from_cwd {
            // The kernel's name of the same inode now (a rename since the
            // copy was made shows here), unless another thread changed
            // directory since the walk started there.
            let here = getcwd(&mut buf)?;
            let (_, m, _) = mounts::locate_abs(here)?;
            if !std::ptr::eq(m, self.mount) || !cwd::unchanged_since(generation) {
                return None;
            }
            here
        } else if self.start == ROOT_INO {
            &self.mount.path
        } else {
            dir_path()?
        };
        Some(normalized(&[head, self.parts[0], self.parts[1]]))
    }

    /// The cwd.rs generation the walk read, if it started at the current
    /// directory's inode.
    pub fn from_cwd(&self) -> Option<u64> {
        self.from_cwd
    }

    /// The path a file's placeholder keeps to be materialized by. From the
    /// current directory: the path as written, relative, normalized (no
    /// getcwd: the kernel resolves it from the same current directory,
    /// since a change of it first materializes every placeholder kept so,
    /// `lazy::settle_relative`), if no change began since the walk read
    /// the directory (the caller holds a `cwd::Opening` from before this
    /// check until the placeholder is registered). Otherwise
    /// [`absolute`](Self::absolute)'s.
    pub fn kept(&self, dir_path: impl FnOnce() -> Option<&'static [u8]>) -> Option<Kept> {
        match self.from_cwd {
            Some(generation) => {
                debug_assert!(self.parts[0].is_empty(), "a walk from the cwd has one part");
                cwd::unchanged_since(generation).then(|| Kept {
                    path: relative(self.parts[1]),
                    relative: true,
                })
            }
            None => self.absolute(dir_path).map(Kept::absolute),
        }
    }
}

/// The path kept of a served open file, NUL-terminated: absolute, or
/// relative to the current directory the open was made in.
pub struct Kept {
    pub path: Box<[u8]>,
    pub relative: bool,
}

impl Kept {
    pub fn absolute(path: Box<[u8]>) -> Kept {
        Kept {
            path,
            relative: false,
        }
    }
}

/// Relative path `p` normalized as [`normalize`] does an absolute one,
/// except that a ".." with no name before it stays (it climbs above the
/// current directory, as the kernel will), and NUL-terminated; "." if
/// nothing is left.
fn relative(p: &[u8]) -> Box<[u8]> {
    let mut out: Vec<u8> = Vec::with_capacity(p.len() + 2);
    for name in p.split(|&b| b == b'/') {
        match name {
            b"" | b"." => {}
            b".." if !out.is_empty() && out != b".." && !out.ends_with(b"/..") => {
                let cut = out.iter().rposition(|&b| b == b'/').unwrap_or(0);
                out.truncate(cut);
            }
            _ => {
                if !out.is_empty() {
                    out.push(b'/');
                }
                out.extend_from_slice(name);
            }
        }
    }
    if out.is_empty() {
        out.push(b'.');
    }
    out.push(0);
    out.into_boxed_slice()
}

/// `pieces` joined by "/", normalized as [`normalize`] does, and
/// NUL-terminated, in one allocation of about the right size (every open
/// keeps such a path: a 4 KiB buffer, a second one for the normalized
/// copy and a shrinking reallocation were three calls into the allocator).
fn normalized(pieces: &[&[u8]]) -> Box<[u8]> {
    let bound = pieces.iter().map(|p| p.len() + 1).sum::<usize>() + 2;
    let mut out: Vec<u8> = Vec::with_capacity(bound);
    for piece in pieces {
        push_names(&mut out, piece);
    }
    if out.is_empty() {
        out.push(b'/');
    }
    out.push(0);
    debug_assert!(out.len() <= bound);
    out.into_boxed_slice()
}

/// The names of `p` onto normalized absolute path `out` ("." and empty
/// names dropped, ".." taking the last name away, none above "/").
fn push_names(out: &mut Vec<u8>, p: &[u8]) {
    for name in p.split(|&b| b == b'/') {
        match name {
            b"" | b"." => {}
            b".." => {
                let cut = out.iter().rposition(|&b| b == b'/').unwrap_or(0);
                out.truncate(cut);
            }
            _ => {
                out.push(b'/');
                out.extend_from_slice(name);
            }
        }
    }
}

/// Absolute path `p` with "." and empty names dropped and each ".."
/// taking the name before it away (none above "/"). Right for the paths
/// kept of served descriptors: their start (a mount, the current
/// directory, a directory descriptor's kept path) has no symlink in it,
/// and a walk in the pool follows none but a last name it hands to the
/// kernel; so a kept path stays good once a directory named on the way
/// is gone (a placeholder opened as `d/sub/..` is materialized by `d`'s
/// path after `sub` was removed, as `rm -rf` does).
pub fn normalize(p: &[u8]) -> Vec<u8> {
    let mut out: Vec<u8> = Vec::with_capacity(p.len() + 1);
    push_names(&mut out, p);
    if out.is_empty() {
        out.push(b'/');
    }
    out
}

/// A buffer for the current directory of a relative path, left
/// uninitialized: most calls never fill it (an absolute path, or a
/// current directory known by its inode), and zeroing 4 KiB at every
/// served open and stat was 5 % of a 100-thread webserver's samples.
pub struct CwdBuf(MaybeUninit<[u8; libc::PATH_MAX as usize]>);

impl CwdBuf {
    #[inline]
    pub fn new() -> CwdBuf {
        CwdBuf(MaybeUninit::uninit())
    }
}

impl Default for CwdBuf {
    fn default() -> CwdBuf {
        CwdBuf::new()
    }
}

/// The path as bytes (None for a null pointer).
///
/// # Safety
/// `p` is null or a NUL-terminated string.
pub unsafe fn bytes<'a>(p: *const c_char) -> Option<&'a [u8]> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller's promise.
    Some(unsafe { CStr::from_ptr(p) }.to_bytes())
}

/// Where `path` (relative to `dirfd`) lies, if on a served mount that
/// admits this process.
pub fn locate<'a>(dirfd: c_int, path: &'a [u8], cwd: &'a mut CwdBuf) -> Option<Target<'a>> {
    locate_any(dirfd, path, cwd).filter(|t| t.mount.admits_caller())
}

fn locate_any<'a>(dirfd: c_int, path: &'a [u8], cwd: &'a mut CwdBuf) -> Option<Target<'a>> {
    if path.is_empty() || path.len() >= libc::PATH_MAX as usize || mounts::all().is_empty() {
        return None;
    }
    if path[0] == b'/' {
        let (_, mount, rest) = mounts::locate_abs(path)?;
        return Some(Target {
            mount,
            start: ROOT_INO,
            from_cwd: None,
            parts: [rest, b""],
        });
    }
    if dirfd == libc::AT_FDCWD {
        // From the current directory's inode, as the kernel walks; its
        // path only when the copy is not known (cwd.rs).
        let generation = cwd::generation();
        match cwd::current() {
            Cwd::Off => return None,
            Cwd::At { mount, ino } => {
                return Some(Target {
                    mount: mounts::by_index(mount)?,
                    start: ino,
                    from_cwd: Some(generation),
                    parts: [b"", path],
                });
            }
            Cwd::Unknown => {}
        }
        let (_, mount, rest) = mounts::locate_abs(getcwd(cwd)?)?;
        return Some(Target {
            mount,
            start: ROOT_INO,
            from_cwd: None,
            parts: [rest, path],
        });
    }
    let (_, ofd) = table::local(dirfd)?;
    if !ofd.is_dir() {
        return None;
    }
    let mount = mounts::by_index(ofd.mount.load(std::sync::atomic::Ordering::Relaxed) as usize)?;
    if mount.has_submounts {
        return None;
    }
    Some(Target {
        mount,
        start: ofd.ino.load(std::sync::atomic::Ordering::Relaxed),
        from_cwd: None,
        parts: [b"", path],
    })
}

/// The kernel's path of the current directory, in `buf`.
fn getcwd(buf: &mut CwdBuf) -> Option<&[u8]> {
    let len = std::mem::size_of_val(&buf.0);
    let start: *mut u8 = buf.0.as_mut_ptr().cast();
    // SAFETY: the buffer is ours and its length is given.
    let p = unsafe { real::getcwd(start.cast(), len) };
    if p.is_null() {
        return None;
    }
    // SAFETY: getcwd succeeded: the buffer holds a NUL-terminated string
    // (shorter than `len`), whose bytes it wrote.
    Some(unsafe { CStr::from_ptr(start.cast::<c_char>()) }.to_bytes())
}

/// The components of `t`'s path, "." dropped: `None` past [`MAX_PARTS`].
fn components<'a>(t: &Target<'a>, names: &mut [&'a [u8]; MAX_PARTS]) -> Option<usize> {
    let mut n = 0;
    for part in t.parts {
        for c in part.split(|&b| b == b'/') {
            if c.is_empty() || c == b"." {
                continue;
            }
            *names.get_mut(n)? = c;
            n += 1;
        }
    }
    Some(n)
}

/// Whether `t`'s path ends with a slash (or "/."): it names a directory.
fn dir_only(t: &Target<'_>) -> bool {
    let last_part = if t.parts[1].is_empty() {
        t.parts[0]
    } else {
        t.parts[1]
    };
    last_part.ends_with(b"/") || last_part.ends_with(b"/.")
}

/// What a walk reached last: its kind and, if they were asked for, its
/// attributes.
type Reached = (FileKind, Option<Attr>);

/// Why a walk stopped short of its answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// A name on the way, or the last one, is in no directory the walk
    /// searched (with the caller's search permission, through no
    /// symlink): ENOENT, the kernel's answer too.
    Absent,
    /// Anything else: the kernel answers.
    Kernel,
}

/// A lookup's error as a walk's stop: ENOENT is the name's absence (the
/// lookup checked search permission on the directory first, and the
/// directory is this mount's: see the module's comment).
fn stop(e: inkfs::Error) -> Stop {
    if e.errno() == libc::ENOENT {
        Stop::Absent
    } else {
        Stop::Kernel
    }
}

/// Walk `names` from `t.start`: the kind of the last one (`None` for
/// none: the start itself) and, if `want_attr`, its attributes; or why
/// not: [`Stop::Absent`] for a name no directory on the way holds,
/// [`Stop::Kernel`] for "ask the kernel" (a symlink on the way, or the
/// last one with `follow`, `..` above the mount's root, any other
/// error). `..` above the
/// start is the start's parent in the pool (a directory descriptor's:
/// `openat(fd, "..")`; the current directory's: `stat("..")`). A name on
/// the way is looked up by its directory entry alone: the next step loads
/// it as the directory it searches (its search permission, and ENOTDIR
/// or ENOENT if it is no longer one), so only an answer's own attributes
/// cost a load of the last inode.
fn resolve(
    fs: &Filesystem<MappedPool>,
    cred: &Credentials,
    start: u64,
    names: &[&[u8]],
    follow: bool,
    want_attr: bool,
) -> Result<(u64, Option<Reached>), Stop> {
    let mut stack = [0u64; MAX_PARTS + 1];
    let mut depth = 1;
    stack[0] = start;
    let mut last = None;
    let mut top_is_dir = true;
    let n = names.len();
    for (i, &name) in names.iter().enumerate() {
        if name == b".." {
            if !top_is_dir {
                return Err(Stop::Kernel);
            }
            if depth == 1 {
                // Above the start: its parent in the pool, unless that
                // leaves the mount (the kernel's answer: what is above).
                if stack[0] == ROOT_INO {
                    return Err(Stop::Kernel);
                }
                stack[0] = fs
                    .lookup_entry(cred, stack[0], b"..")
                    .map_err(|_| Stop::Kernel)?
                    .0;
            } else {
                depth -= 1;
            }
            last = None;
            top_is_dir = true;
            continue;
        }
        let (ino, kind, attr) = if want_attr && i + 1 == n {
            let a = fs.lookup(cred, stack[depth - 1], name).map_err(stop)?;
            (a.ino, a.kind, Some(a))
        } else {
            let (ino, kind) = fs
                .lookup_entry(cred, stack[depth - 1], name)
                .map_err(stop)?;
            (ino, kind, None)
        };
        if kind == FileKind::Symlink && (i + 1 < n || follow) {
            return Err(Stop::Kernel);
        }
        top_is_dir = kind == FileKind::Dir;
        stack[depth] = ino;
        depth += 1;
        last = Some((kind, attr));
    }
    Ok((stack[depth - 1], last))
}

/// The inode `t` names, or `None` for "ask the kernel". `follow`: follow a
/// symlink in the last component (here: hand it to the kernel).
pub fn walk(
    fs: &Filesystem<MappedPool>,
    cred: &Credentials,
    t: &Target<'_>,
    follow: bool,
) -> Option<Attr> {
    walk_or_absent(fs, cred, t, follow).ok()
}

/// [`walk`], telling a name no directory holds ([`Stop::Absent`]: ENOENT)
/// from the cases for the kernel.
pub fn walk_or_absent(
    fs: &Filesystem<MappedPool>,
    cred: &Credentials,
    t: &Target<'_>,
    follow: bool,
) -> Result<Attr, Stop> {
    let mut names: [&[u8]; MAX_PARTS] = [b""; MAX_PARTS];
    let n = components(t, &mut names).ok_or(Stop::Kernel)?;
    // "a/" names a directory, and follows a symlink "a".
    let dir_only = dir_only(t);
    let follow = follow || dir_only;
    let (ino, last) = resolve(fs, cred, t.start, &names[..n], follow, true)?;
    let a = match last {
        Some((_, Some(a))) => a,
        _ => fs.getattr(ino).map_err(|_| Stop::Kernel)?,
    };
    if dir_only && a.kind != FileKind::Dir {
        return Err(Stop::Kernel);
    }
    Ok(a)
}

/// Where `t`'s last name is: the directory that holds it and the name,
/// for a call that creates or removes that name. `None` for "ask the
/// kernel": the path names the start or ends in `.` or `..`, a trailing
/// slash (unless `slash_ok`: mkdir and rmdir take one), anything
/// [`walk`] hands to the kernel on the way, a directory the caller may
/// not search, or a parent that is not a directory.
pub fn walk_parent<'a>(
    fs: &Filesystem<MappedPool>,
    cred: &Credentials,
    t: &Target<'a>,
    slash_ok: bool,
) -> Option<(u64, &'a [u8])> {
    let (dir, name) = parent_of(fs, cred, t, slash_ok).ok()?;
    // Search permission on the parent itself (resolve checked the ones
    // above it while looking names up in them).
    fs.access(cred, dir, inkfs::api::MAY_EXEC).ok()?;
    Some((dir, name))
}

/// [`walk_parent`] for a caller that looks the name up in the directory
/// next (`Filesystem::lookup`, which checks the same search permission on
/// the same loaded directory before it looks, and whose refusal the
/// caller hands to the kernel as `walk_parent`'s would be): the parent is
/// not loaded a second time for a check the lookup repeats. Its
/// `ENOENT` therefore also says the caller may search the parent.
/// A directory on the way that is absent is [`Stop::Absent`] (ENOENT, an
/// open's answer with or without O_CREAT).
pub fn walk_parent_to_look_up<'a>(
    fs: &Filesystem<MappedPool>,
    cred: &Credentials,
    t: &Target<'a>,
) -> Result<(u64, &'a [u8]), Stop> {
    parent_of(fs, cred, t, false)
}

/// [`walk_parent`] but the check of the parent's own search permission.
fn parent_of<'a>(
    fs: &Filesystem<MappedPool>,
    cred: &Credentials,
    t: &Target<'a>,
    slash_ok: bool,
) -> Result<(u64, &'a [u8]), Stop> {
    let mut names: [&[u8]; MAX_PARTS] = [b""; MAX_PARTS];
    let n = components(t, &mut names).ok_or(Stop::Kernel)?;
    let (&name, parents) = names[..n].split_last().ok_or(Stop::Kernel)?;
    let raw = if t.parts[1].is_empty() {
        t.parts[0]
    } else {
        t.parts[1]
    };
    // "a/." names `a` itself, as "." does: the kernel's answer (EINVAL,
    // EEXIST...).
    if name == b".." || raw == b"." || raw.ends_with(b"/.") || (!slash_ok && dir_only(t)) {
        return Err(Stop::Kernel);
    }
    let (dir, last) = resolve(fs, cred, t.start, parents, true, false)?;
    if last.is_some_and(|(kind, _)| kind != FileKind::Dir) {
        return Err(Stop::Kernel);
    }
    Ok((dir, name))
}

#[cfg(test)]
mod tests {
    use super::{normalize, normalized, relative};

    #[test]
    fn normalize_takes_dots_out_and_never_climbs_above_the_root() {
        let n = |p: &str| String::from_utf8(normalize(p.as_bytes())).unwrap();
        assert_eq!(n("/mnt/ink/t/a/b/../c/./d//"), "/mnt/ink/t/a/c/d");
        assert_eq!(n("/mnt/ink/t/sub/.."), "/mnt/ink/t");
        assert_eq!(n("/mnt/ink/t/tests/../../libc/src"), "/mnt/ink/libc/src");
        assert_eq!(n("/../.."), "/");
        assert_eq!(n("/"), "/");
        assert_eq!(n("/a/.."), "/");
        assert_eq!(n("/a/..b/.c"), "/a/..b/.c");
    }

    #[test]
    fn a_relative_kept_path_keeps_only_the_dot_dots_above_its_start() {
        let r = |p: &[u8]| relative(p).to_vec();
        assert_eq!(r(b"a/./b//c"), b"a/b/c\0");
        assert_eq!(r(b"a/../b"), b"b\0");
        assert_eq!(r(b"../../a/../b"), b"../../b\0");
        assert_eq!(r(b"a/../../b"), b"../b\0");
        assert_eq!(r(b"a/.."), b".\0");
        assert_eq!(r(b"./"), b".\0");
        assert_eq!(r(b"x../.."), b".\0");
    }

    #[test]
    fn a_kept_path_is_its_pieces_joined_and_normalized() {
        let joined = |pieces: &[&str]| {
            let out = normalized(&pieces.iter().map(|p| p.as_bytes()).collect::<Vec<_>>());
            assert_eq!(out.last(), Some(&0), "NUL-terminated");
            String::from_utf8(out[..out.len() - 1].to_vec()).unwrap()
        };
        assert_eq!(joined(&["/mnt/ink", "d3/f42", ""]), "/mnt/ink/d3/f42");
        assert_eq!(joined(&["/mnt/ink/", "/d3", "f42"]), "/mnt/ink/d3/f42");
        assert_eq!(joined(&["/mnt/ink/t", "", "sub/../x/."]), "/mnt/ink/t/x");
        assert_eq!(joined(&["/mnt/ink", "..", "../.."]), "/");
        assert_eq!(joined(&["/", "", ""]), "/");
        // A name is never glued to the one before it.
        assert_eq!(joined(&["/a", "b", "c"]), "/a/b/c");
    }
}
