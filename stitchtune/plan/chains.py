"""Layout nodes (transpose / reshape / expand) in a region with index ops: which are *chains* of an
input that a remap reads through by index arithmetic, which are *tails* (rearranging a tensor
computed from an index op's result into an output), and which keep their own shapes in the surrogate
(the *layout part* of a mixed region); and the iteration domain, which the tails decide.

A transpose / reshape chain of one input whose head does not align with the domain (ViT's patch
flatten, concatenated after the class token along the sequence: :func:`composed_chains`) is not a
layout part: the planner sees it as one input of the head's aligned shape, the bounds are proven on
the head's own shape, and the kernel carries each (shifted, along any axis) position of the head back
through the chain to the input's offset. A region whose layout nodes are all such chains is not mixed.
A chain may also slice (:func:`sliced_chains`: Phi-3's fused ``qkv`` sliced to q's columns, viewed as
heads and transposed, then rotated); its head may then align with the domain, and its slice moves the
carried position by its start.

A region whose roots (outputs, reduction arguments) do not all span the domain may consist of
independent *parts* (:func:`part_domains`: Llama's q rotary of 4 heads and k's of 2 with its grouped
copy, meeting only in the angles): each tensor is then seen against its part's domain (its
surrogate shape, the alignment of chain heads and of the layout part), and the planner's axes put the
parts' free axes together (:func:`~stitchtune.plan.axes.tensor_axes`), so one kernel iterates both.
"""

from __future__ import annotations

from math import prod

from stitchtune.graph.ops import OPS
from stitchtune.graph.parse import Graph
from stitchtune.plan.pick import node_axis
from stitchtune.plan.index_ops import (after_index_ops, align_refusal, aligned_shape, feeds_layout, gather_tables, has_index_ops,
                                       has_layout_ops, spans_shape, surrogate_shape, unit_reshapes)
from stitchtune.plan.refusal import Refusal

__all__ = ["composed_chains", "sliced_chains", "sliced_members", "chain_members", "wide_inputs", "mixed_layout",
           "layout_part", "layout_part_refusal", "layout_tails", "tails_refusal", "domain_of", "domain_refusal",
           "part_domains"]


def domain_of(graph: Graph) -> tuple[int, ...]:
    """The iteration domain: the largest output or reduction argument (elements, then rank). In a
    mixed region an output made by a trailing transpose / reshape (:func:`layout_tails`) counts by
    the tensor it rearranges."""
    shapes = [graph.spec(o).shape for o in _roots(graph)]
    shapes += [graph.spec(str(n.args[0])).shape for n in graph.nodes if n.op == "gather_elements"]
    return max(shapes, key=lambda s: (prod(s), len(s)))


def _roots(graph: Graph) -> list[str]:
    """The outputs (through their :func:`layout_tails`) and reduction arguments: what sets a domain."""
    tails = layout_tails(graph)
    nodes = {n.id: n for n in graph.nodes}
    out = []
    for o in graph.outputs:
        while o in tails:
            o = nodes[o].tensor_args[0]
        out.append(o)
    return out + [str(n.args[0]) for n in graph.reductions()]


def domain_refusal(graph: Graph) -> Refusal | None:
    """The refusal met in deciding the iteration domain (:func:`domain_of`) and the parts
    (:func:`part_domains`) of a region with index ops: its tails' (:func:`tails_refusal`), else the
    first root (outputs, reduction arguments) of a higher rank than the domain, unless a root before
    it does not span the domain (then the parts decide); None without one."""
    refused = tails_refusal(graph)
    if refused is not None or not has_index_ops(graph):
        return refused
    domain = domain_of(graph)
    for r in _roots(graph):
        shape = tuple(graph.spec(r).shape)
        sur = aligned_shape(shape, domain, r)
        if isinstance(sur, Refusal):
            return sur
        if sur != shape:
            return None
    return None


def part_domains(graph: Graph) -> dict[str, tuple[int, ...]]:
    """In a region with index ops whose roots (outputs, reduction arguments) do not all span the
    iteration domain of :func:`domain_of`: tensor -> the domain of its *part*, the largest root it
    feeds (elements, then rank), where every tensor that feeds roots of different shapes is the same
    seen against each (broadcast along the axes they differ in: rotary's angles, read by q's rotary of
    4 heads and k's of 2, Llama's grouped-query attention); the parts are independent computations
    that one kernel iterates together (:func:`~stitchtune.plan.axes.tensor_axes` unifies their axes).
    Empty (one domain for every tensor) for every other region, as before."""
    if not has_index_ops(graph):
        return {}
    domain = domain_of(graph)
    roots = _roots(graph)
    if all(spans_shape(tuple(graph.spec(r).shape), domain) for r in roots):
        return {}
    feeds = root_feeds(graph)
    own_shape = {nd.id for nd in graph.nodes if OPS[nd.op].kind == "layout"} | feeds_layout(graph, sliced_members(graph))
    own_shape |= {a for nd in graph.nodes if nd.id in own_shape for a in nd.tensor_args}   # (keep their shapes)
    out: dict[str, tuple[int, ...]] = {}
    for name, shapes in feeds.items():
        if not shapes:
            continue
        own = tuple(graph.spec(name).shape)
        if name not in own_shape and (any(len(own) > len(s) for s in shapes)
                                      or len({surrogate_shape(own, s, name) for s in shapes}) > 1):
            return {}
        out[name] = max(shapes, key=lambda s: (prod(s), len(s)))
    return out


def root_feeds(graph: Graph) -> dict[str, set[tuple[int, ...]]]:
    """Tensor -> the shapes of the roots (outputs, reduction arguments) it feeds."""
    feeds: dict[str, set[tuple[int, ...]]] = {n: set() for n in graph.input_names}
    feeds.update({nd.id: set() for nd in graph.nodes})
    for r in _roots(graph):
        feeds[r].add(tuple(graph.spec(r).shape))
    for nd in reversed(graph.nodes):
        for a in nd.tensor_args:
            feeds[a] |= feeds[nd.id]
    return feeds


def outer_part_cuts(graph: Graph, parts: dict[str, tuple[int, ...]], domain: tuple[int, ...]) -> tuple[tuple[str, str], ...]:
    """In a region of independent parts (:func:`part_domains`): where a slice / concat along an outer
    axis lies in a part other than the domain's (a decode step's key concatenated to the cache ``[1,
    2, P + 1, D]`` next to q's rotary ``[1, 4, 1, D]`` of the same size), the reads ``(reader,
    source)`` by which that part's nodes read tensors that other parts read too (the shared angles),
    for a region finder to cut (:class:`~stitchtune.errors.SeparateRegionsError` ``edges``): shifts
    along an outer axis are proven against one domain. Empty otherwise."""
    moved = [nd for nd in graph.nodes if nd.op in ("slice", "concat") and node_axis(nd) < len(nd.shape) - 1
             and parts.get(nd.id, domain) != tuple(domain)]
    if not moved:
        return ()
    feeds = root_feeds(graph)
    mine = feeds[moved[0].id]
    computed = {nd.id for nd in graph.nodes}
    return tuple((nd.id, a) for nd in graph.nodes if feeds[nd.id] and feeds[nd.id] <= mine
                 for a in dict.fromkeys(nd.tensor_args) if a in computed and not feeds[a] <= mine)


def layout_tails(graph: Graph) -> set[str]:
    """The transpose / reshape / expand nodes of a region with index ops that rearrange a tensor
    computed from an index op's result (``k^T`` after Llama's rotary). Each may be read only by
    other such nodes and be an output (it is stored through its map, never evaluated at a shifted
    position): the rule of :func:`tails_refusal`. A layout node of a tensor
    computed *before* any index op (a per-head RMSNorm's result transposed to ``[B, H, S, D]`` and
    rotated, the rotary angles ``cat(freqs, freqs)`` made by expand + reshape) is not a tail: it is
    part of :func:`layout_part`."""
    if not has_index_ops(graph):
        return set()
    after = after_index_ops(graph, sliced_members(graph))
    units = _only_units(graph)
    return {nd.id for nd in graph.nodes if OPS[nd.op].kind == "layout" and nd.id in after and nd.id not in units}


def tails_refusal(graph: Graph) -> Refusal | None:
    """The :class:`~stitchtune.plan.refusal.Refusal` naming the first :func:`layout_tails` node read by
    an op that is not a layout node (in graph order; :func:`_shared_slice_refusal` where it would be a
    sliced chain's head), None when every tail only makes outputs."""
    tails = layout_tails(graph)
    for nd in graph.nodes:
        if OPS[nd.op].kind == "layout":
            continue
        for a in nd.tensor_args:
            if a in tails:
                return _shared_slice_refusal(graph, a, nd.id) or Refusal(
                    f"node '{a}' (transpose / reshape) rearranges a "
                    f"tensor computed in a region with slice, concat or gather and is read by '{nd.id}'; there a "
                    "transpose / reshape of a computed tensor may only make an output")
    return None


def _shared_slice_refusal(graph: Graph, head: str, reader: str) -> Refusal | None:
    """The refusal of a layout tail read by ``reader`` that would be a :func:`sliced_chains` head but for
    what else reads the input it slices (a chain of another head shape, or an op outside the chains):
    one line naming the head (a region finder that leaves it out keeps the rest), the input and why,
    whose ``apart`` is the head, then the others; None for any other tail (the general refusal)."""
    chain = _sliced_candidates(graph).get(head)
    if chain is None:
        return None
    src = chain[-1]
    others = sorted({c.id for m in chain[1:] for c in graph.consumers(m)} - set(chain))
    if not others:   # (dropped for a per-head norm before a transpose: the general refusal)
        return None
    return Refusal(
        f"node '{head}' (transpose / reshape) rearranges a slice of input '{src}' and is read by '{reader}', but "
        f"'{', '.join(others)}' also read that input (or its slice) in another layout or head count; slices of one "
        "input rearranged into tensors of different shapes belong in separate regions", (head, *others))


def composed_chains(graph: Graph) -> dict[str, tuple[str, ...]]:
    """The layout chains a remap reads through in a region with index ops: head tensor -> ``(head,
    ..., input)``. A chain is a run of transpose / reshape nodes from one graph input, each member
    read only by the next (and no member an output), whose head is read by other ops and does not
    align with the iteration domain (right-aligned; ViT's patch flatten: conv ``[1, 32, 4, 4]`` ->
    reshape ``[1, 32, 16]`` -> transpose ``[1, 16, 32]``, concatenated after the class token along the
    sequence, domain ``[1, 17, 32]``). The planner sees the chain as one input of the head's aligned
    shape; the kernel loads the head's element at a (shifted) domain position through the chain's
    index arithmetic (:mod:`stitchtune.lower.remap`). A head that aligns with the domain is a chain
    only where it holds a transpose and a slice / concat along an outer axis reads it, directly or
    through element-wise nodes (:func:`_outer_moved`; Swin's window
    reverse ``[nW, w*w, C]`` -> ``[B, H, W, C]`` rolled back along H and W, which a mixed region's maps
    cannot shift: refused before, so no region that planned changes). Empty without index ops."""
    if not has_index_ops(graph) or not has_layout_ops(graph):
        return {}
    domain, parts = domain_of(graph), part_domains(graph)
    nodes = {n.id: n for n in graph.nodes}
    outputs, inputs = set(graph.outputs), set(graph.input_names)
    feeds = feeds_layout(graph, sliced_members(graph))
    rolled = _outer_moved(graph)
    out: dict[str, tuple[str, ...]] = {}
    for nd in graph.nodes:
        cons = graph.consumers(nd.id)
        if (nd.op not in ("transpose", "reshape") or not cons or nd.id in outputs or len(nd.shape) > len(domain)
                or any(c.id in feeds for c in cons)
                or any(OPS[c.op].kind == "layout" for c in cons)):
            continue
        if len(nd.shape) > len(parts.get(nd.id, domain)):
            continue   # (of a higher rank than its part: refused by layout_part_refusal, never a chain)
        aligned = spans_shape(tuple(nd.shape), parts.get(nd.id, domain))
        if aligned and nd.id not in rolled:
            continue
        chain, cur = [nd.id], nd
        while True:
            arg = str(cur.args[0])
            if graph.consumers(arg) != (cur,) or arg in outputs:
                break
            chain.append(arg)
            if arg in inputs:
                if not aligned or any(nodes[m].op == "transpose" for m in chain[:-1]) \
                        or _unshiftable_reshapes(graph, chain, domain):
                    out[nd.id] = tuple(chain)
                break
            cur = nodes[arg]
            if cur.op not in ("transpose", "reshape"):
                break
    out.update(sliced_chains(graph))
    return out


def _unshiftable_reshapes(graph: Graph, chain: list[str], domain: tuple[int, ...]) -> bool:
    """Whether an aligned run of reshapes ``chain`` (head, ..., input) under an outer shift is a chain
    because :func:`~stitchtune.plan.remap.outer_sources` cannot load it: more than one reshape (a
    decode step's head split ``[1, H*D] -> [1, 1, H*D] -> [1, 1, H, D] -> [1, H, 1, D]``, the last a
    transpose that moves only a size-1 axis, as PyTorch writes it), or one whose input's innermost dim
    is not the domain's. A single reshape of an input with the domain's columns (Swin's tokens
    ``[B, H*W, C]`` viewed as ``[B, H, W, C]``) stays with outer_sources, as before. Only a head of one
    position along the axis of such a slice / concat (the new key appended to the cache) is taken, so
    that no region that planned before changes (Swin's window reverse keeps its path)."""
    head = graph.spec(chain[0]).shape
    off = len(domain) - len(head)
    outer = {len(domain) - len(nd.shape) + node_axis(nd) for nd in graph.nodes
             if nd.op in ("slice", "concat") and node_axis(nd) < len(nd.shape) - 1}
    if not any(a >= off and head[a - off] == 1 for a in outer):
        return False
    return len(chain) > 2 or tuple(graph.spec(chain[-1]).shape[-1:]) != tuple(domain[-1:])


def _outer_moved(graph: Graph) -> set[str]:
    """The tensors a slice / concat along an outer axis reads, directly or through element-wise nodes
    and other slices / concats (they are evaluated at positions moved along an outer axis)."""
    starts = [a for nd in graph.nodes if nd.op in ("slice", "concat") and node_axis(nd) < len(nd.shape) - 1
              for a in nd.tensor_args]
    kinds = ("unary", "binary", "ternary", "cast", "slice", "concat")
    return set(graph.upstream(starts, lambda nd: OPS[nd.op].kind in kinds))


_LINKS = ("transpose", "reshape", "slice")


def sliced_chains(graph: Graph) -> dict[str, tuple[str, ...]]:
    """The chains of :func:`composed_chains` that slice a wider input and rearrange the slice: head
    tensor -> ``(head, ..., input)``, a run of transpose / reshape / slice nodes from one graph input
    with a slice in it, each member read only by chain members, the head a transpose / reshape read by
    other ops and none of them a transpose / reshape / expand (Phi-3's fused projection: ``qkv [B,
    S, (H + 2 KV) * D]`` -> slice of q's columns ``[B, S, H * D]`` -> reshape ``[B, S, H, D]`` ->
    transpose ``[B, H, S, D]``, then the rotary's slice / neg / concat along ``D``). The head may align
    with the iteration domain. Chains may share members (q's and k's columns of one input; one slice
    that the importer reshaped once per reader) when their heads have one shape (the surrogate gives
    every member its head's shape).
    Such a region was refused before (a transpose / reshape after a slice may only make an output),
    so no region that planned changes. A chain whose head feeds a transpose / reshape before the index
    ops (a per-head norm of the slice) is not one. Empty without index ops or layout ops."""
    return dict(_sliced_chains(graph))


def _sliced_chains(graph: Graph) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """:func:`sliced_chains` as items (at once empty without a slice that a chain link reads: every
    index-op walk asks for it)."""
    if not any(nd.op == "slice" and any(c.op in _LINKS for c in graph.consumers(nd.id)) for nd in graph.nodes):
        return ()
    if not has_layout_ops(graph):
        return ()
    cands = _shared_members(graph, _sliced_candidates(graph))
    while cands:
        feeds = feeds_layout(graph, frozenset(n for c in cands.values() for n in c[:-1]))
        bad = {h for h in cands if any(c.id in feeds for c in graph.consumers(h))}
        if not bad:
            break
        cands = _shared_members(graph, {h: c for h, c in cands.items() if h not in bad})
    return tuple(cands.items())


def sliced_members(graph: Graph) -> frozenset[str]:
    """The nodes of :func:`sliced_chains` (heads included, inputs not)."""
    return frozenset(n for c in sliced_chains(graph).values() for n in c[:-1])


def _sliced_candidates(graph: Graph) -> dict[str, tuple[str, ...]]:
    """The runs of :func:`sliced_chains` by their structure alone (members may be shared: checked by
    :func:`_shared_members`); a run inside another one's is dropped."""
    nodes = {n.id: n for n in graph.nodes}
    outputs, inputs = set(graph.outputs), set(graph.input_names)
    found: dict[str, tuple[str, ...]] = {}
    for nd in graph.nodes:
        cons = graph.consumers(nd.id)
        if nd.op not in ("transpose", "reshape") or not cons or nd.id in outputs \
                or any(OPS[c.op].kind == "layout" for c in cons):
            continue
        chain, cur = [nd.id], nd
        while True:
            arg = str(cur.args[0])
            if arg in outputs:
                break
            if arg in inputs:
                if any(nodes[n].op == "slice" for n in chain):
                    found[nd.id] = (*chain, arg)
                break
            if nodes[arg].op not in _LINKS or any(c.op not in _LINKS for c in graph.consumers(arg)):
                break   # (a member read by an op that computes is a head)
            chain.append(arg)
            cur = nodes[arg]
    inner = {n for c in found.values() for n in c[1:]}
    return {h: c for h, c in found.items() if h not in inner}


def _shared_members(graph: Graph, cands: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """``cands`` without the chains that share a member (the input, or a slice of it that the importer
    gave each reader its own reshape of) with a reader outside the chains, or with a chain of a
    different head shape (the surrogate gives every member its head's shape)."""
    out = dict(cands)
    while True:
        nxt: dict[str, set[str]] = {}     # member -> the chain members that read it
        heads: dict[str, set[str]] = {}   # member -> the heads of the chains through it
        for h, c in out.items():
            for k in range(1, len(c)):
                nxt.setdefault(c[k], set()).add(c[k - 1])
                heads.setdefault(c[k], set()).add(h)
        bad = {h for m, hs in heads.items()
               if any(c.id not in nxt[m] for c in graph.consumers(m))
               or len({tuple(graph.spec(x).shape) for x in hs}) > 1 for h in hs}
        if not bad:
            return out
        out = {h: c for h, c in out.items() if h not in bad}


def chain_members(graph: Graph) -> set[str]:
    """Every tensor of a :func:`composed_chains` chain (heads and inputs included)."""
    return {n for c in composed_chains(graph).values() for n in c}


def mixed_layout(graph: Graph) -> bool:
    """Whether ``graph`` has a transpose / reshape / expand outside :func:`composed_chains` (a
    *mixed* region: general maps from :func:`~stitchtune.plan.axes.tensor_axes`, column shifts only)."""
    chained = chain_members(graph) | _only_units(graph)
    return any(OPS[n.op].kind == "layout" and n.id not in chained for n in graph.nodes)


def _only_units(graph: Graph) -> frozenset[str]:
    """The :func:`~stitchtune.plan.index_ops.unit_reshapes` of a region whose layout nodes are all
    such reshapes (GPT-2's ONNX embedding: a gather, a layer norm and
    ``[1, S, C]`` viewed as ``[S, C]``): no layout change, so neither tails nor layout part, and the
    region is not mixed; empty otherwise (a mixed region maps its unit reshapes as it always did)."""
    units = unit_reshapes(graph)
    rest = [n for n in graph.nodes if OPS[n.op].kind == "layout" and n.id not in units]
    return frozenset() if rest else units


def layout_part(graph: Graph) -> set[str]:
    """The tensors of a *mixed* region (index ops and layout ops) that keep their own shape in the
    surrogate: every layout node, and everything a layout node that precedes the index ops is
    computed from (its inputs, and the nodes before it: a per-head RMSNorm of ``[B, S, H, D]``
    transposed to ``[B, H, S, D]`` and rotated). A tensor of this part read by a node outside it
    must span the iteration domain (right-aligned: every dim 1 or the domain's), so that slice /
    concat / gather see a domain-shaped tensor: the rule of :func:`layout_part_refusal`."""
    if not has_layout_ops(graph):
        return set()
    tails = layout_tails(graph)
    chained = chain_members(graph) | _only_units(graph)
    nodes = {n.id: n for n in graph.nodes}
    keep: set[str] = set(tails)
    stack: list[str] = []
    for nd in graph.nodes:
        if OPS[nd.op].kind != "layout" or nd.id in tails or nd.id in chained:
            continue
        keep.add(nd.id)
        stack.extend(nd.tensor_args)
    while stack:  # what the layout nodes before the index ops are computed from
        a = stack.pop()
        if a in keep or a in chained:
            continue
        keep.add(a)
        if a in nodes:
            stack.extend(nodes[a].tensor_args)
    return keep


def layout_part_refusal(graph: Graph) -> Refusal | None:
    """The :class:`~stitchtune.plan.refusal.Refusal` naming the first tensor of :func:`layout_part` read
    by a node outside it (in graph order) that does not span the iteration domain (of its part:
    :func:`part_domains`; of a higher rank, or not right-aligned with it); None when every one does."""
    keep = layout_part(graph)
    if not keep:
        return None
    domain, parts = domain_of(graph), part_domains(graph)
    for nd in graph.nodes:
        if nd.id in keep:
            continue
        for a in nd.tensor_args:
            if a not in keep:
                continue
            refused = align_refusal(tuple(graph.spec(a).shape), parts.get(a, domain), a,
                                    f"is read by '{nd.id}' in a region with slice, concat or gather but "
                                    f"does not align with the iteration domain {list(domain)}")
            if refused is not None:
                return refused
    return None


def wide_inputs(graph: Graph) -> frozenset[str]:
    """In a mixed region: the inputs wider than the iteration domain along its innermost axis only
    (every other dim 1 or the domain's, right-aligned), read by a slice directly (and by other
    element-wise ops, outside :func:`layout_part` and the chains): V's columns of a fused projection ``qkv
    [B, S, (H + 2 KV) * D]`` sliced to ``[B, S, KV * D]`` and then only rearranged (repeated for the
    grouped heads) into an output. Their maps keep their own row strides (the planner), and a column
    shift loads them at column ``c + d < width`` (:func:`~stitchtune.plan.shift.column_shift`)."""
    sliced = [n for n in graph.input_names if any(c.op == "slice" for c in graph.consumers(n))]
    if not sliced or not mixed_layout(graph):
        return frozenset()
    domain = domain_of(graph)
    skip = layout_part(graph) | chain_members(graph) | set(gather_tables(graph).values())
    out = set()
    for name in sliced:
        shape = tuple(graph.spec(name).shape)
        if name in skip or len(shape) > len(domain) or shape[-1] <= domain[-1]:
            continue
        if surrogate_shape(shape, domain, name)[:-1] == shape[:-1]:
            out.add(name)
    return frozenset(out)
