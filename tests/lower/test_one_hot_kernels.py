"""Cross entropy's backward in one row kernel: a target's one-hot as ``where(iota == index, -1, 0)``
(what the torch importer makes of ``scatter(full(0), 1, index, -1.0)``), scaled by ``g / count`` read
from two ``[1]`` inputs (PyTorch's 0-d incoming gradient and count), minus ``softmax * rowsum``.
Emulated against the float64 reference and torch's own gradient for the heuristic and sampled
schedules; an index outside ``[0, cols)`` reads and writes nothing out of bounds (the emulator checks
every address: no address depends on the index) and leaves its row without a one-hot, as the
reference does; the heuristic schedule is one launch."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from helpers.graphs import ce_backward_graph, ce_items_graph
from helpers.lowering import DEV, rel_err
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.emulate.emulator import emulate_program
from stitchtune.graph.reference import run_reference
from stitchtune.lower.entry import lower
from stitchtune.plan.planner import make_plan
from stitchtune.space import SearchSpace
from stitchtune.space.options import CROSS_COMBINE

ALL = lambda k: 1 << 30  # noqa: E731  (every grid and cluster co-resident)


def _schedules(g: Any, n: int) -> tuple[Any, Any, list[Any]]:
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    return plan, space, [heuristic_schedule(plan, DEV, space)] + [space.sample(random.Random(i)) for i in range(n)]


def _inputs(rows: int, cols: int, ignored: list[int], seed: int) -> dict[str, np.ndarray]:
    """The backward's inputs as the forward leaves them: ``logp`` a real log-softmax, ``count`` the
    rows kept, the incoming gradient 1."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols))
    logp = x - x.max(1, keepdims=True)
    logp = (logp - np.log(np.exp(logp).sum(1, keepdims=True))).astype(np.float32)
    t = rng.integers(0, cols, (rows, 1))
    t[ignored, 0] = -100
    return {"g": np.ones(1, np.float32), "count": np.array([rows - len(ignored)], np.float32),
            "target": t, "logp": logp}


def _emulate_all(g: Any, x: dict[str, np.ndarray], n: int, tol: float) -> None:
    ref = run_reference(g, x)
    plan, space, scheds = _schedules(g, n)
    for s in scheds:
        out = emulate_program(lower(g, plan, s, DEV, space), x, coresident_limit=ALL, cluster_limit=ALL)
        assert rel_err(out["dx"], ref["dx"]) < tol, s.to_json()


@pytest.mark.parametrize("rows,cols,ignored", [(16, 100, [3]), (5, 37, [0, 4]), (9, 130, [])])
def test_cross_entropy_backward_matches_the_reference_and_torch(rows: int, cols: int, ignored: list[int]) -> None:
    import torch
    import torch.nn.functional as F

    g = ce_backward_graph(rows, cols)
    x = _inputs(rows, cols, ignored, rows)
    _emulate_all(g, x, 3, 1e-5)
    logits = torch.from_numpy(x["logp"]).requires_grad_()   # a log-softmax's log-softmax is itself
    F.cross_entropy(logits, torch.from_numpy(x["target"][:, 0]), ignore_index=-100).backward()
    assert logits.grad is not None
    assert np.abs(run_reference(g, x)["dx"] - logits.grad.numpy()).max() < 1e-6


def test_an_index_out_of_range_writes_nothing_and_reads_in_bounds() -> None:
    """``where(t != -100, t, 0)`` keeps -1, ``cols`` and 2**40: those rows get no one-hot (the
    reference's value); no load or store leaves its tensor under any schedule (the emulator raises on
    one)."""
    g = ce_backward_graph(8, 40)
    x = _inputs(8, 40, [2], 1)
    x["target"][[1, 4, 6], 0] = [-1, 40, 2**40]
    ref = run_reference(g, x)["dx"]
    assert np.allclose(ref[[1, 4, 6]].sum(1), 0.0, atol=1e-6)   # softmax * 0: no one-hot, no gradient
    _emulate_all(g, x, 4, 1e-5)


def test_the_heuristic_schedule_is_one_launch() -> None:
    g = ce_backward_graph(64, 1000)
    plan, space, [s] = _schedules(g, 0)
    prog = lower(g, plan, s, DEV, space)
    assert len(prog.launches) == 1, [ln.kernel for ln in prog.launches]
    out = emulate_program(prog, _inputs(64, 1000, [5, 17], 2), coresident_limit=ALL)
    assert rel_err(out["dx"], run_reference(g, _inputs(64, 1000, [5, 17], 2))["dx"]) < 1e-5


@pytest.mark.parametrize("dtype", ["int64", "float32"])
def test_the_scalar_epilogue_reads_a_one_element_input(dtype: str) -> None:
    """``loss = masked sum / num_items`` (transformers with ``num_items_in_batch``): the epilogue loads
    the ``[1]`` count (an int64 one cast to float) after the combine, in the main kernel (``grid``) or
    in the second kernel (``kernel``), which then reads it too."""
    g = ce_items_graph(16, 100, dtype)
    plan, space, _ = _schedules(g, 0)
    assert plan.epilogue[-1] == "loss"
    x = {"logits": np.random.default_rng(1).standard_normal((16, 100)).astype(np.float32),
         "target": np.arange(16).reshape(16, 1) * 3, "items": np.array([13], dtype)}
    x["target"][[2, 9], 0] = -100
    ref = run_reference(g, x)["loss"]
    combines = set()
    for s in (space.sample(random.Random(i)) for i in range(40)):
        if s.option(CROSS_COMBINE) in combines:
            continue
        combines.add(s.option(CROSS_COMBINE))
        prog = lower(g, plan, s, DEV, space)
        out = emulate_program(prog, x, coresident_limit=ALL, cluster_limit=ALL)
        assert rel_err(out["loss"], ref) < 1e-5, s.to_json()
    assert {"grid", "kernel"} <= combines


def one_hot_programs() -> list[Any]:
    """Programs of the backward graph and of a loss over a ``[1]`` count (the epilogue's load) for the
    batched sm_90 build (tests/lower/test_int_input_kernels.py)."""
    programs = []
    for g in (ce_backward_graph(16, 100), ce_items_graph(16, 100)):
        plan, space, scheds = _schedules(g, 2)
        programs += [lower(g, plan, s, DEV, space) for s in scheds]
    g = ce_items_graph(16, 100)
    plan, space, _ = _schedules(g, 0)
    for combine in ("grid", "kernel"):
        s = next(s for s in (space.sample(random.Random(i)) for i in range(100))
                 if s.option(CROSS_COMBINE) == combine)
        programs.append(lower(g, plan, s, DEV, space))
    return programs
