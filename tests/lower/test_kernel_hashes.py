"""The generated kernels are pinned: for every example, the heuristic schedule and 24 seeded samples of
its space render exactly the CUDA source (and launch list) recorded in ``golden/kernel_hashes.json``.

A change that alters generated code on purpose regenerates the file
(``python scripts/kernel_hashes.py --out tests/lower/golden/kernel_hashes.json``) and says why in its
commit; a refactoring must leave it untouched. Examples added later are recorded in their own files
(``GOLDEN_ADDED``; ``scripts/kernel_hashes.py --only NAME ... --out FILE``), so that adding an
example never rewrites an existing entry.

The files recorded before the ``cluster`` scheme existed (``GOLDEN``, ``GOLDEN_ADDED``) are compared
with the space built from ``RECORDED_OPTIONS`` (the option table they were recorded with: a new scheme
or option on the H200 necessarily changes seeded draws, so their points are drawn as then and must
render as then); files recorded since (``GOLDEN_FULL``, ``--table full``) with today's table.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from helpers.common import REPO

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
GOLDEN = GOLDEN_DIR / "kernel_hashes.json"
# examples added after the first golden file was recorded, one file per addition (an existing
# entry is never rewritten by adding an example)
GOLDEN_ADDED = (GOLDEN_DIR / "kernel_hashes_index_maps.json", GOLDEN_DIR / "kernel_hashes_masks.json",
                GOLDEN_DIR / "kernel_hashes_single_pass.json", GOLDEN_DIR / "kernel_hashes_cross.json")
# recorded with today's option table (scripts/kernel_hashes.py --table full --only NAME ...)
GOLDEN_FULL = (GOLDEN_DIR / "kernel_hashes_cluster.json", GOLDEN_DIR / "kernel_hashes_index_ops.json",
               GOLDEN_DIR / "kernel_hashes_maps.json", GOLDEN_DIR / "kernel_hashes_rotary.json",
               GOLDEN_DIR / "kernel_hashes_expand.json", GOLDEN_DIR / "kernel_hashes_transpose.json")


def _script():
    spec = importlib.util.spec_from_file_location("kernel_hashes", REPO / "scripts" / "kernel_hashes.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _golden(paths=(GOLDEN, *GOLDEN_ADDED, *GOLDEN_FULL)) -> dict[str, list[dict]]:
    """Every recorded example's rows; an example recorded in two files is an error."""
    want: dict[str, list[dict]] = {}
    for path in paths:
        rows = json.loads(path.read_text())
        assert not set(rows) & set(want), f"{path.name} records examples another golden file has"
        want.update(rows)
    return want


#: the seeded samples every run of the quick suite renders per example (besides the heuristic, seed -1);
#: the slow test renders all the recorded ones
QUICK_SEEDS = 6


def _diffs(want: dict[str, list[dict]], seeds: int | None) -> list[str]:
    """Where today's rendering of ``want``'s examples (the heuristic and seeds below ``seeds``, all when
    None) differs from the recorded fingerprints."""
    full = set(_golden(GOLDEN_FULL))
    samples = max(r["seed"] for rows in want.values() for r in rows) + 1 if seeds is None else seeds
    got = _script().fingerprints(samples, table="recorded", only=set(want) - full)
    got.update(_script().fingerprints(samples, table="full", only=set(want) & full))
    assert sorted(got) == sorted(want), "the set of examples changed: record the new ones in a golden file"
    diffs = []
    for name, rows in want.items():
        kept = [r for r in rows if r["seed"] < samples]
        for w, g in zip(kept, got[name], strict=True):
            for field in ("schedule", "source_sha256", "launches_sha256"):
                if w[field] != g[field]:
                    diffs.append(f"{name} seed {w['seed']}: {field} differs")
    return diffs


def test_every_example_is_recorded() -> None:
    every = {p.name for p in (REPO / "examples").glob("*.json")}
    assert every == set(_golden()), "the set of examples changed: record the new ones in a golden file"


@pytest.mark.parametrize("name", sorted(_golden()))
def test_kernels_render_as_recorded(name: str) -> None:
    """The heuristic and the first QUICK_SEEDS samples of one example (the slow test below: all 24)."""
    want = {name: _golden()[name]}
    assert len([r for r in want[name] if r["seed"] < QUICK_SEEDS]) == QUICK_SEEDS + 1
    diffs = _diffs(want, QUICK_SEEDS)
    assert not diffs, f"{len(diffs)} differences, e.g. {diffs[:5]}"


@pytest.mark.slow
def test_every_recorded_sample_renders_as_recorded() -> None:
    diffs = _diffs(_golden(), None)
    assert not diffs, f"{len(diffs)} differences, e.g. {diffs[:5]}"
