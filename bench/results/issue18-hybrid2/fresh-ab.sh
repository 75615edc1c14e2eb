#!/bin/bash
# A fresh data file's writes, two builds alternately: BASE NEW ROUNDS.
# Each round and build: mkfs (a new 1 GiB data file in /var/tmp, made by
# that build's mkfs) and a strict mount, fio 128 KiB sequential writes
# of a new 256 MiB file (each durable on return), fsync at the end.
set -e
B=$1; N=$2; R=${3:-3}
POOL=/dev/shm/h-hybrid2-f.pool; DATA=/var/tmp/h-hybrid2/f.data; MNT=/mnt/h-hybrid2-a
mkdir -p /var/tmp/h-hybrid2
echo "start: $(uptime)"
one() {
  rm -f $DATA
  local t0=$(date +%s%N)
  $1 mkfs $POOL --size 1G --force --data $DATA --data-size 1G >/dev/null
  local t1=$(date +%s%N)
  $1 mount $POOL $MNT -o mode=strict
  while $1 stat --json $MNT | grep -q '"pool_populating": *true'; do sleep 0.05; done
  fio --name=w --directory=$MNT --ioengine=psync --rw=write --bs=128k --size=256m --end_fsync=1 --filename_format=w --output-format=json 2>/dev/null | python3 -c "import json,sys; j=json.load(sys.stdin)['jobs'][0]; print('$2 %.0f writes/s (mkfs %.1f s)' % (j['write']['iops'], ($t1-$t0)/1e9))"
  umount $MNT; while pgrep -f "mount $POOL " >/dev/null; do sleep 0.05; done
}
for r in $(seq 1 $R); do
  if (( r % 2 )); then one $B base; one $N new; else one $N new; one $B base; fi
done
rm -f $POOL $DATA
echo "end: $(uptime)"
