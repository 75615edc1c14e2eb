//! A client's creates and removals in a directory under a lane lease,
//! under the crash simulator (docs/KERNEL-FREE.md, "Stage 5", "What each crash leaves
//! (stage 5)"; CRASHTEST.md, "Client leases").
//!
//! One simulated pool, the owner's mounted engine and a client engine on
//! a second handle of it (as in [`super::lease`]). The grant is made as
//! the mount's lease table will make it, without sockets: the owner leases
//! a lane (`Fs::lease_lane`), reserves blocks, and the client takes the
//! lane and directory `d`'s lease.
//!
//! **The sequence** ([`explore_namespace_leases`]): the client creates
//! files in `d` and writes them, changes `d`'s own mode under its lease
//! (`Step::DirMode`, once per lease), makes a directory in `d`
//! (`Step::Mkdir`: a new directory inode from the lane's slots, its
//! DIR_ADD in `d`, `d`'s link count from it), removes one of them and an older file of
//! the owner's (`Fs::client_unlink`), removes a file a second client
//! holds (its hold in the epoch table: the removal leaves it ORPHAN), gives
//! `d` and the lane back (`Fs::take_back_lane`; the owner frees the older
//! file, `Fs::free_client_victim`, and adopts the held one); the owner
//! creates and writes in `d` (into the blocks the removals freed), the
//! hold ends (the owner frees the orphan), the owner removes a file and
//! the client's directory; `d` and the
//! lane go to the client again, which creates, removes an older file and
//! its own create, creates in the slot that freed, and makes a second
//! directory. At
//! every fence, crash images are checked: fsck finds no error; recovery
//! mounts the image; `d` holds exactly the names before or after the step
//! in flight, each file the bytes the model gives it (a write in flight:
//! before or after it), each directory whole (empty, `..` naming `d`, two
//! links) and `d`'s link count two plus its directories, `d`'s mode the
//! one before or after it; after a
//! clean unmount fsck reports nothing.
//!
//! **The kill variant** ([`explore_namespace_reaping`]): the lane's first
//! table block is filled but for two slots (the owner's creates, with the
//! other lanes leased away), then the client is killed after each of its
//! stores (`SimPool::kill_after_stores`) during three creates (the third
//! grows the lane's chain), a write, a chmod of `d`, two removals (its
//! own create, an older file) and a mkdir (adopted whole or not at all);
//! the owner reaps the lane
//! (`Fs::reap_lane`),
//! its books are compared with a recovery scan of the memory as it is
//! (every slot and block accounted), `d`'s mode is the chmod's if a later
//! create was adopted (else either), and it then creates and removes in
//! `d` (its create in the leased lane, in the block the chain gained).
//! Images at every fence from the reap on: the names are those of a state
//! of the client's operations no later than what the reap adopted, and
//! from the owner's first change on exactly what it adopted (the reap's
//! stores are durable before the owner builds on them).

use std::collections::BTreeMap;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};

use super::lease::{fsck, mixed, mount_options, new_pool, points_of, read_all, RESERVE, ROOT};
use crate::fs::Fs;
use crate::lanelease::LaneGrant;
use crate::pmem::{Killed, Pmem, SimPool};
use crate::rmlocal::ClientUnlink;
use crate::types::{FileKind, Mode};

/// What one exploration found.
#[derive(Debug, Default)]
pub struct NsLeaseReport {
    /// Crash images checked.
    pub states: u64,
    /// Crash points (fences) of the traces.
    pub points: u64,
    /// Steps traced (sequence) or runs (kill variant).
    pub steps: u64,
    /// Kill variant: runs killed inside the client's operations, and
    /// those whose reap adopted at least one create.
    pub kills: u64,
    pub adopted: u64,
    /// Kill variant: runs in which the client had grown the lane's chain
    /// and the owner's create after the reap took a slot in the added
    /// block.
    pub chain_built_on: u64,
    pub violations: Vec<String>,
}

/// The directory's contents: name to bytes.
type Model = BTreeMap<&'static str, Vec<u8>>;

#[derive(Clone, Copy, Debug)]
enum Step {
    /// The lane, a reservation, `d`'s lease to the client.
    Grant,
    Create(&'static str),
    Write(&'static str, usize, u8),
    /// `d` and the lane back to the owner.
    GiveBack,
    OwnerCreate(&'static str),
    OwnerWrite(&'static str, usize, u8),
    OwnerUnlink(&'static str),
    /// The client removes a name itself (`Fs::client_unlink`): freed.
    Unlink(&'static str),
    /// A second client holds the file open (its hold in the epoch table).
    Hold(&'static str),
    /// The client removes a held file: it stays ORPHAN, the owner adopts
    /// it at the give-back.
    UnlinkHeld(&'static str),
    /// The second client's hold ends: the owner frees the orphan.
    Unhold(&'static str),
    /// The client changes `d`'s own mode under its lease (one SET_ATTR
    /// entry in `d`'s log among its DIR_ADDs: tar's chmod of a directory
    /// it extracted into, docs/KERNEL-FREE.md "Built: attribute changes
    /// under a directory lease").
    DirMode(u32),
    /// The client makes a directory in `d` under its lease (`make_node`
    /// as a create: the record FREE, its first log chunk, the DIR_ADD,
    /// then the journal's `{state LIVE, d's tail}`).
    Mkdir(&'static str),
    /// The owner removes a directory (the client's, once the lane is
    /// back).
    OwnerRmdir(&'static str),
}

/// A directory in the model: whole (empty, `..` naming its parent, two
/// links) reads as this; anything else as what is wrong with it.
const DIR_MARK: &[u8] = b"<dir>";

const STEPS: &[Step] = &[
    // An older file with blocks for the client to remove.
    Step::OwnerWrite("o1", 12288, 6),
    Step::Grant,
    Step::Create("c1"),
    Step::Mkdir("s1"),
    Step::Write("c1", 3000, 1),
    Step::Create("c2"),
    Step::Create("c3"),
    Step::DirMode(0o750),
    Step::Write("c3", 5000, 2),
    // The client's own create, then an older file (the owner's, lane 0).
    Step::Unlink("c2"),
    Step::Unlink("o1"),
    Step::Hold("c3"),
    Step::UnlinkHeld("c3"),
    Step::GiveBack,
    Step::OwnerCreate("o2"),
    // Into blocks the removals freed.
    Step::OwnerWrite("o2", 8192, 4),
    Step::Unhold("c3"),
    Step::OwnerUnlink("c1"),
    Step::OwnerRmdir("s1"),
    Step::Grant,
    Step::DirMode(0o711),
    Step::Create("c4"),
    Step::Write("c4", 100, 3),
    Step::Unlink("o2"),
    Step::Unlink("c4"),
    // In c4's slot.
    Step::Create("c5"),
    Step::Mkdir("s2"),
    Step::GiveBack,
];

/// Slots handed out at each grant.
const SLOTS: usize = 8;

/// The owner, the client's engine attached to the same pool, directory
/// `d` with file `o1` in it; the readers' epoch table both use (holds
/// included), with the client's slot claimed.
struct Setup {
    owner: Fs<SimPool>,
    client: Fs<SimPool>,
    d: u64,
    table: std::sync::Arc<crate::epoch::EpochTable>,
}

fn setup(mode: Mode) -> Result<Setup, String> {
    let e = |what: &'static str| move |err: crate::Error| format!("{what}: {err}");
    let pool = new_pool(false)?;
    let opts = mount_options(&pool, mode);
    let client_view = pool.share();
    let owner = Fs::mount(pool, opts).map_err(e("mount"))?;
    // In lane 0 whatever this thread's lane is (the runs are the same in
    // any test thread): the leased lane's slots are the client's alone.
    let d = on_lane(&owner, 0, || owner.mkdir(ROOT, b"d", 0o755, 0, 0))?
        .map_err(e("mkdir"))?
        .ino;
    let (_, fh) =
        on_lane(&owner, 0, || owner.create(d, b"o1", 0o644, 0, 0))?.map_err(e("create o1"))?;
    owner.release(fh);
    let client = Fs::attach_client(client_view, mode).map_err(e("attach"))?;
    let table = crate::epoch::EpochTable::new_shared();
    owner.share_epochs(table.clone());
    let slot = table.claim_index().ok_or("no epoch slot")?;
    client.client_use_epochs(table.clone(), slot);
    Ok(Setup {
        owner,
        client,
        d,
        table,
    })
}

/// The last lane: leased, blocks reserved, `d`'s lease.
fn grant(
    owner: &Fs<SimPool>,
    client: &Fs<SimPool>,
    d: u64,
) -> Result<(LaneGrant, Vec<(u64, u64)>), String> {
    let lane = owner.geometry().lane_count - 1;
    let g = owner
        .lease_lane(lane, SLOTS)
        .map_err(|e| format!("lease_lane: {e}"))?;
    client
        .client_take_lane(&g)
        .map_err(|e| format!("take lane: {e}"))?;
    let reserved = owner.reserve_blocks(RESERVE, 64);
    client
        .add_reservation(&reserved)
        .map_err(|e| format!("reservation: {e}"))?;
    // The kernel holds nothing in d: older files may be removed too.
    client
        .client_lease_dir_with(d, crate::rmlocal::KernelHeld::Nothing)
        .map_err(|e| format!("lease d: {e}"))?;
    Ok((g, reserved))
}

/// `d` and the lane back, what the client freed and did not use too.
fn give_back(owner: &Fs<SimPool>, client: &Fs<SimPool>, d: u64) -> Result<(), String> {
    let e = |what: &'static str| move |err: crate::Error| format!("{what}: {err}");
    client.client_give_back_dir(d);
    let ret = client
        .client_give_back_lane()
        .map_err(e("give back lane"))?;
    send_freed(owner, client)?;
    let unused = client.drain_reservation();
    owner.free_unused_blocks(&unused);
    owner.settle_dir(d).map_err(e("settle d"))?;
    owner.take_back_lane(&ret).map_err(e("take back lane"))?;
    Ok(())
}

/// What the client sends with its freed batches: the blocks, and the
/// older inodes it removed (`slot INO`).
fn send_freed(owner: &Fs<SimPool>, client: &Fs<SimPool>) -> Result<(), String> {
    owner.return_blocks(&client.take_client_freed());
    for ino in client.take_client_freed_slots() {
        owner
            .free_client_victim(ino)
            .map_err(|err| format!("slot {ino}: {err}"))?;
    }
    Ok(())
}

/// The client sequence in strict and sync modes, at most `max_images`
/// images per crash point.
pub fn explore_namespace_leases(max_images: usize, seed: u64) -> NsLeaseReport {
    let mut report = NsLeaseReport::default();
    for mode in [Mode::Strict, Mode::Sync] {
        if let Err(e) = sequence(mode, max_images, seed, &mut report) {
            report.violations.push(format!("{mode:?}: {e}"));
        }
    }
    report
}

struct Traced {
    step: Step,
    fences: (usize, usize),
    before: Model,
    after: Model,
    /// `d`'s mode before and after the step.
    modes: (u32, u32),
}

fn sequence(
    mode: Mode,
    max_images: usize,
    seed: u64,
    report: &mut NsLeaseReport,
) -> Result<(), String> {
    let e = |what: &'static str| move |err: crate::Error| format!("{what}: {err}");
    let Setup {
        owner,
        client,
        d,
        table,
    } = setup(mode)?;
    let holder = table.claim_index().ok_or("no epoch slot")?;
    let mut model: Model = [("o1", Vec::new())].into_iter().collect();
    let mut dmode = 0o755;
    let mut handles = BTreeMap::new();
    let mut holds = BTreeMap::new();
    let mut orphans = Vec::new();
    let f0 = owner.pmem().fence_count();
    let fences = || (owner.pmem().fence_count() - f0) as usize;
    owner.pmem().start_trace();
    let mut traced = Vec::new();
    for &step in STEPS {
        let before = model.clone();
        let mode_before = dmode;
        let start = fences();
        match step {
            Step::Grant => {
                grant(&owner, &client, d)?;
            }
            Step::Create(name) => {
                let _w = client.client_writes();
                let (_, fh) = client
                    .create(d, name.as_bytes(), 0o644, 0, 0)
                    .map_err(e("client create"))?;
                handles.insert(name, fh);
                model.insert(name, Vec::new());
            }
            Step::Write(name, len, b) => {
                let _w = client.client_writes();
                let fh = handles.get(name).ok_or("no handle")?;
                client
                    .write(fh, 0, &vec![b; len])
                    .map_err(e("client write"))?;
                model.insert(name, vec![b; len]);
            }
            Step::GiveBack => {
                for (_, fh) in std::mem::take(&mut handles) {
                    client.release(fh);
                }
                give_back(&owner, &client, d)?;
            }
            Step::OwnerCreate(name) => {
                // In the last lane: the slot of a removed file of lane 0
                // (o1) stays free, its record as the removal left it.
                let last = owner.geometry().lane_count - 1;
                let (_, fh) = on_lane(&owner, last, || {
                    owner.create(d, name.as_bytes(), 0o644, 0, 0)
                })?
                .map_err(e("owner create"))?;
                owner.release(fh);
                model.insert(name, Vec::new());
            }
            Step::OwnerUnlink(name) => {
                owner
                    .unlink(d, name.as_bytes())
                    .map_err(e("owner unlink"))?;
                model.remove(name);
            }
            Step::OwnerWrite(name, len, b) => {
                let ino = owner
                    .lookup_ino(d, name.as_bytes())
                    .map_err(e("owner lookup"))?;
                let fh = owner.open(ino).map_err(e("owner open"))?;
                // From lane 0's blocks, where o1's were: the blocks a
                // removal freed are reused.
                let r = on_lane(&owner, 0, || owner.write(&fh, 0, &vec![b; len]))?;
                owner.release(fh);
                r.map_err(e("owner write"))?;
                model.insert(name, vec![b; len]);
            }
            Step::Unlink(name) | Step::UnlinkHeld(name) => {
                if let Some(fh) = handles.remove(name) {
                    client.release(fh);
                }
                let _w = client.client_writes();
                let r = client
                    .client_unlink(None, d, name.as_bytes(), &|_| true)
                    .map_err(e("client unlink"))?;
                match (step, r) {
                    (Step::Unlink(_), ClientUnlink::Freed) => {}
                    (Step::UnlinkHeld(_), ClientUnlink::Held { ino, generation }) => {
                        orphans.push((ino, generation));
                    }
                    _ => return Err(format!("{step:?}: {r:?}")),
                }
                model.remove(name);
            }
            Step::Hold(name) => {
                let ino = client.lookup_ino(d, name.as_bytes()).map_err(e("lookup"))?;
                let at = table.hold(holder, ino).ok_or("no hold entry")?;
                holds.insert(name, (ino, at));
            }
            Step::Unhold(name) => {
                let (ino, at) = holds.remove(name).ok_or("not held")?;
                table.unhold(holder, at, ino);
                if owner.free_unheld_orphans() != 1 {
                    return Err(format!("{step:?}: the orphan was not freed"));
                }
            }
            Step::Mkdir(name) => {
                let _w = client.client_writes();
                client
                    .mkdir(d, name.as_bytes(), 0o755, 0, 0)
                    .map_err(e("client mkdir"))?;
                model.insert(name, DIR_MARK.to_vec());
            }
            Step::OwnerRmdir(name) => {
                owner.rmdir(d, name.as_bytes()).map_err(e("owner rmdir"))?;
                model.remove(name);
            }
            Step::DirMode(m) => {
                let _w = client.client_writes();
                let set = crate::types::SetAttr {
                    mode: Some(m),
                    ..Default::default()
                };
                client.setattr(d, &set).map_err(e("client chmod d"))?;
                dmode = m;
            }
        }
        if matches!(step, Step::GiveBack) {
            // `orphan INO GEN`, after the freed batch: held, so kept.
            for (ino, generation) in std::mem::take(&mut orphans) {
                if owner
                    .adopt_client_orphan(ino, generation)
                    .map_err(e("adopt"))?
                {
                    return Err(format!("orphan {ino} freed while held"));
                }
            }
        }
        // The holder of d sees the model (the owner catches up when d
        // comes back).
        let holder = if client.client_lane().is_some() {
            &client
        } else {
            &owner
        };
        if !same(&dir_model(holder, d)?, &model, None) || dir_mode(holder, d)? != dmode {
            return Err(format!("{step:?}: the live directory is not the model"));
        }
        traced.push(Traced {
            step,
            fences: (start, fences()),
            before,
            after: model.clone(),
            modes: (mode_before, dmode),
        });
    }
    let trace = owner.pmem().stop_trace();
    if !same(&dir_model(&owner, d)?, &model, None) || dir_mode(&owner, d)? != dmode {
        return Err("the owner's directory at the end is not the model".into());
    }
    report.steps += traced.len() as u64;
    let last = traced.len() - 1;
    for (i, t) in traced.iter().enumerate() {
        for point in points_of(t.fences, i == last, trace.fence_count()) {
            report.points += 1;
            for img in trace.crash_images(point, max_images, seed) {
                report.states += 1;
                let sync_write = mode == Mode::Sync && matches!(t.step, Step::Write(..));
                let modes = [t.modes.0, t.modes.1];
                if let Err(why) = check_image(
                    img.image,
                    mode,
                    d,
                    &[&t.before, &t.after],
                    sync_write,
                    Some(&modes),
                ) {
                    report
                        .violations
                        .push(format!("{mode:?} {:?} {}: {why}", t.step, img.description));
                }
            }
        }
    }
    Ok(())
}

/// The directory as a model: names and bytes (a directory's:
/// [`subdir_bytes`]). Err if `d`'s link count is not two plus its
/// directories (a directory's count is its DIR_ADDs of directories, kept
/// nowhere else: a mkdir's commit is its parent's too).
fn dir_model<P: Pmem>(fs: &Fs<P>, d: u64) -> Result<Got, String> {
    let mut names = Vec::new();
    fs.readdir(d, 0, &mut |e| {
        if e.name != b"." && e.name != b".." {
            names.push((e.name.clone(), e.ino, e.kind));
        }
        true
    })
    .map_err(|e| format!("readdir: {e}"))?;
    let dirs = names.iter().filter(|n| n.2 == FileKind::Dir).count() as u32;
    let nlink = fs.getattr(d).map_err(|e| format!("getattr d: {e}"))?.nlink;
    if nlink != 2 + dirs {
        return Err(format!("d has {nlink} links and {dirs} directories"));
    }
    names
        .into_iter()
        .map(|(n, ino, kind)| match kind {
            FileKind::Dir => Ok((n, subdir_bytes(fs, d, ino)?)),
            _ => Ok((n, read_all(fs, ino)?)),
        })
        .collect()
}

/// Directory `ino` in `d`, as the model reads it: [`DIR_MARK`] when it is
/// whole (no entry but `.` and `..`, `..` naming `d`, two links), else
/// what it is.
fn subdir_bytes<P: Pmem>(fs: &Fs<P>, d: u64, ino: u64) -> Result<Vec<u8>, String> {
    let (mut parent, mut entries) = (0, 0);
    fs.readdir(ino, 0, &mut |e| {
        if e.name == b".." {
            parent = e.ino;
        } else if e.name != b"." {
            entries += 1;
        }
        true
    })
    .map_err(|e| format!("readdir {ino}: {e}"))?;
    let nlink = fs
        .getattr(ino)
        .map_err(|e| format!("getattr {ino}: {e}"))?
        .nlink;
    if (parent, entries, nlink) == (d, 0, 2) {
        return Ok(DIR_MARK.to_vec());
    }
    Ok(format!("<dir: .. {parent}, {entries} entries, {nlink} links>").into_bytes())
}

/// A directory read back, as a model.
type Got = BTreeMap<Vec<u8>, Vec<u8>>;

/// `d`'s permission bits.
fn dir_mode<P: Pmem>(fs: &Fs<P>, d: u64) -> Result<u32, String> {
    fs.getattr(d)
        .map(|a| a.mode & 0o7777)
        .map_err(|e| format!("getattr d: {e}"))
}

/// Whether `got` is `m`: the same names, each with `m`'s bytes (or, for a
/// sync-mode write in flight, `mixed` between `before`'s and `m`'s).
fn same(got: &Got, m: &Model, before: Option<&Model>) -> bool {
    got.len() == m.len()
        && got.iter().zip(m.iter()).all(|((n, b), (mn, mb))| {
            n.as_slice() == mn.as_bytes()
                && (b == mb
                    || before.is_some_and(|old| {
                        let old = old.get(mn).map_or(&[][..], |v| v.as_slice());
                        mixed(b, old, mb)
                    }))
        })
}

/// One crash image: fsck, recovery, `d` one of `allowed` (names exactly;
/// a sync-mode write in flight, `sync_write`, may mix old and new bytes:
/// `allowed` is then before and after) and, if `modes` are given, `d`'s
/// mode one of them; a clean unmount that fsck finds perfect.
fn check_image(
    image: Vec<u8>,
    mode: Mode,
    d: u64,
    allowed: &[&Model],
    sync_write: bool,
    modes: Option<&[u32]>,
) -> Result<(), String> {
    let pm = SimPool::from_image(image);
    fsck(&pm, false)?;
    let opts = mount_options(&pm, mode);
    let fs = Fs::mount(pm, opts).map_err(|e| format!("recovery: {e}"))?;
    let got = dir_model(&fs, d)?;
    let before = sync_write.then(|| allowed[0]);
    if !allowed.iter().any(|m| same(&got, m, before)) {
        let names: Vec<String> = got
            .iter()
            .map(|(n, b)| format!("{}({})", String::from_utf8_lossy(n), b.len()))
            .collect();
        return Err(format!("d holds {names:?}: none of the states allowed"));
    }
    if let Some(modes) = modes {
        let got = dir_mode(&fs, d)?;
        if !modes.contains(&got) {
            let octal: Vec<String> = modes.iter().map(|m| format!("{m:o}")).collect();
            return Err(format!("d's mode {got:o}: none of {octal:?}"));
        }
    }
    let pm = fs.unmount().map_err(|e| format!("unmount: {e}"))?;
    fsck(&pm, true)
}

/// The kill variant's client operations, in order (names created, the
/// write of `c1` between them, then two removals). The lane's first table
/// block has room for the first two creates only: the third grows the
/// chain.
const KILL_CREATES: [&str; 3] = ["c1", "c2", "c3"];
/// Removed after the creates: the client's own `c2`, the owner's older
/// `o1` (lane 0).
const KILL_UNLINKS: [&str; 2] = ["c2", "o1"];
/// Made after the removals (perhaps in `c2`'s slot).
const KILL_MKDIR: &str = "s1";
/// The names after each of the kill variant's operations (the write of
/// `c1` and the chmod of `d` after it change none).
const KILL_STATES: [&[&str]; 9] = [
    &["o1"],
    &["c1", "o1"],
    &["c1", "o1"],
    &["c1", "o1"],
    &["c1", "c2", "o1"],
    &["c1", "c2", "c3", "o1"],
    &["c1", "c3", "o1"],
    &["c1", "c3"],
    &["c1", "c3", "s1"],
];
/// `c1`'s bytes once written.
const KILL_WRITE: usize = 4096;
/// `d`'s mode before the kill variant's chmod of it, and after.
const KILL_MODES: (u32, u32) = (0o755, 0o700);
/// The first of [`KILL_STATES`] after that chmod returned (`c2` made).
const KILL_AFTER_CHMOD: usize = 4;
/// Bound on the kill points (the operations have far fewer stores).
const KILLS_MAX: u64 = 400;

/// The client killed after each of its stores, the owner reaping the
/// lane, then changing `d`; strict and sync modes.
pub fn explore_namespace_reaping(max_images: usize, seed: u64) -> NsLeaseReport {
    let mut report = NsLeaseReport::default();
    for mode in [Mode::Strict, Mode::Sync] {
        for k in 0..=KILLS_MAX {
            report.steps += 1;
            match kill_run(mode, k, max_images, seed, &mut report) {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => {
                    report
                        .violations
                        .push(format!("{mode:?} killed after store {k}: {e}"));
                    break;
                }
            }
            if k == KILLS_MAX {
                report
                    .violations
                    .push(format!("{mode:?}: not done after {k} stores"));
            }
        }
    }
    report
}

/// Run `f` with every lane but `lane` leased away (and given back after
/// it, untouched): the owner's creates in it take `lane`'s slots.
fn on_lane<T>(owner: &Fs<SimPool>, lane: u32, f: impl FnOnce() -> T) -> Result<T, String> {
    let e = |what: &'static str| move |err: crate::Error| format!("{what}: {err}");
    let others: Vec<LaneGrant> = (0..owner.geometry().lane_count)
        .filter(|&l| l != lane)
        .map(|l| owner.lease_lane(l, 0))
        .collect::<crate::Result<_>>()
        .map_err(e("lease the other lanes"))?;
    let out = f();
    for g in others {
        let ret = crate::lanelease::LaneReturn {
            lane: g.lane,
            unused_slots: g.slots,
            table_end: g.table_end,
            ..Default::default()
        };
        owner
            .take_back_lane(&ret)
            .map_err(e("take the other lanes back"))?;
    }
    Ok(out)
}

/// One run: the client killed after `k` stores; true if the kill came
/// inside its operations.
fn kill_run(
    mode: Mode,
    k: u64,
    max_images: usize,
    seed: u64,
    report: &mut NsLeaseReport,
) -> Result<bool, String> {
    let e = |what: &'static str| move |err: crate::Error| format!("{what}: {err}");
    let Setup {
        owner, client, d, ..
    } = setup(mode)?;
    // The leased lane's first table block filled but for two slots, so
    // the client's third create grows the chain.
    let lane = owner.geometry().lane_count - 1;
    on_lane(&owner, lane, || -> crate::Result<()> {
        for i in 0..crate::format::INODES_PER_TABLE_BLOCK - 2 {
            let (_, fh) = owner.create(ROOT, format!("p{i}").as_bytes(), 0o644, 0, 0)?;
            owner.release(fh);
        }
        Ok(())
    })?
    .map_err(e("fill the lane's table"))?;
    let (g, reserved) = grant(&owner, &client, d)?;
    client.pmem().kill_after_stores(k);
    let done = catch_unwind(AssertUnwindSafe(|| -> crate::Result<()> {
        let _w = client.client_writes();
        let (_, fh) = client.create(d, KILL_CREATES[0].as_bytes(), 0o644, 0, 0)?;
        client.write(&fh, 0, &[5u8; KILL_WRITE])?;
        client.release(fh);
        // `d`'s own attributes under its lease: a kill between its
        // SET_ATTR entry and the tail store leaves the entry unnamed.
        let set = crate::types::SetAttr {
            mode: Some(KILL_MODES.1),
            ..Default::default()
        };
        client.setattr(d, &set)?;
        for name in &KILL_CREATES[1..] {
            let (_, fh) = client.create(d, name.as_bytes(), 0o644, 0, 0)?;
            client.release(fh);
        }
        for name in KILL_UNLINKS {
            match client.client_unlink(None, d, name.as_bytes(), &|_| true)? {
                ClientUnlink::Freed => {}
                r => return Err(crate::Error::Corrupt(format!("unlink {name}: {r:?}"))),
            }
        }
        client.mkdir(d, KILL_MKDIR.as_bytes(), 0o755, 0, 0)?;
        Ok(())
    }));
    let killed = match done {
        Ok(r) => {
            r.map_err(|err| format!("the client's operations: {err}"))?;
            client.pmem().kill();
            false
        }
        Err(payload) if payload.is::<Killed>() => true,
        Err(payload) => resume_unwind(payload),
    };
    drop(client);
    report.kills += killed as u64;

    // The reap, then the owner's own changes on what it adopted.
    owner.pmem().start_trace();
    let f0 = owner.pmem().fence_count();
    let fences = || (owner.pmem().fence_count() - f0) as usize;
    let settled = owner
        .reap_lane(g.lane, &[d], &reserved)
        .map_err(e("reap"))?;
    let reap_end = fences();
    let adopted = dir_model(&owner, d)?;
    // The last state whose names the reap adopted: none other is allowed.
    let names_of = |m: &Got| -> Vec<Vec<u8>> { m.keys().cloned().collect() };
    let Some(reached) = KILL_STATES.iter().rposition(|st| {
        st.iter()
            .map(|n| n.as_bytes().to_vec())
            .eq(names_of(&adopted))
    }) else {
        return Err(format!(
            "the reap adopted {:?}: no state of the client's operations",
            adopted
                .keys()
                .map(|n| String::from_utf8_lossy(n))
                .collect::<Vec<_>>()
        ));
    };
    report.adopted += (killed && reached > 0) as u64;
    // A directory adopted is whole (its record, its log and `d`'s entry
    // came with one commit).
    if adopted
        .get(KILL_MKDIR.as_bytes())
        .is_some_and(|b| b.as_slice() != DIR_MARK)
    {
        return Err(format!("the reap adopted {KILL_MKDIR} broken: {adopted:?}"));
    }
    // `d`'s mode: the chmod's once a later create was adopted (its commit
    // follows the chmod's in `d`'s log), either before.
    let dmode = dir_mode(&owner, d)?;
    let modes_allowed: &[u32] = if reached >= KILL_AFTER_CHMOD {
        &[KILL_MODES.1]
    } else {
        &[KILL_MODES.0, KILL_MODES.1]
    };
    if !modes_allowed.contains(&dmode) {
        return Err(format!(
            "the reap adopted {dmode:o} for d's mode at state {reached}"
        ));
    }
    // Every slot and block accounted: the owner's books are what a
    // recovery scan of the memory as it is finds.
    let scan = Fs::mount(
        SimPool::from_image(owner.pmem().current_image()),
        mount_options(owner.pmem(), mode),
    )
    .map_err(e("scan"))?
    .statfs();
    if owner.statfs() != scan {
        return Err(format!(
            "after the reap the owner has {:?}, a scan finds {scan:?}",
            owner.statfs()
        ));
    }
    // In the leased lane: its slot is in the block the client added to the
    // chain (the lowest free slot), whose link must be durable by now.
    let (o2, fh) = on_lane(&owner, lane, || owner.create(d, b"o2", 0o644, 0, 0))?
        .map_err(e("owner create"))?;
    owner.release(fh);
    let slot = (o2.ino - 1) / owner.geometry().lane_count as u64;
    if settled.table_blocks_added > 0 && slot >= crate::format::INODES_PER_TABLE_BLOCK {
        report.chain_built_on += 1;
    }
    let o2_end = fences();
    owner.unlink(d, b"o2").map_err(e("owner unlink"))?;
    let trace = owner.pmem().stop_trace();

    // The states allowed: during the reap, any state of the client's
    // operations up to what it adopted (c1 with its bytes or without: the
    // write may not have been durable, and the reap adopts it only if it
    // was visible); then what it adopted, before and after each of the
    // owner's changes.
    let to_model = |m: &Got| -> Model {
        m.iter()
            .map(|(n, b)| {
                let name: &'static str = match n.as_slice() {
                    b"c1" => "c1",
                    b"c2" => "c2",
                    b"c3" => "c3",
                    b"o1" => "o1",
                    b"s1" => "s1",
                    _ => "o2",
                };
                (name, b.clone())
            })
            .collect()
    };
    let after_reap = to_model(&adopted);
    let mut during_reap = Vec::new();
    for names in &KILL_STATES[..=reached] {
        for c1 in [Vec::new(), vec![5u8; KILL_WRITE]] {
            let empty = |n: &str| {
                if n == KILL_MKDIR {
                    DIR_MARK.to_vec()
                } else {
                    Vec::new()
                }
            };
            let mut m: Model = names.iter().map(|&n| (n, empty(n))).collect();
            if m.contains_key("c1") {
                m.insert("c1", c1);
            }
            during_reap.push(m);
        }
    }
    let mut with_o2 = after_reap.clone();
    with_o2.insert("o2", Vec::new());
    let phases: Vec<((usize, usize), Vec<&Model>)> = vec![
        ((0, reap_end), during_reap.iter().collect()),
        ((reap_end, o2_end), vec![&after_reap, &with_o2]),
        ((o2_end, trace.fence_count()), vec![&with_o2, &after_reap]),
    ];
    let last = phases.len() - 1;
    for (i, (fences, allowed)) in phases.iter().enumerate() {
        for point in points_of(*fences, i == last, trace.fence_count()) {
            report.points += 1;
            for img in trace.crash_images(point, max_images, seed) {
                report.states += 1;
                check_image(img.image, mode, d, allowed, false, None)
                    .map_err(|why| format!("phase {i}, {}: {why}", img.description))?;
            }
        }
    }
    Ok(killed)
}
