//! The client sequence of the kernel-free path under the crash simulator
//! (`inkfs::crashtest::lease`): a client engine writes under a lease on a
//! pool the owner has mounted, the lease goes back and comes again; crash
//! images at every fence, recovered and checked. Its own budget, apart
//! from the catalogue's exploration (`crash_explore.rs`, near its cap).
//!
//! The same sequence runs on a hybrid pool too: the client writes the data
//! device itself, and the device loses unflushed writes in the images.
//!
//! `INKFS_CRASHTEST_LEASE_IMAGES` sets the images per crash point (64).

use inkfs::crashtest::lease::LeaseReport;

fn images() -> usize {
    std::env::var("INKFS_CRASHTEST_LEASE_IMAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

#[test]
fn crash_exploration_client_leases() {
    let t = std::time::Instant::now();
    let report = inkfs::crashtest::lease::explore_leases(images(), 0xace);
    judge("crash_lease", &report, t);
}

#[test]
fn crash_exploration_client_leases_hybrid_pool() {
    let t = std::time::Instant::now();
    let report = inkfs::crashtest::lease::explore_leases_hybrid(images(), 0xace);
    judge("crash_lease (hybrid)", &report, t);
}

fn judge(what: &str, report: &LeaseReport, t: std::time::Instant) {
    eprintln!(
        "{what}: {} crash states at {} crash points of {} operations in {:.1}s; {} violations",
        report.states,
        report.points,
        report.ops,
        t.elapsed().as_secs_f64(),
        report.violations.len()
    );
    for v in report.violations.iter().take(10) {
        eprintln!("{v}");
    }
    assert!(
        report.violations.is_empty(),
        "{} violations",
        report.violations.len()
    );
    assert!(
        report.ops >= 22,
        "both modes ran every operation: {report:?}"
    );
    assert!(report.states >= report.points, "{report:?}");
}

/// A client killed at each store of an operation under its lease, reaped
/// by the owner, which then reuses the blocks the settle freed
/// (`inkfs::crashtest::reap`). `INKFS_CRASHTEST_REAP_IMAGES` sets the
/// images per crash point (16).
#[test]
fn crash_exploration_client_killed_and_reaped() {
    let t = std::time::Instant::now();
    let images = std::env::var("INKFS_CRASHTEST_REAP_IMAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16);
    let r = inkfs::crashtest::reap::explore_reaping(images, 0xace);
    eprintln!(
        "crash_reap: {} runs ({} killed inside the operation, {} adopted a tail and freed blocks, \
         {} reused freed blocks): {} crash states at {} points in {:.1}s; {} violations",
        r.runs,
        r.kills,
        r.adopted,
        r.reused,
        r.states,
        r.points,
        t.elapsed().as_secs_f64(),
        r.violations.len()
    );
    for v in r.violations.iter().take(10) {
        eprintln!("{v}");
    }
    assert!(r.violations.is_empty(), "{} violations", r.violations.len());
    // The case the reap must get right happened: a kill after a tail
    // store whose displaced blocks the owner then reused.
    assert!(r.adopted > 0 && r.reused > 0, "{r:?}");
    assert!(r.states >= r.points && r.kills > 0, "{r:?}");
}

/// A client's creates in a directory under a lane lease, the lane given
/// back, the owner's own creates and removals there, the lane leased
/// again (`inkfs::crashtest::nslease`): images at every fence.
/// `INKFS_CRASHTEST_NSLEASE_IMAGES` sets the images per crash point (32).
#[test]
fn crash_exploration_namespace_under_a_lane_lease() {
    let t = std::time::Instant::now();
    let images = std::env::var("INKFS_CRASHTEST_NSLEASE_IMAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(32);
    let r = inkfs::crashtest::nslease::explore_namespace_leases(images, 0xace);
    eprintln!(
        "crash_nslease: {} steps, {} crash states at {} points in {:.1}s; {} violations",
        r.steps,
        r.states,
        r.points,
        t.elapsed().as_secs_f64(),
        r.violations.len()
    );
    for v in r.violations.iter().take(10) {
        eprintln!("{v}");
    }
    assert!(r.violations.is_empty(), "{} violations", r.violations.len());
    assert!(r.steps >= 28 && r.states >= r.points, "{r:?}");
}

/// The client killed after each of its stores during its creates under a
/// lane lease, the lane reaped by the owner (`Fs::reap_lane`), which then
/// changes the directory (`inkfs::crashtest::nslease`).
/// `INKFS_CRASHTEST_NSREAP_IMAGES` sets the images per crash point (8).
#[test]
fn crash_exploration_namespace_client_killed_and_lane_reaped() {
    let t = std::time::Instant::now();
    let images = std::env::var("INKFS_CRASHTEST_NSREAP_IMAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let r = inkfs::crashtest::nslease::explore_namespace_reaping(images, 0xace);
    eprintln!(
        "crash_nsreap: {} runs ({} killed inside the creates, {} adopted a create, \
         {} built on a chain the client grew): {} crash states at {} points in {:.1}s; \
         {} violations",
        r.steps,
        r.kills,
        r.adopted,
        r.chain_built_on,
        r.states,
        r.points,
        t.elapsed().as_secs_f64(),
        r.violations.len()
    );
    for v in r.violations.iter().take(10) {
        eprintln!("{v}");
    }
    assert!(r.violations.is_empty(), "{} violations", r.violations.len());
    assert!(
        r.kills > 0 && r.adopted > 0 && r.states >= r.points,
        "{r:?}"
    );
    // The owner created in the block a killed client had added to the
    // lane's chain (its link must be durable by then).
    assert!(r.chain_built_on > 0, "{r:?}");
}
