//! Persistence-layer overhead: each operation through `MappedPool` next to
//! the same operation done with raw instructions (the machine floor), in
//! one run, on a pool in /dev/shm (DRAM standing in for PM).
//!
//! `cargo bench -p inkfs --bench persist [-- --quick]`
//!
//! Every figure is the median over several runs of the mean time per
//! operation within a run. Runs of all operations are interleaved so that
//! drift (frequency, neighbours) hits ours and the floor alike.

use std::hint::black_box;
use std::path::PathBuf;
use std::time::Instant;

use inkfs::pmem::{FlushMethod, MappedPool, Pmem, PoolOpenOptions};
use inkfs::testkit::median;

const POOL_BYTES: u64 = 64 << 20;
/// Operations rotate through this window (fits in L2), the same for ours
/// and the floor.
const WINDOW_BYTES: u64 = 256 << 10;
const PAGE_BYTES: usize = 4096;

struct Config {
    runs: usize,
    iters_small: u64,
    iters_page: u64,
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let config = if quick {
        Config {
            runs: 7,
            iters_small: 20_000,
            iters_page: 4_000,
        }
    } else {
        Config {
            runs: 11,
            iters_small: 200_000,
            iters_page: 40_000,
        }
    };
    let path = pool_path();
    let result = run(&path, &config);
    let _ = std::fs::remove_file(&path);
    if let Err(e) = result {
        eprintln!("persist bench: {e}");
        std::process::exit(1);
    }
}

fn pool_path() -> PathBuf {
    PathBuf::from(format!(
        "/dev/shm/inkfs-bench-persist-{}.pool",
        std::process::id()
    ))
}

/// One benchmarked operation: `f(i)` performs iteration `i`.
struct Op<'a> {
    name: &'static str,
    /// Index of the floor row this is compared with (None: it is a floor or
    /// a baseline).
    floor: Option<usize>,
    iters: u64,
    f: Box<dyn FnMut(u64) + 'a>,
    samples_ns: Vec<f64>,
}

fn run(path: &std::path::Path, config: &Config) -> std::io::Result<()> {
    let opts = PoolOpenOptions {
        create_size_bytes: Some(POOL_BYTES),
        read_only: false,
    };
    let pool = MappedPool::open(path, &opts)?;
    let info = pool.info();
    let flush = info.flush;
    println!(
        "pool: {} ({}), flush: {}",
        path.display(),
        info.kind.describe(),
        flush.name()
    );
    if matches!(flush, FlushMethod::Msync | FlushMethod::None) {
        return Err(std::io::Error::other(
            "the bench needs a DRAM pool with CPU flushes",
        ));
    }
    // Fault every page in before timing.
    pool.zero_nt(0, POOL_BYTES);
    pool.fence();

    let base = raw_base(&pool);
    let line = [0x5au8; 64];
    let page = vec![0xa5u8; PAGE_BYTES];
    let mut dram = vec![0u8; WINDOW_BYTES as usize];
    let dram_ptr = dram.as_mut_ptr();
    let small = config.iters_small;
    let pages = config.iters_page;
    let avx2 = is_x86_feature_detected!("avx2");

    let line_off = |i: u64| (i * 64) % WINDOW_BYTES;
    let page_off = |i: u64| (i * PAGE_BYTES as u64) % WINDOW_BYTES;

    let mut ops: Vec<Op> = Vec::new();
    // Floors: raw instructions, no abstraction (rows 0..=3).
    add(
        &mut ops,
        "floor: 64 B store + flush + sfence",
        None,
        small,
        Box::new(|i| {
            // SAFETY: in range of the mapping; `line` is separate memory.
            unsafe { raw_store_flush(flush, base.add(line_off(i) as usize), &line, 1) }
        }),
    );
    add(
        &mut ops,
        "floor: 4 KiB stream (SSE2) + sfence",
        None,
        pages,
        Box::new(|i| {
            // SAFETY: page-aligned, in range of the mapping.
            unsafe { raw_stream_sse2(base.add(page_off(i) as usize), &page) }
        }),
    );
    add(
        &mut ops,
        "floor: 4 KiB memcpy + 64 flush + sfence",
        None,
        pages,
        Box::new(|i| {
            // SAFETY: in range of the mapping.
            unsafe { raw_store_flush(flush, base.add(page_off(i) as usize), &page, 64) }
        }),
    );
    add(
        &mut ops,
        "floor: commit (64 B + 8 B tail, 2 fences)",
        None,
        small,
        Box::new(|i| {
            let entry = base.wrapping_add(line_off(i) as usize);
            let tail = base.wrapping_add((WINDOW_BYTES + 64 * (i % 8)) as usize);
            // SAFETY: both ranges lie inside the mapping.
            unsafe {
                raw_store_flush(flush, entry, &line, 1);
                raw_store_flush(flush, tail, &i.to_le_bytes(), 1);
            }
        }),
    );
    // Ours (rows 4..=7), compared with the floors above.
    let p = &pool;
    add(
        &mut ops,
        "ours: 64 B write + persist",
        Some(0),
        small,
        Box::new(move |i| {
            let off = line_off(i);
            p.write(off, &line);
            p.persist(off, 64);
        }),
    );
    add(
        &mut ops,
        "ours: 4 KiB copy_nt + fence",
        Some(1),
        pages,
        Box::new(|i| {
            p.copy_nt(page_off(i), &page);
            p.fence();
        }),
    );
    add(
        &mut ops,
        "ours: 4 KiB write + flush + fence",
        Some(2),
        pages,
        Box::new(|i| {
            let off = page_off(i);
            p.write(off, &page);
            p.persist(off, PAGE_BYTES as u64);
        }),
    );
    add(
        &mut ops,
        "ours: commit (64 B + write_u64 tail)",
        Some(3),
        small,
        Box::new(move |i| {
            let off = line_off(i);
            p.write(off, &line);
            p.persist(off, 64);
            let tail = WINDOW_BYTES + 64 * (i % 8);
            p.write_u64(tail, i);
            p.persist(tail, 8);
        }),
    );
    // Baselines: not durable at all.
    add(
        &mut ops,
        "baseline: 64 B memcpy to DRAM",
        None,
        small,
        Box::new(move |i| {
            // SAFETY: in range of `dram`.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    line.as_ptr(),
                    dram_ptr.add(line_off(i) as usize),
                    64,
                );
            }
            black_box(dram_ptr);
        }),
    );
    add(
        &mut ops,
        "baseline: 4 KiB memcpy to DRAM",
        None,
        pages,
        Box::new(|i| {
            // SAFETY: in range of `dram`.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    page.as_ptr(),
                    dram_ptr.add(page_off(i) as usize),
                    PAGE_BYTES,
                );
            }
            black_box(dram_ptr);
        }),
    );
    if avx2 {
        add(
            &mut ops,
            "floor: 4 KiB stream (AVX2) + sfence",
            None,
            pages,
            Box::new(|i| {
                // SAFETY: AVX2 detected; page-aligned, in range of the mapping.
                unsafe { raw_stream_avx2(base.add(page_off(i) as usize), &page) }
            }),
        );
    }

    for _ in 0..config.runs {
        for op in ops.iter_mut() {
            op.samples_ns.push(time_ns(op.iters, &mut op.f));
        }
    }
    print_table(&ops);
    drop(ops);
    drop(dram);
    Ok(())
}

fn add<'a>(
    ops: &mut Vec<Op<'a>>,
    name: &'static str,
    floor: Option<usize>,
    iters: u64,
    f: Box<dyn FnMut(u64) + 'a>,
) {
    ops.push(Op {
        name,
        floor,
        iters,
        f,
        samples_ns: Vec::new(),
    });
}

/// Mean ns per iteration of `iters` calls, after a short warm-up.
fn time_ns(iters: u64, f: &mut dyn FnMut(u64)) -> f64 {
    for i in 0..iters / 10 {
        f(i);
    }
    let start = Instant::now();
    for i in 0..iters {
        f(i);
    }
    start.elapsed().as_nanos() as f64 / iters as f64
}

fn print_table(ops: &[Op]) {
    let medians: Vec<f64> = ops.iter().map(|op| median(&op.samples_ns)).collect();
    println!(
        "{:<44} {:>10} {:>14}",
        "operation", "ns median", "ours / floor"
    );
    for (op, ns) in ops.iter().zip(&medians) {
        let ratio = op
            .floor
            .map_or(String::new(), |f| format!("{:.2}", ns / medians[f]));
        println!("{:<44} {:>10.1} {:>14}", op.name, ns, ratio);
    }
}

/// A second mapping of the pool file for the floor rows: the pool does not
/// hand out raw pointers, and both mappings share the same physical pages.
fn raw_base(pool: &MappedPool) -> *mut u8 {
    use std::os::unix::io::AsRawFd;
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(pool.path())
    {
        Ok(file) => file,
        Err(e) => panic!("reopen {}: {e}", pool.path().display()),
    };
    // SAFETY: a fresh shared mapping of the whole pool file; it is never
    // unmapped (the process exits after the bench).
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            POOL_BYTES as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    assert!(
        ptr != libc::MAP_FAILED,
        "mmap: {}",
        std::io::Error::last_os_error()
    );
    // Fault it in.
    // SAFETY: the mapping is POOL_BYTES long and writable.
    unsafe { std::ptr::write_bytes(ptr.cast::<u8>(), 0, POOL_BYTES as usize) };
    ptr.cast()
}

/// Store `src`, write back `lines` lines with the raw instruction, sfence.
///
/// # Safety
/// `dst..dst + src.len()` is mapped and writable.
#[inline(always)]
unsafe fn raw_store_flush(method: FlushMethod, dst: *mut u8, src: &[u8], lines: usize) {
    use std::arch::asm;
    std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len());
    for l in 0..lines {
        let p = dst.add(l * 64);
        match method {
            FlushMethod::Clwb => asm!("clwb [{}]", in(reg) p, options(nostack, preserves_flags)),
            FlushMethod::Clflushopt => {
                asm!("clflushopt [{}]", in(reg) p, options(nostack, preserves_flags))
            }
            _ => std::arch::x86_64::_mm_clflush(p),
        }
    }
    std::arch::x86_64::_mm_sfence();
}

/// # Safety
/// `dst` is 16-byte aligned and `dst..dst + src.len()` mapped and writable.
#[inline(always)]
unsafe fn raw_stream_sse2(dst: *mut u8, src: &[u8]) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    for i in (0..src.len()).step_by(16) {
        let v = _mm_loadu_si128(src.as_ptr().add(i).cast::<__m128i>());
        _mm_stream_si128(dst.add(i).cast::<__m128i>(), v);
    }
    _mm_sfence();
}

/// # Safety
/// AVX2 is available; `dst` is 32-byte aligned and the range mapped.
#[target_feature(enable = "avx2")]
unsafe fn raw_stream_avx2(dst: *mut u8, src: &[u8]) {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm256_stream_si256, _mm_sfence};
    for i in (0..src.len()).step_by(32) {
        let v = _mm256_loadu_si256(src.as_ptr().add(i).cast::<__m256i>());
        _mm256_stream_si256(dst.add(i).cast::<__m256i>(), v);
    }
    _mm_sfence();
}
