"""How far apart two workloads' shapes are: the nearest-shape rule of :mod:`stitchtune.deploy.selection`
(:func:`shape_distance` over the tensors both name, :func:`graph_shapes` of a graph as the tuning
database's ``shapes`` column holds them, :func:`parse_shapes` of that column)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stitchtune.graph.parse import Graph

__all__ = ["graph_shapes", "parse_shapes", "shape_distance"]


def graph_shapes(graph: Graph) -> dict[str, list[int]]:
    """{tensor: shape} of the graph's inputs and outputs (the database's ``shapes`` column)."""
    shapes = {name: list(spec.shape) for name, spec in graph.inputs}
    for out in graph.outputs:
        shapes[out] = list(graph.spec(out).shape)
    return shapes


def shape_distance(a: Mapping[str, Any], b: Mapping[str, Any]) -> float:
    """``sum over tensors named in both, over dims, of |log2(a_d / b_d)|``; ``inf`` when no tensor is
    shared or a shared tensor differs in rank (or has a non-positive dim)."""
    common = [k for k in a if k in b]
    if not common:
        return math.inf
    total = 0.0
    for k in common:
        sa, sb = list(a[k]), list(b[k])
        if len(sa) != len(sb):
            return math.inf
        for x, y in zip(sa, sb):
            if int(x) <= 0 or int(y) <= 0:
                return math.inf
            total += abs(math.log2(int(x) / int(y)))
    return total


def parse_shapes(text: Any) -> dict[str, Any] | None:
    """The database's ``shapes`` column of one row (JSON text) as a dict; None when it is not one."""
    try:
        d = json.loads(str(text))
    except (json.JSONDecodeError, TypeError, RecursionError):
        return None
    return d if isinstance(d, dict) else None
