//! `libinkfs_preload.so`: run a program with
//! `LD_PRELOAD=libinkfs_preload.so` (or `inkfs run -- CMD`) and its reads,
//! writes, fsyncs, stats, directory listings, opens, creates and closes of
//! files under an inkfs mount are served from the pool mapped in the
//! process (writes under the inode's write lease), with no kernel
//! crossing, and its namespace calls are made by the server through the
//! client's request ring (docs/KERNEL-FREE.md, "Built: the preload
//! library", "Built: namespace calls").
//!
//! A regular file the program opens on the mount gets a placeholder
//! descriptor ([`lazy`]) the library materializes (opens in the kernel)
//! when a call needs the kernel's file; other files and directories are
//! opened on the mount first and registered. The library keeps its own
//! state beside each descriptor ([`table`]) and serves the calls it knows
//! through an attached [`inkfs::api::client::Client`] ([`mounts`]).
//! [`io::route`] is the one place that decides which way a data call
//! goes; [`names`] and [`attrs`] send namespace and attribute changes to
//! the server (or make them under the lease); [`kfd`] materializes for the
//! calls that need the kernel's file.
//!
//! Not on an inkfs mount, attach refused (trust rule, posix mode, server
//! gone), a call the library does not know, a panic in the
//! library, a reentrant call: libc does it, as without the library.

// Each exported function is the libc function of the same name, with its
// contract (the caller's pointers valid as libc's manual says).
#![allow(clippy::missing_safety_doc)]

pub mod attr;
pub mod attrs;
pub mod creds;
pub mod cwd;
pub mod dir;
pub mod fds;
pub mod guard;
pub mod io;
pub mod kfd;
pub mod lazy;
pub mod map;
pub mod meta;
pub mod mounts;
pub mod names;
pub mod path;
pub mod process;
pub mod real;
pub mod stats;
pub mod stdio;
pub mod sync;
pub mod table;

#[cfg(not(all(target_os = "linux", target_env = "gnu", target_arch = "x86_64")))]
compile_error!(
    "libinkfs_preload defines variadic libc functions (open, fcntl, execl) with \
     fixed arguments, which the x86-64 System V ABI allows; it interposes glibc"
);

/// At load: read the environment and the mount table; silence panics (a
/// panic in the library is caught and the call goes to the kernel: no
/// message in the program's output).
extern "C" fn on_load() {
    let _ = guard::run_always(|| {
        if std::env::var_os("INKFS_PRELOAD_DEBUG").is_none() {
            std::panic::set_hook(Box::new(|_| {}));
        }
        stats::init();
        creds::init();
        lazy::init();
        names::init();
        // The mount table now, not at the first call that needs it: that
        // call may come from inside the program's allocator (jemalloc, in
        // redis-server, calls readlink and open while it initializes
        // under its own lock), and reading the table allocates: a
        // deadlock. Here, inside the library, this allocation initializes
        // a lazy allocator, and whatever it calls meanwhile goes straight
        // to libc (guard.rs).
        let _ = mounts::all();
    });
    guard::set_loaded();
}

/// At exit: directory leases given back, the statistics line if asked
/// for.
extern "C" fn on_exit() {
    let _ = guard::run(mounts::at_exit);
    let _ = guard::run(stats::report);
}

#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;

#[used]
#[link_section = ".fini_array"]
static ON_EXIT: extern "C" fn() = on_exit;
