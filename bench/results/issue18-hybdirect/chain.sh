#!/bin/bash
# The runs: the write rows and the read rows the write change touches
# (a1..a4: step 1, the direct device writes, N=/tmp/hybdirect-new1 at
# 1f248e5), then with step 2 (the round run by a request thread,
# N=/tmp/hybdirect-new2): s2a1, s2a2 (same rows) and s2b1, s2b2 (the
# fsync-heavy rows); builds swapped between slots in the runs whose name
# ends in 2, 4 or 6; b1 (the fsync rows) with N=/tmp/hybdirect-new1 last.
# M: main's at 969255e (/tmp/stop32-base-release).
# The workload driver is stop 31's main build's (run.sh).
here=$(cd "$(dirname "$0")" && pwd)
N=${N:-/tmp/hybdirect-new1} M=${M:-/tmp/stop32-base-release}
c=ext4-disk,inkfs-hybrid-posix,base.inkfs-hybrid-posix
a=fio:seqwrite128k-endfsync-big-1j+seqwrite128k-fsync-1j+seqread128k-1j
b=fio:randwrite-fsync-1j+seqwrite-fdatasync-1j,filebench:varmail
for r in ${RUNS:-a1 a2 a3 a4 b1 b2 b3 b4}; do
  case $r in *a[0-9]) only=$a;; *b[0-9]) only=$b;; esac
  case $r in *2|*4|*6) NEW=$M BASE=$N;; *) NEW=$N BASE=$M;; esac
  NEW=$NEW BASE=$BASE "$here/run.sh" "$here/$r" "$only" "$c"
done
