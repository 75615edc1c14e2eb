//! A directory's DRAM index: name → child, plus readdir order by the
//! DIR_ADD sequence number, which makes readdir cookies stable across
//! remounts and log compaction. Rebuilt from DIR_ADD/DIR_REMOVE entries.

use std::collections::{BTreeMap, HashMap};

use crate::format::FileKind;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Child {
    pub ino: u64,
    pub kind: FileKind,
    /// Sequence number of the DIR_ADD that created this name.
    pub seq: u64,
}

/// Cookies 1 and 2 are "." and ".."; a child with sequence `s` has cookie `s + 3`.
pub const COOKIE_DOT: u64 = 1;
pub const COOKIE_DOTDOT: u64 = 2;
pub const COOKIE_FIRST_CHILD_BASE: u64 = 3;

#[derive(Clone, Debug, Default)]
pub struct DirIndex {
    by_name: HashMap<Box<[u8]>, Child>,
    by_seq: BTreeMap<u64, Box<[u8]>>,
    next_seq: u64,
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
    /// The sequence number the next DIR_ADD gets.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Apply a DIR_ADD (replay or commit). A name already present is
    /// replaced (rename over an existing name writes remove then add, but a
    /// replayed log is trusted to be in order).
    pub fn add(&mut self, name: &[u8], child: Child) {
        self.remove(name);
        if child.kind == FileKind::Dir {
            self.subdirs += 1;
        }
        self.by_seq.insert(child.seq, name.into());
        self.by_name.insert(name.into(), child);
        self.next_seq = self.next_seq.max(child.seq + 1);
    }

    pub fn remove(&mut self, name: &[u8]) -> Option<Child> {
        let child = self.by_name.remove(name)?;
        self.by_seq.remove(&child.seq);
        if child.kind == FileKind::Dir {
            self.subdirs -= 1;
        }
        Some(child)
    }

    /// Keep the sequence counter past sequences seen in DIR_REMOVE entries
    /// too, so a cookie is never reused within one log's lifetime.
    pub fn note_seq(&mut self, seq: u64) {
        self.next_seq = self.next_seq.max(seq + 1);
    }

    /// Children whose cookie is greater than `cookie`, in cookie order.
    pub fn after_cookie(&self, cookie: u64) -> impl Iterator<Item = (u64, &[u8], Child)> + '_ {
        let first_seq = cookie.saturating_sub(COOKIE_FIRST_CHILD_BASE - 1);
        let first_seq = if cookie < COOKIE_FIRST_CHILD_BASE {
            0
        } else {
            first_seq
        };
        self.by_seq
            .range(first_seq..)
            .filter_map(move |(&seq, name)| {
                let child = self.by_name.get(name)?;
                Some((seq + COOKIE_FIRST_CHILD_BASE, &name[..], *child))
            })
    }

    /// Same names mapping to the same children (the sequence counter aside).
    pub fn same_children(&self, other: &DirIndex) -> bool {
        self.by_name == other.by_name
    }

    pub fn iter(&self) -> impl Iterator<Item = (&[u8], Child)> + '_ {
        self.by_seq
            .values()
            .filter_map(move |n| self.by_name.get(n).map(|c| (&n[..], *c)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_resume_after_removal() {
        let mut d = DirIndex::default();
        for (i, n) in [b"a", b"b", b"c"].iter().enumerate() {
            d.add(
                *n,
                Child {
                    ino: 10 + i as u64,
                    kind: FileKind::File,
                    seq: i as u64,
                },
            );
        }
        let all: Vec<_> = d
            .after_cookie(COOKIE_DOTDOT)
            .map(|(c, n, _)| (c, n.to_vec()))
            .collect();
        assert_eq!(all.len(), 3);
        let after_first = all[0].0;
        d.remove(b"b");
        let rest: Vec<_> = d
            .after_cookie(after_first)
            .map(|(_, n, _)| n.to_vec())
            .collect();
        assert_eq!(rest, vec![b"c".to_vec()]);
        assert_eq!(d.next_seq(), 3);
    }
}
