//! Readdir positions are a function of the name (docs/FORMAT.md, DIR_ADD):
//! one pass through a directory never returns a name twice while other
//! threads rename over existing names, unlink and re-create names, and
//! create and remove others; every name that exists for the whole pass is
//! returned exactly once. Positions survive log compaction, a clean
//! remount and a crash; directories written with version-2 sequential
//! positions keep theirs and mix with hashed ones.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use inkfs::format::*;
use inkfs::pmem::{read_pod, write_pod, Pmem, SimPool};
use inkfs::testkit::Rng;
use inkfs::types::*;
use inkfs::Fs;

type F = Fs<SimPool>;

/// Names only renamed over: they exist through every pass.
const FILES: usize = 1500;
/// Names unlinked and created again.
const CHURNED: usize = 40;
/// Entries per readdir call (the reader resumes from the last cookie).
const BATCH: usize = 16;
const MIN_OPS: u64 = 3000;
const MIN_PASSES: u64 = 8;
const TIME_LIMIT: Duration = Duration::from_secs(120);

fn fresh() -> F {
    let pm = SimPool::new(96 << 20);
    Fs::format(
        &pm,
        &FormatOptions {
            lanes: 2,
            ..Default::default()
        },
    )
    .unwrap();
    Fs::mount(pm, MountOptions::default()).unwrap()
}

fn f_name(i: usize) -> Vec<u8> {
    format!("file-{i:05}").into_bytes()
}
fn u_name(i: usize) -> Vec<u8> {
    format!("churn-{i:03}").into_bytes()
}

fn touch(fs: &F, dir: u64, name: &[u8]) {
    let (_, fh) = fs.create(dir, name, 0o644, 0, 0).unwrap();
    fs.release(fh);
}

/// One pass, paging through readdir `BATCH` entries at a time from the
/// last cookie returned, as getdents through FUSE does. "." and ".." left
/// out.
fn pass(fs: &F, dir: u64) -> Result<Vec<DirEntry>, String> {
    let mut out: Vec<DirEntry> = Vec::new();
    let mut cookie = 0;
    loop {
        let mut batch = Vec::new();
        fs.readdir(dir, cookie, &mut |e| {
            batch.push(e);
            batch.len() < BATCH
        })
        .map_err(|e| format!("readdir: {e}"))?;
        let Some(last) = batch.last() else {
            break;
        };
        if last.cookie <= cookie {
            return Err(format!("cookie {} after {cookie}", last.cookie));
        }
        cookie = last.cookie;
        out.extend(
            batch
                .into_iter()
                .filter(|e| e.name != b"." && e.name != b".."),
        );
    }
    Ok(out)
}

/// No name twice; every stable name exactly once.
fn check_pass(entries: &[DirEntry], stable: &[Vec<u8>]) -> Result<(), String> {
    let mut seen: HashMap<&[u8], u32> = HashMap::new();
    for e in entries {
        let n = seen.entry(&e.name[..]).or_insert(0);
        *n += 1;
        if *n == 2 {
            return Err(format!(
                "\"{}\" returned twice in one pass of {} entries",
                String::from_utf8_lossy(&e.name),
                entries.len()
            ));
        }
    }
    for s in stable {
        if !seen.contains_key(&s[..]) {
            return Err(format!(
                "\"{}\" existed for the whole pass and was not returned",
                String::from_utf8_lossy(s)
            ));
        }
    }
    Ok(())
}

/// name → cookie of a quiet directory.
fn cookies(fs: &F, dir: u64) -> BTreeMap<Vec<u8>, u64> {
    let list = pass(fs, dir).unwrap();
    let n = list.len();
    let map: BTreeMap<_, _> = list.into_iter().map(|e| (e.name, e.cookie)).collect();
    assert_eq!(map.len(), n, "a name listed twice in a quiet directory");
    map
}

fn only<'a>(
    m: &'a BTreeMap<Vec<u8>, u64>,
    keys: &'a BTreeMap<Vec<u8>, u64>,
) -> BTreeMap<Vec<u8>, u64> {
    m.iter()
        .filter(|(k, _)| keys.contains_key(*k))
        .map(|(k, v)| (k.clone(), *v))
        .collect()
}

fn populate(fs: &F) -> u64 {
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, 0, 0).unwrap().ino;
    for i in 0..FILES {
        touch(fs, d, &f_name(i));
    }
    for i in 0..CHURNED {
        touch(fs, d, &u_name(i));
    }
    d
}

/// One writer, one reader paging through `dir`, until the writer did
/// `MIN_OPS` operations and the reader `MIN_PASSES` passes during which
/// the writer renamed over at least `MIN_RENAMES_PER_PASS` names (so the
/// test cannot pass by the two threads not overlapping).
/// `unlink_existing`: also unlink and re-create the churned names.
fn stress(fs: &Arc<F>, dir: u64, seed: u64, unlink_existing: bool) {
    const MIN_RENAMES_PER_PASS: u64 = 10;
    let stable: Vec<Vec<u8>> = (0..FILES).map(f_name).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let passes = Arc::new(AtomicU64::new(0));
    let renames = Arc::new(AtomicU64::new(0));
    let reader = {
        let (fs, stop, passes, renames) =
            (fs.clone(), stop.clone(), passes.clone(), renames.clone());
        std::thread::spawn(move || -> Result<(), String> {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let r0 = renames.load(Ordering::Relaxed);
                check_pass(&pass(&fs, dir)?, &stable).map_err(|e| format!("pass {n}: {e}"))?;
                n += 1;
                if renames.load(Ordering::Relaxed) - r0 >= MIN_RENAMES_PER_PASS {
                    passes.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok(())
        })
    };
    let mut rng = Rng::new(seed);
    let start = Instant::now();
    let mut k = 0u64;
    let mut fresh_name: Option<Vec<u8>> = None;
    while k < MIN_OPS || passes.load(Ordering::Relaxed) < MIN_PASSES {
        if reader.is_finished() {
            break;
        }
        assert!(
            start.elapsed() < TIME_LIMIT,
            "{k} operations and {} passes in {TIME_LIMIT:?}",
            passes.load(Ordering::Relaxed)
        );
        let r = rng.next_u64() as usize;
        match k % 8 {
            0..=4 => {
                // The reproducer: a new file renamed over an existing name.
                touch(fs, dir, b"tmp");
                fs.rename(dir, b"tmp", dir, &f_name(r % FILES), RenameFlags::default())
                    .unwrap();
                renames.fetch_add(1, Ordering::Relaxed);
            }
            5 if unlink_existing => {
                let n = u_name(r % CHURNED);
                fs.unlink(dir, &n).unwrap();
                touch(fs, dir, &n);
            }
            _ => match fresh_name.take() {
                Some(n) => fs.unlink(dir, &n).unwrap(),
                None => {
                    let n = format!("fresh-{k}").into_bytes();
                    touch(fs, dir, &n);
                    fresh_name = Some(n);
                }
            },
        }
        k += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let result = reader.join().unwrap();
    if let Some(n) = fresh_name {
        fs.unlink(dir, &n).unwrap();
    }
    if let Err(e) = result {
        panic!("after {k} operations: {e}");
    }
    assert!(passes.load(Ordering::Relaxed) >= MIN_PASSES);
    eprintln!(
        "stress: {k} operations, {} passes overlapping renames",
        passes.load(Ordering::Relaxed)
    );
}

fn unwrap_arc(fs: Arc<F>) -> F {
    Arc::try_unwrap(fs).unwrap_or_else(|_| panic!("fs still shared"))
}

#[test]
fn one_pass_never_returns_a_name_twice() {
    let fs = Arc::new(fresh());
    let d = populate(&fs);
    let before = cookies(&fs, d);
    assert_eq!(before.len(), FILES + CHURNED);
    let gc0 = fs.gc_stats();

    stress(&fs, d, 0x9e37_79b9_7f4a_7c15, true);
    // The directory's log was compacted while the reader paged through it.
    assert!(
        fs.gc_stats().compactions > gc0.compactions,
        "no compaction ran: {:?}",
        fs.gc_stats()
    );
    // Every name sits where it was: renames over it, unlink + create and
    // compaction all kept its position.
    let after = cookies(&fs, d);
    assert_eq!(after, before);

    // A clean remount replays the same positions, and they hold up.
    let fs =
        Arc::new(Fs::mount(unwrap_arc(fs).unmount().unwrap(), MountOptions::default()).unwrap());
    assert_eq!(cookies(&fs, d), before);
    stress(&fs, d, 0x1234_5678_9abc_def1, true);
    assert_eq!(cookies(&fs, d), before);

    // And so does a crash (the durable image only).
    let image = fs.pmem().persisted_image();
    drop(fs);
    let fs = Fs::mount(SimPool::from_image(image), MountOptions::default()).unwrap();
    assert!(!fs.mount_report().was_clean);
    assert_eq!(cookies(&fs, d), before);
    let pm = fs.unmount().unwrap();
    let report = inkfs::fsck::check(
        &pm,
        &inkfs::fsck::FsckOptions {
            repair: false,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(report.is_clean(), "{:#?}", report.problems);
}

/// A name renamed over keeps its cookie, so a reader that stopped right
/// after it and resumes from that cookie (telldir/seekdir) does not meet it
/// again; a renamed name's new name and an unlinked + created name are
/// placed by their hash, the same each time.
#[test]
fn positions_follow_names() {
    let fs = fresh();
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, 0, 0).unwrap().ino;
    for i in 0..200 {
        touch(&fs, d, &f_name(i));
    }
    let all = pass(&fs, d).unwrap();
    let mid = &all[100];
    touch(&fs, d, b"tmp");
    fs.rename(d, b"tmp", d, &mid.name, RenameFlags::default())
        .unwrap();
    touch(&fs, d, b"tmp");
    fs.rename(d, b"tmp", d, &all[10].name, RenameFlags::default())
        .unwrap();
    let mut rest = Vec::new();
    fs.readdir(d, mid.cookie, &mut |e| {
        rest.push(e.name);
        true
    })
    .unwrap();
    let want: Vec<Vec<u8>> = all[101..].iter().map(|e| e.name.clone()).collect();
    assert_eq!(rest, want);

    // Unlink + create, rename away and back: the same cookie.
    let c = |fs: &F, n: &[u8]| cookies(fs, d)[n];
    let was = c(&fs, &all[50].name);
    fs.unlink(d, &all[50].name).unwrap();
    touch(&fs, d, &all[50].name);
    assert_eq!(c(&fs, &all[50].name), was);
    fs.rename(d, &all[50].name, ROOT_INO, b"away", RenameFlags::default())
        .unwrap();
    fs.rename(ROOT_INO, b"away", d, &all[50].name, RenameFlags::default())
        .unwrap();
    assert_eq!(c(&fs, &all[50].name), was);

    // Exchange keeps both names' cookies.
    let (a, b) = (&all[3].name, &all[150].name);
    let (ca, cb) = (c(&fs, a), c(&fs, b));
    let ia = fs.lookup(d, a).unwrap().ino;
    let exchange = RenameFlags {
        exchange: true,
        ..Default::default()
    };
    fs.rename(d, a, d, b, exchange).unwrap();
    assert_eq!((c(&fs, a), c(&fs, b)), (ca, cb));
    assert_eq!(fs.lookup(d, b).unwrap().ino, ia);
}

// ------------------------------------------------------------------------
// Version-2 directories (sequential positions)
// ------------------------------------------------------------------------

fn rec_off(pm: &SimPool, ino: u64) -> u64 {
    let sb: Superblock = read_pod(pm, 0);
    let (lane, slot) = ino_to_lane_slot(ino, sb.lane_count);
    let mut block = lane_first_block(lane) + LANE_INODE_TABLE_BLOCK;
    for _ in 0..slot / INODES_PER_TABLE_BLOCK {
        let t: TableTrailer = read_pod(pm, block * BLOCK_SIZE + TABLE_TRAILER_OFFSET);
        block = t.next_block;
    }
    block * BLOCK_SIZE + (slot % INODES_PER_TABLE_BLOCK) * INODE_RECORD_SIZE
}

/// Every committed entry of `ino`'s log: (offset, bytes).
fn log_entries(pm: &SimPool, ino: u64) -> Vec<(u64, Vec<u8>)> {
    let r: InodeRecord = read_pod(pm, rec_off(pm, ino));
    let mut out = Vec::new();
    let mut page = r.log_head;
    loop {
        // The head may be a chunk (version 6): its span says where.
        let span = LogPageSpan::of(page);
        let base = span.base;
        let end = if span.holds(r.log_tail) {
            r.log_tail - base
        } else {
            span.payload
        };
        let mut pos = 0;
        while pos < end {
            let mut h = [0u8; 2];
            pm.read(base + pos, &mut h);
            if h[0] == entry_type::PAD {
                break;
            }
            let len = h[1] as u64 * ENTRY_UNIT;
            let mut b = vec![0u8; len as usize];
            pm.read(base + pos, &mut b);
            out.push((base + pos, b));
            pos += len;
        }
        if span.holds(r.log_tail) {
            return out;
        }
        let f: LogPageFooter = read_pod(pm, span.footer());
        page = f.next_block;
    }
}

/// Give `dir`'s DIR_ADD entries the positions version 2 wrote: 0, 1, 2…
/// in log order (a directory never compacted, nothing removed). Returns
/// the names in that order.
fn make_sequential(pm: &SimPool, dir: u64) -> Vec<Vec<u8>> {
    let mut names = Vec::new();
    for (off, mut b) in log_entries(pm, dir) {
        if b[0] != entry_type::DIR_ADD {
            continue;
        }
        let head = DirEntryHead::from_bytes(&b);
        b[16..24].copy_from_slice(&(names.len() as u64).to_le_bytes());
        seal_entry(&mut b);
        pm.write(off, &b);
        pm.persist(off, b.len() as u64);
        names.push(b[40..40 + head.name_len as usize].to_vec());
    }
    names
}

/// A version-2 pool whose directory holds sequential positions mounts,
/// lists in creation order, and keeps those positions while names are
/// renamed over; new names get hashed positions in the same directory,
/// and passes still never return a name twice.
#[test]
fn version_2_sequential_positions_are_kept_and_mix_with_hashed_ones() {
    let fs = fresh();
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, 0, 0).unwrap().ino;
    for i in 0..FILES {
        touch(&fs, d, &f_name(i));
    }
    let pm = fs.unmount().unwrap();
    let order = make_sequential(&pm, d);
    assert_eq!(order.len(), FILES);
    for block in [SUPER_PRIMARY_BLOCK, SUPER_BACKUP_BLOCK] {
        let mut sb: Superblock = read_pod(&pm, block * BLOCK_SIZE);
        sb.version = 2;
        sb.seal();
        write_pod(&pm, block * BLOCK_SIZE, &sb);
        pm.persist(block * BLOCK_SIZE, 256);
    }
    let fs = Fs::mount(pm, MountOptions::default()).unwrap();
    assert_eq!(fs.superblock().version, FORMAT_VERSION);
    let listed = pass(&fs, d).unwrap();
    let got: Vec<(Vec<u8>, u64)> = listed.into_iter().map(|e| (e.name, e.cookie)).collect();
    let want: Vec<(Vec<u8>, u64)> = order
        .iter()
        .enumerate()
        .map(|(i, n)| (n.clone(), i as u64 + 3))
        .collect();
    assert_eq!(got, want, "version-2 positions are not read as they are");
    let before = cookies(&fs, d);

    let fs = Arc::new(fs);
    stress(&fs, d, 0x5eed_0f01_d0d0, false);
    assert_eq!(cookies(&fs, d), before, "a renamed-over name moved");

    // A name unlinked and created again leaves its sequential position
    // for its hashed one (once), then stays there.
    fs.unlink(d, &f_name(7)).unwrap();
    touch(&fs, d, &f_name(7));
    let hashed = cookies(&fs, d)[&f_name(7)];
    assert!(hashed > FILES as u64 + 3);
    touch(&fs, d, b"tmp");
    fs.rename(d, b"tmp", d, &f_name(7), RenameFlags::default())
        .unwrap();
    assert_eq!(cookies(&fs, d)[&f_name(7)], hashed);

    let now = cookies(&fs, d);
    let fs = Fs::mount(unwrap_arc(fs).unmount().unwrap(), MountOptions::default()).unwrap();
    assert_eq!(cookies(&fs, d), now);
    assert_eq!(only(&now, &before).len(), FILES);
    let pm = fs.unmount().unwrap();
    let report = inkfs::fsck::check(
        &pm,
        &inkfs::fsck::FsckOptions {
            repair: false,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(report.is_clean(), "{:#?}", report.problems);
}
