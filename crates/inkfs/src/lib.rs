//! inkfs: a crash-consistent, NOVA-style log-structured file system for
//! persistent memory, in user space.
//!
//! Module map (one concern each):
//! - [`pmem`]: the persistence layer (mapped pools, flush/fence, crash simulator)
//! - [`format`]: every on-media structure (docs/FORMAT.md)
//! - [`superblock`]: formatting a pool and validating its superblocks
//! - [`alloc`]: per-lane block and inode-slot allocators (DRAM)

pub mod alloc;
pub mod error;
pub mod format;
pub mod pmem;
pub mod superblock;
pub mod types;

pub use error::{Error, Result};
