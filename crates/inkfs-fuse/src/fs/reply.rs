//! Translation between the engine's types and FUSE's: attributes, times,
//! errnos, and how each kind of reply is answered with a result
//! (`Answer`). A child of fs.rs, which holds the request handlers.

use super::*;

/// The attributes of a negative lookup reply: only node 0 matters.
pub(super) fn negative_attr() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
        flags: 0,
    }
}

pub(super) fn errno(e: api::Error) -> Errno {
    Errno::from_i32(e.errno())
}

pub(super) fn fail<T>(e: i32) -> api::Result<T> {
    Err(api::Error::Errno(e))
}

pub(super) fn file_type(k: FileKind) -> FileType {
    match k {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDev => FileType::CharDevice,
        FileKind::BlockDev => FileType::BlockDevice,
    }
}

pub(super) fn system_time(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

pub(super) fn time_ns(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos().min(i64::MAX as u128) as i64,
        Err(e) => -(e.duration().as_nanos().min(i64::MAX as u128) as i64),
    }
}

pub(super) fn time_set(t: TimeOrNow) -> TimeSet {
    match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(t) => TimeSet::At(time_ns(t)),
    }
}

pub fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: system_time(a.atime_ns),
        mtime: system_time(a.mtime_ns),
        ctime: system_time(a.ctime_ns),
        crtime: system_time(a.ctime_ns),
        kind: file_type(a.kind),
        perm: (a.mode & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        // FUSE carries the kernel's 32-bit device encoding, which is what
        // mknod handed us and what the engine stored.
        rdev: a.rdev as u32,
        blksize: 4096,
        flags: 0,
    }
}

pub(super) fn name_bytes(name: &OsStr) -> &[u8] {
    name.as_bytes()
}

/// A reply the kernel waits for, and how a result of type `T` answers it.
pub(super) trait Answer<T> {
    fn ok(self, v: T);
    fn fail(self, e: Errno);
}

impl Answer<Attr> for ReplyEntry {
    fn ok(self, a: Attr) {
        self.entry(&TTL, &file_attr(&a), Generation(a.generation));
    }
    fn fail(self, e: Errno) {
        self.error(e);
    }
}

impl Answer<Attr> for ReplyAttr {
    fn ok(self, a: Attr) {
        self.attr(&TTL, &file_attr(&a));
    }
    fn fail(self, e: Errno) {
        self.error(e);
    }
}

impl Answer<()> for ReplyEmpty {
    fn ok(self, (): ()) {
        ReplyEmpty::ok(self);
    }
    fn fail(self, e: Errno) {
        self.error(e);
    }
}

impl Answer<Vec<u8>> for ReplyData {
    fn ok(self, d: Vec<u8>) {
        self.data(&d);
    }
    fn fail(self, e: Errno) {
        self.error(e);
    }
}

/// An open reply: the handle, and the open flags to give it.
impl Answer<(u64, FopenFlags)> for ReplyOpen {
    fn ok(self, (fh, flags): (u64, FopenFlags)) {
        self.opened(FileHandle(fh), flags);
    }
    fn fail(self, e: Errno) {
        self.error(e);
    }
}

impl Answer<u32> for ReplyWrite {
    fn ok(self, n: u32) {
        self.written(n);
    }
    fn fail(self, e: Errno) {
        self.error(e);
    }
}

impl Answer<(Attr, u64, FopenFlags)> for ReplyCreate {
    fn ok(self, (a, fh, flags): (Attr, u64, FopenFlags)) {
        self.created(
            &TTL,
            &file_attr(&a),
            Generation(a.generation),
            FileHandle(fh),
            flags,
        );
    }
    fn fail(self, e: Errno) {
        self.error(e);
    }
}

impl Answer<i64> for ReplyLseek {
    fn ok(self, off: i64) {
        self.offset(off);
    }
    fn fail(self, e: Errno) {
        self.error(e);
    }
}

/// An xattr value or name list, and the buffer size the caller offered
/// (0: it asks for the size only).
impl Answer<(Vec<u8>, u32)> for ReplyXattr {
    fn ok(self, (v, size): (Vec<u8>, u32)) {
        if size == 0 {
            self.size(v.len() as u32);
        } else if v.len() > size as usize {
            self.error(Errno::ERANGE);
        } else {
            self.data(&v);
        }
    }
    fn fail(self, e: Errno) {
        self.error(e);
    }
}
