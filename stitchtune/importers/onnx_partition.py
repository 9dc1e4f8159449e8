"""Partition of an ONNX graph into fusable groups and memory-intensive regions.

Contract
--------
* :func:`partition(nodes, mappable, consts)` returns the maximal groups of ``mappable`` node
  indices that can each run as one fused unit: connected over producer->consumer tensors, and
  convex (a group that a path leaves and re-enters through a boundary node is split by *stage*:
  every path through a boundary node moves to a later stage, a group never spans stages).
* :func:`regions(...)` returns the connected groups of memory-intensive nodes (all but
  ``Constant`` and :data:`COMPUTE_OPS`) and, for each, whether it was imported whole (one group, no
  boundary node), cut (with the nodes that stopped it: its boundary nodes, or the compute ops on a
  path that leaves and re-enters it), dropped (only no-op groups) or skipped (nothing imported).
"""

from __future__ import annotations

from collections.abc import Callable, Container
from dataclasses import dataclass
from typing import Any

__all__ = ["COMPUTE_OPS", "OnnxRegion", "Partition", "label", "partition", "regions"]

COMPUTE_OPS: frozenset[str] = frozenset({
    "MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum", "MatMulInteger", "ConvInteger", "QLinearMatMul",
    "QLinearConv", "FusedMatMul", "Attention", "MultiHeadAttention", "LSTM", "GRU", "RNN"})


def label(i: int, node: Any) -> str:
    """``"index:op:name"`` of ONNX node ``node``."""
    return f"{i}:{node.op_type}:{node.name or '-'}"


@dataclass(frozen=True)
class OnnxRegion:
    """A connected group of memory-intensive ONNX nodes and what became of it."""

    nodes: tuple[str, ...]        # "index:op:name" of its nodes
    status: str                   # "whole" | "cut" | "dropped" (only no-ops) | "skipped" (nothing imported)
    subgraphs: tuple[str, ...]    # names of the graphs made from it
    stopped_by: tuple[str, ...]   # "index:op:name: reason" of what kept it from one graph


@dataclass(frozen=True)
class Partition:
    groups: list[list[int]]               # node indices of each group, ascending
    consumers: dict[str, set[int]]        # tensor -> nodes reading it
    producer: dict[str, int]
    succ: dict[int, set[int]]


def partition(nodes: list[Any], mappable: set[int], consts: Container[str]) -> Partition:
    """Maximal convex groups of ``mappable`` nodes (see the module docstring)."""
    producer: dict[str, int] = {t: i for i, n in enumerate(nodes) for t in n.output if t}
    # stage: boundary nodes move everything after them to a later stage (see module docstring)
    stage: dict[str, int] = {}
    node_stage: dict[int, int] = {}
    for i, n in enumerate(nodes):
        s = max((stage.get(t, 0) for t in n.input if t and t not in consts), default=0)
        node_stage[i] = s
        for t in n.output:
            stage[t] = s if (i in mappable or n.op_type == "Constant") else s + 1
    consumers: dict[str, set[int]] = {}
    for i, n in enumerate(nodes):
        for t in n.input:
            consumers.setdefault(t, set()).add(i)
    succ = {i: {c for t in n.output if t for c in consumers.get(t, ())} for i, n in enumerate(nodes)}
    groups = []
    # widest first: connected components; a component that a path leaves and re-enters through a
    # boundary node cannot be one kernel, so it is split by stage (always convex)
    for comp in _components(mappable, nodes, producer, lambda p, i: True):
        if _convex(set(comp), succ):
            groups.append(comp)
        else:
            groups.extend(_components(set(comp), nodes, producer,
                                      lambda p, i: node_stage[p] == node_stage[i]))
    return Partition(groups=groups, consumers=consumers, producer=producer, succ=succ)


def regions(nodes: list[Any], in_range: set[int], reasons: dict[int, str | None], part: Partition,
             fate: dict[int, str]) -> tuple[OnnxRegion, ...]:
    """The memory-intensive regions of the model and what became of each."""
    members = {i for i in in_range if nodes[i].op_type != "Constant" and nodes[i].op_type not in COMPUTE_OPS}
    group_of = {i: g[0] for g in part.groups for i in g}
    out = []
    for region in _components(members, nodes, part.producer, lambda p, i: True):
        firsts = sorted({group_of[i] for i in region if i in group_of})
        names = tuple(fate[f] for f in firsts if fate[f] not in ("no-op", "unused"))
        stopped = [f"{label(i, nodes[i])}: {reasons[i]}" for i in region if reasons[i] is not None]
        if not stopped and len(firsts) > 1:
            between = _between(set(region), part.succ)
            between = [i for i in between if nodes[i].op_type in COMPUTE_OPS] or between
            stopped = [f"{label(i, nodes[i])}: a path leaves the region through it and comes back"
                       for i in between]
        if names and not stopped and len(firsts) == 1:
            status = "whole"
        elif names:
            status = "cut"
        elif firsts and all(fate[f] == "no-op" for f in firsts):
            status = "dropped"
        else:
            status = "skipped"
        out.append(OnnxRegion(nodes=tuple(label(i, nodes[i]) for i in region), status=status,
                              subgraphs=names, stopped_by=tuple(stopped)))
    return tuple(out)


def _between(region: set[int], succ: dict[int, set[int]]) -> list[int]:
    """Nodes outside ``region`` on a path from it back into it."""
    def reach(start: set[int], edges: dict[int, set[int]]) -> set[int]:
        seen: set[int] = set()
        todo = [c for i in start for c in edges.get(i, ()) if c not in start]
        while todo:
            n = todo.pop()
            if n not in seen and n not in start:
                seen.add(n)
                todo.extend(edges.get(n, ()))
        return seen

    pred: dict[int, set[int]] = {}
    for i, cs in succ.items():
        for c in cs:
            pred.setdefault(c, set()).add(i)
    return sorted(reach(region, succ) & reach(region, pred))


def _components(members: set[int], nodes: list[Any], producer: dict[str, int],
                joinable: Callable[[int, int], bool]) -> list[list[int]]:
    """Connected components of ``members`` over producer->consumer edges that ``joinable`` accepts."""
    parent = {i: i for i in members}

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in sorted(members):
        for t in nodes[i].input:
            p = producer.get(t)
            if p in members and joinable(p, i):
                parent[find(i)] = find(p)
    groups: dict[int, list[int]] = {}
    for i in sorted(members):
        groups.setdefault(find(i), []).append(i)
    return list(groups.values())


def _convex(group: set[int], succ: dict[int, set[int]]) -> bool:
    """False if some path leaves ``group`` and comes back into it."""
    frontier = [c for i in group for c in succ[i] if c not in group]
    seen: set[int] = set()
    while frontier:
        n = frontier.pop()
        if n in seen:
            continue
        seen.add(n)
        for c in succ[n]:
            if c in group:
                return False
            frontier.append(c)
    return True
