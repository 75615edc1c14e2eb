#!/bin/bash
cd /work/h-mountread
for run in ${RUNS:-A B}; do
  if [ $run = A ] || [ $run = C ]; then MINE=/tmp/h-mountread-new/inkfs; BASE=/tmp/h-mountread-base; else MINE=/tmp/h-mountread-base/inkfs; BASE=/tmp/h-mountread-new; fi
  echo "run $run start $(date -u +%T) $(uptime)"
  flock /tmp/inkfs-timing.lock bench/run --quick --reps 5 --no-build --only fio:seqread128k-big-1j --contenders ext4-disk,inkfs-hybrid,base.inkfs-hybrid,null-fs --base-bin $BASE --inkfs-bin $MINE --out bench/results/issue18-mountread/$run > /tmp/h-mountread-run$run.log 2>&1
  echo "run $run end $(date -u +%T) $(uptime) rc=$?"
done
