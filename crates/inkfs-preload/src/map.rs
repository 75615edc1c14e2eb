//! Private read-only mappings of served files, as copies: `mmap` with
//! MAP_PRIVATE of a regular file the library serves is an anonymous
//! mapping filled with the file's bytes from the pool, with no kernel
//! open of a placeholder (lazy.rs), no GETATTR and no READ request per
//! page. git maps every file it hashes that way (`git status` after a
//! checkout or an untar hashes each one whose ctime changed).
//!
//! POSIX leaves unspecified whether changes made to the file after the
//! mmap call show in a private mapping (Linux shows them in the pages
//! not written yet); a copy shows none. What else a program could see:
//! `/proc/self/maps` names no file for it, and its pages are the
//! process's own memory (so it is only made up to [`MAX_COPY_BYTES`]).
//! Taken by the kernel as before: a shared mapping, MAP_FIXED, PROT_EXEC,
//! an offset not page-aligned, a range that reaches a page wholly past
//! the end of the file (the kernel's SIGBUS there), a descriptor not open
//! for reading, and anything the pool cannot answer.

use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering;

use libc::{off64_t, size_t};

use crate::io::{pool_read, route, Op, Route};
use crate::{guard, mounts, real, stats};

/// Larger mappings stay the kernel's (page cache shared, no copy).
pub const MAX_COPY_BYTES: usize = 16 << 20;

const PAGE_BYTES: u64 = 4096;

/// The mapping, or `None` for the kernel's. (No address: without
/// MAP_FIXED the program's is only a hint, which the kernel may not take
/// either.)
pub fn private_copy(
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off64_t,
) -> Option<*mut c_void> {
    let kind = flags & (libc::MAP_SHARED | libc::MAP_PRIVATE | libc::MAP_SHARED_VALIDATE);
    let refused = libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE | libc::MAP_ANONYMOUS;
    if kind != libc::MAP_PRIVATE
        || flags & refused != 0
        || prot & libc::PROT_EXEC != 0
        || len == 0
        || len > MAX_COPY_BYTES
        || off < 0
        || !(off as u64).is_multiple_of(PAGE_BYTES)
        || guard::inside()
    {
        return None;
    }
    let Route::Served(idx, ofd) = route(fd, Op::Read) else {
        return None;
    };
    guard::run(|| {
        let m = mounts::by_index(ofd.mount.load(Ordering::Relaxed) as usize)?;
        let size = m
            .checkout()?
            .client()
            .getattr(ofd.ino.load(Ordering::Relaxed))
            .ok()?
            .size;
        let off = off as u64;
        // Every page of the range holds a byte of the file.
        if off.checked_add(len as u64)? > size.next_multiple_of(PAGE_BYTES) {
            return None;
        }
        // SAFETY: a new anonymous mapping, where the kernel picks; its
        // pages made at once (MAP_POPULATE): the copy writes every one.
        let p = unsafe {
            real::mmap64(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        let want = (size - off).min(len as u64) as usize;
        let iov = [libc::iovec {
            iov_base: p,
            iov_len: want,
        }];
        let got = pool_read(idx, ofd, &iov, off);
        // SAFETY: the mapping made above, ours alone until returned.
        let protected =
            prot & libc::PROT_WRITE != 0 || unsafe { libc::mprotect(p, len, prot) } == 0;
        if got != Some(want) || !protected {
            // SAFETY: as above.
            unsafe { libc::munmap(p, len) };
            return None;
        }
        stats::bump(&stats::MAP_LOCAL);
        Some(p)
    })
    .flatten()
}
