//! A small in-memory reference engine with the same API as `inkfs::Fs`.
//!
//! Not a product: one global mutex, no persistence. The tests mount it
//! through the same FUSE front end as the real engine, so a test that passes
//! on `MemFs` and fails on `inkfs::Fs` points at the engine, and one that
//! fails on both points at the front end.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use inkfs::error::errno;
use inkfs::types::{
    Attr, DirEntry, FallocFlags, FileKind, RenameFlags, SetAttr, StatFs, TimeSet, Whence,
    XattrFlags,
};
use inkfs::Result;

use crate::engine::Engine;

const PAGE: u64 = 4096;
const NAME_MAX: usize = 255;
/// Largest file MemFs accepts (it keeps contents in a Vec).
const SIZE_MAX_BYTES: u64 = 1 << 32;

struct Node {
    attr: Attr,
    data: Vec<u8>,
    /// Allocated 4 KiB pages (for st_blocks and SEEK_DATA/SEEK_HOLE).
    pages: BTreeSet<u64>,
    /// cookie → (name, ino); cookies start at 3 ("." and ".." are 1 and 2).
    entries: BTreeMap<u64, (Vec<u8>, u64)>,
    names: HashMap<Vec<u8>, u64>,
    next_cookie: u64,
    parent: u64,
    target: Vec<u8>,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    open_count: u32,
}

struct State {
    nodes: HashMap<u64, Node>,
    next_ino: u64,
}

pub struct MemFs {
    state: Mutex<State>,
    read_only: bool,
}

pub struct MemHandle {
    ino: u64,
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

fn kind_of(mode: u32) -> Option<FileKind> {
    Some(match mode & libc::S_IFMT {
        libc::S_IFREG => FileKind::File,
        libc::S_IFDIR => FileKind::Dir,
        libc::S_IFLNK => FileKind::Symlink,
        libc::S_IFIFO => FileKind::Fifo,
        libc::S_IFSOCK => FileKind::Socket,
        libc::S_IFCHR => FileKind::CharDev,
        libc::S_IFBLK => FileKind::BlockDev,
        _ => return None,
    })
}

impl Default for MemFs {
    fn default() -> Self {
        MemFs::new(false)
    }
}

impl MemFs {
    pub fn new(read_only: bool) -> MemFs {
        let mut st = State {
            nodes: HashMap::new(),
            next_ino: 2,
        };
        let t = now_ns();
        let root = Node::new(
            Attr {
                ino: 1,
                generation: 1,
                kind: FileKind::Dir,
                mode: libc::S_IFDIR | 0o755,
                nlink: 2,
                uid: 0,
                gid: 0,
                rdev: 0,
                size: 0,
                blocks: 0,
                atime_ns: t,
                mtime_ns: t,
                ctime_ns: t,
            },
            1,
        );
        st.nodes.insert(1, root);
        MemFs {
            state: Mutex::new(st),
            read_only,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves a test double in an unknown
        // state; carrying on with it is fine for its purpose.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn writable(&self) -> Result<()> {
        if self.read_only {
            return errno(libc::EROFS);
        }
        Ok(())
    }
}

impl Node {
    fn new(attr: Attr, parent: u64) -> Node {
        Node {
            attr,
            data: Vec::new(),
            pages: BTreeSet::new(),
            entries: BTreeMap::new(),
            names: HashMap::new(),
            next_cookie: 3,
            parent,
            target: Vec::new(),
            xattrs: BTreeMap::new(),
            open_count: 0,
        }
    }
    fn refresh_blocks(&mut self) {
        self.attr.blocks = self.pages.len() as u64 * (PAGE / 512);
    }
    fn resize(&mut self, size: u64) {
        self.data.resize(size as usize, 0);
        self.attr.size = size;
        let first_gone = size.div_ceil(PAGE);
        self.pages.retain(|&p| p < first_gone);
        self.refresh_blocks();
    }
    fn mark(&mut self, off: u64, len: u64) {
        if len == 0 {
            return;
        }
        for p in off / PAGE..=(off + len - 1) / PAGE {
            self.pages.insert(p);
        }
        self.refresh_blocks();
    }
}

impl State {
    fn node(&self, ino: u64) -> Result<&Node> {
        self.nodes
            .get(&ino)
            .ok_or(inkfs::Error::Errno(libc::ENOENT))
    }
    fn node_mut(&mut self, ino: u64) -> Result<&mut Node> {
        self.nodes
            .get_mut(&ino)
            .ok_or(inkfs::Error::Errno(libc::ENOENT))
    }
    fn dir(&self, ino: u64) -> Result<&Node> {
        let n = self.node(ino)?;
        if n.attr.kind != FileKind::Dir {
            return errno(libc::ENOTDIR);
        }
        Ok(n)
    }
    fn child(&self, parent: u64, name: &[u8]) -> Result<u64> {
        let d = self.dir(parent)?;
        match name {
            b"." => Ok(parent),
            b".." => Ok(d.parent),
            _ => d
                .names
                .get(name)
                .and_then(|c| d.entries.get(c))
                .map(|e| e.1)
                .ok_or(inkfs::Error::Errno(libc::ENOENT)),
        }
    }
    fn add_entry(&mut self, parent: u64, name: &[u8], ino: u64) -> Result<()> {
        let d = self.node_mut(parent)?;
        let c = d.next_cookie;
        d.next_cookie += 1;
        d.entries.insert(c, (name.to_vec(), ino));
        d.names.insert(name.to_vec(), c);
        let t = now_ns();
        d.attr.mtime_ns = t;
        d.attr.ctime_ns = t;
        Ok(())
    }
    fn remove_entry(&mut self, parent: u64, name: &[u8]) -> Result<u64> {
        let d = self.node_mut(parent)?;
        let c = d
            .names
            .remove(name)
            .ok_or(inkfs::Error::Errno(libc::ENOENT))?;
        let (_, ino) = d.entries.remove(&c).ok_or(inkfs::Error::Errno(libc::EIO))?;
        let t = now_ns();
        d.attr.mtime_ns = t;
        d.attr.ctime_ns = t;
        Ok(ino)
    }
    fn maybe_free(&mut self, ino: u64) {
        if let Some(n) = self.nodes.get(&ino) {
            if n.attr.nlink == 0 && n.open_count == 0 {
                self.nodes.remove(&ino);
            }
        }
    }
    fn check_new(&self, parent: u64, name: &[u8]) -> Result<()> {
        if name.is_empty() || name.len() > NAME_MAX {
            return errno(libc::ENAMETOOLONG);
        }
        let d = self.dir(parent)?;
        if d.attr.nlink == 0 {
            return errno(libc::ENOENT);
        }
        if name == b"." || name == b".." || d.names.contains_key(name) {
            return errno(libc::EEXIST);
        }
        Ok(())
    }
    fn new_node(&mut self, parent: u64, name: &[u8], mode: u32, uid: u32, gid: u32) -> Result<u64> {
        self.check_new(parent, name)?;
        let kind = kind_of(mode).ok_or(inkfs::Error::Errno(libc::EINVAL))?;
        let ino = self.next_ino;
        self.next_ino += 1;
        let t = now_ns();
        let attr = Attr {
            ino,
            generation: 1,
            kind,
            mode,
            nlink: if kind == FileKind::Dir { 2 } else { 1 },
            uid,
            gid,
            rdev: 0,
            size: 0,
            blocks: 0,
            atime_ns: t,
            mtime_ns: t,
            ctime_ns: t,
        };
        self.nodes.insert(ino, Node::new(attr, parent));
        self.add_entry(parent, name, ino)?;
        if kind == FileKind::Dir {
            self.node_mut(parent)?.attr.nlink += 1;
        }
        Ok(ino)
    }
    fn is_ancestor(&self, anc: u64, mut ino: u64) -> bool {
        for _ in 0..4096 {
            if ino == anc {
                return true;
            }
            match self.nodes.get(&ino) {
                Some(n) if n.parent != ino => ino = n.parent,
                _ => return false,
            }
        }
        false
    }
}

impl Engine for MemFs {
    type Handle = MemHandle;

    fn handle_ino(&self, fh: &MemHandle) -> u64 {
        fh.ino
    }
    fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr> {
        let st = self.lock();
        let ino = st.child(parent, name)?;
        Ok(st.node(ino)?.attr)
    }
    fn getattr(&self, ino: u64) -> Result<Attr> {
        Ok(self.lock().node(ino)?.attr)
    }
    fn setattr(&self, ino: u64, set: &SetAttr) -> Result<Attr> {
        self.writable()?;
        let mut st = self.lock();
        let n = st.node_mut(ino)?;
        let t = now_ns();
        if let Some(size) = set.size {
            if n.attr.kind == FileKind::Dir {
                return errno(libc::EISDIR);
            }
            if size > SIZE_MAX_BYTES {
                return errno(libc::EFBIG);
            }
            n.resize(size);
            n.attr.mtime_ns = t;
        }
        if let Some(m) = set.mode {
            n.attr.mode = (n.attr.mode & libc::S_IFMT) | (m & 0o7777);
        }
        if let Some(u) = set.uid {
            n.attr.uid = u;
        }
        if let Some(g) = set.gid {
            n.attr.gid = g;
        }
        let ts = |s: TimeSet| match s {
            TimeSet::Now => t,
            TimeSet::At(v) => v,
        };
        if let Some(a) = set.atime {
            n.attr.atime_ns = ts(a);
        }
        if let Some(m) = set.mtime {
            n.attr.mtime_ns = ts(m);
        }
        n.attr.ctime_ns = t;
        Ok(n.attr)
    }
    fn mknod(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u64,
        uid: u32,
        gid: u32,
    ) -> Result<Attr> {
        self.writable()?;
        let mut st = self.lock();
        let ino = st.new_node(parent, name, mode, uid, gid)?;
        let n = st.node_mut(ino)?;
        n.attr.rdev = rdev;
        Ok(n.attr)
    }
    fn create(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        uid: u32,
        gid: u32,
    ) -> Result<(Attr, MemHandle)> {
        self.writable()?;
        let mut st = self.lock();
        let ino = st.new_node(parent, name, libc::S_IFREG | (mode & 0o7777), uid, gid)?;
        let n = st.node_mut(ino)?;
        n.open_count += 1;
        Ok((n.attr, MemHandle { ino }))
    }
    fn mkdir(&self, parent: u64, name: &[u8], mode: u32, uid: u32, gid: u32) -> Result<Attr> {
        self.writable()?;
        let mut st = self.lock();
        let ino = st.new_node(parent, name, libc::S_IFDIR | (mode & 0o7777), uid, gid)?;
        Ok(st.node(ino)?.attr)
    }
    fn symlink(&self, parent: u64, name: &[u8], target: &[u8], uid: u32, gid: u32) -> Result<Attr> {
        self.writable()?;
        let mut st = self.lock();
        let ino = st.new_node(parent, name, libc::S_IFLNK | 0o777, uid, gid)?;
        let n = st.node_mut(ino)?;
        n.target = target.to_vec();
        n.attr.size = target.len() as u64;
        Ok(n.attr)
    }
    fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        let st = self.lock();
        let n = st.node(ino)?;
        if n.attr.kind != FileKind::Symlink {
            return errno(libc::EINVAL);
        }
        Ok(n.target.clone())
    }
    fn link(&self, ino: u64, newparent: u64, newname: &[u8]) -> Result<Attr> {
        self.writable()?;
        let mut st = self.lock();
        if st.node(ino)?.attr.kind == FileKind::Dir {
            return errno(libc::EPERM);
        }
        st.check_new(newparent, newname)?;
        st.add_entry(newparent, newname, ino)?;
        let n = st.node_mut(ino)?;
        n.attr.nlink += 1;
        n.attr.ctime_ns = now_ns();
        Ok(n.attr)
    }
    fn unlink(&self, parent: u64, name: &[u8]) -> Result<()> {
        self.writable()?;
        let mut st = self.lock();
        let ino = st.child(parent, name)?;
        if st.node(ino)?.attr.kind == FileKind::Dir {
            return errno(libc::EISDIR);
        }
        st.remove_entry(parent, name)?;
        let n = st.node_mut(ino)?;
        n.attr.nlink = n.attr.nlink.saturating_sub(1);
        n.attr.ctime_ns = now_ns();
        st.maybe_free(ino);
        Ok(())
    }
    fn rmdir(&self, parent: u64, name: &[u8]) -> Result<()> {
        self.writable()?;
        let mut st = self.lock();
        if name == b"." {
            return errno(libc::EINVAL);
        }
        if name == b".." {
            return errno(libc::ENOTEMPTY);
        }
        let ino = st.child(parent, name)?;
        let d = st.dir(ino)?;
        if !d.entries.is_empty() {
            return errno(libc::ENOTEMPTY);
        }
        st.remove_entry(parent, name)?;
        st.node_mut(ino)?.attr.nlink = 0;
        st.node_mut(parent)?.attr.nlink -= 1;
        st.maybe_free(ino);
        Ok(())
    }
    fn rename(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: RenameFlags,
        uid: u32,
        gid: u32,
    ) -> Result<()> {
        self.writable()?;
        if flags.exchange && (flags.noreplace || flags.whiteout) {
            return errno(libc::EINVAL);
        }
        let mut st = self.lock();
        let src = st.child(parent, name)?;
        if newname.len() > NAME_MAX {
            return errno(libc::ENAMETOOLONG);
        }
        st.dir(newparent)?;
        let dst = st.child(newparent, newname).ok();
        let src_dir = st.node(src)?.attr.kind == FileKind::Dir;
        if src_dir && st.is_ancestor(src, newparent) {
            return errno(libc::EINVAL);
        }
        if flags.exchange {
            let dst = dst.ok_or(inkfs::Error::Errno(libc::ENOENT))?;
            let dst_dir = st.node(dst)?.attr.kind == FileKind::Dir;
            if dst_dir && st.is_ancestor(dst, parent) {
                return errno(libc::EINVAL);
            }
            for (p, n, ino) in [(parent, name, dst), (newparent, newname, src)] {
                let d = st.node_mut(p)?;
                let c = *d.names.get(n).ok_or(inkfs::Error::Errno(libc::EIO))?;
                if let Some(e) = d.entries.get_mut(&c) {
                    e.1 = ino;
                }
            }
            if src_dir != dst_dir && parent != newparent {
                let (a, b) = if src_dir {
                    (newparent, parent)
                } else {
                    (parent, newparent)
                };
                st.node_mut(a)?.attr.nlink += 1;
                st.node_mut(b)?.attr.nlink -= 1;
            }
            st.node_mut(src)?.parent = newparent;
            st.node_mut(dst)?.parent = parent;
            return Ok(());
        }
        if let Some(dst) = dst {
            if flags.noreplace {
                return errno(libc::EEXIST);
            }
            if dst == src {
                return Ok(());
            }
            let dn = st.node(dst)?;
            let dst_dir = dn.attr.kind == FileKind::Dir;
            if dst_dir && !src_dir {
                return errno(libc::EISDIR);
            }
            if !dst_dir && src_dir {
                return errno(libc::ENOTDIR);
            }
            if dst_dir && !dn.entries.is_empty() {
                return errno(libc::ENOTEMPTY);
            }
            st.remove_entry(newparent, newname)?;
            let n = st.node_mut(dst)?;
            if dst_dir {
                n.attr.nlink = 0;
                st.node_mut(newparent)?.attr.nlink -= 1;
            } else {
                n.attr.nlink -= 1;
            }
            st.maybe_free(dst);
        }
        st.remove_entry(parent, name)?;
        st.add_entry(newparent, newname, src)?;
        if src_dir && parent != newparent {
            st.node_mut(parent)?.attr.nlink -= 1;
            st.node_mut(newparent)?.attr.nlink += 1;
        }
        let n = st.node_mut(src)?;
        n.parent = newparent;
        n.attr.ctime_ns = now_ns();
        if flags.whiteout {
            // A character device 0/0, mode 0, at the old name.
            st.new_node(parent, name, libc::S_IFCHR, uid, gid)?;
        }
        Ok(())
    }
    fn readdir(&self, ino: u64, cookie: u64, f: &mut dyn FnMut(DirEntry) -> bool) -> Result<()> {
        let st = self.lock();
        let d = st.dir(ino)?;
        if cookie < 1
            && !f(DirEntry {
                ino,
                kind: FileKind::Dir,
                name: b".".to_vec(),
                cookie: 1,
            })
        {
            return Ok(());
        }
        if cookie < 2
            && !f(DirEntry {
                ino: d.parent,
                kind: FileKind::Dir,
                name: b"..".to_vec(),
                cookie: 2,
            })
        {
            return Ok(());
        }
        for (&c, (name, child)) in d.entries.range(cookie.max(2) + 1..) {
            let kind = st
                .node(*child)
                .map(|n| n.attr.kind)
                .unwrap_or(FileKind::File);
            if !f(DirEntry {
                ino: *child,
                kind,
                name: name.clone(),
                cookie: c,
            }) {
                break;
            }
        }
        Ok(())
    }
    fn open(&self, ino: u64) -> Result<MemHandle> {
        let mut st = self.lock();
        st.node_mut(ino)?.open_count += 1;
        Ok(MemHandle { ino })
    }
    fn release(&self, fh: MemHandle) {
        let mut st = self.lock();
        if let Some(n) = st.nodes.get_mut(&fh.ino) {
            n.open_count = n.open_count.saturating_sub(1);
        }
        st.maybe_free(fh.ino);
    }
    fn read(&self, fh: &MemHandle, off: u64, buf: &mut [u8]) -> Result<usize> {
        let st = self.lock();
        let n = st.node(fh.ino)?;
        if n.attr.kind == FileKind::Dir {
            return errno(libc::EISDIR);
        }
        if off >= n.attr.size {
            return Ok(0);
        }
        let len = buf.len().min((n.attr.size - off) as usize);
        buf[..len].copy_from_slice(&n.data[off as usize..off as usize + len]);
        Ok(len)
    }
    fn write(&self, fh: &MemHandle, off: u64, data: &[u8]) -> Result<usize> {
        self.writable()?;
        let mut st = self.lock();
        let n = st.node_mut(fh.ino)?;
        let end = off
            .checked_add(data.len() as u64)
            .ok_or(inkfs::Error::Errno(libc::EFBIG))?;
        if end > SIZE_MAX_BYTES {
            return errno(libc::EFBIG);
        }
        if end > n.attr.size {
            n.data.resize(end as usize, 0);
            n.attr.size = end;
        }
        n.data[off as usize..end as usize].copy_from_slice(data);
        n.mark(off, data.len() as u64);
        let t = now_ns();
        n.attr.mtime_ns = t;
        n.attr.ctime_ns = t;
        Ok(data.len())
    }
    fn append(&self, fh: &MemHandle, data: &[u8]) -> Result<(u64, usize)> {
        // Not atomic with respect to other appends here (two lock
        // acquisitions); good enough for a test double.
        let off = self.lock().node(fh.ino)?.attr.size;
        Ok((off, self.write(fh, off, data)?))
    }
    fn copy_range(
        &self,
        src: &MemHandle,
        src_off: u64,
        dst: &MemHandle,
        dst_off: u64,
        len: u64,
    ) -> Result<u64> {
        self.writable()?;
        // Not atomic (two lock acquisitions); good enough for a test double.
        let data = {
            let st = self.lock();
            let n = st.node(src.ino)?;
            if n.attr.kind == FileKind::Dir {
                return errno(libc::EISDIR);
            }
            let k = len
                .min(inkfs::file::COPY_MAX)
                .min(n.attr.size.saturating_sub(src_off));
            if k == 0 {
                return Ok(0);
            }
            if src.ino == dst.ino && src_off < dst_off.saturating_add(k) && dst_off < src_off + k {
                return errno(libc::EINVAL);
            }
            n.data[src_off as usize..(src_off + k) as usize].to_vec()
        };
        self.write(dst, dst_off, &data).map(|n| n as u64)
    }
    fn fsync(&self, _fh: &MemHandle, _datasync: bool) -> Result<()> {
        Ok(())
    }
    fn fallocate(&self, fh: &MemHandle, off: u64, len: u64, flags: FallocFlags) -> Result<()> {
        self.writable()?;
        if flags.shifts() {
            // Not in the reference engine: the kernel's FUSE never sends
            // collapse or insert range (fuse_file_fallocate refuses them).
            return errno(libc::EOPNOTSUPP);
        }
        let mut st = self.lock();
        let n = st.node_mut(fh.ino)?;
        let end = off
            .checked_add(len)
            .ok_or(inkfs::Error::Errno(libc::EFBIG))?;
        if end > SIZE_MAX_BYTES {
            return errno(libc::EFBIG);
        }
        if flags.punch_hole || flags.zero_range {
            let stop = end.min(n.attr.size);
            if off < stop {
                n.data[off as usize..stop as usize].fill(0);
            }
        }
        if flags.punch_hole {
            let first_full = off.div_ceil(PAGE);
            let stop_full = end / PAGE;
            n.pages.retain(|&p| p < first_full || p >= stop_full);
            n.refresh_blocks();
        } else {
            n.mark(off, len);
        }
        if !flags.keep_size && end > n.attr.size {
            n.data.resize(end as usize, 0);
            n.attr.size = end;
        }
        Ok(())
    }
    fn seek(&self, fh: &MemHandle, off: u64, whence: Whence) -> Result<u64> {
        let st = self.lock();
        let n = st.node(fh.ino)?;
        if off >= n.attr.size {
            return errno(libc::ENXIO);
        }
        let mut p = off / PAGE;
        loop {
            let pos = (p * PAGE).max(off);
            if pos >= n.attr.size {
                return match whence {
                    Whence::Data => errno(libc::ENXIO),
                    Whence::Hole => Ok(n.attr.size),
                };
            }
            let data = n.pages.contains(&p);
            if data == (whence == Whence::Data) {
                return Ok(pos);
            }
            p += 1;
        }
    }
    fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], flags: XattrFlags) -> Result<()> {
        self.writable()?;
        let mut st = self.lock();
        let n = st.node_mut(ino)?;
        let exists = n.xattrs.contains_key(name);
        match flags {
            XattrFlags::Create if exists => return errno(libc::EEXIST),
            XattrFlags::Replace if !exists => return errno(libc::ENODATA),
            _ => {}
        }
        n.xattrs.insert(name.to_vec(), value.to_vec());
        n.attr.ctime_ns = now_ns();
        Ok(())
    }
    fn getxattr(&self, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        let st = self.lock();
        st.node(ino)?
            .xattrs
            .get(name)
            .cloned()
            .ok_or(inkfs::Error::Errno(libc::ENODATA))
    }
    fn listxattr(&self, ino: u64) -> Result<Vec<Vec<u8>>> {
        Ok(self.lock().node(ino)?.xattrs.keys().cloned().collect())
    }
    fn removexattr(&self, ino: u64, name: &[u8]) -> Result<()> {
        self.writable()?;
        let mut st = self.lock();
        let n = st.node_mut(ino)?;
        n.xattrs
            .remove(name)
            .ok_or(inkfs::Error::Errno(libc::ENODATA))?;
        Ok(())
    }
    fn statfs(&self) -> StatFs {
        let st = self.lock();
        let used: u64 = st.nodes.values().map(|n| n.pages.len() as u64).sum();
        let blocks = 1 << 20;
        StatFs {
            block_size: PAGE as u32,
            blocks,
            blocks_free: blocks.saturating_sub(used),
            files: 1 << 20,
            files_free: (1u64 << 20).saturating_sub(st.nodes.len() as u64),
            name_max: NAME_MAX as u32,
        }
    }
    fn sync(&self) -> Result<()> {
        Ok(())
    }
}
