//! Write-backs answered late: a hybrid posix mount's write-back that left
//! device data to flush (an append the engine deferred, or an overwrite in
//! place on the device) hands its reply here instead of flushing the
//! device itself. One thread, woken by the first such write-back, runs the
//! engine's round (`commit_deferred`: one device flush, then the deferred
//! tails stored) and only then answers every write-back queued before the
//! round began (docs/DESIGN.md, "Deferred commits, answered late").
//!
//! The setattr that carries the times the kernel writes back between
//! write-backs is answered the same way when its commit joined the file's
//! deferred ones (otherwise it would flush the device to settle them).
//!
//! Every write-back is thus durable when answered, as before: FSYNC stays
//! ENOSYS, and fsync, sync and syncfs keep their meaning (each waits for
//! the write-backs). The kernel keeps sending write-backs while answers
//! are outstanding, so one flush covers as many as arrive during the last
//! one. fuser's replies may be sent from any thread.
//!
//! Ownership: the queue and the thread belong to the mount's `InkFuse`;
//! dropping it (the session ended) answers what is queued and joins the
//! thread, which then holds no reference to the engine.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use fuser::{Errno, FileAttr, ReplyAttr, ReplyWrite};

use crate::clock::Tick;
use crate::stats::{Op, Stats};
use crate::Engine;

/// A request waiting for the round: its reply and what it answers, when
/// it arrived (its time in the statistics includes the wait).
struct Waiter {
    answer: Answer,
    started: Tick,
}

enum Answer {
    /// A write-back of this many bytes.
    Write(ReplyWrite, u32),
    /// A setattr of the times the kernel writes back between write-backs
    /// (its commit joined the file's deferred ones).
    Attr(ReplyAttr, FileAttr, Duration),
}

impl Answer {
    fn op(&self) -> Op {
        match self {
            Answer::Write(..) => Op::write,
            Answer::Attr(..) => Op::setattr,
        }
    }

    fn send(self, r: &inkfs::api::Result<()>) {
        match (self, r) {
            (Answer::Write(reply, len), Ok(())) => reply.written(len),
            (Answer::Attr(reply, attr, ttl), Ok(())) => reply.attr(&ttl, &attr),
            (Answer::Write(reply, _), Err(e)) => reply.error(Errno::from_i32(e.errno())),
            (Answer::Attr(reply, ..), Err(e)) => reply.error(Errno::from_i32(e.errno())),
        }
    }
}

#[derive(Default)]
struct Queue {
    waiting: Vec<Waiter>,
    stopping: bool,
}

#[derive(Default)]
struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// See the module documentation.
pub struct Flusher {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Flusher {
    /// Start the thread for `fs`'s rounds.
    pub fn start(fs: Arc<Engine>, stats: Arc<Stats>) -> std::io::Result<Flusher> {
        let shared = Arc::new(Shared::default());
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("inkfs-writeback".into())
            .spawn(move || run(&fs, &stats, &s))?;
        Ok(Flusher {
            shared,
            thread: Some(thread),
        })
    }

    /// Answer `reply` with `len` once a round that begins after this call
    /// has committed.
    pub fn write_after_round(&self, reply: ReplyWrite, len: u32, started: Tick) {
        self.queue(Answer::Write(reply, len), started);
    }

    /// Answer `reply` with `attr` once a round that begins after this call
    /// has committed.
    pub fn attr_after_round(&self, reply: ReplyAttr, attr: FileAttr, ttl: Duration, started: Tick) {
        self.queue(Answer::Attr(reply, attr, ttl), started);
    }

    fn queue(&self, answer: Answer, started: Tick) {
        let mut q = self.shared.lock();
        q.waiting.push(Waiter { answer, started });
        if q.waiting.len() == 1 {
            self.shared.wake.notify_one();
        }
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        self.shared.lock().stopping = true;
        self.shared.wake.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The thread: wait for a waiter, take every one queued, run one round,
/// answer them; until stopped with nothing queued.
fn run(fs: &Engine, stats: &Stats, shared: &Shared) {
    let mut batch = Vec::new();
    loop {
        {
            let mut q = shared.lock();
            while q.waiting.is_empty() && !q.stopping {
                q = shared.wake.wait(q).unwrap_or_else(|p| p.into_inner());
            }
            if q.waiting.is_empty() {
                return;
            }
            // Taken before the round begins: each of these write-backs
            // returned from the engine before the round notes the pending
            // tails, so the round covers it.
            std::mem::swap(&mut batch, &mut q.waiting);
        }
        let r = fs.commit_deferred();
        for w in batch.drain(..) {
            stats.record(w.answer.op(), w.started, r.is_ok());
            w.answer.send(&r);
        }
    }
}
