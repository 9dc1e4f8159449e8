"""scripts/gpu_regions.py (the ``regions`` phase of scripts/gpu_models.py) without a GPU: the table from
fake profiler rows, the inputs of a region module, and the CPU dry run (predicted columns only)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from helpers.common import load_script

ROOT = Path(__file__).resolve().parents[2]


def load(name: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    return load_script(name, monkeypatch)


def test_summarise_and_table_from_fake_profiler_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    gr = load("gpu_regions", monkeypatch)
    ours = gr.summarise([("st_k0", 30.0), ("st_k0", 32.0)], calls=2)
    ind = gr.summarise([("triton_poi_fused_clone_0", 8.0), ("triton_poi_fused_clone_0", 8.4)], calls=2)
    assert ours == {"us": 31.0, "kernels": 1.0, "names": ["st_k0"]}
    row = gr.region_row("bert", "inference", "region_view_4", "8f425e5f0009abcdef", 2, ours, ind, 5.2, 40.0, 12.5)
    assert row["ours_us"] == 31.0 and row["inductor_us"] == 8.2 and row["workload"] == "8f425e5f0009"
    lines = gr.region_table([row, {"phase": "time", "model": "bert"},
                             gr.region_row("gpt2", "train", "r", "k", 1, None, None, 1.0, 2.0)])
    assert lines[0].count("predicted") == 3 and "Inductor us (measured)" in lines[0]
    assert len(lines) == 4          # header, rule, two region rows (the time row is not one)
    assert "| bert | inference | region_view_4 | 2 | 31.0 | 8.2 | 3.78 | 5.2 | 40.0 | 12.5 |" in lines[2]
    assert "| - | - | - |" in lines[3] and "| 1.0 | 2.0 | - |" in lines[3]   # no analytic time: pruned


def test_region_inputs_follow_the_placeholders() -> None:
    torch = pytest.importorskip("torch")
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x: Any, idx: Any, m: Any) -> Any:
        return torch.where(m, x[idx], 0.0)

    gm = make_fx(f)(torch.zeros(4, 3), torch.zeros(2, dtype=torch.int64), torch.ones(2, 3, dtype=torch.bool))
    from importlib import util

    spec = util.spec_from_file_location("gpu_regions_x", ROOT / "scripts" / "gpu_regions.py")
    gr = util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(gr)  # type: ignore[union-attr]
    xs = gr.region_inputs(torch, gm, "cpu")
    assert [tuple(t.shape) for t in xs] == [(4, 3), (2,), (2, 3)]
    assert xs[0].dtype == torch.float32 and xs[0].abs().sum() > 0
    assert int(xs[1].abs().sum()) == 0 and bool(xs[2].all())
    assert tuple(gm(*xs).shape) == (2, 3)


@pytest.mark.slow   # a GPU script's CPU path (about 10 s beside other work): only scripts/ changes touch it
def test_cpu_dry_run_of_the_phase(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    gm = load("gpu_models", monkeypatch)
    assert gm.main(["--cpu", "--phases", "regions", "--time-models", "gpt2", "--modes", "inference",
                    "--out", str(tmp_path)]) == 0
    text = (tmp_path / "gpu_models.md").read_text()
    assert "ours / Inductor" in text
    rows = [ln for ln in text.splitlines() if ln.startswith("| gpt2 | inference | region")]
    assert rows and all("| - | - | - |" in ln for ln in rows)   # nothing measured on the CPU
    assert all(float(ln.split("|")[9]) > 0 for ln in rows)       # the model's prediction
    assert all(float(ln.split("|")[10]) > 0 for ln in rows)      # the analytic cost model's
