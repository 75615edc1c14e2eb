//! The shared library's soname: programs linked with -linkfs record
//! libinkfs.so.0 (install.sh installs libinkfs.so.0.1.0 under that name
//! and libinkfs.so for the linker), so an incompatible libinkfs.so.1
//! can sit beside it later.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libinkfs.so.0");
}
