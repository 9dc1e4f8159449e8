"""scripts/model_coverage.py on a small BERT (transformers config, legacy ONNX exporter) and a small
ConvNeXt (torch.export): the table's invariants, not today's counts."""

from __future__ import annotations

import importlib.util
import json

import pytest

from helpers.common import REPO

pytest.importorskip("torch")
pytest.importorskip("onnx")
pytest.importorskip("transformers")


def _script():
    spec = importlib.util.spec_from_file_location("model_coverage", REPO / "scripts" / "model_coverage.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bert_legacy_row_invariants() -> None:
    mc = _script()
    row = mc.cover("bert", "legacy", seed=0)
    assert row["status"] == "ran", row
    assert 0 < row["planned"] <= row["whole"] <= row["regions"]
    assert row["correct"] == row["planned"]
    assert row["whole"] + row["cut"] + row["dropped"] + row["skipped"] == row["regions"]
    p = row["pieces"]
    assert p["correct"] == p["planned"] <= p["graphs"]
    assert not row["wrong"], row["wrong"]
    for r in row["cut_regions"]:   # every cut names the op that cut it
        assert r["stopped_by"]
        for b in r["stopped_by"]:
            op = b.split(":")[1]
            assert op and op[0].isupper(), b
    assert sum(row["cut_by"].values()) >= row["cut"]
    assert row["compute_ops"].get("MatMul", 0) > 0
    lines = mc.table_lines([row])
    assert any(line.startswith("bert") for line in lines) and lines[-1].startswith("total")
    json.dumps(row)   # machine-readable as is


def test_torch_export_row_invariants() -> None:
    """The torch.export path (fx graph cut by the ONNX partitioner, groups imported by import_torch)
    on a small ConvNeXt: regions found and imported whole, every planned graph emulated correctly."""
    mc = _script()
    row = mc.cover("convnext", "export", seed=0)
    assert row["status"] == "ran", row
    assert 0 < row["planned"] <= row["whole"] <= row["regions"] and row["correct"] == row["planned"]
    assert row["whole"] + row["cut"] + row["dropped"] + row["skipped"] == row["regions"]
    assert not row["wrong"], row["wrong"]
    assert all(r["stopped_by"] for r in row["cut_regions"])
    assert row["compute_ops"].get("Conv", 0) > 0


def test_bad_options_exit_2(capsys) -> None:
    mc = _script()
    assert mc.main(["--models", "bert,nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nope" in err
    with pytest.raises(SystemExit) as e:
        mc.main(["--seed", "x"])
    assert e.value.code == 2
