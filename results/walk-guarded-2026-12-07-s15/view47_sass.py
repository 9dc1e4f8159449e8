"""BERT train view_47 (erf GELU backward + column sum, 4096 x 3072) in sm_90 SASS at several register caps.

    PYTHONPATH=$PWD python results/walk-guarded-2026-12-07-s15/view47_sass.py [--out /tmp/v47]

Lowers the region (tests/lower/test_col_row_guard.py's graph) with the heuristic schedule and with min_blocks 4, 2
and 0, renders it with today's code generator, compiles each (the builder's nvcc flags) and prints the registers,
the most loads / bytes one thread has pending and the spill instructions (stitchtune.gpu.sass). Nothing is timed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from helpers.lowering import DEV  # noqa: E402
from lower.test_col_row_guard import erf_gelu_backward_colsum  # noqa: E402
from stitchtune.cost.heuristic import heuristic_schedule  # noqa: E402
from stitchtune.gpu.build import NvccBuilder  # noqa: E402
from stitchtune.gpu.render import render  # noqa: E402
from stitchtune.gpu.sass import compiled_facts, read_cubin  # noqa: E402
from stitchtune.lower.entry import CODEGEN_VERSION, lower  # noqa: E402
from stitchtune.lower.resources import legal_space  # noqa: E402
from stitchtune.plan.planner import make_plan  # noqa: E402
from stitchtune.space import Schedule  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="write each rendered source here")
    a = ap.parse_args()
    g = erf_gelu_backward_colsum(4096, 3072)
    plan = make_plan(g)
    space = legal_space(g, plan, DEV)
    h = heuristic_schedule(plan, DEV, space)
    print(f"codegen {CODEGEN_VERSION}; heuristic {h.to_json()}")
    builder = NvccBuilder()
    for mb in (h.min_blocks, 4, 2, 0):
        s = Schedule.from_dict({**h.to_dict(), "min_blocks": mb})
        src = render(lower(g, plan, s, DEV, space))
        if a.out:
            a.out.mkdir(parents=True, exist_ok=True)
            (a.out / f"view47_mb{mb}.cu").write_text(src)
        (res,) = builder.build([src])
        for k, m in read_cubin(res.cubin_path).items():
            f = compiled_facts(m)
            print(f"min_blocks {mb}: {k} {f.registers} registers, {f.loads_in_flight:.0f} loads / "
                  f"{f.bytes_in_flight:.0f} B in flight per thread, {f.spill_instructions} spill instructions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
