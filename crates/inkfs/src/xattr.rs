//! Extended attributes: user.*, trusted.*, security.* (system.* needs ACL
//! support, which inkfs does not have). Each change is one XATTR_SET or
//! XATTR_REMOVE entry in the inode's log.

use crate::error::{errno, Error, Result};
use crate::format::*;
use crate::fs::{live, Fs};
use crate::inode::{read, write};
use crate::log::{EntryBuf, NewPages};
use crate::pmem::Pmem;
use crate::time::now_ns;
use crate::perm::{self, Actor};
use crate::types::XattrFlags;

/// Linux's limit on a value (XATTR_SIZE_MAX).
const XATTR_SIZE_MAX: usize = 65536;

fn check_name(name: &[u8]) -> Result<()> {
    check_name_len(name)?;
    check_namespace(name)
}

/// The syscall's own check (before any permission).
fn check_name_len(name: &[u8]) -> Result<()> {
    if name.is_empty() || name.len() > NAME_MAX {
        return errno(libc::ERANGE);
    }
    // A C string cannot carry NUL; the log's decoder refuses it too.
    if name.contains(&0) {
        return errno(libc::EINVAL);
    }
    Ok(())
}

/// The namespace (resolved by the VFS after the permission checks).
fn check_namespace(name: &[u8]) -> Result<()> {
    match XATTR_PREFIXES.iter().find(|p| name.starts_with(p)) {
        Some(p) if name.len() > p.len() => {
            debug_assert!(xattr_name_valid(name));
            Ok(())
        }
        Some(_) => errno(libc::EINVAL),
        None => errno(libc::EOPNOTSUPP),
    }
}

impl<P: Pmem> Fs<P> {
    pub fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], flags: XattrFlags) -> Result<()> {
        self.setxattr_as(Actor::Engine, ino, name, value, flags)
    }

    /// setxattr for `actor`: a caller passes `perm::xattr_access` (the
    /// namespace's rules, then write permission) under the inode's lock.
    pub(crate) fn setxattr_as(
        &self,
        actor: Actor<'_>,
        ino: u64,
        name: &[u8],
        value: &[u8],
        flags: XattrFlags,
    ) -> Result<()> {
        self.check_writable()?;
        check_name_len(name)?;
        if value.len() > XATTR_SIZE_MAX {
            return errno(libc::E2BIG);
        }
        let inode = self.iget(ino)?;
        let mut st = write(&inode.state);
        live(&st)?;
        // As xattr_permission: immutable and append-only inodes keep their
        // xattrs, before the namespace is looked at.
        crate::flags::deny_if_immutable_or_append(&st)?;
        check_namespace(name)?;
        if let Some(cred) = actor.caller() {
            perm::xattr_access(cred, &self.attr_of(&inode, &st), name, true)?;
        }
        if value.len() > XATTR_VALUE_MAX {
            return errno(libc::ENOSPC); // as ext4 without ea_inode: one block per value
        }
        if name.starts_with(b"user.") && !matches!(inode.kind, FileKind::File | FileKind::Dir) {
            return errno(libc::EPERM);
        }
        let exists = st.xattrs.contains_key(name);
        match flags {
            XattrFlags::Create if exists => return errno(libc::EEXIST),
            XattrFlags::Replace if !exists => return errno(libc::ENODATA),
            _ => {}
        }
        self.log_xattr(&inode, &mut st, true, name, value)
    }

    pub fn getxattr(&self, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        self.getxattr_as(Actor::Engine, ino, name)
    }

    pub(crate) fn getxattr_as(&self, actor: Actor<'_>, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        check_name(name)?;
        let inode = self.iget(ino)?;
        let st = read(&inode.state);
        live(&st)?;
        if let Some(cred) = actor.caller() {
            perm::xattr_access(cred, &self.attr_of(&inode, &st), name, false)?;
        }
        st.xattrs
            .get(name)
            .cloned()
            .ok_or(Error::Errno(libc::ENODATA))
    }

    pub fn listxattr(&self, ino: u64) -> Result<Vec<Vec<u8>>> {
        self.listxattr_as(Actor::Engine, ino)
    }

    /// The names `actor` may see: `trusted.` ones only for root.
    pub(crate) fn listxattr_as(&self, actor: Actor<'_>, ino: u64) -> Result<Vec<Vec<u8>>> {
        let inode = self.iget(ino)?;
        let st = read(&inode.state);
        live(&st)?;
        let shown = |n: &&Vec<u8>| actor.caller().is_none_or(|c| perm::xattr_listed(c, n));
        Ok(st.xattrs.keys().filter(shown).cloned().collect())
    }

    pub fn removexattr(&self, ino: u64, name: &[u8]) -> Result<()> {
        self.removexattr_as(Actor::Engine, ino, name)
    }

    pub(crate) fn removexattr_as(&self, actor: Actor<'_>, ino: u64, name: &[u8]) -> Result<()> {
        self.check_writable()?;
        check_name_len(name)?;
        let inode = self.iget(ino)?;
        let mut st = write(&inode.state);
        live(&st)?;
        crate::flags::deny_if_immutable_or_append(&st)?;
        check_namespace(name)?;
        if let Some(cred) = actor.caller() {
            perm::xattr_access(cred, &self.attr_of(&inode, &st), name, true)?;
        }
        // As setxattr (and Linux): user.* is writable only on files and dirs.
        if name.starts_with(b"user.") && !matches!(inode.kind, FileKind::File | FileKind::Dir) {
            return errno(libc::EPERM);
        }
        if !st.xattrs.contains_key(name) {
            return errno(libc::ENODATA);
        }
        self.log_xattr(&inode, &mut st, false, name, &[])
    }

    pub(crate) fn log_xattr(
        &self,
        inode: &crate::inode::Inode,
        st: &mut crate::inode::InodeState,
        set: bool,
        name: &[u8],
        value: &[u8],
    ) -> Result<()> {
        let now = now_ns();
        let entry = EntryBuf::xattr(set, name, value, now);
        let mut cur = st.log;
        let mut pages = NewPages::default();
        if let Err(e) = self.log_append(inode.ino, &mut cur, &entry, &mut pages) {
            pages.release(&self.blocks);
            return Err(e);
        }
        self.commit_tail(inode.rec_off, &cur, true);
        st.log = cur;
        let parsed = crate::log::parse(entry.as_bytes()).map_err(Error::Corrupt)?;
        let geo = self.geo;
        crate::inode::apply_entry(&self.pm, &geo, st, parsed, &mut |_, _| {})
            .map_err(Error::Corrupt)?;
        self.maybe_compact(inode, st);
        Ok(())
    }
}
