#!/bin/bash
# One A/B run: this experiment's build (/tmp/h-pflush-exp: main + the
# measurement-only patch of branch h/pflush-wip, INKFS_EXPERIMENT_NOFLUSH=1
# set by its wrapper) against main's build (/tmp/h-pflush-base, e3a4e32),
# interleaved in one bench/run, with the load and the raw device's figures
# before and after. Usage: run.sh OUTDIR ONLY CONTENDERS
out=$1; only=$2; contenders=$3
# BIN: the build under test (default: the no-flush experiment; big-writes.sh
# sets /tmp/h-pflush-exp2/inkfs, 16 MiB requests). BASE: the baseline's directory
# (default main's build; slow-flush.sh sets wrappers adding a 3 ms delay to each
# device flush on both sides).
here=$(cd "$(dirname "$0")" && pwd); repo=$(cd "$here/../../.." && pwd)
mkdir -p "$out"
{
  echo "before: $(date -u +%H:%M:%S) $(uptime)"
  "$here/raw-device.sh"
  "$repo/bench/run" --quick --no-build --reps 5 --inkfs-bin "${BIN:-/tmp/h-pflush-exp/inkfs}" \
    --work-bin /tmp/h-pflush-base/inkbench-work --base-bin "${BASE:-/tmp/h-pflush-base}" \
    --contenders "$contenders" --only "$only" --out "$out" > "$out/run.log" 2>&1
  echo "bench/run exit $?"
  "$here/raw-device.sh"
  echo "after: $(date -u +%H:%M:%S) $(uptime)"
} > "$out/load-and-device.txt" 2>&1
