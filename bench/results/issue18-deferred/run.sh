#!/bin/bash
# One interleaved A/B run of the deferred-commit build against main's,
# under the timing lock, with the load and the data disk's raw figures
# (../issue18-pflush/raw-device.sh) before and after.
# Usage: run.sh OUTDIR ONLY CONTENDERS
# NEW: the build under test as the plain contenders (default
# /tmp/h-pflush2-new: h/pflush's release inkfs and
# libinkfs_preload.so); BASE: the build in the base.* slots (default
# /tmp/h-pflush2-base: main's release build at 92975c6). Swap them
# (NEW=/tmp/h-pflush2-base BASE=/tmp/h-pflush2-new) for the second run.
# The workload driver (inkbench-work) is main's for both.
set -u
out=$1; only=$2; contenders=$3
export NEW=${NEW:-/tmp/h-pflush2-new} BASE=${BASE:-/tmp/h-pflush2-base}
here=$(cd "$(dirname "$0")" && pwd); repo=$(cd "$here/../../.." && pwd)
mkdir -p "$out"
flock /tmp/inkfs-timing.lock bash -c '
  echo "before: $(date -u +%H:%M:%S) $(uptime)"
  echo "NEW=$NEW BASE=$BASE"
  "$0/../issue18-pflush/raw-device.sh"
  "$1/bench/run" --quick --no-build --reps 5 --inkfs-bin "$NEW/inkfs" \
    --work-bin /tmp/h-pflush2-base/inkbench-work --base-bin "$BASE" \
    --contenders "$4" --only "$3" --out "$2" > "$2/run.log" 2>&1
  echo "bench/run exit $?"
  "$0/../issue18-pflush/raw-device.sh"
  echo "after: $(date -u +%H:%M:%S) $(uptime)"
' "$here" "$repo" "$out" "$only" "$contenders" > "$out/load-and-device.txt" 2>&1
