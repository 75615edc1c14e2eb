//! `inkfs`: the command-line tool. Every error is one line on stderr and a
//! non-zero exit code; nothing here panics on user input.

mod crashtest;
mod fsck;
mod pool;
mod scrub;
mod selftest;
mod state;

use std::process::ExitCode;

const USAGE: &str = "\
usage: inkfs <command> [args]

commands:
  mkfs POOL [--size SIZE] [--lanes N] [--force]
                      create an empty file system (SIZE like 4G, 512M; a DAX
                      device is used whole)
  stat POOL|MOUNTPOINT [--json]
                      describe a pool (format, backend, space, state) or a
                      running mount (live per-operation statistics)
  mount POOL MOUNTPOINT [-f] [-o mode=strict|sync|posix,ro,threads=N,...]
                      mount with FUSE; returns once the mount is live
                      (errors=remount-ro|continue: on corruption met while
                      mounted, turn read-only, the default, or keep serving)
  fsck POOL [-y|--repair] [--json] [-q] [--progress]
                      check a pool (read-only unless -y, which repairs what
                      is safely repairable); exit 0 clean, 1 errors fixed,
                      4 errors left, 8 operational error
  scrub MOUNTPOINT [--json] [-q]
                      check every checksum of a mounted pool while it keeps
                      serving; exit 0 clean, 4 damage found, 8 operational
                      error
  selftest POOL       write a tree through the library, unmount, remount,
                      verify every byte, fsck, clean up (for new hardware)
  null-fs MOUNTPOINT  a do-nothing FUSE file system (benchmark floor)
  install-helper [DIR]
                      install mount.fuse.inkfs (default /sbin) for
                      `mount -t fuse.inkfs` and /etc/fstab
  crashtest [--states N] [--seed S] [--mode M] [--workload W] [--images K]
                      crash exploration on the simulator: every one- and
                      two-operation workload, every fence, each mode
  help                this text
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = args.first() else {
        eprint!("{USAGE}");
        return ExitCode::from(2);
    };
    let rest = &args[1..];
    const COMMANDS: [&str; 9] = [
        "mkfs",
        "stat",
        "mount",
        "fsck",
        "scrub",
        "selftest",
        "null-fs",
        "install-helper",
        "help",
    ];
    if COMMANDS.contains(&cmd.as_str()) && rest.iter().any(|a| a == "--help" || a == "-h") {
        print!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let result = match cmd.as_str() {
        "selftest" => selftest::selftest(rest),
        "mkfs" => pool::mkfs(rest),
        "mount" => return exit_code(inkfs_fuse::mount_main(rest)),
        "null-fs" => return exit_code(inkfs_fuse::null_main(rest)),
        "install-helper" => return exit_code(inkfs_fuse::install_helper_main(rest)),
        "stat" => pool::stat(rest),
        "crashtest" => crashtest::main(rest),
        "fsck" => return exit_code(fsck::fsck_main(rest)),
        "scrub" => return exit_code(scrub::scrub_main(rest)),
        "help" | "--help" | "-h" => {
            print!("{USAGE}");
            Ok(())
        }
        other => Err(format!("unknown command '{other}' (try 'inkfs help')")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("inkfs {cmd}: {msg}");
            ExitCode::FAILURE
        }
    }
}

fn exit_code(code: i32) -> ExitCode {
    ExitCode::from(code.clamp(0, 255) as u8)
}
