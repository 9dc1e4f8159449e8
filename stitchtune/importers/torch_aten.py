"""PyTorch import, second half: walk a captured fx graph and map each ATen op onto graph.json ops.

:class:`_Walker` reads the :class:`_Captured` graph that :mod:`stitchtune.importers.torch_import`
captured and emits graph.json nodes through a :class:`~stitchtune.importers.builder.GraphBuilder`;
each node is mapped by its handler in :mod:`stitchtune.importers.torch_aten_ops`' registry (whose op
tables are re-exported here); the supported-op contract is in
:mod:`stitchtune.importers.torch_import`'s docstring. Every problem raises
:class:`~stitchtune.importers.builder.ImportError_` naming the op and its source location.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from stitchtune.importers.builder import GraphBuilder, ImportError_, Value, scalar
from stitchtune.importers.torch_aten_ops import (  # noqa: F401  (re-exported: the op tables)
    _BINARY,
    _CASTS,
    _COMPARE,
    _FILLS,
    _IGNORED,
    _IOTA,
    _LOGICAL,
    _MASK_OPS,
    _REDUCE,
    _UNARY,
    _VIEWS,
    INT_OPS,
    RAND_KEY,
    RAND_STREAM_STEP,
    SUPPORTED_OPS,
    _is_bool,
    map_op,
)
from stitchtune.importers.torch_cnn import dead, inplace_problem
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
from stitchtune.importers.torch_layout import _LAYOUT, LayoutOps


# ---------------------------------------------------------------------------- the walk
@dataclass
class _Captured:
    """A captured fx graph (built by ``torch_import._capture``): what :class:`_Walker` walks."""

    gm: Any                      # torch.fx.GraphModule
    bindings: dict[str, tuple[str, Any]]   # placeholder name -> ("user", index) | ("param", (fqn, tensor))
    method: str


@dataclass(frozen=True)
class _Alias:
    """An argument replaced by another value of the walk (an int tensor promoted to float32)."""

    name: str


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
                if key in _IGNORED or key == "aten.sym_size" or dead(node):   # (a size: read from the meta shapes)
                    continue
                if key.endswith("_") and not key.endswith("__"):
                    key = self._inplace(node, key)
                if not hasattr(node.target, "_schema"):
                    raise ImportError_(f"unsupported op {node.target} at {_where(node)}")
                res = map_op(self, node, key, _bind(node))
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

    def promote_ints(self, node: Any, a: dict[str, Any]) -> dict[str, Any]:
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
        return self.ints_to_float(node, a)

    def ints_to_float(self, node: Any, a: dict[str, Any]) -> dict[str, Any]:
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

    def no_bool(self, node: Any, key: str, a: dict[str, Any]) -> None:
        """Refuse a bool tensor argument of an arithmetic op (graph.json reads bools only in logical
        ops, ``where``'s condition and casts)."""
        if key in _CASTS or key in _VIEWS or key in _LAYOUT or (key == "aten.sum" and a.get("dtype") is None):
            return   # (a sum of a bool tensor is a count)
        for v in a.values():
            if _is_bool(v):
                raise ImportError_(f"{node.target} at {_where(node)}: reads the bool tensor {v.name!a} "
                                   "(graph.json reads bools only in logical ops, where and cast)")

    def graph_dtype(self, dt: Any, node: Any) -> str:
        name = torch_dtype_name(dt)
        if name is None:
            raise ImportError_(f"{node.target} at {_where(node)}: dtype {dt} is not supported")
        return name

    def reduce_node(self, node: Any, key: str, a: dict[str, Any]) -> Any:
        x = a["self"]
        v = self.val(x, node)
        if v.dtype in ("int32", "int64") or (v.dtype == "bool" and key != "aten.sum"):
            raise ImportError_(f"{node.target} at {_where(node)}: reducing a {v.dtype} tensor is not supported "
                               "(a sum of a bool tensor is: a count)")
        if a.get("dtype") is not None:
            v = self.b.cast(v, self.graph_dtype(a["dtype"], node), f"{node.name}_in")
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

    def view_node(self, node: Any, key: str, x: Any) -> Value:
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
