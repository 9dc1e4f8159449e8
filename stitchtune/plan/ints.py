"""Which tensors of a region are integer values in kernel registers (int arithmetic on runtime values).

Contract
--------
:func:`int_registers(graph)` is the set of int32/int64 tensors that kernels keep as integers of their
own width (``i32`` / ``i64`` registers, exact, wrapping arithmetic): every int tensor of a graph that
*computes* with ints (an ``iota``, an int op on int tensors, a comparison of ints, a ``cast`` to an
int dtype, or an int output), and none of any other graph. In the latter (int inputs read only by
``cast``, the index maps and as gather indices, as before int arithmetic existed) int tensors are
converted to float32 at the load, so those kernels stay byte for byte what they were.
"""

from __future__ import annotations

from stitchtune.graph.ops import OPS
from stitchtune.graph.parse import INT_DTYPES, Graph

__all__ = ["int_registers", "computes_ints"]


def computes_ints(graph: Graph) -> bool:
    """Whether ``graph`` computes with int values (see the module docstring)."""
    if any(graph.spec(o).dtype in INT_DTYPES for o in graph.outputs):
        return True
    for nd in graph.nodes:
        info = OPS[nd.op]
        if info.kind == "iota" or (info.kind == "cast" and nd.dtype in INT_DTYPES):
            return True
        if info.ints and any(graph.spec(a).dtype in INT_DTYPES for a in nd.tensor_args):
            return True
    return False


def int_registers(graph: Graph) -> frozenset[str]:
    """The int tensors of ``graph`` that kernels hold as integers (see the module docstring)."""
    if not computes_ints(graph):
        return frozenset()
    names = [n for n, _ in graph.inputs] + [nd.id for nd in graph.nodes]
    return frozenset(n for n in names if graph.spec(n).dtype in INT_DTYPES)
