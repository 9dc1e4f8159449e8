"""PyTorch regions, grouping: the candidate nodes of an fx graph split into maximal convex groups.

:func:`_groups` is what :func:`stitchtune.importers.torch_regions.find_regions` maps (one region
attempt per group): connected candidates, split by stage where a path would leave a group and
re-enter it, then parts linked by an edge joined again while their union stays convex.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

from stitchtune.importers.torch_candidates import _Excluded
from stitchtune.importers.torch_fx_util import fx_args


def _components(members: Iterable[Any], same: Callable[[Any, Any], bool]) -> list[list[Any]]:
    """Connected components of ``members`` over producer->consumer edges where ``same(a, b)``."""
    member = set(members)
    parent = {n: n for n in member}

    def find(n: Any) -> Any:
        while parent[n] is not n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for n in member:
        for a in fx_args(n):
            if a in member and same(a, n):
                parent[find(a)] = find(n)
    comps: dict[Any, list[Any]] = {}
    for n in member:
        comps.setdefault(find(n), []).append(n)
    return list(comps.values())


def _convex(group: set[Any]) -> bool:
    """No path leaves ``group`` and re-enters it."""
    frontier = [u for n in group for u in n.users if u not in group]
    seen = set(frontier)
    while frontier:
        n = frontier.pop()
        for u in n.users:
            if u in group:
                return False
            if u not in seen:
                seen.add(u)
                frontier.append(u)
    return True


def _groups(nodes: Sequence[Any], ex: _Excluded) -> list[list[Any]]:
    """Maximal convex groups of candidates, each in graph order; no group joins the two ends of an
    edge in ``ex.cuts`` (:func:`stitchtune.importers.torch_cuts.chain_cut`)."""
    order = {n: i for i, n in enumerate(nodes)}
    stage: dict[Any, int] = {}
    node_stage: dict[Any, int] = {}
    for n in nodes:
        s = max((stage.get(a, 0) for a in fx_args(n)), default=0)
        node_stage[n] = s
        stage[n] = s + 1 if n in ex and n not in ex.pulled else s
    cands = [n for n in nodes if n not in ex]
    out: list[list[Any]] = []
    cuts = ex.cuts
    for comp in _components(cands, lambda a, b: (a, b) not in cuts):
        parts = [comp] if _convex(set(comp)) else _merge_convex(
            _components(comp, lambda a, b: node_stage[a] == node_stage[b] and (a, b) not in cuts), cuts)
        out.extend(sorted(p, key=order.__getitem__) for p in parts)
    return sorted(out, key=lambda g: order[g[0]])


def _merge_convex(parts: list[list[Any]], cuts: Collection[tuple[Any, Any]] = ()) -> list[list[Any]]:
    """Join parts linked by an edge (not one of ``cuts``) while their union stays convex (the split by
    stage is coarse: an embedding whose ids come from integer ops has a later stage than the one it is
    added to)."""
    sets = [set(p) for p in parts]
    merged = True
    while merged:
        merged = False
        for i in range(len(sets)):
            for j in range(i + 1, len(sets)):
                linked = any(a in sets[j] and (a, n) not in cuts for n in sets[i] for a in fx_args(n)) or \
                    any(a in sets[i] and (a, n) not in cuts for n in sets[j] for a in fx_args(n))
                if linked and _convex(sets[i] | sets[j]):
                    sets[i] |= sets.pop(j)
                    merged = True
                    break
            if merged:
                break
    return [list(p) for p in sets]
