"""Counters of the torch.compile backend: kernels built, schedule selections, cache hits, per region.

Contract
--------
* The backend (:mod:`stitchtune.deploy.torch_backend`, :mod:`stitchtune.deploy.torch_ops`) counts,
  per stitched region (one :class:`RegionCounter` per region of each compiled graph, made by
  :func:`region_counter`):

  - ``selections``: schedules selected (each call of :func:`stitchtune.deploy.compiled.compile` for the
    region: at graph compile time, and per shape or bucket met at run time by a region with symbolic
    shapes);
  - ``builds``: kernels made to run (a region's program: its cubin, built by nvcc, on a GPU; the program
    the emulator runs on CPU tensors). A static region makes one at graph compile time; a region with
    symbolic shapes one per entry of its cache (see ``hits``);
  - ``hits``: calls of a region with symbolic shapes that found their kernel in its cache (calls of a
    static region are not counted: its one kernel always serves);
  - ``eager``: calls of a region with symbolic shapes that ran its ATen ops because no kernel could be
    made for those shapes (each such shape is tried once: later calls count as ``eager`` only).

  A region declined after its counter was made (its compile failed, nvcc failed, the fake
  check, or its kernel failed at run time) keeps its counts and says why in ``declined``.

* :func:`stats` returns a :class:`TorchStats` snapshot (frozen: later calls do not change it) of every
  region counted since the last :func:`reset` (the process start, or
  :func:`stitchtune.deploy.torch_backend.explain`, which resets them); :func:`reset` forgets every
  region. Counting is thread-safe and exact; it never raises into a model's call.

This module does not import torch.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RegionCounter", "RegionStats", "TorchStats", "region_counter", "reset", "stats"]

_lock = threading.Lock()
_counters: list[RegionCounter] = []


@dataclass
class RegionCounter:
    """The live counts of one region (see module docstring); :meth:`add` increments them."""

    graph: str           # "forward" | "backward" | "inference"
    region: str
    ops: tuple[str, ...]
    dynamic: bool
    selections: int = 0
    builds: int = 0
    hits: int = 0
    eager: int = 0
    declined: str | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    #: thin paths (:class:`~stitchtune.deploy.torch_fast.ShapeCalls`) that count their own hits (their
    #: ``hits``, read at a snapshot: no lock taken per call)
    thin: list[Any] = field(default_factory=list, repr=False, compare=False)

    def decline(self, reason: str) -> None:
        """Mark the region declined (the first reason is kept)."""
        with self._lock:
            if self.declined is None:
                self.declined = reason

    def add(self, *, selections: int = 0, builds: int = 0, hits: int = 0, eager: int = 0) -> None:
        with self._lock:
            self.selections += selections
            self.builds += builds
            self.hits += hits
            self.eager += eager

    def snapshot(self) -> RegionStats:
        with self._lock:
            hits = self.hits + sum(t.hits for t in self.thin)
            return RegionStats(self.graph, self.region, self.ops, self.dynamic, self.selections, self.builds,
                               hits, self.eager, self.declined)


@dataclass(frozen=True)
class RegionStats:
    """One region's counts at the time of :func:`stats` (see module docstring)."""

    graph: str
    region: str
    ops: tuple[str, ...]
    dynamic: bool
    selections: int
    builds: int
    hits: int
    eager: int
    #: None while stitched, else why the region was declined (its ATen ops run)
    declined: str | None = None


@dataclass(frozen=True)
class TorchStats:
    """Every counted region (in the order they were compiled) and the totals over them."""

    regions: tuple[RegionStats, ...] = ()

    @property
    def selections(self) -> int:
        return sum(r.selections for r in self.regions)

    @property
    def builds(self) -> int:
        return sum(r.builds for r in self.regions)

    @property
    def hits(self) -> int:
        return sum(r.hits for r in self.regions)

    @property
    def eager(self) -> int:
        return sum(r.eager for r in self.regions)

    def summary(self) -> str:
        """One line: the totals."""
        return (f"stitchtune: {self.builds} kernel(s) built, {self.selections} schedule selection(s), "
                f"{self.hits} cache hit(s), {self.eager} eager call(s) over {len(self.regions)} region(s)")

    def __str__(self) -> str:
        rows = [self.summary(), "",
                f"{'graph':<9} {'region':<28} {'shapes':<8} {'selections':>10} {'builds':>6} {'hits':>6} {'eager':>6}"]
        for r in self.regions:
            rows.append(f"{r.graph:<9} {r.region[:28]:<28} {'symbolic' if r.dynamic else 'static':<8} "
                        f"{r.selections:>10} {r.builds:>6} {r.hits:>6} {r.eager:>6}"
                        + (f"  declined: {r.declined[:80]}" if r.declined else ""))
        return "\n".join(rows)


def region_counter(graph: str, region: str, ops: tuple[str, ...], dynamic: bool) -> RegionCounter:
    """A new counter for one region, included in :func:`stats` until the next :func:`reset`."""
    c = RegionCounter(graph, region, tuple(ops), dynamic)
    with _lock:
        _counters.append(c)
    return c


def stats() -> TorchStats:
    """A snapshot of every region counted since the last :func:`reset` (see module docstring)."""
    with _lock:
        counters = list(_counters)
    return TorchStats(tuple(c.snapshot() for c in counters))


def reset() -> None:
    """Forget every region counted so far (their kernels keep counting into counters no longer listed)."""
    with _lock:
        _counters.clear()
