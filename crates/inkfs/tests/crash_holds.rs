//! The crash-exploration catalogue's namespace removals with a client of
//! the kernel-free path attached (docs/KERNEL-FREE.md, "Unlinked files a
//! process holds open"): the last unlink of an inode then commits it
//! ORPHAN in its journal transaction and frees it (one persisted FREE
//! store) after it finds no client's hold. Crash images at every fence of
//! the removing operation, recovered and checked as the catalogue's
//! (recovery frees ORPHAN inodes). Its own budget, apart from
//! `crash_explore.rs`.
//!
//! `INKFS_CRASHTEST_HOLDS_STATES` sets the budget (4000 states).

use inkfs::crashtest::{self, CrashTestOptions};

#[test]
fn crash_exploration_unlinks_with_a_client_attached() {
    let budget = std::env::var("INKFS_CRASHTEST_HOLDS_STATES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4000);
    let mut ran = std::collections::BTreeSet::new();
    let mut states = 0;
    // One-operation workloads that remove a last name: unlink, rmdir and
    // renames over an existing file.
    for filter in ["unlink_", "rmdir", "_over_"] {
        let opts = CrashTestOptions {
            states_budget: budget / 3,
            filter: Some(filter.to_string()),
            clients: true,
            ..Default::default()
        };
        let report = crashtest::run(&opts, |p| {
            ran.insert(p.workload.to_string());
        });
        for v in report.violations.iter().take(5) {
            eprintln!("{v}");
        }
        assert!(
            report.violations.is_empty(),
            "{filter}: {} violations",
            report.violations.len()
        );
        states += report.states_checked;
    }
    eprintln!(
        "crash_holds: {states} crash states over {} workloads",
        ran.len()
    );
    assert!(ran.len() >= 3, "workloads run: {ran:?}");
    assert!(states >= 100, "{states} states");
}
