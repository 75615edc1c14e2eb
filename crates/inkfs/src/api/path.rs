//! Path resolution for callers that name files by path (the C ABI, the
//! preload library): Linux's path walk, inside one pool. Every directory a
//! name is looked up in must grant search permission; symbolic links are
//! followed (an absolute target from the pool's root), at most
//! [`SYMLINKS_MAX`] per walk; ".." of the root is the root.

use super::{Filesystem, Pmem, ROOT_INO};
use crate::error::{errno, Result};
use crate::format::NAME_MAX;
use crate::perm::{self, Credentials};
use crate::types::{Attr, FileKind};

/// Longest path, terminating NUL included (PATH_MAX).
pub const PATH_MAX: usize = 4096;
/// Symbolic links one walk follows at most (MAXSYMLINKS): ELOOP past it.
pub const SYMLINKS_MAX: u32 = 40;

/// Whether the walk follows a symbolic link in the last component.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Follow {
    /// stat, open without O_NOFOLLOW, chdir...
    Yes,
    /// lstat, readlink, unlink, O_NOFOLLOW...
    No,
}

/// Where a path's last component lives: its directory and its name, and
/// whether the path ended in a slash (so that it must name a directory).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    pub dir: u64,
    pub name: Vec<u8>,
    pub trailing_slash: bool,
}

impl<P: Pmem> Filesystem<P> {
    /// The inode `path` names, walked from directory `at` (an absolute path
    /// starts at the pool's root). A path ending in '/' must name a
    /// directory (ENOTDIR).
    pub fn resolve(
        &self,
        cred: &Credentials,
        at: u64,
        path: &[u8],
        follow: Follow,
    ) -> Result<Attr> {
        let mut budget = SYMLINKS_MAX;
        self.walk(cred, at, path, follow, &mut budget)
    }

    /// The directory that holds, or would hold, `path`'s last component,
    /// and that component (for create, mkdir, unlink, rename, link, ...).
    /// Symbolic links are followed in every component but the last. The
    /// last component is never "." or ".." here: EEXIST-style callers get
    /// them as names and refuse them as the engine does (EINVAL/EEXIST),
    /// and "/" alone resolves to the root's own name, "." in the root.
    pub fn resolve_parent(&self, cred: &Credentials, at: u64, path: &[u8]) -> Result<Resolved> {
        let mut budget = SYMLINKS_MAX;
        self.walk_parent(cred, at, path, &mut budget)
    }

    fn walk(
        &self,
        cred: &Credentials,
        at: u64,
        path: &[u8],
        follow: Follow,
        budget: &mut u32,
    ) -> Result<Attr> {
        let r = self.walk_parent(cred, at, path, budget)?;
        let a = self.lookup(cred, r.dir, &r.name)?;
        let a = if a.kind == FileKind::Symlink && (follow == Follow::Yes || r.trailing_slash) {
            self.follow_link(cred, r.dir, &a, budget)?
        } else {
            a
        };
        if r.trailing_slash && a.kind != FileKind::Dir {
            return errno(libc::ENOTDIR);
        }
        Ok(a)
    }

    fn walk_parent(
        &self,
        cred: &Credentials,
        at: u64,
        path: &[u8],
        budget: &mut u32,
    ) -> Result<Resolved> {
        if path.is_empty() {
            return errno(libc::ENOENT);
        }
        if path.len() >= PATH_MAX {
            return errno(libc::ENAMETOOLONG);
        }
        if path.contains(&0) {
            return errno(libc::EINVAL);
        }
        let mut dir = if path[0] == b'/' { ROOT_INO } else { at };
        let trailing_slash = path.ends_with(b"/");
        let names: Vec<&[u8]> = path
            .split(|&b| b == b'/')
            .filter(|c| !c.is_empty())
            .collect();
        let Some((last, walk)) = names.split_last() else {
            // "/" or "////": the root itself.
            return Ok(Resolved {
                dir: ROOT_INO,
                name: b".".to_vec(),
                trailing_slash: true,
            });
        };
        for name in walk {
            if name.len() > NAME_MAX {
                return errno(libc::ENAMETOOLONG);
            }
            let a = self.lookup(cred, dir, name)?;
            let a = match a.kind {
                FileKind::Symlink => self.follow_link(cred, dir, &a, budget)?,
                _ => a,
            };
            if a.kind != FileKind::Dir {
                return errno(libc::ENOTDIR);
            }
            dir = a.ino;
        }
        if last.len() > NAME_MAX {
            return errno(libc::ENAMETOOLONG);
        }
        // Search permission on the last directory too: the name is looked
        // up there (or created there, which may_create checks again).
        let d = self.getattr(dir)?;
        perm::may_lookup(cred, &d)?;
        Ok(Resolved {
            dir,
            name: last.to_vec(),
            trailing_slash,
        })
    }

    /// What the symbolic link `link` (found in directory `dir`) points at.
    fn follow_link(
        &self,
        cred: &Credentials,
        dir: u64,
        link: &Attr,
        budget: &mut u32,
    ) -> Result<Attr> {
        if *budget == 0 {
            return errno(libc::ELOOP);
        }
        *budget -= 1;
        let target = self.readlink(link.ino)?;
        self.walk(cred, dir, &target, Follow::Yes, budget)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{MountOptions, OpenFlags};
    use crate::pmem::SimPool;
    use crate::types::FormatOptions;

    fn fs() -> Filesystem<SimPool> {
        let pm = SimPool::new(8 << 20);
        Filesystem::format(&pm, &FormatOptions::default()).unwrap();
        Filesystem::mount(pm, MountOptions::default()).unwrap()
    }

    fn eno<T: std::fmt::Debug>(r: Result<T>) -> i32 {
        r.err().map_or(0, |e| e.errno())
    }

    #[test]
    fn walks_follow_links_and_check_search_permission() {
        let fs = fs();
        let root = Credentials::root();
        let a = fs.mkdir(&root, ROOT_INO, b"a", 0o755).unwrap();
        let b = fs.mkdir(&root, a.ino, b"b", 0o700).unwrap();
        let (f, file) = fs
            .create(&root, b.ino, b"f", 0o644, OpenFlags::new(libc::O_WRONLY))
            .unwrap();
        fs.release(file);
        fs.symlink(&root, ROOT_INO, b"abs", b"/a/b").unwrap();
        fs.symlink(&root, a.ino, b"rel", b"b/f").unwrap();
        fs.symlink(&root, ROOT_INO, b"loop", b"loop").unwrap();
        let r = |p: &[u8], follow| fs.resolve(&root, ROOT_INO, p, follow);
        assert_eq!(r(b"/a/b/f", Follow::Yes).unwrap().ino, f.ino);
        assert_eq!(r(b"abs/f", Follow::Yes).unwrap().ino, f.ino);
        assert_eq!(r(b"a/rel", Follow::Yes).unwrap().ino, f.ino);
        assert_eq!(r(b"a/rel", Follow::No).unwrap().kind, FileKind::Symlink);
        assert_eq!(r(b"a/./b/../b//f", Follow::Yes).unwrap().ino, f.ino);
        assert_eq!(r(b"/../../a", Follow::Yes).unwrap().ino, a.ino);
        assert_eq!(eno(r(b"loop", Follow::Yes)), libc::ELOOP);
        assert_eq!(eno(r(b"a/b/f/", Follow::Yes)), libc::ENOTDIR);
        assert_eq!(eno(r(b"a/b/f/x", Follow::Yes)), libc::ENOTDIR);
        assert_eq!(eno(r(b"a/nope", Follow::Yes)), libc::ENOENT);
        assert_eq!(eno(r(b"", Follow::Yes)), libc::ENOENT);
        let long = vec![b'x'; 256];
        assert_eq!(eno(r(&long, Follow::Yes)), libc::ENAMETOOLONG);
        // b is 0700 root's: another user may not search it.
        let user = Credentials::user(1000, 1000);
        assert_eq!(
            eno(fs.resolve(&user, ROOT_INO, b"a/b/f", Follow::Yes)),
            libc::EACCES
        );
        assert_eq!(
            fs.resolve(&user, ROOT_INO, b"a/b", Follow::Yes)
                .unwrap()
                .ino,
            b.ino
        );
        let p = fs.resolve_parent(&root, ROOT_INO, b"/a/b/new/").unwrap();
        assert_eq!(
            (p.dir, &p.name[..], p.trailing_slash),
            (b.ino, &b"new"[..], true)
        );
        assert_eq!(
            fs.resolve(&root, ROOT_INO, b"/", Follow::Yes).unwrap().ino,
            ROOT_INO
        );
    }
}
