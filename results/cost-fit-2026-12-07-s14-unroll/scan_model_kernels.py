"""Today's model kernels: rolled loops whose body has a guarded vector load (serialised by the carried destination),
and rolled loops the unrolling rule would group (walk bytes in flight with the rule off vs on).

    PYTHONPATH=$PWD python results/cost-fit-2026-12-07-s14-unroll/scan_model_kernels.py > scan_model_kernels.txt
"""
import sys
sys.path.insert(0, "scripts")
import gpu_models
from stitchtune.deploy.model_tuning import capture_regions
from stitchtune.deploy.selection import heuristic_schedule
from stitchtune.lower.entry import lower
from stitchtune.lower.resources import legal_space
from stitchtune.plan.planner import make_plan
from stitchtune.hardware.device import get_device
from stitchtune.cost import walk_loops
from stitchtune.cost.features import kernel_walk
from stitchtune.ir import kir
dev = get_device("h200")

def guarded_in_rolled(stmts, inside=False):
    """Guarded vector loads whose innermost enclosing loop is rolled (an unrolled loop renames the destinations)."""
    n = 0
    for s in stmts:
        if isinstance(s, kir.For):
            n += guarded_in_rolled(s.body, not s.unroll)
        elif isinstance(s, kir.If):
            n += guarded_in_rolled(s.then, inside) + guarded_in_rolled(s.orelse, inside)
        elif isinstance(s, kir.LoadVec) and s.pred is not None and inside:
            n += 1
    return n

seen = set()
for model in ("bert", "gpt2", "llama"):
    m, args = gpu_models._medium(model)
    for call in ("inference", "train"):
        for reg in capture_regions(m, args, call):
            key = reg.graph.workload_key()
            if key in seen:
                continue
            seen.add(key)
            plan = make_plan(reg.graph); space = legal_space(reg.graph, plan, dev)
            prog = lower(reg.graph, plan, heuristic_schedule(plan, dev, space), dev, space)
            for l in prog.launches:
                k = prog.kernel(l.kernel)
                g = guarded_in_rolled(k.body)
                walk_loops.UNROLL_ROLLED = False
                off = kernel_walk(k, l.grid).base
                walk_loops.UNROLL_ROLLED = True
                on = kernel_walk(k, l.grid).base
                if g or abs(off.bytes_in_flight_per_thread - on.bytes_in_flight_per_thread) > 1e-9:
                    print(f"{model} {call} {reg.name} {k.name} grid {l.grid}: guarded vector loads in rolled loops {g}; "
                          f"walk B/thread off {off.bytes_in_flight_per_thread:.0f} on {on.bytes_in_flight_per_thread:.0f}, "
                          f"load_rounds {off.load_rounds:.0f} -> {on.load_rounds:.0f}, task_trips {on.task_trips:.1f}", flush=True)
print("workloads", len(seen))
