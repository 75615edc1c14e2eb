//! The state of a pool, in the same words for `inkfs stat` and `inkfs fsck`.
//!
//! Two facts make it: what the superblock says (CLEAN after a clean unmount,
//! MOUNTED while a read-write engine has it) and who holds the pool's lock
//! now (`inkfs::pmem::PoolBusy`). MOUNTED with nobody holding the lock is a
//! crash, which the next read-write mount recovers.

use inkfs::pmem::PoolBusy;
use serde_json::{json, Value};

pub struct PoolState {
    /// For scripts: "clean", "crashed", "mounted" or "in_use".
    pub word: &'static str,
    /// For people: "clean", "crashed: will recover at next mount",
    /// "mounted by pid 12 (inkfs mount /dev/shm/p /mnt/x)", ...
    pub text: String,
}

/// `clean`: the superblock says the pool was cleanly unmounted; `busy`
/// who holds the pool (None: nobody).
pub fn pool_state(clean: bool, busy: Option<&PoolBusy>) -> PoolState {
    let finishing = |b: &PoolBusy| {
        if b.finishing {
            ", finishing its unmount"
        } else {
            ""
        }
    };
    match busy {
        None if clean => PoolState {
            word: "clean",
            text: "clean".into(),
        },
        None => PoolState {
            word: "crashed",
            text: "crashed: will recover at next mount".into(),
        },
        Some(b) if b.exclusive && !clean => PoolState {
            word: "mounted",
            text: format!("mounted by {}{}", b.holders_text(), finishing(b)),
        },
        // A read-write open that has not mounted (mkfs, fsck -y), or a
        // mount that has just marked the pool clean.
        Some(b) if b.exclusive => PoolState {
            word: "in_use",
            text: format!("in use by {}{}", b.holders_text(), finishing(b)),
        },
        Some(b) if clean => PoolState {
            word: "clean",
            text: format!("clean; open read-only by {}", b.holders_text()),
        },
        Some(b) => PoolState {
            word: "crashed",
            text: format!(
                "crashed: will recover at next read-write mount; open read-only by {}",
                b.holders_text()
            ),
        },
    }
}

/// The holders as JSON: `[{"pid":12,"command":"inkfs mount ..."}]`.
pub fn holders_json(busy: Option<&PoolBusy>) -> Value {
    let holders: Vec<Value> = busy
        .map(|b| {
            b.holders
                .iter()
                .map(|h| json!({"pid": h.pid, "command": h.command}))
                .collect()
        })
        .unwrap_or_default();
    Value::Array(holders)
}

/// How the pool is held, for JSON: "exclusive", "shared" or null.
pub fn held_json(busy: Option<&PoolBusy>) -> Value {
    match busy {
        None => Value::Null,
        Some(b) if b.exclusive => "exclusive".into(),
        Some(_) => "shared".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inkfs::pmem::Holder;

    fn held(exclusive: bool) -> PoolBusy {
        PoolBusy {
            exclusive,
            holders: vec![Holder {
                pid: 42,
                command: "inkfs mount /p /m".into(),
            }],
            hidden: false,
            finishing: false,
        }
    }

    #[test]
    fn states_are_named_for_what_they_are() {
        assert_eq!(pool_state(true, None).text, "clean");
        let s = pool_state(false, None);
        assert_eq!(
            (s.word, s.text.as_str()),
            ("crashed", "crashed: will recover at next mount")
        );
        let s = pool_state(false, Some(&held(true)));
        assert_eq!(
            (s.word, s.text.as_str()),
            ("mounted", "mounted by pid 42 (inkfs mount /p /m)")
        );
        assert_eq!(pool_state(true, Some(&held(true))).word, "in_use");
        let s = pool_state(true, Some(&held(false)));
        assert_eq!(
            (s.word, s.text.as_str()),
            (
                "clean",
                "clean; open read-only by pid 42 (inkfs mount /p /m)"
            )
        );
    }
}
