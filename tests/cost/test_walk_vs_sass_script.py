"""scripts/walk_vs_sass.py (the walk's bytes in flight against the SASS's, on a dataset) and fit_cost_model.py's
``--base NAME=VALUE`` (a coefficient fixed in the fit's base). Nothing is measured or predicted."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _script(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    monkeypatch.setitem(sys.modules, name, mod)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def _dataset(xsum_walk: float) -> dict[str, Any]:
    """Three kernels: st_xsum (SASS 76 B in flight, the walk ``xsum_walk``), one the walk gets right, one without
    SASS facts (not counted)."""
    def k(name: str, walk: float, sass: float) -> dict[str, Any]:
        return {"name": name, "grid": 3, "block": 256, "bytes_in_flight_per_thread": walk, "compiled_bytes_in_flight": sass}
    return {"rows": [{"group": "bert-train", "label": "region_add_6", "kernels": [k("st_k0", 32, 32), k("st_xsum", xsum_walk, 76)]},
                     {"group": "db:x", "label": "x", "kernels": [k("st_k0", 16, 0)]}]}


def test_walk_vs_sass_counts_a_kernel_moved_to_its_sass_figure(monkeypatch: pytest.MonkeyPatch) -> None:
    mod = _script("walk_vs_sass", monkeypatch)
    before, after = _dataset(4.0), _dataset(64.0)
    assert mod.summary(mod.pairs(before))["kernels"] == 2
    assert mod.summary(mod.pairs(before))["within_1.25x"] == 1
    assert mod.summary(mod.pairs(after))["within_1.25x"] == 2          # 64 / 76 = 0.84
    lines = mod.report(before, after)
    assert "kernels moved: 1 (1 closer to the SASS, 0 further)" in lines
    assert "| bert-train region_add_6 | st_xsum | 3 x 256 | 4 | 64 | 76 |" in lines


def test_fit_cost_model_base_takes_coefficients_and_refuses_unknown_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    mod = _script("fit_cost_model", monkeypatch)
    assert mod.parse_base(["reuse_tasks=1", "bw_efficiency=0.85"]) == {"reuse_tasks": 1.0, "bw_efficiency": 0.85}
    for bad in (["nonsense=1"], ["reuse_tasks"], ["reuse_tasks=x"], ["source=1"]):
        with pytest.raises(ValueError):
            mod.parse_base(bad)
