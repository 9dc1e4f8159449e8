"""Fitting the feature model's coefficients (stitchtune.cost.fitting) and scripts/fit_cost_model.py on a
small fixture: a slice of the committed dataset (H200 measurements with their IR features). Every
time other than ``measured_us`` is a prediction."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

from stitchtune.cost.fitted import Coefficients
from stitchtune.cost.fitting import fit_coefficients, leave_one_group_out, predict_rows, score
from stitchtune.hardware.device import get_device

H200 = get_device("h200")
ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).parent / "data" / "fit_fixture.json"


def rows() -> list[dict[str, Any]]:
    return list(json.loads(FIXTURE.read_text())["rows"])


def test_score() -> None:
    s = score([10.0, 20.0, 30.0, 40.0], [11.0, 30.0, 29.0, 41.0])
    assert s["n"] == 4 and s["within25"] == 0.75 and s["spearman"] == pytest.approx(0.8)
    assert math.isnan(score([], [])["within25"])


def test_the_fit_recovers_coefficients_that_made_the_times() -> None:
    truth = dataclasses.replace(Coefficients.defaults(H200), bw_efficiency=0.7, dram_latency_ns=500.0, cta_ns=80.0)
    rs = rows()
    for r, t in zip(rs, predict_rows(rs, H200, truth)):
        r["measured_us"] = float(t)
    c = fit_coefficients(rs, H200)
    s = score([r["measured_us"] for r in rs], predict_rows(rs, H200, c))
    assert s["within25"] == 1.0 and s["median_ratio"] == pytest.approx(1.0, abs=0.03)


def test_the_fit_is_deterministic_and_beats_the_defaults_in_sample() -> None:
    rs = rows()
    a, b = fit_coefficients(rs, H200), fit_coefficients(rs, H200)
    assert a == b
    meas = [r["measured_us"] for r in rs]
    err = lambda c: sum(abs(math.log(p / m)) for p, m in zip(predict_rows(rs, H200, c), meas))  # noqa: E731
    assert err(a) < err(Coefficients.defaults(H200))


def test_leave_one_group_out_never_sees_the_held_out_group() -> None:
    rs = rows()
    held = leave_one_group_out(rs, H200)
    assert set(held) == {r["group"] for r in rs}
    g = "bert-inference"
    assert held[g] == fit_coefficients([r for r in rs if r["group"] != g], H200)
    with pytest.raises(ValueError):
        fit_coefficients([], H200)


def test_the_script_reproduces_the_table_from_a_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = importlib.util.spec_from_file_location("fit_cost_model", ROOT / "scripts" / "fit_cost_model.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    monkeypatch.setitem(sys.modules, "fit_cost_model", mod)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    out = tmp_path / "fit"
    assert mod.main(["--out", str(out), "--dataset", str(FIXTURE)]) == 0
    text = (out / "fit.md").read_text()
    assert "held out ±25%" in text and "PREDICTED" in text
    for g in ("bert-train", "bert-inference", "db:layernorm", "db:softmax_tiny_rows", "all"):
        assert f"| {g} |" in text
    data = json.loads((out / "fit.json").read_text())
    assert len(data["rows"]) == 20 and all(r["heldout_us"] > 0 for r in data["rows"])
    # the package data is written only when asked
    assert not list(out.glob("fitted_*.json"))


def test_the_script_refuses_a_dataset_without_fingerprints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("fit_cost_model", ROOT / "scripts" / "fit_cost_model.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    monkeypatch.setitem(sys.modules, "fit_cost_model", mod)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    old = tmp_path / "old.json"
    data = json.loads(FIXTURE.read_text())
    old.write_text(json.dumps({"device": data["device"], "rows": data["rows"]}))   # format 1
    assert mod.main(["--out", str(tmp_path / "fit"), "--dataset", str(old)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "error:" in err[0] and "format 1" in err[0]
    assert not (tmp_path / "fit" / "fit.md").exists()


def test_refeature_adds_new_fields_only_when_the_stored_features_come_out_identical() -> None:
    """scripts/refeature_dataset.py: rebuilt rows (the measured programs walked again) add the fields the stored
    features lack; a rebuilt kernel whose stored features differ (another kernel) is refused."""
    spec = importlib.util.spec_from_file_location("refeature_dataset", ROOT / "scripts" / "refeature_dataset.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    stored = json.loads(FIXTURE.read_text())
    rebuilt = [{**r, "kernels": [{**k, "serial_rounds": 7.0} for k in r["kernels"]]} for r in stored["rows"]]
    merged, problems = mod.merge(stored, rebuilt, "test")
    assert problems == [] and len(merged["rows"]) == len(stored["rows"])
    assert all(k["serial_rounds"] == 7.0 for r in merged["rows"] for k in r["kernels"])
    assert [r["measured_us"] for r in merged["rows"]] == [r["measured_us"] for r in stored["rows"]]
    assert "serial_rounds" in merged["provenance"]["refeatured"]
    changed = [dict(r) for r in rebuilt]
    changed[3] = {**changed[3], "kernels": [{**k, "grid": k["grid"] + 1} for k in changed[3]["kernels"]]}
    _, problems = mod.merge(stored, changed, "test")
    assert len(problems) == len(changed[3]["kernels"]) and "grid" in problems[0]
