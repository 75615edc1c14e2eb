//! `inkfs mkfs` and `inkfs stat` on a pool (a file or a DAX device).

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use inkfs::api::{self, ErrorEvent, Filesystem, FormatOptions, MountOptions};
use inkfs::pmem::{probe_pool, MappedPool, Pmem, PoolBusy, PoolFile, PoolOpenOptions};
use inkfs_fuse::stats::human_bytes;
use serde_json::json;

use crate::state::{held_json, holders_json, pool_state};

/// Parse "4G", "512M", "64k", "1T" or plain bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    inkfs_fuse::mount::parse_size(s)
}

fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// `--lanes`: 1 to LANES_MAX.
fn parse_lanes(v: &str) -> Result<u32, String> {
    let max = api::pool::LANES_MAX;
    match v.parse::<u32>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        // The parser's message names the value refused.
        _ => Err(format!(
            "--lanes takes 1 to {max} (omit it for one per CPU, at least 4)"
        )),
    }
}

/// Create an empty file system on a pool
///
/// A new pool file is created with --size; an existing one keeps its size
/// unless --size is given; a DAX device is used whole. A pool that holds
/// data (an inkfs pool or anything else) is overwritten only with --force;
/// a pool that another process has open is refused, --force or not.
#[derive(clap::Args, Debug)]
pub struct MkfsArgs {
    /// The pool: a file (on /dev/shm, hugetlbfs, ext4/xfs -o dax, or any
    /// file system) or a DAX device such as /dev/dax0.0
    pub pool: PathBuf,
    /// Size of a new (or re-made) pool file: bytes, or with a suffix k, M,
    /// G or T (binary: 4G = 4 GiB), e.g. 4G, 512M, 65536; a multiple of
    /// 4096 (of 2 MiB on hugetlbfs). Ignored for a DAX device
    #[arg(short, long, value_name = "SIZE", value_parser = parse_size)]
    pub size: Option<u64>,
    /// Log lanes, 1 to 256: how many threads can write at once without
    /// waiting for one another [default: one per CPU, at least 4]
    #[arg(long, value_name = "N", value_parser = parse_lanes, allow_negative_numbers = true)]
    pub lanes: Option<u32>,
    /// Overwrite what the pool holds (an inkfs pool or other data), and
    /// what the data device holds
    #[arg(short, long)]
    pub force: bool,
    /// Make a hybrid pool: file data of large writes on this block device
    /// or file (on another file system), everything else on the pool.
    /// A file is created with --data-size; a block device is used whole
    #[arg(long, value_name = "DEV_OR_FILE")]
    pub data: Option<PathBuf>,
    /// Size of the data file (created, or re-made at this size); for a
    /// block device, how much of it to use
    #[arg(long, value_name = "SIZE", value_parser = parse_size, requires = "data")]
    pub data_size: Option<u64>,
    /// Writes of at least SIZE bytes put their pages on the data device,
    /// smaller ones on the pool (a mount may override it)
    #[arg(long, value_name = "SIZE", value_parser = parse_size, requires = "data",
          default_value = "64k")]
    pub data_threshold: u64,
    /// An appending file grows on the data device in extents of SIZE
    #[arg(long, value_name = "SIZE", value_parser = parse_size, requires = "data",
          default_value = "1M")]
    pub data_unit: u64,
}

/// A data file this mkfs created: removed again on drop unless `keep`
/// is called, so that a mkfs failing after it leaves nothing behind (a
/// file that was there before is never removed).
struct CreatedData<'a>(Option<&'a Path>);

impl CreatedData<'_> {
    fn keep(mut self) {
        self.0 = None;
    }
}

impl Drop for CreatedData<'_> {
    fn drop(&mut self) {
        if let Some(p) = self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Open (or create) the data device of `a`, refusing one that holds data
/// unless --force. Returns it, the path to record (absolute), the blocks
/// to use (None: all of it), and the guard that removes the file if this
/// call created it and the mkfs does not complete.
fn open_data_device<'a>(
    a: &MkfsArgs,
    path: &'a Path,
) -> Result<(inkfs::api::FileDev, PathBuf, Option<u64>, CreatedData<'a>), String> {
    use inkfs::api::BlockDev;
    let meta = std::fs::metadata(path);
    let is_blockdev = matches!(&meta, Ok(m) if m.file_type().is_block_device());
    let exists = meta.is_ok();
    let show = path.display();
    if !exists && a.data_size.is_none() {
        return Err(format!(
            "data device {show} does not exist; give --data-size to create it"
        ));
    }
    if exists && !a.force {
        let dev = inkfs::api::FileDev::open(path, true).map_err(|e| format!("{show}: {e}"))?;
        if dev.size_bytes() >= 4096 {
            let mut page = inkfs::blockdev::dev::pages(1);
            dev.read_at(0, &mut page)
                .map_err(|e| format!("{show}: {e}"))?;
            if page[0].0.iter().any(|&b| b != 0) {
                return Err(format!(
                    "data device {show} holds data (its first block is not zero); use --force to overwrite it"
                ));
            }
        }
    }
    // Armed before the file can exist: FileDev::create may fail after
    // making it (a fallocate that finds the disk full).
    let created = CreatedData((!exists).then_some(path));
    let (dev, blocks) = match (is_blockdev, a.data_size) {
        (false, Some(size)) => {
            if size % 4096 != 0 {
                return Err(format!("--data-size {size} is not a multiple of 4096"));
            }
            let d = inkfs::api::FileDev::create(path, size).map_err(|e| format!("{show}: {e}"))?;
            (d, None)
        }
        (_, size) => {
            let d = inkfs::api::FileDev::open(path, false).map_err(|e| format!("{show}: {e}"))?;
            (d, size.map(|s| s / 4096))
        }
    };
    let abs = path.canonicalize().map_err(|e| format!("{show}: {e}"))?;
    Ok((dev, abs, blocks, created))
}

/// What is at the path now, for the "refuse to overwrite" decision.
enum Existing {
    Nothing,
    EmptyFile,
    File { bytes: u64 },
    DaxDevice,
}

fn existing(path: &Path) -> Result<Existing, String> {
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Existing::Nothing),
        Err(e) => Err(format!("{}: {e}", path.display())),
        Ok(m) if m.file_type().is_char_device() => Ok(Existing::DaxDevice),
        Ok(m) if m.is_file() && m.len() == 0 => Ok(Existing::EmptyFile),
        Ok(m) if m.is_file() => Ok(Existing::File { bytes: m.len() }),
        Ok(_) => Err(format!(
            "{} is neither a regular file nor a DAX device",
            path.display()
        )),
    }
}

/// Describe non-empty contents in one phrase, or None if all zero. Reads
/// through a second descriptor of `pool`, which shares its claim.
fn describe_contents(pool: &PoolFile) -> Result<Option<String>, String> {
    let path = pool.path();
    let pm = MappedPool::map(
        pool.try_clone()
            .map_err(|e| format!("{}: {e}", path.display()))?,
        &PoolOpenOptions {
            create_size_bytes: None,
            read_only: true,
        },
    )
    .map_err(|e| format!("{}: {e}", path.display()))?;
    if api::looks_like_inkfs(&pm) {
        return Ok(Some(match api::read_summary(&pm) {
            Ok(sb) => format!(
                "an inkfs pool (format v{}, {}, {} lanes, {})",
                sb.version,
                human(sb.size_bytes),
                sb.lanes,
                // The claim is ours: nobody else has it open.
                pool_state(sb.clean, None).text
            ),
            Err(e) => format!("a damaged inkfs pool ({e})"),
        }));
    }
    let mut buf = vec![0u8; 1 << 20];
    let n = (buf.len() as u64).min(pm.size_bytes()) as usize;
    pm.read(0, &mut buf[..n]);
    Ok(buf[..n]
        .iter()
        .any(|&b| b != 0)
        .then(|| "data that is not an inkfs pool (first MiB not zero)".to_string()))
}

pub fn mkfs(a: &MkfsArgs) -> Result<(), String> {
    let path = &a.pool;
    let found = existing(path)?;
    // A file this command creates is removed again if it cannot become a
    // pool (e.g. a size hugetlbfs cannot hold): no empty file left behind.
    let created = matches!(found, Existing::Nothing);
    // What to do, decided before anything is opened: whether the contents
    // need --force, and the size to give an empty (or emptied) file.
    let (guarded, create_size, empty_first) = match (found, a.size) {
        (Existing::Nothing, None) => {
            return Err(format!(
                "{} does not exist; give --size to create it",
                path.display()
            ))
        }
        (Existing::Nothing | Existing::EmptyFile, Some(s)) => (false, Some(s), false),
        (Existing::EmptyFile, None) => {
            return Err(format!("{} is empty; give --size", path.display()))
        }
        (Existing::DaxDevice, size) => {
            if size.is_some() {
                eprintln!("inkfs mkfs: note: a DAX device is used whole; --size ignored");
            }
            (true, None, false)
        }
        // Forced, with a new size: start from an empty file.
        (Existing::File { bytes }, Some(s)) if s != bytes => (true, Some(s), true),
        (Existing::File { .. }, _) => (true, None, false),
    };
    if let Some(s) = create_size {
        if s % 4096 != 0 {
            return Err(format!("size {s} is not a multiple of 4096"));
        }
    }
    // Claim the pool before reading or writing a byte of it: a pool that
    // another process has open is refused here, --force or not.
    let pool = PoolFile::open(
        path,
        &PoolOpenOptions {
            create_size_bytes: created.then_some(create_size).flatten(),
            read_only: false,
        },
    )
    .map_err(|e| match PoolBusy::of(&e) {
        Some(_) => format!("{}: {e}; not formatting it", path.display()),
        None => format!("{}: {e}", path.display()),
    })?;
    let undo = |e: String| {
        if created {
            let _ = std::fs::remove_file(path);
        }
        e
    };
    if guarded {
        refuse_unless_forced(&pool, a.force)?;
    }
    if empty_first {
        pool.file()
            .set_len(0)
            .map_err(|e| format!("{}: emptying: {e}", path.display()))?;
    }
    let pm = MappedPool::map(
        pool,
        &PoolOpenOptions {
            create_size_bytes: create_size,
            read_only: false,
        },
    )
    .map_err(|e| undo(format!("{}: {e}", path.display())))?;
    let opts = FormatOptions {
        // 0: the engine's default.
        lanes: a.lanes.unwrap_or(0),
        ..Default::default()
    };
    let sb = match &a.data {
        None => Filesystem::format(&pm, &opts).map_err(|e| undo(e.to_string()))?,
        Some(data) => {
            let unit = a.data_unit / 4096;
            if !a.data_unit.is_multiple_of(4096) || unit == 0 || unit > u32::MAX as u64 {
                return Err(undo(format!(
                    "--data-unit {} is not a positive multiple of 4096",
                    a.data_unit
                )));
            }
            let threshold = u32::try_from(a.data_threshold).map_err(|_| {
                undo(format!(
                    "--data-threshold {} is too large",
                    a.data_threshold
                ))
            })?;
            let (dev, abs, blocks, created_data) = open_data_device(a, data).map_err(undo)?;
            let sb = Filesystem::format_hybrid(
                &pm,
                &opts,
                &inkfs::api::HybridFormat {
                    device: &dev,
                    path: &abs,
                    blocks,
                    threshold_bytes: threshold,
                    unit_blocks: unit as u32,
                },
            )
            .map_err(|e| undo(e.to_string()))?;
            created_data.keep();
            sb
        }
    };
    let info = pm.info();
    println!(
        "inkfs: {} formatted: {}, {} lanes, {} data blocks; backend {}, flush {}",
        path.display(),
        human(sb.size_bytes),
        sb.lanes,
        sb.data_blocks(),
        info.kind.describe(),
        info.flush.name()
    );
    if let (Some(d), Some(data)) = (sb.data, &a.data) {
        println!(
            "inkfs: data device {}: {} ({} data blocks); writes of {} or more go there, in extents of {}",
            data.display(),
            human(d.blocks * 4096),
            d.data_blocks(),
            human(d.threshold_bytes as u64),
            human(d.unit_blocks as u64 * 4096)
        );
    }
    if info.kind == inkfs::pmem::BackendKind::MsyncFile {
        println!(
            "inkfs: note: {} is on a disk file system: every persist is an msync (slow)",
            path.display()
        );
    }
    Ok(())
}

fn refuse_unless_forced(pool: &PoolFile, force: bool) -> Result<(), String> {
    if force {
        return Ok(());
    }
    match describe_contents(pool)? {
        Some(what) => Err(format!(
            "{} holds {what}; use --force to overwrite it",
            pool.path().display()
        )),
        None => Ok(()),
    }
}

/// Print `(label, value)` lines with the values aligned, `label:` style.
fn print_aligned(lines: &[(&str, String)]) {
    let width = lines.iter().map(|(l, _)| l.len()).max().unwrap_or(0) + 1;
    for (label, value) in lines {
        println!("{:<width$} {value}", format!("{label}:"), width = width);
    }
}

/// Describe a pool (format, backend, space, state) or a running mount
/// (live per-operation statistics)
///
/// A pool is read without a claim, so it may be described while mounted
/// (its space and inodes are then counted by the mount only: ask the mount
/// point).
#[derive(clap::Args, Debug)]
pub struct StatArgs {
    /// A pool (file or DAX device), or the mount point of a running inkfs
    /// server
    #[arg(value_name = "POOL|MOUNTPOINT")]
    pub path: PathBuf,
    /// Print one JSON object (for scripts)
    #[arg(long)]
    pub json: bool,
    /// Hybrid pools: the data device or file, when not at the path
    /// recorded by mkfs
    #[arg(long, value_name = "PATH")]
    pub data: Option<PathBuf>,
}

pub fn stat(a: &StatArgs) -> Result<(), String> {
    let (path, json) = (&a.path, a.json);
    if path.is_dir() {
        return match inkfs_fuse::stat_mountpoint(path, json) {
            Some(Ok(report)) => {
                print!("{report}");
                if !report.ends_with('\n') {
                    println!();
                }
                Ok(())
            }
            Some(Err(e)) => Err(e),
            None => Err(format!("{} is not an inkfs mount point", path.display())),
        };
    }
    // Only ask who holds the pool, and read it without a claim: a shared
    // lock held by stat would make a mount starting meanwhile fail.
    let busy = probe_pool(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let pm = PoolFile::open_unlocked(path)
        .and_then(|f| {
            MappedPool::map(
                f,
                &PoolOpenOptions {
                    create_size_bytes: None,
                    read_only: true,
                },
            )
        })
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let info = pm.info();
    // Hybrid pools: where mkfs recorded the data device (None: none, or
    // an unreadable record).
    let recorded_data = api::read_data_path(&pm);
    let mounted_on = inkfs_fuse::mount::mountpoints_of_pool(path);
    // A read-write holder changes the logs under us: read nothing but the
    // superblock (checksummed, with a backup copy), and point at the
    // mount's own live figures.
    let (sb, space) = if busy.as_ref().is_some_and(|b| b.exclusive) {
        let sb = api::read_summary(&pm).map_err(|e| format!("{}: {e}", path.display()))?;
        (sb, Space::Live(sb.from_backup))
    } else {
        let fs = Filesystem::mount(
            pm,
            MountOptions {
                read_only: true,
                data: a.data.clone().map(inkfs::api::DataDevice::Path),
                ..Default::default()
            },
        )
        .map_err(|e| format!("{}: {e}", path.display()))?;
        let st = fs.statfs();
        let space = Space::Counted {
            block_size: st.block_size as u64,
            blocks: st.blocks,
            blocks_free: st.blocks_free,
            data_blocks: st.data_blocks,
            data_blocks_free: st.data_blocks_free,
            inodes: st.files - st.files_free,
            backup_superblock: fs.mount_report().used_backup_superblock,
        };
        (fs.summary(), space)
    };
    let state = pool_state(sb.clean, busy.as_ref());
    let errors = sb.errors;
    if json {
        let event = |e: Option<ErrorEvent>| match e {
            None => serde_json::Value::Null,
            Some(e) => json!({
                "unix_ns": e.unix_ns,
                "inode": e.ino,
                "reason": e.reason().map_or("unknown", |r| r.name()),
            }),
        };
        let mut v = json!({
            "pool": path.display().to_string(),
            "format_version": sb.version,
            "backend": info.kind.describe(),
            "flush": info.flush.name(),
            "size_bytes": sb.size_bytes,
            "lanes": sb.lanes,
            "state": state.word,
            "state_text": state.text,
            "held": held_json(busy.as_ref()),
            "holders": holders_json(busy.as_ref()),
            "mounted_on": mounted_on.iter().map(|m| m.display().to_string()).collect::<Vec<_>>(),
            "errors_count": errors.count,
            "first_error": event(errors.first),
            "last_error": event(errors.last),
        });
        if let Some(d) = sb.data {
            v["data_device"] = json!({
                "path": a.data.as_ref().or(recorded_data.as_ref()).map(|p| p.display().to_string()),
                "recorded_path": recorded_data.as_ref().map(|p| p.display().to_string()),
                "uuid": hex(&d.uuid),
                "blocks": d.blocks,
                "first_data_block": d.first_data_block,
                "threshold_bytes": d.threshold_bytes,
                "unit_bytes": d.unit_blocks as u64 * 4096,
            });
        }
        match space {
            Space::Counted {
                block_size,
                blocks,
                blocks_free,
                data_blocks,
                data_blocks_free,
                inodes,
                backup_superblock,
            } => {
                v["block_size"] = block_size.into();
                v["blocks_total"] = blocks.into();
                v["blocks_used"] = (blocks - blocks_free).into();
                v["blocks_free"] = blocks_free.into();
                if sb.data.is_some() {
                    // Of the totals above: PM's and the data device's.
                    v["pm_blocks_total"] = (blocks - data_blocks).into();
                    v["pm_blocks_free"] = (blocks_free - data_blocks_free).into();
                    v["data_device"]["blocks_total"] = data_blocks.into();
                    v["data_device"]["blocks_used"] = (data_blocks - data_blocks_free).into();
                    v["data_device"]["blocks_free"] = data_blocks_free.into();
                }
                v["inodes"] = inodes.into();
                v["used_backup_superblock"] = backup_superblock.into();
            }
            Space::Live(backup_superblock) => {
                v["used_backup_superblock"] = backup_superblock.into();
            }
        }
        println!("{v}");
        return Ok(());
    }
    let mut lines = vec![
        ("pool", path.display().to_string()),
        ("format version", sb.version.to_string()),
        ("backend", info.kind.describe().to_string()),
        ("flush method", info.flush.name().to_string()),
        ("size", human_bytes(sb.size_bytes)),
        ("lanes", sb.lanes.to_string()),
        ("state", state.text),
        (
            "errors",
            if errors.is_clear() {
                "none recorded".to_string()
            } else {
                format!(
                    "{}; a read-write mount needs `inkfs fsck -y` first",
                    errors.describe()
                )
            },
        ),
    ];
    for m in &mounted_on {
        let dead =
            matches!(std::fs::metadata(m), Err(e) if e.raw_os_error() == Some(libc::ENOTCONN));
        lines.push((
            "mounted on",
            if dead {
                format!(
                    "{} (dead: its server is gone; the next inkfs mount there clears it)",
                    m.display()
                )
            } else {
                m.display().to_string()
            },
        ));
    }
    if let Some(d) = sb.data {
        lines.push((
            "data device",
            format!(
                "{} (uuid {}, {}; writes of {} or more, extents of {})",
                a.data
                    .as_ref()
                    .or(recorded_data.as_ref())
                    .map_or("(path not recorded)".into(), |p| p.display().to_string()),
                hex(&d.uuid),
                human_bytes(d.blocks * 4096),
                human_bytes(d.threshold_bytes as u64),
                human_bytes(d.unit_blocks as u64 * 4096)
            ),
        ));
    }
    let backup = match space {
        Space::Counted {
            block_size,
            blocks,
            blocks_free,
            data_blocks,
            data_blocks_free,
            inodes,
            backup_superblock,
        } => {
            let describe = |blocks: u64, free: u64| {
                format!(
                    "{blocks} total, {} used, {free} free ({block_size} B each; free: {})",
                    blocks - free,
                    human_bytes(free * block_size)
                )
            };
            if sb.data.is_some() {
                lines.push((
                    "PM data blocks",
                    describe(blocks - data_blocks, blocks_free - data_blocks_free),
                ));
                lines.push((
                    "device data blocks",
                    describe(data_blocks, data_blocks_free),
                ));
            } else {
                lines.push(("data blocks", describe(blocks, blocks_free)));
            }
            lines.push(("inodes in use", inodes.to_string()));
            backup_superblock
        }
        Space::Live(backup_superblock) => {
            let at = mounted_on
                .first()
                .map_or("MOUNTPOINT".to_string(), |m| m.display().to_string());
            lines.push((
                "space, inodes",
                format!("counted by the mount only: inkfs stat {at}"),
            ));
            backup_superblock
        }
    };
    if backup {
        lines.push((
            "warning",
            "the primary superblock is damaged; the backup copy was used".into(),
        ));
    }
    print_aligned(&lines);
    Ok(())
}

/// Space and inodes of a pool, or why they are not counted here.
enum Space {
    Counted {
        block_size: u64,
        blocks: u64,
        blocks_free: u64,
        /// Of `blocks` and `blocks_free`, those on a hybrid pool's data
        /// device (0 without one).
        data_blocks: u64,
        data_blocks_free: u64,
        inodes: u64,
        backup_superblock: bool,
    },
    /// In use by a read-write holder: only the mount knows (the flag: the
    /// backup superblock was read).
    Live(bool),
}

fn hex(uuid: &[u8; 16]) -> String {
    uuid.iter().map(|b| format!("{b:02x}")).collect()
}
