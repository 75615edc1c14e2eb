//! fsck: clean pools check clean; injected corruptions are detected; the
//! repairable ones are repaired (re-check clean, untouched data intact).

use inkfs::format::*;
use inkfs::fsck::{self, FsckOptions, FsckReport, ProblemKind, Severity};
use inkfs::log::EntryBuf;
use inkfs::pmem::{read_pod, write_pod, Pmem, SimPool};
use inkfs::types::*;
use inkfs::Fs;

const POOL: u64 = 32 << 20;

fn fresh() -> Fs<SimPool> {
    let pm = SimPool::new(POOL);
    Fs::format(
        &pm,
        &FormatOptions {
            lanes: 2,
            ..Default::default()
        },
    )
    .unwrap();
    mount(pm)
}

fn mount(pm: SimPool) -> Fs<SimPool> {
    Fs::mount(pm, MountOptions::default()).unwrap()
}

fn check(pm: &SimPool) -> FsckReport {
    fsck::check(
        pm,
        &FsckOptions {
            repair: false,
            ..Default::default()
        },
    )
    .unwrap()
}

fn repair(pm: &SimPool) -> FsckReport {
    fsck::check(
        pm,
        &FsckOptions {
            repair: true,
            ..Default::default()
        },
    )
    .unwrap()
}

fn assert_clean(r: &FsckReport) {
    assert!(r.is_clean(), "expected clean, got {:#?}", r.problems);
    assert_eq!(r.exit_code(), 0);
}

fn has_error(r: &FsckReport, kind: ProblemKind) -> bool {
    r.errors().any(|p| p.kind == kind)
}

/// Byte offset of `ino`'s record (following the lane's table chain).
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

fn record(pm: &SimPool, ino: u64) -> InodeRecord {
    read_pod(pm, rec_off(pm, ino))
}

/// The pages of `ino`'s log up to its tail.
fn log_pages(pm: &SimPool, ino: u64) -> Vec<u64> {
    let r = record(pm, ino);
    let mut pages = vec![r.log_head];
    while !LogPageSpan::of(*pages.last().unwrap()).holds(r.log_tail) {
        let f: LogPageFooter = read_pod(pm, LogPageSpan::of(*pages.last().unwrap()).footer());
        pages.push(f.next_block);
    }
    pages
}

/// Every committed entry of `ino`'s log: (offset, bytes).
fn log_entries(pm: &SimPool, ino: u64) -> Vec<(u64, Vec<u8>)> {
    let r = record(pm, ino);
    let mut out = Vec::new();
    for page in log_pages(pm, ino) {
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
    }
    out
}

/// Append a sealed entry at `ino`'s tail (it must fit in the tail page)
/// and commit it, as the engine would.
fn append_entry(pm: &SimPool, ino: u64, entry: &[u8]) {
    let off = rec_off(pm, ino);
    let r = record(pm, ino);
    let span = LogPageSpan::of(r.log_head);
    let room = if span.holds(r.log_tail) {
        span.footer() - r.log_tail
    } else {
        LOG_PAGE_PAYLOAD - r.log_tail % BLOCK_SIZE
    };
    assert!(entry.len() as u64 <= room);
    pm.write(r.log_tail, entry);
    pm.write_u64(off + INODE_TAIL_FIELD, r.log_tail + entry.len() as u64);
}

/// The attribute snapshot `ino` has now, as a log entry would hold it.
fn attr_entry(fs: &Fs<SimPool>, ino: u64, parent: u64) -> AttrEntry {
    let a = fs.getattr(ino).unwrap();
    let mut e: AttrEntry = AttrEntry::zeroed();
    e.mode = a.mode;
    e.uid = a.uid;
    e.gid = a.gid;
    e.nlink = a.nlink;
    e.size = if a.kind == FileKind::File { a.size } else { 0 };
    e.atime_ns = a.atime_ns;
    e.mtime_ns = a.mtime_ns;
    e.ctime_ns = a.ctime_ns;
    e.rdev_or_parent = parent;
    e
}

fn lookup_path(fs: &Fs<SimPool>, path: &str) -> u64 {
    let mut ino = ROOT_INO;
    for c in path.split('/').filter(|c| !c.is_empty()) {
        ino = fs
            .lookup(ino, c.as_bytes())
            .unwrap_or_else(|e| panic!("{path}: {e}"))
            .ino;
    }
    ino
}

fn read_all(fs: &Fs<SimPool>, ino: u64) -> Vec<u8> {
    let fh = fs.open(ino).unwrap();
    let size = fs.fgetattr(&fh).unwrap().size as usize;
    let mut buf = vec![0u8; size];
    let mut got = 0;
    while got < size {
        let n = fs.read(&fh, got as u64, &mut buf[got..]).unwrap();
        assert!(n > 0);
        got += n;
    }
    fs.release(fh);
    buf
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u64 * 31 + seed * 7) % 251) as u8)
        .collect()
}

struct Populated {
    /// path → contents, for every regular file left.
    files: Vec<(String, Vec<u8>)>,
}

/// A namespace exercising every entry type: nested directories, files of
/// several sizes (holes, overwrites, truncates), hard links, a symlink, a
/// FIFO, xattrs, renames, unlinks, and a directory with a multi-page log.
fn populate(fs: &Fs<SimPool>) -> Populated {
    let mut files = Vec::new();
    let d1 = fs.mkdir(ROOT_INO, b"d1", 0o755, 0, 0).unwrap().ino;
    let d2 = fs.mkdir(ROOT_INO, b"d2", 0o755, 0, 0).unwrap().ino;
    let d3 = fs.mkdir(d1, b"d3", 0o700, 0, 0).unwrap().ino;
    let big = fs.mkdir(ROOT_INO, b"big", 0o755, 0, 0).unwrap().ino;
    for (i, (dir, dname)) in [(ROOT_INO, ""), (d1, "d1"), (d2, "d2"), (d3, "d1/d3")]
        .into_iter()
        .enumerate()
    {
        for j in 0..5u64 {
            let name = format!("f{j}");
            let (_, fh) = fs.create(dir, name.as_bytes(), 0o644, 0, 0).unwrap();
            let len = [0usize, 100, 5000, 20000, 70000][j as usize];
            let data = pattern(i as u64 * 10 + j, len);
            if len > 0 {
                fs.write(&fh, 0, &data).unwrap();
            }
            fs.release(fh);
            files.push((format!("{dname}/{name}"), data));
        }
    }
    // Overwrite in the middle (copy-on-write), extend with a hole, truncate.
    let f = lookup_path(fs, "d1/f4");
    let fh = fs.open(f).unwrap();
    fs.write(&fh, 4096 * 3 + 10, b"overwritten").unwrap();
    fs.write(&fh, 200_000, b"after a hole").unwrap();
    fs.release(fh);
    fs.setattr(
        lookup_path(fs, "d2/f4"),
        &SetAttr {
            size: Some(12345),
            ..Default::default()
        },
    )
    .unwrap();
    fs.link(lookup_path(fs, "f3"), d2, b"hardlink").unwrap();
    fs.symlink(d1, b"sym", b"../f2", 0, 0).unwrap();
    fs.mknod(d2, b"fifo", libc::S_IFIFO | 0o644, 0, 0, 0)
        .unwrap();
    fs.setxattr(lookup_path(fs, "f2"), b"user.k", b"value", XattrFlags::Any)
        .unwrap();
    fs.rename(ROOT_INO, b"f1", d3, b"moved", RenameFlags::default())
        .unwrap();
    fs.rename(d1, b"d3", d2, b"d3moved", RenameFlags::default())
        .unwrap();
    fs.unlink(d2, b"f0").unwrap();
    for _ in 0..150 {
        fs.setattr(
            lookup_path(fs, "d2/f1"),
            &SetAttr {
                mode: Some(0o600),
                ..Default::default()
            },
        )
        .unwrap();
    }
    // A directory whose log spans several pages.
    for k in 0..150 {
        let name = format!("e{k}");
        let (_, fh) = fs.create(big, name.as_bytes(), 0o644, 0, 0).unwrap();
        fs.release(fh);
    }
    for k in (0..150).step_by(3) {
        fs.unlink(big, format!("e{k}").as_bytes()).unwrap();
    }
    // Recompute what is where after the moves.
    let mut out = Vec::new();
    for (path, data) in files {
        let path = match path.as_str() {
            "/f1" => "d2/d3moved/moved".to_string(),
            "d2/f0" => continue,
            p if p.starts_with("d1/d3/") => p.replace("d1/d3/", "d2/d3moved/"),
            p => p.trim_start_matches('/').to_string(),
        };
        out.push((path, data));
    }
    for (path, data) in out.iter_mut() {
        if path == "d1/f4" {
            data.resize(200_000 + 12, 0);
            data[4096 * 3 + 10..4096 * 3 + 21].copy_from_slice(b"overwritten");
            data[200_000..].copy_from_slice(b"after a hole");
        }
        if path == "d2/f4" {
            data.resize(12345, 0);
        }
    }
    Populated { files: out }
}

fn populated_pool() -> (SimPool, Populated) {
    let fs = fresh();
    let p = populate(&fs);
    (fs.unmount().unwrap(), p)
}

/// Every file's contents as populate left them (mounts and unmounts).
fn verify_files(pm: SimPool, p: &Populated) -> SimPool {
    let fs = mount(pm);
    for (path, data) in &p.files {
        let got = read_all(&fs, lookup_path(&fs, path));
        assert!(got == *data, "{path}: contents differ");
    }
    fs.unmount().unwrap()
}

// ---------------------------------------------------------------------------

#[test]
fn fresh_pool_is_clean() {
    let pm = fresh().unmount().unwrap();
    let r = check(&pm);
    assert_clean(&r);
    assert_eq!(r.inodes_checked, 1);
    assert_eq!(r.directories, 1);
    assert!(r.was_clean);
    assert_eq!(r.blocks_used, 1);
    assert!(r.problems.is_empty(), "{:#?}", r.problems);
}

#[test]
fn populated_pool_is_clean_clean_and_crashed() {
    let fs = fresh();
    let p = populate(&fs);
    // Crash image (not unmounted): clean, the allocator gets rebuilt.
    let crashed = SimPool::from_image(fs.pmem().current_image());
    let r = check(&crashed);
    assert_clean(&r);
    assert!(!r.was_clean);
    let pm = fs.unmount().unwrap();
    let r = check(&pm);
    assert_clean(&r);
    assert!(r.problems.is_empty(), "{:#?}", r.problems);
    assert_eq!(r.directories, 5);
    assert_eq!(r.files, 19 + 100);
    assert_eq!(r.symlinks, 1);
    assert_eq!(r.other, 1);
    assert_eq!(r.blocks_used + r.blocks_free, r.blocks_total);
    // Repair of a clean pool changes nothing.
    let r = repair(&pm);
    assert_clean(&r);
    assert!(!r.modified);
    verify_files(pm, &p);
}

#[test]
fn orphan_after_crash_is_a_note_and_repair_frees_it() {
    let fs = fresh();
    let (_, fh) = fs.create(ROOT_INO, b"open", 0o644, 0, 0).unwrap();
    fs.write(&fh, 0, &pattern(1, 9000)).unwrap();
    fs.unlink(ROOT_INO, b"open").unwrap();
    let pm = SimPool::from_image(fs.pmem().current_image());
    let r = check(&pm);
    assert_clean(&r);
    assert_eq!(r.orphans, 1);
    assert!(r
        .problems
        .iter()
        .any(|p| p.kind == ProblemKind::Orphan && p.severity == Severity::Note));
    let r = repair(&pm);
    assert_clean(&r);
    let r = check(&pm);
    assert_eq!(r.orphans, 0);
    assert!(r.problems.is_empty(), "{:#?}", r.problems);
    fs.release(fh);
}

#[test]
fn torn_journal_is_a_note() {
    let (pm, _) = populated_pool();
    let off = (lane_first_block(1) + LANE_JOURNAL_BLOCK) * BLOCK_SIZE;
    pm.write_u64(off + 8, 3 | 0xdead_beef << 32);
    let r = check(&pm);
    assert_clean(&r);
    assert!(r.problems.iter().any(|p| p.kind == ProblemKind::Journal));
    let r = repair(&pm);
    assert_clean(&r);
    assert_eq!(pm.read_u64(off + 8), 0);
    assert!(check(&pm).problems.is_empty());
}

#[test]
fn committed_journal_is_replayed_in_the_check() {
    // A committed, unapplied transaction that frees "f0" and removes its
    // name: the check must see the pool as the mount will (clean).
    let fs = fresh();
    let (_, fh) = fs.create(ROOT_INO, b"f0", 0o644, 0, 0).unwrap();
    fs.release(fh);
    let ino = fs.lookup(ROOT_INO, b"f0").unwrap().ino;
    let pm = fs.unmount().unwrap();
    let fs = mount(pm);
    let root_rec = record(fs.pmem(), ROOT_INO);
    let (root_off, f_off) = (rec_off(fs.pmem(), ROOT_INO), rec_off(fs.pmem(), ino));
    let e = EntryBuf::dir(false, ino, 0, 1, FileKind::File, b"f0");
    let at = root_rec.log_tail;
    fs.pmem().write(at, e.as_bytes());
    let records = [
        JournalRecord {
            offset: root_off + INODE_TAIL_FIELD,
            value: at + e.as_bytes().len() as u64,
        },
        JournalRecord {
            offset: f_off + INODE_STATE_FIELD,
            value: INODE_FREE,
        },
    ];
    let joff = (lane_first_block(0) + LANE_JOURNAL_BLOCK) * BLOCK_SIZE;
    let seq = 77;
    for (i, r) in records.iter().enumerate() {
        write_pod(fs.pmem(), joff + 64 + i as u64 * 16, r);
    }
    fs.pmem().write_u64(joff, seq);
    fs.pmem()
        .write_u64(joff + 8, journal_commit_word(2, journal_crc(seq, &records)));
    let pm = SimPool::from_image(fs.pmem().current_image());
    drop(fs);
    let r = check(&pm);
    assert_clean(&r);
    assert!(r
        .problems
        .iter()
        .any(|p| p.kind == ProblemKind::Journal && p.message.contains("committed")));
    let r = repair(&pm);
    assert_clean(&r);
    assert_eq!(record(&pm, ino).state, INODE_FREE);
    let fs = mount(pm);
    assert!(fs.lookup(ROOT_INO, b"f0").is_err());
}

#[test]
fn flipped_log_byte_is_detected_and_not_repairable() {
    let (pm, _) = populated_pool();
    let fs = mount(pm);
    let ino = lookup_path(&fs, "d1/f2");
    let pm = fs.unmount().unwrap();
    let (off, _) = log_entries(&pm, ino)[0];
    let mut b = [0u8; 1];
    pm.read(off + 20, &mut b);
    pm.write(off + 20, &[b[0] ^ 0x40]);
    let r = check(&pm);
    assert!(has_error(&r, ProblemKind::Log), "{:#?}", r.problems);
    assert!(r
        .errors()
        .any(|p| p.ino == Some(ino) && p.message.contains("checksum")));
    assert_eq!(r.exit_code(), 4);
    let r = repair(&pm);
    assert_eq!(r.exit_code(), 4);
    assert!(r.errors_remaining > 0);
}

#[test]
fn log_chain_cycle_is_detected() {
    let (pm, _) = populated_pool();
    let fs = mount(pm);
    let big = lookup_path(&fs, "big");
    let pm = fs.unmount().unwrap();
    let pages = log_pages(&pm, big);
    // The head is a chunk (no link may name one): the whole pages after it.
    let whole = &pages[1..];
    assert!(whole.len() >= 3, "big's log has {} pages", pages.len());
    // Second whole page back to the first; the tail is beyond.
    pm.write_u64(whole[1] * BLOCK_SIZE + LOG_FOOTER_OFFSET, whole[0]);
    let r = check(&pm);
    assert!(r
        .errors()
        .any(|p| p.kind == ProblemKind::Log && p.ino == Some(big) && p.message.contains("cycle")));
    assert_eq!(r.exit_code(), 4);
}

#[test]
fn dangling_entry_is_detected_and_removed() {
    let (pm, p) = populated_pool();
    let fs = mount(pm);
    let victim = lookup_path(&fs, "d1/f3");
    let pm = fs.unmount().unwrap();
    pm.write_u64(rec_off(&pm, victim) + INODE_STATE_FIELD, INODE_FREE);
    let r = check(&pm);
    assert!(
        has_error(&r, ProblemKind::DanglingEntry),
        "{:#?}",
        r.problems
    );
    // Its blocks are still reserved by the saved free lists: a leak.
    assert!(has_error(&r, ProblemKind::BlockLeak), "{:#?}", r.problems);
    assert_eq!(r.exit_code(), 4);
    let r = repair(&pm);
    assert_eq!(r.exit_code(), 1, "{:#?}", r.problems);
    assert!(r.errors().all(|p| p.repaired));
    assert_clean(&check(&pm));
    let p = Populated {
        files: p.files.into_iter().filter(|(n, _)| n != "d1/f3").collect(),
    };
    let pm = verify_files(pm, &p);
    let fs = mount(pm);
    assert!(fs.lookup(lookup_path(&fs, "d1"), b"f3").is_err());
}

#[test]
fn wrong_link_count_is_detected_and_fixed() {
    let (pm, p) = populated_pool();
    let fs = mount(pm);
    let ino = lookup_path(&fs, "d1/f4");
    let mut a = attr_entry(&fs, ino, 0);
    a.nlink = 3;
    let pm = fs.unmount().unwrap();
    append_entry(&pm, ino, EntryBuf::attr(true, a).as_bytes());
    let r = check(&pm);
    assert!(r
        .errors()
        .any(|p| p.kind == ProblemKind::LinkCount && p.ino == Some(ino)));
    let r = repair(&pm);
    assert_eq!(r.exit_code(), 1, "{:#?}", r.problems);
    assert_clean(&check(&pm));
    let pm = verify_files(pm, &p);
    let fs = mount(pm);
    assert_eq!(fs.getattr(ino).unwrap().nlink, 1);
    // The hard-linked file keeps 2.
    assert_eq!(fs.getattr(lookup_path(&fs, "f3")).unwrap().nlink, 2);
}

#[test]
fn doubly_used_block_is_detected() {
    let (pm, _) = populated_pool();
    let fs = mount(pm);
    let a = lookup_path(&fs, "d2/f2");
    let b = lookup_path(&fs, "d2/f3");
    let pm = fs.unmount().unwrap();
    let write_of = |ino| {
        log_entries(&pm, ino)
            .into_iter()
            .find(|(_, e)| e[0] == entry_type::FILE_WRITE)
            .unwrap()
    };
    let (_, ea) = write_of(a);
    let block_a = WriteEntry::from_bytes(&ea).block;
    let (off_b, eb) = write_of(b);
    let mut w = WriteEntry::from_bytes(&eb);
    w.block = block_a;
    let mut bytes = w.as_bytes().to_vec();
    seal_entry(&mut bytes);
    pm.write(off_b, &bytes);
    let r = check(&pm);
    assert!(
        r.errors()
            .any(|p| p.kind == ProblemKind::BlockTwice && p.message.contains(&block_a.to_string())),
        "{:#?}",
        r.problems
    );
    assert_eq!(r.exit_code(), 4);
    let r = repair(&pm);
    assert_eq!(r.exit_code(), 4);
    assert!(r
        .errors()
        .any(|p| p.kind == ProblemKind::BlockTwice && !p.repaired));
}

/// A block carved into log chunks that a file also maps as data: a block
/// used twice (reported, not repaired, as for whole pages).
#[test]
fn chunk_block_used_as_data_is_detected() {
    let (pm, _) = populated_pool();
    let fs = mount(pm);
    let a = lookup_path(&fs, "d2/f2");
    let b = lookup_path(&fs, "d2/f3");
    let pm = fs.unmount().unwrap();
    let (chunk_block, chunk) = log_page_id(record(&pm, a).log_head).unwrap();
    assert!(chunk.is_some(), "a new inode's log starts in a chunk");
    let (off_b, eb) = log_entries(&pm, b)
        .into_iter()
        .find(|(_, e)| e[0] == entry_type::FILE_WRITE)
        .unwrap();
    let mut w = WriteEntry::from_bytes(&eb);
    w.block = chunk_block;
    w.pages = 1;
    let mut bytes = w.as_bytes().to_vec();
    seal_entry(&mut bytes);
    pm.write(off_b, &bytes);
    let r = check(&pm);
    assert!(
        r.errors().any(|p| p.kind == ProblemKind::BlockTwice
            && p.message.contains(&chunk_block.to_string())
            && p.message.contains("log chunks")),
        "{:#?}",
        r.problems
    );
    assert_eq!(repair(&pm).exit_code(), 4);
}

/// Two inodes whose records name one chunk: the second's walk meets a
/// footer of another inode (an error, as for a page).
#[test]
fn two_inodes_naming_one_chunk_is_detected() {
    let (pm, _) = populated_pool();
    let fs = mount(pm);
    let a = lookup_path(&fs, "d2/f2");
    let b = lookup_path(&fs, "d2/f3");
    let pm = fs.unmount().unwrap();
    let head = record(&pm, a).log_head;
    rec_mut(&pm, b, |r| {
        r.log_head = head;
        r.log_tail = record(&pm, a).log_tail;
    });
    let r = check(&pm);
    assert!(has_error(&r, ProblemKind::Log), "{:#?}", r.problems);
}

/// On a clean pool, the saved lists of partly used chunk blocks must match
/// the logs' heads: a chunk in use listed free would be handed out twice,
/// a free chunk not listed is leaked. Both are fixed by rebuilding the
/// lists; the files stay.
#[test]
fn saved_chunk_lists_that_disagree_with_the_logs_are_fixed() {
    for damage in ["free a used chunk", "forget the chunk blocks"] {
        let (pm, p) = populated_pool();
        let lane = (0..2)
            .find(|&l| {
                let off = (lane_first_block(l) + LANE_SAVE_FIRST_BLOCK) * BLOCK_SIZE;
                read_pod::<SaveHeader, _>(&pm, off).chunk_blocks > 0
            })
            .expect("a partly used chunk block");
        save_mut_all(&pm, lane, |_, _, _, chunks| match damage {
            "free a used chunk" => {
                let used = chunks[0].len;
                // Keep one chunk used (a valid record) and drop the others.
                chunks[0].len = used & used.wrapping_neg();
                if chunks[0].len == used {
                    chunks[0].len = used ^ 0b1111;
                }
            }
            _ => chunks.clear(),
        });
        let r = check(&pm);
        let kind = match damage {
            "free a used chunk" => ProblemKind::SaveArea,
            _ => ProblemKind::BlockLeak,
        };
        assert!(has_error(&r, kind), "{damage}: {:#?}", r.problems);
        assert_eq!(repair(&pm).exit_code(), 1, "{damage}");
        assert_clean(&check(&pm));
        verify_files(pm, &p);
    }
}

#[test]
fn unreachable_file_is_reconnected() {
    let (pm, p) = populated_pool();
    let fs = mount(pm);
    let d1 = lookup_path(&fs, "d1");
    let ino = lookup_path(&fs, "d1/f3");
    let pm = fs.unmount().unwrap();
    append_entry(
        &pm,
        d1,
        EntryBuf::dir(false, ino, 3, 1, FileKind::File, b"f3").as_bytes(),
    );
    let r = check(&pm);
    assert!(r
        .errors()
        .any(|p| p.kind == ProblemKind::Unreachable && p.ino == Some(ino)));
    let r = repair(&pm);
    assert_eq!(r.exit_code(), 1, "{:#?}", r.problems);
    assert_clean(&check(&pm));
    let data = p
        .files
        .iter()
        .find(|(n, _)| n == "d1/f3")
        .unwrap()
        .1
        .clone();
    let rest = Populated {
        files: p.files.into_iter().filter(|(n, _)| n != "d1/f3").collect(),
    };
    let pm = verify_files(pm, &rest);
    let fs = mount(pm);
    let got = lookup_path(&fs, &format!("lost+found/#{ino}"));
    assert_eq!(got, ino);
    assert_eq!(read_all(&fs, ino), data);
}

#[test]
fn unreachable_directory_is_reconnected_with_its_tree() {
    let (pm, p) = populated_pool();
    let fs = mount(pm);
    let d1 = lookup_path(&fs, "d1");
    let pm = fs.unmount().unwrap();
    append_entry(
        &pm,
        ROOT_INO,
        EntryBuf::dir(false, d1, 0, 1, FileKind::Dir, b"d1").as_bytes(),
    );
    let r = check(&pm);
    let unreachable: Vec<_> = r
        .errors()
        .filter(|p| p.kind == ProblemKind::Unreachable)
        .collect();
    // Only the top of the tree, not what is below it.
    assert_eq!(unreachable.len(), 1, "{:#?}", r.problems);
    assert_eq!(unreachable[0].ino, Some(d1));
    let r = repair(&pm);
    assert_eq!(r.exit_code(), 1, "{:#?}", r.problems);
    assert_clean(&check(&pm));
    let moved = Populated {
        files: p
            .files
            .iter()
            .map(|(n, d)| {
                let n = match n.strip_prefix("d1/") {
                    Some(rest) => format!("lost+found/#{d1}/{rest}"),
                    None => n.clone(),
                };
                (n, d.clone())
            })
            .collect(),
    };
    let pm = verify_files(pm, &moved);
    let fs = mount(pm);
    let lf = lookup_path(&fs, "lost+found");
    assert_eq!(fs.lookup_ino(d1, b"..").unwrap(), lf);
}

#[test]
fn wrong_dotdot_is_detected_and_fixed() {
    let (pm, p) = populated_pool();
    let fs = mount(pm);
    let d3 = lookup_path(&fs, "d2/d3moved");
    let d2 = lookup_path(&fs, "d2");
    let a = attr_entry(&fs, d3, ROOT_INO);
    let pm = fs.unmount().unwrap();
    append_entry(&pm, d3, EntryBuf::attr(false, a).as_bytes());
    let r = check(&pm);
    assert!(r
        .errors()
        .any(|p| p.kind == ProblemKind::DirParent && p.ino == Some(d3)));
    let r = repair(&pm);
    assert_eq!(r.exit_code(), 1, "{:#?}", r.problems);
    assert_clean(&check(&pm));
    let pm = verify_files(pm, &p);
    let fs = mount(pm);
    assert_eq!(fs.lookup_ino(d3, b"..").unwrap(), d2);
}

#[test]
fn entry_kind_mismatch_is_fixed() {
    let (pm, p) = populated_pool();
    let fs = mount(pm);
    let ino = lookup_path(&fs, "f2");
    let pm = fs.unmount().unwrap();
    append_entry(
        &pm,
        ROOT_INO,
        EntryBuf::dir(true, ino, 900, 1, FileKind::Symlink, b"f2").as_bytes(),
    );
    let r = check(&pm);
    assert!(has_error(&r, ProblemKind::EntryKind), "{:#?}", r.problems);
    let r = repair(&pm);
    assert_eq!(r.exit_code(), 1, "{:#?}", r.problems);
    assert_clean(&check(&pm));
    verify_files(pm, &p);
}

#[test]
fn damaged_primary_superblock_is_rewritten_from_the_backup() {
    let (pm, p) = populated_pool();
    let mut b = [0u8; 1];
    pm.read(100, &mut b);
    pm.write(100, &[b[0] ^ 0xff]);
    let r = check(&pm);
    assert!(r
        .errors()
        .any(|p| p.kind == ProblemKind::Superblock && p.message.contains("primary")));
    assert_eq!(r.exit_code(), 4);
    let r = repair(&pm);
    assert_eq!(r.exit_code(), 1, "{:#?}", r.problems);
    assert_clean(&check(&pm));
    let primary: Superblock = read_pod(&pm, 0);
    let backup: Superblock = read_pod(&pm, BLOCK_SIZE);
    assert_eq!(primary, backup);
    verify_files(pm, &p);
}

#[test]
fn damaged_backup_superblock_is_rewritten() {
    let (pm, _) = populated_pool();
    pm.write_u64(BLOCK_SIZE + 16, 12345);
    let r = check(&pm);
    assert!(r
        .errors()
        .any(|p| p.kind == ProblemKind::Superblock && p.message.contains("backup")));
    assert_eq!(repair(&pm).exit_code(), 1);
    assert_clean(&check(&pm));
}

#[test]
fn no_superblock_is_an_operational_error() {
    let pm = SimPool::new(1 << 20);
    assert!(fsck::check(&pm, &FsckOptions::default()).is_err());
}

#[test]
fn leak_on_a_clean_pool_is_fixed() {
    let (pm, p) = populated_pool();
    // A free block that the saved lists do not mention: rewrite lane 0's
    // save area without its first range (checksum fixed).
    let off = (lane_first_block(0) + LANE_SAVE_FIRST_BLOCK) * BLOCK_SIZE;
    let mut h: SaveHeader = read_pod(&pm, off);
    assert!(h.block_ranges > 0);
    let n = (h.block_ranges + h.inode_ranges + h.chunk_blocks) as usize;
    let mut ranges = vec![0u8; n * 16];
    pm.read(off + 64, &mut ranges);
    let mut first = SavedRange::from_bytes(&ranges);
    first.start += 1;
    first.len -= 1;
    if first.len == 0 {
        return;
    }
    ranges[..16].copy_from_slice(first.as_bytes());
    pm.write(off + 64, &ranges);
    h.checksum = 0;
    let crc = crc32c_of(&h, &ranges);
    h.checksum = crc;
    write_pod(&pm, off, &h);
    let r = check(&pm);
    assert!(has_error(&r, ProblemKind::BlockLeak), "{:#?}", r.problems);
    assert_eq!(repair(&pm).exit_code(), 1);
    assert_clean(&check(&pm));
    verify_files(pm, &p);
}

fn crc32c_of(h: &SaveHeader, ranges: &[u8]) -> u32 {
    // Same as the engine: crc32c over the header (checksum zero), then ranges.
    let mut all = h.as_bytes().to_vec();
    all.extend_from_slice(ranges);
    crc32c(&all)
}

/// Plain crc32c (Castagnoli), to forge save-area checksums in tests.
fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82f6_3b78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn progress_is_reported() {
    let (pm, _) = populated_pool();
    let mut last = None;
    fsck::check_with_progress(&pm, &FsckOptions::default(), &mut |p| last = Some(p)).unwrap();
    let p = last.unwrap();
    assert_eq!(p.done, p.total);
    assert!(p.total > 0);
}

/// Every crash image of a small workload: the raw image checks without an
/// operational error or a panic, and once recovered (mounted) it is clean,
/// mounted and after a clean unmount.
#[test]
fn crash_images_are_clean_after_recovery() {
    let pm = SimPool::new(4 << 20);
    Fs::format(
        &pm,
        &FormatOptions {
            lanes: 2,
            ..Default::default()
        },
    )
    .unwrap();
    let fs = mount(pm);
    fs.pmem().start_trace();
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, 0, 0).unwrap().ino;
    let (_, fh) = fs.create(d, b"a", 0o644, 0, 0).unwrap();
    fs.write(&fh, 0, &pattern(3, 9000)).unwrap();
    fs.link(fh.ino(), ROOT_INO, b"a2").unwrap();
    fs.rename(d, b"a", ROOT_INO, b"a3", RenameFlags::default())
        .unwrap();
    fs.unlink(ROOT_INO, b"a2").unwrap();
    fs.unlink(ROOT_INO, b"a3").unwrap(); // open: an orphan
    fs.mkdir(d, b"e", 0o755, 0, 0).unwrap();
    fs.rmdir(d, b"e").unwrap();
    fs.release(fh);
    let pm = fs.unmount().unwrap();
    let trace = pm.stop_trace();
    let points = trace.fence_count() + 1;
    let step = points.div_ceil(60).max(1);
    let mut images = 0;
    for point in (0..points).step_by(step) {
        for img in trace.crash_images(point, 3, 7) {
            images += 1;
            let pm = SimPool::from_image(img.image);
            let raw = fsck::check(&pm, &FsckOptions::default())
                .unwrap_or_else(|e| panic!("{}: {e}", img.description));
            // A crash image can only hold states the mount handles: notes,
            // or a torn superblock copy.
            for p in raw.errors() {
                assert_eq!(
                    p.kind,
                    ProblemKind::Superblock,
                    "{}: {p} (all: {:#?})",
                    img.description,
                    raw.problems
                );
            }
            let fs = mount(pm);
            let mounted = SimPool::from_image(fs.pmem().current_image());
            let r = check(&mounted);
            assert!(r.is_clean(), "{}: {:#?}", img.description, r.problems);
            let pm = fs.unmount().unwrap();
            let r = check(&pm);
            assert!(r.is_clean(), "{}: {:#?}", img.description, r.problems);
            assert!(
                r.problems.is_empty(),
                "{}: {:#?}",
                img.description,
                r.problems
            );
        }
    }
    assert!(images > 10);
}

#[test]
fn directory_with_two_names_is_fixed() {
    let (pm, p) = populated_pool();
    let fs = mount(pm);
    let d2 = lookup_path(&fs, "d2");
    let pm = fs.unmount().unwrap();
    // The walk meets names in readdir order and reports the second name of
    // a directory: "alias" gets the last position, so it is that one.
    append_entry(
        &pm,
        ROOT_INO,
        EntryBuf::dir(
            true,
            d2,
            inkfs::dir::POSITION_MAX,
            1,
            FileKind::Dir,
            b"alias",
        )
        .as_bytes(),
    );
    let r = check(&pm);
    assert!(
        r.errors()
            .any(|p| p.kind == ProblemKind::DirLinkedTwice && p.message.contains("alias")),
        "{:#?}",
        r.problems
    );
    let r = repair(&pm);
    assert_eq!(r.exit_code(), 1, "{:#?}", r.problems);
    assert_clean(&check(&pm));
    let pm = verify_files(pm, &p);
    let fs = mount(pm);
    assert!(fs.lookup(ROOT_INO, b"alias").is_err());
    assert!(fs.lookup(ROOT_INO, b"d2").is_ok());
}

#[test]
fn broken_inode_table_chain_is_detected() {
    let (pm, _) = populated_pool();
    // A lane whose table has grown (a thread allocates from one lane).
    let (first, t) = (0..2)
        .map(|lane| {
            let first = lane_first_block(lane) + LANE_INODE_TABLE_BLOCK;
            let t: TableTrailer = read_pod(&pm, first * BLOCK_SIZE + TABLE_TRAILER_OFFSET);
            (first, t)
        })
        .find(|(_, t)| t.next_block != 0)
        .expect("a lane with a second table block");
    // Second block's trailer links back to the first: a cycle.
    pm.write_u64(t.next_block * BLOCK_SIZE + TABLE_TRAILER_OFFSET + 8, first);
    let r = check(&pm);
    assert!(has_error(&r, ProblemKind::InodeTable), "{:#?}", r.problems);
    assert_eq!(r.exit_code(), 4);
    // Out of range, and a bad magic.
    pm.write_u64(
        t.next_block * BLOCK_SIZE + TABLE_TRAILER_OFFSET + 8,
        1 << 40,
    );
    assert!(has_error(&check(&pm), ProblemKind::InodeTable));
    pm.write_u64(t.next_block * BLOCK_SIZE + TABLE_TRAILER_OFFSET, 0);
    let r = check(&pm);
    assert!(has_error(&r, ProblemKind::InodeTable));
    // The inodes of the lost block are gone: their names dangle.
    assert!(has_error(&r, ProblemKind::DanglingEntry));
    assert_eq!(repair(&pm).exit_code(), 4);
}

/// Non-zero bytes a file maps past its end (in its last page, and in a
/// block kept past the end by fallocate KEEP_SIZE) are errors: they would
/// show as the file's contents if it grew. Repair zeroes them and keeps
/// the file's bytes.
#[test]
fn bytes_past_eof_are_detected_and_zeroed() {
    let fs = fresh();
    let (attr, fh) = fs.create(1, b"f", 0o644, 0, 0).unwrap();
    let data = pattern(3, 5000);
    fs.write(&fh, 0, &data).unwrap();
    let keep = FallocFlags {
        keep_size: true,
        ..Default::default()
    };
    fs.fallocate(&fh, 0, 4 * 4096, keep).unwrap();
    fs.release(fh);
    let pm = fs.unmount().unwrap();
    assert_clean(&check(&pm));
    // The blocks of pages 1 (the last, 5000 % 4096 bytes used) and 3.
    let block_of = |page: u64| {
        log_entries(&pm, attr.ino)
            .into_iter()
            .filter(|(_, e)| e[0] == entry_type::FILE_WRITE)
            .map(|(_, e)| WriteEntry::from_bytes(&e))
            .rfind(|w| w.file_page <= page && page < w.file_page + w.pages as u64)
            .map(|w| w.block + (page - w.file_page))
            .unwrap()
    };
    pm.write(block_of(1) * BLOCK_SIZE + 5000 % 4096 + 7, &[0xab]);
    pm.write(block_of(3) * BLOCK_SIZE + 4095, &[0xcd]);
    let r = check(&pm);
    let p = r
        .errors()
        .find(|p| p.kind == ProblemKind::PastEof)
        .unwrap_or_else(|| panic!("{:#?}", r.problems));
    assert_eq!(p.ino, Some(attr.ino));
    assert!(p.message.starts_with("2 page(s)"), "{}", p.message);
    assert_eq!(r.exit_code(), 4);
    let r = repair(&pm);
    assert_eq!(r.exit_code(), 1, "{:#?}", r.problems);
    assert!(r.modified);
    assert_clean(&check(&pm));
    // The file's bytes are intact and growing it shows zeros.
    let fs = mount(pm);
    assert!(read_all(&fs, attr.ino) == data);
    fs.setattr(
        attr.ino,
        &SetAttr {
            size: Some(4 * 4096),
            ..Default::default()
        },
    )
    .unwrap();
    let grown = read_all(&fs, attr.ino);
    assert!(grown[..5000] == data[..] && grown[5000..].iter().all(|&b| b == 0));
}

// The out-of-range cases (fields outside docs/FORMAT.md's ranges, checksums
// valid) and their helpers.
mod ranges;
use ranges::{rec_mut, save_mut_all};
