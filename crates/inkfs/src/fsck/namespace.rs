//! The namespace walk, from the root: every entry must name a live inode
//! of the kind it says, a directory must have one name and a ".." that
//! agrees with it, every live inode must be reached, and a non-directory's
//! link count must equal the entries naming it. Unreachable trees are
//! reconnected (tops first) to /lost+found at repair.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use super::check::{show_name, Checker, Found};
use super::inodes::InoInfo;
use super::repair::Fix;
use super::report::{Problem, ProblemKind, Severity};
use crate::format::*;
use crate::pmem::Pmem;

impl<P: Pmem + ?Sized> Checker<'_, P> {
    pub(super) fn check_namespace(&mut self) {
        let inodes = std::mem::take(&mut self.inodes);
        let mut ns = Namespace {
            inodes: &inodes,
            found: Vec::new(),
            visited: HashSet::new(),
            links: HashMap::new(),
            refs: HashMap::new(),
        };
        let root_ok = match inodes.get(&ROOT_INO) {
            None => Some("the root directory (inode 1) is not live"),
            Some(i) if i.kind != FileKind::Dir || i.state != INODE_LIVE => {
                Some("the root inode is not a live directory")
            }
            Some(i) if i.body.is_none() => Some("the root directory's log is damaged"),
            Some(_) => None,
        };
        if let Some(m) = root_ok {
            self.error(ProblemKind::Root, Some(ROOT_INO), m.into(), None);
            self.inodes = inodes;
            return;
        }
        ns.walk(ROOT_INO);

        // Unreachable directories: the tops of unreachable trees first (no
        // unreachable directory names them), each reconnected with its tree.
        let unreached: Vec<u64> = inodes
            .iter()
            .filter(|(ino, i)| {
                i.kind == FileKind::Dir
                    && i.state == INODE_LIVE
                    && i.body.is_some()
                    && !ns.visited.contains(*ino)
            })
            .map(|(ino, _)| *ino)
            .collect();
        let named: HashSet<u64> = unreached
            .iter()
            .filter_map(|d| inodes.get(d)?.body.as_ref())
            .flat_map(|b| b.children.iter().map(|c| c.1))
            .collect();
        let (tops, rest): (Vec<u64>, Vec<u64>) =
            unreached.into_iter().partition(|d| !named.contains(d));
        let mut reconnected = HashSet::new();
        for d in tops.into_iter().chain(rest) {
            if ns.visited.contains(&d) {
                continue;
            }
            ns.found.push(Found {
                problem: Problem {
                    kind: ProblemKind::Unreachable,
                    severity: Severity::Error,
                    ino: Some(d),
                    message: "directory not reachable from the root; reconnect to /lost+found"
                        .into(),
                    repairable: true,
                    repaired: false,
                },
                fix: Some(Fix::Reconnect { ino: d }),
            });
            reconnected.insert(d);
            ns.walk(d);
        }

        // Files and other non-directories: reachability and link counts.
        for (&ino, i) in inodes.iter() {
            if i.kind == FileKind::Dir || i.state != INODE_LIVE {
                continue;
            }
            let Some(b) = &i.body else { continue };
            let mut refs = ns.refs.get(&ino).copied().unwrap_or(0);
            if refs == 0 {
                ns.found.push(Found {
                    problem: Problem {
                        kind: ProblemKind::Unreachable,
                        severity: Severity::Error,
                        ino: Some(ino),
                        message: "no directory entry names this inode; reconnect to /lost+found"
                            .into(),
                        repairable: true,
                        repaired: false,
                    },
                    fix: Some(Fix::Reconnect { ino }),
                });
                refs = 1;
            }
            if b.nlink != refs {
                ns.found.push(Found {
                    problem: Problem {
                        kind: ProblemKind::LinkCount,
                        severity: Severity::Error,
                        ino: Some(ino),
                        message: format!(
                            "link count is {}, but {refs} directory entr{} name{} it",
                            b.nlink,
                            if refs == 1 { "y" } else { "ies" },
                            if refs == 1 { "s" } else { "" }
                        ),
                        repairable: true,
                        repaired: false,
                    },
                    fix: Some(Fix::SetNlink { ino, nlink: refs }),
                });
            }
        }

        // "..": the root's is itself; every other reached directory's is
        // the directory that names it.
        let mut parents: Vec<(u64, u64)> = ns.links.iter().map(|(&c, &(p, _))| (c, p)).collect();
        parents.push((ROOT_INO, ROOT_INO));
        parents.sort_unstable();
        for (dir, parent) in parents {
            if reconnected.contains(&dir) {
                continue;
            }
            let Some(b) = inodes.get(&dir).and_then(|i| i.body.as_ref()) else {
                continue;
            };
            if b.parent != parent {
                ns.found.push(Found {
                    problem: Problem {
                        kind: ProblemKind::DirParent,
                        severity: Severity::Error,
                        ino: Some(dir),
                        message: format!(
                            "\"..\" is inode {}, but the directory is found in inode {parent}",
                            b.parent
                        ),
                        repairable: true,
                        repaired: false,
                    },
                    fix: Some(Fix::SetParent { dir, parent }),
                });
            }
        }
        let found = ns.found;
        self.found.extend(found);
        self.inodes = inodes;
    }
}

/// The namespace walk: directories reached, the entry by which each was
/// reached, and how many entries name each non-directory.
struct Namespace<'i> {
    inodes: &'i BTreeMap<u64, InoInfo>,
    found: Vec<Found>,
    visited: HashSet<u64>,
    /// Directory → (parent, name) of the entry it is reached by.
    links: HashMap<u64, (u64, Vec<u8>)>,
    refs: HashMap<u64, u32>,
}

impl Namespace<'_> {
    fn error(&mut self, kind: ProblemKind, ino: u64, message: String, fix: Option<Fix>) {
        self.found.push(Found {
            problem: Problem {
                kind,
                severity: Severity::Error,
                ino: Some(ino),
                message,
                repairable: fix.is_some(),
                repaired: false,
            },
            fix,
        });
    }

    /// True if `d` is `anc` or lies below it (following reached links).
    fn is_under(&self, mut d: u64, anc: u64) -> bool {
        // Bounded: links form a forest, and at most one step per directory.
        for _ in 0..=self.links.len() {
            if d == anc {
                return true;
            }
            match self.links.get(&d) {
                Some(&(p, _)) => d = p,
                None => return false,
            }
        }
        false
    }

    /// Breadth-first from directory `start` (bounded: each directory is
    /// expanded once).
    fn walk(&mut self, start: u64) {
        let inodes = self.inodes;
        self.visited.insert(start);
        let mut queue = VecDeque::from([start]);
        while let Some(d) = queue.pop_front() {
            let Some(body) = inodes.get(&d).and_then(|i| i.body.as_ref()) else {
                continue;
            };
            for (name, cino, ckind) in &body.children {
                let (name, cino, ckind) = (name.clone(), *cino, *ckind);
                // Names were checked by the log decoder (`dir_name_valid`).
                debug_assert!(dir_name_valid(&name));
                let shown = show_name(&name);
                let child = inodes.get(&cino).filter(|i| i.state == INODE_LIVE);
                let Some(child) = child else {
                    let what = match inodes.get(&cino) {
                        Some(_) => "an orphan",
                        None => "free or nonexistent",
                    };
                    self.error(
                        ProblemKind::DanglingEntry,
                        d,
                        format!("entry \"{shown}\" names inode {cino}, which is {what}"),
                        Some(Fix::RemoveEntry { dir: d, name }),
                    );
                    continue;
                };
                if child.kind != ckind {
                    self.error(
                        ProblemKind::EntryKind,
                        d,
                        format!(
                            "entry \"{shown}\" says inode {cino} is a {ckind:?}, it is a {:?}",
                            child.kind
                        ),
                        Some(Fix::RetargetEntry {
                            dir: d,
                            name: name.clone(),
                            ino: cino,
                            kind: child.kind,
                        }),
                    );
                }
                if child.kind != FileKind::Dir {
                    *self.refs.entry(cino).or_insert(0) += 1;
                    continue;
                }
                if !self.visited.contains(&cino) {
                    self.visited.insert(cino);
                    self.links.insert(cino, (d, name));
                    queue.push_back(cino);
                    continue;
                }
                // A second name for a directory. Keep the one its ".."
                // agrees with, unless that would cut the tree off.
                let recorded = child.body.as_ref().map(|b| b.parent);
                let keep_new = cino != ROOT_INO
                    && recorded == Some(d)
                    && self.links.get(&cino).is_some_and(|(p, _)| *p != d)
                    && !self.is_under(d, cino);
                let (extra_dir, extra_name) = if keep_new {
                    match self.links.insert(cino, (d, name)) {
                        Some(old) => old,
                        None => continue,
                    }
                } else {
                    (d, name)
                };
                self.error(
                    ProblemKind::DirLinkedTwice,
                    extra_dir,
                    format!(
                        "entry \"{}\" names directory {cino}, which already has a name \
                         (or is an ancestor)",
                        show_name(&extra_name)
                    ),
                    Some(Fix::RemoveEntry {
                        dir: extra_dir,
                        name: extra_name,
                    }),
                );
            }
        }
    }
}
