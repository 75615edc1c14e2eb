//! Mount time after a clean unmount and after a crash, against the number
//! of files (issue: recovery). Pools in /dev/shm.
//!
//! `cargo bench -p inkfs --bench mount [-- --quick | --full]`
//! default: 10k and 100k files; --full adds 1M; --quick: 10k only.

use std::path::PathBuf;
use std::time::Instant;

use inkfs::pmem::{MappedPool, PoolOpenOptions};
use inkfs::types::*;
use inkfs::Fs;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let counts: &[u64] = if args.iter().any(|a| a == "--quick") {
        &[10_000]
    } else if args.iter().any(|a| a == "--full") {
        &[10_000, 100_000, 1_000_000]
    } else {
        &[10_000, 100_000]
    };
    println!(
        "{:>9}  {:>12}  {:>12}  {:>14}",
        "files", "clean (ms)", "crash (ms)", "crash scanned"
    );
    for &n in counts {
        let path = PathBuf::from(format!(
            "/dev/shm/inkfs-bench-mount-{}-{n}.pool",
            std::process::id()
        ));
        let r = measure(&path, n);
        let _ = std::fs::remove_file(&path);
        match r {
            Ok((clean, crash, scanned)) => {
                println!("{n:>9}  {clean:>12.1}  {crash:>12.1}  {scanned:>14}")
            }
            Err(e) => {
                eprintln!("mount bench: {e}");
                std::process::exit(1);
            }
        }
    }
}

fn open(path: &std::path::Path, size: Option<u64>) -> Result<MappedPool, String> {
    MappedPool::open(
        path,
        &PoolOpenOptions {
            create_size_bytes: size,
            read_only: false,
        },
    )
    .map_err(|e| e.to_string())
}

/// Returns (clean mount ms, crash mount ms, inodes scanned by the crash mount).
fn measure(path: &std::path::Path, files: u64) -> Result<(f64, f64, u64), String> {
    // Each file needs a 4 KiB log page and a data block; 1000 files a directory.
    let bytes = ((files * 8192 * 6 / 5) + (256 << 20)) & !4095;
    let pm = open(path, Some(bytes))?;
    Fs::format(&pm, &FormatOptions::default()).map_err(|e| e.to_string())?;
    let fs = Fs::mount(pm, MountOptions::default()).map_err(|e| e.to_string())?;
    let mut dir = 0;
    for i in 0..files {
        if i % 1000 == 0 {
            dir = fs
                .mkdir(1, format!("d{}", i / 1000).as_bytes(), 0o755, 0, 0)
                .map_err(|e| e.to_string())?
                .ino;
        }
        let (_, fh) = fs
            .create(dir, format!("f{i}").as_bytes(), 0o644, 0, 0)
            .map_err(|e| e.to_string())?;
        fs.write(&fh, 0, b"x").map_err(|e| e.to_string())?;
        fs.release(fh);
    }
    drop(fs.unmount().map_err(|e| e.to_string())?);

    let pm = open(path, None)?;
    let t = Instant::now();
    let fs = Fs::mount(pm, MountOptions::default()).map_err(|e| e.to_string())?;
    let clean = t.elapsed().as_secs_f64() * 1e3;
    if !fs.mount_report().allocator_restored {
        return Err("clean mount did not restore the allocator".into());
    }
    // A crash: the pool is left mounted (no unmount), then mounted again.
    drop(fs);
    let pm = open(path, None)?;
    let t = Instant::now();
    let fs = Fs::mount(pm, MountOptions::default()).map_err(|e| e.to_string())?;
    let crash = t.elapsed().as_secs_f64() * 1e3;
    let scanned = fs.mount_report().inodes_scanned;
    if scanned < files {
        return Err(format!(
            "crash mount scanned {scanned} inodes, expected at least {files}"
        ));
    }
    drop(fs.unmount().map_err(|e| e.to_string())?);
    Ok((clean, crash, scanned))
}
