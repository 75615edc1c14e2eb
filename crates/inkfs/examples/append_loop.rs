//! Profiling aid: `append_loop [N] [append|overwrite]` runs N strict-mode
//! 4 KiB appends + fdatasync, or N random 4 KiB overwrites of a 16 MiB
//! file, on a /dev/shm pool (for perf and callgrind).
use inkfs::pmem::{MappedPool, PoolOpenOptions};
use inkfs::types::*;
use inkfs::Fs;
fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(200_000);
    let overwrite = std::env::args().nth(2).as_deref() == Some("overwrite");
    // File pages for overwrites (default 4096: 16 MiB).
    let pages: u64 = std::env::args()
        .nth(3)
        .and_then(|s| s.parse().ok())
        .unwrap_or(4096);
    let path = std::path::PathBuf::from(format!(
        "/dev/shm/inkfs-append-loop-{}.pool",
        std::process::id()
    ));
    let pm = MappedPool::open(
        &path,
        &PoolOpenOptions {
            create_size_bytes: Some(256 << 20),
            read_only: false,
        },
    )
    .expect("pool");
    inkfs::pmem::prefault(&pm);
    Fs::format(&pm, &FormatOptions::default()).expect("mkfs");
    let fs = Fs::mount(pm, MountOptions::default()).expect("mount");
    let page = vec![7u8; 4096];
    let (_, fh) = fs.create(1, b"f", 0o644, 0, 0).expect("create");
    if overwrite {
        for p in 0..pages {
            fs.write(&fh, p * 4096, &page).expect("fill");
        }
    }
    let t = std::time::Instant::now();
    let mut x = 88172645463325252u64;
    for i in 0..n {
        if overwrite {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            fs.write(&fh, (x % pages) * 4096, &page).expect("overwrite");
        } else {
            if i % 5_000 == 4_999 {
                fs.setattr(
                    fh.ino(),
                    &SetAttr {
                        size: Some(0),
                        ..Default::default()
                    },
                )
                .expect("truncate");
            }
            fs.append(&fh, &page).expect("append");
            fs.fsync(&fh, true).expect("fsync");
        }
    }
    println!(
        "{:.0} ns/op; log pages {}; {:?}",
        t.elapsed().as_nanos() as f64 / n as f64,
        fs.log_pages(fh.ino()).unwrap_or(0),
        fs.gc_stats()
    );
    let _ = std::fs::remove_file(&path);
}
