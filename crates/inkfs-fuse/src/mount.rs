//! `inkfs mount`: options, dead mounts, daemonising, signals,
//! and running a FUSE session until it is unmounted.

use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fuser::{Config, Filesystem, MountOption, Session, SessionACL};
use inkfs::types::{ErrorsPolicy, Mode};

use crate::attach::AttachService;
use crate::fs::{Caching, InkFuse};
use crate::inval::Invalidator;
use crate::scrub::ScrubService;
use crate::stats::{Access, Field, Handler, Request, Stats, StatsServer};
use crate::Engine;

/// The `-o` options, for `inkfs mount --help` (kept beside
/// [`MountConfig::apply_options`], which parses them).
pub const OPTIONS_HELP: &str = "\
Mount options (-o, comma separated, mount(8) style; -o may be repeated):
  mode=strict|sync|posix   consistency mode (default strict; docs/MODES.md)
  ro / rw                  read-only or read-write (default rw)
  errors=remount-ro|continue  on corruption met while mounted: turn
                           read-only (default) or keep serving; either way
                           it is counted, logged and recorded, and the next
                           read-write mount needs `inkfs fsck -y` first
  allow_other / noallow_other            (default: allow_other when root)
  default_permissions / nodefault_permissions  kernel permission checks (default on)
  writeback_cache / nowriteback_cache  posix mode only: writes land in the
                           kernel's page cache and are written back later,
                           durable at fsync, fdatasync, msync, sync, syncfs,
                           O_SYNC/O_DSYNC (default on in posix mode; needs
                           default_permissions; docs/MODES.md)
  kernel_open / nokernel_open  posix mode with the writeback cache only:
                           regular files opened by the kernel alone (no
                           OPEN or RELEASE request per open and close;
                           writes to chattr +i/+a files then fail at their
                           write-back, not at open; default off; ignored
                           without the cache, where the server's open must
                           choose direct_io for O_APPEND; docs/MODES.md)
  noxattr / xattr          no extended attributes through the mount: every
                           xattr call fails with EOPNOTSUPP (getfattr,
                           setcap, overlayfs upper layers; files run from
                           it get no file capabilities), and the kernel
                           stops asking for security.capability before
                           writes and chowns (default xattr; docs/MODES.md)
  threads=N                FUSE worker threads, 1 to 64 (default 2, 1 on a
                           1-CPU machine)
  poll / nopoll            spin on the FUSE device while requests keep coming,
                           sleep after 2 ms without one (default nopoll: it
                           helps a single-threaded server only)
  fsname=NAME, subtype=NAME  shown in /proc/mounts (default POOL, inkfs)
  stats=owner|all          who may read `inkfs stat MOUNTPOINT`: the mount's
                           owner and root (default), or every local user
  data=PATH                hybrid pools: the data device or file, when not
                           at the path recorded by mkfs (checked by its
                           label: another device is refused)
  data_cache=SIZE          hybrid pools: DRAM cache of data-device blocks
                           (default 256M; 0 disables it)
  data_threshold=SIZE      hybrid pools: writes of at least SIZE bytes put
                           their pages on the data device (default: mkfs's)
  data_readahead=threads|uring|off  hybrid pools: how sequential readers
                           are read ahead into the DRAM cache (default
                           threads)
  dev, nodev, suid, nosuid, exec, noexec, atime, noatime, sync, async, dirsync
  ignored: defaults, auto, noauto, nofail, _netdev, user, nouser, users,
           relatime, strictatime, nodiratime, x-*, comment=*
The flags mount(8) may add for a helper, -n, -s and -v, are ignored.

Exit status: 0 mounted (without -f) or unmounted cleanly (with -f), 1 the
mount or the server failed, 2 usage error (an unknown option included).";

/// Mount a pool with FUSE; returns once the mount is live
///
/// mount(8) runs it too, through the helper mount.fuse.inkfs (`mount -t
/// fuse.inkfs`, /etc/fstab; see `inkfs install-helper`), as
/// `mount.fuse.inkfs POOL MOUNTPOINT [-s] [-f] [-n] [-v] [-o OPTIONS]`.
//
// (libmount's exec_helper. Its -f means "fake" (`mount -f`): the helper
// script handles it and does not run this.)
#[derive(clap::Args, Clone, Debug)]
#[command(after_help = OPTIONS_HELP)]
pub struct MountArgs {
    /// The pool: a file or a DAX device, made by `inkfs mkfs`
    pub pool: PathBuf,
    /// The directory to mount it on
    pub mountpoint: PathBuf,
    /// Stay in the foreground and serve until unmounted (otherwise return
    /// once the mount is live)
    #[arg(short, long)]
    pub foreground: bool,
    /// Mount options, comma separated (see below); checked before anything
    /// is opened
    #[arg(short = 'o', value_name = "OPTIONS", value_parser = check_options)]
    pub options: Vec<String>,
    /// What mount(8) may pass a helper besides -f and -o: -n (no mtab),
    /// -s (sloppy), -v (verbose); accepted and ignored.
    #[arg(short = 'n', short_aliases = ['s', 'v'], action = clap::ArgAction::Count, hide = true)]
    pub helper_flags: u8,
}

/// The `-o` value parser: an option list is refused by the argument
/// parser, as a usage error, if [`MountConfig::apply_options`] refuses it.
fn check_options(list: &str) -> Result<String, String> {
    MountConfig::new(PathBuf::new(), PathBuf::new()).apply_options(list)?;
    Ok(list.to_string())
}

/// FUSE worker threads when `threads=` is not given. On a 2-vCPU machine
/// two blocking threads serve fio 4 KiB I/O 1.3-1.6x faster than one
/// polling thread with one client and ~2x with two; four are slower than
/// two (bench/fuse-floor, RESULTS.md). Larger machines were not measured,
/// so more than two is not the default.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(2))
}

/// Everything `inkfs mount` was asked to do.
#[derive(Clone, Debug)]
pub struct MountConfig {
    pub pool: PathBuf,
    pub mountpoint: PathBuf,
    pub foreground: bool,
    pub mode: Mode,
    pub read_only: bool,
    /// What the engine does on corruption met while mounted (`errors=`).
    pub errors: ErrorsPolicy,
    pub allow_other: bool,
    pub default_permissions: bool,
    /// `writeback_cache` / `nowriteback_cache` if given (see
    /// [`MountConfig::caching`] for the default).
    pub writeback_cache: Option<bool>,
    /// `kernel_open`: regular files opened by the kernel (`crate::open`).
    pub kernel_open: bool,
    /// `noxattr`: no xattrs through the mount (`Caching::no_xattr`).
    pub no_xattr: bool,
    pub threads: usize,
    /// Spin on the FUSE device while requests keep coming (`poll`).
    pub poll: bool,
    pub fsname: Option<String>,
    pub subtype: String,
    /// Who may read the statistics socket (`stats=owner|all`).
    pub stats_access: Access,
    /// Kernel flags passed through (dev, suid, exec, noatime, ...).
    pub flags: Vec<MountOption>,
    /// Hybrid pools: `data=`, `data_cache=`, `data_threshold=`,
    /// `data_readahead=`.
    pub data: Option<PathBuf>,
    pub data_cache_bytes: Option<u64>,
    pub data_threshold_bytes: Option<u64>,
    pub data_readahead: inkfs::api::ReadaheadMode,
}

/// Parse "4G", "512M", "64k", "1T" or plain bytes (binary units).
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

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

impl MountConfig {
    fn new(pool: PathBuf, mountpoint: PathBuf) -> MountConfig {
        MountConfig {
            pool,
            mountpoint,
            foreground: false,
            mode: Mode::default(),
            read_only: false,
            errors: ErrorsPolicy::default(),
            allow_other: is_root(),
            default_permissions: true,
            writeback_cache: None,
            kernel_open: false,
            no_xattr: false,
            threads: default_threads(),
            poll: false,
            fsname: None,
            subtype: "inkfs".into(),
            stats_access: Access::OwnerAndRoot,
            flags: Vec::new(),
            data: None,
            data_cache_bytes: None,
            data_threshold_bytes: None,
            data_readahead: Default::default(),
        }
    }

    /// Apply one comma-separated `-o` list.
    pub fn apply_options(&mut self, list: &str) -> Result<(), String> {
        for opt in list.split(',').map(str::trim).filter(|o| !o.is_empty()) {
            let (key, value) = match opt.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (opt, None),
            };
            match (key, value) {
                ("mode", Some(v)) => {
                    self.mode = Mode::parse(v)
                        .ok_or_else(|| format!("mode={v}: expected strict, sync or posix"))?
                }
                ("errors", Some(v)) => {
                    self.errors = ErrorsPolicy::parse(v)
                        .ok_or_else(|| format!("errors={v}: expected remount-ro or continue"))?
                }
                ("ro", None) => self.read_only = true,
                ("rw", None) => self.read_only = false,
                ("allow_other", None) => self.allow_other = true,
                ("noallow_other", None) => self.allow_other = false,
                ("default_permissions", None) => self.default_permissions = true,
                ("nodefault_permissions", None) => self.default_permissions = false,
                ("writeback_cache", None) => self.writeback_cache = Some(true),
                ("nowriteback_cache", None) => self.writeback_cache = Some(false),
                ("kernel_open", None) => self.kernel_open = true,
                ("nokernel_open", None) => self.kernel_open = false,
                ("noxattr", None) => self.no_xattr = true,
                ("xattr", None) => self.no_xattr = false,
                ("threads", Some(v)) => {
                    self.threads = v
                        .parse()
                        .ok()
                        .filter(|n| (1..=64).contains(n))
                        .ok_or_else(|| format!("threads={v}: expected 1 to 64"))?
                }
                ("poll", None) => self.poll = true,
                ("nopoll", None) => self.poll = false,
                ("fsname", Some(v)) => self.fsname = Some(v.to_string()),
                ("stats", Some("owner")) => self.stats_access = Access::OwnerAndRoot,
                ("stats", Some("all")) => self.stats_access = Access::Everyone,
                ("stats", Some(v)) => return Err(format!("stats={v}: expected owner or all")),
                ("subtype", Some(v)) => self.subtype = v.to_string(),
                ("data", Some(v)) if !v.is_empty() => self.data = Some(PathBuf::from(v)),
                ("data_cache", Some(v)) => {
                    self.data_cache_bytes =
                        Some(parse_size(v).map_err(|e| format!("data_cache: {e}"))?)
                }
                ("data_threshold", Some(v)) => {
                    self.data_threshold_bytes =
                        Some(parse_size(v).map_err(|e| format!("data_threshold: {e}"))?)
                }
                ("data_readahead", Some(v)) => {
                    self.data_readahead = inkfs::api::ReadaheadMode::parse(v).ok_or_else(|| {
                        format!("data_readahead={v}: expected threads, uring or off")
                    })?
                }
                ("dev", None) => self.flags.push(MountOption::Dev),
                ("nodev", None) => self.flags.push(MountOption::NoDev),
                ("suid", None) => self.flags.push(MountOption::Suid),
                ("nosuid", None) => self.flags.push(MountOption::NoSuid),
                ("exec", None) => self.flags.push(MountOption::Exec),
                ("noexec", None) => self.flags.push(MountOption::NoExec),
                ("atime", None) => self.flags.push(MountOption::Atime),
                ("noatime", None) => self.flags.push(MountOption::NoAtime),
                ("sync", None) => self.flags.push(MountOption::Sync),
                ("async", None) => self.flags.push(MountOption::Async),
                ("dirsync", None) => self.flags.push(MountOption::DirSync),
                // mount(8) and fstab noise that means nothing to a FUSE server.
                (
                    "defaults" | "auto" | "noauto" | "nofail" | "_netdev" | "user" | "nouser"
                    | "users" | "owner" | "relatime" | "norelatime" | "strictatime"
                    | "nostrictatime" | "lazytime" | "nolazytime" | "diratime" | "nodiratime"
                    | "loud" | "silent" | "nosymfollow",
                    None,
                ) => {}
                ("comment", Some(_)) => {}
                (k, _) if k.starts_with("x-") => {}
                _ => return Err(format!("unknown mount option: {opt}")),
            }
        }
        Ok(())
    }

    /// The configuration `args` ask for: the `-o` lists applied in order.
    pub fn from_args(args: &MountArgs) -> Result<MountConfig, String> {
        let mut cfg = MountConfig::new(args.pool.clone(), args.mountpoint.clone());
        cfg.foreground = args.foreground;
        for o in &args.options {
            cfg.apply_options(o)?;
        }
        cfg.check_caching()?;
        Ok(cfg)
    }

    /// Refuse a writeback cache asked for where it cannot be had.
    fn check_caching(&self) -> Result<(), String> {
        if self.writeback_cache != Some(true) {
            return Ok(());
        }
        if self.mode != Mode::Posix {
            return Err(format!(
                "writeback_cache: mode={} promises every write durable when it returns; \
                 the cache is for mode=posix",
                self.mode.name()
            ));
        }
        if !self.default_permissions {
            return Err(
                "writeback_cache needs default_permissions: the kernel then checks \
                 the times it sends on the caller's behalf"
                    .into(),
            );
        }
        Ok(())
    }

    /// How the kernel may cache this mount. The writeback cache: in posix
    /// mode, read-write, with `default_permissions`, unless
    /// `nowriteback_cache` (strict and sync promise durability when a
    /// write returns, which a cached write does not have). Directories
    /// opened and listed from the kernel's cache: in every mode, with
    /// `default_permissions` (without it only the server checks the read
    /// permission opendir needs, so it must be asked).
    pub fn caching(&self) -> Caching {
        let possible = self.mode == Mode::Posix && !self.read_only && self.default_permissions;
        let writeback = possible && self.writeback_cache != Some(false);
        Caching {
            writeback,
            kernel_opendir: self.default_permissions,
            kernel_open: writeback && self.kernel_open,
            no_xattr: self.no_xattr,
        }
    }

    /// The fuser session configuration for this mount.
    pub fn fuser_config(&self) -> Config {
        let mut opts = vec![
            // The canonical pool path by default, so that `inkfs stat POOL`
            // finds the mount whatever directory it was started from.
            MountOption::FSName(self.fsname.clone().unwrap_or_else(|| {
                self.pool
                    .canonicalize()
                    .unwrap_or_else(|_| self.pool.clone())
                    .display()
                    .to_string()
            })),
            // fuser sends Subtype only through fusermount; as a kernel option
            // it works with the direct mount(2) too (/proc/mounts then says
            // fuse.inkfs, which is what `mount -t fuse.inkfs` and umount match).
            MountOption::CUSTOM(format!("subtype={}", self.subtype)),
        ];
        if self.default_permissions {
            opts.push(MountOption::DefaultPermissions);
        }
        opts.push(if self.read_only {
            MountOption::RO
        } else {
            MountOption::RW
        });
        opts.extend(self.flags.iter().cloned());
        let mut c = Config::default();
        c.mount_options = opts;
        c.acl = if self.allow_other {
            SessionACL::All
        } else {
            SessionACL::Owner
        };
        c.n_threads = Some(self.threads);
        c.clone_fd = self.threads > 1;
        c
    }
}

/// Where pid files and sockets live: /run/inkfs for root, a per-user
/// directory under /tmp otherwise.
pub fn run_dir() -> PathBuf {
    if is_root() {
        PathBuf::from(crate::stats::RUN_DIR)
    } else {
        // SAFETY: geteuid has no preconditions and cannot fail.
        PathBuf::from(format!("/tmp/inkfs-{}", unsafe { libc::geteuid() }))
    }
}

/// The mount points of the inkfs servers of `pool`: the FUSE mounts whose
/// source (the `fsname`, by default the canonical pool path) is the same
/// file as `pool`. Empty if none (or /proc/self/mounts is unreadable).
pub fn mountpoints_of_pool(pool: &Path) -> Vec<PathBuf> {
    let Ok(want) = std::fs::metadata(pool) else {
        return Vec::new();
    };
    let same = |m: &std::fs::Metadata| {
        let ft = m.mode() & libc::S_IFMT;
        if ft == libc::S_IFCHR || ft == libc::S_IFBLK {
            m.rdev() == want.rdev() && m.mode() & libc::S_IFMT == want.mode() & libc::S_IFMT
        } else {
            m.dev() == want.dev() && m.ino() == want.ino()
        }
    };
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|line| {
            let mut f = line.split(' ');
            let (source, target, fstype) = (f.next()?, f.next()?, f.next()?);
            if !fstype.starts_with("fuse") {
                return None;
            }
            let meta = std::fs::metadata(unescape_mount_field(source)).ok()?;
            same(&meta).then(|| PathBuf::from(unescape_mount_field(target)))
        })
        .collect()
}

/// /proc/mounts writes blanks, tabs, newlines and backslashes as `\ooo`.
fn unescape_mount_field(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).and_then(|d| {
            std::str::from_utf8(d)
                .ok()
                .and_then(|d| u8::from_str_radix(d, 8).ok())
        });
        match (bytes[i], octal) {
            (b'\\', Some(b)) => {
                out.push(b);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// If a previous server died, its mount point answers ENOTCONN: detach it
/// so the new mount can take its place. Returns whether one was cleared.
pub fn clear_dead_mount(mountpoint: &Path) -> Result<bool, String> {
    match std::fs::metadata(mountpoint) {
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            let c = CString::new(mountpoint.as_os_str().as_bytes())
                .map_err(|_| format!("{}: path contains NUL", mountpoint.display()))?;
            // SAFETY: c is a valid NUL-terminated path for the whole call.
            let rc = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
            if rc != 0 {
                return Err(format!(
                    "{}: dead mount (server gone) and detaching it failed: {}; try `fusermount3 -uz {}`",
                    mountpoint.display(),
                    std::io::Error::last_os_error(),
                    mountpoint.display()
                ));
            }
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// The channel by which a daemonised server tells the waiting parent that
/// the mount is live (`ok`) or why it failed.
pub struct Notify(Option<OwnedFd>);

impl Notify {
    pub fn none() -> Notify {
        Notify(None)
    }
    fn send(&mut self, msg: &str) {
        if let Some(fd) = self.0.take() {
            let mut f = File::from(fd);
            let _ = f.write_all(msg.as_bytes());
        }
    }
    pub fn ready(&mut self) {
        self.send("ok");
    }
    pub fn fail(&mut self, msg: &str) {
        if self.0.is_some() {
            self.send(msg);
        } else {
            eprintln!("inkfs: {msg}");
        }
    }
    fn daemonised(&self) -> bool {
        self.0.is_some()
    }
}

/// Run `serve` in the foreground, or in a daemon child while this process
/// waits for the child's verdict. Must be called while the process is
/// single-threaded (fork).
pub fn daemonize(foreground: bool, serve: impl FnOnce(Notify) -> i32) -> i32 {
    if foreground {
        return serve(Notify::none());
    }
    let mut fds = [0i32; 2];
    // SAFETY: fds is a valid array of two ints for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        eprintln!("inkfs: pipe: {}", std::io::Error::last_os_error());
        return 1;
    }
    // SAFETY: both descriptors were just created by pipe2 and are owned
    // by nothing else.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: the caller guarantees that no other thread exists, so the
    // child inherits no lock held by a thread that does not exist there.
    match unsafe { libc::fork() } {
        -1 => {
            eprintln!("inkfs: fork: {}", std::io::Error::last_os_error());
            1
        }
        0 => {
            drop(rd);
            // SAFETY: setsid has no memory preconditions; failure (already a
            // group leader) is harmless.
            unsafe { libc::setsid() };
            let code = serve(Notify(Some(wr)));
            std::process::exit(code);
        }
        child => {
            drop(wr);
            let mut msg = String::new();
            let _ = File::from(rd).read_to_string(&mut msg);
            if msg == "ok" {
                return 0;
            }
            let mut status = 0;
            // SAFETY: waiting for our own child; status is a valid int.
            unsafe { libc::waitpid(child, &mut status, 0) };
            if msg.is_empty() {
                msg = format!("server exited before the mount was ready (status {status})");
            }
            eprintln!("inkfs: {msg}");
            1
        }
    }
}

/// After the parent was told "ok": let go of its terminal.
fn detach_stdio() {
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        for fd in 0..3 {
            // SAFETY: dup2 onto the standard descriptors; null stays open
            // for the duration of the calls.
            unsafe { libc::dup2(null.as_raw_fd(), fd) };
        }
    }
    // The server's messages (a settle the engine failed, a client's
    // session ended for a bad message) kept where the operator says.
    if let Some(path) = std::env::var_os("INKFS_SERVER_LOG") {
        if let Ok(log) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            // SAFETY: dup2 onto stderr; log stays open for the call.
            unsafe { libc::dup2(log.as_raw_fd(), 2) };
        }
    }
    let _ = std::env::set_current_dir("/");
}

/// The termination signals, to be blocked in every thread and taken with
/// sigwait by one.
fn term_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset/sigaddset initialise it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGHUP);
        set
    }
}

/// Block SIGTERM/SIGINT/SIGHUP in this thread and every thread it creates
/// from now on (call before creating any).
pub fn block_term_signals() {
    let set = term_signals();
    // SAFETY: set is initialised; the old mask is not wanted.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
}

/// Unmount `mountpoint` when a termination signal arrives; the session then
/// ends and the caller tears down cleanly.
fn unmount_on_signal(mountpoint: PathBuf) {
    let _ = std::thread::Builder::new()
        .name("inkfs-signals".into())
        .spawn(move || {
            let set = term_signals();
            let mut sig = 0;
            // SAFETY: set is initialised and sig is a valid int to fill.
            while unsafe { libc::sigwait(&set, &mut sig) } != 0 {}
            let Ok(c) = CString::new(mountpoint.as_os_str().as_bytes()) else {
                return;
            };
            // SAFETY: c is a valid NUL-terminated path for both calls.
            unsafe {
                if libc::umount2(c.as_ptr(), 0) != 0 {
                    // Busy (open files, a shell cd'd in): detach; the session
                    // ends when the last user lets go.
                    libc::umount2(c.as_ptr(), libc::MNT_DETACH);
                }
            }
        });
}

/// Mount `fs` on `mountpoint` and serve it until it is unmounted. Reports
/// readiness through `notify`. Returns an exit code.
pub fn serve_session<F: Filesystem>(
    fs: F,
    mountpoint: &Path,
    config: &Config,
    poll: Option<Arc<crate::stats::Counter>>,
    notify: &mut Notify,
    on_ready: impl FnOnce(crate::inval::KernelSink),
) -> i32 {
    let session = match Session::new(fs, mountpoint, config) {
        Ok(s) => s,
        Err(e) => {
            notify.fail(&format!("mounting on {}: {e}", mountpoint.display()));
            return 1;
        }
    };
    // Stopped (joined) when this function returns, after the session.
    let _poller = poll.and_then(|requests| {
        crate::poll::Poller::start(&session, requests)
            .map_err(|e| eprintln!("inkfs: poll: {e} (continuing with blocking reads)"))
            .ok()
    });
    unmount_on_signal(mountpoint.to_path_buf());
    // A duplicate of the session's device, for the invalidations whose
    // ENOENT matters (crate::inval): it lives as long as the notifier,
    // which holds the device too.
    let dev = std::os::fd::AsFd::as_fd(&session)
        .try_clone_to_owned()
        .map_err(|e| eprintln!("inkfs: duplicating /dev/fuse: {e} (invalidations sent once)"))
        .ok();
    on_ready(crate::inval::KernelSink::new(session.notifier(), dev));
    let daemon = notify.daemonised();
    notify.ready();
    if daemon {
        detach_stdio();
    }
    match session.run() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("inkfs: session ended: {e}");
            1
        }
    }
}

/// Prepare the mount point (clear a dead mount, canonicalise).
pub fn prepare_mountpoint(mountpoint: &Path) -> Result<PathBuf, String> {
    if clear_dead_mount(mountpoint)? {
        eprintln!(
            "inkfs: {}: detached the mount of a dead server",
            mountpoint.display()
        );
    }
    let mnt = mountpoint
        .canonicalize()
        .map_err(|e| format!("{}: {e}", mountpoint.display()))?;
    if !mnt.is_dir() {
        return Err(format!("{}: not a directory", mnt.display()));
    }
    // Stacking a second server on a live one would hide it and take over
    // its statistics socket.
    if let Some(Ok(report)) = crate::stat_mountpoint(&mnt, true) {
        let pid = serde_json::from_str::<serde_json::Value>(&report)
            .ok()
            .and_then(|v| v["pid"].as_u64())
            .map_or("?".to_string(), |p| p.to_string());
        return Err(format!(
            "{}: already an inkfs mount (server pid {pid})",
            mnt.display()
        ));
    }
    Ok(mnt)
}

/// What each consistency mode promises, in a few words (docs/MODES.md).
fn mode_meaning(mode: Mode) -> &'static str {
    match mode {
        Mode::Strict => "every call durable and atomic when it returns",
        Mode::Sync => "every call durable when it returns; overwrites in place",
        Mode::Posix => "writes durable at fsync, metadata on return",
    }
}

/// What the kernel caches, in a few words, for the statistics report.
fn caching_meaning(c: Caching) -> &'static str {
    if c.writeback {
        "writes land in the kernel's page cache; written back at fsync, sync, close \
         or by the kernel's flusher, each write-back durable when answered"
    } else {
        "every write goes to the server, which answers once it is done"
    }
}

/// Serve `engine` per `cfg` (pool claimed, mount point prepared), then
/// hand the engine to `finish` for its clean unmount. `info` fields go
/// into the statistics report.
pub fn run_engine(
    engine: Engine,
    cfg: &MountConfig,
    mnt: &Path,
    info: Vec<Field>,
    notify: &mut Notify,
    finish: impl FnOnce(Engine) -> Result<(), String>,
) -> i32 {
    let engine = Arc::new(engine);
    let stats = Arc::new(Stats::default());
    let caching = cfg.caching();
    let inval = Arc::new(Invalidator::default());
    let leases = crate::lease::Leases::new(&engine, inval.clone());
    let mut adapter = InkFuse::new(engine.clone(), stats.clone(), caching, inval.clone());
    adapter.set_leases(leases.clone());
    let leases_held = Arc::downgrade(&leases);
    let refs = adapter.kernel_refs();
    inval.track(refs.clone());
    let refs_held = Arc::downgrade(&refs);
    let opens_held = Arc::downgrade(&adapter.kernel_opens());
    let attach = AttachService::new(&engine, cfg.mode, leases, refs, stats.clone())
        .map_err(|e| eprintln!("inkfs: attach: {e} (continuing without)"))
        .ok()
        .map(Arc::new);
    let handler: Handler = {
        // Weak: the stats thread is never joined, and must not keep the
        // engine from its clean unmount.
        let engine = Arc::downgrade(&engine);
        let stats = stats.clone();
        let mut fields = vec![
            Field::text("mountpoint", "mount point", mnt.display().to_string()),
            Field::text("pool", "pool", cfg.pool.display().to_string()),
            Field::count("pid", "server pid", std::process::id().into()),
            Field::text("mode", "consistency mode", cfg.mode.name())
                .explained(mode_meaning(cfg.mode)),
            Field::flag("read_only", "read-only", cfg.read_only, "yes", "no"),
            Field::count("threads", "FUSE threads", cfg.threads as u64),
            Field::flag(
                "writeback_cache",
                "writeback cache",
                caching.writeback,
                "on",
                "off",
            )
            .explained(caching_meaning(caching)),
            Field::flag(
                "kernel_open",
                "files opened by the kernel",
                caching.kernel_open,
                "yes (no OPEN/RELEASE)",
                "no",
            ),
            Field::flag(
                "no_xattr",
                "extended attributes",
                caching.no_xattr,
                "off (noxattr)",
                "on",
            ),
        ];
        fields.extend(info);
        let attached = attach.clone();
        let inval = Arc::downgrade(&inval);
        let report = move |json: bool| {
            let mut lines = fields.clone();
            if let Some(inval) = inval.upgrade() {
                let (sent, failed) = inval.counts();
                lines.push(
                    Field::count("invalidations", "cache invalidations sent", sent)
                        .explained("changes the kernel did not make, pushed to its caches"),
                );
                lines.push(Field::count(
                    "invalidations_failed",
                    "cache invalidations refused",
                    failed,
                ));
                let (retried, unreached) = inval.landings();
                lines.push(
                    Field::count(
                        "invalidations_retried",
                        "cache invalidations sent again",
                        retried,
                    )
                    .explained("the kernel was taking the inode in from a reply"),
                );
                lines.push(
                    Field::count(
                        "invalidations_unreached",
                        "cache invalidations given up",
                        unreached,
                    )
                    .explained("should stay 0"),
                );
            }
            if let Some(engine) = engine.upgrade() {
                let s = engine.statfs();
                let bs = s.block_size as u64;
                lines.push(Field::bytes("block_size", "block size", bs));
                lines.push(Field::bytes("bytes_total", "space total", s.blocks * bs));
                lines.push(Field::bytes("bytes_free", "space free", s.blocks_free * bs));
                lines.push(Field::count("inodes_total", "inodes total", s.files));
                lines.push(Field::count("inodes_free", "inodes free", s.files_free));
                if s.data_blocks > 0 {
                    let pm = (s.blocks - s.data_blocks, s.blocks_free - s.data_blocks_free);
                    lines.push(Field::bytes("pm_bytes_total", "PM space total", pm.0 * bs));
                    lines.push(Field::bytes("pm_bytes_free", "PM space free", pm.1 * bs));
                    lines.push(Field::bytes(
                        "data_bytes_total",
                        "data device space total",
                        s.data_blocks * bs,
                    ));
                    lines.push(Field::bytes(
                        "data_bytes_free",
                        "data device space free",
                        s.data_blocks_free * bs,
                    ));
                }
                lines.extend(crate::serve::report_fields(&engine));
                lines.push(
                    Field::count(
                        "limbo_blocks",
                        "freed blocks held for clients",
                        engine.limbo_blocks(),
                    )
                    .explained(
                        "return to the free lists when no attached client can be reading them",
                    ),
                );
                lines.push(
                    Field::count(
                        "held_orphans",
                        "unlinked files only clients hold open",
                        engine.held_orphans() as u64,
                    )
                    .explained("freed when the last client holding each lets it go or ends"),
                );
                lines.push(
                    Field::count(
                        "frees_refused",
                        "frees refused (double frees)",
                        engine.frees_refused(),
                    )
                    .explained("a bug if not 0: each is logged on the server's stderr"),
                );
            }
            if let Some(a) = &attached {
                lines.push(
                    Field::count("clients_attached", "attached clients", a.attached() as u64)
                        .explained("processes reading the pool directly (inkfs::api::client)"),
                );
            }
            if let Some(opens) = opens_held.upgrade().filter(|_| caching.kernel_open) {
                lines.push(
                    Field::count(
                        "kernel_open_files",
                        "files the kernel has open",
                        opens.held() as u64,
                    )
                    .explained("one engine handle each, released when the kernel forgets the file"),
                );
            }
            if let Some(refs) = refs_held.upgrade() {
                lines.push(
                    Field::count(
                        "kernel_pins",
                        "removed inodes the kernel holds",
                        refs.pinned(),
                    )
                    .explained("kept from reuse until the kernel forgets them"),
                );
                lines.push(Field::count(
                    "kernel_refs",
                    "inodes the kernel refers to",
                    refs.known(),
                ));
                let negatives = refs.negatives();
                lines.push(
                    Field::count(
                        "root_negative_names",
                        "negative names recorded under the root",
                        negatives.len() as u64,
                    )
                    .explained(if negatives.zero_ttl() {
                        "overflowed: negative lookups under the root uncached"
                    } else {
                        "dropped at a lease of the root"
                    }),
                );
                lines.push(
                    Field::count(
                        "kernel_refs_mismatched",
                        "FORGETs of more than was counted",
                        refs.mismatches(),
                    )
                    .explained("should stay 0"),
                );
                let (rechecked, withdrawn) = refs.races();
                lines.push(
                    Field::count(
                        "kernel_refs_rechecked",
                        "entries checked again after a client's removal",
                        rechecked,
                    )
                    .explained("replies racing a removal of the library's"),
                );
                lines.push(Field::count(
                    "kernel_refs_withdrawn",
                    "entries withdrawn (removed meanwhile)",
                    withdrawn,
                ));
                let (skipped, refreshed) = refs.skips();
                lines.push(
                    Field::count(
                        "invalidations_skipped",
                        "cache invalidations not needed",
                        skipped,
                    )
                    .explained("a client's changes of what the kernel does not hold"),
                );
                lines.push(Field::count(
                    "kernel_refs_refreshed",
                    "entries read again after a skipped invalidation",
                    refreshed,
                ));
            }
            if let Some(l) = leases_held.upgrade() {
                let (files, dirs) = l.held();
                lines.push(
                    Field::count("leases_held", "write leases held", files as u64)
                        .explained("files attached clients write themselves now"),
                );
                lines.push(
                    Field::count("dir_leases_held", "directory leases held", dirs as u64)
                        .explained("directories leased to attached clients now"),
                );
                let (granted, recalled, refused) = l.dirs.counts();
                lines.push(Field::count(
                    "dir_leases_granted",
                    "directory leases granted",
                    granted,
                ));
                lines.push(Field::count(
                    "dir_leases_recalled",
                    "directory leases recalled",
                    recalled,
                ));
                for (why, n) in refused {
                    lines.push(Field::count(
                        crate::dirlease::refusal_key(why),
                        crate::dirlease::refusal_label(why),
                        n,
                    ));
                }
                let (leased, given_back, reaped, kept, refused) = l.lanes.counts();
                lines.push(
                    Field::count("lanes_leased", "lanes leased", leased)
                        .explained("with directory leases, to clients that asked"),
                );
                lines.push(Field::count(
                    "lanes_given_back",
                    "lanes given back",
                    given_back,
                ));
                lines.push(
                    Field::count("lanes_reaped", "lanes reaped", reaped)
                        .explained("of clients that died holding one"),
                );
                lines.push(
                    Field::count(
                        "lane_slots_given",
                        "lane slots given by `slots`",
                        l.lanes.slots_given(),
                    )
                    .explained("beyond each grant's, to clients that ran out"),
                );
                lines.push(
                    Field::count("lanes_returns_refused", "lane returns refused", refused)
                        .explained("the client's session was ended for it"),
                );
                lines.push(
                    Field::count(
                        "lane_settles_failed",
                        "lane settles failed",
                        l.lanes.failures(),
                    )
                    .explained("blocks kept from the free lists until fsck; stderr says why"),
                );
                lines.push(
                    Field::count(
                        "dir_files_kept",
                        "files kept at a directory's give-back",
                        kept,
                    )
                    .explained("made under a directory lease, leased as files after it"),
                );
                let (removed, orphans, slots, refused) = l.lanes.removals();
                lines.push(
                    Field::count("lane_unlinks", "unlinks made by clients", removed)
                        .explained("under directory leases, told at each give-back"),
                );
                lines.push(
                    Field::count("lane_orphans_adopted", "client orphans adopted", orphans)
                        .explained("removed by a client, held open by another process"),
                );
                lines.push(
                    Field::count("lane_slots_freed", "client-removed inodes freed", slots)
                        .explained("older files a client removed (`slot`)"),
                );
                lines.push(Field::count(
                    "lane_removals_refused",
                    "`orphan` or `slot` refused",
                    refused,
                ));
                let (released, given) = l.give_backs();
                lines.push(
                    Field::count(
                        "leases_released",
                        "write leases given back by `released`",
                        released,
                    )
                    .explained("on a client's session: recalls' answers"),
                );
                lines.push(
                    Field::count(
                        "leases_given_with_requests",
                        "write leases given back with a removal",
                        given,
                    )
                    .explained("no message of their own"),
                );
            }
            stats.report(&lines, json)
        };
        // One arm per request type (the protocol: stats.rs).
        Arc::new(move |req: &Request| match req.word.as_str() {
            "text" => Ok(report(false)),
            "json" => Ok(report(true)),
            other => Err(format!("unknown request '{other}' (known: text, json)")),
        })
    };
    let scrubs = ScrubService::new(&engine);
    let mut takers = vec![(crate::scrub::REQUEST, scrubs.handler())];
    if let Some(a) = &attach {
        takers.push((inkfs::api::attach::REQUEST, a.handler()));
    }
    let takers = Arc::new(takers);
    let mut server = None;
    let code = serve_session(
        adapter,
        mnt,
        &cfg.fuser_config(),
        cfg.poll.then(|| stats.requests.clone()),
        notify,
        |notifier| {
            inval.attach(notifier);
            match StatsServer::start(&run_dir(), mnt, cfg.stats_access, handler, takers) {
                Ok(s) => server = Some(s),
                Err(e) => eprintln!("inkfs: statistics socket: {e} (continuing without)"),
            }
        },
    );
    drop(server);
    inval.shutdown();
    // Attached clients' sessions end (they see the end of file), and
    // nothing of the attach service touches the engine any more.
    if let Some(a) = &attach {
        a.shutdown();
    }
    // A running scrub holds the engine: stop it before taking it back.
    scrubs.shutdown();
    // The session and the stats server are gone: this is the last reference.
    let engine = match Arc::try_unwrap(engine) {
        Ok(e) => e,
        Err(_) => {
            eprintln!("inkfs: engine still referenced at unmount; not unmounted cleanly");
            return 1;
        }
    };
    match finish(engine) {
        Ok(()) => code,
        Err(e) => {
            eprintln!("inkfs: unmount: {e}");
            1
        }
    }
}

/// `inkfs mount ...`: mount, and serve in the background (or, with `-f`,
/// here until unmounted). Returns the exit status: 0, 1 on failure, 2 for
/// refused options (which the argument parser has checked already).
pub fn mount_main(args: &MountArgs) -> i32 {
    let cfg = match MountConfig::from_args(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("inkfs mount: {e} (try 'inkfs mount --help')");
            return 2;
        }
    };
    let foreground = cfg.foreground;
    daemonize(foreground, move |mut notify| {
        block_term_signals();
        // Claim the pool before touching the mount point: a pool that
        // another process has open is refused, naming it. The claim lives
        // in the mapped pool and goes with this process.
        let pool = match crate::serve::open_pool(&cfg) {
            Ok(p) => p,
            Err(e) => {
                notify.fail(&e);
                return 1;
            }
        };
        let mnt = match prepare_mountpoint(&cfg.mountpoint) {
            Ok(m) => m,
            Err(e) => {
                notify.fail(&e);
                return 1;
            }
        };
        crate::serve::serve_pool(&cfg, &mnt, &mut notify, pool)
    })
}
