//! Errors: caller mistakes carry an errno; damaged or foreign media and
//! failing I/O are told apart so tools can say which it was.

use std::fmt;

#[derive(Debug)]
pub enum Error {
    /// A POSIX error the caller should see (ENOENT, EEXIST, ENOSPC, ...).
    Errno(i32),
    /// The pool is not an inkfs pool, or is one we cannot use (version,
    /// size mismatch, ...). Nothing was changed.
    BadPool(String),
    /// Media contents violate an invariant (checksum, bounds, cycle).
    Corrupt(String),
    /// The operating system refused (open, mmap, msync, ...).
    Io(std::io::Error),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// The errno a POSIX front end should return.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Errno(e) => *e,
            Error::BadPool(_) | Error::Corrupt(_) => libc::EIO,
            Error::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Errno(e) => write!(f, "{}", std::io::Error::from_raw_os_error(*e)),
            Error::BadPool(m) => write!(f, "not a usable inkfs pool: {m}"),
            Error::Corrupt(m) => write!(f, "corrupt pool: {m}"),
            Error::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e)
    }
}

/// Shorthand for `Err(Error::Errno(libc::E...))`.
pub fn errno<T>(e: i32) -> Result<T> {
    Err(Error::Errno(e))
}
