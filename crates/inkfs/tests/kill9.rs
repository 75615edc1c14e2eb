//! kill -9 at the library level: a child process (this test binary,
//! re-executed with `INKFS_KILL9_CHILD` set, running the `kill9_child`
//! "test") runs a random workload on a pool in /dev/shm and reports every
//! operation it completed over a pipe (its stdout). The parent kills it
//! with SIGKILL after a random delay, recovers the pool and checks that
//! everything the mode promised durable is there, that the namespace is
//! consistent, and that a clean unmount + remount and a recount of free
//! space agree.
//!
//! The workload is a deterministic function of the round's seed and of the
//! model state, so the parent rebuilds the exact model of the first k
//! completed operations (and of the one that may have been in flight) from
//! the seed and the child's reports alone.
//!
//! `INKFS_KILL9_ROUNDS` (default 40) and `INKFS_KILL9_SEED` (replay).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use inkfs::pmem::{MappedPool, Pmem, PoolOpenOptions};
use inkfs::testkit::Rng;
use inkfs::types::*;
use inkfs::{FileHandle, Fs};

const CHILD_ENV: &str = "INKFS_KILL9_CHILD";
const POOL_BYTES: u64 = 32 << 20;
const MAX_FILES: usize = 20;
const MAX_FILE_BYTES: usize = 64 << 10;
/// Posix mode: fsync a file once this many states have piled up since its
/// last fsync (bounds the checker's work).
const MAX_HIST: usize = 24;

// ---------------------------------------------------------------------------
// Deterministic workload
// ---------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Op {
    Mkdir(String),
    Create(String),
    Write(String, u64, Vec<u8>),
    Append(String, Vec<u8>),
    Truncate(String, u64),
    /// May replace an existing file.
    Rename(String, String),
    Unlink(String),
    Fsync(String),
    /// Open, then unlink: the file lives on as an orphan while held.
    Hold(String),
    HeldWrite(u64, Vec<u8>),
    Release,
}

impl Op {
    fn short(&self) -> String {
        match self {
            Op::Write(p, off, d) => format!("Write({p}, {off}, {} bytes)", d.len()),
            Op::Append(p, d) => format!("Append({p}, {} bytes)", d.len()),
            Op::HeldWrite(off, d) => format!("HeldWrite({off}, {} bytes)", d.len()),
            other => format!("{other:?}"),
        }
    }
}

#[derive(Clone, Debug, Default)]
struct MFile {
    cur: Vec<u8>,
    /// Contents the file may show after a crash: just `cur` once durable;
    /// in posix mode every state since the last fsync; in sync mode the
    /// old and new state of an in-place overwrite in flight.
    hist: Vec<Vec<u8>>,
}

#[derive(Clone, Debug, Default)]
struct Model {
    /// Subdirectories of the root ("d0", "d1").
    dirs: Vec<String>,
    /// Path -> file id.
    names: BTreeMap<String, u64>,
    files: BTreeMap<u64, MFile>,
    next_id: u64,
    /// Names are never reused: f0, f1, ...
    next_name: u64,
    held: bool,
}

impl Model {
    fn pick_file(&self, rng: &mut Rng) -> Option<String> {
        if self.names.is_empty() {
            return None;
        }
        let i = rng.below(self.names.len() as u64) as usize;
        self.names.keys().nth(i).cloned()
    }

    fn new_path(&self, rng: &mut Rng) -> String {
        let d = rng.below(self.dirs.len() as u64 + 1) as usize;
        let name = format!("f{}", self.next_name);
        match self.dirs.get(d) {
            Some(dir) => format!("{dir}/{name}"),
            None => name,
        }
    }

    fn size(&self, path: &str) -> usize {
        self.files[&self.names[path]].cur.len()
    }

    fn gen(&self, rng: &mut Rng, mode: Mode) -> Op {
        if self.dirs.len() < 2 {
            return Op::Mkdir(format!("d{}", self.dirs.len()));
        }
        if mode == Mode::Posix {
            if let Some((p, _)) = self
                .names
                .iter()
                .find(|(_, id)| self.files[id].hist.len() > MAX_HIST)
            {
                return Op::Fsync(p.clone());
            }
        }
        let Some(path) = self.pick_file(rng) else {
            return Op::Create(self.new_path(rng));
        };
        let r = rng.below(100);
        let size = self.size(&path);
        match r {
            0..=11 if self.names.len() < MAX_FILES => Op::Create(self.new_path(rng)),
            0..=29 if size < MAX_FILE_BYTES => {
                let len = 1 + rng.below(12_000) as usize;
                Op::Append(path, rng.bytes(len))
            }
            0..=29 => Op::Truncate(path, rng.below(size as u64)),
            30..=54 => {
                let off = rng.below(size as u64 + 2000);
                let len = 1 + rng.below(12_000) as usize;
                Op::Write(path, off, rng.bytes(len))
            }
            55..=61 => Op::Truncate(path, rng.below(size as u64 + 8192)),
            62..=71 => {
                let dst = if rng.below(2) == 0 {
                    self.pick_file(rng).filter(|d| *d != path)
                } else {
                    None
                };
                Op::Rename(path, dst.unwrap_or_else(|| self.new_path(rng)))
            }
            72..=77 => Op::Unlink(path),
            90..=93 if !self.held => Op::Hold(path),
            94..=96 if self.held => {
                let len = 1 + rng.below(9000) as usize;
                Op::HeldWrite(rng.below(20_000), rng.bytes(len))
            }
            97..=99 if self.held => Op::Release,
            _ => Op::Fsync(path),
        }
    }

    /// Apply `op`. `durable`: the call returned (strict/sync: its result is
    /// durable; posix: only what fsync made durable is).
    fn apply(&mut self, op: &Op, mode: Mode, durable: bool) {
        let mut touched = None;
        match op {
            Op::Mkdir(d) => self.dirs.push(d.clone()),
            Op::Create(p) => {
                let id = self.next_id;
                self.next_id += 1;
                self.next_name += 1;
                self.names.insert(p.clone(), id);
                self.files.insert(
                    id,
                    MFile {
                        cur: Vec::new(),
                        hist: vec![Vec::new()],
                    },
                );
            }
            Op::Write(p, off, data) => {
                let f = self.files.get_mut(&self.names[p]).unwrap();
                let (off, end) = (*off as usize, *off as usize + data.len());
                if f.cur.len() < end {
                    f.cur.resize(end, 0);
                }
                f.cur[off..end].copy_from_slice(data);
                touched = Some(self.names[p]);
            }
            Op::Append(p, data) => {
                let f = self.files.get_mut(&self.names[p]).unwrap();
                f.cur.extend_from_slice(data);
                touched = Some(self.names[p]);
            }
            Op::Truncate(p, size) => {
                let f = self.files.get_mut(&self.names[p]).unwrap();
                f.cur.resize(*size as usize, 0);
                touched = Some(self.names[p]);
            }
            Op::Rename(src, dst) => {
                self.next_name += 1;
                let id = self.names.remove(src).unwrap();
                if let Some(victim) = self.names.insert(dst.clone(), id) {
                    self.files.remove(&victim);
                }
            }
            Op::Unlink(p) => {
                let id = self.names.remove(p).unwrap();
                self.files.remove(&id);
            }
            Op::Fsync(p) => {
                let f = self.files.get_mut(&self.names[p]).unwrap();
                f.hist = vec![f.cur.clone()];
            }
            Op::Hold(p) => {
                let id = self.names.remove(p).unwrap();
                self.files.remove(&id);
                self.held = true;
            }
            Op::HeldWrite(..) => {}
            Op::Release => self.held = false,
        }
        if let Some(id) = touched {
            let f = self.files.get_mut(&id).unwrap();
            let collapse = match mode {
                Mode::Strict => true,
                Mode::Sync => durable,
                Mode::Posix => false,
            };
            if collapse {
                f.hist = vec![f.cur.clone()];
            } else {
                f.hist.push(f.cur.clone());
            }
        }
    }
}

fn split(path: &str) -> (Option<&str>, &str) {
    match path.split_once('/') {
        Some((d, n)) => (Some(d), n),
        None => (None, path),
    }
}

// ---------------------------------------------------------------------------
// Child
// ---------------------------------------------------------------------------

fn exec<P: Pmem>(fs: &Fs<P>, op: &Op, held: &mut Option<FileHandle>) -> inkfs::Result<()> {
    let parent = |dir: Option<&str>| -> inkfs::Result<u64> {
        match dir {
            Some(d) => fs.lookup_ino(1, d.as_bytes()),
            None => Ok(1),
        }
    };
    let resolve = |path: &str| -> inkfs::Result<(u64, Vec<u8>)> {
        let (d, n) = split(path);
        Ok((parent(d)?, n.as_bytes().to_vec()))
    };
    let open = |path: &str| -> inkfs::Result<FileHandle> {
        let (d, n) = resolve(path)?;
        fs.open(fs.lookup_ino(d, &n)?)
    };
    match op {
        Op::Mkdir(d) => {
            fs.mkdir(1, d.as_bytes(), 0o755, 0, 0)?;
        }
        Op::Create(p) => {
            let (d, n) = resolve(p)?;
            let (_, fh) = fs.create(d, &n, 0o644, 0, 0)?;
            fs.release(fh);
        }
        Op::Write(p, off, data) => {
            let fh = open(p)?;
            let r = fs.write(&fh, *off, data);
            fs.release(fh);
            r?;
        }
        Op::Append(p, data) => {
            let fh = open(p)?;
            let r = fs.append(&fh, data);
            fs.release(fh);
            r?;
        }
        Op::Truncate(p, size) => {
            let (d, n) = resolve(p)?;
            fs.setattr(
                fs.lookup_ino(d, &n)?,
                &SetAttr {
                    size: Some(*size),
                    ..Default::default()
                },
            )?;
        }
        Op::Rename(src, dst) => {
            let (sd, sn) = resolve(src)?;
            let (dd, dn) = resolve(dst)?;
            fs.rename(sd, &sn, dd, &dn, RenameFlags::default())?;
        }
        Op::Unlink(p) => {
            let (d, n) = resolve(p)?;
            fs.unlink(d, &n)?;
        }
        Op::Fsync(p) => {
            let fh = open(p)?;
            let r = fs.fsync(&fh, false);
            fs.release(fh);
            r?;
        }
        Op::Hold(p) => {
            let fh = open(p)?;
            let (d, n) = resolve(p)?;
            fs.unlink(d, &n)?;
            *held = Some(fh);
        }
        Op::HeldWrite(off, data) => {
            let fh = held.as_ref().expect("a held handle");
            fs.write(fh, *off, data)?;
        }
        Op::Release => fs.release(held.take().expect("a held handle")),
    }
    Ok(())
}

/// Not a test by itself: the body of the child process (returns at once
/// unless `INKFS_KILL9_CHILD` is set).
#[test]
fn kill9_child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut parts = spec.split('|');
    let (Some(path), Some(seed), Some(mode)) = (parts.next(), parts.next(), parts.next()) else {
        panic!("bad {CHILD_ENV}: {spec}");
    };
    let seed: u64 = seed.parse().unwrap();
    let mode = Mode::parse(mode).unwrap();
    let pm = MappedPool::open(Path::new(path), &PoolOpenOptions::default()).unwrap();
    let fs = Fs::mount(
        pm,
        MountOptions {
            mode,
            read_only: false,
            ..Default::default()
        },
    )
    .unwrap();
    println!("@M");
    let mut rng = Rng::new(seed);
    let mut model = Model::default();
    let mut held = None;
    let start = Instant::now();
    for i in 0u64.. {
        let op = model.gen(&mut rng, mode);
        if let Err(e) = exec(&fs, &op, &mut held) {
            println!("@E {i} {} failed: {e:?}", op.short());
            std::process::exit(3);
        }
        model.apply(&op, mode, true);
        println!("@D {i}");
        if start.elapsed() > Duration::from_secs(60) {
            break; // the parent should have killed us long ago
        }
    }
    std::process::exit(4);
}

// ---------------------------------------------------------------------------
// Parent: recovery checks
// ---------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq, Eq)]
enum Node {
    Dir,
    File(Vec<u8>),
}

/// Walk the tree, checking as it goes that every entry resolves (no
/// dangling names), link counts equal the names found, and no inode is
/// allocated that no name (or open handle) reaches.
fn walk<P: Pmem>(fs: &Fs<P>) -> Result<BTreeMap<String, Node>, String> {
    let mut out = BTreeMap::new();
    let mut names_of: BTreeMap<u64, u32> = BTreeMap::new();
    let mut dirs = vec![(1u64, String::new())];
    let mut seen_dirs = BTreeSet::from([1u64]);
    while let Some((dino, prefix)) = dirs.pop() {
        let mut entries = Vec::new();
        fs.readdir(dino, 0, &mut |e| {
            entries.push(e);
            true
        })
        .map_err(|e| format!("readdir {prefix:?}: {e:?}"))?;
        let mut subdirs = 0;
        for e in entries {
            if e.name == b"." || e.name == b".." {
                continue;
            }
            let name = String::from_utf8(e.name.clone()).map_err(|_| "non-utf8 name")?;
            let path = if prefix.is_empty() {
                name
            } else {
                format!("{prefix}/{name}")
            };
            let a = fs
                .getattr(e.ino)
                .map_err(|err| format!("dangling entry {path} -> {}: {err:?}", e.ino))?;
            if a.kind != e.kind {
                return Err(format!(
                    "{path}: entry kind {:?}, inode {:?}",
                    e.kind, a.kind
                ));
            }
            match a.kind {
                FileKind::Dir => {
                    subdirs += 1;
                    if !seen_dirs.insert(e.ino) {
                        return Err(format!("directory {} reached twice", e.ino));
                    }
                    if fs.lookup_ino(e.ino, b"..").ok() != Some(dino) {
                        return Err(format!("{path}: '..' is not its parent"));
                    }
                    dirs.push((e.ino, path.clone()));
                    out.insert(path, Node::Dir);
                }
                FileKind::File => {
                    *names_of.entry(e.ino).or_default() += 1;
                    let fh = fs.open(e.ino).map_err(|e| format!("open {path}: {e:?}"))?;
                    let mut buf = vec![0u8; a.size as usize + 1];
                    let n = fs
                        .read(&fh, 0, &mut buf)
                        .map_err(|e| format!("read {path}: {e:?}"))?;
                    fs.release(fh);
                    if n as u64 != a.size {
                        return Err(format!("{path}: read {n} of {} bytes", a.size));
                    }
                    buf.truncate(n);
                    out.insert(path, Node::File(buf));
                }
                k => return Err(format!("{path}: unexpected kind {k:?}")),
            }
        }
        let nlink = fs.getattr(dino).map_err(|e| format!("{e:?}"))?.nlink;
        if nlink != 2 + subdirs {
            return Err(format!(
                "directory {prefix:?}: nlink {nlink}, expected {}",
                2 + subdirs
            ));
        }
    }
    for (ino, n) in &names_of {
        let nlink = fs.getattr(*ino).map_err(|e| format!("{e:?}"))?.nlink;
        if nlink != *n {
            return Err(format!("inode {ino}: nlink {nlink} but {n} names"));
        }
    }
    let st = fs.statfs();
    let used = st.files - st.files_free;
    let reachable = (seen_dirs.len() + names_of.len()) as u64;
    if used != reachable {
        return Err(format!(
            "{used} inodes allocated, {reachable} reachable (leak or orphan not reclaimed)"
        ));
    }
    Ok(out)
}

/// Could a crash leave `got` for a file whose possible states are `f.hist`?
fn content_ok(got: &[u8], f: &MFile) -> bool {
    if f.hist.iter().any(|h| h.as_slice() == got) {
        return true;
    }
    if f.hist.len() < 2 || !f.hist.iter().any(|h| h.len() == got.len()) {
        return false;
    }
    // Not atomic (sync/posix overwrites in place): every byte must be one
    // this position held in some possible state (zero past a state's end).
    got.iter()
        .enumerate()
        .all(|(i, &b)| f.hist.iter().any(|h| h.get(i).map_or(b == 0, |&x| x == b)))
}

fn matches(got: &BTreeMap<String, Node>, m: &Model) -> Result<(), String> {
    let mut want: BTreeSet<&str> = m.names.keys().map(|s| s.as_str()).collect();
    want.extend(m.dirs.iter().map(|s| s.as_str()));
    let have: BTreeSet<&str> = got.keys().map(|s| s.as_str()).collect();
    if want != have {
        return Err(format!(
            "namespace differs: missing {:?}, unexpected {:?}",
            want.difference(&have).collect::<Vec<_>>(),
            have.difference(&want).collect::<Vec<_>>()
        ));
    }
    for (path, node) in got {
        match (node, m.names.get(path)) {
            (Node::Dir, None) => {}
            (Node::File(data), Some(id)) => {
                let f = &m.files[id];
                if !content_ok(data, f) {
                    return Err(format!(
                        "{path}: {} bytes, expected {} (one of {} states with sizes {:?})",
                        data.len(),
                        f.cur.len(),
                        f.hist.len(),
                        f.hist.iter().map(|h| h.len()).collect::<Vec<_>>()
                    ));
                }
            }
            _ => return Err(format!("{path}: kind differs")),
        }
    }
    Ok(())
}

fn mount(path: &Path, mode: Mode) -> Fs<MappedPool> {
    let pm = MappedPool::open(path, &PoolOpenOptions::default()).expect("open pool");
    Fs::mount(
        pm,
        MountOptions {
            mode,
            read_only: false,
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("mount {} failed: {e:?}", path.display()))
}

/// `inkfs::fsck` on the pool at `path`, read-only: no error; after a
/// clean unmount (`clean`) no problem of any kind, not even a note.
fn fsck(path: &Path, clean: bool, ctx: &str) {
    let pm = MappedPool::open(
        path,
        &PoolOpenOptions {
            create_size_bytes: None,
            read_only: true,
        },
    )
    .expect("open pool read-only");
    let r = inkfs::fsck::check(&pm, &inkfs::fsck::FsckOptions::default())
        .unwrap_or_else(|e| panic!("{ctx}: fsck failed: {e}"));
    let bad: Vec<String> = r
        .problems
        .iter()
        .filter(|p| clean || p.severity == inkfs::fsck::Severity::Error)
        .map(|p| p.to_string())
        .collect();
    assert!(
        bad.is_empty(),
        "{ctx}: fsck {} found {bad:#?}; pool kept at {}",
        if clean {
            "after a clean unmount"
        } else {
            "of the crashed pool"
        },
        path.display()
    );
}

struct Outcome {
    done: Option<u64>,
    orphans: u64,
    in_flight_visible: bool,
}

fn round(round: u32, seed: u64, mode: Mode) -> Outcome {
    let ctx = format!("round {round}, mode {}, seed {seed}", mode.name());
    let path = PathBuf::from(format!(
        "/dev/shm/inkfs-kill9-{}-{round}.pool",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);
    {
        let pm = MappedPool::open(
            &path,
            &PoolOpenOptions {
                create_size_bytes: Some(POOL_BYTES),
                read_only: false,
            },
        )
        .unwrap();
        Fs::format(
            &pm,
            &FormatOptions {
                lanes: 4,
                ..Default::default()
            },
        )
        .unwrap();
        pm.sync_all().unwrap();
    }

    // Run the child and kill it.
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "kill9_child", "--nocapture", "--test-threads=1"])
        .env(
            CHILD_ENV,
            format!("{}|{seed}|{}", path.display(), mode.name()),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        let mut lines = Vec::new();
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            // libtest prints "test kill9_child ... " without a newline.
            let Some(at) = line.find('@') else { continue };
            let line = line[at..].to_string();
            if line == "@M" {
                let _ = tx.send(line.clone());
            }
            lines.push(line);
        }
        lines
    });
    let mut rng = Rng::new(seed ^ 0x5EED);
    let mounted = rx.recv_timeout(Duration::from_secs(60));
    if mounted.is_ok() {
        std::thread::sleep(Duration::from_micros(rng.below(50_000)));
    }
    let _ = child.kill(); // SIGKILL
    let status = child.wait().unwrap();
    let lines = reader.join().unwrap();
    assert!(mounted.is_ok(), "{ctx}: the child never mounted ({status})");
    if let Some(e) = lines.iter().find(|l| l.starts_with("@E")) {
        panic!("{ctx}: the child's operation failed: {e}");
    }
    let done: Option<u64> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("@D ")?.parse().ok())
        .next_back();

    // Rebuild the model: operations 0..=done completed, the next one may
    // have been in flight.
    let mut wl = Rng::new(seed);
    let mut before = Model::default();
    let completed = done.map_or(0, |d| d + 1);
    for _ in 0..completed {
        let op = before.gen(&mut wl, mode);
        before.apply(&op, mode, true);
    }
    let next = before.gen(&mut wl, mode);
    let mut after = before.clone();
    after.apply(&next, mode, false);

    // fsck of the crashed pool (read-only): notes allowed, no error.
    fsck(&path, false, &ctx);
    // Recover.
    let fs = mount(&path, mode);
    let rep = fs.mount_report().clone();
    assert!(!rep.was_clean, "{ctx}: pool clean after kill -9");
    assert!(!rep.allocator_restored, "{ctx}");
    let got = walk(&fs).unwrap_or_else(|e| {
        panic!("{ctx}: inconsistent after recovery ({completed} ops done): {e}")
    });
    let in_flight_visible = matches(&got, &before).is_err();
    if let Err(e1) = matches(&got, &before) {
        if let Err(e2) = matches(&got, &after) {
            panic!(
                "{ctx}: recovered state after {completed} completed ops matches neither \
                 the state before the in-flight op {} ({e1}) nor after it ({e2}); pool kept at {}",
                next.short(),
                path.display()
            );
        }
    }
    let free = fs.statfs();

    // Clean unmount + remount: identical, allocator restored.
    fs.unmount().unwrap();
    fsck(&path, true, &ctx);
    let fs = mount(&path, mode);
    assert!(fs.mount_report().was_clean, "{ctx}");
    assert!(fs.mount_report().allocator_restored, "{ctx}");
    assert_eq!(walk(&fs).as_ref(), Ok(&got), "{ctx}: after clean remount");
    assert_eq!(fs.statfs(), free, "{ctx}: free space after clean remount");
    // Recount: a crash now makes the next mount rebuild the allocator from
    // the logs; it must find exactly the same free space.
    drop(fs);
    let fs = mount(&path, mode);
    assert!(!fs.mount_report().allocator_restored, "{ctx}");
    assert_eq!(fs.statfs(), free, "{ctx}: free space recount");
    assert_eq!(walk(&fs).as_ref(), Ok(&got), "{ctx}: after recount");
    fs.unmount().unwrap();
    std::fs::remove_file(&path).unwrap();
    Outcome {
        done,
        orphans: rep.orphans_reclaimed,
        in_flight_visible,
    }
}

#[test]
fn kill9_recovery() {
    let rounds: u32 = std::env::var("INKFS_KILL9_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let seed: u64 = std::env::var("INKFS_KILL9_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    eprintln!("kill9 seed: {seed} (INKFS_KILL9_SEED={seed} to replay), {rounds} rounds");
    let t0 = Instant::now();
    let (mut ops, mut orphans, mut visible) = (0u64, 0u64, 0u32);
    for r in 0..rounds {
        let mode = match r % 8 {
            6 => Mode::Sync,
            7 => Mode::Posix,
            _ => Mode::Strict,
        };
        let round_seed = Rng::new(seed.wrapping_add(r as u64)).next_u64();
        let o = round(r, round_seed, mode);
        ops += o.done.map_or(0, |d| d + 1);
        orphans += o.orphans;
        visible += o.in_flight_visible as u32;
    }
    eprintln!(
        "kill9: {rounds} rounds, {ops} operations acknowledged, {orphans} orphans reclaimed, \
         unacknowledged in-flight op visible in {visible} rounds, {:.1} s",
        t0.elapsed().as_secs_f64()
    );
}
