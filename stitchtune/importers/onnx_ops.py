"""The ONNX op handlers of the ONNX import (:func:`stitchtune.importers.onnx_map._map_node`): a registry.

Each handler maps one family of ONNX ops onto graph.json ops and is registered for its op types with
:func:`onnx_op` (as :mod:`stitchtune.importers.torch_aten_ops` does for ATen ops).
:data:`SUPPORTED_OPS`, the ops a subgraph may take as computations (the boundary rules of
:mod:`stitchtune.importers.onnx_rules`), is the registry's keys; layout ops (``Transpose``, ``Slice``,
``Gather``, ...), shape ops that change nothing and ``Pad`` of zeros are mapped by ``_map_node`` itself.

Contract of a handler ``fn(ctx, b, node, attrs, v, exact, name) -> [value or None per output]``:
``ctx`` the import's context (``_Ctx``: ``opset``, ``const_list``), ``b`` the builder, ``node`` the
ONNX node, ``attrs`` its attributes, ``v(tensor)`` its inputs' values (broadcast views allowed),
``exact(tensor)`` the value in its ONNX shape, ``name`` the first output's name. Handlers run only on
nodes the boundary rules admitted, so they do not check arguments again.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol

from stitchtune.importers.builder import GraphBuilder, Value, scalar
from stitchtune.importers.onnx_ops_layout import INT_DTYPES


class _Ctx(Protocol):
    """What a handler may use of the import's context (:class:`stitchtune.importers.onnx_rules._Ctx` provides
    it): the model's opset and a node's constant list input. A protocol, so that this module does not import
    the rules that import it."""

    opset: int

    def const_list(self, node: Any, idx: int) -> list[int] | None: ...

# ---------------------------------------------------------------------------- the op tables
_UNARY = {"Sqrt": "sqrt", "Reciprocal": "reciprocal", "Exp": "exp", "Log": "log", "Tanh": "tanh",
          "Sigmoid": "sigmoid", "Relu": "relu", "Erf": "erf", "Neg": "neg", "Abs": "abs"}
_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow"}
_VARIADIC = {"Max": "maximum", "Min": "minimum"}
_REDUCE = {"ReduceMean": "reduce_mean", "ReduceSum": "reduce_sum", "ReduceMax": "reduce_max",
           "ReduceMin": "reduce_min"}
_COMPARE = {"Equal": "eq", "Less": "lt", "LessOrEqual": "le", "Greater": "gt", "GreaterOrEqual": "ge"}
_LOGICAL = {"And": "logical_and", "Or": "logical_or"}
_NORMS = ("LayerNormalization", "RMSNormalization", "SimplifiedLayerNormalization")
_ONNX_DTYPES = {1: "float32", 10: "float16", 16: "bfloat16"}   # TensorProto enum -> graph.json
_BOOL = 9
_ONNX_ALL = {**_ONNX_DTYPES, _BOOL: "bool"}

# ---------------------------------------------------------------------------- the registry
ValueOf = Callable[[str], Value]
#: a handler: ``fn(ctx, b, node, attrs, v, exact, name) -> [value or None per output]`` (module docstring)
OnnxHandler = Callable[[_Ctx, GraphBuilder, Any, dict[str, Any], ValueOf, ValueOf, str], list[Value | None]]

_HANDLERS: dict[str, OnnxHandler] = {}


def onnx_op(*ops: str) -> Callable[[OnnxHandler], OnnxHandler]:
    """Register the decorated handler for ONNX op types ``ops``; one registered twice raises ``ValueError``."""
    def register(fn: OnnxHandler) -> OnnxHandler:
        for op in ops:
            if op in _HANDLERS:
                raise ValueError(f"ONNX op {op} has two handlers ({_HANDLERS[op].__name__}, {fn.__name__})")
            _HANDLERS[op] = fn
        return fn
    return register


def handlers() -> dict[str, OnnxHandler]:
    """A copy of the registry: ONNX op type -> handler."""
    return dict(_HANDLERS)


# ---------------------------------------------------------------------------- the handlers
@onnx_op(*_COMPARE, *_LOGICAL, "Not", "Where")
def _map_mask(ctx: _Ctx, b: GraphBuilder, node: Any, a: dict[str, Any], v: ValueOf, exact: ValueOf,
              name: str) -> list[Value | None]:
    """A comparison, logical op or Where."""
    op, ins = node.op_type, list(node.input)
    if op in _COMPARE:
        x, y = v(ins[0]), v(ins[1])
        if x.dtype == "bool":   # Equal of two bools: compare them as 0 / 1
            x, y = b.cast(x, "float32", f"{name}_a"), b.cast(y, "float32", f"{name}_b")
        return [b.elementwise(_COMPARE[op], [x, y], name)]
    if op in _LOGICAL:
        return [b.elementwise(_LOGICAL[op], [v(ins[0]), v(ins[1])], name)]
    if op == "Not":
        return [b.logical_not(v(ins[0]), name)]
    return [b.elementwise("where", [v(t) for t in ins[:3]], name)]


@onnx_op(*_UNARY)
def _unary(ctx: _Ctx, b: GraphBuilder, node: Any, a: dict[str, Any], v: ValueOf, exact: ValueOf,
           name: str) -> list[Value | None]:
    return [b.unary(_UNARY[node.op_type], v(node.input[0]), name)]


@onnx_op("Identity")
def _identity(ctx: _Ctx, b: GraphBuilder, node: Any, a: dict[str, Any], v: ValueOf, exact: ValueOf,
              name: str) -> list[Value | None]:
    return [v(node.input[0])]


@onnx_op(*_BINARY)
def _binary(ctx: _Ctx, b: GraphBuilder, node: Any, a: dict[str, Any], v: ValueOf, exact: ValueOf,
            name: str) -> list[Value | None]:
    return [b.binary(_BINARY[node.op_type], v(node.input[0]), v(node.input[1]), name)]


@onnx_op(*_VARIADIC)
def _variadic(ctx: _Ctx, b: GraphBuilder, node: Any, a: dict[str, Any], v: ValueOf, exact: ValueOf,
              name: str) -> list[Value | None]:
    ins = list(node.input)
    acc = v(ins[0])
    for k, t in enumerate(ins[1:], 1):
        acc = b.binary(_VARIADIC[node.op_type], acc, v(t), name if k == len(ins) - 1 else f"{name}_{k}")
    return [acc]


@onnx_op(*_REDUCE, "Softmax", "LogSoftmax", *_NORMS)
def _map_reduction(ctx: _Ctx, b: GraphBuilder, node: Any, a: dict[str, Any], v: ValueOf, exact: ValueOf,
                   name: str) -> list[Value | None]:
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


@onnx_op("Cast")
def _cast(ctx: _Ctx, b: GraphBuilder, node: Any, a: dict[str, Any], v: ValueOf, exact: ValueOf,
          name: str) -> list[Value | None]:
    return [b.cast(v(node.input[0]), _ONNX_ALL.get(a["to"]) or INT_DTYPES[a["to"]], name)]


@onnx_op("Gelu", "FastGelu")
def _gelu(ctx: _Ctx, b: GraphBuilder, node: Any, a: dict[str, Any], v: ValueOf, exact: ValueOf,
          name: str) -> list[Value | None]:
    """Gelu (``approximate``) and com.microsoft's FastGelu (tanh, with an optional bias added first)."""
    op, ins = node.op_type, list(node.input)
    x = v(ins[0])
    if op == "FastGelu" and len(ins) > 1 and ins[1]:
        x = b.binary("add", x, v(ins[1]), f"{name}_bias")
    approx = "tanh" if op == "FastGelu" else a.get("approximate", "none")
    return [b.unary("gelu_tanh" if approx == "tanh" else "gelu", x, name)]


@onnx_op("Clip")
def _clip(ctx: _Ctx, b: GraphBuilder, node: Any, a: dict[str, Any], v: ValueOf, exact: ValueOf,
          name: str) -> list[Value | None]:
    """Clip as ``clamp``; a missing bound is -inf / +inf."""
    ins = list(node.input)
    x = v(ins[0])
    lo = a.get("min") if ctx.opset < 11 else (v(ins[1]) if len(ins) > 1 and ins[1] else None)
    hi = a.get("max") if ctx.opset < 11 else (v(ins[2]) if len(ins) > 2 and ins[2] else None)
    if lo is None and hi is None:
        return [x]
    bounds = [scalar(d) if w is None else (w if isinstance(w, Value) else scalar(w))
              for w, d in ((lo, -math.inf), (hi, math.inf))]
    return [b.elementwise("clamp", [x, *bounds], name)]


#: the ONNX op types a subgraph maps as computations: the registry's keys
SUPPORTED_OPS: frozenset[str] = frozenset(_HANDLERS)
