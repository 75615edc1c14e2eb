#!/bin/bash
# One interleaved A/B run of h/hybdirect's build against main's, under the
# timing lock, with the load and the data disk's raw figures
# (../issue18-pflush/raw-device.sh) before and after.
# Usage: NEW=DIR BASE=DIR run.sh OUTDIR ONLY CONTENDERS
# NEW: the build in the plain contenders' slots; BASE: the build in the
# base.* slots (swap them for the second run of a pair). The workload
# driver (inkbench-work) is main's for both.
set -u
out=$1; only=$2; contenders=$3
export NEW BASE
here=$(cd "$(dirname "$0")" && pwd); repo=$(cd "$here/../../.." && pwd)
mkdir -p "$out"
flock /tmp/inkfs-timing.lock bash -c '
  echo "before: $(date -u +%H:%M:%S) $(uptime)"
  echo "NEW=$NEW BASE=$BASE"
  "$0/../issue18-pflush/raw-device.sh" /var/tmp/hybdirect-raw
  "$1/bench/run" --quick --no-build --reps 5 --inkfs-bin "$NEW/inkfs" \
    --work-bin /tmp/stop31-base-release/inkbench-work --base-bin "$BASE" \
    --contenders "$4" --only "$3" --out "$2" --quiet > "$2/run.log" 2>&1
  echo "bench/run exit $?"
  "$0/../issue18-pflush/raw-device.sh" /var/tmp/hybdirect-raw
  echo "after: $(date -u +%H:%M:%S) $(uptime)"
' "$here" "$repo" "$out" "$only" "$contenders" > "$out/load-and-device.txt" 2>&1
