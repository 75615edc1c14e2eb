#!/bin/bash
# run.sh with BIN=/tmp/h-pflush-exp2/inkfs (main + INKFS_EXPERIMENT_MAX_WRITE=16 MiB)
# while fs.fuse.max_pages_limit is 4096 (the kernel's cap on a request,
# 256 pages by default); restored after. Only connections that ask for more
# than 1 MiB are affected by the raised cap.
old=$(cat /proc/sys/fs/fuse/max_pages_limit)
echo 4096 > /proc/sys/fs/fuse/max_pages_limit
BIN=/tmp/h-pflush-exp2/inkfs "$(dirname "$0")/run.sh" "$@"
echo "$old" > /proc/sys/fs/fuse/max_pages_limit
