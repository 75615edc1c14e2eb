#!/bin/bash
cd /work/h-hybask
one() { local n=$1 only=$2; shift 2
  flock -o /tmp/inkfs-timing.lock bash -c "uptime > /tmp/hybask-runs/$n.load; bench/run --quick --reps 5 --no-build --work-bin /tmp/hybask-prof/inkbench-work --only $only $* --out bench/results/issue18-hybask-$n > /tmp/hybask-runs/$n.log 2>&1; echo rc=\$? >> /tmp/hybask-runs/$n.log; uptime >> /tmp/hybask-runs/$n.load"
}
sleep 20
one granted-k micro --inkfs-bin /tmp/hybask-p2/inkfs --base-bin /tmp/hybask-p0 --contenders ext4-disk,inkfs-hybrid-preload+ask,base.inkfs-hybrid-preload+ask
one granted-l-swapped micro --inkfs-bin /tmp/hybask-p0/inkfs --base-bin /tmp/hybask-p2 --contenders ext4-disk,inkfs-hybrid-preload+ask,base.inkfs-hybrid-preload+ask
