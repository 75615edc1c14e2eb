//! Crash ordering of inode-table growth: a lane's table gains a block
//! (zeroed and persisted, then linked) when a create needs a slot past the
//! last block. Every crash image during a run of creates that grows the
//! table must mount, check clean with fsck, hold a prefix of the created
//! names (each create is durable on return), and accept new creates.

use inkfs::fsck::{self, FsckOptions};
use inkfs::pmem::SimPool;
use inkfs::types::{FormatOptions, MountOptions};
use inkfs::Fs;

fn names(fs: &Fs<SimPool>) -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    fs.readdir(1, 0, &mut |d| {
        if d.name != b"." && d.name != b".." {
            v.push(d.name);
        }
        true
    })
    .expect("readdir");
    v.sort();
    v
}

#[test]
fn inode_table_growth_is_crash_safe() {
    let pm = SimPool::new(8 << 20);
    Fs::format(
        &pm,
        &FormatOptions {
            lanes: 2,
            ..Default::default()
        },
    )
    .expect("mkfs");
    let fs = Fs::mount(pm, MountOptions::default()).expect("mount");
    let name = |i: u32| format!("f{i:03}").into_bytes();
    // All creates of this thread use one lane: its first table block (31
    // slots, the root's among them in lane 0) fills within 31 creates.
    for i in 0..25 {
        let (_, fh) = fs.create(1, &name(i), 0o644, 0, 0).expect("create");
        fs.release(fh);
    }
    fs.pmem().start_trace();
    for i in 25..40 {
        let (_, fh) = fs.create(1, &name(i), 0o644, 0, 0).expect("create");
        fs.release(fh);
    }
    let trace = fs.pmem().stop_trace();
    let all: Vec<Vec<u8>> = (0..40).map(name).collect();
    let mut checked = 0;
    for point in 0..=trace.fence_count() {
        for img in trace.crash_images(point, 8, 0x7ab1e) {
            let fs = Fs::mount(SimPool::from_image(img.image), MountOptions::default())
                .unwrap_or_else(|e| panic!("point {point} ({}): mount: {e}", img.description));
            let got = names(&fs);
            assert!(
                got.len() >= 25 && got[..] == all[..got.len()],
                "point {point}: {got:?}"
            );
            let (_, fh) = fs
                .create(1, b"after", 0o644, 0, 0)
                .expect("create after recovery");
            fs.release(fh);
            let pm = fs.unmount().expect("unmount");
            let report = fsck::check(&pm, &FsckOptions::default()).expect("fsck");
            assert!(
                report.problems.is_empty(),
                "point {point}: {:?}",
                report.problems
            );
            checked += 1;
        }
    }
    // 4 fences per create (the journal); more means the table grew inside
    // the traced window (its new block persisted, then linked).
    assert!(
        trace.fence_count() > 15 * 4,
        "the table did not grow in the traced creates"
    );
    eprintln!(
        "inode table growth: {checked} crash images checked at {} fences",
        trace.fence_count()
    );
}
