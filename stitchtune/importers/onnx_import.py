"""ONNX -> graph.json: the maximal memory-intensive subgraphs of a model, one graph.json each.

Contract
--------
* :func:`import_onnx(model, node_range=None, shapes=None)` loads the model with the ``onnx`` package,
  applies ``shapes`` (``{graph input name: shape}`` or ``{dim_param: (size,)}``) to the graph
  inputs, folds constants and runs ONNX shape inference, and returns an :class:`OnnxImport`.
* A node is *mappable* if its op is in :data:`SUPPORTED_OPS` (or is a layout node that is a view,
  below), it lies in ``node_range`` (python slice over node indices), its tensors are
  float32/float16/bfloat16 or bool of rank 1..4, bools only where graph.json takes them (logical
  ops, ``Where``'s condition, ``Cast``, ``Equal`` of two bools; bool operands are tensors, never
  constants), and its attribute-like inputs (reduction axes) are constants. Every other node
  (MatMul, Gemm, Conv, Reshape, Transpose, integer ops, ...) is a boundary. The mask chain maps as
  Equal/Less/LessOrEqual/Greater/GreaterOrEqual -> ``eq lt le gt ge``, Not/And/Or ->
  ``logical_not/and/or``, Where -> ``where``, Clip -> ``clamp`` (a missing bound is -inf / +inf).
* *Views*: a layout node on constant parameters whose output is its chain's first tensor broadcast
  numpy-style (Expand, Reshape/Unsqueeze/Flatten/Gather chains that only move unit axes; see
  :mod:`~stitchtune.importers.onnx_layout`) maps to nothing: its readers read that tensor and
  broadcasting does the rest. A view that a non-element-wise op (reduction, softmax, norm) needs
  materialised, or one whose value would leave a subgraph, is a boundary instead (it is found while
  building and the partition is redone without it). A Reshape that keeps the element order is a
  *reshaped frame*: element-wise nodes whose tensor operands are all in the same frame compute in
  it, and a value leaves in it (the same bytes); anything else that reads it needs a ``reshape``
  node (once graph.json has it) or leaves the Reshape to the framework.
* Subgraphs are the maximal connected groups of mappable nodes (joined by tensors) that can run as
  one fused unit. A group that some path leaves and re-enters through a boundary node (a residual
  around a MatMul) is split by *stage*: every path through a boundary moves to a later stage, a
  part never spans stages, so each part is convex and its inputs exist before it starts. Views and
  element-wise nodes that read only model inputs and constants (the attention mask chain) join no
  group by themselves: every group that reads them recomputes them, so one mask feeds every layer.
* Subgraph inputs are the tensors it reads but does not produce; single-element constants are
  inlined as scalars, other constants (weights, bool tables) become inputs with their values in
  ``OnnxSubgraph.constants``. Outputs are the tensors its own (not recomputed) nodes produce that
  are read outside it or are model outputs; never bool (their producers become boundaries); an
  output may have another shape than its ONNX tensor when it holds the same elements in the same
  order (a Reshape on the way out of the region costs nothing and is left out). Names are
  sanitised to ``[A-Za-z_][A-Za-z0-9_]{0,63}``; ``tensor_names`` maps them back to ONNX names.
* A dynamic dimension on a tensor of a mappable node is an error naming the tensor, the dimension
  and its symbol, unless ``shapes`` fixes it.
* The file is read by :mod:`~stitchtune.importers.onnx_load` (hostile files are refused with one
  line) and, after ``shapes``, constant-only nodes are folded and shapes inferred by
  :mod:`~stitchtune.importers.onnx_fold`, so legacy (TorchScript) exports with static inputs come
  out static. Node indices are always those of the file.
* A Reshape/Squeeze/Unsqueeze/Flatten/Expand whose output shape equals its input's is a no-op and
  mappable. A group whose outputs are all passed through unchanged (only Identity, same-type Cast,
  no-op reshapes) is dropped, never fatal, and listed in ``OnnxImport.dropped``.
* *Regions* are the connected groups of memory-intensive nodes (every op but Constant and
  :data:`COMPUTE_OPS`; cheap nodes that read only model inputs, and views, count in every region
  that reads them); each :class:`OnnxRegion` says whether it was imported whole, cut (and by
  which nodes), dropped as a no-op, or skipped.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from stitchtune.graph.parse import Graph
from stitchtune.graph.ops import OPS
from stitchtune.graph.parse import broadcast_shapes
from stitchtune.importers.builder import (
    GraphBuilder,
    ImportError_,
    Value,
    scalar,
)
from stitchtune.importers.onnx_fold import FoldReport, fold_and_infer
from stitchtune.importers.onnx_layout import VIEW_OPS, View, resolve_views
from stitchtune.importers.onnx_ops_layout import INT_DTYPES, layout_op, map_layout, map_split, why_not_layout
from stitchtune.importers.onnx_load import MAX_TENSOR_ELEMENTS, ConstTable, load_model
from stitchtune.importers.onnx_partition import COMPUTE_OPS, OnnxRegion, label, partition
from stitchtune.importers.onnx_partition import regions as find_regions

__all__ = [
    "COMPUTE_OPS",
    "SUPPORTED_OPS",
    "OnnxImport",
    "OnnxRegion",
    "OnnxSubgraph",
    "import_onnx",
    "parse_node_range",
    "summary_lines",
    "write_subgraphs",
]

log = logging.getLogger(__name__)

_UNARY = {"Sqrt": "sqrt", "Reciprocal": "reciprocal", "Exp": "exp", "Log": "log", "Tanh": "tanh",
          "Sigmoid": "sigmoid", "Relu": "relu", "Erf": "erf", "Neg": "neg", "Abs": "abs"}
_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow"}
_VARIADIC = {"Max": "maximum", "Min": "minimum"}
_REDUCE = {"ReduceMean": "reduce_mean", "ReduceSum": "reduce_sum", "ReduceMax": "reduce_max",
           "ReduceMin": "reduce_min"}
_COMPARE = {"Equal": "eq", "Less": "lt", "LessOrEqual": "le", "Greater": "gt", "GreaterOrEqual": "ge"}
_LOGICAL = {"And": "logical_and", "Or": "logical_or"}
_OTHER = {"Identity", "Softmax", "LogSoftmax", "LayerNormalization", "RMSNormalization",
          "SimplifiedLayerNormalization", "Cast", "Gelu", "FastGelu", "Clip", "Not", "Where"}
SUPPORTED_OPS: frozenset[str] = frozenset([*_UNARY, *_BINARY, *_VARIADIC, *_REDUCE, *_COMPARE, *_LOGICAL, *_OTHER])
#: element-wise ops: they take broadcast views as they are, and are recomputed by every group that
#: reads them when they read only model inputs and constants (a mask chain)
_ELEMENTWISE = frozenset([*_UNARY, *_BINARY, *_VARIADIC, *_COMPARE, *_LOGICAL, "Identity", "Cast", "Gelu",
                          "FastGelu", "Clip", "Not", "Where"])
#: ONNX ops that are cheap enough to belong to every region that reads them when they read only
#: model inputs and constants (for the region count only; mapping them is another matter)
_CHEAP = frozenset([*_ELEMENTWISE, *VIEW_OPS, "Xor", "Mod", "Sin", "Cos", "Concat", "Split", "Trilu", "Range"])
_DOMAINS = {"", "ai.onnx", "com.microsoft"}
_MS_ONLY = {"SimplifiedLayerNormalization", "FastGelu"}

_NOOP_SHAPE_OPS = {"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Expand"}   # mappable when they change nothing
_ONNX_DTYPES = {1: "float32", 10: "float16", 16: "bfloat16"}   # TensorProto enum -> graph.json
_BOOL = 9
_ONNX_ALL = {**_ONNX_DTYPES, _BOOL: "bool"}


class _Demote(Exception):
    """Node ``node`` must be a boundary after all (found while building its group): ``reason``."""

    def __init__(self, node: int, reason: str, tensor: str | None = None) -> None:
        super().__init__(reason)
        self.node, self.reason, self.tensor = node, reason, tensor


@dataclass(frozen=True)
class OnnxSubgraph:
    """One memory-intensive subgraph of the model, as a validated graph."""

    graph: Graph
    onnx_nodes: tuple[str, ...]                     # "index:op:name" of each ONNX node in it
    tensor_names: tuple[tuple[str, str], ...]       # (graph input/output name, ONNX tensor name)
    constants: tuple[tuple[str, np.ndarray], ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class OnnxImport:
    subgraphs: tuple[OnnxSubgraph, ...]
    boundaries: tuple[str, ...]   # "index:op:name: reason" for each node left out
    regions: tuple[OnnxRegion, ...] = ()
    dropped: tuple[str, ...] = ()      # no-op groups dropped: their nodes' labels, comma-separated
    compute_ops: tuple[str, ...] = ()  # "index:op:name" of the compute ops left to the framework
    fold: FoldReport = field(default_factory=lambda: FoldReport((), ()))


def parse_node_range(text: str | None) -> tuple[int | None, int | None] | None:
    """``"A:B"`` (either side may be empty) -> (A, B); a python slice over node indices."""
    if not text:
        return None
    a, colon, b = text.partition(":")
    try:
        if not colon:
            raise ValueError
        return (int(a) if a.strip() else None, int(b) if b.strip() else None)
    except ValueError:
        raise ImportError_(f"--node-range {text!a} is not A:B with integer node indices") from None


# ---------------------------------------------------------------------------- shapes
def _apply_shapes(model: Any, shapes: Mapping[str, tuple[int, ...]]) -> Any:
    """A copy of ``model`` with graph-input dims fixed by name or by dim_param symbol."""
    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(model)
    inits = {t.name for t in m.graph.initializer}
    inputs = {i.name: i for i in m.graph.input if i.name not in inits}
    symbols: set[str] = set()
    for i in inputs.values():
        for d in i.type.tensor_type.shape.dim:
            if d.HasField("dim_param"):
                symbols.add(d.dim_param)
    problems: list[str] = []
    for name, shape in shapes.items():
        if name in inputs:
            dims = inputs[name].type.tensor_type.shape.dim
            if len(dims) != len(shape):
                problems.append(f"--shapes: {name!a} has rank {len(dims)} in the model, not {len(shape)}")
                continue
            for d, v in zip(dims, shape):
                if d.HasField("dim_value") and d.dim_value not in (0, v):
                    problems.append(f"--shapes: {name!a} dim {list(dims).index(d)} is {d.dim_value} in the model")
                d.dim_value = v
        elif name in symbols:
            if len(shape) != 1:
                problems.append(f"--shapes: dimension symbol {name!a} takes one size, e.g. {name}=8")
                continue
            for i in inputs.values():
                for d in i.type.tensor_type.shape.dim:
                    if d.HasField("dim_param") and d.dim_param == name:
                        d.dim_value = shape[0]
        else:
            problems.append(f"--shapes: {name!a} is neither a model input ({', '.join(inputs) or 'none'}) "
                            f"nor a dimension symbol ({', '.join(sorted(symbols)) or 'none'})")
    if problems:
        raise ImportError_(problems=problems)
    return m


@dataclass
class _Tensor:
    shape: tuple[int | str | None, ...] | None   # None = unknown rank; str = dim_param; None dim = unknown
    elem: int


def _type_table(model: Any) -> dict[str, _Tensor]:
    out: dict[str, _Tensor] = {}
    vis = [*model.graph.input, *model.graph.output, *model.graph.value_info]
    for vi in vis:
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            continue
        shape: tuple[int | str | None, ...] | None = None
        if tt.HasField("shape"):
            shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim)
        out[vi.name] = _Tensor(shape, tt.elem_type)
    for t in model.graph.initializer:
        out[t.name] = _Tensor(tuple(t.dims), t.data_type)
    return out


# ---------------------------------------------------------------------------- per-node support
class _Ctx:
    def __init__(self, model: Any, types: dict[str, _Tensor], consts: ConstTable) -> None:
        self.types, self.consts = types, consts
        self.views: dict[int, View] = {}        # layout nodes that are views graph.json can take
        self.producer: dict[str, int] = {}
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
        inits = {t.name for t in model.graph.initializer}
        self.symbol_at: dict[str, str] = {}   # dim symbol -> "input 'x' dim 0" where it first appears
        for vi in model.graph.input:
            if vi.name not in inits:
                for k, d in enumerate(vi.type.tensor_type.shape.dim):
                    if d.HasField("dim_param"):
                        self.symbol_at.setdefault(d.dim_param, f"model input {vi.name!a} dim {k}")

    @staticmethod
    def attrs(node: Any) -> dict[str, Any]:
        from onnx import helper

        out = {}
        for a in node.attribute:
            v = helper.get_attribute_value(a)
            out[a.name] = v.decode() if isinstance(v, bytes) else v
        return out

    def const_list(self, node: Any, idx: int) -> list[int] | None:
        if len(node.input) <= idx or not node.input[idx]:
            return None
        c = self.consts.get(node.input[idx])
        return None if c is None else [int(v) for v in np.asarray(c).reshape(-1)]


def _why_not(ctx: _Ctx, i: int, node: Any, in_range: bool) -> str | None:
    """None if the node can be part of a subgraph, else the reason it is a boundary."""
    if node.op_type == "Constant":
        return "constant"
    if node.op_type in COMPUTE_OPS:
        return "compute op, left to the framework"
    if i in ctx.views:
        if not in_range:
            return "outside --node-range"
        base = ctx.types.get(ctx.views[i].base)
        return None if base is not None and (base.elem in _ONNX_ALL or base.elem in INT_DTYPES) else \
            f"tensor {ctx.views[i].base!a} is not float32/float16/bfloat16/bool/int32/int64"
    lop = layout_op(node.op_type) if node.domain in ("", "ai.onnx") else None
    if lop is not None:
        pass   # Transpose/Reshape/Slice/Concat/Gather, now that graph.json has the op (checked below)
    elif node.op_type in _NOOP_SHAPE_OPS and node.domain in ("", "ai.onnx"):
        if not _changes_nothing(ctx, node):
            return "changes the shape (graph.json has no reshape)"
    elif node.domain not in _DOMAINS or node.op_type not in SUPPORTED_OPS:
        return "unsupported op"
    if node.op_type in _MS_ONLY and node.domain != "com.microsoft":
        return "unsupported op"
    if not in_range:
        return "outside --node-range"
    tensor_ins = [t for t in node.input if t and t not in ctx.consts]
    if not tensor_ins:
        return "all inputs are constants"
    for t in [*node.input, *node.output]:
        if not t or (t in ctx.consts and t not in node.output):
            continue
        ty = ctx.types.get(t)
        if ty is None or ty.elem not in _ONNX_ALL:
            if node.op_type in _REDUCE and node.input[1:2] == [t]:
                continue
            if ty is not None and ty.elem in INT_DTYPES and _takes_int(node, lop, t):
                continue
            return f"tensor {t!a} is not float32/float16/bfloat16/bool (or has no type)"
        if ty.shape is not None and not 1 <= len(ty.shape) <= 4:
            return f"tensor {t!a} has rank {len(ty.shape)} (graph.json takes 1..4)"
    a = ctx.attrs(node)
    if lop is not None:
        def rank(t: str) -> int:
            ty = ctx.types.get(t)
            return len(ty.shape) if ty is not None and ty.shape is not None else 0
        return why_not_layout(node, a, lambda k: ctx.const_list(node, k),
                              lambda t: ctx.types[t].elem if t in ctx.types else None, rank)
    why = _bool_rule(ctx, node)
    if why:
        return why
    if node.op_type in _REDUCE and "axes" not in a and len(node.input) > 1 and node.input[1] \
            and ctx.const_list(node, 1) is None:
        return "reduction axes are not a constant"
    if node.op_type == "Clip":
        for k in (1, 2):
            t = node.input[k] if len(node.input) > k else ""
            if t and t in ctx.consts and ctx.consts[t].size != 1:
                return "clip bounds are constants of more than one element"
    if node.op_type == "Cast" and a.get("to") not in _ONNX_ALL:
        return "cast to a type other than float32/float16/bfloat16/bool"
    if node.op_type == "Gelu" and a.get("approximate", "none") not in ("none", "tanh"):
        return "unknown gelu approximation"
    return None


def _takes_int(node: Any, lop: str | None, t: str) -> bool:
    """Whether ``node`` may read or produce int tensor ``t``: Cast's input (to bool or a float), the
    data and result of Transpose/Reshape/Slice/Concat/Split (index maps of an int; what reads their
    result is checked in turn), Gather's index (graph.json's int rules, see graph/parse.py)."""
    if node.op_type == "Cast":
        return node.input[:1] == [t]
    if lop == "gather":
        return node.input[1:2] == [t]
    return lop is not None


def _is_bool(ctx: _Ctx, t: str) -> bool:
    ty = ctx.types.get(t)
    return ty is not None and ty.elem == _BOOL


def _bool_rule(ctx: _Ctx, node: Any) -> str | None:
    """Where ``node`` puts a bool tensor where graph.json takes none (or a float where it needs a
    bool): the reason, else None. Bool operands must be tensors (graph.json has no bool constants)."""
    op, ins = node.op_type, [t for t in node.input]
    want: list[str | None]          # per input: "b" bool, "f" float, None either
    if op in _LOGICAL or op == "Not":
        want = ["b"] * len(ins)
    elif op == "Where":
        want = ["b", "f", "f"]
    elif op == "Equal":
        want = [None, None]
    elif op in ("Cast", "Identity"):
        want = [None]
    else:
        want = ["f"] * len(ins)
    for k, t in enumerate(ins):
        if not t or k >= len(want) or want[k] is None or (op in _REDUCE and k == 1) or (op == "Clip" and k):
            continue
        if want[k] == "b" and t in ctx.consts and ctx.consts[t].size == 1:
            return f"input {k} ({t!a}) is a bool constant (graph.json takes bool tensors only)"
        if (want[k] == "b") != _is_bool(ctx, t):
            return f"input {k} ({t!a}) is {'not ' if want[k] == 'b' else ''}bool"
    if op == "Equal" and _is_bool(ctx, ins[0]) != _is_bool(ctx, ins[1]):
        return "compares a bool with a float"
    if op == "Where" and node.output and _is_bool(ctx, node.output[0]):
        return "where of bool values"
    return None


def _changes_nothing(ctx: _Ctx, node: Any) -> bool:
    """True if a reshape-like ``node`` has a static output shape equal to its data input's."""
    if not node.input or not node.output or not node.input[0]:
        return False
    a, b = ctx.types.get(node.input[0]), ctx.types.get(node.output[0])
    return (a is not None and b is not None and a.shape is not None and a.shape == b.shape
            and all(isinstance(d, int) and d > 0 for d in a.shape))


def _static_shape(ctx: _Ctx, t: str) -> tuple[int, ...]:
    """The static shape of tensor ``t``; an error naming the dimension if it is not static and
    positive, or if the tensor is larger than graph.json takes."""
    ty = ctx.types.get(t)
    if ty is None or ty.shape is None:
        raise ImportError_(f"tensor {t!a} has no inferred shape; pass --shapes for the model inputs")
    for k, d in enumerate(ty.shape):
        if isinstance(d, int) and d == 0:
            raise ImportError_(f"tensor {t!a} dim {k} is 0 (empty tensors cannot be imported)")
        if isinstance(d, str) and d in ctx.symbol_at:
            raise ImportError_(f"tensor {t!a} dim {k} ({d!a}, from {ctx.symbol_at[d]}) is dynamic; fix it "
                               f"with --shapes INPUT=AxB... or --shapes SYMBOL=N")
        if not isinstance(d, int) or d < 0:
            sym = f" ({d!a})" if isinstance(d, str) else ""
            dyn = ", ".join(f"{s!a} ({w})" for s, w in ctx.symbol_at.items())
            hint = (f"the model's dynamic inputs are {dyn}: fix them with --shapes SYMBOL=N or INPUT=AxB..."
                    if dyn else "no model input is dynamic: the model derives it from a value known only at run time")
            raise ImportError_(f"tensor {t!a} dim {k}{sym} is dynamic after constant folding and shape "
                               f"inference; {hint}")
    shape = tuple(int(d) for d in ty.shape)
    if math.prod(shape) > MAX_TENSOR_ELEMENTS:
        raise ImportError_(f"tensor {t!a} has shape {list(shape)}, over {MAX_TENSOR_ELEMENTS} elements")
    return shape


def _elem_name(ctx: _Ctx, t: str) -> str:
    """The graph.json dtype of ONNX tensor ``t`` (a float, bool or int type ``_why_not`` admitted)."""
    elem = ctx.types[t].elem
    return _ONNX_ALL.get(elem) or INT_DTYPES[elem]


# ---------------------------------------------------------------------------- mapping one node
def _check_frames(ctx: _Ctx, b: GraphBuilder, index: int, node: Any,
                  v: Callable[[str], Value]) -> Callable[[str], Value]:
    """An element-wise node may read values in a *reshaped frame* (the same elements as the ONNX
    tensor in another shape: a Reshape it reads through). When all its tensor operands are in the
    same frame of the same ONNX shape it computes in that frame: ``v`` itself. Otherwise each framed
    operand is reshaped back to its ONNX shape (a ``reshape`` node, an index map in the kernel), or,
    without graph.json's ``reshape``, :class:`_Demote` of the view that framed one."""
    tensors = [t for t in node.input if t]
    framed = []
    for t in tensors:
        x = v(t)
        if not x.is_scalar and broadcast_shapes(tuple(x.shape), _static_shape(ctx, t)) != _static_shape(ctx, t):
            framed.append(t)
    if not framed:
        return v
    vals = [v(t) for t in tensors if not v(t).is_scalar]
    if len(vals) == len(framed) and len({x.shape for x in vals}) == 1 \
            and len({_static_shape(ctx, t) for t in framed}) == 1:
        return v
    if "reshape" not in OPS:
        raise _Demote(-1, f"a reshaped view that {label(index, node)} reads next to other shapes "
                          f"(graph.json has no reshape)", tensor=framed[0])

    def unframed(t: str) -> Value:
        x, want = v(t), _static_shape(ctx, t)
        if t not in framed:
            return x
        return b.layout("reshape", [x], want, str(x.dtype), f"{t}_reshape", shape=list(want))
    return unframed


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


def _map_node(ctx: _Ctx, b: GraphBuilder, index: int, node: Any, v: Callable[[str], Value],
              out_names: list[str]) -> list[Value | None]:
    """The values of ``node``'s outputs (None: not produced). A value may be *broadcast*: of a shape
    that broadcasts to the ONNX one (a view's base); ops that are not element-wise take exact
    values only (:class:`_Demote` of the producer otherwise)."""
    def exact(t: str) -> Value:
        x, want = v(t), _static_shape(ctx, t)
        if not x.is_scalar and tuple(x.shape) != want:
            if "reshape" in OPS and math.prod(x.shape) == math.prod(want):   # a reshaped frame
                return b.layout("reshape", [x], want, str(x.dtype), f"{t}_reshape", shape=list(want))
            raise _Demote(-1, f"a broadcast view that {label(index, node)} needs materialised "
                              f"(graph.json has no expand)", tensor=t)
        return x

    op, a = node.op_type, ctx.attrs(node)
    name = out_names[0]
    ins = [t for t in node.input]
    if index in ctx.views:   # a view: its consumers read the base (broadcasting does the rest)
        return [v(ctx.views[index].base)]
    if op in _ELEMENTWISE:
        v = _check_frames(ctx, b, index, node, v)
    if op in _COMPARE or op in _LOGICAL or op in ("Not", "Where"):
        return [_map_mask(b, op, ins, v, name)]
    if op in _UNARY:
        return [b.unary(_UNARY[op], v(ins[0]), name)]
    if op == "Identity" or (op in _NOOP_SHAPE_OPS and _changes_nothing(ctx, node)):
        return [v(ins[0])]
    if op == "Split":
        return map_split(b, node, a, exact, _elem_name(ctx, node.input[0]), lambda k: ctx.const_list(node, k),
                         out_names)
    if op == "Gather" and tuple(v(ins[1]).shape) != _static_shape(ctx, ins[1]):
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
    if op in _REDUCE:
        x = exact(ins[0])
        axes = a.get("axes")
        if axes is None:
            axes = ctx.const_list(node, 1)
        if not axes:
            if a.get("noop_with_empty_axes", 0):
                return [x]
            axes = list(range(len(x.shape)))
        return [b.reduce(_REDUCE[op], x, axes, bool(a.get("keepdims", 1)), name)]
    if op in ("Softmax", "LogSoftmax"):
        x = exact(ins[0])
        r = len(x.shape)
        axis = a.get("axis", -1 if ctx.opset >= 13 else 1)
        axes = [axis % r] if ctx.opset >= 13 else list(range(axis % r, r))
        return [b.softmax(x, axes, name, log_=op == "LogSoftmax")]
    if op in ("LayerNormalization", "RMSNormalization", "SimplifiedLayerNormalization"):
        x = exact(ins[0])
        r = len(x.shape)
        axes = list(range(a.get("axis", -1) % r, r))
        eps = float(a.get("epsilon", 1e-5))
        w = v(ins[1]) if len(ins) > 1 and ins[1] else None
        if op == "LayerNormalization":
            bias = v(ins[2]) if len(ins) > 2 and ins[2] else None
            return list(b.layer_norm(x, axes, w, bias, eps, name))
        y, rstd = b.rms_norm(x, axes, w, eps, name)
        return [y, rstd]
    if op == "Cast":
        return [b.cast(v(ins[0]), _ONNX_ALL[a["to"]], name)]
    if op in ("Gelu", "FastGelu"):
        x = v(ins[0])
        if op == "FastGelu" and len(ins) > 1 and ins[1]:
            x = b.binary("add", x, v(ins[1]), f"{name}_bias")
        approx = "tanh" if op == "FastGelu" else a.get("approximate", "none")
        return [b.unary("gelu_tanh" if approx == "tanh" else "gelu", x, name)]
    if op == "Clip":   # clamp(x, lo, hi); a missing bound is -inf / +inf
        x = v(ins[0])
        lo = a.get("min") if ctx.opset < 11 else (v(ins[1]) if len(ins) > 1 and ins[1] else None)
        hi = a.get("max") if ctx.opset < 11 else (v(ins[2]) if len(ins) > 2 and ins[2] else None)
        if lo is None and hi is None:
            return [x]
        bounds = [scalar(d) if w is None else (w if isinstance(w, Value) else scalar(w))
                  for w, d in ((lo, -math.inf), (hi, math.inf))]
        return [b.elementwise("clamp", [x, *bounds], name)]
    raise AssertionError(f"unmapped supported op {op}")  # _why_not admits only mapped ops


# ---------------------------------------------------------------------------- partition + build
def import_onnx(model: Any, node_range: tuple[int | None, int | None] | None = None,
                shapes: Mapping[str, tuple[int, ...]] | None = None, name: str | None = None) -> OnnxImport:
    """Split ``model`` (path or ``ModelProto``) into memory-intensive subgraphs; see the module docstring."""
    loaded = load_model(model)   # raises ImportError_ if the onnx package is missing or the file is bad
    m = loaded.model
    if shapes:
        m = _apply_shapes(m, shapes)
    m, fold = fold_and_infer(m, loaded.consts)
    from_file = loaded.base_dir is not None
    base = name or m.graph.name or (Path(str(model)).stem if from_file else "onnx")
    ctx = _Ctx(m, _type_table(m), loaded.consts)
    nodes = list(m.graph.node)
    ctx.producer = {t: i for i, n in enumerate(nodes) for t in n.output if t}
    ctx.views = _mappable_views(ctx, nodes)
    lo, hi = node_range or (None, None)
    in_range = set(range(len(nodes))[slice(lo, hi)])
    model_inputs = {i.name for i in m.graph.input} - set(ctx.consts)
    model_outputs = {o.name for o in m.graph.output}
    # cheap nodes computed from model inputs and constants only (mapped or not): the mask chain
    pre = _preamble(ctx, nodes, set(range(len(nodes))), model_inputs, lambda i: nodes[i].op_type in _CHEAP)
    demoted: dict[int, str] = {}   # nodes found unmappable while building their group
    while True:
        reasons = {i: demoted.get(i) or _why_not(ctx, i, n, i in in_range) for i, n in enumerate(nodes)}
        mappable = {i for i, r in reasons.items() if r is None}
        pullable = {i for i in mappable if i in ctx.views or (i in pre and nodes[i].op_type in _ELEMENTWISE)}
        part = partition(nodes, mappable, ctx.consts, frozenset(pullable), model_outputs)
        try:
            subgraphs, fate = _build_all(ctx, nodes, part, part.external(nodes, mappable, model_outputs), base)
            break
        except _Demote as d:
            if d.node in demoted or d.node < 0:   # cannot happen: a demoted node is in no group
                raise ImportError_(f"{label(d.node, nodes[d.node])}: {d.reason}") from None
            log.info("%s: %s", label(d.node, nodes[d.node]), d.reason)
            demoted[d.node] = d.reason
    dropped = tuple(", ".join(label(i, nodes[i]) for i in g) for g, f in zip(part.groups, fate) if f == "no-op")
    boundaries = tuple(f"{label(i, n)}: {reasons[i]}" for i, n in enumerate(nodes)
                       if reasons[i] is not None and n.op_type != "Constant")
    regions = find_regions(nodes, in_range, reasons, part, fate, frozenset(pre | pullable))
    compute = tuple(label(i, n) for i, n in enumerate(nodes) if n.op_type in COMPUTE_OPS)
    log.info("%s: %d nodes (%d folded), %d regions, %d subgraphs, %d no-op groups dropped, %d boundary nodes",
             base, len(nodes), len(fold.folded), len(regions), len(subgraphs), len(dropped), len(boundaries))
    return OnnxImport(subgraphs=tuple(subgraphs), boundaries=boundaries, regions=regions, dropped=dropped,
                      compute_ops=compute, fold=fold)


def _build_all(ctx: _Ctx, nodes: list[Any], part: Any, external: set[str],
               base: str) -> tuple[list[OnnxSubgraph], list[str]]:
    """The subgraphs ``base_0, base_1, ...`` of the groups, and each group's fate (its graph's name,
    ``"no-op"`` or ``"unused"``)."""
    subgraphs: list[OnnxSubgraph] = []
    fate: list[str] = []
    for g, core in zip(part.groups, part.cores):
        sg = _build(ctx, nodes, g, core, external, f"{base}_{len(subgraphs)}")
        if isinstance(sg, OnnxSubgraph):
            subgraphs.append(sg)
        fate.append(sg.graph.name if isinstance(sg, OnnxSubgraph) else sg)
    return subgraphs, fate


def _mappable_views(ctx: _Ctx, nodes: list[Any]) -> dict[int, View]:
    """The views of :func:`resolve_views` that a group can take: broadcast ones, and any whose
    every reader is such a view in turn (a chain that ends broadcast)."""
    shapes = {t: (tuple(ty.shape) if ty.shape is not None and all(isinstance(d, int) for d in ty.shape) else None)
              for t, ty in ctx.types.items()}
    same = {i for i, n in enumerate(nodes) if n.op_type == "Cast" and n.input and n.input[0] in ctx.types
            and ctx.types[n.input[0]].elem == ctx.attrs(n).get("to")}
    views = resolve_views(nodes, shapes, ctx.consts, same)
    readers: dict[str, list[int]] = {}
    for i, n in enumerate(nodes):
        for t in n.input:
            readers.setdefault(t, []).append(i)
    keep: dict[int, View] = {}
    for i in sorted(views, reverse=True):
        rs = readers.get(nodes[i].output[0], [])
        if views[i].broadcast or views[i].reshape or (rs and all(r in keep for r in rs)):
            keep[i] = views[i]
    return keep


def _preamble(ctx: _Ctx, nodes: list[Any], among: set[int], model_inputs: set[str],
              cheap: Callable[[int], bool]) -> set[int]:
    """Nodes of ``among`` that are ``cheap`` (and element-wise or views) and read only model inputs,
    constants and each other: recomputed by every group (and counted in every region) that reads them."""
    out: set[int] = set()
    for i, n in enumerate(nodes):
        if i not in among or n.op_type == "Constant" or not cheap(i):
            continue
        if n.op_type not in _ELEMENTWISE and i not in ctx.views and n.op_type not in _CHEAP:
            continue
        tensors = [t for t in n.input if t and t not in ctx.consts]
        if tensors and all(t in model_inputs or ctx.producer.get(t) in out for t in tensors):
            out.add(i)
    return out


def _lazy_origin(ctx: _Ctx, nodes: list[Any], t: str, vals: dict[str, Value]) -> int:
    """The view node nearest to tensor ``t`` that makes its value broadcast (``t``'s producer if
    there is none): the node to leave to the framework so that ``t`` comes out exact."""
    p = ctx.producer[t]
    todo, seen = [p], set()
    while todo:
        q = todo.pop(0)
        if q in seen:
            continue
        seen.add(q)
        if q in ctx.views:
            return q
        for u in nodes[q].input:
            val = vals.get(u)
            if u in ctx.producer and val is not None and not val.is_scalar \
                    and tuple(val.shape) != _static_shape(ctx, u):
                todo.append(ctx.producer[u])
    return p


def _take(ctx: _Ctx, nodes: list[Any], b: GraphBuilder, i: int, t: str, r: Value, leaves: bool,
          vals: dict[str, Value]) -> Value | str | None:
    """Record node ``i``'s value ``r`` of tensor ``t`` (checked against the model's shape, cast to
    its dtype) in ``vals``; return it when it ``leaves`` the group as an output, ``"passed"`` when
    it would leave but is one of the group's inputs, else None. Raises :class:`_Demote` when it
    cannot leave (bool, broadcast, rearranged) or does not fit the model."""
    view = ctx.views.get(i)
    if view is not None and not view.broadcast and not view.reshape:
        if leaves:
            raise _Demote(i, f"its value {t!a} is a rearranged view that leaves the region")
        return None   # an inner link of a chain of views: its readers read the base
    expect = _static_shape(ctx, t)
    if not r.is_scalar and math.prod(r.shape) == math.prod(expect):
        pass   # exact, or a reshaped frame of it: the same elements in the same order
    elif r.is_scalar or broadcast_shapes(tuple(r.shape), expect) != expect:
        raise _Demote(i, f"mapped shape {list(r.shape)} differs from the model's {list(expect)} for {t!a}")
    dt = _elem_name(ctx, t)
    if r.dtype != dt:
        r = b.cast(r, dt, f"{t}_cast")
    vals[t] = r
    if not leaves:
        return None
    same = math.prod(r.shape) == math.prod(expect)   # a pure reshape: the same bytes
    if b.is_input(r) and same:
        return "passed"
    if not same:
        raise _Demote(_lazy_origin(ctx, nodes, t, vals), f"a broadcast view that would leave "
                      f"the region through {t!a} (graph.json has no expand)")
    if dt == "bool" or dt in INT_DTYPES.values():
        raise _Demote(i, f"its value {t!a} would leave the region as a {dt} tensor ({dt} graph outputs are refused)")
    return r


def _build(ctx: _Ctx, nodes: list[Any], members: list[int], core: set[int], external: set[str],
           gname: str) -> OnnxSubgraph | str:
    """The group's subgraph, or ``"no-op"`` when every value it hands on is one of its inputs passed
    through unchanged, or ``"unused"`` when nothing outside reads what it computes. Values of its
    ``core`` nodes in ``external`` leave it (the nodes it only recomputes hand nothing on). Raises
    :class:`_Demote` for a node whose value would leave the group as a bool or a broadcast view."""
    b = GraphBuilder(gname)
    produced = {t for i in members for t in nodes[i].output if t}
    vals: dict[str, Value] = {}
    names: list[tuple[str, str]] = []
    constants: list[tuple[str, np.ndarray]] = []

    def value(t: str) -> Value:
        if t in vals:
            return vals[t]
        if t in produced:   # an inner link of a chain of views, read by something else after all
            raise _Demote(ctx.producer[t], "a rearranged view read inside the region")
        if t in ctx.consts and t not in produced:
            c = ctx.consts[t]
            if c.size == 1:
                vals[t] = scalar(float(np.asarray(c, dtype=np.float64).reshape(-1)[0]))
                return vals[t]
            ty = _ONNX_ALL.get(ctx.types[t].elem if t in ctx.types else 0)
            if ty is None:
                raise ImportError_(f"constant {t!a} is not float32/float16/bfloat16/bool")
            v = b.add_input(t, tuple(int(d) for d in c.shape), ty)
            from stitchtune.graph.reference import numpy_dtype

            arr = np.asarray(c) != 0 if ty == "bool" else np.asarray(c, dtype=np.float32)
            constants.append((str(v.ref), arr.astype(numpy_dtype(ty))))
        else:
            v = b.add_input(t, _static_shape(ctx, t), _elem_name(ctx, t))
        names.append((str(v.ref), t))
        vals[t] = v
        return v

    outputs: list[Value] = []
    passed_through = False
    for i in members:
        n = nodes[i]
        outs = list(n.output)
        hints = [o or f"{n.op_type}_{i}" for o in outs]
        try:
            results = _map_node(ctx, b, i, n, value, hints)
        except _Demote as d:
            if d.tensor is None:
                raise
            raise _Demote(_lazy_origin(ctx, nodes, d.tensor, vals), d.reason) from None
        for t, r in zip(outs, results):
            if not t or r is None:
                continue
            got = _take(ctx, nodes, b, i, t, r, i in core and t in external, vals)
            if got == "passed":
                passed_through = True   # the tensor equals one of the group's inputs: nothing to compute
            elif got is not None:
                outputs.append(got)
                names.append((str(got.ref), t))
    if not outputs:
        why = "no-op" if passed_through else "unused"
        log.info("%s (ONNX nodes %s): %s", gname, ", ".join(label(i, nodes[i]) for i in members),
                 "only passes its inputs through; dropped" if passed_through else "nothing outside uses it; skipped")
        return why
    graph = b.graph(outputs)
    live = set(graph.outputs) | {n for n, _ in graph.inputs}
    return OnnxSubgraph(graph=graph, onnx_nodes=tuple(label(i, nodes[i]) for i in members),
                        tensor_names=tuple((g, o) for g, o in names if g in live),
                        constants=tuple((c, arr) for c, arr in constants if c in live))


def _write_atomic(path: Path, write: Callable[[Any], None]) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_subgraphs(result: OnnxImport, out_dir: str | Path) -> list[Path]:
    """Write ``<name>.json`` (+ ``<name>.constants.npz`` when it has weights) per subgraph and
    ``manifest.json`` (subgraphs, boundaries, regions, dropped no-op groups, folded nodes, compute
    ops), each file through a temporary name; returns the graph.json paths. A file system error is
    an :class:`ImportError_` naming the path."""
    out = Path(out_dir)
    paths, manifest = [], []
    try:
        out.mkdir(parents=True, exist_ok=True)
        for sg in result.subgraphs:
            p = out / f"{sg.graph.name}.json"
            text = (json.dumps(sg.graph.to_dict(), indent=1) + "\n").encode()
            _write_atomic(p, lambda f, text=text: f.write(text))
            entry: dict[str, Any] = {"graph": p.name, "onnx_nodes": list(sg.onnx_nodes),
                                     "onnx_tensors": dict(sg.tensor_names)}
            if sg.constants:
                cp = out / f"{sg.graph.name}.constants.npz"
                arrays = dict(sg.constants)   # bfloat16 comes back as |V2; `stitchtune run` reads it
                _write_atomic(cp, lambda f, arrays=arrays: np.savez(f, **arrays))
                entry["constants"] = cp.name
            manifest.append(entry)
            paths.append(p)
        doc = {"subgraphs": manifest, "boundaries": list(result.boundaries),
               "regions": [{"nodes": list(r.nodes), "status": r.status, "subgraphs": list(r.subgraphs),
                            "stopped_by": list(r.stopped_by)} for r in result.regions],
               "dropped_noop_groups": list(result.dropped), "folded": list(result.fold.folded),
               "not_folded": list(result.fold.unfolded), "compute_ops": list(result.compute_ops)}
        text = (json.dumps(doc, indent=1) + "\n").encode()
        _write_atomic(out / "manifest.json", lambda f: f.write(text))
    except OSError as e:
        raise ImportError_(f"cannot write to {ascii(str(out))}: {e.strerror or e}") from None
    return paths


def _counted(ops: list[str]) -> str:
    counts: dict[str, int] = {}
    for op in ops:
        counts[op] = counts.get(op, 0) + 1
    return ", ".join(f"{op} x{n}" if n > 1 else op for op, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def summary_lines(result: OnnxImport) -> list[str]:
    """What the import did, for the CLI: regions found / imported whole / cut (by which ops) /
    dropped / skipped, the dropped no-op groups, folding, and the compute ops left to the framework."""
    by = {s: [r for r in result.regions if r.status == s] for s in ("whole", "cut", "dropped", "skipped")}
    lines = [f"regions: {len(result.regions)} found, {len(by['whole'])} imported whole, {len(by['cut'])} cut, "
             f"{len(by['dropped'])} dropped as no-ops, {len(by['skipped'])} not imported"]
    for r in by["cut"]:
        lines.append(f"  cut: nodes {r.nodes[0].split(':')[0]}..{r.nodes[-1].split(':')[0]} -> "
                     f"{', '.join(r.subgraphs)}; stopped by {_counted([b.split(':')[1] for b in r.stopped_by])}")
    stops = [b.split(":")[1] for r in by["skipped"] for b in r.stopped_by]
    if by["skipped"]:
        lines.append(f"  not imported: {len(by['skipped'])} region(s) of {_counted(stops) or 'unused nodes'}")
    lines.append(f"dropped no-op groups: {len(result.dropped)}" + "".join(f"\n  {d}" for d in result.dropped))
    lines.append(f"constant-only nodes folded: {len(result.fold.folded)}"
                 + (f" ({len(result.fold.unfolded)} left unfolded, see manifest.json)" if result.fold.unfolded else ""))
    lines.append("compute ops left to the framework: "
                 + (_counted([c.split(":")[1] for c in result.compute_ops]) or "none"))
    return lines
