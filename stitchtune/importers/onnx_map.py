"""ONNX -> graph.json, per node: one mappable ONNX node mapped onto graph.json ops.

:func:`_map_node` is what :func:`stitchtune.importers.onnx_import.import_onnx` calls for each node of a
subgraph it builds: a view, a layout op, a shape op or ``Pad`` that changes nothing here, every other op
through its handler in :mod:`stitchtune.importers.onnx_ops`' registry; the rules of what is mappable
are :mod:`stitchtune.importers.onnx_rules`'.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from stitchtune.graph.ops import OPS
from stitchtune.graph.parse import broadcast_shapes
from stitchtune.importers.builder import GraphBuilder, Value
from stitchtune.importers.onnx_ops import _HANDLERS
from stitchtune.importers.onnx_ops_layout import layout_op, map_layout, map_split
from stitchtune.importers.onnx_partition import label
from stitchtune.importers.onnx_rules import (
    _ELEMENTWISE,
    _NOOP_SHAPE_OPS,
    pads_nothing,
    _changes_nothing,
    _check_frames,
    _Ctx,
    _Demote,
    _elem_name,
    _static_shape,
)


def _exact_of(ctx: _Ctx, b: GraphBuilder, index: int, node: Any,
              v: Callable[[str], Value]) -> Callable[[str], Value]:
    """``exact(t)``: the value of ``t`` in its ONNX shape, for an op that is not element-wise. A
    reshaped frame is reshaped back, a broadcast view is expanded (once graph.json has ``expand``);
    else :class:`_Demote` of the view."""
    def exact(t: str) -> Value:
        x, want = v(t), _static_shape(ctx, t)
        if x.is_scalar or tuple(x.shape) == want:
            return x
        if "reshape" in OPS and math.prod(x.shape) == math.prod(want):   # a reshaped frame
            return b.layout("reshape", [x], want, str(x.dtype), f"{t}_reshape", shape=list(want))
        if "expand" in OPS and broadcast_shapes(tuple(x.shape), want) == want:
            return b.layout("expand", [x], want, str(x.dtype), f"{t}_expand", shape=list(want))
        raise _Demote(-1, f"a broadcast view that {label(index, node)} needs materialised "
                          f"(graph.json has no expand)", tensor=t)
    return exact


def _map_node(ctx: _Ctx, b: GraphBuilder, index: int, node: Any, v: Callable[[str], Value],
              out_names: list[str]) -> list[Value | None]:
    """The values of ``node``'s outputs (None: not produced). A value may be *broadcast*: of a shape
    that broadcasts to the ONNX one (a view's base); ops that are not element-wise take exact
    values only (:func:`_exact_of`)."""
    op, a = node.op_type, ctx.attrs(node)
    name = out_names[0]
    ins = [t for t in node.input]
    exact = _exact_of(ctx, b, index, node, v)
    if index in ctx.views:   # a view: its consumers read the base (broadcasting does the rest)
        return [v(ctx.views[index].base)]
    if op in _ELEMENTWISE:
        v = _check_frames(ctx, b, index, node, v)
    handler = _HANDLERS.get(op)
    if handler is not None:   # the registered ops (onnx_ops.SUPPORTED_OPS)
        return handler(ctx, b, node, a, v, exact, name)
    if (op in _NOOP_SHAPE_OPS and _changes_nothing(ctx, node)) or pads_nothing(ctx, node):
        return [v(ins[0])]
    if op == "Split":
        return map_split(b, node, a, exact, _elem_name(ctx, node.input[0]), lambda k: ctx.const_list(node, k),
                         out_names)
    if op in ("Gather", "GatherElements") and tuple(v(ins[1]).shape) != _static_shape(ctx, ins[1]):
        raise _Demote(-1, "a reshaped view of gather's index (graph.json indexes by a graph input)", tensor=ins[1])
    if layout_op(op) is not None:
        out = node.output[0]
        return [map_layout(b, node, a, exact, _static_shape(ctx, out), _elem_name(ctx, out),
                           lambda k: ctx.const_list(node, k), name)]
    raise AssertionError(f"unmapped supported op {op}")  # _why_not admits only mapped ops
