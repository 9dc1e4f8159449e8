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
from dataclasses import dataclass, field
from typing import Any

__all__ = ["COMPUTE_OPS", "OnnxRegion", "Partition", "label", "partition", "regions"]

COMPUTE_OPS: frozenset[str] = frozenset({
    "MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum", "MatMulInteger", "ConvInteger", "QLinearMatMul",
    "QLinearConv", "FusedMatMul", "Attention", "MultiHeadAttention", "LSTM", "GRU", "RNN",
    "MaxPool", "AveragePool", "LpPool"})   # windowed pooling: graph.json has no windows


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
    groups: list[list[int]]               # node indices of each group (core + pulled), ascending
    consumers: dict[str, set[int]]        # tensor -> nodes reading it
    producer: dict[str, int]
    succ: dict[int, set[int]]
    cores: list[set[int]] = field(default_factory=list)   # per group: its own nodes (not pulled ones)

    def external(self, nodes: list[Any], mappable: Container[int], outputs: set[str]) -> set[str]:
        """Tensors that must leave the group making them: model ``outputs``, tensors read by a node
        outside ``mappable``, and tensors some group reads but does not compute itself."""
        out = set(outputs)
        out |= {t for t, cs in self.consumers.items() if any(c not in mappable for c in cs)}
        for g in self.groups:
            made = {t for i in g for t in nodes[i].output if t}
            out |= {t for i in g for t in nodes[i].input if t and t not in made}
        return out


def _pull(start: set[int], nodes: list[Any], producer: dict[str, int], pullable: Container[int]) -> set[int]:
    """The ``pullable`` nodes that ``start`` reads through chains of ``pullable`` nodes."""
    out: set[int] = set()
    todo = [producer[t] for i in start for t in nodes[i].input if t in producer]
    while todo:
        p = todo.pop()
        if p in out or p not in pullable:
            continue
        out.add(p)
        todo.extend(producer[t] for t in nodes[p].input if t in producer)
    return out


def _roots(i: int, nodes: list[Any], producer: dict[str, int], pullable: Container[int]) -> set[int]:
    """The producers of ``i``'s inputs, looking through ``pullable`` producers to what they read."""
    out: set[int] = set()
    seen: set[int] = set()
    todo = [producer[t] for t in nodes[i].input if t in producer]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        if p in pullable:
            todo.extend(producer[t] for t in nodes[p].input if t in producer)
        else:
            out.add(p)
    return out


def _home(comp: set[int], cores: list[set[int]], nodes: list[Any], producer: dict[str, int],
          pullable: Container[int]) -> int | None:
    """The first of ``cores`` that ``comp`` reads (through ``pullable`` nodes), or None."""
    roots = set().union(*(_roots(i, nodes, producer, pullable) for i in comp)) - comp
    return next((k for k, c in enumerate(cores) if c & roots), None)


def partition(nodes: list[Any], mappable: set[int], consts: Container[str],
              pullable: frozenset[int] = frozenset(), outputs: Container[str] = ()) -> Partition:
    """Maximal convex groups of ``mappable`` nodes (see the module docstring). ``pullable`` nodes
    (cheap: views and element-wise ops of model inputs) join no group by themselves: every group
    recomputes the ones it reads; those read outside every group (by boundary nodes or as model
    ``outputs``) also form groups of their own."""
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
    pullable = frozenset(pullable) & frozenset(mappable)
    core = set(mappable) - pullable
    edges = {i: _roots(i, nodes, producer, pullable) for i in core}
    cores: list[set[int]] = []
    # widest first: connected components; a component that a path leaves and re-enters through a
    # boundary node cannot be one kernel, so it is split by stage (always convex)
    for comp in _components(core, edges, lambda p, i: True):
        if _convex(set(comp) | _pull(set(comp), nodes, producer, pullable), succ):
            cores.append(set(comp))
        else:
            cores.extend(set(c) for c in _components(set(comp), edges,
                                                     lambda p, i: node_stage[p] == node_stage[i]))
    pulled = [_pull(c, nodes, producer, pullable) for c in cores]
    used = set().union(*pulled) if pulled else set()
    needed = {q for q in pullable if q not in used or any(
        t in outputs or (consumers.get(t, set()) - set(mappable)) for t in nodes[q].output if t)}
    direct = {q: {p for t in nodes[q].input if (p := producer.get(t)) is not None} for q in needed}
    for comp in _components(needed, direct, lambda p, i: True):
        home = _home(set(comp), cores, nodes, producer, pullable)
        if home is None:   # reads only model inputs: a group of its own
            cores.append(set(comp))
            pulled.append(_pull(set(comp), nodes, producer, pullable) - set(comp))
        else:              # a view of a group's value read outside: the group hands it on
            cores[home] |= set(comp)
            pulled[home] |= _pull(set(comp), nodes, producer, pullable)
    order = sorted(range(len(cores)), key=lambda k: min(cores[k]))
    groups = [sorted(cores[k] | pulled[k]) for k in order]
    return Partition(groups=groups, consumers=consumers, producer=producer, succ=succ,
                     cores=[cores[k] for k in order])


def regions(nodes: list[Any], in_range: set[int], reasons: dict[int, str | None], part: Partition,
            fate: list[str], pre: frozenset[int] = frozenset()) -> tuple[OnnxRegion, ...]:
    """The memory-intensive regions of the model and what became of each (``fate[k]``: the graph
    made from group ``k``, ``"no-op"`` or ``"unused"``). ``pre`` nodes (cheap nodes that read only
    model inputs and constants, and views) belong to every region that reads them, so one mask
    chain feeding every layer does not join the layers into one region."""
    members = {i for i in in_range if nodes[i].op_type != "Constant" and nodes[i].op_type not in COMPUTE_OPS}
    pre_m = frozenset(pre) & members
    core = members - pre_m
    edges = {i: {p for p in _roots(i, nodes, part.producer, pre_m) if p in core} for i in core}
    comps = [(set(c), _pull(set(c), nodes, part.producer, pre_m)) for c in _components(core, edges, lambda p, i: True)]
    used = set().union(*(p for _, p in comps)) if comps else set()
    rest = pre_m - used
    direct = {q: {p for t in nodes[q].input if (p := part.producer.get(t)) is not None} for q in rest}
    for c in _components(set(rest), direct, lambda p, i: True):
        home = _home(set(c), [own for own, _ in comps], nodes, part.producer, pre_m)
        if home is None:
            comps.append((set(c), _pull(set(c), nodes, part.producer, pre_m) - set(c)))
        else:
            comps[home][1].update(set(c) | _pull(set(c), nodes, part.producer, pre_m))
    out = []
    for own, attached in sorted(comps, key=lambda c: min(c[0])):
        region = sorted(own | attached)
        gids = [k for k, c in enumerate(part.cores) if c & own]
        names = tuple(fate[k] for k in gids if fate[k] not in ("no-op", "unused"))
        stopped = [f"{label(i, nodes[i])}: {reasons[i]}" for i in region if reasons[i] is not None]
        if not stopped and len(gids) > 1:
            between = _between(own, part.succ)
            between = [i for i in between if nodes[i].op_type in COMPUTE_OPS] or between
            stopped = [f"{label(i, nodes[i])}: a path leaves the region through it and comes back"
                       for i in between]
        if names and not stopped and len(gids) == 1:
            status = "whole"
        elif names:
            status = "cut"
        elif gids and all(fate[k] == "no-op" for k in gids):
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


def _components(members: set[int], edges: dict[int, set[int]],
                joinable: Callable[[int, int], bool]) -> list[list[int]]:
    """Connected components of ``members`` over the edges ``i -> edges[i]`` that ``joinable`` accepts."""
    parent = {i: i for i in members}

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in sorted(members):
        for p in edges.get(i, ()):
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
