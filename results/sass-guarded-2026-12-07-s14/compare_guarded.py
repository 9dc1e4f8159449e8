"""Run from the repository root: PYTHONPATH=$PWD python results/sass-guarded-2026-12-07-s14/compare_guarded.py examples|models > FILE.
sm_90 SASS of every example's heuristic program (or the model workloads), renderer with and without fresh guarded loads."""
import sys, glob, tempfile
from stitchtune.gpu import render as R
from stitchtune.gpu.build import NvccBuilder
from stitchtune.gpu.sass import read_cubin
from stitchtune.deploy.selection import heuristic_schedule
from stitchtune.lower.entry import lower
from stitchtune.lower.resources import legal_space
from stitchtune.plan.planner import make_plan
from stitchtune.hardware.device import get_device
dev = get_device("h200")
fresh = R._Renderer._load_vec_fresh
def old(self, s, ind): self._load_vec(s, ind)
def progs():
    if sys.argv[1] == "examples":
        from stitchtune.graph.parse import load_graph
        for f in sorted(glob.glob("examples/*.json")):
            yield f.split("/")[-1][:-5], load_graph(f)
    else:
        sys.path.insert(0, "scripts"); import gpu_models
        from stitchtune.deploy.model_tuning import capture_regions
        seen = set()
        for model in ("bert", "gpt2", "llama"):
            m, args = gpu_models._medium(model)
            for call in ("inference", "train"):
                for reg in capture_regions(m, args, call):
                    key = reg.graph.workload_key()
                    if key in seen: continue
                    seen.add(key); yield f"{model}-{call}-{reg.name}", reg.graph
b = NvccBuilder(jobs=2, cache_dir=tempfile.mkdtemp())
for name, g in progs():
    plan = make_plan(g); space = legal_space(g, plan, dev)
    prog = lower(g, plan, heuristic_schedule(plan, dev, space), dev, space)
    R._Renderer._load_vec_fresh = old; s0 = R.render(prog)
    R._Renderer._load_vec_fresh = fresh; s1 = R.render(prog)
    if s0 == s1: continue
    r0, r1 = b.build([s0, s1], "sm_90")
    if r0.status != "ok" or r1.status != "ok":
        print(name, "BUILD", r0.status, r1.status, (r1.error or "")[:300], flush=True); continue
    m0, m1 = read_cubin(r0.cubin_path), read_cubin(r1.cubin_path)
    for k in m0:
        a, c = m0[k], m1[k]
        key = lambda m: (m.registers, m.max_loads_in_flight, m.max_bytes_in_flight, m.instructions, m.spills, sum(m.ldg.values()))
        flag = "SAME" if key(a) == key(c) else ("BETTER" if c.max_bytes_in_flight > a.max_bytes_in_flight else ("WORSE" if (c.max_bytes_in_flight < a.max_bytes_in_flight or c.registers > a.registers or c.spills > a.spills) else "DIFF"))
        print(f"{name} {k}: regs {a.registers}->{c.registers} loads_in_flight {a.max_loads_in_flight}->{c.max_loads_in_flight} B_in_flight {a.max_bytes_in_flight}->{c.max_bytes_in_flight} instr {a.instructions}->{c.instructions} spills {a.spills}->{c.spills} {flag}", flush=True)
print("done")
