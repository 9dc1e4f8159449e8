"""Index remaps: planning graphs with ``slice``, ``concat`` and ``gather`` (see graph/index_checks.py).

These ops move elements without arithmetic, so a stitched kernel never materialises their results:
it evaluates the element-wise subtree below them at a *remapped* position and loads the graph inputs
there (:mod:`stitchtune.lower.remap`). Planning sees a *surrogate* graph (:func:`surrogate`):

* the iteration domain is the largest shape (elements, then rank) among the outputs and the
  arguments of reductions (a gather table and its indices never set it);
* every tensor's surrogate shape is its own with each dimension other than 1 replaced by the
  domain's (right-aligned), so the sliced, concatenated and gathered tensors all span the domain;
* ``slice`` becomes a unary and ``concat`` an n-ary element-wise node over the surrogate shapes;
  ``gather(table, idx)`` an element-wise node of ``idx`` seen as per-row (``idx.shape`` + ones) and
  the table seen as one row (``table.shape[1:]``), so its result is full-size and the index per-row.

The planner then classifies, stages and maps the surrogate as any other graph (so the space, the
cost model and the heuristic need nothing new); :func:`real_index_maps` gives the inputs whose own
shape differs from their surrogate shape (a sliced input larger than the domain) their maps with
their own strides. Refused with :class:`UnsupportedGraphError` naming the tensor: an output or a
reduction argument that does not span the domain, a tensor of higher rank than the domain, a gather
table read by anything but gather, a table whose trailing dims are not the view's columns (checked
in :func:`check_gathers`), an index tensor used with two table ranks.
"""

from __future__ import annotations

from math import prod

from stitchtune.errors import UnsupportedGraphError
from stitchtune.graph.ops import INDEX_KINDS, OPS
from stitchtune.graph.parse import Graph, Node, TensorSpec
from stitchtune.plan.index_map import IndexMap, index_map

__all__ = ["has_index_ops", "domain_of", "surrogate", "real_index_maps", "check_gathers", "gather_tables"]


def has_index_ops(graph: Graph) -> bool:
    return any(OPS[n.op].kind in INDEX_KINDS for n in graph.nodes)


def gather_tables(graph: Graph) -> dict[str, str]:
    """Gather node id -> its table input."""
    return {n.id: n.args[0] for n in graph.nodes if n.op == "gather"}  # type: ignore[misc]


def domain_of(graph: Graph) -> tuple[int, ...]:
    """The iteration domain: the largest output or reduction argument (elements, then rank)."""
    shapes = [graph.spec(o).shape for o in graph.outputs]
    shapes += [graph.spec(n.args[0]).shape for n in graph.reductions()]  # type: ignore[arg-type]
    return max(shapes, key=lambda s: (prod(s), len(s)))


def _sur(shape: tuple[int, ...], domain: tuple[int, ...], name: str) -> tuple[int, ...]:
    off = len(domain) - len(shape)
    if off < 0:
        raise UnsupportedGraphError(f"tensor '{name}' {list(shape)} has a higher rank than the iteration "
                                    f"domain {list(domain)}")
    return tuple(1 if s == 1 else domain[off + k] for k, s in enumerate(shape))


def _gather_shapes(graph: Graph, domain: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
    """Surrogate shapes of the gather tables (one row) and their indices (per row)."""
    out: dict[str, tuple[int, ...]] = {}
    tables = set(gather_tables(graph).values())
    for n in graph.nodes:
        if n.op != "gather":
            if any(a in tables for a in n.tensor_args):
                raise UnsupportedGraphError(f"node '{n.id}' reads gather table '{next(a for a in n.tensor_args if a in tables)}'; "
                                            "a gather table may only be read by gather")
            continue
        table, idx = n.args
        tspec, ispec = graph.spec(table), graph.spec(idx)  # type: ignore[arg-type]
        isur = _sur(tuple(ispec.shape) + (1,) * (tspec.rank - 1), domain, str(idx))
        if out.setdefault(str(idx), isur) != isur:
            raise UnsupportedGraphError(f"gather '{n.id}': index '{idx}' is used with tables of different ranks")
        out[str(table)] = _sur(tuple(tspec.shape[1:]), domain, str(table))
    for o in graph.outputs:
        if o in tables:
            raise UnsupportedGraphError(f"output '{o}' is a gather table; a table may only be read by gather")
    return out


def surrogate(graph: Graph) -> Graph:
    """The graph the planner analyses in place of ``graph`` (module docstring); ``graph`` itself
    when it has no index op."""
    if not has_index_ops(graph):
        return graph
    domain = domain_of(graph)
    special = _gather_shapes(graph, domain)
    inputs = tuple((n, TensorSpec(special.get(n) or _sur(s.shape, domain, n), s.dtype)) for n, s in graph.inputs)
    nodes = []
    for nd in graph.nodes:
        kind = OPS[nd.op].kind
        if kind in ("slice", "concat"):
            _check_no_broadcast_piece(graph, nd, domain)
        shape = _sur(nd.shape, domain, nd.id)
        op = {"slice": "neg", "concat": "add", "gather": "add"}.get(kind, nd.op)
        nodes.append(Node(id=nd.id, op=op, args=nd.args, axes=nd.axes, keepdims=nd.keepdims, to=nd.to,
                          shape=shape, dtype=nd.dtype))
    for name in list(graph.outputs) + [str(n.args[0]) for n in graph.reductions()]:
        if tuple(graph.spec(name).shape) != _sur(graph.spec(name).shape, domain, name):
            raise UnsupportedGraphError(
                f"tensor '{name}' {list(graph.spec(name).shape)} is stored or reduced but does not span the "
                f"iteration domain {list(domain)}; stitched kernels store and reduce whole tensors only")
    return Graph(name=graph.name, inputs=inputs, nodes=tuple(nodes), outputs=graph.outputs)


def _check_no_broadcast_piece(graph: Graph, nd: Node, domain: tuple[int, ...]) -> None:
    """A slice or concat piece of size 1 along its axis would broadcast against the domain: refused."""
    off = len(domain) - len(nd.shape)
    if nd.axis is None or off < 0 or domain[off + nd.axis] == 1:
        return
    for t in (nd.id,) + nd.tensor_args:
        if graph.spec(t).shape[nd.axis] == 1:
            raise UnsupportedGraphError(
                f"{nd.op} '{nd.id}': '{t}' has size 1 along axis {nd.axis}, which would broadcast "
                f"against the iteration domain {list(domain)}; not supported")


def real_index_maps(graph: Graph, sur: Graph, axes: dict[str, tuple[int | None, ...]], domain: tuple[int, ...],
                    row_axes: tuple[int, ...], col_axes: tuple[int, ...]) -> dict[str, IndexMap]:
    """The maps of the inputs whose own shape (same rank) differs from the surrogate one: the same
    domain axes, addressed with their own strides (a sliced input larger than the domain)."""
    tables = set(gather_tables(graph).values())
    out: dict[str, IndexMap] = {}
    for name, spec in graph.inputs:
        s = sur.spec(name).shape
        if name in tables or tuple(spec.shape) == tuple(s) or len(spec.shape) != len(s):
            continue
        out[name] = index_map(spec.shape, axes[name], domain, row_axes, col_axes)
    return out


def check_gathers(graph: Graph, domain: tuple[int, ...], col_axes: tuple[int, ...], family: str) -> None:
    """A gather's table rows must be the view's columns: ``table.shape[1:]`` spans exactly the column
    axes (so element ``(r, c)`` is ``table[idx[r], c]``), in a row-family view."""
    for n in graph.nodes:
        if n.op not in ("gather", "slice", "concat"):
            continue
        if family == "col":
            raise UnsupportedGraphError(f"{n.op} '{n.id}': index ops are supported in row-reduction and "
                                        "element-wise kernels only, not in column reductions")
        if n.op != "gather":
            continue
        trail = graph.spec(n.args[0]).shape[1:]  # type: ignore[arg-type]
        cols = tuple(domain[a] for a in col_axes)
        live = tuple(d for d in cols if d > 1)
        if prod(trail) != prod(cols) or tuple(d for d in trail if d > 1) != live or (
                col_axes and col_axes[0] < len(domain) - len(trail)):
            raise UnsupportedGraphError(
                f"gather '{n.id}': the table's rows {list(trail)} are not the contiguous axes {list(cols)} "
                "of the kernel (gather whole rows of a table whose rows are the innermost axes)")
