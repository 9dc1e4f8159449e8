"""scripts/gpu_scatter_variants.py without a GPU: the CPU dry run builds every variant (no scatter, the word
table, both tables; private / direct / scalar adds; token types all 0 or random), each equal to the float64
reference in the emulator, with the lowering each variant names, and writes its rows and table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.common import load_script


def test_cpu_dry_run_builds_every_variant(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sv = load_script("gpu_scatter_variants", monkeypatch)
    assert sv.main(["--cpu", "--out", str(tmp_path), "--iters", "1"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "scatter_variants.jsonl").read_text().splitlines()]
    assert [(r["tables"], r["tt"], r["lowering"]) for r in rows] == list(sv.VARIANTS)
    assert all(r["max_rel_err"] < 1e-5 for r in rows)
    by = {(r["tables"], r["tt"], r["lowering"]): r for r in rows}
    atomics = {k: sum(x["atomics_per_thread"] for x in r["kernels"]) for k, r in by.items()}
    assert atomics[("none", "zero", "private")] == 0
    # the private copy: shared memory and fewer global adds than direct; scalar adds: 4x the vector ones
    assert max(x["smem"] for x in by[("word+type", "zero", "private")]["kernels"]) > 0
    assert atomics[("word+type", "zero", "private")] < atomics[("word+type", "zero", "direct")]
    assert atomics[("word", "zero", "scalar")] == 4 * atomics[("word", "zero", "private")]
    md = (tmp_path / "scatter_variants.md").read_text()
    assert "CPU dry run" in md and "PREDICTED" in md


def test_the_region_is_built_on_the_package_node_list(monkeypatch: pytest.MonkeyPatch) -> None:
    """The script's layer-norm backward is ``stitchtune.graph.node_lists.layernorm_backward_rows`` (the tests'
    scatter graphs use the same list), not a copy of it: a change there reaches the script's region."""
    from stitchtune.graph import node_lists

    sv = load_script("gpu_scatter_variants", monkeypatch)
    shape = sv.CPU_SHAPE
    g = sv.region_graph("none", **shape)
    assert [n.id for n in g.nodes] == [n["id"] for n in node_lists.layernorm_backward_rows()]
    doubled = [*node_lists.layernorm_backward_rows()[:-1], {"id": "dx", "op": "add", "args": ["c", "rstd"]}]
    monkeypatch.setattr(node_lists, "layernorm_backward_rows", lambda: doubled)
    assert sv.region_graph("word", **shape).nodes[-2].op == "add"
