//! Finding the server behind a path: the FUSE mount it is on (from
//! /proc/self/mountinfo) and that server's control socket.

use std::path::{Path, PathBuf};

use crate::api::attach as wire;
use crate::error::{errno, Error, Result};

pub(super) fn refused(mountpoint: &Path, why: &str) -> Error {
    Error::Io(std::io::Error::other(format!(
        "attaching to the inkfs mount {}: {why}",
        mountpoint.display()
    )))
}

/// The control socket of the server of `mountpoint`: in root's run
/// directory, this user's, or the mount owner's.
pub(super) fn find_socket(mountpoint: &Path, owner: Option<u32>) -> Option<PathBuf> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    let mut dirs = vec![PathBuf::from(wire::RUN_DIR)];
    for uid in [Some(euid), owner].into_iter().flatten() {
        dirs.push(PathBuf::from(format!("/tmp/inkfs-{uid}")));
    }
    dirs.iter()
        .map(|d| wire::socket_path(d, mountpoint))
        .find(|p| p.exists())
}

/// The FUSE mount `path` is on, and its owner (user_id=): the mount point
/// in /proc/self/mountinfo that is the longest prefix of the canonical
/// path. ENOTSUP if that mount is not a FUSE one.
pub fn mount_of(path: &Path) -> Result<(PathBuf, Option<u32>)> {
    let path = path.canonicalize()?;
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    let best = info
        .lines()
        .filter_map(parse_mountinfo)
        .filter(|m| path.starts_with(&m.0))
        .max_by_key(|m| m.0.as_os_str().len());
    match best {
        Some((mnt, fstype, owner)) if fstype.starts_with("fuse.") => Ok((mnt, owner)),
        _ => errno(libc::ENOTSUP),
    }
}

/// One mountinfo line: mount point, file system type, user_id option.
fn parse_mountinfo(line: &str) -> Option<(PathBuf, String, Option<u32>)> {
    let (left, right) = line.split_once(" - ")?;
    let target = unescape(left.split(' ').nth(4)?);
    let mut right = right.split(' ');
    let fstype = right.next()?.to_string();
    let options = right.nth(1).unwrap_or("");
    let owner = options
        .split(',')
        .find_map(|o| o.strip_prefix("user_id="))
        .and_then(|u| u.parse().ok());
    Some((PathBuf::from(target), fstype, owner))
}

/// mountinfo writes blanks, tabs, newlines and backslashes as octal
/// escapes (\040, \011, \012, \134).
fn unescape(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines() {
        let l = "36 35 0:31 / /mnt/a\\040b rw,nosuid - fuse.inkfs /dev/shm/p rw,user_id=1000,group_id=1000";
        let (m, t, o) = parse_mountinfo(l).unwrap();
        assert_eq!(m, Path::new("/mnt/a b"));
        assert_eq!(t, "fuse.inkfs");
        assert_eq!(o, Some(1000));
        assert!(parse_mountinfo("garbage").is_none());
    }

    #[test]
    fn a_path_on_no_fuse_mount_is_enotsup() {
        let e = super::super::attach(Path::new("/proc/self"))
            .err()
            .expect("refused");
        assert_eq!(e.errno(), libc::ENOTSUP);
    }
}
