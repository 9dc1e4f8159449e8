"""scripts/fit_order.py on the small fixture (a slice of the committed dataset): variants scored held out, the
heuristic vs best ordering per database workload, the nested choice; bad input is one error line. Every time other
than ``measured_us`` is a prediction."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from stitchtune.cost import fitted

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).parent / "data" / "fit_fixture.json"


def _script(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location("fit_order", ROOT / "scripts" / "fit_order.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    monkeypatch.setitem(sys.modules, "fit_order", mod)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def test_heuristic_vs_best_says_ordered_wrong_right_and_no_measured_heuristic(monkeypatch: pytest.MonkeyPatch) -> None:
    mod = _script(monkeypatch)
    rows = [{"group": "db:a", "workload": "a", "heuristic": True, "measured_us": 10.0},
            {"group": "db:a", "workload": "a", "heuristic": False, "measured_us": 8.0},
            {"group": "db:b", "workload": "b", "heuristic": False, "measured_us": 5.0},
            {"group": "db:c", "workload": "c", "heuristic": True, "measured_us": 3.0},
            {"group": "db:c", "workload": "c", "heuristic": False, "measured_us": 4.0}]
    wrong = mod.heuristic_vs_best(rows, np.array([7.0, 9.0, 1.0, 1.0, 2.0]))
    right = mod.heuristic_vs_best(rows, np.array([9.0, 7.0, 1.0, 1.0, 2.0]))
    assert [x["ordered"] for x in wrong] == [False, None, None] and right[0]["ordered"] is True
    assert wrong[1]["note"] == "no measured heuristic row" and wrong[2]["note"] == "heuristic is the best measured"


def test_fit_order_scores_variants_and_restores_the_shipped_form(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = _script(monkeypatch)
    chain = next(i for i, v in enumerate(mod.VARIANTS) if v.exposed_of == "chain")
    assert mod.main(["--dataset", str(FIXTURE), "--out", str(tmp_path), "--variants", f"0,1,{chain}", "--name", "o"]) == 0
    assert fitted.EXPOSED_OF == "issue"
    text = (tmp_path / "o.md").read_text()
    assert "PREDICTED" in text and "| 0 | shipped |" in text and "nested within ±25%" in text
    assert "## Heuristic vs best" in text and "layernorm" in text
    data = json.loads((tmp_path / "o.json").read_text())
    assert data["variants"]["shipped"]["all_rows"]["overlap_warps"] == 0.0
    assert data["variants"][mod.VARIANTS[1].name]["all_rows"]["overlap_warps"] > 0.0
    ln = next(x for x in data["variants"]["shipped"]["heuristic_vs_best_pre"] if x["workload"] == "layernorm")
    assert ln["ordered"] in (True, False, None)


def test_a_bad_dataset_or_variant_is_one_error_line_and_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    mod = _script(monkeypatch)
    assert mod.main(["--dataset", str(tmp_path / "missing.json"), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fit_order: error: ") and "missing.json" in err[0]
    for bad in ("99", "x", "0,-1"):
        assert mod.main(["--dataset", str(FIXTURE), "--out", str(tmp_path), "--variants", bad]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("fit_order: error: --variants"), err


def test_implied_latency_is_in_flight_over_read_bandwidth(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("implied_latency", ROOT / "scripts" / "implied_latency.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    monkeypatch.setitem(sys.modules, "implied_latency", mod)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    from stitchtune.cost.fitted import package_coefficients
    from stitchtune.hardware.device import get_device

    dev = get_device("h200")
    row = json.loads(FIXTURE.read_text())["rows"]
    ln = next(r for r in row if r["workload"] == "layernorm" and len(r["kernels"]) == 1)
    k = {**ln["kernels"][0], "grid": 16, "block": 256, "blocks_per_sm": 1, "active_lanes": 1.0,
         "compiled_bytes_in_flight": 64.0, "sector_bytes": 3.0 * mod.written_bytes("layernorm")}
    c = package_coefficients(dev)
    r = {**ln, "kernels": [k], "measured_us": 100.0 + c.event_us + c.ramp_us}
    (x,) = mod.implied([r], dev)
    reads = 2.0 * mod.written_bytes("layernorm")         # sectors less the output written
    assert x["implied_latency_ns"] == pytest.approx(16 * 256 * 64.0 / (reads / 100e3))
    assert x["kib_per_busy_sm"] == pytest.approx(256 * 64.0 / 1024)
    assert mod.main(["--dataset", str(FIXTURE), "--out", str(tmp_path / "l.md")]) == 0
    assert "implied latency ns" in (tmp_path / "l.md").read_text()
    capsys.readouterr()
    assert mod.main(["--dataset", str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("implied_latency: error: ")
