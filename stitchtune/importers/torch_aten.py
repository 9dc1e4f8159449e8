"""PyTorch import, second half: walk a captured fx graph and map each ATen op onto graph.json ops.

:class:`_Walker` reads the :class:`_Captured` graph that :mod:`stitchtune.importers.torch_import`
captured and emits graph.json nodes through a :class:`~stitchtune.importers.builder.GraphBuilder`;
the op tables and the per-op translations are here, the supported-op contract is in
:mod:`stitchtune.importers.torch_import`'s docstring. Every problem raises
:class:`~stitchtune.importers.builder.ImportError_` naming the op and its source location.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from stitchtune.importers.builder import GraphBuilder, ImportError_, Value, scalar
from stitchtune.importers.torch_cnn import CNN_OPS, dead, inplace_problem, map_cnn_op
from stitchtune.importers.torch_fx_util import (  # noqa: F401  (re-exported: the importers' helpers)
    _bind,
    _fits,
    _key,
    _meta,
    _strip1,
    _to_numpy,
    _where,
    index_dtype_name,
    zero_pad,
    torch_dtype_name,
    value_dtype_name,
)
from stitchtune.importers.torch_layout import _LAYOUT, LayoutOps, Padded
from stitchtune.importers.torch_scatter import SCATTER_OPS, map_scatter


# ---------------------------------------------------------------------------- the walk
@dataclass
class _Captured:
    """A captured fx graph (built by ``torch_import._capture``): what :class:`_Walker` walks."""

    gm: Any                      # torch.fx.GraphModule
    bindings: dict[str, tuple[str, Any]]   # placeholder name -> ("user", index) | ("param", (fqn, tensor))
    method: str


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
#: every ATen op key (``_key(node.target)``) that :meth:`_Walker._op` maps (some only for some arguments)
SUPPORTED_OPS: frozenset[str] = frozenset({
    *_UNARY, *_BINARY, *_REDUCE, *_VIEWS, *_CASTS, *_LAYOUT, "aten.gelu", "aten.add", "aten.sub", "aten.rsub", "aten.pow",
    "aten.clamp", "aten.clamp_min", "aten.clamp_max", "aten.hardtanh", "aten.softmax", "aten._softmax",
    "aten.log_softmax", "aten._log_softmax", "aten.layer_norm", "aten.native_layer_norm", "aten.rms_norm",
    "aten.dropout", "aten.native_dropout", "aten.feature_dropout", *_FILLS, "prims.fma", *_MASK_OPS, *_IOTA,
    RAND_KEY, *SCATTER_OPS})   # (SCATTER_OPS: an embedding's gradient, torch_scatter)
SUPPORTED_OPS = SUPPORTED_OPS | CNN_OPS   # eval batch norm, 1x1 adaptive average pool (torch_cnn)
_IGNORED = {"aten._assert_tensor_metadata", "aten._assert_scalar", "aten.sym_constrain_range_for_size",
            "aten._assert_async"}


@dataclass(frozen=True)
class _Alias:
    """An argument replaced by another value of the walk (an int tensor promoted to float32)."""

    name: str


def _is_bool(x: Any) -> bool:
    """True for an fx node whose value is a bool tensor."""
    return hasattr(x, "meta") and _meta(x)[1] == "bool"


def _is_view(n: Any) -> bool:
    return bool(n.op == "call_function" and _key(n.target) in _VIEWS)


def _row_lift_ok(n: Any, m: Any, members: set[Any], B: int) -> bool:
    """Whether fx node ``m``, an argument or a user of row vector ``n``, fits the lift: a member, a 0-d
    value (a reduction of one, a scalar), or the keepdim form ``(B, 1)`` on the other side of a view."""
    if m in members:
        return True
    val = m.meta.get("val") if hasattr(m, "meta") else None
    shape = tuple(getattr(val, "shape", (None,)))
    return shape == () or (shape == (B, 1) and (_is_view(m) if m in n.users else _is_view(n)))


def row_vectors(gm: Any) -> frozenset[str]:
    """The rank-1 ``[B]`` values of ``gm`` that torch's ``squeeze`` / ``unsqueeze`` of keepdim ``[B, 1]``
    results say are one value per row (cross entropy's target, mask and picked loss next to
    ``logits [B, C]``): the graph holds them as ``[B, 1]``, so that they broadcast along the rows.
    A connected set of ``[B]`` values (fx edges between them) is lifted when one of them is squeezed from
    or unsqueezed to ``[B, 1]`` and every argument and user outside the set is a 0-d value or such a view
    (a ``[B]`` value read along the columns of a ``[C, B]`` tensor is never lifted). Static shapes only."""
    def shape(n: Any) -> tuple[int, ...] | None:
        val = n.meta.get("val") if hasattr(n, "meta") else None
        dims = tuple(getattr(val, "shape", None) or ()) if val is not None and hasattr(val, "shape") else None
        return dims if dims is not None and all(type(d) is int for d in dims) else None   # (no symbolic dim)

    nodes = [n for n in gm.graph.nodes if n.op in ("placeholder", "call_function")]
    out: set[str] = set()
    seen: set[Any] = set()
    for start in nodes:
        sh = shape(start)
        if start in seen or sh is None or len(sh) != 1 or sh[0] <= 1:
            continue
        B = sh[0]
        comp, stack = set(), [start]
        while stack:   # the [B] values connected to ``start``
            n = stack.pop()
            if n in comp:
                continue
            comp.add(n)
            for m in [*(a for a in n.all_input_nodes), *n.users]:
                if m.op in ("placeholder", "call_function") and shape(m) == (B,):
                    stack.append(m)
        seen |= comp
        keyed = [m for n in comp for m in [*n.all_input_nodes, *n.users] if m not in comp and shape(m) == (B, 1)
                 and (_is_view(m) if m in n.users else _is_view(n))]
        if not keyed:
            continue
        if all(_row_lift_ok(n, m, comp, B) for n in comp for m in [*n.all_input_nodes, *n.users] if m.op != "output"):
            out |= {n.name for n in comp}
    return frozenset(out)


class _Walker(LayoutOps):
    def __init__(self, cap: _Captured, b: GraphBuilder, user_values: list[Value],
                 param_dtype: Callable[[str, Any], str]) -> None:
        self.cap, self.b = cap, b
        self.user_values = user_values
        self.vals: dict[str, Any] = {}
        self.params: list[tuple[str, np.ndarray]] = []
        self.param_dtype = param_dtype
        self.forced_keepdim = self._keepdim_prepass()
        self.rows = row_vectors(cap.gm)   # [B] values held as [B, 1] (user inputs: the caller's shapes)
        #: placeholders the caller declared at the shape every reader reshapes them to (no node)
        self.viewed: frozenset[str] = frozenset()
        #: ``sum`` nodes mapped as adds of slices (:meth:`_unrolled_sum`; the region finder picks them)
        self.unrolled: frozenset[str] = frozenset()
        for n in cap.gm.graph.nodes:   # a caller that gave a row vector input as [B] gets no lift
            if n.op == "placeholder" and n.name in self.rows and cap.bindings.get(n.name, ("", 0))[0] == "user" \
                    and tuple(user_values[cap.bindings[n.name][1]].shape) != (*self.tshape(n), 1):
                self.rows = frozenset()
                break
        self.current: Any = None
        self._exact: dict[str, Value] = {}
        self._reshaped: dict[str, Value] = {}
        self._order: dict[Any, int] | None = None   # node -> position, for in-place ops

    # -- helpers
    def tshape(self, n: Any) -> tuple[int, ...]:
        return _meta(n)[0]

    def val(self, x: Any, node: Any) -> Value:
        import torch.fx

        if isinstance(x, _Alias):
            return self.vals[x.name]
        if isinstance(x, torch.fx.Node):
            v = self.vals.get(x.name)
            if not isinstance(v, Value):
                raise ImportError_(f"{node.target} at {_where(node)}: argument {x.name!a} is not a tensor "
                                   "graph.json can represent")
            return v
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise ImportError_(f"{node.target} at {_where(node)}: unsupported argument {type(x).__name__}")
        return scalar(float(x))

    def axes(self, x: Any, dims: Any, node: Any) -> list[int]:
        """PyTorch dims of ``x`` -> graph axes of its value (size-1 leading dims may differ)."""
        v = self.val(x, node)
        t = self.tshape(x)
        if getattr(x, "name", None) in self.rows and tuple(v.shape) == (*t, 1):
            return [0, 1]   # a row vector's reduction reduces all of it (its graph form [B, 1])
        if _strip1(t) != _strip1(v.shape):
            raise ImportError_(f"{node.target} at {_where(node)}: reducing a broadcast or reshaped tensor "
                               f"(PyTorch shape {list(t)}, graph shape {list(v.shape)}) is not supported")
        rt = len(t)
        if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
            dims = list(range(rt))
        if isinstance(dims, int):
            dims = [dims]
        out = []
        for d in dims:
            if not -rt <= d < max(rt, 1):
                raise ImportError_(f"{node.target} at {_where(node)}: dim {d} out of range for rank {rt}")
            g = d % rt - (rt - len(v.shape))
            if g >= 0:
                out.append(g)
        return out

    def _keepdim_prepass(self) -> set[str]:
        """Reductions with keepdim=False whose every user re-inserts the reduced dims."""
        forced: set[str] = set()
        for n in self.cap.gm.graph.nodes:
            if n.op != "call_function" or _key(n.target) not in _REDUCE or not hasattr(n.target, "_schema"):
                continue
            a = _bind(n)
            if a.get("keepdim") or "dim" not in a or not n.users:
                continue
            t_in = self.tshape(a["self"])
            dims = a["dim"]
            dims = [dims] if isinstance(dims, int) else list(dims or range(len(t_in)))
            dims = {d % max(len(t_in), 1) for d in dims}
            kd = tuple(1 if i in dims else d for i, d in enumerate(t_in))
            if all(u.op == "call_function" and _key(u.target) in _VIEWS and self.tshape(u) == kd
                   for u in n.users):
                forced.add(n.name)
        return forced

    # -- the walk
    def run(self) -> list[Value]:
        outputs: list[Value] = []
        for node in self.cap.gm.graph.nodes:
            self.current = node   # the node being mapped (torch_regions names it when mapping fails)
            if node.op in ("placeholder", "get_attr"):
                if node.users or self.cap.bindings[node.name][0] == "user":   # unused parameters and
                    self.vals[node.name] = self._input(node)                # buffers are no inputs
            elif node.op == "call_function":
                if node.target is operator.getitem:
                    src, idx = node.args
                    got = self.vals.get(src.name)
                    item = got[idx] if isinstance(got, tuple) and idx < len(got) else None
                    if item is None and not node.users:   # an unused output (batch norm's saved stats)
                        continue
                    if item is None:
                        raise ImportError_(f"{src.target} output {idx} at {_where(node)} is not supported")
                    self.vals[node.name] = item
                    continue
                key = _key(node.target)
                if key in _IGNORED or dead(node):
                    continue
                if key.endswith("_") and not key.endswith("__"):
                    key = self._inplace(node, key)
                if not hasattr(node.target, "_schema"):
                    raise ImportError_(f"unsupported op {node.target} at {_where(node)}")
                res = self._op(node, key, _bind(node))
                if isinstance(res, Value) and not (res.is_scalar and key in _FILLS):
                    res = self._check(node, res)
                self.vals[node.name] = res
            elif node.op == "output":
                outs = node.args[0]
                outs = outs if isinstance(outs, (list, tuple)) else [outs]
                for o in outs:
                    v = self.val(o, node) if o is not None else None
                    if v is None or v.is_scalar:
                        raise ImportError_("every output must be a tensor")
                    t, _ = _meta(o)
                    if not t:
                        raise ImportError_(f"output {o.name!a} is a 0-d tensor; graph.json tensors have rank "
                                           "1..4 (keep the reduced dims: keepdim=True)")
                    if tuple(v.shape) != tuple(t):
                        raise ImportError_(f"output {o.name!a} has PyTorch shape {list(t)} but the graph "
                                           f"computes {list(v.shape)} (a reshape graph.json cannot express)")
                    outputs.append(v)
            else:
                raise ImportError_(f"unsupported fx node {node.op} {node.target} at {_where(node)}")
        return outputs

    def _inplace(self, node: Any, key: str) -> str:
        """An in-place op on a fresh intermediate that nothing reads afterwards is its out-of-place op
        (:func:`stitchtune.importers.torch_cnn.inplace_problem`)."""
        if self._order is None:
            self._order = {n: i for i, n in enumerate(self.cap.gm.graph.nodes)}
        why = inplace_problem(node, self._order)
        if why:
            raise ImportError_(f"in-place op {node.target} at {_where(node)} {why}")
        return key[:-1]

    def _input(self, node: Any) -> Value:
        kind, payload = self.cap.bindings[node.name]
        if kind == "user":
            return self.user_values[payload]
        if kind == "folded":   # a constant the region resolves at import time (``index``'s indices)
            return payload
        fqn, t = payload
        if kind == "const" and t.numel() == 1 and t.dim() == 0:
            return scalar(float(t.item()))
        dt = self.param_dtype(fqn, t)
        v = self.b.add_input(fqn, tuple(t.shape), dt)
        self.params.append((str(v.ref), _to_numpy(t, dt)))
        return v

    def _check(self, node: Any, v: Value) -> Value:
        t, dt = _meta(node)
        if dt is None and node.meta.get("val") is not None:
            dt = index_dtype_name(node.meta["val"].dtype)   # an int value (ids, positions, a count)
        if dt is None:
            raise ImportError_(f"{node.target} at {_where(node)} produces a dtype graph.json does not have "
                               f"({node.meta.get('val').dtype if node.meta.get('val') is not None else '?'})")
        if v.is_scalar:
            raise ImportError_(f"{node.target} at {_where(node)}: a constant tensor is not supported")
        if v.dtype != dt:
            v = self.b.cast(v, dt, node.name)
        if not _fits(v.shape, t) and node.name not in self.forced_keepdim and not (
                node.name in self.rows and tuple(v.shape) == (*t, 1)):
            raise ImportError_(f"{node.target} at {_where(node)}: graph shape {list(v.shape)} does not match "
                               f"PyTorch shape {list(t)}")
        return v

    def _op(self, node: Any, key: str, a: dict[str, Any]) -> Any:
        """The graph value(s) of one ATen node (a tuple for multi-output ops); unsupported ops raise."""
        b, name = self.b, node.name
        x = a.get("self", a.get("input", a.get("a")))   # ("a": prims.convert_element_type)
        if key in _MASK_OPS:
            return self._mask_op(node, key, a, x)
        if key in _FILLS:   # a 0-d constant (e.g. masked_fill's value), or a scatter's base of one value
            fill = a.get("s", a.get("fill_value"))
            if isinstance(fill, bool) or not isinstance(fill, (int, float)):
                raise ImportError_(f"{node.target} at {_where(node)}: a non-numeric {key.removeprefix('aten.')}")
            return scalar(float(fill))
        if key in _IOTA:
            return self._iota(node, key, a)
        if key == RAND_KEY:
            return self._rand(node, a)
        if key in SCATTER_OPS:   # an embedding's gradient: scatter_add of the masked values (torch_scatter)
            return map_scatter(b, node, lambda v: self.val(v, node), self.tshape(node))
        if key == "aten.mul" and _meta(node)[1] not in (None, "bool") and any(map(_is_bool, (x, a.get("other")))):
            # training dropout's ``mask * x``: the mask cast to the product's dtype (exact: 0 or 1)
            prod_dt = str(_meta(node)[1])
            lhs, rhs = (b.cast(self.val(v, node), prod_dt, f"{name}_{i}") for i, v in enumerate((x, a["other"])))
            return b.binary("mul", lhs, rhs, name)
        self._no_bool(node, key, a)
        if key in INT_OPS:
            a = self._promote_ints(node, a)
        elif key in _UNARY or key in _BINARY or key in ("aten.pow", "aten.gelu"):
            a = self._ints_to_float(node, a)
        x = a.get("self", a.get("input", a.get("a")))   # ("a": prims.convert_element_type)
        if key in _UNARY:
            return b.unary(_UNARY[key], self.val(x, node), name)
        if key == "aten.gelu":
            op = {"none": "gelu", "tanh": "gelu_tanh"}.get(a.get("approximate") or "none")
            if op is None:
                raise ImportError_(f"gelu approximate={a.get('approximate')!a} at {_where(node)} is not supported")
            return b.unary(op, self.val(x, node), name)
        if key in ("aten.add", "aten.sub", "aten.rsub"):
            return self._add_sub(node, key, a, x)
        if key in _BINARY:
            if a.get("rounding_mode") is not None:
                raise ImportError_(f"{node.target} rounding_mode={a['rounding_mode']!a} at {_where(node)} "
                                   "is not supported")
            return b.binary(_BINARY[key], self.val(x, node), self.val(a["other"], node), name)
        if key == "prims.fma":   # a * b + c (Inductor's decomposition of softmax's backward)
            prod = b.binary("mul", self.val(a["a"], node), self.val(a["b"], node), f"{name}_mul")
            return b.binary("add", prod, self.val(a["c"], node), name)
        if key == "aten.pow":
            return b.binary("pow", self.val(x, node), self.val(a["exponent"], node), name)
        if key in ("aten.clamp", "aten.clamp_min", "aten.clamp_max", "aten.hardtanh"):
            return self._clamp(node, a, x)
        if key in _REDUCE:
            return self._reduce(node, key, a)
        if key in ("aten.softmax", "aten._softmax", "aten.log_softmax", "aten._log_softmax"):
            return self._softmax(node, key, a, x)
        if key in ("aten.layer_norm", "aten.native_layer_norm", "aten.rms_norm"):
            return self._norm(node, key, a)
        if key in ("aten.dropout", "aten.native_dropout", "aten.feature_dropout"):
            if a.get("train"):
                raise ImportError_(f"{node.target} at {_where(node)}: dropout in training mode is not "
                                   "supported (call .eval() first)")
            v = self.val(a["input"], node)
            return (v, None) if key == "aten.native_dropout" else v
        if key in _CASTS:
            _, dt = _meta(node)
            if dt is None:
                raise ImportError_(f"{node.target} at {_where(node)}: cast to a dtype graph.json does not have")
            return b.cast(self.val(a["a"] if key == "prims.convert_element_type" else x, node), dt, name)
        if key in _VIEWS or zero_pad(node):
            return self._view(node, key, x)
        if key in _LAYOUT:
            return self._layout(node, key, a, x)
        if key in CNN_OPS:
            return map_cnn_op(self, node, key, a)
        raise ImportError_(f"unsupported op {node.target} at {_where(node)}")

    def _rand(self, node: Any, a: dict[str, Any]) -> Value:
        """``stitchtune::rand(seed, stream, size)``: ``uniform(seed + stream * RAND_STREAM_STEP, i)`` with
        ``i`` the element's row-major flat index in ``size``, a sum of int32 ``iota``s times strides."""
        b, name = self.b, node.name
        t = tuple(int(d) for d in a["size"])
        stream = a["stream"]
        if math.prod(t) >= 2**31 or isinstance(stream, bool) or not isinstance(stream, int) or not 0 <= stream < 2**16:
            raise ImportError_(f"{node.target} at {_where(node)}: only fewer than 2**31 numbers and streams "
                               "below 2**16 are supported")
        seed = self.val(a["seed"], node)
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

    def _iota(self, node: Any, key: str, a: dict[str, Any]) -> Value:
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
        v = self.b.iota(t, 0, it, node.name if (start, step) == (0, 1) and it == dt else f"{node.name}_i")
        if step != 1:
            v = self.b.binary("mul", v, scalar(float(step)), f"{node.name}_step")
        if start != 0:
            v = self.b.binary("add", v, scalar(float(start)), f"{node.name}_start")
        return v if it == dt else self.b.cast(v, dt, node.name)

    def _promote_ints(self, node: Any, a: dict[str, Any]) -> dict[str, Any]:
        """An int op's arguments as torch promotes them: ints stay ints where every tensor argument is
        an int and every number an integer; otherwise (a float tensor or a fractional number with an
        int tensor) the int tensors are cast to the result's float dtype first."""
        import torch.fx

        tensors = [v for v in a.values() if isinstance(v, torch.fx.Node) and isinstance(self.vals.get(v.name), Value)]
        ints = [v for v in tensors if self.vals[v.name].dtype in ("int32", "int64")]
        if not ints:
            return a
        floats = [v for v in tensors if self.vals[v.name].dtype not in ("int32", "int64", "bool")]
        nums = [v for k, v in a.items() if k not in ("alpha",) and isinstance(v, float) and v != int(v)]
        if not floats and not nums and not any(isinstance(v, float) and not math.isfinite(v) for v in a.values()):
            return a
        return self._ints_to_float(node, a)

    def _ints_to_float(self, node: Any, a: dict[str, Any]) -> dict[str, Any]:
        """``a`` with every int tensor argument cast to float32 (torch's promotion of an int tensor
        read by a float op)."""
        import torch.fx

        out = dict(a)
        for k, v in a.items():
            if isinstance(v, torch.fx.Node) and isinstance(self.vals.get(v.name), Value) \
                    and self.vals[v.name].dtype in ("int32", "int64"):
                name = f"{v.name}_f"
                if name not in self.vals:
                    self.vals[name] = self.b.cast(self.vals[v.name], "float32", name)
                out[k] = _Alias(name)
        return out

    def _no_bool(self, node: Any, key: str, a: dict[str, Any]) -> None:
        """Refuse a bool tensor argument of an arithmetic op (graph.json reads bools only in logical
        ops, ``where``'s condition and casts)."""
        if key in _CASTS or key in _VIEWS or key in _LAYOUT or (key == "aten.sum" and a.get("dtype") is None):
            return   # (a sum of a bool tensor is a count)
        for v in a.values():
            if _is_bool(v):
                raise ImportError_(f"{node.target} at {_where(node)}: reads the bool tensor {v.name!a} "
                                   "(graph.json reads bools only in logical ops, where and cast)")

    def _mask_op(self, node: Any, key: str, a: dict[str, Any], x: Any) -> Value:
        """Comparisons, logical ops on bools, ``where`` and ``masked_fill`` (scalar value)."""
        b, name = self.b, node.name
        if key == "aten.where":
            if a.get("condition") is None or "self" not in a:
                raise ImportError_(f"{node.target} at {_where(node)}: only where(cond, a, b) is supported")
            args = [self.val(a["condition"], node), self.val(a["self"], node), self.val(a["other"], node)]
            if args[0].dtype != "bool" or any(v.dtype == "bool" for v in args[1:]):
                raise ImportError_(f"{node.target} at {_where(node)}: where needs a bool condition and float values")
            return b.elementwise("where", args, name)
        if key == "aten.masked_fill":
            mask, value = self.val(a["mask"], node), self.val(a["value"], node)
            v = self.val(x, node)
            if mask.dtype != "bool" or not value.is_scalar or v.dtype == "bool":
                raise ImportError_(f"{node.target} at {_where(node)}: masked_fill needs a float tensor, a bool "
                                   "mask and a number")
            return b.elementwise("where", [mask, value, v], name)
        if key in _COMPARE:
            args = [self.val(x, node), self.val(a["other"], node)]
            if any(v.dtype == "bool" for v in args):
                raise ImportError_(f"{node.target} at {_where(node)}: comparing bool tensors is not supported")
            return b.elementwise(_COMPARE[key], args, name)
        args = [self.val(x, node)] + ([self.val(a["other"], node)] if "other" in a else [])
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

    def _add_sub(self, node: Any, key: str, a: dict[str, Any], x: Any) -> Value | Padded:
        """``add`` / ``sub`` / ``rsub`` (``rsub(x, y) = y - x``); ``alpha`` multiplies what is added or
        subtracted; an ``add`` of a slice scattered into zeros is :meth:`LayoutOps.add_padded`'s."""
        b, name = self.b, node.name
        alpha = a.get("alpha")
        padded = [self.vals.get(str(getattr(v, "name", ""))) for v in (x, a["other"])]
        if key == "aten.add" and alpha in (None, 1) and any(isinstance(p, Padded) for p in padded):
            lhs, rhs = (p if isinstance(p, Padded) else self.val(v, node) for p, v in zip(padded, (x, a["other"])))
            return self.add_padded(node, lhs, rhs)
        lhs, rhs = self.val(x, node), self.val(a["other"], node)
        if alpha is not None and alpha != 1:
            if key == "aten.rsub":
                lhs = b.binary("mul", lhs, scalar(alpha), f"{name}_alpha")
            else:
                rhs = b.binary("mul", rhs, scalar(alpha), f"{name}_alpha")
        if key == "aten.rsub":
            return b.binary("sub", rhs, lhs, name)
        return b.binary(key.removeprefix("aten."), lhs, rhs, name)

    def _clamp(self, node: Any, a: dict[str, Any], x: Any) -> Value:
        """``clamp`` / ``clamp_min`` / ``clamp_max`` / ``hardtanh`` as ``maximum`` then ``minimum``."""
        b, name = self.b, node.name
        v = self.val(x, node)
        lo = a.get("min", a.get("min_val"))
        hi = a.get("max", a.get("max_val"))
        if lo is not None:
            v = b.binary("maximum", v, self.val(lo, node), f"{name}_lo" if hi is not None else name)
        if hi is not None:
            v = b.binary("minimum", v, self.val(hi, node), name)
        return v

    def _softmax(self, node: Any, key: str, a: dict[str, Any], x: Any) -> Value:
        """``softmax`` / ``log_softmax`` (and their ``_`` forms), with the optional input cast first."""
        b, name = self.b, node.name
        v = self.val(x, node)
        if a.get("dtype") is not None:
            v = b.cast(v, self._dtype(a["dtype"], node), f"{name}_in")
        if a.get("half_to_float"):
            v = b.cast(v, "float32", f"{name}_in")
        return b.softmax(v, self.axes(x, a["dim"], node), name, log_="log_" in key)

    def _norm(self, node: Any, key: str, a: dict[str, Any]) -> Any:
        """``layer_norm`` / ``rms_norm`` (decomposed by the builder); ``native_layer_norm`` gives
        ``(y, mean, rstd)``."""
        b, name = self.b, node.name
        v = self.val(a["input"], node)
        k = len(a["normalized_shape"])
        rt = len(self.tshape(a["input"]))
        axes = self.axes(a["input"], list(range(rt - k, rt)), node)
        w = self.val(a["weight"], node) if a.get("weight") is not None else None
        if key == "aten.rms_norm":
            eps = a.get("eps")
            if eps is None:
                import torch

                eps = torch.finfo(node.meta["val"].dtype).eps
            return b.rms_norm(v, axes, w, float(eps), name)[0]
        bias = self.val(a["bias"], node) if a.get("bias") is not None else None
        y, mean, rstd = b.layer_norm(v, axes, w, bias, float(a["eps"]), name)
        return y if key == "aten.layer_norm" else (y, mean, rstd)

    def _dtype(self, dt: Any, node: Any) -> str:
        name = torch_dtype_name(dt)
        if name is None:
            raise ImportError_(f"{node.target} at {_where(node)}: dtype {dt} is not supported")
        return name

    def _reduce(self, node: Any, key: str, a: dict[str, Any]) -> Any:
        x = a["self"]
        v = self.val(x, node)
        if v.dtype in ("int32", "int64") or (v.dtype == "bool" and key != "aten.sum"):
            raise ImportError_(f"{node.target} at {_where(node)}: reducing a {v.dtype} tensor is not supported "
                               "(a sum of a bool tensor is: a count)")
        if a.get("dtype") is not None:
            v = self.b.cast(v, self._dtype(a["dtype"], node), f"{node.name}_in")
        keep = bool(a.get("keepdim")) or node.name in self.forced_keepdim
        dims = a.get("dim")
        axes = self.axes(x, dims, node)
        op = _REDUCE[key]
        if len(axes) == 1 and node.name in self.unrolled and key == "aten.sum" and tuple(v.shape) == self.tshape(x):
            out = self._unrolled_sum(node, v, axes[0], keep)
        elif axes:
            if len(axes) == len(v.shape):
                keep = True   # graph.json has no rank-0 tensors; (1, ..., 1) broadcasts the same way
            out = self.b.reduce(op, v, axes, keep, node.name)
        else:  # only size-1 dims reduced: the value is unchanged
            out = v
        if key in ("aten.max", "aten.min") and isinstance(dims, int):
            return (out, None)   # (values, indices); indices are not representable
        return out

    def _unrolled_sum(self, node: Any, v: Value, ax: int, keep: bool) -> Value:
        """``sum(v, ax)`` as adds of its slices along axis ``ax`` (one ``slice`` per element, ``reshape``d
        without the axis, added in index order; ``keep``: the sum ``reshape``d back to a 1 there, which
        a ``squeeze`` reading it undoes for free): an element-wise graph where the planner refuses the
        reduction (grouped-query attention's sum of a key's gradient over the heads that share it,
        next to rotary's slices: a slice of a computed tensor may not be reshaped after it is added)."""
        kept = tuple(1 if j == ax else d for j, d in enumerate(v.shape))
        dropped = tuple(d for j, d in enumerate(v.shape) if j != ax) or (1,)
        parts = [self._reshape(self.b.layout("slice", [v], kept, str(v.dtype), f"{node.name}_{i}", axis=ax,
                                             start=i, stop=i + 1), dropped, f"{node.name}_{i}_view")
                 for i in range(v.shape[ax])]
        acc = parts[0]
        for i, part in enumerate(parts[1:]):
            acc = self.b.binary("add", acc, part, f"{node.name}_add{i}" if keep or i < len(parts) - 2 else node.name)
        return self._reshape(acc, kept, node.name) if keep else acc

    def _view(self, node: Any, key: str, x: Any) -> Value:
        """A view, ``clone``/``contiguous``/``alias``/``detach`` or ``expand``: the value itself where it
        broadcasts to the result (no node), else a ``reshape`` (``expand`` is implicit broadcasting)."""
        v = self.val(x, node)
        t_in, t_new = self.tshape(x), self.tshape(node)
        back = self.unreshaped(v, t_new)
        if back is not None:   # a view back to the shape of what v reshapes: that value, no node
            return back
        if getattr(x, "name", None) in self.viewed:   # declared at this view's shape
            return v
        if (getattr(x, "name", None) in self.rows or node.name in self.rows) and len(v.shape) == 2 and \
                tuple(v.shape) in ((*t_new, 1), tuple(t_new)):   # a row vector's [B] <-> [B, 1]: no node
            return v
        if _fits(v.shape, t_new) and (
                key in ("aten.expand", "aten.expand_as")
                or _strip1(t_in) == _strip1(t_new)
                or (x.name in self.forced_keepdim and tuple(v.shape) == tuple(t_new))):
            return v
        if key in ("aten.expand", "aten.expand_as") or math.prod(t_in) != math.prod(t_new):
            raise ImportError_(f"{node.target} at {_where(node)}: {list(t_in)} -> {list(t_new)} (graph shape "
                               f"{list(v.shape)}) is neither a broadcast nor a reshape")
        return self._reframe(x, v, t_in, t_new, node.name, node)
