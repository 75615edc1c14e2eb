//! The engine behind the mount: a pool claimed, mounted through
//! `inkfs::api`, served, and cleanly unmounted.

use std::path::Path;

use inkfs::api::{Filesystem, MountOptions};
use inkfs::pmem::{MappedPool, Pmem, PoolBusy, PoolOpenOptions};

use crate::mount::{run_engine, MountConfig, Notify};
use crate::stats::Field;
use crate::Engine;

/// The engine's own lines of the statistics report: log and GC figures,
/// page pre-mapping, errors met while mounted.
pub fn report_fields(fs: &Engine) -> Vec<Field> {
    let g = fs.gc_stats();
    let e = fs.error_stats();
    let (inodes, pages) = fs.loaded_log_pages();
    let mut fields = vec![
        Field::count("inodes_loaded", "inodes in memory", inodes)
            .explained("read from their logs since mount"),
        Field::count(
            "log_pages_of_loaded_inodes",
            "log pages of those inodes",
            pages,
        ),
        Field::count("gc_fast_scans", "log GC: fast scans", g.fast_scans)
            .explained("logs searched for pages holding only dead entries"),
        Field::count(
            "gc_fast_pages_freed",
            "log GC: fast pages freed",
            g.fast_pages_freed,
        ),
        Field::count(
            "gc_fast_refused",
            "log GC: fast scans refused",
            g.fast_refused,
        ),
        Field::count("gc_compactions", "log GC: compactions", g.compactions)
            .explained("logs rewritten without their dead entries"),
        Field::count(
            "gc_compaction_pages_freed",
            "log GC: compaction pages freed",
            g.compaction_pages_freed,
        ),
        Field::flag(
            "pool_populating",
            "page pre-mapping",
            fs.pool().populating(),
            "running (a background thread maps the pool's pages; until it is done, \
             a first write to a page may take a page fault)",
            "done, or not needed for this backend",
        ),
        // Corruption met while mounted (errors=), this mount's count.
        Field::count("fs_errors", "errors met while mounted", e.count)
            .explained("corruption found by operations or scrub since mount"),
        Field::count(
            "fs_errors_recorded",
            "errors in the pool's record",
            e.recorded.count,
        )
        .explained("kept in the superblock until inkfs fsck -y clears them"),
        Field::flag(
            "remounted_read_only",
            "turned read-only",
            e.remounted_ro,
            "yes: errors=remount-ro met corruption; writes get EROFS",
            "no",
        ),
        Field::text("errors_policy", "on errors", e.policy.name())
            .explained("errors= mount option"),
    ];
    if let Some(d) = fs.data_stats() {
        fields.push(Field::text(
            "data_device",
            "data device",
            fs.data_device().unwrap_or_default(),
        ));
        fields.extend([
            Field::bytes(
                "data_bytes_written",
                "data device: bytes written",
                d.bytes_written,
            ),
            Field::bytes("data_bytes_read", "data device: bytes read", d.bytes_read),
            Field::count(
                "data_flushes_requested",
                "data device: flushes requested",
                d.flushes_requested,
            ),
            Field::count(
                "data_flushes_issued",
                "data device: flushes issued",
                d.flushes_issued,
            )
            .explained("fewer than requested: group commit shared them"),
            Field::count(
                "data_deferred_appends",
                "data device: write-backs committed after a shared flush",
                d.deferred_appends,
            ),
            Field::count(
                "data_deferred_rounds",
                "data device: shared flushes that committed them",
                d.deferred_rounds,
            ),
            Field::count(
                "data_deferred_settles",
                "data device: deferred tails another commit stored first",
                d.deferred_settles,
            ),
            Field::bytes("data_cache_bytes", "data device: DRAM cache", d.cache_bytes),
            Field::count("data_cache_hits", "data device: cache hits", d.cache_hits),
            Field::count(
                "data_cache_misses",
                "data device: cache misses",
                d.cache_misses,
            ),
            Field::bytes(
                "data_readahead_bytes",
                "data device: read ahead",
                d.readahead_bytes,
            )
            .explained("of the bytes read: ahead of sequential readers, by its threads"),
        ]);
    }
    if let Some(last) = e.recorded.last {
        fields.push(Field::text("last_error", "last error", last.describe()));
    }
    fields
}

/// Open and claim the pool of `cfg`: exclusively for a read-write mount,
/// shared for `ro`.
pub fn open_pool(cfg: &MountConfig) -> std::result::Result<MappedPool, String> {
    let opts = PoolOpenOptions {
        create_size_bytes: None,
        read_only: cfg.read_only,
    };
    MappedPool::open(&cfg.pool, &opts).map_err(|e| match PoolBusy::of(&e) {
        Some(_) => format!("{}: {e}; not mounting it", cfg.pool.display()),
        None => format!("{}: {e}", cfg.pool.display()),
    })
}

/// Mount the engine on `pm` (the pool of `cfg`, opened by [`open_pool`])
/// and serve it on `mnt`.
pub fn serve_pool(cfg: &MountConfig, mnt: &Path, notify: &mut Notify, pm: MappedPool) -> i32 {
    let backend = pm.info();
    let fs = match Filesystem::mount(
        pm,
        MountOptions {
            mode: cfg.mode,
            read_only: cfg.read_only,
            errors: cfg.errors,
            data: cfg.data.clone().map(inkfs::api::DataDevice::Path),
            data_cache_bytes: cfg.data_cache_bytes,
            data_threshold_bytes: cfg.data_threshold_bytes,
            data_readahead: cfg.data_readahead,
        },
    ) {
        Ok(f) => f,
        Err(e) => {
            notify.fail(&format!("{}: {e}", cfg.pool.display()));
            return 1;
        }
    };
    let recorded = fs.error_stats().recorded;
    if !recorded.is_clear() {
        // Only a read-only mount gets here with a record (the engine
        // refuses a read-write one): say why the pool needs fsck.
        eprintln!(
            "inkfs: warning: {}: {}; mounted read-only, run `inkfs fsck -y` on it after unmounting",
            cfg.pool.display(),
            recorded.describe()
        );
    }
    // DRAM pools: take tmpfs's first-touch page faults in the background
    // now rather than one per fresh block inside write requests.
    fs.pool().populate_in_background();
    let r = fs.mount_report().clone();
    let info = vec![
        Field::text("engine", "engine", "inkfs"),
        Field::text("backend", "backend", backend.kind.describe()),
        Field::text("flush", "flush method", backend.flush.name()),
        Field::bytes("pool_bytes", "pool size", backend.size_bytes),
        Field::flag(
            "mounted_clean",
            "state at mount",
            r.was_clean,
            "clean",
            "crashed: recovered by this mount",
        ),
        Field::count(
            "journals_replayed",
            "journals replayed at mount",
            r.journals_replayed.into(),
        )
        .explained("operations on several inodes that a crash cut short, finished"),
        Field::count(
            "orphans_reclaimed",
            "orphans freed at mount",
            r.orphans_reclaimed,
        )
        .explained("files still open after their unlink when the pool was last used"),
    ];
    run_engine(fs, cfg, mnt, info, notify, |fs| {
        // The session is over: a new mount of this pool waits for the
        // claim from here on instead of being refused.
        fs.pool().pool_file().finishing();
        fs.unmount().map(|_pool| ()).map_err(|e| e.to_string())
    })
}
