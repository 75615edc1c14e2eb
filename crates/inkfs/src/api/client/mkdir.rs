//! The client's mkdir under a directory lease (docs/KERNEL-FREE.md,
//! "Built: mkdir under a directory lease").
//!
//! A mkdir (`Client::ns` with `ns::Op::Mkdir`) in a directory D whose
//! lease and lane this client holds runs in its own engine: the engine's
//! `make_node`, the one a create runs (a slot of the lane, the new
//! directory's record written FREE with its first log chunk, the DIR_ADD
//! at D's tail, then the lane's journal `{state LIVE, D's tail}`). D's
//! link count is not stored: it is two plus the directories D's entries
//! name, so the DIR_ADD (its kind) is the parent's change too; the new
//! directory's `..` is its record's parent field. Nothing is sent: the
//! server learns of it as of a create, at D's give-back (its settle
//! replays the DIR_ADD) and the lane's (the take-back, or the reaping,
//! finds the slot LIVE and takes the directory's log into its books).
//!
//! **No lease from birth.** The new directory E is not leased to the
//! client: the server's lease table is the authority, and E is in the
//! pool (another client replaying D's log finds it and may send a create
//! in E to the server at once). So the client marks E in its ask table
//! ([`super::ask`]'s `born`): its first namespace request in E through
//! the ring asks for E's lease, and the rest are made here (tar: a
//! directory made, then filled). The server's grant of E walks nothing
//! of D when the kernel does not know E (it cannot: no request named E),
//! so the ask does not recall D.

use std::sync::atomic::Ordering::SeqCst;

use super::Client;
use crate::api::ns;
use crate::perm::Credentials;

impl Client {
    /// Directories made by this client under directory leases so far.
    pub fn local_mkdirs(&self) -> u64 {
        self.shared.dirs.local_mkdirs()
    }

    /// Request `seq`, `op`, made here if it is a mkdir in a directory
    /// whose lease this client holds with a lane (see the module comment);
    /// None: ask the server. A reservation found empty is refilled once,
    /// and a lane with no slot left asks for more once, as for a create.
    pub(super) fn mkdir_under_lease(
        &self,
        cred: &Credentials,
        seq: u64,
        op: &ns::Op,
    ) -> Option<ns::Done> {
        let ns::Op::Mkdir { dir, name, mode } = op else {
            return None;
        };
        if self.shared.dirs.count() == 0 || self.shared.closed.load(SeqCst) {
            return None;
        }
        let r = self.local_with_retries(*dir, || {
            self.call(|fs| self.shared.dirs.mkdir_local(fs, cred, *dir, name, *mode))
        })?;
        if let Ok((a, _)) = &r {
            self.shared.dirs.asks().born(a.ino);
        }
        Some(super::local::answer(seq, r))
    }
}
