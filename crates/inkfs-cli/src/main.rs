//! `inkfs`: the command-line tool. Every error is one line on stderr and a
//! non-zero exit code; nothing here panics on user input.
//!
//! The arguments are parsed by clap (derive): each command's arguments are
//! a struct next to the code that runs it (`pool::MkfsArgs`, ...; the FUSE
//! commands' in inkfs-fuse), so `--help` is generated from what is parsed.

mod crashtest;
mod fsck;
mod pool;
mod run;
mod scrub;
mod selftest;
mod state;
mod usage;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

/// inkfs: a crash-consistent, log-structured file system for persistent
/// memory, in user space
#[derive(Parser)]
#[command(
    name = "inkfs",
    version = usage::version(),
    arg_required_else_help = true,
    after_help = usage::EXIT_STATUS_HELP
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    Mkfs(pool::MkfsArgs),
    Stat(pool::StatArgs),
    Mount(inkfs_fuse::MountArgs),
    Fsck(fsck::FsckArgs),
    Scrub(scrub::ScrubArgs),
    Selftest(selftest::SelftestArgs),
    NullFs(inkfs_fuse::NullArgs),
    InstallHelper(inkfs_fuse::InstallHelperArgs),
    Crashtest(crashtest::CrashtestArgs),
    Run(run::RunArgs),
}

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let cli = match Cli::try_parse_from(&args) {
        Ok(c) => c,
        Err(e) => return usage::refuse(&e, &args, &Cli::command()),
    };
    let (name, result) = match cli.cmd {
        Cmd::Mkfs(a) => ("mkfs", pool::mkfs(&a)),
        Cmd::Stat(a) => ("stat", pool::stat(&a)),
        Cmd::Mount(a) => return exit_code(inkfs_fuse::mount_main(&a)),
        Cmd::Fsck(a) => return exit_code(fsck::fsck_main(&a)),
        Cmd::Scrub(a) => return exit_code(scrub::scrub_main(&a)),
        Cmd::Selftest(a) => ("selftest", selftest::selftest(&a)),
        Cmd::NullFs(a) => return exit_code(inkfs_fuse::null_main(&a)),
        Cmd::InstallHelper(a) => return exit_code(inkfs_fuse::install_helper_main(&a)),
        Cmd::Crashtest(a) => ("crashtest", crashtest::main(&a)),
        Cmd::Run(a) => ("run", run::run(&a)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("inkfs {name}: {msg}");
            ExitCode::FAILURE
        }
    }
}

fn exit_code(code: i32) -> ExitCode {
    ExitCode::from(code.clamp(0, 255) as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// clap's own consistency checks of the definitions (ids, overrides,
    /// short flags used twice, ...), which it otherwise runs only on use.
    #[test]
    fn argument_definitions_are_consistent() {
        Cli::command().debug_assert();
    }
}
