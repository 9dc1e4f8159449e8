"""Rows of one (issue 41, item 1): an extent of 1 (batch 1, one position) plans like any other extent.

A layer norm of ``x [1, N]`` used to be refused ("reduction 'mean' over the rows is read by another
node"): its reductions reduce every live axis, so they were taken for cross reductions (a loss); now a
reduction that keeps a dim of its source is a row reduction of one row, and every tensor of such a
view has the classes of the same graph with more rows. The kernels of [1, N] for N from 768 to 16384
emulate equal to the float64 reference, and a long row is split over blocks (task splitting)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from helpers.common import EXAMPLES
import stitchtune
from stitchtune.deploy.selection import clear_cache
from stitchtune.graph.parse import Graph, parse_graph
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.plan.planner import TensorClass, make_plan


def _one_row(name: str, n: int, lead: tuple[int, ...] = (1,)) -> Graph:
    """Example ``name`` with its 2-D inputs made ``lead + [n]`` and its 1-D ones ``[n]``."""
    obj: dict[str, Any] = json.loads((EXAMPLES / f"{name}.json").read_text())
    for spec in obj["inputs"].values():
        spec["shape"] = [*lead, n] if len(spec["shape"]) >= 2 else [n]
    obj["name"] = f"{name}_1x{n}"
    return parse_graph(obj)


@pytest.mark.parametrize("lead", [(1,), (1, 1), (1, 1, 1)], ids=["2d", "3d", "4d"])
def test_a_layernorm_of_one_row_is_a_row_plan(lead: tuple[int, ...]) -> None:
    p = make_plan(_one_row("layernorm_small", 1024, lead))
    assert (p.family, p.M, p.N, p.cross) == ("row", 1, 1024, ())
    assert p.stages == (("mean",), ("var",))
    assert p.cls("x") is TensorClass.FULL and p.cls("mean") is TensorClass.PER_KEPT
    assert p.cls("rstd") is TensorClass.PER_KEPT and p.cls("y") is TensorClass.FULL


def test_a_decode_rmsnorm_is_a_row_plan() -> None:
    """Mistral's RMSNorm at one position: ``mean(x * x, -1)`` of ``[1, 1, H]`` (was refused: "reduces
    tensor 'pow_1', which varies along neither the rows nor the whole view")."""
    p = make_plan(_one_row("rmsnorm_small", 4096, (1, 1)))
    assert (p.family, p.M, p.N, p.cross, p.reductions) == ("row", 1, 4096, (), ("ms",))


def _loss(rows: int, n: int = 512) -> Graph:
    obj = json.loads((EXAMPLES / "mse_loss_small.json").read_text())
    for spec in obj["inputs"].values():
        spec["shape"] = [rows, n]
    return parse_graph(obj)


def test_a_loss_of_one_row_is_a_row_reduction() -> None:
    """A reduction of everything (a loss) stays a cross reduction over several rows; over one row (the
    domain has one live axis; it was refused) it is that row's reduction, split over blocks if long."""
    assert [c.kind for c in make_plan(_loss(256)).cross] == ["scalar"]
    p = make_plan(_loss(1))
    assert (p.family, p.M, p.N, p.cross, p.reductions) == ("row", 1, 512, (), ("loss",))
    clear_cache()
    g = _loss(1, 8192)
    ins = random_inputs(g, 0)
    out, ref = stitchtune.compile(g, db=None, device="h200", build=False).emulate(**ins), run_reference(g, ins)
    assert abs(float(out["loss"].reshape(())) - float(ref["loss"].reshape(()))) < 1e-5 * abs(float(ref["loss"].reshape(())))


@pytest.mark.parametrize("name", ["layernorm_small", "rmsnorm_small", "softmax_small"])
@pytest.mark.parametrize("n", [768, 1000, 4096, 16384])
def test_one_row_compiles_and_emulates_equal_to_the_reference(name: str, n: int) -> None:
    clear_cache()
    g = _one_row(name, n)
    cg = stitchtune.compile(g, db=None, device="h200", build=False)
    ins = random_inputs(g, n)
    out, ref = cg.emulate(**ins), run_reference(g, ins)
    for o in ref:
        scale = max(1.0, float(np.abs(ref[o]).max()))
        assert float(np.abs(out[o] - ref[o]).max()) / scale < 1e-5, (name, n, o)
    s = cg.schedule
    if n > 1024:  # a long row is spread over a whole block, or several (task splitting), never one warp
        assert s.tpr == 1024, s
    if n == 16384:
        assert s.split > 1, s


@pytest.mark.parametrize("shape", [[4, 1], [1, 1], [2, 4, 1, 1]])
def test_a_softmax_over_one_key_is_the_identity_chain(shape: list[int]) -> None:
    """Reductions over extents of 1 only (a softmax over one key) are planned as the identities they
    are (they were refused: 'leaves a full-size result'); the kernels emulate equal to the reference."""
    obj = json.loads((EXAMPLES / "softmax_small.json").read_text())
    obj["inputs"]["x"]["shape"] = shape
    g = parse_graph(obj)
    p = make_plan(g)
    assert p.unit_reductions == ("m", "s") and not p.moved_rows and p.reductions == ()
    assert p.planned_graph(g) is p.moved_graph and {nd.op for nd in p.moved_graph.nodes} >= {"maximum"}
    clear_cache()
    ins = random_inputs(g, 0)
    out = stitchtune.compile(g, db=None, device="h200", build=False).emulate(**ins)
    assert np.array_equal(out["y"], run_reference(g, ins)["y"].astype(np.float32))


def test_a_layernorm_backward_at_batch_one_plans() -> None:
    """dgamma / dbeta of one row: sums over an extent of 1 (identities), beside the row's own sums."""
    obj = json.loads((EXAMPLES / "layernorm_backward_small.json").read_text())
    for spec in obj["inputs"].values():
        if len(spec["shape"]) == 2:
            spec["shape"][0] = 1
    g = parse_graph(obj)
    p = make_plan(g)
    assert set(p.unit_reductions) == {"dgamma", "dbeta"} and p.M == 1 and not p.cross
    clear_cache()
    ins = random_inputs(g, 0)
    out, ref = stitchtune.compile(g, db=None, device="h200", build=False).emulate(**ins), run_reference(g, ins)
    for o in ref:
        assert float(np.abs(out[o] - ref[o]).max()) < 1e-4 * max(1.0, float(np.abs(ref[o]).max())), o
