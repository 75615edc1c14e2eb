//! The FFI boundary's plumbing: errno, panics, and turning the caller's
//! pointers into Rust values. Every `extern "C"` function runs its body
//! through [`ffi`], so a panic becomes EIO instead of unwinding into C, and
//! every pointer the caller passes is checked here before it is used.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// A failed call: the errno the caller sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Errno(pub i32);

pub(crate) type CResult<T> = Result<T, Errno>;

impl From<inkfs::Error> for Errno {
    fn from(e: inkfs::Error) -> Errno {
        Errno(e.errno())
    }
}

pub(crate) fn fail<T>(e: i32) -> CResult<T> {
    Err(Errno(e))
}

/// Longest read or write one call makes, as Linux's MAX_RW_COUNT (a page
/// short of 2 GiB): a longer request is served short, as the kernel does.
pub(crate) const RW_MAX: usize = 0x7fff_f000;

/// Most iovecs one readv/writev takes (IOV_MAX).
pub(crate) const IOV_MAX: c_int = 1024;

pub(crate) fn set_errno(e: i32) {
    // SAFETY: __errno_location returns this thread's errno slot, valid
    // for the thread's lifetime; storing an int there is what libc does.
    unsafe { *libc::__errno_location() = e }
}

/// Run an entry point's body: its value, or `fail` with errno set to the
/// body's error, or to EIO if the body panicked (the panic is caught here
/// and never crosses into C).
pub(crate) fn ffi<T>(fail: T, body: impl FnOnce() -> CResult<T>) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(v)) => v,
        Ok(Err(Errno(e))) => {
            set_errno(e);
            fail
        }
        Err(_) => {
            set_errno(libc::EIO);
            fail
        }
    }
}

thread_local! {
    /// The message of this thread's last failed mount, mkfs or unmount.
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Remember why a mount, mkfs or unmount failed, for `inkfs_last_error`
/// (the errno alone cannot say "pool in use by pid 4242 (...)").
pub(crate) fn record_error(message: &str) {
    let text = CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = text);
}

pub(crate) fn last_error() -> *const c_char {
    // The pointer stays valid until this thread records another message
    // (documented in the header): the thread-local outlives the borrow.
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// A NUL-terminated string argument, without its NUL; NULL is EFAULT.
pub(crate) fn cstr<'a>(p: *const c_char) -> CResult<&'a [u8]> {
    if p.is_null() {
        return fail(libc::EFAULT);
    }
    // SAFETY: the caller passes a NUL-terminated string that stays valid
    // and unchanged for the call (the header's contract for every `const
    // char *`); it is not NULL (checked above).
    Ok(unsafe { CStr::from_ptr(p) }.to_bytes())
}

/// A NUL-terminated string argument that may be NULL.
pub(crate) fn cstr_opt<'a>(p: *const c_char) -> CResult<Option<&'a [u8]>> {
    if p.is_null() {
        Ok(None)
    } else {
        cstr(p).map(Some)
    }
}

/// The caller's buffer of `len` bytes to read from. NULL is EFAULT unless
/// `len` is 0.
pub(crate) fn bytes<'a>(p: *const std::ffi::c_void, len: usize) -> CResult<&'a [u8]> {
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return fail(libc::EFAULT);
    }
    if len > isize::MAX as usize {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller passes `len` readable bytes at `p` that nothing
    // writes during the call (the header's contract for every buffer);
    // `p` is not NULL and `len` fits an isize (checked above).
    Ok(unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) })
}

/// The caller's buffer of `len` bytes to write into. NULL is EFAULT
/// unless `len` is 0.
pub(crate) fn bytes_mut<'a>(p: *mut std::ffi::c_void, len: usize) -> CResult<&'a mut [u8]> {
    if len == 0 {
        return Ok(&mut []);
    }
    if p.is_null() {
        return fail(libc::EFAULT);
    }
    if len > isize::MAX as usize {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller passes `len` writable bytes at `p` that nothing
    // else reads or writes during the call; `p` is not NULL and `len` fits
    // an isize (checked above).
    Ok(unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), len) })
}

/// The caller's array of `count` iovecs.
pub(crate) fn iovecs<'a>(p: *const libc::iovec, count: c_int) -> CResult<&'a [libc::iovec]> {
    if !(0..=IOV_MAX).contains(&count) {
        return fail(libc::EINVAL);
    }
    if count == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return fail(libc::EFAULT);
    }
    // SAFETY: the caller passes `count` iovecs at `p` (not NULL, checked),
    // valid for the call; `count` is at most IOV_MAX.
    Ok(unsafe { std::slice::from_raw_parts(p, count as usize) })
}

/// Store `value` through the caller's out-pointer (EFAULT if NULL).
pub(crate) fn store<T>(p: *mut T, value: T) -> CResult<()> {
    if p.is_null() {
        return fail(libc::EFAULT);
    }
    // SAFETY: the caller passes a pointer to writable storage for one T
    // (the header's contract for every out-parameter); not NULL (checked).
    unsafe { p.write(value) };
    Ok(())
}

/// Read the caller's in-pointer; None if NULL.
pub(crate) fn load<T: Copy>(p: *const T) -> Option<T> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller passes a pointer to one readable T, or NULL
    // (handled above).
    Some(unsafe { p.read() })
}

/// A value of a C struct with every field zero (libc's structs with
/// private padding fields cannot be built field by field).
pub(crate) fn zeroed<T: Zeroable>() -> T {
    // SAFETY: `Zeroable` is implemented only for plain C structs of
    // integers and arrays of integers, for which all-zero bytes are a
    // valid value.
    unsafe { std::mem::zeroed() }
}

/// C structs for which all-zero bytes are a valid value.
pub(crate) trait Zeroable {}
impl Zeroable for libc::stat {}
impl Zeroable for libc::statfs {}

/// Convert a count of bytes done to the C return type (at most RW_MAX, so
/// it fits).
pub(crate) fn ssize(n: usize) -> isize {
    debug_assert!(n <= RW_MAX);
    n as isize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errno() -> i32 {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    }

    #[test]
    fn a_panic_becomes_eio_and_never_unwinds() {
        let r: c_int = ffi(-1, || panic!("an engine bug"));
        assert_eq!((r, errno()), (-1, libc::EIO));
    }

    #[test]
    fn an_error_sets_errno_and_a_value_passes_through() {
        assert_eq!(ffi(-1, || fail::<c_int>(libc::ENOENT)), -1);
        assert_eq!(errno(), libc::ENOENT);
        assert_eq!(ffi(-1, || Ok(7)), 7);
    }

    #[test]
    fn null_arguments_are_efault() {
        assert_eq!(cstr(std::ptr::null()), Err(Errno(libc::EFAULT)));
        assert_eq!(bytes(std::ptr::null(), 1), Err(Errno(libc::EFAULT)));
        assert_eq!(bytes(std::ptr::null(), 0), Ok(&[][..]));
        assert_eq!(iovecs(std::ptr::null(), 1).err(), Some(Errno(libc::EFAULT)));
        assert_eq!(
            iovecs(std::ptr::null(), -1).err(),
            Some(Errno(libc::EINVAL))
        );
        assert_eq!(
            store::<u8>(std::ptr::null_mut(), 0),
            Err(Errno(libc::EFAULT))
        );
    }
}
