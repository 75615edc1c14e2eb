#!/bin/bash
# A/B of the cold 512 MiB sequential read (128 KiB psync) on one hybrid pool and data file: BASE NEW ROUNDS
set -e
B=$1; N=$2; R=${3:-4}
POOL=/dev/shm/h-hybrid2-r.pool; DATA=/var/tmp/h-hybrid2/r.data; MNT=/mnt/h-hybrid2-a
echo "start: $(uptime)"
$N mkfs $POOL --size 1G --force --data $DATA --data-size 1G >/dev/null
$N mount $POOL $MNT -o mode=strict
fio --name=w --directory=$MNT --ioengine=psync --rw=write --bs=1m --size=512m --filename_format=big --output-format=terse >/dev/null
umount $MNT; while pgrep -f "mount $POOL " >/dev/null; do sleep 0.05; done
one() {
  $1 mount $POOL $MNT -o mode=strict
  while $1 stat --json $MNT | grep -q '"pool_populating": *true'; do sleep 0.05; done
  sync; echo 3 > /proc/sys/vm/drop_caches
  fio --name=r --directory=$MNT --ioengine=psync --rw=read --bs=128k --size=512m --filename_format=big --output-format=json 2>/dev/null | python3 -c "import json,sys; j=json.load(sys.stdin)['jobs'][0]; print('$2 %.0f MB/s' % (j['read']['bw_bytes']/1e6))"
  umount $MNT; while pgrep -f "mount $POOL " >/dev/null; do sleep 0.05; done
}
for r in $(seq 1 $R); do
  if (( r % 2 )); then one $B base; one $N new; else one $N new; one $B base; fi
done
rm -f $POOL $DATA
echo "end: $(uptime)"
