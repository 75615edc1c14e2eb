//! Group commit of the device flush: concurrent writers that each need
//! "a flush that started after my writes completed" share flushes, the way
//! a journal commits many transactions with one barrier.
//!
//! Flushes are numbered. A writer that finds none running starts the next
//! one itself (it starts after its writes, so it covers them); one that
//! finds a flush running needs the one after it (the running one may have
//! started before its writes), and waits: whoever finishes the running
//! flush starts the next, for every thread waiting on it at once. A count
//! of completed writes lets a writer skip the flush when one that started
//! after its last write has already completed.

use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

#[derive(Default)]
struct State {
    /// Flushes completed (numbers 1 ..= done).
    done: u64,
    running: bool,
    /// The count of completed writes the last successful flush covers.
    covered_writes: u64,
    /// Failed flushes (number → error), kept until every waiter for them
    /// has had the chance to see it.
    failed: BTreeMap<u64, (io::ErrorKind, String)>,
}

/// See the module documentation.
#[derive(Default)]
pub struct GroupFlush {
    state: Mutex<State>,
    finished: Condvar,
    /// Writes completed (each counted after its `write_at` returned).
    writes: AtomicU64,
    /// Flushes issued to the device, and flush requests served (the
    /// difference is what grouping saved).
    pub(crate) issued: AtomicU64,
    pub(crate) requests: AtomicU64,
}

impl GroupFlush {
    /// A write completed: flushes that start from now on cover it.
    pub fn wrote(&self) {
        self.writes.fetch_add(1, Ordering::Release);
    }

    /// Writes completed so far.
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::Acquire)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Return once a flush that started after every write completed before
    /// this call has completed; `flush` issues one to the device.
    pub fn flush(&self, flush: impl Fn() -> io::Result<()>) -> io::Result<()> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let writes_now = self.writes();
        let mut s = self.lock();
        if s.covered_writes >= writes_now {
            return Ok(());
        }
        let need = if s.running { s.done + 2 } else { s.done + 1 };
        loop {
            if s.done >= need {
                return match s.failed.get(&need) {
                    Some((kind, msg)) => Err(io::Error::new(*kind, msg.clone())),
                    None => Ok(()),
                };
            }
            if s.running {
                s = self.finished.wait(s).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            s.running = true;
            let number = s.done + 1;
            let covers = self.writes();
            drop(s);
            self.issued.fetch_add(1, Ordering::Relaxed);
            let r = flush();
            s = self.lock();
            s.running = false;
            s.done = number;
            match &r {
                Ok(()) => s.covered_writes = s.covered_writes.max(covers),
                Err(e) => {
                    s.failed.insert(number, (e.kind(), e.to_string()));
                    // Waiters for older numbers have long been woken.
                    let old = number.saturating_sub(1024);
                    s.failed = s.failed.split_off(&old);
                }
            }
            self.finished.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn nothing_written_nothing_flushed() {
        let g = GroupFlush::default();
        g.flush(|| panic!("no write to flush")).unwrap();
        g.wrote();
        let n = AtomicU64::new(0);
        g.flush(|| {
            n.fetch_add(1, Ordering::Relaxed);
            Ok(())
        })
        .unwrap();
        g.flush(|| panic!("covered already")).unwrap();
        assert_eq!(n.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_failed_flush_fails_its_waiters_and_the_next_succeeds() {
        let g = GroupFlush::default();
        g.wrote();
        let e = g
            .flush(|| Err(io::Error::other("boom")))
            .unwrap_err();
        assert_eq!(e.to_string(), "boom");
        // Not covered: the next request flushes again.
        g.flush(|| Ok(())).unwrap();
    }

    #[test]
    fn concurrent_writers_share_flushes_and_each_is_covered() {
        let g = Arc::new(GroupFlush::default());
        // "Durable" = the value of `writes` the last completed flush saw.
        let durable = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (g, durable) = (g.clone(), durable.clone());
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        g.wrote();
                        let mine = g.writes();
                        g.flush(|| {
                            let w = g.writes();
                            std::thread::sleep(std::time::Duration::from_micros(50));
                            durable.fetch_max(w, Ordering::SeqCst);
                            Ok(())
                        })
                        .unwrap();
                        assert!(durable.load(Ordering::SeqCst) >= mine);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let issued = g.issued.load(Ordering::Relaxed);
        assert!(issued <= 800, "{issued} flushes for 800 requests");
    }
}
