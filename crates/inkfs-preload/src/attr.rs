//! An engine [`Attr`] as the kernel shows it through the FUSE mount:
//! `struct stat` and `struct statx`, field for field what the mount's
//! getattr reply (crates/inkfs-fuse/src/fs.rs, `file_attr`) becomes in the
//! kernel, so a program sees the same answer served or not.

use inkfs::api::Attr;

use crate::mounts::Mount;

/// The block size the mount reports.
const BLKSIZE: i64 = 4096;

fn split_ns(ns: i64) -> (i64, i64) {
    (ns.div_euclid(1_000_000_000), ns.rem_euclid(1_000_000_000))
}

/// FUSE carries the 32-bit device encoding; the kernel decodes it.
fn rdev_parts(rdev: u64) -> (u32, u32) {
    let d = rdev as u32;
    ((d & 0xfff00) >> 8, (d & 0xff) | ((d >> 12) & 0xfff00))
}

pub fn to_stat(a: &Attr, m: &Mount, st: &mut libc::stat64) {
    // SAFETY: all-zero bytes are a valid struct stat64.
    *st = unsafe { std::mem::zeroed() };
    st.st_dev = m.dev;
    st.st_ino = a.ino;
    st.st_mode = a.mode;
    st.st_nlink = a.nlink as _;
    st.st_uid = a.uid;
    st.st_gid = a.gid;
    let (maj, min) = rdev_parts(a.rdev);
    st.st_rdev = libc::makedev(maj, min);
    st.st_size = a.size as i64;
    st.st_blksize = BLKSIZE;
    st.st_blocks = a.blocks as i64;
    (st.st_atime, st.st_atime_nsec) = split_ns(a.atime_ns);
    (st.st_mtime, st.st_mtime_nsec) = split_ns(a.mtime_ns);
    (st.st_ctime, st.st_ctime_nsec) = split_ns(a.ctime_ns);
}

/// The statx mask bits an answer here can fill.
pub const STATX_SERVED: u32 = libc::STATX_BASIC_STATS | libc::STATX_MNT_ID;

/// Fill `sx` from `a`, with the mask, attributes and mount id the kernel
/// gave for the mount's root (`root`). The root's own "mount root"
/// attribute is kept for the root only.
pub fn to_statx(a: &Attr, m: &Mount, root: &libc::statx, sx: &mut libc::statx) {
    // SAFETY: all-zero bytes are a valid struct statx.
    *sx = unsafe { std::mem::zeroed() };
    sx.stx_mask = root.stx_mask & STATX_SERVED;
    sx.stx_blksize = BLKSIZE as u32;
    sx.stx_attributes_mask = root.stx_attributes_mask;
    sx.stx_attributes = root.stx_attributes;
    if a.ino != inkfs::api::ROOT_INO {
        sx.stx_attributes &= !(libc::STATX_ATTR_MOUNT_ROOT as u64);
    }
    sx.stx_nlink = a.nlink;
    sx.stx_uid = a.uid;
    sx.stx_gid = a.gid;
    sx.stx_mode = a.mode as u16;
    sx.stx_ino = a.ino;
    sx.stx_size = a.size;
    sx.stx_blocks = a.blocks;
    let ts = |t: &mut libc::statx_timestamp, ns: i64| {
        let (s, n) = split_ns(ns);
        t.tv_sec = s;
        t.tv_nsec = n as u32;
    };
    ts(&mut sx.stx_atime, a.atime_ns);
    ts(&mut sx.stx_mtime, a.mtime_ns);
    ts(&mut sx.stx_ctime, a.ctime_ns);
    let (maj, min) = rdev_parts(a.rdev);
    sx.stx_rdev_major = maj;
    sx.stx_rdev_minor = min;
    sx.stx_dev_major = libc::major(m.dev);
    sx.stx_dev_minor = libc::minor(m.dev);
    sx.stx_mnt_id = root.stx_mnt_id;
}
