#!/bin/bash
# usage: kopen-counts.sh BIN_DIR OPTS ; op counts per step (fresh pool each)
set -e
B=$1/inkfs; W=$1/inkbench-work
P=/dev/shm/kopen-c.pool; M=/tmp/kopen-cm
mkdir -p $M
fresh() { fusermount3 -u $M 2>/dev/null || true; rm -f $P; $B mkfs $P --size 1G >/dev/null; $B mount $P $M -o "$1"; }
ops() { $B stat $M --json | python3 -c "
import json,sys; d=json.load(sys.stdin)['ops']; c={k:v['count'] for k,v in d.items() if v['count']}
print(sum(c.values()), 'getxattr=%d' % c.get('getxattr',0), 'getattr=%d' % c.get('getattr',0), c)"; }
fresh "$2"
tar xf /tmp/kopen-src.tar -C $M
echo "untar: $(ops)"
(cd $M && git init -q . && git add -A && git -c user.email=a@b -c user.name=n commit -qm x) >/dev/null
echo "+git add/commit: $(ops)"
(cd $M && git status --porcelain >/dev/null)
echo "+git status: $(ops)"
rm -rf $M/crates $M/docs $M/bench $M/tests
echo "+rm: $(ops)"
for p in fileserver webproxy varmail; do
  fresh "$2"; mkdir $M/fb
  $W filebench --dir $M/fb --personality $p --nfiles 500 --threads 8 --seconds 1 > /tmp/kopen-fb.out 2>&1 || { cat /tmp/kopen-fb.out; }
  echo "$p: $(tail -1 /tmp/kopen-fb.out | cut -c1-120) :: $(ops)"
done
fusermount3 -u $M; rm -f $P
