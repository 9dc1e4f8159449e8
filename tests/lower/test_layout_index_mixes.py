"""Mixed regions beyond the head split (stitchtune/plan/chains.py ``layout_part``): a transpose /
reshape / expand of a tensor *computed* before the index ops (a per-head RMSNorm of q followed by
the rotary, Qwen3-style; the rotary angles ``cat(freqs, freqs)`` computed in the region from the
positions, Llama-style), and slice / concat along outer axes next to a window partition (Swin's
shifted windows: ``roll`` as slice + concat along H and W), also right after Swin's LayerNorm (the roll pushed below the row-local
LayerNorm: stitchtune/plan/row_moves.py). Each plans, emulates like the float64 reference (the
emulator faults on any out-of-bounds, unwritten or racy access) and compiles; what is still not
planned (a transpose before the roll, a statistic over the tokens, a per-row input under the roll) is
one named line."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from stitchtune.graph.node_lists import layernorm_rows
from helpers.lowering import check_emulates, DEV, emulated_errors, float_graph as _graph
from helpers.nvcc import BUILDER_FLAGS, compile_programs_sm90, heuristic_programs
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.errors import UnsupportedGraphError
from stitchtune.gpu.build import nvcc_found
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.plan.planner import make_plan
from stitchtune.plan import row_moves as row_moves_module
from stitchtune.plan.chains import composed_chains, layout_part, layout_tails
from stitchtune.plan.row_moves import commute_row_moves
from stitchtune.space import SearchSpace


def _rotate(src: str, D: int, pre: str = "r") -> list[dict[str, Any]]:
    """``src * cos + rotate_half(src) * sin`` along the innermost axis (``D`` even)."""
    h = D // 2
    return [{"id": f"{pre}x2", "op": "slice", "args": [src], "axis": -1, "start": h, "stop": D},
            {"id": f"{pre}n", "op": "neg", "args": [f"{pre}x2"]},
            {"id": f"{pre}x1", "op": "slice", "args": [src], "axis": -1, "start": 0, "stop": h},
            {"id": f"{pre}rot", "op": "concat", "args": [f"{pre}n", f"{pre}x1"], "axis": -1},
            {"id": f"{pre}qc", "op": "mul", "args": [src, "cos"]},
            {"id": f"{pre}rs", "op": "mul", "args": [f"{pre}rot", "sin"]},
            {"id": f"{pre}out", "op": "add", "args": [f"{pre}qc", f"{pre}rs"]}]


def qk_norm_rotary(B: int = 2, S: int = 4, H: int = 2, D: int = 8) -> Any:
    """Qwen3's q path: ``[B, S, H*D]`` split into heads, RMSNorm over each head's D (weight ``[D]``),
    transposed to ``[B, H, S, D]`` and rotated (cos / sin ``[S, D]``)."""
    nodes = [{"id": "xr", "op": "reshape", "args": ["x"], "shape": [B, S, H, D]},
             {"id": "sq", "op": "mul", "args": ["xr", "xr"]},
             {"id": "ms", "op": "reduce_mean", "args": ["sq"], "axes": [-1], "keepdims": True},
             {"id": "eps", "op": "add", "args": ["ms", 1e-6]},
             {"id": "rs", "op": "rsqrt", "args": ["eps"]},
             {"id": "nn", "op": "mul", "args": ["xr", "rs"]},
             {"id": "nw", "op": "mul", "args": ["nn", "w"]},
             {"id": "q", "op": "transpose", "args": ["nw"], "perm": [0, 2, 1, 3]}] + _rotate("q", D)
    return _graph({"x": [B, S, H * D], "w": [D], "cos": [S, D], "sin": [S, D]}, nodes, ["rout"])


def rotary_with_angles(B: int = 1, S: int = 8, H: int = 4, D: int = 8) -> Any:
    """Llama's rotary with its angles computed in the region: ``freqs = pos * inv_freq`` ``[1, S, D/2]``,
    ``cat(freqs, freqs)`` as PyTorch decomposes it (reshape, expand, reshape to ``[1, 1, S, D]``), cos and
    sin of it, applied to q after the head split."""
    nodes = [{"id": "fr", "op": "mul", "args": ["pos", "inv"]},
             {"id": "fu", "op": "reshape", "args": ["fr"], "shape": [1, S, 1, D // 2]},
             {"id": "fe", "op": "expand", "args": ["fu"], "shape": [1, S, 2, D // 2]},
             {"id": "emb", "op": "reshape", "args": ["fe"], "shape": [1, 1, S, D]},
             {"id": "cos", "op": "cos", "args": ["emb"]},
             {"id": "sin", "op": "sin", "args": ["emb"]},
             {"id": "xr", "op": "reshape", "args": ["x"], "shape": [B, S, H, D]},
             {"id": "q", "op": "transpose", "args": ["xr"], "perm": [0, 2, 1, 3]}] + _rotate("q", D)
    return _graph({"x": [B, S, H * D], "pos": [1, S, 1], "inv": [D // 2]}, nodes, ["rout"])


def test_a_layout_before_the_index_ops_keeps_its_shapes() -> None:
    g = qk_norm_rotary()
    assert layout_tails(g) == set()  # q is no tail: it is read by the rotary
    assert {"xr", "sq", "ms", "rs", "nn", "nw", "q"} <= layout_part(g)
    assert composed_chains(g) == {}  # xr feeds the norm, which keeps its own shape: not a chain
    plan = make_plan(g)
    assert (plan.family, plan.M, plan.N) == ("row", 2 * 2 * 4, 8)  # rows B*S*H, the head dim reduced


def test_angles_in_the_region_make_the_whole_head_dim_the_columns() -> None:
    plan = make_plan(rotary_with_angles())
    assert (plan.family, plan.M, plan.N) == ("elementwise", 4 * 8, 8)  # not the half D/2 of the expand
    assert plan.imap("inv").partial_cols  # inv_freq repeats along the columns: ((c % 4))


def shifted_windows(B: int = 1, H: int = 8, W: int = 8, C: int = 4, w: int = 4, s: int = 2) -> Any:
    """Swin's shifted windows: ``roll(x, (-s, -s), (1, 2))`` of ``[B, H, W, C]`` as ONNX exports it (slice +
    concat along H, then along W), then the window partition ``[B, H/w, w, W/w, w, C]`` -> transpose ->
    ``[B * nW, w*w, C]`` (trailing maps of the output)."""
    nodes = [{"id": "a1", "op": "slice", "args": ["x"], "axis": 1, "start": s, "stop": H},
             {"id": "a2", "op": "slice", "args": ["x"], "axis": 1, "start": 0, "stop": s},
             {"id": "r1", "op": "concat", "args": ["a1", "a2"], "axis": 1},
             {"id": "b1", "op": "slice", "args": ["r1"], "axis": 2, "start": s, "stop": W},
             {"id": "b2", "op": "slice", "args": ["r1"], "axis": 2, "start": 0, "stop": s},
             {"id": "r2", "op": "concat", "args": ["b1", "b2"], "axis": 2},
             {"id": "v", "op": "reshape", "args": ["r2"], "shape": [B, H // w, w, W // w, w, C]},
             {"id": "t", "op": "transpose", "args": ["v"], "perm": [0, 1, 3, 2, 4, 5]},
             {"id": "o", "op": "reshape", "args": ["t"], "shape": [B * (H // w) * (W // w), w * w, C]}]
    return _graph({"x": [B, H, W, C]}, nodes, ["o"])


def test_shifted_windows_plan_over_the_rolled_tensor() -> None:
    g = shifted_windows()
    assert layout_tails(g) == {"v", "t", "o"}
    plan = make_plan(g)
    assert (plan.family, plan.M, plan.N, plan.moved_rows) == ("elementwise", 8 * 8, 4, False)
    assert plan.imap("o").bijective and not plan.imap("o").plain  # stored window by window


def _roll_of(pre: list[dict[str, Any]], x: dict[str, list[int]]) -> Any:
    """:func:`shifted_windows` rolling the last of the nodes ``pre`` (of inputs ``x``) instead of ``x``."""
    nodes = [dict(n, args=[pre[-1]["id"] if a == "x" else a for a in n["args"]]) for n in shifted_windows().to_dict()["nodes"]]
    return _graph(x, pre + nodes, ["o"])


def rolled_tokens() -> Any:
    """The roll of tokens ``[B, H*W, C]`` viewed as ``[B, H, W, C]`` (a reshape keeps the row-major index)."""
    return _roll_of([{"id": "xv", "op": "reshape", "args": ["x"], "shape": [1, 8, 8, 4]}], {"x": [1, 64, 4]})


def rolled_biased_tokens() -> Any:
    """The roll of ``tokens + bias`` (a projection's output), viewed as ``[B, H, W, C]``: the bias is read at
    the shifted column only, the tokens at the shifted row-major offset."""
    return _roll_of([{"id": "xb", "op": "add", "args": ["x", "b"]},
                     {"id": "xv", "op": "reshape", "args": ["xb"], "shape": [1, 8, 8, 4]}], {"x": [1, 64, 4], "b": [4]})


def rolled_layernorm(C: int = 8) -> Any:
    """Swin's block start: ``layernorm_before`` of tokens ``[1, 64, C]``, viewed as ``[1, 8, 8, C]``, rolled
    by ``(-2, -2)`` along H and W (slice + concat) and partitioned into 4x4 windows. Planned with the roll
    pushed below the LayerNorm (:mod:`stitchtune.plan.row_moves`): each row's statistics are those of the
    source row it reads."""
    nodes = [dict(n, args=["xv" if a == "x" else a for a in n["args"]]) for n in shifted_windows(C=C).to_dict()["nodes"]]
    return _graph({"x": [1, 64, C], "g": [C], "b": [C]},
                  layernorm_rows("x") + [{"id": "xv", "op": "reshape", "args": ["xb"], "shape": [1, 8, 8, C]}] + nodes,
                  ["o"])


def rolled_layernorm_output(C: int = 8) -> Any:
    """A residual sum and its LayerNorm over ``[1, 8, 8, C]``, rolled along H and W and stored as it is: no
    layout op, both summands moved with the rows."""
    nodes = [{"id": "xy", "op": "add", "args": ["x", "y"]}] + layernorm_rows("xy")
    nodes += [dict(n, args=["xb" if a == "x" else a for a in n["args"]]) for n in shifted_windows(C=C).to_dict()["nodes"][:6]]
    return _graph({"x": [1, 8, 8, C], "y": [1, 8, 8, C], "g": [C], "b": [C]}, nodes, ["r2"])


def rolled_layernorm_saved(C: int = 8) -> Any:
    """Swin's block start as a training step's forward has it: the residual sum of a projection's ``[64, C]``
    (viewed as tokens) and the shortcut is an output too (the next residual reads it), and so are the
    LayerNorm's mean and 1/std (saved for the backward): each computed once more in the tokens' own order."""
    nodes = [{"id": "pv", "op": "reshape", "args": ["p"], "shape": [1, 64, C]},
             {"id": "xr", "op": "add", "args": ["pv", "y"]}] + layernorm_rows("xr")
    nodes += [{"id": "xv", "op": "reshape", "args": ["xb"], "shape": [1, 8, 8, C]}]
    nodes += [dict(n, args=["xv" if a == "x" else a for a in n["args"]]) for n in shifted_windows(C=C).to_dict()["nodes"]]
    return _graph({"p": [64, C], "y": [1, 64, C], "g": [C], "b": [C]}, nodes, ["o", "xr", "m", "rs"])


def rolled_back(C: int = 8, bias: bool = True, shortcut: bool = True, s: int = 2) -> Any:
    """Swin's shifted block after its window attention: the projection ``p`` ``[4, 16, C]`` (+ bias ``pb``),
    the window reverse ``[1, 2, 2, 4, 4, C]`` -> transpose -> ``[1, 8, 8, C]``, the roll back by ``s`` (slice
    + concat along H, then W), the tokens view ``[1, 64, C]``, the residual sum with ``y`` and
    ``layernorm_after``; the sum and the LayerNorm are outputs (the next residual reads the sum)."""
    nodes: list[dict[str, Any]] = []
    src = "p"
    if bias:
        nodes.append({"id": "pa", "op": "add", "args": ["p", "pb"]})
        src = "pa"
    nodes += [{"id": "wv", "op": "reshape", "args": [src], "shape": [1, 2, 2, 4, 4, C]},
              {"id": "wt", "op": "transpose", "args": ["wv"], "perm": [0, 1, 3, 2, 4, 5]},
              {"id": "x", "op": "reshape", "args": ["wt"], "shape": [1, 8, 8, C]},
              {"id": "a1", "op": "slice", "args": ["x"], "axis": 1, "start": 8 - s, "stop": 8},
              {"id": "a2", "op": "slice", "args": ["x"], "axis": 1, "start": 0, "stop": 8 - s},
              {"id": "r1", "op": "concat", "args": ["a1", "a2"], "axis": 1},
              {"id": "b1", "op": "slice", "args": ["r1"], "axis": 2, "start": 8 - s, "stop": 8},
              {"id": "b2", "op": "slice", "args": ["r1"], "axis": 2, "start": 0, "stop": 8 - s},
              {"id": "r2", "op": "concat", "args": ["b1", "b2"], "axis": 2},
              {"id": "tv", "op": "reshape", "args": ["r2"], "shape": [1, 64, C]}]
    res = "tv"
    if shortcut:
        nodes.append({"id": "res", "op": "add", "args": ["y", "tv"]})
        res = "res"
    inputs = {"p": [4, 16, C], "g": [C], "b": [C]} | ({"pb": [C]} if bias else {}) | ({"y": [1, 64, C]} if shortcut else {})
    return _graph(inputs, nodes + layernorm_rows(res), [res, "xb"])


def rolled_transposed(z: bool = False) -> Any:
    """The roll of ``x`` transposed (H and W swapped) before it (``z``: plus an input ``z`` of the rolled
    layout): a chain of the input read at shifted positions."""
    pre = [{"id": "xt", "op": "transpose", "args": ["x"], "perm": [0, 2, 1, 3]}]
    pre += [{"id": "xe", "op": "add", "args": ["xt", "z"]}] if z else []
    return _roll_of(pre, {"x": [1, 8, 8, 4]} | ({"z": [1, 8, 8, 4]} if z else {}))


def test_the_roll_back_after_attention_plans_in_the_rows_layout() -> None:
    plan = make_plan(rolled_back())
    assert (plan.family, plan.M, plan.N, plan.nstages, plan.moved_rows) == ("row", 64, 8, 2, True)
    h = plan.planned_graph(rolled_back())
    assert composed_chains(h) == {"x_rows": ("x_rows", "wt", "wv", "p")}   # the reverse of p alone
    assert {nd.id: nd.shape for nd in h.nodes if nd.op == "reduce_mean"} == {"m": (1, 8, 8, 1), "var": (1, 8, 8, 1)}
    plan = make_plan(rolled_transposed())   # no rewrite: the transposed input is a chain
    assert (plan.family, plan.M, plan.N, plan.moved_rows) == ("elementwise", 64, 4, False)


def test_a_layernorm_before_the_roll_plans_over_the_rolled_rows() -> None:
    plan = make_plan(rolled_layernorm())
    assert (plan.family, plan.M, plan.N, plan.nstages, plan.moved_rows) == ("row", 64, 8, 2, True)
    plan = make_plan(rolled_layernorm_saved())
    assert (plan.family, plan.M, plan.N) == ("row", 64, 8)
    assert plan.imap("xr").bijective and plan.imap("m").bijective  # stored in the tokens' own order
    assert plan.imap("o").bijective and not plan.imap("o").plain  # stored window by window
    plan = make_plan(rolled_layernorm_output())
    assert (plan.family, plan.M, plan.N, plan.nstages) == ("row", 64, 8, 2)


def test_the_plan_carries_the_rewritten_graph_and_the_lowering_does_not_rewrite_again(monkeypatch) -> None:
    g = rolled_layernorm()
    plan = make_plan(g)
    assert plan.moved_graph == commute_row_moves(g) and plan.planned_graph(g) is plan.moved_graph
    other = shifted_windows()
    with pytest.raises(ValueError, match="row-move rewrite of graph"):
        plan.planned_graph(other)
    assert make_plan(other).moved_graph is None and make_plan(other).planned_graph(other) is other

    def no_rewrite(graph: Any) -> Any:
        raise AssertionError("the lowering made the row-move rewrite again")
    space = SearchSpace.for_plan(plan, DEV)
    inputs = random_inputs(g, 3)
    ref = run_reference(g, inputs)
    monkeypatch.setattr(row_moves_module, "_commuted", no_rewrite)
    errors = emulated_errors(g, plan, space, heuristic_schedule(plan, DEV, space), inputs, ref)
    assert set(errors) == set(g.outputs) and max(errors.values()) < 1e-5, errors


def test_outer_rolls_that_stay_refused_are_one_named_line() -> None:
    # a full-size sum transposed before the roll: neither a chain of one input nor a per-column op below it
    g = _roll_of([{"id": "xe", "op": "add", "args": ["x", "z"]},
                  {"id": "xt", "op": "transpose", "args": ["xe"], "perm": [0, 2, 1, 3]}], {"x": [1, 8, 8, 4], "z": [1, 8, 8, 4]})
    with pytest.raises(UnsupportedGraphError, match="node 'xt': a slice/concat along an outer axis reads it through"):
        make_plan(g)
    # a statistic over the tokens (not row-local): the roll cannot move below it, and the mean over axis 1
    # makes it a column reduction
    ln: list[dict[str, Any]] = [{"id": "m", "op": "reduce_mean", "args": ["x"], "axes": [1], "keepdims": True},
          {"id": "xc", "op": "sub", "args": ["x", "m"]},
          {"id": "xv", "op": "reshape", "args": ["xc"], "shape": [1, 8, 8, 4]}]
    with pytest.raises(UnsupportedGraphError, match="column reduction 'm' next to slice / concat"):
        make_plan(_roll_of(ln, {"x": [1, 64, 4]}))
    # a per-row input under the roll (given means): moved, it would be a per-row value under a row shift
    nodes = [dict(n, args=["mu" if a == "m" else a for a in n["args"]]) for n in layernorm_rows("x") if n["id"] != "m"]
    g = _roll_of(nodes + [{"id": "xv", "op": "reshape", "args": ["xb"], "shape": [1, 8, 8, 4]}],
                 {"x": [1, 64, 4], "mu": [1, 64, 1], "g": [4], "b": [4]})
    with pytest.raises(UnsupportedGraphError, match="node 'xv': a slice/concat along an outer axis"):
        make_plan(g)


CASES: dict[str, Callable[[], Any]] = {"qk_norm_rotary": qk_norm_rotary, "rotary_with_angles": rotary_with_angles, "shifted_windows": shifted_windows,
         "rolled_tokens": rolled_tokens, "rolled_biased_tokens": rolled_biased_tokens,
         "rolled_layernorm": rolled_layernorm, "rolled_layernorm_output": rolled_layernorm_output,
         "rolled_layernorm_saved": rolled_layernorm_saved, "rolled_back": rolled_back,
         "rolled_back_plain": lambda: rolled_back(bias=False, shortcut=False, s=3), "rolled_transposed": rolled_transposed,
         "rolled_transposed_sum": lambda: rolled_transposed(z=True)}


@pytest.mark.parametrize("case", sorted(CASES))
def test_cases_match_the_reference(case: str) -> None:
    check_emulates(CASES[case](), 3, 3)


@pytest.mark.skipif(not nvcc_found(), reason="nvcc not installed")
def test_cases_compile_for_sm90(tmp_path) -> None:
    programs = heuristic_programs([make() for make in CASES.values()])
    # one translation unit for all cases, with the builder's flags; ptxas must report every kernel
    compile_programs_sm90(programs, tmp_path, flags=BUILDER_FLAGS)
