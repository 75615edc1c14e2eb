//! `inkfs null-fs MOUNTPOINT`: a FUSE file system that stores nothing —
//! the floor any FUSE file system sits on, for benchmarks.
//!
//! One root directory; files can be created, opened, written (the length is
//! acknowledged, the bytes dropped), read (zeros up to the size written or
//! truncated to), fsynced and unlinked. Attributes come from a small map.
//! Its FUSE settings are libfuse-like defaults (no page cache kept across
//! opens, no readdirplus): the published baseline of `bench/`.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request,
    SessionACL, TimeOrNow, WriteFlags,
};

use crate::mount::{block_term_signals, daemonize, prepare_mountpoint, serve_session};
use crate::stats::Counter;

const TTL: Duration = Duration::from_secs(1);
const ROOT: u64 = 1;
/// Reads are answered from this (a read never exceeds max_pages × 4 KiB).
static ZEROS: [u8; 1 << 20] = [0; 1 << 20];

struct NullFile {
    size: AtomicU64,
    mode: u32,
}

#[derive(Default)]
struct NullState {
    names: HashMap<Vec<u8>, u64>,
    files: HashMap<u64, Arc<NullFile>>,
    next_ino: u64,
}

pub struct NullFs {
    state: RwLock<NullState>,
    /// Data requests served (reads, writes, fsyncs): what `-o poll` watches.
    requests: Arc<Counter>,
    uid: u32,
    gid: u32,
    started: SystemTime,
}

impl Default for NullFs {
    fn default() -> Self {
        // SAFETY: getuid/getgid have no preconditions and cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        NullFs {
            state: RwLock::new(NullState {
                next_ino: 2,
                ..NullState::default()
            }),
            requests: Arc::new(Counter::default()),
            uid,
            gid,
            started: SystemTime::now(),
        }
    }
}

impl NullFs {
    fn attr(&self, ino: u64, f: Option<&NullFile>) -> FileAttr {
        let (kind, perm, size, nlink) = match f {
            None => (FileType::Directory, 0o777, 0, 2),
            Some(f) => (
                FileType::RegularFile,
                f.mode as u16,
                f.size.load(Relaxed),
                1,
            ),
        };
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: 0,
            atime: self.started,
            mtime: self.started,
            ctime: self.started,
            crtime: self.started,
            kind,
            perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }
    fn read_state(&self) -> std::sync::RwLockReadGuard<'_, NullState> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }
    fn write_state(&self) -> std::sync::RwLockWriteGuard<'_, NullState> {
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }
    fn file(&self, ino: u64) -> Option<Arc<NullFile>> {
        self.read_state().files.get(&ino).cloned()
    }
}

impl Filesystem for NullFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        for cap in [
            InitFlags::FUSE_BIG_WRITES,
            InitFlags::FUSE_MAX_PAGES,
            InitFlags::FUSE_ATOMIC_O_TRUNC,
        ] {
            let _ = config.add_capabilities(cap);
        }
        let _ = config.set_max_write(crate::fs::MAX_WRITE_BYTES);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent.0 != ROOT {
            return reply.error(Errno::ENOENT);
        }
        let st = self.read_state();
        match st
            .names
            .get(name.as_bytes())
            .and_then(|ino| st.files.get(ino).map(|f| (*ino, f)))
        {
            Some((ino, f)) => reply.entry(&TTL, &self.attr(ino, Some(f)), Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        if ino.0 == ROOT {
            return reply.attr(&TTL, &self.attr(ROOT, None));
        }
        match self.file(ino.0) {
            Some(f) => reply.attr(&TTL, &self.attr(ino.0, Some(&f))),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        if ino.0 == ROOT {
            return reply.attr(&TTL, &self.attr(ROOT, None));
        }
        match self.file(ino.0) {
            Some(f) => {
                if let Some(s) = size {
                    f.size.store(s, Relaxed);
                }
                reply.attr(&TTL, &self.attr(ino.0, Some(&f)))
            }
            None => reply.error(Errno::ENOENT),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut st = self.write_state();
        match (parent.0, st.names.remove(name.as_bytes())) {
            (ROOT, Some(ino)) => {
                // Open descriptors keep working: getattr just stops finding it.
                st.files.remove(&ino);
                reply.ok()
            }
            _ => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if ino.0 != ROOT {
            if let Some(f) = self.file(ino.0) {
                if flags.0 & libc::O_TRUNC != 0 {
                    f.size.store(0, Relaxed);
                }
            }
        }
        reply.opened(FileHandle(ino.0), FopenFlags::empty())
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        if parent.0 != ROOT {
            return reply.error(Errno::ENOENT);
        }
        let mut st = self.write_state();
        let ino = match st.names.get(name.as_bytes()) {
            Some(&ino) => ino,
            None => {
                let ino = st.next_ino;
                st.next_ino += 1;
                let f = NullFile {
                    size: AtomicU64::new(0),
                    mode: mode & !umask & 0o7777,
                };
                st.files.insert(ino, Arc::new(f));
                st.names.insert(name.as_bytes().to_vec(), ino);
                ino
            }
        };
        let attr = self.attr(ino, st.files.get(&ino).map(|f| &**f));
        reply.created(
            &TTL,
            &attr,
            Generation(0),
            FileHandle(ino),
            FopenFlags::empty(),
        )
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.requests.add(1);
        let file_size = self.file(ino.0).map(|f| f.size.load(Relaxed)).unwrap_or(0);
        let n = file_size
            .saturating_sub(offset)
            .min(size as u64)
            .min(ZEROS.len() as u64);
        reply.data(&ZEROS[..n as usize])
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        self.requests.add(1);
        if let Some(f) = self.file(ino.0) {
            f.size
                .fetch_max(offset.saturating_add(data.len() as u64), Relaxed);
        }
        reply.written(data.len() as u32)
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lo: LockOwner,
        reply: ReplyEmpty,
    ) {
        // As inkfs: nothing to flush, and the kernel stops asking.
        reply.error(Errno::ENOSYS)
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _ds: bool, reply: ReplyEmpty) {
        self.requests.add(1);
        reply.ok()
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino.0 != ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let st = self.read_state();
        let mut entries: Vec<(u64, FileType, &[u8])> = vec![
            (ROOT, FileType::Directory, b"."),
            (ROOT, FileType::Directory, b".."),
        ];
        let mut files: Vec<_> = st.names.iter().map(|(n, &i)| (i, n.as_slice())).collect();
        files.sort_unstable();
        entries.extend(
            files
                .into_iter()
                .map(|(i, n)| (i, FileType::RegularFile, n)),
        );
        for (i, (ino, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(ino), i as u64 + 1, kind, OsStr::from_bytes(name)) {
                break;
            }
        }
        reply.ok()
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        reply.statfs(1 << 30, 1 << 30, 1 << 30, 1 << 20, 1 << 20, 4096, 255, 4096)
    }
}

/// A do-nothing FUSE file system: FUSE's floor, for benchmarks
///
/// One root directory; files can be created, written (the length is
/// acknowledged, the bytes dropped), read (zeros), fsynced and unlinked.
#[derive(clap::Args, Clone, Debug)]
pub struct NullArgs {
    /// The directory to mount it on
    pub mountpoint: PathBuf,
    /// Stay in the foreground and serve until unmounted (otherwise return
    /// once the mount is live)
    #[arg(short, long)]
    pub foreground: bool,
    /// Options, comma separated: threads=N (FUSE worker threads, 1 to 64;
    /// default the same as inkfs mount's), poll / nopoll (spin on the FUSE
    /// device while requests keep coming, as `inkfs mount -o poll` does;
    /// default nopoll)
    #[arg(short = 'o', value_name = "OPTIONS", value_delimiter = ',', value_parser = NullOption::parse)]
    pub options: Vec<NullOption>,
}

/// One `-o` option of `inkfs null-fs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NullOption {
    Threads(usize),
    Poll(bool),
    /// An empty item (`-o a,,b`): nothing.
    None,
}

impl NullOption {
    fn parse(o: &str) -> Result<NullOption, String> {
        match o {
            "" => Ok(NullOption::None),
            "poll" => Ok(NullOption::Poll(true)),
            "nopoll" => Ok(NullOption::Poll(false)),
            _ => match o.strip_prefix("threads=") {
                Some(v) => v
                    .parse()
                    .ok()
                    .filter(|n| (1..=64).contains(n))
                    .map(NullOption::Threads)
                    .ok_or_else(|| format!("threads={v}: expected 1 to 64")),
                None => Err(format!(
                    "unknown option {o} (threads=N, poll and nopoll are known)"
                )),
            },
        }
    }
}

/// `inkfs null-fs ...`; returns the exit status (0, or 1 on failure).
pub fn null_main(args: &NullArgs) -> i32 {
    let (mnt, foreground) = (args.mountpoint.clone(), args.foreground);
    // The same default as `inkfs mount`, so that the floor it measures is
    // FUSE as inkfs uses it.
    let mut threads = crate::mount::default_threads();
    let mut poll = false;
    for o in &args.options {
        match *o {
            NullOption::Threads(n) => threads = n,
            NullOption::Poll(p) => poll = p,
            NullOption::None => {}
        }
    }
    daemonize(foreground, move |mut notify| {
        block_term_signals();
        let mnt = match prepare_mountpoint(&mnt) {
            Ok(m) => m,
            Err(e) => {
                notify.fail(&e);
                return 1;
            }
        };
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            MountOption::FSName("null".into()),
            MountOption::CUSTOM("subtype=inkfs-null".into()),
        ];
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            config.acl = SessionACL::All;
        }
        config.n_threads = Some(threads);
        config.clone_fd = threads > 1;
        let fs = NullFs::default();
        let requests = poll.then(|| fs.requests.clone());
        serve_session(fs, &mnt, &config, requests, &mut notify, |_| {})
    })
}
