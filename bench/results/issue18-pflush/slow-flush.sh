#!/bin/bash
# A/B runs as if the disk's flush took 3 ms (as it did in the h/hybrid2
# runs), on both sides, in an hour when this disk's flush is fast: both
# builds are the measurement-only build of h/pflush-wip with
# INKFS_EXPERIMENT_FLUSH_DELAY_US=3000 (a sleep after each device
# fdatasync); the base side flushes before each posix append's commit
# (main's rule), the tested side as set by its wrapper:
#   slow-flush.sh OUT ONLY CONTENDERS noflush   -> INKFS_EXPERIMENT_NOFLUSH=1
#   slow-flush.sh OUT ONLY CONTENDERS big       -> 16 MiB requests (sysctl raised)
#   slow-flush.sh OUT ONLY CONTENDERS defer     -> INKFS_EXPERIMENT_DEFER=1 and NOFLUSH=1
#                                                  (/tmp/h-pflush-deferslow: the wip head's build)
# ext4-disk has no delay: its ratios to inkfs are not comparable here.
set -u
out=$1; only=$2; contenders=$3; what=$4
mkdir -p /tmp/h-pflush-slowbig
cp /tmp/h-pflush-slow/inkbench-work /tmp/h-pflush-slow/libinkfs_preload.so /tmp/h-pflush-slowbig/
printf '#!/bin/sh\nINKFS_EXPERIMENT_FLUSH_DELAY_US=3000 INKFS_EXPERIMENT_MAX_WRITE=16777216 exec /tmp/h-pflush-slow/inkfs.real "$@"\n' > /tmp/h-pflush-slowbig/inkfs
chmod +x /tmp/h-pflush-slowbig/inkfs
here=$(cd "$(dirname "$0")" && pwd)
case $what in
  noflush) BIN=/tmp/h-pflush-slow/inkfs BASE=/tmp/h-pflush-slowbase "$here/run.sh" "$out" "$only" "$contenders" ;;
  defer) BIN=/tmp/h-pflush-deferslow/inkfs BASE=/tmp/h-pflush-slowbase "$here/run.sh" "$out" "$only" "$contenders" ;;
  big) old=$(cat /proc/sys/fs/fuse/max_pages_limit); echo 4096 > /proc/sys/fs/fuse/max_pages_limit
       BIN=/tmp/h-pflush-slowbig/inkfs BASE=/tmp/h-pflush-slowbase "$here/run.sh" "$out" "$only" "$contenders"
       echo "$old" > /proc/sys/fs/fuse/max_pages_limit ;;
esac
