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
