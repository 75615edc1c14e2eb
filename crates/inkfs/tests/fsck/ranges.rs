//! Out-of-range fields with valid checksums
//!
//! Each case damages one field of one on-media structure with a value outside
//! the range docs/FORMAT.md ("Field ranges") allows, and keeps every checksum
//! valid, so only the range checks can catch it. For each case:
//! - fsck reports an error of the expected kind (exit 4), and after `-y`
//!   exits 1 with a clean re-check if the damage is repairable, else 4;
//! - the mount refuses the pool with a one-line error, or serves every name
//!   except the damaged inodes, which give `Corrupt` (EIO), and still takes
//!   writes; it never serves the bad value;
//! - a crash mount (state MOUNTED: the recovery scan reads every log) refuses
//!   damage in any inode, and serves the rest as the clean mount does;
//! - nothing panics, nothing hangs (each case runs under a deadline).

use super::*;

use std::collections::BTreeMap;
use std::sync::OnceLock;

use inkfs::Error;

/// A small pool holding every kind of inode, each log with room in its
/// tail page, a directory whose log spans two pages, and a lane whose inode
/// table has three blocks.
struct RangeBase {
    img: Vec<u8>,
    /// "/victim": data, a hole, a small and a large xattr.
    file: u64,
    /// "/dir", holding "inner".
    dir: u64,
    sym: u64,
    cdev: u64,
    /// "/many": 70 files, a two-page log.
    many: u64,
    /// The lane every inode but the root is in.
    lane: u32,
    lane_count: u32,
    total_blocks: u64,
    first_data_block: u64,
    /// Path → inode number, for every name.
    inos: BTreeMap<String, u64>,
    /// Path → what the walk saw (`describe_tree`).
    tree: BTreeMap<String, String>,
}

const RANGE_POOL: u64 = 2 << 20;
/// The size from the outside report: above MAX_FILE_BYTES, with valid checksums.
const SIZE_TOO_BIG: u64 = (1 << 46) + (1 << 32);

fn range_base() -> &'static RangeBase {
    static BASE: OnceLock<RangeBase> = OnceLock::new();
    BASE.get_or_init(|| {
        let pm = SimPool::new(RANGE_POOL);
        Fs::format(
            &pm,
            &FormatOptions {
                lanes: 2,
                ..Default::default()
            },
        )
        .unwrap();
        let fs = mount(pm);
        // The large xattr first: it does not fit the log's head (a 1 KiB
        // chunk) and fills the first whole page but two entries (its
        // name is 72 bytes long for that), so the entries after it start
        // a second page with room to append.
        let (a, fh) = fs.create(ROOT_INO, b"victim", 0o644, 0, 0).unwrap();
        let big_name = [b"user.big".as_slice(), &[b'n'; 64]].concat();
        fs.setxattr(
            a.ino,
            &big_name,
            &vec![7u8; XATTR_VALUE_MAX],
            XattrFlags::Any,
        )
        .unwrap();
        fs.write(&fh, 0, &pattern(1, 10_000)).unwrap();
        fs.write(&fh, 1 << 20, b"far").unwrap();
        fs.release(fh);
        fs.setxattr(a.ino, b"user.k", b"v", XattrFlags::Any)
            .unwrap();
        let (_, fh) = fs.create(ROOT_INO, b"bystander", 0o644, 0, 0).unwrap();
        fs.write(&fh, 0, b"fine").unwrap();
        fs.release(fh);
        let dir = fs.mkdir(ROOT_INO, b"dir", 0o755, 0, 0).unwrap().ino;
        let (_, fh) = fs.create(dir, b"inner", 0o600, 0, 0).unwrap();
        fs.write(&fh, 0, b"inside").unwrap();
        fs.release(fh);
        let sym = fs.symlink(ROOT_INO, b"sym", b"victim", 0, 0).unwrap().ino;
        fs.mknod(ROOT_INO, b"fifo", libc::S_IFIFO | 0o644, 0, 0, 0)
            .unwrap();
        let cdev = fs
            .mknod(ROOT_INO, b"cdev", libc::S_IFCHR | 0o600, 0x0103, 0, 0)
            .unwrap()
            .ino;
        let many = fs.mkdir(ROOT_INO, b"many", 0o755, 0, 0).unwrap().ino;
        for i in 0..70 {
            let (_, fh) = fs
                .create(many, format!("e{i}").as_bytes(), 0o644, 0, 0)
                .unwrap();
            fs.release(fh);
        }
        let geo = fs.geometry();
        let pm = fs.unmount().unwrap();
        let (lane, _) = ino_to_lane_slot(a.ino, geo.lane_count);
        let mut base = RangeBase {
            img: pm.current_image(),
            file: a.ino,
            dir,
            sym,
            cdev,
            many,
            lane,
            lane_count: geo.lane_count,
            total_blocks: geo.total_blocks,
            first_data_block: geo.first_data_block,
            inos: BTreeMap::new(),
            tree: BTreeMap::new(),
        };
        assert!(log_pages(&pm, many).len() >= 2, "many's log has one page");
        assert_eq!(table_blocks(&pm, lane).len(), 3, "lane {lane}'s table");
        let fs = mount(pm);
        base.tree = describe_tree(&fs, &[], "base", Some(&mut base.inos));
        base
    })
}

/// The blocks of `lane`'s inode-table chain.
fn table_blocks(pm: &SimPool, lane: u32) -> Vec<u64> {
    let mut out = vec![lane_first_block(lane) + LANE_INODE_TABLE_BLOCK];
    loop {
        let last = *out.last().unwrap();
        let t: TableTrailer = read_pod(pm, last * BLOCK_SIZE + TABLE_TRAILER_OFFSET);
        if t.next_block == 0 {
            return out;
        }
        out.push(t.next_block);
    }
}

fn hash_bytes(data: &[u8]) -> u64 {
    use std::hash::{DefaultHasher, Hasher};
    let mut h = DefaultHasher::new();
    h.write(data);
    h.finish()
}

/// Every name reachable from the root and what it shows (attributes,
/// contents, link target, xattrs). Names of the inodes in `bad` must give
/// `Corrupt` with a one-line message; their subtrees are not walked.
fn describe_tree(
    fs: &Fs<SimPool>,
    bad: &[u64],
    what: &str,
    mut inos: Option<&mut BTreeMap<String, u64>>,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![(String::new(), ROOT_INO)];
    while let Some((path, dir)) = dirs.pop() {
        let mut entries = Vec::new();
        fs.readdir(dir, 0, &mut |e| {
            entries.push(e);
            true
        })
        .unwrap_or_else(|e| panic!("{what}: readdir {path}/: {e}"));
        for e in entries {
            if e.name == b"." || e.name == b".." {
                continue;
            }
            let p = format!("{path}/{}", String::from_utf8_lossy(&e.name));
            if let Some(m) = inos.as_deref_mut() {
                m.insert(p.clone(), e.ino);
            }
            if bad.contains(&e.ino) {
                match fs.lookup(dir, &e.name) {
                    Err(Error::Corrupt(m)) => assert_one_line(what, &m),
                    other => panic!(
                        "{what}: {p} (inode {}) gave {other:?}, expected Corrupt",
                        e.ino
                    ),
                }
                assert_eq!(
                    fs.getattr(e.ino).map_err(|e| e.errno()).err(),
                    Some(libc::EIO),
                    "{what}: getattr {p}"
                );
                out.insert(p, "corrupt".into());
                continue;
            }
            let a = fs
                .lookup(dir, &e.name)
                .unwrap_or_else(|err| panic!("{what}: {p}: {err}"));
            let mut d = format!(
                "{:?} mode {:o} nlink {} size {} rdev {:x} uid {}",
                a.kind, a.mode, a.nlink, a.size, a.rdev, a.uid
            );
            match a.kind {
                FileKind::File => {
                    d += &format!(" data {:x}", hash_bytes(&read_all(fs, a.ino)));
                }
                FileKind::Symlink => {
                    let t = fs.readlink(a.ino).unwrap();
                    d += &format!(" -> {}", String::from_utf8_lossy(&t));
                }
                FileKind::Dir => dirs.push((p.clone(), a.ino)),
                _ => {}
            }
            for name in fs.listxattr(a.ino).unwrap() {
                let v = fs.getxattr(a.ino, &name).unwrap();
                d += &format!(
                    " xattr {}={:x}",
                    String::from_utf8_lossy(&name),
                    hash_bytes(&v)
                );
            }
            out.insert(p, d);
        }
    }
    out
}

fn assert_one_line(what: &str, m: &str) {
    assert!(
        !m.is_empty() && !m.contains('\n'),
        "{what}: error message {m:?}"
    );
}

/// What the mount must serve when the inodes in `bad` are damaged: the
/// base tree, with their names "corrupt" and what lies below them gone.
fn expected_tree(base: &RangeBase, bad: &[u64]) -> BTreeMap<String, String> {
    let bad_path = |p: &str| base.inos.get(p).is_some_and(|i| bad.contains(i));
    let mut out = BTreeMap::new();
    'paths: for (p, d) in &base.tree {
        let mut at = 0;
        while let Some(i) = p[at + 1..].find('/') {
            at += 1 + i;
            if bad_path(&p[..at]) {
                continue 'paths;
            }
        }
        let d = if bad_path(p) {
            "corrupt".into()
        } else {
            d.clone()
        };
        out.insert(p.clone(), d);
    }
    out
}

struct Case {
    what: String,
    img: Vec<u8>,
    /// The mount refuses the pool.
    refused: bool,
    /// Inodes that must give Corrupt; every other name is served.
    bad: Vec<u64>,
    /// None: fsck finds no usable superblock (operational error). Else the
    /// error kind it must report, the inode it must name (if any), and
    /// whether `-y` repairs it.
    fsck: Option<(ProblemKind, Option<u64>, bool)>,
    /// Also mount the image as a crashed pool.
    crash: bool,
    /// Creating an inode may fail with Corrupt (the lane's inode table is
    /// damaged, and a new inode may need a slot in it).
    creates_may_fail: bool,
}

impl RangeBase {
    /// The base image with `f` applied.
    fn damaged(&self, f: impl FnOnce(&SimPool)) -> Vec<u8> {
        let pm = SimPool::from_image(self.img.clone());
        f(&pm);
        pm.current_image()
    }
    /// Damage in inode `ino` (its record or log): fsck names it.
    fn inode_case(
        &self,
        what: &str,
        ino: u64,
        kind: ProblemKind,
        f: impl FnOnce(&SimPool),
    ) -> Case {
        Case {
            what: what.into(),
            img: self.damaged(f),
            refused: false,
            bad: vec![ino],
            fsck: Some((kind, Some(ino), false)),
            crash: true,
            creates_may_fail: false,
        }
    }
    /// Inodes past the last table block of the lane still reachable.
    fn table_victims(&self, first_lost: u64) -> Vec<u64> {
        self.inos
            .values()
            .copied()
            .filter(|&i| {
                let (lane, slot) = ino_to_lane_slot(i, self.lane_count);
                lane == self.lane && slot / INODES_PER_TABLE_BLOCK >= first_lost
            })
            .collect()
    }
    /// One past the largest inode number the pool's geometry allows.
    fn ino_limit(&self) -> u64 {
        (self.total_blocks - self.first_data_block + 1)
            * INODES_PER_TABLE_BLOCK
            * self.lane_count as u64
            + 1
    }
}

/// Run each case on its own thread, under a deadline; report every case
/// that failed.
fn run_cases(cases: Vec<Case>) {
    use std::sync::mpsc;
    use std::time::Duration;
    let base = range_base();
    let mut failed = Vec::new();
    let n = cases.len();
    for c in cases {
        let what = c.what.clone();
        let (tx, rx) = mpsc::channel();
        let h = std::thread::spawn(move || {
            run_case(base, &c);
            let _ = tx.send(());
        });
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(()) => {
                let _ = h.join();
            }
            Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what}: hung"),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let p = h.join().unwrap_err();
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                let first = msg.lines().next().unwrap_or("").to_string();
                failed.push(if first.starts_with(&what) {
                    first
                } else {
                    format!("{what}: {first}")
                });
            }
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {n} cases failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

fn run_case(base: &RangeBase, c: &Case) {
    let what = c.what.as_str();
    // fsck, then fsck -y.
    let pm = SimPool::from_image(c.img.clone());
    match c.fsck {
        None => assert!(
            fsck::check(&pm, &FsckOptions::default()).is_err(),
            "{what}: fsck used a superblock"
        ),
        Some((kind, ino, repairable)) => {
            let r = check(&pm);
            assert!(
                r.errors()
                    .any(|p| p.kind == kind && (ino.is_none() || p.ino == ino)),
                "{what}: expected a {} error (inode {ino:?}), got {:#?}",
                kind.name(),
                r.problems
            );
            assert_eq!(r.exit_code(), 4, "{what}");
            let r = repair(&pm);
            assert_eq!(
                r.exit_code(),
                if repairable { 1 } else { 4 },
                "{what}: fsck -y: {:#?}",
                r.problems
            );
            if repairable {
                assert_clean(&check(&pm));
                let fs = mount(pm);
                let got = describe_tree(&fs, &[], &format!("{what} (repaired)"), None);
                assert!(
                    got == base.tree,
                    "{what}: the repaired pool serves another tree"
                );
            }
        }
    }
    // The mount, then a crash mount.
    mount_and_serve(base, c, c.img.clone(), c.refused, "mount");
    if c.crash {
        let crashed = SimPool::from_image(c.img.clone());
        for b in [SUPER_PRIMARY_BLOCK, SUPER_BACKUP_BLOCK] {
            let mut sb: Superblock = read_pod(&crashed, b * BLOCK_SIZE);
            sb.state = STATE_MOUNTED;
            sb.seal();
            write_pod(&crashed, b * BLOCK_SIZE, &sb);
        }
        let refused = c.refused || !c.bad.is_empty();
        mount_and_serve(base, c, crashed.current_image(), refused, "crash mount");
    }
}

fn mount_and_serve(base: &RangeBase, c: &Case, img: Vec<u8>, refused: bool, how: &str) {
    let what = format!("{}: {how}", c.what);
    // errors=continue: the damaged inodes are counted and the rest is
    // served read-write (remount-ro, the default, would refuse the creates
    // below once the walk met the damage; tests/runtime_errors.rs covers it).
    let opts = MountOptions {
        errors: ErrorsPolicy::Continue,
        ..Default::default()
    };
    let r = Fs::mount(SimPool::from_image(img), opts);
    if refused {
        match r {
            Err(Error::Corrupt(m)) | Err(Error::BadPool(m)) => assert_one_line(&what, &m),
            Err(e) => panic!("{what}: refused with {e:?}, expected BadPool or Corrupt"),
            Ok(_) => panic!("{what}: the pool was mounted"),
        }
        return;
    }
    let fs = r.unwrap_or_else(|e| panic!("{what}: {e}"));
    let got = describe_tree(&fs, &c.bad, &what, None);
    let want = expected_tree(base, &c.bad);
    assert!(got == want, "{what}: served {got:#?}\nexpected {want:#?}");
    assert_eq!(
        fs.error_stats().count > 0,
        !c.bad.is_empty(),
        "{what}: damage met while mounted is counted"
    );
    // The rest of the pool still takes writes.
    match fs.create(ROOT_INO, b"new-file", 0o644, 0, 0) {
        Ok((_, fh)) => {
            fs.write(&fh, 0, b"new").unwrap();
            fs.release(fh);
            fs.mkdir(ROOT_INO, b"new-dir", 0o755, 0, 0).unwrap();
        }
        Err(Error::Corrupt(m)) if c.creates_may_fail => assert_one_line(&what, &m),
        Err(e) => panic!("{what}: create: {e}"),
    }
    fs.unmount()
        .unwrap_or_else(|e| panic!("{what}: unmount: {e}"));
}

// Builders of damaged structures, every checksum valid.

/// Rewrite one superblock copy with `f` applied, resealed.
fn sb_mut(pm: &SimPool, block: u64, f: fn(&mut Superblock)) {
    let mut sb: Superblock = read_pod(pm, block * BLOCK_SIZE);
    f(&mut sb);
    sb.seal();
    write_pod(pm, block * BLOCK_SIZE, &sb);
}

/// Commit `records` in lane 0's journal (valid commit word), unapplied.
fn journal_commit(pm: &SimPool, records: &[JournalRecord]) {
    let off = (lane_first_block(0) + LANE_JOURNAL_BLOCK) * BLOCK_SIZE;
    for (i, r) in records.iter().enumerate() {
        write_pod(pm, off + 64 + i as u64 * 16, r);
    }
    let seq = 77;
    pm.write_u64(off, seq);
    pm.write_u64(
        off + 8,
        journal_commit_word(records.len() as u32, journal_crc(seq, records)),
    );
}

/// Rewrite lane `lane`'s save area: `f` gets the header and the block and
/// inode-slot ranges; the counts and the checksum are recomputed.
fn save_mut(
    pm: &SimPool,
    lane: u32,
    f: impl FnOnce(&mut SaveHeader, &mut Vec<SavedRange>, &mut Vec<SavedRange>),
) {
    save_mut_all(pm, lane, |h, blocks, slots, _| f(h, blocks, slots));
}

/// `save_mut` with the lane's chunk block records too (version 6).
pub(crate) fn save_mut_all(
    pm: &SimPool,
    lane: u32,
    f: impl FnOnce(&mut SaveHeader, &mut Vec<SavedRange>, &mut Vec<SavedRange>, &mut Vec<SavedRange>),
) {
    let off = (lane_first_block(lane) + LANE_SAVE_FIRST_BLOCK) * BLOCK_SIZE;
    let mut h: SaveHeader = read_pod(pm, off);
    assert_eq!(h.magic, SAVE_MAGIC, "lane {lane} has no saved free lists");
    let n = (h.block_ranges + h.inode_ranges + h.chunk_blocks) as usize;
    let mut bytes = vec![0u8; n * 16];
    pm.read(off + 64, &mut bytes);
    let all: Vec<SavedRange> = bytes.chunks(16).map(SavedRange::from_bytes).collect();
    let (b, rest) = all.split_at(h.block_ranges as usize);
    let (i, c) = rest.split_at(h.inode_ranges as usize);
    let (mut blocks, mut slots, mut chunks) = (b.to_vec(), i.to_vec(), c.to_vec());
    let (nb, ni) = (h.block_ranges, h.inode_ranges);
    f(&mut h, &mut blocks, &mut slots, &mut chunks);
    // A test may set the counts itself (too many ranges); else they follow the lists.
    if h.block_ranges == nb && h.inode_ranges == ni {
        h.block_ranges = blocks.len() as u32;
        h.inode_ranges = slots.len() as u32;
    }
    h.chunk_blocks = chunks.len() as u32;
    let ranges: Vec<u8> = blocks
        .iter()
        .chain(&slots)
        .chain(&chunks)
        .flat_map(|r| r.as_bytes().to_vec())
        .collect();
    pm.write(off + 64, &ranges);
    h.checksum = 0;
    h.checksum = crc32c_of(&h, &ranges);
    write_pod(pm, off, &h);
}

pub(crate) fn rec_mut(pm: &SimPool, ino: u64, f: impl FnOnce(&mut InodeRecord)) {
    let off = rec_off(pm, ino);
    let mut r: InodeRecord = read_pod(pm, off);
    f(&mut r);
    write_pod(pm, off, &r);
}

/// A sealed entry of type `kind`: `head` then `tail`, padded (or cut) to
/// `units` lines (by default, the length the engine would give it).
fn raw_entry(kind: u8, head: &[u8], tail: &[u8], units: Option<u8>) -> Vec<u8> {
    let mut b = [head, tail].concat();
    let len = units.map_or(entry_bytes(head.len(), tail.len()), |u| {
        u as u64 * ENTRY_UNIT
    });
    b.resize(len as usize, 0);
    b[0] = kind;
    b[1] = (len / ENTRY_UNIT) as u8;
    seal_entry(&mut b);
    b
}

fn dir_entry(kind: u8, ino: u64, seq: u64, child_kind: u8, name_len: u16, name: &[u8]) -> Vec<u8> {
    let h = DirEntryHead {
        hdr: EntryHeader::zeroed(),
        ino,
        seq,
        mtime_ns: 1,
        name_len,
        child_kind,
        reserved: [0; 5],
    };
    raw_entry(kind, h.as_bytes(), name, None)
}

fn xattr_entry(kind: u8, name_len: u16, value_len: u16, name: &[u8], value: &[u8]) -> Vec<u8> {
    let h = XattrHead {
        hdr: EntryHeader::zeroed(),
        name_len,
        value_len,
        reserved: 0,
        ctime_ns: 1,
    };
    raw_entry(kind, h.as_bytes(), &[name, value].concat(), None)
}

fn write_entry(file_page: u64, block: u64, pages: u32, size: u64) -> Vec<u8> {
    let w = WriteEntry {
        hdr: EntryHeader::zeroed(),
        file_page,
        block,
        pages,
        reserved0: 0,
        size,
        mtime_ns: 1,
        reserved: [0; 16],
    };
    raw_entry(entry_type::FILE_WRITE, w.as_bytes(), &[], None)
}

fn symlink_entry(block: u64, len: u32) -> Vec<u8> {
    let s = SymlinkEntry {
        hdr: EntryHeader::zeroed(),
        block,
        len,
        reserved: [0; 44],
    };
    raw_entry(entry_type::SYMLINK, s.as_bytes(), &[], None)
}

/// The last attribute snapshot in `ino`'s log.
fn last_attr(pm: &SimPool, ino: u64) -> AttrEntry {
    log_entries(pm, ino)
        .into_iter()
        .rev()
        .find(|(_, e)| matches!(e[0], entry_type::SET_ATTR | entry_type::LINK_CHANGE))
        .map(|(_, e)| AttrEntry::from_bytes(&e))
        .expect("a log holds an attribute snapshot")
}

/// `ino`'s last snapshot with `f` applied, as a sealed entry.
fn attr_entry_with(
    pm: &SimPool,
    ino: u64,
    link_change: bool,
    f: impl FnOnce(&mut AttrEntry),
) -> Vec<u8> {
    let mut a = last_attr(pm, ino);
    f(&mut a);
    EntryBuf::attr(link_change, a).as_bytes().to_vec()
}

impl RangeBase {
    /// An entry appended to `ino`'s log (committed by its tail).
    fn appended(&self, what: &str, ino: u64, entry: impl FnOnce(&SimPool) -> Vec<u8>) -> Case {
        self.inode_case(what, ino, ProblemKind::Log, |pm| {
            let e = entry(pm);
            append_entry(pm, ino, &e);
        })
    }
    /// An attribute snapshot of `ino` with `f` applied, appended.
    fn attr_case(&self, what: &str, ino: u64, f: fn(&mut AttrEntry)) -> Case {
        self.appended(what, ino, |pm| attr_entry_with(pm, ino, false, f))
    }
}

#[test]
fn out_of_range_superblock_fields() {
    let b = range_base();
    type SbMut = fn(&mut Superblock);
    let fields: [(&str, SbMut); 13] = [
        ("state 0", |s| s.state = 0),
        ("state 3", |s| s.state = 3),
        ("mount_epoch at u64::MAX", |s| s.mount_epoch = u64::MAX),
        ("version 0", |s| s.version = 0),
        ("version newer", |s| s.version = FORMAT_VERSION + 1),
        ("block_size 8192", |s| s.block_size = 8192),
        ("lane_count 0", |s| s.lane_count = 0),
        ("lane_count 1 (geometry)", |s| s.lane_count = 1),
        ("lane_count above LANES_MAX", |s| {
            s.lane_count = LANES_MAX + 1
        }),
        ("first_data_block + 1", |s| s.first_data_block += 1),
        ("total_blocks + 1", |s| s.total_blocks += 1),
        ("size_bytes + 4096", |s| s.size_bytes += 4096),
        ("size_bytes not a block multiple", |s| s.size_bytes += 1),
    ];
    let mut cases = Vec::new();
    for (name, f) in fields {
        // The primary only: the mount uses the backup, -y rewrites the primary.
        cases.push(Case {
            what: format!("superblock {name} (primary)"),
            img: b.damaged(|pm| sb_mut(pm, SUPER_PRIMARY_BLOCK, f)),
            refused: false,
            bad: vec![],
            fsck: Some((ProblemKind::Superblock, None, true)),
            crash: false,
            creates_may_fail: false,
        });
        cases.push(Case {
            what: format!("superblock {name} (both copies)"),
            img: b.damaged(|pm| {
                sb_mut(pm, SUPER_PRIMARY_BLOCK, f);
                sb_mut(pm, SUPER_BACKUP_BLOCK, f);
            }),
            refused: true,
            bad: vec![],
            fsck: None,
            crash: false,
            creates_may_fail: false,
        });
    }
    run_cases(cases);
}

#[test]
fn out_of_range_journal_records() {
    let b = range_base();
    let pm = SimPool::from_image(b.img.clone());
    let off = rec_off(&pm, b.file);
    let tail = record(&pm, b.file).log_tail;
    let page = tail / BLOCK_SIZE * BLOCK_SIZE;
    let records: [(&str, u64, u64); 9] = [
        (
            "target outside any inode record",
            b.first_data_block * BLOCK_SIZE,
            0,
        ),
        ("state 3", off + INODE_STATE_FIELD, 3),
        ("state u64::MAX", off + INODE_STATE_FIELD, u64::MAX),
        ("head in the lane area", off + INODE_HEAD_FIELD, 1),
        ("head past the pool", off + INODE_HEAD_FIELD, b.total_blocks),
        ("tail past the pool", off + INODE_TAIL_FIELD, u64::MAX),
        (
            "tail not on an entry boundary",
            off + INODE_TAIL_FIELD,
            tail + 8,
        ),
        (
            "tail in the footer",
            off + INODE_TAIL_FIELD,
            page + LOG_FOOTER_OFFSET + 8,
        ),
        ("tail in the superblock", off + INODE_TAIL_FIELD, 64),
    ];
    let cases = records
        .into_iter()
        .map(|(name, offset, value)| Case {
            what: format!("committed journal record: {name}"),
            img: b.damaged(|pm| journal_commit(pm, &[JournalRecord { offset, value }])),
            refused: true,
            bad: vec![],
            fsck: Some((ProblemKind::Journal, None, false)),
            crash: true,
            creates_may_fail: false,
        })
        .collect();
    run_cases(cases);
}

#[test]
fn out_of_range_save_area_fields() {
    let b = range_base();
    let slots_max = (b.total_blocks - b.first_data_block + 1) * INODES_PER_TABLE_BLOCK;
    type SaveMut = Box<dyn FnOnce(&mut SaveHeader, &mut Vec<SavedRange>, &mut Vec<SavedRange>)>;
    let total = b.total_blocks;
    let fields: Vec<(&str, SaveMut)> = vec![
        (
            "inode_slots_used u64::MAX",
            Box::new(|h, _, _| h.inode_slots_used = u64::MAX),
        ),
        (
            "inode_slots_used above what the tables can hold",
            Box::new(move |h, _, _| h.inode_slots_used = slots_max + 1),
        ),
        ("epoch of another mount", Box::new(|h, _, _| h.epoch += 1)),
        (
            "more ranges than fit",
            Box::new(|h, _, _| h.block_ranges = SAVE_MAX_RANGES as u32 + 1),
        ),
        ("block range at block 0", Box::new(|_, r, _| r[0].start = 0)),
        ("block range of length 0", Box::new(|_, r, _| r[0].len = 0)),
        (
            "block range past the pool",
            Box::new(move |_, r, _| {
                let last = r.len() - 1;
                r[last].len = total;
            }),
        ),
        (
            "block range overflowing",
            Box::new(|_, r, _| r[0].len = u64::MAX - r[0].start + 1),
        ),
        ("block ranges overlapping", Box::new(|_, r, _| r.push(r[0]))),
        (
            "inode range at the high water",
            Box::new(|h, _, s| {
                s.push(SavedRange {
                    start: h.inode_slots_used,
                    len: 1,
                })
            }),
        ),
        (
            "inode range of length 0",
            Box::new(|_, _, s| s.push(SavedRange { start: 0, len: 0 })),
        ),
    ];
    let cases = fields
        .into_iter()
        .map(|(name, f)| Case {
            what: format!("save area of lane {}: {name}", b.lane),
            img: b.damaged(|pm| save_mut(pm, b.lane, f)),
            refused: false,
            bad: vec![],
            fsck: Some((ProblemKind::SaveArea, None, true)),
            crash: true,
            creates_may_fail: false,
        })
        .collect();
    run_cases(cases);
}

#[test]
fn out_of_range_inode_table_and_record_fields() {
    let b = range_base();
    let pm = SimPool::from_image(b.img.clone());
    let t = table_blocks(&pm, b.lane);
    let trailer = |block: u64| block * BLOCK_SIZE + TABLE_TRAILER_OFFSET;
    let table_case = |what: &str, first_lost: u64, off: u64, value: u64| Case {
        what: format!("inode table of lane {}: {what}", b.lane),
        img: b.damaged(|pm| pm.write_u64(off, value)),
        refused: false,
        bad: b.table_victims(first_lost),
        fsck: Some((ProblemKind::InodeTable, None, false)),
        crash: true,
        creates_may_fail: true,
    };
    let mut cases = vec![
        table_case("first block links to block 1", 1, trailer(t[0]) + 8, 1),
        table_case(
            "first block links past the pool",
            1,
            trailer(t[0]) + 8,
            b.total_blocks,
        ),
        table_case(
            "first block links to u64::MAX",
            1,
            trailer(t[0]) + 8,
            u64::MAX,
        ),
        table_case(
            "second block links back to the first",
            2,
            trailer(t[1]) + 8,
            t[0],
        ),
        table_case("second block's magic", 1, trailer(t[1]), 0),
        table_case("third block's magic", 2, trailer(t[2]), TABLE_MAGIC + 1),
    ];
    let f = b.file;
    let rec = |what: &str, ino: u64, kind: ProblemKind, g: fn(&mut InodeRecord)| {
        b.inode_case(&format!("inode record: {what}"), ino, kind, |pm| {
            rec_mut(pm, ino, g)
        })
    };
    use ProblemKind::{InodeRecord as R, Log as L};
    cases.extend([
        rec("state 3", f, R, |r| r.state = 3),
        rec("state u64::MAX", f, R, |r| r.state = u64::MAX),
        rec("ino of another slot", f, R, |r| r.ino += 1),
        rec("kind 0", f, R, |r| r.kind = 0),
        rec("kind 8", f, R, |r| r.kind = 8),
        rec("kind dir for a file", f, L, |r| {
            r.kind = FileKind::Dir as u32
        }),
        rec("kind file for a char device", b.cdev, L, |r| {
            r.kind = FileKind::File as u32
        }),
        rec("log_head 0", f, L, |r| r.log_head = 0),
        rec("log_head in the lane area", f, L, |r| r.log_head = 1),
        rec("log_head u64::MAX", f, L, |r| r.log_head = u64::MAX),
        rec("log_tail not on an entry boundary", f, L, |r| {
            r.log_tail += 8
        }),
        rec("log_tail in the footer", f, L, |r| {
            r.log_tail = r.log_tail / BLOCK_SIZE * BLOCK_SIZE + LOG_FOOTER_OFFSET + 8
        }),
        rec("log_tail 0", f, L, |r| r.log_tail = 0),
        rec("log_tail at the top of u64", f, L, |r| r.log_tail = !63),
    ]);
    let other_tail = record(&pm, b.many).log_tail;
    cases.push(
        b.inode_case("inode record: log_tail in another log", f, L, |pm| {
            rec_mut(pm, f, |r| r.log_tail = other_tail)
        }),
    );
    run_cases(cases);
}

#[test]
fn out_of_range_log_page_footers() {
    let b = range_base();
    let pm = SimPool::from_image(b.img.clone());
    let pages = log_pages(&pm, b.many);
    // The head may be a chunk (version 6): its span says where its footer is.
    let footer = LogPageSpan::of(pages[0]).footer();
    let case = |what: &str, off: u64, value: u64| {
        b.inode_case(
            &format!("log page footer: {what}"),
            b.many,
            ProblemKind::Log,
            |pm| pm.write_u64(off, value),
        )
    };
    run_cases(vec![
        case("next_block in the lane area", footer, 1),
        case("next_block past the pool", footer, b.total_blocks),
        case("next_block u64::MAX", footer, u64::MAX),
        case("next_block to itself", footer, pages[0]),
        case("magic", footer + 8, 0),
        case("owner of another inode", footer + 16, b.many + 1),
    ]);
}

#[test]
fn out_of_range_entry_headers_and_attributes() {
    let b = range_base();
    let (f, d) = (b.file, b.dir);
    let attr = |pm: &SimPool, ino| last_attr(pm, ino);
    let mut cases = vec![
        b.appended("entry type 0", f, |_| raw_entry(0, &[0; 8], &[], Some(1))),
        b.appended("entry type 10", f, |_| raw_entry(10, &[0; 8], &[], Some(1))),
        b.appended("entry type 255", f, |_| {
            raw_entry(255, &[0; 8], &[], Some(1))
        }),
        b.appended("a pad below the tail", f, |_| {
            let mut e = vec![0u8; 64];
            e[0] = entry_type::PAD;
            e
        }),
        b.appended("SET_ATTR of two lines", f, |pm| {
            raw_entry(entry_type::SET_ATTR, attr(pm, f).as_bytes(), &[], Some(2))
        }),
        b.appended("FILE_WRITE of two lines", f, |_| {
            let w = WriteEntry::from_bytes(&write_entry(0, 0, 1, 5));
            raw_entry(entry_type::FILE_WRITE, w.as_bytes(), &[], Some(2))
        }),
        // The outside report: a size above MAX_FILE_BYTES, checksums valid.
        b.attr_case("SET_ATTR size 2^46 + 2^32", f, |a| a.size = SIZE_TOO_BIG),
        b.appended("LINK_CHANGE size 2^46 + 2^32", f, |pm| {
            attr_entry_with(pm, f, true, |a| a.size = SIZE_TOO_BIG)
        }),
        b.attr_case("SET_ATTR size MAX_FILE_BYTES + 1", f, |a| {
            a.size = MAX_FILE_BYTES + 1
        }),
        b.attr_case("SET_ATTR size u64::MAX", f, |a| a.size = u64::MAX),
        b.attr_case("SET_ATTR mode of a directory in a file", f, |a| {
            a.mode = libc::S_IFDIR | 0o755
        }),
        b.appended("SET_ATTR mode of a directory, superseded", f, |pm| {
            let bad = attr_entry_with(pm, f, false, |a| a.mode = libc::S_IFDIR | 0o755);
            let good = attr_entry_with(pm, f, false, |_| {});
            [bad, good].concat()
        }),
        b.attr_case("SET_ATTR mode without type bits", f, |a| a.mode = 0o644),
        b.attr_case("SET_ATTR mode with a bit above S_IFMT", f, |a| {
            a.mode |= 1 << 16
        }),
        b.attr_case("SET_ATTR nlink above LINK_MAX", f, |a| a.nlink = 65_001),
        b.attr_case("SET_ATTR nlink u32::MAX", f, |a| a.nlink = u32::MAX),
        b.attr_case("SET_ATTR size 1 in a directory", d, |a| a.size = 1),
        b.attr_case("SET_ATTR size 6 in a symlink", b.sym, |a| a.size = 6),
        b.attr_case("SET_ATTR parent 0", d, |a| a.rdev_or_parent = 0),
        b.attr_case("SET_ATTR mode of a file in a char device", b.cdev, |a| {
            a.mode = libc::S_IFREG | 0o600
        }),
    ];
    let limit = b.ino_limit();
    cases.push(
        b.appended("SET_ATTR parent past the last inode", d, move |pm| {
            attr_entry_with(pm, d, false, |a| a.rdev_or_parent = limit)
        }),
    );
    cases.push(b.appended("SET_ATTR parent u64::MAX", d, |pm| {
        attr_entry_with(pm, d, false, |a| a.rdev_or_parent = u64::MAX)
    }));
    run_cases(cases);
}

#[test]
fn out_of_range_file_write_entries() {
    let b = range_base();
    let f = b.file;
    let max_pages = MAX_FILE_BYTES / BLOCK_SIZE;
    let total = b.total_blocks;
    let w = |what: &str, ino: u64, e: Vec<u8>| {
        b.appended(&format!("FILE_WRITE {what}"), ino, move |_| e)
    };
    run_cases(vec![
        w("of zero pages", f, write_entry(0, 0, 0, 5)),
        w("size 2^46 + 2^32", f, write_entry(5, 0, 1, SIZE_TOO_BIG)),
        w(
            "size MAX_FILE_BYTES + 1",
            f,
            write_entry(5, 0, 1, MAX_FILE_BYTES + 1),
        ),
        w(
            "past the maximum file size",
            f,
            write_entry(max_pages - 1, 0, 2, 5),
        ),
        w(
            "page range overflowing",
            f,
            write_entry(u64::MAX - 1, 0, 4, 5),
        ),
        w("block in the lane area", f, write_entry(0, 5, 1, 5)),
        w("blocks past the pool", f, write_entry(0, total - 1, 2, 5)),
        w(
            "block range overflowing",
            f,
            write_entry(0, u64::MAX - 1, 4, 5),
        ),
        w("in a directory's log", b.dir, write_entry(0, 0, 1, 5)),
        w("in a symlink's log", b.sym, write_entry(0, 0, 1, 5)),
    ]);
}

#[test]
fn out_of_range_directory_entries() {
    let b = range_base();
    let (d, child) = (b.dir, b.file);
    let (add, remove) = (entry_type::DIR_ADD, entry_type::DIR_REMOVE);
    let file = FileKind::File as u8;
    let e = |what: &str, ino: u64, entry: Vec<u8>| b.appended(what, ino, move |_| entry);
    let name256 = vec![b'n'; 256];
    let mut short = dir_entry(add, child, 9, file, 200, b"x");
    short.truncate(64);
    short[1] = 1;
    seal_entry(&mut short);
    let mut long = dir_entry(add, child, 9, file, 1, b"x");
    long.resize(128, 0);
    long[1] = 2;
    seal_entry(&mut long);
    run_cases(vec![
        e("DIR_ADD ino 0", d, dir_entry(add, 0, 9, file, 1, b"x")),
        e(
            "DIR_ADD ino past the last inode",
            d,
            dir_entry(add, b.ino_limit(), 9, file, 1, b"x"),
        ),
        e(
            "DIR_ADD ino u64::MAX",
            d,
            dir_entry(add, u64::MAX, 9, file, 1, b"x"),
        ),
        e(
            "DIR_ADD seq 2^63",
            d,
            dir_entry(add, child, 1 << 63, file, 1, b"x"),
        ),
        e(
            "DIR_ADD seq u64::MAX",
            d,
            dir_entry(add, child, u64::MAX, file, 1, b"x"),
        ),
        e(
            "DIR_REMOVE seq u64::MAX",
            d,
            dir_entry(remove, child, u64::MAX, file, 5, b"inner"),
        ),
        e(
            "DIR_ADD name_len 0",
            d,
            dir_entry(add, child, 9, file, 0, b""),
        ),
        e(
            "DIR_ADD name_len 256",
            d,
            dir_entry(add, child, 9, file, 256, &name256),
        ),
        e("DIR_ADD name_len past the entry", d, short),
        e("DIR_ADD longer than its name", d, long),
        e(
            "DIR_ADD child_kind 0",
            d,
            dir_entry(add, child, 9, 0, 1, b"x"),
        ),
        e(
            "DIR_ADD child_kind 8",
            d,
            dir_entry(add, child, 9, 8, 1, b"x"),
        ),
        e(
            "DIR_REMOVE child_kind 0",
            d,
            dir_entry(remove, child, 9, 0, 5, b"inner"),
        ),
        e(
            "DIR_ADD name with '/'",
            d,
            dir_entry(add, child, 9, file, 3, b"a/b"),
        ),
        e(
            "DIR_ADD name with NUL",
            d,
            dir_entry(add, child, 9, file, 3, b"a\0b"),
        ),
        e(
            "DIR_ADD name \".\"",
            d,
            dir_entry(add, child, 9, file, 1, b"."),
        ),
        e(
            "DIR_ADD name \"..\"",
            d,
            dir_entry(add, child, 9, file, 2, b".."),
        ),
        e(
            "DIR_REMOVE name \"..\"",
            d,
            dir_entry(remove, child, 9, file, 2, b".."),
        ),
        e(
            "DIR_ADD in a file's log",
            child,
            dir_entry(add, d, 9, file, 1, b"x"),
        ),
    ]);
}

#[test]
fn out_of_range_symlink_and_xattr_entries() {
    let b = range_base();
    let (s, f) = (b.sym, b.file);
    let e = |what: &str, ino: u64, entry: Vec<u8>| b.appended(what, ino, move |_| entry);
    let (set, remove) = (entry_type::XATTR_SET, entry_type::XATTR_REMOVE);
    let mut cases = vec![
        e("SYMLINK block 0", s, symlink_entry(0, 3)),
        e(
            "SYMLINK block in the lane area",
            s,
            symlink_entry(b.first_data_block - 1, 3),
        ),
        e(
            "SYMLINK block past the pool",
            s,
            symlink_entry(b.total_blocks, 3),
        ),
        e("SYMLINK block u64::MAX", s, symlink_entry(u64::MAX, 3)),
        e("SYMLINK len 0", s, symlink_entry(b.first_data_block, 0)),
        e(
            "SYMLINK len 4096",
            s,
            symlink_entry(b.first_data_block, 4096),
        ),
        e(
            "SYMLINK len u32::MAX",
            s,
            symlink_entry(b.first_data_block, u32::MAX),
        ),
        e(
            "SYMLINK in a file's log",
            f,
            symlink_entry(b.first_data_block, 3),
        ),
        e("XATTR_SET name_len 0", f, xattr_entry(set, 0, 1, b"", b"v")),
        e(
            "XATTR_SET name_len 256",
            f,
            xattr_entry(set, 256, 1, &[b'u'; 256], b"v"),
        ),
        e("XATTR_SET lengths past the entry", f, {
            let mut x = xattr_entry(set, 6, 1, b"user.k", b"v");
            x[10] = 200; // value_len
            seal_entry(&mut x);
            x
        }),
        e("XATTR_SET longer than name and value", f, {
            let mut x = xattr_entry(set, 6, 1, b"user.k", b"v");
            x.resize(128, 0);
            x[1] = 2;
            seal_entry(&mut x);
            x
        }),
        e(
            "XATTR_SET name without a namespace",
            f,
            xattr_entry(set, 7, 1, b"foo.bar", b"v"),
        ),
        e(
            "XATTR_SET name \"user.\"",
            f,
            xattr_entry(set, 5, 1, b"user.", b"v"),
        ),
        e(
            "XATTR_SET name in system.*",
            f,
            xattr_entry(set, 8, 1, b"system.a", b"v"),
        ),
        e(
            "XATTR_SET name with NUL",
            f,
            xattr_entry(set, 8, 1, b"user.a\0b", b"v"),
        ),
        e(
            "XATTR_REMOVE with a value",
            f,
            xattr_entry(remove, 6, 5, b"user.k", b"12345"),
        ),
        e(
            "XATTR_REMOVE name_len 0",
            f,
            xattr_entry(remove, 0, 0, b"", b""),
        ),
    ];
    // A value one byte above XATTR_VALUE_MAX, inside the entry's length:
    // the large xattr, rewritten in place.
    cases.push(b.inode_case(
        "XATTR_SET value_len above XATTR_VALUE_MAX",
        f,
        ProblemKind::Log,
        |pm| {
            let (off, mut x) = log_entries(pm, f)
                .into_iter()
                .find(|(_, e)| e[0] == set && XattrHead::from_bytes(e).value_len > 1000)
                .unwrap();
            let mut h = XattrHead::from_bytes(&x);
            h.value_len += 1;
            x[..24].copy_from_slice(h.as_bytes());
            seal_entry(&mut x);
            pm.write(off, &x);
        },
    ));
    run_cases(cases);
}

/// The journal's sequence number is only a salt of the commit crc: any
/// value is valid, and the next commit wraps it rather than overflowing.
#[test]
fn journal_sequence_at_its_limit_wraps() {
    let b = range_base();
    let img = b.damaged(|pm| {
        for lane in 0..b.lane_count {
            pm.write_u64(
                (lane_first_block(lane) + LANE_JOURNAL_BLOCK) * BLOCK_SIZE,
                u64::MAX,
            );
        }
    });
    let pm = SimPool::from_image(img);
    assert_clean(&check(&pm));
    let fs = mount(pm);
    fs.mkdir(ROOT_INO, b"after", 0o755, 0, 0).unwrap();
    let pm = fs.unmount().unwrap();
    assert_clean(&check(&pm));
}

/// The outside report, on its own: a file size of 2^46 + 2^32 with valid
/// checksums was checked clean and served.
#[test]
fn file_size_above_the_maximum_is_refused() {
    let b = range_base();
    let img = b.damaged(|pm| {
        let e = attr_entry_with(pm, b.file, false, |a| a.size = SIZE_TOO_BIG);
        append_entry(pm, b.file, &e);
    });
    let pm = SimPool::from_image(img.clone());
    let r = check(&pm);
    assert!(
        r.errors().any(|p| p.kind == ProblemKind::Log
            && p.ino == Some(b.file)
            && p.message.contains("size")),
        "{:#?}",
        r.problems
    );
    assert_eq!(r.exit_code(), 4);
    let fs = mount(SimPool::from_image(img));
    match fs.getattr(b.file) {
        Err(Error::Corrupt(m)) => assert!(m.contains(&b.file.to_string()), "{m}"),
        other => panic!("served {other:?}"),
    }
}

/// Two entries at one readdir position (or one out of range) would list a
/// name twice or not at all in one pass: the replay places the offender at
/// the next free position (every name stays listed), fsck reports it and
/// the repair rewrites the entry there, keeping the others' cookies.
#[test]
fn duplicate_and_out_of_range_readdir_positions_are_fixed() {
    let fs = fresh();
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, 0, 0).unwrap().ino;
    let mut inos = Vec::new();
    for n in [&b"a"[..], b"b", b"c"] {
        let (a, fh) = fs.create(d, n, 0o644, 0, 0).unwrap();
        fs.release(fh);
        inos.push(a.ino);
    }
    let listing = |fs: &Fs<SimPool>| {
        let mut v = Vec::new();
        fs.readdir(d, 2, &mut |e| {
            v.push((e.name, e.cookie));
            true
        })
        .unwrap();
        v.sort();
        v
    };
    let before = listing(&fs);
    let pm = fs.unmount().unwrap();
    // "b" re-added at "a"'s position, "c" at one whose cookie would not fit
    // an i64 (inside the field's range, DIR_SEQ_LIMIT: past it the entry
    // itself is refused as damage, tests above).
    let a_pos = before[0].1 - 3;
    append_entry(
        &pm,
        d,
        EntryBuf::dir(true, inos[1], a_pos, 1, FileKind::File, b"b").as_bytes(),
    );
    append_entry(
        &pm,
        d,
        EntryBuf::dir(true, inos[2], i64::MAX as u64 - 2, 1, FileKind::File, b"c").as_bytes(),
    );
    let r = check(&pm);
    let shown: Vec<_> = r
        .errors()
        .filter(|p| p.kind == ProblemKind::DirPosition)
        .collect();
    assert_eq!(shown.len(), 2, "{:#?}", r.problems);
    assert!(shown.iter().all(|p| p.ino == Some(d) && p.repairable));
    assert_eq!(r.exit_code(), 4);
    // Mounted as it is, every name is listed once, at distinct cookies.
    let fs = mount(pm);
    let damaged = listing(&fs);
    let names: Vec<&[u8]> = damaged.iter().map(|(n, _)| &n[..]).collect();
    assert_eq!(names, [&b"a"[..], b"b", b"c"]);
    assert_eq!(damaged[0], before[0]);
    assert!(damaged.iter().all(|(_, c)| *c <= i64::MAX as u64));
    let pm = fs.unmount().unwrap();
    let r = repair(&pm);
    assert_eq!(r.exit_code(), 1, "{:#?}", r.problems);
    assert_clean(&check(&pm));
    // The repair kept the cookies readdir was already returning.
    let fs = mount(pm);
    assert_eq!(listing(&fs), damaged);
}
