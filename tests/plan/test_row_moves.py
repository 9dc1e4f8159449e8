"""Row moves pushed below row-local computations (stitchtune/plan/row_moves.py): the rewritten graph
computes exactly what the graph as given computes (float64 reference, same inputs and outputs), the
per-column weights stay where they are, and every graph the rewrite does not apply to is returned as
it is (so the kernels of every graph planned before are unchanged)."""

from __future__ import annotations

from typing import Any

import numpy as np

from stitchtune.graph.node_lists import layernorm_rows
from helpers.lowering import float_graph as _graph
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.plan.row_moves import commute_row_moves, row_moves

from lower.test_layout_index_mixes import (rolled_biased_tokens, rolled_layernorm,  # the Swin graphs
                                           rolled_layernorm_output, rolled_layernorm_saved, shifted_windows)


def _same_values(g, h) -> None:
    assert (g.input_names, g.outputs) == (h.input_names, h.outputs)
    inputs = random_inputs(g, 3)
    want, got = run_reference(g, inputs), run_reference(h, inputs)
    for o in g.outputs:
        assert np.array_equal(want[o], got[o]), o


def test_the_roll_moves_below_the_layernorm() -> None:
    g = rolled_layernorm()
    (move,) = row_moves(g)
    assert (move.root, move.sources, move.top, move.views, move.moved_inputs) == ("r2", ("xv",), "xb", ("xv",), ("x",))
    assert move.tree == ("a1", "a2", "r1", "b1", "b2", "r2")
    assert move.computed == ("m", "xc", "sq", "var", "ve", "rs", "xn", "xg", "xb")
    h = commute_row_moves(g)
    nodes = {nd.id: nd for nd in h.nodes}
    assert {"m", "xb", "xv", "a1"}.isdisjoint(nodes)          # the old LayerNorm and roll are gone
    assert nodes["r2"].op == "add" and nodes["r2"].shape == (1, 8, 8, 8)   # the LayerNorm's last node
    movers = [nd for nd in h.nodes if nd.op in ("slice", "concat")]
    assert len(movers) == 6 and all(nd.tensor_args[0] != "g" for nd in movers)  # x moved; g, b read as they are
    assert [nd.axes for nd in h.nodes if nd.op == "reduce_mean"] == [(3,), (3,)]
    _same_values(g, h)
    assert commute_row_moves(h) is h


def test_every_varying_input_moves_with_the_rows() -> None:
    g = rolled_layernorm_output()
    (move,) = row_moves(g)
    assert move.sources == ("xb",) and move.views == () and move.moved_inputs == ("x", "y")
    _same_values(g, commute_row_moves(g))


def test_values_also_read_in_their_own_order_are_made_again_there() -> None:
    g = rolled_layernorm_saved()
    (move,) = row_moves(g)
    assert move.moved_inputs == ("p", "y") and "pv" in move.computed   # a view of tokens inside the computation
    assert move.kept == ("xr", "m", "rs")
    h = commute_row_moves(g)
    nodes = {nd.id: nd for nd in h.nodes}
    assert all(nodes[k].op == "reshape" and nodes[k].shape == g.spec(k).shape for k in move.kept)
    assert nodes[str(nodes["m"].args[0])].op == "reduce_mean" and nodes[str(nodes["m"].args[0])].shape == (1, 8, 8, 1)
    assert sum(nd.op == "reduce_mean" for nd in h.nodes) == 4   # the rolled LayerNorm and the kept statistics
    _same_values(g, h)


def test_graphs_the_rewrite_does_not_apply_to_are_returned_as_they_are() -> None:
    cases = {
        "no reduction under the roll (remapped loads already)": rolled_biased_tokens(),
        "the roll of an input": shifted_windows(),
        "no index op": _graph({"x": [4, 8], "g": [8], "b": [8]}, layernorm_rows("x"), ["xb"]),
    }
    ln = layernorm_rows("x")
    inner = [{"id": "s1", "op": "slice", "args": ["xb"], "axis": 1, "start": 2, "stop": 8},
             {"id": "s2", "op": "slice", "args": ["xb"], "axis": 1, "start": 0, "stop": 2},
             {"id": "r", "op": "concat", "args": ["s1", "s2"], "axis": 1}]
    cases["a roll along the innermost axis"] = _graph({"x": [4, 8], "g": [8], "b": [8]}, ln + inner, ["r"])
    outer = [dict(n, axis=0, stop=n["stop"] - 4 if n["stop"] == 8 else n["stop"]) if n["op"] == "slice" else
             dict(n, axis=0) for n in inner]
    per_row = [dict(n, args=["mu" if a == "m" else a for a in n["args"]]) for n in ln if n["id"] != "m"]
    cases["a per-row input"] = _graph({"x": [4, 8], "mu": [4, 1], "g": [8], "b": [8]}, per_row + outer, ["r"])
    for why, g in cases.items():
        assert commute_row_moves(g) is g, why
    # the outer roll of the same LayerNorm does move
    moved = _graph({"x": [4, 8], "g": [8], "b": [8]}, ln + outer, ["r"])
    assert commute_row_moves(moved) is not moved
    _same_values(moved, commute_row_moves(moved))


def test_slices_of_rows_are_taken_before_the_rows_are_computed() -> None:
    """``(x - max(x))[2:4]`` and the rotation of ``x - max(x)`` along the rows: once refused (the output
    does not span the domain the reduction sets; a per-row value under a row-axis shift), now the rows
    computed from the moved rows of ``x``, row plans that emulate like the reference."""
    from helpers.lowering import check_emulates
    from stitchtune.plan.planner import make_plan

    head = [{"id": "m", "op": "reduce_max", "args": ["x"], "axes": [-1], "keepdims": True},
            {"id": "d", "op": "sub", "args": ["x", "m"]}]
    part = _graph({"x": [6, 8]}, head + [{"id": "y", "op": "slice", "args": ["d"], "axis": 0, "start": 2, "stop": 4}], ["y"])
    turn = _graph({"x": [6, 8]}, head + [{"id": "a", "op": "slice", "args": ["d"], "axis": 0, "start": 2, "stop": 6},
                                         {"id": "b", "op": "slice", "args": ["d"], "axis": 0, "start": 0, "stop": 2},
                                         {"id": "y", "op": "concat", "args": ["a", "b"], "axis": 0}], ["y"])
    for g, rows in ((part, 2), (turn, 6)):
        (move,) = row_moves(g)
        assert (move.root, move.sources, move.moved_inputs) == ("y", ("d",), ("x",))
        _same_values(g, commute_row_moves(g))
        plan = make_plan(g)
        assert (plan.family, plan.M, plan.N) == ("row", rows, 8)
        check_emulates(g, 2, 3)


def _random_case(seed: int):
    """A random row-local computation (a residual sum maybe, a max- or mean-centred row, a per-column weight,
    an exp maybe) of ``[B, H, C]`` under random moves of rows (a roll or a slice along axis 0 or 1, maybe
    twice), its centred value maybe an output too."""
    import random

    rnd = random.Random(seed)
    B, H, C = rnd.choice([1, 2, 3]), rnd.choice([4, 5, 6]), rnd.choice([4, 8])
    inputs = {"x": [B, H, C], "g": [C]}
    src = "x"
    nodes: list[dict[str, Any]] = []
    if rnd.random() < 0.5:
        inputs["y"] = [B, H, C]
        nodes.append({"id": "s", "op": "add", "args": ["x", "y"]})
        src = "s"
    red = rnd.choice(["reduce_mean", "reduce_max"])
    nodes += [{"id": "m", "op": red, "args": [src], "axes": [-1], "keepdims": True},
              {"id": "d", "op": "sub", "args": [src, "m"]},
              {"id": "w", "op": "mul", "args": ["d", "g"]}]
    top = "w"
    if rnd.random() < 0.5:
        nodes.append({"id": "e", "op": "exp", "args": ["w"]})
        top = "e"
    shape = [B, H, C]
    for k in range(rnd.choice([1, 2])):
        axis = rnd.choice([a for a in (0, 1) if shape[a] > 1])
        n = shape[axis]
        cut = rnd.randrange(1, n)
        if rnd.random() < 0.6:   # a roll by cut
            nodes += [{"id": f"a{k}", "op": "slice", "args": [top], "axis": axis, "start": cut, "stop": n},
                      {"id": f"b{k}", "op": "slice", "args": [top], "axis": axis, "start": 0, "stop": cut},
                      {"id": f"r{k}", "op": "concat", "args": [f"a{k}", f"b{k}"], "axis": axis}]
        else:                    # rows cut..n
            nodes.append({"id": f"r{k}", "op": "slice", "args": [top], "axis": axis, "start": cut, "stop": n})
            shape[axis] = n - cut
        top = f"r{k}"
    outputs = [top] + (["d"] if rnd.random() < 0.3 else [])
    return _graph(inputs, nodes, outputs)


def test_random_row_moves_plan_and_emulate_like_the_reference() -> None:
    """Each rewritten graph computes what its graph computes; each that plans emulates like the reference;
    a refusal (size-1 pieces of a roll of two batches, a slice leaving one row: planner limits of the
    rewritten graph too) is one line, the given graph's."""
    from helpers.lowering import check_emulates
    from stitchtune.errors import UnsupportedGraphError
    from stitchtune.plan.planner import make_plan

    moved = 0
    for seed in range(8):
        g = _random_case(seed)
        _same_values(g, commute_row_moves(g))
        try:
            plan = make_plan(g)
        except UnsupportedGraphError as e:
            named = str(e).split("'")[1]
            assert "\n" not in str(e) and named in {nd.id for nd in g.nodes} | set(g.input_names), (seed, str(e))
            continue
        assert plan.family == "row", seed
        moved += plan.moved_rows
        check_emulates(g, 1, seed)
    assert moved >= 5
