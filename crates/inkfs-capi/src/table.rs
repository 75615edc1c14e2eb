//! The descriptor table of one mount: small ints naming open file
//! descriptions, as a process's fd table does (but not kernel fds: they
//! mean something only to the `inkfs_t` that issued them).
//!
//! Lookups (every read and write) take no table-wide lock: the table is
//! segments of slots, allocated once and never moved, each slot behind its
//! own reader-writer lock, so a lookup is an uncontended read lock of one
//! slot and a reference-count increment, with no allocation and no system
//! call. Changes (open, close, dup) serialise on the allocator's mutex,
//! which keeps the slots and the bitmap of numbers in use in step and
//! hands out the lowest free number, as POSIX requires of open and dup.

use std::ffi::c_int;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};

use crate::boundary::{fail, CResult};
use crate::ofd::Ofd;

const SEGMENT_SLOTS: usize = 1024;
const SEGMENTS: usize = 1024;
/// Most descriptors open at once (Linux's default nr_open): EMFILE past it.
pub(crate) const FDS_MAX: usize = SEGMENT_SLOTS * SEGMENTS;
const _: () = assert!(FDS_MAX <= i32::MAX as usize);

#[derive(Default)]
struct Slot {
    ofd: RwLock<Option<Arc<Ofd>>>,
    /// FD_CLOEXEC: kept and reported for F_GETFD; an exec ends the mount
    /// anyway, so it changes nothing.
    fd_flags: AtomicI32,
}

/// Which numbers are in use, one bit each.
#[derive(Default)]
struct Numbers {
    words: Vec<u64>,
}

impl Numbers {
    /// Mark and return the lowest free number at or above `min`.
    fn take_lowest(&mut self, min: usize) -> Option<usize> {
        let mut fd = min;
        while fd < FDS_MAX {
            let (w, b) = (fd / 64, fd % 64);
            let word = self.words.get(w).copied().unwrap_or(0);
            let free = !word & (u64::MAX << b);
            if free != 0 {
                let fd = w * 64 + free.trailing_zeros() as usize;
                if fd >= FDS_MAX {
                    return None;
                }
                self.set(fd);
                return Some(fd);
            }
            fd = (w + 1) * 64;
        }
        None
    }
    fn set(&mut self, fd: usize) {
        let w = fd / 64;
        if self.words.len() <= w {
            self.words.resize(w + 1, 0);
        }
        self.words[w] |= 1 << (fd % 64);
    }
    fn clear(&mut self, fd: usize) {
        if let Some(word) = self.words.get_mut(fd / 64) {
            *word &= !(1 << (fd % 64));
        }
    }
}

pub(crate) struct FdTable {
    segments: Box<[OnceLock<Box<[Slot]>>]>,
    /// Held by every change of a slot (never by a lookup).
    numbers: Mutex<Numbers>,
}

impl Default for FdTable {
    fn default() -> Self {
        FdTable {
            segments: (0..SEGMENTS).map(|_| OnceLock::new()).collect(),
            numbers: Mutex::default(),
        }
    }
}

impl FdTable {
    fn slot(&self, fd: usize) -> Option<&Slot> {
        let segment = self.segments.get(fd / SEGMENT_SLOTS)?.get()?;
        segment.get(fd % SEGMENT_SLOTS)
    }

    /// The slot of `fd`, its segment allocated if need be (changes only).
    fn slot_for_change(&self, fd: usize) -> &Slot {
        let segment = self.segments[fd / SEGMENT_SLOTS]
            .get_or_init(|| (0..SEGMENT_SLOTS).map(|_| Slot::default()).collect());
        &segment[fd % SEGMENT_SLOTS]
    }

    fn numbers(&self) -> MutexGuard<'_, Numbers> {
        // A panic while the mutex was held left the bitmap consistent
        // (every change to it is one statement), so a poisoned lock is
        // still usable.
        self.numbers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The open file description `fd` names (EBADF if none).
    pub(crate) fn get(&self, fd: c_int) -> CResult<Arc<Ofd>> {
        let Ok(fd) = usize::try_from(fd) else {
            return fail(libc::EBADF);
        };
        let Some(slot) = self.slot(fd) else {
            return fail(libc::EBADF);
        };
        let ofd = slot.ofd.read().unwrap_or_else(|e| e.into_inner());
        ofd.clone().ok_or(crate::boundary::Errno(libc::EBADF))
    }

    /// Give `ofd` the lowest free number at or above `min` (EMFILE when
    /// none is left, EINVAL when `min` is out of range).
    pub(crate) fn insert(&self, ofd: Arc<Ofd>, min: c_int, fd_flags: i32) -> CResult<c_int> {
        let Ok(min) = usize::try_from(min) else {
            return fail(libc::EINVAL);
        };
        if min >= FDS_MAX {
            return fail(libc::EINVAL);
        }
        let mut numbers = self.numbers();
        let Some(fd) = numbers.take_lowest(min) else {
            return fail(libc::EMFILE);
        };
        let slot = self.slot_for_change(fd);
        let old = slot
            .ofd
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .replace(ofd);
        debug_assert!(old.is_none(), "a free number's slot is empty");
        slot.fd_flags.store(fd_flags, Ordering::Relaxed);
        Ok(fd as c_int)
    }

    /// Put `ofd` at number `fd` (dup2): the description it named before,
    /// if any, is returned for the caller to release.
    pub(crate) fn install(
        &self,
        fd: c_int,
        ofd: Arc<Ofd>,
        fd_flags: i32,
    ) -> CResult<Option<Arc<Ofd>>> {
        let Ok(n) = usize::try_from(fd) else {
            return fail(libc::EBADF);
        };
        if n >= FDS_MAX {
            return fail(libc::EBADF);
        }
        let mut numbers = self.numbers();
        numbers.set(n);
        let slot = self.slot_for_change(n);
        let old = slot
            .ofd
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .replace(ofd);
        slot.fd_flags.store(fd_flags, Ordering::Relaxed);
        Ok(old)
    }

    /// Free number `fd`: the description it named (EBADF if none).
    pub(crate) fn remove(&self, fd: c_int) -> CResult<Arc<Ofd>> {
        let Ok(n) = usize::try_from(fd) else {
            return fail(libc::EBADF);
        };
        let mut numbers = self.numbers();
        let Some(slot) = self.slot(n) else {
            return fail(libc::EBADF);
        };
        let old = slot.ofd.write().unwrap_or_else(|e| e.into_inner()).take();
        let Some(ofd) = old else {
            return fail(libc::EBADF);
        };
        numbers.clear(n);
        Ok(ofd)
    }

    /// Empty the table (unmount): every description it held.
    pub(crate) fn drain(&self) -> Vec<Arc<Ofd>> {
        let mut numbers = self.numbers();
        let mut all = Vec::new();
        for segment in self.segments.iter().filter_map(OnceLock::get) {
            for slot in segment.iter() {
                if let Some(ofd) = slot.ofd.write().unwrap_or_else(|e| e.into_inner()).take() {
                    all.push(ofd);
                }
            }
        }
        numbers.words.clear();
        all
    }

    /// F_GETFD.
    pub(crate) fn fd_flags(&self, fd: c_int) -> CResult<i32> {
        self.get(fd)?;
        let slot = usize::try_from(fd).ok().and_then(|n| self.slot(n));
        Ok(slot.map_or(0, |s| s.fd_flags.load(Ordering::Relaxed)))
    }

    /// F_SETFD.
    pub(crate) fn set_fd_flags(&self, fd: c_int, flags: i32) -> CResult<()> {
        self.get(fd)?;
        if let Some(slot) = usize::try_from(fd).ok().and_then(|n| self.slot(n)) {
            slot.fd_flags
                .store(flags & libc::FD_CLOEXEC, Ordering::Relaxed);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_hand_out_the_lowest_free() {
        let mut n = Numbers::default();
        assert_eq!(n.take_lowest(0), Some(0));
        assert_eq!(n.take_lowest(0), Some(1));
        assert_eq!(n.take_lowest(0), Some(2));
        n.clear(1);
        assert_eq!(n.take_lowest(0), Some(1));
        assert_eq!(n.take_lowest(0), Some(3));
        assert_eq!(n.take_lowest(100), Some(100));
        assert_eq!(n.take_lowest(64), Some(64));
        n.set(FDS_MAX - 1);
        assert_eq!(n.take_lowest(FDS_MAX - 1), None);
        assert_eq!(n.take_lowest(FDS_MAX - 2), Some(FDS_MAX - 2));
    }
}
