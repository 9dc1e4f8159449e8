"""What the framework peers of ``stitchtune bench`` share (:mod:`~stitchtune.bench.peers` for PyTorch,
:mod:`~stitchtune.bench.jax_peer` for JAX): the shape of an op that reads its node, the comparison /
logical / ``where`` / ``clamp`` table over any array library, and how a node's arguments are read.

No framework is imported here; each peer passes its library's functions in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from stitchtune.graph.ops import OPS

if TYPE_CHECKING:
    from stitchtune.graph.parse import Node

__all__ = ["SIXTEEN_BIT", "NodeOp", "mask_ops", "node_args"]

#: storage dtypes the peers widen to float32 on load (and round to at a ``cast``)
SIXTEEN_BIT = ("float16", "bfloat16")

NodeOp = Callable[["Node", list[Any]], Any]
"""``f(node, args) -> value``: an op that reads its node's attributes (axis, shape, perm, target type)
besides its argument values ``args`` (tensors, or Python numbers for constants: :func:`node_args`)."""


def mask_ops(f: Callable[[Any], Any], where: Callable[..., Any],
             clamp: Callable[..., Any]) -> dict[str, Callable[..., Any]]:
    """Comparisons, logical ops, ``where`` and ``clamp`` for one array library: its operators serve
    the comparisons; ``f`` turns a boolean array into float32 0.0 / 1.0 (how the peers carry bools,
    as the reference does in ``graph/ops.py``), ``where(c, a, b)`` (non-zero ``c`` picks ``a``; the
    branches' dtype, float32 or int, is kept) and ``clamp(x, lo, hi)`` are the library's own."""
    return {
        "lt": lambda a, b: f(a < b), "le": lambda a, b: f(a <= b), "gt": lambda a, b: f(a > b),
        "ge": lambda a, b: f(a >= b), "eq": lambda a, b: f(a == b), "ne": lambda a, b: f(a != b),
        "logical_and": lambda a, b: f((a != 0) & (b != 0)),
        "logical_or": lambda a, b: f((a != 0) | (b != 0)),
        "logical_not": lambda a: f(a == 0),
        "where": where,   # float branches give float32, int branches their int dtype
        "clamp": clamp,
    }


def node_args(node: Node, env: Mapping[str, Any], is_int: Callable[[Any], bool]) -> list[Any]:
    """The argument values of ``node``: each tensor argument from ``env``, each constant as a Python
    number, as the reference reads them (``graph/reference.py``): an exact ``int`` when the node
    computes on ints (its op takes ints, ``OpInfo.ints``, and a tensor argument is an int value:
    ``is_int(value)``), else a ``float``. So an int64 constant never passes through a float32 (graph
    constants are integers within ``2**53`` there), and each peer chooses how a float becomes a scalar."""
    vals = [env[a] if isinstance(a, str) else None for a in node.args]
    ints = OPS[node.op].ints and any(v is not None and is_int(v) for v in vals)
    return [v if isinstance(a, str) else (int(a) if ints else float(a)) for a, v in zip(node.args, vals)]
