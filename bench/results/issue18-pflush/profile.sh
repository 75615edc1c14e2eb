#!/bin/bash
# Where the mount server's CPU goes while 512 MiB are written through a
# hybrid posix mount and fsynced once (fio, 128 KiB writes): perf record of
# the server process for the whole job, then perf report by symbol.
# Usage: profile.sh INKFS_BIN OUT.txt
set -u
bin=$1; out=$2
p=/dev/shm/h-pflush-prof.pool; d=/var/tmp/h-pflush-prof.data; m=/mnt/h-pflush-prof
rm -f $p $d; mkdir -p $m; truncate -s 2G $p; fallocate -l 2G $d
$bin mkfs $p --data $d --data-size 2G >/dev/null
$bin mount -o mode=posix $p $m || exit 1
pid=$(pgrep -n -f "inkfs.real mount -o mode=posix $p|inkfs mount -o mode=posix $p")
perf record -q -g -o /tmp/h-pflush-prof.data -p "$pid" -- sleep 30 >/dev/null 2>&1 &
rec=$!
sleep 0.5
fio --name=w --directory=$m --rw=write --bs=128k --size=512m --end_fsync=1 --fallocate=none --ioengine=psync --output-format=terse 2>/dev/null | awk -F';' '{printf "fio: %d MB/s\n", $48/1000}' > "$out"
kill -INT $rec; wait $rec 2>/dev/null
$bin stat $m | grep -E "^data device: (bytes written|flushes)" >> "$out"
umount $m; rm -f $p $d
perf report -i /tmp/h-pflush-prof.data --no-children --sort symbol --stdio 2>/dev/null | grep -E "^ +[0-9]" | head -30 >> "$out"
rm -f /tmp/h-pflush-prof.data
