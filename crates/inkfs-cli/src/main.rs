//! `inkfs`: the command-line tool. Every error is one line on stderr and a
//! non-zero exit code; nothing here panics on user input.

mod pool;

use std::process::ExitCode;

const USAGE: &str = "\
usage: inkfs <command> [args]

commands:
  mkfs POOL [--size SIZE] [--lanes N] [--force]
                      create an empty file system (SIZE like 4G, 512M; a DAX
                      device is used whole)
  stat POOL [--json]  describe a pool: format, backend, space, state
  help                this text
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = args.first() else {
        eprint!("{USAGE}");
        return ExitCode::from(2);
    };
    let rest = &args[1..];
    let result = match cmd.as_str() {
        "mkfs" => pool::mkfs(rest),
        "stat" => pool::stat(rest),
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
