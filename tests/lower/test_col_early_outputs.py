"""A column program stores the outputs that follow no reduction in its first sweep (issue 39).

BERT's training ``region_view_56`` (a bias gradient after the attention's head merge: ``y = x`` viewed
``[B, H, S, D] -> [B, S, H * D]``, ``db = y.sum(0)``) has two outputs: the copy ``y`` and the column sum. The
copy needs no reduction result, but it was written by the output sweep after the combine: under the
heuristic's ``global`` scheme from a 32-float register cache held across the grid barrier (90 registers,
two rounds of tasks), under ``independent`` by a second kernel that read the input again. Now the first
sweep stores it as it reads it (:func:`stitchtune.lower.liveness.early_outputs`).
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from helpers.lowering import emulated_errors, float_graph
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.hardware.device import get_device
from stitchtune.ir import kir
from stitchtune.lower.entry import lower
from stitchtune.lower.liveness import early_outputs, node_args
from stitchtune.plan.planner import make_plan
from stitchtune.space import ReuseLevel, Schedule, SearchSpace

DEV = get_device("h200")


def head_merge_bias_grad(b: int = 2, h: int = 4, s: int = 16, d: int = 16) -> Any:
    """``region_view_56``'s ops at a small shape: ``[B * H, S, D]`` -> ``[B * S, H * D]`` and its column sum."""
    return float_graph({"x": [b * h, s, d]}, [
        {"id": "v", "op": "reshape", "args": ["x"], "shape": [b, h, s, d]},
        {"id": "p", "op": "transpose", "args": ["v"], "perm": [0, 2, 1, 3]},
        {"id": "y", "op": "reshape", "args": ["p"], "shape": [b * s, h * d]},
        {"id": "db", "op": "reduce_sum", "args": ["y"], "axes": [0], "keepdims": True}], ["y", "db"])


def batchnorm_like(m: int = 64, n: int = 64) -> Any:
    """A column mean subtracted: the output ``c`` follows the reduction (no early output), ``x2`` does not."""
    return float_graph({"x": [m, n]}, [
        {"id": "x2", "op": "mul", "args": ["x", 2.0]},
        {"id": "mu", "op": "reduce_mean", "args": ["x2"], "axes": [0], "keepdims": True},
        {"id": "c", "op": "sub", "args": ["x2", "mu"]}], ["x2", "c", "mu"])


def _schedule(g: Any, scheme: str, split: int) -> tuple[Any, Any, Any]:
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    d = heuristic_schedule(plan, DEV, space).to_dict()
    d.update(schemes=[scheme], split=split, tpr=4, block=128, vec=2, min_blocks=1,
             reuse=[ReuseLevel.REGISTER if c == "y" else lvl for c, lvl in zip(plan.reuse_candidates, d["reuse"])])
    s = Schedule.from_dict(d)
    space.check(s)
    return plan, space, s


def _stores(stmts: tuple[kir.Stmt, ...]) -> list[tuple[str, bool]]:
    """(buffer, after a grid barrier) of every global store, in program order."""
    out: list[tuple[str, bool]] = []
    synced = False
    for st in kir.walk(stmts):
        if isinstance(st, kir.GridSync):
            synced = True
        elif isinstance(st, kir.StoreVec):
            out.append((st.buf, synced))
    return out


def test_early_outputs_are_the_outputs_no_reduction_precedes() -> None:
    for g, want in ((head_merge_bias_grad(), ("y",)), (batchnorm_like(), ("x2",))):
        plan = make_plan(g)
        args = node_args({nd.id: nd for nd in g.nodes})
        assert early_outputs(plan, args, g.outputs) == want


def test_global_scheme_stores_the_copy_before_the_grid_barrier() -> None:
    g = head_merge_bias_grad()
    plan, space, s = _schedule(g, "global", 4)
    prog = lower(g, plan, s, DEV, space)
    (k,) = prog.kernels
    outs = {b.name for b in prog.buffers if b.role == "output"}
    stores = [(buf, after) for buf, after in _stores(tuple(k.body)) if buf in outs]
    copy = [after for buf, after in stores if buf != "out1"]
    assert copy and not any(copy)                          # the copy: before the barrier (was: after it)
    assert not k.locals                                      # and no register cache of it (was: rc<t>)


def test_independent_scheme_reads_the_input_once() -> None:
    g = head_merge_bias_grad()
    plan, space, s = _schedule(g, "independent", 4)
    prog = lower(g, plan, s, DEV, space)
    assert len(prog.kernels) == 2
    k0, k1 = prog.kernels
    assert "in0" in {pp.name for pp in k0.params}
    assert "in0" not in {pp.name for pp in k1.params}      # was: the second kernel read x again for the copy


@pytest.mark.parametrize("make", [head_merge_bias_grad, batchnorm_like])
@pytest.mark.parametrize("scheme,split", [("global", 4), ("independent", 4), ("global", 2), ("independent", 2),
                                          ("regional", 1)])
def test_emulates_the_reference(make: Any, scheme: str, split: int) -> None:
    g = make()
    plan, space, s = _schedule(g, scheme, split)
    inputs = random_inputs(g, 3)
    ref = run_reference(g, inputs)
    errs = emulated_errors(g, plan, space, s, inputs, ref)
    assert max(errs.values()) < 1e-5, (s.to_json(), errs)
    for i in range(3):   # and sampled schedules of the space
        t = space.sample(random.Random(i))
        errs = emulated_errors(g, plan, space, t, inputs, ref)
        assert max(errs.values()) < 1e-5, (t.to_json(), errs)
