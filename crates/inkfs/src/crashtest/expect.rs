//! What each mode promises a recovered state is (docs/MODES.md), as a
//! check of one recovered snapshot against the live states of a workload.
//!
//! The workload ran operations 1..=n; `states[j]` is the live state after
//! operation j (`states[0]` before the first). A crash point lies inside
//! operation i when the crash is just before one of that operation's fences
//! (operations 1..i-1 completed; i may have stored anything before that
//! fence), or at the end of the trace (all n completed, nothing in flight).
//! The rules, per mode:
//!
//! - **strict**: every operation is atomic and durable on return. The
//!   recovered state equals `states[i-1]` or `states[i]` (timestamps
//!   ignored); at the end exactly `states[n]`.
//! - **sync**: as strict, except that a write in flight may overwrite in
//!   place: the metadata (sizes included) equals that of `states[i-1]` or
//!   `states[i]`, and every byte of every file equals that byte in one of
//!   the two (an offset a state does not have counts for nothing: bytes past
//!   the old end of file must be the new ones, never stale or zero unless
//!   the write wrote zeros). Appends and writes into holes are therefore
//!   checked as all-or-nothing by the size and the bytes they add.
//! - **posix**: metadata operations, truncate and fallocate are atomic and
//!   durable on return; writes are durable only at fsync/fdatasync of the
//!   file (or when a later truncate/fallocate of the file makes its state
//!   durable). So:
//!   - everything but file sizes and contents equals `states[i-1]` or
//!     `states[i]`;
//!   - a file's size is its size in some state j with lo ≤ j ≤ hi, where hi
//!     is i (the state after the operation in flight; n at the end) and lo
//!     the last completed fsync/fdatasync/truncate/fallocate of that file
//!     (0 if none: the setup state is durable);
//!   - each byte of a file equals that byte in some state j with
//!     lo(off) ≤ j ≤ hi that has it, where lo(off) is the last completed
//!     fsync/fdatasync of the file, or a later truncate/fallocate that
//!     changed that byte (a punched or zeroed range is durable at once; an
//!     unsynced overwrite elsewhere in the file may still be old or new).
//!
//!   Files are matched across states by inode number and generation (a
//!   reused number is another file). Unsynced writes may thus be lost, or
//!   (overwrites) partly present, but never show bytes no state had.
//!
//! Timestamps (atime, mtime, ctime) are part of the comparison in strict and sync
//! mode, where every change of them is logged with its operation; posix
//! mode persists an in-place overwrite's mtime only at fsync, so there they
//! are ignored. Inode generations are compared in every mode.

use std::collections::HashMap;

use crate::types::{FileKind, Mode};

use super::snapshot::{diff, Node, Snap};
use super::workload::OpClass;

/// What happened when the workload ran one operation.
#[derive(Clone, Debug)]
pub struct OpRecord {
    pub class: OpClass,
    /// The file whose data it changes or syncs, (ino, generation) resolved
    /// before it ran.
    pub target: Option<(u64, u64)>,
    pub ok: bool,
    /// Fence numbers (trace-relative) issued during the operation:
    /// `fences.0..fences.1`.
    pub fences: (usize, usize),
}

/// Where a crash point lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Point {
    /// Operation i (1-based) in flight.
    InFlight(usize),
    /// Operations 1..=c completed, none in flight.
    After(usize),
}

pub fn locate(records: &[OpRecord], point: usize) -> Point {
    for (i, r) in records.iter().enumerate() {
        if r.fences.0 <= point && point < r.fences.1 {
            return Point::InFlight(i + 1);
        }
    }
    Point::After(records.iter().filter(|r| r.fences.1 <= point).count())
}

/// Snapshot with, as asked, times cleared and file contents and sizes
/// cleared.
fn strip(s: &Snap, content: bool, size: bool, times: bool) -> Snap {
    let mut s = s.clone();
    for n in s.nodes.values_mut() {
        if !times {
            n.atime = 0;
            n.mtime = 0;
            n.ctime = 0;
        }
        if n.kind == FileKind::File {
            if content {
                n.content.clear();
            }
            if size {
                n.size = 0;
            }
        }
    }
    s
}

fn by_file(s: &Snap) -> HashMap<(u64, u64), &Node> {
    s.nodes
        .values()
        .filter(|n| n.kind == FileKind::File)
        .map(|n| ((n.ino, n.generation), n))
        .collect()
}

/// Check `found` against the promise of `mode`. Returns the indices of the
/// candidate states whose metadata it matches (several when an operation
/// changed nothing visible, e.g. fallocate with KEEP_SIZE), or an
/// explanation.
pub fn check(
    mode: Mode,
    found: &Snap,
    states: &[Snap],
    records: &[OpRecord],
    at: Point,
) -> Result<Vec<usize>, String> {
    let (cands, hi): (Vec<usize>, usize) = match at {
        Point::InFlight(i) => (vec![i - 1, i], i),
        Point::After(c) => (vec![c], c),
    };
    let completed = match at {
        Point::InFlight(i) => i - 1,
        Point::After(c) => c,
    };
    let in_flight_data = matches!(at, Point::InFlight(i)
        if matches!(records[i - 1].class, OpClass::Data | OpClass::DataSync));
    let (strip_content, strip_size) = match mode {
        Mode::Strict => (false, false),
        Mode::Sync => (in_flight_data, false),
        Mode::Posix => (true, true),
    };
    // Times: strict and sync log every mtime change with the operation;
    // posix persists an in-place overwrite's mtime only at fsync.
    let times = mode != Mode::Posix;
    let f = strip(found, strip_content, strip_size, times);
    let matched: Vec<usize> = cands
        .iter()
        .copied()
        .filter(|&c| strip(&states[c], strip_content, strip_size, times) == f)
        .collect();
    if matched.is_empty() {
        let mut s = format!(
            "{} equals none of the expected states {cands:?}\n",
            if strip_content { "metadata" } else { "state" }
        );
        for &c in &cands {
            s.push_str(&format!(
                " diff from state {c} to recovered:\n{}",
                diff(&strip(&states[c], strip_content, strip_size, times), &f)
            ));
        }
        return Err(s);
    }
    if !strip_content {
        return Ok(matched);
    }
    // Sizes and bytes, file by file.
    let maps: Vec<_> = states[..=hi].iter().map(by_file).collect();
    let mut checked = std::collections::HashSet::new();
    for (path, n) in &found.nodes {
        if n.kind != FileKind::File || !checked.insert((n.ino, n.generation)) {
            continue;
        }
        let key = (n.ino, n.generation);
        // The file in each state 0..=hi (looked up once, not per byte).
        let v: Vec<Option<&Node>> = maps.iter().map(|m| m.get(&key).copied()).collect();
        let v = &v;
        // Per offset, the first state a byte may come from.
        let (lo_size, lo_byte): (usize, Box<dyn Fn(usize) -> usize>) = match mode {
            Mode::Sync => {
                let i = hi;
                (i - 1, Box::new(move |_| i - 1))
            }
            _ => {
                let mut lo_sync = 0;
                let mut durable = Vec::new();
                for (j, r) in records[..completed].iter().enumerate() {
                    if !r.ok || r.target != Some(key) {
                        continue;
                    }
                    match r.class {
                        OpClass::Sync | OpClass::DataSync => lo_sync = j + 1,
                        OpClass::DurableData => durable.push(j + 1),
                        _ => {}
                    }
                }
                let lo_size = durable.iter().copied().fold(lo_sync, usize::max);
                (
                    lo_size,
                    Box::new(move |off: usize| {
                        let mut lo = lo_sync;
                        for &j in &durable {
                            if j > lo && byte_of(v[j - 1], off) != byte_of(v[j], off) {
                                lo = j;
                            }
                        }
                        lo
                    }),
                )
            }
        };
        if mode == Mode::Posix {
            let sizes: Vec<u64> = (lo_size..=hi)
                .filter_map(|j| v[j].map(|m| m.size))
                .collect();
            if !sizes.contains(&n.size) {
                return Err(format!(
                    "{path}: size {} is none of the sizes the file had since its last durable point (states {lo_size}..={hi}): {sizes:?}",
                    n.size
                ));
            }
        }
        for (off, &b) in n.content.iter().enumerate() {
            let lo = lo_byte(off);
            // Later states first (usually the one recovered).
            let ok = (lo..=hi).rev().any(|j| byte_of(v[j], off) == Some(b));
            if !ok {
                let had: Vec<String> = (lo..=hi)
                    .map(|j| match byte_of(v[j], off) {
                        Some(x) => format!("{x:#x}"),
                        None => "-".into(),
                    })
                    .collect();
                return Err(format!(
                    "{path}: byte {off} = {b:#x} is in no allowed state (states {lo}..={hi} had {})",
                    had.join(" ")
                ));
            }
        }
    }
    Ok(matched)
}

fn byte_of(n: Option<&Node>, off: usize) -> Option<u8> {
    n.and_then(|n| n.content.get(off).copied())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn file(content: &[u8]) -> Node {
        Node {
            ino: 5,
            generation: 1,
            kind: FileKind::File,
            mode: 0o100644,
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            size: content.len() as u64,
            content: content.to_vec(),
            target: Vec::new(),
            xattrs: BTreeMap::new(),
            flags: 0,
            atime: 0,
            mtime: 0,
            ctime: 0,
            cookie: 0,
        }
    }

    fn snap(content: &[u8]) -> Snap {
        let mut s = Snap::default();
        s.nodes.insert("/f".into(), file(content));
        s
    }

    fn rec(class: OpClass, fences: (usize, usize)) -> OpRecord {
        OpRecord {
            class,
            target: Some((5, 1)),
            ok: true,
            fences,
        }
    }

    #[test]
    fn locate_points() {
        let r = [
            rec(OpClass::Data, (0, 2)),
            rec(OpClass::Sync, (2, 2)),
            rec(OpClass::Meta, (2, 5)),
        ];
        assert_eq!(locate(&r, 0), Point::InFlight(1));
        assert_eq!(locate(&r, 1), Point::InFlight(1));
        assert_eq!(locate(&r, 2), Point::InFlight(3));
        assert_eq!(locate(&r, 5), Point::After(3));
    }

    #[test]
    fn strict_wants_old_or_new_exactly() {
        let states = [snap(b"aaaa"), snap(b"bbbb")];
        let r = [rec(OpClass::Data, (0, 2))];
        assert!(check(
            Mode::Strict,
            &snap(b"aaaa"),
            &states,
            &r,
            Point::InFlight(1)
        )
        .is_ok());
        assert!(check(
            Mode::Strict,
            &snap(b"bbbb"),
            &states,
            &r,
            Point::InFlight(1)
        )
        .is_ok());
        assert!(check(
            Mode::Strict,
            &snap(b"abab"),
            &states,
            &r,
            Point::InFlight(1)
        )
        .is_err());
        assert!(check(Mode::Strict, &snap(b"aaaa"), &states, &r, Point::After(1)).is_err());
        // Sync: an overwrite in flight may mix, sizes stay atomic.
        assert!(check(Mode::Sync, &snap(b"abab"), &states, &r, Point::InFlight(1)).is_ok());
        assert!(check(Mode::Sync, &snap(b"abaz"), &states, &r, Point::InFlight(1)).is_err());
        assert!(check(Mode::Sync, &snap(b"aba"), &states, &r, Point::InFlight(1)).is_err());
    }

    #[test]
    fn sync_extension_bytes_only_new() {
        let states = [snap(b"aa"), snap(b"bbbb")];
        let r = [rec(OpClass::Data, (0, 2))];
        assert!(check(Mode::Sync, &snap(b"abbb"), &states, &r, Point::InFlight(1)).is_ok());
        assert!(check(
            Mode::Sync,
            &snap(b"ab\0\0"),
            &states,
            &r,
            Point::InFlight(1)
        )
        .is_err());
    }

    #[test]
    fn posix_unsynced_writes_may_be_lost_synced_ones_not() {
        // write (no fence), then fsync (fences 0..1), then a metadata op.
        let states = [
            snap(b"aaaa"),
            snap(b"bbbbbb"),
            snap(b"bbbbbb"),
            snap(b"bbbbbb"),
        ];
        let r = [
            rec(OpClass::Data, (0, 0)),
            rec(OpClass::Sync, (0, 1)),
            OpRecord {
                class: OpClass::Meta,
                target: None,
                ok: true,
                fences: (1, 3),
            },
        ];
        // Crash during the fsync: the write may be lost, or half there.
        assert!(check(Mode::Posix, &snap(b"aaaa"), &states, &r, Point::InFlight(2)).is_ok());
        assert!(check(Mode::Posix, &snap(b"abab"), &states, &r, Point::InFlight(2)).is_ok());
        assert!(check(
            Mode::Posix,
            &snap(b"bbbbbb"),
            &states,
            &r,
            Point::InFlight(2)
        )
        .is_ok());
        // Invented bytes or sizes never.
        assert!(check(Mode::Posix, &snap(b"aaza"), &states, &r, Point::InFlight(2)).is_err());
        assert!(check(
            Mode::Posix,
            &snap(b"aaaaa"),
            &states,
            &r,
            Point::InFlight(2)
        )
        .is_err());
        // After the fsync completed: only the synced data.
        assert!(check(Mode::Posix, &snap(b"aaaa"), &states, &r, Point::InFlight(3)).is_err());
        assert!(check(Mode::Posix, &snap(b"bbbbbb"), &states, &r, Point::After(3)).is_ok());
    }

    #[test]
    fn posix_truncate_is_durable_for_the_bytes_it_changes() {
        // overwrite (unsynced) of bytes 0..2, then punch of 2..4 (durable).
        let states = [snap(b"aaaa"), snap(b"bbaa"), snap(b"bb\0\0")];
        let r = [
            rec(OpClass::Data, (0, 0)),
            rec(OpClass::DurableData, (0, 2)),
        ];
        assert!(check(Mode::Posix, &snap(b"aa\0\0"), &states, &r, Point::After(2)).is_ok());
        assert!(check(Mode::Posix, &snap(b"bb\0\0"), &states, &r, Point::After(2)).is_ok());
        assert!(check(Mode::Posix, &snap(b"bbaa"), &states, &r, Point::After(2)).is_err());
    }

    #[test]
    fn a_write_back_is_a_write_in_flight_and_durable_once_done() {
        // A write-back (write + fdatasync, fences 0..2), then a metadata op.
        let states = [snap(b"aaaa"), snap(b"bbbbbb"), snap(b"bbbbbb")];
        let r = [
            rec(OpClass::DataSync, (0, 2)),
            OpRecord {
                class: OpClass::Meta,
                target: None,
                ok: true,
                fences: (2, 3),
            },
        ];
        // In flight: old, new or (sync and posix) a mix, never invented.
        for mode in [Mode::Sync, Mode::Posix] {
            for ok in [&b"aaaa"[..], b"bbbbbb", b"abab"] {
                assert!(check(mode, &snap(ok), &states, &r, Point::InFlight(1)).is_ok());
            }
            assert!(check(mode, &snap(b"aaza"), &states, &r, Point::InFlight(1)).is_err());
        }
        // Done: nothing of it may be lost, in any mode.
        for mode in [Mode::Strict, Mode::Sync, Mode::Posix] {
            for lost in [&b"aaaa"[..], b"abab", b"bbbb"] {
                assert!(check(mode, &snap(lost), &states, &r, Point::InFlight(2)).is_err());
            }
            assert!(check(mode, &snap(b"bbbbbb"), &states, &r, Point::After(2)).is_ok());
        }
    }

    #[test]
    fn water_fill_shares() {
        let f = super::super::water_fill;
        assert_eq!(f(&[1, 100, 100], 21), vec![1, 10, 10]);
        assert_eq!(f(&[1, 1, 1], 2), vec![1, 1, 1]);
        assert_eq!(f(&[3, 50], 100), vec![3, 50]);
    }
}
