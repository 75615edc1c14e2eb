//! The inode-flag ioctls (`chattr`, `lsattr`, `xfs_io -c chattr`):
//! FS_IOC_GETFLAGS / FS_IOC_SETFLAGS and FS_IOC_FSGETXATTR /
//! FS_IOC_FSSETXATTR, decoded from FUSE_IOCTL requests.
//!
//! On FUSE the kernel routes these ioctls through its `fileattr_get/set`
//! (fs/fuse/ioctl.c): it opens the inode itself (OPEN or OPENDIR, read
//! only), sends FUSE_IOCTL with the command and a 4-byte flags word or a
//! 28-byte `struct fsxattr`, and releases. A set is preceded by a get: the
//! kernel checks ownership and CAP_LINUX_IMMUTABLE against the flags we
//! report before it asks us to change them. The engine checks privilege
//! again (the other front ends have no kernel in the way).

use inkfs::api::inode_flags::{APPEND, IMMUTABLE, NOATIME, NODUMP};
use inkfs::api::{Credentials, Error, Result};

use crate::Engine;

/// `_IOR('f', 1, long)`, `_IOW('f', 2, long)`: the word itself is an int.
pub const FS_IOC_GETFLAGS: u32 = libc::FS_IOC_GETFLAGS as u32;
pub const FS_IOC_SETFLAGS: u32 = libc::FS_IOC_SETFLAGS as u32;
/// `_IOR('X', 31, struct fsxattr)`, `_IOW('X', 32, struct fsxattr)`.
pub const FS_IOC_FSGETXATTR: u32 = ioc(2, b'X', 31, FSXATTR_BYTES);
pub const FS_IOC_FSSETXATTR: u32 = ioc(1, b'X', 32, FSXATTR_BYTES);

/// `struct fsxattr`: xflags, extsize, nextents, projid, cowextsize (u32
/// each), 8 bytes of padding.
const FSXATTR_BYTES: usize = 28;

const fn ioc(dir: u32, kind: u8, nr: u32, size: usize) -> u32 {
    dir << 30 | (size as u32) << 16 | (kind as u32) << 8 | nr
}
const _: () = assert!(FS_IOC_FSGETXATTR == 0x801c_581f && FS_IOC_FSSETXATTR == 0x401c_5820);

/// `FS_XFLAG_*` ↔ `FS_*_FL` for the flags inkfs stores (the kernel's
/// `fileattr_fill_xflags` mapping).
const XFLAGS: [(u32, u32); 4] = [
    (0x08, IMMUTABLE), // FS_XFLAG_IMMUTABLE
    (0x10, APPEND),    // FS_XFLAG_APPEND
    (0x40, NOATIME),   // FS_XFLAG_NOATIME
    (0x80, NODUMP),    // FS_XFLAG_NODUMP
];

/// Whether a successful `cmd` changed the inode (its flags and ctime).
pub fn changes_inode(cmd: u32) -> bool {
    matches!(cmd, FS_IOC_SETFLAGS | FS_IOC_FSSETXATTR)
}

fn to_xflags(flags: u32) -> u32 {
    XFLAGS
        .iter()
        .filter(|(_, f)| flags & f != 0)
        .fold(0, |x, (bit, _)| x | bit)
}

/// The flags an xflags word asks for; EOPNOTSUPP for any xflag inkfs does
/// not store (as ext4 refuses what it does not support).
fn from_xflags(xflags: u32) -> Result<u32> {
    let known = XFLAGS.iter().fold(0, |x, (bit, _)| x | bit);
    if xflags & !known != 0 {
        return Err(Error::Errno(libc::EOPNOTSUPP));
    }
    Ok(XFLAGS
        .iter()
        .filter(|(bit, _)| xflags & bit != 0)
        .fold(0, |f, (_, flag)| f | flag))
}

fn word(data: &[u8], i: usize) -> Result<u32> {
    data.get(4 * i..4 * i + 4)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_ne_bytes)
        .ok_or(Error::Errno(libc::EINVAL))
}

/// Reply bytes of exactly `out_size` (the kernel's private ioctl takes
/// no shorter reply): `data`, zero-padded.
fn reply_of(data: &[u8], out_size: u32) -> Result<Vec<u8>> {
    let n = out_size as usize;
    if n < data.len() {
        return Err(Error::Errno(libc::EINVAL));
    }
    let mut out = data.to_vec();
    out.resize(n, 0);
    Ok(out)
}

/// Serve `cmd` on inode `ino` for `cred` if it is one of the flag ioctls:
/// the reply data, or `None` for any other command.
pub fn serve(
    fs: &Engine,
    cred: &Credentials,
    ino: u64,
    cmd: u32,
    in_data: &[u8],
    out_size: u32,
) -> Option<Result<Vec<u8>>> {
    let r = match cmd {
        FS_IOC_GETFLAGS => fs
            .get_flags(ino)
            .and_then(|f| reply_of(&f.to_ne_bytes(), out_size)),
        FS_IOC_SETFLAGS => word(in_data, 0)
            .and_then(|f| fs.set_flags(cred, ino, f))
            .map(|()| Vec::new()),
        FS_IOC_FSGETXATTR => fs.get_flags(ino).and_then(|f| {
            // extsize, nextents (ext4 leaves it 0 too), projid, cowextsize:
            // none kept.
            let mut x = [0u8; FSXATTR_BYTES];
            x[..4].copy_from_slice(&to_xflags(f).to_ne_bytes());
            reply_of(&x, out_size)
        }),
        FS_IOC_FSSETXATTR => set_xattr(fs, cred, ino, in_data).map(|()| Vec::new()),
        _ => return None,
    };
    Some(r)
}

fn set_xattr(fs: &Engine, cred: &Credentials, ino: u64, in_data: &[u8]) -> Result<()> {
    let xflags = word(in_data, 0)?;
    // Project ids need quota support inkfs does not have (ext4 without
    // the project feature answers the same); size hints are ignored, as
    // ext4 ignores them.
    if word(in_data, 3)? != 0 {
        return Err(Error::Errno(libc::EOPNOTSUPP));
    }
    fs.set_flags(cred, ino, from_xflags(xflags)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xflags_map_both_ways() {
        for flags in 0..=0xffu32 {
            let flags = flags & (IMMUTABLE | APPEND | NODUMP | NOATIME);
            assert_eq!(from_xflags(to_xflags(flags)).unwrap(), flags);
        }
        assert_eq!(to_xflags(IMMUTABLE | NODUMP), 0x88);
        // FS_XFLAG_SYNC, FS_XFLAG_DAX: not stored.
        assert!(from_xflags(0x20).is_err());
        assert!(from_xflags(0x8000).is_err());
    }

    #[test]
    fn replies_have_the_size_the_kernel_asked_for() {
        assert_eq!(reply_of(&[1, 2, 3, 4], 4).unwrap(), vec![1, 2, 3, 4]);
        assert_eq!(reply_of(&[1, 2, 3, 4], 8).unwrap().len(), 8);
        assert!(reply_of(&[1, 2, 3, 4], 2).is_err());
        assert!(word(&[1, 2], 0).is_err());
    }
}
