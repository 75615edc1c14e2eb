#!/bin/bash
# runs.sh: two micro runs, this build (/tmp/h-hybdel-build) vs main (/tmp/base-release), swapped in the second.
cd /work/h-hybdel
one() { local n=$1; shift
  flock -o /tmp/inkfs-bench.lock bash -c "uptime > /tmp/h-hybdel-work/$n.load; bench/run --quick --reps 7 --no-build --work-bin /tmp/h-hybdel-build/inkbench-work --only micro $* --out bench/results/issue18-hybdel-$n > /tmp/h-hybdel-work/$n.log 2>&1; echo rc=\$? >> /tmp/h-hybdel-work/$n.log; uptime >> /tmp/h-hybdel-work/$n.load"
}
one c --inkfs-bin /tmp/h-hybdel-build/inkfs --base-bin /tmp/base-release --contenders ext4-disk,inkfs-hybrid-preload+ask,inkfs-preload+ask,base.inkfs-hybrid-preload+ask
one d-swapped --inkfs-bin /tmp/base-release/inkfs --base-bin /tmp/h-hybdel-build --contenders ext4-disk,base.inkfs-hybrid-preload+ask,base.inkfs-preload+ask,inkfs-hybrid-preload+ask
