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

thread_local! {
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread is already inside the library (or in no state to
/// run it): the caller must call the real function.
pub fn inside() -> bool {
    INSIDE.with(|c| c.get())
}

/// Run `f` marked as inside the library, panics caught: `None` if `f`
/// panicked or the thread was already inside (the caller then does the
/// real call).
pub fn run<R>(f: impl FnOnce() -> R) -> Option<R> {
    if inside() {
        return None;
    }
    INSIDE.with(|c| c.set(true));
    let r = catch_unwind(AssertUnwindSafe(f));
    INSIDE.with(|c| c.set(false));
    r.ok()
}
