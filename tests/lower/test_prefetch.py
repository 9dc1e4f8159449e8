"""Prefetch (``Schedule.prefetch``): a block loads the full-size inputs of its next task into
registers right after the current task's first sweep, so those loads are in flight while the current
task reduces and writes. These tests pin the results (emulator against the reference, over every
row-family example and several rounds per block), the program's shape (a prologue before the round
loop, a first sweep without global loads of full-size inputs, the next task's loads right after it,
guarded on the last round), and that schedules without prefetch are unchanged (its rules in the
space: ``tests/space/test_space.py``).
"""

from __future__ import annotations

import random

import pytest

from stitchtune.ir import kir
from stitchtune.cost.model import CostParams, predict
from stitchtune.lower.entry import lower
from stitchtune.graph.reference import random_inputs, run_reference
from helpers.lowering import DEV, emulated_errors, setup
from stitchtune.space import Schedule, SearchSpace
from stitchtune.space.options import PREFETCH

ROW_SMALL = ["layernorm_small.json", "layernorm_odd_small.json", "layernorm_bf16_small.json", "softmax_small.json",
             "softmax_odd_small.json", "rmsnorm_small.json", "softmax_tiny_rows_small.json"]
LAYERNORM = {"block": 512, "min_blocks": 0, "reuse": ["register", "recompute"], "schemes": ["regional", "regional"],
             "split": 1, "tasks_per_block": 4, "tpr": 256, "vec": 2}




def _prefetch_schedules(space: SearchSpace, n: int, seed: int = 0) -> list[Schedule]:
    rng = random.Random(seed)
    out: list[Schedule] = []
    for _ in range(20000):
        s = space.sample(rng)
        if s.option(PREFETCH):
            out.append(s)
            if len(out) == n:
                break
    return out


@pytest.mark.parametrize("name", ROW_SMALL)
def test_prefetch_schedules_give_the_reference_results(name: str) -> None:
    g, plan, space = setup(name)
    inputs = random_inputs(g, 2)
    ref = run_reference(g, inputs)
    tol = 1e-5 if all(g.spec(o).dtype == "float32" for o in g.outputs) else 1e-2
    scheds = _prefetch_schedules(space, 6)
    assert len(scheds) == 6
    several_rounds = 0
    for s in scheds:
        prog = lower(g, plan, s, DEV, space)
        assert any(a.name.startswith("pf") for k in prog.kernels for a in k.locals), s.to_json()
        rounds = [st for k in prog.kernels for st in k.body if isinstance(st, kir.For)]
        several_rounds += any(isinstance(r.stop, kir.Const) and r.stop.value > 1 for r in rounds)
        errs = emulated_errors(g, plan, space, s, inputs, ref)
        assert max(errs.values()) < tol, (s.to_json(), errs)
    assert several_rounds >= 2  # the next-task loads were really used


def test_prefetch_program_shape() -> None:
    g, plan, space = setup("layernorm.json")
    prog = lower(g, plan, Schedule.from_dict({**LAYERNORM, "prefetch": 1}), DEV, space)
    (k,) = prog.kernels
    # gamma and beta are held in registers across the tasks (lower.column_cache)
    assert [a.name for a in k.locals] == ["rc0", "pf0", "cw1", "cw2"]
    loops = [st for st in k.body if isinstance(st, kir.For)]
    prologue, _columns, rounds = loops  # the first task's loads, gamma and beta, then the round loop
    assert any(isinstance(x, kir.LoadVec) and x.buf == "in0" for x in kir.walk(prologue.body))
    body_loops = [st for st in rounds.body if isinstance(st, kir.For)]
    first, nxt = body_loops[0], body_loops[1]
    # the first sweep reads x from the prefetch registers, never from global memory ...
    assert not any(isinstance(x, kir.LoadVec) and x.buf == "in0" for x in kir.walk(first.body))
    assert "LocalRef(array='pf0'" in repr(first.body)
    # ... and right after it, the next task's x is loaded, guarded so the last round loads nothing
    assert any(isinstance(x, kir.LoadVec) and x.buf == "in0" for x in kir.walk(nxt.body))
    guard = [st for st in rounds.body if isinstance(st, kir.Assign) and st.var.name.startswith("vn")]
    assert guard and "rd" in repr(guard[0].expr)
    # no other sweep loads x: one read of the input per task, as without prefetch
    later = body_loops[2:]
    assert not any(isinstance(x, kir.LoadVec) and x.buf == "in0" for lp in later for x in kir.walk(lp.body))


def test_without_prefetch_the_program_is_unchanged() -> None:
    g, plan, space = setup("layernorm.json")
    s = Schedule.from_dict(LAYERNORM)
    assert s.option(PREFETCH) == 0 and "prefetch" not in s.to_dict()
    prog = lower(g, plan, s, DEV, space)
    assert not any(a.name.startswith("pf") for k in prog.kernels for a in k.locals)
    on = Schedule.from_dict({**LAYERNORM, "prefetch": 1})
    assert on.key() != s.key() and Schedule.from_json(on.to_json()) == on


def test_cost_model_sees_more_bytes_in_flight() -> None:
    """A model assumption (labelled in lower.py): with prefetch the next task's loads are in flight
    during the current task's reductions, which the model credits as more bytes in flight."""
    g, plan, space = setup("layernorm.json")
    off = lower(g, plan, Schedule.from_dict(LAYERNORM), DEV, space).profile.kernels[0]
    on = lower(g, plan, Schedule.from_dict({**LAYERNORM, "prefetch": 1}), DEV, space).profile.kernels[0]
    assert on.bytes_in_flight_per_thread > off.bytes_in_flight_per_thread
    assert on.dram_read_bytes == off.dram_read_bytes and on.reread_bytes == off.reread_bytes
    p = CostParams()
    assert predict(kir.ProgramProfile((on,), 1), DEV, params=p).time_us <= \
        predict(kir.ProgramProfile((off,), 1), DEV, params=p).time_us
