"""Outputs of a region's graph that store the values of another output again (issue 39: "no region
writes the same values twice").

Contract of :func:`duplicate_outputs(graph)`: for each output of ``graph`` whose value is an earlier
output's value moved only by value-preserving nodes (``reshape``, ``transpose``, a cast to the same
dtype), one :class:`Duplicate` (the output, the earlier output it equals, and the chain of ops from
their common source to it), in output order. A copy of an input (a head split's transposed copy) is
the region's one write of those values and does not count. An ``expand`` (a materialised broadcast: more
elements than its source) does not count. The graph is read only; nothing here imports torch.

The region finder avoids such outputs (:mod:`stitchtune.importers.torch_mapping`: a view of another
output is returned as a view of it, an alias); what remains is PyTorch's ``clone`` of another output
that a user may write to (``_COPY``) and is listed here too, so a script or test can count them
(``scripts/duplicate_writes.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Duplicate", "duplicate_outputs"]

#: ops that move a value without changing it or its element count
_SAME_VALUES = ("reshape", "transpose")


@dataclass(frozen=True)
class Duplicate:
    """Output ``output`` of a graph holds the values of ``same`` (an earlier output);
    ``how``: the op names from their common source (``same``'s value) to ``output``."""

    output: str
    same: str
    how: tuple[str, ...]

    @property
    def same_layout(self) -> bool:
        """True when no transpose is on the way: ``output`` holds ``same``'s bytes in the same order
        (a reshape: PyTorch's view of it); False for a copy in another layout (GPT-2's key stored for
        the backward and again transposed for the score matmul, as eager also writes it)."""
        return "transpose" not in self.how


def _source(graph: Any, name: str) -> tuple[str, tuple[str, ...]]:
    """The tensor that ``name`` equals through value-preserving nodes, and the ops in between."""
    how: list[str] = []
    while not graph.is_input(name):
        node = graph.node(name)
        same_cast = node.op == "cast" and node.tensor_args and graph.spec(node.tensor_args[0]).dtype == node.dtype
        if node.op not in _SAME_VALUES and not same_cast:
            break
        how.append(node.op)
        name = node.tensor_args[0]
    return name, tuple(reversed(how))


def duplicate_outputs(graph: Any) -> tuple[Duplicate, ...]:
    """The outputs of ``graph`` (a :class:`~stitchtune.graph.parse.Graph`) that store an earlier
    output's values again (see module docstring)."""
    roots: dict[str, str] = {}   # source tensor -> first output stored from it
    out: list[Duplicate] = []
    for o in graph.outputs:
        src, how = _source(graph, o)
        first = roots.get(src)
        if first is not None:
            out.append(Duplicate(o, first, how))
        else:
            roots[src] = o
    return tuple(out)
