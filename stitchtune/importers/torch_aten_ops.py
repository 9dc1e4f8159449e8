"""The ATen op handlers of the fx walk (:class:`stitchtune.importers.torch_aten._Walker`): a registry.

Each handler maps one family of ATen ops onto graph.json ops and is registered for its op keys
(``_key(node.target)``, e.g. ``"aten.add"``) with :func:`aten_op`, in the manner of Inductor's
``register_lowering``. :data:`SUPPORTED_OPS`, the op list the importer, the region finder
(:mod:`stitchtune.importers.torch_candidates`) and ``explain()`` use, is the registry's keys.

Contract of a handler ``fn(w, node, key, a, x)``: ``w`` is the walker (its builder ``w.b`` and value
helpers), ``node`` the fx node, ``key`` its op key, ``a`` its bound arguments (``_bind``), ``x`` its
first tensor argument (``a["self"]``, ``a["input"]`` or ``a["a"]``, or None); it returns the node's
graph value (a tuple for multi-output ops) or raises :class:`~stitchtune.importers.builder.ImportError_`
naming the op and its source location. :func:`map_op` runs the shared steps first: a handler
registered ``raw`` (comparisons, logical ops, fills, ``iota``, ``rand``, scatter) sees the arguments as
they are; any other first has bool tensor arguments refused and int tensors promoted as torch does.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from stitchtune.importers.builder import GraphBuilder, ImportError_, Value, scalar
from stitchtune.importers.torch_cnn import CNN_OPS, map_cnn_op
from stitchtune.importers.torch_fx_util import _meta, _where, index_dtype_name, zero_pad
from stitchtune.importers.torch_layout import _LAYOUT, Empty, Padded
from stitchtune.importers.torch_index_copy import index_copy_axis, map_index_copy
from stitchtune.importers.torch_scatter import SCATTER_OPS, map_scatter


class AtenWalker(Protocol):
    """What a handler may use of the fx walk, the walker's public interface
    (:class:`stitchtune.importers.torch_aten._Walker` provides it): its builder, the graph values of the
    nodes walked so far, and the value helpers the handlers share (``promote_ints``, ``ints_to_float``,
    ``no_bool``, ``graph_dtype``, ``reduce_node``, ``view_node``, ``layout_node``, ...). A protocol, so that
    this module does not import the walker that imports it."""

    b: GraphBuilder
    vals: dict[str, Any]

    def tshape(self, n: Any) -> tuple[int, ...]: ...
    def val(self, x: Any, node: Any) -> Value: ...
    def axes(self, x: Any, dims: Any, node: Any) -> list[int]: ...
    def promote_ints(self, node: Any, a: dict[str, Any]) -> dict[str, Any]: ...
    def ints_to_float(self, node: Any, a: dict[str, Any]) -> dict[str, Any]: ...
    def no_bool(self, node: Any, key: str, a: dict[str, Any]) -> None: ...
    def graph_dtype(self, dt: Any, node: Any) -> str: ...
    def reduce_node(self, node: Any, key: str, a: dict[str, Any]) -> Any: ...
    def view_node(self, node: Any, key: str, x: Any) -> Value: ...
    def layout_node(self, node: Any, key: str, a: dict[str, Any], x: Any) -> Value | Padded | Empty: ...
    def add_padded(self, node: Any, lhs: Any, rhs: Any) -> Value | Padded: ...

# ---------------------------------------------------------------------------- the op tables
_UNARY = {"aten.relu": "relu", "aten.sigmoid": "sigmoid", "aten.tanh": "tanh", "aten.exp": "exp",
          "aten.log": "log", "aten.sqrt": "sqrt", "aten.rsqrt": "rsqrt", "aten.reciprocal": "reciprocal",
          "aten.neg": "neg", "aten.abs": "abs", "aten.erf": "erf", "aten.square": "square",
          "aten.silu": "silu", "aten.sin": "sin", "aten.cos": "cos"}
_BINARY = {"aten.mul": "mul", "aten.div": "div", "aten.true_divide": "div", "aten.maximum": "maximum",
           "aten.minimum": "minimum"}
_REDUCE = {"aten.sum": "reduce_sum", "aten.mean": "reduce_mean", "aten.amax": "reduce_max",
           "aten.amin": "reduce_min", "aten.max": "reduce_max", "aten.min": "reduce_min"}
_VIEWS = {"aten.view", "aten.reshape", "aten._unsafe_view", "aten.unsqueeze", "aten.squeeze",
          "aten.flatten", "aten.expand", "aten.expand_as", "aten.alias", "aten.clone", "aten.contiguous",
          "aten.detach", "aten.lift_fresh_copy", "aten.view_as"}
#: casts to the node's dtype (``prims.convert_element_type``: what Inductor's decompositions make of
#: ``to`` in backward graphs, e.g. dropout's bool mask made float)
_CASTS = {"aten._to_copy", "aten.to", "aten.type_as", "aten._to_dtype", "prims.convert_element_type"}
_COMPARE = {"aten.eq": "eq", "aten.ne": "ne", "aten.lt": "lt", "aten.le": "le", "aten.gt": "gt", "aten.ge": "ge"}
_LOGICAL = {"aten.logical_and": "logical_and", "aten.logical_or": "logical_or", "aten.logical_not": "logical_not",
            "aten.bitwise_and": "logical_and", "aten.bitwise_or": "logical_or", "aten.bitwise_not": "logical_not",
            "aten.__and__": "logical_and", "aten.__or__": "logical_or"}
_MASK_OPS = {*_COMPARE, *_LOGICAL, "aten.where", "aten.masked_fill"}
#: ``arange`` and its decomposition ``prims.iota``: an ``iota`` (then ``* step + start``)
_IOTA = {"aten.arange", "prims.iota"}
#: constants of one value, mapped as a number: ``scalar_tensor`` (0-d) and ``full`` (only as a
#: scatter's base: :func:`stitchtune.importers.torch_candidates.full_reason`)
_FILLS = {"aten.scalar_tensor", "aten.full"}
#: ops that take int tensors as ints (graph.json's int ops); any other op reads an int tensor as
#: torch does, promoted to float32 first (``exp(ids)``, ``ids / 2``)
INT_OPS: frozenset[str] = frozenset({
    "aten.add", "aten.sub", "aten.rsub", "aten.mul", "aten.neg", "aten.abs", "aten.maximum", "aten.minimum",
    "aten.clamp", "aten.clamp_min", "aten.clamp_max", *_COMPARE, "aten.where", "aten.masked_fill"})
#: the key of ``stitchtune::rand(seed, stream, size)`` (:mod:`stitchtune.importers.torch_random`): dropout's
#: numbers drawn in the region, ``uniform(seed + stream * RAND_STREAM_STEP, flat index)``
RAND_KEY = "stitchtune.rand"
#: what a stream adds to the seed (a graph.json int constant: exact, below 2**53 for streams < 2**16)
RAND_STREAM_STEP = 0x9E3779B97
#: ops the walk skips (run-time assertions of shapes and values)
_IGNORED = {"aten._assert_tensor_metadata", "aten._assert_scalar", "aten.sym_constrain_range_for_size",
            "aten._assert_async",
            "stitchtune.put"}   # a cache write the backend made a kernel call already (deploy.torch_put)


def _is_bool(x: Any) -> bool:
    """True for an fx node whose value is a bool tensor."""
    return hasattr(x, "meta") and _meta(x)[1] == "bool"


# ---------------------------------------------------------------------------- the registry
#: a handler: ``fn(walker, node, key, bound args, first tensor arg) -> graph value(s)`` (module docstring)
Handler = Callable[[AtenWalker, Any, str, dict[str, Any], Any], Any]


@dataclass(frozen=True)
class OpHandler:
    """A registered handler; ``raw``: it runs before the bool check and int promotion of :func:`map_op`."""

    fn: Handler
    raw: bool = False


_HANDLERS: dict[str, OpHandler] = {}


def aten_op(*keys: str, raw: bool = False) -> Callable[[Handler], Handler]:
    """Register the decorated handler for op ``keys``; a key registered twice raises ``ValueError``."""
    def register(fn: Handler) -> Handler:
        for k in keys:
            if k in _HANDLERS:
                raise ValueError(f"ATen op {k} has two handlers ({_HANDLERS[k].fn.__name__}, {fn.__name__})")
            _HANDLERS[k] = OpHandler(fn, raw)
        return fn
    return register


def handlers() -> dict[str, OpHandler]:
    """A copy of the registry: op key -> handler."""
    return dict(_HANDLERS)


def _first(a: dict[str, Any]) -> Any:
    return a.get("self", a.get("input", a.get("a")))   # ("a": prims.convert_element_type)


def map_op(w: AtenWalker, node: Any, key: str, a: dict[str, Any]) -> Any:
    """The graph value(s) of one ATen node (a tuple for multi-output ops) through its handler; an op
    without one raises ``unsupported op TARGET at LOCATION``."""
    b, name = w.b, node.name
    x = _first(a)
    h = _HANDLERS.get(key)
    if h is not None and h.raw:
        return h.fn(w, node, key, a, x)
    if key == "aten.mul" and _meta(node)[1] not in (None, "bool") and any(map(_is_bool, (x, a.get("other")))):
        # training dropout's ``mask * x``: the mask cast to the product's dtype (exact: 0 or 1)
        prod_dt = str(_meta(node)[1])
        lhs, rhs = (b.cast(w.val(v, node), prod_dt, f"{name}_{i}") for i, v in enumerate((x, a["other"])))
        return b.binary("mul", lhs, rhs, name)
    w.no_bool(node, key, a)
    if key in INT_OPS:
        a = w.promote_ints(node, a)
    elif key in _UNARY or key in _BINARY or key in ("aten.pow", "aten.gelu"):
        a = w.ints_to_float(node, a)
    x = _first(a)
    if zero_pad(node) and (h is None or key in _LAYOUT or key in CNN_OPS):   # a pad of zeros: its input
        return w.view_node(node, key, x)
    if h is None:
        raise ImportError_(f"unsupported op {node.target} at {_where(node)}")
    return h.fn(w, node, key, a, x)


# ---------------------------------------------------------------------------- the handlers
@aten_op(*_FILLS, raw=True)
def _fill(w: AtenWalker, node: Any, key: str, a: dict[str, Any], x: Any) -> Value:
    """A 0-d constant (e.g. masked_fill's value), or a scatter's base of one value."""
    fill = a.get("s", a.get("fill_value"))
    if isinstance(fill, bool) or not isinstance(fill, (int, float)):
        raise ImportError_(f"{node.target} at {_where(node)}: a non-numeric {key.removeprefix('aten.')}")
    t, dt = _meta(node)
    if key == "aten.full" and t and dt is not None and any(u.op == "output" for u in node.users):
        # a region's output (a cache's lazy zeros of a symbolic length): the value at every element,
        # ``iota * 0 + fill`` (exact; no load, a store per element)
        it = "int64" if dt == "int64" else "int32"
        zero = w.b.binary("mul", w.b.iota(t, 0, it, f"{node.name}_i"), scalar(0.0), f"{node.name}_z")
        return w.b.binary("add", zero if dt == it else w.b.cast(zero, dt, f"{node.name}_c"), scalar(float(fill)),
                          node.name)
    return scalar(float(fill))


@aten_op(*SCATTER_OPS, raw=True)
def _scatter(w: AtenWalker, node: Any, key: str, a: dict[str, Any], x: Any) -> Any:
    """An embedding's gradient: scatter_add of the masked values (torch_scatter); a static cache's
    one-position index copy: a where over the cache (torch_index_copy)."""
    if index_copy_axis(node) is not None:
        return map_index_copy(w.b, node, lambda v: w.val(v, node), w.tshape(node))
    return map_scatter(w.b, node, lambda v: w.val(v, node), w.tshape(node))


@aten_op(*_UNARY)
def _unary(w: AtenWalker, node: Any, key: str, a: dict[str, Any], x: Any) -> Value:
    return w.b.unary(_UNARY[key], w.val(x, node), node.name)


@aten_op("aten.gelu")
def _gelu(w: AtenWalker, node: Any, key: str, a: dict[str, Any], x: Any) -> Value:
    op = {"none": "gelu", "tanh": "gelu_tanh"}.get(a.get("approximate") or "none")
    if op is None:
        raise ImportError_(f"gelu approximate={a.get('approximate')!a} at {_where(node)} is not supported")
    return w.b.unary(op, w.val(x, node), node.name)


@aten_op(*_BINARY)
def _binary(w: AtenWalker, node: Any, key: str, a: dict[str, Any], x: Any) -> Value:
    if a.get("rounding_mode") is not None:
        raise ImportError_(f"{node.target} rounding_mode={a['rounding_mode']!a} at {_where(node)} "
                           "is not supported")
    return w.b.binary(_BINARY[key], w.val(x, node), w.val(a["other"], node), node.name)


@aten_op("prims.fma")
def _fma(w: AtenWalker, node: Any, key: str, a: dict[str, Any], x: Any) -> Value:
    """``a * b + c`` (Inductor's decomposition of softmax's backward)."""
    prod = w.b.binary("mul", w.val(a["a"], node), w.val(a["b"], node), f"{node.name}_mul")
    return w.b.binary("add", prod, w.val(a["c"], node), node.name)


@aten_op("aten.pow")
def _pow(w: AtenWalker, node: Any, key: str, a: dict[str, Any], x: Any) -> Value:
    return w.b.binary("pow", w.val(x, node), w.val(a["exponent"], node), node.name)


@aten_op(*_REDUCE)
def _reduce(w: AtenWalker, node: Any, key: str, a: dict[str, Any], x: Any) -> Any:
    return w.reduce_node(node, key, a)


@aten_op("aten.dropout", "aten.native_dropout", "aten.feature_dropout")
def _dropout(w: AtenWalker, node: Any, key: str, a: dict[str, Any], x: Any) -> Any:
    """Dropout in eval mode: its input (``native_dropout``: with no mask)."""
    if a.get("train"):
        raise ImportError_(f"{node.target} at {_where(node)}: dropout in training mode is not "
                           "supported (call .eval() first)")
    v = w.val(a["input"], node)
    return (v, None) if key == "aten.native_dropout" else v


@aten_op(*_CASTS)
def _cast(w: AtenWalker, node: Any, key: str, a: dict[str, Any], x: Any) -> Value:
    _, dt = _meta(node)
    if dt is None:
        raise ImportError_(f"{node.target} at {_where(node)}: cast to a dtype graph.json does not have")
    return w.b.cast(w.val(a["a"] if key == "prims.convert_element_type" else x, node), dt, node.name)


@aten_op(*_VIEWS)
def _view(w: AtenWalker, node: Any, key: str, a: dict[str, Any], x: Any) -> Value:
    return w.view_node(node, key, x)


@aten_op(*_LAYOUT)
def _layout(w: AtenWalker, node: Any, key: str, a: dict[str, Any], x: Any) -> Any:
    return w.layout_node(node, key, a, x)


@aten_op(*CNN_OPS)
def _cnn(w: AtenWalker, node: Any, key: str, a: dict[str, Any], x: Any) -> Any:
    """Eval batch norm, 1x1 adaptive average pool (torch_cnn)."""
    return map_cnn_op(w, node, key, a)


@aten_op("aten.add", "aten.sub", "aten.rsub")
def _add_sub(w: AtenWalker, node: Any, key: str, a: dict[str, Any], x: Any) -> Value | Padded:
    """``add`` / ``sub`` / ``rsub`` (``rsub(x, y) = y - x``); ``alpha`` multiplies what is added or
    subtracted; an ``add`` of a slice scattered into zeros is :meth:`LayoutOps.add_padded`'s."""
    b, name = w.b, node.name
    alpha = a.get("alpha")
    padded = [w.vals.get(str(getattr(v, "name", ""))) for v in (x, a["other"])]
    if key == "aten.add" and alpha in (None, 1) and any(isinstance(p, Padded) for p in padded):
        lhs, rhs = (p if isinstance(p, Padded) else w.val(v, node) for p, v in zip(padded, (x, a["other"])))
        return w.add_padded(node, lhs, rhs)
    lhs, rhs = w.val(x, node), w.val(a["other"], node)
    if alpha is not None and alpha != 1:
        if key == "aten.rsub":
            lhs = b.binary("mul", lhs, scalar(alpha), f"{name}_alpha")
        else:
            rhs = b.binary("mul", rhs, scalar(alpha), f"{name}_alpha")
    if key == "aten.rsub":
        return b.binary("sub", rhs, lhs, name)
    return b.binary(key.removeprefix("aten."), lhs, rhs, name)


@aten_op("aten.clamp", "aten.clamp_min", "aten.clamp_max", "aten.hardtanh")
def _clamp(w: AtenWalker, node: Any, key: str, a: dict[str, Any], x: Any) -> Value:
    """``clamp`` / ``clamp_min`` / ``clamp_max`` / ``hardtanh`` as ``maximum`` then ``minimum``."""
    b, name = w.b, node.name
    v = w.val(x, node)
    lo = a.get("min", a.get("min_val"))
    hi = a.get("max", a.get("max_val"))
    if lo is not None:
        v = b.binary("maximum", v, w.val(lo, node), f"{name}_lo" if hi is not None else name)
    if hi is not None:
        v = b.binary("minimum", v, w.val(hi, node), name)
    return v


@aten_op("aten.softmax", "aten._softmax", "aten.log_softmax", "aten._log_softmax")
def _softmax(w: AtenWalker, node: Any, key: str, a: dict[str, Any], x: Any) -> Value:
    """``softmax`` / ``log_softmax`` (and their ``_`` forms), with the optional input cast first."""
    b, name = w.b, node.name
    v = w.val(x, node)
    if a.get("dtype") is not None:
        v = b.cast(v, w.graph_dtype(a["dtype"], node), f"{name}_in")
    if a.get("half_to_float"):
        v = b.cast(v, "float32", f"{name}_in")
    return b.softmax(v, w.axes(x, a["dim"], node), name, log_="log_" in key)


@aten_op("aten.layer_norm", "aten.native_layer_norm", "aten.rms_norm")
def _norm(w: AtenWalker, node: Any, key: str, a: dict[str, Any], x: Any) -> Any:
    """``layer_norm`` / ``rms_norm`` (decomposed by the builder); ``native_layer_norm`` gives
    ``(y, mean, rstd)``."""
    b, name = w.b, node.name
    v = w.val(a["input"], node)
    k = len(a["normalized_shape"])
    rt = len(w.tshape(a["input"]))
    axes = w.axes(a["input"], list(range(rt - k, rt)), node)
    weight = w.val(a["weight"], node) if a.get("weight") is not None else None
    if key == "aten.rms_norm":
        eps = a.get("eps")
        if eps is None:
            import torch

            eps = torch.finfo(node.meta["val"].dtype).eps
        return b.rms_norm(v, axes, weight, float(eps), name)[0]
    bias = w.val(a["bias"], node) if a.get("bias") is not None else None
    y, mean, rstd = b.layer_norm(v, axes, weight, bias, float(a["eps"]), name)
    return y if key == "aten.layer_norm" else (y, mean, rstd)


@aten_op(*_MASK_OPS, raw=True)
def _mask_op(w: AtenWalker, node: Any, key: str, a: dict[str, Any], x: Any) -> Value:
    """Comparisons, logical ops on bools, ``where`` and ``masked_fill`` (scalar value)."""
    b, name = w.b, node.name
    if key == "aten.where":
        if a.get("condition") is None or "self" not in a:
            raise ImportError_(f"{node.target} at {_where(node)}: only where(cond, a, b) is supported")
        args = [w.val(a["condition"], node), w.val(a["self"], node), w.val(a["other"], node)]
        if args[0].dtype != "bool" or any(v.dtype == "bool" for v in args[1:]):
            raise ImportError_(f"{node.target} at {_where(node)}: where needs a bool condition and float values")
        return b.elementwise("where", args, name)
    if key == "aten.masked_fill":
        mask, value = w.val(a["mask"], node), w.val(a["value"], node)
        v = w.val(x, node)
        if mask.dtype != "bool" or not value.is_scalar or v.dtype == "bool":
            raise ImportError_(f"{node.target} at {_where(node)}: masked_fill needs a float tensor, a bool "
                               "mask and a number")
        return b.elementwise("where", [mask, value, v], name)
    if key in _COMPARE:
        args = [w.val(x, node), w.val(a["other"], node)]
        if any(v.dtype == "bool" for v in args):
            raise ImportError_(f"{node.target} at {_where(node)}: comparing bool tensors is not supported")
        return b.elementwise(_COMPARE[key], args, name)
    args = [w.val(x, node)] + ([w.val(a["other"], node)] if "other" in a else [])
    op = _LOGICAL[key]
    if len(args) == 2 and op in ("logical_and", "logical_or") and sum(v.is_scalar for v in args) == 1:
        # a 0-d bool constant (a mask started as ``full((), True)``): ``x & True`` and ``x | False`` are x
        k = 0 if args[0].is_scalar else 1
        tensor = args[1 - k]
        if _is_bool(x if k == 0 else a["other"]) and bool(args[k].ref) == (op == "logical_and") \
                and tensor.dtype == "bool":
            return tensor
    if any(v.is_scalar or v.dtype != "bool" for v in args):
        raise ImportError_(f"{node.target} at {_where(node)}: logical ops need bool tensors")
    return b.logical_not(args[0], name) if op == "logical_not" else b.elementwise(op, args, name)


@aten_op(*_IOTA, raw=True)
def _iota(w: AtenWalker, node: Any, key: str, a: dict[str, Any], x: Any) -> Value:
    """``arange(start, end, step)`` / ``prims.iota(length, start, step)``: an int ``iota`` of the
    result's length, times ``step`` plus ``start`` (int arithmetic, exact), cast where the result
    is a float (its values are then integers, exact below 2**24)."""
    t, dt = _meta(node)
    if dt is None and node.meta.get("val") is not None:
        dt = index_dtype_name(node.meta["val"].dtype)
    start, step = a.get("start", 0), a.get("step", 1)
    if dt is None or len(t) != 1 or any(isinstance(c, bool) or not isinstance(c, int) for c in (start, step)):
        raise ImportError_(f"{node.target} at {_where(node)}: only a 1-d arange with integer start and step "
                           "is supported")
    it = "int64" if dt not in ("int32", "int64") else dt
    v = w.b.iota(t, 0, it, node.name if (start, step) == (0, 1) and it == dt else f"{node.name}_i")
    if step != 1:
        v = w.b.binary("mul", v, scalar(float(step)), f"{node.name}_step")
    if start != 0:
        v = w.b.binary("add", v, scalar(float(start)), f"{node.name}_start")
    return v if it == dt else w.b.cast(v, dt, node.name)


@aten_op(RAND_KEY, raw=True)
def _rand(w: AtenWalker, node: Any, key: str, a: dict[str, Any], x: Any) -> Value:
    """``stitchtune::rand(seed, stream, size)``: ``uniform(seed + stream * RAND_STREAM_STEP, i)`` with
    ``i`` the element's row-major flat index in ``size``, a sum of int32 ``iota``s times strides."""
    b, name = w.b, node.name
    t = tuple(int(d) for d in a["size"])
    stream = a["stream"]
    if math.prod(t) >= 2**31 or isinstance(stream, bool) or not isinstance(stream, int) or not 0 <= stream < 2**16:
        raise ImportError_(f"{node.target} at {_where(node)}: only fewer than 2**31 numbers and streams "
                           "below 2**16 are supported")
    seed = w.val(a["seed"], node)
    if stream:
        seed = b.binary("add", seed, scalar(float(stream * RAND_STREAM_STEP)), f"{name}_seed")
    idx: Value | None = None
    stride = 1
    for ax in reversed(range(len(t))):
        if t[ax] > 1:
            term = b.iota(t, ax, "int32", f"{name}_i{ax}")
            if stride > 1:
                term = b.binary("mul", term, scalar(float(stride)), f"{name}_s{ax}")
            idx = term if idx is None else b.binary("add", idx, term, f"{name}_c{ax}")
        stride *= t[ax]
    if idx is None:   # a single number: counter 0
        idx = b.iota(t or (1,), 0, "int32", f"{name}_i")
    return b.elementwise("uniform", [seed, idx], name)


#: every ATen op key (``_key(node.target)``) that :func:`map_op` maps (some only for some arguments):
#: the registry's keys
SUPPORTED_OPS: frozenset[str] = frozenset(_HANDLERS)
