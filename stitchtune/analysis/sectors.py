"""Coalescing from the emulator: 32-byte sectors per warp request against the ideal, per global access.

Contract
--------
:func:`program_sectors(program, inputs, max_blocks)` runs each launch of a static
:class:`~stitchtune.ir.kir.Program` in the emulator on a *slice* of its grid (the first
``max_blocks`` blocks, ``gridDim.x`` still the launch's grid; see
:func:`stitchtune.emulate.emulator.emulate_kernel`'s ``blocks``) with an access sink (``trace=``, counting as the records arrive), and returns
one :class:`AccessSectors` per (launch, global memory statement, buffer) and one :class:`SharedAccess`
(bank wavefronts per request) per shared-memory statement; :func:`kernel_sectors` does
it for one kernel launch on given buffers. A warp request is one
warp executing one memory statement (the active lanes of that warp); its sectors are the distinct
32-byte sectors its lanes touch, its ideal the fewest sectors its distinct bytes could fill
(``ceil(distinct bytes / 32)``; the arithmetic is :func:`stitchtune.ir.sectors.warp_sectors`). ``ratio = sectors / ideal`` summed over the requests: 1.0 is a
perfectly coalesced access, 8.0 a 4-byte access per lane at a stride of a sector or more (each
lane a sector of its own). Sectors per request are a per-warp property, so the first blocks of a
launch show what every full block does (a partial last block may differ; it is not emulated).

The slice does not compute results (other blocks' writes never happen), so every buffer is treated
as written; inputs are the values given (index inputs must be valid, as for any emulation), scratch
and outputs start as zeros. An emulator fault in a slice is data: :class:`SliceResult` ``error``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stitchtune.emulate.emulator import EmulatorFault, elem_dtype, emulate_kernel
from stitchtune.ir.sectors import warp_sectors
from stitchtune.emulate.trace import MemoryAccess
from stitchtune.ir import kir
from stitchtune.ir.kir import ELEM_BYTES

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_SLICE_BLOCKS", "AccessSectors", "SharedAccess", "SliceResult",
           "kernel_sectors", "program_sectors", "slice_blocks"]

#: blocks of each launch emulated by default (every warp of them is counted)
DEFAULT_SLICE_BLOCKS = 4


@dataclass(frozen=True)
class AccessSectors:
    """One global memory statement of one launch: ``op`` load | store | atomic of ``buf`` (a
    parameter of the kernel), ``width`` elements of ``elem_bytes`` per lane; over the emulated slice
    ``requests`` warp requests touched ``sectors`` sectors where ``ideal`` would do."""

    kernel: str
    where: str
    buf: str
    op: str
    width: int
    elem_bytes: int
    requests: int
    sectors: int
    ideal: int
    lanes: int = 0   # active lanes summed over the requests (32 per request when every lane takes part)

    @property
    def ratio(self) -> float:
        """Sectors over the ideal (>= 1.0; 1.0 = coalesced)."""
        return self.sectors / self.ideal if self.ideal else 1.0

    @property
    def access_bits(self) -> int:
        """Bits one lane moves per access (128: a 16-byte vector access)."""
        return self.width * self.elem_bytes * 8

    @property
    def active_lanes(self) -> float:
        """Active lanes per request over 32 (1.0: every lane of every warp request takes part)."""
        return self.lanes / (32 * self.requests) if self.requests else 1.0

    @property
    def wide(self) -> bool:
        """A warp request reads more than one sector (not a broadcast of a per-row value)."""
        return self.ideal > self.requests

    def to_dict(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "where": self.where, "buf": self.buf, "op": self.op, "width": self.width,
                "elem_bytes": self.elem_bytes, "requests": self.requests, "sectors": self.sectors,
                "ideal": self.ideal, "lanes": self.lanes, "ratio": round(self.ratio, 4)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AccessSectors:
        return cls(**{k: v for k, v in d.items() if k != "ratio"})


@dataclass(frozen=True)
class SharedAccess:
    """One shared-memory statement of one launch over the emulated slice: ``requests`` scalar warp
    requests (the renderer splits a vector shared access into scalar ones, so a ``width``-wide
    statement makes ``width`` requests per warp) took ``wavefronts`` passes of the 32 banks: per
    request, the most distinct 4-byte words that fall into one bank (a broadcast is free). 1.0 per
    request: no bank conflict; 2.0: two-way conflicts."""

    kernel: str
    where: str
    buf: str
    op: str
    width: int
    requests: int
    wavefronts: int

    @property
    def ratio(self) -> float:
        """Wavefronts per request (>= 1.0; 1.0 = conflict-free)."""
        return self.wavefronts / self.requests if self.requests else 1.0

    def to_dict(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "where": self.where, "buf": self.buf, "op": self.op, "width": self.width,
                "requests": self.requests, "wavefronts": self.wavefronts, "ratio": round(self.ratio, 4)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SharedAccess:
        return cls(**{k: v for k, v in d.items() if k != "ratio"})


@dataclass(frozen=True)
class SliceResult:
    """The accesses of one launch's slice: ``blocks`` of ``grid`` emulated; ``error`` is the
    emulator's fault text when the slice could not run ('' otherwise)."""

    kernel: str
    grid: int
    blocks: int
    accesses: tuple[AccessSectors, ...] = field(default=())
    error: str = ""
    shared: tuple[SharedAccess, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "grid": self.grid, "blocks": self.blocks, "error": self.error,
                "accesses": [a.to_dict() for a in self.accesses], "shared": [a.to_dict() for a in self.shared]}


class _Collector:
    """An access sink (``emulate_kernel(trace=...)``) that counts sectors per warp request
    (:func:`~stitchtune.ir.sectors.warp_sectors`) and bank wavefronts as the records arrive."""

    def __init__(self, kernel: kir.Kernel) -> None:
        self.kernel = kernel
        self.elem = {p.name: ELEM_BYTES.get(p.dtype, 4) for p in kernel.params}
        # (where, buf, op, width) -> [requests, sectors, ideal, lanes]
        self.counts: dict[tuple[str, str, str, int], list[int]] = {}
        # shared: (where, buf, op, width) -> [requests, wavefronts]
        self.banks: dict[tuple[str, str, str, int], list[int]] = {}

    def append(self, a: MemoryAccess) -> None:
        w = np.repeat(a.warps, a.width) if a.width > 1 else a.warps
        if a.shared:
            self._shared(a.where, a.buf, a.op, w, a.elements, a.width)
            return
        n = warp_sectors(w, a.elements, self.elem[a.buf])
        c = self.counts.setdefault((a.where, a.buf, a.op, a.width), [0, 0, 0, 0])
        c[0] += n.requests
        c[1] += n.sectors
        c[2] += n.ideal
        c[3] += int(a.threads.size)

    def _shared(self, where: str, buf: str, op: str, w: np.ndarray, e: np.ndarray, width: int) -> None:
        """Bank wavefronts of one shared statement: one scalar request per warp and vector element."""
        k = np.tile(np.arange(width, dtype=np.int64), e.size // width) if width > 1 else np.zeros(e.size, np.int64)
        req = w * width + k
        pairs = np.unique((req << 34) | e)                        # distinct words per request
        keys, counts = np.unique(((pairs >> 34) << 5) | ((pairs & ((1 << 34) - 1)) % 32), return_counts=True)
        reqs = keys >> 5                                          # sorted: a request's banks are adjacent
        starts = np.flatnonzero(np.r_[True, reqs[1:] != reqs[:-1]])
        c = self.banks.setdefault((where, buf, op, width), [0, 0])
        c[0] += starts.size
        c[1] += int(np.maximum.reduceat(counts, starts).sum()) if starts.size else 0

    def shared_result(self) -> tuple[SharedAccess, ...]:
        return tuple(SharedAccess(self.kernel.name, where, buf, op, width, *c)
                     for (where, buf, op, width), c in sorted(self.banks.items()))

    def result(self) -> tuple[AccessSectors, ...]:
        return tuple(AccessSectors(self.kernel.name, where, buf, op, width, self.elem[buf], *c)
                     for (where, buf, op, width), c in sorted(self.counts.items()))


def slice_blocks(kernel: kir.Kernel, grid: int, max_blocks: int) -> int:
    """Blocks of a slice: at most ``max_blocks`` (>= 1) and the grid, a whole number of clusters."""
    n = max(1, min(grid, max_blocks))
    if kernel.cluster > 1:
        n = max(kernel.cluster, n // kernel.cluster * kernel.cluster)
    return min(n, grid)


def _buffers(program: kir.Program, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    arrays: dict[str, np.ndarray] = {}
    for b in program.buffers:
        dt = elem_dtype(b.dtype, b.role)
        if b.role == "input":
            arrays[b.name] = np.asarray(inputs[b.tensor]).ravel().astype(dt)
        else:
            arrays[b.name] = np.zeros(b.size, dt)
    return arrays


def program_sectors(program: kir.Program, inputs: Mapping[str, np.ndarray],
                    max_blocks: int = DEFAULT_SLICE_BLOCKS) -> list[SliceResult]:
    """One :class:`SliceResult` per launch of ``program`` (static programs only; see module docstring).

    ``inputs`` maps each input tensor to its values (e.g. :func:`stitchtune.graph.reference.random_inputs`).
    """
    if program.dynamic is not None:
        raise ValueError("program_sectors takes a static program (program.dynamic is None)")
    arrays = _buffers(program, inputs)
    out: list[SliceResult] = []
    for launch in program.launches:
        kernel = program.kernel(launch.kernel)
        out.append(kernel_sectors(kernel, launch.grid, {p.name: arrays[a] for p, a in zip(kernel.params, launch.args)},
                                  max_blocks))
    return out


def kernel_sectors(kernel: kir.Kernel, grid: int, buffers: dict[str, np.ndarray],
                   max_blocks: int = DEFAULT_SLICE_BLOCKS) -> SliceResult:
    """The accesses of one launch ``kernel<<<grid>>>`` on ``buffers`` (one array per parameter, as
    :func:`~stitchtune.emulate.emulator.emulate_kernel` takes them; updated in place) over a slice of
    at most ``max_blocks`` blocks (see module docstring)."""
    blocks = slice_blocks(kernel, grid, max_blocks)
    col = _Collector(kernel)
    error = ""
    try:
        emulate_kernel(kernel, grid, buffers, blocks=blocks, trace=col)
    except EmulatorFault as exc:
        log.warning("slice of %s could not run: %s", kernel.name, exc)
        error = str(exc)
    return SliceResult(kernel.name, grid, blocks, col.result(), error, col.shared_result())
