//! include/inkfs.h is generated from the crate's source by cbindgen (the
//! version pinned in Cargo.toml, with cbindgen.toml): this test
//! regenerates it and fails if the checked-in header differs, so a stale
//! header cannot pass CI. `INKFS_BLESS_HEADER=1` writes the new header.

use std::path::Path;

#[test]
fn header_is_current() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config =
        cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml parses");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut generated);
    let generated = String::from_utf8(generated).expect("the header is UTF-8");
    let path = crate_dir.join("include/inkfs.h");
    if std::env::var_os("INKFS_BLESS_HEADER").is_some() {
        std::fs::write(&path, &generated).expect("write include/inkfs.h");
        return;
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    if checked_in != generated {
        let line = checked_in
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| checked_in.lines().count().min(generated.lines().count()));
        panic!(
            "include/inkfs.h is stale (first difference at line {}): regenerate it with\n  \
             INKFS_BLESS_HEADER=1 cargo test -p inkfs-capi --test header\n\
             checked in: {:?}\ngenerated:  {:?}",
            line + 1,
            checked_in.lines().nth(line),
            generated.lines().nth(line),
        );
    }
}
