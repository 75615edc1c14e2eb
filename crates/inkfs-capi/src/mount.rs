//! `inkfs_t`: a pool mounted in this process, its descriptor table and
//! the credentials its calls are made with; mkfs, mount, unmount, and the
//! calls that set credentials.

use std::ffi::{c_char, c_int, c_uint, OsStr};
use std::ops::Deref;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::{Arc, RwLock};

use inkfs::api::{
    Credentials, DataDevice, Error, ErrorsPolicy, Filesystem, FormatOptions, Mode, MountOptions,
    ROOT_INO,
};
use inkfs::pmem::PoolBusy;

use crate::boundary::{cstr, cstr_opt, fail, ffi, last_error, load, record_error, CResult, Errno};
use crate::ofd::Ofd;
use crate::table::FdTable;

/// A mounted pool (`inkfs_t` in C).
pub struct Mount {
    pub(crate) fs: Filesystem,
    cred: RwLock<Arc<Credentials>>,
    pub(crate) fds: FdTable,
    /// st_dev of every inode, f_fsid: from the pool's UUID.
    pub(crate) dev: u64,
}

/// How `inkfs_mount_ex` (and `inkfs_mount`: the first three fields only)
/// mounts a pool. A NULL `opts` is all zeros: strict mode, read-write,
/// errors=remount-ro, a hybrid pool's data device where mkfs recorded it.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MountOpts {
    /// INKFS_MODE_STRICT, INKFS_MODE_SYNC or INKFS_MODE_POSIX
    /// (docs/MODES.md).
    pub mode: c_int,
    /// Non-zero: mount read-only (shares the pool with other read-only
    /// mounts; every change fails with EROFS).
    pub read_only: c_int,
    /// INKFS_ERRORS_REMOUNT_RO or INKFS_ERRORS_CONTINUE: what corruption
    /// met while mounted does besides failing the call with EIO.
    pub errors: c_int,
    /// A hybrid pool's data device (block device or file), when it is not
    /// at the path recorded at mkfs (it moved); NULL: the recorded path.
    /// Read by `inkfs_mount_ex` only: `inkfs_mount` keeps reading the
    /// first three fields, as programs built before this field pass.
    pub data: *const c_char,
}

impl Default for MountOpts {
    fn default() -> MountOpts {
        MountOpts {
            mode: INKFS_MODE_STRICT,
            read_only: 0,
            errors: INKFS_ERRORS_REMOUNT_RO,
            data: std::ptr::null(),
        }
    }
}

/// `inkfs_options` as libinkfs.so.0 first shipped it (three ints): what
/// `inkfs_mount` reads, so that a program built against that header,
/// whose struct is this long, never has bytes past it read.
#[repr(C)]
#[derive(Clone, Copy)]
struct MountOptsV0 {
    mode: c_int,
    read_only: c_int,
    errors: c_int,
}

/// The size of `inkfs_options` in the first header: the smallest
/// `opts_size` `inkfs_mount_ex` takes.
pub const INKFS_OPTIONS_SIZE_V0: usize = 12;
const _: () = assert!(std::mem::size_of::<MountOptsV0>() == INKFS_OPTIONS_SIZE_V0);
const _: () = assert!(std::mem::offset_of!(MountOpts, errors) == 8);
const _: () = assert!(std::mem::offset_of!(MountOpts, data) >= INKFS_OPTIONS_SIZE_V0);

impl From<MountOptsV0> for MountOpts {
    fn from(v: MountOptsV0) -> MountOpts {
        MountOpts {
            mode: v.mode,
            read_only: v.read_only,
            errors: v.errors,
            data: std::ptr::null(),
        }
    }
}

/// The caller's options of `size` bytes (`sizeof(inkfs_options)` of the
/// header it was built with), as openat2(2) reads its `struct open_how`:
/// the first release's three fields at least (smaller: EINVAL); fields the
/// caller's struct does not have are zero; bytes past the struct this
/// library knows must be zero (E2BIG otherwise: an option it cannot
/// honour). A size that ends inside `data` is EINVAL.
fn load_sized(opts: *const MountOpts, size: usize) -> CResult<MountOpts> {
    if opts.is_null() {
        return Ok(MountOpts::default());
    }
    let full = std::mem::size_of::<MountOpts>();
    if size < INKFS_OPTIONS_SIZE_V0 || (size < full && size > std::mem::offset_of!(MountOpts, data))
    {
        return fail(libc::EINVAL);
    }
    if size > full {
        // SAFETY: the caller passes `size` readable bytes at `opts`.
        let tail = unsafe { std::slice::from_raw_parts(opts.cast::<u8>().add(full), size - full) };
        if tail.iter().any(|&b| b != 0) {
            return fail(libc::E2BIG);
        }
    }
    if size < full {
        // The first release's struct: reading more would read past it.
        return Ok(load(opts.cast::<MountOptsV0>())
            .map(MountOpts::from)
            .unwrap_or_default());
    }
    Ok(load(opts).unwrap_or_default())
}

/// Every call durable and atomic on return (data copy-on-write).
pub const INKFS_MODE_STRICT: c_int = 0;
/// Every call durable on return; overwrites in place (not atomic).
pub const INKFS_MODE_SYNC: c_int = 1;
/// Metadata atomic and durable; file data durable at fsync/fdatasync.
pub const INKFS_MODE_POSIX: c_int = 2;
/// On corruption, turn read-only (later changes fail with EROFS).
pub const INKFS_ERRORS_REMOUNT_RO: c_int = 0;
/// On corruption, keep serving; only the damaged objects fail.
pub const INKFS_ERRORS_CONTINUE: c_int = 1;

impl MountOpts {
    fn engine(&self) -> CResult<MountOptions> {
        let mode = match self.mode {
            INKFS_MODE_STRICT => Mode::Strict,
            INKFS_MODE_SYNC => Mode::Sync,
            INKFS_MODE_POSIX => Mode::Posix,
            _ => return fail(libc::EINVAL),
        };
        let errors = match self.errors {
            INKFS_ERRORS_REMOUNT_RO => ErrorsPolicy::RemountRo,
            INKFS_ERRORS_CONTINUE => ErrorsPolicy::Continue,
            _ => return fail(libc::EINVAL),
        };
        Ok(MountOptions {
            mode,
            read_only: self.read_only != 0,
            errors,
            // NULL: a hybrid pool's data device is found where mkfs
            // recorded it.
            data: cstr_opt(self.data)?.map(|p| DataDevice::Path(path_of(p).to_path_buf())),
            ..Default::default()
        })
    }
}

/// An open file description borrowed for one call; given back (and the
/// file closed, if this was its last reference) when dropped.
pub(crate) struct OpenRef<'m> {
    mount: &'m Mount,
    ofd: Option<Arc<Ofd>>,
}

impl Deref for OpenRef<'_> {
    type Target = Ofd;
    fn deref(&self) -> &Ofd {
        // Some until drop.
        self.ofd
            .as_deref()
            .expect("an OpenRef holds its description")
    }
}

impl OpenRef<'_> {
    pub(crate) fn arc(&self) -> Arc<Ofd> {
        self.ofd.clone().expect("an OpenRef holds its description")
    }
}

impl Drop for OpenRef<'_> {
    fn drop(&mut self) {
        if let Some(ofd) = self.ofd.take() {
            self.mount.put(ofd);
        }
    }
}

impl Mount {
    /// The description `fd` names, for the length of a call.
    pub(crate) fn fd(&self, fd: c_int) -> CResult<OpenRef<'_>> {
        Ok(OpenRef {
            mount: self,
            ofd: Some(self.fds.get(fd)?),
        })
    }

    /// Drop a reference to a description; the last one closes the file
    /// (the last close of an unlinked file frees it).
    pub(crate) fn put(&self, ofd: Arc<Ofd>) {
        if let Some(ofd) = Arc::into_inner(ofd) {
            self.fs.release(ofd.file);
        }
    }

    /// A new descriptor for `ofd` (closed again if none is free).
    pub(crate) fn insert(&self, ofd: Arc<Ofd>, min: c_int, fd_flags: i32) -> CResult<c_int> {
        match self.fds.insert(ofd.clone(), min, fd_flags) {
            Ok(fd) => {
                drop(ofd);
                Ok(fd)
            }
            Err(e) => {
                self.put(ofd);
                Err(e)
            }
        }
    }

    /// The credentials calls are made with now.
    pub(crate) fn cred(&self) -> Arc<Credentials> {
        self.cred.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set_cred(&self, c: Credentials) {
        *self.cred.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(c);
    }

    /// The inode a *at call's `dirfd` names: the pool's root for
    /// AT_FDCWD, and for an absolute path (which ignores it, as Linux).
    pub(crate) fn at(&self, dirfd: c_int, path: &[u8]) -> CResult<u64> {
        if dirfd == libc::AT_FDCWD || path.first() == Some(&b'/') {
            return Ok(ROOT_INO);
        }
        let d = self.fd(dirfd)?;
        if !d.is_dir() {
            return fail(libc::ENOTDIR);
        }
        Ok(d.file.ino())
    }
}

/// The handle behind a caller's `inkfs_t *` (EINVAL if NULL).
pub(crate) fn mount<'a>(p: *const Mount) -> CResult<&'a Mount> {
    if p.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: a non-NULL `inkfs_t *` is one inkfs_mount returned
    // (Arc::into_raw) and not yet given to inkfs_unmount: the header's
    // contract. The Mount lives until that unmount.
    Ok(unsafe { &*p })
}

/// A new strong reference to the caller's mount (a directory stream keeps
/// one, so that unmount refuses while it is open).
pub(crate) fn mount_arc(p: *const Mount) -> CResult<Arc<Mount>> {
    mount(p)?;
    // SAFETY: `p` came from Arc::into_raw in inkfs_mount and that
    // reference is still held (not unmounted: the contract above), so the
    // count is at least one while we add ours.
    unsafe {
        Arc::increment_strong_count(p);
        Ok(Arc::from_raw(p))
    }
}

fn path_of(bytes: &[u8]) -> &Path {
    Path::new(OsStr::from_bytes(bytes))
}

/// The errno of a failed mount, mkfs or unmount, its message kept for
/// inkfs_last_error.
fn pool_error(e: Error) -> Errno {
    record_error(&e.to_string());
    match &e {
        Error::Io(io) if PoolBusy::of(io).is_some() => Errno(libc::EBUSY),
        // The pool layer's own refusals carry a kind, not an OS errno.
        Error::Io(io) if io.raw_os_error().is_none() => Errno(match io.kind() {
            std::io::ErrorKind::AlreadyExists => libc::EEXIST,
            std::io::ErrorKind::NotFound => libc::ENOENT,
            std::io::ErrorKind::PermissionDenied => libc::EACCES,
            std::io::ErrorKind::InvalidInput => libc::EINVAL,
            std::io::ErrorKind::WouldBlock => libc::EBUSY,
            _ => libc::EIO,
        }),
        Error::BadPool(_) => Errno(libc::EINVAL),
        _ => Errno::from(e),
    }
}

fn device_number(uuid: &[u8; 16]) -> u64 {
    let (a, b) = uuid.split_at(8);
    let word = |s: &[u8]| u64::from_le_bytes(s.try_into().unwrap_or([0; 8]));
    word(a) ^ word(b)
}

/// Create a pool file of `size_bytes` at `pool` (mode 0600; it must not
/// exist: EEXIST, whatever it holds) and lay out an empty file system on it with `lanes` lanes (0:
/// one per online CPU). The root directory is owned by the calling
/// process's effective uid and gid, mode 0755. Returns 0, or -1 with
/// errno (inkfs_last_error() says why).
#[no_mangle]
pub unsafe extern "C" fn inkfs_mkfs(pool: *const c_char, size_bytes: u64, lanes: c_uint) -> c_int {
    ffi(-1, || {
        let path = cstr(pool)?;
        // SAFETY: geteuid/getegid cannot fail and touch no memory.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let opts = FormatOptions {
            lanes,
            root_uid: uid,
            root_gid: gid,
            root_mode: 0o755,
        };
        // Created here, exclusively: the engine's create_pool would also
        // format an existing file of the same size, and mkfs must never
        // overwrite what is there.
        let path = path_of(path);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| pool_error(Error::Io(e)))?;
        if let Err(e) = Filesystem::create_pool(path, size_bytes, &opts) {
            let _ = std::fs::remove_file(path);
            return Err(pool_error(e));
        }
        Ok(0)
    })
}

/// Mount the pool at `pool` (a file on /dev/shm, hugetlbfs or a DAX file
/// system, or a /dev/daxX.Y device) in this process: recovers it if it
/// crashed. The pool is claimed for as long as it is mounted: a pool
/// mounted read-write by another process (or by another inkfs_mount in
/// this one, or served by `inkfs mount`) is refused with EBUSY, and so is
/// a read-write mount of a pool mounted read-only elsewhere; the claim is
/// released by inkfs_unmount or when the process dies, even by SIGKILL.
/// Calls are made with the calling process's effective uid, gid,
/// supplementary groups and umask as they are now (see
/// inkfs_set_credentials). Returns the handle, or NULL with errno: EBUSY
/// (in use), EINVAL (not an inkfs pool, or a version or state this library
/// cannot mount, e.g. one that needs fsck), ENOENT, EACCES, EIO...;
/// inkfs_last_error() says why.
///
/// Reads the first three fields of `opts` (`mode`, `read_only`, `errors`)
/// only; `inkfs_mount_ex` reads them all.
#[no_mangle]
pub unsafe extern "C" fn inkfs_mount(pool: *const c_char, opts: *const MountOpts) -> *mut Mount {
    ffi(std::ptr::null_mut(), || {
        let v0 = load(opts.cast::<MountOptsV0>()).map(MountOpts::from);
        mount_with(pool, v0.unwrap_or_default())
    })
}

/// inkfs_mount with every field of `opts`, among them `data` (a hybrid
/// pool's data device that moved). `opts_size` is `sizeof(inkfs_options)`
/// as the caller's header has it: a program built against an older header
/// keeps working with a library whose struct grew (its missing fields are
/// zero), and one built against a newer header is refused with E2BIG when
/// it sets a field this library does not know. EINVAL: `opts_size` below
/// INKFS_OPTIONS_SIZE_V0, or a bad field. A data device that is missing or
/// is not the pool's is EINVAL, inkfs_last_error() saying which.
#[no_mangle]
pub unsafe extern "C" fn inkfs_mount_ex(
    pool: *const c_char,
    opts: *const MountOpts,
    opts_size: usize,
) -> *mut Mount {
    ffi(std::ptr::null_mut(), || {
        mount_with(pool, load_sized(opts, opts_size)?)
    })
}

fn mount_with(pool: *const c_char, opts: MountOpts) -> CResult<*mut Mount> {
    {
        let path = cstr(pool)?;
        let opts = opts.engine()?;
        let fs = Filesystem::open_pool(path_of(path), opts).map_err(pool_error)?;
        let dev = device_number(&fs.summary().uuid);
        let m = Mount {
            fs,
            cred: RwLock::new(Arc::new(Credentials::current_process())),
            fds: FdTable::default(),
            dev,
        };
        Ok(Arc::into_raw(Arc::new(m)).cast_mut())
    }
}

/// Unmount: close every descriptor still open (the last close of an
/// unlinked file frees it), save the allocator, mark the pool clean and
/// release it. Fails with EBUSY, changing nothing, while a directory
/// stream (inkfs_dir_t) of this mount is open. Otherwise the handle is
/// gone when this returns, even on failure (EIO: the pool could not be
/// marked clean; it is recovered at its next mount). No other thread may
/// be inside a call on this handle, nor start one.
#[no_mangle]
pub unsafe extern "C" fn inkfs_unmount(fs: *mut Mount) -> c_int {
    ffi(-1, || {
        mount(fs)?;
        // SAFETY: `fs` came from Arc::into_raw in inkfs_mount and the
        // caller hands that reference back here (once, with no call on it
        // in flight: the contract above).
        let m = unsafe { Arc::from_raw(fs.cast_const()) };
        if Arc::strong_count(&m) > 1 {
            // Directory streams hold the others: give our reference back.
            let _ = Arc::into_raw(m);
            record_error("a directory stream of this mount is still open");
            return fail(libc::EBUSY);
        }
        for ofd in m.fds.drain() {
            m.put(ofd);
        }
        let m = match Arc::try_unwrap(m) {
            Ok(m) => m,
            Err(m) => {
                let _ = Arc::into_raw(m);
                record_error("a directory stream of this mount is still open");
                return fail(libc::EBUSY);
            }
        };
        m.fs.unmount().map_err(pool_error)?;
        Ok(0)
    })
}

/// Why this thread's last failed inkfs_mount, inkfs_mkfs or inkfs_unmount
/// failed, e.g. "pool in use by pid 4242 (inkfs mount /dev/shm/p /mnt)";
/// "" if none failed. Valid until the next such failure in this thread.
#[no_mangle]
pub extern "C" fn inkfs_last_error() -> *const c_char {
    ffi(c"".as_ptr(), || Ok(last_error()))
}

/// Make every later call on `fs` act as user `uid`, group `gid` with the
/// `ngroups` supplementary groups at `groups` (the umask is kept). The
/// library does not see setuid(2), setgid(2) or setgroups(2): a process
/// that changes its ids calls this, or inkfs_refresh_credentials. Checks
/// are made by the engine exactly as Linux makes them for a process with
/// these ids (uid 0: root, with every capability). Calls already running
/// finish with the old credentials.
#[no_mangle]
pub unsafe extern "C" fn inkfs_set_credentials(
    fs: *mut Mount,
    uid: libc::uid_t,
    gid: libc::gid_t,
    ngroups: usize,
    groups: *const libc::gid_t,
) -> c_int {
    ffi(-1, || {
        let m = mount(fs)?;
        let list = if ngroups == 0 {
            Vec::new()
        } else {
            if groups.is_null() {
                return fail(libc::EFAULT);
            }
            if ngroups > 65536 {
                return fail(libc::EINVAL);
            }
            // SAFETY: the caller passes `ngroups` gids at `groups` (not
            // NULL, checked; at most NGROUPS_MAX, checked).
            unsafe { std::slice::from_raw_parts(groups, ngroups) }.to_vec()
        };
        let umask = m.cred().umask;
        m.set_cred(Credentials {
            uid,
            gid,
            groups: list,
            umask,
        });
        Ok(0)
    })
}

/// Take the calling process's effective uid and gid, supplementary groups
/// and umask again (after it changed them).
#[no_mangle]
pub unsafe extern "C" fn inkfs_refresh_credentials(fs: *mut Mount) -> c_int {
    ffi(-1, || {
        mount(fs)?.set_cred(Credentials::current_process());
        Ok(0)
    })
}

/// Set the umask of files created through `fs` (the process's own umask(2)
/// is not changed, nor read again); returns the previous one. Never fails
/// for a valid handle; (mode_t)-1 with EINVAL for NULL.
#[no_mangle]
pub unsafe extern "C" fn inkfs_umask(fs: *mut Mount, mask: libc::mode_t) -> libc::mode_t {
    ffi(libc::mode_t::MAX, || {
        let m = mount(fs)?;
        let mut c = (*m.cred()).clone();
        let old = c.umask;
        c.umask = mask & 0o777;
        m.set_cred(c);
        Ok(old)
    })
}
