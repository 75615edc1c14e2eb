#!/bin/bash
# cold 512 MiB read through a hybrid mount with the FUSE bdi's read_ahead_kb set to each of $2...
BIN=$1; shift
P=/dev/shm/h-mountread-pool; D=/var/tmp/h-mountread.data; M=/mnt/h-mountread-m
mkdir -p $M
$BIN mkfs $P --size 2147483648 --force --data $D --data-size 2147483648 >/dev/null
$BIN mount $P $M -f -o mode=strict & SRV=$!
for i in $(seq 50); do mountpoint -q $M && break; sleep 0.2; done
BDI=/sys/class/bdi/$(mountpoint -d $M)
echo "bdi $BDI: read_ahead_kb $(cat $BDI/read_ahead_kb) max_ratio $(cat $BDI/max_ratio 2>/dev/null)"
fio --name=job --directory=$M --ioengine=psync --size=512m --filename_format=big.0 --rw=read --bs=128k --fallocate=none --output-format=terse >/dev/null
for rep in 1 2 3; do
for ra in "$@"; do
echo $ra > $BDI/read_ahead_kb
echo 3 > /proc/sys/vm/drop_caches
printf "ra %5s KiB: " $ra
fio --name=job --directory=$M --ioengine=psync --size=512m --filename_format=big.0 --rw=read --bs=128k --fallocate=none --output-format=json | python3 -c 'import json,sys;j=json.load(sys.stdin)["jobs"][0]["read"];print("iops %.0f  MB/s %.0f"%(j["iops"],j["bw_bytes"]/1e6))'
done; done
umount $M; wait $SRV
rm -f $P $D
