//! How many PM blocks the server may grant a client's reservation request
//! (docs/KERNEL-FREE.md, "Reservation"): the server's guard on
//! reservations.
//!
//! Several clients asking at once (1024 blocks each, a write that runs
//! dry up to 8192) could take the last free blocks of a small pool, and
//! the server's own operations (creates through the mount, the log GC
//! it runs at every lease settling) then failed with ENOSPC while `df`
//! showed room, the space sitting unused in clients' reservations. So a
//! grant:
//! - never takes the server's keep ([`server_keep_blocks`]): the blocks
//!   the server's own metadata may need while clients hold the rest;
//! - takes at most half of the free blocks above the keep: whatever the
//!   number of clients asking one after another, half of what is above
//!   the keep stays free after each grant, for the others and for the
//!   server's writes through the mount.
//!
//! Pure functions of the counts, so the policy is tested without a pool.

/// The fewest blocks kept for the server: a log GC of a client's file
/// compacts into fresh pages before it frees the old ones (16,384 live
/// 64 B entries, the client's give-back threshold, are 256 pages), and a
/// create takes a 1 KiB log chunk and a share of a directory log page
/// (256 blocks: about a thousand creates).
pub const SERVER_KEEP_MIN_BLOCKS: u64 = 256;
/// The most kept (64 MiB): a large pool keeps 1/64 of its capacity up to
/// this, plenty for the metadata of thousands of concurrent operations.
pub const SERVER_KEEP_MAX_BLOCKS: u64 = 16_384;

/// Blocks of a pool of `capacity_blocks` (its data area) that no grant
/// may take: 1/64 of the capacity, between the two bounds above, and
/// never more than half of the pool (a tiny test pool still serves
/// clients).
pub fn server_keep_blocks(capacity_blocks: u64) -> u64 {
    (capacity_blocks / 64)
        .clamp(SERVER_KEEP_MIN_BLOCKS, SERVER_KEEP_MAX_BLOCKS)
        .min(capacity_blocks / 2)
}

/// The most a reservation request may get now, `free_blocks` being free
/// in the server's allocator of a pool of `capacity_blocks`: half of the
/// free blocks above the keep, rounded up (the last block above it is
/// grantable too); 0 when the free blocks are all the keep's.
pub fn grantable_blocks(free_blocks: u64, capacity_blocks: u64) -> u64 {
    free_blocks
        .saturating_sub(server_keep_blocks(capacity_blocks))
        .div_ceil(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_keep_is_a_64th_of_the_pool_within_its_bounds() {
        // 64 MiB, 4 GiB, 64 GiB pools, and a tiny one.
        assert_eq!(server_keep_blocks(16_384), 256);
        assert_eq!(server_keep_blocks(1 << 20), 16_384);
        assert_eq!(server_keep_blocks(1 << 24), 16_384);
        assert_eq!(server_keep_blocks(300), 150);
    }

    #[test]
    fn grants_never_reach_the_keep_however_many_clients_ask() {
        let capacity = 16_384;
        let keep = server_keep_blocks(capacity);
        let mut free = 10_000u64;
        for _client in 0..64 {
            let got = grantable_blocks(free, capacity).min(8192);
            assert!(got <= (free - keep).div_ceil(2));
            free -= got;
            assert!(free >= keep, "a grant took the server's keep");
        }
        // Down to the keep: nothing more is granted.
        assert_eq!(free, keep);
        assert_eq!(grantable_blocks(free, capacity), 0);
        assert_eq!(grantable_blocks(keep + 1, capacity), 1);
        assert_eq!(grantable_blocks(0, capacity), 0);
    }
}
