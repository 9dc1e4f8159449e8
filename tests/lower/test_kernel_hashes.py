"""The generated kernels are pinned: for every example, the heuristic schedule and 24 seeded samples of
its space render exactly the CUDA source (and launch list) recorded in ``golden/kernel_hashes.json``.

A change that alters generated code on purpose regenerates the file
(``python scripts/kernel_hashes.py --out tests/lower/golden/kernel_hashes.json``) and says why in its
commit; a refactoring must leave it untouched.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from helpers import REPO

GOLDEN = Path(__file__).resolve().parent / "golden" / "kernel_hashes.json"


def _script():
    spec = importlib.util.spec_from_file_location("kernel_hashes", REPO / "scripts" / "kernel_hashes.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_kernels_render_as_recorded() -> None:
    want = json.loads(GOLDEN.read_text())
    samples = max(r["seed"] for rows in want.values() for r in rows) + 1
    got = _script().fingerprints(samples)
    assert sorted(got) == sorted(want), "the set of examples changed: regenerate the golden file"
    diffs = []
    for name, rows in want.items():
        for w, g in zip(rows, got[name], strict=True):
            for field in ("schedule", "source_sha256", "launches_sha256"):
                if w[field] != g[field]:
                    diffs.append(f"{name} seed {w['seed']}: {field} differs")
    assert not diffs, f"{len(diffs)} differences, e.g. {diffs[:5]}"
