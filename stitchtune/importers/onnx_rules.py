"""ONNX import: which nodes a subgraph may take (the boundary rules) and what they read.

Contract
--------
* The op tables: :data:`SUPPORTED_OPS` (the keys of :mod:`stitchtune.importers.onnx_ops`' registry of
  op handlers) and the ONNX -> graph.json maps ``_UNARY`` ... ``_LOGICAL`` and the ONNX element types
  graph.json takes (``_ONNX_ALL``: floats and bool; ints through
  :data:`~stitchtune.importers.onnx_ops_layout.INT_DTYPES`), re-exported from there; ``_ELEMENTWISE``,
  ``_CHEAP``.
* :class:`_Ctx` holds one model's tensor types, constants, views and producers;
  :func:`_why_not(ctx, i, node, in_range)` is None when node ``i`` can be part of a subgraph, else
  the reason it is a boundary (the rules of :mod:`stitchtune.importers.onnx_import`'s docstring:
  dtypes, ranks up to graph.json's ``MAX_RANK``, bools and ints only where graph.json takes them,
  constant parameters).
* :func:`_static_shape(ctx, t)` is the static shape of ``t`` or an
  :class:`~stitchtune.importers.builder.ImportError_` naming the dynamic dim and its symbol;
  :func:`_check_frames` lets an element-wise node read values in a reshaped frame (reshaping them
  back where they meet other shapes); :class:`_Demote` says a node must be a boundary after all.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from stitchtune.graph.checks import MAX_RANK
from stitchtune.graph.ops import OPS
from stitchtune.graph.parse import broadcast_shapes
from stitchtune.importers.builder import GraphBuilder, ImportError_, Value
from stitchtune.importers.onnx_layout import VIEW_OPS, View
from stitchtune.importers.onnx_load import MAX_TENSOR_ELEMENTS, ConstTable
from stitchtune.importers.onnx_ops import (  # noqa: F401  (re-exported: the op tables)
    _BINARY,
    _BOOL,
    _COMPARE,
    _LOGICAL,
    _ONNX_ALL,
    _ONNX_DTYPES,
    _REDUCE,
    _UNARY,
    _VARIADIC,
    SUPPORTED_OPS,
)
from stitchtune.importers.onnx_ops_layout import INT_DTYPES, layout_op, split_sizes, why_not_layout
from stitchtune.importers.onnx_partition import COMPUTE_OPS, label

__all__ = ["SUPPORTED_OPS"]

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


class _Demote(Exception):
    """Node ``node`` must be a boundary after all (found while building its group): ``reason``."""

    def __init__(self, node: int, reason: str, tensor: str | None = None) -> None:
        super().__init__(reason)
        self.node, self.reason, self.tensor = node, reason, tensor


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
    elif node.op_type == "Pad" and node.domain in ("", "ai.onnx"):
        if not pads_nothing(ctx, node):
            return "pads (graph.json has no pad)"
    elif node.domain not in _DOMAINS or node.op_type not in SUPPORTED_OPS:
        return "unsupported op"
    if node.op_type in _MS_ONLY and node.domain != "com.microsoft":
        return "unsupported op"
    if not in_range:
        return "outside --node-range"
    tensor_ins = [t for t in node.input if t and t not in ctx.consts]
    if not tensor_ins:
        return "all inputs are constants"
    why = _tensor_rule(ctx, node, lop)
    if why:
        return why
    a = ctx.attrs(node)
    if lop is not None:
        def rank(t: str) -> int:
            ty = ctx.types.get(t)
            return len(ty.shape) if ty is not None and ty.shape is not None else 0
        return why_not_layout(node, a, lambda k: ctx.const_list(node, k),
                              lambda t: ctx.types[t].elem if t in ctx.types else None, rank) \
            or _split_rule(ctx, node, a)
    return _bool_rule(ctx, node) or _attribute_rule(ctx, node, a)


def _split_rule(ctx: _Ctx, node: Any, a: dict[str, Any]) -> str | None:
    """Why a Split's sizes do not cut its (static) axis into one non-empty part per output."""
    ty = ctx.types.get(node.input[0]) if node.op_type == "Split" else None
    if ty is None or ty.shape is None or not ty.shape:
        return None
    axis = int(a.get("axis", 0))
    dim = ty.shape[axis % len(ty.shape)] if -len(ty.shape) <= axis < len(ty.shape) else None
    if not isinstance(dim, int):
        return None if dim is not None else "split axis out of range"
    sizes = split_sizes(node, a, lambda k: ctx.const_list(node, k), dim) or []
    if sum(sizes) != dim or len(sizes) != len(node.output) or min(sizes, default=0) <= 0:
        return f"split sizes {sizes} do not cut dim {dim} into {len(node.output)} non-empty parts"
    return None


def _tensor_rule(ctx: _Ctx, node: Any, lop: str | None) -> str | None:
    """Why a tensor ``node`` reads or writes is not one graph.json takes (dtype, rank), else None."""
    for t in [*node.input, *node.output]:
        if not t or (t in ctx.consts and t not in node.output):
            continue
        ty = ctx.types.get(t)
        if ty is None or ty.elem not in _ONNX_ALL:
            if node.op_type in _REDUCE and node.input[1:2] == [t]:
                continue
            if ty is None or ty.elem not in INT_DTYPES or not _takes_int(node, lop, t):
                return f"tensor {t!a} is not float32/float16/bfloat16/bool (or has no type)"
        if ty.shape is not None and not 1 <= len(ty.shape) <= MAX_RANK:
            return f"tensor {t!a} has rank {len(ty.shape)} (graph.json takes 1..{MAX_RANK})"
        dims = [d for d in ty.shape or () if isinstance(d, int)]
        if ty.shape is not None and len(dims) == len(ty.shape) and math.prod(dims) > MAX_TENSOR_ELEMENTS:
            return f"tensor {t!a} has over {MAX_TENSOR_ELEMENTS} elements"
    return None


def _attribute_rule(ctx: _Ctx, node: Any, a: dict[str, Any]) -> str | None:
    """Why an attribute-like parameter of ``node`` is not one graph.json takes, else None."""
    if node.op_type in _REDUCE and "axes" not in a and len(node.input) > 1 and node.input[1] \
            and ctx.const_list(node, 1) is None:
        return "reduction axes are not a constant"
    if node.op_type == "Clip":
        for k in (1, 2):
            t = node.input[k] if len(node.input) > k else ""
            if t and t in ctx.consts and ctx.consts[t].size != 1:
                return "clip bounds are constants of more than one element"
    if node.op_type == "Cast" and a.get("to") not in _ONNX_ALL and a.get("to") not in INT_DTYPES:
        return "cast to a type other than float32/float16/bfloat16/bool/int32/int64"
    if node.op_type == "Gelu" and a.get("approximate", "none") not in ("none", "tanh"):
        return "unknown gelu approximation"
    return _int_mix_rule(ctx, node)


def _int_mix_rule(ctx: _Ctx, node: Any) -> str | None:
    """Why an int op mixes int and float tensors, or an int tensor with a fractional constant (graph.json
    never mixes them; ONNX does not either, but a model's constants may be floats), else None."""
    if node.op_type not in _INT_OPS:
        return None
    ins = [t for t in (node.input[1:] if node.op_type == "Where" else node.input) if t]
    ints = [t for t in ins if t in ctx.types and ctx.types[t].elem in INT_DTYPES]
    if not ints:
        return None
    for t in ins:
        c = ctx.consts.get(t)
        if c is not None and c.size == 1:
            f = float(np.asarray(c).reshape(-1)[0])
            if not math.isfinite(f) or f != int(f) or abs(f) > 2**53:
                return f"int op with the non-integer constant {t!a}"
        elif t not in ints:
            return f"mixes int and non-int tensors ({ints[0]!a}, {t!a})"
    return None


#: ONNX ops that compute on int tensors as graph.json's int ops (int arithmetic, comparisons, Where's
#: branches; all their numeric operands int, see :func:`_int_mix_rule`)
_INT_OPS = frozenset({"Add", "Sub", "Mul", "Neg", "Abs", "Max", "Min", *_COMPARE, "Where"})


def _takes_int(node: Any, lop: str | None, t: str) -> bool:
    """Whether ``node`` may read or produce int tensor ``t``: Cast's input and result, the int ops
    (:data:`_INT_OPS`), the data and result of Transpose/Reshape/Slice/Concat/Split (index maps of an
    int; what reads their result is checked in turn), Gather's and GatherElements' index (graph.json's
    int rules, see graph/parse.py)."""
    if node.op_type in ("Cast", *_INT_OPS):
        return True
    if lop in ("gather", "gather_elements"):
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


def pads_nothing(ctx: _Ctx, node: Any) -> bool:
    """True for a ``Pad`` whose pads are a constant of zeros (Swin's ``maybe_pad`` where the windows
    tile the image): the value of its data input, unchanged."""
    pads = ctx.const_list(node, 1) if node.op_type == "Pad" else None
    return pads is not None and not any(pads)


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
    dims: list[int] = []
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
        dims.append(d)
    shape = tuple(dims)
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
