"""Fingerprints of the optuna parameters the schedule space asks for: a guard for refactors of
``stitchtune.space`` (a study must resume: the same names, domains and order for the same points).

For every example graph this runs a seeded random-sampler study of ``--trials`` trials against the
space on the H200 preset, in define-by-run mode and in flat mode, and records per trial the asked
parameters in order (name and value) and the suggested schedule's JSON, plus the one domain each
parameter name has. Written as JSON to ``--out`` (default: stdout).

``tests/space/test_compat.py`` compares today's code with ``tests/space/golden/suggest_params.json``;
regenerate it only with a change that means to change the space (and then bump its ``version``):

    python scripts/suggest_params.py --out tests/space/golden/suggest_params.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: the space version whose draws the committed golden files were recorded with (``SearchSpace.as_of``): every
#: file so far was recorded before space version 6 made ``min_blocks`` 3 a drawn value
GOLDEN_DRAWN_AS = "5"
DEFAULT_TRIALS = 24


def fingerprints(trials: int = DEFAULT_TRIALS, examples: Path = ROOT / "examples",
                 only: set[str] | None = None, table: str = "full", drawn_as: str = GOLDEN_DRAWN_AS) -> dict[str, Any]:
    """``{example: {mode: {"domains": {name: choices}, "trials": [{"params": [[name, value], ...],
    "schedule": json}, ...]}}}`` for mode ``define`` and ``flat``, for every example or those in ``only``;
    ``table`` and ``drawn_as`` as in ``scripts/kernel_hashes.py`` (``recorded``: the table of the first golden files)."""
    import optuna

    from stitchtune.graph.parse import load_graph
    from stitchtune.hardware.device import get_device
    from stitchtune.plan.planner import make_plan
    from stitchtune.space import SearchSpace
    from stitchtune.space.options import OPTIONS, RECORDED_OPTIONS

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    dev = get_device("H200")
    out: dict[str, Any] = {}
    for path in sorted(examples.glob("*.json")):
        if only is not None and path.name not in only:
            continue
        space = SearchSpace.for_plan(make_plan(load_graph(path)), dev,
                                     table=RECORDED_OPTIONS if table == "recorded" else OPTIONS).as_of(drawn_as)
        modes: dict[str, Any] = {}
        for mode, sp in (("define", space), ("flat", space.flat_mode())):
            study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=11))
            domains: dict[str, list[Any]] = {}
            rows = []
            for _ in range(trials):
                t = study.ask()
                s = sp.suggest(t)
                for name, dist in t.distributions.items():
                    domains.setdefault(name, list(dist.choices))
                rows.append({"params": [[k, v] for k, v in t.params.items()], "schedule": s.to_json()})
                study.tell(t, 1.0)
            modes[mode] = {"domains": domains, "trials": rows}
        out[path.name] = modes
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=DEFAULT_TRIALS, help="trials per example and mode")
    ap.add_argument("--out", type=Path, help="write the JSON here (default: stdout)")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="only these example files (e.g. softmax.json)")
    ap.add_argument("--table", choices=("full", "recorded"), default="full",
                    help="option table: today's (full) or the one of the first golden files (recorded)")
    ap.add_argument("--drawn-as", default=GOLDEN_DRAWN_AS, metavar="VERSION",
                    help=f"draw as this space version did (default {GOLDEN_DRAWN_AS}: the committed golden files)")
    args = ap.parse_args(argv)
    only = set(args.only) if args.only else None
    text = json.dumps(fingerprints(args.trials, only=only, table=args.table, drawn_as=args.drawn_as), sort_keys=True, separators=(",", ":")) + "\n"
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
