//! `inkfs crashtest`: the crash-exploration suite outside the test suite
//! (`inkfs::crashtest`): any budget, one mode, one workload, and the
//! reproduction of a reported violation.

use std::time::Instant;

use inkfs::crashtest::{self, workload, CrashTestOptions};
use inkfs::types::Mode;

pub const USAGE: &str = "\
usage: inkfs crashtest [--states N] [--seed S] [--mode strict|sync|posix]...
                       [--workload NAME] [--images K] [--max-images K]
                       [--quick] [--torn] [--list]

Runs every one- and two-operation workload (and write-fsync-anything
triples, and the same with handles held open) over a small fixed namespace on
the crash simulator, in each mode; at every fence, crash images are
recovered and checked against the mode's promise (docs/MODES.md).

  --states N      crash states (distinct images) to check at most (default
                  20000; with --images, unlimited unless given)
  --seed S        exploration seed, decimal or 0x hex (default 0xace)
  --mode M        only this mode (repeatable, or comma-separated)
  --workload W    only the workload W (`op` or `op1+op2`), or those whose
                  name contains W
  --images K      exactly K images per crash point (reproduces a report)
  --max-images K  at most K images per crash point (default 64)
  --quick         skip the clean remount and probe after each recovery
  --torn          also tear multi-word stores (8-byte words stay atomic)
  --list          print the operations and exit
";

fn parse_u64(flag: &str, v: Option<&String>) -> Result<u64, String> {
    let v = v.ok_or_else(|| format!("{flag} needs a value"))?;
    let r = match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => v.replace('_', "").parse(),
    };
    r.map_err(|_| format!("{flag}: '{v}' is not a number"))
}

pub fn main(args: &[String]) -> Result<(), String> {
    let mut opts = CrashTestOptions::default();
    let mut modes: Vec<Mode> = Vec::new();
    let mut states_given = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--states" => {
                opts.states_budget = parse_u64(a, it.next())?;
                states_given = true;
            }
            "--seed" => opts.seed = parse_u64(a, it.next())?,
            "--images" => opts.images = Some(parse_u64(a, it.next())?.max(1) as usize),
            "--max-images" => opts.max_images_per_point = parse_u64(a, it.next())?.max(1) as usize,
            "--mode" => {
                let v = it.next().ok_or("--mode needs a value")?;
                for m in v.split(',') {
                    modes
                        .push(Mode::parse(m).ok_or_else(|| {
                            format!("unknown mode '{m}' (strict, sync or posix)")
                        })?);
                }
            }
            "--workload" => {
                opts.filter = Some(it.next().ok_or("--workload needs a value")?.clone())
            }
            "--quick" => opts.deep = false,
            "--torn" => opts.torn_stores = true,
            "--list" => {
                for op in workload::OPS {
                    println!("{:<28} {:?}", op.name, op.kind);
                }
                println!("namespace: {}", workload::NAMESPACE);
                return Ok(());
            }
            "-h" | "--help" => {
                print!("{USAGE}");
                return Ok(());
            }
            other => return Err(format!("unknown argument '{other}'\n{USAGE}")),
        }
    }
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
