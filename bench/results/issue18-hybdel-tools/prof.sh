#!/bin/bash
# prof.sh BINDIR TAG hybrid|pm : perf record of the unlink phase (1000 empty files x rounds)
B=$1; TAG=$2; KIND=$3; N=${4:-1000}; R=${5:-5}
P=/dev/shm/h-hybdel-$TAG.pool; D=/var/tmp/h-hybdel-$TAG.data; M=/tmp/h-hybdel-mnt-$TAG
mkdir -p $M
if [ $KIND = hybrid ]; then $B/inkfs mkfs $P --size 1G --data $D --data-size 1G --force >/dev/null || exit 1
else $B/inkfs mkfs $P --size 1G --force >/dev/null || exit 1; fi
$B/inkfs mount $P $M -o mode=strict || exit 1
rm -f /tmp/h-hybdel-work/ctl-$TAG; mkfifo /tmp/h-hybdel-work/ctl-$TAG
PERF_CTL=/tmp/h-hybdel-work/ctl-$TAG LD_PRELOAD=$B/libinkfs_preload.so INKFS_PRELOAD_DIR_LEASE=1 \
  perf record -F 20000 -g -D -1 --control fifo:/tmp/h-hybdel-work/ctl-$TAG -o /tmp/h-hybdel-work/perf-$TAG.data \
  /tmp/h-hybdel-work/loop $M/d $N 0 $R
$B/inkfs stat $M | grep -E 'frees refused|slot|orphan|unlinks'
fusermount3 -u $M; $B/inkfs fsck $P | tail -2; rm -f $P $D
