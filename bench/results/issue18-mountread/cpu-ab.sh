#!/bin/bash
# interleaved: for each rep, for each binary: fresh hybrid mount, lay out 512 MiB, cold read it;
# prints fio IOPS, fio's mean completion latency, the server's CPU (task-clock) and its READ time.
REPS=$1; shift
P=/dev/shm/h-mountread-pool; D=/var/tmp/h-mountread.data; M=/mnt/h-mountread-m
mkdir -p $M
for rep in $(seq $REPS); do for BIN in "$@"; do
$BIN mkfs $P --size 2147483648 --force --data $D --data-size 2147483648 >/dev/null
$BIN mount $P $M -f -o mode=strict & SRV=$!
for i in $(seq 50); do mountpoint -q $M && break; sleep 0.2; done
fio --name=job --directory=$M --ioengine=psync --size=512m --filename_format=big.0 --rw=read --bs=128k --fallocate=none --output-format=terse >/dev/null
echo 3 > /proc/sys/vm/drop_caches
T0=$(awk '{print $14+$15}' /proc/$SRV/stat)
R=$(fio --name=job --directory=$M --ioengine=psync --size=512m --filename_format=big.0 --rw=read --bs=128k --fallocate=none --output-format=json | python3 -c 'import json,sys;j=json.load(sys.stdin)["jobs"][0]["read"];print("iops %.0f clat %.0fus"%(j["iops"],j["clat_ns"]["mean"]/1e3))')
T1=$(awk '{print $14+$15}' /proc/$SRV/stat)
echo "$(basename $BIN) $R server-cpu $(( (T1-T0)*10 ))ms $($BIN stat $M 2>/dev/null | grep -iE '^ *read ' | head -1)"
umount $M; wait $SRV
rm -f $P $D
done; done
