//! Write leases on the attach session (docs/KERNEL-FREE.md, "Writing:
//! per-inode leases"): the messages client and server exchange after the
//! grant, and the server's engine calls.
//!
//! One line per message, on the session's connection (the one the attach
//! was made on); blocks are `START+LEN` ranges:
//!
//! ```text
//! client: lease INO              the write lease of regular file INO
//! server: granted INO GEN        (after recalling it from its holder and
//!                                 invalidating the kernel's caches of it)
//!     or: denied INO ERRNO
//! client: reserve N              N more blocks for the reservation
//!     or: reserve-dev N          N more data-device blocks (a hybrid
//!                                 pool; PM blocks if the device is full)
//! server: blocks S+L S+L ...     (at least one block)
//!     or: nospace
//! server: recall INO GEN         give lease INO (grant GEN) back
//! client: return S+L S+L ...     blocks it freed or did not use (no answer)
//! client: released INO GEN       the answer to a recall (or a lease given
//!                                 back unasked), after the returns
//! client: lane K                  serve request ring K too (`super::ring`;
//!                                 no answer)
//! client: released D DGEN kept=...  a directory's lease back, with the
//!                                 files kept (`super::lanelease`)
//! client: released lane K ...     a lane back (`super::lanelease`)
//! client: slots K                 more slots of lane K (`super::lanelease`)
//! server: slots-given K S,S,...   (`-`: none)
//! client: orphan INO GEN          it removed INO (generation GEN) under a
//!                                 directory lease and another process
//!                                 holds it: the server keeps it until the
//!                                 last hold (`super::lanelease`)
//! client: slot INO                it removed and freed the older inode
//!                                 INO under a directory lease: the server
//!                                 frees its blocks and slot
//! ```
//!
//! `orphan` and `slot` (and `removed=` in a directory's `released`) go
//! only to a server whose attach grant said `removes=1`
//! (`super::attach::Grant::removes`); an older client sends none.
//!
//! GEN numbers each grant (unique while the server runs). A lease may also
//! come with a namespace request's answer (`super::ns`: a create), which
//! a recall may overtake: the client holds a grant it learns of only if it
//! was not asked to give back that grant (or a later one) meanwhile, and
//! the server settles a `released` only for the grant it names.
//!
//! The client sends one request at a time (lease or reserve) and waits for
//! its answer; recalls may come at any time and are answered from another
//! thread of the client. A recall is answered after every block the client
//! freed before it has been returned, so the server's books of the lease
//! are complete when `released` arrives.

use super::Filesystem;
use crate::error::Result;
use crate::pmem::Pmem;

pub use crate::lease::{LeaseHook, RangeSet};

/// Ranges at most in one `return` or `blocks` line.
pub const RANGES_PER_LINE: usize = 64;

/// Longest message line, in bytes: a namespace request (`super::ns`) or
/// 64 ranges of two 20-digit numbers.
pub const LINE_MAX: usize = {
    let ranges = 64 + RANGES_PER_LINE * 42;
    if ranges > super::ns::REQUEST_MAX {
        ranges
    } else {
        super::ns::REQUEST_MAX
    }
};

/// A message of the lease protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Msg {
    Lease(u64),
    /// Inode, grant number.
    Granted(u64, u64),
    Denied(u64, i32),
    Reserve(u64),
    ReserveDev(u64),
    Blocks(Vec<(u64, u64)>),
    NoSpace,
    /// Inode, grant number.
    Recall(u64, u64),
    /// Blocks the client freed (displaced or cut from a file, or a
    /// preallocation it dropped): readers may hold them (the limbo).
    Return(Vec<(u64, u64)>),
    /// Blocks of the client's reservation it never used: free at once.
    Unused(Vec<(u64, u64)>),
    /// Inode, grant number.
    Released(u64, u64),
    /// A namespace request (`super::ns`).
    Ns(super::ns::Request),
    /// Its answer.
    Done(super::ns::Done),
    /// A hold of an orphan ended (`super::ns`).
    Unheld(u64),
    /// Serve request ring K of the client's set too (`super::ring`).
    Lane(u32),
    /// A directory's lease given back (inode, grant number) with the
    /// files created under it that the client keeps writing (inode,
    /// generation), and the removals it made under it: `super::lanelease`.
    /// None kept, none removed: the line of [`Msg::Released`].
    ReleasedDir(u64, u64, Vec<(u64, u64)>, u64),
    /// A lane given back (`super::lanelease`).
    ReleasedLane(super::lanelease::LaneReturn),
    /// More slots of lane K, asked (`super::lanelease`).
    Slots(u32),
    /// Its answer: the slots added (none: the creates go to the server).
    SlotsGiven(u32, Vec<u64>),
    /// A removal under a directory lease left this inode (number,
    /// generation) held by another process (`super::lanelease`).
    Orphan(u64, u64),
    /// A removal under a directory lease freed this older inode's record:
    /// its blocks and slot are the server's to free (`super::lanelease`).
    Slot(u64),
}

impl Msg {
    /// The line (with its newline).
    pub fn line(&self) -> String {
        let mut out = String::new();
        self.write_line(&mut out);
        out
    }

    /// Append the line (with its newline) to `out`: one buffer for a
    /// batch of lines, no allocation per range.
    pub fn write_line(&self, out: &mut String) {
        use std::fmt::Write;
        let ranges = |out: &mut String, word: &str, r: &[(u64, u64)]| {
            out.reserve(word.len() + 1 + r.len() * 16);
            out.push_str(word);
            for (s, l) in r {
                let _ = write!(out, " {s}+{l}");
            }
            out.push('\n');
        };
        // Writing to a String cannot fail.
        let _ = match self {
            Msg::Lease(i) => writeln!(out, "lease {i}"),
            Msg::Granted(i, g) => writeln!(out, "granted {i} {g}"),
            Msg::Denied(i, e) => writeln!(out, "denied {i} {e}"),
            Msg::Reserve(n) => writeln!(out, "reserve {n}"),
            Msg::ReserveDev(n) => writeln!(out, "reserve-dev {n}"),
            Msg::Blocks(r) => {
                ranges(out, "blocks", r);
                Ok(())
            }
            Msg::NoSpace => writeln!(out, "nospace"),
            Msg::Recall(i, g) => writeln!(out, "recall {i} {g}"),
            Msg::Return(r) => {
                ranges(out, "return", r);
                Ok(())
            }
            Msg::Unused(r) => {
                ranges(out, "unused", r);
                Ok(())
            }
            Msg::Released(i, g) => writeln!(out, "released {i} {g}"),
            Msg::Ns(r) => {
                out.push_str(&r.line());
                Ok(())
            }
            Msg::Done(d) => {
                d.write_line(out);
                Ok(())
            }
            Msg::Unheld(i) => writeln!(out, "unheld {i}"),
            Msg::Lane(k) => writeln!(out, "lane {k}"),
            Msg::ReleasedDir(i, g, kept, removed) => writeln!(
                out,
                "released {}",
                super::lanelease::released_dir_words(*i, *g, kept, *removed)
            ),
            Msg::ReleasedLane(r) => {
                writeln!(out, "released {}", super::lanelease::released_lane_words(r))
            }
            Msg::Slots(k) => writeln!(out, "slots {k}"),
            Msg::SlotsGiven(k, v) => {
                writeln!(out, "slots-given {k} {}", super::lanelease::slot_list(v))
            }
            Msg::Orphan(i, g) => writeln!(out, "orphan {i} {g}"),
            Msg::Slot(i) => writeln!(out, "slot {i}"),
        };
    }

    /// Lines for `ranges` as `make` messages of at most
    /// [`RANGES_PER_LINE`] ranges each.
    pub fn split(ranges: &[(u64, u64)], make: fn(Vec<(u64, u64)>) -> Msg) -> Vec<Msg> {
        ranges
            .chunks(RANGES_PER_LINE)
            .map(|c| make(c.to_vec()))
            .collect()
    }

    /// Parse one line (without its newline).
    pub fn parse(line: &str) -> Option<Msg> {
        let mut w = line.split_ascii_whitespace();
        let word = w.next()?;
        let num = |s: Option<&str>| s.and_then(|s| s.parse::<u64>().ok());
        let ranges = |w: std::str::SplitAsciiWhitespace<'_>| -> Option<Vec<(u64, u64)>> {
            w.map(|r| {
                let (s, l) = r.split_once('+')?;
                let (s, l) = (s.parse().ok()?, l.parse().ok()?);
                (l > 0).then_some((s, l))
            })
            .collect()
        };
        let msg = match word {
            "lease" => Msg::Lease(num(w.next())?),
            "granted" => Msg::Granted(num(w.next())?, num(w.next())?),
            "denied" => Msg::Denied(num(w.next())?, w.next()?.parse().ok()?),
            "reserve" => Msg::Reserve(num(w.next())?),
            "reserve-dev" => Msg::ReserveDev(num(w.next())?),
            "blocks" => Msg::Blocks(ranges(w)?),
            "nospace" => Msg::NoSpace,
            "recall" => Msg::Recall(num(w.next())?, num(w.next())?),
            "return" => Msg::Return(ranges(w)?),
            "unused" => Msg::Unused(ranges(w)?),
            "released" => {
                let first = w.next()?;
                if first == "lane" {
                    return super::lanelease::parse_released_lane(w).map(Msg::ReleasedLane);
                }
                let (ino, gen) = (num(Some(first))?, num(w.next())?);
                match super::lanelease::parse_released_dir_rest(w)? {
                    // An older client's line, or a give-back keeping and
                    // removing nothing.
                    (kept, 0) if kept.is_empty() => Msg::Released(ino, gen),
                    (kept, removed) => Msg::ReleasedDir(ino, gen, kept, removed),
                }
            }
            "ns" => Msg::Ns(super::ns::Request::parse(w)?),
            "done" => Msg::Done(super::ns::Done::parse(w)?),
            "unheld" => Msg::Unheld(num(w.next())?),
            "slots" => Msg::Slots(w.next()?.parse().ok()?),
            "slots-given" => {
                let k = w.next()?.parse().ok()?;
                let v = super::lanelease::parse_slot_list(w.next()?)?;
                Msg::SlotsGiven(k, v)
            }
            "lane" => Msg::Lane(w.next()?.parse().ok()?),
            "orphan" => Msg::Orphan(num(w.next())?, num(w.next())?),
            "slot" => Msg::Slot(num(w.next())?),
            _ => return None,
        };
        Some(msg)
    }
}

/// The server's side of leases, on the mount's engine.
impl<P: Pmem> Filesystem<P> {
    /// Install the mount's lease table: told before any inode is used.
    pub fn set_lease_hook(&self, hook: std::sync::Arc<dyn LeaseHook>) {
        self.fs.set_lease_hook(hook)
    }

    /// Inode `ino` caught up with what its lease holder committed, and the
    /// blocks it refers to (log pages, data). EINVAL unless a regular
    /// file, ENOENT if gone.
    pub fn lease_refs(&self, ino: u64) -> Result<Vec<(u64, u64)>> {
        self.fs.lease_refs(ino)
    }

    /// Whether `ino` is unlinked (kept by open handles): not leased.
    pub fn is_orphan(&self, ino: u64) -> Result<bool> {
        self.fs.is_orphan(ino)
    }

    /// A client's check after it held `ino`: still linked, generation
    /// `generation` (holds.rs).
    pub fn is_linked(&self, ino: u64, generation: u64) -> bool {
        self.fs.is_linked(ino, generation)
    }

    /// Whether orphan `ino` is in use (a handle of the server's, or a
    /// client's hold): then it may be leased (holds.rs).
    pub fn orphan_in_use(&self, ino: u64) -> bool {
        self.fs.orphan_in_use(ino)
    }

    /// Free the client-held orphans no client holds any more (after a
    /// client's `unheld`, at the end of its session, now and then): the
    /// count freed.
    pub fn free_unheld_orphans(&self) -> usize {
        self.fs.free_unheld_orphans()
    }

    /// Frees the engine's allocator refused so far (double frees: always
    /// a bug, each also logged).
    pub fn frees_refused(&self) -> u64 {
        self.fs.frees_refused()
    }

    /// Client-held orphans waiting.
    pub fn held_orphans(&self) -> usize {
        self.fs.held_orphans()
    }

    /// Up to `want` free blocks for a client's reservation (none: empty).
    pub fn reserve_blocks(&self, want: u64) -> Vec<(u64, u64)> {
        self.fs.reserve_blocks(want, RANGES_PER_LINE)
    }

    /// Up to `want` free data-device blocks for a client's reservation (a
    /// hybrid pool; PM blocks when the device is full; none: empty).
    pub fn reserve_dev_blocks(&self, want: u64) -> Vec<(u64, u64)> {
        self.fs.reserve_dev_blocks(want, RANGES_PER_LINE)
    }

    /// Log GC of `ino` once its lease came back.
    pub fn collect_log(&self, ino: u64) -> Result<()> {
        self.fs.collect_log(ino)
    }

    /// Blocks of a client's reservation it never used: free at once
    /// (`Fs::free_unused_blocks`).
    pub fn free_unused_blocks(&self, ranges: &[(u64, u64)]) {
        self.fs.free_unused_blocks(ranges)
    }

    /// Blocks a client gave back or left: to the limbo.
    pub fn return_blocks(&self, ranges: &[(u64, u64)]) {
        self.fs.return_blocks(ranges)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_junk_is_refused() {
        let all = [
            Msg::Lease(7),
            Msg::Granted(7, 3),
            Msg::Denied(7, libc::EINVAL),
            Msg::Reserve(256),
            Msg::ReserveDev(512),
            Msg::Blocks(vec![(100, 3), (200, 1)]),
            Msg::NoSpace,
            Msg::Recall(9, 4),
            Msg::Return(vec![]),
            Msg::Return(vec![(5, 5)]),
            Msg::Unused(vec![(9, 2), (30, 1)]),
            Msg::Released(9, 4),
            Msg::Unheld(9),
            Msg::Lane(3),
            Msg::Orphan(9, 4),
            Msg::Slot(u64::MAX),
        ];
        for m in all {
            let line = m.line();
            assert!(line.len() <= LINE_MAX);
            assert_eq!(Msg::parse(line.trim_end()), Some(m));
        }
        for bad in [
            "",
            "lease",
            "lease x",
            "blocks 1+0",
            "blocks 1-2",
            "unused 7+0",
            "grant 1",
            "recall 5",
            "released 5",
            "lane",
            "lane -1",
            "orphan 5",
            "orphan x 1",
            "slot",
            "slot -2",
        ] {
            assert_eq!(Msg::parse(bad), None, "{bad}");
        }
        let many: Vec<(u64, u64)> = (0..150).map(|i| (i * 10, 1)).collect();
        let lines = Msg::split(&many, Msg::Return);
        assert_eq!(lines.len(), 3);
        assert!(lines.iter().all(|m| m.line().len() <= LINE_MAX));
    }
}
