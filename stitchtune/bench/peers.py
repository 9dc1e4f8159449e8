"""Peer implementations of a :class:`~stitchtune.graph.parse.Graph`: PyTorch eager, torch.compile, JAX jit.

The peers are what a user would otherwise run; ``stitchtune bench`` times them side by side with the
tuned kernels. Each is built from the very same graph with the same semantics as
:func:`stitchtune.graph.reference.run_reference` and the generated kernels: 16-bit inputs are upcast to
float32 on load, all float arithmetic is float32, every output is cast to its graph dtype at the end,
and a ``cast`` node rounds its value to the target dtype (and continues in float32). Bools are float32
0.0 / 1.0. Int values are exact, as in the reference: each keeps its graph dtype (int32 arithmetic
wraps at 32 bits), int constants of int ops are exact integers (:func:`~stitchtune.bench.peer_ops.node_args`),
a float -> int ``cast`` truncates, saturates and gives 0 for NaN, and ``uniform`` gives the reference's
bits (:func:`~stitchtune.importers.torch_random.uniform_torch`, :func:`~stitchtune.bench.jax_peer.uniform_jax`).

Contract:

* ``torch_function(graph)`` returns ``f(**tensors) -> tuple`` of torch tensors in ``graph.outputs``
  order; the inputs are torch tensors keyed by graph input name (any device). ``torch_function(graph,
  compile_mode="default")`` (or ``"max-autotune-no-cudagraphs"``) wraps the same function with
  ``torch.compile``.
* ``jax_function(graph)`` returns the ``jax.jit``-compiled ``f(**arrays) -> tuple`` (built in
  :mod:`stitchtune.bench.jax_peer`, re-exported here).
* ``build_peers(graph, names)`` builds the requested peers (``PEER_NAMES``); a peer whose framework
  is not installed is skipped and named in the returned notes, never an error.

The torch forms of the ops live here, the JAX forms in :mod:`~stitchtune.bench.jax_peer`, what both
share in :mod:`~stitchtune.bench.peer_ops`. torch and jax are optional: they are imported inside the
functions that need them. Nothing from the graph file reaches generated source here: node ids are only
dictionary keys.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from stitchtune.bench.jax_peer import jax_function
from stitchtune.bench.peer_ops import SIXTEEN_BIT, NodeOp, mask_ops, node_args
from stitchtune.bench.peer_scatter import torch_scatter_ops
from stitchtune.deploy.torch_entry import torch_dtype
from stitchtune.errors import StitchtuneError

if TYPE_CHECKING:
    from stitchtune.graph.parse import Graph, Node

__all__ = ["PEER_NAMES", "PEER_SYSTEMS", "Peer", "PeerError", "build_peers", "jax_function", "parse_peer_names",
           "torch_function"]

log = logging.getLogger(__name__)

#: peer names accepted by ``stitchtune bench --peers`` -> system label in the results table
PEER_SYSTEMS: dict[str, str] = {
    "eager": "torch_eager",
    "inductor": "torch_compile_default",
    "inductor-max": "torch_compile_max_autotune_no_cudagraphs",
    "xla": "jax_jit",
}
PEER_NAMES: tuple[str, ...] = tuple(PEER_SYSTEMS)

#: the torch.compile mode of each torch peer (None = eager)
_TORCH_MODES: dict[str, str | None] = {
    "eager": None,
    "inductor": "default",
    "inductor-max": "max-autotune-no-cudagraphs",
}

_COMPILED = 0  # compiled torch peers built so far (names their code objects)


class PeerError(StitchtuneError):
    """A peer name is unknown (user error in ``--peers``)."""


@dataclass(frozen=True)
class Peer:
    """One runnable peer of a graph.

    ``fn(**inputs) -> tuple`` of outputs in ``graph.outputs`` order. ``framework`` is ``torch`` (inputs
    are torch tensors) or ``jax`` (inputs are jax arrays).
    """

    name: str
    system: str
    framework: str
    fn: Callable[..., tuple]


def parse_peer_names(text: str | None) -> tuple[str, ...]:
    """Parse ``eager,inductor,...`` (None or ``all`` = every peer, ``none`` or empty = no peer)."""
    if text is None or text.strip() == "all":
        return PEER_NAMES
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if names == ("none",):
        return ()
    bad = [n for n in names if n not in PEER_SYSTEMS]
    if bad:
        raise PeerError(problems=[f"--peers: unknown peer {n!r} (known: {', '.join(PEER_NAMES)})" for n in bad])
    return tuple(dict.fromkeys(names))


# ----------------------------------------------------------------------------------------------
# torch
# ----------------------------------------------------------------------------------------------


def _torch_unary() -> dict[str, Callable[[Any], Any]]:
    import torch
    import torch.nn.functional as F

    return {
        "neg": torch.neg,
        "abs": torch.abs,
        "exp": torch.exp,
        "log": torch.log,
        "sqrt": torch.sqrt,
        "rsqrt": torch.rsqrt,
        "reciprocal": torch.reciprocal,
        "square": torch.square,
        "tanh": torch.tanh,
        "sin": torch.sin,
        "cos": torch.cos,
        "sigmoid": torch.sigmoid,
        "relu": torch.relu,
        "erf": torch.erf,
        "gelu": lambda x: F.gelu(x, approximate="none"),
        "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
        "silu": F.silu,
    }


def _torch_binary() -> dict[str, Callable[[Any, Any], Any]]:
    import torch

    def _max(a: Any, b: Any) -> Any:   # a constant (float, or int beside an int tensor) clamps
        if isinstance(a, (int, float)):
            a, b = b, a
        return torch.clamp(a, min=b) if isinstance(b, (int, float)) else torch.maximum(a, b)

    def _min(a: Any, b: Any) -> Any:
        if isinstance(a, (int, float)):
            a, b = b, a
        return torch.clamp(a, max=b) if isinstance(b, (int, float)) else torch.minimum(a, b)

    return {
        "add": lambda a, b: a + b,
        "sub": lambda a, b: a - b,
        "mul": lambda a, b: a * b,
        "div": lambda a, b: a / b,
        "pow": lambda a, b: a ** b,
        "maximum": _max,
        "minimum": _min,
    }


def _torch_masks() -> dict[str, Callable[..., Any]]:
    """Comparisons, logical ops, where and clamp on float32 tensors (or Python floats) whose bools
    are 0.0 / 1.0, as in the reference (``graph/ops.py``); comparisons and ``where``'s branches also
    on int tensors (and Python ints)."""
    import torch

    def f(x: Any) -> Any:
        return x.to(torch.float32)

    def t(v: Any, like: Any) -> Any:
        return torch.as_tensor(v, dtype=torch.float32, device=like.device) if isinstance(v, float) else v

    def clamp(x: Any, lo: Any, hi: Any) -> Any:
        like = next(a for a in (x, lo, hi) if not isinstance(a, float))
        return torch.minimum(torch.maximum(t(x, like), t(lo, like)), t(hi, like))

    return mask_ops(f, lambda c, a, b: torch.where(c != 0, t(a, c), t(b, c)), clamp)


def _torch_reduce() -> dict[str, Callable[..., Any]]:
    import torch

    return {
        "reduce_sum": lambda x, axes, keep: torch.sum(x, dim=axes, keepdim=keep),
        "reduce_mean": lambda x, axes, keep: torch.mean(x, dim=axes, keepdim=keep),
        "reduce_max": lambda x, axes, keep: torch.amax(x, dim=axes, keepdim=keep),
        "reduce_min": lambda x, axes, keep: torch.amin(x, dim=axes, keepdim=keep),
    }


def _torch_index_ops() -> dict[str, NodeOp]:
    """slice, concat, gather, gather_elements, uniform and iota on torch tensors, as the reference."""
    import torch

    def concat(node: Node, args: list[Any]) -> Any:
        if node.axis is None:
            raise ValueError(f"peers: concat {node.id} has no axis")  # a bug: the parser sets it
        return torch.cat(args, dim=node.axis)

    def gather(node: Node, args: list[Any]) -> Any:  # out-of-range index: a zero row, as the reference
        table, idx = args
        ok = (idx >= 0) & (idx < table.shape[0])
        rows = table[idx.clamp(0, table.shape[0] - 1)]
        return rows * ok.reshape(ok.shape + (1,) * (table.dim() - 1)).to(rows.dtype)

    def gather_elements(node: Node, args: list[Any]) -> Any:  # torch.gather; out-of-range index: 0, as the reference
        x, idx = args
        ax = int(node.axis or 0)
        part = x[tuple(slice(0, d) if k != ax else slice(None) for k, d in enumerate(idx.shape))]
        ok = (idx >= 0) & (idx < x.shape[ax])
        return torch.gather(part, ax, idx.clamp(0, x.shape[ax] - 1).long()) * ok.to(x.dtype)

    def uniform(node: Node, args: list[Any]) -> Any:   # the same bits as the kernels' (importers/torch_random.py)
        from stitchtune.importers.torch_random import uniform_torch

        return uniform_torch(args[0], args[1])

    def iota(node: Node, args: list[Any]) -> Any:
        shape, ax = tuple(node.shape), int(node.axis or 0)
        line = torch.arange(shape[ax], dtype=torch_dtype(node.dtype))
        return line.reshape([-1 if d == ax else 1 for d in range(len(shape))]).expand(shape)

    return {"slice": lambda node, args: args[0].narrow(node.axis, node.start, node.stop - node.start),
            "concat": concat, "gather": gather, "gather_elements": gather_elements, "uniform": uniform, "iota": iota}


def _torch_layout_ops() -> dict[str, NodeOp]:
    """cast (bools as 0.0 / 1.0, ints as int32 / int64 as the reference's ``cast_value``, 16-bit types
    rounded to and computed on in float32), transpose, reshape and expand on torch tensors."""
    import torch

    def float_to_int(x: Any, dt: Any) -> Any:  # graph/int_ops.float_to_int: truncate, NaN -> 0, saturate
        info = torch.iinfo(dt)
        t = torch.trunc(x)
        lim = -float(info.min)   # 2**(bits - 1), exact in float32
        v = torch.where(torch.isfinite(t) & (t >= -lim) & (t < lim), t, 0.0).to(dt)
        return torch.where(t >= lim, info.max, torch.where(t < -lim, info.min, v))

    def cast(node: Node, args: list[Any]) -> Any:
        to, x = node.to or node.dtype, args[0]
        if to == "bool":
            return (x != 0).to(torch.float32)
        if to in ("int32", "int64"):   # int -> int keeps the low bits; float -> int truncates
            return float_to_int(x, torch_dtype(to)) if x.is_floating_point() else x.to(torch_dtype(to))
        if not x.is_floating_point():   # an int value made float: the nearest float32 (then rounded)
            x = x.to(torch.float32)
        if to in SIXTEEN_BIT:  # round to the target type, keep computing in float32
            return x.to(torch_dtype(to)).to(torch.float32)
        return x

    return {"cast": cast,
            "transpose": lambda node, args: args[0].permute(*node.perm),
            "reshape": lambda node, args: args[0].reshape(node.shape),
            "expand": lambda node, args: args[0].expand(*node.shape)}


def _torch_body(graph: Graph) -> Callable[..., tuple]:
    """The eager float32 function of ``graph`` taking inputs positionally in ``graph.inputs`` order."""
    import torch

    unary, binary, reduce, masks = _torch_unary(), _torch_binary(), _torch_reduce(), _torch_masks()
    node_ops = {**_torch_index_ops(), **_torch_layout_ops(), **torch_scatter_ops()}
    names = [n for n, _ in graph.inputs]
    nodes = graph.nodes
    outputs = graph.outputs
    out_dtypes = [torch_dtype(graph.spec(o).dtype) for o in outputs]

    def is_int(v: Any) -> bool:
        return not v.is_floating_point()

    def run_node(node: Node, env: dict[str, Any]) -> Any:
        args = node_args(node, env, is_int)
        op = node.op
        if op in unary:
            if isinstance(args[0], float):
                args[0] = torch.tensor(args[0], dtype=torch.float32)
            return unary[op](args[0])
        if op in binary:
            if isinstance(args[0], float) and isinstance(args[1], float):
                args[0] = torch.tensor(args[0], dtype=torch.float32)
            return binary[op](args[0], args[1])
        if op in reduce:
            return reduce[op](args[0], tuple(node.axes), bool(node.keepdims))
        if op in masks:
            return masks[op](*args)
        if op in node_ops:
            return node_ops[op](node, args)
        raise ValueError(f"peers: op {op!r} has no torch implementation")  # a bug: graph validated ops

    def body(*tensors: Any) -> tuple:
        env: dict[str, Any] = {}
        for name, t in zip(names, tensors):
            if t.dtype in (torch.int32, torch.int64):  # ints keep their width (int32 arithmetic wraps)
                env[name] = t
            else:
                env[name] = t.to(torch.float32) if t.dtype != torch.float32 else t
        for node in nodes:
            env[node.id] = run_node(node, env)
        return tuple(env[o].to(dt) for o, dt in zip(outputs, out_dtypes))

    return body


def torch_function(graph: Graph, compile_mode: str | None = None) -> Callable[..., tuple]:
    """``f(**tensors) -> tuple`` computing ``graph`` with torch (eager, or ``torch.compile(mode=...)``).

    Raises ``ImportError`` when torch is not installed.
    """
    import torch

    body = _torch_body(graph)
    if compile_mode is not None:
        # dynamo caches compiled code per *code object* (cache_size_limit entries): every graph and mode
        # gets a fresh code object so that many compiled peers never evict each other or fall back to eager
        global _COMPILED
        _COMPILED += 1
        code = body.__code__.replace(co_name=f"stitchtune_peer_{_COMPILED}")
        body = types.FunctionType(code, body.__globals__, code.co_name, body.__defaults__, body.__closure__)
    fn = body if compile_mode is None else torch.compile(body, mode=compile_mode, dynamic=False)
    names = [n for n, _ in graph.inputs]

    def call(**tensors: Any) -> tuple:
        return fn(*[tensors[n] for n in names])

    return call


# ----------------------------------------------------------------------------------------------
# peer set
# ----------------------------------------------------------------------------------------------


def build_peers(graph: Graph, names: tuple[str, ...] = PEER_NAMES) -> tuple[list[Peer], list[str]]:
    """Build the peers ``names`` of ``graph``. Returns (peers, notes); a framework that cannot be
    imported skips its peers with a note. ``torch.compile`` is lazy: compilation happens on first call.
    """
    peers: list[Peer] = []
    notes: list[str] = []
    for name in names:
        if name not in PEER_SYSTEMS:
            raise PeerError(f"unknown peer {name!r} (known: {', '.join(PEER_NAMES)})")
        system = PEER_SYSTEMS[name]
        try:
            if name == "xla":
                peers.append(Peer(name, system, "jax", jax_function(graph)))
            else:
                peers.append(Peer(name, system, "torch", torch_function(graph, _TORCH_MODES[name])))
        except ImportError as exc:
            notes.append(f"{system}: skipped ({exc.name or 'framework'} not installed)")
            log.info("peer %s skipped: %s", name, exc)
    return peers, notes
