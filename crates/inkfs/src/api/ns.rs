//! Namespace requests on the attach session (docs/KERNEL-FREE.md, "Stage
//! 4: the channel"): what a client asks the server to change for it, and
//! the answer.
//!
//! One line per message, beside the lease messages (`super::lease`):
//!
//! ```text
//! client: ns SEQ CRED OP ARGS...      CRED = uid:gid:umask:g1,g2,... ("-": no groups)
//!   create DIR NAME MODE FLAGS        mkdir DIR NAME MODE
//!   mknod DIR NAME MODE RDEV          symlink DIR NAME TARGET
//!   link INO DIR NAME                 unlink DIR NAME
//!   rmdir DIR NAME                    rename DIR NAME DIR2 NAME2 FLAGS
//!   setattr INO MODE UID GID ATIME MTIME   ("-": unchanged; a time is
//!                                           "now" or nanoseconds)
//!   setxattr INO NAME VALUE FLAGS     removexattr INO NAME
//!   ... give=INO:GEN:LINES            (after any removal's arguments, at most
//!                                      two: unlink, rmdir, rename) the write
//!                                      lease of INO, grant GEN, given back
//!                                      with the request, once the server has
//!                                      read LINES lines of the session
//!   ... +dir                          (a request naming a directory first:
//!                                      its DIR) the directory's lease too
//!                                      (`super::dirlease`; only to a server
//!                                      whose grant said `dirs=1`)
//! server: done SEQ ERRNO INO IGEN GEN ERRNO 0: made; INO the inode made or
//!                                      changed, IGEN its generation; GEN the
//!                                      grant number of a write lease that
//!                                      came with it (0: none)
//!   ... +dir +lane                    (`+lane` only after `+dir`, only to a
//!                                      server whose grant said `lanes=1`)
//!                                      a lane with the directory's lease
//!                                      (`super::lanelease`)
//!         ... dir=DGEN:KERNEL          only to a request with `+dir`: the
//!             dir=0:REASON             directory's grant, or the refusal
//!         ... lane=K:END:S,...         only to a request with `+lane`, and
//!                                      only when a lane was leased with
//!                                      the directory
//! client: unheld INO                  a hold of an orphan ended (no answer)
//! ```
//!
//! Names, targets and values are `x` followed by their bytes in hex (a name
//! may hold any byte but `/` and NUL, a value any byte). The credentials
//! are the caller's as it states them: a client maps the pool read-write,
//! so believing it gives it nothing it does not have (the trust boundary).

use super::dirlease::{DirAnswer, ASK_WORD};
use super::lanelease::{LaneGrant, LANE_ASK_WORD};
use crate::perm::Credentials;
use crate::types::{SetAttr, TimeSet};

/// Longest symlink target or xattr value a request carries; longer ones
/// go through the mount.
pub const BYTES_MAX: usize = 4096;
/// Supplementary groups a request carries at most (the rest: through the
/// mount).
pub const GROUPS_MAX: usize = 64;
/// Longest request line: a name, a target or value, and numbers.
pub const REQUEST_MAX: usize = 2 * (2 * 255 + 2 * BYTES_MAX) + GROUPS_MAX * 11 + 512;

/// What a request changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// open(2) with O_CREAT: create `name` in `dir` (or open it if it
    /// exists and `flags` has no O_EXCL). A write access mode asks for the
    /// new file's write lease too.
    Create {
        dir: u64,
        name: Vec<u8>,
        mode: u32,
        flags: i32,
    },
    Mkdir {
        dir: u64,
        name: Vec<u8>,
        mode: u32,
    },
    Mknod {
        dir: u64,
        name: Vec<u8>,
        mode: u32,
        rdev: u64,
    },
    Symlink {
        dir: u64,
        name: Vec<u8>,
        target: Vec<u8>,
    },
    Link {
        ino: u64,
        dir: u64,
        name: Vec<u8>,
    },
    Unlink {
        dir: u64,
        name: Vec<u8>,
    },
    Rmdir {
        dir: u64,
        name: Vec<u8>,
    },
    Rename {
        dir: u64,
        name: Vec<u8>,
        to_dir: u64,
        to: Vec<u8>,
        flags: u32,
    },
    /// chmod, chown, utimens (never a size: truncate goes elsewhere).
    Setattr {
        ino: u64,
        set: SetAttr,
    },
    Setxattr {
        ino: u64,
        name: Vec<u8>,
        value: Vec<u8>,
        flags: i32,
    },
    Removexattr {
        ino: u64,
        name: Vec<u8>,
    },
}

/// A client's request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// The client's number for it (echoed in the answer).
    pub seq: u64,
    pub cred: Credentials,
    pub op: Op,
    /// Write leases the client gives back with the request (a removal's:
    /// the files it names), instead of by `released` on the session
    /// (docs/KERNEL-FREE.md, "Built: a removal carries its lease").
    pub give: Vec<Give>,
    /// `+dir`: the lease of the directory the request names first
    /// ([`Request::dir`]) is asked for too (`super::dirlease`).
    pub dir_lease: bool,
    /// `+lane` (only with `+dir`): a lane with it, if the client holds
    /// none (`super::lanelease`).
    pub lane_lease: bool,
}

/// Gives at most in one request (a rename's two names).
pub const GIVES_MAX: usize = 2;

/// A write lease given back with a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Give {
    pub ino: u64,
    /// The grant given back (the server ignores it if it is not the one
    /// it holds for this client, as it ignores a stale `released`).
    pub gen: u64,
    /// The lines the client had written on its session when it gave the
    /// lease back (the `return` lines of the blocks it freed among them):
    /// the server settles the lease once its session reader has read as
    /// many, so those blocks are taken back under the lease, as when
    /// `released` follows them on the session.
    pub lines: u64,
}

/// The server's answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Done {
    pub seq: u64,
    /// 0: made.
    pub errno: i32,
    /// The inode made or changed (0 when none).
    pub ino: u64,
    /// Its generation (the inode number's use: a hold checks it).
    pub igen: u64,
    /// The grant number of a write lease granted with it (0: none).
    pub gen: u64,
    /// The answer to `+dir` (None: not asked; an older server never
    /// answers it, and says so in its attach grant).
    pub dir: Option<DirAnswer>,
    /// A lane leased with the directory (only to `+lane`).
    pub lane: Option<LaneGrant>,
}

fn hex(b: &[u8]) -> String {
    let mut s = String::with_capacity(1 + 2 * b.len());
    s.push('x');
    for byte in b {
        s.push_str(&format!("{byte:02x}"));
    }
    s
}

/// The value of one hex digit (either case).
fn nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    let h = s.strip_prefix('x')?.as_bytes();
    if h.len() % 2 != 0 {
        return None;
    }
    // Two digits a byte, looked up directly: this runs on the server's
    // ring thread for every name of every request.
    let mut out = Vec::with_capacity(h.len() / 2);
    for pair in h.chunks_exact(2) {
        out.push(nibble(pair[0])? << 4 | nibble(pair[1])?);
    }
    Some(out)
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_string(), |v| v.to_string())
}

fn time(t: Option<TimeSet>) -> String {
    match t {
        None => "-".into(),
        Some(TimeSet::Now) => "now".into(),
        Some(TimeSet::At(ns)) => ns.to_string(),
    }
}

fn parse_opt<T: std::str::FromStr>(s: &str) -> Option<Option<T>> {
    if s == "-" {
        return Some(None);
    }
    s.parse().ok().map(Some)
}

fn parse_time(s: &str) -> Option<Option<TimeSet>> {
    match s {
        "-" => Some(None),
        "now" => Some(Some(TimeSet::Now)),
        _ => s.parse().ok().map(|ns| Some(TimeSet::At(ns))),
    }
}

/// `give=INO:GEN:LINES`.
fn parse_give(word: &str) -> Option<Give> {
    let mut f = word.strip_prefix("give=")?.split(':');
    let g = Give {
        ino: f.next()?.parse().ok()?,
        gen: f.next()?.parse().ok()?,
        lines: f.next()?.parse().ok()?,
    };
    f.next().is_none().then_some(g)
}

fn cred_word(c: &Credentials) -> String {
    let groups = if c.groups.is_empty() {
        "-".to_string()
    } else {
        c.groups
            .iter()
            .map(|g| g.to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    format!("{}:{}:{}:{groups}", c.uid, c.gid, c.umask)
}

fn parse_cred(s: &str) -> Option<Credentials> {
    let mut f = s.split(':');
    let uid = f.next()?.parse().ok()?;
    let gid = f.next()?.parse().ok()?;
    let umask: u32 = f.next()?.parse().ok()?;
    let g = f.next()?;
    if f.next().is_some() || umask > 0o777 {
        return None;
    }
    let groups = if g == "-" {
        Vec::new()
    } else {
        g.split(',')
            .map(|x| x.parse().ok())
            .collect::<Option<Vec<u32>>>()?
    };
    if groups.len() > GROUPS_MAX {
        return None;
    }
    Some(Credentials {
        uid,
        gid,
        groups,
        umask,
    })
}

impl Request {
    /// The directory the request names first: the one `+dir` asks the
    /// lease of (None: a request by inode, setattr and xattrs).
    pub fn dir(&self) -> Option<u64> {
        match &self.op {
            Op::Create { dir, .. }
            | Op::Mkdir { dir, .. }
            | Op::Mknod { dir, .. }
            | Op::Symlink { dir, .. }
            | Op::Link { dir, .. }
            | Op::Unlink { dir, .. }
            | Op::Rmdir { dir, .. }
            | Op::Rename { dir, .. } => Some(*dir),
            Op::Setattr { .. } | Op::Setxattr { .. } | Op::Removexattr { .. } => None,
        }
    }

    /// Whether the request fits in one line (a target or value longer than
    /// [`BYTES_MAX`], or too many groups, do not: use the mount).
    pub fn fits(&self) -> bool {
        let big = match &self.op {
            Op::Symlink { target, .. } => target.len(),
            Op::Setxattr { value, name, .. } => value.len().max(name.len()),
            _ => 0,
        };
        big <= BYTES_MAX && self.cred.groups.len() <= GROUPS_MAX
    }

    /// The line (with its newline), without the leading word's "ns ".
    pub fn line(&self) -> String {
        let args = match &self.op {
            Op::Create {
                dir,
                name,
                mode,
                flags,
            } => format!("create {dir} {} {mode} {flags}", hex(name)),
            Op::Mkdir { dir, name, mode } => format!("mkdir {dir} {} {mode}", hex(name)),
            Op::Mknod {
                dir,
                name,
                mode,
                rdev,
            } => format!("mknod {dir} {} {mode} {rdev}", hex(name)),
            Op::Symlink { dir, name, target } => {
                format!("symlink {dir} {} {}", hex(name), hex(target))
            }
            Op::Link { ino, dir, name } => format!("link {ino} {dir} {}", hex(name)),
            Op::Unlink { dir, name } => format!("unlink {dir} {}", hex(name)),
            Op::Rmdir { dir, name } => format!("rmdir {dir} {}", hex(name)),
            Op::Rename {
                dir,
                name,
                to_dir,
                to,
                flags,
            } => format!("rename {dir} {} {to_dir} {} {flags}", hex(name), hex(to)),
            Op::Setattr { ino, set } => format!(
                "setattr {ino} {} {} {} {} {}",
                opt(set.mode),
                opt(set.uid),
                opt(set.gid),
                time(set.atime),
                time(set.mtime)
            ),
            Op::Setxattr {
                ino,
                name,
                value,
                flags,
            } => format!("setxattr {ino} {} {} {flags}", hex(name), hex(value)),
            Op::Removexattr { ino, name } => format!("removexattr {ino} {}", hex(name)),
        };
        let mut line = format!("ns {} {} {args}", self.seq, cred_word(&self.cred));
        for g in &self.give {
            line.push_str(&format!(" give={}:{}:{}", g.ino, g.gen, g.lines));
        }
        if self.dir_lease {
            line.push(' ');
            line.push_str(ASK_WORD);
        }
        if self.lane_lease {
            line.push(' ');
            line.push_str(LANE_ASK_WORD);
        }
        line.push('\n');
        line
    }

    /// Parse the words after "ns" (None: malformed).
    pub fn parse(mut w: std::str::SplitAsciiWhitespace<'_>) -> Option<Request> {
        let seq = w.next()?.parse().ok()?;
        let cred = parse_cred(w.next()?)?;
        let word = w.next()?;
        let op = match word {
            "create" => {
                let dir = w.next()?.parse().ok()?;
                let name = unhex(w.next()?)?;
                let mode = w.next()?.parse().ok()?;
                let flags = w.next()?.parse().ok()?;
                Op::Create {
                    dir,
                    name,
                    mode,
                    flags,
                }
            }
            "mkdir" => Op::Mkdir {
                dir: w.next()?.parse().ok()?,
                name: unhex(w.next()?)?,
                mode: w.next()?.parse().ok()?,
            },
            "mknod" => Op::Mknod {
                dir: w.next()?.parse().ok()?,
                name: unhex(w.next()?)?,
                mode: w.next()?.parse().ok()?,
                rdev: w.next()?.parse().ok()?,
            },
            "symlink" => Op::Symlink {
                dir: w.next()?.parse().ok()?,
                name: unhex(w.next()?)?,
                target: unhex(w.next()?)?,
            },
            "link" => Op::Link {
                ino: w.next()?.parse().ok()?,
                dir: w.next()?.parse().ok()?,
                name: unhex(w.next()?)?,
            },
            "unlink" => Op::Unlink {
                dir: w.next()?.parse().ok()?,
                name: unhex(w.next()?)?,
            },
            "rmdir" => Op::Rmdir {
                dir: w.next()?.parse().ok()?,
                name: unhex(w.next()?)?,
            },
            "rename" => Op::Rename {
                dir: w.next()?.parse().ok()?,
                name: unhex(w.next()?)?,
                to_dir: w.next()?.parse().ok()?,
                to: unhex(w.next()?)?,
                flags: w.next()?.parse().ok()?,
            },
            "setattr" => Op::Setattr {
                ino: w.next()?.parse().ok()?,
                set: SetAttr {
                    mode: parse_opt(w.next()?)?,
                    uid: parse_opt(w.next()?)?,
                    gid: parse_opt(w.next()?)?,
                    size: None,
                    atime: parse_time(w.next()?)?,
                    mtime: parse_time(w.next()?)?,
                },
            },
            "setxattr" => Op::Setxattr {
                ino: w.next()?.parse().ok()?,
                name: unhex(w.next()?)?,
                value: unhex(w.next()?)?,
                flags: w.next()?.parse().ok()?,
            },
            "removexattr" => Op::Removexattr {
                ino: w.next()?.parse().ok()?,
                name: unhex(w.next()?)?,
            },
            _ => return None,
        };
        let mut give = Vec::new();
        let mut dir_lease = false;
        let mut lane_lease = false;
        for word in w {
            if word == ASK_WORD && !dir_lease {
                dir_lease = true;
            } else if word == LANE_ASK_WORD && dir_lease && !lane_lease {
                lane_lease = true;
            } else {
                give.push(parse_give(word)?);
            }
        }
        let removes = matches!(op, Op::Unlink { .. } | Op::Rmdir { .. } | Op::Rename { .. });
        if give.len() > GIVES_MAX || (!give.is_empty() && !removes) {
            return None;
        }
        let r = Request {
            seq,
            cred,
            op,
            give,
            dir_lease,
            lane_lease,
        };
        // `+dir` only where there is a directory to lease.
        (!r.dir_lease || r.dir().is_some()).then_some(r)
    }
}

impl Done {
    pub fn line(&self) -> String {
        let mut out = String::new();
        self.write_line(&mut out);
        out
    }

    /// Append the line (with its newline) to `out` (the server's ring
    /// thread reuses one buffer for every answer).
    pub fn write_line(&self, out: &mut String) {
        use std::fmt::Write;
        // Writing to a String cannot fail.
        let _ = write!(
            out,
            "done {} {} {} {} {}",
            self.seq, self.errno, self.ino, self.igen, self.gen
        );
        if let Some(d) = &self.dir {
            out.push(' ');
            out.push_str(&d.word());
        }
        if let Some(g) = &self.lane {
            out.push(' ');
            out.push_str(&super::lanelease::grant_word(g));
        }
        out.push('\n');
    }

    /// Parse the words after "done".
    pub fn parse(mut w: std::str::SplitAsciiWhitespace<'_>) -> Option<Done> {
        let mut d = Done {
            seq: w.next()?.parse().ok()?,
            errno: w.next()?.parse().ok()?,
            ino: w.next()?.parse().ok()?,
            igen: w.next()?.parse().ok()?,
            gen: w.next()?.parse().ok()?,
            dir: None,
            lane: None,
        };
        if let Some(word) = w.next() {
            d.dir = Some(DirAnswer::parse(word)?);
        }
        if let Some(word) = w.next() {
            d.lane = Some(super::lanelease::parse_grant_word(word)?);
        }
        (w.next().is_none() && d.errno >= 0).then_some(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(op: Op) {
        let gives: &[Give] = match op {
            Op::Unlink { .. } => &[Give {
                ino: 7,
                gen: 3,
                lines: 12,
            }],
            Op::Rename { .. } => &[
                Give {
                    ino: 7,
                    gen: 3,
                    lines: 12,
                },
                Give {
                    ino: u64::MAX,
                    gen: 1,
                    lines: 0,
                },
            ],
            _ => &[],
        };
        for give in [&[][..], gives] {
            round_with(op.clone(), give.to_vec(), false);
            if !matches!(
                op,
                Op::Setattr { .. } | Op::Setxattr { .. } | Op::Removexattr { .. }
            ) {
                round_with(op.clone(), give.to_vec(), true);
                round_with_lane(op.clone(), give.to_vec());
            }
        }
    }

    fn round_with(op: Op, give: Vec<Give>, dir_lease: bool) {
        round_request(op, give, dir_lease, false);
    }

    fn round_with_lane(op: Op, give: Vec<Give>) {
        round_request(op, give, true, true);
    }

    fn round_request(op: Op, give: Vec<Give>, dir_lease: bool, lane_lease: bool) {
        let r = Request {
            seq: 9,
            cred: Credentials {
                uid: 1000,
                gid: 100,
                groups: vec![4, 27],
                umask: 0o022,
            },
            op,
            give,
            dir_lease,
            lane_lease,
        };
        let line = r.line();
        assert!(line.len() <= REQUEST_MAX, "{}", line.len());
        let mut w = line.trim_end().split_ascii_whitespace();
        assert_eq!(w.next(), Some("ns"));
        assert_eq!(Request::parse(w), Some(r));
    }

    #[test]
    fn requests_round_trip() {
        let odd = b"a b\nc\x01\xff".to_vec();
        round(Op::Create {
            dir: 1,
            name: odd.clone(),
            mode: 0o644,
            flags: libc::O_CREAT | libc::O_WRONLY,
        });
        round(Op::Mkdir {
            dir: 2,
            name: b"d".to_vec(),
            mode: 0o755,
        });
        round(Op::Mknod {
            dir: 2,
            name: b"p".to_vec(),
            mode: libc::S_IFIFO | 0o600,
            rdev: 0,
        });
        round(Op::Symlink {
            dir: 3,
            name: b"l".to_vec(),
            target: vec![b'z'; BYTES_MAX],
        });
        round(Op::Link {
            ino: 5,
            dir: 3,
            name: odd.clone(),
        });
        round(Op::Unlink {
            dir: 3,
            name: vec![b'n'; 255],
        });
        round(Op::Rmdir {
            dir: 3,
            name: b"x".to_vec(),
        });
        round(Op::Rename {
            dir: 3,
            name: b"a".to_vec(),
            to_dir: 4,
            to: odd,
            flags: libc::RENAME_NOREPLACE,
        });
        round(Op::Setattr {
            ino: 7,
            set: SetAttr {
                mode: Some(0o4755),
                uid: None,
                gid: Some(5),
                size: None,
                atime: Some(TimeSet::Now),
                mtime: Some(TimeSet::At(-1_500_000_000)),
            },
        });
        round(Op::Setxattr {
            ino: 7,
            name: b"user.k".to_vec(),
            value: vec![0; BYTES_MAX],
            flags: 1,
        });
        round(Op::Removexattr {
            ino: 7,
            name: b"user.k".to_vec(),
        });
    }

    #[test]
    fn answers_round_trip_and_junk_is_refused() {
        let d = Done {
            seq: 3,
            errno: libc::EEXIST,
            ino: 0,
            igen: 0,
            gen: 0,
            dir: None,
            lane: None,
        };
        let line = d.line();
        // An answer to a request without `+dir` is an older server's
        // line, word for word: an older client takes it.
        assert_eq!(line, "done 3 17 0 0 0\n");
        let mut w = line.split_ascii_whitespace();
        assert_eq!(w.next(), Some("done"));
        assert_eq!(Done::parse(w), Some(d.clone()));
        for dir in [
            DirAnswer::Refused(crate::api::dirlease::Refusal::Gone),
            DirAnswer::Granted {
                gen: 4,
                kernel: crate::api::dirlease::KernelView::Children(vec![9]),
            },
        ] {
            let d = Done {
                dir: Some(dir),
                ..d.clone()
            };
            let line = d.line();
            let mut w = line.split_ascii_whitespace();
            assert_eq!(w.next(), Some("done"));
            assert_eq!(Done::parse(w), Some(d.clone()));
            // With a lane leased too (`+lane`).
            let d = Done {
                lane: Some(LaneGrant {
                    lane: 2,
                    slots: vec![4, 6],
                    table_end: 99,
                }),
                ..d
            };
            let line = d.line();
            let mut w = line.split_ascii_whitespace();
            assert_eq!(w.next(), Some("done"));
            assert_eq!(Done::parse(w), Some(d));
        }
        for bad in [
            "1 0:0:0:- unlink 1",
            "1 0:0:0:- unlink 1 x0",
            "1 0:0:0:- unlink 1 abc",
            "1 0:0:0:- unlink 1 x61 extra",
            "1 0:0:0:- unlink 1 x+f",
            "1 0:0:0:- unlink 1 x6g",
            "1 0:0:1000:- unlink 1 x61",
            "1 0:0 unlink 1 x61",
            "1 0:0:0:- frob 1 x61",
            "1 0:0:0:- setattr 1 - - - later -",
            // A give only after a removal, whole, at most two.
            "1 0:0:0:- mkdir 1 x61 448 give=5:1:0",
            "1 0:0:0:- unlink 1 x61 give=5:1",
            "1 0:0:0:- unlink 1 x61 give=5:1:0:2",
            "1 0:0:0:- unlink 1 x61 give=5:-1:0",
            "1 0:0:0:- unlink 1 x61 gift=5:1:0",
            "1 0:0:0:- unlink 1 x61 give=5:1:0 give=6:1:0 give=7:1:0",
            // `+dir` once, and only where a directory is named.
            "1 0:0:0:- unlink 1 x61 +dir +dir",
            "1 0:0:0:- setattr 1 - - - - - +dir",
            "1 0:0:0:- removexattr 1 x61 +dir",
            "1 0:0:0:- unlink 1 x61 +dirs",
            // `+lane` once, only after `+dir`.
            "1 0:0:0:- unlink 1 x61 +lane",
            "1 0:0:0:- unlink 1 x61 +lane +dir",
            "1 0:0:0:- unlink 1 x61 +dir +lane +lane",
        ] {
            assert_eq!(Request::parse(bad.split_ascii_whitespace()), None, "{bad}");
        }
        assert_eq!(Done::parse("1 -5 0 0 0".split_ascii_whitespace()), None);
        assert_eq!(Done::parse("1 0 0 0".split_ascii_whitespace()), None);
        assert_eq!(
            Done::parse("1 0 0 0 0 dir=5".split_ascii_whitespace()),
            None
        );
        assert_eq!(
            Done::parse("1 0 0 0 0 dir=5:many x".split_ascii_whitespace()),
            None
        );
    }
}
