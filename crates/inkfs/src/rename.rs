//! rename(2) and renameat2(2): RENAME_NOREPLACE, RENAME_EXCHANGE and
//! RENAME_WHITEOUT, in one journal transaction over every log the rename
//! touches (the source and target directories, the moved inode, a victim
//! it replaces, a whiteout it leaves), so a crash shows the rename whole
//! or not at all. The shared pieces (locking, the permission checks of a
//! removal, a victim's last link) are namei's.

use std::sync::Arc;

use crate::dir::Child;
use crate::error::{errno, Error, Result};
use crate::format::*;
use crate::fs::{live, rec, Fs};
use crate::inode::{read, Inode, InodeState};
use crate::log::{EntryBuf, LogCursor, NewPages};
use crate::namei::{check_name, is_dot_or_dotdot, DropOutcome, Locked, NameAt, NewNode};
use crate::perm::{self, Actor};
use crate::pmem::Pmem;
use crate::time::now_ns;
use crate::types::*;

/// Entries being prepared for one inode's log.
struct Pending {
    ino: u64,
    rec_off: u64,
    cur: LogCursor,
    entries: u64,
}

impl<P: Pmem> Fs<P> {
    /// rename(2)/renameat2(2). RENAME_WHITEOUT creates an inode, which
    /// needs an owner: it is EINVAL here, use [`Fs::rename_as`].
    pub fn rename(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: RenameFlags,
    ) -> Result<()> {
        if flags.whiteout {
            return errno(libc::EINVAL);
        }
        self.rename_as(parent, name, newparent, newname, flags, 0, 0)
    }

    /// renameat2(2) by a caller whose file-system uid and gid are `uid` and
    /// `gid`: they own the whiteout RENAME_WHITEOUT leaves at the old name
    /// (as Linux creates it with the caller's credentials; the front end
    /// applies a set-group-ID directory's group). The whiteout, a character
    /// device 0/0 with mode 0, is created in the rename's own journal
    /// transaction: a crash shows the rename not done, or done with the
    /// whiteout in place.
    #[allow(clippy::too_many_arguments)]
    pub fn rename_as(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: RenameFlags,
        uid: u32,
        gid: u32,
    ) -> Result<()> {
        let (from, to) = ((parent, name), (newparent, newname));
        self.rename_for(Actor::Engine, from, to, flags, (uid, gid))
    }

    /// renameat2 for `actor`: a caller needs may_delete on the source,
    /// may_create or may_delete on the target, and write permission on a
    /// directory that changes parent, all checked under the rename's locks;
    /// its whiteout takes the caller's owner and the directory's group rules
    /// (`owner` serves the engine's own calls).
    pub(crate) fn rename_for(
        &self,
        actor: Actor<'_>,
        (parent, name): NameAt<'_>,
        (newparent, newname): NameAt<'_>,
        flags: RenameFlags,
        owner: (u32, u32),
    ) -> Result<()> {
        self.check_writable()?;
        self.deny_client()?;
        // As renameat2(2) checks its flags, before any lookup.
        if flags.exchange && (flags.noreplace || flags.whiteout) {
            return errno(libc::EINVAL);
        }
        check_name(name)?;
        check_name(newname)?;
        if is_dot_or_dotdot(name) || is_dot_or_dotdot(newname) {
            return errno(libc::EINVAL);
        }
        let sp = self.dir_inode(parent)?;
        let dp = self.dir_inode(newparent)?;
        loop {
            let m_ino = self.lookup_ino(parent, name)?;
            let v_ino = match self.lookup_ino(newparent, newname) {
                Ok(i) => Some(i),
                Err(Error::Errno(libc::ENOENT)) => None,
                Err(e) => return Err(e),
            };
            // As Linux: the flags are checked against the target before the
            // ancestry checks (EINVAL) below.
            if flags.noreplace && v_ino.is_some() {
                return errno(libc::EEXIST);
            }
            if flags.exchange && v_ino.is_none() {
                return errno(libc::ENOENT);
            }
            let m = self.iget(m_ino)?;
            let v = v_ino.map(|i| self.iget(i)).transpose()?;
            let moves_dir_across = (m.kind == FileKind::Dir
                || v.as_ref().is_some_and(|v| v.kind == FileKind::Dir))
                && parent != newparent;
            let _rename_guard = moves_dir_across.then(|| crate::inode::lock(&self.rename_lock));
            let mut all: Vec<&Arc<Inode>> = vec![&sp, &dp, &m];
            if let Some(v) = &v {
                all.push(v);
            }
            // Objects of freed inodes whose numbers were reused: retry.
            let stale =
                |l: &mut Locked<'_>| l.get(m_ino).gone || v_ino.is_some_and(|v| l.get(v).gone);
            let mut locked = Locked::new(&all);
            let still_m = locked
                .get(parent)
                .dir()
                .and_then(|d| d.get(name))
                .map(|c| c.ino);
            let still_v = locked
                .get(newparent)
                .dir()
                .and_then(|d| d.get(newname))
                .map(|c| c.ino);
            if still_m != Some(m_ino) || still_v != v_ino || stale(&mut locked) {
                continue;
            }
            if moves_dir_across {
                // Checked under the rename lock, so no other directory move
                // can change the ancestry meanwhile.
                drop(locked);
                if m.kind == FileKind::Dir && self.is_ancestor(m_ino, newparent)? {
                    return errno(libc::EINVAL);
                }
                // The target is an ancestor of the source: Linux answers
                // before looking at kinds (so a file onto its own
                // grandparent is ENOTEMPTY, not EISDIR).
                if v.as_ref().is_some_and(|v| v.kind == FileKind::Dir)
                    && self.is_ancestor(v.as_ref().map_or(0, |v| v.ino), parent)?
                {
                    return errno(if flags.exchange {
                        libc::EINVAL
                    } else {
                        libc::ENOTEMPTY
                    });
                }
                locked = Locked::new(&all);
                let still_m = locked
                    .get(parent)
                    .dir()
                    .and_then(|d| d.get(name))
                    .map(|c| c.ino);
                let still_v = locked
                    .get(newparent)
                    .dir()
                    .and_then(|d| d.get(newname))
                    .map(|c| c.ino);
                if still_m != Some(m_ino) || still_v != v_ino || stale(&mut locked) {
                    continue;
                }
            }
            return self.rename_locked(
                actor,
                &sp,
                name,
                &dp,
                newname,
                &m,
                v.as_ref(),
                flags,
                owner,
                &mut locked,
            );
        }
    }

    /// True if directory `anc` is `dir` or one of its ancestors.
    fn is_ancestor(&self, anc: u64, dir: u64) -> Result<bool> {
        let mut cur = dir;
        for _ in 0..=self.slots.used_count() + 1 {
            if cur == anc {
                return Ok(true);
            }
            if cur == ROOT_INO {
                return Ok(false);
            }
            let inode = self.iget(cur)?;
            cur = read(&inode.state).attr.rdev_or_parent;
        }
        Err(self.corruption(
            ErrorReason::Namespace,
            Some(dir),
            Error::Corrupt(format!(
                "directory parent chain from {dir} does not reach the root"
            )),
        ))
    }

    #[allow(clippy::too_many_arguments)]
    fn rename_locked(
        &self,
        actor: Actor<'_>,
        sp: &Arc<Inode>,
        name: &[u8],
        dp: &Arc<Inode>,
        newname: &[u8],
        m: &Arc<Inode>,
        v: Option<&Arc<Inode>>,
        flags: RenameFlags,
        owner: (u32, u32),
        locked: &mut Locked<'_>,
    ) -> Result<()> {
        for ino in [sp.ino, dp.ino] {
            let st = locked.get(ino);
            live(st)?;
            if st.orphan {
                return errno(libc::ENOENT);
            }
        }
        if m.ino == ROOT_INO {
            return errno(libc::EBUSY);
        }
        if let Some(v) = v {
            // NOREPLACE fails on any existing target, even another name of
            // the same inode (as Linux: checked before the same-inode case).
            if flags.noreplace {
                return errno(libc::EEXIST);
            }
            if v.ino == m.ino {
                return Ok(()); // two names of one inode: POSIX says do nothing
            }
        } else if flags.exchange {
            return errno(libc::ENOENT);
        }
        // As vfs_rename: may_delete of the source, then may_create or
        // may_delete of the target, each checking permission and flags
        // before kinds; then, for a directory that changes parent (its ".."
        // changes), write permission on it; emptiness last.
        self.may_delete_locked(actor, sp, m, locked)?;
        match v {
            None => {
                crate::flags::deny_if_immutable(locked.get(dp.ino))?;
                if let Some(cred) = actor.caller() {
                    perm::may_create(cred, &self.attr_of(dp, locked.get(dp.ino)))?;
                }
            }
            Some(v) => self.may_delete_locked(actor, dp, v, locked)?,
        }
        if let Some(v) = v {
            if !flags.exchange {
                match (m.kind == FileKind::Dir, v.kind == FileKind::Dir) {
                    (true, false) => return errno(libc::ENOTDIR),
                    (false, true) => return errno(libc::EISDIR),
                    _ => {}
                }
            }
        }
        if let (Some(cred), true) = (actor.caller(), sp.ino != dp.ino) {
            let flipped = std::iter::once(m).chain(v.filter(|_| flags.exchange));
            for dir in flipped.filter(|i| i.kind == FileKind::Dir) {
                perm::check_access(cred, &self.attr_of(dir, locked.get(dir.ino)), perm::MAY_WRITE)?;
            }
        }
        if let Some(v) = v {
            if !flags.exchange
                && v.kind == FileKind::Dir
                && locked.get(v.ino).dir().is_some_and(|d| !d.is_empty())
            {
                return errno(libc::ENOTEMPTY);
            }
        }
        let now = now_ns();
        let pos = Positions {
            src: locked
                .get(sp.ino)
                .dir()
                .and_then(|d| d.get(name))
                .map_or(0, |c| c.seq),
            dst: locked
                .get(dp.ino)
                .dir()
                .map_or(0, |d| d.place(newname, &self.names)),
        };
        let mut pages = NewPages::default();
        let mut records = Vec::new();
        // The whiteout's record and first log page are written (state FREE)
        // before the journal makes it LIVE with the directories' new tails.
        let owner = match actor.caller() {
            Some(cred) => {
                let dir_attr = self.attr_of(sp, locked.get(sp.ino));
                let (uid, gid, _) = perm::new_inode_owner(cred, &dir_attr, FileKind::CharDev, 0);
                (uid, gid)
            }
            None => owner,
        };
        let whiteout = if flags.whiteout {
            let inherited = crate::flags::inherited(locked.get(sp.ino).flags, FileKind::CharDev);
            match self.prepare_whiteout(sp.ino, owner, inherited, &mut pages) {
                Ok(w) => Some(w),
                Err(e) => {
                    pages.release(&self.blocks);
                    return Err(e);
                }
            }
        } else {
            None
        };
        let r = self.rename_entries(
            sp,
            name,
            dp,
            newname,
            m,
            v,
            flags,
            whiteout.as_ref(),
            pos,
            now,
            locked,
            &mut pages,
            &mut records,
        );
        let (pending, outcome) = match r {
            Ok(x) => x,
            Err(e) => {
                pages.release(&self.blocks);
                if let Some(w) = whiteout {
                    let _ = self.slots.free(w.lane, w.slot);
                }
                return Err(e);
            }
        };
        // Cached before the record turns LIVE (see make_node).
        let wh_child = whiteout.map(|w| {
            let ino = w.ino;
            self.cache.insert(Arc::new(w.into_inode()));
            ino
        });
        self.commit_journal(&records);
        // DRAM follows the committed media state.
        for p in &pending {
            let st = locked.get(p.ino);
            st.log = p.cur;
            st.log_entries += p.entries;
        }
        self.rename_apply_dram(
            sp, name, dp, newname, m, v, flags, wh_child, pos, now, locked,
        );
        if let (Some(v), Some(o)) = (v, outcome) {
            // Never a client's (it renames nothing): None.
            let held = self.finish_drop_link(v, locked.get(v.ino), o);
            debug_assert!(held.is_none());
        }
        // Every log this rename grew (else renames alone fill the pool).
        for inode in [sp, dp, m].into_iter().chain(v) {
            self.maybe_compact(inode, locked.get(inode.ino));
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn rename_entries(
        &self,
        sp: &Arc<Inode>,
        name: &[u8],
        dp: &Arc<Inode>,
        newname: &[u8],
        m: &Arc<Inode>,
        v: Option<&Arc<Inode>>,
        flags: RenameFlags,
        whiteout: Option<&NewNode>,
        pos: Positions,
        now: i64,
        locked: &mut Locked<'_>,
        pages: &mut NewPages,
        records: &mut Vec<JournalRecord>,
    ) -> Result<(Vec<Pending>, Option<DropOutcome>)> {
        let mut pending: Vec<Pending> = Vec::new();
        // Source directory: the old name goes (or, for exchange, points at
        // v; with a whiteout, at the whiteout), from the same position.
        let src_entry = match (flags.exchange, v, whiteout) {
            (true, Some(v), _) => EntryBuf::dir(true, v.ino, pos.src, now, v.kind, name),
            (false, _, Some(w)) => {
                EntryBuf::dir(true, w.ino, pos.src, now, FileKind::CharDev, name)
            }
            _ => EntryBuf::dir(false, m.ino, pos.src, now, m.kind, name),
        };
        self.append_pending(&mut pending, sp, locked.get(sp.ino), &src_entry, pages)?;

        // Destination directory: the new name points at m.
        let dst_entry = EntryBuf::dir(true, m.ino, pos.dst, now, m.kind, newname);
        self.append_pending(&mut pending, dp, locked.get(dp.ino), &dst_entry, pages)?;

        // The moved inode: ctime, and ".." when a directory changes parent.
        let ma = moved_attr(m, locked.get(m.ino), dp.ino, now);
        self.append_pending(
            &mut pending,
            m,
            locked.get(m.ino),
            &EntryBuf::attr(false, ma),
            pages,
        )?;

        let mut outcome = None;
        if let Some(v) = v {
            if flags.exchange {
                let va = moved_attr(v, locked.get(v.ino), sp.ino, now);
                self.append_pending(
                    &mut pending,
                    v,
                    locked.get(v.ino),
                    &EntryBuf::attr(false, va),
                    pages,
                )?;
            } else {
                let mut vrecords = Vec::new();
                // The victim loses a link: its tail or state joins the records.
                let o = self.drop_link(v, locked.get(v.ino), now, pages, &mut vrecords)?;
                records.extend(vrecords);
                outcome = Some(o);
            }
        }
        for p in &pending {
            records.push(rec(p.rec_off, INODE_TAIL_FIELD, p.cur.tail));
        }
        if let Some(w) = whiteout {
            records.push(rec(w.rec_off, INODE_STATE_FIELD, INODE_LIVE));
        }
        Ok((pending, outcome))
    }

    #[allow(clippy::too_many_arguments)]
    fn rename_apply_dram(
        &self,
        sp: &Arc<Inode>,
        name: &[u8],
        dp: &Arc<Inode>,
        newname: &[u8],
        m: &Arc<Inode>,
        v: Option<&Arc<Inode>>,
        flags: RenameFlags,
        whiteout: Option<u64>,
        pos: Positions,
        now: i64,
        locked: &mut Locked<'_>,
    ) {
        {
            let st = locked.get(sp.ino);
            st.attr.mtime_ns = now;
            st.attr.ctime_ns = now;
            let d = st.dir_mut().expect("directory");
            d.remove(name);
            let replacement = match (flags.exchange, v, whiteout) {
                (true, Some(v), _) => Some((v.ino, v.kind)),
                (false, _, Some(w)) => Some((w, FileKind::CharDev)),
                _ => None,
            };
            if let Some((ino, kind)) = replacement {
                let at = d.add(
                    name,
                    Child {
                        ino,
                        kind,
                        seq: pos.src,
                    },
                );
                debug_assert_eq!(at, pos.src, "exchange keeps the source name's position");
            }
        }
        {
            let st = locked.get(dp.ino);
            st.attr.mtime_ns = now;
            st.attr.ctime_ns = now;
            let d = st.dir_mut().expect("directory");
            d.remove(newname);
            let at = d.add(
                newname,
                Child {
                    ino: m.ino,
                    kind: m.kind,
                    seq: pos.dst,
                },
            );
            debug_assert_eq!(at, pos.dst, "the target name's position was free");
        }
        let st = locked.get(m.ino);
        st.attr = moved_attr(m, st, dp.ino, now);
        if let (true, Some(v)) = (flags.exchange, v) {
            let st = locked.get(v.ino);
            st.attr = moved_attr(v, st, sp.ino, now);
        }
    }

    /// Append `entry` to `inode`'s pending cursor, which starts at its
    /// committed log position the first time the inode is met.
    fn append_pending(
        &self,
        pending: &mut Vec<Pending>,
        inode: &Inode,
        st: &InodeState,
        entry: &EntryBuf,
        pages: &mut NewPages,
    ) -> Result<()> {
        let i = match pending.iter().position(|p| p.ino == inode.ino) {
            Some(i) => i,
            None => {
                pending.push(Pending {
                    ino: inode.ino,
                    rec_off: inode.rec_off,
                    cur: st.log,
                    entries: 0,
                });
                pending.len() - 1
            }
        };
        self.log_append(inode.ino, &mut pending[i].cur, entry, pages)?;
        pending[i].entries += 1;
        Ok(())
    }
}

/// Attributes of an inode moved by rename: new ctime, and for a directory
/// its new parent ("..").
fn moved_attr(inode: &Inode, st: &InodeState, new_parent: u64, now: i64) -> AttrEntry {
    let mut a = st.attr;
    a.ctime_ns = now;
    if inode.kind == FileKind::Dir {
        a.rdev_or_parent = new_parent;
    }
    a
}

/// Readdir positions a rename writes: `src` is the source name's (removed,
/// or for exchange now naming the victim, for a whiteout the whiteout), `dst` the target name's: the
/// victim's when it replaces one (so the name does not move), else a new
/// name's position. A name keeps its position while it exists, so a
/// readdir pass cannot meet it again further on.
#[derive(Clone, Copy)]
struct Positions {
    src: u64,
    dst: u64,
}
