//! Namespace requests of attached clients, the server's side
//! (docs/KERNEL-FREE.md, "Stage 4: the channel"; the messages:
//! `inkfs::api::ns`).
//!
//! Each request runs on its client's worker thread (attach.rs), through
//! `inkfs::api` with the credentials the client stated, as a FUSE request
//! does: the engine's permission rules, and the lease table's hold on every
//! inode it uses until the engine call returns (so no lease is granted on
//! an inode while the request changes its log). Then, before the answer,
//! the kernel is told every name and attribute the request changed
//! ([`Invalidator::client_changed`]): when the program gets its answer,
//! the mount shows the change (an invalidation the kernel answers ENOENT
//! while a reply handing it the inode is on its way is sent again until
//! it lands: crate::inval). Only what the kernel can hold is told
//! (`Invalidator::needed`): nothing of an inode it has no count of, no
//! name under a directory it has no count of (`crate::kernel_refs` says why that is
//! enough, and how a reply racing the change gets the new state). A
//! library's untar makes its directories and files through here, unseen by
//! the kernel: none of its changes is sent. Waiting for the kernel here is safe: it may wait
//! for a directory's lock that a FUSE request in flight holds, and the
//! server's FUSE threads finish that request without this client (its
//! recalls are answered by its own recall thread).

use std::sync::Arc;

use inkfs::api::dirlease::{DirAnswer, Refusal};
use inkfs::api::lanelease::LaneGrant;
use inkfs::api::ns::{Done, Op, Request};
use inkfs::api::{self, Credentials, OpenFlags, RenameFlags, XattrFlags};

use crate::inval::{Change, Invalidator};
use crate::kernel_refs::{KernelRefs, Remover};
use crate::lease::{Holder, Leases};
use crate::stats::{self, Stats};
use crate::Engine;

/// What a request made or changed, for the answer and the kernel.
struct Made {
    ino: u64,
    /// Its generation (0 when not known).
    igen: u64,
    /// A write lease granted with it (its grant number).
    gen: u64,
    /// A regular file created (or opened) for writing: its lease goes
    /// with the answer, granted once the request's hold on the inodes it
    /// used is over (a grant waits for every hold on the inode to end).
    lease: bool,
    changes: Vec<Change>,
}

fn made(ino: u64, changes: Vec<Change>) -> Made {
    Made {
        ino,
        igen: 0,
        gen: 0,
        lease: false,
        changes,
    }
}

/// Run `req` for the client `holder` and answer it. An inode it removes
/// that the kernel still refers to stays pinned in `refs` until the kernel
/// forgets it (`KernelRefs::removing`).
pub fn serve(
    engine: &Engine,
    leases: &Arc<Leases>,
    inval: &Invalidator,
    refs: &KernelRefs,
    stats: &Stats,
    holder: &Arc<Holder>,
    req: &Request,
) -> Done {
    let t = crate::clock::now();
    // Leases given back with the request first: its engine call would
    // recall them (lease.rs).
    leases.settle_given(holder, &req.give);
    let r = {
        // Hold what the engine uses, as a FUSE request does (lease.rs).
        let _scope = leases.scope();
        run(engine, refs, &req.cred, &req.op)
    };
    let done = match r {
        Ok(mut m) => {
            if m.lease {
                // The lease comes with the create: no grant round trip.
                // Refused (the server is ending...): the client asks for it
                // at its first write.
                if let Ok(gen) = leases.grant(holder, m.ino, false) {
                    m.gen = gen;
                }
            }
            if m.gen == 0 && matches!(req.op, Op::Create { .. }) {
                // (A grant invalidated the inode's attributes already; an
                // existing file opened with O_TRUNC changed them.)
                m.changes.push(Change::Attr { ino: m.ino });
            }
            // After the engine call: a skip is decided on the changed
            // state (kernel_refs.rs).
            for c in m.changes {
                inval.client_changed(c);
            }
            Done {
                seq: req.seq,
                errno: 0,
                ino: m.ino,
                igen: m.igen,
                gen: m.gen,
                dir: None,
                lane: None,
            }
        }
        Err(e) => Done {
            seq: req.seq,
            errno: e.errno(),
            ino: 0,
            igen: 0,
            gen: 0,
            dir: None,
            lane: None,
        },
    };
    // The directory's lease, asked with the request (`+dir`), whatever
    // the request's own result: granted once the request's hold on the
    // directory is over, as a create's file lease (crate::dirlease).
    let done = match req.dir().filter(|_| req.dir_lease) {
        Some(dir) => {
            let (dir, lane) = grant_dir(engine, leases, holder, dir, req.lane_lease);
            Done {
                dir: Some(dir),
                lane,
                ..done
            }
        }
        None => done,
    };
    stats.record(op_stat(&req.op), t, done.errno == 0);
    done
}

/// Directory `dir`'s lease for `holder`, and a lane with it if it asked
/// (`+lane`) and holds none (crate::lanes): no lane to be had refuses the
/// directory too (`nolane`), and a lane leased for a directory then
/// refused goes back at once.
fn grant_dir(
    engine: &Engine,
    leases: &Leases,
    holder: &Arc<Holder>,
    dir: u64,
    with_lane: bool,
) -> (DirAnswer, Option<LaneGrant>) {
    let lane = if with_lane {
        match crate::lanes::grant(leases, engine, holder) {
            Ok(g) => g,
            Err(()) => {
                leases.dirs.refused(Refusal::NoLane);
                return (DirAnswer::Refused(Refusal::NoLane), None);
            }
        }
    } else {
        None
    };
    match leases.grant_dir(holder, dir) {
        Ok((gen, kernel)) => (DirAnswer::Granted { gen, kernel }, lane),
        Err(why) => {
            if let Some(g) = &lane {
                crate::lanes::untake(leases, engine, holder, g);
            }
            (DirAnswer::Refused(why), None)
        }
    }
}

fn op_stat(op: &Op) -> stats::Op {
    match op {
        Op::Create { .. } => stats::Op::client_create,
        Op::Mkdir { .. } => stats::Op::client_mkdir,
        Op::Mknod { .. } => stats::Op::client_mknod,
        Op::Symlink { .. } => stats::Op::client_symlink,
        Op::Link { .. } => stats::Op::client_link,
        Op::Unlink { .. } => stats::Op::client_unlink,
        Op::Rmdir { .. } => stats::Op::client_rmdir,
        Op::Rename { .. } => stats::Op::client_rename,
        Op::Setattr { .. } => stats::Op::client_setattr,
        Op::Setxattr { .. } => stats::Op::client_setxattr,
        Op::Removexattr { .. } => stats::Op::client_removexattr,
    }
}

/// The inode `name` in `dir` names now, if any (to tell the kernel which
/// inode a removal took).
fn victim(engine: &Engine, dir: u64, name: &[u8]) -> Option<u64> {
    victim_attr(engine, dir, name).map(|a| a.ino)
}

fn victim_attr(engine: &Engine, dir: u64, name: &[u8]) -> Option<api::Attr> {
    engine.lookup(&Credentials::root(), dir, name).ok()
}

fn entry(parent: u64, name: &[u8]) -> Change {
    Change::Entry {
        parent,
        name: name.to_vec(),
    }
}

fn run(engine: &Engine, refs: &KernelRefs, cred: &Credentials, op: &Op) -> api::Result<Made> {
    match op {
        Op::Create {
            dir,
            name,
            mode,
            flags,
        } => {
            let (a, file) =
                engine.create(cred, *dir, name, mode & 0o7777, OpenFlags::new(*flags))?;
            let writable = file.flags().writable();
            engine.release(file);
            let mut m = made(a.ino, vec![entry(*dir, name)]);
            m.igen = a.generation;
            m.lease = writable && a.kind == api::FileKind::File;
            Ok(m)
        }
        Op::Mkdir { dir, name, mode } => {
            let a = engine.mkdir(cred, *dir, name, *mode)?;
            Ok(made(a.ino, vec![entry(*dir, name)]))
        }
        Op::Mknod {
            dir,
            name,
            mode,
            rdev,
        } => {
            let a = engine.mknod(cred, *dir, name, *mode, *rdev)?;
            Ok(made(a.ino, vec![entry(*dir, name)]))
        }
        Op::Symlink { dir, name, target } => {
            let a = engine.symlink(cred, *dir, name, target)?;
            Ok(made(a.ino, vec![entry(*dir, name)]))
        }
        Op::Link { ino, dir, name } => {
            let a = engine.link(cred, *ino, *dir, name)?;
            Ok(made(
                a.ino,
                vec![entry(*dir, name), Change::Attr { ino: *ino }],
            ))
        }
        Op::Unlink { dir, name } | Op::Rmdir { dir, name } => {
            let child = victim_attr(engine, *dir, name);
            refs.removing(
                engine,
                child.as_ref().map(|a| a.ino),
                Remover::Client,
                || {
                    if matches!(op, Op::Rmdir { .. }) {
                        engine.rmdir(cred, *dir, name)
                    } else {
                        engine.unlink(cred, *dir, name)
                    }
                },
            )?;
            let mut changes = Vec::new();
            match child {
                Some(a) => {
                    changes.push(Change::Deleted {
                        parent: *dir,
                        child: a.ino,
                        name: name.clone(),
                    });
                    if a.kind != api::FileKind::Dir && a.nlink > 1 {
                        // Other names remain: its link count changed.
                        changes.push(Change::Attr { ino: a.ino });
                    }
                }
                None => changes.push(entry(*dir, name)),
            }
            Ok(made(child.map_or(0, |a| a.ino), changes))
        }
        Op::Rename {
            dir,
            name,
            to_dir,
            to,
            flags,
        } => {
            let f = RenameFlags::from_bits(*flags)?;
            let moved = victim(engine, *dir, name);
            let replaced = victim(engine, *to_dir, to);
            let over = replaced.filter(|_| !f.exchange);
            refs.removing(engine, over, Remover::Client, || {
                engine.rename(
                    cred,
                    &api::Rename {
                        from_dir: *dir,
                        from: name,
                        to_dir: *to_dir,
                        to,
                        flags: f,
                    },
                )
            })?;
            // The old name (moved, or exchanged), the new one, the ctimes.
            let mut changes = vec![entry(*dir, name)];
            match replaced {
                // A directory replaced by the rename is gone: the kernel
                // marks it dead (no more listing or lookups in it).
                Some(v) if !f.exchange && Some(v) != moved => changes.push(Change::Deleted {
                    parent: *to_dir,
                    child: v,
                    name: to.clone(),
                }),
                _ => changes.push(entry(*to_dir, to)),
            }
            for ino in [moved, replaced].into_iter().flatten() {
                changes.push(Change::Attr { ino });
            }
            Ok(made(moved.unwrap_or(0), changes))
        }
        Op::Setattr { ino, set } => {
            let a = engine.setattr(cred, *ino, set, None)?;
            Ok(made(a.ino, vec![Change::Attr { ino: *ino }]))
        }
        Op::Setxattr {
            ino,
            name,
            value,
            flags,
        } => {
            engine.setxattr(cred, *ino, name, value, XattrFlags::from_bits(*flags)?)?;
            Ok(made(*ino, vec![Change::Attr { ino: *ino }]))
        }
        Op::Removexattr { ino, name } => {
            engine.removexattr(cred, *ino, name)?;
            Ok(made(*ino, vec![Change::Attr { ino: *ino }]))
        }
    }
}
