#!/bin/bash
# interleaved A/B runs, one after the other, each under the timing lock
cd /work/h-hybask
one() { # name, extra args...
  local n=$1; shift
  flock -o /tmp/inkfs-timing.lock bash -c "uptime > /tmp/hybask-runs/$n.load; bench/run --quick --reps 5 --no-build --only micro,filebench:varmail $* --out bench/results/issue18-hybask-$n > /tmp/hybask-runs/$n.log 2>&1; echo rc=\$? >> /tmp/hybask-runs/$n.log; uptime >> /tmp/hybask-runs/$n.load"
}
one b --base-bin /tmp/stop34-base-release --contenders ext4-disk,inkfs-hybrid-preload,inkfs-hybrid-preload+ask,base.inkfs-hybrid-preload+ask
one c-swapped --inkfs-bin /tmp/stop34-base-release/inkfs --base-bin /tmp/hybask-build --contenders ext4-disk,base.inkfs-hybrid-preload+ask,inkfs-hybrid-preload+ask,inkfs-hybrid-preload
one d --base-bin /tmp/stop34-base-release --contenders ext4-disk,inkfs-hybrid-preload+ask,inkfs-hybrid-preload,base.inkfs-hybrid-preload+ask
