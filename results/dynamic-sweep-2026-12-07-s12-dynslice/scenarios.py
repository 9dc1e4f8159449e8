"""The four modules of tests/deploy/test_torch_dynamic_slices.py through torch.compile(dynamic=True):
builds, eager calls and graphs per scenario (CPU, emulated kernels; nothing timed).

    PYTHONPATH=$PWD python results/dynamic-sweep-2026-12-07-s12-dynslice/scenarios.py
"""

from __future__ import annotations

import json
import logging
import sys
import warnings

import torch

sys.path.insert(0, "tests")
sys.path.insert(0, "tests/deploy")
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)

import stitchtune.torch as st_torch  # noqa: E402
from test_torch_dynamic_slices import OPTS, CacheStep, D, H, LastPositions, ShiftedDiff  # noqa: E402


def run(name: str, m: torch.nn.Module, calls: list[tuple[torch.Tensor, ...]]) -> None:
    torch._dynamo.reset()
    st_torch.reset_stats()
    torch._dynamo.utils.counters.clear()
    c = torch.compile(m, backend="stitchtune", dynamic=True, options=OPTS)
    diff = 0.0
    with torch.no_grad():
        for args in calls:
            diff = max(diff, float((c(*args) - m(*args)).abs().max()))
    s = st_torch.stats()
    print(json.dumps({"scenario": name, "calls": len(calls), "graphs": torch._dynamo.utils.counters["stats"]["unique_graphs"],
                      "builds": s.builds, "max_builds": max(r.builds for r in s.regions), "eager": s.eager,
                      "max_diff": diff}))


torch.manual_seed(0)
run("slice x[:, 1:] - x[:, :-1], batch 2, 8 lengths 5..64", ShiftedDiff().eval(),
    [(torch.randn(2, s, 32),) for s in (5, 9, 16, 33, 40, 64, 47, 20)])
run("last positions x[:, -2:], batch 2, 8 lengths 5..64", LastPositions().eval(),
    [(torch.randn(2, s, 32),) for s in (5, 9, 16, 33, 40, 64, 47, 20)])
run("decode step, batch 1-4, past 3..64", CacheStep().eval(),
    [(torch.randn(b, 1, H * D), torch.randn(b, H, p, D)) for b, p in
     ((1, 3), (2, 3), (3, 4), (4, 5), (1, 6), (2, 6), (3, 33), (4, 40), (1, 41), (3, 47), (2, 64))])
run("chunked prefill, 2-5 new positions, past 3..60", CacheStep().eval(),
    [(torch.randn(1, c, H * D), torch.randn(1, H, p, D)) for c, p in
     ((2, 3), (3, 7), (4, 12), (5, 20), (3, 33), (4, 40), (2, 47), (5, 60))])
