//! Profiling aid: `client_loop FILE [N] [seq|rand|append]` attaches to the
//! inkfs mount FILE is on as a client of the kernel-free path and runs N
//! served 4 KiB writes of FILE + fdatasync through `inkfs::api::client`
//! (no preload library, no interposer): sequential overwrites of a 32 MiB
//! file (wrapping), random ones, or O_APPEND appends (truncated to 0 every
//! 5000, as append_loop does). Prints the mean wall
//! and CPU time per write + fdatasync, for comparison with the same loop
//! through the preload library and with the engine's own (append_loop).
use inkfs::api::client;
use inkfs::api::{Credentials, OpenFlags};

fn cpu_ns() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let t = |v: libc::timeval| v.tv_sec as f64 * 1e9 + v.tv_usec as f64 * 1e3;
    t(u.ru_utime) + t(u.ru_stime)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let path = std::path::PathBuf::from(
        args.next()
            .expect("usage: client_loop FILE [N] [seq|rand|append]"),
    );
    let n: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(200_000);
    let how = args.next().unwrap_or_else(|| "seq".into());
    const PAGES: u64 = 8192;
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .expect("create the file through the mount");
    let c = client::attach(&path).expect("attach");
    let root = Credentials::root();
    let attr = c
        .resolve_path(&root, &path, inkfs::api::Follow::Yes)
        .expect("resolve");
    let mut flags = libc::O_RDWR;
    if how == "append" {
        flags |= libc::O_APPEND;
    }
    let f = c
        .open(&root, attr.ino, OpenFlags::new(flags))
        .expect("open");
    let page = vec![0x5au8; 4096];
    if how != "append" {
        for p in 0..PAGES {
            c.pwrite(&f, p * 4096, &page).expect("lay out");
        }
    }
    let mut x = 88172645463325252u64;
    let (t0, c0) = (std::time::Instant::now(), cpu_ns());
    for i in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        match how.as_str() {
            "rand" => {
                c.pwrite(&f, (x % PAGES) * 4096, &page).expect("write");
            }
            "append" => {
                // As append_loop: the file stays small (truncated every
                // 5000 appends).
                if i % 5_000 == 4_999 {
                    c.truncate(&root, &f, 0).expect("truncate");
                }
                c.append(&f, &page).expect("append");
            }
            _ => {
                c.pwrite(&f, (i % PAGES) * 4096, &page).expect("write");
            }
        }
        c.fsync(&f, true).expect("fsync");
    }
    let (wall, cpu) = (t0.elapsed().as_nanos() as f64, cpu_ns() - c0);
    println!(
        "client {how}: wall_ns {:.0} cpu_ns {:.0} per write + fdatasync",
        wall / n as f64,
        cpu / n as f64
    );
    c.release(f);
}
