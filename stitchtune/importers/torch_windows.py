"""Strided region inputs, read where they lie: permuted ones, and windows of a larger tensor.

An input that PyTorch holds permuted (a convolution's channels-last output seen as NCHW) is declared
in its memory order and read through a transpose (:func:`input_perms`).

An input that is a part of a larger tensor (a split part: Phi-3's ``gate`` and ``up`` halves of one
``gate_up_proj`` output, saved for the backward as two strided views) is declared as that tensor.

Such an input (``[1, 8, 64]`` with strides ``(1024, 128, 1)``: the first or second half of the last dim
of a row-major ``[1, 8, 128]``) is declared by the region's graph as that whole row-major tensor, its
:class:`Window`, and read through a ``slice`` (:func:`declare_windowed`), so the region op hands the
kernel the window itself (:meth:`Window.view`: ``as_strided``, no copy kernel) instead of copying the
part contiguous first. :func:`held_window` finds the window from a fake tensor's sizes, strides and
storage offset; :meth:`Window.view` checks them again on the real tensor at every call and returns
None when they differ (the caller copies then).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from collections.abc import Mapping, Sequence
from typing import Any

from stitchtune.importers.builder import GraphBuilder, Value
from stitchtune.importers.torch_fx_util import fx_args
from stitchtune.importers.torch_subgraph import _dense_perm

__all__ = ["Window", "declare_windowed", "held_permuted", "held_window", "input_perms", "input_windows",
           "reads_strided", "symbolic"]


def _row_major(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))


@dataclass(frozen=True)
class Window:
    """The row-major tensor of shape ``full`` that an input is the ``[start, start + n)`` part of along
    ``dim`` (``n``: the input's own size there; every other dim the same)."""

    full: tuple[int, ...]
    dim: int
    start: int

    def view(self, t: Any) -> Any | None:
        """The window of ``t`` (a strided tensor: the part), an ``as_strided`` view of its storage, or
        None when ``t`` is not that part (other strides, or the window would leave its storage)."""
        strides = _row_major(self.full)
        shape = tuple(t.shape)
        want = tuple(n if i == self.dim else d for i, (d, n) in enumerate(zip(self.full, shape)))
        if len(shape) != len(self.full) or shape != want or tuple(t.stride()) != strides \
                or self.start + shape[self.dim] > self.full[self.dim]:
            return None
        base = t.storage_offset() - self.start * strides[self.dim]
        if base < 0 or (base + math.prod(self.full)) * t.element_size() > t.untyped_storage().nbytes():
            return None
        return t.as_strided(self.full, strides, base)


def held_window(val: Any) -> Window | None:
    """The :class:`Window` of ``val`` (a fake tensor of a region input) when it is a float tensor of
    static sizes, not contiguous, whose strides are those of a row-major tensor that is larger along
    exactly one dim (a part of a split), and whose storage offset puts its start there; else None."""
    if not hasattr(val, "stride") or not val.dtype.is_floating_point or val.dim() == 0 or val.is_contiguous():
        return None
    shape, strides = tuple(val.shape), tuple(val.stride())
    if not all(isinstance(d, int) for d in (*shape, *strides)) or not isinstance(val.storage_offset(), int):
        return None
    for dim in range(len(shape)):
        outer = strides[dim - 1] if dim > 0 else None
        inner = strides[dim]
        if outer is None or inner <= 0 or outer % inner:
            continue
        full = tuple(outer // inner if i == dim else d for i, d in enumerate(shape))
        if full[dim] <= shape[dim] or _row_major(full) != strides:
            continue
        start = (val.storage_offset() // inner) % full[dim]
        if start + shape[dim] <= full[dim]:
            return Window(full, dim, start)
    return None


def declare_windowed(b: GraphBuilder, name: str, window: Window, shape: tuple[int, ...],
                     dtype: str) -> tuple[Value, Value]:
    """(the graph input ``name``, declared as ``window.full``; its ``slice`` of ``shape``, the value the
    region reads)."""
    raw = b.add_input(name, window.full, dtype)
    n = shape[window.dim]
    return raw, b.layout("slice", [raw], shape, dtype, f"{name}_part", axis=window.dim, start=window.start,
                         stop=window.start + n)


def input_windows(inputs: Sequence[Any], others: Sequence[Any], perms: Sequence[Any],
                  skip: set[int]) -> list[Window | None]:
    """Per region input (fx nodes): its :func:`held_window`, or None for those at ``skip`` positions
    (constants, inputs declared at another shape), those with a permutation in ``perms``, and every
    input of a region with symbolic sizes (``others``: its outputs; mapped again at contiguous shapes)."""
    if any(symbolic(n.meta.get("val")) for n in (*inputs, *others)):
        return [None] * len(inputs)
    return [None if i in skip or p is not None else held_window(x.meta.get("val"))
            for i, (x, p) in enumerate(zip(inputs, perms))]


def input_perms(inputs: Sequence[Any], outputs: Sequence[Any], consts: Mapping[Any, Any], reshaped: set[str],
                names: Sequence[str]) -> list[tuple[int, ...] | None]:
    """Per region input: the axis order PyTorch stores it in when that is a permutation of a dense
    tensor other than row-major (a convolution's channels-last output read as NCHW: ``val.permute(p)``
    is contiguous), else None. The region declares such an input as ``val.permute(p)`` (its memory)
    and reads it through a transpose, so the region op passes the permuted view, not a copy (see
    :attr:`~stitchtune.importers.torch_regions.TorchRegion.input_perms`). None for every input of a
    region with symbolic sizes (its kernels are mapped again at contiguous shapes), for constants (held
    by the kernel as they are),
    for the inputs declared at another shape (``reshaped``: read through one reshape, or a ``[B]``
    value held per row), and for int and bool inputs (a gather's indices must be a graph input)."""
    if any(symbolic(n.meta.get("val")) for n in (*inputs, *outputs)):
        return [None] * len(inputs)
    out: list[tuple[int, ...] | None] = []
    for x, name in zip(inputs, names):
        p = None if x in consts or name in reshaped else held_permuted(x.meta.get("val"))
        out.append(None if p is None or p == tuple(range(len(p))) else p)
    return out


def held_permuted(val: Any) -> tuple[int, ...] | None:
    """The axis order PyTorch stores ``val`` (an fx node's value) in when it is a float tensor of rank 2
    or more, of static sizes, not contiguous and a permutation of a dense tensor
    (:func:`~stitchtune.importers.torch_subgraph._dense_perm`); else None."""
    if not hasattr(val, "is_contiguous") or val.dim() < 2 or not val.dtype.is_floating_point \
            or symbolic(val) or val.is_contiguous():
        return None
    return _dense_perm(val)


def symbolic(val: Any) -> bool:
    """``val`` (a fake tensor) has a symbolic size or stride."""
    return val is not None and not all(isinstance(d, int) for d in (*val.shape, *val.stride()))


def reads_strided(group: Sequence[Any]) -> bool:
    """Whether a node of ``group`` reads a float tensor from outside it that PyTorch holds permuted
    (a candidate for :func:`input_perms`) or that is a part of a larger one (a window)."""
    own = set(group)
    for n in group:
        for a in fx_args(n):
            if a not in own and hasattr(a, "meta") and (held_permuted(a.meta.get("val")) is not None
                                                        or held_window(a.meta.get("val")) is not None):
                return True
    return False
