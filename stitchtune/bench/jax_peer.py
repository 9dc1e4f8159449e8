"""The JAX peer of ``stitchtune bench``: a :class:`~stitchtune.graph.parse.Graph` as one ``jax.jit``
function, with the semantics of :func:`stitchtune.graph.reference.run_reference` and the generated
kernels (see :mod:`stitchtune.bench.peers` for the rules every peer follows).

Contract:

* ``jax_function(graph)`` returns ``f(**arrays) -> tuple``: the ``jax.jit``-compiled graph, outputs in
  ``graph.outputs`` order and dtypes, the inputs (numpy or JAX arrays) keyed by graph input name.
  Raises ``ImportError`` without jax.
* Int values are exact as in the reference: each keeps its graph dtype (int32 arithmetic wraps at 32
  bits), int constants of int ops are exact integers, a float -> int ``cast`` truncates, saturates and
  gives 0 for NaN. JAX holds int64 only with ``jax_enable_x64``: for a graph with an int64 value
  (:func:`uses_int64`) ``f`` traces and runs inside :func:`x64_scope` (thread-local, the process's
  setting is left as it was), and :func:`jax_inputs` puts its inputs on the device there (an int64
  array put outside it would already be int32).
* ``uniform`` is :func:`uniform_jax`: the same bits as the reference, the kernels and the torch peer.

jax is optional: it is imported inside the functions that need it. Nothing from the graph file reaches
generated source here: node ids are only dictionary keys.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from stitchtune.bench.peer_ops import SIXTEEN_BIT, NodeOp, mask_ops, node_args
from stitchtune.bench.peer_scatter import jax_scatter_ops

if TYPE_CHECKING:
    from stitchtune.graph.parse import Graph, Node

__all__ = ["jax_function", "jax_inputs", "uniform_jax", "uses_int64", "x64_scope"]

_M32 = 0xFFFFFFFF


def _jax_dtype(name: str) -> Any:
    import jax.numpy as jnp

    return {"float32": jnp.float32, "float16": jnp.float16, "bfloat16": jnp.bfloat16, "bool": jnp.bool_,
            "int32": jnp.int32, "int64": jnp.int64, "float64": jnp.float64}[name]


def uses_int64(graph: Graph) -> bool:
    """True when an input or a node of ``graph`` is int64, or an input float64 (its JAX peer needs
    ``jax_enable_x64``)."""
    return any(s.dtype in ("int64", "float64") for _, s in graph.inputs) or any(n.dtype == "int64" for n in graph.nodes)


@contextlib.contextmanager
def x64_scope(on: bool = True) -> Iterator[None]:
    """``jax_enable_x64`` inside the block when ``on`` (``jax.enable_x64``, thread-local, restored on
    exit; on a JAX without it, the config flag, restored on exit); nothing when not ``on``."""
    if not on:
        yield
        return
    import jax

    scope = getattr(jax, "enable_x64", None)
    if scope is not None:
        with scope(True):
            yield
        return
    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", before)


def jax_inputs(graph: Graph, arrays: Mapping[str, Any]) -> dict[str, Any]:
    """``arrays`` (numpy) put on JAX's default device as :func:`jax_function` of ``graph`` reads them:
    inside :func:`x64_scope` when the graph :func:`uses_int64`, so int64 inputs stay int64."""
    import jax

    with x64_scope(uses_int64(graph)):
        return {n: jax.device_put(a) for n, a in arrays.items()}


def _uint32(x: Any) -> Any:
    """The low 32 bits of int array ``x`` as uint32 (two's complement)."""
    import jax
    import jax.numpy as jnp

    if x.dtype == jnp.int64:
        return (x & _M32).astype(jnp.uint32)
    return jax.lax.bitcast_convert_type(x.astype(jnp.int32), jnp.uint32)


def uniform_jax(seed: Any, counter: Any) -> Any:
    """:func:`stitchtune.graph.ops.uniform` on int JAX arrays (broadcast): float32 in ``[0, 1)``, the
    very bits of the reference, the kernels and ``uniform_torch``. ``seed`` is an int64 array (or
    int32, sign-extended as the reference does), ``counter`` int32 or int64 (its low 32 bits count);
    uint32 arithmetic wraps as the kernel's ``unsigned int``."""
    import jax.numpy as jnp

    lo = _uint32(seed)
    hi = _uint32(seed >> 32) if seed.dtype == jnp.int64 else jnp.where(seed < 0, jnp.uint32(_M32), jnp.uint32(0))
    h = _uint32(counter) * jnp.uint32(0x9E3779B1) + lo
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ hi
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    h = h ^ (h >> 16)
    return (h >> 8).astype(jnp.float32) * jnp.float32(2.0**-24)


def _jax_tables() -> tuple[dict, dict, dict]:
    import jax
    import jax.numpy as jnp
    from jax.scipy.special import erf

    unary = {
        "neg": jnp.negative,
        "abs": jnp.abs,
        "exp": jnp.exp,
        "log": jnp.log,
        "sqrt": jnp.sqrt,
        "rsqrt": jax.lax.rsqrt,
        "reciprocal": jnp.reciprocal,
        "square": jnp.square,
        "tanh": jnp.tanh,
        "sin": jnp.sin,
        "cos": jnp.cos,
        "sigmoid": jax.nn.sigmoid,
        "relu": jax.nn.relu,
        "erf": erf,
        "gelu": lambda x: jax.nn.gelu(x, approximate=False),
        "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
        "silu": jax.nn.silu,
    }
    binary = {
        "add": jnp.add,
        "sub": jnp.subtract,
        "mul": jnp.multiply,
        "div": jnp.divide,
        "pow": jnp.power,
        "maximum": jnp.maximum,
        "minimum": jnp.minimum,
    }
    reduce = {
        "reduce_sum": jnp.sum,
        "reduce_mean": jnp.mean,
        "reduce_max": jnp.max,
        "reduce_min": jnp.min,
    }
    return unary, binary, reduce


def _jax_masks() -> dict[str, Callable[..., Any]]:
    """Comparisons, logical ops, where and clamp on float32 arrays whose bools are 0.0 / 1.0."""
    import jax.numpy as jnp

    def f(x: Any) -> Any:
        return x.astype(jnp.float32)

    return mask_ops(f, lambda c, a, b: jnp.where(c != 0, a, b),
                     lambda x, lo, hi: jnp.minimum(jnp.maximum(x, lo), hi))


def _jax_index_ops() -> dict[str, NodeOp]:
    """slice, concat, gather, gather_elements, uniform and iota on JAX arrays, as the reference."""
    import jax
    import jax.numpy as jnp

    def gather(node: Node, args: list[Any]) -> Any:  # out-of-range index: a zero row, as the reference
        table, idx = args
        ok = (idx >= 0) & (idx < table.shape[0])
        rows = table[jnp.clip(idx, 0, table.shape[0] - 1)]
        return rows * ok.reshape(ok.shape + (1,) * (table.ndim - 1)).astype(jnp.float32)

    def gather_elements(node: Node, args: list[Any]) -> Any:  # take_along_axis; out-of-range index: 0, as the reference
        x, idx = args
        ax = int(node.axis or 0)
        part = x[tuple(slice(0, d) if k != ax else slice(None) for k, d in enumerate(idx.shape))]
        ok = (idx >= 0) & (idx < x.shape[ax])
        return jnp.take_along_axis(part, jnp.clip(idx, 0, x.shape[ax] - 1), axis=ax) * ok.astype(x.dtype)

    def iota(node: Node, args: list[Any]) -> Any:
        shape, ax = tuple(node.shape), int(node.axis or 0)
        line = jnp.arange(shape[ax], dtype=_jax_dtype(node.dtype))
        return jnp.broadcast_to(line.reshape([-1 if d == ax else 1 for d in range(len(shape))]), shape)

    return {"slice": lambda node, args: jax.lax.slice_in_dim(args[0], node.start, node.stop, axis=node.axis),
            "concat": lambda node, args: jnp.concatenate(args, axis=node.axis),
            "gather": gather, "gather_elements": gather_elements, "iota": iota,
            "uniform": lambda node, args: uniform_jax(args[0], args[1])}


def _jax_layout_ops() -> dict[str, NodeOp]:
    """cast (bools as 0.0 / 1.0, ints as int32 / int64 as the reference's ``cast_value``, 16-bit types
    rounded to and computed on in float32), transpose, reshape and expand on JAX arrays."""
    import jax.numpy as jnp

    def float_to_int(x: Any, dt: Any) -> Any:  # graph/int_ops.float_to_int: truncate, NaN -> 0, saturate
        info = jnp.iinfo(dt)
        t = jnp.trunc(x)
        lim = -float(info.min)   # 2**(bits - 1), exact in float32
        v = jnp.where(jnp.isfinite(t) & (t >= -lim) & (t < lim), t, 0.0).astype(dt)
        return jnp.where(t >= lim, jnp.asarray(info.max, dt), jnp.where(t < -lim, jnp.asarray(info.min, dt), v))

    def cast(node: Node, args: list[Any]) -> Any:
        to, x = node.to or node.dtype, args[0]
        if to == "bool":
            return (x != 0).astype(jnp.float32)
        is_int = jnp.issubdtype(x.dtype, jnp.integer)
        if to in ("int32", "int64"):   # int -> int keeps the low bits; float -> int truncates
            return x.astype(_jax_dtype(to)) if is_int else float_to_int(x, _jax_dtype(to))
        if is_int:   # an int value made float: the nearest float32 (then rounded to a 16-bit type)
            x = x.astype(jnp.float32)
        return x.astype(_jax_dtype(to)).astype(jnp.float32) if to in SIXTEEN_BIT else x

    return {"cast": cast,
            "transpose": lambda node, args: jnp.transpose(args[0], node.perm),
            "reshape": lambda node, args: jnp.reshape(args[0], node.shape),
            "expand": lambda node, args: jnp.broadcast_to(args[0], node.shape)}


def jax_function(graph: Graph) -> Callable[..., tuple]:
    """``f(**arrays) -> tuple``: ``graph`` in JAX, ``jax.jit``-compiled, run inside :func:`x64_scope`
    when the graph :func:`uses_int64` (see the module docstring). Raises ``ImportError`` without jax."""
    import jax
    import jax.numpy as jnp

    unary, binary, reduce = _jax_tables()
    masks = _jax_masks()
    node_ops = {**_jax_index_ops(), **_jax_layout_ops(), **jax_scatter_ops()}
    names = [n for n, _ in graph.inputs]
    nodes = graph.nodes
    outputs = graph.outputs
    out_dtypes = [_jax_dtype(graph.spec(o).dtype) for o in outputs]
    f32 = jnp.float32

    x64 = uses_int64(graph)

    def scalar(x: Any) -> Any:  # weakly typed python floats could promote differently; ints stay weak
        return jnp.asarray(x, dtype=f32) if isinstance(x, float) else x

    def is_int(v: Any) -> bool:
        return bool(jnp.issubdtype(v.dtype, jnp.integer))

    def run_node(node: Node, env: dict[str, Any]) -> Any:
        args = [scalar(a) for a in node_args(node, env, is_int)]
        op = node.op
        if op in unary:
            return unary[op](args[0])
        if op in binary:
            return binary[op](args[0], args[1])
        if op in reduce:
            return reduce[op](args[0], axis=tuple(node.axes), keepdims=bool(node.keepdims))
        if op in masks:
            return masks[op](*args)
        if op in node_ops:
            return node_ops[op](node, args)
        raise ValueError(f"peers: op {op!r} has no jax implementation")

    def body(*arrays: Any) -> tuple:
        env: dict[str, Any] = {n: a if jnp.issubdtype(a.dtype, jnp.integer) else a.astype(f32)
                               for n, a in zip(names, arrays)}
        for node in nodes:
            env[node.id] = run_node(node, env)
        return tuple(env[o].astype(dt) for o, dt in zip(outputs, out_dtypes))

    jitted = jax.jit(body)

    def call(**arrays: Any) -> tuple:
        return jitted(*[arrays[n] for n in names])

    def call_x64(**arrays: Any) -> tuple:   # entering the scope costs every call: only where needed
        with x64_scope():
            return jitted(*[arrays[n] for n in names])

    return call_x64 if x64 else call


