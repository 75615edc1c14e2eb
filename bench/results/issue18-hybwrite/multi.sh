#!/bin/bash
# multi.sh BIN PASSES [PERF_PASS]: PASSES passes of 512 MiB write + end fsync
# in one hybrid posix mount (the file removed between passes, as bench/run
# does); the disk's counters per pass; perf of the server on PERF_PASS.
set -u
bin=$1; passes=$2; perfpass=${3:-0}
p=/dev/shm/hybwrite-prof.pool; d=/var/tmp/hybwrite-prof.data; m=/tmp/hybwrite-mnt
rm -f $p $d; mkdir -p $m
truncate -s 2G $p; fallocate -l 2G $d
$bin mkfs $p --data $d --data-size 2G >/dev/null
$bin mount -o mode=posix ${OPTS:-} $p $m || exit 1
pid=$(pgrep -n -f "hybwrite-prof.pool")
sleep 3   # let the pool's pre-mapping finish
for i in $(seq 1 $passes); do
  rm -f $m/w.0.0; sync
  if [ "$i" = "$perfpass" ]; then perf record ${PERFARGS:--g} -p $pid -o /tmp/hybwrite-prof/perf.data 2>/dev/null & ppid=$!; sleep 0.5; fi
  s0=$(cat /sys/block/vda/stat); c0=$(awk '{print $14+$15}' /proc/$pid/stat)
  fio --name=w --directory=$m --rw=write --bs=128k --size=512m --end_fsync=1 --fallocate=none --ioengine=psync --output-format=terse 2>/dev/null | awk -F';' '{printf "pass: %d MB/s (%.0f ms) ", $48/1000, $50/1}'
  s1=$(cat /sys/block/vda/stat); c1=$(awk '{print $14+$15}' /proc/$pid/stat)
  [ "$i" = "$perfpass" ] && { kill -INT $ppid; wait $ppid; }
  echo "$s0 $s1" | awk -v c=$((c1-c0)) '{printf "server cpu %d ms; vda: writes %d, MB %d, busy %d ms, flushes %d (%d ms)\n", c*10, $(5+17)-$5, ($(7+17)-$7)/2048, $(10+17)-$10, $(16+17)-$16, $(17+17)-$17}'
done
$bin stat $m 2>&1 | grep -E "^data device: (flushes|write-backs|shared|deferred)|^write |^setattr "
umount $m; rm -f $p $d
