#!/bin/bash
# usage: bench31.sh NEWDIR BASEDIR TAG [ONLY] [CONTENDERS]
# Four runs, slots swapped in b and d, under the timing lock.
NEW=$1; BASE=$2; TAG=$3
ONLY=${4:-filebench:fileserver+webproxy+webserver+varmail,meta}
CONT=${5:-tmpfs,ext4,inkfs-preload,base.inkfs-preload}
cd /work/h-askon
for r in a b c d; do
  if [ $r = b ] || [ $r = d ]; then A=$BASE; B=$NEW; sfx=-swapped; else A=$NEW; B=$BASE; sfx=; fi
  echo "== run $r $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  flock /tmp/inkfs-timing.lock bench/run --quick --reps 5 --no-build --inkfs-bin $A/inkfs --base-bin $B \
    --only "$ONLY" --contenders "$CONT" --out bench/results/$TAG-$r$sfx --quiet
  echo "   rc=$? end $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
done
