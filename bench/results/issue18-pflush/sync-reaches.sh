#!/bin/bash
# Does sync(2) / syncfs(2) give a FUSE server a durability point? With the
# measurement-only no-flush build (write-backs answered with no device
# flush, FSYNC served), count the device flushes the server issues after
# writing 64 MiB, after `sync`, after `sync -f` (syncfs) and after an
# fsync of the file. Not a timing.
set -u
bin=${1:-/tmp/h-pflush-exp/inkfs}
p=/dev/shm/h-pflush-sync.pool; d=/var/tmp/h-pflush-sync.data; m=/mnt/h-pflush-sync
rm -f $p $d; mkdir -p $m; truncate -s 1G $p; fallocate -l 1G $d
$bin mkfs $p --data $d --data-size 1G >/dev/null
$bin mount -o mode=posix $p $m || exit 1
flushes() { $bin stat $m | grep -E "^data device: flushes issued" | awk '{print $5}'; }
written() { $bin stat $m | grep -E '^data device: bytes written' | awk '{print $5}'; }
# The file stays open (a close writes its dirty pages back): 64 MiB in
# the page cache, then sync, syncfs and fsync in turn.
python3 - "$m/f" <<PY
import os, subprocess, sys
def report(what):
    print(f"{what}: " + subprocess.run(["sh", "-c", "$bin stat $m | grep -E '^data device: (bytes written|flushes issued)' | awk '{print \$4, \$5}' | tr '\\n' ' '"], capture_output=True, text=True).stdout)
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o644)
buf = os.urandom(1 << 20)
for _ in range(64):
    os.write(fd, buf)
report("after 64 MiB written (file open)")
os.sync(); report("after sync(2)")
subprocess.run(["sync", "-f", sys.argv[1]]); report("after syncfs(2) (sync -f)")
os.fsync(fd); report("after fsync(2)")
os.close(fd)
PY
umount $m; rm -f $p $d
