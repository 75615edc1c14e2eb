#!/bin/bash
# profile the server during a cold 512 MiB read through a hybrid mount
BIN=${1:-/tmp/h-mountread-base}; TAG=${2:-base}
P=/dev/shm/h-mountread-pool; D=/var/tmp/h-mountread.data; M=/mnt/h-mountread-m
mkdir -p $M
$BIN mkfs $P --size 2147483648 --force --data $D --data-size 2147483648 >/dev/null
$BIN mount $P $M -f -o mode=strict & SRV=$!
for i in $(seq 50); do mountpoint -q $M && break; sleep 0.2; done
fio --name=job --directory=$M --ioengine=psync --size=512m --filename_format=big.0 --rw=read --bs=128k --fallocate=none --output-format=terse >/dev/null
echo 3 > /proc/sys/vm/drop_caches
# pass 1 with perf stat, pass 2 under perf record
perf stat -e task-clock,page-faults,cycles -p $SRV -o /tmp/h-mountread-$TAG.stat -- sleep 30 & PS=$!
sleep 0.5
fio --name=job --directory=$M --ioengine=psync --size=512m --filename_format=big.0 --rw=read --bs=128k --fallocate=none --output-format=json | python3 -c 'import json,sys;j=json.load(sys.stdin)["jobs"][0]["read"];print("iops",j["iops"],"bw MB/s",j["bw_bytes"]/1e6)'
kill -INT $PS; wait $PS
$BIN stat $M --json | python3 -c 'import json,sys;j=json.load(sys.stdin);print({k:v for k,v in j.items() if "read" in k or "cache" in k or "data" in k})' 2>/dev/null
echo 3 > /proc/sys/vm/drop_caches
perf record -g -p $SRV -o /tmp/h-mountread-$TAG.data 2>/dev/null & PR=$!
sleep 0.5
fio --name=job --directory=$M --ioengine=psync --size=512m --filename_format=big.0 --rw=read --bs=128k --fallocate=none --output-format=json | python3 -c 'import json,sys;j=json.load(sys.stdin)["jobs"][0]["read"];print("iops",j["iops"],"bw MB/s",j["bw_bytes"]/1e6)'
kill -INT $PR; wait $PR
umount $M; wait $SRV
rm -f $P $D
