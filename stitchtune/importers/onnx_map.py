"""ONNX -> graph.json, per node: one mappable ONNX node mapped onto graph.json ops.

:func:`_map_node` is what :func:`stitchtune.importers.onnx_import.import_onnx` calls for each node of a
subgraph it builds; the rules of what is mappable are :mod:`stitchtune.importers.onnx_rules`'.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from stitchtune.graph.ops import OPS
from stitchtune.graph.parse import broadcast_shapes
from stitchtune.importers.builder import GraphBuilder, Value, scalar
from stitchtune.importers.onnx_ops_layout import INT_DTYPES, layout_op, map_layout, map_split
from stitchtune.importers.onnx_partition import label
from stitchtune.importers.onnx_rules import (
    _BINARY,
    _COMPARE,
    _ELEMENTWISE,
    _LOGICAL,
    _NOOP_SHAPE_OPS,
    pads_nothing,
    _ONNX_ALL,
    _REDUCE,
    _UNARY,
    _VARIADIC,
    _changes_nothing,
    _check_frames,
    _Ctx,
    _Demote,
    _elem_name,
    _static_shape,
)


def _map_mask(b: GraphBuilder, op: str, ins: list[str], v: Callable[[str], Value], name: str) -> Value:
    """A comparison, logical op or Where."""
    if op in _COMPARE:
        x, y = v(ins[0]), v(ins[1])
        if x.dtype == "bool":   # Equal of two bools: compare them as 0 / 1
            x, y = b.cast(x, "float32", f"{name}_a"), b.cast(y, "float32", f"{name}_b")
        return b.elementwise(_COMPARE[op], [x, y], name)
    if op in _LOGICAL:
        return b.elementwise(_LOGICAL[op], [v(ins[0]), v(ins[1])], name)
    if op == "Not":
        return b.logical_not(v(ins[0]), name)
    return b.elementwise("where", [v(t) for t in ins[:3]], name)


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
    if op in _COMPARE or op in _LOGICAL or op in ("Not", "Where"):
        return [_map_mask(b, op, ins, v, name)]
    if op in _UNARY:
        return [b.unary(_UNARY[op], v(ins[0]), name)]
    if op == "Identity" or (op in _NOOP_SHAPE_OPS and _changes_nothing(ctx, node)) or pads_nothing(ctx, node):
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
    if op in _BINARY:
        return [b.binary(_BINARY[op], v(ins[0]), v(ins[1]), name)]
    if op in _VARIADIC:
        acc = v(ins[0])
        for k, t in enumerate(ins[1:], 1):
            acc = b.binary(_VARIADIC[op], acc, v(t), name if k == len(ins) - 1 else f"{name}_{k}")
        return [acc]
    if op in _REDUCE or op in ("Softmax", "LogSoftmax") or op in _NORMS:
        return _map_reduction(ctx, b, node, a, exact, v, name)
    return [_map_other(ctx, b, node, a, v, name)]


_NORMS = ("LayerNormalization", "RMSNormalization", "SimplifiedLayerNormalization")


def _map_reduction(ctx: _Ctx, b: GraphBuilder, node: Any, a: dict[str, Any], exact: Callable[[str], Value],
                   v: Callable[[str], Value], name: str) -> list[Value | None]:
    """A reduction, Softmax/LogSoftmax or a layer / RMS norm (their data input exact)."""
    op, ins = node.op_type, list(node.input)
    x = exact(ins[0])
    r = len(x.shape)
    if op in _REDUCE:
        axes = a.get("axes")
        if axes is None:
            axes = ctx.const_list(node, 1)
        if not axes:
            if a.get("noop_with_empty_axes", 0):
                return [x]
            axes = list(range(r))
        return [b.reduce(_REDUCE[op], x, axes, bool(a.get("keepdims", 1)), name)]
    if op in ("Softmax", "LogSoftmax"):
        axis = a.get("axis", -1 if ctx.opset >= 13 else 1)
        axes = [axis % r] if ctx.opset >= 13 else list(range(axis % r, r))
        return [b.softmax(x, axes, name, log_=op == "LogSoftmax")]
    axes = list(range(a.get("axis", -1) % r, r))
    eps = float(a.get("epsilon", 1e-5))
    w = v(ins[1]) if len(ins) > 1 and ins[1] else None
    if op == "LayerNormalization":
        bias = v(ins[2]) if len(ins) > 2 and ins[2] else None
        return list(b.layer_norm(x, axes, w, bias, eps, name))
    y, rstd = b.rms_norm(x, axes, w, eps, name)
    return [y, rstd]


def _map_other(ctx: _Ctx, b: GraphBuilder, node: Any, a: dict[str, Any], v: Callable[[str], Value],
               name: str) -> Value:
    """Cast, Gelu/FastGelu and Clip (``clamp``; a missing bound is -inf / +inf)."""
    op, ins = node.op_type, list(node.input)
    if op == "Cast":
        return b.cast(v(ins[0]), _ONNX_ALL.get(a["to"]) or INT_DTYPES[a["to"]], name)
    if op in ("Gelu", "FastGelu"):
        x = v(ins[0])
        if op == "FastGelu" and len(ins) > 1 and ins[1]:
            x = b.binary("add", x, v(ins[1]), f"{name}_bias")
        approx = "tanh" if op == "FastGelu" else a.get("approximate", "none")
        return b.unary("gelu_tanh" if approx == "tanh" else "gelu", x, name)
    if op == "Clip":
        x = v(ins[0])
        lo = a.get("min") if ctx.opset < 11 else (v(ins[1]) if len(ins) > 1 and ins[1] else None)
        hi = a.get("max") if ctx.opset < 11 else (v(ins[2]) if len(ins) > 2 and ins[2] else None)
        if lo is None and hi is None:
            return x
        bounds = [scalar(d) if w is None else (w if isinstance(w, Value) else scalar(w))
                  for w, d in ((lo, -math.inf), (hi, math.inf))]
        return b.elementwise("clamp", [x, *bounds], name)
    raise AssertionError(f"unmapped supported op {op}")  # _why_not admits only mapped ops
