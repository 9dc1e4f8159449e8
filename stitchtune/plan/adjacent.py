"""Transposed inputs: element-wise regions that read an input along the view's rows.

The row family gives a warp's lanes adjacent view columns ``c``. An input whose own stride-1 axis is
the view's innermost *row* axis (GPT-2's training concat reads k's gradient ``[B, H, D, S]`` merged to
``[B, S, H * D]``: consecutive view rows ``s`` are adjacent in memory, consecutive columns 512 floats
apart; Llama's rotary gradient reads ``[B*H, D, S]`` transposed) is then loaded one 32-byte sector
per element: 8x the ideal sectors for float32.

Such a load is at its ideal sectors when each column of a warp's elements covers ``G`` consecutive
view rows, ``G`` elements of one sector (``G = 32 / element bytes``): the warp then holds ``G`` rows of
``warp / G`` lanes each (:mod:`stitchtune.lower.lane_order`), and the region's other accesses, along
the columns, still move whole sectors (``warp / G`` lanes x ``vec`` elements of a row). The heuristic
gives such a region blocks of at least ``G`` rows.

Contract: :func:`adjacent_rows` returns ``G > 1`` only for an element-wise plan without cross
reductions or scatters, static, with an input (read through its index map, or through a layout chain
of :func:`~stitchtune.plan.chains.composed_chains`) whose stride along the view's innermost row axis
is 1 and whose stride along the view's innermost column is neither 0 nor 1, that row axis a multiple
of ``G`` long; else 0.

:func:`vector_rows` is what the schedule option ``row_vectors`` (:mod:`stitchtune.lower.row_vectors`)
needs of such a region: ``R`` (``16 / element bytes``: 4 for float32, 8 for 16-bit) when every transposed
source is a layout chain whose ``R`` consecutive view rows at any column are ``R`` adjacent elements of its
input starting at a multiple of ``R`` (stride 1 along the innermost row axis, that axis a multiple of
``R`` long, every other stride and the chain's start offset multiples of ``R``: one aligned 128-bit load),
the view's rows follow the domain's row-major layout (``M % R == 0``), and nothing is held per row (no
per-row tensor, gather, ``iota`` or int register: a thread's ``R`` rows share nothing but the columns);
else 0. A transposed source that is a graph input read through its own index map (not a chain) is not
vectorised: 0.
"""

from __future__ import annotations

from math import prod

import numpy as np

from stitchtune.graph.parse import Graph
from stitchtune.graph.values import ITEMSIZE
from stitchtune.graph.ops import OPS
from stitchtune.plan.chains import composed_chains, domain_of, mixed_layout
from stitchtune.plan.classes import TensorClass
from stitchtune.plan.family import Family
from stitchtune.plan.index_map import IndexMap
from stitchtune.plan.ints import int_registers
from stitchtune.plan.lane_shifts import ColumnVisit
from stitchtune.plan.remap import remap_visits

__all__ = ["adjacent_rows", "chain_strides", "chain_start", "column_visits", "transposed_heads", "vector_loads",
           "vector_rows"]

#: bytes of one memory sector (a warp access is served in these)
_SECTOR = 32


def _chain_view(graph: Graph, chain: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray] | None:
    """``(base, view)``: an unallocated int8 array of the chain's input's shape and the head of layout chain
    ``chain`` (``(head, ..., input)``) as a numpy view of it, or None where a reshape of the chain cannot be a
    view (numpy's rules) or a link is not a layout op. Neither array's bytes are ever read."""
    base: np.ndarray = np.empty(graph.spec(chain[-1]).shape, dtype=np.int8)
    v = base
    for name in reversed(chain[:-1]):
        nd = graph.node(name)
        if nd.op == "transpose":
            v = v.transpose(nd.perm)
        elif nd.op == "reshape":
            try:
                v = np.reshape(v, nd.shape, copy=False)
            except ValueError:
                return None
        elif nd.op == "slice" and nd.axis is not None:
            v = v[(slice(None),) * nd.axis + (slice(nd.start, nd.stop),)]
        else:
            return None
    return base, v


def chain_strides(graph: Graph, chain: tuple[str, ...]) -> tuple[int, ...] | None:
    """Element strides of the head of layout chain ``chain`` (``(head, ..., input)``) in its input, or None
    where a reshape of the chain cannot be a view (numpy's rules, on an unallocated byte array)."""
    views = _chain_view(graph, chain)
    return None if views is None else tuple(int(s) for s in views[1].strides)


def chain_start(graph: Graph, chain: tuple[str, ...]) -> int | None:
    """The element offset in the chain's input of the head's element 0 (a slice's start moves it), or None
    where a reshape of the chain cannot be a view (as :func:`chain_strides`)."""
    views = _chain_view(graph, chain)
    if views is None:
        return None
    base, v = views
    return int(v.__array_interface__["data"][0] - base.__array_interface__["data"][0])


def _row_axes(graph: Graph, M: int) -> tuple[int, ...]:
    """The domain axes of the view's rows (all but the innermost in a mixed region)."""
    domain = domain_of(graph)
    D = len(domain)
    if mixed_layout(graph):
        return tuple(range(D - 1))
    k = 0
    while k < D and prod(domain[:k]) < M:
        k += 1
    return tuple(range(k))


def transposed_heads(graph: Graph, M: int) -> frozenset[str]:
    """The heads of the layout chains (:func:`~stitchtune.plan.chains.composed_chains`) whose input has
    stride 1 along the view's innermost row axis (of the domain's extent there): the chains a thread with
    row vectors loads ``R`` rows at a time."""
    domain = domain_of(graph)
    rows = _row_axes(graph, M)
    if not rows or rows[-1] == len(domain) - 1:
        return frozenset()
    ra = rows[-1]
    out = set()
    for head, chain in composed_chains(graph).items():
        shape = graph.spec(head).shape
        off = len(domain) - len(shape)
        strides = chain_strides(graph, chain)
        if strides is not None and ra >= off and shape[ra - off] == domain[ra] and strides[ra - off] == 1:
            out.add(head)
    return frozenset(out)


def vector_loads(graph: Graph, classes: dict[str, TensorClass], M: int) -> int:
    """The loads of :func:`transposed_heads` chains one element of the row kernel of a plan of ``M`` rows and
    tensor ``classes`` makes: each chain
    once per column shift the region's slices and concats read it at (GPT-2's concat: 1; Llama's rotary
    gradient: 4 chains x 3 shifts = 12), from the remap walk the planner proved
    (:func:`~stitchtune.plan.remap.remap_visits`)."""
    heads = transposed_heads(graph, M)
    varies = {n: c.varies_along_reduced for n, c in classes.items()}
    seen = remap_visits(graph, domain_of(graph), _row_axes(graph, M), varies, mixed_layout(graph))
    return sum(1 for name, _ in seen if name in heads)


def column_visits(graph: Graph, classes: dict[str, TensorClass], M: int) -> tuple[ColumnVisit, ...]:
    """The reads of :func:`transposed_heads` chains that :func:`vector_loads` counts whose shift moves and
    limits the innermost domain axis only (:mod:`stitchtune.plan.lane_shifts`): ``(head, d, lo, hi)``, the
    unshifted reads ``(head, 0, 0, N)`` among them; sorted. The reads at other shifts are not listed."""
    heads = transposed_heads(graph, M)
    domain = domain_of(graph)
    D = len(domain)
    varies = {n: c.varies_along_reduced for n, c in classes.items()}
    out: set[ColumnVisit] = set()
    for name, sh in remap_visits(graph, domain, _row_axes(graph, M), varies, mixed_layout(graph)):
        if name not in heads or sh.axes() - {D - 1}:
            continue
        lo, hi = next(((lo, hi) for _, lo, hi in sh.conds), (0, domain[-1]))
        out.add((name, sh.d(D - 1), lo, hi))
    return tuple(sorted(out))


def vector_rows(graph: Graph, family: Family, maps: dict[str, IndexMap], classes: dict[str, TensorClass], M: int,
                plain: bool) -> int:
    """The view rows a thread takes so that the region's transposed inputs load ``R`` rows per 128-bit
    access (module docstring), or 0."""
    if not adjacent_rows(graph, family, maps, M, plain) or int_registers(graph):
        return 0
    if any(c is TensorClass.PER_KEPT for c in classes.values()):
        return 0
    if any(nd.op == "iota" or OPS[nd.op].kind.startswith("gather") or OPS[nd.op].kind == "scatter"
           for nd in graph.nodes):
        return 0
    domain = domain_of(graph)
    rows = _row_axes(graph, M)
    if not rows or rows[-1] == len(domain) - 1:
        return 0
    ra = rows[-1]
    if mixed_layout(graph) and not any(tuple(nd.shape) == tuple(domain) and OPS[nd.op].kind != "layout"
                                       and nd.id in maps and maps[nd.id].plain for nd in graph.nodes):
        return 0   # the view's rows need not be the domain's in row-major order
    chains = composed_chains(graph)
    chained = {c[-1] for c in chains.values()}
    for name, _ in graph.inputs:   # a transposed input read through its own map: row by row
        m = maps.get(name)
        if name in chained or m is None or m.cols.broadcast or m.cols.contiguous():
            continue
        if any(f.stride == 1 and f.inner == 1 for f in m.rows.factors):
            return 0
    found: set[int] = set()
    for head in transposed_heads(graph, M):
        chain = chains[head]
        shape = graph.spec(head).shape
        off = len(domain) - len(shape)
        strides = chain_strides(graph, chain)
        assert strides is not None
        size = ITEMSIZE.get(graph.spec(chain[-1]).dtype, 4)
        R = 16 // size
        start = chain_start(graph, chain)
        others = [st for k, (st, d) in enumerate(zip(strides, shape)) if k != ra - off and d > 1]
        if start is None or start % R or domain[ra] % R or M % R or any(st % R for st in others):
            return 0
        found.add(R)
    return found.pop() if len(found) == 1 else 0


def adjacent_rows(graph: Graph, family: Family, maps: dict[str, IndexMap], M: int, plain: bool) -> int:
    """The view rows a warp should span for the region's transposed inputs (module docstring), or 0.
    ``plain``: the plan has no cross reductions or scatters."""
    if family != Family.ELEMENTWISE or not plain:
        return 0
    domain = domain_of(graph)
    D = len(domain)
    if mixed_layout(graph):
        rows = tuple(range(D - 1))
    else:
        k = 0
        while k < D and prod(domain[:k]) < M:
            k += 1
        rows = tuple(range(k))
    if not rows or rows[-1] == D - 1:
        return 0
    ra = rows[-1]
    best = 0
    chains = composed_chains(graph)
    for head, chain in chains.items():
        shape = graph.spec(head).shape
        off = D - len(shape)
        strides = chain_strides(graph, chain)
        if strides is None or ra < off or shape[ra - off] != domain[ra]:
            continue
        g = _SECTOR // ITEMSIZE.get(graph.spec(chain[-1]).dtype, 4)
        if strides[ra - off] == 1 and strides[-1] not in (0, 1) and domain[ra] % g == 0:
            best = max(best, g)
    chained = {c[-1] for c in chains.values()}
    for name, spec in graph.inputs:
        m = maps.get(name)
        if name in chained or m is None or m.cols.broadcast or m.cols.contiguous():
            continue
        f = next((f for f in m.rows.factors if f.stride == 1 and f.inner == 1), None)
        g = _SECTOR // ITEMSIZE.get(spec.dtype, 4)
        if f is not None and f.dim % g == 0 and M % g == 0:
            best = max(best, g)
    return best if best > 1 else 0

