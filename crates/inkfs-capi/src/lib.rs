//! libinkfs: the C ABI of inkfs. A C program mounts a pool in its own
//! process and calls the file system directly: no kernel, no FUSE round
//! trip. Every call goes through `inkfs::api`, the surface the FUSE mount
//! uses too, so both give the same answers (permission checks included:
//! the engine makes them, nothing here does).
//!
//! Conventions (stated in the header, include/inkfs.h, generated from this
//! crate by cbindgen):
//! - POSIX-shaped: a call returns what its libc namesake returns (0, a
//!   count, a descriptor), or -1 (NULL for a handle) with `errno` set to
//!   the errno Linux gives for the same request.
//! - Descriptors are small ints in a table of their `inkfs_t`, not kernel
//!   descriptors: they mean nothing to read(2) or to another `inkfs_t`.
//! - Calls are made with the credentials held by the `inkfs_t`.
//! - No call unwinds into C: a panic is caught and reported as EIO; every
//!   pointer is checked for NULL (EFAULT for buffers and paths, EINVAL for
//!   handles).
//!
//! The `unsafe` of this crate is confined to the boundary: turning the
//! caller's pointers into references (boundary.rs, mount.rs, dir.rs), each
//! block with the contract it relies on.

// Each extern "C" function's contract (valid pointers, as the header
// states it) is its doc comment, which cbindgen copies into the header; a
// "# Safety" section on each of some hundred libc-shaped calls would only
// repeat it.
#![allow(clippy::missing_safety_doc)]

// In the order the header lists their calls (cbindgen follows the
// source): mounting, opening, data, attributes, names, directories,
// extended attributes.
mod mount;

mod open;

mod io;

mod attrs;

mod names;

mod dir;

mod xattr;

mod boundary;
mod ofd;
mod table;

pub use attrs::*;
pub use dir::*;
pub use io::*;
pub use mount::{
    inkfs_last_error, inkfs_mkfs, inkfs_mount, inkfs_mount_ex, inkfs_refresh_credentials,
    inkfs_set_credentials, inkfs_umask, inkfs_unmount, Mount, MountOpts, INKFS_ERRORS_CONTINUE,
    INKFS_ERRORS_REMOUNT_RO, INKFS_MODE_POSIX, INKFS_MODE_STRICT, INKFS_MODE_SYNC,
    INKFS_OPTIONS_SIZE_V0,
};
pub use names::*;
pub use open::*;
pub use xattr::*;

/// A *at call's `dirfd` naming the pool's root directory (the value of
/// AT_FDCWD, which means the same: a mount has no working directory).
pub const INKFS_AT_ROOT: std::ffi::c_int = -100;
const _: () = assert!(INKFS_AT_ROOT == libc::AT_FDCWD);
