"""New IR features for the cost fit's stored dataset, computed on the measured kernels themselves.

    git archive <features_commit> | tar -x -C /tmp/old          # the checkout whose programs were measured
    cp stitchtune/cost/{features,ir_walk}.py /tmp/old/stitchtune/cost/ && cp stitchtune/ir/sectors.py /tmp/old/stitchtune/ir/
    (cd /tmp/old && PYTHONPATH=$PWD python scripts/fit_cost_model.py --out /tmp/old/rebuilt)   # lowers again there
    python scripts/refeature_dataset.py --rebuilt /tmp/old/rebuilt/dataset.json \\
        [--dataset results/cost-fit-2026-12-07/dataset.json] --out results/cost-fit-2026-12-07-s11/dataset.json

The stored dataset keeps the features of the programs that were measured (each row keyed by its
program's fingerprint, :mod:`stitchtune.cost.fit_dataset`); a feature added later cannot be read from
today's programs (110 of 153 differ). So the measured programs are lowered again at the checkout that
computed the stored features, with today's IR walk copied in; this script pairs the rebuilt rows with
the stored ones in order (group, label, n-th occurrence), **checks that every stored feature came out
identical** (the same kernels, walked the same way: else it refuses, exit 1; the compiled-code fields of
``scripts/sass_dataset.py`` are not the walk's and are kept as stored) and writes the stored
rows with the fields the stored features lack added. ``--replace F,G`` names stored fields that a changed
walk is meant to move (s13-walkfix: the load groups' ``load_rounds`` ...): those take the rebuilt value and
are reported (how many kernels moved); every other stored feature must still come out identical.
Nothing is measured or predicted here.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
#: kernel fields read from the compiled code (scripts/sass_dataset.py), not from the walk: kept as stored
COMPILED = ("compiled_bytes_in_flight", "spill_instructions", "sass")


def _keyed(rows: list[dict[str, Any]]) -> dict[tuple[str, str, int], dict[str, Any]]:
    seen: dict[tuple[str, str], int] = defaultdict(int)
    out = {}
    for r in rows:
        k = (r["group"], r["label"])
        seen[k] += 1
        out[(*k, seen[k])] = r
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)
    return bool(a == b)


def merge(stored: dict[str, Any], rebuilt: list[dict[str, Any]], tag: str,
          replace: frozenset[str] = frozenset()) -> tuple[dict[str, Any], list[str]]:
    """The stored dataset with the rebuilt rows' new kernel fields added and the ``replace`` fields taken
    from the rebuilt rows; the problems found (empty: ok)."""
    new = _keyed(rebuilt)
    seen: dict[tuple[str, str], int] = defaultdict(int)
    rows, problems, added = [], [], set()
    moved: dict[str, int] = defaultdict(int)
    for r in stored["rows"]:
        k = (r["group"], r["label"])
        seen[k] += 1
        n = new.get((*k, seen[k]))
        if n is None or len(n["kernels"]) != len(r["kernels"]):
            problems.append(f"{k}: not rebuilt, or another number of launches")
            continue
        kernels = []
        for ko, kn in zip(r["kernels"], n["kernels"]):
            bad = [f for f, v in ko.items() if f in kn and f not in COMPILED and f not in replace and not _same(v, kn[f])]
            if bad:
                problems.append(f"{k} {ko.get('name')}: {', '.join(bad)} differ from the stored features")
            for f in replace & set(kn):
                moved[f] += not _same(ko.get(f), kn[f])
            extra = {f: v for f, v in kn.items() if f not in ko or f in replace}
            added |= set(extra)
            kernels.append({**ko, **extra})
        rows.append({**r, "kernels": kernels, "features_commit": f"{r.get('features_commit', '?')} + {tag}"})
    before = stored.get("provenance", {}).get("refeatured")
    what = f"fields {sorted(added)} added" if not replace else \
        f"fields {sorted(replace)} recomputed (kernels moved: {dict(sorted(moved.items()))})" + \
        (f", {sorted(added - replace)} added" if added - replace else "")
    prov = {**stored.get("provenance", {}),
            "refeatured": (f"{before}; " if before else "") + f"{what} by scripts/refeature_dataset.py ({tag}): the measured "
                          "programs lowered again at features_commit with this walk copied in; every other stored feature identical"}
    return {**stored, "provenance": prov, "rows": rows}, problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="results/cost-fit-2026-12-07/dataset.json")
    ap.add_argument("--rebuilt", required=True, help="dataset.json written by fit_cost_model.py in the old checkout")
    ap.add_argument("--out", required=True)
    ap.add_argument("--tag", default="s11 walk", help="what computed the new fields (kept in features_commit)")
    ap.add_argument("--replace", default="", help="comma-separated stored kernel fields the changed walk is meant "
                    "to move: taken from the rebuilt rows (every other stored feature must be identical)")
    a = ap.parse_args(argv)
    stored = json.loads((REPO / a.dataset).read_text())
    rebuilt = json.loads(Path(a.rebuilt).read_text())["rows"]
    merged, problems = merge(stored, rebuilt, a.tag, frozenset(f for f in a.replace.split(",") if f))
    if problems:
        print("refeature_dataset: refused, the rebuilt kernels are not the stored ones:\n  " + "\n  ".join(problems[:20]),
              file=sys.stderr)
        return 1
    out = REPO / a.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(merged, indent=0) + "\n")
    print(f"wrote {a.out}: {len(merged['rows'])} rows, {merged['provenance']['refeatured']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
