//! The server's table of the kernel's references
//! (crates/inkfs-fuse/src/kernel_refs.rs) driven directly on an engine, no
//! kernel: each interleaving of a reply counting an entry and a client's
//! removal of it, made deterministic (the end-to-end tests are in
//! preload_held.rs).

mod common;

use inkfs::api::{Credentials, Filesystem};
use inkfs_fuse::kernel_refs::{KernelRefs, Remover};

use common::Pool;

const ROOT: u64 = 1;

fn engine(pool: &Pool) -> inkfs_fuse::Engine {
    Filesystem::open_pool(&pool.path, Default::default()).expect("mount")
}

fn mkdir(fs: &inkfs_fuse::Engine, name: &str) -> inkfs::api::Attr {
    fs.mkdir(&Credentials::root(), ROOT, name.as_bytes(), 0o755)
        .expect("mkdir")
}

fn rmdir(
    fs: &inkfs_fuse::Engine,
    refs: &KernelRefs,
    a: &inkfs::api::Attr,
    name: &str,
    who: Remover,
) {
    refs.removing(fs, Some(a.ino), who, || {
        fs.rmdir(&Credentials::root(), ROOT, name.as_bytes())
    })
    .expect("rmdir");
}

/// The kernel counted the directory before the client removed it: the
/// removal keeps it (an orphan, its number not reused) until the FORGET.
#[test]
fn a_counted_inode_is_pinned_until_its_forget() {
    let pool = Pool::new("refs-pinned", 64);
    let fs = engine(&pool);
    let refs = KernelRefs::default();
    let mut a = mkdir(&fs, "d");
    refs.hand(&fs, &mut a, refs.mark()).expect("counted");
    refs.hand(&fs, &mut a, refs.mark()).expect("counted twice");
    rmdir(&fs, &refs, &a, "d", Remover::Client);
    assert_eq!(refs.pinned(), 1);
    assert!(refs.is_pinned(a.ino));
    assert_eq!(fs.getattr(a.ino).expect("still there").nlink, 0);
    let b = mkdir(&fs, "e");
    assert_ne!(b.ino, a.ino, "the pinned number was reused");
    refs.forget(&fs, a.ino, 1);
    assert_eq!(refs.pinned(), 1, "one of two references forgotten");
    refs.forget(&fs, a.ino, 1);
    assert_eq!(refs.pinned(), 0);
    assert!(fs.getattr(a.ino).is_err(), "freed at the last FORGET");
    assert_eq!(refs.known(), 0);
    assert_eq!(refs.mismatches(), 0);
    fs.unmount().expect("unmount");
}

/// Never counted: the removal frees it at once and nothing stays behind.
#[test]
fn an_uncounted_inode_is_freed_at_its_removal() {
    let pool = Pool::new("refs-uncounted", 64);
    let fs = engine(&pool);
    let refs = KernelRefs::default();
    let a = mkdir(&fs, "d");
    rmdir(&fs, &refs, &a, "d", Remover::Client);
    assert_eq!(refs.pinned(), 0);
    assert!(fs.getattr(a.ino).is_err(), "kept with no count");
    assert_eq!(refs.known(), 0);
    fs.unmount().expect("unmount");
}

/// The race: a reply's engine call found the directory (its mark taken
/// before), the client's removal decided while the reply had not counted
/// it yet, so the removal freed it; the reply must then hand nothing out.
/// A reply whose engine call began after the removal, or that meets a
/// removal of another inode, hands its own inode out.
#[test]
fn a_reply_counting_after_a_removal_decided_withdraws_its_entry() {
    let pool = Pool::new("refs-race", 64);
    let fs = engine(&pool);
    let refs = KernelRefs::default();
    let mut a = mkdir(&fs, "d");
    let mark = refs.mark();
    rmdir(&fs, &refs, &a, "d", Remover::Client);
    let r = refs.hand(&fs, &mut a, mark);
    assert_eq!(r.map_err(|e| e.errno()), Err(libc::ENOENT));
    assert_eq!(refs.known(), 0, "the withdrawn entry stayed counted");
    assert_eq!(refs.races(), (1, 1));
    // The number given to a new directory: a stale reply of the old one
    // (its generation) is withdrawn, the new one's is handed out.
    let mut b = mkdir(&fs, "e");
    assert_eq!(
        b.ino, a.ino,
        "the engine gives a freed number to the next inode"
    );
    let mark = refs.mark();
    let c = mkdir(&fs, "f");
    rmdir(&fs, &refs, &c, "f", Remover::Client);
    assert!(
        refs.hand(&fs, &mut a, mark).is_err(),
        "a reused number's old generation"
    );
    refs.hand(&fs, &mut b, mark)
        .expect("a live inode, rechecked");
    refs.hand(&fs, &mut b, refs.mark())
        .expect("no removal since the mark");
    assert_eq!(refs.known(), 1);
    // The kernel's own removal of a counted inode keeps it as well.
    rmdir(&fs, &refs, &b, "e", Remover::Kernel);
    assert_eq!(refs.pinned(), 1);
    refs.forget(&fs, b.ino, 2);
    assert_eq!((refs.pinned(), refs.known(), refs.mismatches()), (0, 0, 0));
    fs.unmount().expect("unmount");
}

/// At unmount every pin goes, and none is kept after.
#[test]
fn close_lets_every_pin_go() {
    let pool = Pool::new("refs-close", 64);
    let fs = engine(&pool);
    let refs = KernelRefs::default();
    let mut a = mkdir(&fs, "d");
    refs.hand(&fs, &mut a, refs.mark()).expect("counted");
    rmdir(&fs, &refs, &a, "d", Remover::Client);
    assert_eq!(refs.pinned(), 1);
    refs.close(&fs);
    assert_eq!(refs.pinned(), 0);
    assert!(fs.getattr(a.ino).is_err(), "freed at close");
    let mut b = mkdir(&fs, "e");
    refs.hand(&fs, &mut b, refs.mark()).expect("counted");
    rmdir(&fs, &refs, &b, "e", Remover::Client);
    assert_eq!(refs.pinned(), 0, "a pin kept after close");
    fs.unmount().expect("unmount");
}

/// A client's change of an inode the kernel has no count of skips its
/// invalidation; a reply whose engine call read the inode before that
/// change and counts it after the skip reads its attributes again, so the
/// kernel gets the changed ones. Counted first, the change is told the
/// kernel knows the inode (its invalidation is sent). The root is known.
#[test]
fn a_reply_counting_after_a_skipped_invalidation_reads_again() {
    let pool = Pool::new("refs-skip", 64);
    let fs = engine(&pool);
    let refs = KernelRefs::default();
    let root = Credentials::root();
    assert!(refs.knows(ROOT));
    let a = mkdir(&fs, "d");
    let chmod = |mode: u32| {
        let set = inkfs::api::SetAttr {
            mode: Some(mode),
            ..Default::default()
        };
        fs.setattr(&root, a.ino, &set, None).expect("chmod");
    };
    // The reply's engine call (a lookup) reads the old mode.
    let mark = refs.mark();
    let mut seen = fs.lookup(&root, ROOT, b"d").expect("lookup");
    assert_eq!(seen.mode & 0o7777, 0o755);
    // The client's chmod, then its decision: no count, no invalidation.
    chmod(0o700);
    assert!(!refs.knows(a.ino), "an uncounted inode is known");
    refs.hand(&fs, &mut seen, mark).expect("counted");
    assert_eq!(seen.mode & 0o7777, 0o700, "stale attributes handed out");
    assert_eq!(refs.skips(), (1, 1));
    // Counted now: the next change must invalidate, and nothing is read
    // again for a reply that met no skip.
    chmod(0o750);
    assert!(refs.knows(a.ino), "a counted inode is unknown");
    let mut again = fs.lookup(&root, ROOT, b"d").expect("lookup");
    refs.hand(&fs, &mut again, refs.mark()).expect("counted");
    assert_eq!(refs.skips(), (1, 1));
    // A skip of another inode meanwhile: the same attributes read again.
    let other = mkdir(&fs, "e");
    let mark = refs.mark();
    let mut third = fs.lookup(&root, ROOT, b"d").expect("lookup");
    assert!(!refs.knows(other.ino));
    refs.hand(&fs, &mut third, mark).expect("counted");
    assert_eq!(third.mode & 0o7777, 0o750);
    assert_eq!(refs.skips(), (2, 2));
    refs.forget(&fs, a.ino, 3);
    assert_eq!((refs.known(), refs.mismatches()), (0, 0));
    fs.unmount().expect("unmount");
}
