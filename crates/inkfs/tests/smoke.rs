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
            },
        )
        .unwrap();
        assert!(!fs.mount_report().was_clean);
        assert_eq!(fs.lookup(d.ino, b"moved").unwrap().size, 10100);
    }
}
