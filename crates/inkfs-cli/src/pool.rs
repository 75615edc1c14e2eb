//! `inkfs mkfs` and `inkfs stat` on a pool (a file or a DAX device).

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use inkfs::format::{STATE_CLEAN, STATE_MOUNTED};
use inkfs::pmem::{MappedPool, Pmem, PoolOpenOptions};
use inkfs::superblock;
use inkfs::types::{ErrorEvent, ErrorRecord, FormatOptions, MountOptions};
use inkfs::Fs;

/// Parse "4G", "512M", "64k", "1T" or plain bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.chars().last() {
        Some(c @ ('k' | 'K' | 'm' | 'M' | 'g' | 'G' | 't' | 'T')) => {
            let shift = match c.to_ascii_lowercase() {
                'k' => 10,
                'm' => 20,
                'g' => 30,
                _ => 40,
            };
            (&s[..s.len() - 1], 1u64 << shift)
        }
        _ => (s, 1),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("bad size '{s}' (use e.g. 4G, 512M, 65536)"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("size '{s}' is too large"))
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

struct MkfsArgs {
    pool: PathBuf,
    size: Option<u64>,
    lanes: u32,
    force: bool,
}

fn parse_mkfs(args: &[String]) -> Result<MkfsArgs, String> {
    let mut pool = None;
    let mut size = None;
    let mut lanes = 0;
    let mut force = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--size" | "-s" => size = Some(parse_size(it.next().ok_or("--size needs a value")?)?),
            "--lanes" => {
                let v = it.next().ok_or("--lanes needs a value")?;
                lanes = v.parse().map_err(|_| format!("bad lane count '{v}'"))?;
            }
            "--force" | "-f" => force = true,
            s if s.starts_with("--size=") => size = Some(parse_size(&s[7..])?),
            s if s.starts_with('-') => return Err(format!("unknown option '{s}'")),
            s if pool.is_none() => pool = Some(PathBuf::from(s)),
            s => return Err(format!("unexpected argument '{s}'")),
        }
    }
    let pool = pool.ok_or("which pool? usage: inkfs mkfs POOL [--size SIZE] [--force]")?;
    Ok(MkfsArgs {
        pool,
        size,
        lanes,
        force,
    })
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

/// Describe non-empty contents in one phrase, or None if all zero.
fn describe_contents(path: &Path) -> Result<Option<String>, String> {
    let pm = MappedPool::open(
        path,
        &PoolOpenOptions {
            create_size_bytes: None,
            read_only: true,
        },
    )
    .map_err(|e| format!("{}: {e}", path.display()))?;
    if superblock::looks_like_inkfs(&pm) {
        return Ok(Some(match superblock::read_superblock(&pm) {
            Ok((sb, _)) => format!(
                "an inkfs pool (format v{}, {}, {} lanes, {})",
                sb.version,
                human(sb.size_bytes),
                sb.lane_count,
                if sb.state == STATE_CLEAN {
                    "cleanly unmounted"
                } else {
                    "not cleanly unmounted"
                }
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

pub fn mkfs(args: &[String]) -> Result<(), String> {
    let a = parse_mkfs(args)?;
    let path = &a.pool;
    let found = existing(path)?;
    // A file this command creates is removed again if it cannot become a
    // pool (e.g. a size hugetlbfs cannot hold): no empty file left behind.
    let created = matches!(found, Existing::Nothing);
    let create_size = match (found, a.size) {
        (Existing::Nothing, None) => {
            return Err(format!(
                "{} does not exist; give --size to create it",
                path.display()
            ))
        }
        (Existing::Nothing | Existing::EmptyFile, Some(s)) => Some(s),
        (Existing::EmptyFile, None) => {
            return Err(format!("{} is empty; give --size", path.display()))
        }
        (Existing::DaxDevice, size) => {
            if size.is_some() {
                eprintln!("inkfs mkfs: note: a DAX device is used whole; --size ignored");
            }
            refuse_unless_forced(path, a.force)?;
            None
        }
        (Existing::File { bytes }, size) => {
            refuse_unless_forced(path, a.force)?;
            match size {
                Some(s) if s != bytes => {
                    // Forced, with a new size: start from an empty file.
                    std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
                    Some(s)
                }
                _ => None,
            }
        }
    };
    if let Some(s) = create_size {
        if s % 4096 != 0 {
            return Err(format!("size {s} is not a multiple of 4096"));
        }
    }
    let undo = |e: String| {
        if created {
            let _ = std::fs::remove_file(path);
        }
        e
    };
    let pm = MappedPool::open(
        path,
        &PoolOpenOptions {
            create_size_bytes: create_size,
            read_only: false,
        },
    )
    .map_err(|e| undo(format!("{}: {e}", path.display())))?;
    let opts = FormatOptions {
        lanes: a.lanes,
        ..Default::default()
    };
    let sb = Fs::format(&pm, &opts).map_err(|e| undo(e.to_string()))?;
    let info = pm.info();
    println!(
        "inkfs: {} formatted: {}, {} lanes, {} data blocks; backend {}, flush {}",
        path.display(),
        human(sb.size_bytes),
        sb.lane_count,
        sb.total_blocks - sb.first_data_block,
        info.kind.describe(),
        info.flush.name()
    );
    if info.kind == inkfs::pmem::BackendKind::MsyncFile {
        println!(
            "inkfs: note: {} is on a disk file system: every persist is an msync (slow)",
            path.display()
        );
    }
    Ok(())
}

fn refuse_unless_forced(path: &Path, force: bool) -> Result<(), String> {
    if force {
        return Ok(());
    }
    match describe_contents(path)? {
        Some(what) => Err(format!(
            "{} holds {what}; use --force to overwrite it",
            path.display()
        )),
        None => Ok(()),
    }
}

pub fn stat(args: &[String]) -> Result<(), String> {
    let mut json = false;
    let mut path = None;
    for a in args {
        match a.as_str() {
            "--json" => json = true,
            s if s.starts_with('-') => return Err(format!("unknown option '{s}'")),
            s => path = Some(PathBuf::from(s)),
        }
    }
    let path = path.ok_or("usage: inkfs stat POOL [--json]")?;
    if path.is_dir() {
        return match inkfs_fuse::stat_mountpoint(&path, json) {
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
    let pm = MappedPool::open(
        &path,
        &PoolOpenOptions {
            create_size_bytes: None,
            read_only: true,
        },
    )
    .map_err(|e| format!("{}: {e}", path.display()))?;
    let info = pm.info();
    let fs = Fs::mount(
        pm,
        MountOptions {
            read_only: true,
            ..Default::default()
        },
    )
    .map_err(|e| e.to_string())?;
    let sb = fs.superblock();
    let st = fs.statfs();
    let rep = fs.mount_report();
    let state = match sb.state {
        STATE_CLEAN => "clean",
        STATE_MOUNTED => "not clean (mounted now, or crashed)",
        _ => "unknown",
    };
    let used = st.blocks - st.blocks_free;
    let inodes = st.files - st.files_free;
    let errors = ErrorRecord::of(&sb);
    if json {
        let event = |e: Option<ErrorEvent>| match e {
            None => "null".to_string(),
            Some(e) => format!(
                "{{\"unix_ns\":{},\"inode\":{},\"reason\":{}}}",
                e.unix_ns,
                e.ino.map_or("null".to_string(), |i| i.to_string()),
                json_str(e.reason().map_or("unknown", |r| r.name()))
            ),
        };
        println!(
            "{{\"pool\":{},\"format_version\":{},\"backend\":{},\"flush\":{},\"size_bytes\":{},\"block_size\":{},\"lanes\":{},\"state\":{},\"blocks_total\":{},\"blocks_used\":{},\"blocks_free\":{},\"inodes\":{},\"used_backup_superblock\":{},\"errors_count\":{},\"first_error\":{},\"last_error\":{}}}",
            json_str(&path.display().to_string()),
            sb.version,
            json_str(info.kind.describe()),
            json_str(info.flush.name()),
            sb.size_bytes,
            st.block_size,
            sb.lane_count,
            json_str(if sb.state == STATE_CLEAN { "clean" } else { "not-clean" }),
            st.blocks,
            used,
            st.blocks_free,
            inodes,
            rep.used_backup_superblock,
            errors.count,
            event(errors.first),
            event(errors.last)
        );
    } else {
        println!("pool:            {}", path.display());
        println!("format version:  {}", sb.version);
        println!("backend:         {}", info.kind.describe());
        println!("flush method:    {}", info.flush.name());
        println!(
            "size:            {} ({} bytes)",
            human(sb.size_bytes),
            sb.size_bytes
        );
        println!("lanes:           {}", sb.lane_count);
        println!("state:           {state}");
        println!(
            "data blocks:     {} total, {} used, {} free ({} free)",
            st.blocks,
            used,
            st.blocks_free,
            human(st.blocks_free * st.block_size as u64)
        );
        println!("inodes:          {inodes}");
        if errors.is_clear() {
            println!("errors:          none recorded");
        } else {
            println!(
                "errors:          {}; a read-write mount needs `inkfs fsck -y` first",
                errors.describe()
            );
        }
        if rep.used_backup_superblock {
            println!(
                "warning:         the primary superblock is damaged; the backup copy was used"
            );
        }
    }
    Ok(())
}

fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
