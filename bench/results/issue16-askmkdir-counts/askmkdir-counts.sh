#!/bin/bash
# usage: askmkdir-counts.sh INKFS_BIN LIB MNT DIRNAME ASK TARFILE
# One untar of TARFILE into MNT/DIRNAME, then one rm -rf of it, both under
# LIB with INKFS_PRELOAD_DIR_LEASE=ASK: the server's counter deltas and the
# wall time of each (counts only: not a timing).
B=$1; LIB=$2; M=$3; D=$4; ASK=$5; TAR=$6
snap() { $B stat --json $M > $1; }
delta() {
python3 - "$@" <<'PY'
import json,sys
a=json.load(open(sys.argv[1])); b=json.load(open(sys.argv[2]))
def flat(d,p=''):
    out={}
    for k,v in d.items():
        if isinstance(v,dict): out.update(flat(v,p+k+'.'))
        elif isinstance(v,(int,float)): out[p+k]=v
    return out
fa,fb=flat(a),flat(b)
keys=['dir_leases_granted','dir_leases_recalled','dir_leases_refused_no_lane','dir_leases_refused_held','lanes_leased','lanes_reaped','lane_unlinks','ops.client_create.count','ops.client_mkdir.count','ops.client_unlink.count','ops.client_rmdir.count','ops.client_setattr.count','frees_refused','lane_removals_refused']
print(sys.argv[3], ' '.join(f"{k.replace('ops.client_','ring_').replace('.count','').replace('dir_leases_','')}={fb.get(k,0)-fa.get(k,0)}" for k in keys), f"wall={float(sys.argv[5])-float(sys.argv[4]):.3f}s")
PY
}
mkdir $M/$D
snap /tmp/askmkdir-s0.json; s=$(date +%s.%N)
INKFS_PRELOAD_DIR_LEASE=$ASK LD_PRELOAD=$LIB tar -xf $TAR -C $M/$D
e=$(date +%s.%N); snap /tmp/askmkdir-s1.json
delta /tmp/askmkdir-s0.json /tmp/askmkdir-s1.json untar $s $e
s=$(date +%s.%N)
INKFS_PRELOAD_DIR_LEASE=$ASK LD_PRELOAD=$LIB rm -rf $M/$D
e=$(date +%s.%N); snap /tmp/askmkdir-s2.json
delta /tmp/askmkdir-s1.json /tmp/askmkdir-s2.json rm-rf $s $e
