//! Tests of the allocators as a whole: many threads allocating and freeing
//! at once, and the model-based property test that runs random operations
//! against both allocators and a trivially correct model, then saves and
//! restores them. Also the in-memory pool and the listing helpers the
//! save-area tests share.

use super::*;
use crate::format::{lanes_end_block, BLOCK_SIZE};
use crate::pmem::{BackendInfo, BackendKind, FlushMethod, Pmem};
use crate::testkit::Rng;
use proptest::prelude::*;
use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

/// In-memory pool: the real backends are not needed to test what the
/// allocator writes and reads back.
pub(super) struct MemPool {
    bytes: Mutex<Vec<u8>>,
}

impl MemPool {
    pub(super) fn new(size_bytes: u64) -> Self {
        MemPool {
            bytes: Mutex::new(vec![0; size_bytes as usize]),
        }
    }
    /// A pool holding the lane areas of `lane_count` lanes (data blocks
    /// are never touched by the allocator, so they need no backing).
    pub(super) fn for_lanes(lane_count: u32) -> Self {
        Self::new(lanes_end_block(lane_count) * BLOCK_SIZE)
    }
}

impl Pmem for MemPool {
    fn size_bytes(&self) -> u64 {
        self.bytes.lock().unwrap().len() as u64
    }
    fn info(&self) -> BackendInfo {
        BackendInfo {
            kind: BackendKind::Simulated,
            flush: FlushMethod::None,
            size_bytes: self.size_bytes(),
        }
    }
    fn read(&self, off: u64, buf: &mut [u8]) {
        let b = self.bytes.lock().unwrap();
        buf.copy_from_slice(&b[off as usize..off as usize + buf.len()]);
    }
    fn read_u64(&self, off: u64) -> u64 {
        let mut v = [0; 8];
        self.read(off, &mut v);
        u64::from_le_bytes(v)
    }
    fn write(&self, off: u64, data: &[u8]) {
        let mut b = self.bytes.lock().unwrap();
        b[off as usize..off as usize + data.len()].copy_from_slice(data);
    }
    fn write_u64(&self, off: u64, value: u64) {
        self.write(off, &value.to_le_bytes());
    }
    fn copy_nt(&self, off: u64, data: &[u8]) {
        self.write(off, data);
    }
    fn zero_nt(&self, off: u64, len: u64) {
        let mut b = self.bytes.lock().unwrap();
        b[off as usize..(off + len) as usize].fill(0);
    }
    fn flush(&self, _off: u64, _len: u64) {}
    fn fence(&self) {}
    fn sync_all(&self) -> std::io::Result<()> {
        Ok(())
    }
}

pub(super) fn all_ranges(a: &BlockAllocator) -> Vec<Vec<(u64, u64)>> {
    (0..a.lane_count()).map(|l| a.free_ranges(l)).collect()
}

pub(super) fn all_slots(s: &InodeSlots) -> Vec<(u64, Vec<(u64, u64)>)> {
    (0..s.lane_count())
        .map(|l| (s.slots_high_water(l), s.freed_ranges(l)))
        .collect()
}

#[test]
fn concurrent_alloc_free_never_duplicates() {
    let lanes = 2;
    let (first, total) = (8, 8 + 512);
    let a = Arc::new(BlockAllocator::new_all_free(lanes, first, total));
    let s = Arc::new(InodeSlots::new(lanes));
    // Owner map: a block is set here while some thread holds it.
    let owned = Arc::new(Mutex::new(vec![false; total as usize]));
    let slots_owned = Arc::new(Mutex::new(HashSet::new()));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let (a, s, owned, slots_owned) =
                (a.clone(), s.clone(), owned.clone(), slots_owned.clone());
            std::thread::spawn(move || {
                let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15 ^ (t + 1));
                let mut held: Vec<(u64, u64)> = Vec::new();
                let mut held_slots: Vec<(u32, u64)> = Vec::new();
                for _ in 0..3000 {
                    // Threads 0,1 on lane 0, 2,3 on lane 1, plus random lanes.
                    let lane = if rng.below(4) == 0 {
                        rng.next_u64() as u32
                    } else {
                        (t / 2) as u32
                    };
                    if rng.below(2) == 0 || held.is_empty() {
                        if let Some((start, len)) = a.alloc(lane, 1 + rng.next_u64() % 16) {
                            let mut o = owned.lock().unwrap();
                            for b in start..start + len {
                                assert!(!o[b as usize], "block {b} handed out twice");
                                o[b as usize] = true;
                            }
                            held.push((start, len));
                        }
                    } else {
                        let (start, len) = held.swap_remove(rng.next_u64() as usize % held.len());
                        // Give up ownership before the blocks can be reallocated.
                        owned.lock().unwrap()[start as usize..(start + len) as usize].fill(false);
                        a.free(start, len).unwrap();
                    }
                    let slot_lane = lane % lanes;
                    if rng.below(2) == 0 || held_slots.is_empty() {
                        let slot = s.alloc(slot_lane);
                        assert!(
                            slots_owned.lock().unwrap().insert((slot_lane, slot)),
                            "slot handed out twice"
                        );
                        held_slots.push((slot_lane, slot));
                    } else {
                        let (l, slot) =
                            held_slots.swap_remove(rng.next_u64() as usize % held_slots.len());
                        slots_owned.lock().unwrap().remove(&(l, slot));
                        s.free(l, slot).unwrap();
                    }
                }
                for (start, len) in held {
                    owned.lock().unwrap()[start as usize..(start + len) as usize].fill(false);
                    a.free(start, len).unwrap();
                }
                for (l, slot) in held_slots {
                    slots_owned.lock().unwrap().remove(&(l, slot));
                    s.free(l, slot).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    a.check();
    s.check();
    assert_eq!(a.free_blocks(), a.capacity_blocks());
    assert_eq!(s.used_count(), 0);
    for l in 0..lanes {
        let (rs, re) = a.lane_region(l);
        assert_eq!(a.free_ranges(l), vec![(rs, re - rs)]);
    }
}

// -----------------------------------------------------------------------
// Model-based property tests
// -----------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Op {
    Alloc {
        lane: u32,
        want: u64,
    },
    /// Free part of the used run at or after `at` (never a double free).
    FreeUsed {
        at: u64,
        len: u64,
    },
    /// Free an arbitrary range: a double free unless it is all in use.
    FreeAny {
        at: u64,
        len: u64,
    },
    MarkUsed {
        at: u64,
        len: u64,
    },
    SlotAlloc {
        lane: u32,
    },
    SlotFree {
        lane: u32,
        pick: usize,
    },
    SlotMark {
        lane: u32,
        slot: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..8u32, 1..40u64).prop_map(|(lane, want)| Op::Alloc { lane, want }),
        4 => (0..400u64, 1..40u64).prop_map(|(at, len)| Op::FreeUsed { at, len }),
        1 => (0..400u64, 1..10u64).prop_map(|(at, len)| Op::FreeAny { at, len }),
        1 => (0..400u64, 1..10u64).prop_map(|(at, len)| Op::MarkUsed { at, len }),
        2 => (0..8u32).prop_map(|lane| Op::SlotAlloc { lane }),
        2 => (0..8u32, any::<usize>()).prop_map(|(lane, pick)| Op::SlotFree { lane, pick }),
        1 => (0..8u32, 0..30u64).prop_map(|(lane, slot)| Op::SlotMark { lane, slot }),
    ]
}

/// The allocators beside a trivially correct model of them.
struct Harness {
    a: BlockAllocator,
    s: InodeSlots,
    /// used[b - first]: block b is in use.
    used: Vec<bool>,
    /// Per lane, the slots in use.
    slots: Vec<BTreeSet<u64>>,
    /// Per lane, one past the highest slot ever in use (it never shrinks).
    high_water: Vec<u64>,
}

impl Harness {
    fn new(lanes: u32, first: u64, capacity: u64) -> Self {
        Harness {
            a: BlockAllocator::new_all_free(lanes, first, first + capacity),
            s: InodeSlots::new(lanes),
            used: vec![false; capacity as usize],
            slots: vec![BTreeSet::new(); lanes as usize],
            high_water: vec![0; lanes as usize],
        }
    }

    fn first(&self) -> u64 {
        self.a.first_block()
    }

    /// Longest run of free blocks inside one lane region (model).
    fn max_free_run(&self) -> u64 {
        let mut best = 0;
        for l in 0..self.a.lane_count() {
            let (rs, re) = self.a.lane_region(l);
            let mut run = 0;
            for b in rs..re {
                run = if self.used[(b - self.first()) as usize] {
                    0
                } else {
                    run + 1
                };
                best = best.max(run);
            }
        }
        best
    }

    fn clamp(&self, at: u64, len: u64) -> (u64, u64) {
        let cap = self.used.len() as u64;
        let at = at % cap;
        (self.first() + at, len.min(cap - at))
    }

    fn apply(&mut self, op: &Op) {
        let first = self.first();
        let lanes = self.a.lane_count();
        match *op {
            Op::Alloc { lane, want } => {
                let expect_len = want.min(self.max_free_run());
                match self.a.alloc(lane, want) {
                    None => assert_eq!(expect_len, 0, "ENOSPC with free blocks"),
                    Some((start, len)) => {
                        assert!(len >= 1 && len <= want);
                        assert!(start >= first && start + len <= self.a.total_blocks());
                        assert_eq!(len, expect_len, "not the full length / largest range");
                        for b in start..start + len {
                            let u = &mut self.used[(b - first) as usize];
                            assert!(!*u, "block {b} handed out twice");
                            *u = true;
                        }
                    }
                }
            }
            Op::FreeUsed { at, len } => {
                let (start, _) = self.clamp(at, 0);
                let Some(run_start) =
                    (start..self.a.total_blocks()).find(|&b| self.used[(b - first) as usize])
                else {
                    return;
                };
                let run_len = (run_start..self.a.total_blocks())
                    .take_while(|&b| self.used[(b - first) as usize])
                    .count() as u64;
                let len = len.min(run_len);
                self.a.free(run_start, len).unwrap();
                self.used[(run_start - first) as usize..(run_start - first + len) as usize]
                    .fill(false);
            }
            Op::FreeAny { at, len } => {
                let (start, len) = self.clamp(at, len);
                let range = (start - first) as usize..(start - first + len) as usize;
                let expect = match self.used[range.clone()].iter().position(|u| !u) {
                    Some(i) => Err(AllocError::DoubleFree {
                        block: start + i as u64,
                    }),
                    None => Ok(()),
                };
                assert_eq!(self.a.try_free(start, len), expect);
                if expect.is_ok() {
                    self.used[range].fill(false);
                }
            }
            Op::MarkUsed { at, len } => {
                let (start, len) = self.clamp(at, len);
                let range = (start - first) as usize..(start - first + len) as usize;
                let expect = match self.used[range.clone()].iter().position(|&u| u) {
                    Some(i) => Err(AllocError::AlreadyUsed {
                        block: start + i as u64,
                    }),
                    None => Ok(()),
                };
                assert_eq!(self.a.mark_used(start, len), expect);
                if expect.is_ok() {
                    self.used[range].fill(true);
                }
            }
            Op::SlotAlloc { lane } => {
                let lane = lane % lanes;
                let set = &mut self.slots[lane as usize];
                let lowest = (0..).find(|x| !set.contains(x)).unwrap();
                assert_eq!(self.s.alloc(lane), lowest);
                set.insert(lowest);
                let hw = &mut self.high_water[lane as usize];
                *hw = (*hw).max(lowest + 1);
            }
            Op::SlotFree { lane, pick } => {
                let lane = lane % lanes;
                let set = &mut self.slots[lane as usize];
                if set.is_empty() {
                    assert!(self.s.try_free(lane, 0).is_err());
                    return;
                }
                let slot = *set.iter().nth(pick % set.len()).unwrap();
                self.s.free(lane, slot).unwrap();
                set.remove(&slot);
                assert!(self.s.try_free(lane, slot).is_err());
            }
            Op::SlotMark { lane, slot } => {
                let lane = lane % lanes;
                let set = &mut self.slots[lane as usize];
                let r = self.s.mark_used(lane, slot);
                if set.insert(slot) {
                    r.unwrap();
                    let hw = &mut self.high_water[lane as usize];
                    *hw = (*hw).max(slot + 1);
                } else {
                    assert_eq!(r, Err(AllocError::SlotAlreadyUsed { lane, slot }));
                }
            }
        }
    }

    /// Allocators and model agree on every block and slot.
    fn check(&self) {
        self.a.check();
        self.s.check();
        let used = self.used.iter().filter(|u| **u).count() as u64;
        assert_eq!(self.a.free_blocks() + used, self.a.capacity_blocks());
        for (i, &u) in self.used.iter().enumerate() {
            assert_eq!(
                self.a.is_free(self.first() + i as u64),
                !u,
                "block {}",
                self.first() + i as u64
            );
        }
        for (lane, set) in self.slots.iter().enumerate() {
            let hw = self.s.slots_high_water(lane as u32);
            assert_eq!(hw, self.high_water[lane]);
            for slot in 0..hw + 2 {
                assert_eq!(self.s.is_used(lane as u32, slot), set.contains(&slot));
            }
        }
        let used_slots: usize = self.slots.iter().map(|s| s.len()).sum();
        assert_eq!(self.s.used_count(), used_slots as u64);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn prop_allocator_matches_model(
        lanes in 1..5u32,
        capacity in 1..300u64,
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        let first = lanes_end_block(lanes);
        let mut h = Harness::new(lanes, first, capacity);
        for op in &ops {
            h.apply(op);
            h.check();
        }

        // Save -> restore reproduces both allocators exactly.
        let pm = MemPool::for_lanes(lanes);
        prop_assert_eq!(h.a.save(&pm, 77, &h.s), Ok(true));
        let (b, t) = BlockAllocator::restore(&pm, lanes, first, first + capacity, 77).unwrap();
        prop_assert_eq!(all_ranges(&h.a), all_ranges(&b));
        prop_assert_eq!(all_slots(&h.s), all_slots(&t));
        prop_assert_eq!(h.a.free_blocks(), b.free_blocks());
        prop_assert_eq!(h.s.used_count(), t.used_count());
        b.check();
        t.check();
        prop_assert!(BlockAllocator::restore(&pm, lanes, first, first + capacity, 78).is_none());

        // Freeing everything leaves one range per non-empty lane: its region.
        for i in 0..capacity {
            if h.used[i as usize] {
                h.a.free(first + i, 1).unwrap();
            }
        }
        for l in 0..lanes {
            let (rs, re) = h.a.lane_region(l);
            let expect = if re > rs { vec![(rs, re - rs)] } else { vec![] };
            prop_assert_eq!(h.a.free_ranges(l), expect);
        }
        prop_assert_eq!(h.a.free_blocks(), capacity);
    }
}
