"""The heuristic kernel (what a user gets without tuning) of a few representative examples, kept as
readable CUDA under ``golden/heuristic/``: a row reduction in a warp and in a block, a column reduction,
an element-wise graph, a wide row on thread-block clusters, cross reductions (layernorm backward) and a
gather. A change shows as a unified diff of the source; ``tests/lower/test_kernel_hashes.py`` pins every
other example and sample by hash."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.lowering import assert_matches_golden, DEV, setup
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.gpu.render import render
from stitchtune.lower.entry import lower

GOLDEN = Path(__file__).resolve().parent / "golden" / "heuristic"
REPRESENTATIVE = ("layernorm", "softmax", "rmsnorm", "colsum_sigmoid_scale", "bias_gelu", "layernorm_wide",
                  "layernorm_backward", "embed_gather_layernorm")


@pytest.mark.parametrize("name", REPRESENTATIVE)
def test_heuristic_kernel_renders_as_recorded(name: str) -> None:
    g, plan, space = setup(f"{name}.json")
    s = heuristic_schedule(plan, DEV, space)
    src = render(lower(g, plan, s, DEV, space))
    assert_matches_golden(GOLDEN / f"{name}.cu", f"// schedule {s.to_json()}\n{src}", f"the heuristic kernel of {name}")
