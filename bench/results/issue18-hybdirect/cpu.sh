#!/bin/bash
# Server CPU (utime+stime, ticks of 10 ms) for 512 MiB written with dd
# (1 MiB blocks) + fsync through a hybrid posix mount, per build.
B=$1; P=/dev/shm/hybdirect-cpu.pool; D=/var/tmp/hybdirect-cpu.data; M=/tmp/hybdirect-cpumnt
rm -f $P $D; mkdir -p $M
$B mkfs -s 256M --data $D --data-size 1G $P >/dev/null || exit 1
$B mount $P $M -o mode=posix || exit 1
pid=$(pgrep -f "mount $P $M" | head -1)
cpu() { for t in /proc/$pid/task/*; do c=$(cat $t/comm); [ "$c" = inkfs-populate ] && continue; awk '{print $14+$15}' $t/stat; done | paste -sd+ | bc; }
pop() { for t in /proc/$pid/task/*; do [ "$(cat $t/comm)" = inkfs-populate ] && awk '{print $14+$15}' $t/stat; done; }
t0=$(cpu)
s=$(date +%s.%N)
dd if=/dev/zero of=$M/f bs=1M count=512 conv=fsync 2>/dev/null
e=$(date +%s.%N)
t1=$(cpu); p1=$(pop)
st=$($B stat $M --json | tr ',' '\n' | grep -E '"data_direct_bytes"' | cut -d: -f2)
echo "$(basename $(dirname $B)) server_cpu_ticks_no_populate=$((t1-t0)) populate_ticks_so_far=${p1:-done} wall=$(echo "$e - $s" | bc) direct_bytes=${st:-none} load=$(cut -d' ' -f1 /proc/loadavg)"
fusermount3 -u $M; sleep 0.3; rm -f $P $D
