use inkfs::pmem::SimPool;
use inkfs::types::*;
use inkfs::Fs;

fn fresh(mode: Mode) -> Fs<SimPool> {
    let pm = SimPool::new(16 << 20);
    Fs::format(
        &pm,
        &FormatOptions {
            lanes: 2,
            ..Default::default()
        },
    )
    .unwrap();
    Fs::mount(
        pm,
        MountOptions {
            mode,
            read_only: false,
            ..Default::default()
        },
    )
    .unwrap()
}

#[test]
fn create_write_read_remount() {
    for mode in [Mode::Strict, Mode::Sync, Mode::Posix] {
        let fs = fresh(mode);
        let (a, fh) = fs.create(1, b"hello", 0o644, 0, 0).unwrap();
        assert_eq!(a.size, 0);
        let data: Vec<u8> = (0..10000u32).map(|i| i as u8).collect();
        assert_eq!(fs.write(&fh, 100, &data).unwrap(), data.len());
        let mut buf = vec![0u8; 20000];
        let n = fs.read(&fh, 0, &mut buf).unwrap();
        assert_eq!(n, 10100);
        assert!(buf[..100].iter().all(|&b| b == 0));
        assert_eq!(&buf[100..10100], &data[..]);
        fs.write(&fh, 50, b"xyz").unwrap();
        fs.fsync(&fh, false).unwrap();
        fs.release(fh);
        fs.mkdir(1, b"d", 0o755, 0, 0).unwrap();
        fs.rename(
            1,
            b"hello",
            fs.lookup(1, b"d").unwrap().ino,
            b"moved",
            RenameFlags::default(),
        )
        .unwrap();
        let pm = fs.unmount().unwrap();
        let fs = Fs::mount(
            pm,
            MountOptions {
                mode,
                read_only: false,
                ..Default::default()
            },
        )
        .unwrap();
        assert!(fs.mount_report().allocator_restored);
        let d = fs.lookup(1, b"d").unwrap();
        let f = fs.lookup(d.ino, b"moved").unwrap();
        assert_eq!(f.size, 10100);
        let fh = fs.open(f.ino).unwrap();
        let mut buf = vec![0u8; 20000];
        assert_eq!(fs.read(&fh, 0, &mut buf).unwrap(), 10100);
        assert_eq!(&buf[50..53], b"xyz");
        assert_eq!(&buf[100..10100], &data[..]);
        fs.release(fh);
        assert!(fs.lookup(1, b"hello").is_err());
        // crash-style remount: drop without unmount
        let pm = fs.pmem().current_image();
        drop(fs);
        let fs = Fs::mount(
            SimPool::from_image(pm),
            MountOptions {
                mode,
                read_only: false,
                ..Default::default()
            },
        )
        .unwrap();
        assert!(!fs.mount_report().was_clean);
        assert_eq!(fs.lookup(d.ino, b"moved").unwrap().size, 10100);
    }
}

/// Zero-copy reads lend the pool's bytes for a run inside one extent (and
/// agree with `read`); holes and extent boundaries, and the simulator,
/// which has no mapping, answer None.
#[test]
fn read_in_place_matches_read() {
    use inkfs::pmem::{MappedPool, PoolOpenOptions};
    let path = std::path::PathBuf::from(format!(
        "/dev/shm/inkfs-test-in-place-{}.pool",
        std::process::id()
    ));
    let pm = MappedPool::open(
        &path,
        &PoolOpenOptions {
            create_size_bytes: Some(16 << 20),
            read_only: false,
        },
    )
    .unwrap();
    let _ = std::fs::remove_file(&path);
    Fs::format(&pm, &FormatOptions::default()).unwrap();
    let fs = Fs::mount(pm, MountOptions::default()).unwrap();
    let (_, fh) = fs.create(1, b"f", 0o644, 0, 0).unwrap();
    let data: Vec<u8> = (0..3 * 4096u32).map(|i| (i * 7) as u8).collect();
    fs.write(&fh, 0, &data).unwrap();
    // A hole at page 4, then page 5.
    fs.write(&fh, 5 * 4096, &data[..100]).unwrap();
    let lend = |off: u64, len: usize| fs.read_in_place(&fh, off, len, |b| b.to_vec()).unwrap();
    assert_eq!(lend(0, 4096).as_deref(), Some(&data[..4096]));
    assert_eq!(lend(100, 8000).as_deref(), Some(&data[100..8100]));
    assert_eq!(
        lend(5 * 4096, 4096).as_deref(),
        Some(&data[..100]),
        "clipped at EOF"
    );
    assert_eq!(lend(1 << 30, 4096).as_deref(), Some(&[][..]), "past EOF");
    assert_eq!(lend(4 * 4096, 10), None, "hole");
    assert_eq!(lend(2 * 4096, 3 * 4096), None, "runs into the hole");
    fs.release(fh);
    let sim = fresh(Mode::Strict);
    let (_, fh) = sim.create(1, b"f", 0o644, 0, 0).unwrap();
    sim.write(&fh, 0, &data).unwrap();
    assert_eq!(sim.read_in_place(&fh, 0, 4096, |b| b.len()).unwrap(), None);
}
