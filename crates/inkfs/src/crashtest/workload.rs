//! The workloads: a small fixed namespace and a catalogue of operations
//! over it, in the style of ACE (CrashMonkey's workload generator). Every
//! operation names its targets by path, so an operation that follows
//! another may act on what that one created, moved or removed (or fail,
//! which is a valid workload too: the state must then stay unchanged).

use crate::error::{Error, Result};
use crate::fs::Fs;
use crate::pmem::{Pmem, SimPool};
use crate::types::*;

use super::snapshot::pattern;

/// Pool size of every workload (small: crash images are copied per state).
pub const POOL_BYTES: u64 = 512 << 10;

/// Sizes of the files of the fixed namespace.
pub const FOO_LEN: usize = 5000;
pub const BAR_LEN: usize = 2 * 4096 + 100;
pub const AL_LEN: usize = 2 * 4096;

/// Where a write goes.
#[derive(Clone, Copy, Debug)]
pub enum At {
    Off(u64),
    /// O_APPEND: at the end of file.
    End,
}

/// One operation of the catalogue. Paths are absolute ("/A/foo").
#[derive(Clone, Copy, Debug)]
pub enum OpKind {
    Create(&'static str),
    Mkdir(&'static str),
    Symlink(&'static str, &'static str),
    Write {
        path: &'static str,
        at: At,
        len: usize,
        salt: u8,
    },
    Truncate(&'static str, u64),
    /// copy_file_range of `len` bytes (fewer at the source's end).
    Copy {
        from: &'static str,
        from_off: u64,
        to: &'static str,
        to_off: u64,
        len: u64,
    },
    Fallocate {
        path: &'static str,
        off: u64,
        len: u64,
        flags: FallocFlags,
    },
    Link(&'static str, &'static str),
    Unlink(&'static str),
    Rmdir(&'static str),
    /// renameat2; a whiteout is owned by uid/gid 1000.
    Rename {
        from: &'static str,
        to: &'static str,
        flags: RenameFlags,
    },
    SetXattr {
        path: &'static str,
        name: &'static str,
        len: usize,
        salt: u8,
    },
    RemoveXattr(&'static str, &'static str),
    Chmod(&'static str, u32),
    /// chattr by a privileged caller: the inode's flags become these.
    SetFlags(&'static str, u32),
    Fsync {
        path: &'static str,
        datasync: bool,
    },
    /// What the FUSE server does for one write-back of the kernel's page
    /// cache (posix mode with the writeback cache): whole pages written
    /// where the kernel placed them, set-id bits kept, then fdatasync,
    /// all before the request is answered.
    WriteBack {
        path: &'static str,
        off: u64,
        len: usize,
        salt: u8,
    },
    /// setattr with the times the kernel's writeback cache stamped: an
    /// explicit mtime and the kernel's own ctime.
    KernelTimes(&'static str),
}

/// What a mode promises about an operation (docs/MODES.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpClass {
    /// Namespace, attribute and xattr changes: atomic and durable on return
    /// in every mode.
    Meta,
    /// write/append: durable on return in strict and sync mode, at fsync in
    /// posix mode; overwrites in place are not atomic in sync/posix mode.
    Data,
    /// truncate/fallocate: atomic and durable on return in every mode.
    DurableData,
    /// fsync/fdatasync of a file: makes its data durable (posix mode).
    Sync,
    /// A write made durable before it returns (a write-back under the
    /// FUSE writeback cache: write, then fdatasync): in flight, as `Data`;
    /// completed, as `Sync` of what it wrote.
    DataSync,
}

#[derive(Clone, Copy, Debug)]
pub struct Op {
    pub name: &'static str,
    pub kind: OpKind,
}

impl Op {
    pub fn class(&self) -> OpClass {
        match self.kind {
            OpKind::Write { .. } | OpKind::Copy { .. } => OpClass::Data,
            OpKind::Truncate(..) | OpKind::Fallocate { .. } => OpClass::DurableData,
            OpKind::Fsync { .. } => OpClass::Sync,
            OpKind::WriteBack { .. } => OpClass::DataSync,
            _ => OpClass::Meta,
        }
    }

    /// Whether the operation goes through a handle held on /A/foo or /bar
    /// in a `held` workload.
    pub fn uses_held_handle(&self) -> bool {
        self.data_path()
            .is_some_and(|p| matches!(p, "/A/foo" | "/B/hl" | "/bar"))
    }

    /// Whether the operation may remove a name (and so a last link).
    pub fn removes_name(&self) -> bool {
        matches!(self.kind, OpKind::Unlink(_) | OpKind::Rename { .. })
    }

    /// The file whose data the operation changes or syncs, if any.
    fn data_path(&self) -> Option<&'static str> {
        match self.kind {
            OpKind::Write { path, .. }
            | OpKind::Copy { to: path, .. }
            | OpKind::Truncate(path, _)
            | OpKind::Fallocate { path, .. }
            | OpKind::Fsync { path, .. }
            | OpKind::WriteBack { path, .. } => Some(path),
            _ => None,
        }
    }
}

const fn op(name: &'static str, kind: OpKind) -> Op {
    Op { name, kind }
}

const fn write(name: &'static str, path: &'static str, at: At, len: usize, salt: u8) -> Op {
    op(
        name,
        OpKind::Write {
            path,
            at,
            len,
            salt,
        },
    )
}

const fn copy(
    name: &'static str,
    from: &'static str,
    from_off: u64,
    to: &'static str,
    to_off: u64,
    len: u64,
) -> Op {
    op(
        name,
        OpKind::Copy {
            from,
            from_off,
            to,
            to_off,
            len,
        },
    )
}

const fn falloc(
    name: &'static str,
    path: &'static str,
    off: u64,
    len: u64,
    flags: (bool, bool, bool),
) -> Op {
    op(
        name,
        OpKind::Fallocate {
            path,
            off,
            len,
            flags: FallocFlags {
                keep_size: flags.0,
                punch_hole: flags.1,
                zero_range: flags.2,
                collapse_range: false,
                insert_range: false,
            },
        },
    )
}

/// fallocate COLLAPSE_RANGE (`collapse`) or INSERT_RANGE.
const fn shift(name: &'static str, path: &'static str, off: u64, len: u64, collapse: bool) -> Op {
    op(
        name,
        OpKind::Fallocate {
            path,
            off,
            len,
            flags: FallocFlags {
                keep_size: false,
                punch_hole: false,
                zero_range: false,
                collapse_range: collapse,
                insert_range: !collapse,
            },
        },
    )
}

const fn rename(
    name: &'static str,
    from: &'static str,
    to: &'static str,
    flags: RenameFlags,
) -> Op {
    op(name, OpKind::Rename { from, to, flags })
}

const fn rename_flags(noreplace: bool, exchange: bool, whiteout: bool) -> RenameFlags {
    RenameFlags {
        noreplace,
        exchange,
        whiteout,
    }
}

const PLAIN: RenameFlags = rename_flags(false, false, false);
const NOREPLACE: RenameFlags = rename_flags(true, false, false);
const EXCHANGE: RenameFlags = rename_flags(false, true, false);
const WHITEOUT: RenameFlags = rename_flags(false, false, true);

/// The fixed namespace every workload starts from (see [`setup`]):
///
/// ```text
/// /A            dir
/// /A/foo        file, 5000 bytes, xattr user.x = "one"
/// /A/sub        empty dir
/// /B            dir
/// /B/hl         hard link to /A/foo
/// /B/al         file, 8192 bytes (page-aligned size: appends to it
///               displace no block)
/// /bar          file, 8292 bytes (two pages and a bit)
/// /sym          symlink -> A/foo
/// ```
///
/// New names the operations use: /A/new (file), /B/d (dir), /A/sl
/// (symlink), /B/foo2, /A/bar2, /B/new2 (links), /A/foo2, /A/bar, /B/bar,
/// /B/sub (rename targets).
pub const NAMESPACE: &str = "/A/{foo,sub/} /B/{hl=A/foo,al} /bar /sym->A/foo";

/// The operation catalogue. Names are stable: they form workload names
/// (`op` or `op1+op2`) that reproduce a run.
pub const OPS: &[Op] = &[
    // Creating names.
    op("create_A_new", OpKind::Create("/A/new")),
    op("create_bar_exists", OpKind::Create("/bar")),
    op("mkdir_B_d", OpKind::Mkdir("/B/d")),
    op("mkdir_A_sub_exists", OpKind::Mkdir("/A/sub")),
    op("symlink_A_sl", OpKind::Symlink("/A/sl", "../bar")),
    // Writes: appends, overwrites aligned and not, extending, into a hole.
    write("append_foo", "/A/foo", At::End, 3000, 11),
    write("append_hl_4k", "/B/hl", At::End, 4096, 12),
    write("write_foo_unaligned", "/A/foo", At::Off(1000), 2000, 13),
    write("write_bar_aligned", "/bar", At::Off(4096), 4096, 14),
    write("write_bar_extend", "/bar", At::Off(8000), 5000, 15),
    write("write_foo_hole", "/A/foo", At::Off(20_000), 100, 16),
    write("write_new", "/A/new", At::Off(0), 5000, 17),
    write("append_new_4k", "/A/new", At::End, 4096, 18),
    write("append_al_8k", "/B/al", At::End, 8192, 19),
    // Over the end of file, inside the size a preceding write_foo_hole
    // set (posix: not yet durable).
    write("write_foo_mid", "/A/foo", At::Off(1000), 6000, 20),
    // copy_file_range: over and past the end, past the end with a hole,
    // within one file.
    copy("copy_bar_foo", "/bar", 0, "/A/foo", 1000, 6000),
    copy("copy_foo_bar_hole", "/A/foo", 100, "/bar", 30_000, 3000),
    copy("copy_foo_within", "/A/foo", 0, "/A/foo", 4000, 1000),
    // Truncate and fallocate.
    op("truncate_foo_1000", OpKind::Truncate("/A/foo", 1000)),
    op("truncate_bar_4096", OpKind::Truncate("/bar", 4096)),
    op("truncate_foo_0", OpKind::Truncate("/A/foo", 0)),
    op("truncate_bar_grow", OpKind::Truncate("/bar", 20_000)),
    falloc(
        "falloc_foo_extend",
        "/A/foo",
        8000,
        8000,
        (false, false, false),
    ),
    falloc(
        "falloc_bar_keep_size",
        "/bar",
        0,
        16_384,
        (true, false, false),
    ),
    falloc("punch_bar", "/bar", 1000, 5000, (true, true, false)),
    falloc("zero_range_foo", "/A/foo", 100, 4400, (false, false, true)),
    // Collapse and insert range: every later page moves (one commit of
    // several FILE_WRITE entries); collapse frees the removed blocks.
    shift("collapse_bar_mid", "/bar", 4096, 4096, true),
    shift("insert_foo_start", "/A/foo", 0, 4096, false),
    // Links.
    op("link_foo_B_foo2", OpKind::Link("/A/foo", "/B/foo2")),
    op("link_bar_A_bar2", OpKind::Link("/bar", "/A/bar2")),
    op("link_new_B_new2", OpKind::Link("/A/new", "/B/new2")),
    op("link_foo_bar_exists", OpKind::Link("/A/foo", "/bar")),
    op("link_dir_A", OpKind::Link("/A", "/B/A2")),
    // Unlinks.
    op("unlink_hl", OpKind::Unlink("/B/hl")),
    op("unlink_bar", OpKind::Unlink("/bar")),
    op("unlink_foo", OpKind::Unlink("/A/foo")),
    op("unlink_sym", OpKind::Unlink("/sym")),
    op("unlink_new", OpKind::Unlink("/A/new")),
    op("unlink_dir_A", OpKind::Unlink("/A")),
    // Renames: move, same directory, over a file, over the same inode,
    // directories, over an empty and a non-empty directory, noreplace,
    // exchange.
    rename("rename_bar_A_bar", "/bar", "/A/bar", PLAIN),
    rename("rename_foo_foo2", "/A/foo", "/A/foo2", PLAIN),
    rename("rename_bar_over_foo", "/bar", "/A/foo", PLAIN),
    rename("rename_hl_over_foo", "/B/hl", "/A/foo", PLAIN),
    rename("rename_new_over_bar", "/A/new", "/bar", PLAIN),
    rename("rename_sub_B_sub", "/A/sub", "/B/sub", PLAIN),
    rename("rename_B_over_sub", "/B", "/A/sub", PLAIN),
    rename("rename_d_over_sub", "/B/d", "/A/sub", PLAIN),
    rename("rename_sub_over_B", "/A/sub", "/B", PLAIN),
    rename("rename_noreplace_bar_foo", "/bar", "/A/foo", NOREPLACE),
    rename("rename_noreplace_bar_B_bar", "/bar", "/B/bar", NOREPLACE),
    rename("exchange_bar_foo", "/bar", "/A/foo", EXCHANGE),
    rename("exchange_A_B", "/A", "/B", EXCHANGE),
    rename("exchange_sym_sub", "/sym", "/A/sub", EXCHANGE),
    // RENAME_WHITEOUT (overlayfs): the old name becomes a whiteout in the
    // same transaction; to a new name, over a file (its last link goes),
    // a directory across directories.
    rename("whiteout_bar_A_bar", "/bar", "/A/bar", WHITEOUT),
    rename("whiteout_foo_over_al", "/A/foo", "/B/al", WHITEOUT),
    rename("whiteout_sub_B_sub", "/A/sub", "/B/sub", WHITEOUT),
    // Removing directories.
    op("rmdir_sub", OpKind::Rmdir("/A/sub")),
    op("rmdir_A_notempty", OpKind::Rmdir("/A")),
    op("rmdir_d", OpKind::Rmdir("/B/d")),
    // Attributes.
    op(
        "setxattr_foo_replace",
        OpKind::SetXattr {
            path: "/A/foo",
            name: "user.x",
            len: 3,
            salt: 21,
        },
    ),
    // 900 bytes: an entry larger than what is left of /bar's log head (a
    // 1 KiB chunk), so the log grows into its first whole page.
    op(
        "setxattr_bar_new",
        OpKind::SetXattr {
            path: "/bar",
            name: "user.n",
            len: 900,
            salt: 22,
        },
    ),
    op(
        "setxattr_dir_A",
        OpKind::SetXattr {
            path: "/A",
            name: "user.d",
            len: 8,
            salt: 23,
        },
    ),
    op("removexattr_foo", OpKind::RemoveXattr("/A/foo", "user.x")),
    op("chmod_bar", OpKind::Chmod("/bar", 0o600)),
    // chattr: immutable file (also /B/hl), append-only file, immutable
    // directory, and clearing (after one of these, in a pair).
    op(
        "chattr_foo_i",
        OpKind::SetFlags("/A/foo", inode_flags::IMMUTABLE),
    ),
    op(
        "chattr_bar_a",
        OpKind::SetFlags("/bar", inode_flags::APPEND),
    ),
    op("chattr_A_i", OpKind::SetFlags("/A", inode_flags::IMMUTABLE)),
    op("chattr_foo_clear", OpKind::SetFlags("/A/foo", 0)),
    // Syncs.
    op(
        "fsync_foo",
        OpKind::Fsync {
            path: "/A/foo",
            datasync: false,
        },
    ),
    op(
        "fdatasync_bar",
        OpKind::Fsync {
            path: "/bar",
            datasync: true,
        },
    ),
    op(
        "fsync_new",
        OpKind::Fsync {
            path: "/A/new",
            datasync: false,
        },
    ),
    // The FUSE server under the kernel's writeback cache (posix mode):
    // a write-back of whole pages over the end of file (the kernel sends
    // the tail page whole, its size its own), durable when answered; the
    // times the kernel stamped, written back.
    op(
        "writeback_bar_pages",
        OpKind::WriteBack {
            path: "/bar",
            off: 4096,
            len: 3 * 4096,
            salt: 24,
        },
    ),
    op("kernel_times_foo", OpKind::KernelTimes("/A/foo")),
];

/// A workload: one, two or three operations of [`OPS`] (indices), optionally with
/// handles held open on /A/foo and /bar from before the first operation to
/// after the last (`held`): data operations on those files then go
/// through the held handle (appends continue the handle's block
/// reservation), truncate and fallocate act on a file open elsewhere, and
/// unlinking the last name of a held file leaves an orphan that recovery
/// must free.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    pub ops: Vec<usize>,
    pub held: bool,
}

/// Prefix of the name of a workload run with held handles.
pub const HELD_PREFIX: &str = "held:";

impl Workload {
    /// `op`, `op1+op2`, with `held:` in front when handles are held.
    pub fn name(&self) -> String {
        let ops = self
            .ops
            .iter()
            .map(|&i| OPS[i].name)
            .collect::<Vec<_>>()
            .join("+");
        if self.held {
            format!("{HELD_PREFIX}{ops}")
        } else {
            ops
        }
    }

    /// The workload a name denotes.
    pub fn parse(name: &str) -> Option<Workload> {
        let (held, rest) = match name.strip_prefix(HELD_PREFIX) {
            Some(rest) => (true, rest),
            None => (false, name),
        };
        let ops = rest
            .split('+')
            .map(|n| OPS.iter().position(|o| o.name == n))
            .collect::<Option<Vec<_>>>()?;
        (!ops.is_empty() && ops.len() <= 3).then_some(Workload { ops, held })
    }
}

/// Every workload of one and of two operations, in catalogue order: the
/// single operations, the single operations with handles held, the pairs,
/// the triples write–fsync–anything (for every write of a file that has an
/// fsync in the catalogue), and the pairs with handles held where holding
/// matters: one of the two
/// goes through a held handle (a write, truncate, fallocate or sync of
/// /A/foo, /B/hl or /bar), or both remove names (a held file may become an
/// orphan).
pub fn all_workloads() -> Vec<Workload> {
    let n = OPS.len();
    let w = |ops: Vec<usize>, held: bool| Workload { ops, held };
    let mut out: Vec<Workload> = (0..n).map(|i| w(vec![i], false)).collect();
    out.extend((0..n).map(|i| w(vec![i], true)));
    for a in 0..n {
        for b in 0..n {
            out.push(w(vec![a, b], false));
        }
    }
    // Write, fsync, then anything: synced data must survive every later
    // operation's crash points (what posix mode promises).
    for (a, op) in OPS.iter().enumerate() {
        let Some(path) = op.data_path() else { continue };
        if op.class() != OpClass::Data || path == "/A/new" {
            continue;
        }
        let Some(sync) = OPS.iter().position(|s| {
            s.class() == OpClass::Sync
                && (s.data_path() == Some(path)
                    || (path == "/B/hl" && s.data_path() == Some("/A/foo")))
        }) else {
            continue;
        };
        for c in 0..n {
            out.push(w(vec![a, sync, c], false));
        }
    }
    for (a, x) in OPS.iter().enumerate() {
        for (b, y) in OPS.iter().enumerate() {
            let uses_held = x.uses_held_handle() || y.uses_held_handle();
            let removes = x.removes_name() && y.removes_name();
            if uses_held || removes {
                out.push(w(vec![a, b], true));
            }
        }
    }
    out
}

/// The mtime and ctime `kernel_times_foo` sets (as a kernel would have
/// stamped them: in the past, the ctime not before the mtime).
const KERNEL_MTIME: TimeNs = 1_700_000_000_123_456_789;
const KERNEL_CTIME: TimeNs = 1_700_000_001_000_000_001;

/// Paths a `held` workload keeps open.
pub const HELD_PATHS: [&str; 2] = ["/A/foo", "/bar"];

/// Handles held through a workload, by inode.
#[derive(Default)]
pub struct Held {
    handles: Vec<(u64, crate::fs::FileHandle)>,
}

impl Held {
    pub fn open<P: Pmem>(fs: &Fs<P>) -> Result<Held> {
        let mut handles = Vec::new();
        for p in HELD_PATHS {
            let ino = resolve(fs, p)?;
            handles.push((ino, fs.open(ino)?));
        }
        Ok(Held { handles })
    }

    pub fn release<P: Pmem>(self, fs: &Fs<P>) {
        for (_, fh) in self.handles {
            fs.release(fh);
        }
    }

    fn get(&self, ino: u64) -> Option<&crate::fs::FileHandle> {
        self.handles.iter().find(|(i, _)| *i == ino).map(|(_, h)| h)
    }
}

/// A formatted, populated and cleanly unmounted pool holding the fixed
/// namespace; every workload starts from a copy of it.
pub fn base_image() -> Vec<u8> {
    base_image_for(false)
}

/// Data device of a hybrid crash-test pool: 128 blocks (the label, one
/// save block, 126 for data).
pub const DEV_BYTES: u64 = 128 * crate::format::BLOCK_SIZE;
/// Placement threshold of a hybrid crash-test pool: the catalogue's
/// writes of a page or more go to the device, smaller ones (and every
/// partial-page zeroing of truncate and punch) stay on PM, so workloads
/// mix both sides and move data from one to the other.
pub const HYBRID_THRESHOLD: u32 = 4096;
/// Device extent unit of a hybrid crash-test pool, in blocks.
pub const HYBRID_UNIT_BLOCKS: u32 = 4;

/// The populated base image: the pool, followed in a hybrid pool
/// (`hybrid`) by its data device's bytes ([`pool_of`] splits them).
pub fn base_image_for(hybrid: bool) -> Vec<u8> {
    let dev_bytes = if hybrid { DEV_BYTES } else { 0 };
    let pm = SimPool::with_device(vec![0; POOL_BYTES as usize], &vec![0; dev_bytes as usize]);
    let opts = FormatOptions {
        lanes: 2,
        ..Default::default()
    };
    match pm.device() {
        Some(dev) => Fs::format_hybrid(
            &pm,
            &opts,
            &crate::blockdev::HybridFormat {
                device: &*dev,
                path: std::path::Path::new("/nonexistent/inkfs-crashtest-device"),
                blocks: None,
                threshold_bytes: HYBRID_THRESHOLD,
                unit_blocks: HYBRID_UNIT_BLOCKS,
            },
        ),
        None => Fs::format(&pm, &opts),
    }
    .expect("format the crash-test pool");
    let mopts = mount_options(&pm, Mode::Strict);
    let fs = Fs::mount(pm, mopts).expect("mount the fresh pool");
    setup(&fs).expect("populate the fixed namespace");
    let pm = fs.unmount().expect("unmount the populated pool");
    pm.current_image()
}

/// A simulated pool of `image` (a base or crash image: the pool's
/// `POOL_BYTES`, then its data device's bytes if it has one), all durable.
pub fn pool_of(image: Vec<u8>) -> SimPool {
    SimPool::from_combined(image, POOL_BYTES)
}

/// Mount options in `mode` for `pm`, naming its simulated data device
/// when it has one.
pub fn mount_options(pm: &SimPool, mode: Mode) -> MountOptions {
    MountOptions {
        mode,
        read_only: false,
        data: pm
            .device()
            .map(|d| DataDevice::Open(d as std::sync::Arc<dyn crate::blockdev::BlockDev>)),
        ..Default::default()
    }
}

fn setup<P: Pmem>(fs: &Fs<P>) -> Result<()> {
    let a = fs.mkdir(1, b"A", 0o755, 0, 0)?.ino;
    let b = fs.mkdir(1, b"B", 0o755, 0, 0)?.ino;
    fs.mkdir(a, b"sub", 0o755, 0, 0)?;
    let (foo_attr, fh) = fs.create(a, b"foo", 0o644, 1000, 1000)?;
    fs.write(&fh, 0, &pattern(FOO_LEN, 1))?;
    fs.release(fh);
    let (_, fh) = fs.create(1, b"bar", 0o644, 1000, 1000)?;
    fs.write(&fh, 0, &pattern(BAR_LEN, 2))?;
    fs.fsync(&fh, false)?;
    fs.release(fh);
    fs.link(foo_attr.ino, b, b"hl")?;
    let (_, fh) = fs.create(b, b"al", 0o644, 1000, 1000)?;
    fs.write(&fh, 0, &pattern(AL_LEN, 3))?;
    fs.release(fh);
    fs.symlink(1, b"sym", b"A/foo", 0, 0)?;
    fs.setxattr(foo_attr.ino, b"user.x", b"one", XattrFlags::Any)?;
    let fh = fs.open(foo_attr.ino)?;
    fs.fsync(&fh, false)?;
    fs.release(fh);
    Ok(())
}

/// The inode `path` names.
pub fn resolve<P: Pmem>(fs: &Fs<P>, path: &str) -> Result<u64> {
    let mut ino = 1;
    for c in path.split('/').filter(|c| !c.is_empty()) {
        ino = fs.lookup_ino(ino, c.as_bytes())?;
    }
    Ok(ino)
}

/// The directory holding `path`'s last component, and that component.
fn parent<'a, P: Pmem>(fs: &Fs<P>, path: &'a str) -> Result<(u64, &'a [u8])> {
    let (dir, name) = path.rsplit_once('/').expect("absolute path");
    Ok((resolve(fs, dir)?, name.as_bytes()))
}

/// The file inode `op` changes or syncs, resolved before it runs.
pub fn data_target<P: Pmem>(fs: &Fs<P>, op: &Op) -> Option<u64> {
    op.data_path().and_then(|p| resolve(fs, p).ok())
}

/// Run one operation. Handles it opens are closed before it returns, so
/// every fence it causes belongs to it; a file with a handle in `held` is
/// written, fallocated and synced through that handle.
pub fn exec<P: Pmem>(fs: &Fs<P>, op: &Op, held: &Held) -> Result<()> {
    match op.kind {
        OpKind::Create(path) => {
            let (dir, name) = parent(fs, path)?;
            let (_, fh) = fs.create(dir, name, 0o644, 1000, 1000)?;
            fs.release(fh);
        }
        OpKind::Mkdir(path) => {
            let (dir, name) = parent(fs, path)?;
            fs.mkdir(dir, name, 0o755, 0, 0)?;
        }
        OpKind::Symlink(path, target) => {
            let (dir, name) = parent(fs, path)?;
            fs.symlink(dir, name, target.as_bytes(), 0, 0)?;
        }
        OpKind::Write {
            path,
            at,
            len,
            salt,
        } => with_handle(fs, held, path, |fh| {
            let data = pattern(len, salt);
            match at {
                At::Off(off) => fs.write(fh, off, &data).map(|_| ()),
                At::End => fs.append(fh, &data).map(|_| ()),
            }
        })?,
        OpKind::Copy {
            from,
            from_off,
            to,
            to_off,
            len,
        } => with_handle(fs, held, from, |src| {
            with_handle(fs, held, to, |dst| {
                fs.copy_range(src, from_off, dst, to_off, len).map(|_| ())
            })
        })?,
        OpKind::Truncate(path, size) => {
            let ino = resolve(fs, path)?;
            fs.setattr(
                ino,
                &SetAttr {
                    size: Some(size),
                    ..Default::default()
                },
            )?;
        }
        OpKind::Fallocate {
            path,
            off,
            len,
            flags,
        } => with_handle(fs, held, path, |fh| fs.fallocate(fh, off, len, flags))?,
        OpKind::Link(from, to) => {
            let ino = resolve(fs, from)?;
            let (dir, name) = parent(fs, to)?;
            fs.link(ino, dir, name)?;
        }
        OpKind::Unlink(path) => {
            let (dir, name) = parent(fs, path)?;
            fs.unlink(dir, name)?;
        }
        OpKind::Rmdir(path) => {
            let (dir, name) = parent(fs, path)?;
            fs.rmdir(dir, name)?;
        }
        OpKind::Rename { from, to, flags } => {
            let (sd, sn) = parent(fs, from)?;
            let (dd, dn) = parent(fs, to)?;
            fs.rename_as(sd, sn, dd, dn, flags, 1000, 1000)?;
        }
        OpKind::SetXattr {
            path,
            name,
            len,
            salt,
        } => {
            let ino = resolve(fs, path)?;
            fs.setxattr(ino, name.as_bytes(), &pattern(len, salt), XattrFlags::Any)?;
        }
        OpKind::RemoveXattr(path, name) => {
            let ino = resolve(fs, path)?;
            fs.removexattr(ino, name.as_bytes())?;
        }
        OpKind::Chmod(path, mode) => {
            let ino = resolve(fs, path)?;
            fs.setattr(
                ino,
                &SetAttr {
                    mode: Some(mode),
                    ..Default::default()
                },
            )?;
        }
        OpKind::SetFlags(path, flags) => {
            let ino = resolve(fs, path)?;
            fs.set_flags(ino, flags, true)?;
        }
        OpKind::Fsync { path, datasync } => {
            with_handle(fs, held, path, |fh| fs.fsync(fh, datasync))?
        }
        OpKind::WriteBack {
            path,
            off,
            len,
            salt,
        } => with_handle(fs, held, path, |fh| {
            fs.write_dropping(fh, off, &pattern(len, salt), false)?;
            fs.fsync(fh, true)
        })?,
        OpKind::KernelTimes(path) => {
            let ino = resolve(fs, path)?;
            let set = SetAttr {
                mtime: Some(TimeSet::At(KERNEL_MTIME)),
                ..Default::default()
            };
            let kernel = crate::fs::KernelTimes {
                ctime: Some(KERNEL_CTIME),
            };
            fs.setattr_times_from(crate::perm::Actor::Engine, ino, &set, Some(kernel))?;
        }
    }
    Ok(())
}

fn with_handle<P: Pmem>(
    fs: &Fs<P>,
    held: &Held,
    path: &str,
    f: impl FnOnce(&crate::fs::FileHandle) -> Result<()>,
) -> Result<()> {
    let ino = resolve(fs, path)?;
    if let Some(fh) = held.get(ino) {
        return f(fh);
    }
    let fh = fs.open(ino)?;
    let r = f(&fh);
    fs.release(fh);
    r
}

/// A short form of an operation's result for reports.
pub fn result_name(r: &std::result::Result<(), Error>) -> String {
    match r {
        Ok(()) => "ok".into(),
        Err(Error::Errno(e)) => format!("errno {e}"),
        Err(e) => format!("{e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The whiteout, collapse, insert and write-back operations do what
    /// their names say on the fixed namespace (a failing one would only explore the
    /// error path).
    #[test]
    fn whiteout_and_shift_ops_succeed_on_the_namespace() {
        for name in [
            "whiteout_bar_A_bar",
            "whiteout_foo_over_al",
            "whiteout_sub_B_sub",
            "collapse_bar_mid",
            "insert_foo_start",
            "writeback_bar_pages",
            "kernel_times_foo",
        ] {
            let op = OPS
                .iter()
                .find(|o| o.name == name)
                .expect("in the catalogue");
            let fs = Fs::mount(SimPool::from_image(base_image()), MountOptions::default()).unwrap();
            exec(&fs, op, &Held::default()).unwrap_or_else(|e| panic!("{name}: {e:?}"));
            if let OpKind::Rename { from, .. } = op.kind {
                let w = fs.getattr(resolve(&fs, from).unwrap()).unwrap();
                assert_eq!(
                    (w.kind, w.mode, w.rdev),
                    (FileKind::CharDev, libc::S_IFCHR, 0)
                );
            }
            if let OpKind::Fallocate { path, .. } = op.kind {
                let size = fs.getattr(resolve(&fs, path).unwrap()).unwrap().size;
                let want = if name == "collapse_bar_mid" {
                    BAR_LEN as u64 - 4096
                } else {
                    FOO_LEN as u64 + 4096
                };
                assert_eq!(size, want, "{name}");
            }
            if name == "writeback_bar_pages" {
                let a = fs.getattr(resolve(&fs, "/bar").unwrap()).unwrap();
                assert_eq!(a.size, 4 * 4096, "{name}");
            }
            if name == "kernel_times_foo" {
                let a = fs.getattr(resolve(&fs, "/A/foo").unwrap()).unwrap();
                assert_eq!((a.mtime_ns, a.ctime_ns), (KERNEL_MTIME, KERNEL_CTIME));
            }
        }
    }
}
