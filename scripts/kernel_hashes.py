"""Fingerprints of the generated kernels: a guard for refactors of the middle of the pipeline.

For every example graph (small and full size) this takes the AStitch heuristic schedule and
``--samples`` seeded samples of its space (``SearchSpace.sample(random.Random(seed))``, seeds
0..N-1), lowers each for the H200 preset, renders the CUDA source and records, per schedule, its
JSON and the SHA-256 of the rendered source and of the launch list (kernel, grid, block, dynamic
shared memory, arguments). Written as JSON to ``--out`` (default: stdout).

``tests/test_kernel_hashes.py`` compares today's code with the committed file
``tests/lower/golden/kernel_hashes.json``; after an intended change of generated code, regenerate it with

    python scripts/kernel_hashes.py --out tests/lower/golden/kernel_hashes.json

and say in the commit message why the kernels changed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: the space version whose draws the committed golden files were recorded with (``SearchSpace.as_of``): every
#: file so far was recorded before space version 6 made ``min_blocks`` 3 a drawn value
GOLDEN_DRAWN_AS = "5"
DEFAULT_SAMPLES = 24


def fingerprints(samples: int = DEFAULT_SAMPLES, examples: Path = ROOT / "examples",
                 only: set[str] | None = None, table: str = "full", drawn_as: str = GOLDEN_DRAWN_AS) -> dict[str, list[dict]]:
    """``{example file name: [{"seed", "schedule", "source_sha256", "launches_sha256"}, ...]}``
    (seed -1 is the heuristic schedule) for every example, or those named in ``only``. ``table``:
    ``full`` (today's option table) or ``recorded`` (``RECORDED_OPTIONS``, the table the first golden
    files were recorded with: no ``cluster`` scheme or option). ``drawn_as``: the space version whose draws
    the samples are (:data:`GOLDEN_DRAWN_AS`, that of the committed files)."""
    from stitchtune.cost.heuristic import heuristic_schedule
    from stitchtune.gpu.render import render
    from stitchtune.graph.parse import load_graph
    from stitchtune.hardware.device import get_device
    from stitchtune.lower.entry import lower
    from stitchtune.plan.planner import make_plan
    from stitchtune.space import SearchSpace
    from stitchtune.space.options import OPTIONS, RECORDED_OPTIONS

    dev = get_device("H200")
    out: dict[str, list[dict]] = {}
    for path in sorted(examples.glob("*.json")):
        if only is not None and path.name not in only:
            continue
        g = load_graph(path)
        plan = make_plan(g)
        space = SearchSpace.for_plan(plan, dev, table=RECORDED_OPTIONS if table == "recorded" else OPTIONS).as_of(drawn_as)
        rows = []
        points = [(-1, heuristic_schedule(plan, dev, space))]
        points += [(i, space.sample(random.Random(i))) for i in range(samples)]
        for seed, s in points:
            prog = lower(g, plan, s, dev, space)
            launches = json.dumps([[ln.kernel, ln.grid, ln.block, ln.smem_bytes, list(ln.args)]
                                   for ln in prog.launches])
            rows.append({"seed": seed, "schedule": s.to_json(),
                         "source_sha256": hashlib.sha256(render(prog).encode()).hexdigest(),
                         "launches_sha256": hashlib.sha256(launches.encode()).hexdigest()})
        out[path.name] = rows
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=DEFAULT_SAMPLES, help="sampled schedules per example")
    ap.add_argument("--out", type=Path, help="write the JSON here (default: stdout)")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="only these example files (e.g. softmax.json)")
    ap.add_argument("--table", choices=("full", "recorded"), default="full",
                    help="option table: today's (full) or the one of the first golden files (recorded)")
    ap.add_argument("--drawn-as", default=GOLDEN_DRAWN_AS, metavar="VERSION",
                    help=f"draw as this space version did (default {GOLDEN_DRAWN_AS}: the committed golden files)")
    args = ap.parse_args(argv)
    only = set(args.only) if args.only else None
    text = json.dumps(fingerprints(args.samples, only=only, table=args.table, drawn_as=args.drawn_as), indent=1, sort_keys=True) + "\n"
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
