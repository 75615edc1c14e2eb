//! Several threads on one inkfs_t: I/O on their own descriptors, on one
//! shared descriptor (whose offset they share), and opens, dups and
//! closes churning the descriptor table meanwhile.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;

use common::Pool;

const THREADS: usize = 4;
const CHUNK: usize = 4096;

fn pattern(tag: u64, index: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(CHUNK);
    while v.len() < CHUNK {
        v.extend_from_slice(&(tag << 32 | index).to_le_bytes());
    }
    v
}

/// Each thread writes and reads back its own file; meanwhile another
/// thread opens, dups and closes descriptors as fast as it can, so the
/// table's slots are reused under the I/O.
#[test]
fn threads_on_their_own_descriptors_with_table_churn() {
    let pool = Arc::new(Pool::new("threads-own"));
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let (pool, stop) = (pool.clone(), stop.clone());
        thread::spawn(move || {
            let mut rounds = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let fd = pool
                    .open("churn", libc::O_CREAT | libc::O_RDWR, 0o644)
                    .expect("open churn");
                // SAFETY: a live mount.
                let dup = unsafe { inkfs_capi::inkfs_dup(pool.fs, fd) };
                assert!(dup >= 0);
                pool.close(fd).expect("close");
                pool.close(dup).expect("close dup");
                rounds += 1;
            }
            rounds
        })
    };
    let workers: Vec<_> = (0..THREADS as u64)
        .map(|t| {
            let pool = pool.clone();
            thread::spawn(move || {
                let name = format!("own{t}");
                let fd = pool
                    .open(&name, libc::O_CREAT | libc::O_RDWR, 0o644)
                    .expect("open own file");
                for round in 0..3u64 {
                    for i in 0..64u64 {
                        let data = pattern(t * 10 + round, i);
                        let n = pool.pwrite(fd, &data, (i as usize * CHUNK) as i64);
                        assert_eq!(n, Ok(CHUNK as isize));
                    }
                    let mut buf = vec![0u8; CHUNK];
                    for i in 0..64u64 {
                        let n = pool.pread(fd, &mut buf, (i as usize * CHUNK) as i64);
                        assert_eq!(n, Ok(CHUNK));
                        assert!(buf == pattern(t * 10 + round, i), "thread {t} chunk {i}");
                    }
                }
                pool.close(fd).expect("close own file");
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker");
    }
    stop.store(true, Ordering::Relaxed);
    let rounds = churn.join().expect("churn thread");
    assert!(rounds > 0);
    let pool = Arc::into_inner(pool).expect("threads joined");
    pool.unmount().expect("unmount");
}

/// Threads appending through one O_APPEND descriptor: every record lands
/// whole, none lost, none overlapping.
#[test]
fn appends_through_one_descriptor_land_whole() {
    let pool = Arc::new(Pool::new("threads-append"));
    let fd = pool
        .open(
            "log",
            libc::O_CREAT | libc::O_WRONLY | libc::O_APPEND,
            0o644,
        )
        .expect("open log");
    const RECORDS: u64 = 200;
    let workers: Vec<_> = (0..THREADS as u64)
        .map(|t| {
            let pool = pool.clone();
            thread::spawn(move || {
                for i in 0..RECORDS {
                    let rec = pattern(t, i);
                    assert_eq!(pool.write(fd, &rec[..512]), Ok(512));
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker");
    }
    let total = THREADS as u64 * RECORDS * 512;
    assert_eq!(pool.lseek(fd, 0, libc::SEEK_CUR), Ok(total as i64));
    pool.close(fd).expect("close");
    let fd = pool.open("log", libc::O_RDONLY, 0).expect("reopen");
    let mut seen = vec![vec![false; RECORDS as usize]; THREADS];
    let mut rec = vec![0u8; 512];
    for _ in 0..THREADS as u64 * RECORDS {
        assert_eq!(pool.read(fd, &mut rec), Ok(512));
        let word = u64::from_le_bytes(rec[..8].try_into().expect("8 bytes"));
        let (t, i) = ((word >> 32) as usize, (word & 0xffff_ffff) as usize);
        assert!(rec == pattern(t as u64, i as u64)[..512], "a torn record");
        assert!(!seen[t][i], "record {t}/{i} twice");
        seen[t][i] = true;
    }
    assert_eq!(pool.read(fd, &mut rec), Ok(0), "nothing past the records");
    pool.close(fd).expect("close");
}

/// Threads reading through one descriptor share its offset: between
/// them they read every chunk exactly once (the offset is locked across
/// each read, as Linux's f_pos_lock does).
#[test]
fn reads_through_one_descriptor_share_its_offset() {
    let pool = Arc::new(Pool::new("threads-shared"));
    const CHUNKS: u64 = 256;
    let fd = pool
        .open("data", libc::O_CREAT | libc::O_RDWR, 0o644)
        .expect("open");
    for i in 0..CHUNKS {
        assert_eq!(pool.write(fd, &pattern(7, i)), Ok(CHUNK as isize));
    }
    assert_eq!(pool.lseek(fd, 0, libc::SEEK_SET), Ok(0));
    // SAFETY: a live mount; the dup shares the description and offset.
    let dup = unsafe { inkfs_capi::inkfs_dup(pool.fs, fd) };
    assert!(dup >= 0);
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let pool = pool.clone();
            let my_fd = if t % 2 == 0 { fd } else { dup };
            thread::spawn(move || {
                let mut got = Vec::new();
                let mut buf = vec![0u8; CHUNK];
                loop {
                    let n = pool.read(my_fd, &mut buf).expect("read");
                    if n == 0 {
                        break got;
                    }
                    assert_eq!(n, CHUNK);
                    let word = u64::from_le_bytes(buf[..8].try_into().expect("8 bytes"));
                    let i = word & 0xffff_ffff;
                    assert!(buf == pattern(7, i), "chunk {i} read whole");
                    got.push(i);
                }
            })
        })
        .collect();
    let mut all: Vec<u64> = workers
        .into_iter()
        .flat_map(|w| w.join().expect("worker"))
        .collect();
    all.sort_unstable();
    assert_eq!(all, (0..CHUNKS).collect::<Vec<_>>(), "each chunk once");
    pool.close(fd).expect("close");
    pool.close(dup).expect("close dup");
}
