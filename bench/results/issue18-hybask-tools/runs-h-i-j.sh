#!/bin/bash
cd /work/h-hybask
one() { local n=$1 only=$2; shift 2
  flock -o /tmp/inkfs-timing.lock bash -c "uptime > /tmp/hybask-runs/$n.load; bench/run --quick --reps 5 --no-build --work-bin /tmp/hybask-prof/inkbench-work --only $only $* --out bench/results/issue18-hybask-$n > /tmp/hybask-runs/$n.log 2>&1; echo rc=\$? >> /tmp/hybask-runs/$n.log; uptime >> /tmp/hybask-runs/$n.load"
}
one h micro,filebench:varmail --inkfs-bin /tmp/hybask-build2/inkfs --base-bin /tmp/stop34-base-release --contenders ext4-disk,inkfs-hybrid-preload,inkfs-hybrid-preload+ask,base.inkfs-hybrid-preload+ask
one i-swapped micro,filebench:varmail --inkfs-bin /tmp/stop34-base-release/inkfs --base-bin /tmp/hybask-build2 --contenders ext4-disk,base.inkfs-hybrid-preload+ask,inkfs-hybrid-preload+ask,inkfs-hybrid-preload
one j micro --inkfs-bin /tmp/hybask-build2/inkfs --base-bin /tmp/stop34-base-release --contenders ext4-disk,base.inkfs-hybrid-preload+ask,inkfs-hybrid-preload+ask,inkfs-hybrid-preload
