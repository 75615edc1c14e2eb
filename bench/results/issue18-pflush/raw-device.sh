#!/bin/bash
# The data device's raw bandwidth beside a run: fio O_DIRECT (libaio) on a
# 512 MiB file in /var/tmp (the disk of the hybrid data files and of
# ext4-disk's image): 128 KiB reads at queue depth 1 and 4, 128 KiB writes
# without flushes, and 128 KiB writes with an fdatasync after each.
d=${1:-/var/tmp/h-pflush-raw}; mkdir -p "$d"; f=$d/raw.dat
[ -f "$f" ] || fio --name=lay --filename=$f --rw=write --bs=1m --size=512m --direct=1 --output-format=terse >/dev/null 2>&1
for qd in 1 4; do
  fio --name=raw --filename=$f --rw=read --bs=128k --direct=1 --ioengine=libaio --iodepth=$qd --size=512m --output-format=terse 2>/dev/null | awk -F';' -v q=$qd '{printf "raw O_DIRECT read 128k qd%s: %d MB/s\n", q, $7/1000}'
done
fio --name=raw --filename=$f --rw=write --bs=128k --direct=1 --ioengine=psync --size=256m --output-format=terse 2>/dev/null | awk -F';' '{printf "raw O_DIRECT write 128k: %d MB/s\n", $48/1000}'
fio --name=raw --filename=$f --rw=write --bs=128k --direct=1 --ioengine=psync --fdatasync=1 --size=64m --output-format=terse 2>/dev/null | awk -F';' '{printf "raw O_DIRECT write 128k + fdatasync each: %d MB/s\n", $48/1000}'
