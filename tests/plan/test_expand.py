"""``expand`` (numpy ``broadcast_to``) in graph.json and as an index map, and ranks up to 6.

Llama's grouped K/V heads (``repeat_kv``: reshape ``[B, Hkv, S, D] -> [B, Hkv, 1, S, D]``, expand to
``[B, Hkv, n, S, D]``, reshape ``[B, Hkv*n, S, D]``) plan as one kernel over the grouped copy's domain,
reading head ``h`` at ``h // n`` (zero stride along the grown axis). A region that also stores the
un-grouped tensor (the rotated ``k`` kept for the cache) stores it by the first copy of each group
only (``IndexMap.store_once``): the emulator, which faults on two writers of one element, proves it
for the heuristic and sampled schedules, and faults when the predicate is taken away.
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from helpers.lowering import check_emulates, DEV, float_graph as _graph, setup
from helpers.nvcc import BUILDER_FLAGS, compile_programs_sm90
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.emulate.memory import EmulatorFault
from stitchtune.errors import GraphError, UnsupportedGraphError
from stitchtune.gpu.build import nvcc_found
from stitchtune.graph.parse import parse_graph
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.lower.entry import lower
from stitchtune.plan.planner import make_plan
from stitchtune.space import SearchSpace


def _repeat_kv(src: str, B: int, H: int, n: int, S: int, D: int, out: str = "r") -> list[dict]:
    return [{"id": "u", "op": "reshape", "args": [src], "shape": [B, H, 1, S, D]},
            {"id": "e", "op": "expand", "args": ["u"], "shape": [B, H, n, S, D]},
            {"id": out, "op": "reshape", "args": ["e"], "shape": [B, H * n, S, D]}]


def test_expand_follows_numpy_and_round_trips() -> None:
    g = _graph({"x": [3, 1, 4]}, [{"id": "e", "op": "expand", "args": ["x"], "shape": [2, 3, 5, 4]},
                                  {"id": "y", "op": "mul", "args": ["e", 2.0]}], ["y"])
    assert g.node("e").shape == (2, 3, 5, 4)
    assert parse_graph(g.to_dict()) == g and g.to_dict()["nodes"][0]["shape"] == [2, 3, 5, 4]
    ins = random_inputs(g, 1)
    want = np.broadcast_to(ins["x"].astype(np.float64), (2, 3, 5, 4)) * 2
    np.testing.assert_allclose(run_reference(g, ins)["y"], want.astype(np.float32))


def test_only_size_one_dims_grow() -> None:
    g = _graph({"x": [3, 1, 4]}, [{"id": "e", "op": "expand", "args": ["x"], "shape": [3, 2, 4]}], ["e"])
    assert g.node("e").shape == (3, 2, 4)


@pytest.mark.parametrize("shape,problem", [
    ([6, 1, 4], "nodes[0].shape: expand 'e' cannot expand [3, 1, 4] to [6, 1, 4]"),
    ([1, 4], "nodes[0].shape: expand 'e' cannot expand [3, 1, 4] to [1, 4]"),
    (None, "nodes[0].shape: missing: expand needs a target shape"),
    ([1, 1, 1, 1, 3, 1, 4], "nodes[0].shape: rank 7 is not supported (ranks 1..6)"),
])
def test_bad_expands_are_one_line_naming_the_node(shape, problem: str) -> None:
    node = {"id": "e", "op": "expand", "args": ["x"]} | ({} if shape is None else {"shape": shape})
    with pytest.raises(GraphError) as e:
        _graph({"x": [3, 1, 4]}, [node], ["e"])
    assert any(p.startswith(problem) for p in e.value.problems), e.value.problems
    assert all("\n" not in p for p in e.value.problems)


def test_rank_six_inputs_and_intermediates_plan_and_emulate() -> None:
    g = _graph({"x": [2, 3, 2, 2, 2, 8], "b": [8]},
               [{"id": "y", "op": "add", "args": ["x", "b"]},
                {"id": "t", "op": "transpose", "args": ["y"], "perm": [0, 2, 1, 3, 4, 5]},
                {"id": "m", "op": "reduce_max", "args": ["t"], "axes": [5], "keepdims": True},
                {"id": "o", "op": "sub", "args": ["t", "m"]}], ["o"])
    check_emulates(g, 3, 5)


def test_repeat_kv_reads_head_h_at_h_div_n() -> None:
    B, H, n, S, D = 1, 2, 2, 8, 8
    g = _graph({"k": [B, H, S, D]}, _repeat_kv("k", B, H, n, S, D) + [
        {"id": "y", "op": "mul", "args": ["r", 2.0]}], ["y"])
    plan = make_plan(g)
    assert (plan.M, plan.N) == (B * H * n * S, D)
    rows = plan.imap("k").rows
    assert [(f.dim, f.inner) for f in rows.factors] == [(H, n * S), (S, 1)]  # head h -> h // n, zero stride on n
    assert plan.imap("y").plain
    check_emulates(g, 3, 5)


def test_a_stored_source_of_the_copy_is_written_once_per_element() -> None:
    B, H, n, S, D = 1, 2, 3, 4, 8
    g = _graph({"k": [B, H, S, D]}, [{"id": "k2", "op": "mul", "args": ["k", 3.0]}]
               + _repeat_kv("k2", B, H, n, S, D), ["r", "k2"])
    plan = make_plan(g)
    im = plan.imap("k2")
    assert not im.bijective and im.store_once and im.row_repeats == ((n, S),)
    assert sum(im.first_rows(r) for r in range(plan.M)) == B * H * S
    check_emulates(g, 6, 5)


def test_without_the_predicate_the_emulator_sees_two_writers(monkeypatch) -> None:
    from stitchtune.lower import base

    B, H, n, S, D = 1, 2, 2, 4, 8
    g = _graph({"k": [B, H, S, D]}, [{"id": "k2", "op": "mul", "args": ["k", 3.0]}]
               + _repeat_kv("k2", B, H, n, S, D), ["r", "k2"])
    monkeypatch.setattr(base.Lowerer, "once_pred", lambda self, name, r, pred: pred)
    with pytest.raises(EmulatorFault, match="race"):
        check_emulates(g, 0, 5)


def test_an_output_broadcast_along_part_of_the_columns_is_still_refused() -> None:
    g = _graph({"k": [4, 1, 8]}, [{"id": "k2", "op": "mul", "args": ["k", 3.0]},
                                  {"id": "e", "op": "expand", "args": ["k2"], "shape": [4, 2, 8]},
                                  {"id": "s", "op": "reduce_sum", "args": ["e"], "axes": [1, 2], "keepdims": True},
                                  {"id": "o", "op": "div", "args": ["e", "s"]}], ["o", "k2"])
    with pytest.raises(UnsupportedGraphError, match="output 'k2'"):
        make_plan(g)


def test_rotary_then_repeat_kv_example_plans_and_emulates() -> None:
    g, plan, space = setup("repeat_kv_rotary_small.json")  # B=1, S=8, Hkv=2, n=2, D=16
    assert (plan.family, plan.M, plan.N) == ("elementwise", 32, 16)
    assert plan.imap("k_rot").store_once and plan.imap("k_rep").bijective
    check_emulates(g, 4, 5)


def test_rotary_then_repeat_kv_plans_at_full_size() -> None:
    _, plan, _ = setup("repeat_kv_rotary.json")
    assert (plan.M, plan.N) == (4 * 32 * 2048, 128)


@pytest.mark.slow  # nvcc
@pytest.mark.skipif(not nvcc_found(), reason="nvcc not installed")
def test_grouped_copy_and_its_once_stored_source_compile_for_sm90(tmp_path) -> None:
    g, plan, space = setup("repeat_kv_rotary.json")
    s = dataclasses.replace(heuristic_schedule(plan, DEV, space), vec=4)
    assert not space.violations(s)
    programs = [lower(g, plan, s, DEV, space)]
    B, H, n, S, D = 2, 4, 2, 16, 64
    g2 = _graph({"k": [B, H, S, D]}, [{"id": "k2", "op": "mul", "args": ["k", 3.0]}]
                + _repeat_kv("k2", B, H, n, S, D), ["r", "k2"])
    p2 = make_plan(g2)
    sp2 = SearchSpace.for_plan(p2, DEV)
    programs.append(lower(g2, p2, sp2.sample(random.Random(1)), DEV, sp2))
    # both in one translation unit, with the builder's flags; ptxas must report every kernel
    compile_programs_sm90(programs, tmp_path, flags=BUILDER_FLAGS)
