"""Shared graph.json builder for the importers (torch, onnx).

Contract
--------
* :class:`GraphBuilder` accumulates inputs and nodes of one graph.json and tracks each value's
  shape and dtype itself (numpy broadcasting, reductions, casts, dtype promotion as in
  :mod:`stitchtune.graph.parse`), so importers can check a value against their framework's metadata
  while they walk it.
* Every name it emits is made by :class:`NameAllocator`: it matches
  :data:`stitchtune.graph.parse.NAME_RE` (``[A-Za-z_][A-Za-z0-9_]{0,63}``) and is unique, whatever the
  framework name was. Framework names are never pasted anywhere unsanitised.
* Composite ops (layer norm, RMS norm, softmax, log-softmax) are decomposed into graph.json
  primitives here, once, for both importers.
* :meth:`GraphBuilder.build` drops nodes that feed no output and returns the graph.json dict;
  :meth:`GraphBuilder.graph` validates it with :func:`stitchtune.graph.parse.parse_graph`.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from stitchtune.errors import StitchtuneError
from stitchtune.graph.ops import OPS
from stitchtune.graph.parse import (
    DTYPES,
    FLOAT_DTYPES,
    INT_DTYPES,
    Graph,
    broadcast_shapes,
    parse_graph,
    promote_dtypes,
)

__all__ = ["GraphBuilder", "ImportError_", "NameAllocator", "Value", "sanitize_name"]

log = logging.getLogger(__name__)

_BAD_CHARS = re.compile(r"[^A-Za-z0-9_]")
_MAX_NAME = 64


class ImportError_(StitchtuneError):
    """A model or function cannot be imported into graph.json (unsupported op, bad shape spec, ...)."""


def sanitize_name(raw: str, fallback: str = "t") -> str:
    """``raw`` mapped into ``[A-Za-z_][A-Za-z0-9_]{0,63}`` (not yet unique)."""
    s = _BAD_CHARS.sub("_", str(raw)).strip("_") or fallback
    if s[0].isdigit():
        s = "_" + s
    return s[:_MAX_NAME]


class NameAllocator:
    """Hands out unique, sanitised identifiers."""

    def __init__(self) -> None:
        self._used: set[str] = set()

    def take(self, raw: str, fallback: str = "t") -> str:
        base = sanitize_name(raw, fallback)
        name, k = base, 1
        while name in self._used:
            suffix = f"_{k}"
            name = base[: _MAX_NAME - len(suffix)] + suffix
            k += 1
        self._used.add(name)
        return name


@dataclass(frozen=True)
class Value:
    """A graph value: a tensor name (with shape and dtype) or a scalar constant (``dtype`` None)."""

    ref: str | float
    shape: tuple[int, ...] = ()
    dtype: str | None = None

    @property
    def is_scalar(self) -> bool:
        return self.dtype is None


def scalar(x: float) -> Value:
    return Value(ref=float(x))


_FOLD: dict[str, Callable[[float, float], float]] = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "pow": lambda a, b: a ** b,
    "maximum": max,
    "minimum": min,
}


class GraphBuilder:
    """Builds one graph.json dict; see the module docstring."""

    def __init__(self, name: str) -> None:
        self.names = NameAllocator()
        self.name = sanitize_name(name, "graph")
        self._inputs: dict[str, dict[str, Any]] = {}
        self._nodes: list[dict[str, Any]] = []
        self._transposed: dict[str, tuple[Value, tuple[int, ...]]] = {}   # transpose node -> (source, perm)

    # ------------------------------------------------------------------ inputs and primitives
    def add_input(self, preferred: str, shape: Sequence[int], dtype: str) -> Value:
        if dtype not in DTYPES:
            raise ImportError_(f"input {preferred!a}: dtype {dtype!a} is not one of {', '.join(DTYPES)}")
        name = self.names.take(preferred, "input")
        shape = tuple(int(d) for d in shape)
        self._inputs[name] = {"shape": list(shape), "dtype": dtype}
        return Value(name, shape, dtype)

    def is_input(self, v: Value) -> bool:
        """True if ``v`` is one of this graph's inputs (not computed by a node)."""
        return not v.is_scalar and v.ref in self._inputs

    def _emit(self, name: str, op: str, args: Sequence[Value], shape: tuple[int, ...], dtype: str, /,
              **attrs: Any) -> Value:
        nid = self.names.take(name, "n")
        node: dict[str, Any] = {"id": nid, "op": op, "args": [a.ref for a in args]}
        node.update(attrs)
        self._nodes.append(node)
        return Value(nid, shape, dtype)

    def unary(self, op: str, x: Value, name: str) -> Value:
        if x.is_scalar:
            raise ImportError_(f"{op} of a scalar constant is not supported (value {name!a})")
        return self._emit(name, op, [x], x.shape, x.dtype or "float32")

    def binary(self, op: str, a: Value, b: Value, name: str) -> Value:
        if a.is_scalar and b.is_scalar:
            return scalar(_FOLD[op](float(a.ref), float(b.ref)))
        if op == "pow" and b.is_scalar and float(b.ref) == 2.0:
            return self.unary("square", a, name)   # x**2: cheaper than powf, same value
        return self.elementwise(op, [a, b], name)

    def elementwise(self, op: str, args: Sequence[Value], name: str) -> Value:
        """``op`` (any element-wise graph op: binary, comparison, logical, ``where``, ``clamp``) on
        ``args`` with numpy broadcasting; a bool result for comparisons and logical ops, else the
        promoted dtype of the float tensor arguments (float32 when there is none)."""
        shapes = [v.shape for v in args if not v.is_scalar]
        if not shapes:
            raise ImportError_(f"{op} of constants only is not supported (value {name!a})")
        shape = broadcast_shapes(*shapes)
        if shape is None:
            raise ImportError_(f"{op}: shapes {', '.join(map(str, shapes))} do not broadcast (value {name!a})")
        numeric = [v.dtype for v in args if not v.is_scalar and v.dtype is not None and v.dtype != "bool"]
        if OPS[op].result in ("bool", "float32"):
            dtype = OPS[op].result
        elif OPS[op].ints and numeric and all(d in INT_DTYPES for d in numeric):
            dtype = "int64" if "int64" in numeric else "int32"   # int ops on ints (graph-format.md)
        else:
            dtype = promote_dtypes(numeric) if numeric else "float32"
        return self._emit(name, op, args, shape, dtype)

    def iota(self, shape: Sequence[int], axis: int, dtype: str, name: str) -> Value:
        """An ``iota`` node: each element's coordinate along ``axis`` of ``shape`` (int32 / int64)."""
        shape = tuple(int(d) for d in shape)
        return self._emit(name, "iota", [], shape, dtype, shape=list(shape), axis=int(axis), dtype=dtype)

    def layout(self, op: str, x: Sequence[Value], result_shape: Sequence[int], dtype: str, name: str, /,
               **attrs: Any) -> Value:
        """A layout node (``transpose``, ``reshape``, ``slice``, ``concat``, ``gather``) whose result
        shape and dtype the importer computed from its framework's metadata; the graph validation
        checks them again."""
        if op not in OPS:
            raise ImportError_(f"graph.json has no {op!a} op (value {name!a})")
        return self._emit(name, op, list(x), tuple(int(d) for d in result_shape), dtype, **attrs)

    def transpose(self, x: Value, perm: Sequence[int], name: str) -> Value:
        """``x`` with its axes permuted (result axis ``i`` is ``x``'s axis ``perm[i]``). A transpose of a
        transpose this builder made is one transpose of the first one's source (the composed
        permutation), or that source itself when they cancel (a region input read in memory order,
        then permuted back by the model: no node at all)."""
        if x.is_scalar:
            raise ImportError_(f"transpose of a scalar constant is not supported (value {name!a})")
        p = tuple(int(a) for a in perm)
        if sorted(p) != list(range(len(x.shape))):
            raise ImportError_(f"transpose: {list(p)} is not a permutation of {len(x.shape)} axes (value {name!a})")
        src, q = self._transposed.get(str(x.ref), (x, tuple(range(len(x.shape)))))
        p = tuple(q[a] for a in p)
        if p == tuple(range(len(p))):
            return src
        out = self._emit(name, "transpose", [src], tuple(src.shape[a] for a in p), src.dtype or "float32",
                         perm=list(p))
        self._transposed[str(out.ref)] = (src, p)
        return out

    def reduce(self, op: str, x: Value, axes: Sequence[int], keepdims: bool, name: str) -> Value:
        if x.is_scalar:
            raise ImportError_(f"{op} of a scalar constant is not supported (value {name!a})")
        rank = len(x.shape)
        norm = sorted({a % rank if -rank <= a < rank else _bad_axis(a, rank, name) for a in axes})
        if keepdims:
            shape = tuple(1 if i in norm else d for i, d in enumerate(x.shape))
        else:
            shape = tuple(d for i, d in enumerate(x.shape) if i not in norm)
        dtype = "float32" if x.dtype == "bool" else (x.dtype or "float32")   # a bool sum is a float32 count
        return self._emit(name, op, [x], shape, dtype, axes=norm, keepdims=bool(keepdims))

    def cast(self, x: Value, to: str, name: str) -> Value:
        if to not in (*FLOAT_DTYPES, "bool", *INT_DTYPES):
            raise ImportError_(f"cast to {to!a} is not supported (graph.json casts to: "
                               f"{', '.join((*FLOAT_DTYPES, 'bool', *INT_DTYPES))})")
        if x.is_scalar or x.dtype == to:
            return x
        return self._emit(name, "cast", [x], x.shape, to, to=to)

    def logical_not(self, x: Value, name: str) -> Value:
        if x.is_scalar:
            raise ImportError_(f"logical_not of a scalar constant is not supported (value {name!a})")
        return self._emit(name, "logical_not", [x], x.shape, "bool")

    # ------------------------------------------------------------------ composites
    def layer_norm(self, x: Value, axes: Sequence[int], weight: Value | None, bias: Value | None,
                   eps: float, name: str) -> tuple[Value, Value, Value]:
        """(y, mean, rstd) with mean/rstd in keepdims form, like ``aten.native_layer_norm``."""
        mean = self.reduce("reduce_mean", x, axes, True, f"{name}_mean")
        xc = self.binary("sub", x, mean, f"{name}_xc")
        sq = self.binary("mul", xc, xc, f"{name}_sq")
        var = self.reduce("reduce_mean", sq, axes, True, f"{name}_var")
        ve = self.binary("add", var, scalar(eps), f"{name}_ve")
        rstd = self.unary("rsqrt", ve, f"{name}_rstd")
        y = self.binary("mul", xc, rstd, f"{name}_xn" if (weight or bias) else name)
        if weight is not None:
            y = self.binary("mul", y, weight, f"{name}_xg" if bias is not None else name)
        if bias is not None:
            y = self.binary("add", y, bias, name)
        return y, mean, rstd

    def rms_norm(self, x: Value, axes: Sequence[int], weight: Value | None, eps: float,
                 name: str) -> tuple[Value, Value]:
        """(y, rstd): ``y = x * rsqrt(mean(x*x) + eps) [* weight]``."""
        sq = self.binary("mul", x, x, f"{name}_sq")
        ms = self.reduce("reduce_mean", sq, axes, True, f"{name}_ms")
        me = self.binary("add", ms, scalar(eps), f"{name}_me")
        rstd = self.unary("rsqrt", me, f"{name}_rstd")
        y = self.binary("mul", x, rstd, f"{name}_xn" if weight is not None else name)
        if weight is not None:
            y = self.binary("mul", y, weight, name)
        return y, rstd

    def softmax(self, x: Value, axes: Sequence[int], name: str, log_: bool = False) -> Value:
        """Numerically stable (log-)softmax over ``axes``."""
        m = self.reduce("reduce_max", x, axes, True, f"{name}_max")
        xs = self.binary("sub", x, m, f"{name}_shift")
        e = self.unary("exp", xs, f"{name}_exp")
        s = self.reduce("reduce_sum", e, axes, True, f"{name}_sum")
        if log_:
            ls = self.unary("log", s, f"{name}_logsum")
            return self.binary("sub", xs, ls, name)
        return self.binary("div", e, s, name)

    # ------------------------------------------------------------------ output
    def build(self, outputs: Sequence[Value]) -> dict[str, Any]:
        """The graph.json dict for ``outputs`` (duplicates dropped, dead nodes removed)."""
        outs: list[str] = []
        for v in outputs:
            if v.is_scalar:
                raise ImportError_(f"an output is the constant {v.ref!r}; graph.json outputs must be tensors")
            if v.ref not in outs:
                outs.append(str(v.ref))
        live = set(outs)
        kept: list[dict[str, Any]] = []
        for node in reversed(self._nodes):
            if node["id"] in live:
                kept.append(node)
                live.update(a for a in node["args"] if isinstance(a, str))
        kept.reverse()
        for node in kept:
            node["args"] = [a if isinstance(a, str) else _json_number(a) for a in node["args"]]
        return {"name": self.name, "inputs": dict(self._inputs), "nodes": kept, "outputs": outs}

    def graph(self, outputs: Sequence[Value]) -> Graph:
        return parse_graph(self.build(outputs))


def _json_number(x: float) -> float | int:
    x = float(x)
    if math.isfinite(x) and x == int(x) and abs(x) < 2**53:
        return int(x)
    return x


def _bad_axis(a: int, rank: int, name: str) -> int:
    raise ImportError_(f"reduction axis {a} is out of range for rank {rank} (value {name!a})")


# ---------------------------------------------------------------------------- CLI spec parsing
_SPEC_NAME = re.compile(r"[^\s=,]+")


def parse_shapes(text: str | None) -> dict[str, tuple[int, ...]]:
    """``"x=16384x1024,gamma=1024"`` -> ``{"x": (16384, 1024), "gamma": (1024,)}``.

    Raises :class:`ImportError_` listing every malformed item.
    """
    out: dict[str, tuple[int, ...]] = {}
    problems: list[str] = []
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        name, eq, dims = item.partition("=")
        name = name.strip()
        if not eq or not _SPEC_NAME.fullmatch(name):
            problems.append(f"--shapes: {item!a} is not NAME=DIMxDIM...")
            continue
        try:
            shape = tuple(int(d) for d in dims.lower().split("x"))
        except ValueError:
            problems.append(f"--shapes: {item!a}: dimensions must be integers joined by 'x'")
            continue
        if not shape or any(d <= 0 for d in shape):
            problems.append(f"--shapes: {item!a}: dimensions must be positive")
            continue
        if name in out:
            problems.append(f"--shapes: {name!a} is given twice")
            continue
        out[name] = shape
    if problems:
        raise ImportError_(problems=problems)
    return out


def parse_dtypes(text: str | None, names: Sequence[str], default: str = "float32",
                 allowed: Sequence[str] = FLOAT_DTYPES) -> dict[str, str]:
    """``"bfloat16"`` (all inputs) or ``"x=bfloat16,gamma=float32"`` or a mix -> dtype per name, each
    one of ``allowed``; :class:`ImportError_` lists every problem."""
    per: dict[str, str] = {}
    problems: list[str] = []
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        name, eq, dt = item.partition("=")
        if not eq:
            name, dt = "", name
        dt = dt.strip()
        if dt not in allowed:
            problems.append(f"--dtype: {dt!a} is not one of {', '.join(allowed)}")
        elif name and name.strip() not in names:
            problems.append(f"--dtype: {name.strip()!a} is not an input (inputs: {', '.join(names)})")
        elif name:
            per[name.strip()] = dt
        else:
            default = dt
    if problems:
        raise ImportError_(problems=problems)
    return {n: per.get(n, default) for n in names}
