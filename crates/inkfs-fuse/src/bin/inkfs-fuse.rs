//! The FUSE commands of `inkfs` on their own (the same dispatch as the
//! `inkfs` CLI): lets this crate's tests run the real daemon path without
//! depending on another crate's binary.

use std::path::Path;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (cmd, rest) = match args.split_first() {
        Some((c, r)) => (c.as_str(), r),
        None => ("", &[][..]),
    };
    let code = match cmd {
        "mount" => inkfs_fuse::mount_main(rest),
        "null-fs" => inkfs_fuse::null_main(rest),
        "install-helper" => inkfs_fuse::install_helper_main(rest),
        "stat" => {
            let json = rest.iter().any(|a| a == "--json");
            match rest.iter().find(|a| !a.starts_with('-')) {
                Some(p) => match inkfs_fuse::stat_mountpoint(Path::new(p), json) {
                    Some(Ok(s)) => {
                        print!("{s}");
                        0
                    }
                    Some(Err(e)) => {
                        eprintln!("inkfs stat: {e}");
                        1
                    }
                    None => {
                        eprintln!("inkfs stat: {p}: not an inkfs mount point");
                        1
                    }
                },
                None => {
                    eprintln!("usage: inkfs-fuse stat MOUNTPOINT [--json]");
                    2
                }
            }
        }
        _ => {
            eprintln!("usage: inkfs-fuse mount|null-fs|stat|install-helper ...");
            2
        }
    };
    std::process::exit(code)
}
