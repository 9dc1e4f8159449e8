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
"""

from __future__ import annotations

from math import prod

import numpy as np

from stitchtune.graph.parse import Graph
from stitchtune.graph.values import ITEMSIZE
from stitchtune.plan.chains import composed_chains, domain_of, mixed_layout
from stitchtune.plan.family import Family
from stitchtune.plan.index_map import IndexMap

__all__ = ["adjacent_rows", "chain_strides"]

#: bytes of one memory sector (a warp access is served in these)
_SECTOR = 32


def chain_strides(graph: Graph, chain: tuple[str, ...]) -> tuple[int, ...] | None:
    """Element strides of the head of layout chain ``chain`` (``(head, ..., input)``) in its input, or None
    where a reshape of the chain cannot be a view (numpy's rules, on an unallocated byte array)."""
    v: np.ndarray = np.empty(graph.spec(chain[-1]).shape, dtype=np.int8)   # never touched: strides only
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
    return tuple(int(s) for s in v.strides)


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

