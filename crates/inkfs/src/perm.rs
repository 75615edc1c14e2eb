//! POSIX permission rules, as Linux applies them (fs/namei.c
//! `generic_permission`, `may_delete`, `may_create`; fs/attr.c
//! `setattr_prepare`; fs/inode.c `inode_init_owner`; fs/xattr.c
//! `xattr_permission`). Pure functions of the caller's credentials and the
//! attributes involved: the engine calls them under the inode locks of the
//! operation they guard, so a check and the change it allows see the same
//! state.
//!
//! Root is uid 0 with every capability the rules below name (DAC_OVERRIDE,
//! DAC_READ_SEARCH, FOWNER, FSETID, CHOWN, SYS_ADMIN, LINUX_IMMUTABLE,
//! MKNOD). Capabilities held by other users are not modelled: a front end
//! that wants them passes uid 0.

use crate::error::{errno, Result};
use crate::types::{Attr, FileKind};

/// Who is asking: the file-system ids of a process (fsuid/fsgid, which
/// equal the effective ids unless setfsuid changed them), its supplementary
/// groups and its umask (applied to the mode of files it creates).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credentials {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub umask: u32,
}

impl Credentials {
    /// Root with no supplementary groups and umask 0: every check passes
    /// that Linux lets root pass.
    pub fn root() -> Credentials {
        Credentials {
            uid: 0,
            gid: 0,
            groups: Vec::new(),
            umask: 0,
        }
    }

    /// A user with the given ids, no supplementary groups, umask 022.
    pub fn user(uid: u32, gid: u32) -> Credentials {
        Credentials {
            uid,
            gid,
            groups: Vec::new(),
            umask: 0o022,
        }
    }

    /// The calling process's effective ids, supplementary groups and umask.
    pub fn current_process() -> Credentials {
        // SAFETY: geteuid/getegid cannot fail and touch no memory of ours.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        Credentials {
            uid,
            gid,
            groups: supplementary_groups(),
            umask: current_umask(),
        }
    }

    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    /// Whether the caller is a member of `gid` (its own group or a
    /// supplementary one): Linux's `in_group_p`.
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }

    /// Owner of the inode, or root (`inode_owner_or_capable`).
    pub fn owns(&self, a: &Attr) -> bool {
        self.uid == a.uid || self.is_root()
    }
}

fn supplementary_groups() -> Vec<u32> {
    // SAFETY: a zero-sized call only returns the count.
    let n = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
    if n <= 0 {
        return Vec::new();
    }
    let mut groups = vec![0 as libc::gid_t; n as usize];
    // SAFETY: the buffer holds `n` entries, and getgroups writes at most that.
    let got = unsafe { libc::getgroups(n, groups.as_mut_ptr()) };
    groups.truncate(got.max(0) as usize);
    groups
}

fn current_umask() -> u32 {
    // umask(2) can only be read by setting it; set it back at once. Another
    // thread creating a file in between would see 022 for that instant, so
    // read it from /proc where the kernel offers it (Linux 4.7+).
    if let Ok(status) = std::fs::read_to_string("/proc/self/status") {
        if let Some(v) = status.lines().find_map(|l| l.strip_prefix("Umask:")) {
            if let Ok(m) = u32::from_str_radix(v.trim(), 8) {
                return m;
            }
        }
    }
    // SAFETY: umask has no failure mode; the old value is restored at once.
    unsafe {
        let old = libc::umask(0o022);
        libc::umask(old);
        old
    }
}

/// On whose behalf an engine call acts.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Actor<'a> {
    /// The engine itself or a trusted tool (recovery, fsck, the crash
    /// harness, tests): no permission checks, owners as given.
    Engine,
    /// A caller of the API: every permission rule below is checked, under
    /// the locks of the operation it guards.
    Caller(&'a Credentials),
}

impl<'a> Actor<'a> {
    pub(crate) fn caller(self) -> Option<&'a Credentials> {
        match self {
            Actor::Engine => None,
            Actor::Caller(c) => Some(c),
        }
    }
}

/// Access bits, as access(2)'s mask and the rwx triplets of a mode.
pub const MAY_READ: u32 = 4;
pub const MAY_WRITE: u32 = 2;
pub const MAY_EXEC: u32 = 1;

/// `generic_permission`: the class bits (owner, else group, else other:
/// an owner is judged by the owner bits alone), then root's overrides:
/// read and write always, execute of a directory always and of a file only
/// if someone may execute it.
pub fn check_access(cred: &Credentials, a: &Attr, mask: u32) -> Result<()> {
    debug_assert!(mask & !7 == 0, "mask is rwx bits only");
    if mask == 0 {
        return Ok(());
    }
    let class_bits = if cred.uid == a.uid {
        (a.mode >> 6) & 7
    } else if cred.in_group(a.gid) {
        (a.mode >> 3) & 7
    } else {
        a.mode & 7
    };
    if mask & !class_bits == 0 {
        return Ok(());
    }
    if cred.is_root() {
        let exec_ok = a.kind == FileKind::Dir || a.mode & 0o111 != 0;
        if mask & MAY_EXEC == 0 || exec_ok {
            return Ok(());
        }
    }
    errno(libc::EACCES)
}

/// Creating a name in `dir`: write and search permission on it.
pub fn may_create(cred: &Credentials, dir: &Attr) -> Result<()> {
    if dir.kind != FileKind::Dir {
        return errno(libc::ENOTDIR);
    }
    check_access(cred, dir, MAY_WRITE | MAY_EXEC)
}

/// Removing (or renaming away, or renaming over) `victim`'s name in `dir`:
/// write and search permission on the directory, and in a sticky directory
/// ownership of the victim or the directory (`may_delete`, `check_sticky`).
pub fn may_delete(cred: &Credentials, dir: &Attr, victim: &Attr) -> Result<()> {
    check_access(cred, dir, MAY_WRITE | MAY_EXEC)?;
    check_sticky(cred, dir, victim)
}

/// In a sticky directory only the victim's owner, the directory's owner or
/// root may remove or rename a name (`check_sticky`).
pub fn check_sticky(cred: &Credentials, dir: &Attr, victim: &Attr) -> Result<()> {
    if dir.mode & libc::S_ISVTX != 0
        && cred.uid != victim.uid
        && cred.uid != dir.uid
        && !cred.is_root()
    {
        return errno(libc::EPERM);
    }
    Ok(())
}

/// Looking a name up in `dir` (one step of a path walk): search permission.
pub fn may_lookup(cred: &Credentials, dir: &Attr) -> Result<()> {
    if dir.kind != FileKind::Dir {
        return errno(libc::ENOTDIR);
    }
    check_access(cred, dir, MAY_EXEC)
}

/// A hard link to `source` (may_linkat with protected_hardlinks, Linux's
/// default): its owner and root may link anything; others only a regular
/// file that is not set-user-ID, not executable set-group-ID, and that
/// they may read and write. Otherwise EPERM.
pub fn may_link(cred: &Credentials, source: &Attr) -> Result<()> {
    if cred.owns(source) {
        return Ok(());
    }
    let setid = source.mode & libc::S_ISUID != 0
        || source.mode & (libc::S_ISGID | libc::S_IXGRP) == libc::S_ISGID | libc::S_IXGRP;
    let safe = source.kind == FileKind::File
        && !setid
        && check_access(cred, source, MAY_READ | MAY_WRITE).is_ok();
    if safe {
        Ok(())
    } else {
        errno(libc::EPERM)
    }
}

/// Owner, group and mode bits of a new inode in `dir` (`inode_init_owner`):
/// the caller's fsuid; the directory's group if it is set-group-ID (and a
/// new directory inherits the bit), else the caller's fsgid; the requested
/// mode less the umask; a set-group-ID bit on a new non-directory is dropped
/// when the caller is not in the file's group (unless root).
pub fn new_inode_owner(
    cred: &Credentials,
    dir: &Attr,
    kind: FileKind,
    requested_mode: u32,
) -> (u32, u32, u32) {
    let mut mode = requested_mode & 0o7777 & !(cred.umask & 0o777);
    let gid = if dir.mode & libc::S_ISGID != 0 {
        if kind == FileKind::Dir {
            mode |= libc::S_ISGID;
        }
        dir.gid
    } else {
        cred.gid
    };
    if kind != FileKind::Dir
        && mode & libc::S_ISGID != 0
        && mode & libc::S_IXGRP != 0
        && !cred.in_group(gid)
        && !cred.is_root()
    {
        mode &= !libc::S_ISGID;
    }
    (cred.uid, gid, mode)
}

/// The permission bits after a write or truncate by `cred`
/// (`should_remove_suid`): set-user-ID goes, and set-group-ID when it means
/// "set group on exec" (group-executable), unless the caller is root.
/// `None` when nothing changes.
pub fn mode_after_write(cred: &Credentials, a: &Attr) -> Option<u32> {
    if cred.is_root() || a.kind != FileKind::File {
        return None;
    }
    killed_setid(a.mode)
}

/// The permission bits with set-user-ID cleared, and set-group-ID when the
/// file is group-executable; `None` if neither is set.
pub fn killed_setid(mode: u32) -> Option<u32> {
    let mut kill = libc::S_ISUID;
    if mode & libc::S_IXGRP != 0 {
        kill |= libc::S_ISGID;
    }
    (mode & kill != 0).then_some(mode & 0o7777 & !kill)
}

/// chmod: owner or root. A caller outside the file's group (and not root)
/// cannot set its set-group-ID bit: it is dropped, as Linux drops it.
/// Returns the permission bits to store.
pub fn chmod(cred: &Credentials, a: &Attr, new_perm: u32) -> Result<u32> {
    if !cred.owns(a) {
        return errno(libc::EPERM);
    }
    let mut perm = new_perm & 0o7777;
    if perm & libc::S_ISGID != 0 && !cred.in_group(a.gid) && !cred.is_root() {
        perm &= !libc::S_ISGID;
    }
    Ok(perm)
}

/// chown/chgrp (`chown_ok`, `chgrp_ok`): root may set anything; the owner
/// may "change" the uid to itself and the group to one it belongs to.
pub fn chown(cred: &Credentials, a: &Attr, uid: Option<u32>, gid: Option<u32>) -> Result<()> {
    if cred.is_root() {
        return Ok(());
    }
    if let Some(u) = uid {
        if u != a.uid || cred.uid != a.uid {
            return errno(libc::EPERM);
        }
    }
    if let Some(g) = gid {
        if cred.uid != a.uid || (g != a.gid && !cred.in_group(g)) {
            return errno(libc::EPERM);
        }
    }
    Ok(())
}

/// Setting timestamps: to explicit values needs ownership (or root); to
/// "now" also write permission.
pub fn set_times(cred: &Credentials, a: &Attr, explicit: bool) -> Result<()> {
    if cred.owns(a) {
        return Ok(());
    }
    if explicit {
        return errno(libc::EPERM);
    }
    check_access(cred, a, MAY_WRITE)
}

/// Extended attribute namespaces inkfs stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XattrClass {
    User,
    Trusted,
    Security,
}

/// The namespace of an attribute name, or EOPNOTSUPP for one inkfs does
/// not store (POSIX ACLs are not enforced, so storing one would suggest a
/// protection that is not there; unknown prefixes are refused by Linux
/// before a file system sees them).
pub fn xattr_class(name: &[u8]) -> Result<XattrClass> {
    if name.starts_with(b"user.") {
        Ok(XattrClass::User)
    } else if name.starts_with(b"trusted.") {
        Ok(XattrClass::Trusted)
    } else if name.starts_with(b"security.") {
        Ok(XattrClass::Security)
    } else {
        errno(libc::EOPNOTSUPP)
    }
}

/// `xattr_permission` for reading (`write == false`) or changing an
/// attribute. Reading a `trusted.` attribute as non-root answers ENODATA
/// (it is invisible), changing it EPERM; `user.` attributes live only on
/// files and directories and follow the file's read/write permission, and
/// on a sticky directory only its owner may change them.
pub fn xattr_access(cred: &Credentials, a: &Attr, name: &[u8], write: bool) -> Result<()> {
    match xattr_class(name)? {
        XattrClass::Trusted if !cred.is_root() => {
            errno(if write { libc::EPERM } else { libc::ENODATA })
        }
        XattrClass::Trusted | XattrClass::Security => Ok(()),
        XattrClass::User => {
            if a.kind != FileKind::File && a.kind != FileKind::Dir {
                return errno(if write { libc::EPERM } else { libc::ENODATA });
            }
            if write && a.kind == FileKind::Dir && a.mode & libc::S_ISVTX != 0 && !cred.owns(a) {
                return errno(libc::EPERM);
            }
            check_access(cred, a, if write { MAY_WRITE } else { MAY_READ })
        }
    }
}

/// Whether `listxattr` shows `name` to `cred` (trusted names only to root).
pub fn xattr_listed(cred: &Credentials, name: &[u8]) -> bool {
    cred.is_root() || !name.starts_with(b"trusted.")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(kind: FileKind, mode: u32, uid: u32, gid: u32) -> Attr {
        let type_bits = match kind {
            FileKind::Dir => libc::S_IFDIR,
            _ => libc::S_IFREG,
        };
        Attr {
            ino: 10,
            generation: 0,
            kind,
            mode: type_bits | mode,
            nlink: 1,
            uid,
            gid,
            rdev: 0,
            size: 0,
            blocks: 0,
            atime_ns: 0,
            mtime_ns: 0,
            ctime_ns: 0,
        }
    }

    fn eno(r: Result<()>) -> i32 {
        r.err().map_or(0, |e| e.errno())
    }

    #[test]
    fn owner_is_judged_by_owner_bits_alone() {
        let f = attr(FileKind::File, 0o077, 1000, 100);
        let owner = Credentials::user(1000, 100);
        assert_eq!(eno(check_access(&owner, &f, MAY_READ)), libc::EACCES);
        let member = Credentials::user(1001, 100);
        assert_eq!(eno(check_access(&member, &f, MAY_READ | MAY_WRITE)), 0);
    }

    #[test]
    fn supplementary_groups_count() {
        let f = attr(FileKind::File, 0o640, 1000, 200);
        let mut c = Credentials::user(1001, 100);
        assert_eq!(eno(check_access(&c, &f, MAY_READ)), libc::EACCES);
        c.groups.push(200);
        assert_eq!(eno(check_access(&c, &f, MAY_READ)), 0);
        assert_eq!(eno(check_access(&c, &f, MAY_WRITE)), libc::EACCES);
    }

    #[test]
    fn root_overrides_but_not_execute_of_a_non_executable_file() {
        let root = Credentials::root();
        let f = attr(FileKind::File, 0o000, 1000, 100);
        assert_eq!(eno(check_access(&root, &f, MAY_READ | MAY_WRITE)), 0);
        assert_eq!(eno(check_access(&root, &f, MAY_EXEC)), libc::EACCES);
        let x = attr(FileKind::File, 0o001, 1000, 100);
        assert_eq!(eno(check_access(&root, &x, MAY_EXEC)), 0);
        let d = attr(FileKind::Dir, 0o000, 1000, 100);
        assert_eq!(eno(check_access(&root, &d, MAY_EXEC)), 0);
    }

    #[test]
    fn sticky_directory_protects_other_users_files() {
        let tmp = attr(FileKind::Dir, 0o1777, 0, 0);
        let theirs = attr(FileKind::File, 0o644, 1001, 100);
        let mine = attr(FileKind::File, 0o644, 1000, 100);
        let me = Credentials::user(1000, 100);
        assert_eq!(eno(may_delete(&me, &tmp, &theirs)), libc::EPERM);
        assert_eq!(eno(may_delete(&me, &tmp, &mine)), 0);
        assert_eq!(eno(may_delete(&Credentials::root(), &tmp, &theirs)), 0);
        let my_tmp = attr(FileKind::Dir, 0o1777, 1000, 100);
        assert_eq!(eno(may_delete(&me, &my_tmp, &theirs)), 0);
        let plain = attr(FileKind::Dir, 0o777, 0, 0);
        assert_eq!(eno(may_delete(&me, &plain, &theirs)), 0);
    }

    #[test]
    fn setgid_directory_gives_its_group_and_passes_the_bit_to_directories() {
        let dir = attr(FileKind::Dir, 0o2775, 0, 500);
        let me = Credentials::user(1000, 100);
        assert_eq!(
            new_inode_owner(&me, &dir, FileKind::File, 0o666),
            (1000, 500, 0o644)
        );
        assert_eq!(
            new_inode_owner(&me, &dir, FileKind::Dir, 0o777),
            (1000, 500, 0o2755)
        );
        let plain = attr(FileKind::Dir, 0o755, 0, 500);
        assert_eq!(
            new_inode_owner(&me, &plain, FileKind::File, 0o666),
            (1000, 100, 0o644)
        );
        // A set-group-ID executable in a group the creator is not in.
        let mut nomask = me.clone();
        nomask.umask = 0;
        assert_eq!(
            new_inode_owner(&nomask, &dir, FileKind::File, 0o2775).2,
            0o775
        );
    }

    #[test]
    fn chmod_chown_and_times() {
        let f = attr(FileKind::File, 0o644, 1000, 100);
        let owner = Credentials::user(1000, 100);
        let other = Credentials::user(1001, 100);
        assert_eq!(chmod(&owner, &f, 0o2755).ok(), Some(0o2755));
        assert_eq!(
            chmod(&other, &f, 0o600).err().map(|e| e.errno()),
            Some(libc::EPERM)
        );
        let g = attr(FileKind::File, 0o644, 1000, 300);
        assert_eq!(
            chmod(&owner, &g, 0o2755).ok(),
            Some(0o755),
            "not in group 300"
        );
        assert_eq!(eno(chown(&owner, &f, Some(1001), None)), libc::EPERM);
        assert_eq!(eno(chown(&owner, &f, Some(1000), None)), 0);
        assert_eq!(eno(chown(&owner, &f, None, Some(300))), libc::EPERM);
        let mut member = owner.clone();
        member.groups.push(300);
        assert_eq!(eno(chown(&member, &f, None, Some(300))), 0);
        assert_eq!(eno(chown(&other, &f, None, Some(100))), libc::EPERM);
        assert_eq!(eno(chown(&Credentials::root(), &f, Some(7), Some(7))), 0);
        let w = attr(FileKind::File, 0o666, 1000, 100);
        assert_eq!(eno(set_times(&other, &w, false)), 0);
        assert_eq!(eno(set_times(&other, &w, true)), libc::EPERM);
        assert_eq!(eno(set_times(&other, &f, false)), libc::EACCES);
    }

    #[test]
    fn setid_bits_after_write() {
        let me = Credentials::user(1000, 100);
        let f = attr(FileKind::File, 0o6755, 1000, 100);
        assert_eq!(mode_after_write(&me, &f), Some(0o755));
        let g = attr(FileKind::File, 0o2745, 1000, 100);
        assert_eq!(
            mode_after_write(&me, &g),
            None,
            "setgid without group exec is a lock bit"
        );
        assert_eq!(mode_after_write(&Credentials::root(), &f), None);
    }

    #[test]
    fn xattr_namespaces() {
        let me = Credentials::user(1000, 100);
        let f = attr(FileKind::File, 0o644, 1000, 100);
        let theirs = attr(FileKind::File, 0o644, 1001, 100);
        assert_eq!(eno(xattr_access(&me, &f, b"user.a", true)), 0);
        assert_eq!(
            eno(xattr_access(&me, &theirs, b"user.a", true)),
            libc::EACCES
        );
        assert_eq!(eno(xattr_access(&me, &theirs, b"user.a", false)), 0);
        assert_eq!(
            eno(xattr_access(&me, &f, b"trusted.a", false)),
            libc::ENODATA
        );
        assert_eq!(eno(xattr_access(&me, &f, b"trusted.a", true)), libc::EPERM);
        assert_eq!(
            eno(xattr_access(&Credentials::root(), &f, b"trusted.a", true)),
            0
        );
        assert_eq!(
            eno(xattr_access(&me, &f, b"system.posix_acl_access", true)),
            libc::EOPNOTSUPP
        );
        assert!(!xattr_listed(&me, b"trusted.overlay.opaque"));
        assert!(xattr_listed(&me, b"user.x"));
    }
}
