//! The FUSE commands of `inkfs` on their own (the same arguments as the
//! `inkfs` CLI's): lets this crate's tests run the real daemon path without
//! depending on another crate's binary.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use inkfs_fuse::{InstallHelperArgs, MountArgs, NullArgs};

/// The FUSE commands of inkfs (the `inkfs` binary has them all)
#[derive(Parser)]
#[command(name = "inkfs-fuse", version)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    Mount(MountArgs),
    NullFs(NullArgs),
    InstallHelper(InstallHelperArgs),
    /// Live statistics of a running inkfs server
    Stat {
        /// The mount point of a running inkfs server
        mountpoint: PathBuf,
        /// One JSON object on stdout
        #[arg(long)]
        json: bool,
    },
}

fn main() {
    let code = match Cli::parse().cmd {
        Cmd::Mount(a) => inkfs_fuse::mount_main(&a),
        Cmd::NullFs(a) => inkfs_fuse::null_main(&a),
        Cmd::InstallHelper(a) => inkfs_fuse::install_helper_main(&a),
        Cmd::Stat { mountpoint, json } => match inkfs_fuse::stat_mountpoint(&mountpoint, json) {
            Some(Ok(s)) => {
                print!("{s}");
                0
            }
            Some(Err(e)) => {
                eprintln!("inkfs stat: {e}");
                1
            }
            None => {
                eprintln!(
                    "inkfs stat: {}: not an inkfs mount point",
                    mountpoint.display()
                );
                1
            }
        },
    };
    std::process::exit(code)
}
