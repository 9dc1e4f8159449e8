"""Shared helpers of the lowering tests (test_sweep_order, test_prefetch, test_combine): load an example
with its plan and space, and compare emulated outputs with the float64 reference."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from stitchtune.device import get_device
from stitchtune.emulator import emulate_program
from stitchtune.graph import load_graph
from stitchtune.lower import lower
from stitchtune.plan import make_plan
from stitchtune.schedule import Schedule, SearchSpace

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
DEV = get_device("H200")


def setup(name: str) -> tuple[Any, Any, SearchSpace]:
    """(graph, plan, space on the H200 preset) of ``examples/<name>``."""
    g = load_graph(EXAMPLES / name)
    plan = make_plan(g)
    return g, plan, SearchSpace.for_plan(plan, DEV)


def rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    """||out - ref||_2 / ||ref||_2 in float64 (the runners' check, without its NaN handling)."""
    r = np.asarray(ref, dtype=np.float64)
    x = np.asarray(out, dtype=np.float64).reshape(r.shape)
    return float(np.linalg.norm(x - r) / max(np.linalg.norm(r), 1e-30))


def emulated_errors(g: Any, plan: Any, space: SearchSpace, s: Schedule, inputs: dict[str, np.ndarray],
                    ref: dict[str, np.ndarray]) -> dict[str, float]:
    """Relative error per output of schedule ``s`` run in the emulator (every grid co-resident)."""
    out = emulate_program(lower(g, plan, s, DEV, space), inputs, coresident_limit=lambda k: 1 << 30)
    return {o: rel_err(out[o], ref[o]) for o in ref}


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
