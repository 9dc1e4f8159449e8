"""The immutable graph values: :class:`TensorSpec`, :class:`Node`, :class:`GraphValue`; dtype/shape rules; keys.

Contract
--------
* These are plain frozen values. :class:`GraphValue` is what a graph *is* (its tensors and nodes,
  lookups, graph.json form and keys); the validated graph everyone uses is its subclass
  :class:`stitchtune.graph.parse.Graph`, built only through validation (:func:`~stitchtune.graph.parse.parse_graph`
  / :func:`~stitchtune.graph.parse.load_graph` / ``Graph.from_dict``), which guarantees the invariants
  listed in :mod:`stitchtune.graph.parse`. Nothing here validates or reads files, and this module
  imports nothing of :mod:`stitchtune.graph.parse`, which re-exports every public name of this module.
* :func:`promote_dtypes` (of float dtypes; ``bool`` never promotes, see graph/parse.py): float32
  wins; float16 + bfloat16 -> float32 (constants do not promote).
  :func:`broadcast_shapes`: numpy broadcasting, ``None`` when the shapes do not broadcast.
* :meth:`Graph.workload_key` is a canonical structural hash: invariant to node-id renaming and to
  reordering independent nodes (and to input order and the graph name); it changes with any op,
  constant, axis, keepdims, cast target, shape, dtype, input name or output order.
  :meth:`Graph.structure_key` is the same with every dimension reduced to "1 or not 1" (rank,
  dtypes and broadcast pattern kept), for nearest-shape reuse.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable, Iterable

from stitchtune.graph.ops import OPS

__all__ = [
    "DTYPES",
    "FLOAT_DTYPES",
    "INT_DTYPES",
    "INPUT_ONLY_DTYPES",
    "ITEMSIZE",
    "TensorSpec",
    "Node",
    "GraphValue",
    "promote_dtypes",
    "broadcast_shapes",
]

#: graph dtypes; ``bool`` is stored one byte per element (0 or 1) and holds comparison results and masks;
#: ``int32``/``int64`` are graph inputs (gather indices, masks; read by cast and index maps, see graph/parse.py);
#: ``float64`` is a graph input read only by ``cast`` (a framework's float64 scalar: kernels load it rounded to
#: float32, never compute or store float64, :data:`INPUT_ONLY_DTYPES`)
DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16", "bool", "int32", "int64", "float64")
FLOAT_DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16")
INT_DTYPES: tuple[str, ...] = ("int32", "int64")
ITEMSIZE: dict[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2, "bool": 1, "int32": 4, "int64": 8,
                            "float64": 8}
#: dtypes a graph input may have but no node produces, read only by ``cast`` (to a dtype of the graph)
INPUT_ONLY_DTYPES: tuple[str, ...] = ("float64",)
_KEY_VERSION = "stitchtune-workload-v1"


# ---------------------------------------------------------------------------- values
@dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype of a tensor (an input or a node result)."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * ITEMSIZE[self.dtype]


@dataclass(frozen=True)
class Node:
    """One operator application. ``args``: a ``str`` names a tensor, a ``float`` is a scalar constant.

    ``axes`` (reductions) are normalised, non-negative and sorted; ``shape``/``dtype`` are inferred.
    ``axis`` (slice, concat, gather) is normalised and non-negative; ``start``/``stop`` (slice) are
    normalised so that ``0 <= start < stop <= dim`` (step 1).
    (For ``reshape`` and ``expand`` the shape is the target given in the file.) ``perm`` is ``transpose``'s
    permutation of the argument's dims (numpy semantics), ``()`` for every other op.
    """

    id: str
    op: str
    args: tuple[str | float, ...]
    axes: tuple[int, ...] = ()
    keepdims: bool = False
    to: str | None = None
    shape: tuple[int, ...] = ()
    dtype: str = "float32"
    axis: int | None = None
    start: int = 0
    stop: int = 0
    perm: tuple[int, ...] = ()

    @property
    def spec(self) -> TensorSpec:
        return TensorSpec(self.shape, self.dtype)

    @property
    def tensor_args(self) -> tuple[str, ...]:
        return tuple(a for a in self.args if isinstance(a, str))

    @property
    def kind(self) -> str:
        return OPS[self.op].kind


@dataclass(frozen=True)
class GraphValue:
    """A graph's structure and what is derived from it (no validation: the validated graph is
    :class:`stitchtune.graph.parse.Graph`, this class plus ``from_dict``)."""

    name: str
    inputs: tuple[tuple[str, TensorSpec], ...]  # in file order
    nodes: tuple[Node, ...]  # topological order as validated
    outputs: tuple[str, ...]

    # -- lookups (cached; the dataclass stays immutable)
    @cached_property
    def _specs(self) -> dict[str, TensorSpec]:
        d: dict[str, TensorSpec] = dict(self.inputs)
        for n in self.nodes:
            d[n.id] = n.spec
        return d

    @cached_property
    def _nodes(self) -> dict[str, Node]:
        return {n.id: n for n in self.nodes}

    @cached_property
    def _consumers(self) -> dict[str, tuple[Node, ...]]:
        d: dict[str, list[Node]] = {}
        for n in self.nodes:
            for a in dict.fromkeys(n.tensor_args):
                d.setdefault(a, []).append(n)
        return {k: tuple(v) for k, v in d.items()}

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.inputs)

    def is_input(self, name: str) -> bool:
        return name in dict(self.inputs)

    def spec(self, name: str) -> TensorSpec:
        """Shape and dtype of an input or node; ``KeyError`` if unknown."""
        return self._specs[name]

    def node(self, name: str) -> Node:
        """The node with id ``name``; ``KeyError`` if it is an input or unknown."""
        return self._nodes[name]

    def consumers(self, name: str) -> tuple[Node, ...]:
        """Nodes that read tensor ``name`` (each once, in topological order)."""
        return self._consumers.get(name, ())

    def upstream(self, starts: Iterable[str], through: Callable[[Node], bool] = lambda _: True) -> frozenset[str]:
        """``starts`` and every tensor they are computed from, walking up from a node to its tensor
        arguments only where ``through(node)`` holds (a node it refuses is in the result, what it reads
        is not, unless reached another way); inputs end the walk."""
        seen: set[str] = set()
        stack = list(starts)
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            nd = self._nodes.get(name)
            if nd is not None and through(nd):
                stack.extend(nd.tensor_args)
        return frozenset(seen)

    # -- persistence
    def to_dict(self) -> dict[str, Any]:
        """The graph.json form; ``parse_graph(g.to_dict()) == g``."""
        nodes = []
        for n in self.nodes:
            d: dict[str, Any] = {"id": n.id, "op": n.op, "args": list(n.args)}
            if OPS[n.op].kind == "reduce":
                d["axes"] = list(n.axes)
                d["keepdims"] = n.keepdims
            if n.op == "cast":
                d["to"] = n.to
            if n.op == "transpose":
                d["perm"] = list(n.perm)
            if n.op in ("reshape", "expand", "iota", "scatter_add"):
                d["shape"] = list(n.shape)
            if n.op == "iota":
                d["dtype"] = n.dtype
            if n.axis is not None:
                d["axis"] = n.axis
            if n.op == "slice":
                d["start"], d["stop"] = n.start, n.stop
            nodes.append(d)
        return {
            "name": self.name,
            "inputs": {k: {"shape": list(s.shape), "dtype": s.dtype} for k, s in self.inputs},
            "nodes": nodes,
            "outputs": list(self.outputs),
        }

    # -- keys
    def _canonical(self, shapes: bool) -> str:
        memo: dict[str, str] = {}

        def dims(shape: tuple[int, ...]) -> list[Any]:
            return list(shape) if shapes else [1 if s == 1 else "n" for s in shape]

        def h(obj: Any) -> str:
            text = json.dumps(obj, separators=(",", ":"), sort_keys=True)
            return hashlib.sha256(text.encode()).hexdigest()

        for name, s in self.inputs:
            memo[name] = h(["input", name, dims(s.shape), s.dtype])
        for n in self.nodes:
            args = [memo[a] if isinstance(a, str) else ["const", float(a).hex()] for a in n.args]
            if OPS[n.op].commutative:
                args = sorted(args, key=lambda v: json.dumps(v))
            fields = ["node", n.op, list(n.axes), n.keepdims, n.to, dims(n.shape), n.dtype, args]
            if n.axis is not None:  # slice / concat / gather (keys of other nodes are unchanged)
                fields.append([n.axis, n.start, n.stop])
            if n.perm:  # transpose (keys of other nodes are unchanged)
                fields.append(list(n.perm))
            memo[n.id] = h(fields)
        inputs = sorted([name, dims(s.shape), s.dtype] for name, s in self.inputs)
        return h([_KEY_VERSION, inputs, [memo[o] for o in self.outputs]])

    def workload_key(self) -> str:
        """Hex sha256 of the canonical structure + shapes + dtypes + constants (see module doc)."""
        return self._canonical(shapes=True)

    def structure_key(self) -> str:
        """Like :meth:`workload_key` but shape-free: only rank and which dims are 1 are kept."""
        return self._canonical(shapes=False)

    def input_read_bytes(self) -> dict[str, int]:
        """Graph input -> the bytes a perfect kernel must read of it: the whole tensor, except an input
        whose every reader takes it as the source of ``gather`` / ``gather_elements``: at most
        ``min(tensor, index count x row bytes)`` summed over those gathers (``gather``: the index's
        elements x one table row; ``gather_elements``: the index's elements x one element). The index
        count bounds the rows read from above whatever the indices are (which rows repeat is data);
        an input that is also read any other way counts whole."""
        out: dict[str, int] = {}
        for name, spec in self.inputs:
            users = self.consumers(name)
            gathered = 0
            for n in users:
                if OPS[n.op].kind not in ("gather", "gather_elements") or n.tensor_args[0] != name \
                        or name in n.tensor_args[1:]:
                    gathered = -1
                    break
                idx = self.spec(n.tensor_args[1]).numel
                per = spec.nbytes // max(spec.shape[0], 1) if n.op == "gather" else ITEMSIZE[spec.dtype]
                gathered += idx * per
            out[name] = spec.nbytes if gathered < 0 or not users or name in self.outputs \
                else min(spec.nbytes, gathered)
        return out

    def min_bytes(self) -> int:
        """Bytes a perfect kernel moves (the DRAM floor): every input read once, a gathered table at
        most the rows its indices name (:meth:`input_read_bytes`), + every distinct output written once."""
        total = sum(self.input_read_bytes().values())
        total += sum(self.spec(o).nbytes for o in dict.fromkeys(self.outputs))
        return total

    def io_bytes(self) -> int:
        """Bytes the graph's tensors occupy: every input whole + every distinct output (what must fit in
        the device's memory; :meth:`min_bytes` or more)."""
        total = sum(s.nbytes for _, s in self.inputs)
        total += sum(self.spec(o).nbytes for o in dict.fromkeys(self.outputs))
        return total

    def reductions(self) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if OPS[n.op].kind == "reduce")


# ---------------------------------------------------------------------------- dtype / shape rules
def promote_dtypes(dtypes: Iterable[str]) -> str:
    """float32 if any is float32 or float16 meets bfloat16; otherwise the common dtype."""
    ds = set(dtypes)
    if not ds:
        return "float32"
    if len(ds) == 1:
        return next(iter(ds))
    return "float32"


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...] | None:
    """numpy broadcasting of ``shapes``; ``None`` if they do not broadcast."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(rank):
        dim = 1
        for s in shapes:
            j = i - (rank - len(s))
            if j < 0:
                continue
            d = s[j]
            if d == 1:
                continue
            if dim != 1 and dim != d:
                return None
            dim = d
        out.append(dim)
    return tuple(out)
