//! GC effectiveness under space pressure. Log-structured file systems that
//! clean segments (NILFS2, F2FS) slow down sharply as the device fills:
//! cleaning must copy live data out of the segments it reclaims. inkfs
//! frees a displaced data block at the commit of the write that replaced
//! it and compacts only the small per-inode metadata logs, so a steady
//! overwrite workload should run as fast on a 95%-full pool as on an empty
//! one.
//!
//! Random 4 KiB overwrites in strict mode (copy-on-write: every write
//! allocates a fresh block and frees the old one) of a fixed hot set of
//! files, measured in slices of a fixed number of operations: first on the
//! nearly empty pool, then after filling the rest of the pool with cold
//! files to 95%. Same hot set in both phases, so the comparison is about
//! allocation and GC under pressure, not the CPU cache. Goal: the last
//! slices within 10% of the fresh pool's.
//!
//! `cargo bench -p inkfs --bench gc [-- --quick]` (pool in /dev/shm).

use std::path::PathBuf;
use std::time::Instant;

use inkfs::pmem::{prefault, MappedPool, PoolOpenOptions};
use inkfs::testkit::{median, Rng};
use inkfs::types::*;
use inkfs::{FileHandle, Fs};

struct Cfg {
    pool_bytes: u64,
    hot_files: u64,
    ops_per_slice: u64,
    fresh_slices: usize,
    full_slices: usize,
}

const PAGE: u64 = 4096;
const FILE_BYTES: u64 = 1 << 20;
const FILL: f64 = 0.95;

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let cfg = if quick {
        Cfg {
            pool_bytes: 128 << 20,
            hot_files: 8,
            ops_per_slice: 25_000,
            fresh_slices: 3,
            full_slices: 6,
        }
    } else {
        Cfg {
            pool_bytes: 512 << 20,
            hot_files: 16,
            ops_per_slice: 100_000,
            fresh_slices: 4,
            full_slices: 12,
        }
    };
    let path = PathBuf::from(format!(
        "/dev/shm/inkfs-bench-gc-{}.pool",
        std::process::id()
    ));
    let r = run(&path, &cfg);
    let _ = std::fs::remove_file(&path);
    if let Err(e) = r {
        eprintln!("gc bench: {e}");
        std::process::exit(1);
    }
}

fn err<E: std::fmt::Debug>(what: &str) -> impl FnOnce(E) -> String + '_ {
    move |e| format!("{what}: {e:?}")
}

struct Pool {
    fs: Fs<MappedPool>,
    hot: Vec<FileHandle>,
}

/// A formatted, prefaulted pool with the hot set written.
fn setup(path: &std::path::Path, cfg: &Cfg, chunk: &[u8]) -> Result<Pool, String> {
    let _ = std::fs::remove_file(path);
    let pm = MappedPool::open(
        path,
        &PoolOpenOptions {
            create_size_bytes: Some(cfg.pool_bytes),
            read_only: false,
        },
    )
    .map_err(err("create pool"))?;
    // Touch every page now so that tmpfs page allocation is not charged to
    // the first slices.
    prefault(&pm);
    Fs::format(&pm, &FormatOptions::default()).map_err(err("format"))?;
    let fs = Fs::mount(
        pm,
        MountOptions {
            mode: Mode::Strict,
            read_only: false,
            ..Default::default()
        },
    )
    .map_err(err("mount"))?;
    let mut hot = Vec::new();
    for i in 0..cfg.hot_files {
        let (_, fh) = fs
            .create(1, format!("hot{i}").as_bytes(), 0o644, 0, 0)
            .map_err(err("create"))?;
        fs.write(&fh, 0, chunk).map_err(err("write"))?;
        hot.push(fh);
    }
    Ok(Pool { fs, hot })
}

/// Fill the rest of the pool with cold files until FILL of it is used.
fn fill(p: &Pool, chunk: &[u8]) -> Result<(), String> {
    let fs = &p.fs;
    let t = Instant::now();
    let total = fs.statfs().blocks;
    let target_free = ((1.0 - FILL) * total as f64) as u64;
    let mut cold = 0u64;
    loop {
        let free = fs.statfs().blocks_free;
        if free <= target_free + 2 {
            break;
        }
        // Leave room for the file's log page; the last file is partial.
        let bytes = ((free - target_free - 1) * PAGE).min(FILE_BYTES);
        let (_, fh) = fs
            .create(1, format!("cold{cold}").as_bytes(), 0o644, 0, 0)
            .map_err(err("create cold"))?;
        fs.write(&fh, 0, &chunk[..bytes as usize])
            .map_err(err("fill"))?;
        fs.release(fh);
        cold += 1;
    }
    println!(
        "filled: {cold} cold files in {:.2} s, {:.1}% used ({} blocks free)",
        t.elapsed().as_secs_f64(),
        used_pct(fs),
        fs.statfs().blocks_free
    );
    Ok(())
}

fn used_pct(fs: &Fs<MappedPool>) -> f64 {
    let st = fs.statfs();
    100.0 * (st.blocks - st.blocks_free) as f64 / st.blocks as f64
}

/// One slice of random 4 KiB overwrites of the hot set: kops/s.
fn slice(p: &Pool, cfg: &Cfg, rng: &mut Rng) -> Result<f64, String> {
    let mut page = [0u8; PAGE as usize];
    let pages_per_file = FILE_BYTES / PAGE;
    let t = Instant::now();
    for _ in 0..cfg.ops_per_slice {
        let r = rng.next_u64();
        let f = &p.hot[(r % cfg.hot_files) as usize];
        let pg = (r >> 20) % pages_per_file;
        page[..8].copy_from_slice(&r.to_le_bytes());
        p.fs.write(f, pg * PAGE, &page).map_err(err("overwrite"))?;
    }
    Ok(cfg.ops_per_slice as f64 / t.elapsed().as_secs_f64() / 1e3)
}

fn max_log_pages(p: &Pool) -> u64 {
    p.hot
        .iter()
        .map(|f| p.fs.log_pages(f.ino()).unwrap_or(0))
        .max()
        .unwrap_or(0)
}

/// Two pools side by side: A stays nearly empty, B is filled to 95%.
/// A measures the fresh-pool rate first; then slices alternate A, B so
/// that the noise of a shared machine hits both alike.
fn run(base: &std::path::Path, cfg: &Cfg) -> Result<(), String> {
    let chunk = vec![0xA5u8; FILE_BYTES as usize];
    let path_a = base.with_extension("a.pool");
    let path_b = base.with_extension("b.pool");
    let result = (|| {
        let a = setup(&path_a, cfg, &chunk)?;
        let b = setup(&path_b, cfg, &chunk)?;
        println!(
            "pools {} MiB, hot set {} x 1 MiB, random 4 KiB overwrites in strict mode \
             (copy-on-write), {} ops per slice",
            cfg.pool_bytes >> 20,
            cfg.hot_files,
            cfg.ops_per_slice
        );
        let mut rng = Rng::new(0x0067_6362_656e_6368);
        slice(&a, cfg, &mut rng)?; // warm-up, not counted
        let mut first = Vec::new();
        for n in 1..=cfg.fresh_slices {
            let k = slice(&a, cfg, &mut rng)?;
            println!(
                "fresh pool slice {n}: {k:.1} kops/s ({:.1}% used)",
                used_pct(&a.fs)
            );
            first.push(k);
        }
        fill(&b, &chunk)?;
        let free_before = b.fs.statfs().blocks_free;
        println!(
            "{:>5}  {:>14}  {:>14}  {:>7}  {:>9}  {:>14}",
            "slice", "fresh kops/s", "95% kops/s", "ratio", "B used", "max log pages"
        );
        let mut ratios = Vec::new();
        let mut full = Vec::new();
        for n in 1..=cfg.full_slices {
            let ka = slice(&a, cfg, &mut rng)?;
            let kb = slice(&b, cfg, &mut rng)?;
            println!(
                "{n:>5}  {ka:>14.1}  {kb:>14.1}  {:>7.3}  {:>8.1}%  {:>14}",
                kb / ka,
                used_pct(&b.fs),
                max_log_pages(&b)
            );
            ratios.push(kb / ka);
            full.push(kb);
        }
        let free_after = b.fs.statfs().blocks_free;
        let tail = cfg.full_slices.min(3);
        let last_full = median(&full[full.len() - tail..]);
        let vs_first = last_full / median(&first);
        let paired = median(&ratios[ratios.len() - tail..]);
        println!(
            "95%-full pool, last {tail} slices: {last_full:.1} kops/s = {vs_first:.3} x the fresh \
             pool's first slices ({:.1} kops/s); paired with the fresh pool: {paired:.3} \
             (goal >= 0.90: {})",
            median(&first),
            if paired >= 0.90 { "met" } else { "MISSED" }
        );
        println!(
            "95%-full pool free blocks across the run: {free_before} -> {free_after} \
             (log pages of the hot files at most {})",
            max_log_pages(&b)
        );
        for p in [a, b] {
            for fh in p.hot {
                p.fs.release(fh);
            }
            p.fs.unmount().map_err(err("unmount"))?;
        }
        Ok(())
    })();
    let _ = std::fs::remove_file(&path_a);
    let _ = std::fs::remove_file(&path_b);
    result
}
