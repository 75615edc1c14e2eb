#!/bin/bash
# A/B of the end-fsync sequential write on one hybrid pool and data file: BASE NEW ROUNDS
set -e
B=$1; N=$2; R=${3:-3}
POOL=/dev/shm/h-hybrid2-w.pool; DATA=/var/tmp/h-hybrid2/w.data; MNT=/mnt/h-hybrid2-a
$N mkfs $POOL --size 1G --force --data $DATA --data-size 1G >/dev/null
one() {
  $1 mount $POOL $MNT -o mode=strict
  while $1 stat --json $MNT | grep -q '"pool_populating": *true'; do sleep 0.05; done
  rm -f $MNT/w
  fio --name=w --directory=$MNT --ioengine=psync --rw=write --bs=128k --size=256m --end_fsync=1 --filename_format=w --output-format=json 2>/dev/null | python3 -c "import json,sys; j=json.load(sys.stdin)['jobs'][0]; print('$2 %.0f IOPS' % j['write']['iops'])"
  umount $MNT; while pgrep -f "mount $POOL " >/dev/null; do sleep 0.05; done
}
for r in $(seq 1 $R); do
  if (( r % 2 )); then one $B base; one $N new; else one $N new; one $B base; fi
done
rm -f $POOL $DATA
