"""Stitch planning: AStitch's dominant-op analysis on a validated :class:`~stitchtune.graph.parse.Graph`.

The plan views the graph as a 2-D problem ``[M, N]`` (row-major, ``N`` contiguous):

* family ``row``: every reduction reduces the contiguous trailing axes (row reductions: layernorm,
  softmax, RMSNorm); ``P = M`` rows are independent, ``K = N`` is the reduced length.
* family ``col``: every reduction reduces the leading axes (column reductions, e.g. batchnorm
  statistics); ``P = N`` columns are independent, ``K = M`` is the reduced length.
* family ``elementwise``: no reduction (bias + GELU); handled like ``row`` with zero stages.

Every tensor gets a class: ``F`` (full ``[M, N]``), ``P`` (one value per independent row/column:
reduction results and what is computed from them), ``K`` (one value per reduced index, e.g. gamma
in a layernorm), ``S`` (a scalar). The reductions are the dominant ops; reductions of the same
*depth* (number of reductions on the longest path to them, counting themselves) form one stage and
share one stitching scheme. The result of a stage reaches its consumers one-to-many (a broadcast
along the reduced axis); which schemes are legal for that edge depends on the thread mapping and is
decided in :mod:`stitchtune.space`.

Graphs whose broadcasts cannot be expressed in this view (a tensor that varies along part of an
axis group, reductions over different axes, ...) raise :class:`UnsupportedGraphError`; they still
run on the reference executor.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from stitchtune.errors import UnsupportedGraphError
from stitchtune.graph.parse import Graph
from stitchtune.graph.ops import OPS

SCHEMES = ("local", "regional", "global", "independent")

#: element-wise ops that count as "expensive" for AStitch's dominant analysis
EXPENSIVE = frozenset({"exp", "log", "tanh", "erf", "gelu", "gelu_tanh", "sigmoid", "silu", "pow", "div"})


@dataclass(frozen=True)
class StitchPlan:
    """The analysis result. All tuples are in graph (topological) order."""

    family: str                              # row | col | elementwise
    M: int
    N: int
    classes: tuple[tuple[str, str], ...]     # tensor name -> F | P | K | S
    reductions: tuple[str, ...]              # reduction node ids
    stages: tuple[tuple[str, ...], ...]      # reductions per stage, stage 1 first
    dominants: tuple[str, ...]               # reductions + expensive element-wise ops feeding a broadcast
    reuse_candidates: tuple[str, ...]        # F tensors needed by two or more sweeps
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    dtypes: tuple[tuple[str, str], ...]      # tensor name -> dtype

    def cls(self, name: str) -> str:
        return dict(self.classes)[name]

    def dtype(self, name: str) -> str:
        return dict(self.dtypes)[name]

    @property
    def P(self) -> int:
        """Number of independent rows (row family) or columns (col family)."""
        return self.N if self.family == "col" else self.M

    @property
    def K(self) -> int:
        """Length of each reduction (row: N, col: M)."""
        return self.M if self.family == "col" else self.N

    @property
    def nstages(self) -> int:
        return len(self.stages)

    def stage_of(self, reduction: str) -> int:
        """1-based stage of a reduction."""
        for i, st in enumerate(self.stages):
            if reduction in st:
                return i + 1
        raise KeyError(reduction)

    def to_dict(self) -> dict:
        return {"family": self.family, "M": self.M, "N": self.N, "classes": dict(self.classes),
                "stages": [list(s) for s in self.stages], "dominants": list(self.dominants),
                "reuse_candidates": list(self.reuse_candidates)}


def _axes_maps(graph: Graph, domain: tuple[int, ...]) -> dict[str, tuple[int | None, ...]]:
    """For each tensor: which domain axis each of its dims indexes (None for a size-1 dim)."""
    D = len(domain)
    maps: dict[str, tuple[int | None, ...]] = {}
    for name, spec in graph.inputs:
        shape = spec.shape
        if len(shape) > D:
            raise UnsupportedGraphError(f"input '{name}' has a higher rank than the largest tensor")
        m: list[int | None] = []
        for k, s in enumerate(shape):
            ax = D - len(shape) + k
            if s == 1:
                m.append(None)
            elif s == domain[ax]:
                m.append(ax)
            else:
                raise UnsupportedGraphError(
                    f"input '{name}' shape {list(shape)} does not align with the iteration domain {list(domain)}")
        maps[name] = tuple(m)
    for node in graph.nodes:
        info = OPS[node.op]
        targs = [a for a in node.args if isinstance(a, str)]
        if info.kind == "reduce":
            src = maps[targs[0]]
            if node.keepdims:
                maps[node.id] = tuple(None if i in node.axes else a for i, a in enumerate(src))
            else:
                maps[node.id] = tuple(a for i, a in enumerate(src) if i not in node.axes)
            continue
        rank = len(node.shape)
        out: list[int | None] = [None] * rank
        for a in targs:
            am = maps[a]
            off = rank - len(am)
            for k, ax in enumerate(am):
                pos = off + k
                if ax is None:
                    continue
                if out[pos] is None:
                    out[pos] = ax
                elif out[pos] != ax:
                    raise UnsupportedGraphError(
                        f"node '{node.id}' broadcasts values of different axes against each other "
                        "(a reduction without keepdims used along another axis?)")
        maps[node.id] = tuple(out)
    return maps


def make_plan(graph: Graph) -> StitchPlan:
    """Analyse ``graph``; raise :class:`UnsupportedGraphError` when it has no stitched lowering."""
    all_specs = [(n, s.shape) for n, s in graph.inputs] + [(nd.id, nd.shape) for nd in graph.nodes]
    domain = max((shape for _, shape in all_specs), key=lambda s: (prod(s), len(s)))
    D = len(domain)
    maps = _axes_maps(graph, domain)
    live_axes = [a for a in range(D) if domain[a] > 1]

    # reduced domain axes of every reduction
    red_nodes = [nd for nd in graph.nodes if OPS[nd.op].kind == "reduce"]
    red_axes: set[int] | None = None
    for nd in red_nodes:
        src = maps[nd.args[0]]  # type: ignore[index]
        axes = {src[i] for i in nd.axes if src[i] is not None}
        kept = {a for i, a in enumerate(src) if i not in nd.axes and a is not None}
        if red_axes is None:
            red_axes = axes
        elif axes and axes != red_axes:
            raise UnsupportedGraphError(
                f"reduction '{nd.id}' reduces other axes than the first reduction; stitched kernels "
                "need every reduction over the same axes")
        if kept & (red_axes or set()):
            raise UnsupportedGraphError(f"reduction '{nd.id}' mixes reduced and kept axes")
    red_axes = red_axes or set()
    red_live = sorted(a for a in red_axes if domain[a] > 1)

    if not red_nodes or not red_live:
        family = "elementwise" if not red_nodes else "row"
        split = live_axes[-1] if live_axes else D - 1
        row_axes = [a for a in range(D) if a < split]
        col_axes = [a for a in range(D) if a >= split]
        if not red_nodes:
            # whole tensor as rows of the last axis
            pass
    elif red_live == live_axes[len(live_axes) - len(red_live):]:
        family = "row"
        first = red_live[0]
        row_axes = [a for a in range(D) if a < first]
        col_axes = [a for a in range(D) if a >= first]
    elif red_live == live_axes[:len(red_live)]:
        family = "col"
        last = red_live[-1]
        row_axes = [a for a in range(D) if a <= last]
        col_axes = [a for a in range(D) if a > last]
    else:
        raise UnsupportedGraphError(
            "the reduced axes are neither the trailing nor the leading axes of the tensor; "
            "transpose the input so that they are")
    M = prod(domain[a] for a in row_axes) if row_axes else 1
    N = prod(domain[a] for a in col_axes) if col_axes else 1

    rows_live = {a for a in row_axes if domain[a] > 1}
    cols_live = {a for a in col_axes if domain[a] > 1}

    def classify(name: str) -> str:
        varies = {a for a in maps[name] if a is not None}
        in_rows, in_cols = varies & rows_live, varies & cols_live
        if (in_rows and in_rows != rows_live) or (in_cols and in_cols != cols_live):
            raise UnsupportedGraphError(
                f"tensor '{name}' varies along only part of an axis group; stitched kernels support "
                "full, per-row, per-column and scalar operands")
        if in_rows and in_cols:
            return "F"
        if in_rows:
            return "K" if family == "col" else "P"
        if in_cols:
            return "P" if family == "col" else "K"
        return "S"

    classes = {n: classify(n) for n, _ in all_specs}
    for nd in red_nodes:
        if classes[nd.args[0]] != "F":  # type: ignore[index]
            raise UnsupportedGraphError(f"reduction '{nd.id}' reduces a tensor that is not full-size")
        if classes[nd.id] not in ("P", "S"):
            raise UnsupportedGraphError(f"reduction '{nd.id}' leaves a full-size result")
        if classes[nd.id] == "S":
            classes[nd.id] = "P"  # a full reduction of a single row/column

    # stages: depth of each reduction
    depth: dict[str, int] = {n: 0 for n, _ in graph.inputs}
    for nd in graph.nodes:
        d = max((depth[a] for a in nd.args if isinstance(a, str)), default=0)
        depth[nd.id] = d + 1 if OPS[nd.op].kind == "reduce" else d
    nst = max((depth[nd.id] for nd in red_nodes), default=0)
    stages = tuple(tuple(nd.id for nd in red_nodes if depth[nd.id] == s) for s in range(1, nst + 1))

    # dominant element-wise ops: expensive ops whose result is broadcast (P-class feeding F)
    dominants = [nd.id for nd in red_nodes]
    for nd in graph.nodes:
        if nd.op in EXPENSIVE and classes[nd.id] in ("P", "K"):
            if any(classes[c.id] == "F" for c in graph.consumers(nd.id)):
                dominants.append(nd.id)

    # sweeps that need each F tensor (no caching): sweep s (1..nst) feeds stage s reductions,
    # sweep nst+1 writes the F outputs
    needs: dict[str, set[int]] = {n: set() for n in classes}
    by_id = {nd.id: nd for nd in graph.nodes}

    def mark(name: str, sweep: int) -> None:
        if classes[name] != "F" or sweep in needs[name]:
            return
        needs[name].add(sweep)
        nd = by_id.get(name)
        if nd is not None:
            for a in nd.args:
                if isinstance(a, str):
                    mark(a, sweep)

    for i, st in enumerate(stages):
        for r in st:
            mark(by_id[r].args[0], i + 1)  # type: ignore[arg-type]
    for o in graph.outputs:
        mark(o, nst + 1)
    reuse = tuple(n for n, _ in all_specs if classes[n] == "F" and len(needs[n]) >= 2)

    dtypes = tuple((n, graph.spec(n).dtype) for n, _ in all_specs)
    return StitchPlan(
        family=family, M=M, N=N, classes=tuple(classes.items()), reductions=tuple(nd.id for nd in red_nodes),
        stages=stages, dominants=tuple(dominants), reuse_candidates=reuse,
        input_names=tuple(n for n, _ in graph.inputs), output_names=tuple(graph.outputs), dtypes=dtypes)
