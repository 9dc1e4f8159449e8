"""Validation of the index ops ``slice``, ``concat`` and ``gather`` (their attributes and result specs).

Contract (graph.json forms)
---------------------------
* ``{"op": "slice", "args": ["x"], "axis": A, "start": S, "stop": E}``: step 1; ``A`` in
  ``[-rank, rank)`` (normalised to non-negative); ``S`` and ``E`` integers, a negative one counts from
  the end as in Python (``S + dim``), ``E`` may be ``null``: the axis's end (Python's ``x[1:]``, in a
  dynamic graph the end whatever the extent), then ``0 <= S < E <= dim`` is required (an empty or out-of-range
  slice is an error, never clipped). Result: ``x``'s shape with ``E - S`` along ``A``, ``x``'s dtype.
* ``{"op": "concat", "args": ["a", "b", ...], "axis": A}``: two to eight tensors of the same rank,
  equal dims except along ``A`` (no broadcasting inside concat), all float (one promoted dtype),
  all bool or all of one int dtype (index maps of int graph inputs). Result: dims summed along ``A``.
* ``{"op": "gather", "args": ["table", "idx"], "axis": 0}``: ``axis`` 0 only; ``idx`` an
  ``int32``/``int64`` graph input; result shape ``idx.shape + table.shape[1:]`` (rank at most
  :data:`~stitchtune.graph.checks.MAX_RANK`), ``table``'s dtype (float). Out-of-range indices are a
  defined result (a zero row) and a flagged error at run time, not a validation error.
* ``{"op": "gather_elements", "args": ["x", "idx"], "axis": A}`` (``torch.gather``, ONNX
  ``GatherElements``): ``A`` in ``[-rank, rank)``; ``x`` float, ``idx`` an ``int32``/``int64`` graph
  input of the same rank with ``idx.shape[d] <= x.shape[d]`` for ``d != A``; result ``idx.shape``,
  ``x``'s dtype; ``out[p] = x[p with p[A] := idx[p]]``, 0 (and a run-time error flag) where
  ``idx[p]`` is out of ``[0, x.shape[A])``.
* Only these ops take ``axis``; only ``slice`` takes ``start``/``stop``; every problem is one
  ``"<json path>: <what>"`` line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from stitchtune.graph.checks import MAX_ELEMENTS, MAX_RANK, _Problems, _show
from stitchtune.graph.ops import INDEX_KINDS, OpInfo
from stitchtune.graph.values import INT_DTYPES, TensorSpec, promote_dtypes

__all__ = ["IndexResult", "index_attributes", "index_spec", "INDEX_KEYS"]

INDEX_KEYS = ("axis", "start", "stop")
#: a slice's ``stop`` given as ``null``: the axis's end (resolved to the dim by the node's validation)
STOP_END = 2**63 - 1


def _int(v: Any, path: str, p: _Problems) -> int | None:
    if isinstance(v, bool) or not isinstance(v, int):
        p.add(path, f"must be an integer, got {_show(v)}")
        return None
    return v


def index_attributes(rn: dict[str, Any], path: str, info: OpInfo | None,
                     p: _Problems) -> tuple[int | None, int | None, int | None]:
    """The raw ``(axis, start, stop)`` of a node (None where absent or invalid); a problem for each
    attribute an op does not take or misses."""
    kind = info.kind if info is not None else None
    if info is not None:
        takes = {"axis"} if kind in INDEX_KINDS else set()
        if kind == "slice":
            takes |= {"start", "stop"}
        for k in INDEX_KEYS:
            if k in rn and k not in takes:
                p.add(f"{path}.{k}", f"only {'slice' if k != 'axis' else 'slice, concat, gather and gather_elements'} "
                                     f"take{'s' if k != 'axis' else ''} {k!r}; {info.name} does not")
    if kind not in INDEX_KINDS:
        return None, None, None
    out: list[int | None] = []
    for k in ("axis", "start", "stop") if kind == "slice" else ("axis",):
        if k not in rn:
            p.add(f"{path}.{k}", f"missing: {info.name} needs {k!r}")  # type: ignore[union-attr]
            out.append(None)
        elif k == "stop" and rn[k] is None:
            out.append(STOP_END)
        else:
            out.append(_int(rn[k], f"{path}.{k}", p))
    out += [None] * (3 - len(out))
    return out[0], out[1], out[2]


@dataclass(frozen=True)
class IndexResult:
    """What an index op yields: its result spec, the axis it works on, and (slice) the kept range."""

    shape: tuple[int, ...]
    dtype: str
    axis: int
    start: int = 0   # slice: first kept index of ``axis`` (negative values resolved)
    stop: int = 0    # slice: one past the last kept index


def _axis(axis: int | None, rank: int, path: str, p: _Problems) -> int | None:
    if axis is None:
        return None
    if not -rank <= axis < rank:
        p.add(f"{path}.axis", f"axis {axis} out of range for rank {rank}")
        return None
    return axis % rank


def index_spec(info: OpInfo, path: str, specs: tuple[TensorSpec, ...], arg_names: tuple[str, ...],
               attrs: tuple[int | None, int | None, int | None], p: _Problems) -> IndexResult | None:
    """The result of a valid index op; None (problems added to ``p``) otherwise."""
    axis, start, stop = attrs
    if info.kind == "slice":
        return _slice_spec(path, specs[0], axis, start, stop, p)
    if info.kind == "concat":
        return _concat_spec(path, specs, axis, p)
    if info.kind == "gather_elements":
        return _gather_elements_spec(path, specs, arg_names, axis, p)
    return _gather_spec(path, specs, arg_names, axis, p)


def _slice_spec(path: str, x: TensorSpec, axis: int | None, start: int | None, stop: int | None,
                p: _Problems) -> IndexResult | None:
    a = _axis(axis, x.rank, path, p)
    if a is None or start is None or stop is None:
        return None
    dim = x.shape[a]
    s = start + dim if start < 0 else start
    e = dim if stop == STOP_END else stop + dim if stop < 0 else stop
    if not 0 <= s < e <= dim:
        p.add(path, f"slice [{start}:{'' if stop == STOP_END else stop}] of axis {a} (dim {dim}) is empty or out of range "
                    f"(needs 0 <= start < stop <= dim after negative values count from the end)")
        return None
    shape = tuple(e - s if k == a else d for k, d in enumerate(x.shape))
    return IndexResult(shape, x.dtype, a, s, e)


def _concat_spec(path: str, specs: tuple[TensorSpec, ...], axis: int | None,
                 p: _Problems) -> IndexResult | None:
    if len(specs) < 2:
        p.add(f"{path}.args", f"concat needs two or more tensors, got {len(specs)}")
        return None
    rank = specs[0].rank
    if any(s.rank != rank for s in specs):
        p.add(f"{path}.args", "concat needs tensors of the same rank, got shapes "
                              + " and ".join(str(list(s.shape)) for s in specs))
        return None
    a = _axis(axis, rank, path, p)
    if a is None:
        return None
    for j, s in enumerate(specs[1:], 1):
        if any(d != e for k, (d, e) in enumerate(zip(s.shape, specs[0].shape)) if k != a):
            p.add(f"{path}.args[{j}]", f"shape {list(s.shape)} differs from {list(specs[0].shape)} "
                                       f"outside axis {a} (concat does not broadcast)")
            return None
    kinds = {s.dtype if s.dtype in ("bool", *INT_DTYPES) else "float" for s in specs}
    if len(kinds) > 1:
        p.add(f"{path}.args", "concat needs all float, all bool or all int tensors of one int dtype, got "
                              + ", ".join(s.dtype for s in specs))
        return None
    shape = tuple(sum(s.shape[a] for s in specs) if k == a else d for k, d in enumerate(specs[0].shape))
    dtype = kinds.pop() if kinds != {"float"} else promote_dtypes(s.dtype for s in specs)
    return IndexResult(shape, dtype, a)


def _gather_dtypes(op: str, what: str, path: str, specs: tuple[TensorSpec, ...], names: tuple[str, ...],
                   p: _Problems) -> bool:
    """Whether a gather's source is float and its index int32/int64 (a problem naming the argument if not;
    parse checks that an int index is a graph input)."""
    src, idx = specs
    if idx.dtype not in INT_DTYPES:
        p.add(f"{path}.args[1]", f"{op} needs an int32/int64 graph input as its index, {_show(names[1])} is {idx.dtype}")
        return False
    if src.dtype not in ("float32", "float16", "bfloat16"):
        p.add(f"{path}.args[0]", f"{op} needs a float {what}, {_show(names[0])} is {src.dtype}")
        return False
    return True


def _gather_spec(path: str, specs: tuple[TensorSpec, ...], names: tuple[str, ...], axis: int | None,
                 p: _Problems) -> IndexResult | None:
    table, idx = specs
    if axis is None:
        return None
    if axis not in (0, -table.rank):
        p.add(f"{path}.axis", f"gather takes axis 0 only (rows of the table), got {axis}")
        return None
    if not _gather_dtypes("gather", "table", path, specs, names, p):
        return None
    shape = tuple(idx.shape) + tuple(table.shape[1:])
    if len(shape) > MAX_RANK:
        p.add(path, f"result rank {len(shape)} exceeds {MAX_RANK}")
        return None
    if math.prod(shape) > MAX_ELEMENTS:
        p.add(path, f"too large: result has {math.prod(shape)} elements (limit {MAX_ELEMENTS})")
        return None
    return IndexResult(shape, table.dtype, 0)


def _gather_elements_spec(path: str, specs: tuple[TensorSpec, ...], names: tuple[str, ...], axis: int | None,
                          p: _Problems) -> IndexResult | None:
    x, idx = specs
    a = _axis(axis, x.rank, path, p)
    if a is None:
        return None
    if not _gather_dtypes("gather_elements", "tensor", path, specs, names, p):
        return None
    if idx.rank != x.rank or any(i > d for k, (i, d) in enumerate(zip(idx.shape, x.shape)) if k != a):
        p.add(f"{path}.args[1]", f"gather_elements needs an index of the same rank as {_show(names[0])} "
                                 f"{list(x.shape)}, no larger outside axis {a}; got {list(idx.shape)}")
        return None
    return IndexResult(tuple(idx.shape), x.dtype, a)
