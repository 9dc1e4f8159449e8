"""The JAX peer of ``stitchtune bench``: a :class:`~stitchtune.graph.parse.Graph` as one ``jax.jit``
function, with the semantics of :func:`stitchtune.graph.reference.run_reference` and the generated
kernels (see :mod:`stitchtune.bench.peers` for the rules every peer follows).

Contract: ``jax_function(graph)`` returns the ``jax.jit``-compiled ``f(**arrays) -> tuple`` of outputs
in ``graph.outputs`` order, the inputs keyed by graph input name. Raises ``ImportError`` without jax.

jax is optional: it is imported inside the functions that need it. Nothing from the graph file reaches
generated source here: node ids are only dictionary keys.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from stitchtune.bench.peer_ops import SIXTEEN_BIT, NodeOp, mask_ops

if TYPE_CHECKING:
    from stitchtune.graph.parse import Graph, Node

__all__ = ["jax_function"]


def _jax_dtype(name: str) -> Any:
    import jax.numpy as jnp

    return {"float32": jnp.float32, "float16": jnp.float16, "bfloat16": jnp.bfloat16}[name]


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
    """slice, concat, gather, gather_elements and iota on JAX arrays, as the reference (no ``uniform``)."""
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
        line = jnp.arange(shape[ax]).reshape([-1 if d == ax else 1 for d in range(len(shape))])
        return jnp.broadcast_to(line, shape)

    return {"slice": lambda node, args: jax.lax.slice_in_dim(args[0], node.start, node.stop, axis=node.axis),
            "concat": lambda node, args: jnp.concatenate(args, axis=node.axis),
            "gather": gather, "gather_elements": gather_elements, "iota": iota}


def _jax_layout_ops() -> dict[str, NodeOp]:
    """cast (bools as 0.0 / 1.0, ints as int32 / int64, 16-bit types rounded to and computed on in
    float32), transpose, reshape and expand on JAX arrays."""
    import jax.numpy as jnp

    def cast(node: Node, args: list[Any]) -> Any:
        to = node.to or node.dtype
        if to == "bool":
            return (args[0] != 0).astype(jnp.float32)
        if to in ("int32", "int64"):
            return args[0].astype(jnp.int32 if to == "int32" else jnp.int64)
        if jnp.issubdtype(args[0].dtype, jnp.integer):   # an int value made float
            return args[0].astype(jnp.float32)
        return args[0].astype(_jax_dtype(to)).astype(jnp.float32) if to in SIXTEEN_BIT else args[0]

    return {"cast": cast,
            "transpose": lambda node, args: jnp.transpose(args[0], node.perm),
            "reshape": lambda node, args: jnp.reshape(args[0], node.shape),
            "expand": lambda node, args: jnp.broadcast_to(args[0], node.shape)}


def jax_function(graph: Graph) -> Callable[..., tuple]:
    """``f(**arrays) -> tuple``: ``graph`` in JAX, ``jax.jit``-compiled. Raises ``ImportError`` without jax."""
    import jax
    import jax.numpy as jnp

    unary, binary, reduce = _jax_tables()
    masks = _jax_masks()
    node_ops = {**_jax_index_ops(), **_jax_layout_ops()}
    names = [n for n, _ in graph.inputs]
    nodes = graph.nodes
    outputs = graph.outputs
    out_dtypes = [_jax_dtype(graph.spec(o).dtype) for o in outputs]
    f32 = jnp.float32

    def scalar(x: float) -> Any:
        return jnp.asarray(x, dtype=f32)  # weakly typed python floats could promote differently

    def run_node(node: Node, env: dict[str, Any]) -> Any:
        args = [env[a] if isinstance(a, str) else scalar(float(a)) for a in node.args]
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

    return call


