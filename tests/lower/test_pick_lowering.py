"""``gather_elements`` picks in row kernels (``stitchtune.lower.gather.pick_value``): cross entropy with
integer targets emulates against the float64 reference for the heuristic and sampled schedules (odd
shapes, bf16 logits, a per-column bias inside the picked expression), an out-of-range target gives
0.0 and raises the node's error flag (never an out-of-bounds load: the emulator checks every address),
and the cross-entropy kernel is one launch under the grid combine."""

from __future__ import annotations

import random

import numpy as np
import pytest

from helpers.graphs import ce_graph, ce_ignore_graph, int_next_to_pick_graph
from helpers.lowering import DEV, rel_err
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.emulate.emulator import emulate_program
from stitchtune.graph.parse import parse_graph
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.lower.entry import lower
from stitchtune.lower.gather import gather_flag_buffers
from stitchtune.plan.planner import make_plan
from stitchtune.space import SearchSpace
from stitchtune.space.options import CROSS_COMBINE

ALL = lambda k: 1 << 30  # noqa: E731  (every grid co-resident)


def _schedules(g, n: int = 3):
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    return plan, space, [heuristic_schedule(plan, DEV, space)] + [space.sample(random.Random(i)) for i in range(n)]


def _check(g, inputs, tol: float) -> None:
    ref = run_reference(g, inputs)
    plan, space, scheds = _schedules(g)
    for s in scheds:
        out = emulate_program(lower(g, plan, s, DEV, space), inputs, coresident_limit=ALL)
        errs = {o: rel_err(out[o], ref[o]) for o in ref}
        assert max(errs.values()) < tol, (s.to_json(), errs)


@pytest.mark.parametrize("rows,cols,dtype,tol", [(16, 1000, "float32", 1e-5), (5, 37, "float32", 1e-5),
                                                 (9, 130, "bfloat16", 1e-2)])
def test_cross_entropy_matches_the_reference(rows: int, cols: int, dtype: str, tol: float) -> None:
    g = ce_graph(rows, cols, dtype, outputs=("loss", "picked"))
    _check(g, random_inputs(g, 1), tol)


def test_a_per_column_bias_and_an_input_pick() -> None:
    """``picked = (x + bias)[t]`` next to ``raw = x[t]`` read straight from the input, and a row sum."""
    g = parse_graph({"name": "b", "inputs": {"x": {"shape": [6, 48], "dtype": "float32"},
                                             "bias": {"shape": [48], "dtype": "float32"},
                                             "t": {"shape": [6, 1], "dtype": "int32"}},
                     "nodes": [{"id": "xb", "op": "add", "args": ["x", "bias"]},
                               {"id": "s", "op": "reduce_sum", "args": ["xb"], "axes": [-1], "keepdims": True},
                               {"id": "picked", "op": "gather_elements", "args": ["xb", "t"], "axis": -1},
                               {"id": "raw", "op": "gather_elements", "args": ["x", "t"], "axis": 1},
                               {"id": "d", "op": "sub", "args": ["s", "picked"]}],
                     "outputs": ["d", "raw"]})
    _check(g, random_inputs(g, 2), 1e-5)


@pytest.mark.parametrize("make", [ce_graph, ce_ignore_graph])
def test_out_of_range_targets_give_zero_and_the_flag(make) -> None:
    """An index read from the input, or computed in the kernel (``where(t != -100, t, 0)`` keeps -1, 40
    and 2**40 of 40 classes): the pick is 0.0 (as the reference gives) and the flag is raised; no load
    leaves the tensor (the emulator checks)."""
    g = make(8, 40, outputs=("loss", "picked"))
    x = random_inputs(g, 3)
    x["target"][[1, 4, 6], 0] = [-1, 40, 2**40]
    ref = run_reference(g, x)
    assert ref["picked"].ravel()[[1, 4, 6]].tolist() == [0.0, 0.0, 0.0]
    plan, space, scheds = _schedules(g, 2)
    for s in scheds:
        prog = lower(g, plan, s, DEV, space)
        assert set(gather_flag_buffers(prog).values()) == {"picked"}
        scratch: dict[str, np.ndarray] = {}
        out = emulate_program(prog, x, coresident_limit=ALL, scratch_out=scratch)
        assert max(rel_err(out[o], ref[o]) for o in ref) < 1e-5, s.to_json()
        assert all(scratch[b][0] > 0 for b in gather_flag_buffers(prog)), s.to_json()
        clean: dict[str, np.ndarray] = {}
        emulate_program(prog, random_inputs(g, 3), coresident_limit=ALL, scratch_out=clean)
        assert all(clean[b][0] == 0 for b in gather_flag_buffers(prog))


@pytest.mark.parametrize("make", [ce_graph, ce_ignore_graph])
def test_cross_entropy_is_one_launch_under_the_grid_combine(make) -> None:
    """Also with ``ignore_index`` (two rows ignored): the count and the masked sum share the combine."""
    g = make(64, 1000)
    plan, space, _ = _schedules(g, 0)
    s = next(s for s in (space.sample(random.Random(i)) for i in range(400))
             if s.option(CROSS_COMBINE) == "grid" and set(s.schemes) <= {"local", "regional", "global"})
    prog = lower(g, plan, s, DEV, space)
    assert len(prog.launches) == 1, [ln.kernel for ln in prog.launches]
    x = random_inputs(g, 4)
    x["target"][[5, 17], 0] = -100 if make is ce_ignore_graph else x["target"][[5, 17], 0]
    out = emulate_program(prog, x, coresident_limit=ALL)
    assert rel_err(out["loss"], run_reference(g, x)["loss"]) < 1e-5


def test_picks_emulate_under_split_rows_clusters_and_kernel_boundaries() -> None:
    """Without a cross reduction the space splits long rows over blocks (global / cluster schemes) and
    cuts kernels (independent): the pick is recomputed where each kernel needs it."""
    d = ce_graph(4, 4096, outputs=("loss", "picked")).to_dict()
    d["nodes"] = [nd for nd in d["nodes"] if nd["id"] not in ("nll", "total", "loss")]
    d["nodes"].append({"id": "y", "op": "mul", "args": ["logp", "picked"]})
    d["outputs"] = ["picked", "y"]
    g = parse_graph(d)
    plan, space, _ = _schedules(g, 0)
    x = random_inputs(g, 2)
    ref = run_reference(g, x)
    seen = set()
    for i in range(14):
        s = space.sample(random.Random(i))
        seen.add(s.split > 1)
        prog = lower(g, plan, s, DEV, space)
        out = emulate_program(prog, x, coresident_limit=ALL, cluster_limit=ALL)
        assert max(rel_err(out[o], ref[o]) for o in ref) < 1e-5, s.to_json()
    assert seen == {True, False}


def test_compiled_graph_reports_an_out_of_range_target_by_name(tmp_path) -> None:
    from stitchtune.deploy.compiled import compile as st_compile
    from stitchtune.errors import StitchtuneError

    g = ce_graph(8, 40)
    cg = st_compile(g, db=tmp_path / "none", device="h200", build=False)
    x = random_inputs(g, 5)
    assert abs(float(cg.emulate(**x)["loss"].ravel()[0]) - float(run_reference(g, x)["loss"].ravel()[0])) < 1e-5
    x["target"][2, 0] = 40
    with pytest.raises(StitchtuneError) as e:
        cg.emulate(**x)
    assert e.value.problems[0].startswith("gather 'picked': index out of range")


def _ce_targets(rows: int, cols: int, ignored: list[int], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    t = rng.integers(0, cols, (rows, 1))
    t[ignored, 0] = -100
    return {"logits": rng.standard_normal((rows, cols)).astype(np.float32), "target": t}


@pytest.mark.parametrize("rows,cols,ignored", [(16, 100, [3]), (7, 37, [0, 1, 6]), (33, 130, [])])
def test_cross_entropy_with_ignore_index_matches_the_reference(rows: int, cols: int, ignored: list[int]) -> None:
    """The pick's index computed in the kernel (``where(t != -100, t, 0)``), the loss the masked sum over
    the count: heuristic and sampled schedules against the float64 reference and torch's own loss."""
    import torch
    import torch.nn.functional as F

    g = ce_ignore_graph(rows, cols, outputs=("loss", "picked"))
    x = _ce_targets(rows, cols, ignored, rows)
    _check(g, x, 1e-5)
    want = F.cross_entropy(torch.from_numpy(x["logits"]), torch.from_numpy(x["target"][:, 0]), ignore_index=-100)
    assert abs(float(run_reference(g, x)["loss"].ravel()[0]) - float(want)) < 1e-5


def test_cross_entropy_with_every_row_ignored_gives_nan_without_the_flag() -> None:
    g = ce_ignore_graph(6, 40)
    x = _ce_targets(6, 40, list(range(6)), 1)
    plan, space, scheds = _schedules(g, 2)
    for s in scheds:
        prog = lower(g, plan, s, DEV, space)
        scratch: dict[str, np.ndarray] = {}
        out = emulate_program(prog, x, coresident_limit=ALL, scratch_out=scratch)
        assert np.isnan(out["loss"]).all() and np.isnan(run_reference(g, x)["loss"]).all(), s.to_json()
        assert all(scratch[b][0] == 0 for b in gather_flag_buffers(prog)), s.to_json()


def test_int_arithmetic_next_to_a_pick_read_by_input_index() -> None:
    """Int registers (``t + 1`` cast to float) beside a pick whose index is the input itself."""
    g = int_next_to_pick_graph(5, 24)
    _check(g, random_inputs(g, 6), 1e-5)
