"""Index grids: which element of a base tensor each element of a layout op's result reads.

Shared by the ONNX importer (:mod:`stitchtune.importers.onnx_layout`: Gather/GatherND/Slice chains
on constant parameters) and the PyTorch importer (``aten.index`` with constant indices): the op is
applied to the grid ``arange(prod(base)).reshape(base)`` and the result tells what the op is.

Contract of :func:`grid_kind(res, base_shape)`: ``"reshape"`` when ``res`` holds every element of
the base once, in order (the same bytes; it may also broadcast, see :func:`is_broadcast`),
``"broadcast"`` when ``res`` is the base broadcast numpy-style (right-aligned) to ``res.shape``,
else None (a real gather: not a view). :func:`rotation(res, base_shape)` tells a rotation along one
axis (``torch.roll``: a concat of two slices). Grids are bounded by :data:`MAX_GRID` elements.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["MAX_GRID", "broadcasts", "grid_kind", "is_broadcast", "rotation", "strip_leading_ones"]

MAX_GRID = 1 << 15   # elements of a base (and of each view of it) traced on an index grid


def strip_leading_ones(shape: tuple[int, ...]) -> tuple[int, ...]:
    k = 0
    while k < len(shape) and shape[k] == 1:
        k += 1
    return shape[k:]


def broadcasts(base: tuple[int, ...], out: tuple[int, ...]) -> bool:
    """True when ``base`` broadcasts (numpy rules) to exactly ``out``."""
    try:
        return tuple(np.broadcast_shapes(base, out)) == out
    except ValueError:
        return False


def is_broadcast(grid: np.ndarray, base_shape: tuple[int, ...]) -> bool:
    """True when the index ``grid`` is the base's own grid broadcast to ``grid.shape``."""
    if not broadcasts(base_shape, grid.shape):
        return False
    core = strip_leading_ones(base_shape)
    want = np.broadcast_to(np.arange(math.prod(core), dtype=np.int64).reshape(core), grid.shape)
    return bool(np.array_equal(grid, want))


def grid_kind(res: np.ndarray, base_shape: tuple[int, ...]) -> str | None:
    """``"reshape"``, ``"broadcast"`` or None for the index grid ``res`` (see the module docstring)."""
    size = math.prod(base_shape)
    if res.size == size and np.array_equal(res.reshape(-1), np.arange(size)):
        return "reshape"
    if is_broadcast(res, base_shape):
        return "broadcast"
    return None


def rotation(res: np.ndarray, base_shape: tuple[int, ...]) -> tuple[int, int] | None:
    """``(axis, k)`` when the index grid ``res`` is the base rotated along one axis (``torch.roll``):
    element ``i`` of that axis reads element ``(i + k) % n``, ``0 < k < n``, i.e. ``concat(base[k:],
    base[:k])``; else None."""
    if tuple(res.shape) != tuple(base_shape):
        return None
    grid = np.arange(math.prod(base_shape), dtype=np.int64).reshape(base_shape)
    for axis, n in enumerate(base_shape):
        if n < 2:
            continue
        stride = math.prod(base_shape[axis + 1:])
        k = int(res.reshape(-1)[0] // stride) % n
        if 0 < k and np.array_equal(res, np.roll(grid, -k, axis=axis)):
            return axis, k
    return None
