//! Profiling aid: N strict-mode 4 KiB appends + fdatasync on a /dev/shm pool.
use inkfs::pmem::{MappedPool, PoolOpenOptions};
use inkfs::types::*;
use inkfs::Fs;
fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(200_000);
    let path = std::path::PathBuf::from(format!(
        "/dev/shm/inkfs-append-loop-{}.pool",
        std::process::id()
    ));
    let pm = MappedPool::open(
        &path,
        &PoolOpenOptions {
            create_size_bytes: Some(64 << 20),
            read_only: false,
        },
    )
    .unwrap();
    inkfs::pmem::prefault(&pm);
    Fs::format(&pm, &FormatOptions::default()).unwrap();
    let fs = Fs::mount(pm, MountOptions::default()).unwrap();
    let page = vec![7u8; 4096];
    let (_, fh) = fs.create(1, b"f", 0o644, 0, 0).unwrap();
    let t = std::time::Instant::now();
    for i in 0..n {
        if i % 5_000 == 4_999 {
            fs.setattr(
                fh.ino(),
                &SetAttr {
                    size: Some(0),
                    ..Default::default()
                },
            )
            .unwrap();
        }
        fs.append(&fh, &page).unwrap();
        fs.fsync(&fh, true).unwrap();
    }
    println!("{:.0} ns/op", t.elapsed().as_nanos() as f64 / n as f64);
    let _ = std::fs::remove_file(&path);
}
