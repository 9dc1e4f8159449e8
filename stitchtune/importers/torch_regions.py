"""Memory-intensive regions of an ATen-level fx graph, each as a stitchtune graph.

Used by the ``torch.compile`` backend (:mod:`stitchtune.deploy.torch_backend`) and by whole-model
tuning (``stitchtune tune``); the per-op mapping is :mod:`stitchtune.importers.torch_aten`'s, so a
region maps exactly what ``stitchtune import torch`` maps.

Contract of :func:`find_regions(gm, accept)` -> :class:`RegionSplit`:

* Candidates are ``call_function`` nodes whose op the importer maps (:data:`torch_aten.SUPPORTED_OPS`)
  with static shapes and float tensors in and out (see :mod:`stitchtune.importers.torch_candidates`
  for integer ids and masks); ``getitem`` of a candidate is a candidate. Every other op is declined
  with a reason (compute op, no graph.json equivalent, dynamic shape, dtype).
* Nodes computed from constants only (``arange``, ``zeros``, masks of those; ``constants`` names the
  placeholders that are constant) are evaluated at import time
  (:func:`~stitchtune.importers.torch_consts.fold_constants`): a 0-d one is a scalar of the region's
  graph, the indices of an ``index`` are resolved on an index grid (a broadcast or reshape; a real
  gather is declined), any other is an input of the region that PyTorch computes (its value is in
  ``RegionSplit.folded``: the torch backend hands it to the region's kernel instead).
* Bool chains of graph inputs and constants are computed again by every region that reads them
  (``TorchRegion.pulled``), so one padding mask feeds every layer's softmax region; so are float
  element-wise / view chains of values from outside every region that only broadcast into larger
  tensors (the rotary angles, ``cos`` / ``sin`` of ``positions * inv_freq``: q's and k's rotary of every
  layer are one region each). Such a node that the graph also returns (a training forward saves the
  angles for its backward) is stored by the first region that computes it (:func:`_store_saved`).
* A ``clone`` of a broadcast (``repeat_kv``'s ``expand`` + ``clone``) read outside the region is stored
  expanded (an ``expand`` node): the region that makes k writes the grouped copy itself.
* A view (``view``, ``transpose``, ``expand``, ...) or a no-op (eval dropout, a same-dtype cast)
  whose result only leaves a region stays PyTorch's (``RegionSplit.free``: the region returns the
  contiguous base); a permuted view also read inside the region (not returned by the graph) is an output
  stored in its memory order (``output_perms``: ConvNeXt's NHWC gradient viewed as NCHW for a
  convolution and permuted back by the layer scale's gradient). A view of another output of the region
  that the region also reads is not stored again: it is an alias (``TorchRegion.aliases``; the backend
  applies the view to that output: a layer norm backward's input gradient and its 2-D view for the
  weight gradient's matmul). A group that nothing reads, or
  that only moves data as views, is dropped (``RegionSplit.dropped``). Neither is reported as declined.
  A ``clone`` of another output of the region (attention dropout at p = 0 in training: the softmax
  saved and its copy multiplied) is stored again by the region, a second output, rather than copied by
  a kernel of its own.
* Regions are the maximal connected groups of candidates that are convex (no path leaves a region and
  re-enters it; a non-convex group is split by how many non-candidates precede its nodes, as the
  ONNX partition does, then parts linked by an edge are joined again while their union stays convex). Each region is mapped through :class:`torch_aten._Walker` on a sub-graph
  whose placeholders are the region's external inputs. A node that fails to map (or is an output
  that the graph cannot express: another shape than PyTorch's, a duplicate or an input passed
  through; leading 1s may differ, and a ``[B]`` value held per row is stored as ``[B, 1]``, see
  ``TorchRegion.output_shapes``) is declined with the walker's reason and the groups are recomputed without it, until
  every region maps. A graph without any computing node (views, reshapes and casts only: PyTorch's
  views are free) is dropped silently.
* Two settled regions that read the same value, or one the other's output, are joined when their
  union is convex and maps and ``accept`` takes it (one kernel reads the value once: a bias
  gradient's column sum beside the layer norm backward reading the same gradient); else they stay.
* ``accept(graph)`` (default: the planner, :func:`stitchtune.importers.torch_cuts.plan_check`) returns None or
  why not. When the reason names a node of the region (``'sum_4'``: e.g. a column sum next to row
  sums in a layer norm's backward; a column sum next to a concat, which the planner names first),
  that node is declined with the reason and the rest is grouped again; otherwise the region is
  declined whole (its ops stay in the fx graph). In a refused region, a ``sum`` over one axis of at
  most :data:`UNROLL_MAX` elements that a view split off a larger dim (grouped-query attention's sum
  of a key's gradient over the heads that share it, next to rotary's slices) is first mapped again as
  adds of its slices (:func:`_unrollable`); the refusals after that are handled as above. A region refused for int arithmetic (next to a
  gather, or in a column reduction) that draws random numbers (``stitchtune::rand``:
  :mod:`stitchtune.importers.torch_random`) gives up its draw first, with the comparisons reading it.
* An input that PyTorch holds permuted (its strides a permutation of a dense tensor's other than
  row-major: a convolution's channels-last output seen as NCHW) is declared in its memory order and
  read through a transpose (``TorchRegion.input_perms``); the graph builder composes that transpose
  with the model's own permutes (ConvNeXt's permute to channels-last cancels it), so the region op
  passes a view of the tensor, not a copy. Float inputs only, and not for regions with symbolic
  sizes, constants, or inputs declared at another shape; a region that ``accept`` refuses so is
  mapped again with those inputs in PyTorch's axes (the region op copies them).
* A 0-d input (a loss's incoming gradient, a count of rows kept, a position offset) is a ``[1]`` input
  of the region's graph (graph.json tensors have rank 1 or more) that broadcasts as PyTorch's 0-d
  tensor does; the region op reshapes the tensor to the graph's shape (same bytes).
* Graph inputs are named ``in0, in1, ...`` in order of first use, so equal regions (the same layer
  norm in every layer) have equal workload keys (one tuning record serves them all).
* Region ``i`` has ``nodes`` (fx nodes, graph order), ``inputs`` (external fx nodes, in the graph's
  input order) and ``outputs`` (fx nodes read outside the region, in the graph's output order).
  Nothing here modifies ``gm``.
"""

from __future__ import annotations

import logging
import math
import operator
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stitchtune.importers.torch_aten import RAND_KEY, _key, _where
from stitchtune.importers.torch_candidates import (
    COMPUTE_OPS,  # noqa: F401  (re-exported: the compute ops left to the framework)
    _Excluded,
    _hint,
    _initial_exclusions,
)
from stitchtune.importers.torch_consts import fold_constants
from stitchtune.importers.torch_cuts import Accept, cut_for, edge_cuts, plan_check, reason_of
from stitchtune.importers.torch_fx_util import fx_args
from stitchtune.importers.torch_grouping import _convex, _groups
from stitchtune.importers.torch_mapping import Declined, _computes, _Culprit, _inverse, _map_group, _Mapped, _ops_text
from stitchtune.importers.torch_subgraph import _with_pulled, saved_pulled
from stitchtune.importers.torch_windows import Window, reads_strided

__all__ = ["COMPUTE_OPS", "Declined", "RegionSplit", "TorchRegion", "find_regions", "plan_check"]

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class TorchRegion:
    """One memory-intensive region mapped to a stitchtune graph (see module docstring)."""

    name: str
    graph: Any                       # graph.parse.Graph
    nodes: tuple[Any, ...] = field(compare=False)     # torch.fx.Node, graph order
    inputs: tuple[Any, ...] = field(compare=False)    # fx nodes feeding graph.inputs, same order
    outputs: tuple[Any, ...] = field(compare=False)   # fx nodes of graph.outputs, same order
    #: the region's ATen ops as a GraphModule (placeholders = ``inputs``, outputs = ``outputs``)
    module: Any = field(default=None, compare=False, repr=False)
    #: nodes outside ``nodes`` that the region computes again (bool chains of graph inputs), graph order
    pulled: tuple[Any, ...] = field(default=(), compare=False)
    #: per output: None, or the axis order PyTorch stores it in (its strides); the graph's output is
    #: then ``pytorch_value.permute(perm)`` (row-major), and ``graph_out.permute(inverse(perm))`` is
    #: PyTorch's strided tensor (see :meth:`restore_perm`)
    output_perms: tuple[tuple[int, ...] | None, ...] = field(default=(), compare=False)

    #: (fx node, the input or output node it equals or views): no-op nodes of the region (eval dropout,
    #: a same-dtype cast, a view of another output) that are read outside it; PyTorch's readers read
    #: the node they equal, or the backend's view of it
    aliases: tuple[tuple[Any, Any], ...] = field(default=(), compare=False)
    #: per input: None, or the axis order PyTorch stores it in (a permutation of a dense tensor that
    #: is not row-major: a convolution's channels-last output); the graph's input is then
    #: ``pytorch_value.permute(perm)`` (row-major: a free view, no copy) and the graph transposes it
    #: back to PyTorch's axes
    input_perms: tuple[tuple[int, ...] | None, ...] = field(default=(), compare=False)
    #: per input: None, or the larger row-major tensor it is a part of (a split part: a
    #: :class:`~stitchtune.importers.torch_windows.Window`); the graph declares that tensor and reads
    #: the part through a slice, the region op passes ``window.view(t)`` (no copy)
    input_windows: tuple[Window | None, ...] = field(default=(), compare=False)

    def restore_perm(self, i: int) -> tuple[int, ...]:
        """The permutation that turns the kernel's row-major output ``i`` into PyTorch's strided
        tensor (a free view; the identity when ``output_perms[i]`` is None)."""
        p = self.output_perms[i] if self.output_perms else None
        return tuple(range(len(self.outputs[i].meta["val"].shape))) if p is None else _inverse(p)

    @property
    def dynamic(self) -> bool:
        """True when some input or output has symbolic dims (``graph`` is at their example values)."""
        return any(not all(isinstance(d, int) for d in n.meta["val"].shape) for n in (*self.inputs, *self.outputs))

    @property
    def output_shapes(self) -> tuple[tuple[int, ...], ...]:
        """PyTorch's shape of each output as the kernel writes it (may differ from the graph's in
        leading 1s only; symbolic dims at their example values; permuted by ``output_perms``)."""
        perms = self.output_perms or (None,) * len(self.outputs)
        shapes = [tuple(_hint(d) or 1 for d in o.meta["val"].shape) for o in self.outputs]
        return tuple(s if p is None else tuple(s[i] for i in p) for s, p in zip(shapes, perms))

    @property
    def ops(self) -> tuple[str, ...]:
        """The ATen ops the region computes (``getitem`` left out; ``pulled`` ones first, as they
        precede what reads them), in graph order otherwise."""
        return tuple(_key(n.target) for n in (*self.pulled, *self.nodes) if n.target is not operator.getitem)


@dataclass(frozen=True)
class RegionSplit:
    """``regions`` and ``declined`` (see the module docstring); ``free``: nodes left to the framework
    as free views or no-ops at a region's boundary (a transpose of a region's output, eval dropout,
    a same-dtype cast); ``dropped``: groups that map to no computing graph (views only, or nothing
    reads them); neither is a cut."""

    regions: tuple[TorchRegion, ...]
    declined: tuple[Declined, ...]
    free: tuple[Any, ...] = ()
    dropped: tuple[tuple[Any, ...], ...] = ()
    constants: tuple[Any, ...] = ()   # nodes computed from constants only (inputs of regions, or scalars)
    #: (node, its value: a CPU tensor) for each of ``constants`` that a region reads as an input; a
    #: caller may hand the region the value itself instead of computing the node (no kernel)
    folded: tuple[tuple[Any, Any], ...] = ()


def find_regions(gm: Any, accept: Accept | None = plan_check,
                 prefix: str = "region", constants: Mapping[str, Any] | None = None) -> RegionSplit:
    """The memory-intensive regions of ``gm`` (an ATen-level fx GraphModule with ``meta["val"]``) and
    what was declined (see module docstring). ``constants``: placeholder name -> tensor for the
    placeholders whose values never change (an exported program's buffers); the nodes computed from
    constants only are evaluated (:func:`~stitchtune.importers.torch_consts.fold_constants`)."""
    nodes = list(gm.graph.nodes)
    consts = fold_constants(nodes, constants, gm)
    ex = _initial_exclusions(nodes, consts)
    while True:
        groups, mapped = _settle(nodes, ex, consts, accept, prefix)
        groups = _join_siblings(nodes, groups, mapped, ex, consts, accept, prefix)
        groups = _store_saved(nodes, groups, mapped, ex, consts, accept)
        regions, declined, dropped = _collect(groups, mapped, ex)
        claimed = {n for r in regions for n in (*r.pulled, *r.nodes)}
        unclaimed = [n for n in nodes if n in ex.pulled and n not in claimed]
        if not unclaimed:
            break
        ex.pulled.difference_update(unclaimed)   # read by no region: grouped like any other node
    read = {x for r in regions for x in r.inputs}
    return RegionSplit(tuple(regions), tuple(_op_declines(nodes, ex)) + tuple(declined),
                       tuple(n for n in nodes if n in ex.free), tuple(dropped), tuple(consts),
                       tuple((n, v) for n, v in consts.items() if n in read and hasattr(v, "dim")))


def _settle(nodes: Sequence[Any], ex: _Excluded, consts: Mapping[Any, Any],
            accept: Accept | None,
            prefix: str) -> tuple[list[list[Any]], dict[frozenset[Any], _Mapped | Declined | None]]:
    """Group and map until every group maps (or is declined): (groups, group -> mapping result)."""
    mapped: dict[frozenset[Any], _Mapped | Declined | None] = {}
    while True:
        groups = _groups(nodes, ex)
        changed = False
        for group in groups:
            key = frozenset(group)
            if key in mapped:
                continue
            res = _map_with_constants(group, f"{prefix}_{group[0].name}", consts, ex, accept)
            if isinstance(res, _Culprit) and res.unroll:
                ex.unrolled.add(res.node)   # mapped again, the sum as adds of slices
                changed = True
            elif isinstance(res, _Culprit) and res.cut is not None:
                ex.cuts.add(res.cut)   # grouped again, split at that edge (and at the edges cut with it)
                ex.cuts.update(res.more_cuts)
                changed = True
            elif isinstance(res, _Culprit):
                ex.add(res.node, res.reason, res.free)
                changed = True
            else:
                mapped[key] = res
        if not changed:
            return groups, mapped


def _map_with_constants(group: list[Any], name: str, consts: Mapping[Any, Any], ex: _Excluded,
                        accept: Accept | None) -> _Mapped | _Culprit | Declined | None:
    """``group`` mapped (and judged by ``accept`` where it computes) with the pulled nodes it reads;
    when that fails and it computes pulled constants (:func:`~stitchtune.importers.torch_candidates._pull_constants`:
    an iota the planner cannot lower next to a slice or concat), mapped again reading those constants
    as inputs (the framework computes them), as it did before they were pulled; the first result
    when neither maps. A group refused while it reads inputs that PyTorch holds permuted through
    transposes (:func:`~stitchtune.importers.torch_windows.input_perms`) is mapped again reading them in PyTorch's axes (the region op
    then copies them), so reading in memory order never costs a region."""
    def mapped(pulled: set[Any], permuted: bool = True) -> _Mapped | _Culprit | Declined | None:
        res = _map_group(group, name, consts, pulled, ex.unrolled, permuted)
        return _judge(res, group, accept, ex.unrolled, ex.cuts) if isinstance(res, _Mapped) and _computes(res.graph) \
            and accept is not None else res

    def judged(pulled: set[Any]) -> _Mapped | _Culprit | Declined | None:
        res = mapped(pulled)
        if isinstance(res, _Mapped) or res is None or not reads_strided(group):
            return res
        plain = mapped(pulled, permuted=False)   # its permuted inputs' transposes refused: copied, as before
        return plain if isinstance(plain, _Mapped) else res

    res = judged(ex.pulled)
    if isinstance(res, _Mapped) or not ex.constants & set(_with_pulled(group, ex.pulled)):
        return res
    alt = judged(ex.pulled - ex.constants)
    return alt if isinstance(alt, _Mapped) else res


def _join_siblings(nodes: Sequence[Any], groups: list[list[Any]],
                   mapped: dict[frozenset[Any], _Mapped | Declined | None], ex: _Excluded,
                   consts: Mapping[Any, Any], accept: Accept | None,
                   prefix: str) -> list[list[Any]]:
    """``groups`` with two mapped groups that read the same value, or one the other's output, joined
    (adds the union to ``mapped``) while their union is convex and maps and the planner accepts it:
    one kernel where there were two (a bias gradient's column sum beside the layer norm backward
    that reads the same gradient); a union that fails keeps the two as they were."""
    order = {n: i for i, n in enumerate(nodes)}

    def reads(g: list[Any]) -> set[Any]:
        res = mapped.get(frozenset(g))
        return set(res.inputs) if isinstance(res, _Mapped) and _computes(res.graph) else set()

    tried: set[frozenset[Any]] = set()
    out = list(groups)
    joined = True
    while joined:
        joined = False
        for i, j in ((i, j) for i in range(len(out)) for j in range(i + 1, len(out))):
            union = frozenset(out[i]) | frozenset(out[j])
            ri, rj = reads(out[i]), reads(out[j])
            if union in tried or not (ri and rj) or not (ri & rj or ri & set(out[j]) or rj & set(out[i])):
                continue
            tried.add(union)
            if not _convex(set(union)):
                continue
            group = sorted(union, key=order.__getitem__)
            res = _map_with_constants(group, f"{prefix}_{group[0].name}", consts, ex, accept)
            if isinstance(res, _Mapped):
                mapped[union] = res
                out[i], joined = group, True
                del out[j]
                break
    return sorted(out, key=lambda g: order[g[0]])


def _store_saved(nodes: Sequence[Any], groups: list[list[Any]],
                 mapped: dict[frozenset[Any], _Mapped | Declined | None], ex: _Excluded,
                 consts: Mapping[Any, Any], accept: Accept | None) -> list[list[Any]]:
    """``groups`` where the first mapped group (graph order) that computes a pulled node the graph
    returns (:func:`~stitchtune.importers.torch_subgraph.saved_pulled`: the rotary angles a training
    forward saves for its backward) also stores it: the node joins that group, an output of its region
    (adds the new group to ``mapped``), so that no kernel of the rest computes it once more. A group
    whose union with the node does not map (or the planner refuses) stays as it was; the other
    regions still compute the node again."""
    saved = saved_pulled(nodes, ex.pulled)
    if not saved:
        return groups
    order = {n: i for i, n in enumerate(nodes)}
    out = list(groups)
    for i, group in enumerate(out):
        res = mapped.get(frozenset(group))
        if not saved or not isinstance(res, _Mapped) or not _computes(res.graph):
            continue
        want = [s for s in saved if s in set(_with_pulled(group, ex.pulled))]
        new = sorted(set(group) | set(want), key=order.__getitem__)
        if not want or not _convex(set(new)):
            continue
        joined = _map_with_constants(new, res.graph.name, consts, ex, accept)
        if isinstance(joined, _Mapped):
            mapped[frozenset(new)] = joined
            out[i] = new
            saved = [s for s in saved if s not in want]
    return out


def _collect(groups: list[list[Any]], mapped: dict[frozenset[Any], _Mapped | Declined | None],
             ex: _Excluded) -> tuple[list[TorchRegion], list[Declined], list[tuple[Any, ...]]]:
    """(regions, groups declined whole, groups dropped) of the settled ``groups``."""
    regions: list[TorchRegion] = []
    declined: list[Declined] = []
    dropped: list[tuple[Any, ...]] = []
    for group in groups:
        res = mapped[frozenset(group)]
        if isinstance(res, Declined):
            declined.append(res)
        elif res is not None and _computes(res.graph):
            own = set(group)
            pulled = tuple(n for n in _with_pulled(group, set(res.pulled)) if n not in own)
            regions.append(TorchRegion(res.graph.name, res.graph, tuple(group), res.inputs, res.outputs, res.sub.module,
                                       pulled, res.perms, res.aliases, res.in_perms, res.in_windows))
        else:
            dropped.append(tuple(group))
    return regions, declined, dropped


_QUOTED = re.compile(r"'([A-Za-z_][A-Za-z0-9_]*)'")


def _judge(res: _Mapped, group: list[Any], accept: Accept,
           unrolled: Iterable[Any] = (), ex_cuts: Collection[tuple[Any, Any]] = ()) -> _Mapped | _Culprit | Declined:
    """``res`` when ``accept`` takes its graph; else the group's node that the refusal names (a
    reduction over other axes, ...: the rest may still be a region; for a named graph input, the
    first node reading it), else the group declined. A refused group with a small sum over a split-off
    axis not yet ``unrolled`` (:func:`_unrollable`) first names that sum, to map again as adds of
    slices."""
    refusal = accept(res.graph)
    if not refusal:
        return res
    why = reason_of(refusal)
    cut = cut_for(refusal, group, ex_cuts)
    if cut is not None:   # two parts that must be apart: split the group there
        return _Culprit(cut[1], why, cut=cut)
    edges = edge_cuts(refusal, group, ex_cuts)
    if edges:   # independent parts sharing tensors: cut every read between them at once
        return _Culprit(edges[0][1], why, cut=edges[0], more_cuts=edges[1:])
    if "computes with int values" in why:   # a gather or a column reduction next to int arithmetic:
        drawn = next((n for n in group if _key(n.target) == RAND_KEY), None)   # give up a draw first
        if drawn is not None:
            return _Culprit(drawn, f"{why} (the random numbers of this region's dropout are drawn by the framework)")
    small = next((n for n in group if n not in set(unrolled) and _unrollable(n)), None)
    if small is not None:   # (whatever the refusal names: a squeeze of the sum, the sum itself)
        return _Culprit(small, why, unroll=True)
    by_name = {n.name: n for n in group}
    for name in _QUOTED.findall(why):
        node = by_name.get(name)
        if node is None:   # a node of a decomposed op: "<fx name>_<part>"
            cands = [n for n in group if name.startswith(n.name + "_")]
            node = max(cands, key=lambda n: len(n.name)) if cands else None
        if node is None and re.fullmatch(r"in\d+", name) and int(name[2:]) < len(res.inputs):
            x = res.inputs[int(name[2:])]   # a graph input: the first node of the group reading it goes
            node = next((n for n in group if x in fx_args(n)), None)
        if node is not None and node.op == "call_function":
            return _Culprit(node, why)
    return Declined(f"region {res.graph.name} ({_ops_text(group)})", why)


#: the most elements per output that a refused ``sum`` is unrolled over (:func:`_unrollable`)
UNROLL_MAX = 8


def _unrollable(node: Any) -> bool:
    """Whether ``node`` is a float ``sum`` over one axis of at most :data:`UNROLL_MAX` (2 or more)
    elements that a ``view`` split off a larger dim (grouped-query attention's key / value gradient,
    ``[B, H, S, D]`` viewed ``[B, Hkv, H / Hkv, S, D]`` and summed over the heads that share a key):
    a planner refusing the reduction may take it as adds of slices. A sum over a dim of the tensor as
    it is (a bias gradient's column sum over the rows) is never unrolled: its size grows with the
    data, not with the model's structure."""
    if node.op != "call_function" or _key(node.target) != "aten.sum" or len(node.args) < 2:
        return False
    x, dims = node.args[0], node.args[1]
    src = getattr(x, "args", (None,))[0] if _key(getattr(x, "target", None)) in ("aten.view", "aten._unsafe_view",
                                                                                 "aten.reshape") else None
    val, before = getattr(x, "meta", {}).get("val"), getattr(src, "meta", {}).get("val")
    if val is None or before is None or not val.dtype.is_floating_point or node.kwargs.get("dtype") is not None:
        return False
    shape, old = list(val.shape), list(before.shape)
    dims = [dims] if isinstance(dims, int) else list(dims or ())
    if len(dims) != 1 or not all(isinstance(d, int) for d in (*shape, *old)):
        return False
    ax = dims[0] % len(shape)
    if not 2 <= shape[ax] <= UNROLL_MAX:
        return False
    cum = [math.prod(shape[:j]) for j in range(len(shape) + 1)]   # the run of the view's dims between
    bounds = {math.prod(old[:k]) for k in range(len(old) + 1)}     # two cuts that its input shares
    lo = max(j for j in range(ax + 1) if cum[j] in bounds)
    hi = min(j for j in range(ax + 1, len(shape) + 1) if cum[j] in bounds)
    return sum(1 for d in shape[lo:hi] if d > 1) >= 2


def _op_declines(nodes: Sequence[Any], ex: _Excluded) -> list[Declined]:
    """One :class:`Declined` per (op, reason) among the excluded nodes, with its count, in graph order."""
    counts: dict[tuple[str, str], int] = {}
    for n in nodes:
        reason = ex.reasons.get(n)
        if reason is not None:
            k = (f"op {_key(n.target)}", reason)
            counts[k] = counts.get(k, 0) + 1
    return [Declined(what, reason, c) for (what, reason), c in counts.items()]


def where(node: Any) -> str:
    """The source location of an fx node (for messages)."""
    return _where(node)
