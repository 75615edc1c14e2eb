#!/bin/bash
# /tmp/h-fsrv-run.sh BIN_DIR PERS SECONDS [extra env...]: one preloaded run, prints result + stat
set -euo pipefail
b=$1; pers=$2; secs=$3
pool=/dev/shm/h-fsrv-pool; mnt=/tmp/h-fsrv-mnt
work=/work/h-fsrv/target/release/inkbench-work
mkdir -p $mnt; rm -f $pool
declare -A Q=([fileserver]="2000 20 131072 50 80" [webproxy]="2000 1000000 16384 100 80")
read -r nfiles dirwidth filesize threads prealloc <<<"${Q[$pers]}"
threads=${THREADS:-$threads}
$b/inkfs mkfs --size 2G $pool >/dev/null
$b/inkfs mount $pool $mnt -o mode=strict
while $b/inkfs stat --json $mnt | grep -q '"pool_populating": *true'; do sleep 0.05; done
spid=$(pgrep -f "mount $pool " | head -1)
s0=$(awk '{print $14+$15}' /proc/$spid/stat)
mkdir $mnt/$pers
[ -n "${PERF:-}" ] && (sleep 1; perf record -q ${PERFARGS:--g -F 999} -o /tmp/h-fsrv-perf.data -p $spid -- sleep 1.5 2>/dev/null) &
/usr/bin/time -f '%U %S %e' -o /tmp/h-fsrv-time env LD_PRELOAD=$b/libinkfs_preload.so ${PRE:-} $work filebench --dir $mnt/$pers --personality $pers --seed 1 --nfiles $nfiles --dirwidth $dirwidth --filesize $filesize --threads $threads --iosize 1048576 --appendsize 16384 --prealloc $prealloc --seconds $secs > /tmp/h-fsrv-out.json
s1=$(awk '{print $14+$15}' /proc/$spid/stat)
echo "prog cpu (u s wall): $(cat /tmp/h-fsrv-time)  server cpu: $(( s1 - s0 )) ticks"
python3 -c 'import json;r=json.load(open("/tmp/h-fsrv-out.json"));print({k:v for k,v in r["result"].items() if k!="flowops"}); print(r["result"].get("flowops"))' || cat /tmp/h-fsrv-out.json | head -50
$b/inkfs stat $mnt > /tmp/h-fsrv-stat.txt
fusermount3 -u $mnt
while pgrep -f "mount $pool " >/dev/null; do sleep 0.05; done
$b/inkfs fsck $pool | tail -2
rm -f $pool
