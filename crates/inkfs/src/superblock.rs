//! Formatting a pool and validating its superblocks. (Being written.)
