"""The gathers' out-of-range index flags of the torch op, read without stalling the device.

A stitched kernel that meets an out-of-range index writes zeros for that row and adds 1 to the
gather's error flag (a float32 scratch buffer, ``gerr<k>``). On the torch op's launch path these
flags live in page-locked host memory mapped into the device (``Launcher(mapped=...)``): the kernel's
write lands in host memory, and the host reads it as plain memory, with no copy, no event and no
synchronisation. A flag is sticky: nothing resets it until the host has seen it set.

Contract
--------
* :class:`GatherFlags` is one launcher's flags (per region, GPU and stream): ``region`` (the
  region's description), per gather its node id, a description of its index input and the host
  array of its flag. :meth:`GatherFlags.take` returns the set ones' descriptions and zeroes them
  (host writes); :meth:`GatherFlags.raise_if_set` raises :func:`index_error` for them.
* When a set flag is seen: at the region's next call (checked before its launch: the kernels of
  an earlier call met the index, and the error is raised then, naming the region and the input),
  after each call of a compiled graph (:func:`check_keys`, the backend's wrapper: also after a CUDA
  graph replay, which runs no region call), at :func:`check_all` (what ``stitchtune.torch.check_errors()``
  calls, after synchronising the device), and, with ``check_gather="sync"`` (a debug option), right
  after the launch that met it (a synchronisation per call).
* The error is a :class:`~stitchtune.errors.StitchtuneError` whose message contains ``index out of
  range`` (so the backend's guard raises it instead of running the region's ATen ops).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from stitchtune.errors import StitchtuneError

__all__ = ["GatherFlags", "check_all", "check_keys", "gather_inputs", "index_error"]

_lock = threading.Lock()
#: every live GatherFlags (weakly: a dropped kernel's go with it)
_ALL: weakref.WeakSet[GatherFlags] = weakref.WeakSet()


def index_error(region: str, what: Sequence[str], when: str) -> StitchtuneError:
    """The error for the gathers ``what`` (their descriptions) of ``region`` that met an out-of-range index."""
    return StitchtuneError(problems=[f"{region}: {w}: index out of range (the table has fewer rows, or the "
                                     f"index is negative; those output rows are zeros), seen {when}" for w in what])


def gather_inputs(graph: Any, nodes: Iterable[str]) -> dict[str, str]:
    """Gather node id -> a description naming its index input: the region's input (its position, graph
    name, dtype and shape) or the node inside the region that computes it."""
    names = [n for n, _ in graph.inputs]
    out = {}
    for node_id in nodes:
        try:
            idx = graph.node(node_id).args[1]
        except (KeyError, IndexError):
            out[node_id] = f"gather {node_id!r}"
            continue
        if isinstance(idx, str) and idx in names:
            spec = graph.spec(idx)
            where = f"region input {names.index(idx)} ({idx!r}, {spec.dtype} {list(spec.shape)})"
        else:
            where = f"index {idx!r} computed inside the region"
        out[node_id] = f"gather {node_id!r} reading {where}"
    return out


@dataclass(frozen=True, eq=False)
class GatherFlags:
    """One launcher's gather error flags (see module docstring): ``flags`` holds (description, host
    float32 array of one element) per gather."""

    region: str
    flags: tuple[tuple[str, np.ndarray], ...]

    @classmethod
    def of(cls, region: str, launcher: Any, buffers: dict[str, str], graph: Any) -> GatherFlags:
        """The flags of ``launcher`` (its :attr:`~stitchtune.gpu.launch.Launcher.host` arrays of the
        flag buffers ``buffers``: buffer name -> gather node id), registered for :func:`check_all`."""
        what = gather_inputs(graph, buffers.values())
        made = cls(region, tuple((what[node], launcher.host[b].view(np.float32)) for b, node in buffers.items()))
        with _lock:
            _ALL.add(made)
        return made

    def is_set(self) -> bool:
        """Whether a flag is set (a host read: no device call)."""
        return any(a[0] != 0 for _, a in self.flags)

    def take(self) -> list[str]:
        """The descriptions of the set flags, zeroed (host writes)."""
        bad = []
        for what, a in self.flags:
            if a[0] != 0:
                bad.append(what)
                a[0] = 0
        return bad

    def raise_if_set(self, when: str) -> None:
        """Raise :func:`index_error` (and zero the flags) when one is set."""
        if self.is_set():
            raise index_error(self.region, self.take(), when)


def check_keys(flags: Iterable[GatherFlags], when: str = "after the compiled graph ran") -> None:
    """Raise for the first of ``flags`` that is set (the backend's check after a graph's call)."""
    for f in flags:
        f.raise_if_set(when)


def check_all(when: str = "at stitchtune.torch.check_errors()") -> None:
    """Raise naming every region whose flag is set, over every live launcher of the process (zeroed)."""
    with _lock:
        every = list(_ALL)
    problems = []
    for f in every:
        bad = f.take()
        if bad:
            problems += index_error(f.region, bad, when).problems
    if problems:
        raise StitchtuneError(problems=problems)
