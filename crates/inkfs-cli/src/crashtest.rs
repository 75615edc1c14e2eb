//! `inkfs crashtest`: the crash-exploration suite outside the test suite
//! (`inkfs::crashtest`): any budget, one mode, one workload, and the
//! reproduction of a reported violation.

use std::ffi::OsStr;
use std::time::Instant;

use clap::builder::{PossibleValue, StringValueParser, TypedValueParser};
use clap::ValueEnum;

use inkfs::crashtest::{self, workload, CrashTestOptions};
use inkfs::types::Mode;

/// Crash exploration on the simulator
///
/// Runs every one- and two-operation workload (and write-fsync-anything
/// triples, and the same with handles held open) over a small fixed
/// namespace on the crash simulator, in each mode; at every fence, crash
/// images are recovered and checked against the mode's promise
/// (docs/MODES.md, docs/CRASHTEST.md). Exit status: 0 no violation, 1
/// violations found (or an error), 2 usage error.
#[derive(clap::Args, Debug)]
pub struct CrashtestArgs {
    /// Crash states (distinct images) to check at most [default: 20000;
    /// with --images, unlimited]
    #[arg(long, value_name = "N", value_parser = parse_u64)]
    states: Option<u64>,
    /// Exploration seed, decimal or 0x hex [default: 0xace]
    #[arg(long, value_name = "S", value_parser = parse_u64)]
    seed: Option<u64>,
    /// Only this mode (repeatable, or comma-separated) [default: all three]
    #[arg(long, value_name = "M", value_parser = ModeParser, value_delimiter = ',')]
    mode: Vec<ModeArg>,
    /// Only the workload W (`op` or `op1+op2`), or those whose name contains
    /// W (see --list)
    #[arg(long, value_name = "W")]
    workload: Option<String>,
    /// Exactly K images per crash point (reproduces a report)
    #[arg(long, value_name = "K", value_parser = parse_count)]
    images: Option<u64>,
    /// At most K images per crash point [default: 64]
    #[arg(long, value_name = "K", value_parser = parse_count)]
    max_images: Option<u64>,
    /// Skip the clean remount and probe after each recovery
    #[arg(long)]
    quick: bool,
    /// Also tear multi-word stores (8-byte words stay atomic)
    #[arg(long)]
    torn: bool,
    /// Explore hybrid pools: writes of a page or more go to a simulated
    /// data device that keeps or loses each write not yet flushed
    #[arg(long)]
    hybrid: bool,
    /// Run with a client of the kernel-free path attached: an inode's last
    /// unlink commits it ORPHAN and frees it after
    #[arg(long)]
    clients: bool,
    /// Print the operations of the catalogue and exit
    #[arg(long)]
    list: bool,
}

/// A consistency mode, as `--mode` names it.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum ModeArg {
    Strict,
    Sync,
    Posix,
}

impl From<ModeArg> for Mode {
    fn from(m: ModeArg) -> Mode {
        match m {
            ModeArg::Strict => Mode::Strict,
            ModeArg::Sync => Mode::Sync,
            ModeArg::Posix => Mode::Posix,
        }
    }
}

/// `--mode`'s parser: clap's for a value enum (whose values `--help`
/// lists), with this command's own message for a value it refuses.
#[derive(Clone)]
struct ModeParser;

impl TypedValueParser for ModeParser {
    type Value = ModeArg;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<ModeArg, clap::Error> {
        let parse = |m: String| {
            ModeArg::from_str(&m, false)
                .map_err(|_| format!("unknown mode '{m}' (strict, sync or posix)"))
        };
        StringValueParser::new()
            .try_map(parse)
            .parse_ref(cmd, arg, value)
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        let values = ModeArg::value_variants().iter();
        Some(Box::new(values.filter_map(ValueEnum::to_possible_value)))
    }
}

/// A count or seed: decimal (with `_` separators allowed) or 0x hex.
fn parse_u64(v: &str) -> Result<u64, String> {
    let r = match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(&hex.replace('_', ""), 16),
        None => v.replace('_', "").parse(),
    };
    r.map_err(|_| format!("'{v}' is not a number (decimal, or hex with 0x)"))
}

/// An image count: at least 1.
fn parse_count(v: &str) -> Result<u64, String> {
    match parse_u64(v)? {
        0 => Err("at least 1".into()),
        n => Ok(n),
    }
}

pub fn main(a: &CrashtestArgs) -> Result<(), String> {
    if a.list {
        for op in workload::OPS {
            println!("{:<28} {:?}", op.name, op.kind);
        }
        println!("namespace: {}", workload::NAMESPACE);
        return Ok(());
    }
    let mut opts = CrashTestOptions::default();
    let states_given = a.states.is_some();
    if let Some(n) = a.states {
        opts.states_budget = n;
    }
    if let Some(s) = a.seed {
        opts.seed = s;
    }
    opts.images = a.images.map(|k| k as usize);
    if let Some(k) = a.max_images {
        opts.max_images_per_point = k as usize;
    }
    opts.filter = a.workload.clone();
    opts.deep = !a.quick;
    opts.torn_stores = a.torn;
    opts.hybrid = a.hybrid;
    opts.clients = a.clients;
    let mut modes: Vec<Mode> = a.mode.iter().map(|&m| m.into()).collect();
    if opts.images.is_some() && !states_given {
        // Reproducing with exactly K images per point: every point, unless
        // the user also capped the states.
        opts.states_budget = u64::MAX;
    }
    if !modes.is_empty() {
        modes.dedup();
        opts.modes = modes;
    }
    if let Some(f) = &opts.filter {
        if crashtest::select_workloads(Some(f), opts.seed).is_empty() {
            return Err(format!(
                "no workload matches '{f}' (names are op or op1+op2; see --list)"
            ));
        }
    }
    println!(
        "crashtest: seed {:#x}, modes {}, {}",
        opts.seed,
        opts.modes
            .iter()
            .map(|m| m.name())
            .collect::<Vec<_>>()
            .join(","),
        match (opts.images, states_given) {
            (Some(k), false) => format!("{k} images per crash point"),
            (Some(k), true) => format!(
                "{k} images per crash point, at most {} crash states",
                opts.states_budget
            ),
            (None, _) => format!("budget {} crash states", opts.states_budget),
        }
    );
    let mut last = Instant::now();
    let report = crashtest::run(&opts, |p| {
        if last.elapsed().as_secs_f64() >= 2.0 {
            last = Instant::now();
            eprintln!(
                "  {}/{} runs, {} crash states, {} violations, {:.0} states/s ({} [{}])",
                p.runs_done,
                p.runs_total,
                p.states_checked,
                p.violations,
                p.states_checked as f64 / p.elapsed.as_secs_f64().max(1e-9),
                p.workload,
                p.mode.name()
            );
        }
    });
    for v in report.violations.iter().take(50) {
        println!("{v}");
    }
    if report.violations.len() > 50 {
        println!("... {} more violations", report.violations.len() - 50);
    }
    println!(
        "crashtest: {} crash states checked (strict {}, sync {}, posix {}) at {} crash points, {} of {} workloads ({} runs), {:.1}s, {:.0} states/s",
        report.states_checked,
        report.states_per_mode[0],
        report.states_per_mode[1],
        report.states_per_mode[2],
        report.crash_points,
        report.workloads,
        report.workloads_total,
        report.runs,
        report.elapsed.as_secs_f64(),
        report.states_per_second()
    );
    if report.violations.is_empty() {
        println!("crashtest: 0 violations");
        Ok(())
    } else {
        Err(format!("{} violations", report.violations.len()))
    }
}
