#!/bin/bash
# varmail under the library with the ask on, REPS times on one fresh hybrid
# pool served by build DIR; prints failures, frees refused, read-only.
DIR=$1; TAG=$2; REPS=${3:-5}
P=/dev/shm/hybask-vm-$TAG.pool; D=/var/tmp/hybask-vm-$TAG.data; M=/tmp/hybask-vm-$TAG
mkdir -p $M
$DIR/inkfs mkfs $P --size 2G --data $D --data-size 2G --force >/dev/null || exit 1
$DIR/inkfs mount $P $M -o mode=strict || exit 1
fails=0
for i in $(seq 1 $REPS); do
  mkdir -p $M/fb-$i 2>/dev/null
  LD_PRELOAD=$DIR/libinkfs_preload.so INKFS_PRELOAD_DIR_LEASE=1 /tmp/hybask-prof/inkbench-work filebench --dir $M/fb-$i --personality varmail --seed $i --nfiles 200 --dirwidth 1000000 --filesize 16384 --threads 16 --iosize 1048576 --appendsize 16384 --prealloc 80 --seconds 1.0 > /tmp/hybask-vm-$TAG.out 2>&1 || { fails=$((fails+1)); tail -c 300 /tmp/hybask-vm-$TAG.out; echo; }
done
echo "$TAG: $fails/$REPS failed; $($DIR/inkfs stat $M | grep -E 'frees refused|read-only:' | tr -s ' ' | tr '\n' ';')"
fusermount3 -u $M; rm -f $P $D /tmp/hybask-vm-$TAG.out
