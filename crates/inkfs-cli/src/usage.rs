//! What the argument parser's refusals look like: one line on stderr,
//! naming the command, and the exit status of a usage error (2, or 16 for
//! fsck and scrub, whose codes are e2fsck's).

use std::ffi::OsString;
use std::process::ExitCode;

use clap::error::ErrorKind;

/// Exit status of a usage error (an unknown flag, a missing or extra
/// argument, a value the parser refuses), as clap and most tools give it.
pub const EXIT_USAGE: u8 = 2;

/// The commands whose exit codes are e2fsck's, where a usage error is 16
/// (e2fsck's FSCK_USAGE): 2 means something else there (e2fsck's
/// "reboot required").
const E2FSCK_CODES: [&str; 2] = ["fsck", "scrub"];
pub const EXIT_USAGE_E2FSCK: u8 = 16;

pub const EXIT_STATUS_HELP: &str = "\
Exit status: 0 success, 1 failure (one line on stderr says why), 2 usage
error. fsck and scrub exit as e2fsck does (0 clean, 1 errors fixed, 4 errors
left, 8 operational error, 16 usage error): see their --help.";

/// `inkfs --version`: the tool's version and the pool format it writes.
pub fn version() -> String {
    format!(
        "{} (pool format version {})",
        env!("CARGO_PKG_VERSION"),
        inkfs::api::pool::FORMAT_VERSION
    )
}

/// Answer a parse that did not yield a command: help and version on
/// stdout (exit 0), a bare `inkfs` with the help on stderr (exit 2), and
/// any other refusal as one line (exit 2, or 16 for fsck and scrub).
pub fn refuse(e: &clap::Error, args: &[OsString], cli: &clap::Command) -> ExitCode {
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            return ExitCode::from(EXIT_USAGE);
        }
        _ => {}
    }
    // No option comes before the command (the top level has only --help
    // and --version), so the first argument names the command refused.
    let command = args
        .get(1)
        .and_then(|a| a.to_str())
        .and_then(|a| cli.find_subcommand(a))
        .map(|c| c.get_name().to_string());
    let (prefix, help) = match &command {
        Some(c) => (format!("inkfs {c}"), format!("inkfs {c} --help")),
        None => ("inkfs".to_string(), "inkfs --help".to_string()),
    };
    eprintln!("{prefix}: {} (try '{help}')", one_line(e));
    match command {
        Some(c) if E2FSCK_CODES.contains(&c.as_str()) => ExitCode::from(EXIT_USAGE_E2FSCK),
        _ => ExitCode::from(EXIT_USAGE),
    }
}

/// clap's message without its usage block and "For more information"
/// trailer, on one line: the error, any indented continuation (the
/// missing arguments) and its tips ("a similar argument exists: ..."),
/// but for the generic "to pass '--x' as a value, use '-- --x'".
fn one_line(e: &clap::Error) -> String {
    let rendered = e.render().to_string();
    let mut msg = String::new();
    for line in rendered.lines().map(str::trim) {
        if line.starts_with("Usage:") || line.starts_with("For more information") {
            break;
        }
        if line.is_empty() || line.starts_with("tip: to pass") {
            continue;
        }
        let line = line.strip_prefix("error: ").unwrap_or(line);
        if !msg.is_empty() {
            msg.push_str(if line.starts_with("tip:") { "; " } else { " " });
        }
        msg.push_str(line);
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, Command};

    fn refused(args: &[&str]) -> String {
        let cmd = Command::new("t")
            .arg(Arg::new("pool").required(true))
            .arg(Arg::new("size").long("size"));
        one_line(&cmd.try_get_matches_from(args).unwrap_err())
    }

    #[test]
    fn refusals_are_one_line_naming_what_is_wrong() {
        let m = refused(&["t", "p", "--sise", "4"]);
        assert_eq!(
            m,
            "unexpected argument '--sise' found; tip: a similar argument exists: '--size'"
        );
        let m = refused(&["t", "p", "--bogus"]);
        assert_eq!(m, "unexpected argument '--bogus' found");
        let m = refused(&["t"]);
        assert_eq!(
            m,
            "the following required arguments were not provided: <pool>"
        );
        assert!(!refused(&["t", "a", "b"]).contains('\n'));
    }
}
