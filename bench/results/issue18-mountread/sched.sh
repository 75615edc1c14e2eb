#!/bin/bash
# where the server's threads wait during a cold 512 MiB read: sched events of one pass
BIN=$1; OUT=$2
P=/dev/shm/h-mountread-pool; D=/var/tmp/h-mountread.data; M=/mnt/h-mountread-m
mkdir -p $M
$BIN mkfs $P --size 2147483648 --force --data $D --data-size 2147483648 >/dev/null
$BIN mount $P $M -f -o mode=strict & SRV=$!
for i in $(seq 50); do mountpoint -q $M && break; sleep 0.2; done
fio --name=job --directory=$M --ioengine=psync --size=512m --filename_format=big.0 --rw=read --bs=128k --fallocate=none --output-format=terse >/dev/null
echo 3 > /proc/sys/vm/drop_caches
perf sched record -o $OUT.sched -- sleep 3 >/dev/null 2>&1 & PS=$!
perf record -e sched:sched_switch -g -p $SRV -o $OUT.switch >/dev/null 2>&1 & PR=$!
sleep 0.7
fio --name=job --directory=$M --ioengine=psync --size=512m --filename_format=big.0 --rw=read --bs=128k --fallocate=none --output-format=json | python3 -c 'import json,sys;j=json.load(sys.stdin)["jobs"][0]["read"];print("iops %.0f clat %.0fus"%(j["iops"],j["clat_ns"]["mean"]/1e3))'
$BIN stat $M | grep -E '^ *read '
kill -INT $PR; wait $PR; wait $PS
umount $M; wait $SRV
rm -f $P $D
