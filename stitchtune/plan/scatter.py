"""Scatters in a stitched region: ``scatter_add`` nodes (an embedding's gradient) planned as stores.

A ``scatter_add(v, idx)`` node (see ``docs/graph-format.md``) adds the rows of ``v`` into a table of
zeros at the rows ``idx`` names. In a stitched kernel it is not computed by the sweeps: the region's
*core* graph (:func:`core_graph`: every scatter node removed, each scattered value ``v`` made an
output) is planned and lowered as any other region, and the lowering
(:mod:`stitchtune.lower.scatter`) turns each store of ``v`` into float atomic adds into the table
row ``idx[r]`` (range-checked: an index out of ``[0, rows)`` adds nothing), after zeroing the table.
So the layer norm / dropout backward that produces an embedding's gradient and the scatter into the
embedding table are one kernel.

Contract: :func:`split_scatters` returns the core graph and one frozen :class:`Scatter` per scatter
node (graph order), or a :class:`~stitchtune.plan.refusal.Refusal` naming the node when
the region cannot be lowered so: a scatter's table read by another node (kernels only store it).
Every float table is planned (float32, float16, bfloat16: the IR's atomic add takes them; a 16-bit
one needs a device with that atomic add, which the lowering checks). A graph without scatters is
returned as it is, with no scatters. Several scatters may add the same ``v`` (BERT's word, position
and token-type embeddings all take the embeddings' gradient); ``v`` may also be an output itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from stitchtune.graph.parse import Graph
from stitchtune.plan.refusal import Refusal

__all__ = ["Scatter", "core_graph", "split_scatters", "has_scatters", "nondeterministic"]

@dataclass(frozen=True)
class Scatter:
    """One ``scatter_add`` node of a region: ``node`` (its id, the table output), the tensor ``values``
    whose rows it adds, the int input ``index`` naming the table rows, the table's ``rows`` and
    ``row_size`` (elements per table row, ``prod(shape[1:])``), and its ``dtype``."""

    node: str
    values: str
    index: str
    rows: int
    row_size: int
    dtype: str

    @property
    def size(self) -> int:
        """Elements of the table."""
        return self.rows * self.row_size

    def to_dict(self) -> dict[str, object]:
        return {"node": self.node, "values": self.values, "index": self.index, "rows": self.rows,
                "row_size": self.row_size, "dtype": self.dtype}


def has_scatters(graph: Graph) -> bool:
    """Whether ``graph`` has a ``scatter_add`` node."""
    return any(nd.op == "scatter_add" for nd in graph.nodes)


def split_scatters(graph: Graph) -> tuple[Graph, tuple[Scatter, ...]] | Refusal:
    """``(core graph, scatters)`` of ``graph`` (see the module docstring); ``(graph, ())`` without scatters."""
    nodes = [nd for nd in graph.nodes if nd.op == "scatter_add"]
    if not nodes:
        return graph, ()
    out: list[Scatter] = []
    for nd in nodes:
        values, index = nd.tensor_args
        readers = graph.consumers(nd.id)
        if readers:
            return Refusal(
                f"scatter_add '{nd.id}' is read by node '{readers[0].id}' (graph '{graph.name}'); stitched kernels "
                "produce a scatter's table as an output only")
        out.append(Scatter(nd.id, values, index, nd.shape[0], prod(nd.shape[1:]), nd.dtype))
    return core_graph(graph), tuple(out)


def core_graph(graph: Graph) -> Graph:
    """``graph`` without its scatter nodes: their values are outputs instead (after the graph's own
    outputs that are not scatters, each once), without the inputs only scatters read (their indices:
    the lowering binds them). ``graph`` itself without scatters."""
    scatter_ids = {nd.id for nd in graph.nodes if nd.op == "scatter_add"}
    if not scatter_ids:
        return graph
    outputs = [o for o in graph.outputs if o not in scatter_ids]
    for nd in graph.nodes:
        if nd.id in scatter_ids and nd.tensor_args[0] not in outputs:
            outputs.append(nd.tensor_args[0])
    nodes = tuple(nd for nd in graph.nodes if nd.id not in scatter_ids)
    read = {a for nd in nodes for a in nd.tensor_args} | set(outputs)
    inputs = tuple((n, s) for n, s in graph.inputs if n in read)
    return Graph(name=graph.name, inputs=inputs, nodes=nodes, outputs=tuple(outputs))


def nondeterministic(scatters: tuple[Scatter, ...]) -> str | None:
    """Why a plan with ``scatters`` is not bitwise reproducible (one line naming the first scatter), or
    None without scatters: its tables are summed by float atomics in the order the blocks add. What
    the deterministic modes (``compile`` / ``search --deterministic``, the torch backend's
    ``deterministic=True``) refuse, whatever the schedule."""
    if not scatters:
        return None
    return (f"scatter_add '{scatters[0].node}' sums its table with float atomics (not bitwise reproducible); "
            "a deterministic schedule was asked for")
