#!/bin/bash
# The four runs of the final build (/tmp/h-pflush3-new) against main's
# (/tmp/h-pflush2-base), each pair with the builds swapped between slots.
here=$(cd "$(dirname "$0")" && pwd)
big=fio:seqwrite128k-endfsync-big-1j+seqwrite128k-fsync-1j
heavy=sqlite:WAL,rocksdb:sync1,fio:randwrite-fsync-1j+seqwrite-fdatasync-1j,filebench:varmail
c=ext4-disk,inkfs-hybrid-posix,base.inkfs-hybrid-posix
NEW=/tmp/h-pflush3-new BASE=/tmp/h-pflush2-base "$here/run.sh" "$here/a3" $big $c
NEW=/tmp/h-pflush2-base BASE=/tmp/h-pflush3-new "$here/run.sh" "$here/a4" $big $c
NEW=/tmp/h-pflush3-new BASE=/tmp/h-pflush2-base "$here/run.sh" "$here/b3" $heavy $c
NEW=/tmp/h-pflush2-base BASE=/tmp/h-pflush3-new "$here/run.sh" "$here/b4" $heavy $c
