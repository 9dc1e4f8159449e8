"""Tuning database: atomic parts, corrupt parts skipped, dedup, lookups."""

from __future__ import annotations

import logging
import os

import pandas as pd
import pytest

from stitchtune.tune.database import TuningDB, read_db
from stitchtune.tune.records import TrialStatus
from stitchtune.errors import DatabaseError


def _row(**kw):
    base = {
        "workload_key": "w1", "structure_key": "s1", "graph_name": "ln", "shapes": "{}", "dtypes": "{}",
        "device_key": "h200-sm90", "device_name": "h200", "device_cc": "9.0", "backend": "emulate",
        "estimated": True, "space_version": "sv1", "codegen_version": "cg1", "schedule_json": "{}",
        "schedule_key": "k1", "heuristic": False, "status": "ok", "prune_reason": None, "predicted_us": 10.0,
        "measured_us": 10.0, "samples_us": "[10.0]", "max_rel_error": 0.0, "registers": 32, "smem_bytes": 0,
        "spill_bytes": 0, "occupancy": 1.0, "compile_s": 0.1, "error": "", "reused": False, "reused_from": None,
        "study": "st", "trial_number": 0, "sampler": "tpe", "worker": "h:1",
    }
    base.update(kw)
    return base


def test_append_and_read_roundtrip(tmp_path):
    db = TuningDB(tmp_path / "db")
    assert db.read().empty  # missing directory reads as empty
    p1 = db.append([_row(), _row(schedule_key="k2", trial_number=1, measured_us=5.0, p_block=256)])
    p2 = db.append([_row(schedule_key="k3", trial_number=2, status="compile_error", measured_us=None,
                         error="nvcc: boom")])
    assert os.path.basename(p1).startswith("part-") and p1.endswith(".parquet")
    assert p1 != p2
    df = read_db(tmp_path / "db")
    assert len(df) == 3
    assert set(df["schedule_key"]) == {"k1", "k2", "k3"}
    assert df.loc[df["schedule_key"] == "k3", "error"].item() == "nvcc: boom"
    assert str(df["timestamp"].dt.tz) == "UTC"
    assert db.append([]) is None


def test_best_and_measured_filter_everything(tmp_path):
    db = TuningDB(tmp_path)
    db.append([
        _row(schedule_key="a", trial_number=0, measured_us=9.0),
        _row(schedule_key="b", trial_number=1, measured_us=4.0),
        _row(schedule_key="c", trial_number=2, measured_us=1.0, codegen_version="cg0"),  # other version
        _row(schedule_key="d", trial_number=3, measured_us=0.5, device_key="a100-sm80"),  # other device
        _row(schedule_key="e", trial_number=4, measured_us=0.1, status="wrong_result"),
        _row(schedule_key="f", trial_number=5, measured_us=2.0, backend="cuda", estimated=False),
    ])
    best = db.best("w1", "h200-sm90", "sv1", "cg1", backend="emulate")
    assert best.schedule_key == "b" and best.measured_us == 4.0
    # without a backend, a real measurement beats estimated ones
    assert db.best("w1", "h200-sm90", "sv1", "cg1").schedule_key == "f"
    assert db.best("w2", "h200-sm90", "sv1", "cg1") is None
    m = db.measured("w1", "h200-sm90", "sv1", "cg1", "emulate")
    assert set(m) == {"a", "b", "e"}
    assert m["e"].status is TrialStatus.WRONG_RESULT
    assert m["a"].prune_reason is None


def test_measured_prefers_original_over_reused(tmp_path):
    db = TuningDB(tmp_path)
    db.append([_row(schedule_key="a", trial_number=7, reused=True, reused_from="st:0")])
    db.append([_row(schedule_key="a", trial_number=0, measured_us=3.0)])
    m = db.measured("w1", "h200-sm90", "sv1", "cg1", "emulate")
    assert m["a"].trial_number == 0
    assert not m["a"].reused


def test_dedup_on_read(tmp_path):
    db = TuningDB(tmp_path)
    db.append([_row(trial_number=0, measured_us=10.0)])
    db.append([_row(trial_number=0, measured_us=11.0)])  # replayed trial: same identity
    db.append([_row(trial_number=1)])  # same schedule, another trial: kept
    db.append([_row(trial_number=0, study="other")])  # another study: kept
    df = db.read()
    assert len(df) == 3
    assert df.loc[(df["trial_number"] == 0) & (df["study"] == "st"), "measured_us"].item() == 10.0


def test_crash_between_temp_write_and_rename_leaves_no_part(tmp_path, monkeypatch):
    db = TuningDB(tmp_path)
    db.append([_row(trial_number=0)])

    def crash(self, tmp, final):
        raise KeyboardInterrupt("killed before rename")

    monkeypatch.setattr(TuningDB, "_commit", crash)
    with pytest.raises(KeyboardInterrupt):
        db.append([_row(trial_number=1)])
    monkeypatch.undo()
    # the temp file may remain (as after kill -9) but is never visible as a part
    assert len(db.parts()) == 1
    leftovers = [n for n in os.listdir(tmp_path) if n.startswith(".tmp-")]
    assert leftovers, "the crash left its temporary file behind, as a kill -9 would"
    df = db.read()
    assert list(df["trial_number"]) == [0]


def test_corrupt_and_truncated_parts_are_skipped_with_warning(tmp_path, caplog):
    db = TuningDB(tmp_path)
    good = db.append([_row(trial_number=0)])
    second = db.append([_row(trial_number=1)])
    # truncate the second part, add a garbage part
    with open(second, "rb") as fh:
        data = fh.read()
    with open(second, "wb") as fh:
        fh.write(data[: len(data) // 2])
    bad = tmp_path / "part-99999999T000000000000Z-1-garbage.parquet"
    bad.write_bytes(b"not parquet at all")
    with caplog.at_level(logging.WARNING, logger="stitchtune.tune.database"):
        df = db.read()
    assert list(df["trial_number"]) == [0]
    text = caplog.text
    assert os.path.basename(second) in text and bad.name in text
    assert os.path.basename(good) not in text


def test_best_per_workload_and_path_errors(tmp_path):
    db = TuningDB(tmp_path / "d")
    db.append([_row(schedule_key="a", measured_us=3.0), _row(schedule_key="b", trial_number=1, measured_us=2.0),
               _row(workload_key="w2", graph_name="sm", schedule_key="z", measured_us=7.0)])
    best = db.best_per_workload()
    assert sorted(zip(best["workload_key"], best["measured_us"])) == [("w1", 2.0), ("w2", 7.0)]
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(DatabaseError):
        TuningDB(f)


def test_mixed_schemas_concatenate(tmp_path):
    db = TuningDB(tmp_path)
    db.append([_row(p_block=128, trial_number=0)])
    db.append([_row(workload_key="w2", p_rows=4, trial_number=0)])
    df = db.read()
    assert {"p_block", "p_rows"} <= set(df.columns)
    assert isinstance(df, pd.DataFrame) and len(df) == 2
