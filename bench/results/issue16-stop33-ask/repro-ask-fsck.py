# Stop 33: a single-threaded reproduction of the ask-on books fault.
# Usage (strict mount at MNT, fresh 1 GiB pool, server run with `inkfs mount -f`):
#   LD_PRELOAD=target/release/libinkfs_preload.so INKFS_PRELOAD_DIR_LEASE=1 \
#     python3 repro-ask-fsck.py MNT 40 4096
# then unmount and `inkfs fsck POOL`: 2 errors (a log-chunk block on the
# free lists with no log head in it; 2 blocks neither used nor free).
# With 4 directories instead of 40, or 0-byte files: fsck clean.
import os, sys
d = sys.argv[1]; ndirs = int(sys.argv[2]); size = int(sys.argv[3])
for k in range(ndirs): os.mkdir(f'{d}/d{k}')
for r in range(8):
    for k in range(ndirs):
        for j in range(6):
            p = f'{d}/d{k}/f{r}-{j}'
            fd = os.open(p, os.O_CREAT | os.O_WRONLY, 0o644); os.write(fd, b'x' * size); os.close(fd)
        if r > 0:
            for j in range(6): os.unlink(f'{d}/d{k}/f{r-1}-{j}')
