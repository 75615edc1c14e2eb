//! The permission table: every operation that checks permissions, run by
//! four callers (the owner of the files, a member of their group through a
//! supplementary group, anyone else, root), with the errno Linux gives each.
//! Shared by the engine's test (`tests/permissions.rs`, through
//! `inkfs::api` with path resolution) and the FUSE test
//! (`crates/inkfs-fuse/tests/permissions.rs`, through the mount as real
//! users): both must give exactly these answers.
//!
//! Each case builds its own small tree (as root) under a fresh directory,
//! so cases do not disturb each other; paths below are relative to it.

#![allow(dead_code)]

/// Who runs an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Who {
    /// uid 2001, gid 2001, supplementary group 4001: owns the files.
    Owner,
    /// uid 2002, gid 2002, supplementary group 3001: the files' group.
    Member,
    /// uid 2003, gid 2003, no supplementary group.
    Other,
    Root,
}

pub const WHO: [Who; 4] = [Who::Owner, Who::Member, Who::Other, Who::Root];

pub const OWNER_UID: u32 = 2001;
/// The group the tree's files belong to (MEMBER's supplementary group).
pub const GROUP: u32 = 3001;
/// OWNER's supplementary group (a chgrp target it may use).
pub const OWNER_EXTRA_GROUP: u32 = 4001;

impl Who {
    /// (uid, gid, supplementary groups)
    pub fn ids(self) -> (u32, u32, Vec<u32>) {
        match self {
            Who::Owner => (2001, 2001, vec![OWNER_EXTRA_GROUP]),
            Who::Member => (2002, 2002, vec![GROUP]),
            Who::Other => (2003, 2003, vec![]),
            Who::Root => (0, 0, vec![]),
        }
    }
}

/// A node of a case's tree: path, kind, permission bits, owner and group.
#[derive(Clone, Copy, Debug)]
pub struct Node {
    pub path: &'static str,
    pub dir: bool,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

const fn dir(path: &'static str, mode: u32) -> Node {
    Node {
        path,
        dir: true,
        mode,
        uid: OWNER_UID,
        gid: GROUP,
    }
}
const fn file(path: &'static str, mode: u32) -> Node {
    Node {
        path,
        dir: false,
        mode,
        uid: OWNER_UID,
        gid: GROUP,
    }
}
const fn root_dir(path: &'static str, mode: u32) -> Node {
    Node {
        path,
        dir: true,
        mode,
        uid: 0,
        gid: 0,
    }
}

/// Every file is created with 3 bytes, "abc", and the xattr user.k = "v".
pub const CONTENT: &[u8] = b"abc";
pub const XATTR: (&str, &[u8]) = ("user.k", b"v");

#[derive(Clone, Copy, Debug)]
pub enum Op {
    /// open(2) an existing file with these flags (and close it).
    Open(&'static str, i32),
    /// open(path, O_CREAT | O_WRONLY | O_EXCL, mode)
    Create(&'static str, u32),
    /// stat(2)
    Stat(&'static str),
    /// access(2) with R_OK/W_OK/X_OK bits
    Access(&'static str, u32),
    Unlink(&'static str),
    Rmdir(&'static str),
    Mkdir(&'static str, u32),
    Rename(&'static str, &'static str),
    /// link(existing, new)
    Link(&'static str, &'static str),
    /// symlink(target, path)
    Symlink(&'static str, &'static str),
    /// mknod(path, mode with S_IFMT, rdev)
    Mknod(&'static str, u32, u64),
    Chmod(&'static str, u32),
    Chown(&'static str, Option<u32>, Option<u32>),
    /// utimensat: to explicit times (true) or to now (false)
    Utimes(&'static str, bool),
    Truncate(&'static str, u64),
    SetXattr(&'static str, &'static str),
    GetXattr(&'static str, &'static str),
    RemoveXattr(&'static str, &'static str),
    ReadDir(&'static str),
    /// open O_WRONLY, write one byte at 0, close
    Write(&'static str),
    /// `Create` with this umask instead of the callers' usual 022.
    CreateMasked(&'static str, u32, u32),
    /// `Mkdir` with this umask instead of 022.
    MkdirMasked(&'static str, u32, u32),
}

/// The umask every caller runs with, but for the `*Masked` operations.
pub const UMASK: u32 = 0o022;

/// What else to verify after a successful operation (as root).
#[derive(Clone, Copy, Debug)]
pub enum Check {
    None,
    /// The path's group is the caller's gid (0) or this gid.
    Gid(&'static str, Option<u32>),
    /// The path's permission bits (with set-id bits) after an operation by
    /// a user other than root, and after one by root.
    Mode(&'static str, u32, u32),
}

pub struct Case {
    pub name: &'static str,
    pub tree: &'static [Node],
    pub op: Op,
    /// errno for Owner, Member, Other, Root (0: success).
    pub expect: [i32; 4],
    pub check: Check,
}

const OK: i32 = 0;
const EACCES: i32 = libc::EACCES;
const EPERM: i32 = libc::EPERM;

pub const CASES: &[Case] = &[
    Case {
        name: "read a 0640 file",
        tree: &[file("f", 0o640)],
        op: Op::Open("f", libc::O_RDONLY),
        expect: [OK, OK, EACCES, OK],
        check: Check::None,
    },
    Case {
        name: "open a 0640 file for writing",
        tree: &[file("f", 0o640)],
        op: Op::Open("f", libc::O_WRONLY),
        expect: [OK, EACCES, EACCES, OK],
        check: Check::None,
    },
    Case {
        name: "O_RDONLY|O_TRUNC needs write permission",
        tree: &[file("f", 0o640)],
        op: Op::Open("f", libc::O_RDONLY | libc::O_TRUNC),
        expect: [OK, EACCES, EACCES, OK],
        check: Check::None,
    },
    Case {
        name: "O_NOATIME only for the owner",
        tree: &[file("f", 0o644)],
        op: Op::Open("f", libc::O_RDONLY | libc::O_NOATIME),
        expect: [OK, EPERM, EPERM, OK],
        check: Check::None,
    },
    Case {
        name: "root may not execute a file nobody may",
        tree: &[file("f", 0o644)],
        op: Op::Access("f", libc::X_OK as u32),
        expect: [EACCES, EACCES, EACCES, EACCES],
        check: Check::None,
    },
    Case {
        name: "access R_OK through the group",
        tree: &[file("f", 0o640)],
        op: Op::Access("f", libc::R_OK as u32),
        expect: [OK, OK, EACCES, OK],
        check: Check::None,
    },
    Case {
        name: "the owner is judged by the owner bits alone",
        tree: &[file("f", 0o066)],
        op: Op::Open("f", libc::O_RDONLY),
        expect: [EACCES, OK, OK, OK],
        check: Check::None,
    },
    Case {
        name: "search permission along the path",
        tree: &[dir("d", 0o700), file("d/f", 0o644)],
        op: Op::Stat("d/f"),
        expect: [OK, EACCES, EACCES, OK],
        check: Check::None,
    },
    Case {
        name: "search permission through the group",
        tree: &[dir("d", 0o710), file("d/f", 0o644)],
        op: Op::Stat("d/f"),
        expect: [OK, OK, EACCES, OK],
        check: Check::None,
    },
    Case {
        name: "readdir needs read permission",
        tree: &[dir("d", 0o711)],
        op: Op::ReadDir("d"),
        expect: [OK, EACCES, EACCES, OK],
        check: Check::None,
    },
    Case {
        name: "create needs write permission on the directory",
        tree: &[dir("d", 0o775)],
        op: Op::Create("d/new", 0o644),
        expect: [OK, OK, EACCES, OK],
        check: Check::None,
    },
    Case {
        name: "mkdir in a read-only directory",
        tree: &[root_dir("d", 0o555)],
        op: Op::Mkdir("d/sub", 0o755),
        expect: [EACCES, EACCES, EACCES, OK],
        check: Check::None,
    },
    Case {
        name: "a new file takes the set-group-ID directory's group",
        tree: &[Node {
            path: "d",
            dir: true,
            mode: 0o2777,
            uid: 0,
            gid: GROUP,
        }],
        op: Op::Create("d/new", 0o644),
        expect: [OK, OK, OK, OK],
        check: Check::Gid("d/new", Some(GROUP)),
    },
    Case {
        name: "a new directory takes the set-group-ID bit too",
        tree: &[Node {
            path: "d",
            dir: true,
            mode: 0o2777,
            uid: 0,
            gid: GROUP,
        }],
        op: Op::Mkdir("d/sub", 0o755),
        expect: [OK, OK, OK, OK],
        check: Check::Mode("d/sub", 0o2755, 0o2755),
    },
    Case {
        name: "a new file's group is the creator's elsewhere",
        tree: &[root_dir("d", 0o777)],
        op: Op::Create("d/new", 0o644),
        expect: [OK, OK, OK, OK],
        check: Check::Gid("d/new", None),
    },
    Case {
        name: "symlink needs write permission on the directory",
        tree: &[dir("d", 0o755)],
        op: Op::Symlink("target", "d/link"),
        expect: [OK, EACCES, EACCES, OK],
        check: Check::None,
    },
    Case {
        name: "a FIFO anyone may make where they may write",
        tree: &[root_dir("d", 0o777)],
        op: Op::Mknod("d/fifo", libc::S_IFIFO | 0o644, 0),
        expect: [OK, OK, OK, OK],
        check: Check::None,
    },
    Case {
        name: "a device node only root may make",
        tree: &[root_dir("d", 0o777)],
        op: Op::Mknod("d/null", libc::S_IFCHR | 0o644, 0x0103),
        expect: [EPERM, EPERM, EPERM, OK],
        check: Check::None,
    },
    Case {
        name: "unlink needs write permission on the directory",
        tree: &[dir("d", 0o755), file("d/f", 0o666)],
        op: Op::Unlink("d/f"),
        expect: [OK, EACCES, EACCES, OK],
        check: Check::None,
    },
    Case {
        name: "a sticky directory protects others' files from unlink",
        tree: &[root_dir("t", 0o1777), file("t/f", 0o666)],
        op: Op::Unlink("t/f"),
        expect: [OK, EPERM, EPERM, OK],
        check: Check::None,
    },
    Case {
        name: "a sticky directory protects others' files from rename",
        tree: &[root_dir("t", 0o1777), file("t/f", 0o666)],
        op: Op::Rename("t/f", "t/g"),
        expect: [OK, EPERM, EPERM, OK],
        check: Check::None,
    },
    Case {
        name: "the owner of a sticky directory may remove anything in it",
        tree: &[
            dir("t", 0o1777),
            Node {
                path: "t/f",
                dir: false,
                mode: 0o666,
                uid: 2003,
                gid: 2003,
            },
        ],
        op: Op::Unlink("t/f"),
        expect: [OK, EPERM, OK, OK],
        check: Check::None,
    },
    Case {
        name: "rmdir needs write permission on the parent",
        tree: &[dir("d", 0o775), dir("d/sub", 0o777)],
        op: Op::Rmdir("d/sub"),
        expect: [OK, OK, EACCES, OK],
        check: Check::None,
    },
    Case {
        name: "a directory moved to another parent needs write permission on itself",
        tree: &[
            root_dir("a", 0o777),
            root_dir("b", 0o777),
            dir("a/sub", 0o755),
        ],
        op: Op::Rename("a/sub", "b/sub"),
        expect: [OK, EACCES, EACCES, OK],
        check: Check::None,
    },
    Case {
        name: "rename over a file needs write permission on both directories",
        tree: &[
            root_dir("a", 0o777),
            dir("b", 0o775),
            file("a/f", 0o644),
            file("b/g", 0o644),
        ],
        op: Op::Rename("a/f", "b/g"),
        expect: [OK, OK, EACCES, OK],
        check: Check::None,
    },
    Case {
        name: "link needs write permission on the directory",
        tree: &[dir("d", 0o775), file("f", 0o666)],
        op: Op::Link("f", "d/l"),
        expect: [OK, OK, EACCES, OK],
        check: Check::None,
    },
    Case {
        name: "link to a file one may neither read nor write (protected_hardlinks)",
        tree: &[root_dir("d", 0o777), file("f", 0o600)],
        op: Op::Link("f", "d/l"),
        expect: [OK, EPERM, EPERM, OK],
        check: Check::None,
    },
    Case {
        name: "chmod only by the owner",
        tree: &[file("f", 0o666)],
        op: Op::Chmod("f", 0o600),
        expect: [OK, EPERM, EPERM, OK],
        check: Check::None,
    },
    Case {
        name: "chmod drops set-group-ID outside the owner's groups",
        tree: &[Node {
            path: "f",
            dir: false,
            mode: 0o644,
            uid: OWNER_UID,
            gid: 2002,
        }],
        op: Op::Chmod("f", 0o2755),
        expect: [OK, EPERM, EPERM, OK],
        check: Check::Mode("f", 0o755, 0o2755),
    },
    Case {
        name: "chown to another user only by root",
        tree: &[file("f", 0o644)],
        op: Op::Chown("f", Some(2002), None),
        expect: [EPERM, EPERM, EPERM, OK],
        check: Check::None,
    },
    Case {
        name: "chgrp by the owner to a group it is in",
        tree: &[file("f", 0o644)],
        op: Op::Chown("f", None, Some(OWNER_EXTRA_GROUP)),
        expect: [OK, EPERM, EPERM, OK],
        check: Check::None,
    },
    Case {
        name: "chown drops set-user-ID, even root's",
        tree: &[file("f", 0o4755)],
        op: Op::Chown("f", None, Some(OWNER_EXTRA_GROUP)),
        expect: [OK, EPERM, EPERM, OK],
        check: Check::Mode("f", 0o755, 0o755),
    },
    Case {
        name: "times to now with write permission",
        tree: &[file("f", 0o664)],
        op: Op::Utimes("f", false),
        expect: [OK, OK, EACCES, OK],
        check: Check::None,
    },
    Case {
        name: "explicit times only by the owner",
        tree: &[file("f", 0o666)],
        op: Op::Utimes("f", true),
        expect: [OK, EPERM, EPERM, OK],
        check: Check::None,
    },
    Case {
        name: "truncate needs write permission",
        tree: &[file("f", 0o644)],
        op: Op::Truncate("f", 1),
        expect: [OK, EACCES, EACCES, OK],
        check: Check::None,
    },
    Case {
        name: "a write by its owner drops set-user-ID, root's keeps it",
        tree: &[file("f", 0o4755)],
        op: Op::Write("f"),
        expect: [OK, EACCES, EACCES, OK],
        check: Check::Mode("f", 0o755, 0o4755),
    },
    Case {
        name: "any unprivileged writer drops set-user-ID",
        tree: &[file("f", 0o4777)],
        op: Op::Write("f"),
        expect: [OK, OK, OK, OK],
        check: Check::Mode("f", 0o777, 0o4777),
    },
    Case {
        name: "user xattrs follow write permission",
        tree: &[file("f", 0o664)],
        op: Op::SetXattr("f", "user.new"),
        expect: [OK, OK, EACCES, OK],
        check: Check::None,
    },
    Case {
        name: "user xattrs follow read permission",
        tree: &[file("f", 0o640)],
        op: Op::GetXattr("f", "user.k"),
        expect: [OK, OK, EACCES, OK],
        check: Check::None,
    },
    Case {
        name: "removing a user xattr needs write permission",
        tree: &[file("f", 0o644)],
        op: Op::RemoveXattr("f", "user.k"),
        expect: [OK, EACCES, EACCES, OK],
        check: Check::None,
    },
    Case {
        name: "trusted xattrs only for root",
        tree: &[file("f", 0o666)],
        op: Op::SetXattr("f", "trusted.t"),
        expect: [EPERM, EPERM, EPERM, OK],
        check: Check::None,
    },
    Case {
        name: "user xattrs on a sticky directory only by its owner",
        tree: &[dir("t", 0o1777)],
        op: Op::SetXattr("t", "user.new"),
        expect: [OK, EPERM, EPERM, OK],
        check: Check::None,
    },
    Case {
        name: "the umask masks a new file's mode",
        tree: &[dir("d", 0o777)],
        op: Op::CreateMasked("d/new", 0o666, 0o077),
        expect: [OK, OK, OK, OK],
        check: Check::Mode("d/new", 0o600, 0o600),
    },
    Case {
        name: "the umask masks a new directory's mode",
        tree: &[dir("d", 0o777)],
        op: Op::MkdirMasked("d/sub", 0o777, 0o027),
        expect: [OK, OK, OK, OK],
        check: Check::Mode("d/sub", 0o750, 0o750),
    },
    Case {
        name: "the umask leaves the set-group-ID a directory inherits",
        tree: &[Node {
            path: "d",
            dir: true,
            mode: 0o2777,
            uid: 0,
            gid: GROUP,
        }],
        op: Op::MkdirMasked("d/sub", 0o777, 0o077),
        expect: [OK, OK, OK, OK],
        check: Check::Mode("d/sub", 0o2700, 0o2700),
    },
    Case {
        name: "any unprivileged writer drops set-group-ID of a group-executable file",
        tree: &[file("f", 0o2777)],
        op: Op::Write("f"),
        expect: [OK, OK, OK, OK],
        check: Check::Mode("f", 0o777, 0o2777),
    },
    Case {
        name: "a write keeps set-group-ID of a file the group may not execute",
        tree: &[file("f", 0o2766)],
        op: Op::Write("f"),
        expect: [OK, OK, OK, OK],
        check: Check::Mode("f", 0o2766, 0o2766),
    },
    Case {
        name: "a truncate by an unprivileged writer drops set-user-ID",
        tree: &[file("f", 0o4777)],
        op: Op::Truncate("f", 1),
        expect: [OK, OK, OK, OK],
        check: Check::Mode("f", 0o777, 0o4777),
    },
];
