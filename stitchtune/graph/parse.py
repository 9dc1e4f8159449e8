"""graph.json: load and validate into the immutable :class:`Graph` (size limits, shape/dtype inference).

Contract
--------
* :func:`load_graph(path)` reads a file; :func:`parse_graph(obj)` takes already-decoded JSON. Both
  return a validated :class:`Graph` or raise :class:`~stitchtune.errors.GraphError` whose
  ``problems`` list holds *every* problem found, each of the form ``"<json path>: <what is wrong>"``
  (for example ``nodes[3].args[1]: unknown tensor 'foo'``). Strings from the file are shown only
  through :func:`ascii`-style escaping, so a problem is always one printable line.
* Size limits (the ``MAX_*`` constants, re-exported here) are checked on the decoded structure before
  anything is allocated from it: file size, node/input/output counts, elements per tensor, total bytes.
* A valid graph: names match :data:`NAME_RE`; inputs and node ids are unique; args name inputs or
  *earlier* nodes (file order is a topological order) or are scalar constants (finite or infinite
  numbers); shapes broadcast as numpy's; every tensor has rank 1..6 (``MAX_RANK``) and positive dimensions; every
  node contributes to some output.
* Node dtype = promoted dtype of its float tensor args (float32 wins; float16 + bfloat16 -> float32;
  constants do not promote; float32 when every float argument is a constant); ``cast`` gives ``to``;
  arithmetic is defined in float32.
* ``bool`` tensors (graph inputs, stored one byte per element, and results of the comparisons
  ``lt le gt ge eq ne`` and of ``logical_and logical_or logical_not``) may be read only by logical
  ops, by ``where``'s first argument and by ``cast`` (bool -> float gives 0 / 1; float -> bool is
  ``x != 0``, so NaN is true) and by ``reduce_sum`` (a count). Every other argument must be a float
  (or int, see below) tensor or, for binary and ternary ops, a constant (see
  :attr:`~stitchtune.graph.ops.OpInfo.arg_types`). A bool tensor may be a graph output (one byte
  per element, 0 / 1, as ``torch.bool``; the reference returns numpy bools).
* ``int32``/``int64`` tensors are graph inputs (token ids, labels, attention masks), ``iota`` nodes
  and the results of the int ops, of casts to an int dtype and of the index maps of ints. The int
  ops (``OpInfo.ints``: add sub mul neg abs maximum minimum, the comparisons, ``where``'s branches)
  take them when *all* their numeric arguments are int (int and float never mix; constants must be
  integers in the result's range, at most 2**53 in magnitude); the result is int64 if any argument
  is, else int32; arithmetic wraps. Int tensors are also read by ``cast``, the index maps, and -- a
  graph input only -- as ``gather``'s index, and may be outputs. A ``reduce_sum`` of a bool tensor is
  a float32 count (at most 2**24 reduced elements). Semantics: docs/graph-format.md, "Integer values".
* The values themselves (:class:`Node`, :class:`TensorSpec`, ``DTYPES``, ``ITEMSIZE``,
  :func:`promote_dtypes`, :func:`broadcast_shapes`, and :class:`~stitchtune.graph.values.GraphValue`
  with the lookups and workload/structure keys) live in :mod:`stitchtune.graph.values` and are
  re-exported here: import them from either module. :class:`Graph` (a ``GraphValue`` plus
  :meth:`Graph.from_dict`) is defined here, next to the validation that builds it; import it from here.
* The limits, :data:`NAME_RE`, the problem list, the checks of single values (names, shapes, dtypes,
  constants) and of the top-level sections (keys, inputs, the node list, outputs, liveness, total
  bytes) live in :mod:`stitchtune.graph.checks`; the per-node parsing and the entry points are here.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from stitchtune.errors import GraphError
from stitchtune.graph.checks import (
    MAX_ELEMENTS,
    MAX_FILE_BYTES,
    MAX_INPUTS,
    MAX_NODES,
    MAX_OUTPUTS,
    MAX_RANK,
    MAX_TOTAL_BYTES,
    NAME_RE,
    _check_live_and_size,
    _check_top,
    _pairs_hook,
    _parse_inputs,
    _parse_outputs,
    _Problems,
    _raw_nodes,
    _Scope,
    _type_name,
)
from stitchtune.graph.values import (
    DTYPES,
    FLOAT_DTYPES,
    INT_DTYPES,
    ITEMSIZE,
    GraphValue,
    Node,
    TensorSpec,
    broadcast_shapes,
    promote_dtypes,
)
from stitchtune.graph.parse_node import _NODE_KEYS, _NodeListing, _parse_node  # noqa: F401  (_NODE_KEYS: re-exported)

__all__ = [
    "parse_graph_bytes",
    "DTYPES",
    "FLOAT_DTYPES",
    "INT_DTYPES",
    "ITEMSIZE",
    "NAME_RE",
    "MAX_NODES",
    "MAX_INPUTS",
    "MAX_OUTPUTS",
    "MAX_FILE_BYTES",
    "MAX_ELEMENTS",
    "MAX_TOTAL_BYTES",
    "MAX_RANK",
    "TensorSpec",
    "Node",
    "Graph",
    "GraphValue",
    "load_graph",
    "parse_graph",
    "promote_dtypes",
    "broadcast_shapes",
]

# ---------------------------------------------------------------------------- the validated graph
@dataclass(frozen=True)
class Graph(GraphValue):
    """A validated graph: build it with :func:`parse_graph` / :func:`load_graph` / :meth:`from_dict`
    (the fields, lookups and keys are :class:`~stitchtune.graph.values.GraphValue`'s)."""

    @classmethod
    def from_dict(cls, d: Any) -> "Graph":
        """Validate ``d`` (graph.json form) and build the graph; raises :class:`GraphError`.
        ``Graph.from_dict(g.to_dict()) == g``."""
        return parse_graph(d)


# ---------------------------------------------------------------------------- parsing
def load_graph(path: str | os.PathLike[str]) -> Graph:
    """Read and validate a graph.json file; raises :class:`GraphError` naming every problem."""
    shown = ascii(os.fspath(path))
    try:
        size = os.stat(path).st_size
    except OSError as e:
        raise GraphError(problems=[f"{shown}: cannot read graph file: {e.strerror or e}"]) from None
    if size > MAX_FILE_BYTES:
        raise GraphError(problems=[f"{shown}: too large: {size} bytes (limit {MAX_FILE_BYTES})"])
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise GraphError(problems=[f"{shown}: cannot read graph file: {e.strerror or e}"]) from None
    if len(raw) > MAX_FILE_BYTES:
        raise GraphError(problems=[f"{shown}: too large (limit {MAX_FILE_BYTES} bytes)"])
    return parse_graph_bytes(raw, source=shown)


def parse_graph_bytes(raw: bytes, source: str = "graph") -> Graph:
    """Decode UTF-8 JSON bytes and validate them (see :func:`parse_graph`)."""
    if len(raw) > MAX_FILE_BYTES:
        raise GraphError(problems=[f"{source}: too large (limit {MAX_FILE_BYTES} bytes)"])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise GraphError(problems=[f"{source}: not UTF-8 (byte offset {e.start})"]) from None
    try:
        obj = json.loads(text, object_pairs_hook=_pairs_hook)
    except json.JSONDecodeError as e:
        raise GraphError(
            problems=[f"{source}: not JSON: {e.msg} (line {e.lineno}, column {e.colno})"]) from None
    except RecursionError:
        raise GraphError(problems=[f"{source}: not JSON: nested too deeply"]) from None
    except ValueError as e:  # e.g. an integer literal over Python's 4300-digit conversion limit
        raise GraphError(problems=[f"{source}: not JSON: {str(e).split(';')[0]}"]) from None
    return parse_graph(obj)


def parse_graph(obj: Any) -> Graph:
    """Validate decoded graph.json ``obj`` and build the :class:`Graph`.

    Raises :class:`GraphError` with one ``"<json path>: <problem>"`` entry per problem found.
    """
    p = _Problems()
    if not isinstance(obj, dict):
        p.add("(top level)", f"must be a JSON object, got {_type_name(obj)}")
        p.raise_if_any()
    if "dynamic" in obj:  # one line, not a problem per named shape dim
        raise GraphError(problems=["dynamic: a graph with dynamic dims is not a static graph: stitchtune.compile "
                                   "and `stitchtune validate|search --dynamic|compile|run` take it, "
                                   "stitchtune.graph.dynamic.load_dynamic reads it"])
    name = _check_top(obj, p)
    scope = _Scope()
    inputs = _parse_inputs(obj, scope, p)
    raw_nodes = _raw_nodes(obj, p)
    listing = _NodeListing.of(raw_nodes)
    nodes: list[Node] = []
    for i, rn in enumerate(raw_nodes):
        node = _parse_node(rn, i, f"nodes[{i}]", scope, listing, p)
        if node is not None:
            nodes.append(node)
            scope.specs[node.id] = node.spec
    outputs = _parse_outputs(obj, scope, p)
    if not p:
        _check_live_and_size(inputs, nodes, outputs, scope, p)
    p.raise_if_any()
    return Graph(name=name, inputs=tuple(inputs), nodes=tuple(nodes), outputs=tuple(outputs))
