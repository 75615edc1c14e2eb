#!/bin/bash
# usage: askmkdir-bench.sh NEWDIR BASEDIR TAG [ONLY] [CONTENDERS]
# Four runs of bench/run --quick --reps 5, the new build's directory and
# main's swapped between the inkfs-bin and base-bin slots in runs b and d,
# each under the timing lock; the load before and after each.
NEW=$1; BASE=$2; TAG=$3
ONLY=${4:-meta}
CONT=${5:-ext4,inkfs-preload+ask,base.inkfs-preload+ask}
cd /work/h-askmkdir
for r in a b c d; do
  if [ $r = b ] || [ $r = d ]; then A=$BASE; B=$NEW; sfx=-swapped; else A=$NEW; B=$BASE; sfx=; fi
  echo "== run $r $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  flock -o /tmp/inkfs-timing.lock bench/run --quick --reps 5 --no-build --inkfs-bin $A/inkfs --base-bin $B \
    --only "$ONLY" --contenders "$CONT" --out bench/results/$TAG-$r$sfx --quiet
  echo "   rc=$? end $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
done
