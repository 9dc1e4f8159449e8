"""A guarded vector load in a loop is rendered so that it does not wait for the previous one (issue 39).

``LoadVec`` with ``pred`` keeps its destinations' values where the guard is false. Rendered as
``if (pred) { float4 v = load; d = v.x; ... }`` inside a loop, the destination registers carry the last
iteration's values, and nvcc copies them into the next load's registers before issuing it (``MOV`` before
``@P LDG``): one load in flight (the column combine after the grid barrier of BERT train ``view_47``, GPT-2
train ``view_41`` and ``sum_13``). The renderer now loads into fresh temporaries set to 0 and selects
``pred ? temp : d``, unless the statements just before set the destinations to 0
(:func:`stitchtune.lower.guarded_loads.load_vec`), which already breaks the chain.

The rendering tests need no tool; the SASS test needs nvcc and cuobjdump and skips without them.
"""

from __future__ import annotations

import pytest

from stitchtune.gpu.build import NvccBuilder, nvcc_found
from stitchtune.gpu.render import preamble, render_kernel
from stitchtune.gpu.sass import find_cuobjdump, read_cubin
from stitchtune.ir import kir
from stitchtune.ir.kir import (BOOL, F32, I32, Assign, Bin, Const, Extent, For, LoadVec, Param, Select,
                               Special, StoreVec, Var)

TRIPS, BLOCK = 64, 128


def _kernel(zeroed: bool = False, in_loop: bool = True) -> kir.Kernel:
    """``acc += v ? x[r] : acc`` over ``TRIPS`` rows ``r = i * BLOCK + tid`` (float4 each), ``v = r < n``."""
    i, r, v = Var("i", I32), Var("r", I32), Var("v", BOOL)
    t = tuple(Var(f"t{k}", F32) for k in range(4))
    acc = tuple(Var(f"acc{k}", F32) for k in range(4))
    body: list[kir.Stmt] = [Assign(r, Bin("+", Bin("*", i, Const(BLOCK, I32)), Special("tid"))),
                            Assign(v, Bin("<", r, Extent("n")))]
    if zeroed:
        body += [Assign(d, Const(0.0)) for d in t]
    body.append(LoadVec(t, "x", Bin("*", r, Const(4, I32)), v))
    body += [Assign(a, Select(v, Bin("+", a, d), a)) for a, d in zip(acc, t)]
    top: tuple[kir.Stmt, ...] = ((For(i, Const(0, I32), Const(TRIPS, I32), 1, tuple(body)),) if in_loop
                                 else (Assign(i, Const(0, I32)), *body))
    out = StoreVec("y", Bin("*", Special("tid"), Const(4, I32)), acc)
    return kir.Kernel("guarded", (Param("x", "float32", TRIPS * BLOCK * 4, "input"),
                                  Param("y", "float32", BLOCK * 4, "output")), (*top, out), BLOCK, extents=("n",))


def test_a_carried_guarded_load_in_a_loop_loads_into_fresh_temporaries() -> None:
    src = render_kernel(_kernel())
    assert "const bool _g0 = v;" in src
    assert "float _f0_0 = 0.0f;" in src and "if (_g0) {" in src
    assert "t0 = (_g0 ? _f0_0 : t0);" in src and "t3 = (_g0 ? _f0_3 : t3);" in src
    assert "t0 = _v" not in src  # the destination is never the load's own register


@pytest.mark.parametrize("zeroed,in_loop", [(True, True), (False, False)])
def test_zeroed_or_straight_line_guarded_loads_render_as_before(zeroed: bool, in_loop: bool) -> None:
    src = render_kernel(_kernel(zeroed, in_loop))
    assert "_g0" not in src and "if (v) {" in src and "t0 = _v0.x;" in src


needs_tools = pytest.mark.skipif(not nvcc_found() or find_cuobjdump() is None,
                                 reason="needs nvcc and cuobjdump (pip install nvidia-cuda-cuobjdump)")


@needs_tools
def test_sm90_keeps_several_guarded_loads_in_flight(tmp_path) -> None:  # type: ignore[no-untyped-def]
    k = _kernel()
    res = NvccBuilder(jobs=1, cache_dir=tmp_path).build([preamble([k]) + render_kernel(k)], "sm_90")[0]
    assert res.status == "ok", res.error
    m = read_cubin(res.cubin_path)[k.name]
    # carried destinations (before): 1 load, 16 B pending; fresh ones: nvcc's unrolled iterations overlap
    assert m.max_loads_in_flight >= 4 and m.max_bytes_in_flight >= 64, m
