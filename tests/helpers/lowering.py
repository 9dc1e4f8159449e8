"""Planning, lowering and emulating from a test: ``DEV`` (H200 preset), ``setup(name)`` -> (graph, plan,
space), ``rel_err``, ``emulated_errors``, ``check_emulates``, ``plan_or_refused``, ``float_graph``,
``channels_last_ln_backward``, ``GLOBAL_ROWS`` / ``local_scheme_space`` (a test-local scheme),
``assert_matches_golden``, ``suggested`` (schedules drawn the way optuna would), ``emulator_kernels`` and
``FakeStateBuilder`` (a kernel builder reduced to what the exchange uses: ``fake_row_builder``,
``fake_col_builder``)."""

from __future__ import annotations

import os
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Generic, TypeVar

import numpy as np
import optuna

from helpers.common import EXAMPLES
from stitchtune.emulate.emulator import emulate_program
from stitchtune.graph.parse import Graph, load_graph, parse_graph
from stitchtune.hardware.device import get_device
from stitchtune.ir import kir
from stitchtune.ir.kir import F32, I32, Var
from stitchtune.lower.builder import RowIndex
from stitchtune.lower.col_exchange import ColIndex
from stitchtune.lower.entry import lower
from stitchtune.lower.state import ReductionState
from stitchtune.plan.planner import make_plan
from stitchtune.space import Schedule, Scheme, SearchSpace


# ---------------------------------------------------------------------------- lowering

DEV = get_device("H200")


def setup(name: str) -> tuple[Any, Any, SearchSpace]:
    """(graph, plan, space on the H200 preset) of ``examples/<name>``."""
    g = load_graph(EXAMPLES / name)
    plan = make_plan(g)
    return g, plan, SearchSpace.for_plan(plan, DEV)


def rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    """||out - ref||_2 / ||ref||_2 in float64; ``inf`` when ``out`` holds a NaN or an infinity (so a
    ``< tol`` check fails on it, also inside ``max`` over several outputs)."""
    r = np.asarray(ref, dtype=np.float64)
    x = np.asarray(out, dtype=np.float64).reshape(r.shape)
    if not np.all(np.isfinite(x)):
        return float("inf")
    return float(np.linalg.norm(x - r)) / max(float(np.linalg.norm(r)), 1e-30)


def emulated_errors(g: Any, plan: Any, space: SearchSpace, s: Schedule, inputs: dict[str, np.ndarray],
                    ref: dict[str, np.ndarray]) -> dict[str, float]:
    """Relative error per output of schedule ``s`` run in the emulator (every grid co-resident)."""
    out = emulate_program(lower(g, plan, s, DEV, space), inputs, coresident_limit=lambda k: 1 << 30)
    return {o: rel_err(out[o], ref[o]) for o in ref}


def generic_program(dg: Any, key: Any) -> kir.Program:
    """The one generic program of bucket ``key`` of dynamic graph ``dg`` at the generic heuristic's schedule
    (the row fit must succeed and the program be a dynamic one: the caller's test fails otherwise)."""
    from stitchtune.cost.heuristic import generic_heuristic
    from stitchtune.lower.dynamic import RowFit, fit_rows, lower_dynamic

    fit = fit_rows(dg, key)
    assert isinstance(fit, RowFit), (key.label(), fit)
    space = SearchSpace.for_plan(fit.plan, DEV)
    prog = lower_dynamic(fit, generic_heuristic(fit, DEV, space), DEV, space)
    assert isinstance(prog, kir.Program) and prog.dynamic is not None, (key.label(), prog)
    return prog


def float_graph(inputs: Mapping[str, Sequence[int]], nodes: Sequence[object], outputs: Sequence[str]) -> Graph:
    """The validated graph ``t`` with float32 ``inputs`` (name -> shape), ``nodes`` and ``outputs``."""
    return parse_graph({"name": "t", "inputs": {k: {"shape": list(v), "dtype": "float32"} for k, v in inputs.items()},
                        "nodes": list(nodes), "outputs": list(outputs)})


def plan_or_refused(obj: dict[str, Any]) -> tuple[Any, Any]:
    """(graph, plan) of a graph dict, or (graph, None) when the planner refuses it; a refusal must be
    one line (the contract for every unsupported graph)."""
    from stitchtune.errors import UnsupportedGraphError
    from stitchtune.graph.parse import parse_graph

    g = parse_graph(obj)
    try:
        return g, make_plan(g)
    except UnsupportedGraphError as e:
        assert "\n" not in str(e), str(e)
        return g, None


def check_emulates(g: Any, n_samples: int = 3, input_seed: int = 4, tol: float = 1e-5) -> None:
    """Plan ``g``; its heuristic schedule and ``n_samples`` seeded samples (seeds 0..n-1) emulate within
    ``tol`` (relative L2 per output) of the float64 reference on seeded random inputs."""
    from stitchtune.cost.heuristic import heuristic_schedule
    from stitchtune.graph.reference import random_inputs, run_reference

    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    inputs = random_inputs(g, input_seed)
    ref = run_reference(g, inputs)
    for s in [heuristic_schedule(plan, DEV, space)] + [space.sample(random.Random(i)) for i in range(n_samples)]:
        for o, err in emulated_errors(g, plan, space, s, inputs, ref).items():
            assert err < tol, (g.name, s.to_json(), o, err)


def channels_last_ln_backward(h: int = 4, w: int = 4, c: int = 32, grad: str = "merged") -> Any:
    """A channels-last layer norm's backward as ConvNeXt's training step has it: ``dx`` (row sums over
    ``C`` of ``[1, H, W, C]``) and the column sums ``dgamma``, ``dbeta`` over ``(1, H, W)``. ``grad``:
    how the gradient ``dy`` comes in: ``"merged"`` (a matmul's ``[H*W, C]`` viewed as ``[1, H, W, C]``)
    or ``"nchw"`` (a convolution's ``[1, C, H, W]`` transposed to ``[1, H, W, C]``)."""
    def red(i: str, a: str, axes: list[int], keep: bool) -> dict[str, Any]:
        return {"id": i, "op": "reduce_sum", "args": [a], "axes": axes, "keepdims": keep}

    first: dict[str, Any] = ({"id": "v", "op": "reshape", "args": ["dy"], "shape": [1, h, w, c]} if grad == "merged" else
             {"id": "v", "op": "transpose", "args": ["dy"], "perm": [0, 2, 3, 1]})
    nodes: list[dict[str, Any]] = [
             first, {"id": "xc", "op": "sub", "args": ["x", "mu"]}, {"id": "xh", "op": "mul", "args": ["xc", "rs"]},
             {"id": "g", "op": "mul", "args": ["v", "gamma"]}, {"id": "gn", "op": "mul", "args": ["g", float(c)]},
             red("s1", "g", [3], True), {"id": "gx", "op": "mul", "args": ["g", "xh"]}, red("s2", "gx", [3], True),
             {"id": "t", "op": "mul", "args": ["xh", "s2"]}, {"id": "a", "op": "sub", "args": ["gn", "s1"]},
             {"id": "b", "op": "sub", "args": ["a", "t"]}, {"id": "d", "op": "div", "args": ["rs", float(c)]},
             {"id": "dx", "op": "mul", "args": ["d", "b"]}, {"id": "vx", "op": "mul", "args": ["v", "xh"]},
             red("dgamma", "vx", [0, 1, 2], False), red("dbeta", "v", [0, 1, 2], False)]
    dy = [h * w, c] if grad == "merged" else [1, c, h, w]
    return float_graph({"dy": dy, "x": [1, h, w, c], "mu": [1, h, w, 1], "rs": [1, h, w, 1], "gamma": [c]},
                       nodes, ["dx", "dgamma", "dbeta"])


GLOBAL_ROWS = Scheme(
    "global_rows", "split == 1 and family == 'row'", partials=True, grid_barrier=True, cost_term="grid_barriers",
    doc="global stitching of whole rows: each row's value through global scratch after a grid barrier")
"""A scheme made of existing exchange steps and declared only in the tests (``tests/space/test_schemes.py``,
``tests/lower/test_scheme_contract.py``): a row that one block holds still hands its reduced value over
through global memory and a grid barrier (AStitch's global stitching without a split)."""


def local_scheme_space(name: str) -> SearchSpace:
    """The space of ``examples/<name>`` on the H200 with :data:`GLOBAL_ROWS` declared and offered (a table
    with it added, its name appended to the space file's scheme choices)."""
    from stitchtune.space import SCHEMES, load_space_file

    plan = make_plan(load_graph(EXAMPLES / name))
    data = load_space_file()
    data["params"]["scheme"]["choices"] = [*data["params"]["scheme"]["choices"], GLOBAL_ROWS.name]
    return SearchSpace(plan, DEV, data, schemes=SCHEMES.extended(GLOBAL_ROWS))


def assert_matches_golden(path: Path, text: str, what: str) -> None:
    """``text`` equals the golden file ``path``, else fail with a unified diff of the two (the first
    200 lines of it). ``STITCHTUNE_REGEN_GOLDEN=1`` rewrites the file instead (a deliberate change of
    generated code, to be said in its commit); a missing file is written and the test fails."""
    import difflib

    import pytest

    if os.environ.get("STITCHTUNE_REGEN_GOLDEN") or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if not os.environ.get("STITCHTUNE_REGEN_GOLDEN"):
            pytest.fail(f"golden file {path.name} was missing and has been written; commit it")
        return
    want = path.read_text()
    if text != want:
        diff = list(difflib.unified_diff(want.splitlines(), text.splitlines(), f"{path.name} (golden)",
                                         f"{path.name} (generated)", lineterm=""))
        pytest.fail(f"{what} differs from {path.name} ({len(diff)} diff lines; regenerate with "
                    f"STITCHTUNE_REGEN_GOLDEN=1 only for an intended change):\n" + "\n".join(diff[:200]),
                    pytrace=False)


def suggested(space: SearchSpace, n: int, seed: int) -> list[tuple[dict[str, Any], Schedule]]:
    """``n`` (optuna parameters, schedule) pairs suggested by a random-sampler study (define-by-run);
    every schedule's :meth:`SearchSpace.params_of` is checked to give back its trial's parameters."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    out = []
    for _ in range(n):
        t = study.ask()
        s = space.suggest(t)
        assert space.params_of(s) == t.params
        out.append((dict(t.params), s))
        study.tell(t, 1.0)
    return out



def emulator_kernels(program: Any) -> dict[str, Any]:
    """FakeDriver kernels (``stitchtune.gpu.fake_driver.FakeDriver(kernels=...)``) that run each kernel of
    ``program`` in the SIMT emulator on the fake device memory the launch's arguments point at."""
    from stitchtune.emulate.emulator import elem_dtype, emulate_kernel

    def make(kernel: Any) -> Any:
        def run(drv: Any, args: tuple[int, ...], ln: Any) -> None:
            assert ln.block == (kernel.block, 1, 1) and len(args) == len(kernel.params), kernel.name
            bufs = {p.name: drv.buffer(a).view(elem_dtype(p.dtype, p.role)) for p, a in zip(kernel.params, args)}
            emulate_kernel(kernel, ln.grid[0], bufs)

        return run

    return {ln.kernel: make(program.kernel(ln.kernel)) for ln in program.launches}


# ---------------------------------------------------------------------------- a fake kernel builder

IX = TypeVar("IX", RowIndex, ColIndex)


class FakeSchedule(SimpleNamespace):
    """The fields of a ``Schedule`` the exchange reads, and its typed option read (``option(COMBINE)``)."""

    def option(self, opt: Any) -> Any:
        return getattr(self, opt if isinstance(opt, str) else opt.name)


class FakeStateBuilder(Generic[IX]):
    """A kernel builder reduced to what the exchange (``stitchtune.lower.exchange``) uses: a
    ``StateBuilder`` that records what it is given (``rb``: the emitted statements; ``parts``: the scratch
    buffers asked for, in order, each time), with a row kernel's index variables and sizes (an ``ExchangeBuilder``:
    :func:`fake_row_builder`) or a column kernel's (a ``ColExchangeBuilder``: :func:`fake_col_builder`).
    Reductions ``r`` and ``m`` have index 0, ``v`` index 1."""

    def __init__(self, ix: IX, schedule: FakeSchedule, M: int, N: int, chunk: int) -> None:
        self.ix: IX = ix
        self.rb: list[kir.Stmt] = []
        self.parts: list[str] = []
        self._s, self._p, self._chunk = schedule, SimpleNamespace(M=M, N=N), chunk
        self._n = 0

    @property
    def schedule(self) -> Any:
        return self._s

    @property
    def plan(self) -> Any:
        return self._p

    @property
    def chunk(self) -> int:
        return self._chunk

    @property
    def rows_per_block(self) -> int:
        return int(self._s.block // self._s.tpr)

    @property
    def tile_cols(self) -> int:
        return int(self._s.block // self._s.tpr * self._s.vec)

    def var(self, prefix: str, dtype: str = F32) -> Var:
        self._n += 1
        return Var(f"{prefix}{self._n}", dtype)

    def emit(self, *stmts: kir.Stmt) -> None:
        self.rb.extend(stmts)

    def last_row(self) -> kir.Expr:
        return kir.Const(self._p.M - 1, I32)

    def state_parts(self, st: ReductionState) -> tuple[str, ...]:
        names = st.part_names({"r": 0, "m": 0, "v": 1})
        self.parts += names
        return names


def fake_row_builder(tpr: int, block: int, split: int = 1, combine: str = "thread") -> FakeStateBuilder[RowIndex]:
    """A row kernel's builder (64 rows of 4096, ``vec`` 1)."""
    ix = RowIndex(Var("lane", I32), Var("rib", I32), Var("rd", I32), Var("row", I32), Var("sidx", I32),
                  Var("rv", kir.BOOL), Var("kb", I32), Var("ke", I32))
    s = FakeSchedule(tpr=tpr, block=block, split=split, vec=1, combine=combine)
    return FakeStateBuilder(ix, s, 64, 4096, 4096 // split)


def fake_col_builder(tpr: int, block: int, vec: int, split: int = 1) -> FakeStateBuilder[ColIndex]:
    """A column kernel's builder (1000 rows of 512 columns)."""
    c = Var("c", I32)
    ix = ColIndex(Var("tc", I32), Var("tk", I32), Var("rd", I32), Var("tile", I32), Var("sidx", I32), c,
                  Var("cv", kir.BOOL), Var("kb", I32), Var("ke", I32), Var("task", I32), c)
    s = FakeSchedule(tpr=tpr, block=block, vec=vec, split=split, combine="thread")
    return FakeStateBuilder(ix, s, 1000, 512, -(-1000 // split))
