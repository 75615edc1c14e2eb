//! The client's removals under a directory lease (docs/KERNEL-FREE.md,
//! "Built: client-local removals on the wire"; the engine's side:
//! crates/inkfs/src/rmlocal.rs).
//!
//! An unlink (`Client::ns` with `ns::Op::Unlink`) in a directory whose
//! lease and lane this client holds, of a regular file whose write lease
//! it holds, runs in its own engine (`Fs::client_unlink`), when its
//! server said `removes=1`. What the engine refuses (`NotLocal`) goes to
//! the server as before, with its give-back of the file's lease.
//!
//! What the server hears, in one write on the session, after the removal:
//! `slot INO` for an older file it freed (the server frees its blocks and
//! slot), or `orphan INO GEN` for a file another process holds open (the
//! server frees it at the last hold), each after the blocks this client
//! freed so far (`return` lines). Either message also ends the client's
//! file lease of INO on the server (it was held: rule 3), without a
//! settle. The removal of a file created under the lease sends nothing:
//! its blocks (its reservation's) wait in the engine's freed list for a
//! full batch (`Fs::client_freed_due`, as a write's freed blocks do) or
//! the next message that takes them (a give-back of a file's or the
//! directory's lease, a detach); a dead client's reaping returns them
//! with the reservation's rest. A message per removal was a system call
//! and the server woken, 30-40 % of a removal's time under the library
//! (bench/results-notes/hybask.md).
//!
//! **A file created under an earlier lease of D (or of another
//! directory) with the lane kept** goes to the server: its slot is the
//! lane's grant, so the engine would free its blocks as the
//! reservation's, but a settle of its file lease since may have taken
//! them out of the client's books on the server, which would then refuse
//! the `return`s (a leak until the next mount). The server's own removal
//! settles them as any leased file's.
//!
//! The order against a recall of D: the removal holds the book's `local`
//! lock from its look at the grant to its messages, as a create does, so
//! a give-back of D counts it in `removed=` or finds it not begun (the
//! engine checks D's lease again under D's lock).

use std::sync::atomic::Ordering::SeqCst;

use super::{lock, Client, Msg};
use crate::api::ns;
use crate::perm::Credentials;
use crate::rmlocal::ClientUnlink;
use crate::types::FileKind;

impl Client {
    /// Removals made by this client under directory leases so far.
    pub fn local_removals(&self) -> u64 {
        self.shared.dirs.local_removals()
    }

    /// Request `seq`, `op`, made here if it is an unlink this client may
    /// make under its lease of the directory (see the module comment);
    /// None: ask the server.
    pub(super) fn unlink_under_lease(
        &self,
        cred: &Credentials,
        seq: u64,
        op: &ns::Op,
    ) -> Option<ns::Done> {
        let ns::Op::Unlink { dir, name } = op else {
            return None;
        };
        let shared = &self.shared;
        if !self.grant.removes || shared.dirs.count() == 0 || shared.closed.load(SeqCst) {
            return None;
        }
        let mut book = shared.dirs.local_book();
        let (dgen, _) = shared.dirs.held(*dir)?;
        let done = |errno| ns::Done {
            seq,
            errno,
            ino: 0,
            igen: 0,
            gen: 0,
            dir: None,
            lane: None,
        };
        let fs = &shared.fs.fs;
        let a = match self.call(|f| f.lookup(&Credentials::root(), *dir, name)) {
            Ok(a) => a,
            // Under D's lease this engine's view of D is the authority
            // (caught up at the grant, changed since only here): a name
            // missing is ENOENT without a request (which would recall D).
            Err(e) if e.errno() == libc::ENOENT && fs.client_holds_dir(*dir) => {
                return Some(done(libc::ENOENT));
            }
            Err(_) => return None,
        };
        if a.kind != FileKind::File {
            return None;
        }
        let created = book.get(dir).is_some_and(|m| m.has(a.ino, a.generation));
        if !created && fs.client_owns_slot(a.ino) {
            return None;
        }
        // Rule 3, held for the whole removal: a recall of the file's lease
        // waits for this cell.
        let cell = lock(shared.lease_shard(a.ino)).get(&a.ino).cloned()?;
        let mut lease = lock(&cell);
        if !lease.held || (created && lease.gen != dgen) {
            return None;
        }
        let victim = a.ino;
        let r = self.call(|f| {
            let _w = f.fs.client_writes();
            f.fs.client_unlink(Some(cred), *dir, name, &|ino| ino == victim)
        });
        let held = match r {
            Err(e) => return Some(done(e.errno())),
            Ok(ClientUnlink::NotLocal(_)) => return None,
            Ok(ClientUnlink::Freed) => None,
            Ok(ClientUnlink::Held { ino, generation }) => Some((ino, generation)),
        };
        // Removed: the file's lease ends here (the server's entry, if
        // any, with the message below).
        let gen = lease.gen;
        lease.recalled = lease.recalled.max(gen);
        lease.drop_lease(&shared.held);
        drop(lease);
        fs.client_release_inode(victim);
        let made = book.entry(*dir).or_default();
        made.forget(victim);
        made.removed += 1;
        shared.dirs.removed_one();
        let mut then: Vec<Msg> = fs
            .take_client_freed_slots()
            .into_iter()
            .map(Msg::Slot)
            .collect();
        then.extend(held.map(|(i, g)| Msg::Orphan(i, g)));
        // The freed blocks wait for a full batch, as a write's do (see the
        // module comment), unless a message goes anyway.
        if !then.is_empty() || fs.client_freed_due() {
            let freed = fs.take_client_freed();
            // A failed write: the session is ending, and its end reaps the
            // lane (the removal is in the directory's log).
            let _ = shared.send_lines(&freed, &then);
        }
        drop(book);
        Some(done(0))
    }
}
