#!/bin/bash
# Device flushes for 512 MiB written through a hybrid posix mount with one
# fsync at the end (fio 128 KiB writes), for each inkfs binary given; the
# deferred-commit counters where the build has them. Counts, not timings.
set -u
for bin in "$@"; do
  p=/dev/shm/h-pflush-count.pool; d=/var/tmp/h-pflush-count.data; m=/mnt/h-pflush-count
  rm -f $p $d; mkdir -p $m
  truncate -s 2G $p; fallocate -l 2G $d
  $bin mkfs $p --data $d --data-size 2G >/dev/null
  $bin mount -o mode=posix $p $m || exit 1
  fio --name=w --directory=$m --rw=write --bs=128k --size=512m --end_fsync=1 --fallocate=none --ioengine=psync --output-format=terse >/dev/null 2>&1
  echo "== $bin"
  $bin stat $m 2>&1 | grep -iE "^data device: (bytes written|flushes|write-backs|shared|deferred)|^(write|setattr) "
  umount $m; rm -f $p $d
done
