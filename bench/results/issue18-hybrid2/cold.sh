#!/bin/bash
# usage: cold.sh BIN OPTS [RA_KB] -> prints MB/s of a cold 512 MiB read through the mount
set -e
BIN=$1; OPTS=$2; RA=${3:-}
POOL=/dev/shm/h-hybrid2-cold.pool; DATA=/var/tmp/h-hybrid2/cold.data; MNT=/mnt/h-hybrid2-a
if [ ! -f /var/tmp/h-hybrid2/ready ]; then
  $BIN mkfs $POOL --size 1G --force --data $DATA --data-size 1G >/dev/null
  $BIN mount $POOL $MNT -o mode=strict
  fio --name=w --directory=$MNT --ioengine=psync --rw=write --bs=1m --size=512m --filename_format=big --output-format=terse >/dev/null
  umount $MNT; while pgrep -f "mount $POOL " >/dev/null; do sleep 0.05; done
  touch /var/tmp/h-hybrid2/ready
fi
$BIN mount $POOL $MNT -o mode=strict${OPTS:+,$OPTS}
while $BIN stat --json $MNT | grep -q '"pool_populating": *true'; do sleep 0.05; done
if [ -n "$RA" ]; then
  dev=$(mountpoint -d $MNT); echo $RA > /sys/class/bdi/$dev/read_ahead_kb
fi
sync; echo 3 > /proc/sys/vm/drop_caches
SPID=$(pgrep -f "mount $POOL " | head -1)
cpu() { awk '{print $14+$15}' /proc/$SPID/stat; }
c0=$(cpu); t0=$(date +%s.%N)
fio --name=r --directory=$MNT --ioengine=psync --rw=read --bs=128k --size=512m --filename_format=big --output-format=json 2>/dev/null | python3 -c "import json,sys; j=json.load(sys.stdin)['jobs'][0]; print('%.0f MB/s fio usr %.0f%% sys %.0f%%' % (j['read']['bw_bytes']/1e6, j['usr_cpu'], j['sys_cpu']))"
c1=$(cpu); t1=$(date +%s.%N); echo "server cpu $(( (c1-c0) ))0 ms over $(echo "($t1-$t0)*1000/1" | bc) ms wall"
$BIN stat --json $MNT | python3 -c "
import json,sys; s=json.load(sys.stdin)
print({k:v for k,v in s.items() if k.startswith('data_') and k!='data_device'})
ops=s.get('ops',{}); r=ops.get('read',{}); print('reads', r.get('count'), 'mean ns', r.get('total_ns',0)//max(r.get('count',1),1))" 2>/dev/null || true
umount $MNT; while pgrep -f "mount $POOL " >/dev/null; do sleep 0.05; done
