//! The epoch table (epoch.rs) in memory shared between the mount server
//! and its clients: a sealed memfd, mapped by each (docs/KERNEL-FREE.md,
//! "Attaching").
//!
//! The server creates it, seals its size, and passes the descriptor with
//! each attach. A client maps what it was given after checking the seals
//! and the size: a region someone could shrink would kill every process
//! mapping it with SIGBUS at its next access, and the server must survive
//! any client. The table holds atomics only, for which every bit pattern
//! is a value, so what a confused client stores there can stall the limbo
//! (a slot that stays pinned) but never make the server misbehave.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

use crate::epoch::{EpochTable, TABLE_BYTES};

/// Seals every mapping of the table relies on: its size never changes,
/// and nobody can lift that.
const SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// An `EpochTable` (epoch.rs) in a shared memfd mapping; unmapped when
/// dropped.
pub struct SharedEpochs {
    table: NonNull<EpochTable>,
    map_len: usize,
    fd: OwnedFd,
}

// SAFETY: the mapping holds an EpochTable, which is atomics only (Sync);
// it is owned by this value for its whole life.
unsafe impl Send for SharedEpochs {}
// SAFETY: see Send.
unsafe impl Sync for SharedEpochs {}

impl SharedEpochs {
    /// A fresh table in a new sealed memfd (the server, at mount).
    pub fn create() -> io::Result<SharedEpochs> {
        let map_len = map_len();
        let fd = sealed_memfd(c"inkfs-epochs", map_len)?;
        let table = map(&fd, map_len)?;
        // SAFETY: the mapping is fresh, writable, page aligned, zero-filled
        // and at least TABLE_BYTES long; an EpochTable is atomics, valid
        // at any bits; nobody else can see it yet.
        unsafe { table.as_ref() }.start_zeroed();
        Ok(SharedEpochs { table, map_len, fd })
    }

    /// Map a table another process created and passed over (a client, at
    /// attach): refused unless its size is sealed and it is the size this
    /// build's table has.
    pub fn from_fd(fd: OwnedFd) -> io::Result<SharedEpochs> {
        let map_len = map_len();
        check_sealed(&fd, map_len, "the epoch table")?;
        let table = map(&fd, map_len)?;
        Ok(SharedEpochs { table, map_len, fd })
    }

    /// The memfd, to pass to a client.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRef<EpochTable> for SharedEpochs {
    fn as_ref(&self) -> &EpochTable {
        // SAFETY: the mapping lives as long as self and holds an
        // EpochTable (atomics: any bits are a valid value).
        unsafe { self.table.as_ref() }
    }
}

impl std::ops::Deref for SharedEpochs {
    type Target = EpochTable;
    fn deref(&self) -> &EpochTable {
        self.as_ref()
    }
}

impl Drop for SharedEpochs {
    fn drop(&mut self) {
        // SAFETY: the mapping was made by `map` with this length and no
        // reference into it outlives self.
        unsafe { libc::munmap(self.table.as_ptr().cast(), self.map_len) };
    }
}

/// The table's size rounded up to whole pages.
/// A new memfd of `len` bytes whose size is sealed (the creator's side of
/// a shared table: the other side maps it only after `check_sealed`).
pub(crate) fn sealed_memfd(name: &std::ffi::CStr, len: usize) -> io::Result<OwnedFd> {
    // SAFETY: the name is NUL-terminated.
    let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: memfd_create returned a new descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: ftruncate and fcntl on a descriptor we own.
    unsafe {
        if libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) != 0
            || libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, SEALS) != 0
        {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(fd)
}

/// Refuse a passed memfd (`what`) unless its size is sealed and is `len`:
/// another process could otherwise shrink it under our mapping (SIGBUS).
pub(crate) fn check_sealed(fd: &OwnedFd, len: usize, what: &str) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own; no memory is involved.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 || seals & (libc::F_SEAL_SHRINK | libc::F_SEAL_GROW) == 0 {
        return Err(invalid(&format!("{what}'s size is not sealed")));
    }
    let size = std::fs::File::from(fd.try_clone()?).metadata()?.len();
    if size != len as u64 {
        return Err(invalid(&format!(
            "{what} is {size} bytes, this build's is {len}"
        )));
    }
    Ok(())
}

fn map_len() -> usize {
    // SAFETY: sysconf has no memory preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
    TABLE_BYTES.div_ceil(page) * page
}

fn map(fd: &OwnedFd, map_len: usize) -> io::Result<NonNull<EpochTable>> {
    // SAFETY: a new shared mapping of a descriptor we own; the kernel
    // picks the address.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            map_len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(p.cast()).ok_or_else(|| invalid("mmap returned null"))
}

fn invalid(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_mappings_share_the_slots() {
        let server = SharedEpochs::create().unwrap();
        let client = SharedEpochs::from_fd(server.fd().try_clone_to_owned().unwrap()).unwrap();
        let i = server.claim_index().unwrap();
        assert_eq!(client.claimed_count(), 1);
        let limbo = crate::epoch::Limbo::default();
        let pin = client.pin_at(i).unwrap();
        limbo.hold(&server, 7, 1);
        let mut freed = Vec::new();
        limbo.reclaim(&server, |s, _| freed.push(s));
        assert!(freed.is_empty(), "the client's pin, seen through the server's mapping");
        drop(pin);
        limbo.reclaim(&server, |s, _| freed.push(s));
        assert_eq!(freed, [7]);
    }

    #[test]
    fn an_unsealed_region_is_refused() {
        // SAFETY: the name is a NUL-terminated literal.
        let raw = unsafe { libc::memfd_create(c"t".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: a new descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: ftruncate on a descriptor we own.
        assert_eq!(unsafe { libc::ftruncate(raw, map_len() as libc::off_t) }, 0);
        let e = SharedEpochs::from_fd(fd).err().expect("refused");
        assert!(e.to_string().contains("not sealed"), "{e}");
    }
}
