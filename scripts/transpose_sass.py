"""Global store and load widths in the sm_90 SASS of a transposed copy, untiled and tiled (issue 39).

For each example graph given (default: ``examples/k_transpose.json``, BERT's K^T copy) this lowers the
heuristic schedule (the tiled transpose where the plan has one) and the same schedule with
``transpose=0`` for the H200 preset, builds each with nvcc for sm_90 (``-cubin -O3``) and counts the
``LDG`` / ``STG`` / ``LDS`` / ``STS`` instructions by width in ``cuobjdump -sass`` (pip
``nvidia-cuda-cuobjdump``; found on PATH or in the pip package), with the emulated 32-byte sectors
per store request of the small example (:mod:`stitchtune.emulate.sectors`). No GPU is needed.

    python scripts/transpose_sass.py [graph.json ...]
"""

from __future__ import annotations

import collections
import dataclasses
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _cuobjdump() -> str:
    found = shutil.which("cuobjdump")
    if found:
        return found
    import nvidia  # the pip packages' namespace
    for base in nvidia.__path__:
        for cand in Path(base).glob("*/bin/cuobjdump"):
            return str(cand)
    raise SystemExit("cuobjdump not found: pip install nvidia-cuda-cuobjdump")


def sass_counts(src: str) -> dict[str, int]:
    """``{"STG.E.128": n, ...}``: the memory instructions of the cubin of ``src`` by opcode and width."""
    with tempfile.TemporaryDirectory() as tmp:
        cu, cubin = Path(tmp) / "k.cu", Path(tmp) / "k.cubin"
        cu.write_text(src)
        subprocess.run(["nvcc", "-cubin", "-O3", "-arch=sm_90", "-o", str(cubin), str(cu)], check=True, timeout=300)
        sass = subprocess.run([_cuobjdump(), "-sass", str(cubin)], check=True, capture_output=True, text=True,
                              timeout=120).stdout
    ops = re.findall(r"\b((?:LDG|STG|LDS|STS)(?:\.[A-Z0-9]+)*)\b", sass)
    return dict(sorted(collections.Counter(ops).items()))


def main(paths: list[str]) -> None:
    from stitchtune.cost.heuristic import heuristic_schedule
    from stitchtune.cost.model import predict
    from stitchtune.emulate.emulator import emulate_program
    from stitchtune.emulate.sectors import count_sectors
    from stitchtune.gpu.render import render
    from stitchtune.graph.parse import load_graph
    from stitchtune.graph.reference import random_inputs
    from stitchtune.hardware.device import get_device
    from stitchtune.lower.entry import lower
    from stitchtune.lower.resources import legal_space
    from stitchtune.space.options import TRANSPOSE
    from stitchtune.plan.planner import make_plan

    dev = get_device("h200")
    for path in paths or [str(ROOT / "examples" / "k_transpose.json")]:
        g = load_graph(path)
        plan = make_plan(g)
        space = legal_space(g, plan, dev)
        s = heuristic_schedule(plan, dev, space)
        small = Path(path).with_name(Path(path).stem + "_small.json")
        for x in (dataclasses.replace(s, transpose=0), s):
            prog = lower(g, plan, x, dev, space)
            line = (f"{Path(path).name} {x.to_json()}\n  predicted {predict(prog.profile, dev).time_us:.1f} us "
                    f"(cost model, not measured); SASS {sass_counts(render(prog))}")
            if small.exists():
                gs = load_graph(small)
                ps = make_plan(gs)
                sps = legal_space(gs, ps, dev)
                xs = dataclasses.replace(heuristic_schedule(ps, dev, sps), transpose=x.option(TRANSPOSE))
                if not sps.violations(xs):
                    trace: list = []
                    emulate_program(lower(gs, ps, xs, dev, sps), random_inputs(gs, 0), trace=trace)
                    line += (f"\n  emulated ({small.name}): store sectors / ideal "
                             f"{count_sectors(trace, op='store').ratio:.2f}, load {count_sectors(trace, op='load').ratio:.2f}")
            print(line)


if __name__ == "__main__":
    main(sys.argv[1:])
