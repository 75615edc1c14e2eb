#!/bin/bash
# O_DIRECT 128 KiB writes + fdatasync each: into fallocated (unwritten) blocks vs into blocks written before
d=/var/tmp/h-hybrid2-uw; mkdir -p $d; f=$d/u.dat
echo "start: $(uptime)"
for round in 1 2 3; do
  rm -f $f; fallocate -l 256M $f
  fio --name=fresh --filename=$f --rw=write --bs=128k --direct=1 --ioengine=psync --fdatasync=1 --size=32m --output-format=terse 2>/dev/null | awk -F';' '{printf "fallocated, first write: %d IOPS\n", $49}'
  fio --name=again --filename=$f --rw=write --bs=128k --direct=1 --ioengine=psync --fdatasync=1 --size=32m --output-format=terse 2>/dev/null | awk -F';' '{printf "same blocks, written before: %d IOPS\n", $49}'
done
rm -rf $d
echo "end: $(uptime)"
