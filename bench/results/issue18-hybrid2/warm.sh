#!/bin/bash
# cold (server cache empty) then warm (server cache holds the file; kernel page cache dropped before each)
set -e
BIN=$1; POOL=/dev/shm/h-hybrid2-cold.pool; MNT=/mnt/h-hybrid2-a
$BIN mount $POOL $MNT -o mode=strict,data_cache=1G
while $BIN stat --json $MNT | grep -q '"pool_populating": *true'; do sleep 0.05; done
for pass in cold warm warm; do
sync; echo 3 > /proc/sys/vm/drop_caches
fio --name=r --directory=$MNT --ioengine=psync --rw=read --bs=128k --size=512m --filename_format=big --output-format=json 2>/dev/null | python3 -c "import json,sys; j=json.load(sys.stdin)['jobs'][0]; print('$pass: %.0f MB/s' % (j['read']['bw_bytes']/1e6))"
done
umount $MNT; while pgrep -f "mount $POOL " >/dev/null; do sleep 0.05; done
