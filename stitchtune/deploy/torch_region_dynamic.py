"""Kernels of regions with symbolic shapes, for the torch op (:mod:`stitchtune.deploy.torch_ops`, which
re-exports them): :class:`DynamicRegionKernel` caches kernels per (structure, bucket) of the shapes it
meets, each a :class:`Built`; a shape without a kernel runs the region's ATen ops.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from stitchtune.deploy.torch_guard import eager_outputs

if TYPE_CHECKING:
    from stitchtune.deploy.compiled_graph import CompiledGraph
    from stitchtune.deploy.torch_ops import RegionKernel
    from stitchtune.deploy.torch_stats import RegionCounter

__all__ = ["Built", "DynamicRegionKernel"]

log = logging.getLogger("stitchtune.deploy.torch_ops")   # its records keep the op's logger name


@dataclass(frozen=True)
class Built:
    """A kernel :class:`DynamicRegionKernel`'s ``build`` made: ``kernel(inputs[, device]) -> outputs`` (a
    :class:`RegionKernel`), ``index[i]`` the position in its outputs of the module's output ``i``, and
    ``generic``: True when it runs every shape of the inputs' bucket (kept for the bucket), False
    when it is specialised to the inputs' shapes (kept for those shapes)."""

    kernel: RegionKernel
    index: tuple[int, ...]
    generic: bool = False


@dataclass
class _Entry:
    """One (structure, bucket) of a :class:`DynamicRegionKernel`'s cache: a generic kernel, or
    kernels per shape (None: no kernel for that shape, its ATen ops run)."""

    generic: Built | None = None
    shapes: dict[Any, Built | None] = field(default_factory=dict)


@dataclass
class DynamicRegionKernel:
    """A region with symbolic shapes. ``module`` (its ATen ops) gives the fake result and, where no
    kernel can be made, the eager one. Kernels are cached by (structure, bucket): the structure is
    the inputs' dtypes, device type and ranks; the bucket is ``bucket_of(inputs)`` (None, or when it
    raises: the exact input shapes). A cache miss calls ``build(inputs)`` -> :class:`Built`; a generic
    kernel then serves every shape of its bucket, a specialised one its shapes only. A failing build
    is logged once per shape, and that shape runs the region's ATen ops. ``counter`` (a
    :class:`~stitchtune.deploy.torch_stats.RegionCounter`) counts cache hits and eager calls; ``build``
    counts its own selections and builds."""

    name: str
    ops: tuple[str, ...]
    module: Any
    build: Callable[[Sequence[Any]], Built]
    compiled: CompiledGraph | None = None   # at the example shapes (what explain reports)
    bucket_of: Callable[[Sequence[Any]], Hashable] | None = None  # None: the exact shapes
    counter: RegionCounter | None = None
    #: per output, the axis order the kernels write it row-major in (the region's ``output_perms``:
    #: PyTorch keeps it permuted in memory); () or None: its own order
    perms: tuple[tuple[int, ...] | None, ...] = ()
    #: which of ``module``'s outputs the kernels return, in their order (None: all); the module also
    #: returns the no-op views a region's ``aliases`` stand for (GPT-2's fused qkv viewed for q beside
    #: the cache concats of k and v), which neither the fake nor the eager result may include
    keep: tuple[int, ...] | None = None
    kernels: dict[Any, _Entry] = field(default_factory=dict, repr=False)

    def describe(self) -> str:
        return f"stitched region {self.name} ({', '.join(o.removeprefix('aten.') for o in self.ops)})"

    def fake(self, inputs: Sequence[Any], device: Any = None) -> list[Any]:
        """Empty outputs shaped as the kernels write them (permuted by ``perms``; on the device the
        region's ATen ops put them, ``device`` unused)."""
        outs = self.module(*inputs)
        outs = outs if self.keep is None else [outs[k] for k in self.keep]
        perms = self.perms or (None,) * len(outs)
        return [torch.empty(o.shape if p is None else o.permute(p).shape, dtype=o.dtype, device=o.device)
                for o, p in zip(outs, perms)]

    def _eager(self, inputs: Sequence[Any]) -> list[Any]:
        return eager_outputs(self.module, inputs, self.perms or None, self.keep)

    def copies(self, inputs: Sequence[Any]) -> int:
        """How many of ``inputs`` a call copies before its launch: every strided one (the kernels of a
        region with symbolic sizes are mapped at contiguous inputs)."""
        return sum(not t.is_contiguous() for t in inputs)

    def _bucket(self, inputs: Sequence[Any], shapes: Any) -> Any:
        if self.bucket_of is None:
            return ("shapes", shapes)
        try:
            return ("bucket", self.bucket_of(inputs))
        except Exception as exc:  # noqa: BLE001 - outside every bucket: kernels per shape
            log.debug("%s: no bucket for shapes %s (%s)", self.describe(), [list(s) for s in shapes], exc)
            return ("shapes", shapes)

    def entries(self) -> list[tuple[Any, Any, Built | None]]:
        """The cache, flat: (bucket or None when keyed by the exact shapes, shapes or None for a
        generic kernel, kernel or None)."""
        out: list[tuple[Any, Any, Built | None]] = []
        for (_, (tag, b)), e in self.kernels.items():
            bucket = b if tag == "bucket" else None
            if e.generic is not None:
                out.append((bucket, None, e.generic))
            out += [(bucket, sh, b) for sh, b in e.shapes.items()]
        return out

    def __call__(self, inputs: Sequence[Any], device: Any = None) -> list[Any]:
        shapes = tuple(tuple(t.shape) for t in inputs)
        key = (tuple((t.dtype, t.device.type, t.dim()) for t in inputs), self._bucket(inputs, shapes))
        entry = self.kernels.get(key)
        if entry is None:
            entry = self.kernels[key] = _Entry()
        built = entry.generic
        if built is None and shapes in entry.shapes:
            built = entry.shapes[shapes]
            if built is None:
                self._count(eager=1)
                return self._eager(inputs)
        if built is not None:
            self._count(hits=1)
        else:
            try:
                built = self.build(inputs)
                log.info("%s: kernels made for shapes %s%s", self.describe(), [list(s) for s in shapes],
                         f" (bucket {key[1][1]})" if built.generic else "")
            except Exception as exc:  # noqa: BLE001 - this shape runs the region's ATen ops instead
                log.warning("%s: no kernel for shapes %s (%s); running its ATen ops", self.describe(),
                            [list(s) for s in shapes], exc)
                entry.shapes[shapes] = None
                self._count(eager=1)
                return self._eager(inputs)
            if built.generic:
                entry.generic = built
            else:
                entry.shapes[shapes] = built
        outs = built.kernel(inputs) if device is None else built.kernel(inputs, device)
        return [outs[i] for i in built.index]

    def fast_path(self, device: Any, held: Sequence[tuple[int, Any]], first: Sequence[Any]) -> Any:
        """The thin path (:class:`~stitchtune.deploy.torch_fast.FastCall`) of the kernel that ran
        ``first`` (a call's inputs, held ones included), for later calls of the same shapes; None when
        the full path must run them (no kernel, the ATen ops, or a kernel whose thin path is None)."""
        shapes = tuple(tuple(t.shape) for t in first)
        key = (tuple((t.dtype, t.device.type, t.dim()) for t in first), self._bucket(first, shapes))
        entry = self.kernels.get(key)
        built = None if entry is None else entry.generic or entry.shapes.get(shapes)
        if built is None:
            return None
        return built.kernel.fast_path(device, held, first, built.index)

    @property
    def flag_sets(self) -> list[Any]:
        """The GatherFlags of every kernel built so far."""
        return [f for _, _, b in self.entries() if b is not None for f in b.kernel.flag_sets]

    def _count(self, **n: int) -> None:
        if self.counter is not None:
            self.counter.add(**n)
