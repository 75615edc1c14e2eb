#!/bin/bash
# Device flushes and FUSE write sizes for 512 MiB written through a hybrid
# posix mount with one fsync at the end (fio's seqwrite128k-endfsync-big
# job), for each inkfs binary given (a path, or a wrapper setting the
# experiment's environment). Not a timing: counts from `inkfs stat`.
set -u
for bin in "$@"; do
  p=/dev/shm/h-pflush-count.pool; d=/var/tmp/h-pflush-count.data; m=/mnt/h-pflush-count
  rm -f $p $d; mkdir -p $m
  truncate -s 2G $p; fallocate -l 2G $d
  $bin mkfs $p --data $d --data-size 2G >/dev/null
  $bin mount -o mode=posix $p $m || exit 1
  fio --name=w --directory=$m --rw=write --bs=128k --size=512m --end_fsync=1 --fallocate=none --ioengine=psync --output-format=terse >/dev/null 2>&1
  echo "== $bin"
  $bin stat $m 2>&1 | grep -E "^data device: (bytes written|flushes)|^fuse: write|requests: write" 
  umount $m; rm -f $p $d
done
