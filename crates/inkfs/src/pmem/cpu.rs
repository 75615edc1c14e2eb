//! CPU persistence primitives: cache-line write-back, fences, and
//! non-temporal copies. The flush instruction is chosen once (CPUID) and
//! dispatched with a predictable branch, never through a pointer.

use std::sync::OnceLock;

/// How cache lines are written back to the persistence domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlushMethod {
    /// `clwb`: write back, line may stay cached (best).
    Clwb,
    /// `clflushopt`: write back and evict, weakly ordered.
    Clflushopt,
    /// `clflush`: write back and evict, strongly ordered (SSE2, universal on
    /// x86_64, understood by valgrind).
    Clflush,
    /// msync(2) of the covered pages (plain files on a disk file system).
    Msync,
    /// No instruction at all: the memory is not persistent (crash simulator)
    /// or the tool cannot run cache flushes (Miri).
    None,
}

impl FlushMethod {
    pub fn name(self) -> &'static str {
        match self {
            FlushMethod::Clwb => "clwb",
            FlushMethod::Clflushopt => "clflushopt",
            FlushMethod::Clflush => "clflush",
            FlushMethod::Msync => "msync",
            FlushMethod::None => "none",
        }
    }
}

/// The best cache-line flush this CPU has. `INKFS_FLUSH=clflush` (or
/// `clflushopt`) forces a weaker one, e.g. to run under valgrind, which
/// does not decode clwb. An override the CPU cannot execute is ignored.
pub fn detect_flush_method() -> FlushMethod {
    static METHOD: OnceLock<FlushMethod> = OnceLock::new();
    *METHOD.get_or_init(|| {
        let hw = detect_hw();
        match std::env::var("INKFS_FLUSH").as_deref() {
            Ok("clflush") if hw.clflush => FlushMethod::Clflush,
            Ok("clflushopt") if hw.clflushopt => FlushMethod::Clflushopt,
            _ => hw.best(),
        }
    })
}

/// The flush instructions the CPU decodes.
#[derive(Clone, Copy, Debug, Default)]
struct HwFlush {
    clwb: bool,
    clflushopt: bool,
    clflush: bool,
}

impl HwFlush {
    fn best(self) -> FlushMethod {
        if self.clwb {
            FlushMethod::Clwb
        } else if self.clflushopt {
            FlushMethod::Clflushopt
        } else if self.clflush {
            FlushMethod::Clflush
        } else {
            FlushMethod::None
        }
    }
}

#[cfg(all(target_arch = "x86_64", not(miri)))]
// The cpuid intrinsics are safe from Rust 1.87 on, unsafe before (our MSRV).
#[allow(unused_unsafe)]
fn detect_hw() -> HwFlush {
    use std::arch::x86_64::{__cpuid_count, __get_cpuid_max};
    // clflush is part of SSE2, which every x86_64 CPU has.
    let mut hw = HwFlush {
        clflush: true,
        ..HwFlush::default()
    };
    // Leaf 7 exists only if the CPU says so; asking for a leaf above the
    // maximum returns the data of the highest leaf on Intel, whose bits
    // would be misread as clwb/clflushopt.
    // SAFETY: cpuid is always available on x86_64.
    let (max_leaf, _) = unsafe { __get_cpuid_max(0) };
    if max_leaf >= 7 {
        // SAFETY: leaf 7 is supported (checked above).
        let leaf7 = unsafe { __cpuid_count(7, 0) };
        hw.clwb = leaf7.ebx & (1 << 24) != 0;
        hw.clflushopt = leaf7.ebx & (1 << 23) != 0;
    }
    hw
}

#[cfg(not(all(target_arch = "x86_64", not(miri))))]
fn detect_hw() -> HwFlush {
    HwFlush::default()
}

/// Write back every line overlapping `[addr, addr + len)`.
///
/// # Safety
/// The range must be mapped.
#[inline]
pub unsafe fn flush_lines(method: FlushMethod, addr: *const u8, len: usize) {
    if len == 0 {
        return;
    }
    let start = (addr as usize) & !(super::CACHE_LINE as usize - 1);
    let end = addr as usize + len;
    let mut line = start;
    while line < end {
        flush_one(method, line as *const u8);
        line += super::CACHE_LINE as usize;
    }
}

#[cfg(all(target_arch = "x86_64", not(miri)))]
#[inline(always)]
unsafe fn flush_one(method: FlushMethod, line: *const u8) {
    use std::arch::asm;
    match method {
        // SAFETY (all arms): `line` is mapped (caller's contract); the
        // instruction was detected by CPUID.
        FlushMethod::Clwb => asm!("clwb [{}]", in(reg) line, options(nostack, preserves_flags)),
        FlushMethod::Clflushopt => {
            asm!("clflushopt [{}]", in(reg) line, options(nostack, preserves_flags))
        }
        FlushMethod::Clflush => std::arch::x86_64::_mm_clflush(line),
        FlushMethod::Msync | FlushMethod::None => {}
    }
}

#[cfg(not(all(target_arch = "x86_64", not(miri))))]
#[inline(always)]
unsafe fn flush_one(_method: FlushMethod, _line: *const u8) {}

/// Store fence: orders flushes and non-temporal stores before later stores.
#[inline]
pub fn sfence() {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: sfence has no memory operands.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

/// Copy `src` to `dst` with non-temporal stores where alignment allows, and
/// write back the (at most two) partial lines at the edges. Durable after
/// the next `sfence`.
///
/// # Safety
/// `dst..dst+src.len()` must be mapped and writable, not overlapping `src`.
#[inline]
pub unsafe fn copy_nt(method: FlushMethod, dst: *mut u8, src: &[u8]) {
    if method == FlushMethod::None || method == FlushMethod::Msync {
        std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len());
        return;
    }
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        copy_nt_x86(method, dst, src);
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len());
}

#[cfg(all(target_arch = "x86_64", not(miri)))]
#[inline]
unsafe fn copy_nt_x86(method: FlushMethod, dst: *mut u8, src: &[u8]) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    let len = src.len();
    // Head up to the first 16-byte boundary and tail after the last one go
    // through the cache and are written back explicitly.
    let head = ((16 - (dst as usize & 15)) & 15).min(len);
    let body = (len - head) & !15;
    let tail = len - head - body;
    if head > 0 {
        std::ptr::copy_nonoverlapping(src.as_ptr(), dst, head);
        flush_lines(method, dst, head);
    }
    let mut i = head;
    while i < head + body {
        // SAFETY: dst+i is 16-byte aligned; src is read unaligned.
        let v = _mm_loadu_si128(src.as_ptr().add(i) as *const __m128i);
        _mm_stream_si128(dst.add(i) as *mut __m128i, v);
        i += 16;
    }
    if tail > 0 {
        std::ptr::copy_nonoverlapping(src.as_ptr().add(i), dst.add(i), tail);
        flush_lines(method, dst.add(i), tail);
    }
}

/// Software prefetch of the line at `p` (a hint: never faults, changes
/// nothing). On x86 it also walks the page tables when the address is not
/// in the TLB, which is what callers want from it.
#[inline]
pub fn prefetch(p: *const u8) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: a prefetch of any address is architecturally a no-op hint.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_NTA }>(p as *const i8)
    };
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    let _ = p;
}

/// Zero with non-temporal stores; durable after the next `sfence`.
///
/// # Safety
/// `dst..dst+len` must be mapped and writable.
pub unsafe fn zero_nt(method: FlushMethod, dst: *mut u8, len: usize) {
    // A `static`, not a `const`: slicing a const array materialises a 4 KiB
    // copy on the stack at every iteration.
    static ZEROS: [u8; 4096] = [0; 4096];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(ZEROS.len());
        copy_nt(method, dst.add(done), &ZEROS[..n]);
        done += n;
    }
}
