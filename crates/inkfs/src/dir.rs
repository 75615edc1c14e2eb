//! A directory's DRAM index: name → child, plus readdir order by each
//! name's *position* (stored in the DIR_ADD's `seq` field; its cookie is
//! position + 3). Rebuilt from DIR_ADD/DIR_REMOVE entries.
//!
//! A position is a function of the name, as ext4's hash order: a keyed
//! 62-bit hash of the name, probed forward to the first free position on a
//! collision. So a name that is removed and added again (rename over it,
//! unlink then create) lands where it was, and one readdir pass, which
//! walks positions in increasing order, never meets a name twice. A name
//! keeps its position while it exists (rename over it, exchange, fsck's
//! retarget). Positions are stored, never recomputed: cookies stay stable
//! across remounts and log compaction, and pools written before hashed
//! positions (version 2 and older: per-directory sequence numbers) keep
//! theirs, which are just other unique numbers.
//!
//! Two corners, both documented in docs/FORMAT.md. (1) A 62-bit collision
//! within one directory: a name placed after a colliding one moves when it
//! is re-added after the other went. Moving back is harmless (a pass that
//! already returned it further on does not meet it again), but the reverse
//! (a name at its hash position removed, a colliding name added there, the
//! first re-added further on) can list the first name twice in one pass.
//! With a keyed 62-bit hash that takes a collision among a directory's n
//! names (about n²/2⁶³), which nobody can aim at without the pool's uuid.
//! (2) A name holding an old sequential position moves to its hashed one
//! the first time it is removed and added again (unlink + create; rename
//! over it keeps its place): a pass running just then may list it twice,
//! once per such name.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use siphasher::sip::SipHasher24;

use crate::format::FileKind;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Child {
    pub ino: u64,
    pub kind: FileKind,
    /// Readdir position (the DIR_ADD's `seq` field); cookie = seq + 3.
    pub seq: u64,
}

/// Cookies 1 and 2 are "." and ".."; a child at position `s` has cookie `s + 3`.
pub const COOKIE_DOT: u64 = 1;
pub const COOKIE_DOTDOT: u64 = 2;
pub const COOKIE_FIRST_CHILD_BASE: u64 = 3;

/// New positions are taken in `[0, 2^62)`: hashes, and probing wraps there.
pub const POSITION_HASH_SPACE: u64 = 1 << 62;
/// Largest position a DIR_ADD may hold: its cookie must fit an i64 (FUSE
/// and telldir offsets are signed). Above the hash space, room is left for
/// the positions older software hands out (its last position + 1).
pub const POSITION_MAX: u64 = i64::MAX as u64 - COOKIE_FIRST_CHILD_BASE;

const _: () = assert!(POSITION_HASH_SPACE - 1 <= POSITION_MAX);
const _: () = assert!(POSITION_MAX.checked_add(COOKIE_FIRST_CHILD_BASE).is_some());

/// The pool's name hash: SipHash-2-4 (a fixed, published function: the
/// same positions on every machine and Rust version) keyed by the pool's
/// uuid, so positions cannot be precomputed across pools.
#[derive(Clone, Debug)]
pub struct NameHasher(SipHasher24);

impl NameHasher {
    pub fn new(pool_uuid: &[u8; 16]) -> NameHasher {
        NameHasher(SipHasher24::new_with_key(pool_uuid))
    }

    /// The position `name` hashes to, in `[0, POSITION_HASH_SPACE)`.
    pub fn position(&self, name: &[u8]) -> u64 {
        // The top 62 bits (SipHash's bits are uniformly mixed).
        self.0.hash(name) >> 2
    }
}

#[derive(Clone, Debug, Default)]
pub struct DirIndex {
    by_name: HashMap<Box<[u8]>, Child>,
    by_pos: BTreeMap<u64, Box<[u8]>>,
    /// Names whose DIR_ADD holds a position that was already taken by
    /// another name, or out of range (a damaged log: the engine never writes
    /// one). Each was placed at the first free position after it instead;
    /// fsck reports them and rewrites their entries with that position.
    displaced: BTreeSet<Box<[u8]>>,
    subdirs: u32,
}

impl DirIndex {
    pub fn len(&self) -> usize {
        self.by_name.len()
    }
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
    pub fn subdirs(&self) -> u32 {
        self.subdirs
    }
    pub fn get(&self, name: &[u8]) -> Option<Child> {
        self.by_name.get(name).copied()
    }

    /// The position a DIR_ADD of `name` gets now: its current one if the
    /// name exists (rename over it, exchange), else its hash position or
    /// the first free one after it.
    pub fn place(&self, name: &[u8], hasher: &NameHasher) -> u64 {
        match self.by_name.get(name) {
            Some(c) => c.seq,
            None => self.first_free(hasher.position(name)),
        }
    }

    /// The first position at or after `start` (taken modulo the hash space)
    /// that no name holds, wrapping within the hash space.
    fn first_free(&self, start: u64) -> u64 {
        let mut p = start % POSITION_HASH_SPACE;
        // Two rounds at most: a directory holds far fewer than 2^62 names,
        // so the second round (from 0) ends at a gap.
        for _ in 0..2 {
            // Taken positions from p on come in key order: walk the run of
            // consecutive ones starting at p.
            for &taken in self.by_pos.range(p..POSITION_HASH_SPACE).map(|(k, _)| k) {
                if taken != p {
                    break;
                }
                p += 1;
            }
            if p < POSITION_HASH_SPACE {
                return p;
            }
            p = 0;
        }
        debug_assert!(false, "no free position in a directory");
        p
    }

    /// Apply a DIR_ADD (replay or commit) and return the position the name
    /// got. A name already present is replaced. A position that another
    /// name holds, or one out of range, can only come from a damaged log:
    /// the name goes to the first free position after it and is recorded
    /// as displaced (the directory stays readable; fsck repairs it).
    pub fn add(&mut self, name: &[u8], mut child: Child) -> u64 {
        self.remove(name);
        if child.seq > POSITION_MAX || self.by_pos.contains_key(&child.seq) {
            child.seq = self.first_free(child.seq);
            self.displaced.insert(name.into());
        }
        if child.kind == FileKind::Dir {
            self.subdirs += 1;
        }
        self.by_pos.insert(child.seq, name.into());
        self.by_name.insert(name.into(), child);
        child.seq
    }

    pub fn remove(&mut self, name: &[u8]) -> Option<Child> {
        let child = self.by_name.remove(name)?;
        self.by_pos.remove(&child.seq);
        if !self.displaced.is_empty() {
            self.displaced.remove(name);
        }
        if child.kind == FileKind::Dir {
            self.subdirs -= 1;
        }
        Some(child)
    }

    /// Names placed away from the position their DIR_ADD holds (see
    /// `displaced`), with the position they have now.
    pub fn displaced(&self) -> impl Iterator<Item = (&[u8], Child)> + '_ {
        self.displaced
            .iter()
            .filter_map(move |n| self.by_name.get(n).map(|c| (&n[..], *c)))
    }

    /// Children whose cookie is greater than `cookie`, in cookie order.
    pub fn after_cookie(&self, cookie: u64) -> impl Iterator<Item = (u64, &[u8], Child)> + '_ {
        // Cookie c belongs to position c - 3: resume at position c - 2.
        let first_pos = cookie.saturating_sub(COOKIE_FIRST_CHILD_BASE - 1);
        self.by_pos
            .range(first_pos..)
            .filter_map(move |(&pos, name)| {
                let child = self.by_name.get(name)?;
                Some((pos + COOKIE_FIRST_CHILD_BASE, &name[..], *child))
            })
    }

    /// Same names mapping to the same children at the same positions.
    pub fn same_children(&self, other: &DirIndex) -> bool {
        self.by_name == other.by_name
    }

    /// Every child, in position (readdir) order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], Child)> + '_ {
        self.by_pos
            .values()
            .filter_map(move |n| self.by_name.get(n).map(|c| (&n[..], *c)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(ino: u64, seq: u64) -> Child {
        Child {
            ino,
            kind: FileKind::File,
            seq,
        }
    }

    fn names_after(d: &DirIndex, cookie: u64) -> Vec<Vec<u8>> {
        d.after_cookie(cookie).map(|(_, n, _)| n.to_vec()).collect()
    }

    #[test]
    fn cookies_resume_after_removal() {
        let mut d = DirIndex::default();
        for (i, n) in [b"a", b"b", b"c"].iter().enumerate() {
            d.add(*n, file(10 + i as u64, i as u64));
        }
        let all: Vec<_> = d
            .after_cookie(COOKIE_DOTDOT)
            .map(|(c, n, _)| (c, n.to_vec()))
            .collect();
        assert_eq!(all.len(), 3);
        assert_eq!(all[0].0, COOKIE_FIRST_CHILD_BASE);
        let after_first = all[0].0;
        d.remove(b"b");
        assert_eq!(names_after(&d, after_first), vec![b"c".to_vec()]);
        // "." and ".." cookies (and 0) start from the first child.
        assert_eq!(names_after(&d, 0).len(), 2);
        assert_eq!(names_after(&d, COOKIE_DOT).len(), 2);
    }

    /// SipHash-2-4 is pinned: positions written by one build must be the
    /// ones every later build computes (the reference vector of the SipHash
    /// paper: key 00..0f, message 00..0e → a129ca6149be45e5).
    #[test]
    fn name_hash_is_siphash_2_4_and_62_bits() {
        let key: [u8; 16] = std::array::from_fn(|i| i as u8);
        let msg: Vec<u8> = (0u8..15).collect();
        let h = NameHasher::new(&key);
        assert_eq!(h.position(&msg), 0xa129ca6149be45e5 >> 2);
        let other = NameHasher::new(&[7; 16]);
        assert_ne!(h.position(b"name"), other.position(b"name"));
        for i in 0..1000u32 {
            assert!(h.position(&i.to_le_bytes()) < POSITION_HASH_SPACE);
        }
    }

    /// Forced collisions: every name hashes to one of two positions, one at
    /// the very top of the hash space (probing wraps to 0).
    #[test]
    fn colliding_names_get_unique_positions_and_keep_them() {
        let mut d = DirIndex::default();
        let top = POSITION_HASH_SPACE - 1;
        let tiny = |name: &[u8]| if name.len().is_multiple_of(2) { top } else { 5 };
        let place = |d: &DirIndex, name: &[u8]| match d.get(name) {
            Some(c) => c.seq,
            None => d.first_free(tiny(name)),
        };
        let names: Vec<Vec<u8>> = (1..=8).map(|n| vec![b'x'; n]).collect();
        for (i, n) in names.iter().enumerate() {
            let p = place(&d, n);
            assert_eq!(d.add(n, file(100 + i as u64, p)), p);
        }
        let mut pos: Vec<u64> = d.iter().map(|(_, c)| c.seq).collect();
        pos.sort();
        pos.dedup();
        assert_eq!(pos.len(), 8, "positions unique");
        // Odd lengths probe 5, 6, 7, 8; even ones top, then wrap to 0, 1, 2.
        assert_eq!(d.get(b"x").unwrap().seq, 5);
        assert_eq!(d.get(b"xx").unwrap().seq, top);
        assert_eq!(d.get(b"xxxx").unwrap().seq, 0);
        assert!(pos.iter().all(|&p| p < POSITION_HASH_SPACE));
        assert!(d.displaced().next().is_none());
        // Rename over / unlink + create of a name whose probe run is intact:
        // same position.
        for n in &names {
            let before = d.get(n).unwrap().seq;
            d.remove(n);
            let p = place(&d, n);
            d.add(n, file(1, p));
            assert_eq!(d.get(n).unwrap().seq, before, "{n:?} moved");
        }
        // The documented corner: "x" (at 5) goes, "xxx" (at 6) goes and
        // comes back: it now takes 5.
        d.remove(b"x");
        d.remove(b"xxx");
        let p = place(&d, b"xxx");
        d.add(b"xxx", file(1, p));
        assert_eq!(d.get(b"xxx").unwrap().seq, 5);
    }

    /// A damaged log (two names at one position, or a position out of
    /// range): every name stays visible at a unique position, and the moved
    /// ones are reported until re-added at a free position.
    #[test]
    fn duplicate_or_out_of_range_positions_are_displaced() {
        let mut d = DirIndex::default();
        d.add(b"a", file(1, 40));
        assert_eq!(d.add(b"b", file(2, 40)), 41);
        assert_eq!(
            d.add(b"c", file(3, u64::MAX)),
            u64::MAX % POSITION_HASH_SPACE
        );
        assert_eq!(d.add(b"d", file(4, POSITION_MAX)), POSITION_MAX);
        assert_eq!(names_after(&d, 0).len(), 4);
        let shown: Vec<_> = d.displaced().map(|(n, c)| (n.to_vec(), c.seq)).collect();
        assert_eq!(
            shown,
            vec![
                (b"b".to_vec(), 41),
                (b"c".to_vec(), u64::MAX % POSITION_HASH_SPACE)
            ]
        );
        // The largest cookie fits an i64.
        let last = d.after_cookie(0).last().unwrap().0;
        assert_eq!(last, i64::MAX as u64);
        // Rewriting "b" at the position it has now heals it.
        d.add(b"b", file(2, 41));
        d.remove(b"c");
        assert!(d.displaced().next().is_none());
    }
}
