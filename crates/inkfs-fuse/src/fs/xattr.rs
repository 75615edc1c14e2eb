//! Extended-attribute requests, and the mount without them (`noxattr`,
//! `Caching::no_xattr`).
//!
//! Why a mount would give xattrs up: the kernel asks for
//! `security.capability` (a GETXATTR round trip) before the first write
//! to a file after every attribute reply for it, and at every chown (Linux
//! 6.18: `file_remove_privs` skips the probe only while the inode has
//! S_NOSEC, which FUSE's `fuse_change_attributes_common` clears at every
//! attribute refresh, a create's included; `notify_change` probes for
//! ATTR_KILL_PRIV unconditionally). That is two requests of ten per
//! untarred file, one per file written in filebench. No reply of the
//! server changes either rule; the one lever is ENOSYS, which makes the
//! kernel set `no_getxattr` for the connection and answer every later
//! getxattr itself with EOPNOTSUPP, the probe included (no capability:
//! nothing to kill). The other three are refused the same way so that the
//! mount is consistently one without xattrs (a set that could not be read
//! back would be worse), and the engine's xattrs stay on the pool
//! untouched, for the next mount without the option.
//!
//! Each handler counts its ENOSYS as served (it is the answer), as
//! `open` does under `kernel_open`.

use super::*;

impl InkFuse {
    /// On a `noxattr` mount: count `op` as served (ENOSYS is the answer)
    /// and say so; the caller replies ENOSYS.
    fn xattrs_off(&self, op: Op) -> bool {
        if !self.caching.no_xattr {
            return false;
        }
        self.done(op, clock::now(), true);
        true
    }

    pub(super) fn xattr_set(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        reply: ReplyEmpty,
    ) {
        if self.xattrs_off(Op::setxattr) {
            return reply.error(Errno::ENOSYS);
        }
        let cred = self.cred(req);
        self.answer(Op::setxattr, reply, || {
            let f = api::XattrFlags::from_bits(flags)?;
            self.fs.setxattr(&cred, ino.0, name_bytes(name), value, f)
        });
    }

    pub(super) fn xattr_get(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        size: u32,
        reply: ReplyXattr,
    ) {
        if self.xattrs_off(Op::getxattr) {
            return reply.error(Errno::ENOSYS);
        }
        let cred = self.cred(req);
        self.answer(Op::getxattr, reply, || {
            Ok((self.fs.getxattr(&cred, ino.0, name_bytes(name))?, size))
        });
    }

    pub(super) fn xattr_list(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        if self.xattrs_off(Op::listxattr) {
            return reply.error(Errno::ENOSYS);
        }
        let cred = self.cred(req);
        self.answer(Op::listxattr, reply, || {
            let mut buf = Vec::new();
            for n in self.fs.listxattr(&cred, ino.0)? {
                buf.extend_from_slice(&n);
                buf.push(0);
            }
            Ok((buf, size))
        });
    }

    pub(super) fn xattr_remove(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        reply: ReplyEmpty,
    ) {
        if self.xattrs_off(Op::removexattr) {
            return reply.error(Errno::ENOSYS);
        }
        let cred = self.cred(req);
        self.answer(Op::removexattr, reply, || {
            self.fs.removexattr(&cred, ino.0, name_bytes(name))
        });
    }
}
