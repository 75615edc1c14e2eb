import sys, types
sys.path.insert(0, '/work/h-askmkdir/bench')
from inkbench.workloads import Meta
ctx = types.SimpleNamespace(p={"tree_files": 2000}, work="/tmp/askmkdir-work")
m = Meta.__new__(Meta)
m.ctx = ctx; m.repo = "/work/h-askmkdir"; m.tar = "/tmp/askmkdir-work/tree.tar"; m.tree_info = {}
m.prepare()
print(m.tree_info)
