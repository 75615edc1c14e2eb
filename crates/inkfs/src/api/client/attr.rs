//! Attribute changes the client makes itself (docs/KERNEL-FREE.md,
//! "Attribute changes by the lease holder" for a file, "Built: attribute
//! changes under a directory lease" for a directory): a file's under its
//! write lease (`Client::setattr_leased`), a directory's own under its
//! directory lease (here). Anything else is the server's, through the
//! ring (`Client::ns` with `Op::Setattr`).

use std::sync::atomic::Ordering::SeqCst;

use super::Client;
use crate::error::Result;
use crate::perm::Credentials;
use crate::types::{Attr, SetAttr};

impl Client {
    /// Change `set` of directory `dir` in the client's engine, if this
    /// client holds `dir`'s lease (`super::super::dirlease::DirLeases::
    /// setattr_local`): None if it does not (ask the server: its setattr
    /// of `dir` would recall the lease from whoever holds it). `set` must
    /// not change the size. The lease stays held: tar's utimens, chown and
    /// chmod of a directory it extracted into no longer end the lease its
    /// creates there were made under.
    pub fn setattr_dir_leased(
        &self,
        cred: &Credentials,
        dir: u64,
        set: &SetAttr,
    ) -> Option<Result<Attr>> {
        if set.size.is_some() || self.shared.dirs.count() == 0 || self.shared.closed.load(SeqCst) {
            return None;
        }
        let r = self.call(|fs| self.shared.dirs.setattr_local(fs, cred, dir, set))?;
        if r.is_ok() {
            self.shared.dirs.attr_made();
        }
        Some(r)
    }

    /// Attribute changes of leased directories made by this client so far.
    pub fn local_dir_setattrs(&self) -> u64 {
        self.shared.dirs.local_setattrs()
    }
}
