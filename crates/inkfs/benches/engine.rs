//! Engine latencies through the library API (no kernel crossing), next to
//! the machine's persistence floor and to tmpfs through std::fs, measured
//! in one run on this machine (pool in /dev/shm, DRAM standing in for PM).
//!
//! `cargo bench -p inkfs --bench engine [-- --quick]`
//! (`INKFS_BENCH_DIR=/dev/hugepages` for a pool in 2 MiB pages)
//!
//! Each figure is the median over runs of the mean latency of a batch; runs
//! of the contenders are interleaved so drift hits them alike.

use std::fs::File;
use std::hint::black_box;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::Instant;

use inkfs::pmem::{MappedPool, Pmem, PoolOpenOptions};
use inkfs::testkit::median;
use inkfs::types::*;
use inkfs::Fs;

const POOL_BYTES: u64 = 2 << 30;
const PAGE: usize = 4096;

struct Cfg {
    runs: usize,
    batch: u64,
    overwrite_file_pages: u64,
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let cfg = if quick {
        Cfg {
            runs: 5,
            batch: 2_000,
            overwrite_file_pages: 4096,
        }
    } else {
        Cfg {
            runs: 11,
            batch: 20_000,
            overwrite_file_pages: 16384,
        }
    };
    // INKFS_BENCH_DIR puts the pool elsewhere, e.g. on hugetlbfs (DRAM in
    // 2 MiB pages, as device DAX maps PM) or a DAX file system.
    let dir = std::env::var("INKFS_BENCH_DIR").unwrap_or_else(|_| "/dev/shm".into());
    let pool = PathBuf::from(format!(
        "{dir}/inkfs-bench-engine-{}.pool",
        std::process::id()
    ));
    let tmp = PathBuf::from(format!(
        "/dev/shm/inkfs-bench-engine-{}.tmpfs",
        std::process::id()
    ));
    let r = run(&pool, &tmp, &cfg);
    let _ = std::fs::remove_file(&pool);
    let _ = std::fs::remove_dir_all(&tmp);
    if let Err(e) = r {
        eprintln!("engine bench: {e}");
        std::process::exit(1);
    }
}

/// Mean ns per op of `n` calls of `f`.
fn time_batch(n: u64, mut f: impl FnMut(u64)) -> f64 {
    let t = Instant::now();
    for i in 0..n {
        f(i);
    }
    t.elapsed().as_nanos() as f64 / n as f64
}

/// A deterministic pseudo-random page index.
fn rand_page(i: u64, pages: u64) -> u64 {
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    (x ^ (x >> 29)) % pages
}

fn run(pool: &std::path::Path, tmp: &std::path::Path, cfg: &Cfg) -> Result<(), String> {
    let pm = MappedPool::open(
        pool,
        &PoolOpenOptions {
            create_size_bytes: Some(POOL_BYTES),
            read_only: false,
        },
    )
    .map_err(|e| e.to_string())?;
    // Steady state: take tmpfs's first-touch page faults before measuring.
    inkfs::pmem::prefault(&pm);
    Fs::format(&pm, &FormatOptions::default()).map_err(|e| e.to_string())?;
    let info = pm.info();
    println!(
        "pool {} ({}, flush {}), {} runs x {} ops",
        pool.display(),
        info.kind.describe(),
        info.flush.name(),
        cfg.runs,
        cfg.batch
    );
    std::fs::create_dir_all(tmp).map_err(|e| e.to_string())?;

    let page = vec![0x5au8; PAGE];
    let mut rows: Vec<(&str, Vec<f64>)> = Vec::new();
    let push = |name: &'static str, v: f64, rows: &mut Vec<(&'static str, Vec<f64>)>| match rows
        .iter_mut()
        .find(|(n, _)| *n == name)
    {
        Some((_, s)) => s.push(v),
        None => rows.push((name, vec![v])),
    };

    let mut pm = Some(pm);
    for mode in [Mode::Strict, Mode::Sync, Mode::Posix] {
        let fs = Fs::mount(
            pm.take().expect("pool"),
            MountOptions {
                mode,
                read_only: false,
                ..Default::default()
            },
        )
        .map_err(|e| e.to_string())?;
        // A file for random overwrites, fully written first.
        let (_, ow) = fs
            .create(1, format!("ow-{}", mode.name()).as_bytes(), 0o644, 0, 0)
            .map_err(|e| e.to_string())?;
        for p in 0..cfg.overwrite_file_pages {
            fs.write(&ow, p * PAGE as u64, &page)
                .map_err(|e| e.to_string())?;
        }
        let tmp_ow = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(tmp.join(format!("ow-{}", mode.name())))
            .map_err(|e| e.to_string())?;
        for p in 0..cfg.overwrite_file_pages {
            tmp_ow
                .write_all_at(&page, p * PAGE as u64)
                .map_err(|e| e.to_string())?;
        }
        for _ in 0..cfg.runs {
            if mode == Mode::Strict {
                // The floor: 4 KiB non-temporal copy + fence, then a 64 B
                // persist. Measured in chunks alternating with the appends
                // it is the baseline of, so both see the same machine (a
                // neighbour's burst would otherwise land on one of them).
                let floor_base = POOL_BYTES - (64 << 20);
                let (_, fh) = fs
                    .create(1, b"append", 0o644, 0, 0)
                    .map_err(|e| e.to_string())?;
                const CHUNKS: u64 = 20;
                let chunk = (cfg.batch / CHUNKS).max(1);
                let (mut floor_ns, mut append_ns) = (0.0, 0.0);
                for c in 0..CHUNKS {
                    floor_ns += time_batch(chunk, |i| {
                        let off = floor_base + ((c * chunk + i) % 8192) * PAGE as u64;
                        let pm = fs.pmem();
                        pm.copy_nt(off, &page);
                        pm.fence();
                        pm.write(off, &page[..64]);
                        pm.persist(off, 64);
                    });
                    append_ns += time_batch(chunk, |_| {
                        fs.append(&fh, &page).expect("append");
                        fs.fsync(&fh, true).expect("fsync");
                    });
                }
                let chunks = CHUNKS as f64;
                push(
                    "floor: 4 KiB nt copy + fence + 64 B persist",
                    floor_ns / chunks,
                    &mut rows,
                );
                let v = append_ns / chunks;
                push("inkfs strict: 4 KiB append + fdatasync", v, &mut rows);
                fs.release(fh);
                fs.unlink(1, b"append").map_err(|e| e.to_string())?;

                let f = File::create(tmp.join("append")).map_err(|e| e.to_string())?;
                let v = time_batch(cfg.batch, |_| {
                    use std::io::Write;
                    (&f).write_all(&page).expect("write");
                    f.sync_data().expect("sync");
                });
                push("tmpfs: 4 KiB append + fdatasync", v, &mut rows);
                drop(f);
                let _ = std::fs::remove_file(tmp.join("append"));

                fs.mkdir(1, b"d", 0o755, 0, 0).map_err(|e| e.to_string())?;
                let d = fs.lookup(1, b"d").map_err(|e| e.to_string())?.ino;
                let names: Vec<Vec<u8>> = (0..cfg.batch)
                    .map(|i| format!("f{i}").into_bytes())
                    .collect();
                let v = time_batch(cfg.batch, |i| {
                    let (_, fh) = fs
                        .create(d, &names[i as usize], 0o644, 0, 0)
                        .expect("create");
                    fs.release(fh);
                });
                push("inkfs strict: create", v, &mut rows);
                let v = time_batch(cfg.batch, |i| {
                    fs.unlink(d, &names[i as usize]).expect("unlink")
                });
                push("inkfs strict: unlink", v, &mut rows);
                fs.rmdir(1, b"d").map_err(|e| e.to_string())?;

                let td = tmp.join("d");
                std::fs::create_dir_all(&td).map_err(|e| e.to_string())?;
                let paths: Vec<PathBuf> =
                    (0..cfg.batch).map(|i| td.join(format!("f{i}"))).collect();
                let v = time_batch(cfg.batch, |i| {
                    drop(File::create_new(&paths[i as usize]).expect("create"))
                });
                push("tmpfs: create", v, &mut rows);
                let v = time_batch(cfg.batch, |i| {
                    std::fs::remove_file(&paths[i as usize]).expect("unlink")
                });
                push("tmpfs: unlink", v, &mut rows);
            }
            let pages = cfg.overwrite_file_pages;
            let v = time_batch(cfg.batch, |i| {
                fs.write(&ow, rand_page(i, pages) * PAGE as u64, &page)
                    .expect("overwrite");
            });
            push(
                match mode {
                    Mode::Strict => "inkfs strict: 4 KiB random overwrite",
                    Mode::Sync => "inkfs sync: 4 KiB random overwrite",
                    Mode::Posix => "inkfs posix: 4 KiB random overwrite",
                },
                v,
                &mut rows,
            );
            if mode == Mode::Strict {
                let v = time_batch(cfg.batch, |i| {
                    tmp_ow
                        .write_all_at(&page, rand_page(i, pages) * PAGE as u64)
                        .expect("pwrite");
                });
                push("tmpfs: 4 KiB random overwrite", v, &mut rows);
                let mut buf = vec![0u8; PAGE];
                let v = time_batch(cfg.batch, |i| {
                    black_box(
                        fs.read(&ow, rand_page(i, pages) * PAGE as u64, &mut buf)
                            .expect("read"),
                    );
                });
                push("inkfs: 4 KiB random read", v, &mut rows);
                let v = time_batch(cfg.batch, |i| {
                    black_box(
                        tmp_ow
                            .read_at(&mut buf, rand_page(i, pages) * PAGE as u64)
                            .expect("read"),
                    );
                });
                push("tmpfs: 4 KiB random read", v, &mut rows);
            }
        }
        fs.release(ow);
        pm = Some(fs.unmount().map_err(|e| e.to_string())?);
    }

    // Each run measured the floor in chunks alternating with the appends:
    // the median of the runs' own ratios.
    let runs = |n: &str| rows.iter().find(|(r, _)| *r == n).map(|(_, v)| v.clone());
    let paired = match (
        runs("inkfs strict: 4 KiB append + fdatasync"),
        runs("floor: 4 KiB nt copy + fence + 64 B persist"),
    ) {
        (Some(a), Some(f)) => {
            let r: Vec<f64> = a.iter().zip(&f).map(|(a, f)| a / f).collect();
            median(&r)
        }
        _ => f64::NAN,
    };
    let med: Vec<(&str, f64)> = rows.iter().map(|(n, v)| (*n, median(v))).collect();
    let get = |name: &str| {
        med.iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| *v)
            .unwrap_or(f64::NAN)
    };
    println!("\n{:<48} {:>10}  ratio", "operation", "ns (med)");
    for (name, v) in &med {
        let ratio = if name.starts_with("inkfs strict: 4 KiB append") {
            format!(
                "{:.2}x floor (median of the runs' own ratios: {paired:.2}x)",
                v / get("floor: 4 KiB nt copy + fence + 64 B persist")
            )
        } else if let Some(op) = name
            .strip_prefix("inkfs strict: ")
            .or_else(|| name.strip_prefix("inkfs sync: "))
            .or_else(|| name.strip_prefix("inkfs posix: "))
            .or_else(|| name.strip_prefix("inkfs: "))
        {
            let base = get(&format!("tmpfs: {op}"));
            if base.is_nan() {
                String::new()
            } else {
                format!("{:.2}x tmpfs", v / base)
            }
        } else {
            String::new()
        };
        println!("{name:<48} {v:>10.0}  {ratio}");
    }
    Ok(())
}
