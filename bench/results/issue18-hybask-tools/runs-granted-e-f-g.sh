#!/bin/bash
cd /work/h-hybask
one() { local n=$1; shift
  flock -o /tmp/inkfs-timing.lock bash -c "uptime > /tmp/hybask-runs/$n.load; bench/run --quick --reps 5 --no-build --only micro $* --out bench/results/issue18-hybask-$n > /tmp/hybask-runs/$n.log 2>&1; echo rc=\$? >> /tmp/hybask-runs/$n.log; uptime >> /tmp/hybask-runs/$n.load"
}
one granted-e --inkfs-bin /tmp/hybask-p1/inkfs --base-bin /tmp/hybask-p0 --contenders ext4-disk,inkfs-hybrid-preload+ask,base.inkfs-hybrid-preload+ask
one granted-f-swapped --inkfs-bin /tmp/hybask-p0/inkfs --base-bin /tmp/hybask-p1 --contenders ext4-disk,base.inkfs-hybrid-preload+ask,inkfs-hybrid-preload+ask
one granted-g --inkfs-bin /tmp/hybask-p1/inkfs --base-bin /tmp/hybask-p0 --contenders ext4-disk,base.inkfs-hybrid-preload+ask,inkfs-hybrid-preload+ask
