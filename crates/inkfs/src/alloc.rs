//! Per-lane block and inode-slot allocators. (Being written.)
