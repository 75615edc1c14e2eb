#!/bin/bash
# Exit give-back A/B on one strict mount (the server: this branch's).
B=/tmp/askon-new-release
P=/dev/shm/askon-exit.pool; M=/tmp/askon-exit-mnt
truncate -s 512M $P && $B/inkfs mkfs $P >/dev/null && mkdir -p $M && $B/inkfs mount $P $M -o mode=strict || exit 1
echo "load before $(cut -d' ' -f1-3 /proc/loadavg)"
python3 /tmp/askon-exit.py $M $B/libinkfs_preload.so /tmp/stop32-base-release/libinkfs_preload.so 30
echo "load after $(cut -d' ' -f1-3 /proc/loadavg)"
$B/inkfs stat $M | grep -E "lanes reaped|frees refused|directory leases held"
fusermount3 -u $M; $B/inkfs fsck $P | tail -1; rm -f $P
