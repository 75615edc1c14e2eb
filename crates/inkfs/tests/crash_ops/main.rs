//! Crash consistency of every operation, in every mode.
//!
//! For each operation: populate a small file system, snapshot it, trace
//! the operation with the crash simulator, and for every crash point (each
//! fence, and the end) mount a set of crash images. Each recovered image
//! must mount, be internally consistent (link counts, "..", kinds), equal
//! a state the operation passed through (or, for in-place overwrites in
//! sync/posix mode, mix old and new bytes only), report the free space the
//! live file system had in that state, survive a clean unmount/remount
//! unchanged, and accept new work. The end of the trace must show the
//! final state (every op here is durable on return, data ops end with
//! fsync).
//!
//! Reproduce one failure: the report names the op, mode, crash point, seed
//! and image index; `SimTrace::crash_image(point, MAX_IMAGES, seed, index)`
//! rebuilds that image.

#[path = "../common/mod.rs"]
mod common;

use std::sync::atomic::Ordering;
use std::time::Instant;

use common::*;
use inkfs::pmem::{Pmem, SimPool};
use inkfs::types::*;
use inkfs::{FileHandle, Fs};

const POOL: u64 = 2 << 20;
const SEED: u64 = 0x1eaf_cafe;

thread_local! {
    /// Set by `torn_stores` (edges.rs): its pools tear multi-word stores.
    static TORN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn max_images() -> usize {
    std::env::var("INKFS_CRASH_IMAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

/// What the setup made: inode numbers and open handles the ops use.
struct Env {
    a: u64,
    b: u64,
    sub: u64,
    f1: u64,
    f2: u64,
    big: u64,
    h: u64,
    /// Open only for the ops that use it (`Op::open_f1`).
    fh_f1: Option<FileHandle>,
    fh_f2: FileHandle,
    fh_big: FileHandle,
}

const F1_LEN: usize = 5000;
const F2_LEN: usize = 3 * 4096 + 100;
const BIG_LEN: usize = 20 * 4096;

impl Env {
    fn f1h(&self) -> &FileHandle {
        self.fh_f1.as_ref().expect("op must set open_f1")
    }
}

fn setup(mode: Mode, open_f1: bool) -> (Fs<SimPool>, Env) {
    let fs = fresh(mode, POOL);
    let a = fs.mkdir(1, b"a", 0o755, 0, 0).unwrap().ino;
    let b = fs.mkdir(1, b"b", 0o750, 1, 1).unwrap().ino;
    let sub = fs.mkdir(a, b"sub", 0o700, 0, 0).unwrap().ino;
    fs.mkdir(b, b"empty", 0o755, 0, 0).unwrap();
    let mk = |dir: u64, name: &[u8], len: usize, salt: u8| {
        let (attr, fh) = fs.create(dir, name, 0o644, 1000, 1000).unwrap();
        if len > 0 {
            fs.write(&fh, 0, &pattern(len, salt)).unwrap();
        }
        fs.fsync(&fh, false).unwrap();
        fs.release(fh);
        attr.ino
    };
    let f1 = mk(a, b"f1", F1_LEN, 1);
    let f2 = mk(a, b"f2", F2_LEN, 2);
    mk(sub, b"g", 100, 3);
    let h = mk(b, b"h", 10, 4);
    let big = mk(1, b"big", BIG_LEN, 5);
    fs.link(f2, b, b"hl").unwrap();
    fs.symlink(1, b"sym", b"a/f1", 0, 0).unwrap();
    fs.mknod(1, b"fifo", libc::S_IFIFO | 0o644, 0, 0, 0)
        .unwrap();
    if TORN.with(|t| t.get()) {
        fs.pmem().set_torn_stores(true);
    }
    fs.setxattr(f1, b"user.x", b"one", XattrFlags::Any).unwrap();
    fs.setxattr(a, b"user.d", b"dir-attr", XattrFlags::Any)
        .unwrap();
    let env = Env {
        a,
        b,
        sub,
        f1,
        f2,
        big,
        h,
        fh_f1: open_f1.then(|| fs.open(f1).unwrap()),
        fh_f2: fs.open(f2).unwrap(),
        fh_big: fs.open(big).unwrap(),
    };
    // Everything above durable before the trace starts.
    fs.pmem().sync_all().unwrap();
    (fs, env)
}

type Step = Box<dyn Fn(&Fs<SimPool>, &Env)>;

struct Op {
    name: &'static str,
    steps: Vec<Step>,
    /// In-place data change: sync/posix may mix old and new bytes.
    data_in_place: bool,
    check_times: bool,
    /// Run after the common setup, before the state BEFORE is taken.
    prep: Option<Step>,
    /// Keep /a/f1 open through the op (`Env::f1h`).
    open_f1: bool,
}

fn op(name: &'static str, steps: Vec<Step>) -> Op {
    Op {
        name,
        steps,
        data_in_place: false,
        check_times: false,
        prep: None,
        open_f1: false,
    }
}

fn data_op(name: &'static str, steps: Vec<Step>) -> Op {
    Op {
        name,
        steps,
        data_in_place: true,
        check_times: false,
        prep: None,
        open_f1: false,
    }
}

fn f1_open(mut o: Op) -> Op {
    o.open_f1 = true;
    o
}

fn s(f: impl Fn(&Fs<SimPool>, &Env) + 'static) -> Step {
    Box::new(f)
}

/// A data step followed by fsync of the same handle.
fn with_fsync(
    which: fn(&Env) -> &FileHandle,
    f: impl Fn(&Fs<SimPool>, &Env) + 'static,
) -> Vec<Step> {
    vec![s(f), s(move |fs, e| fs.fsync(which(e), false).unwrap())]
}

fn rf(noreplace: bool, exchange: bool) -> RenameFlags {
    RenameFlags {
        noreplace,
        exchange,
        ..Default::default()
    }
}

/// Run one operation in one mode over every crash point; panics with a
/// report on failure. Returns (images checked, distinct images, points).
fn run(op: &Op, mode: Mode) -> (u64, u64, usize) {
    let (fs, env) = setup(mode, op.open_f1);
    if let Some(prep) = &op.prep {
        prep(&fs, &env);
        fs.pmem().sync_all().unwrap();
    }
    let mut states = vec![snapshot(&fs).expect("setup state consistent")];
    let mut free = vec![free_blocks(&fs)];
    let gc0 = fs.gc_stats().fast_pages_freed;
    fs.pmem().start_trace();
    for step in &op.steps {
        step(&fs, &env);
        states.push(snapshot(&fs).unwrap_or_else(|e| {
            panic!(
                "{} [{}]: live state inconsistent: {e}",
                op.name,
                mode.name()
            )
        }));
        free.push(free_blocks(&fs));
    }
    let trace = fs.pmem().stop_trace();
    let free_slack = fs.gc_stats().fast_pages_freed - gc0;
    // Handles close only now (the orphan op keeps f1 open through the
    // trace); a recovered orphan's space is reclaimed, as after the close.
    let Env {
        fh_f1,
        fh_f2,
        fh_big,
        ..
    } = env;
    if let Some(fh) = fh_f1 {
        fs.release(fh);
    }
    fs.release(fh_f2);
    fs.release(fh_big);
    let last = states.len() - 1;
    if free_blocks(&fs) != free[last] {
        free.push(free_blocks(&fs));
    }
    let expect = if op.check_times {
        Expect::ExactWithTimes
    } else if op.data_in_place && mode != Mode::Strict {
        Expect::DataMix
    } else {
        Expect::Exact
    };
    let ctx = Ctx {
        mode,
        states: &states,
        expect,
        free: &free,
        free_slack,
        check_free_matches_state: true,
        final_durable: true,
    };
    let max = max_images();
    let sw = sweep(&trace, &ctx, max, SEED);
    let mut report = String::new();
    for f in sw.failures.iter().take(3) {
        report.push_str(&format!(
            "--- op {} mode {} crash point {} of {} seed {:#x} image {} ({})\n{}\n",
            op.name,
            mode.name(),
            f.point,
            trace.fence_count(),
            f.seed,
            f.index,
            f.description,
            f.why
        ));
    }
    if !report.is_empty() {
        panic!(
            "op {} mode {}: {} failing crash images of {} checked (max_images {max})\n{report}",
            op.name,
            mode.name(),
            sw.failures.len(),
            sw.checked
        );
    }
    (sw.checked, sw.distinct, trace.fence_count())
}

fn run_group(group: &str, ops: Vec<Op>) {
    let t = Instant::now();
    let mut failures = Vec::new();
    let mut lines = Vec::new();
    for mode in [Mode::Strict, Mode::Sync, Mode::Posix] {
        for op in &ops {
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(op, mode))) {
                Ok((checked, distinct, fences)) => lines.push(format!(
                    "  {:<24} {:<6} fences {fences:>3}  images {checked:>5} (distinct {distinct})",
                    op.name,
                    mode.name()
                )),
                Err(e) => {
                    let msg = e
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    failures.push(format!("{} [{}]: {msg}", op.name, mode.name()));
                }
            }
        }
    }
    eprintln!(
        "crash_ops {group}: {:.1}s\n{}\n  totals so far (images checked / distinct recovered): strict {}/{} sync {}/{} posix {}/{}",
        t.elapsed().as_secs_f64(),
        lines.join("\n"),
        STATES[0].load(Ordering::Relaxed),
        DISTINCT[0].load(Ordering::Relaxed),
        STATES[1].load(Ordering::Relaxed),
        DISTINCT[1].load(Ordering::Relaxed),
        STATES[2].load(Ordering::Relaxed),
        DISTINCT[2].load(Ordering::Relaxed),
    );
    if !failures.is_empty() {
        panic!(
            "{} of the {group} scenarios failed:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }
}

#[test]
fn create_kinds() {
    run_group(
        "create",
        vec![
            op(
                "create",
                vec![s(|fs, e| {
                    let (_, fh) = fs.create(e.a, b"new", 0o640, 7, 8).unwrap();
                    fs.release(fh);
                })],
            ),
            op(
                "mkdir",
                vec![s(|fs, e| {
                    fs.mkdir(e.b, b"newdir", 0o711, 0, 0).unwrap();
                })],
            ),
            op(
                "mknod_fifo",
                vec![s(|fs, e| {
                    fs.mknod(e.a, b"pipe", libc::S_IFIFO | 0o600, 0, 3, 4)
                        .unwrap();
                })],
            ),
            op(
                "symlink",
                vec![s(|fs, e| {
                    fs.symlink(e.b, b"ln", b"../a/f1", 0, 0).unwrap();
                })],
            ),
            op(
                "link",
                vec![s(|fs, e| {
                    fs.link(e.f1, e.b, b"f1link").unwrap();
                })],
            ),
        ],
    );
}

thread_local! {
    /// The handle `rmdir_open_orphan` holds from its first step to its
    /// second.
    static HELD_DIR: std::cell::RefCell<Option<FileHandle>> = const { std::cell::RefCell::new(None) };
}

#[test]
fn remove_kinds() {
    run_group(
        "remove",
        vec![
            op(
                "unlink_last_link",
                vec![s(|fs, e| fs.unlink(e.a, b"f1").unwrap())],
            ),
            op(
                "unlink_not_last",
                vec![s(|fs, e| fs.unlink(e.b, b"hl").unwrap())],
            ),
            op(
                "unlink_symlink",
                vec![s(|fs, _| fs.unlink(1, b"sym").unwrap())],
            ),
            op("rmdir", vec![s(|fs, e| fs.rmdir(e.b, b"empty").unwrap())]),
            // A directory held open through its rmdir (as the FUSE server
            // pins one the kernel may still use: inkfs-fuse `pin_victim`)
            // becomes an orphan, freed when the handle goes.
            op(
                "rmdir_open_orphan",
                vec![
                    s(|fs, e| {
                        let ino = fs.lookup(e.b, b"empty").unwrap().ino;
                        let fh = fs.open(ino).unwrap();
                        fs.rmdir(e.b, b"empty").unwrap();
                        assert_eq!(fs.fgetattr(&fh).unwrap().nlink, 0);
                        HELD_DIR.with(|h| *h.borrow_mut() = Some(fh));
                    }),
                    s(|fs, _| {
                        let fh = HELD_DIR.with(|h| h.borrow_mut().take()).unwrap();
                        fs.release(fh);
                    }),
                ],
            ),
            // f1 stays open (env handle): it becomes an orphan.
            f1_open(op(
                "unlink_open_orphan",
                vec![s(|fs, e| {
                    fs.unlink(e.a, b"f1").unwrap();
                    assert_eq!(fs.fgetattr(e.f1h()).unwrap().nlink, 0);
                })],
            )),
        ],
    );
}

#[test]
fn rename_plain() {
    run_group(
        "rename",
        vec![
            op(
                "rename_same_dir",
                vec![s(|fs, e| {
                    fs.rename(e.a, b"f1", e.a, b"f1r", rf(false, false))
                        .unwrap()
                })],
            ),
            op(
                "rename_across_dirs",
                vec![s(|fs, e| {
                    fs.rename(e.a, b"f1", e.b, b"f1", rf(false, false)).unwrap()
                })],
            ),
            op(
                "rename_over_file",
                vec![s(|fs, e| {
                    fs.rename(e.a, b"f1", e.b, b"h", rf(false, false)).unwrap()
                })],
            ),
            op(
                "rename_over_linked",
                vec![s(|fs, e| {
                    // The victim keeps another name.
                    fs.rename(e.a, b"f1", e.b, b"hl", rf(false, false)).unwrap()
                })],
            ),
            op(
                "rename_dir_over_empty",
                vec![s(|fs, e| {
                    fs.rename(e.a, b"sub", e.b, b"empty", rf(false, false))
                        .unwrap()
                })],
            ),
            op(
                "rename_noreplace",
                vec![s(|fs, e| {
                    fs.rename(e.a, b"f2", e.b, b"f2new", rf(true, false))
                        .unwrap()
                })],
            ),
            op(
                "rename_noreplace_eexist",
                vec![s(|fs, e| {
                    assert!(fs.rename(e.a, b"f2", e.b, b"h", rf(true, false)).is_err())
                })],
            ),
            op(
                "rename_dir_across",
                vec![s(|fs, e| {
                    fs.rename(e.a, b"sub", e.b, b"sub2", rf(false, false))
                        .unwrap()
                })],
            ),
            op(
                "rename_dir_same_dir",
                vec![s(|fs, e| {
                    fs.rename(e.a, b"sub", e.a, b"sub3", rf(false, false))
                        .unwrap()
                })],
            ),
        ],
    );
}

#[test]
fn rename_exchange() {
    run_group(
        "exchange",
        vec![
            op(
                "exchange_file_file",
                vec![s(|fs, e| {
                    fs.rename(e.a, b"f1", e.b, b"h", rf(false, true)).unwrap()
                })],
            ),
            op(
                "exchange_same_dir",
                vec![s(|fs, e| {
                    fs.rename(e.a, b"f1", e.a, b"f2", rf(false, true)).unwrap()
                })],
            ),
            op(
                "exchange_dir_file",
                vec![s(|fs, e| {
                    fs.rename(e.a, b"sub", e.b, b"h", rf(false, true)).unwrap()
                })],
            ),
            op(
                "exchange_dir_dir",
                vec![s(|fs, e| {
                    fs.rename(e.a, b"sub", e.b, b"empty", rf(false, true))
                        .unwrap()
                })],
            ),
        ],
    );
}

#[test]
fn writes() {
    run_group(
        "write",
        vec![
            f1_open(op(
                "append",
                with_fsync(
                    |e| e.f1h(),
                    |fs, e| {
                        fs.append(e.f1h(), &pattern(3000, 11)).unwrap();
                    },
                ),
            )),
            op(
                "append_aligned",
                with_fsync(
                    |e| &e.fh_big,
                    |fs, e| {
                        fs.append(&e.fh_big, &pattern(8192, 12)).unwrap();
                    },
                ),
            ),
            data_op(
                "overwrite_aligned",
                with_fsync(
                    |e| &e.fh_big,
                    |fs, e| {
                        fs.write(&e.fh_big, 4096, &pattern(8192, 13)).unwrap();
                    },
                ),
            ),
            data_op(
                "overwrite_unaligned",
                with_fsync(
                    |e| &e.fh_big,
                    |fs, e| {
                        fs.write(&e.fh_big, 3000, &pattern(6000, 14)).unwrap();
                    },
                ),
            ),
            f1_open(data_op(
                "overwrite_small",
                with_fsync(
                    |e| e.f1h(),
                    |fs, e| {
                        fs.write(e.f1h(), 10, &pattern(100, 15)).unwrap();
                    },
                ),
            )),
            data_op(
                "write_large_extend",
                with_fsync(
                    |e| &e.fh_f2,
                    |fs, e| {
                        // Overwrites the tail of f2 and extends it by ~40 pages.
                        fs.write(&e.fh_f2, 1000, &pattern(40 * 4096 + 777, 16))
                            .unwrap();
                    },
                ),
            ),
            f1_open(op(
                "write_past_eof_hole",
                with_fsync(
                    |e| e.f1h(),
                    |fs, e| {
                        fs.write(e.f1h(), 30_000, &pattern(500, 17)).unwrap();
                    },
                ),
            )),
            data_op(
                "two_writes",
                vec![
                    s(|fs, e| {
                        fs.write(&e.fh_big, 100, &pattern(200, 18)).unwrap();
                    }),
                    s(|fs, e| {
                        fs.append(&e.fh_big, &pattern(5000, 19)).unwrap();
                    }),
                    s(|fs, e| fs.fsync(&e.fh_big, false).unwrap()),
                ],
            ),
        ],
    );
}

/// copy_file_range in the pool: one write of the destination, so strict
/// mode shows the whole copy or none of it, and sync/posix mode mix old and
/// new bytes only where they overwrite in place (a write's guarantees).
#[test]
fn copy_ranges() {
    let mut with_hole = data_op(
        "copy_source_hole",
        with_fsync(
            |e| &e.fh_f2,
            |fs, e| {
                // Pages 1..5 of big, pages 2 and 3 a hole: 4 pages onto f2.
                let n = fs
                    .copy_range(&e.fh_big, 4096, &e.fh_f2, 0, 4 * 4096)
                    .unwrap();
                assert_eq!(n, 4 * 4096);
            },
        ),
    );
    with_hole.prep = Some(s(|fs, e| {
        let punch = FallocFlags {
            keep_size: true,
            punch_hole: true,
            zero_range: false,
            ..Default::default()
        };
        fs.fallocate(&e.fh_big, 2 * 4096, 2 * 4096, punch).unwrap();
    }));
    run_group(
        "copy_range",
        vec![
            data_op(
                "copy_overwrite_extend",
                with_fsync(
                    |e| &e.fh_f2,
                    |fs, e| {
                        // Overwrites the tail of f2 from byte 2000 and extends it.
                        let n = fs
                            .copy_range(&e.fh_big, 4096, &e.fh_f2, 2000, 3 * 4096 + 500)
                            .unwrap();
                        assert_eq!(n, 3 * 4096 + 500);
                    },
                ),
            ),
            data_op(
                "copy_within_file",
                with_fsync(
                    |e| &e.fh_big,
                    |fs, e| {
                        let n = fs
                            .copy_range(&e.fh_big, 100, &e.fh_big, 50_000, 6000)
                            .unwrap();
                        assert_eq!(n, 6000);
                    },
                ),
            ),
            f1_open(op(
                "copy_past_eof",
                with_fsync(
                    |e| e.f1h(),
                    |fs, e| {
                        // Short at f2's end; leaves a hole in f1 before it.
                        let n = fs
                            .copy_range(&e.fh_f2, 0, e.f1h(), 20_000, 1 << 20)
                            .unwrap();
                        assert_eq!(n, F2_LEN as u64);
                    },
                ),
            )),
            with_hole,
        ],
    );
}

fn size(sz: u64) -> SetAttr {
    SetAttr {
        size: Some(sz),
        ..Default::default()
    }
}

#[test]
fn truncate_fallocate() {
    let ff = |keep_size, punch_hole, zero_range| FallocFlags {
        keep_size,
        punch_hole,
        zero_range,
        ..Default::default()
    };
    run_group(
        "truncate/fallocate",
        vec![
            op(
                "truncate_shrink_unaligned",
                vec![s(|fs, e| {
                    fs.setattr(e.big, &size(10 * 4096 + 123)).unwrap();
                })],
            ),
            op(
                "truncate_shrink_aligned",
                vec![s(|fs, e| {
                    fs.setattr(e.big, &size(4 * 4096)).unwrap();
                })],
            ),
            op(
                "truncate_to_zero",
                vec![s(|fs, e| {
                    fs.setattr(e.f2, &size(0)).unwrap();
                })],
            ),
            op(
                "truncate_grow",
                vec![s(|fs, e| {
                    fs.setattr(e.f1, &size(20_000)).unwrap();
                })],
            ),
            f1_open(op(
                "fallocate_default",
                vec![s(move |fs, e| {
                    fs.fallocate(e.f1h(), 8000, 20_000, ff(false, false, false))
                        .unwrap();
                })],
            )),
            f1_open(op(
                "fallocate_keep_size",
                vec![s(move |fs, e| {
                    fs.fallocate(e.f1h(), 0, 40_000, ff(true, false, false))
                        .unwrap();
                })],
            )),
            op(
                "fallocate_punch_hole",
                vec![s(move |fs, e| {
                    fs.fallocate(&e.fh_big, 5000, 3 * 4096, ff(true, true, false))
                        .unwrap();
                })],
            ),
            op(
                "fallocate_zero_range",
                vec![s(move |fs, e| {
                    fs.fallocate(&e.fh_big, 5000, 3 * 4096, ff(false, false, true))
                        .unwrap();
                })],
            ),
        ],
    );
}

/// RENAME_WHITEOUT (one journal transaction with the rename), and
/// collapse and insert range on a file with a hole and blocks kept past
/// its end (one commit of several FILE_WRITE entries).
#[test]
fn whiteout_collapse_insert() {
    let wo = RenameFlags {
        whiteout: true,
        ..Default::default()
    };
    let shift = |collapse: bool| FallocFlags {
        collapse_range: collapse,
        insert_range: !collapse,
        ..Default::default()
    };
    // /big: a hole at pages 6..8, two blocks past its end.
    let shape = || -> Option<Step> {
        Some(s(|fs, e| {
            let punch = FallocFlags {
                keep_size: true,
                punch_hole: true,
                ..Default::default()
            };
            fs.fallocate(&e.fh_big, 6 * 4096, 2 * 4096, punch).unwrap();
            let keep = FallocFlags {
                keep_size: true,
                ..Default::default()
            };
            fs.fallocate(&e.fh_big, BIG_LEN as u64, 2 * 4096, keep)
                .unwrap();
        }))
    };
    let mut collapse_big = op(
        "collapse_big",
        vec![s(move |fs, e| {
            fs.fallocate(&e.fh_big, 4 * 4096, 5 * 4096, shift(true))
                .unwrap();
        })],
    );
    collapse_big.prep = shape();
    let mut insert_big = op(
        "insert_big",
        vec![s(move |fs, e| {
            fs.fallocate(&e.fh_big, 3 * 4096, 4 * 4096, shift(false))
                .unwrap();
        })],
    );
    insert_big.prep = shape();
    run_group(
        "whiteout/collapse/insert",
        vec![
            op(
                "whiteout_new_name",
                vec![s(move |fs, e| {
                    fs.rename_as(e.a, b"f1", e.b, b"new", wo, 5, 6).unwrap()
                })],
            ),
            op(
                "whiteout_over_file",
                vec![s(move |fs, e| {
                    fs.rename_as(e.a, b"f1", e.b, b"h", wo, 5, 6).unwrap()
                })],
            ),
            op(
                "whiteout_over_hard_link",
                vec![s(move |fs, e| {
                    fs.rename_as(e.a, b"f1", e.b, b"hl", wo, 5, 6).unwrap()
                })],
            ),
            op(
                "whiteout_dir_over_empty",
                vec![s(move |fs, e| {
                    fs.rename_as(e.a, b"sub", e.b, b"empty", wo, 5, 6).unwrap()
                })],
            ),
            collapse_big,
            insert_big,
            op(
                "collapse_f2_first_page",
                vec![s(move |fs, e| {
                    fs.fallocate(&e.fh_f2, 0, 4096, shift(true)).unwrap();
                })],
            ),
            op(
                "insert_f2_many",
                vec![s(move |fs, e| {
                    fs.fallocate(&e.fh_f2, 4096, 64 * 4096, shift(false))
                        .unwrap();
                })],
            ),
        ],
    );
}

#[test]
fn attributes() {
    let mut ops = vec![
        op(
            "setxattr_new",
            vec![s(|fs, e| {
                fs.setxattr(e.f2, b"user.new", &pattern(300, 20), XattrFlags::Create)
                    .unwrap()
            })],
        ),
        op(
            "setxattr_replace",
            vec![s(|fs, e| {
                fs.setxattr(e.f1, b"user.x", b"two!", XattrFlags::Replace)
                    .unwrap()
            })],
        ),
        op(
            "removexattr",
            vec![s(|fs, e| fs.removexattr(e.a, b"user.d").unwrap())],
        ),
        op(
            "chmod_chown",
            vec![s(|fs, e| {
                fs.setattr(
                    e.h,
                    &SetAttr {
                        mode: Some(0o600),
                        uid: Some(42),
                        gid: Some(43),
                        ..Default::default()
                    },
                )
                .unwrap();
            })],
        ),
        op(
            "chmod_dir",
            vec![s(|fs, e| {
                fs.setattr(
                    e.sub,
                    &SetAttr {
                        mode: Some(0o555),
                        ..Default::default()
                    },
                )
                .unwrap();
            })],
        ),
    ];
    let mut utimens = op(
        "utimens",
        vec![s(|fs, e| {
            fs.setattr(
                e.f2,
                &SetAttr {
                    atime: Some(TimeSet::At(1_000_000_007)),
                    mtime: Some(TimeSet::At(2_000_000_011)),
                    ..Default::default()
                },
            )
            .unwrap();
        })],
    );
    utimens.check_times = true;
    ops.push(utimens);
    // Enough attribute changes that the log compacts (GC) inside the
    // traced steps.
    let mut steps: Vec<Step> = Vec::new();
    for i in 0..6u32 {
        steps.push(s(move |fs, e| {
            fs.setattr(
                e.h,
                &SetAttr {
                    mode: Some(0o640 | i),
                    ..Default::default()
                },
            )
            .unwrap();
        }));
    }
    let mut gc = op("log_compaction", steps);
    gc.prep = Some(s(|fs, e| {
        for i in 0..124u32 {
            fs.setattr(
                e.h,
                &SetAttr {
                    mode: Some(0o600 | (i & 7)),
                    ..Default::default()
                },
            )
            .unwrap();
        }
    }));
    ops.push(gc);
    run_group("attributes", ops);
}

// ------------------------------------------------------------ regressions
// The smallest reproductions of engine bugs this suite found.

/// Trace `op` on a fresh pool holding one fsynced file of `len` bytes and
/// check every crash image of it; returns the failures as text.
fn small_case(mode: Mode, len: usize, op: impl Fn(&Fs<SimPool>, &FileHandle)) -> String {
    let fs = fresh(mode, 1 << 20);
    let (_, fh) = fs.create(1, b"f", 0o644, 0, 0).unwrap();
    fs.write(&fh, 0, &pattern(len, 1)).unwrap();
    fs.fsync(&fh, false).unwrap();
    fs.pmem().sync_all().unwrap();
    let before = snapshot(&fs).unwrap();
    let free_before = free_blocks(&fs);
    let gc0 = fs.gc_stats().fast_pages_freed;
    fs.pmem().start_trace();
    op(&fs, &fh);
    let trace = fs.pmem().stop_trace();
    let free_slack = fs.gc_stats().fast_pages_freed - gc0;
    fs.release(fh);
    let states = [before, snapshot(&fs).unwrap()];
    let free = [free_before, free_blocks(&fs)];
    let ctx = Ctx {
        mode,
        states: &states,
        expect: Expect::Exact,
        free: &free,
        free_slack,
        check_free_matches_state: true,
        final_durable: true,
    };
    let sw = sweep(&trace, &ctx, 16, SEED);
    sw.failures
        .iter()
        .take(2)
        .map(|f| format!("point {} image {}: {}", f.point, f.index, f.why))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Sync/posix zeroed the tail of the new last page in place before the
/// smaller size committed: a crash kept the old size with those bytes
/// zeroed (data loss by a truncate that never happened).
#[test]
fn regression_truncate_shrink_unaligned_is_atomic() {
    for mode in [Mode::Strict, Mode::Sync, Mode::Posix] {
        let r = small_case(mode, 8192, |fs, fh| {
            fs.setattr(fh.ino(), &size(5000)).unwrap();
        });
        assert!(r.is_empty(), "{}: {r}", mode.name());
    }
}

/// Sync/posix wrote the bytes of an extending write past the old end of
/// file in place before the size committed: after a crash the old size
/// came back but growing the file showed the lost write's bytes, not zeros.
#[test]
fn regression_extending_write_leaves_zeros_past_eof() {
    for mode in [Mode::Strict, Mode::Sync, Mode::Posix] {
        let r = small_case(mode, 5000, |fs, fh| {
            fs.append(fh, &[0xee; 100]).unwrap();
            fs.fsync(fh, false).unwrap();
        });
        assert!(r.is_empty(), "{}: {r}", mode.name());
        // Into blocks preallocated past the end of file.
        let r = small_case(mode, 5000, |fs, fh| {
            let keep = FallocFlags {
                keep_size: true,
                ..Default::default()
            };
            fs.fallocate(fh, 0, 4 * 4096, keep).unwrap();
            fs.pmem().sync_all().unwrap();
            fs.write(fh, 9000, &[0xee; 100]).unwrap();
            fs.fsync(fh, false).unwrap();
        });
        assert!(r.is_empty(), "{} (preallocated): {r}", mode.name());
    }
}

// Log growth, ENOSPC, orphans, a crash during recovery, the error record.
mod edges;
