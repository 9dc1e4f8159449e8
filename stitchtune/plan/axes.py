"""Which axes of the iteration domain each tensor of a region spans (the first step of planning).

Every dimension of every tensor is mapped to a tuple of *domain axes* (row-major inside the
dimension; ``()`` for a size-1 dimension, along which the tensor broadcasts). Axes are found by
propagation in graph order: each input dimension of size > 1 starts as a fresh axis; a broadcasting
op (numpy semantics, right-aligned) *unifies* the axes its arguments meet on; a reduction drops (or,
with ``keepdims``, empties) its reduced dimensions; ``transpose`` permutes the dimensions; ``reshape``
regroups the source's axes into the target dimensions; ``expand`` gives each dim it grows from 1 (or
adds) a fresh axis, along which its source broadcasts (Llama's ``repeat_kv``: ``[B, Hkv, 1, S, D]``
expanded to ``[B, Hkv, n, S, D]`` and merged to ``[B, Hkv*n, S, D]`` reads head ``h`` at ``h // n``). Unifying or regrouping two runs of axes of the
same total size splits an axis where one run has a finer factorisation (an input ``[N, C, H, W]``
reshaped to ``[N, G, C/G, H*W]`` splits the axis of ``C`` into ``G`` and ``C/G`` everywhere), so at
the end every tensor is a sub-product of one set of axes.

Contract (:func:`tensor_axes`): the result's ``order`` is the layout of the *domain tensor* (the
largest tensor, the one with the higher rank on a tie, the first in graph order after that; or the
one named by ``domain``, see :func:`domain_candidates`): the domain axes in row-major order, every axis of size > 1 and every axis some tensor spans (an input
whose axes never meet the domain tensor's is aligned to it by broadcasting; an input nothing reads,
:func:`unread_inputs`, spans no axis and is never the domain tensor). Each tensor
spans each axis at most once (``x + transpose(x)``, a diagonal, is refused). A
:class:`~stitchtune.plan.refusal.Refusal` naming the node is returned where no such axes
exist: a reshape that does not only split and merge axes consistently, or a broadcast of values
along different axes against each other.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from math import prod

from stitchtune.graph.ops import OPS
from stitchtune.graph.parse import Graph, Node
from stitchtune.plan.refusal import Refusal

Groups = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class TensorAxes:
    """The result of :func:`tensor_axes`: axis sizes, the domain order and each tensor's groups."""

    sizes: tuple[tuple[int, int], ...]       # axis id -> extent (> 1)
    order: tuple[int, ...]                   # the domain axes, row-major (the domain tensor's layout)
    groups: tuple[tuple[str, Groups], ...]   # tensor name -> the axes of each of its dims

    @property
    def size_of(self) -> dict[int, int]:
        return dict(self.sizes)

    @property
    def of(self) -> dict[str, Groups]:
        return dict(self.groups)


class _AxisError(Exception):
    """Two runs of axes cannot be made one (sizes that do not divide)."""


class _Builder:
    """Mutable state of the propagation: axis sizes and every tensor's groups so far."""

    def __init__(self) -> None:
        self.sizes: dict[int, int] = {}
        self.groups: dict[str, list[tuple[int, ...] | None]] = {}
        self.next_id = 0

    def fresh(self, size: int) -> int:
        self.next_id += 1
        self.sizes[self.next_id] = size
        return self.next_id

    def substitute(self, a: int, repl: tuple[int, ...], runs: list[list[int]]) -> None:
        """Replace axis ``a`` by the run ``repl`` in every tensor's groups and in the working ``runs``."""
        def sub(g: tuple[int, ...]) -> tuple[int, ...]:
            return tuple(x for b in g for x in (repl if b == a else (b,)))
        for gs in self.groups.values():
            for k, g in enumerate(gs):
                if g is not None and a in g:
                    gs[k] = sub(g)
        for run in runs:
            run[:] = list(sub(tuple(run)))

    def split(self, a: int, outer: int, runs: list[list[int]]) -> None:
        """Split axis ``a`` into an outer axis of extent ``outer`` and an inner one (everywhere)."""
        size = self.sizes[a]
        if size % outer:
            raise _AxisError
        hi, lo = self.fresh(outer), self.fresh(size // outer)
        self.substitute(a, (hi, lo), runs)

    def unify(self, g1: tuple[int, ...], g2: tuple[int, ...]) -> None:
        """Make the runs ``g1`` and ``g2`` (the same total extent) the same axes."""
        a, b = list(g1), list(g2)
        i = 0
        while i < len(a) and i < len(b):
            x, y = a[i], b[i]
            sx, sy = self.sizes[x], self.sizes[y]
            if x == y:
                i += 1
            elif sx == sy:
                self.substitute(y, (x,), [a, b])
                i += 1
            elif sx < sy:
                self.split(y, sx, [a, b])
            else:
                self.split(x, sy, [a, b])
        if len(a) != len(b):
            raise _AxisError

    def regroup(self, src: list[int], shape: tuple[int, ...]) -> list[tuple[int, ...]]:
        """The axes ``src`` (row-major) regrouped into dims of ``shape`` (a reshape), splitting axes
        where a target dim ends inside one."""
        run = list(src)
        out: list[tuple[int, ...]] = []
        for d in shape:
            got: list[int] = []
            need = d
            while need > 1:
                if not run:
                    raise _AxisError
                a = run[0]
                sa = self.sizes[a]
                if sa <= need:
                    if need % sa:
                        raise _AxisError
                    got.append(run.pop(0))
                    need //= sa
                else:
                    self.split(a, need, [run, got])
            out.append(tuple(got))
        if run:
            raise _AxisError
        return out


def _broadcast(b: _Builder, node: Node) -> None:
    """A broadcasting op: its result's dims are the unified dims of its tensor arguments."""
    rank = len(node.shape)
    out: list[tuple[int, ...] | None] = [None] * rank
    b.groups[node.id] = out
    for arg in node.tensor_args:
        src = b.groups[arg]
        off = rank - len(src)
        for k in range(len(src)):
            g = src[k]
            if not g:
                continue
            cur = out[off + k]
            if cur is None:
                out[off + k] = g
            else:
                b.unify(cur, g)
    b.groups[node.id] = [g or () for g in out]


def _node_axes(b: _Builder, node: Node) -> None:
    """The groups of ``node``'s result (raises :class:`_AxisError` when axes do not fit)."""
    kind = OPS[node.op].kind
    targs = node.tensor_args
    if kind == "iota":  # no argument: its dims are fresh axes, as an input's
        b.groups[node.id] = [(b.fresh(s),) if s > 1 else () for s in node.shape]
    elif kind == "reduce":
        src = b.groups[targs[0]]
        b.groups[node.id] = ([() if i in node.axes else g for i, g in enumerate(src)] if node.keepdims
                             else [g for i, g in enumerate(src) if i not in node.axes])
    elif node.op == "transpose":
        src = b.groups[targs[0]]
        b.groups[node.id] = [src[p] for p in node.perm]
    elif node.op == "reshape":
        flat = [a for g in b.groups[targs[0]] for a in (g or ())]
        b.groups[node.id] = list(b.regroup(flat, node.shape))
    elif node.op == "expand":  # a broadcast: every grown (or added) dim is a fresh axis the source lacks
        src = b.groups[targs[0]]
        off = len(node.shape) - len(src)
        b.groups[node.id] = [src[k - off] if k >= off and (src[k - off] or s == 1) else
                             ((b.fresh(s),) if s > 1 else ()) for k, s in enumerate(node.shape)]
    else:
        _broadcast(b, node)


def unread_inputs(graph: Graph) -> frozenset[str]:
    """The inputs that no node reads and no output names: they span no axis of the region and are never
    the domain tensor (a *shape carrier*: the torch backend passes one whose extent is a size the region
    computes with, an ``iota``'s length, and reads it only as the bound of a symbolic dim)."""
    read = {a for nd in graph.nodes for a in nd.tensor_args} | set(graph.outputs)
    return frozenset(n for n, _ in graph.inputs if n not in read)


def domain_candidates(graph: Graph) -> tuple[str, ...]:
    """The tensors that may be the domain tensor (the largest size, then the highest rank), graph
    outputs first, then the others in graph order; the default domain tensor is among them. An input
    that nothing reads (:func:`unread_inputs`) is never one."""
    unread = unread_inputs(graph)
    specs = [(n, s.shape) for n, s in graph.inputs if n not in unread] + [(nd.id, nd.shape) for nd in graph.nodes]
    top = max((prod(s), len(s)) for _, s in specs)
    names = [n for n, s in specs if (prod(s), len(s)) == top]
    return tuple(sorted(names, key=lambda n: n not in graph.outputs))


def _repeated(groups: list[tuple[int, ...] | None]) -> bool:
    axes = [a for g in groups for a in (g or ())]
    return len(axes) != len(set(axes))


def _align_orphans(b: _Builder, graph: Graph, dom: str) -> None:
    """An input (or an ``iota``) whose axes never met the domain tensor's (unused, or feeding only tensors
    that do not meet it) is aligned to the domain tensor's dims by numpy broadcasting (right-aligned), as
    if it were added to it."""
    dom_groups = b.groups[dom]
    leaves = [(name, spec.shape) for name, spec in graph.inputs] + \
        [(nd.id, nd.shape) for nd in graph.nodes if OPS[nd.op].kind == "iota"]  # an iota starts axes as an input
    for name, shape in leaves:
        known = {a for g in dom_groups for a in (g or ())}
        src = b.groups[name]
        off = len(dom_groups) - len(src)
        for k, g in enumerate(src):
            if not g or set(g) <= known or off + k < 0:
                continue
            target = dom_groups[off + k]
            if target and prod(b.sizes[a] for a in target) == shape[k]:
                try:
                    b.unify(target, g)
                except _AxisError:
                    pass  # left orphan: refused below


def _fuse_independent(b: _Builder, specs: list[tuple[str, tuple[int, ...]]], dom: str) -> _Builder:
    """``b`` with the axes of the tensors of the domain tensor's size that span axes it lacks unified
    with the domain tensor's (their row-major runs, split where one is finer), one tensor at a time
    (in ``specs`` order), where that leaves no tensor spanning an axis twice: two parts of a region
    that no op relates along those axes (Llama's q rotary ``[1, 4, S, D]`` and k's grouped copy ``[1,
    2, 2, S, D]``, which meet only in the angles ``[1, 1, S, D]``) iterated by one kernel, each tensor
    still at its own coordinates. A unification that fails is dropped (the builder is copied)."""
    size = prod(dict(specs)[dom])
    for name, shape in specs:
        flat = tuple(a for g in b.groups[name] for a in (g or ()))
        mine = tuple(a for g in b.groups[dom] for a in (g or ()))
        if name == dom or prod(shape) != size or set(flat) <= set(mine):
            continue
        trial = copy.deepcopy(b)
        try:
            trial.unify(mine, flat)
        except _AxisError:
            continue
        if not any(_repeated(gs) for gs in trial.groups.values()):
            b = trial
    return b


def _part_cuts(b: _Builder, graph: Graph, inner: frozenset[int]) -> tuple[tuple[str, str], ...]:
    """Where a region of independent parts that :func:`_fuse_independent` cannot iterate together
    (sizes differ: a decode step's q rotary ``[1, 4, 1, D]`` and k's rotary concatenated to the cache
    ``[1, 2, P + 1, D]``, which share only the angles) splits: every ``(reader, source)`` where a node
    spanning an axis outside the domain tensor's (``inner``) reads a computed tensor inside them that a
    node inside them reads too (the shared angles); empty where there is none. A region finder cuts
    those reads all together (:func:`stitchtune.importers.torch_cuts.edge_cuts`): the outside part
    becomes a region of its own that reads the shared tensors as inputs."""
    def outside(name: str) -> bool:
        return any(a not in inner for g in b.groups[name] for a in (g or ()))

    computed = {nd.id for nd in graph.nodes}
    return tuple((nd.id, a) for nd in graph.nodes if outside(nd.id) for a in dict.fromkeys(nd.tensor_args)
                 if a in computed and not outside(a) and any(not outside(c.id) for c in graph.consumers(a)))


def tensor_axes(graph: Graph, domain: str | None = None) -> TensorAxes | Refusal:
    """The domain axes of every tensor of ``graph`` (see the module docstring); ``domain``: the name of
    the domain tensor instead of the default one (a tensor of the largest size and rank whose layout
    the planner tries when the default one's refuses: a channels-last layer norm's backward whose
    first input is the gradient in NCHW order)."""
    b = _Builder()
    unread = unread_inputs(graph)
    for name, spec in graph.inputs:   # an input nothing reads (a shape carrier) spans no axis
        b.groups[name] = [(b.fresh(s),) if s > 1 and name not in unread else () for s in spec.shape]
    for node in graph.nodes:
        try:
            _node_axes(b, node)
        except _AxisError:
            what = (f"reshapes {list(graph.spec(node.tensor_args[0]).shape)} to {list(node.shape)} in a way "
                    "that does not only split and merge the axes of the region" if node.op == "reshape" else
                    "broadcasts values of different axes against each other (a reduction without keepdims "
                    "used along another axis?)")
            return Refusal(f"node '{node.id}' {what}")
        if _repeated(b.groups[node.id]):
            return Refusal(
                f"node '{node.id}' uses one axis of the region in two of its dims (a diagonal, e.g. x + "
                "transpose(x)); stitched kernels need every tensor to span each axis at most once")
    for name, gs in b.groups.items():
        if _repeated(gs):
            return Refusal(
                f"tensor '{name}' uses one axis of the region in two of its dims (a diagonal, e.g. x + "
                "transpose(x)); stitched kernels need every tensor to span each axis at most once")
    specs = [(n, s.shape) for n, s in graph.inputs] + [(nd.id, nd.shape) for nd in graph.nodes]
    dom = domain if domain is not None else max((t for t in specs if t[0] not in unread),
                                                key=lambda t: (prod(t[1]), len(t[1])))[0]
    _align_orphans(b, graph, dom)
    order = tuple(a for g in b.groups[dom] for a in (g or ()))
    used = {a for gs in b.groups.values() for g in gs for a in (g or ())}
    if used - set(order):   # independent parts (q's and k's rotary): one kernel iterates both
        b = _fuse_independent(b, specs, dom)
        order = tuple(a for g in b.groups[dom] for a in (g or ()))
        used = {a for gs in b.groups.values() for g in gs for a in (g or ())}
    if used - set(order):
        msg = (f"no tensor of the region spans all of its axes (the largest, '{dom}', does not); stitched "
               "kernels iterate the axes of one tensor")
        cuts = _part_cuts(b, graph, frozenset(order))
        if cuts:
            return Refusal(f"{msg}; node '{cuts[0][0]}' belongs to another part than its argument "
                           f"'{cuts[0][1]}', which both parts read (a region each)", (cuts[0][0],), cuts)
        return Refusal(msg)
    groups = tuple((n, tuple(tuple(g or ()) for g in b.groups[n])) for n, _ in specs)
    return TensorAxes(tuple((a, b.sizes[a]) for a in order), order, groups)
