//! The client's creates under a directory lease and their give-back
//! (docs/KERNEL-FREE.md, "Built: lane grants and the client's creates end
//! to end"; the book and its order against a recall: `super::super::
//! dirlease`).

use std::sync::atomic::Ordering::SeqCst;

use super::{lock, Client, Msg, Shared};
use crate::api::dirlease::{Local, HELD_MAX};
use crate::api::ns;
use crate::perm::Credentials;
use crate::types::Attr;

impl Client {
    /// Creates made by this client under directory leases so far.
    pub fn local_creates(&self) -> u64 {
        self.shared.dirs.local_creates()
    }

    /// Request `seq`, `op`, made here if it is a create in a directory
    /// whose lease this client holds with a lane (no ring request); None:
    /// ask the server. A reservation found empty is refilled once.
    pub(super) fn create_under_lease(
        &self,
        cred: &Credentials,
        seq: u64,
        op: &ns::Op,
    ) -> Option<ns::Done> {
        let ns::Op::Create {
            dir,
            name,
            mode,
            flags,
        } = op
        else {
            return None;
        };
        if self.shared.dirs.count() == 0 || self.shared.closed.load(SeqCst) {
            return None;
        }
        let made = |ino: u64, gen: u64| {
            let cell = self.shared.lease_cell(ino);
            lock(&cell).take(gen, &self.shared.held);
        };
        let r = self.local_with_retries(*dir, || {
            self.call(|fs| {
                self.shared
                    .dirs
                    .create_local(fs, cred, *dir, name, *mode, *flags, made)
            })
        })?;
        Some(answer(seq, r))
    }

    /// `attempt` (a create or a mkdir under `dir`'s lease) until it is
    /// made or refused: a reservation found empty is refilled once, a lane
    /// with no slot left asks for more once (`slots K`). None: ask the
    /// server.
    pub(super) fn local_with_retries(
        &self,
        dir: u64,
        mut attempt: impl FnMut() -> Local,
    ) -> Option<std::result::Result<(Attr, u64), i32>> {
        for tries in 1..=2 {
            let refills = self.shared.refills.load(SeqCst);
            match attempt() {
                Local::Made(a, gen) => {
                    self.shared.refill_ahead_if_low(0);
                    return Some(Ok((a, gen)));
                }
                Local::Failed(e) => return Some(Err(e)),
                Local::NoSpace if tries == 1 => {
                    self.refill(0, 1, refills).ok()?;
                }
                Local::Server if tries == 1 && self.more_slots_due(dir) => {
                    self.more_slots()?;
                }
                Local::NoSpace | Local::Server => return None,
            }
        }
        None
    }

    /// Whether a create in `dir` went to the server for want of a slot
    /// only: the lease of `dir` held, a lane held with none left.
    fn more_slots_due(&self, dir: u64) -> bool {
        let fs = &self.shared.fs.fs;
        self.shared.dirs.held(dir).is_some()
            && fs.client_lane().is_some()
            && fs.client_lane_slots() == 0
    }

    /// Ask for more slots of the lane held (`slots K`): None if the
    /// server gave none (the creates go to it).
    fn more_slots(&self) -> Option<()> {
        let fs = &self.shared.fs.fs;
        let (k, taken) = fs.client_lane_lease()?;
        match self.ask(&Msg::Slots(k)).ok()? {
            Msg::SlotsGiven(lane, slots) if lane == k && !slots.is_empty() => {
                fs.client_add_slots(k, taken, &slots).ok()
            }
            _ => None,
        }
    }

    /// The answer `d` to a request that asked for directory `dir`'s lease
    /// (None: no answer): taken into the book and the engine, and a lane
    /// held with no directory given back.
    pub(super) fn dir_answered(&self, dir: u64, d: Option<&ns::Done>) {
        let (answer, lane) = (
            d.and_then(|d| d.dir.as_ref()),
            d.and_then(|d| d.lane.as_ref()),
        );
        let (held, back) = self
            .shared
            .dirs
            .answered_with(&self.shared.fs, dir, answer, lane);
        if let Some(r) = back {
            let _ = self.shared.send(&Msg::ReleasedLane(r));
        }
        if held {
            // Past the bound, the oldest lease goes back (`HELD_MAX`).
            if let Some((old, gen)) = self.shared.dirs.oldest_beyond(HELD_MAX) {
                debug_assert_ne!(old, dir, "the newest grant given back");
                self.shared.give_back_dir(old, gen);
            }
        }
    }
}

/// The answer to request `seq` made under a lease: the new inode and the
/// grant its write lease is held by (0: none), or the errno.
pub(super) fn answer(seq: u64, r: std::result::Result<(Attr, u64), i32>) -> ns::Done {
    let ((ino, igen, gen), errno) = match r {
        Ok((a, gen)) => ((a.ino, a.generation, gen), 0),
        Err(e) => ((0, 0, 0), e),
    };
    ns::Done {
        seq,
        errno,
        ino,
        igen,
        gen,
        dir: None,
        lane: None,
    }
}

impl Shared {
    /// `return` lines for the blocks it freed, then the lines of `then`,
    /// in one write (one system call).
    pub(super) fn send_lines(
        &self,
        freed: &[(u64, u64)],
        then: &[Msg],
    ) -> crate::error::Result<()> {
        let mut lines = String::new();
        for m in Msg::split(freed, Msg::Return).iter().chain(then) {
            m.write_line(&mut lines);
        }
        if lines.is_empty() {
            return Ok(());
        }
        self.sent.fetch_add(1, SeqCst);
        let out = lock(&self.out);
        self.write_lines(&out, &lines)
    }

    /// Give directory `dir`'s grant `gen` back (out of the book already):
    /// the files made under it that this client still writes kept, the
    /// others' leases dropped, the blocks it freed returned first, and
    /// with its last directory its lane (`super::dirlease`).
    pub(super) fn give_back_dir(&self, dir: u64, gen: u64) {
        let fs = &self.fs.fs;
        let holds = |ino| {
            let cell = lock(self.lease_shard(ino)).get(&ino).cloned();
            cell.is_some_and(|c| {
                let st = lock(&c);
                st.held && st.gen == gen
            })
        };
        let back = self.dirs.give_back(&self.fs, dir, holds);
        for ino in back.dropped {
            if let Some(c) = lock(self.lease_shard(ino)).get(&ino).cloned() {
                let mut st = lock(&c);
                if st.held && st.gen == gen {
                    st.recalled = st.recalled.max(gen);
                    st.drop_lease(&self.held);
                    fs.client_release_inode(ino);
                }
            }
        }
        let freed = fs.take_client_freed();
        let _ = self.send_ranges(
            &freed,
            Some(&Msg::ReleasedDir(dir, gen, back.kept, back.removed)),
            &[],
        );
        if let Some(r) = back.lane {
            let _ = self.send(&Msg::ReleasedLane(r));
        }
    }
}
