"""How the GPU scripts time a call (``gpu_models.py``, ``gpu_step.py`` through it, ``gpu_peers.py``,
``gpu_torch_entry.py``): CUDA events, and the wall clock as the CPU dry runs' stand-in.

* :func:`event_times_us` - ``warmup`` untimed calls, one synchronize, then ``iters`` calls queued back
  to back, each between a start and an end event recorded on the current stream, one synchronize, and
  each pair's elapsed time in microseconds (device time of one call, measured; no synchronization
  between the calls, so the host's launch time overlaps the device's work as in a real run).
* :func:`host_times_us` - the wall-clock microseconds of each of ``iters`` calls after ``warmup``
  (a CPU dry run: not comparable with device times).
* :func:`times_us` - the one or the other (``cpu``); :func:`median` - their median.
* :func:`options_only` - the GPU round's check mode (``CHECK=1 bash scripts/gpu_round.sh`` sets
  ``GPU_ROUND_CHECK=1``): a script parses and validates its options as on a GPU, says
  ``<script>: options ok`` and returns 0 without running anything (no GPU needed).

``cuda`` is the ``torch.cuda``-like module the events come from (``Event(enable_timing=True)`` with
``record()`` / ``elapsed_time(end)`` in ms, and ``synchronize()``); default ``torch.cuda`` (tests pass
a fake).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

__all__ = ["event_times_us", "host_times_us", "median", "options_only", "times_us"]


def options_only() -> bool:
    """Whether the GPU round runs in its check mode (``GPU_ROUND_CHECK=1``, module docstring): the caller
    stops after its options are validated (the GPU's presence not required) and returns 0."""
    return os.environ.get("GPU_ROUND_CHECK") == "1"


def _cuda(cuda: Any) -> Any:
    if cuda is not None:
        return cuda
    import torch

    return torch.cuda


def event_times_us(call: Callable[[], Any], iters: int, warmup: int = 3, cuda: Any = None) -> list[float]:
    """Device microseconds of each of ``iters`` calls of ``call``, from CUDA events (module docstring)."""
    cuda = _cuda(cuda)
    for _ in range(warmup):
        call()
    cuda.synchronize()
    pairs = [(cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)) for _ in range(iters)]
    for start, end in pairs:
        start.record()
        call()
        end.record()
    cuda.synchronize()
    return [start.elapsed_time(end) * 1000.0 for start, end in pairs]


def host_times_us(call: Callable[[], Any], iters: int, warmup: int = 1) -> list[float]:
    """Wall-clock microseconds of each of ``iters`` calls of ``call`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        call()
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        call()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def times_us(call: Callable[[], Any], iters: int, cpu: bool, warmup: int = 3, cuda: Any = None) -> list[float]:
    """:func:`host_times_us` on the CPU (``cpu``), else :func:`event_times_us`."""
    if cpu:
        return host_times_us(call, iters, warmup)
    return event_times_us(call, iters, warmup, cuda)


def median(times: list[float]) -> float:
    return float(statistics.median(times))
