//! A hybrid pool through the C ABI: `inkfs_mount_ex` names a data device
//! that moved (the `data` field of inkfs_options); `inkfs_mount` reads the
//! first release's three fields only; `opts_size` is checked as openat2
//! checks its struct's size.

mod common;

use std::ffi::CStr;
use std::path::{Path, PathBuf};

use common::*;
use inkfs::api::{FileDev, Filesystem, FormatOptions, HybridFormat};
use inkfs::pmem::{MappedPool, PoolFile, PoolOpenOptions};
use inkfs_capi::*;

/// Make a hybrid pool at `pool` whose data file is `data` (both new).
fn mkfs_hybrid(pool: &Path, data: &Path) {
    let create = PoolOpenOptions {
        create_size_bytes: Some(32 << 20),
        read_only: false,
    };
    let file = PoolFile::open(pool, &create).unwrap();
    let pm = MappedPool::map(file, &create).unwrap();
    let dev = FileDev::create(data, 16 << 20).unwrap();
    Filesystem::format_hybrid(
        &pm,
        &FormatOptions::default(),
        &HybridFormat {
            device: &dev,
            path: data,
            blocks: None,
            threshold_bytes: 64 << 10,
            unit_blocks: 256,
        },
    )
    .unwrap();
}

fn last_error() -> String {
    // SAFETY: inkfs_last_error returns a valid C string.
    unsafe { CStr::from_ptr(inkfs_last_error()) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn mount_ex_names_a_data_device_that_moved() {
    let dir = tempfile::Builder::new()
        .prefix("inkfs-capi-hybrid")
        .tempdir_in("/var/tmp")
        .unwrap();
    let pool = PoolPath::new("hybrid");
    let recorded = dir.path().join("a.data");
    mkfs_hybrid(&pool.0, &recorded);
    let moved: PathBuf = dir.path().join("b.data");
    std::fs::rename(&recorded, &moved).unwrap();
    let moved_c = c(moved.to_str().unwrap());
    let size = std::mem::size_of::<MountOpts>();
    let opts = MountOpts {
        data: moved_c.as_ptr(),
        ..MountOpts::default()
    };
    // SAFETY: valid C strings and options of the sizes given.
    unsafe {
        // The recorded path is gone.
        assert!(inkfs_mount(pool.c().as_ptr(), std::ptr::null()).is_null());
        assert_eq!(errno(), libc::EINVAL);
        assert!(last_error().contains("missing"), "{}", last_error());
        // inkfs_mount and a first-release size read no `data`.
        assert!(inkfs_mount(pool.c().as_ptr(), &opts).is_null());
        assert!(inkfs_mount_ex(pool.c().as_ptr(), &opts, INKFS_OPTIONS_SIZE_V0).is_null());
        assert!(last_error().contains("missing"), "{}", last_error());
        // Sizes: too small, inside `data`, a non-zero unknown tail.
        assert!(inkfs_mount_ex(pool.c().as_ptr(), &opts, 8).is_null());
        assert_eq!(errno(), libc::EINVAL);
        assert!(inkfs_mount_ex(pool.c().as_ptr(), &opts, size - 4).is_null());
        assert_eq!(errno(), libc::EINVAL);
        #[repr(C)]
        struct Bigger {
            o: MountOpts,
            more: u64,
        }
        let mut big = Bigger { o: opts, more: 1 };
        let p = (&big as *const Bigger).cast::<MountOpts>();
        assert!(inkfs_mount_ex(pool.c().as_ptr(), p, size + 8).is_null());
        assert_eq!(errno(), libc::E2BIG);
        big.more = 0;
        let p = (&big as *const Bigger).cast::<MountOpts>();
        let fs = inkfs_mount_ex(pool.c().as_ptr(), p, size + 8);
        assert!(!fs.is_null(), "{}", last_error());
        assert_eq!(ck(inkfs_unmount(fs)), Ok(0));

        // The whole struct: mounted on the moved file; a large write goes
        // to it and reads back after a remount.
        let data: Vec<u8> = (0..(1 << 20)).map(|i| (i * 7 % 251) as u8).collect();
        let name = c("big");
        let fs = inkfs_mount_ex(pool.c().as_ptr(), &opts, size);
        assert!(!fs.is_null(), "{}", last_error());
        let fd = ck(inkfs_open(
            fs,
            name.as_ptr(),
            libc::O_CREAT | libc::O_RDWR,
            0o644,
        ))
        .unwrap();
        let n = inkfs_write(fs, fd, data.as_ptr().cast(), data.len());
        assert_eq!(n, data.len() as isize);
        assert_eq!(ck(inkfs_close(fs, fd)), Ok(0));
        assert_eq!(ck(inkfs_unmount(fs)), Ok(0));
        let fs = inkfs_mount_ex(pool.c().as_ptr(), &opts, size);
        assert!(!fs.is_null(), "{}", last_error());
        let fd = ck(inkfs_open(fs, name.as_ptr(), libc::O_RDONLY, 0)).unwrap();
        let mut back = vec![0u8; data.len()];
        let n = inkfs_read(fs, fd, back.as_mut_ptr().cast(), back.len());
        assert_eq!(n, data.len() as isize);
        assert!(back == data);
        assert_eq!(ck(inkfs_close(fs, fd)), Ok(0));
        assert_eq!(ck(inkfs_unmount(fs)), Ok(0));
    }
    // The data went to the moved file: it holds the written bytes.
    let on_disk = std::fs::read(&moved).unwrap();
    assert!(
        on_disk.chunks(4096).any(|b| b == &data_page()[..]),
        "the file's first page is not on the data device"
    );
}

fn data_page() -> Vec<u8> {
    (0..4096).map(|i| (i * 7 % 251) as u8).collect()
}
