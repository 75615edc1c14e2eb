//! The four filebench personalities (fileserver, varmail, webserver,
//! webproxy), reproduced from filebench's workloads/*.f: the same fileset
//! (file count, mean directory width, gamma-distributed sizes around the
//! mean, preallocated share), thread count, I/O sizes and the same sequence
//! of flowops per thread loop. Throughput is counted as filebench does: one
//! op per flowop (openfile, readwholefile, appendfilerand, fsync, ...).

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use crate::backend::Backend;
use crate::rng::{file_size, seeded, Rng};
use crate::stats::round;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Personality {
    Fileserver,
    Varmail,
    Webserver,
    Webproxy,
}

impl Personality {
    pub fn parse(s: &str) -> Option<Personality> {
        Some(match s {
            "fileserver" => Personality::Fileserver,
            "varmail" => Personality::Varmail,
            "webserver" => Personality::Webserver,
            "webproxy" => Personality::Webproxy,
            _ => return None,
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            Personality::Fileserver => "fileserver",
            Personality::Varmail => "varmail",
            Personality::Webserver => "webserver",
            Personality::Webproxy => "webproxy",
        }
    }
}

#[derive(Clone, Debug)]
pub struct FbCfg {
    pub personality: Personality,
    pub nfiles: usize,
    pub dirwidth: usize,
    pub filesize: u64,
    pub gamma: f64,
    pub nthreads: usize,
    pub iosize: usize,
    pub appendsize: u64,
    pub prealloc_pct: u64,
    pub seconds: f64,
    pub seed: u64,
}

impl FbCfg {
    /// filebench's published defaults for each personality.
    pub fn published(p: Personality) -> FbCfg {
        let (nfiles, dirwidth, filesize, nthreads, prealloc_pct) = match p {
            Personality::Fileserver => (10_000, 20, 128 << 10, 50, 80),
            Personality::Varmail => (1_000, 1_000_000, 16 << 10, 16, 80),
            Personality::Webserver => (1_000, 20, 16 << 10, 100, 100),
            Personality::Webproxy => (10_000, 1_000_000, 16 << 10, 100, 80),
        };
        FbCfg {
            personality: p,
            nfiles,
            dirwidth,
            filesize,
            gamma: 1.5,
            nthreads,
            iosize: 1 << 20,
            appendsize: 16 << 10,
            prealloc_pct,
            seconds: 60.0,
            seed: 1,
        }
    }
    /// The parameters as filebench names them (bench/inkbench reports
    /// them as they are).
    pub fn json(&self) -> Value {
        json!({
            "personality": self.personality.name(),
            "nfiles": self.nfiles,
            "meandirwidth": self.dirwidth,
            "filesize": self.filesize,
            "filesizegamma": self.gamma,
            "nthreads": self.nthreads,
            "iosize": self.iosize,
            "meanappendsize": self.appendsize,
            "prealloc_pct": self.prealloc_pct,
            "seconds": self.seconds,
            "seed": self.seed,
        })
    }
}

#[derive(Clone, Copy)]
enum Op {
    Create,
    Delete,
    Open,
    Close,
    ReadWhole,
    WriteWhole,
    Append,
    Fsync,
    Stat,
}
const OP_NAMES: [&str; 9] = [
    "createfile",
    "deletefile",
    "openfile",
    "closefile",
    "readwholefile",
    "writewholefile",
    "appendfilerand",
    "fsync",
    "statfile",
];

pub struct FbResult {
    pub ops: u64,
    pub seconds: f64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub prealloc_seconds: f64,
    pub per_op: [u64; 9],
}

impl FbResult {
    /// Throughput as filebench reports it, and each flowop's count.
    pub fn json(&self) -> Value {
        let per: Map<String, Value> = OP_NAMES
            .iter()
            .zip(self.per_op.iter())
            .map(|(n, c)| (n.to_string(), (*c).into()))
            .collect();
        let rate = |x: f64| x / self.seconds;
        json!({
            "ops": self.ops,
            "seconds": round(self.seconds, 4),
            "ops_per_s": round(rate(self.ops as f64), 1),
            "read_mb_per_s": round(rate(self.read_bytes as f64 / 1e6), 2),
            "write_mb_per_s": round(rate(self.write_bytes as f64 / 1e6), 2),
            "prealloc_seconds": round(self.prealloc_seconds, 3),
            "flowops": per,
        })
    }
}

struct Slot {
    exists: Mutex<bool>,
    size: u64,
    dir: usize,
}

/// Size at which webserver's shared log is rotated (truncated): far above
/// what filebench's default run writes on a disk, far below any pool the
/// suite uses (768 MiB in --smoke).
pub const LOG_ROTATE_BYTES: u64 = 128 << 20;

struct Fileset<B: Backend> {
    dirs: Vec<B::Dir>,
    slots: Vec<Slot>,
    log_dir: B::Dir,
    /// Bytes appended to webserver's shared log since it was last rotated.
    log_bytes: AtomicU64,
}

fn name(i: usize) -> String {
    format!("f{i}")
}

impl<B: Backend> Fileset<B> {
    /// A file whose existence is `want`, locked (filebench's FSE_BUSY).
    fn pick(&self, rng: &mut Rng, want: bool) -> Option<(usize, MutexGuard<'_, bool>)> {
        for _ in 0..10_000 {
            let i = rng.scaled_below(self.slots.len() as u64) as usize;
            if let Ok(g) = self.slots[i].exists.try_lock() {
                if *g == want {
                    return Some((i, g));
                }
            }
        }
        None
    }
}

struct Thread {
    ops: u64,
    rb: u64,
    wb: u64,
    per_op: [u64; 9],
}

impl Thread {
    fn count(&mut self, op: Op) {
        self.ops += 1;
        self.per_op[op as usize] += 1;
    }
}

fn write_whole<B: Backend>(b: &B, f: &mut B::File, size: u64, buf: &[u8]) -> io::Result<u64> {
    let mut off = 0;
    while off < size {
        let n = (size - off).min(buf.len() as u64);
        b.pwrite(f, off, &buf[..n as usize])?;
        off += n;
    }
    Ok(size)
}

fn read_whole<B: Backend>(b: &B, f: &mut B::File, buf: &mut [u8]) -> io::Result<u64> {
    let mut off = 0u64;
    loop {
        let n = b.pread(f, off, buf)?;
        if n == 0 {
            return Ok(off);
        }
        off += n as u64;
    }
}

pub fn run<B: Backend>(b: &B, cfg: &FbCfg) -> io::Result<FbResult> {
    let t_pre = Instant::now();
    let top = b.mkdir(&b.root(), "filebench")?;
    // Directory tree: leaves of `dirwidth` files, grouped `dirwidth` per
    // parent when there are more leaves than that (filebench builds a tree
    // of mean width `meandirwidth`).
    let width = cfg.dirwidth.max(1);
    let nleaves = cfg.nfiles.div_ceil(width).max(1);
    let mut dirs = Vec::with_capacity(nleaves);
    if nleaves == 1 {
        dirs.push(top.clone());
    } else {
        let mut parent = top.clone();
        for k in 0..nleaves {
            if nleaves > width && k % width == 0 {
                parent = b.mkdir(&top, &format!("g{}", k / width))?;
            }
            dirs.push(b.mkdir(&parent, &format!("d{k}"))?);
        }
    }
    let mut rng = seeded(cfg.seed);
    let buf = vec![0xabu8; cfg.iosize.max(1)];
    let mut slots = Vec::with_capacity(cfg.nfiles);
    for i in 0..cfg.nfiles {
        let size = file_size(&mut rng, cfg.filesize, cfg.gamma);
        let dir = i / width;
        let exists = rng.scaled_below(100) < cfg.prealloc_pct;
        if exists {
            let mut f = b.create(&dirs[dir], &name(i))?;
            write_whole(b, &mut f, size, &buf)?;
            b.close(f);
        }
        slots.push(Slot {
            exists: Mutex::new(exists),
            size,
            dir,
        });
    }
    let log_dir = b.mkdir(&top, "log")?;
    if cfg.personality == Personality::Webserver {
        let f = b.create(&log_dir, "logfile")?;
        b.close(f);
    }
    b.sync_all()?;
    let prealloc_seconds = t_pre.elapsed().as_secs_f64();

    let fs = Fileset::<B> {
        dirs,
        slots,
        log_dir,
        log_bytes: AtomicU64::new(0),
    };
    let stop = AtomicBool::new(false);
    let failed: Mutex<Option<io::Error>> = Mutex::new(None);
    let t0 = Instant::now();
    let mut totals = Thread {
        ops: 0,
        rb: 0,
        wb: 0,
        per_op: [0; 9],
    };
    let elapsed = std::thread::scope(|s| {
        let handles: Vec<_> = (0..cfg.nthreads.max(1))
            .map(|t| {
                let (fs, stop, failed) = (&fs, &stop, &failed);
                s.spawn(move || {
                    let mut st = Thread {
                        ops: 0,
                        rb: 0,
                        wb: 0,
                        per_op: [0; 9],
                    };
                    let mut rng = seeded(cfg.seed ^ ((t as u64 + 1) << 32));
                    let mut buf = vec![0xcdu8; cfg.iosize.max(1)];
                    let mut log = None;
                    while !stop.load(Ordering::Relaxed) {
                        let r = match cfg.personality {
                            Personality::Fileserver => {
                                fileserver(b, fs, cfg, &mut rng, &mut buf, &mut st)
                            }
                            Personality::Varmail => {
                                varmail(b, fs, cfg, &mut rng, &mut buf, &mut st)
                            }
                            Personality::Webserver => {
                                webserver(b, fs, cfg, &mut rng, &mut buf, &mut st, &mut log)
                            }
                            Personality::Webproxy => {
                                webproxy(b, fs, cfg, &mut rng, &mut buf, &mut st)
                            }
                        };
                        if let Err(e) = r {
                            failed.lock().unwrap().get_or_insert(e);
                            stop.store(true, Ordering::Relaxed);
                        }
                    }
                    if let Some(f) = log.take() {
                        b.close(f);
                    }
                    st
                })
            })
            .collect();
        let deadline = t0 + Duration::from_secs_f64(cfg.seconds);
        while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(5));
        }
        stop.store(true, Ordering::Relaxed);
        for h in handles {
            let st = h.join().expect("workload thread panicked");
            totals.ops += st.ops;
            totals.rb += st.rb;
            totals.wb += st.wb;
            for (a, b) in totals.per_op.iter_mut().zip(st.per_op) {
                *a += b;
            }
        }
        t0.elapsed().as_secs_f64()
    });
    if let Some(e) = failed.lock().unwrap().take() {
        return Err(e);
    }
    Ok(FbResult {
        ops: totals.ops,
        seconds: elapsed,
        read_bytes: totals.rb,
        write_bytes: totals.wb,
        prealloc_seconds,
        per_op: totals.per_op,
    })
}

fn append_rand<B: Backend>(
    b: &B,
    f: &mut B::File,
    cfg: &FbCfg,
    rng: &mut Rng,
    buf: &[u8],
    st: &mut Thread,
) -> io::Result<()> {
    let n = (1 + rng.scaled_below(cfg.appendsize.max(1))).min(buf.len() as u64) as usize;
    b.append(f, &buf[..n])?;
    st.wb += n as u64;
    st.count(Op::Append);
    Ok(())
}

/// openfile; readwholefile; closefile on an existing file.
fn open_read_close<B: Backend>(
    b: &B,
    fs: &Fileset<B>,
    rng: &mut Rng,
    buf: &mut [u8],
    st: &mut Thread,
) -> io::Result<()> {
    let Some((i, _g)) = fs.pick(rng, true) else {
        return Ok(());
    };
    let mut f = b.open(&fs.dirs[fs.slots[i].dir], &name(i))?;
    st.count(Op::Open);
    st.rb += read_whole(b, &mut f, buf)?;
    st.count(Op::ReadWhole);
    b.close(f);
    st.count(Op::Close);
    Ok(())
}

fn delete_one<B: Backend>(
    b: &B,
    fs: &Fileset<B>,
    rng: &mut Rng,
    st: &mut Thread,
) -> io::Result<()> {
    if let Some((i, mut g)) = fs.pick(rng, true) {
        b.unlink(&fs.dirs[fs.slots[i].dir], &name(i))?;
        *g = false;
        st.count(Op::Delete);
    }
    Ok(())
}

fn fileserver<B: Backend>(
    b: &B,
    fs: &Fileset<B>,
    cfg: &FbCfg,
    rng: &mut Rng,
    buf: &mut [u8],
    st: &mut Thread,
) -> io::Result<()> {
    // createfile; writewholefile; closefile
    if let Some((i, mut g)) = fs.pick(rng, false) {
        let mut f = b.create(&fs.dirs[fs.slots[i].dir], &name(i))?;
        *g = true;
        st.count(Op::Create);
        st.wb += write_whole(b, &mut f, fs.slots[i].size, buf)?;
        st.count(Op::WriteWhole);
        b.close(f);
        st.count(Op::Close);
    }
    // openfile; appendfilerand; closefile
    if let Some((i, _g)) = fs.pick(rng, true) {
        let mut f = b.open(&fs.dirs[fs.slots[i].dir], &name(i))?;
        st.count(Op::Open);
        append_rand(b, &mut f, cfg, rng, buf, st)?;
        b.close(f);
        st.count(Op::Close);
    }
    // openfile; readwholefile; closefile
    open_read_close(b, fs, rng, buf, st)?;
    // deletefile
    delete_one(b, fs, rng, st)?;
    // statfile
    if let Some((i, _g)) = fs.pick(rng, true) {
        b.stat(&fs.dirs[fs.slots[i].dir], &name(i))?;
        st.count(Op::Stat);
    }
    Ok(())
}

fn varmail<B: Backend>(
    b: &B,
    fs: &Fileset<B>,
    cfg: &FbCfg,
    rng: &mut Rng,
    buf: &mut [u8],
    st: &mut Thread,
) -> io::Result<()> {
    // deletefile
    delete_one(b, fs, rng, st)?;
    // createfile; appendfilerand; fsync; closefile
    if let Some((i, mut g)) = fs.pick(rng, false) {
        let mut f = b.create(&fs.dirs[fs.slots[i].dir], &name(i))?;
        *g = true;
        st.count(Op::Create);
        append_rand(b, &mut f, cfg, rng, buf, st)?;
        b.fsync(&mut f)?;
        st.count(Op::Fsync);
        b.close(f);
        st.count(Op::Close);
    }
    // openfile; readwholefile; appendfilerand; fsync; closefile
    if let Some((i, _g)) = fs.pick(rng, true) {
        let mut f = b.open(&fs.dirs[fs.slots[i].dir], &name(i))?;
        st.count(Op::Open);
        st.rb += read_whole(b, &mut f, buf)?;
        st.count(Op::ReadWhole);
        append_rand(b, &mut f, cfg, rng, buf, st)?;
        b.fsync(&mut f)?;
        st.count(Op::Fsync);
        b.close(f);
        st.count(Op::Close);
    }
    // openfile; readwholefile; closefile
    open_read_close(b, fs, rng, buf, st)
}

fn webserver<B: Backend>(
    b: &B,
    fs: &Fileset<B>,
    cfg: &FbCfg,
    rng: &mut Rng,
    buf: &mut [u8],
    st: &mut Thread,
    log: &mut Option<B::File>,
) -> io::Result<()> {
    // 10 × (openfile; readwholefile; closefile)
    for _ in 0..10 {
        open_read_close(b, fs, rng, buf, st)?;
    }
    // appendfilerand on the shared log file (each thread its own descriptor)
    let log = match log {
        Some(f) => f,
        None => log.insert(b.open_append(&fs.log_dir, "logfile")?),
    };
    let before = st.wb;
    append_rand(b, log, cfg, rng, buf, st)?;
    rotate_log(b, fs, log, st.wb - before)
}

/// Webserver's log grows as fast as the file system appends, so a
/// time-bounded run on a fast contender (or a fast machine) would fill any
/// fixed pool. Like a web server's logrotate, truncate it once it holds
/// [`LOG_ROTATE_BYTES`]: the space a run needs no longer depends on speed.
/// Every contender rotates at the same size.
fn rotate_log<B: Backend>(
    b: &B,
    fs: &Fileset<B>,
    log: &mut B::File,
    appended: u64,
) -> io::Result<()> {
    let total = fs.log_bytes.fetch_add(appended, Ordering::Relaxed) + appended;
    if total < LOG_ROTATE_BYTES {
        return Ok(());
    }
    // One thread wins the rotation; appends racing with it land in the new
    // log, whose bytes are not counted (a few appends' worth).
    if fs
        .log_bytes
        .compare_exchange(total, 0, Ordering::Relaxed, Ordering::Relaxed)
        .is_ok()
    {
        b.truncate(log, 0)?;
    }
    Ok(())
}

fn webproxy<B: Backend>(
    b: &B,
    fs: &Fileset<B>,
    cfg: &FbCfg,
    rng: &mut Rng,
    buf: &mut [u8],
    st: &mut Thread,
) -> io::Result<()> {
    // deletefile
    delete_one(b, fs, rng, st)?;
    // createfile; appendfilerand; closefile
    if let Some((i, mut g)) = fs.pick(rng, false) {
        let mut f = b.create(&fs.dirs[fs.slots[i].dir], &name(i))?;
        *g = true;
        st.count(Op::Create);
        append_rand(b, &mut f, cfg, rng, buf, st)?;
        b.close(f);
        st.count(Op::Close);
    }
    // 5 × (openfile; readwholefile; closefile)
    for _ in 0..5 {
        open_read_close(b, fs, rng, buf, st)?;
    }
    Ok(())
}
