//! overlayfs with an inkfs upper layer, as a container runtime stacks one.
//!
//! The kernel accepts a FUSE upper only with every feature it otherwise
//! merely warns about (fs/overlayfs/super.c, `ovl_make_workdir`: a remote
//! upper must have d_type, trusted.* xattrs and RENAME_WHITEOUT; O_TMPFILE
//! stays optional). Before inkfs served RENAME_WHITEOUT the mount failed
//! with "upper fs missing required features". Root required.

mod common;

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// An overlay mount, unmounted (lazily if need be) on drop.
struct Overlay {
    merged: PathBuf,
}

impl Overlay {
    fn mount(lower: &Path, upper: &Path, work: &Path, merged: &Path, extra: &str) -> Overlay {
        let opts = format!(
            "lowerdir={},upperdir={},workdir={}{extra}",
            lower.display(),
            upper.display(),
            work.display()
        );
        let out = Command::new("mount")
            .args(["-t", "overlay", "overlay", "-o", &opts])
            .arg(merged)
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "mount -t overlay -o {opts}: {}\nkernel log:\n{}",
            String::from_utf8_lossy(&out.stderr),
            sh("dmesg | grep -i overlay | tail -5 || true")
        );
        Overlay {
            merged: merged.to_path_buf(),
        }
    }
    fn p(&self, rel: &str) -> PathBuf {
        self.merged.join(rel)
    }
    fn unmount(self) {
        let this = std::mem::ManuallyDrop::new(self);
        run(Command::new("umount").arg(&this.merged));
    }
}

impl Drop for Overlay {
    fn drop(&mut self) {
        if Command::new("umount")
            .arg(&self.merged)
            .output()
            .map_or(true, |o| !o.status.success())
        {
            let _ = Command::new("umount").arg("-l").arg(&self.merged).output();
        }
    }
}

fn is_whiteout(p: &Path) -> bool {
    fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_char_device() && m.rdev() == 0)
}

fn xattr(p: &Path, name: &str) -> Option<Vec<u8>> {
    let out = tool("getfattr")
        .args(["--only-values", "-h", "-n", name])
        .arg(p)
        .output()
        .expect("run getfattr");
    out.status.success().then_some(out.stdout)
}

/// A small container-like lower tree (on the test machine's tmp file
/// system, tmpfs or ext4).
fn lower_tree(root: &Path) {
    for d in ["etc", "usr/bin", "usr/lib/pkg", "var/log"] {
        fs::create_dir_all(root.join(d)).unwrap();
    }
    fs::write(root.join("etc/hostname"), b"lower\n").unwrap();
    fs::write(root.join("etc/passwd"), b"root:x:0:0::/root:/bin/sh\n").unwrap();
    fs::write(root.join("usr/bin/tool"), vec![0x7f; 10_000]).unwrap();
    fs::write(root.join("usr/lib/pkg/a.so"), vec![1u8; 5000]).unwrap();
    fs::write(root.join("usr/lib/pkg/b.so"), vec![2u8; 7000]).unwrap();
    fs::write(root.join("var/log/old.log"), b"old\n").unwrap();
}

#[test]
fn overlay_with_an_inkfs_upper() {
    kernel_only("its tools work on an overlayfs stacked on the mount: the kernel's overlayfs is the mount's only client");
    require_tool("getfattr", "attr");
    let pool = Pool::new("overlay", 128);
    let m = Mounted::new(&pool, "");
    let scratch = tempfile::Builder::new()
        .prefix("inkfs-ovl-")
        .tempdir()
        .unwrap();
    let lower = scratch.path().join("lower");
    let merged = scratch.path().join("merged");
    fs::create_dir(&merged).unwrap();
    lower_tree(&lower);
    let (upper, work) = (m.p("upper"), m.p("work"));
    fs::create_dir(&upper).unwrap();
    fs::create_dir(&work).unwrap();

    // redirect_dir=on: a directory from the lower layer can be renamed
    // (the upper copy records where it came from in an xattr).
    let ovl = Overlay::mount(&lower, &upper, &work, &merged, ",redirect_dir=on");
    // Writes: a new file, an appended lower file (copied up).
    fs::write(ovl.p("etc/new.conf"), b"key=value\n").unwrap();
    let mut passwd = fs::read(ovl.p("etc/passwd")).unwrap();
    passwd.extend_from_slice(b"app:x:1000:1000::/home/app:/bin/sh\n");
    fs::write(ovl.p("etc/passwd"), &passwd).unwrap();
    // Deleting a lower file leaves a whiteout in the upper layer.
    fs::remove_file(ovl.p("var/log/old.log")).unwrap();
    // Renaming a lower file: RENAME_WHITEOUT on the upper.
    fs::rename(ovl.p("usr/bin/tool"), ovl.p("usr/bin/tool2")).unwrap();
    // Renaming a lower directory.
    fs::rename(ovl.p("usr/lib/pkg"), ovl.p("usr/lib/pkg2")).unwrap();
    // A directory replaced: removed, then created again (opaque).
    fs::remove_dir_all(ovl.p("var/log")).unwrap();
    fs::create_dir(ovl.p("var/log")).unwrap();
    fs::write(ovl.p("var/log/new.log"), b"new\n").unwrap();

    let check_merged = |ovl: &Overlay| {
        let names = |d: &str| {
            let mut v: Vec<String> = fs::read_dir(ovl.p(d))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        assert_eq!(names("etc"), ["hostname", "new.conf", "passwd"]);
        assert_eq!(fs::read(ovl.p("etc/passwd")).unwrap(), passwd);
        assert_eq!(fs::read(ovl.p("etc/hostname")).unwrap(), b"lower\n");
        assert_eq!(names("usr/bin"), ["tool2"]);
        assert_eq!(
            fs::read(ovl.p("usr/bin/tool2")).unwrap(),
            vec![0x7f; 10_000]
        );
        assert_eq!(names("usr/lib"), ["pkg2"]);
        assert_eq!(names("usr/lib/pkg2"), ["a.so", "b.so"]);
        assert_eq!(
            fs::read(ovl.p("usr/lib/pkg2/b.so")).unwrap(),
            vec![2u8; 7000]
        );
        assert_eq!(names("var/log"), ["new.log"]);
    };
    check_merged(&ovl);
    // The lower layer is untouched.
    assert!(lower.join("var/log/old.log").exists());
    assert!(lower.join("usr/lib/pkg/a.so").exists());

    // The upper layer, on inkfs: copied-up and new files, whiteouts for
    // what was deleted or moved away, the redirect, the opaque directory.
    let u = |rel: &str| upper.join(rel);
    assert_eq!(fs::read(u("etc/passwd")).unwrap(), passwd);
    assert_eq!(fs::read(u("etc/new.conf")).unwrap(), b"key=value\n");
    assert!(
        !u("etc/hostname").exists(),
        "an unchanged file was copied up"
    );
    assert!(
        is_whiteout(&u("usr/bin/tool")),
        "no whiteout for a renamed file"
    );
    assert!(u("usr/bin/tool2").is_file());
    assert!(
        is_whiteout(&u("usr/lib/pkg")),
        "no whiteout for a renamed dir"
    );
    assert_eq!(
        xattr(&u("usr/lib/pkg2"), "trusted.overlay.redirect").as_deref(),
        Some(&b"pkg"[..]),
        "renamed directory without its redirect"
    );
    assert_eq!(
        xattr(&u("var/log"), "trusted.overlay.opaque").as_deref(),
        Some(&b"y"[..]),
        "re-created directory is not opaque"
    );
    assert_eq!(fs::read(u("var/log/new.log")).unwrap(), b"new\n");

    // Unmount both, remount both: the same merged view from the pool.
    ovl.unmount();
    let dir = m.unmount();
    let m = Mounted::at(&pool, dir, "");
    let ovl = Overlay::mount(
        &lower,
        &m.p("upper"),
        &m.p("work"),
        &merged,
        ",redirect_dir=on",
    );
    check_merged(&ovl);
    ovl.unmount();
    let dir = m.unmount();
    drop(dir);
    let pm = inkfs::pmem::MappedPool::open(&pool.path, &Default::default()).unwrap();
    let report = inkfs::fsck::check(&pm, &Default::default()).unwrap();
    assert!(report.is_clean(), "{report:?}");
}
