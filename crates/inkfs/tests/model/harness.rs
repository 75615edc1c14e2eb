//! The model test's harness: each operation applied to inkfs (an engine on
//! a simulated pool) and to the host's tmpfs side by side, and their
//! answers and resulting trees compared (model/main.rs runs it).

use super::*;

struct Handle {
    fd: OwnedFd,
    fh: FileHandle,
    real_ino: u64,
}

pub(super) struct Harness {
    mode: Mode,
    fs: Option<Fs<SimPool>>,
    base: PathBuf,
    base_fd: OwnedFd,
    handles: Vec<Handle>,
    /// Real inodes whose SEEK_DATA/SEEK_HOLE answers may differ (fallocated).
    inexact_seek: HashSet<u64>,
}

pub(super) static STATS: std::sync::Mutex<BTreeMap<(String, String), u64>> =
    std::sync::Mutex::new(BTreeMap::new());
static CASE: AtomicU64 = AtomicU64::new(0);

impl Harness {
    pub(super) fn new(mode: Mode) -> Harness {
        unsafe { libc::umask(0) };
        let base = PathBuf::from(format!(
            "/dev/shm/inkfs-model-{}-{}-{}",
            std::process::id(),
            mode.name(),
            CASE.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir(&base).unwrap();
        std::fs::set_permissions(&base, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let c = cstr(base.as_os_str().as_bytes());
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        assert!(fd >= 0);
        let pm = SimPool::new(POOL_BYTES);
        Fs::format(
            &pm,
            &FormatOptions {
                lanes: 2,
                root_mode: 0o755,
                ..Default::default()
            },
        )
        .unwrap();
        let fs = Fs::mount(
            pm,
            MountOptions {
                mode,
                read_only: false,
                ..Default::default()
            },
        )
        .unwrap();
        Harness {
            mode,
            fs: Some(fs),
            base,
            base_fd: unsafe { OwnedFd::from_raw_fd(fd) },
            handles: Vec::new(),
            inexact_seek: HashSet::new(),
        }
    }

    fn fs(&self) -> &Fs<SimPool> {
        self.fs.as_ref().unwrap()
    }

    // --- path resolution -------------------------------------------------

    fn real_dir(&self, dir: &[u8]) -> Result<OwnedFd, i32> {
        let mut fd = unsafe { libc::dup(self.base_fd.as_raw_fd()) };
        assert!(fd >= 0);
        for &c in dir {
            let n = cstr(&name_bytes(c));
            let next = unsafe {
                libc::openat(
                    fd,
                    n.as_ptr(),
                    libc::O_PATH | libc::O_NOFOLLOW | libc::O_DIRECTORY | libc::O_CLOEXEC,
                )
            };
            let e = errno_now();
            unsafe { libc::close(fd) };
            if next < 0 {
                return Err(e);
            }
            fd = next;
        }
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn real_path(&self, dir: &[u8], name: Name) -> PathBuf {
        let mut p = self.base.clone();
        for &c in dir {
            p.push(std::ffi::OsStr::from_bytes(&name_bytes(c)));
        }
        p.push(std::ffi::OsStr::from_bytes(&name_bytes(name)));
        p
    }

    /// inkfs: the inode of `dir` (lookups only; the final call decides
    /// whether it is a directory, as a FUSE request would).
    fn eng_dir(&self, dir: &[u8]) -> Result<u64, i32> {
        let mut ino = ROOT_INO;
        for &c in dir {
            ino = eng(self.fs().lookup_ino(ino, &name_bytes(c)))?;
        }
        Ok(ino)
    }

    /// `eng_dir`, failing with ENOTDIR at once if it is not a directory
    /// (for two-path calls, where the VFS resolves both parents fully
    /// before the file system sees the request).
    fn eng_dir_checked(&self, dir: &[u8]) -> Result<u64, i32> {
        let ino = self.eng_dir(dir)?;
        if eng(self.fs().getattr(ino))?.kind != FileKind::Dir {
            return Err(libc::ENOTDIR);
        }
        Ok(ino)
    }

    fn eng_node(&self, dir: &[u8], name: Name) -> Result<u64, i32> {
        let p = self.eng_dir(dir)?;
        eng(self.fs().lookup_ino(p, &name_bytes(name)))
    }

    // --- one step --------------------------------------------------------

    /// Every existing (parent path, name) of the reference, in walk order.
    fn existing(&self) -> Vec<(DirPath, Name, bool)> {
        fn walk(dir: &Path, path: &DirPath, out: &mut Vec<(DirPath, Name, bool)>) {
            let mut names: Vec<_> = std::fs::read_dir(dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().as_bytes().to_vec())
                .collect();
            names.sort();
            for n in names {
                let Some(idx) = (0..6u8).find(|&i| name_bytes(i) == n) else {
                    continue;
                };
                let p = dir.join(std::ffi::OsStr::from_bytes(&n));
                let is_dir = std::fs::symlink_metadata(&p).unwrap().is_dir();
                out.push((path.clone(), idx, is_dir));
                if is_dir {
                    let mut sub = path.clone();
                    sub.push(idx);
                    walk(&p, &sub, out);
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.base, &vec![], &mut out);
        out
    }

    /// Replace selectors (`SEL + s`) by paths that exist now.
    fn concretize(&self, op: &Op) -> Op {
        let ex = self.existing();
        let dirs: Vec<DirPath> = std::iter::once(vec![])
            .chain(
                ex.iter()
                    .filter(|(p, _, d)| *d && p.len() < 2)
                    .map(|(p, n, _)| {
                        let mut v = p.clone();
                        v.push(*n);
                        v
                    }),
            )
            .collect();
        let dir = |d: &DirPath| -> DirPath {
            match d.as_slice() {
                [s] if *s >= SEL => dirs[(*s - SEL) as usize % dirs.len()].clone(),
                _ => d.clone(),
            }
        };
        let node = |d: &DirPath, n: Name| -> (DirPath, Name) {
            if n >= SEL {
                if ex.is_empty() {
                    return (vec![], 0);
                }
                let (p, n, _) = &ex[(n - SEL) as usize % ex.len()];
                (p.clone(), *n)
            } else {
                (dir(d), n)
            }
        };
        let mut op = op.clone();
        match &mut op {
            Op::Create(d, ..) | Op::Mkdir(d, ..) | Op::Mknod(d, ..) | Op::Symlink(d, ..) => {
                *d = dir(d)
            }
            Op::Link(d1, n1, d2, _) => {
                (*d1, *n1) = node(d1, *n1);
                *d2 = dir(d2);
            }
            Op::Rename(d1, n1, d2, _, _) => {
                (*d1, *n1) = node(d1, *n1);
                *d2 = dir(d2);
            }
            Op::Unlink(d, n)
            | Op::Rmdir(d, n)
            | Op::Open(d, n)
            | Op::Stat(d, n)
            | Op::Readlink(d, n)
            | Op::Chmod(d, n, _)
            | Op::Chown(d, n, ..)
            | Op::Utimens(d, n, _)
            | Op::Truncate(d, n, _)
            | Op::SetXattr(d, n, ..)
            | Op::GetXattr(d, n, _)
            | Op::RemoveXattr(d, n, _) => (*d, *n) = node(d, *n),
            _ => {}
        }
        op
    }

    pub(super) fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let op = &self.concretize(op);
        let (real, engine) = match op {
            Op::CleanRemount => {
                self.clean_remount()?;
                (Ok(Out::Unit), Ok(Out::Unit))
            }
            Op::CrashRemount => {
                self.crash_remount()?;
                (Ok(Out::Unit), Ok(Out::Unit))
            }
            Op::Write(..)
            | Op::Append(..)
            | Op::Read(..)
            | Op::CopyRange(..)
            | Op::Ftruncate(..)
            | Op::Fallocate(..)
            | Op::Seek(..)
            | Op::Fsync(..)
            | Op::Fstat(..)
            | Op::Release(..) => self.handle_op(op)?,
            _ => {
                let r = self.real_op(op);
                let e = self.eng_op(op);
                (r, e)
            }
        };
        if !equivalent(op, &real, &engine) {
            return Err(TestCaseError::fail(format!(
                "{op:?}: tmpfs {real:?} (errno {}), inkfs {engine:?} (errno {})",
                real.as_ref().err().map_or("-".into(), |e| errname(*e)),
                engine.as_ref().err().map_or("-".into(), |e| errname(*e)),
            )));
        }
        if std::env::var_os("INKFS_MODEL_STATS").is_some() {
            let kind = format!("{op:?}");
            let kind = kind.split('(').next().unwrap().to_string();
            let res = match &real {
                Ok(Out::Skip) => "skip".to_string(),
                Ok(_) => "ok".to_string(),
                Err(e) => format!("E{e}"),
            };
            *STATS.lock().unwrap().entry((kind, res)).or_default() += 1;
        }
        self.after_create(op, &real, &engine)?;
        self.compare_all()
            .map_err(|m| TestCaseError::fail(format!("after {op:?}: {m}")))
    }

    /// Create/Open returned a handle on both sides: keep it (or drop it when
    /// the handful is held already).
    fn after_create(&mut self, op: &Op, real: &R, engine: &R) -> Result<(), TestCaseError> {
        let (dir, name) = match op {
            Op::Create(d, n, _) | Op::Open(d, n) => (d, *n),
            _ => return Ok(()),
        };
        if let (Ok(Out::Num(fd)), Ok(Out::Num(ino))) = (real, engine) {
            let fd = unsafe { OwnedFd::from_raw_fd(*fd as i32) };
            let fh = PENDING_FH
                .with(|p| p.borrow_mut().take())
                .expect("engine handle");
            assert_eq!(fh.ino(), *ino);
            if self.handles.len() >= MAX_HANDLES {
                self.fs().release(fh);
                drop(fd);
            } else {
                let real_ino = fstat(fd.as_raw_fd()).st_ino;
                self.handles.push(Handle { fd, fh, real_ino });
            }
        } else {
            if let Ok(Out::Num(fd)) = real {
                unsafe { libc::close(*fd as i32) };
            }
            if let Some(fh) = PENDING_FH.with(|p| p.borrow_mut().take()) {
                self.fs().release(fh);
            }
            let _ = (dir, name);
        }
        Ok(())
    }

    fn real_op(&mut self, op: &Op) -> R {
        match op {
            Op::Create(d, n, m) => {
                let dfd = self.real_dir(d)?;
                let c = cstr(&name_bytes(*n));
                let fd = cvt(unsafe {
                    libc::openat(
                        dfd.as_raw_fd(),
                        c.as_ptr(),
                        libc::O_CREAT | libc::O_EXCL | libc::O_RDWR | libc::O_CLOEXEC,
                        *m,
                    )
                })?;
                Ok(Out::Num(fd as u64))
            }
            Op::Mkdir(d, n, m) => {
                let dfd = self.real_dir(d)?;
                let c = cstr(&name_bytes(*n));
                cvt(unsafe { libc::mkdirat(dfd.as_raw_fd(), c.as_ptr(), *m) })?;
                Ok(Out::Unit)
            }
            Op::Mknod(d, n, k) => {
                let dfd = self.real_dir(d)?;
                let c = cstr(&name_bytes(*n));
                let (mode, rdev) = mknod_args(*k);
                cvt(unsafe { libc::mknodat(dfd.as_raw_fd(), c.as_ptr(), mode, rdev) })?;
                Ok(Out::Unit)
            }
            Op::Symlink(d, n, t) => {
                let dfd = self.real_dir(d)?;
                let c = cstr(&name_bytes(*n));
                let t = cstr(&symlink_target(*t));
                cvt(unsafe { libc::symlinkat(t.as_ptr(), dfd.as_raw_fd(), c.as_ptr()) })?;
                Ok(Out::Unit)
            }
            Op::Link(d1, n1, d2, n2) => {
                let a = self.real_dir(d1)?;
                let c1 = cstr(&name_bytes(*n1));
                // The old name must exist before the new parent is looked at.
                fstatat(a.as_raw_fd(), &name_bytes(*n1))?;
                let b = self.real_dir(d2)?;
                let c2 = cstr(&name_bytes(*n2));
                cvt(unsafe {
                    libc::linkat(a.as_raw_fd(), c1.as_ptr(), b.as_raw_fd(), c2.as_ptr(), 0)
                })?;
                Ok(Out::Unit)
            }
            Op::Unlink(d, n) | Op::Rmdir(d, n) => {
                let dfd = self.real_dir(d)?;
                let c = cstr(&name_bytes(*n));
                let flags = if matches!(op, Op::Rmdir(..)) {
                    libc::AT_REMOVEDIR
                } else {
                    0
                };
                cvt(unsafe { libc::unlinkat(dfd.as_raw_fd(), c.as_ptr(), flags) })?;
                Ok(Out::Unit)
            }
            Op::Rename(d1, n1, d2, n2, f) => {
                let a = self.real_dir(d1)?;
                let b = self.real_dir(d2)?;
                let c1 = cstr(&name_bytes(*n1));
                let c2 = cstr(&name_bytes(*n2));
                cvt(unsafe {
                    libc::renameat2(a.as_raw_fd(), c1.as_ptr(), b.as_raw_fd(), c2.as_ptr(), *f)
                })?;
                Ok(Out::Unit)
            }
            Op::Open(d, n) => {
                let dfd = self.real_dir(d)?;
                if let Ok(st) = fstatat(dfd.as_raw_fd(), &name_bytes(*n)) {
                    let f = st.st_mode & libc::S_IFMT;
                    if f != libc::S_IFREG && f != libc::S_IFDIR && f != libc::S_IFLNK {
                        return Ok(Out::Skip);
                    }
                }
                let c = cstr(&name_bytes(*n));
                let fd = cvt(unsafe {
                    libc::openat(
                        dfd.as_raw_fd(),
                        c.as_ptr(),
                        libc::O_RDWR | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                    )
                })?;
                Ok(Out::Num(fd as u64))
            }
            Op::Stat(d, n) => {
                let dfd = self.real_dir(d)?;
                Ok(Out::Stat(st_of_stat(&fstatat(
                    dfd.as_raw_fd(),
                    &name_bytes(*n),
                )?)))
            }
            Op::Readlink(d, n) => {
                let dfd = self.real_dir(d)?;
                let c = cstr(&name_bytes(*n));
                let mut buf = vec![0u8; 8192];
                let r = cvt_isize(unsafe {
                    libc::readlinkat(
                        dfd.as_raw_fd(),
                        c.as_ptr(),
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                    )
                })?;
                buf.truncate(r as usize);
                Ok(Out::Bytes(buf))
            }
            Op::Chmod(d, n, m) => {
                let dfd = self.real_dir(d)?;
                if fstatat(dfd.as_raw_fd(), &name_bytes(*n))?.st_mode & libc::S_IFMT
                    == libc::S_IFLNK
                {
                    return Ok(Out::Skip);
                }
                let c = cstr(&name_bytes(*n));
                cvt(unsafe { libc::fchmodat(dfd.as_raw_fd(), c.as_ptr(), *m, 0) })?;
                Ok(Out::Unit)
            }
            Op::Chown(d, n, u, g) => {
                let dfd = self.real_dir(d)?;
                let c = cstr(&name_bytes(*n));
                cvt(unsafe {
                    libc::fchownat(
                        dfd.as_raw_fd(),
                        c.as_ptr(),
                        *u,
                        *g,
                        libc::AT_SYMLINK_NOFOLLOW,
                    )
                })?;
                Ok(Out::Unit)
            }
            Op::Utimens(d, n, t) => {
                let dfd = self.real_dir(d)?;
                let c = cstr(&name_bytes(*n));
                let ts = [
                    libc::timespec {
                        tv_sec: 0,
                        tv_nsec: libc::UTIME_OMIT,
                    },
                    libc::timespec {
                        tv_sec: t / 1_000_000_000,
                        tv_nsec: t % 1_000_000_000,
                    },
                ];
                cvt(unsafe {
                    libc::utimensat(
                        dfd.as_raw_fd(),
                        c.as_ptr(),
                        ts.as_ptr(),
                        libc::AT_SYMLINK_NOFOLLOW,
                    )
                })?;
                let st = fstatat(dfd.as_raw_fd(), &name_bytes(*n))?;
                Ok(Out::Num(
                    (st.st_mtime * 1_000_000_000 + st.st_mtime_nsec) as u64,
                ))
            }
            Op::Truncate(d, n, size) => {
                let dfd = self.real_dir(d)?;
                if fstatat(dfd.as_raw_fd(), &name_bytes(*n))?.st_mode & libc::S_IFMT
                    == libc::S_IFLNK
                {
                    return Ok(Out::Skip);
                }
                let p = cstr(self.real_path(d, *n).as_os_str().as_bytes());
                cvt(unsafe { libc::truncate(p.as_ptr(), *size as i64) })?;
                Ok(Out::Unit)
            }
            Op::SetXattr(d, n, x, len, seed, flags) => {
                self.real_dir(d)?;
                let p = cstr(self.real_path(d, *n).as_os_str().as_bytes());
                let name = cstr(&xattr_name(*x));
                let v = pattern(*seed, *len as usize);
                let fl = [0, libc::XATTR_CREATE, libc::XATTR_REPLACE][*flags as usize];
                cvt(unsafe {
                    libc::lsetxattr(p.as_ptr(), name.as_ptr(), v.as_ptr().cast(), v.len(), fl)
                })?;
                Ok(Out::Unit)
            }
            Op::GetXattr(d, n, x) => {
                self.real_dir(d)?;
                let p = cstr(self.real_path(d, *n).as_os_str().as_bytes());
                let name = cstr(&xattr_name(*x));
                let mut buf = vec![0u8; 70000];
                let r = cvt_isize(unsafe {
                    libc::lgetxattr(
                        p.as_ptr(),
                        name.as_ptr(),
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                    )
                })?;
                buf.truncate(r as usize);
                Ok(Out::Bytes(buf))
            }
            Op::RemoveXattr(d, n, x) => {
                self.real_dir(d)?;
                let p = cstr(self.real_path(d, *n).as_os_str().as_bytes());
                let name = cstr(&xattr_name(*x));
                cvt(unsafe { libc::lremovexattr(p.as_ptr(), name.as_ptr()) })?;
                Ok(Out::Unit)
            }
            _ => unreachable!(),
        }
    }

    fn eng_op(&mut self, op: &Op) -> R {
        let fs = self.fs.as_ref().unwrap();
        match op {
            Op::Create(d, n, m) => {
                let p = self.eng_dir(d)?;
                let (a, fh) = eng(fs.create(p, &name_bytes(*n), *m, 0, 0))?;
                PENDING_FH.with(|x| *x.borrow_mut() = Some(fh));
                Ok(Out::Num(a.ino))
            }
            Op::Mkdir(d, n, m) => {
                let p = self.eng_dir(d)?;
                eng(fs.mkdir(p, &name_bytes(*n), *m, 0, 0))?;
                Ok(Out::Unit)
            }
            Op::Mknod(d, n, k) => {
                let p = self.eng_dir(d)?;
                let (mode, rdev) = mknod_args(*k);
                eng(fs.mknod(p, &name_bytes(*n), mode, rdev, 0, 0))?;
                Ok(Out::Unit)
            }
            Op::Symlink(d, n, t) => {
                let p = self.eng_dir(d)?;
                eng(fs.symlink(p, &name_bytes(*n), &symlink_target(*t), 0, 0))?;
                Ok(Out::Unit)
            }
            Op::Link(d1, n1, d2, n2) => {
                let ino = self.eng_node(d1, *n1)?;
                let p = self.eng_dir_checked(d2)?;
                eng(fs.link(ino, p, &name_bytes(*n2)))?;
                Ok(Out::Unit)
            }
            Op::Unlink(d, n) => {
                let p = self.eng_dir(d)?;
                eng(fs.unlink(p, &name_bytes(*n)))?;
                Ok(Out::Unit)
            }
            Op::Rmdir(d, n) => {
                let p = self.eng_dir(d)?;
                eng(fs.rmdir(p, &name_bytes(*n)))?;
                Ok(Out::Unit)
            }
            Op::Rename(d1, n1, d2, n2, f) => {
                let a = self.eng_dir_checked(d1)?;
                let b = self.eng_dir_checked(d2)?;
                let flags = eng(RenameFlags::from_bits(*f))?;
                // The harness runs as root: a whiteout is root's on tmpfs.
                eng(fs.rename_as(a, &name_bytes(*n1), b, &name_bytes(*n2), flags, 0, 0))?;
                Ok(Out::Unit)
            }
            Op::Open(d, n) => {
                let ino = self.eng_node(d, *n)?;
                let a = eng(fs.getattr(ino))?;
                match a.kind {
                    FileKind::File => {}
                    FileKind::Dir => return Err(libc::EISDIR),
                    FileKind::Symlink => return Err(libc::ELOOP),
                    _ => return Ok(Out::Skip),
                }
                let fh = eng(fs.open(ino))?;
                PENDING_FH.with(|x| *x.borrow_mut() = Some(fh));
                Ok(Out::Num(ino))
            }
            Op::Stat(d, n) => {
                let ino = self.eng_node(d, *n)?;
                Ok(Out::Stat(st_of_attr(&eng(fs.getattr(ino))?)))
            }
            Op::Readlink(d, n) => {
                let ino = self.eng_node(d, *n)?;
                Ok(Out::Bytes(eng(fs.readlink(ino))?))
            }
            Op::Chmod(d, n, m) => {
                let ino = self.eng_node(d, *n)?;
                if eng(fs.getattr(ino))?.kind == FileKind::Symlink {
                    return Ok(Out::Skip);
                }
                let a = eng(fs.setattr(
                    ino,
                    &SetAttr {
                        mode: Some(*m),
                        ..Default::default()
                    },
                ))?;
                assert_eq!(a.mode & 0o7777, *m);
                Ok(Out::Unit)
            }
            Op::Chown(d, n, u, g) => {
                let ino = self.eng_node(d, *n)?;
                eng(fs.setattr(
                    ino,
                    &SetAttr {
                        uid: Some(*u),
                        gid: Some(*g),
                        ..Default::default()
                    },
                ))?;
                Ok(Out::Unit)
            }
            Op::Utimens(d, n, t) => {
                let ino = self.eng_node(d, *n)?;
                let a = eng(fs.setattr(
                    ino,
                    &SetAttr {
                        mtime: Some(TimeSet::At(*t)),
                        ..Default::default()
                    },
                ))?;
                let b = eng(fs.getattr(ino))?;
                assert_eq!(a.mtime_ns, b.mtime_ns);
                Ok(Out::Num(a.mtime_ns as u64))
            }
            Op::Truncate(d, n, size) => {
                let ino = self.eng_node(d, *n)?;
                if eng(fs.getattr(ino))?.kind == FileKind::Symlink {
                    return Ok(Out::Skip);
                }
                eng(fs.setattr(
                    ino,
                    &SetAttr {
                        size: Some(*size),
                        ..Default::default()
                    },
                ))?;
                Ok(Out::Unit)
            }
            Op::SetXattr(d, n, x, len, seed, flags) => {
                let ino = self.eng_node(d, *n)?;
                let v = pattern(*seed, *len as usize);
                let fl =
                    [XattrFlags::Any, XattrFlags::Create, XattrFlags::Replace][*flags as usize];
                eng(fs.setxattr(ino, &xattr_name(*x), &v, fl))?;
                Ok(Out::Unit)
            }
            Op::GetXattr(d, n, x) => {
                let ino = self.eng_node(d, *n)?;
                Ok(Out::Bytes(eng(fs.getxattr(ino, &xattr_name(*x)))?))
            }
            Op::RemoveXattr(d, n, x) => {
                let ino = self.eng_node(d, *n)?;
                eng(fs.removexattr(ino, &xattr_name(*x)))?;
                Ok(Out::Unit)
            }
            _ => unreachable!(),
        }
    }

    fn handle_op(&mut self, op: &Op) -> Result<(R, R), TestCaseError> {
        let hi = match op {
            Op::Write(h, ..)
            | Op::Append(h, ..)
            | Op::Read(h, ..)
            | Op::CopyRange(h, ..)
            | Op::Ftruncate(h, ..)
            | Op::Fallocate(h, ..)
            | Op::Seek(h, ..)
            | Op::Fsync(h)
            | Op::Fstat(h)
            | Op::Release(h) => *h,
            _ => unreachable!(),
        };
        if self.handles.is_empty() {
            return Ok((Ok(Out::Skip), Ok(Out::Skip)));
        }
        let hi = hi % self.handles.len();
        if let Op::Release(_) = op {
            let h = self.handles.remove(hi);
            self.fs().release(h.fh);
            drop(h.fd);
            return Ok((Ok(Out::Unit), Ok(Out::Unit)));
        }
        let h = &self.handles[hi];
        let fd = h.fd.as_raw_fd();
        let fs = self.fs.as_ref().unwrap();
        let fh = &h.fh;
        Ok(match op {
            Op::Write(_, off, len, seed) => {
                let data = pattern(*seed, *len);
                let r = cvt_isize(unsafe {
                    libc::pwrite(fd, data.as_ptr().cast(), data.len(), *off as i64)
                })
                .map(|n| Out::Num(n as u64));
                let e = eng(fs.write(fh, *off, &data)).map(|n| Out::Num(n as u64));
                (r, e)
            }
            Op::Append(_, len, seed) => {
                let data = pattern(*seed, *len);
                let before = fstat(fd).st_size as u64;
                let iov = libc::iovec {
                    iov_base: data.as_ptr() as *mut _,
                    iov_len: data.len(),
                };
                let r = cvt_isize(unsafe { libc::pwritev2(fd, &iov, 1, -1, libc::RWF_APPEND) })
                    .map(|n| Out::Pair(before, n as u64));
                let e = eng(fs.append(fh, &data)).map(|(o, n)| Out::Pair(o, n as u64));
                (r, e)
            }
            Op::Read(_, off, len) => {
                let mut a = vec![0u8; *len];
                let r =
                    cvt_isize(unsafe { libc::pread(fd, a.as_mut_ptr().cast(), *len, *off as i64) })
                        .map(|n| {
                            a.truncate(n as usize);
                            Out::Bytes(a)
                        });
                let mut b = vec![0u8; *len];
                let e = eng(fs.read(fh, *off, &mut b)).map(|n| {
                    b.truncate(n);
                    Out::Bytes(b)
                });
                (r, e)
            }
            Op::CopyRange(_, off_in, out, off_out, len) => {
                let o = &self.handles[out % self.handles.len()];
                let (mut a, mut b) = (*off_in as i64, *off_out as i64);
                let r = cvt_isize(unsafe {
                    libc::copy_file_range(fd, &mut a, o.fd.as_raw_fd(), &mut b, *len, 0)
                } as isize)
                .map(|n| Out::Num(n as u64));
                let e = eng(fs.copy_range(fh, *off_in, &o.fh, *off_out, *len as u64)).map(Out::Num);
                (r, e)
            }
            Op::Ftruncate(_, size) => {
                let r = cvt(unsafe { libc::ftruncate(fd, *size as i64) }).map(|_| Out::Unit);
                let e = eng(fs.setattr(
                    fh.ino(),
                    &SetAttr {
                        size: Some(*size),
                        ..Default::default()
                    },
                ))
                .map(|_| Out::Unit);
                (r, e)
            }
            Op::Fallocate(_, m, off, len) => {
                let bits = [
                    0,
                    libc::FALLOC_FL_KEEP_SIZE,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    libc::FALLOC_FL_ZERO_RANGE,
                    libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
                ][*m as usize];
                let r = if *m >= 3 {
                    // tmpfs has no ZERO_RANGE: punch, then grow if asked.
                    let size = fstat(fd).st_size as u64;
                    cvt(unsafe {
                        libc::fallocate(
                            fd,
                            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                            *off as i64,
                            *len as i64,
                        )
                    })
                    .and_then(|_| {
                        if *m == 3 && off + len > size {
                            cvt(unsafe { libc::ftruncate(fd, (off + len) as i64) })
                        } else {
                            Ok(0)
                        }
                    })
                } else {
                    cvt(unsafe { libc::fallocate(fd, bits, *off as i64, *len as i64) })
                }
                .map(|_| Out::Unit);
                if *m != 2 {
                    let ino = h.real_ino;
                    self.inexact_seek.insert(ino);
                }
                let e = eng(FallocFlags::from_bits(bits))
                    .and_then(|f| eng(fs.fallocate(fh, *off, *len, f)))
                    .map(|_| Out::Unit);
                (r, e)
            }
            Op::Seek(_, off, hole) => {
                let w = if *hole {
                    libc::SEEK_HOLE
                } else {
                    libc::SEEK_DATA
                };
                let r = unsafe { libc::lseek(fd, *off as i64, w) };
                let r = if r < 0 {
                    Err(errno_now())
                } else {
                    Ok(Out::Num(r as u64))
                };
                let e = eng(fs.seek(fh, *off, if *hole { Whence::Hole } else { Whence::Data }))
                    .map(Out::Num);
                if self.inexact_seek.contains(&h.real_ino) {
                    // Sanity only: the answer is in [off, size] and
                    // SEEK_DATA skips only bytes that read as zero.
                    let size = fs.handle_size(fh);
                    match &e {
                        Err(libc::ENXIO) => {
                            prop_assert!(!*hole || *off >= size, "{op:?}: ENXIO")
                        }
                        Ok(Out::Num(at)) => {
                            prop_assert!(*at >= *off && *at <= size, "{op:?}: {at} size {size}");
                            if !*hole {
                                let mut b = vec![0u8; (*at - *off).min(1 << 20) as usize];
                                fs.read(fh, *off, &mut b).unwrap();
                                prop_assert!(b.iter().all(|&x| x == 0), "{op:?}: skipped data");
                            }
                        }
                        other => prop_assert!(false, "{op:?}: {other:?}"),
                    }
                    (Ok(Out::Skip), Ok(Out::Skip))
                } else {
                    (r, e)
                }
            }
            Op::Fsync(_) => {
                let r = cvt(unsafe { libc::fsync(fd) }).map(|_| Out::Unit);
                let e = eng(fs.fsync(fh, false)).map(|_| Out::Unit);
                (r, e)
            }
            Op::Fstat(_) => {
                let r = Ok(Out::Stat(st_of_stat(&fstat(fd))));
                let e = Ok(Out::Stat(st_of_attr(&fs.fgetattr(fh).unwrap())));
                (r, e)
            }
            _ => unreachable!(),
        })
    }

    // --- remounts --------------------------------------------------------

    fn release_all(&mut self) {
        for h in std::mem::take(&mut self.handles) {
            self.fs().release(h.fh);
            drop(h.fd);
        }
    }

    fn clean_remount(&mut self) -> Result<(), TestCaseError> {
        self.release_all();
        let fs = self.fs.take().unwrap();
        let free_before = fs.statfs().blocks_free;
        let pm = fs
            .unmount()
            .map_err(|e| TestCaseError::fail(format!("unmount: {e}")))?;
        let report = inkfs::fsck::check(&pm, &inkfs::fsck::FsckOptions::default())
            .map_err(|e| TestCaseError::fail(format!("fsck: {e}")))?;
        prop_assert!(
            report.is_clean(),
            "fsck after unmount: {:#?}",
            report.problems
        );
        let fs = Fs::mount(
            pm,
            MountOptions {
                mode: self.mode,
                read_only: false,
                ..Default::default()
            },
        )
        .map_err(|e| TestCaseError::fail(format!("clean remount: {e}")))?;
        prop_assert!(fs.mount_report().was_clean);
        let free_after = fs.statfs().blocks_free;
        prop_assert_eq!(
            free_before,
            free_after,
            "free blocks changed across a clean remount"
        );
        self.fs = Some(fs);
        Ok(())
    }

    /// Drop the file system without unmounting, keeping only what is
    /// certainly durable. Strict and sync mode: everything completed. Posix
    /// mode: everything after a syncfs.
    fn crash_remount(&mut self) -> Result<(), TestCaseError> {
        let fs = self.fs.take().unwrap();
        if self.mode == Mode::Posix {
            fs.sync().unwrap();
        }
        let free_before = fs.statfs().blocks_free;
        let image = fs.pmem().persisted_image();
        for h in std::mem::take(&mut self.handles) {
            drop(h.fh); // a handle does not outlive its file system
            drop(h.fd);
        }
        drop(fs);
        let fs = Fs::mount(
            SimPool::from_image(image),
            MountOptions {
                mode: self.mode,
                read_only: false,
                ..Default::default()
            },
        )
        .map_err(|e| TestCaseError::fail(format!("crash remount: {e}")))?;
        prop_assert!(!fs.mount_report().was_clean);
        let free_after = fs.statfs().blocks_free;
        prop_assert!(
            free_after >= free_before,
            "crash recovery leaked blocks: {free_before} free before, {free_after} after"
        );
        self.fs = Some(fs);
        Ok(())
    }

    // --- whole-state comparison -------------------------------------------

    fn compare_all(&self) -> Result<(), String> {
        let mut rl = Links::default();
        let mut el = Links::default();
        let real = self.real_tree(&self.base, &mut rl)?;
        let engine = self.eng_tree(ROOT_INO, ROOT_INO, &mut el)?;
        if real != engine {
            return Err(format!("trees differ:\ntmpfs {real:#?}\ninkfs {engine:#?}"));
        }
        for (i, h) in self.handles.iter().enumerate() {
            let r = fstat(h.fd.as_raw_fd());
            let a = self.fs().fgetattr(&h.fh).map_err(|e| e.to_string())?;
            if r.st_size as u64 != a.size || r.st_nlink != a.nlink as u64 {
                return Err(format!(
                    "handle {i}: tmpfs size {} nlink {}, inkfs size {} nlink {}",
                    r.st_size, r.st_nlink, a.size, a.nlink
                ));
            }
        }
        Ok(())
    }

    fn real_tree(&self, dir: &Path, links: &mut Links) -> Result<BTreeMap<Vec<u8>, Node>, String> {
        let mut out = BTreeMap::new();
        let mut names: Vec<_> = std::fs::read_dir(dir)
            .map_err(|e| e.to_string())?
            .map(|e| e.unwrap().file_name().as_bytes().to_vec())
            .collect();
        names.sort();
        for name in names {
            let p = dir.join(std::ffi::OsStr::from_bytes(&name));
            let md = std::fs::symlink_metadata(&p).map_err(|e| e.to_string())?;
            let fmt = md.mode() & libc::S_IFMT;
            let link = links.id(md.ino());
            let st = St {
                fmt,
                perm: md.mode() & 0o7777,
                nlink: md.nlink(),
                uid: md.uid(),
                gid: md.gid(),
                size: if fmt == libc::S_IFDIR {
                    None
                } else {
                    Some(md.size())
                },
                rdev: md.rdev(),
            };
            let target = (fmt == libc::S_IFLNK).then(|| {
                std::fs::read_link(&p)
                    .unwrap()
                    .as_os_str()
                    .as_bytes()
                    .to_vec()
            });
            let xattrs = real_xattrs(&p);
            let data = if fmt == libc::S_IFREG {
                Some(real_runs(&p))
            } else {
                None
            };
            let children = if fmt == libc::S_IFDIR {
                Some(self.real_tree(&p, links)?)
            } else {
                None
            };
            out.insert(
                name,
                Node {
                    st,
                    link,
                    target,
                    xattrs,
                    data,
                    children,
                },
            );
        }
        Ok(out)
    }

    fn eng_tree(
        &self,
        ino: u64,
        parent: u64,
        links: &mut Links,
    ) -> Result<BTreeMap<Vec<u8>, Node>, String> {
        let fs = self.fs();
        let mut ents = Vec::new();
        fs.readdir(ino, 0, &mut |e| {
            ents.push(e);
            true
        })
        .map_err(|e| format!("readdir {ino}: {e}"))?;
        if ents.len() < 2 || ents[0].name != b"." || ents[1].name != b".." {
            return Err(format!("readdir {ino}: no . and .. first"));
        }
        if ents[0].ino != ino || ents[1].ino != parent {
            return Err(format!("readdir {ino}: . or .. wrong: {:?}", &ents[..2]));
        }
        // Cookies resume after each entry.
        for w in ents.windows(2) {
            let mut next = None;
            fs.readdir(ino, w[0].cookie, &mut |e| {
                next = Some(e.name);
                false
            })
            .unwrap();
            if next.as_deref() != Some(&w[1].name[..]) {
                return Err(format!(
                    "readdir {ino}: cookie after {:?} resumes at {next:?}",
                    w[0].name
                ));
            }
        }
        let mut ents: Vec<_> = ents.into_iter().skip(2).collect();
        ents.sort_by(|a, b| a.name.cmp(&b.name));
        let mut out = BTreeMap::new();
        for e in ents {
            let a = fs
                .getattr(e.ino)
                .map_err(|x| format!("getattr {}: {x}", e.ino))?;
            if a.kind != e.kind {
                return Err(format!(
                    "readdir kind {:?} but inode kind {:?}",
                    e.kind, a.kind
                ));
            }
            if fs.lookup_ino(ino, &e.name).ok() != Some(e.ino) {
                return Err(format!("lookup of {:?} disagrees with readdir", e.name));
            }
            let link = links.id(e.ino);
            let target = (a.kind == FileKind::Symlink).then(|| fs.readlink(e.ino).unwrap());
            let mut xattrs = BTreeMap::new();
            for n in fs.listxattr(e.ino).unwrap() {
                let v = fs.getxattr(e.ino, &n).unwrap();
                xattrs.insert(n, v);
            }
            let data = if a.kind == FileKind::File {
                let fh = fs.open(e.ino).unwrap();
                let r = eng_runs(fs, &fh, a.size);
                fs.release(fh);
                Some(r)
            } else {
                None
            };
            let children = if a.kind == FileKind::Dir {
                Some(self.eng_tree(e.ino, ino, links)?)
            } else {
                None
            };
            out.insert(
                e.name,
                Node {
                    st: st_of_attr(&a),
                    link,
                    target,
                    xattrs,
                    data,
                    children,
                },
            );
        }
        Ok(out)
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(fs) = self.fs.take() {
            for h in std::mem::take(&mut self.handles) {
                fs.release(h.fh);
            }
        }
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

thread_local! {
    static PENDING_FH: std::cell::RefCell<Option<FileHandle>> = const { std::cell::RefCell::new(None) };
}

fn mknod_args(k: u8) -> (u32, u64) {
    match k {
        0 => (libc::S_IFIFO | 0o644, 0),
        1 => (libc::S_IFCHR | 0o600, libc::makedev(1, 3)),
        _ => (libc::S_IFSOCK | 0o755, 0),
    }
}

/// Hard-link structure: the first name (in walk order) of each inode.
#[derive(Default)]
struct Links {
    seen: HashMap<u64, usize>,
}

impl Links {
    fn id(&mut self, ino: u64) -> usize {
        let n = self.seen.len();
        *self.seen.entry(ino).or_insert(n)
    }
}

#[derive(Debug, PartialEq, Eq)]
struct Node {
    st: St,
    link: usize,
    target: Option<Vec<u8>>,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Non-zero byte runs: (offset, bytes).
    data: Option<Vec<(u64, Vec<u8>)>>,
    children: Option<BTreeMap<Vec<u8>, Node>>,
}

fn nonzero_runs(off: u64, buf: &[u8], out: &mut Vec<(u64, Vec<u8>)>) {
    let mut i = 0;
    while i < buf.len() {
        if buf[i] == 0 {
            i += 1;
            continue;
        }
        let s = i;
        while i < buf.len() && buf[i] != 0 {
            i += 1;
        }
        let at = off + s as u64;
        match out.last_mut() {
            Some((o, v)) if *o + v.len() as u64 == at => v.extend_from_slice(&buf[s..i]),
            _ => out.push((at, buf[s..i].to_vec())),
        }
    }
}

fn real_runs(p: &Path) -> Vec<(u64, Vec<u8>)> {
    let f = std::fs::File::open(p).unwrap();
    let fd = f.as_raw_fd();
    let size = fstat(fd).st_size;
    let mut out = Vec::new();
    let mut off = 0i64;
    while off < size {
        let d = unsafe { libc::lseek(fd, off, libc::SEEK_DATA) };
        if d < 0 {
            break;
        }
        let h = unsafe { libc::lseek(fd, d, libc::SEEK_HOLE) };
        let mut buf = vec![0u8; (h - d) as usize];
        let n = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), d) };
        assert_eq!(n as usize, buf.len());
        nonzero_runs(d as u64, &buf, &mut out);
        off = h;
    }
    out
}

fn eng_runs(fs: &Fs<SimPool>, fh: &FileHandle, size: u64) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut off = 0u64;
    while off < size {
        let d = match fs.seek(fh, off, Whence::Data) {
            Ok(d) => d,
            Err(e) if e.errno() == libc::ENXIO => break,
            Err(e) => panic!("seek data: {e}"),
        };
        let h = fs.seek(fh, d, Whence::Hole).unwrap();
        assert!(
            h > d && h <= size,
            "seek hole {h} after data {d}, size {size}"
        );
        let mut buf = vec![0u8; (h - d) as usize];
        assert!(buf.len() < 64 << 20, "data extent of {} bytes", buf.len());
        let n = fs.read(fh, d, &mut buf).unwrap();
        assert_eq!(n, buf.len());
        nonzero_runs(d, &buf, &mut out);
        off = h;
    }
    out
}

fn real_xattrs(p: &Path) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let c = cstr(p.as_os_str().as_bytes());
    let mut buf = vec![0u8; 65536];
    let n = unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(n >= 0);
    let mut out = BTreeMap::new();
    for name in buf[..n as usize]
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty())
    {
        let nc = cstr(name);
        let mut v = vec![0u8; 70000];
        let m = unsafe { libc::lgetxattr(c.as_ptr(), nc.as_ptr(), v.as_mut_ptr().cast(), v.len()) };
        assert!(m >= 0);
        v.truncate(m as usize);
        out.insert(name.to_vec(), v);
    }
    out
}

fn errname(e: i32) -> String {
    format!("{e} {}", std::io::Error::from_raw_os_error(e))
}

/// Results that differ only where the VFS, not the file system, decides.
fn equivalent(op: &Op, real: &R, engine: &R) -> bool {
    if real == engine {
        return true;
    }
    match (op, real, engine) {
        // Create/Open: each side returns its own handle id.
        (Op::Create(..) | Op::Open(..), Ok(Out::Num(_)), Ok(Out::Num(_))) => true,
        // renameat2 looks up the old name (ENOENT) before the length of
        // the new one matters; inkfs checks both names first.
        (Op::Rename(_, _, _, n2, _), Err(libc::ENOENT), Err(libc::ENAMETOOLONG)) if *n2 == 6 => {
            true
        }
        // The VFS finds the parent is not a directory before the name is
        // checked; inkfs checks the name first.
        (_, Err(libc::ENOTDIR), Err(libc::ENAMETOOLONG)) => true,
        // The xattr syscalls check the attribute name before walking the
        // path; the harness walks first for inkfs.
        (
            Op::SetXattr(_, _, 3, ..) | Op::GetXattr(_, _, 3) | Op::RemoveXattr(_, _, 3),
            Err(libc::ERANGE),
            Err(libc::ENOENT | libc::ENOTDIR | libc::ENAMETOOLONG),
        ) => true,
        _ => false,
    }
}
