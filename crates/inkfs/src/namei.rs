//! Namespace operations: lookup, create (all kinds), link, unlink, rmdir,
//! readdir, readlink (rename is its own module, `rename`).
//!
//! Every operation that changes more than one inode appends its entries to
//! each log past the tail, then commits all new tails (and any inode state
//! change) through the lane's redo journal, so a crash shows the operation
//! entirely or not at all.

use std::sync::{Arc, RwLockWriteGuard};

use crate::dir::{Child, COOKIE_DOT, COOKIE_DOTDOT};
use crate::error::{errno, Error, Result};
use crate::format::*;
use crate::fs::{live, rec, FileHandle, Fs};
use crate::inode::{read, write, Body, Inode, InodeState};
use crate::log::{EntryBuf, LogCursor, NewPages};
use crate::pmem::{write_pod, Pmem};
use crate::time::now_ns;
use crate::perm::{self, Actor};
use crate::types::*;

/// A name in a directory: (directory inode, name).
pub(crate) type NameAt<'a> = (u64, &'a [u8]);

/// What `make_node` creates: its kind, mode (permission bits; type bits
/// are the kind's), device number, symlink target, and the owner the
/// engine's own calls give it (a caller's comes from its credentials).
#[derive(Clone, Copy)]
struct NodeSpec<'a> {
    kind: FileKind,
    mode: u32,
    rdev: u64,
    target: Option<&'a [u8]>,
    owner: (u32, u32),
}

impl NodeSpec<'_> {
    fn new(kind: FileKind, mode: u32, owner: (u32, u32)) -> NodeSpec<'static> {
        NodeSpec {
            kind,
            mode,
            rdev: 0,
            target: None,
            owner,
        }
    }
}

/// Names that can be created or removed.
pub(crate) fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > NAME_MAX {
        return errno(libc::ENAMETOOLONG);
    }
    if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
        return errno(libc::EINVAL);
    }
    Ok(())
}

pub(crate) fn is_dot_or_dotdot(name: &[u8]) -> bool {
    name == b"." || name == b".."
}

/// Write locks on several inodes, always taken in inode-number order.
pub(crate) struct Locked<'a> {
    guards: Vec<(u64, RwLockWriteGuard<'a, InodeState>)>,
}

impl<'a> Locked<'a> {
    pub(crate) fn new(inodes: &[&'a Arc<Inode>]) -> Locked<'a> {
        let mut sorted: Vec<&'a Arc<Inode>> = inodes.to_vec();
        sorted.sort_by_key(|i| i.ino);
        sorted.dedup_by_key(|i| i.ino);
        Locked {
            guards: sorted
                .into_iter()
                .map(|i| (i.ino, write(&i.state)))
                .collect(),
        }
    }
    pub(crate) fn get(&mut self, ino: u64) -> &mut InodeState {
        let (_, g) = self
            .guards
            .iter_mut()
            .find(|(i, _)| *i == ino)
            .expect("inode locked");
        g
    }
}

impl<P: Pmem> Fs<P> {
    pub(crate) fn dir_inode(&self, ino: u64) -> Result<Arc<Inode>> {
        let inode = self.iget(ino)?;
        if inode.kind != FileKind::Dir {
            return errno(libc::ENOTDIR);
        }
        Ok(inode)
    }

    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr> {
        let child = self.lookup_ino(parent, name)?;
        self.getattr(child)
    }

    /// The inode number `name` resolves to in directory `parent`.
    pub fn lookup_ino(&self, parent: u64, name: &[u8]) -> Result<u64> {
        if name.len() > NAME_MAX {
            return errno(libc::ENAMETOOLONG);
        }
        let dir = self.dir_inode(parent)?;
        let st = read(&dir.state);
        live(&st)?;
        Self::child_ino(parent, &st, name)
    }

    /// [`Fs::lookup_ino`] after `check` passed on `parent`'s attributes
    /// (the caller's search permission), with one load of `parent` for
    /// both: a path walk's every step, so the directory's cache lookup
    /// and revalidation are not paid twice. Errors in the order of a
    /// `getattr` + check + `lookup_ino`: gone, `check`'s, ENAMETOOLONG,
    /// ENOTDIR.
    pub fn lookup_ino_checked(
        &self,
        parent: u64,
        name: &[u8],
        check: impl FnOnce(&Attr) -> Result<()>,
    ) -> Result<u64> {
        self.lookup_child_checked(parent, name, check)
            .map(|(ino, _)| ino)
    }

    /// [`Fs::lookup_ino_checked`] with the child's kind as its directory
    /// entry records it: a walk's step through a directory needs no more
    /// of the child (the next step loads it, and checks it is a live
    /// directory), so the child is not loaded and revalidated twice.
    pub fn lookup_child_checked(
        &self,
        parent: u64,
        name: &[u8],
        check: impl FnOnce(&Attr) -> Result<()>,
    ) -> Result<(u64, FileKind)> {
        let dir = self.iget(parent)?;
        let st = read(&dir.state);
        live(&st)?;
        check(&self.attr_of(&dir, &st))?;
        if name.len() > NAME_MAX {
            return errno(libc::ENAMETOOLONG);
        }
        if dir.kind != FileKind::Dir {
            return errno(libc::ENOTDIR);
        }
        Self::child_of(parent, &st, name)
    }

    /// `name`'s inode number in the directory `parent` whose state is `st`.
    fn child_ino(parent: u64, st: &InodeState, name: &[u8]) -> Result<u64> {
        Self::child_of(parent, st, name).map(|(ino, _)| ino)
    }

    /// `name`'s inode number and kind in the directory `parent` whose
    /// state is `st`.
    fn child_of(parent: u64, st: &InodeState, name: &[u8]) -> Result<(u64, FileKind)> {
        if name == b"." {
            return Ok((parent, FileKind::Dir));
        }
        if name == b".." {
            return Ok((st.attr.rdev_or_parent, FileKind::Dir));
        }
        st.dir()
            .and_then(|d| d.get(name))
            .map(|c| (c.ino, c.kind))
            .ok_or(Error::Errno(libc::ENOENT))
    }

    pub fn create(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        uid: u32,
        gid: u32,
    ) -> Result<(Attr, FileHandle)> {
        self.create_as(Actor::Engine, parent, name, mode, (uid, gid))
    }

    /// create for a caller with credentials `cred` (as `api::Filesystem`
    /// makes it): owner, group and mode from them and the directory.
    pub fn create_cred(
        &self,
        cred: &crate::perm::Credentials,
        parent: u64,
        name: &[u8],
        mode: u32,
    ) -> Result<(Attr, FileHandle)> {
        self.create_as(Actor::Caller(cred), parent, name, mode, (0, 0))
    }

    /// create for `actor`: a caller's owner, group and mode come from its
    /// credentials and the directory (`perm::new_inode_owner`), `owner` only
    /// serves the engine's own calls.
    pub(crate) fn create_as(
        &self,
        actor: Actor<'_>,
        parent: u64,
        name: &[u8],
        mode: u32,
        owner: (u32, u32),
    ) -> Result<(Attr, FileHandle)> {
        // Opened inside make_node, before any other thread can see the
        // name (an unlink in between would free the inode under the handle).
        let node = NodeSpec::new(FileKind::File, mode, owner);
        let inode = self.make_node(actor, parent, name, node, true)?;
        let fh = FileHandle::new(inode);
        let st = write(&fh.inode.state);
        let attr = self.attr_of(&fh.inode, &st);
        drop(st);
        Ok((attr, fh))
    }

    pub fn mknod(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u64,
        uid: u32,
        gid: u32,
    ) -> Result<Attr> {
        self.mknod_as(Actor::Engine, parent, name, mode, rdev, (uid, gid))
    }

    pub(crate) fn mknod_as(
        &self,
        actor: Actor<'_>,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u64,
        owner: (u32, u32),
    ) -> Result<Attr> {
        let kind = match mode & libc::S_IFMT {
            0 => FileKind::File,
            libc::S_IFDIR => return errno(libc::EPERM),
            libc::S_IFLNK => return errno(libc::EINVAL),
            t => FileKind::from_mode(t).ok_or(Error::Errno(libc::EINVAL))?,
        };
        let node = NodeSpec {
            rdev,
            ..NodeSpec::new(kind, mode, owner)
        };
        let inode = self.make_node(actor, parent, name, node, false)?;
        let st = read(&inode.state);
        Ok(self.attr_of(&inode, &st))
    }

    pub fn mkdir(&self, parent: u64, name: &[u8], mode: u32, uid: u32, gid: u32) -> Result<Attr> {
        self.mkdir_as(Actor::Engine, parent, name, mode, (uid, gid))
    }

    pub(crate) fn mkdir_as(
        &self,
        actor: Actor<'_>,
        parent: u64,
        name: &[u8],
        mode: u32,
        owner: (u32, u32),
    ) -> Result<Attr> {
        let node = NodeSpec::new(FileKind::Dir, mode, owner);
        let inode = self.make_node(actor, parent, name, node, false)?;
        let st = read(&inode.state);
        Ok(self.attr_of(&inode, &st))
    }

    pub fn symlink(
        &self,
        parent: u64,
        name: &[u8],
        target: &[u8],
        uid: u32,
        gid: u32,
    ) -> Result<Attr> {
        self.symlink_as(Actor::Engine, parent, name, target, (uid, gid))
    }

    pub(crate) fn symlink_as(
        &self,
        actor: Actor<'_>,
        parent: u64,
        name: &[u8],
        target: &[u8],
        owner: (u32, u32),
    ) -> Result<Attr> {
        if target.len() > SYMLINK_MAX {
            return errno(libc::ENAMETOOLONG);
        }
        if target.is_empty() {
            return errno(libc::ENOENT);
        }
        let node = NodeSpec {
            target: Some(target),
            ..NodeSpec::new(FileKind::Symlink, 0o777, owner)
        };
        let inode = self.make_node(actor, parent, name, node, false)?;
        let st = read(&inode.state);
        Ok(self.attr_of(&inode, &st))
    }

    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        let inode = self.iget(ino)?;
        let st = read(&inode.state);
        live(&st)?;
        match &st.body {
            Body::Symlink { target, .. } => Ok(target.clone()),
            _ => errno(libc::EINVAL),
        }
    }

    /// Create an inode of any kind and its name, atomically. For a caller,
    /// may_create (write and search permission on the directory) is checked
    /// under the directory's lock, after EEXIST and the directory's flags as
    /// Linux orders them, and the new inode's owner, group and mode follow
    /// the caller's credentials and the directory.
    fn make_node(
        &self,
        actor: Actor<'_>,
        parent: u64,
        name: &[u8],
        node: NodeSpec<'_>,
        open: bool,
    ) -> Result<Arc<Inode>> {
        self.check_writable()?;
        check_name(name)?;
        let dir = self.dir_inode(parent)?;
        let mut dst = write(&dir.state);
        live(&dst)?;
        if dst.orphan {
            return errno(libc::ENOENT);
        }
        // A client engine creates only in a directory it holds the lease
        // of, with a lane leased to it (lanelease.rs): checked under the
        // directory's lock, which the lease's give-back takes too.
        self.client_may_create(parent, node.kind)?;
        if is_dot_or_dotdot(name) || dst.dir().is_some_and(|d| d.get(name).is_some()) {
            return errno(libc::EEXIST);
        }
        // An immutable directory gains no entry (may_create: after EEXIST).
        crate::flags::deny_if_immutable(&dst)?;
        let NodeSpec {
            kind,
            mode,
            rdev,
            target,
            owner: (uid, gid),
        } = node;
        let (uid, gid, mode) = match actor.caller() {
            None => (uid, gid, mode),
            Some(cred) => {
                let dir_attr = self.attr_of(&dir, &dst);
                perm::may_create(cred, &dir_attr)?;
                let (uid, gid, perm_bits) = perm::new_inode_owner(cred, &dir_attr, kind, mode);
                // A symlink's mode is always 0777 (the umask does not apply).
                let perm_bits = if kind == FileKind::Symlink { 0o777 } else { perm_bits };
                (uid, gid, perm_bits)
            }
        };
        let flags = crate::flags::inherited(dst.flags, kind);
        // The owner's lane stays its own until the slot's table block is
        // there (`_lane_use`); a client's is its leased lane.
        let (lane, slot, _lane_use) = self.new_slot()?;
        debug_assert!(self.is_client() || !self.lane_leased(lane));
        let ino = lane_slot_to_ino(lane, slot, self.geo.lane_count);
        let mut new_pages = NewPages::default();
        let mut target_block = 0;
        let result = self.prepare_node(
            ino,
            lane,
            slot,
            parent,
            kind,
            mode,
            rdev,
            uid,
            gid,
            target,
            flags,
            &mut new_pages,
            &mut target_block,
        );
        let (rec_off, child_cur, generation, attr) = match result {
            Ok(v) => v,
            Err(e) => {
                new_pages.release(&self.blocks);
                if target_block != 0 {
                    self.free_blocks(target_block, 1);
                }
                self.free_new_slot(lane, slot);
                return Err(e);
            }
        };
        let now = attr.ctime_ns;
        let mut dir_cur = dst.log;
        let seq = dst.dir().map_or(0, |d| d.place(name, &self.names));
        if let Err(e) = self.log_append(
            parent,
            &mut dir_cur,
            &EntryBuf::dir(true, ino, seq, now, kind, name),
            &mut new_pages,
        ) {
            new_pages.release(&self.blocks);
            if target_block != 0 {
                self.free_blocks(target_block, 1);
            }
            self.free_new_slot(lane, slot);
            return Err(e);
        }
        let mut st = InodeState::empty(kind, generation, false);
        st.attr = attr;
        st.flags = flags;
        st.log = child_cur;
        if let Some(t) = target {
            st.body = Body::Symlink {
                target: t.to_vec(),
                block: target_block,
            };
        }
        st.log_entries = if target.is_some() { 2 } else { 1 };
        st.open_count = open as u32;
        let inode = Arc::new(Inode {
            ino,
            kind,
            rec_off,
            state: std::sync::RwLock::new(st),
            lease_mark: Default::default(),
        });
        // Cached before the record turns LIVE: a thread holding this inode
        // number from before (a stale lookup of the slot's previous inode)
        // must find this object, not load a second copy from media.
        self.cache.insert(inode.clone());
        // Commit: the child's record (written, state still FREE) turns LIVE
        // together with the parent's new tail (a client: through its
        // leased lane's journal).
        self.commit_journal_of_slot(lane, &[
            rec(rec_off, INODE_STATE_FIELD, INODE_LIVE),
            rec(dir.rec_off, INODE_TAIL_FIELD, dir_cur.tail),
        ]);
        self.client_created(parent, ino);
        dst.log = dir_cur;
        dst.log_entries += 1;
        dst.attr.mtime_ns = now;
        dst.attr.ctime_ns = now;
        if let Some(d) = dst.dir_mut() {
            let at = d.add(name, Child { ino, kind, seq });
            debug_assert_eq!(at, seq, "a new name's position was free");
        }
        drop(dst);
        let mut dst = write(&dir.state);
        self.maybe_compact(&dir, &mut dst);
        Ok(inode)
    }

    /// Write a new inode's first log page and its record (state FREE, with
    /// its inherited `flags`: they become the inode's when the state turns
    /// LIVE, in the creating journal transaction).
    #[allow(clippy::too_many_arguments)]
    fn prepare_node(
        &self,
        ino: u64,
        lane: u32,
        slot: u64,
        parent: u64,
        kind: FileKind,
        mode: u32,
        rdev: u64,
        uid: u32,
        gid: u32,
        target: Option<&[u8]>,
        flags: u32,
        new_pages: &mut NewPages,
        target_block: &mut u64,
    ) -> Result<(u64, LogCursor, u64, AttrEntry)> {
        let rec_off = self
            .tables
            .ensure_slot(&self.pm, &self.blocks, lane, slot)
            .map_err(|e| self.corruption(ErrorReason::InodeTable, Some(ino), e))?;
        let old: InodeRecord = crate::pmem::read_pod(&self.pm, rec_off);
        if old.state != INODE_FREE {
            return Err(self.corruption(
                ErrorReason::Namespace,
                Some(ino),
                Error::Corrupt(format!("inode slot {ino} handed out while in use")),
            ));
        }
        // Any value is valid on media: the count wraps rather than overflows.
        let generation = old.generation.wrapping_add(1);
        let now = now_ns();
        let attr = AttrEntry {
            hdr: EntryHeader::default_zero(),
            mode: kind.mode_bits() | (mode & 0o7777),
            uid,
            gid,
            nlink: if kind == FileKind::Dir { 2 } else { 1 },
            size: 0,
            atime_ns: now,
            mtime_ns: now,
            ctime_ns: now,
            rdev_or_parent: if kind == FileKind::Dir { parent } else { rdev },
        };
        let mut cur = LogCursor::default();
        self.log_append(ino, &mut cur, &EntryBuf::attr(false, attr), new_pages)?;
        if let Some(t) = target {
            let (block, _) = self
                .blocks
                .alloc(lane, 1)
                .ok_or(Error::Errno(libc::ENOSPC))?;
            *target_block = block;
            self.pm.write(block * BLOCK_SIZE, t);
            self.pm.flush(block * BLOCK_SIZE, t.len() as u64);
            self.log_append(
                ino,
                &mut cur,
                &EntryBuf::symlink(block, t.len() as u32),
                new_pages,
            )?;
        }
        let record = InodeRecord {
            state: INODE_FREE,
            log_head: cur.head,
            log_tail: cur.tail,
            generation,
            ino,
            kind: kind as u32,
            reserved0: 0,
            flags: flags as u64,
            log_gen: 0,
            reserved: [0; 64],
        };
        write_pod(&self.pm, rec_off, &record);
        self.pm.flush(rec_off, INODE_RECORD_SIZE);
        Ok((rec_off, cur, generation, attr))
    }

    /// A whiteout for RENAME_WHITEOUT: a character device 0/0 with mode 0
    /// (what Linux's vfs_whiteout and ext4/shmem create), its record and
    /// first log page written, its state still FREE. Its log page is in
    /// `pages`; on a later failure the caller releases them and frees the
    /// slot.
    pub(crate) fn prepare_whiteout(
        &self,
        parent: u64,
        (uid, gid): (u32, u32),
        flags: u32,
        pages: &mut NewPages,
    ) -> Result<NewNode> {
        let (lane, slot, _lane_use) = self.new_slot()?;
        let ino = lane_slot_to_ino(lane, slot, self.geo.lane_count);
        let mut no_block = 0;
        match self.prepare_node(
            ino,
            lane,
            slot,
            parent,
            FileKind::CharDev,
            0,
            0,
            uid,
            gid,
            None,
            flags,
            pages,
            &mut no_block,
        ) {
            Ok((rec_off, cur, generation, attr)) => Ok(NewNode {
                ino,
                lane,
                slot,
                rec_off,
                cur,
                generation,
                attr,
                flags,
            }),
            Err(e) => {
                let _ = self.slots.free(lane, slot);
                Err(e)
            }
        }
    }

    pub fn link(&self, ino: u64, newparent: u64, newname: &[u8]) -> Result<Attr> {
        self.link_as(Actor::Engine, ino, newparent, newname)
    }

    /// link for `actor`: a caller needs may_create on the directory,
    /// checked under its lock.
    pub(crate) fn link_as(
        &self,
        actor: Actor<'_>,
        ino: u64,
        newparent: u64,
        newname: &[u8],
    ) -> Result<Attr> {
        self.check_writable()?;
        // Links and renames stay the server's (docs/KERNEL-FREE.md,
        // "Removals": "Still the server's").
        self.deny_client()?;
        check_name(newname)?;
        let inode = self.iget(ino)?;
        let dir = self.dir_inode(newparent)?;
        let mut locked = Locked::new(&[&inode, &dir]);
        {
            let d = locked.get(dir.ino);
            live(d)?;
            if d.orphan {
                return errno(libc::ENOENT);
            }
            if is_dot_or_dotdot(newname) || d.dir().is_some_and(|x| x.get(newname).is_some()) {
                return errno(libc::EEXIST);
            }
        }
        if let Some(cred) = actor.caller() {
            // do_linkat: may_linkat (protected hard links) before the
            // directory's may_create.
            perm::may_link(cred, &self.attr_of(&inode, locked.get(ino)))?;
        }
        {
            let d = locked.get(dir.ino);
            crate::flags::deny_if_immutable(d)?;
            if let Some(cred) = actor.caller() {
                perm::may_create(cred, &self.attr_of(&dir, d))?;
            }
        }
        // As vfs_link: no link to an append-only or immutable inode, after
        // the directory's checks and before refusing directories.
        crate::flags::deny_if_immutable_or_append(locked.get(ino))?;
        // After EEXIST, as Linux (vfs_link refuses directories last).
        if inode.kind == FileKind::Dir {
            return errno(libc::EPERM);
        }
        let now = now_ns();
        let mut pages = NewPages::default();
        let mut a = {
            let st = locked.get(ino);
            live(st)?;
            if st.orphan || st.attr.nlink == 0 {
                return errno(libc::ENOENT);
            }
            if st.attr.nlink >= LINK_MAX {
                return errno(libc::EMLINK);
            }
            st.attr
        };
        a.nlink += 1;
        a.ctime_ns = now;
        let mut icur = locked.get(ino).log;
        let mut dcur = locked.get(dir.ino).log;
        let seq = locked
            .get(dir.ino)
            .dir()
            .map_or(0, |d| d.place(newname, &self.names));
        let r = self
            .log_append(ino, &mut icur, &EntryBuf::attr(true, a), &mut pages)
            .and_then(|_| {
                self.log_append(
                    dir.ino,
                    &mut dcur,
                    &EntryBuf::dir(true, ino, seq, now, inode.kind, newname),
                    &mut pages,
                )
            });
        if let Err(e) = r {
            pages.release(&self.blocks);
            return Err(e);
        }
        self.commit_journal(&[
            rec(inode.rec_off, INODE_TAIL_FIELD, icur.tail),
            rec(dir.rec_off, INODE_TAIL_FIELD, dcur.tail),
        ]);
        let st = locked.get(ino);
        st.log = icur;
        st.log_entries += 1;
        st.attr = a;
        let d = locked.get(dir.ino);
        d.log = dcur;
        d.log_entries += 1;
        d.attr.mtime_ns = now;
        d.attr.ctime_ns = now;
        if let Some(x) = d.dir_mut() {
            let at = x.add(
                newname,
                Child {
                    ino,
                    kind: inode.kind,
                    seq,
                },
            );
            debug_assert_eq!(at, seq, "a new name's position was free");
        }
        self.maybe_compact(&dir, locked.get(dir.ino));
        let st = locked.get(ino);
        self.maybe_compact(&inode, st);
        Ok(self.attr_of(&inode, st))
    }

    pub fn unlink(&self, parent: u64, name: &[u8]) -> Result<()> {
        self.remove_name(Actor::Engine, parent, name, false)
    }

    /// unlink for a caller with credentials `cred` (may_delete checked).
    pub fn unlink_cred(&self, cred: &crate::perm::Credentials, parent: u64, name: &[u8]) -> Result<()> {
        self.remove_name(Actor::Caller(cred), parent, name, false)
    }

    pub fn rmdir(&self, parent: u64, name: &[u8]) -> Result<()> {
        self.remove_name(Actor::Engine, parent, name, true)
    }

    /// unlink (`want_dir` false) or rmdir for `actor`: a caller needs
    /// may_delete (write and search permission on the directory, and in a
    /// sticky directory ownership of the victim or the directory), checked
    /// under both locks, so the victim checked is the victim removed.
    pub(crate) fn remove_name(
        &self,
        actor: Actor<'_>,
        parent: u64,
        name: &[u8],
        want_dir: bool,
    ) -> Result<()> {
        self.check_writable()?;
        if name.len() > NAME_MAX {
            return errno(libc::ENAMETOOLONG);
        }
        if want_dir && name == b"." {
            return errno(libc::EINVAL);
        }
        if want_dir && name == b".." {
            return errno(libc::ENOTEMPTY);
        }
        // A client removes through `client_unlink` (rmlocal.rs), with the
        // rules of a removal under a directory lease.
        self.deny_client()?;
        self.with_victim(actor, parent, name, want_dir, |dir, child, locked| {
            if want_dir && child.kind != FileKind::Dir {
                return errno(libc::ENOTDIR);
            }
            if !want_dir && child.kind == FileKind::Dir {
                return errno(libc::EISDIR);
            }
            self.remove_locked(dir, child, name, locked).map(|_| ())
        })
    }

    /// `name` in directory `parent` and the inode it names, both locked
    /// and checked against each other, may_delete passed for `actor`
    /// (ENOENT, EACCES, EPERM as unlink(2) orders them): `f` runs under
    /// those locks, so the victim checked is the victim removed.
    pub(crate) fn with_victim<R>(
        &self,
        actor: Actor<'_>,
        parent: u64,
        name: &[u8],
        want_dir: bool,
        f: impl FnOnce(&Arc<Inode>, &Arc<Inode>, &mut Locked<'_>) -> Result<R>,
    ) -> Result<R> {
        let dir = self.dir_inode(parent)?;
        loop {
            let child_ino = self.lookup_ino(parent, name)?;
            if is_dot_or_dotdot(name) {
                return errno(if want_dir { libc::EINVAL } else { libc::EISDIR });
            }
            let child = self.iget(child_ino)?;
            let mut locked = Locked::new(&[&dir, &child]);
            // The name may have moved while nothing was locked: retry.
            if locked
                .get(parent)
                .dir()
                .and_then(|d| d.get(name))
                .map(|c| c.ino)
                != Some(child_ino)
                // A stale object of a freed inode whose number the name now
                // reuses: look up again (else the new inode's record would be
                // freed through the old object's state).
                || locked.get(child_ino).gone
            {
                continue;
            }
            self.may_delete_locked(actor, &dir, &child, &mut locked)?;
            return f(&dir, &child, &mut locked);
        }
    }

    /// may_delete, under the locks of `dir` and `victim`: the directory's
    /// permission (immutable first, as inode_permission checks it; write
    /// and search for a caller), its append-only flag, the sticky rule, the
    /// victim's flags. The kinds are the caller's to check next.
    pub(crate) fn may_delete_locked(
        &self,
        actor: Actor<'_>,
        dir: &Arc<Inode>,
        victim: &Arc<Inode>,
        locked: &mut Locked<'_>,
    ) -> Result<()> {
        crate::flags::deny_if_immutable(locked.get(dir.ino))?;
        let cred = actor.caller();
        if let Some(cred) = cred {
            let dir_attr = self.attr_of(dir, locked.get(dir.ino));
            perm::check_access(cred, &dir_attr, perm::MAY_WRITE | perm::MAY_EXEC)?;
        }
        crate::flags::deny_if_immutable_or_append(locked.get(dir.ino))?;
        if let Some(cred) = cred {
            let dir_attr = self.attr_of(dir, locked.get(dir.ino));
            let victim_attr = self.attr_of(victim, locked.get(victim.ino));
            perm::check_sticky(cred, &dir_attr, &victim_attr)?;
        }
        crate::flags::deny_if_immutable_or_append(locked.get(victim.ino))
    }

    /// Remove `name` (naming `child`) from `dir`, both locked: one journal
    /// transaction (a client's through its leased lane's journal). Some
    /// orphan (number, generation) when a client engine left the victim
    /// ORPHAN because a process holds it (rmlocal.rs): its owner must hear
    /// of it.
    pub(crate) fn remove_locked(
        &self,
        dir: &Arc<Inode>,
        child: &Arc<Inode>,
        name: &[u8],
        locked: &mut Locked<'_>,
    ) -> Result<Option<(u64, u64)>> {
        if child.kind == FileKind::Dir && locked.get(child.ino).dir().is_some_and(|d| !d.is_empty())
        {
            return errno(libc::ENOTEMPTY);
        }
        let now = now_ns();
        let mut pages = NewPages::default();
        let seq = locked
            .get(dir.ino)
            .dir()
            .and_then(|d| d.get(name))
            .map_or(0, |c| c.seq);
        let mut dcur = locked.get(dir.ino).log;
        if let Err(e) = self.log_append(
            dir.ino,
            &mut dcur,
            &EntryBuf::dir(false, child.ino, seq, now, child.kind, name),
            &mut pages,
        ) {
            pages.release(&self.blocks);
            return Err(e);
        }
        let mut records = vec![rec(dir.rec_off, INODE_TAIL_FIELD, dcur.tail)];
        let outcome =
            match self.drop_link(child, locked.get(child.ino), now, &mut pages, &mut records) {
                Ok(o) => o,
                Err(e) => {
                    pages.release(&self.blocks);
                    return Err(e);
                }
            };
        if self.is_client() {
            self.client_commit(&records);
        } else {
            self.commit_journal(&records);
        }
        let d = locked.get(dir.ino);
        d.log = dcur;
        d.log_entries += 1;
        d.attr.mtime_ns = now;
        d.attr.ctime_ns = now;
        if let Some(x) = d.dir_mut() {
            x.remove(name);
        }
        let held = self.finish_drop_link(child, locked.get(child.ino), outcome);
        self.maybe_compact(dir, locked.get(dir.ino));
        self.maybe_compact(child, locked.get(child.ino));
        Ok(held)
    }

    /// Prepare the child's side of losing one name: a LINK_CHANGE entry if
    /// links remain, else its record turns ORPHAN (still open) or FREE.
    pub(crate) fn drop_link(
        &self,
        child: &Inode,
        st: &mut InodeState,
        now: i64,
        pages: &mut NewPages,
        records: &mut Vec<JournalRecord>,
    ) -> Result<DropOutcome> {
        let last = child.kind == FileKind::Dir || st.attr.nlink <= 1;
        if last {
            // Open here, or maybe held by a client (holds.rs): ORPHAN, and
            // freed once nobody has it. A client's removal always (its
            // hold check comes after the commit: rmlocal.rs).
            let state = if st.open_count > 0 || self.clients_may_hold() || self.is_client() {
                INODE_ORPHAN
            } else {
                INODE_FREE
            };
            records.push(rec(child.rec_off, INODE_STATE_FIELD, state));
            return Ok(if state == INODE_ORPHAN {
                DropOutcome::Orphaned
            } else {
                DropOutcome::Freed
            });
        }
        let mut a = st.attr;
        a.nlink -= 1;
        a.ctime_ns = now;
        let mut cur = st.log;
        self.log_append(child.ino, &mut cur, &EntryBuf::attr(true, a), pages)?;
        records.push(rec(child.rec_off, INODE_TAIL_FIELD, cur.tail));
        Ok(DropOutcome::Linked { cur, attr: a })
    }

    /// After the commit: the child's DRAM state, and an orphan freed now
    /// unless held. Some (number, generation) for a client's held orphan
    /// (`Fs::client_orphaned`).
    pub(crate) fn finish_drop_link(
        &self,
        child: &Inode,
        st: &mut InodeState,
        outcome: DropOutcome,
    ) -> Option<(u64, u64)> {
        match outcome {
            DropOutcome::Linked { cur, attr } => {
                st.log = cur;
                st.log_entries += 1;
                st.attr = attr;
            }
            DropOutcome::Orphaned => {
                st.orphan = true;
                st.attr.nlink = 0;
                if self.is_client() {
                    return self.client_orphaned(child, st);
                }
                // ORPHAN only because a client might hold it: the journal
                // committed that state; now (after the fence in
                // `client_holds`) either a client's hold is seen, or the
                // client sees ORPHAN and lets go.
                if st.open_count == 0 && self.may_write() {
                    if self.client_holds(child.ino) {
                        self.keep_held_orphan(child.ino);
                    } else {
                        self.free_inode_now(child, st);
                    }
                }
            }
            DropOutcome::Freed => {
                st.attr.nlink = 0;
                self.release_inode_blocks(child, st);
            }
        }
        None
    }

    /// Entries of directory `ino` after `cookie` ("." and ".." first), until
    /// `f` returns false.
    pub fn readdir(
        &self,
        ino: u64,
        cookie: u64,
        f: &mut dyn FnMut(DirEntry) -> bool,
    ) -> Result<()> {
        let dir = self.dir_inode(ino)?;
        let st = read(&dir.state);
        live(&st)?;
        if cookie < COOKIE_DOT
            && !f(DirEntry {
                ino,
                kind: FileKind::Dir,
                name: b".".to_vec(),
                cookie: COOKIE_DOT,
            })
        {
            return Ok(());
        }
        if cookie < COOKIE_DOTDOT
            && !f(DirEntry {
                ino: st.attr.rdev_or_parent,
                kind: FileKind::Dir,
                name: b"..".to_vec(),
                cookie: COOKIE_DOTDOT,
            })
        {
            return Ok(());
        }
        if let Some(d) = st.dir() {
            for (c, name, child) in d.after_cookie(cookie.max(COOKIE_DOTDOT)) {
                if !f(DirEntry {
                    ino: child.ino,
                    kind: child.kind,
                    name: name.to_vec(),
                    cookie: c,
                }) {
                    break;
                }
            }
        }
        Ok(())
    }
}

/// An inode whose record and first log page are written (state FREE), to
/// turn LIVE in the caller's journal transaction.
pub(crate) struct NewNode {
    pub(crate) ino: u64,
    pub(crate) lane: u32,
    pub(crate) slot: u64,
    pub(crate) rec_off: u64,
    pub(crate) cur: LogCursor,
    pub(crate) generation: u64,
    pub(crate) attr: AttrEntry,
    /// Inode flags written in its record (inherited from the directory).
    pub(crate) flags: u32,
}

impl NewNode {
    /// Its DRAM inode, as replaying its one-entry log would build it.
    pub(crate) fn into_inode(self) -> Inode {
        let kind = FileKind::from_mode(self.attr.mode).unwrap_or(FileKind::CharDev);
        let mut st = InodeState::empty(kind, self.generation, false);
        st.attr = self.attr;
        st.log = self.cur;
        st.log_entries = 1;
        st.flags = self.flags;
        Inode {
            ino: self.ino,
            kind,
            rec_off: self.rec_off,
            state: std::sync::RwLock::new(st),
            lease_mark: Default::default(),
        }
    }
}

/// The victim's or unlinked child's fate, decided before the commit and
/// applied to DRAM after it.
pub(crate) enum DropOutcome {
    Linked { cur: LogCursor, attr: AttrEntry },
    Orphaned,
    Freed,
}
