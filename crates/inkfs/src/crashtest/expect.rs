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
//! Timestamps are never compared: posix mode persists the mtime of an
//! in-place overwrite only at fsync, and the other modes are covered by the
//! per-operation crash tests.

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

/// Snapshot with times and generations cleared, and optionally file
/// contents and sizes.
fn strip(s: &Snap, content: bool, size: bool) -> Snap {
    let mut s = s.timeless();
    for n in s.nodes.values_mut() {
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
    let in_flight_data = matches!(at, Point::InFlight(i) if records[i - 1].class == OpClass::Data);
    let (strip_content, strip_size) = match mode {
        Mode::Strict => (false, false),
        Mode::Sync => (in_flight_data, false),
        Mode::Posix => (true, true),
    };
    let f = strip(found, strip_content, strip_size);
    let matched: Vec<usize> = cands
        .iter()
        .copied()
        .filter(|&c| strip(&states[c], strip_content, strip_size) == f)
        .collect();
    if matched.is_empty() {
        let mut s = format!(
            "{} equals none of the expected states {cands:?}\n",
            if strip_content { "metadata" } else { "state" }
        );
        for &c in &cands {
            s.push_str(&format!(
                " diff from state {c} to recovered:\n{}",
                diff(&strip(&states[c], strip_content, strip_size), &f)
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
                        OpClass::Sync => lo_sync = j + 1,
                        OpClass::DurableData => durable.push(j + 1),
                        _ => {}
                    }
                }
                let lo_size = durable.iter().copied().fold(lo_sync, usize::max);
                let maps = &maps;
                (
                    lo_size,
                    Box::new(move |off: usize| {
                        let mut lo = lo_sync;
                        for &j in &durable {
                            if j > lo
                                && byte_of(maps[j - 1].get(&key), off)
                                    != byte_of(maps[j].get(&key), off)
                            {
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
                .filter_map(|j| maps[j].get(&key).map(|m| m.size))
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
            let ok = (lo..=hi).any(|j| byte_of(maps[j].get(&key), off) == Some(b));
            if !ok {
                let had: Vec<String> = (lo..=hi)
                    .map(|j| match byte_of(maps[j].get(&key), off) {
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

fn byte_of(n: Option<&&Node>, off: usize) -> Option<u8> {
    n.and_then(|n| n.content.get(off).copied())
}
