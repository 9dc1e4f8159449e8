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
  (``broadcast``). It is found by evaluating the chain on the grid of element indices of the base
  (bounded by :data:`MAX_GRID`; bigger chains are not views). Nothing here allocates more than that.
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

from stitchtune.importers.onnx_fold import evaluate

__all__ = ["MAX_GRID", "VIEW_OPS", "View", "resolve_views"]

log = logging.getLogger(__name__)

VIEW_OPS: frozenset[str] = frozenset({"Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Expand",
                                      "Transpose", "Gather", "GatherND", "GatherElements", "Slice", "Tile"})
MAX_GRID = 1 << 20   # elements of a base (and of each view of it) that are worth tracing


@dataclass(frozen=True)
class View:
    """Output of a layout node as a view of ``base`` (an ONNX tensor name)."""

    base: str
    base_shape: tuple[int, ...]
    shape: tuple[int, ...]
    broadcast: bool            # output == base broadcast to ``shape`` (see the module docstring)
    reshape: bool              # output == base reshaped: the same elements in the same order
    grid: np.ndarray           # flat index into the base of each output element, shape ``shape``


def _is_broadcast(grid: np.ndarray, base_shape: tuple[int, ...]) -> bool:
    try:
        if tuple(np.broadcast_shapes(base_shape, grid.shape)) != grid.shape:
            return False
    except ValueError:
        return False
    core = list(base_shape)
    while core and core[0] == 1:
        core.pop(0)
    want = np.broadcast_to(np.arange(math.prod(core), dtype=np.int64).reshape(core), grid.shape)
    return bool(np.array_equal(grid, want))


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
        if src in view_of:
            base, bshape, grid = view_of[src].base, view_of[src].base_shape, view_of[src].grid
        else:
            bshape = shapes.get(src)
            if bshape is None or not all(isinstance(d, int) and d > 0 for d in bshape) \
                    or not 1 <= len(bshape) <= 4 or math.prod(bshape) > MAX_GRID:
                continue
            base, grid = src, np.arange(math.prod(bshape), dtype=np.int64).reshape(bshape)
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        try:
            res = evaluate(op, attrs, [grid, *(consts[t] if t else None for t in n.input[1:])])
        except Exception as e:  # noqa: BLE001 -- an op that cannot be traced is simply not a view
            log.debug("%d:%s: not a view: %s", i, n.op_type, e)
            continue
        oshape = shapes.get(dst)
        if res.size > MAX_GRID or oshape is None or tuple(res.shape) != tuple(oshape) \
                or res.dtype.kind not in "iu":
            continue
        v = View(base=base, base_shape=tuple(bshape), shape=tuple(res.shape),
                 broadcast=_is_broadcast(res, tuple(bshape)), grid=res,
                 reshape=res.size == math.prod(bshape) and bool(np.array_equal(res.reshape(-1), np.arange(res.size))))
        out[i] = view_of[dst] = v
    return out
