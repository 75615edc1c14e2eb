//! The argument parser of the real binary: every command refuses what it
//! does not know (an unknown flag, a missing or a surplus argument) with
//! one line naming it and the usage exit status (2; 16 for fsck and scrub,
//! as e2fsck), before doing anything; answers --help; and the version.

use std::process::{Command, Output};

fn inkfs(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_inkfs"))
        .args(args)
        .output()
        .expect("run inkfs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A pool and a directory that do not exist: a command that wrongly took
/// its arguments fails on them, and creates nothing.
const POOL: &str = "/dev/shm/inkfs-argv-test-no-such.pool";
const DIR: &str = "/dev/shm/inkfs-argv-test-no-such-dir";

struct Cmd {
    name: &'static str,
    /// Every positional argument, filled.
    positional: &'static [&'static str],
    /// Words its --help must show: its arguments and flags.
    help: &'static [&'static str],
    /// Exit status of a usage error.
    usage_code: i32,
}

const COMMANDS: &[Cmd] = &[
    Cmd {
        name: "mkfs",
        positional: &[POOL],
        help: &["<POOL>", "--size <SIZE>", "4G", "--lanes <N>", "--force"],
        usage_code: 2,
    },
    Cmd {
        name: "stat",
        positional: &[POOL],
        help: &["<POOL|MOUNTPOINT>", "--json"],
        usage_code: 2,
    },
    Cmd {
        name: "mount",
        positional: &[POOL, DIR],
        help: &[
            "<POOL>",
            "<MOUNTPOINT>",
            "--foreground",
            "-o <OPTIONS>",
            "mode=strict|sync|posix",
            "errors=remount-ro|continue",
            "threads=N",
        ],
        usage_code: 2,
    },
    Cmd {
        name: "fsck",
        positional: &[POOL],
        help: &[
            "<POOL>",
            "--repair",
            "--no",
            "--json",
            "--quiet",
            "--progress",
            "8   operational error",
            "16  usage error",
        ],
        usage_code: 16,
    },
    Cmd {
        name: "scrub",
        positional: &[DIR],
        help: &[
            "<MOUNTPOINT>",
            "--json",
            "--quiet",
            "4   damage found",
            "16  usage error",
        ],
        usage_code: 16,
    },
    Cmd {
        name: "selftest",
        positional: &[POOL],
        help: &["<POOL>"],
        usage_code: 2,
    },
    Cmd {
        name: "null-fs",
        positional: &[DIR],
        help: &["<MOUNTPOINT>", "--foreground", "-o <OPTIONS>", "threads=N"],
        usage_code: 2,
    },
    Cmd {
        name: "install-helper",
        positional: &[DIR],
        help: &["[DIR]", "/sbin"],
        usage_code: 2,
    },
    Cmd {
        name: "crashtest",
        positional: &[],
        help: &[
            "--states <N>",
            "--seed <S>",
            "--mode <M>",
            "strict, sync, posix",
            "--workload <W>",
            "--images <K>",
            "--max-images <K>",
            "--quick",
            "--torn",
            "--list",
        ],
        usage_code: 2,
    },
];

/// `args` is refused as a usage error of `c`: its exit status, one line on
/// stderr that names the command and `naming`, nothing on stdout, and
/// nothing created.
fn refused(c: &Cmd, args: &[&str], naming: &str) {
    let o = inkfs(args);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(c.usage_code), "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "{args:?}: not one line: {err}");
    assert!(
        err.starts_with(&format!("inkfs {}: ", c.name)),
        "{args:?}: {err}"
    );
    assert!(
        err.contains(naming),
        "{args:?} does not name {naming}: {err}"
    );
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    assert_eq!(stdout(&o), "", "{args:?}");
    for p in [POOL, DIR] {
        assert!(!std::path::Path::new(p).exists(), "{args:?} created {p}");
    }
}

#[test]
fn unknown_flags_are_usage_errors_naming_the_flag() {
    for c in COMMANDS {
        for flag in ["--no-such-flag", "-Z"] {
            let mut args = vec![c.name];
            args.extend(c.positional);
            args.push(flag);
            refused(c, &args, &format!("'{flag}'"));
            // Before the arguments too.
            let mut args = vec![c.name, flag];
            args.extend(c.positional);
            refused(c, &args, &format!("'{flag}'"));
        }
    }
}

#[test]
fn missing_and_surplus_arguments_are_usage_errors() {
    for c in COMMANDS {
        let mut args = vec![c.name];
        args.extend(c.positional);
        args.push("surplus-argument");
        refused(c, &args, "'surplus-argument'");
        if let Some(last) = c.positional.len().checked_sub(1) {
            if c.name != "install-helper" {
                let mut args = vec![c.name];
                args.extend(&c.positional[..last]);
                refused(c, &args, "required arguments were not provided");
            }
        }
    }
}

#[test]
fn refused_values_are_usage_errors() {
    let mkfs = &COMMANDS[0];
    refused(mkfs, &["mkfs", POOL, "--size", "12X"], "bad size '12X'");
    refused(mkfs, &["mkfs", POOL, "--size"], "--size");
    refused(
        mkfs,
        &["mkfs", POOL, "--lanes", "257"],
        "--lanes takes 1 to 256",
    );
    let mount = &COMMANDS[2];
    refused(mount, &["mount", POOL, DIR, "-o", "mode=fast"], "mode=fast");
    refused(mount, &["mount", POOL, DIR, "-o", "bogus"], "bogus");
    let null = &COMMANDS[6];
    refused(null, &["null-fs", DIR, "-o", "threads=0"], "threads=0");
    let crashtest = &COMMANDS[8];
    for (flag, value) in [
        ("--mode", "fast"),
        ("--seed", "0xg"),
        ("--states", "-1"),
        ("--images", "0"),
    ] {
        refused(
            crashtest,
            &["crashtest", flag, value],
            &format!("'{value}'"),
        );
    }
}

#[test]
fn every_command_has_help_naming_its_arguments() {
    for c in COMMANDS {
        for args in [vec![c.name, "--help"], vec!["help", c.name]] {
            let o = inkfs(&args);
            let out = stdout(&o);
            assert!(o.status.success(), "{args:?}: {}", stderr(&o));
            assert!(
                out.contains(&format!("Usage: inkfs {}", c.name)),
                "{args:?}: {out}"
            );
            for word in c.help {
                assert!(out.contains(word), "{args:?} lacks {word}: {out}");
            }
        }
        // -h: the short form, also exit 0.
        assert!(inkfs(&[c.name, "-h"]).status.success(), "{} -h", c.name);
    }
}

#[test]
fn top_level_help_lists_every_command_and_version_works() {
    for args in [&["--help"][..], &["-h"], &["help"]] {
        let o = inkfs(args);
        assert!(o.status.success(), "{args:?}");
        let out = stdout(&o);
        for c in COMMANDS {
            assert!(
                out.lines().any(|l| l.trim_start().starts_with(c.name)),
                "{args:?} does not list {}: {out}",
                c.name
            );
        }
    }
    let want = format!(
        "inkfs {} (pool format version {})\n",
        env!("CARGO_PKG_VERSION"),
        inkfs::format::FORMAT_VERSION
    );
    for flag in ["--version", "-V"] {
        let o = inkfs(&[flag]);
        assert!(o.status.success(), "{flag}");
        assert_eq!(stdout(&o), want, "{flag}");
    }
    // No command: the help, on stderr, as a usage error.
    let o = inkfs(&[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("Usage: inkfs <COMMAND>"),
        "{}",
        stderr(&o)
    );
    let o = inkfs(&["frobnicate"]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
    assert!(stderr(&o).contains("'frobnicate'"), "{}", stderr(&o));
}

/// What mount(8) gives its helper (`mount.fuse.inkfs POOL DIR [-s] [-f]
/// [-n] [-v] [-o OPTIONS]`, with options such as rw, nofail, _netdev) is
/// taken: the mount gets past the parser and fails on the missing pool
/// (exit 1), not as a usage error.
#[test]
fn mount_takes_what_mount8_passes_a_helper() {
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().to_str().unwrap();
    let o = inkfs(&[
        "mount",
        POOL,
        mnt,
        "-s",
        "-n",
        "-v",
        "-o",
        "rw,nofail,_netdev,noatime,dev,suid,x-systemd.automount",
        "-oro",
    ]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains(POOL), "{err}");
    assert!(
        !err.contains("unexpected") && !err.contains("--help"),
        "{err}"
    );
}

/// fsck's -y and -n: the last one given wins; e2fsck's -f is taken, and
/// short flags combine as e2fsck's do (`-fy`).
#[test]
fn fsck_repair_flags() {
    /// Removed however the test ends.
    struct Pool(String);
    impl Drop for Pool {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let pool = Pool(format!(
        "/dev/shm/inkfs-argv-test-{}.pool",
        std::process::id()
    ));
    let pool = &pool.0;
    let _ = std::fs::remove_file(pool);
    let o = inkfs(&["mkfs", pool, "--size", "16M"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let repair = |flags: &[&str]| {
        let mut args = vec!["fsck", pool.as_str(), "--json"];
        args.extend(flags);
        let o = inkfs(&args);
        assert_eq!(o.status.code(), Some(0), "{flags:?}: {}", stderr(&o));
        let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        v["repair"].as_bool().unwrap()
    };
    let cases: [(&[&str], bool); 7] = [
        (&[], false),
        (&["-y"], true),
        (&["--yes"], true),
        (&["-y", "-n"], false),
        (&["-n", "--repair"], true),
        (&["-fy"], true),
        (&["-f", "-n"], false),
    ];
    for (flags, want) in cases {
        assert_eq!(repair(flags), want, "{flags:?}");
    }
}

/// `run` passes everything after its options to the program, so it is not
/// in COMMANDS' surplus/unknown-flag checks: a missing program is its one
/// usage error, and its help names the library option.
#[test]
fn run_needs_a_program() {
    let run = Cmd {
        name: "run",
        positional: &[],
        help: &[],
        usage_code: 2,
    };
    refused(&run, &["run"], "required arguments were not provided");
    let o = inkfs(&["run", "--help"]);
    assert!(o.status.success());
    for want in ["<CMD>...", "--lib <PATH>", "LD_PRELOAD"] {
        assert!(stdout(&o).contains(want), "run --help lacks {want}");
    }
}
