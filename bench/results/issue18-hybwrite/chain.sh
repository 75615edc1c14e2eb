#!/bin/bash
# The runs: the write rows and the read rows the write change touches
# (a1..a4), then the fsync-heavy rows (b1..b4); builds swapped between
# slots in a2, a4, b2, b4. N: h/hybwrite's release build (/tmp/hybwrite-new1);
# M: main's at 28b387f (/tmp/stop31-base-release).
here=$(cd "$(dirname "$0")" && pwd)
N=${N:-/tmp/hybwrite-new1} M=${M:-/tmp/stop31-base-release}
c=ext4-disk,inkfs-hybrid-posix,base.inkfs-hybrid-posix
a=fio:seqwrite128k-endfsync-big-1j+seqwrite128k-fsync-1j+seqread128k-1j
b=fio:randwrite-fsync-1j+seqwrite-fdatasync-1j,filebench:varmail
for r in ${RUNS:-a1 a2 a3 a4 b1 b2 b3 b4}; do
  case $r in a*) only=$a;; b*) only=$b;; esac
  case $r in *2|*4) NEW=$M BASE=$N;; *) NEW=$N BASE=$M;; esac
  NEW=$NEW BASE=$BASE "$here/run.sh" "$here/$r" "$only" "$c"
done
