//! Reentrancy and panics.
//!
//! The library's own code calls libc (Rust's std opens and reads files with
//! libc's open and read, the engine's attach reads /proc): those calls
//! reach this library's interposers again. A thread-local flag marks "in
//! the library"; an interposer that finds it set goes straight to the real
//! function. And no panic may cross the C boundary: each interposer's work
//! runs under `catch_unwind`, and a panic means "let the kernel do it".

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};

/// Set when the library's constructor has run. Before that every call goes
/// to libc: another library's constructor may run first and allocate, and
/// an allocator that initializes lazily (jemalloc, in redis-server) calls
/// readlink and open under its own lock while it does; served, those would
/// read the mount table, which allocates: a deadlock. The constructor
/// allocates itself (inside the library), so a lazy allocator is ready
/// once this is set.
static LOADED: AtomicBool = AtomicBool::new(false);

/// The constructor is done: calls may be served from now on.
pub fn set_loaded() {
    LOADED.store(true, Ordering::Release);
}

thread_local! {
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread is already inside the library (or in no state to
/// run it): the caller must call the real function.
pub fn inside() -> bool {
    INSIDE.with(|c| c.get())
}

/// Run `f` marked as inside the library, panics caught: `None` if `f`
/// panicked, the thread was already inside, or the library is not loaded
/// yet (the caller then does the real call).
pub fn run<R>(f: impl FnOnce() -> R) -> Option<R> {
    serve_with(|pool| pool.then(f))?
}

/// Serve a call: `f(true)` under [`run`] (the pool may be used), or
/// `f(false)` at once on a thread already inside the library (a signal
/// handler that interrupted it: no client, nothing that locks or
/// allocates). `None` when [`run`] gives none: the caller does the real
/// call.
#[inline]
pub fn serve<R>(f: impl FnOnce(bool) -> R) -> Option<R> {
    serve_with(f)
}

/// [`serve`] and [`run`] in one look at the thread's flag: in a preloaded
/// library each thread-local access is a call of `__tls_get_addr`, and
/// the flag's three (the check, the set and the clear) and [`inside`]'s
/// own were four of them at every served write and fdatasync. `f(false)`
/// on a thread already inside; `None` before the constructor is done.
#[inline]
fn serve_with<R>(f: impl FnOnce(bool) -> R) -> Option<R> {
    INSIDE.with(|inside| {
        if inside.get() {
            return Some(f(false));
        }
        if !LOADED.load(Ordering::Acquire) {
            return None;
        }
        enter(inside, || f(true))
    })
}

/// `f` with `inside` (this thread's flag, clear) set, panics caught.
#[inline]
fn enter<R>(inside: &Cell<bool>, f: impl FnOnce() -> R) -> Option<R> {
    debug_assert!(!inside.get(), "served calls do not nest");
    inside.set(true);
    let r = catch_unwind(AssertUnwindSafe(f));
    inside.set(false);
    r.ok()
}

/// [`run`], also before the constructor is done (the constructor's own
/// work).
pub fn run_always<R>(f: impl FnOnce() -> R) -> Option<R> {
    INSIDE.with(|inside| if inside.get() { None } else { enter(inside, f) })
}
