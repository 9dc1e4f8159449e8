"""Fitting the optional memory-parallelism terms (stitchtune.cost.fitting with FIT_START) and scripts/fit_terms.py /
scripts/fit_learner.py on the small fixture (a slice of the committed dataset). Every time other than
``measured_us`` is a prediction."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from stitchtune.cost.fitted import FIT_START, Coefficients
from stitchtune.cost.fitting import FITTED, fit_coefficients
from stitchtune.hardware.device import get_device

H200 = get_device("h200")
ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).parent / "data" / "fit_fixture.json"


def _script(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    monkeypatch.setitem(sys.modules, name, mod)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def test_a_term_off_in_the_base_starts_at_fit_start_not_at_its_bound() -> None:
    # rows whose kernels keep a few bytes in flight per SM: the per-SM limit never binds, so the fit leaves it where
    # it starts (its weak pull is towards the start): FIT_START's 32 KiB, not the 1 KiB lower bound
    rows: list[dict[str, Any]] = json.loads(FIXTURE.read_text())["rows"]
    for r in rows:
        r["kernels"] = [{**k, "grid": min(k["grid"], 8), "block": min(k["block"], 64), "bytes_in_flight_per_thread": 4.0,
                         "compiled_bytes_in_flight": 0.0} for k in r["kernels"]]
    assert Coefficients.defaults(H200).sm_inflight_kib == 0.0
    c = fit_coefficients(rows, H200, names=[*FITTED, "sm_inflight_kib"])
    assert c.sm_inflight_kib > 10.0                       # not at the 1 KiB bound
    assert c.sm_inflight_kib == pytest.approx(FIT_START.get("sm_inflight_kib", 0.0), rel=0.05)


def test_fit_terms_scores_the_variants_held_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = _script("fit_terms", monkeypatch)
    assert mod.main(["--dataset", str(FIXTURE), "--out", str(tmp_path), "--variants", "0,4", "--name", "t"]) == 0
    text = (tmp_path / "t.md").read_text()
    assert "PREDICTED" in text and "| shipped (both terms off) |" in text and "nested within ±25%" in text
    data = json.loads((tmp_path / "t.json").read_text())
    both = data["variants"]["+ SM in flight + loaded latency"]
    assert both["all_rows"]["sm_inflight_kib"] > 0 and both["all_rows"]["loaded_latency"] > 0
    assert data["variants"]["shipped (both terms off)"]["all_rows"]["sm_inflight_kib"] == 0.0
    assert set(data["nested"]["chosen"]) == {"bert-train", "bert-inference", "db:layernorm", "db:softmax_tiny_rows"}


def test_fit_learner_reports_learners_and_residuals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("sklearn")
    mod = _script("fit_learner", monkeypatch)
    assert mod.main(["--dataset", str(FIXTURE), "--out", str(tmp_path)]) == 0
    text = (tmp_path / "learner.md").read_text()
    assert "| physical (shipped) |" in text and "| gbr time |" in text and "| hybrid |" in text
    data = json.loads((tmp_path / "learner.json").read_text())
    assert all(0.0 <= v["pre"]["within25"] <= 1.0 for v in data["learners"].values())


@pytest.mark.parametrize("name", ["fit_terms", "fit_learner"])
def test_a_bad_dataset_or_variant_is_one_error_line_and_exit_2(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A dataset that cannot be read (and fit_terms' --variants out of range) is ``<script>: error: ...``, exit 2,
    as fit_cost_model.py's (was a DatasetError / IndexError traceback)."""
    mod = _script(name, monkeypatch)
    assert mod.main(["--dataset", str(tmp_path / "missing.json"), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"{name}: error: ") and "missing.json" in err[0]
    if name == "fit_terms":
        for bad in ("99", "x", "0,-1"):
            assert mod.main(["--dataset", str(FIXTURE), "--out", str(tmp_path), "--variants", bad]) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and err[0].startswith("fit_terms: error: --variants"), err
