"""Bool outputs of stitched kernels (stored one byte per element, 0 / 1, as torch.bool): a training
dropout's mask ``rand > p`` stored next to the softmax it masks (a row reduction), a logical mask
of two comparisons and a bool input passed through (element-wise), a NaN cast to bool (true). Every
schedule checked (the heuristic one and seeded samples) is emulated against the reference: bool
outputs bit-exact, float ones within 1e-5."""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from helpers.lowering import DEV, rel_err
from test_int_ops_kernels import schedules
from stitchtune.emulate.emulator import emulate_program
from stitchtune.graph.parse import parse_graph
from stitchtune.graph.reference import random_inputs, run_reference
from stitchtune.gpu.render import render
from stitchtune.lower.entry import lower


def dropout_softmax() -> Any:
    """``keep = r > 0.1`` (the random tensor an input), ``softmax(where(keep, x, 0) / 0.9)`` and the
    mask itself as outputs: the mask saved for the backward comes out of the same kernel."""
    return parse_graph({
        "name": "dropout", "inputs": {"x": {"shape": [6, 40], "dtype": "float32"},
                                      "r": {"shape": [6, 40], "dtype": "float32"}},
        "nodes": [
            {"id": "keep", "op": "gt", "args": ["r", 0.1]},
            {"id": "y", "op": "where", "args": ["keep", "x", 0.0]},
            {"id": "z", "op": "mul", "args": ["y", 1 / 0.9]},
            {"id": "m", "op": "reduce_max", "args": ["z"], "axes": [-1], "keepdims": True},
            {"id": "e", "op": "sub", "args": ["z", "m"]},
            {"id": "ee", "op": "exp", "args": ["e"]},
            {"id": "s", "op": "reduce_sum", "args": ["ee"], "axes": [-1], "keepdims": True},
            {"id": "p", "op": "div", "args": ["ee", "s"]}],
        "outputs": ["p", "keep"]})


def logical_masks() -> Any:
    """Element-wise: ``(x > 0) & ~(x > 2)`` and ``cast(x * m, bool)`` as bool outputs (NaN inputs
    cast to true), a float16 product, and the bool input ``m`` passed through unchanged."""
    return parse_graph({
        "name": "masks", "inputs": {"x": {"shape": [4, 64], "dtype": "float16"},
                                    "m": {"shape": [4, 64], "dtype": "bool"}},
        "nodes": [
            {"id": "a", "op": "gt", "args": ["x", 0.0]},
            {"id": "b", "op": "gt", "args": ["x", 2.0]},
            {"id": "nb", "op": "logical_not", "args": ["b"]},
            {"id": "ab", "op": "logical_and", "args": ["a", "nb"]},
            {"id": "mf", "op": "cast", "args": ["m"], "to": "float16"},
            {"id": "xm", "op": "mul", "args": ["x", "mf"]},
            {"id": "nz", "op": "cast", "args": ["xm"], "to": "bool"}],
        "outputs": ["ab", "xm", "nz", "m"]})


def _inputs(g: Any) -> dict[str, np.ndarray]:
    x = random_inputs(g, 4)
    if g.spec("x").dtype == "float16":
        x["x"].ravel()[::7] = np.nan
        x["x"].ravel()[3::11] = 0.0
    return x


def _check(g: Any, n: int) -> None:
    plan, space, scheds = schedules(g, n)
    x = _inputs(g)
    ref = run_reference(g, x)
    assert any(v.dtype == np.bool_ and v.any() and not v.all() for v in ref.values())
    for s in scheds:
        out = emulate_program(lower(g, plan, s, DEV, space), x, coresident_limit=lambda k: 1 << 30)
        for o, want in ref.items():
            got = out[o].reshape(want.shape)
            if want.dtype == np.bool_:
                assert got.dtype == np.bool_ and np.array_equal(got, want), (o, s.to_json())
            else:
                nan = np.isnan(want.astype(np.float32))
                assert np.array_equal(np.isnan(got.astype(np.float32)), nan), (o, s.to_json())
                assert rel_err(got[~nan].astype(np.float32), want[~nan].astype(np.float32)) < 1e-5, (o, s.to_json())


def test_dropout_mask_next_to_its_softmax_emulates_exactly() -> None:
    _check(dropout_softmax(), 10)


def test_logical_masks_and_a_passed_bool_emulate_exactly() -> None:
    _check(logical_masks(), 10)


def test_bool_outputs_are_byte_buffers_written_as_zero_or_one() -> None:
    g = logical_masks()
    plan, space, scheds = schedules(g, 0)
    wide = next(s for s in (space.sample(random.Random(i)) for i in range(200)) if s.vec >= 4)
    for s in (scheds[0], wide):
        src = render(lower(g, plan, s, DEV, space))
        assert "unsigned char* __restrict__ out" in src   # the bool outputs' parameters
        assert "!= 0.0f)" in src   # a 0 / 1 byte from the fp32 register (NaN is true)


def bool_output_programs() -> list[Any]:
    """Programs of the graphs above for the batched sm_90 build (tests/lower/test_int_input_kernels.py)."""
    programs = []
    for g in (dropout_softmax(), logical_masks()):
        plan, space, scheds = schedules(g, 2)
        programs += [lower(g, plan, s, DEV, space) for s in scheds]
    return programs
