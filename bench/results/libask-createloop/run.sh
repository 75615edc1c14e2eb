#!/bin/sh
# Interleaved: creates per second in a fresh directory, the library's ask on (1) and off (0), order swapped each round.
B=/work/h-libask/target/release
P=/dev/shm/libask-ab.pool; M=/tmp/libask-ab/mnt
mkdir -p $M; rm -f $P
$B/inkfs mkfs $P --size 1G >/dev/null
$B/inkfs mount $P $M -f -o mode=strict 2> /tmp/libask-ab/srv.log &
sleep 1
echo "start $(date -u +%H:%M:%S) $(uptime)"
for r in 1 2 3 4 5 6; do
  if [ $((r % 2)) -eq 1 ]; then order="1 0"; else order="0 1"; fi
  for a in $order; do
    us=$(INKFS_PRELOAD_DIR_LEASE=$a LD_PRELOAD=$B/libinkfs_preload.so python3 /tmp/libask-ab/loop.py $M/r$r-a$a 2000)
    echo "round $r ask=$a us_per_create=$us"
  done
done
echo "end $(date -u +%H:%M:%S) $(uptime)"
$B/inkfs stat --json $M | python3 -c "import json,sys; r=json.load(sys.stdin); print({k: r[k] for k in ('dir_leases_granted','dir_leases_recalled','lanes_leased','lanes_reaped')}, 'client_create', r['ops']['client_create']['count'])"
fusermount3 -u $M; sleep 1
$B/inkfs fsck $P | tail -1
echo "server stderr lines: $(wc -l < /tmp/libask-ab/srv.log)"; head -3 /tmp/libask-ab/srv.log
rm -f $P
