#!/bin/bash
# usage: askattr-untar.sh INKFS_BIN LIB MNT DIRNAME ASK  -> counter deltas for one untar
B=$1; LIB=$2; M=$3; D=$4; ASK=$5
$B stat --json $M > /tmp/askattr-s0.json
mkdir $M/$D
s=$(date +%s.%N)
INKFS_PRELOAD_DIR_LEASE=$ASK LD_PRELOAD=$LIB tar -xf ${TARFILE:-/tmp/askattr-tree.tar} -C $M/$D
e=$(date +%s.%N)
$B stat --json $M > /tmp/askattr-s1.json
python3 - $s $e <<'PY'
import json,sys
a=json.load(open('/tmp/askattr-s0.json')); b=json.load(open('/tmp/askattr-s1.json'))
def flat(d,p=''):
    out={}
    for k,v in d.items():
        if isinstance(v,dict): out.update(flat(v,p+k+'.'))
        elif isinstance(v,(int,float)): out[p+k]=v
    return out
fa,fb=flat(a),flat(b)
keys=["dir_leases_refused_no_lane",'dir_leases_granted','dir_leases_recalled','dir_leases_refused_held','lanes_leased','lanes_reaped','ops.client_create.count','ops.client_mkdir.count','ops.client_setattr.count','frees_refused']
print(' '.join(f"{k.replace('ops.','').replace('.count','')}={fb.get(k,0)-fa.get(k,0)}" for k in keys), f"wall={float(sys.argv[2])-float(sys.argv[1]):.3f}s")
PY
