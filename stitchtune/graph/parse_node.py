"""graph.json, per node: validate one raw node (id, op, attributes, arguments) and infer its result spec.

What :func:`stitchtune.graph.parse.parse_graph` calls for each node: :func:`_parse_node` returns the
:class:`~stitchtune.graph.values.Node`, or None with its problems added (its id to ``scope.failed``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from stitchtune.graph.checks import (
    MAX_ELEMENTS,
    MAX_RANK,
    _check_dtype,
    _check_dups,
    _check_shape,
    _check_name,
    _constant,
    _key_path,
    _Problems,
    _Scope,
    _show,
    _type_name,
)
from stitchtune.graph.values import (
    INPUT_ONLY_DTYPES,
    INT_DTYPES,
    Node,
    TensorSpec,
    broadcast_shapes,
    promote_dtypes,
)
from stitchtune.graph.ops import INDEX_KINDS, OPS, OpInfo
from stitchtune.graph.arg_checks import check_arg_types, promote_ints
from stitchtune.graph.index_checks import index_attributes, index_spec
from stitchtune.graph.scatter_checks import scatter_spec

_NODE_KEYS = ("id", "op", "args", "axes", "keepdims", "to", "axis", "start", "stop", "perm", "shape", "dtype")


@dataclass(frozen=True)
class _NodeListing:
    """The raw node list and the index of each node id in it (for forward-reference and cycle messages)."""

    raw_nodes: list[Any]
    index: dict[str, int]

    @classmethod
    def of(cls, raw_nodes: list[Any]) -> "_NodeListing":
        index: dict[str, int] = {}
        for i, rn in enumerate(raw_nodes):
            if isinstance(rn, dict) and isinstance(rn.get("id"), str) and rn["id"] not in index:
                index[rn["id"]] = i
        return cls(raw_nodes, index)


def _depends_on(start: str, target: str, listing: _NodeListing) -> bool:
    """Whether raw node ``start`` (transitively) reads ``target``, ignoring validity."""
    stack, seen = [start], set()
    while stack:
        cur = stack.pop()
        if cur in seen or cur not in listing.index:
            continue
        seen.add(cur)
        args = listing.raw_nodes[listing.index[cur]].get("args")
        if not isinstance(args, list):
            continue
        for a in args[:8]:
            if isinstance(a, str):
                if a == target:
                    return True
                stack.append(a)
    return False


@dataclass(frozen=True)
class _Args:
    """The validated arguments of one node: tensor names and constants, the specs of the tensors."""

    values: tuple[str | float, ...]
    specs: tuple[TensorSpec, ...]
    ok: bool  # every argument is valid (and at least one is a tensor)


def _parse_node(rn: Any, i: int, path: str, scope: _Scope, listing: _NodeListing, p: _Problems) -> Node | None:
    """Node ``i`` of the file, or None (its problems added to ``p``, its id to ``scope.failed``)."""
    before = len(p.items)
    if not isinstance(rn, dict):
        p.add(path, f"must be an object {{id, op, args, ...}}, got {_type_name(rn)}")
        return None
    _check_dups(rn, path, p)
    for k in rn:
        if k not in _NODE_KEYS:
            p.add(_key_path(path, k), f"unknown key (expected {', '.join(_NODE_KEYS)})")
    nid = rn.get("id")
    id_ok = _node_id(rn, path, scope, p)
    info = _node_op(rn, path, p)
    if "dtype" in rn and (info is None or info.kind != "iota"):
        p.add(f"{path}.dtype", f"only iota takes 'dtype'{'; ' + info.name + ' does not' if info else ''}")
    if info is not None and info.kind == "iota":
        return _parse_iota(rn, path, nid, id_ok, scope, p, before)
    keepdims, to = _node_attributes(rn, path, info, p)
    attrs = index_attributes(rn, path, info, p)
    args = _node_args(rn, i, path, nid, id_ok, info, scope, listing, p)
    axis: int | None = None
    start = stop = 0
    if info is not None and info.kind in INDEX_KINDS:
        names = tuple(a for a in args.values if isinstance(a, str))
        res = index_spec(info, path, args.specs, names, attrs, p) if args.ok else None
        shape, dtype = (res.shape, res.dtype) if res is not None else (None, None)
        if res is not None:
            axis, start, stop = res.axis, res.start, res.stop
        axes: tuple[int, ...] = ()
    elif info is not None and info.kind == "scatter":
        names = tuple(a for a in args.values if isinstance(a, str))
        shape, dtype = scatter_spec(rn, path, args.specs, names, p) if args.ok else (None, None)
        axes = ()
    else:
        shape, dtype, axes = _node_spec(rn, path, info, args, keepdims, to, p)
    if (len(p.items) > before or shape is None or dtype is None or not id_ok or info is None
            or not isinstance(nid, str)):
        if isinstance(nid, str):
            scope.failed.add(nid)
        return None
    perm = tuple(rn["perm"]) if info.name == "transpose" else ()
    return Node(id=nid, op=info.name, args=args.values, axes=axes, keepdims=keepdims, to=to,
                shape=shape, dtype=dtype, axis=axis, start=start, stop=stop, perm=perm)


def _node_id(rn: dict[str, Any], path: str, scope: _Scope, p: _Problems) -> bool:
    """Whether the node's ``id`` is a valid, new name (then it is entered in ``scope.defined_at``)."""
    nid = rn.get("id")
    if "id" not in rn:
        p.add(f"{path}.id", "missing")
    elif _check_name(nid, f"{path}.id", p, "node id"):
        if nid in scope.defined_at:
            p.add(f"{path}.id", f"duplicate name {_show(nid)} (already defined at {scope.defined_at[nid]})")
        else:
            scope.defined_at[nid] = path
            return True
    return False


def _node_op(rn: dict[str, Any], path: str, p: _Problems) -> OpInfo | None:
    """The op table entry of the node's ``op``, or None when it is missing or unknown."""
    op = rn.get("op")
    if "op" not in rn:
        p.add(f"{path}.op", "missing")
    elif not isinstance(op, str):
        p.add(f"{path}.op", f"must be a string, got {_type_name(op)}")
    elif op not in OPS:
        import difflib

        near = difflib.get_close_matches(op[:64], list(OPS), n=3)
        hint = f" (did you mean {' or '.join(map(repr, near))}?)" if near else ""
        p.add(f"{path}.op", f"unknown op {_show(op)}{hint}")
    else:
        return OPS[op]
    return None


def _parse_iota(rn: dict[str, Any], path: str, nid: Any, id_ok: bool, scope: _Scope, p: _Problems,
                before: int) -> Node | None:
    """An ``iota`` node: no arguments, a ``shape``, an ``axis`` of it and an int ``dtype`` (default int64)."""
    for k in ("axes", "keepdims", "to", "start", "stop", "perm"):
        if k in rn:
            p.add(f"{path}.{k}", f"iota does not take {k!r} (it takes shape, axis and dtype)")
    if rn.get("args", []) != []:
        p.add(f"{path}.args", f"iota takes no arguments (give shape, axis and dtype), got {_show(rn.get('args'))}")
    shape = _check_shape(rn["shape"], f"{path}.shape", p) if "shape" in rn else None
    if "shape" not in rn:
        p.add(f"{path}.shape", "missing: iota needs a shape")
    dtype = rn.get("dtype", "int64")
    if dtype not in INT_DTYPES:
        p.add(f"{path}.dtype", f"iota's dtype must be int32 or int64, got {_show(dtype)}")
    axis = rn.get("axis")
    if "axis" not in rn:
        p.add(f"{path}.axis", "missing: iota needs the axis it counts along")
    elif shape is not None and (isinstance(axis, bool) or not isinstance(axis, int) or not -len(shape) <= axis < len(shape)):
        p.add(f"{path}.axis", f"must be an integer in [{-len(shape)}, {len(shape)}) for shape {list(shape)}, "
                              f"got {_show(axis)}")
    if len(p.items) > before or shape is None or not id_ok or not isinstance(nid, str) or not isinstance(axis, int):
        if isinstance(nid, str):
            scope.failed.add(nid)
        return None
    return Node(id=nid, op="iota", args=(), shape=shape, dtype=str(dtype), axis=axis % len(shape))


def _node_attributes(rn: dict[str, Any], path: str, info: OpInfo | None, p: _Problems) -> tuple[bool, str | None]:
    """``(keepdims, to)``: only reductions take ``axes``/``keepdims``, only cast takes (and needs) ``to``."""
    is_reduce = info is not None and info.kind == "reduce"
    is_cast = info is not None and info.kind == "cast"
    if info is not None:
        if not is_reduce:
            for k in ("axes", "keepdims"):
                if k in rn:
                    p.add(f"{path}.{k}", f"only reductions take {k!r}; {info.name} does not")
        if not is_cast and "to" in rn:
            p.add(f"{path}.to", f"only cast takes 'to'; {info.name} does not")
        for k, ops in (("perm", ("transpose",)), ("shape", ("reshape", "expand", "iota", "scatter_add"))):
            if k in rn and info.name not in ops:
                p.add(f"{path}.{k}", f"only {' and '.join(ops) if len(ops) < 3 else ', '.join(ops[:-1]) + ' and ' + ops[-1]} "
                                     f"take{'s' if len(ops) == 1 else ''} {k!r}; "
                                     f"{info.name} does not")
            elif k not in rn and info.name in ops:
                need = {"perm": "a permutation of the dims", "shape": "a target shape"}[k] if info.kind != "scatter" \
                    else "the table's shape"
                p.add(f"{path}.{k}", f"missing: {info.name} needs {need}")
    keepdims = False
    if is_reduce and "keepdims" in rn:
        if not isinstance(rn["keepdims"], bool):
            p.add(f"{path}.keepdims", f"must be true or false, got {_show(rn['keepdims'])}")
        else:
            keepdims = rn["keepdims"]
    to = None
    if is_cast:
        if "to" not in rn:
            p.add(f"{path}.to", "missing: cast needs a target dtype")
        else:
            to = _check_dtype(rn["to"], f"{path}.to", p)
            if to in INPUT_ONLY_DTYPES:
                p.add(f"{path}.to", f"cast cannot make {to} (a graph input dtype only: kernels compute in float32)")
                to = None
    return keepdims, to


def _node_args(rn: dict[str, Any], i: int, path: str, nid: Any, id_ok: bool, info: OpInfo | None,
               scope: _Scope, listing: _NodeListing, p: _Problems) -> _Args:
    """The node's ``args``: tensors defined earlier, or constants where the op is binary."""
    values: list[str | float] = []
    specs: list[TensorSpec] = []
    raw_args = rn.get("args")
    if "args" not in rn:
        p.add(f"{path}.args", "missing")
        return _Args((), (), False)
    if not isinstance(raw_args, list):
        p.add(f"{path}.args", f"must be a list, got {_type_name(raw_args)}")
        return _Args((), (), False)
    if info is not None and info.arity == 0 and not 2 <= len(raw_args) <= 8:
        p.add(f"{path}.args", f"wrong arity: {info.name} takes 2 to 8 arguments, got {len(raw_args)}")
        return _Args((), (), False)
    if info is not None and info.arity and len(raw_args) != info.arity:
        p.add(f"{path}.args", f"wrong arity: {info.name} takes {info.arity} argument(s), got {len(raw_args)}")
        return _Args((), (), False)
    ok = True
    for j, a in enumerate(raw_args[:8]):
        apath = f"{path}.args[{j}]"
        if isinstance(a, str):
            spec = _tensor_arg(a, apath, i, nid, id_ok, scope, listing, p)
            if spec is None:
                ok = False
            else:
                values.append(a)
                specs.append(spec)
        elif isinstance(a, (int, float)) and not isinstance(a, bool):
            c = _constant(a, apath, p)
            if c is None:
                ok = False
            elif info is not None and (info.kind not in ("binary", "ternary") or info.arg_type(j) in ("b", "i")):
                what = {"b": "a bool tensor", "i": "an int tensor"}.get(info.arg_type(j), "a tensor argument")
                p.add(apath, f"{info.name} needs {what}, not a constant")
                ok = False
            else:
                values.append(c)
        else:
            p.add(apath, f"must be a tensor name or a number, got {_type_name(a)}")
            ok = False
    if ok and raw_args and not specs:
        p.add(f"{path}.args", "needs at least one tensor argument (all constants)")
        ok = False
    if ok and info is not None:
        ok = check_arg_types(path, info, values, specs, p)
    if ok and info is not None and info.kind in ("gather", "scatter") and isinstance(values[-1], str) \
            and specs[-1].dtype in INT_DTYPES and not scope.defined_at.get(values[-1], "").startswith("inputs"):
        p.add(f"{path}.args[1]", f"{info.name} needs an int32/int64 graph input as its index; {_show(values[-1])} is "
                                 "computed (index with the input it is a view of)")
        ok = False
    return _Args(tuple(values), tuple(specs), ok)


def _tensor_arg(a: str, apath: str, i: int, nid: Any, id_ok: bool, scope: _Scope, listing: _NodeListing,
                p: _Problems) -> TensorSpec | None:
    """The spec of tensor argument ``a`` of node ``i``, or None (a problem is added unless ``a``'s own
    definition already failed): itself, a later node (a cycle or a forward reference), or unknown."""
    if a in scope.specs:
        return scope.specs[a]
    if a in scope.failed:
        return None  # already reported where it was defined
    if a == nid:
        p.add(apath, f"cycle: node {_show(a)} reads itself")
    elif a in listing.index and listing.index[a] > i:
        p.cycle_checks += 1
        if id_ok and p.cycle_checks <= 32 and _depends_on(a, nid, listing):
            p.add(apath, f"cycle: {_show(a)} (nodes[{listing.index[a]}]) depends on {_show(nid)}")
        else:
            p.add(apath, f"forward reference to {_show(a)} (defined later at "
                         f"nodes[{listing.index[a]}]); nodes must be in topological order")
    else:
        p.add(apath, f"unknown tensor {_show(a)}")
    return None


def _node_spec(rn: dict[str, Any], path: str, info: OpInfo | None, args: _Args, keepdims: bool,
               to: str | None, p: _Problems) -> tuple[tuple[int, ...] | None, str | None, tuple[int, ...]]:
    """``(shape, dtype, axes)`` inferred from the op and valid arguments (shape None when impossible)."""
    if info is None or not args.ok or not args.specs:
        if info is not None and info.kind == "reduce" and "axes" not in rn:
            p.add(f"{path}.axes", "missing: reductions need a list of axes")
        return None, None, ()
    first = args.specs[0]
    if info.kind in ("binary", "ternary"):
        shape = broadcast_shapes(*(s.shape for s in args.specs))
        if shape is None:
            shown = " and ".join(str(list(s.shape)) for s in args.specs)
            p.add(f"{path}.args", f"impossible broadcast: shapes {shown}")
        elif math.prod(shape) > MAX_ELEMENTS:
            p.add(path, f"too large: result has {math.prod(shape)} elements (limit {MAX_ELEMENTS})")
            shape = None
        return shape, _result_dtype(info, args), ()
    if info.kind == "reduce":
        axes = _check_axes(rn.get("axes"), "axes" in rn, first.rank, f"{path}.axes", p)
        if axes is None:
            return None, first.dtype, ()
        if first.dtype == "bool":  # a count of true elements, float32: exact while it stays below 2**24
            counted = math.prod(first.shape[d] for d in axes)
            if counted > 2**24:
                p.add(f"{path}.axes", f"a reduce_sum of a bool tensor counts in float32, exact up to 2**24 "
                                      f"elements; these axes reduce {counted}")
                return None, None, ()
            first = TensorSpec(first.shape, "float32")
        if keepdims:
            return tuple(1 if d in axes else s for d, s in enumerate(first.shape)), first.dtype, axes
        shape = tuple(s for d, s in enumerate(first.shape) if d not in axes)
        if not shape:
            p.add(path, "reduces to a scalar; set \"keepdims\": true")
            return None, first.dtype, axes
        return shape, first.dtype, axes
    if info.kind == "cast":
        return first.shape, to, ()
    if info.kind == "layout":
        return _layout_shape(rn, path, info, first, p), first.dtype, ()
    return first.shape, _result_dtype(info, args), ()


def _layout_shape(rn: dict[str, Any], path: str, info: OpInfo, first: TensorSpec,
                  p: _Problems) -> tuple[int, ...] | None:
    """The result shape of ``transpose`` (``perm`` must be a permutation of ``range(rank)``) or
    ``reshape`` (``shape`` must be a valid shape of the same element count); None with a problem."""
    if info.name == "transpose":
        v = rn.get("perm")
        if "perm" not in rn:
            return None  # reported by _node_attributes
        if (not isinstance(v, list) or any(isinstance(a, bool) or not isinstance(a, int) for a in v)
                or sorted(v) != list(range(first.rank))):
            p.add(f"{path}.perm", f"must be a permutation of 0..{first.rank - 1} (the argument has rank "
                                  f"{first.rank}), got {_show(v)}")
            return None
        return tuple(first.shape[a] for a in v)
    if "shape" not in rn:
        return None
    shape = _check_shape(rn["shape"], f"{path}.shape", p)
    if info.name == "expand":
        return _expand_shape(rn, path, first, shape, p)
    if shape is not None and math.prod(shape) != first.numel:
        p.add(f"{path}.shape", f"reshape to {list(shape)} ({math.prod(shape)} elements) from "
                               f"{list(first.shape)} ({first.numel} elements): the element counts differ")
        return None
    return shape


def _expand_shape(rn: dict[str, Any], path: str, first: TensorSpec, shape: tuple[int, ...] | None,
                  p: _Problems) -> tuple[int, ...] | None:
    """``expand``'s target ``shape`` (numpy ``broadcast_to``: right-aligned, every dim of the argument
    equal to the target's or 1; leading dims may be added), or None with one problem naming the node."""
    if shape is None:
        return None
    who = f"expand {_show(rn.get('id'))}"
    grows = len(shape) >= first.rank and all(
        d == t or d == 1 for d, t in zip(first.shape, shape[len(shape) - first.rank:]))
    if not grows:
        p.add(f"{path}.shape", f"{who} cannot expand {list(first.shape)} to {list(shape)}: only dims of size 1 "
                               "may grow (right-aligned, as numpy broadcast_to)")
        return None
    if math.prod(shape) > MAX_ELEMENTS:
        p.add(f"{path}.shape", f"{who}: too large: result has {math.prod(shape)} elements (limit {MAX_ELEMENTS})")
        return None
    return shape


def _result_dtype(info: OpInfo, args: _Args) -> str:
    """``bool`` for a bool-valued op, else the promoted dtype of the float tensor arguments."""
    if info.result in ("bool", "float32"):
        return info.result
    numeric = [s.dtype for s in args.specs if s.dtype != "bool"]
    if info.ints and any(d in INT_DTYPES for d in numeric):
        return promote_ints(numeric)
    return promote_dtypes(numeric)


def _check_axes(v: Any, present: bool, rank: int, path: str, p: _Problems) -> tuple[int, ...] | None:
    if not present:
        p.add(path, "missing: reductions need a list of axes")
        return None
    if not isinstance(v, list) or not v:
        p.add(path, f"must be a non-empty list of integers, got {_show(v)}")
        return None
    if len(v) > MAX_RANK:
        p.add(path, f"too many axes ({len(v)}) for a rank-{rank} tensor")
        return None
    out: list[int] = []
    ok = True
    for j, a in enumerate(v):
        if isinstance(a, bool) or not isinstance(a, int):
            p.add(f"{path}[{j}]", f"axis must be an integer, got {_show(a)}")
            ok = False
        elif not -rank <= a < rank:
            p.add(f"{path}[{j}]", f"reduce axis {a} out of range for rank {rank}")
            ok = False
        else:
            n = a % rank
            if n in out:
                p.add(f"{path}[{j}]", f"duplicate axis {a}")
                ok = False
            out.append(n)
    return tuple(sorted(out)) if ok else None
