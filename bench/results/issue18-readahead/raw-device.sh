#!/bin/bash
# The data device's raw bandwidth: fio O_DIRECT 128 KiB reads of a 512 MiB file in /var/tmp, queue depth 1 and 4.
f=/var/tmp/h-hybrid/raw.dat
for qd in 1 4; do
  fio --name=raw --filename=$f --rw=read --bs=128k --direct=1 --ioengine=libaio --iodepth=$qd --size=512m --output-format=terse 2>/dev/null | awk -F';' -v q=$qd '{printf "raw O_DIRECT 128k qd%s: %d MB/s (%d IOPS)\n", q, $7/1000, $8}'
done
