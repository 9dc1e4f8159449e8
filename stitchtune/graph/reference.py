"""numpy reference executor: the ground truth every generated kernel is checked against.

Contract
--------
* :func:`run_reference(graph, inputs)` computes every node in float64 and returns
  ``{output name: array}`` with each array cast to that output's dtype (bfloat16 arrays use
  ``ml_dtypes.bfloat16``). Inputs are checked first (missing/extra names, wrong shape or dtype ->
  :class:`~stitchtune.errors.StitchtuneError` naming every offending input).
* Rounding: intermediates stay in float64 (the kernels keep them in fp32 registers or buffers);
  only an explicit ``cast`` node rounds its value to the target dtype, and outputs are rounded when
  returned. Constants are used as given.
* :func:`random_inputs(graph, seed)` draws standard-normal inputs cast to their dtypes, with no exact
  zeros (``bool`` inputs: true with probability 3/4); the same seed gives the same arrays.
* ``bool`` tensors are 0.0 / 1.0 in float64 (a ``bool`` input array is ``numpy.bool_``); a ``cast``
  to ``bool`` gives ``x != 0`` (NaN is true), as in numpy.
* Int values (inputs, ``iota``, int ops, casts to int) stay int64, exact; an int32 result is wrapped
  to 32 bits (two's complement) after each node, so int arithmetic wraps at its dtype's width; int
  constants are exact integers. Casts to int: :func:`cast_value`.
* ``int32``/``int64`` inputs and the index maps of them stay int64 (exact at any value). A ``cast``
  of one to a float dtype is defined as the nearest float32 (round to nearest even, what kernels do
  at the load: ``(float)v``), then rounded to the cast's dtype: exact for ``|v| < 2**24``; beyond,
  float32 keeps 24 significant bits, float16 is infinite anyway, and bfloat16 may differ by one ulp
  from a direct conversion (a double rounding, e.g. ``2**25 + 2**17 + 1`` gives ``2**25``, not
  ``2**25 + 2**18``). A ``cast`` to ``bool`` is ``v != 0``, exact (a non-zero int never converts to
  0.0). Int inputs not used as gather indices are drawn as 0 / 1 (mask-like) by :func:`random_inputs`.
* :func:`numpy_dtype(name)` maps ``float32``/``float16``/``bfloat16``/``bool`` to numpy dtypes; ml_dtypes is imported
  only for ``bfloat16`` (:func:`bfloat16_dtype`), so float32/float16 work never loads it.
* Both refuse (:class:`StitchtuneError` with the numbers), before allocating, a graph whose reference
  would need more than :data:`HOST_MEMORY_FRACTION` of this host's physical memory
  (:func:`check_host_memory`): a valid graph may hold up to 64 GiB of inputs and outputs, and the
  reference keeps a float64 copy of every tensor.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Mapping

import numpy as np

from stitchtune.errors import GraphError, StitchtuneError
from stitchtune.graph.parse import DTYPES, INT_DTYPES, Graph
from stitchtune.graph.int_ops import float_to_int
from stitchtune.graph.ops import OPS

__all__ = ["numpy_dtype", "bfloat16_dtype", "run_reference", "cast_value", "random_inputs", "check_inputs", "check_host_memory",
           "reference_bytes", "host_memory_bytes", "HOST_MEMORY_FRACTION"]

log = logging.getLogger(__name__)

#: filled on first use: ``bfloat16`` imports ml_dtypes (0.6 s), which a float32 graph never needs
_NP_DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bool": np.dtype(np.bool_),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
    "float64": np.dtype(np.float64),
}


def bfloat16_dtype() -> np.dtype:
    """``ml_dtypes.bfloat16`` as a numpy dtype; ml_dtypes is imported here, when a bfloat16 tensor is involved."""
    import ml_dtypes

    dt: np.dtype = np.dtype(ml_dtypes.bfloat16)
    return dt


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype for a graph dtype name; :class:`GraphError` for anything else."""
    try:
        return _NP_DTYPES[name]
    except (KeyError, TypeError):
        if name == "bfloat16":
            dt = _NP_DTYPES["bfloat16"] = bfloat16_dtype()
            return dt
        raise GraphError(problems=[f"unsupported dtype {name!r} (supported: {', '.join(DTYPES)})"]) \
            from None


HOST_MEMORY_FRACTION = 0.75


def host_memory_bytes() -> int | None:
    """Physical memory of this host in bytes, or None where the platform does not say."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def reference_bytes(graph: Graph) -> int:
    """Host bytes :func:`random_inputs` + :func:`run_reference` hold at once: the inputs in their
    dtypes plus a float64 copy of every input and every node result (all are kept to the end)."""
    return sum(s.nbytes + 8 * s.numel for _, s in graph.inputs) + sum(8 * n.spec.numel for n in graph.nodes)


def check_host_memory(graph: Graph) -> None:
    """Raise :class:`StitchtuneError` giving both numbers when :func:`reference_bytes` exceeds
    :data:`HOST_MEMORY_FRACTION` of :func:`host_memory_bytes` (nothing is checked when unknown)."""
    total = host_memory_bytes()
    if not total:
        return
    need = reference_bytes(graph)
    if need > HOST_MEMORY_FRACTION * total:
        raise StitchtuneError(
            f"graph {graph.name!a} is too large for this host: its numpy reference needs about {need} bytes "
            f"({need / 2**30:.1f} GiB) of host memory, this host has {total} bytes ({total / 2**30:.1f} GiB) "
            f"and stitchtune uses at most {HOST_MEMORY_FRACTION:.0%} of it")


def check_inputs(graph: Graph, inputs: Mapping[str, np.ndarray]) -> None:
    """Raise :class:`StitchtuneError` listing every missing, extra or mis-shaped/typed input."""
    problems: list[str] = []
    expected = dict(graph.inputs)
    for name, spec in graph.inputs:
        if name not in inputs:
            problems.append(f"input {name!r}: missing (expected shape {list(spec.shape)}, "
                            f"dtype {spec.dtype})")
            continue
        arr = inputs[name]
        if not isinstance(arr, np.ndarray):
            problems.append(f"input {name!r}: not an array")
            continue
        if tuple(arr.shape) != spec.shape:
            problems.append(f"input {name!r}: shape {list(arr.shape)}, expected {list(spec.shape)}")
        if arr.dtype != numpy_dtype(spec.dtype):
            problems.append(f"input {name!r}: dtype {arr.dtype}, expected {spec.dtype}")
    for name in inputs:
        if name not in expected:
            problems.append(f"input {ascii(name)}: not an input of graph {graph.name!r}")
    if problems:
        raise StitchtuneError(problems=problems)


def run_reference(graph: Graph, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Evaluate ``graph`` on ``inputs`` in float64; outputs cast to their dtypes (see module doc)."""
    check_inputs(graph, inputs)
    check_host_memory(graph)
    env: dict[str, np.ndarray] = {  # int inputs (gather indices) stay int64: exact at any value
        name: np.asarray(inputs[name]).astype(np.int64 if spec.dtype in INT_DTYPES else np.float64)
        for name, spec in graph.inputs
    }
    with np.errstate(all="ignore"):  # inf/nan are legitimate results (e.g. log of 0)
        for node in graph.nodes:
            info = OPS[node.op]
            args: list[Any] = [env[a] if isinstance(a, str) else float(a) for a in node.args]
            if info.ints and any(isinstance(a, np.ndarray) and a.dtype.kind == "i" for a in args):
                args = [np.int64(int(a)) if isinstance(a, float) else a for a in args]  # exact int constants
            if info.kind == "iota":
                val = info.np_fn(node.shape, node.axis)
            elif info.kind == "reduce":
                val = info.np_fn(args[0], axis=node.axes, keepdims=node.keepdims)
            elif info.kind == "cast":
                val = cast_value(args[0], node.to or "float32")
            elif node.op == "transpose":
                val = np.transpose(args[0], node.perm)
            elif node.op == "reshape":
                val = np.reshape(args[0], node.shape)
            elif node.op == "expand":
                val = np.broadcast_to(args[0], node.shape)
            elif info.kind == "slice":
                val = info.np_fn(args[0], axis=node.axis, start=node.start, stop=node.stop)
            elif info.kind == "scatter":
                val = info.np_fn(*args, shape=node.shape)
            elif info.kind in ("concat", "gather", "gather_elements"):
                val = info.np_fn(*args, axis=node.axis)
            else:
                val = info.np_fn(*args)
            val = np.asarray(val, dtype=np.int64 if node.dtype in INT_DTYPES else np.float64)
            if node.dtype == "int32":  # int32 arithmetic wraps at 32 bits (two's complement)
                val = val.astype(np.int32).astype(np.int64)
            if val.shape != node.shape:  # a bug in graph/parse.py's inference, not a user error
                raise AssertionError(f"{node.id}: shape {val.shape} != inferred {node.shape}")
            env[node.id] = val
        out = {o: env[o].astype(numpy_dtype(graph.spec(o).dtype)) for o in graph.outputs}
    return out


def cast_value(x: np.ndarray, to: str) -> np.ndarray:
    """A ``cast`` of reference value ``x`` (int64 for an int tensor, float64 otherwise) to dtype ``to``,
    as kernels do it (see the module docstring): int -> float through float32; int -> int keeps the low
    bits (int64 -> int32 wraps); float -> int rounds to float32, then truncates toward zero, NaN
    giving 0 and values beyond the int range the nearest limit (CUDA's saturating conversion);
    anything -> bool is ``x != 0``; bool -> int is 0 / 1."""
    if to in INT_DTYPES:
        if x.dtype.kind == "i":
            return x.astype(numpy_dtype(to)).astype(np.int64)
        return float_to_int(x.astype(np.float32), to).astype(np.int64)
    src = x.astype(np.float32) if x.dtype.kind == "i" and to != "bool" else x  # int: via float32
    return np.asarray(src != 0 if to == "bool" else src).astype(numpy_dtype(to)).astype(np.float64)


#: ops whose argument (first argument for pow and for div's denominator: second) must be positive
#: for the result to be finite; an input fed to one of them directly is drawn positive
_POSITIVE_ARG = {"log": (0,), "sqrt": (0,), "rsqrt": (0,), "reciprocal": (0,), "pow": (0,), "div": (1,)}


def positive_inputs(graph: Graph) -> set[str]:
    """Inputs that feed a domain-restricted op directly (log, sqrt, rsqrt, reciprocal, pow base,
    div denominator): random values for them are drawn positive, so that the reference is finite and
    a check against it can tell a right kernel from a wrong one."""
    names = {n for n, _ in graph.inputs}
    out: set[str] = set()
    for node in graph.nodes:
        for i in _POSITIVE_ARG.get(node.op, ()):
            a = node.args[i] if i < len(node.args) else None
            if isinstance(a, str) and a in names:
                out.add(a)
    return out


def gather_bounds(graph: Graph) -> dict[str, int]:
    """For each int input: the number of rows of the smallest table it indexes (``gather_elements``: the
    extent of its axis; ``scatter_add``: the rows of its result table; valid indices are below)."""
    out: dict[str, int] = {}
    for node in graph.nodes:
        if node.op in ("gather", "gather_elements", "scatter_add"):
            table, idx = node.tensor_args  # both are tensors (checked by the parser)
            rows = node.shape[0] if node.op == "scatter_add" else graph.spec(table).shape[node.axis or 0]
            out[idx] = min(out.get(idx, rows), rows)
    return out


def random_inputs(graph: Graph, seed: int) -> dict[str, np.ndarray]:
    """Standard-normal inputs in each input's dtype, never exactly zero, deterministic in ``seed``
    (int inputs: uniform valid gather indices, see :func:`gather_bounds`).

    Inputs in :func:`positive_inputs` get ``|N(0, 1)| + 0.5`` instead."""
    check_host_memory(graph)
    rng = np.random.default_rng(seed)
    positive = positive_inputs(graph)
    out: dict[str, np.ndarray] = {}
    bounds = gather_bounds(graph)
    for name, spec in graph.inputs:
        if spec.dtype in INT_DTYPES:  # gather indices: uniform over the table's rows
            out[name] = rng.integers(0, bounds.get(name, 2), spec.shape).astype(numpy_dtype(spec.dtype))
            continue
        if spec.dtype == "bool":
            out[name] = rng.random(spec.shape, dtype=np.float32) < np.float32(0.75)
            continue
        a = rng.standard_normal(spec.shape, dtype=np.float32)
        a[a == 0] = 0.5
        if name in positive:
            a = np.abs(a) + np.float32(0.5)
        arr = a.astype(numpy_dtype(spec.dtype))
        arr[arr == 0] = 0.5  # values that underflow in the narrow dtype
        out[name] = arr
    return out
