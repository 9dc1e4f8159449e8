"""The cost fit's stored dataset (stitchtune/cost/fit_dataset.py): rows keyed by the fingerprint of the
program that was measured, so that a rebuilt kernel that differs is never paired with an old time."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from helpers.common import REPO
from stitchtune.cost.features import program_features
from stitchtune.cost.fit_dataset import Dataset, DatasetError, load_dataset, pair_rebuilt, save_dataset
from stitchtune.gpu.render import program_fingerprint
from stitchtune.graph.parse import load_graph
from stitchtune.hardware.device import get_device
from stitchtune.lower.entry import lower
from stitchtune.lower.resources import legal_space
from stitchtune.plan.planner import make_plan

H200 = get_device("h200")
STORED = REPO / "results" / "cost-fit-2026-12-07" / "dataset.json"


def _row(prog, label: str, measured: float) -> dict:
    feats = [{k: v for k, v in f.to_dict().items() if k != "per_access"} for f in program_features(prog, H200)]
    return {"group": "db:layernorm", "label": label, "measured_us": measured, "kernels": feats,
            "source_sha256": program_fingerprint(prog)}


def _two_programs():
    g = load_graph(REPO / "examples" / "layernorm.json")
    plan = make_plan(g)
    space = legal_space(g, plan, H200)
    a = lower(g, plan, space.sample(random.Random(0)), H200, space)
    b = next(p for p in (lower(g, plan, space.sample(random.Random(i)), H200, space) for i in range(1, 50))
             if program_fingerprint(p) != program_fingerprint(a))
    return a, b


def test_the_committed_dataset_is_keyed_by_fingerprint() -> None:
    d = load_dataset(STORED, H200.key)
    assert len(d.rows) == 153
    assert all(len(r["source_sha256"]) == 64 and r["features_commit"] for r in d.rows)


def test_load_refuses_a_dataset_without_fingerprints_or_of_another_device(tmp_path: Path) -> None:
    raw = json.loads(STORED.read_text())
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"device": raw["device"], "rows": raw["rows"][:3]}))   # format 1
    with pytest.raises(DatasetError, match="format 1"):
        load_dataset(old, H200.key)
    with pytest.raises(DatasetError, match="device"):
        load_dataset(STORED, "NVIDIA A100/sm_80")
    bad = tmp_path / "bad.json"
    rows = [dict(r) for r in raw["rows"][:3]]
    del rows[1]["source_sha256"]
    bad.write_text(json.dumps({**raw, "rows": rows}))
    with pytest.raises(DatasetError, match="row 1 has no source_sha256"):
        load_dataset(bad, H200.key)


def test_a_changed_kernel_is_never_paired_with_the_old_time(tmp_path: Path) -> None:
    measured, today = _two_programs()
    stored = [_row(measured, "x", 40.0), _row(measured, "same", 50.0)]
    rebuilt = [_row(today, "x", 0.0), _row(measured, "same", 0.0), _row(today, "new", 0.0)]
    rows, notes = pair_rebuilt(stored, rebuilt)
    assert [r["label"] for r in rows] == ["x", "same"]          # "new": no record of what was measured
    assert rows[0] is stored[0]                                  # the stored features of the measured kernel
    assert rows[0]["kernels"] != rebuilt[0]["kernels"] or rows[0]["source_sha256"] != rebuilt[0]["source_sha256"]
    assert rows[1]["source_sha256"] == stored[1]["source_sha256"] and rows[1]["measured_us"] == 50.0
    assert any("differs from the one measured" in n for n in notes) and any("new" in n for n in notes)
    path = tmp_path / "d.json"
    save_dataset(path, Dataset(H200.key, tuple(rows), tuple(notes)))
    assert [r["label"] for r in load_dataset(path, H200.key).rows] == ["x", "same"]


def test_with_timing_fills_only_what_a_row_lacks() -> None:
    from stitchtune.cost.fit_dataset import with_timing

    rows = [{"group": "bert-train"}, {"group": "db:h200"}, {"group": "bert-train", "timing": "events"}]
    got = with_timing(rows)
    assert [r["timing"] for r in got] == ["cupti", "events", "events"]
    assert "timing" not in rows[0] and got[0] is not rows[0]   # copies; the given rows untouched
