//! Adaptive polling of the FUSE device (`-o poll`).
//!
//! A FUSE request is a ping-pong between the caller's thread and the
//! server's. When the server thread sleeps in `read(/dev/fuse)` between
//! requests, every request pays for waking it (tens of µs on an idle
//! virtual machine, against a few µs when both threads are running). While
//! requests keep coming, this puts the device in non-blocking mode, so the
//! server's read loop spins instead of sleeping; after a quiet interval it
//! goes back to blocking reads, so an idle mount costs no CPU.
//!
//! With several worker threads (`threads=N`, one cloned device each) only
//! the session's own device is switched: one thread spins and the others
//! sleep until the kernel hands them a request. All spinning would leave
//! nothing of a 2-CPU machine for the clients.
//!
//! The flag belongs to the device's open file description, which this
//! module holds a duplicate of: toggling it never touches a reused
//! descriptor number, even after the session closed its own.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::stats::Counter;

/// How long without a request before the server sleeps again.
const QUIET: Duration = Duration::from_millis(2);
/// How often an idle mount checks for activity (after a second of quiet):
/// a burst's first requests are served by blocking reads until then.
const IDLE_CHECK: Duration = Duration::from_millis(20);

pub struct Poller {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Poller {
    /// Watch `requests` (incremented once per request served) and switch
    /// the device behind `dev` between spinning and sleeping.
    pub fn start(dev: impl AsFd, requests: Arc<Counter>) -> std::io::Result<Poller> {
        let fd: OwnedFd = dev.as_fd().try_clone_to_owned()?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("inkfs-poll".into())
                .spawn(move || control(&fd, &requests, &stop))?
        };
        Ok(Poller {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn control(fd: &OwnedFd, requests: &Counter, stop: &AtomicBool) {
    let mut last = requests.sum();
    let mut spinning = false;
    let mut quiet_checks = 0u32;
    while !stop.load(Relaxed) {
        let idle = quiet_checks as u128 * QUIET.as_millis() > 1000;
        std::thread::sleep(if idle { IDLE_CHECK } else { QUIET });
        let now = requests.sum();
        let busy = now != last;
        last = now;
        quiet_checks = if busy {
            0
        } else {
            quiet_checks.saturating_add(1)
        };
        if busy != spinning && set_nonblocking(fd, busy).is_ok() {
            spinning = busy;
        }
    }
    let _ = set_nonblocking(fd, false);
}

fn set_nonblocking(fd: &OwnedFd, on: bool) -> std::io::Result<()> {
    let raw = fd.as_raw_fd();
    // SAFETY: fcntl on a descriptor this module owns; no memory involved.
    let flags = unsafe { libc::fcntl(raw, libc::F_GETFL) };
    if flags < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let want = if on {
        flags | libc::O_NONBLOCK
    } else {
        flags & !libc::O_NONBLOCK
    };
    // SAFETY: as above.
    if want != flags && unsafe { libc::fcntl(raw, libc::F_SETFL, want) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
