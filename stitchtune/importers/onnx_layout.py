"""Layout ops of an ONNX graph seen as views: which element of an earlier tensor each output reads.

The exporters build masks and broadcasts with chains of layout ops on constant parameters
(``Cast -> Flatten -> Gather(constant indices) -> Reshape -> Reshape -> And -> Expand``). graph.json
has no reshape, but most of these chains only add, drop or repeat unit-free axes: their result is
the chain's first tensor broadcast numpy-style, which every element-wise consumer does for free.

Contract
--------
* :func:`resolve_views(nodes, shapes, consts)` returns, for each node whose op is in
  :data:`VIEW_OPS`, whose data input (input 0) is a tensor with a static shape and whose other inputs
  are constants, a :class:`View`: its *base* (the first tensor up the chain of such nodes that is not
  itself a view output) and whether its output equals the base broadcast to the output shape
  (``broadcast``) or holds its elements in order (``reshape``). Reshapes of such a view and an
  Expand of a broadcast one follow from the shapes; any other chain (Gather, Transpose, Slice, Tile
  on constant parameters) is evaluated on the grid of element indices of the base, bounded by
  :data:`MAX_GRID` elements (bigger ones are not views; nothing here allocates more). Only views
  (whose output is exactly what broadcasting or a reshape gives) are returned; a chain link that is
  neither is not a view, and neither is what follows it.
* ``broadcast`` means: the base broadcasts (numpy rules, right-aligned) to the output shape and the
  output element at each position is the broadcast base element. Identity, Expand, and
  Reshape/Flatten/Squeeze/Unsqueeze/Gather/Transpose chains that only move unit axes are all of this
  kind. ``reshape`` means: the output holds the base's elements in the base's order (any Reshape;
  the same bytes).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Container, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from stitchtune.importers.index_grid import MAX_GRID, broadcasts, grid_kind, is_broadcast, strip_leading_ones
from stitchtune.importers.onnx_fold import evaluate

__all__ = ["MAX_GRID", "VIEW_OPS", "View", "resolve_views"]

log = logging.getLogger(__name__)

VIEW_OPS: frozenset[str] = frozenset({"Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Expand",
                                      "Transpose", "Gather", "GatherND", "GatherElements", "Slice", "Tile"})


@dataclass(frozen=True)
class View:
    """Output of a layout node as a view of ``base`` (an ONNX tensor name)."""

    base: str
    base_shape: tuple[int, ...]
    shape: tuple[int, ...]
    broadcast: bool            # output == base broadcast to ``shape`` (see the module docstring)
    reshape: bool              # output == base reshaped: the same elements in the same order


_RESHAPES = frozenset({"Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze"})
_strip, _broadcasts, _is_broadcast = strip_leading_ones, broadcasts, is_broadcast


def _grid(v: View) -> np.ndarray | None:
    """The index grid of a view (None if its base is too large to trace)."""
    n = math.prod(v.base_shape)
    if n > MAX_GRID or math.prod(v.shape) > MAX_GRID:
        return None
    if v.reshape:
        return np.arange(n, dtype=np.int64).reshape(v.shape)
    core = _strip(v.base_shape)
    return np.broadcast_to(np.arange(n, dtype=np.int64).reshape(core), v.shape)


def _symbolic(op: str, v: View, out: tuple[int, ...]) -> View | None:
    """The view after ``op`` when it follows from shapes alone (reshapes of a reshape, an Expand of
    a broadcast), else None (the chain is traced on its index grid)."""
    if op in _RESHAPES and (v.reshape or (v.broadcast and math.prod(v.shape) == math.prod(v.base_shape))):
        return View(v.base, v.base_shape, out, broadcast=_strip(v.base_shape) == _strip(out)
                    and len(v.base_shape) <= len(out), reshape=True)
    if op == "Expand" and v.broadcast and _broadcasts(v.base_shape, out):
        return View(v.base, v.base_shape, out, broadcast=True,
                    reshape=math.prod(out) == math.prod(v.base_shape))
    return None


def resolve_views(nodes: list[Any], shapes: Mapping[str, tuple[int, ...] | None],
                  consts: Mapping[str, np.ndarray], passthrough: Container[int] = ()) -> dict[int, View]:
    """The :class:`View` of each layout node that is one (see the module docstring); the nodes in
    ``passthrough`` (same-type casts) are traced as ``Identity``."""
    from onnx import helper

    out: dict[int, View] = {}
    view_of: dict[str, View] = {}   # tensor -> the view it is
    for i, n in enumerate(nodes):
        op = "Identity" if i in passthrough else n.op_type
        if op not in VIEW_OPS or n.domain not in ("", "ai.onnx") or len(n.output) != 1 \
                or not n.input or not n.input[0] or n.input[0] in consts \
                or not all(t in consts for t in n.input[1:] if t):
            continue
        src, dst = n.input[0], n.output[0]
        oshape = shapes.get(dst)
        if oshape is None or not all(isinstance(d, int) and d > 0 for d in oshape):
            continue
        cur = view_of.get(src)
        if cur is None:
            bshape = shapes.get(src)
            if bshape is None or not all(isinstance(d, int) and d > 0 for d in bshape) or not 1 <= len(bshape) <= 4:
                continue
            cur = View(src, tuple(bshape), tuple(bshape), broadcast=True, reshape=True)
        v = _symbolic(op, cur, tuple(oshape)) or _traced(op, n, cur, tuple(oshape), consts, helper)
        if v is not None:
            out[i] = view_of[dst] = v
    return out


def _traced(op: str, n: Any, cur: View, oshape: tuple[int, ...], consts: Mapping[str, np.ndarray],
            helper: Any) -> View | None:
    """The view after ``op``, found on the index grid of the base (None: not a view, or too large)."""
    grid = _grid(cur)
    if grid is None:
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
    try:
        res = evaluate(op, attrs, [grid, *(consts[t] if t else None for t in n.input[1:])])
    except Exception as e:  # noqa: BLE001 -- an op that cannot be traced is simply not a view
        log.debug("%s: not a view: %s", n.op_type, e)
        return None
    if res.size > MAX_GRID or tuple(res.shape) != oshape or res.dtype.kind not in "iu":
        return None
    kind = grid_kind(res, cur.base_shape)
    if kind == "reshape":
        return View(cur.base, cur.base_shape, oshape, broadcast=_is_broadcast(res, cur.base_shape), reshape=True)
    if kind == "broadcast":
        return View(cur.base, cur.base_shape, oshape, broadcast=True, reshape=False)
    return None
