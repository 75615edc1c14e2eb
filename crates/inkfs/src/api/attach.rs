//! The attach exchange on a mount server's control socket
//! (docs/KERNEL-FREE.md, "Attaching"): where the socket is, and the one
//! message that carries descriptors. Both ends use it: the client
//! ([`super::client`]) and the server (inkfs-fuse's `attach.rs`).
//!
//! ```text
//! client: attach\n
//! server: ok layout=L id=N slot=I mode=MODE[ data=T]\n
//!         + 3 descriptors (SCM_RIGHTS): the pool (the server's own open
//!         file description: the client shares its claim), the memfd of
//!         the epoch table, and the memfd of the client's request ring
//!         (`super::ring`); a hybrid pool (`data=T`, T the mount's
//!         placement threshold in bytes) adds a fourth: the data device
//!         (the server's own description too: its lock and its O_DIRECT)
//!     or: error MESSAGE\n                          and the server closes
//! ```
//!
//! After a grant the connection stays open for the client's session: the
//! server learns of the client's end, however it ends, by the end of file
//! on it, and releases the client's epoch slot. Write leases, reservations
//! and recalls are said on it too ([`super::lease`]).
//!
//! Descriptors travel with `nix`'s `sendmsg`/`recvmsg` (already in the
//! tree under fuser): its control-message buffers get the alignment and
//! the truncation flag right, which hand-written CMSG arithmetic is the
//! usual place to get wrong.

use std::io::{self, IoSlice, IoSliceMut, Read};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use nix::sys::socket::{self, ControlMessage, ControlMessageOwned, MsgFlags};

use crate::epoch::TABLE_LAYOUT;
use crate::types::Mode;

/// The request word.
pub const REQUEST: &str = "attach";

/// Where servers run by root put their sockets and pid files; other users'
/// servers use `/tmp/inkfs-UID`.
pub const RUN_DIR: &str = "/run/inkfs";

/// Clients one mount serves at once (one epoch slot each).
pub const CLIENTS_MAX: usize = crate::epoch::READERS_MAX;

/// Longest grant or refusal line, in bytes.
pub const ANSWER_BYTES_MAX: usize = 512;

/// The control socket a server for `mountpoint` (absolute, canonical)
/// listens on, in run directory `dir`.
pub fn socket_path(dir: &Path, mountpoint: &Path) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    dir.join(format!(
        "{:016x}.sock",
        fnv1a(mountpoint.as_os_str().as_bytes())
    ))
}

/// FNV-1a: a stable hash of the mount point path (std's hasher is not
/// stable across releases, and client and server may be different builds).
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// What the server grants an attaching client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The client's number, unique while the server runs.
    pub id: u64,
    /// The epoch slot the server claimed for the client.
    pub slot: usize,
    /// The mount's consistency mode (the client's engine runs in it).
    pub mode: Mode,
    /// A hybrid pool: the mount's placement threshold in bytes (the grant
    /// carries the data device's descriptor too). None: no data device.
    pub data_threshold: Option<u64>,
    /// The server takes a write lease given back with a removal request
    /// (`gives=1`; `super::ns::Give`). An older server's grant has no such
    /// field: its clients give leases back on the session only.
    pub gives: bool,
    /// The server grants directory leases with namespace requests that
    /// ask (`dirs=1`; `super::dirlease`). An older server's grant has no
    /// such field: its clients never send `+dir`.
    pub dirs: bool,
    /// The server leases a lane with a directory lease to a client that
    /// asks (`lanes=1`; `super::lanelease`). An older server's grant has
    /// no such field: its clients never send `+lane`.
    pub lanes: bool,
    /// The server takes a client's own removals under a directory lease
    /// (`removes=1`: the session's `orphan` and `slot` words, `removed=`
    /// in a directory's `released`; `super::lease`). An older server's
    /// grant has no such field: its clients send every unlink as a
    /// request.
    pub removes: bool,
}

impl Grant {
    fn line(&self) -> String {
        let data = self
            .data_threshold
            .map(|t| format!(" data={t}"))
            .unwrap_or_default();
        let gives = if self.gives { " gives=1" } else { "" };
        let dirs = if self.dirs { " dirs=1" } else { "" };
        let lanes = if self.lanes { " lanes=1" } else { "" };
        let removes = if self.removes { " removes=1" } else { "" };
        format!(
            "ok layout={TABLE_LAYOUT} id={} slot={} mode={}{data}{gives}{dirs}{lanes}{removes}\n",
            self.id,
            self.slot,
            self.mode.name()
        )
    }

    /// Descriptors the grant comes with.
    fn fds(&self) -> usize {
        3 + self.data_threshold.is_some() as usize
    }

    /// Parse a grant line (without its newline); every field must be there
    /// and the table layout must be this build's.
    pub fn parse(line: &str) -> Result<Grant, String> {
        let mut words = line.split_ascii_whitespace();
        if words.next() != Some("ok") {
            return Err(format!("not a grant: {line:?}"));
        }
        let (mut layout, mut id, mut slot, mut mode) = (None, None, None, None);
        let mut data_threshold = None;
        let mut gives = false;
        let mut dirs = false;
        let mut lanes = false;
        let mut removes = false;
        for w in words {
            match w.split_once('=') {
                Some(("layout", v)) => layout = v.parse::<u32>().ok(),
                Some(("id", v)) => id = v.parse::<u64>().ok(),
                Some(("slot", v)) => slot = v.parse::<usize>().ok(),
                Some(("mode", v)) => mode = Mode::parse(v),
                Some(("gives", v)) => gives = v == "1",
                Some(("dirs", v)) => dirs = v == "1",
                Some(("lanes", v)) => lanes = v == "1",
                Some(("removes", v)) => removes = v == "1",
                Some(("data", v)) => {
                    data_threshold = Some(
                        v.parse::<u64>()
                            .map_err(|_| format!("malformed grant: {line:?}"))?,
                    )
                }
                _ => {} // a later server's extra field
            }
        }
        match (layout, id, slot, mode) {
            (Some(TABLE_LAYOUT), Some(id), Some(slot), Some(mode))
                if slot < crate::epoch::READERS_MAX =>
            {
                Ok(Grant {
                    id,
                    slot,
                    mode,
                    data_threshold,
                    gives,
                    dirs,
                    lanes,
                    removes,
                })
            }
            (Some(l), ..) if l != TABLE_LAYOUT => Err(format!(
                "the server's epoch table has layout {l}, this build's {TABLE_LAYOUT}"
            )),
            _ => Err(format!("malformed grant: {line:?}")),
        }
    }
}

/// Send the request line (the client), without SIGPIPE if the server
/// has closed.
pub fn send_request(conn: &UnixStream) -> io::Result<()> {
    let line = format!("{REQUEST}\n");
    let mut rest = line.as_bytes();
    while !rest.is_empty() {
        match socket::send(conn.as_raw_fd(), rest, MsgFlags::MSG_NOSIGNAL) {
            Ok(n) => rest = &rest[n..],
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Send `grant` with the pool's descriptor, the epoch table's, the
/// client's request ring's and, when the grant says the pool is hybrid,
/// the data device's (the server).
pub fn send_grant(
    conn: &UnixStream,
    grant: &Grant,
    pool: BorrowedFd<'_>,
    epochs: BorrowedFd<'_>,
    ring: BorrowedFd<'_>,
    data: Option<BorrowedFd<'_>>,
) -> io::Result<()> {
    if data.is_some() != grant.data_threshold.is_some() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a data device's descriptor goes with a grant that says data=",
        ));
    }
    let line = grant.line();
    let mut fds = vec![pool.as_raw_fd(), epochs.as_raw_fd(), ring.as_raw_fd()];
    fds.extend(data.map(|d| d.as_raw_fd()));
    let cmsg = [ControlMessage::ScmRights(&fds)];
    let iov = [IoSlice::new(line.as_bytes())];
    let sent = socket::sendmsg::<()>(conn.as_raw_fd(), &iov, &cmsg, MsgFlags::MSG_NOSIGNAL, None)
        .map_err(io::Error::from)?;
    // The descriptors went with the first byte; the rest of a short send
    // follows as plain bytes.
    let mut rest = &line.as_bytes()[sent..];
    while !rest.is_empty() {
        let n = socket::send(conn.as_raw_fd(), rest, MsgFlags::MSG_NOSIGNAL)
            .map_err(io::Error::from)?;
        rest = &rest[n..];
    }
    Ok(())
}

/// What a grant carries: the pool's descriptor, the epoch table's, the
/// request ring's and a hybrid pool's data device's.
#[derive(Debug)]
pub struct Granted {
    pub grant: Grant,
    /// The pool (the server's open file description).
    pub pool: OwnedFd,
    /// The epoch table's memfd.
    pub epochs: OwnedFd,
    /// The client's request ring's memfd.
    pub ring: OwnedFd,
    /// A hybrid pool's data device (the server's description).
    pub data: Option<OwnedFd>,
}

/// The server's answer: the grant and its descriptors, or the server's
/// reason for refusing (`Err(Refused)`).
pub fn recv_grant(conn: &mut UnixStream) -> Result<Granted, Answer> {
    let mut buf = [0u8; ANSWER_BYTES_MAX];
    let (mut len, fds) = recv_with_fds(conn, &mut buf).map_err(Answer::Io)?;
    while !buf[..len].contains(&b'\n') && len < buf.len() {
        match conn.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Answer::Io(e)),
        }
    }
    let end = buf[..len]
        .iter()
        .position(|&b| b == b'\n')
        .ok_or_else(|| Answer::Malformed("no answer line (server gone?)".into()))?;
    let line = std::str::from_utf8(&buf[..end])
        .map_err(|_| Answer::Malformed("the answer is not UTF-8".into()))?;
    if let Some(msg) = line.strip_prefix("error ") {
        return Err(Answer::Refused(msg.to_string()));
    }
    let grant = Grant::parse(line).map_err(Answer::Malformed)?;
    if fds.len() != grant.fds() {
        return Err(Answer::Malformed(format!(
            "the grant carried {} descriptors, not {}",
            fds.len(),
            grant.fds()
        )));
    }
    let mut fds = fds.into_iter();
    match (fds.next(), fds.next(), fds.next()) {
        (Some(pool), Some(epochs), Some(ring)) => Ok(Granted {
            grant,
            pool,
            epochs,
            ring,
            data: fds.next(),
        }),
        _ => Err(Answer::Malformed(
            "the grant carried too few descriptors".into(),
        )),
    }
}

/// Why an attach got no grant.
#[derive(Debug)]
pub enum Answer {
    /// The server refused, and said why.
    Refused(String),
    /// The answer made no sense (another build, a broken server).
    Malformed(String),
    /// The socket failed.
    Io(io::Error),
}

impl std::fmt::Display for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Answer::Refused(m) => write!(f, "refused: {m}"),
            Answer::Malformed(m) => write!(f, "bad answer: {m}"),
            Answer::Io(e) => write!(f, "{e}"),
        }
    }
}

/// Descriptors one answer may carry; more are closed and refused.
const FDS_MAX: usize = 4;

/// One recvmsg: the bytes, and the descriptors that came with them (owned
/// at once, so that every path closes them).
fn recv_with_fds(conn: &UnixStream, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut space = nix::cmsg_space!([RawFd; FDS_MAX]);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = loop {
        match socket::recvmsg::<()>(
            conn.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Err(nix::errno::Errno::EINTR) => continue,
            other => break other.map_err(io::Error::from)?,
        }
    };
    let mut fds = Vec::new();
    // An error here is a truncated control buffer: the kernel closed what
    // did not fit, and the answer is malformed (no descriptors kept).
    if let Ok(cmsgs) = msg.cmsgs() {
        for c in cmsgs {
            if let ControlMessageOwned::ScmRights(raw) = c {
                // SAFETY: the kernel installed these descriptors in this
                // process for us; nothing else owns them.
                fds.extend(
                    raw.into_iter()
                        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                );
            }
        }
    }
    Ok((msg.bytes, fds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_round_trip_and_bad_ones_are_refused() {
        let g = Grant {
            id: 7,
            slot: 3,
            mode: Mode::Sync,
            data_threshold: None,
            gives: false,
            dirs: false,
            lanes: false,
            removes: false,
        };
        assert_eq!(Grant::parse(g.line().trim_end()), Ok(g));
        let gives = Grant { gives: true, ..g };
        assert!(gives.line().contains(" gives=1"));
        assert_eq!(Grant::parse(gives.line().trim_end()), Ok(gives));
        let dirs = Grant { dirs: true, ..g };
        assert!(dirs.line().contains(" dirs=1"));
        assert_eq!(Grant::parse(dirs.line().trim_end()), Ok(dirs));
        // An older server's grant (no `dirs=`): no directory leases.
        let old = Grant::parse(&format!(
            "ok layout={TABLE_LAYOUT} id=1 slot=2 mode=strict gives=1"
        ))
        .unwrap();
        assert!(old.gives && !old.dirs);
        let lanes = Grant {
            dirs: true,
            lanes: true,
            ..g
        };
        assert!(lanes.line().contains(" dirs=1 lanes=1"));
        assert_eq!(Grant::parse(lanes.line().trim_end()), Ok(lanes));
        // An older server's grant (no `lanes=`): no lane with a directory.
        let old = Grant::parse(&format!(
            "ok layout={TABLE_LAYOUT} id=1 slot=2 mode=strict gives=1 dirs=1"
        ))
        .unwrap();
        assert!(old.dirs && !old.lanes);
        let removes = Grant {
            dirs: true,
            lanes: true,
            removes: true,
            ..g
        };
        assert!(removes.line().contains(" lanes=1 removes=1"));
        assert_eq!(Grant::parse(removes.line().trim_end()), Ok(removes));
        // An older server's grant (no `removes=`): every unlink a request.
        let old = Grant::parse(&format!(
            "ok layout={TABLE_LAYOUT} id=1 slot=2 mode=strict gives=1 dirs=1 lanes=1"
        ))
        .unwrap();
        assert!(old.lanes && !old.removes);
        // An older client reads a newer grant: `removes=1` is a field it
        // skips (the parse above ignores what it does not know).
        let h = Grant {
            data_threshold: Some(65536),
            ..g
        };
        assert!(h.line().contains(" data=65536"));
        assert_eq!(Grant::parse(h.line().trim_end()), Ok(h));
        for bad in [
            "ok id=1 slot=2 mode=strict",
            "ok layout=1 id=1 slot=64 mode=strict",
            "ok layout=1 id=x slot=2 mode=strict",
            "ok layout=1 id=1 slot=2 mode=fast",
            "ok layout=1 id=1 slot=2 mode=strict data=x",
            "ko layout=1 id=1 slot=2 mode=strict",
        ] {
            assert!(Grant::parse(bad).is_err(), "{bad}");
        }
        assert!(Grant::parse("ok layout=9 id=1 slot=2 mode=strict")
            .unwrap_err()
            .contains("layout 9"));
    }

    #[test]
    fn descriptors_travel_with_the_grant() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let f = tempfile::tempfile().unwrap();
        let g = Grant {
            id: 1,
            slot: 0,
            mode: Mode::Strict,
            data_threshold: None,
            gives: true,
            dirs: true,
            lanes: true,
            removes: true,
        };
        use std::os::fd::AsFd;
        send_grant(&a, &g, f.as_fd(), f.as_fd(), f.as_fd(), None).unwrap();
        let got = recv_grant(&mut b).unwrap();
        assert_eq!(got.grant, g);
        assert_ne!(got.pool.as_raw_fd(), got.epochs.as_raw_fd());
        assert_ne!(got.epochs.as_raw_fd(), got.ring.as_raw_fd());
        assert!(got.data.is_none());
        // A hybrid pool's grant: the data device's descriptor too, and
        // only with `data=`.
        let h = Grant {
            data_threshold: Some(4096),
            ..g
        };
        assert!(send_grant(&a, &h, f.as_fd(), f.as_fd(), f.as_fd(), None).is_err());
        assert!(send_grant(&a, &g, f.as_fd(), f.as_fd(), f.as_fd(), Some(f.as_fd())).is_err());
        send_grant(&a, &h, f.as_fd(), f.as_fd(), f.as_fd(), Some(f.as_fd())).unwrap();
        let got = recv_grant(&mut b).unwrap();
        assert_eq!(got.grant, h);
        assert!(got.data.is_some());
        // A grant whose descriptors do not match its line is refused.
        let line = h.line();
        let fds = [f.as_raw_fd(), f.as_raw_fd(), f.as_raw_fd()];
        socket::sendmsg::<()>(
            a.as_raw_fd(),
            &[IoSlice::new(line.as_bytes())],
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::empty(),
            None,
        )
        .unwrap();
        assert!(matches!(recv_grant(&mut b), Err(Answer::Malformed(_))));
        drop(a);
        let (a, mut b) = UnixStream::pair().unwrap();
        use std::io::Write;
        (&a).write_all(b"error permission denied: no\n").unwrap();
        match recv_grant(&mut b) {
            Err(Answer::Refused(m)) => assert_eq!(m, "permission denied: no"),
            other => panic!("{other:?}"),
        }
    }
}
