"""Index remaps: planning graphs with ``slice``, ``concat``, ``gather`` and ``gather_elements`` (see
graph/index_checks.py).

These ops move elements without arithmetic, so a stitched kernel never materialises their results:
it evaluates the element-wise subtree below them at a *remapped* position and loads the graph inputs
there (:mod:`stitchtune.lower.remap`). Planning sees a *surrogate* graph (:func:`surrogate`):

* the iteration domain is the largest shape (elements, then rank) among the outputs and the
  arguments of reductions (a gather table and its indices never set it);
* every tensor's surrogate shape is its own with each dimension other than 1 replaced by the
  domain's (right-aligned), so the sliced, concatenated and gathered tensors all span the domain;
* ``slice`` becomes a unary and ``concat`` an n-ary element-wise node over the surrogate shapes;
  ``gather(table, idx)`` an element-wise node of ``idx`` seen as per-row (``idx.shape`` + ones) and
  the table seen as one row (``table.shape[1:]``), so its result is full-size and the index per-row.

* ``gather_elements`` is planned as a *pick* (:func:`stitchtune.plan.pick.check_picks`): one element per row along the
  view's column axis, a per-row node of its index and of the per-row values its element-wise source
  reads (:func:`stitchtune.plan.pick.pick_leaves`), so that its stage follows theirs; the domain spans its source.

The planner then classifies, stages and maps the surrogate as any other graph (so the space, the
cost model and the heuristic need nothing new); :func:`real_index_maps` gives the inputs whose own
shape differs from their surrogate shape (a sliced input larger than the domain, a concat piece
smaller than it) their maps with their own strides, and :func:`check_remaps` walks every remapped
evaluation the kernel will make (a :class:`Shift` per tensor reached), proving each load in bounds
(:func:`~stitchtune.plan.shift.shift_offset`). Refused with :class:`UnsupportedGraphError` naming the tensor or node: an
output or a reduction argument that does not span the domain, a tensor of higher rank than the
domain, a gather table read by anything but gather, a table whose trailing dims are not the view's
columns or an index op in a column reduction (:func:`check_gathers`), an index tensor used with two
table ranks, a per-row value or a gather under a row-axis slice/concat, a size-1 slice broadcast
over several positions inside a computation (a size-1 concat piece is fine, and so is a size-1 slice
that is only stored, e.g. ``x[:, 0:1, :]`` as an output: :func:`root_shift`).

*Mixed* regions (:func:`has_layout_ops`: transpose / reshape too, e.g. Llama's rotary after the head
split ``x [B, S, H*D] -> [B, S, H, D] -> [B, H, S, D]``): the layout nodes and the inputs they read
(:func:`layout_part`) keep their own shapes in the surrogate, which the planner maps with
:func:`~stitchtune.plan.axes.tensor_axes` (general index maps); every shift must then be a column
shift (:func:`~stitchtune.plan.shift.column_shift`: slice / concat along the innermost domain axis, which must be the view's
columns, :func:`check_mixed`), so a shifted load is the general map's address of view element
``(r, c + d)``; an input of the domain's own layout read by slice / concat directly, or tokens
viewed as the domain by a reshape (:func:`outer_sources`), may be shifted along any axis (Swin's
``roll`` as slice + concat along H and W, then the window partition as trailing maps): its load is
proven by :func:`~stitchtune.plan.shift.shift_offset`, in row-major strides. A
transpose / reshape / expand of a tensor computed *before* the index ops (a per-head RMSNorm, the
rotary angles made in the region) keeps its shapes with everything it is computed from
(:func:`layout_part`); one of a tensor computed from an index op's result (``k^T`` after the rotary,
:func:`layout_tails`) may only make an output, stored through its map. Refused there: such a node
read by another op, a slice / concat along an outer axis of an input read through a transpose /
reshape, gather, column reductions, an input sliced beyond the domain other than along its innermost
axis alone (:func:`wide_inputs`: its own row strides, a column shift up to its width).

A transpose / reshape chain of one input whose head does not align with the domain (ViT's patch
flatten, concatenated after the class token along the sequence: :func:`composed_chains`) is not a
layout part: the planner sees it as one input of the head's aligned shape, the bounds are proven on
the head's own shape, and the kernel carries each (shifted, along any axis) position of the head back
through the chain to the input's offset. A region whose layout nodes are all such chains is not mixed.
A chain may also slice (:func:`sliced_chains`: Phi-3's fused ``qkv`` sliced to q's columns, viewed as
heads and transposed, then rotated); its head may then align with the domain, and its slice moves the
carried position by its start.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from stitchtune.errors import UnsupportedGraphError
from stitchtune.graph.ops import INDEX_KINDS, OPS
from stitchtune.graph.parse import Graph, Node, TensorSpec
from stitchtune.plan.index_map import IndexMap, index_map
from stitchtune.plan.family import Family
from stitchtune.plan.pick import node_axis as _axis
from stitchtune.plan.pick import check_picks, pick_leaves
from stitchtune.plan.shift import Shift, check_size1_slice, column_shift, shift_offset, spans

__all__ = ["OuterSources", "outer_sources", "root_shift", "composed_chains", "sliced_chains", "wide_inputs", "mixed_layout", "has_index_ops", "has_layout_ops", "layout_part", "layout_tails", "check_mixed", "domain_of", "surrogate", "real_index_maps", "check_gathers", "gather_tables",
           "check_remaps"]


def has_index_ops(graph: Graph) -> bool:
    return any(OPS[n.op].kind in INDEX_KINDS for n in graph.nodes)


def gather_tables(graph: Graph) -> dict[str, str]:
    """Gather node id -> its table input."""
    return {n.id: str(n.args[0]) for n in graph.nodes if n.op == "gather"}


def domain_of(graph: Graph) -> tuple[int, ...]:
    """The iteration domain: the largest output or reduction argument (elements, then rank). In a
    mixed region an output made by a trailing transpose / reshape (:func:`layout_tails`) counts by
    the tensor it rearranges."""
    tails = layout_tails(graph)
    nodes = {n.id: n for n in graph.nodes}
    names = []
    for o in graph.outputs:
        while o in tails:
            o = nodes[o].tensor_args[0]
        names.append(o)
    shapes = [graph.spec(o).shape for o in names]
    shapes += [graph.spec(str(n.args[0])).shape for n in graph.reductions()]
    shapes += [graph.spec(str(n.args[0])).shape for n in graph.nodes if n.op == "gather_elements"]
    return max(shapes, key=lambda s: (prod(s), len(s)))


def _after_index_ops(graph: Graph, loaded: frozenset[str] | None = None) -> set[str]:
    """The nodes computed from the result of a slice, concat or gather (the index ops included). The
    members of :func:`sliced_chains` (``loaded``: their nodes; None: computed) are loaded by index
    arithmetic like an input, so they and their head count as before the index ops."""
    skip = _sliced_members(graph) if loaded is None else loaded
    out: set[str] = set()
    for nd in graph.nodes:
        if nd.id in skip:
            continue
        if OPS[nd.op].kind in INDEX_KINDS or any(a in out for a in nd.tensor_args):
            out.add(nd.id)
    return out


def int_index_op(graph: Graph, ints: frozenset[str]) -> Node | None:
    """The first slice / concat / gather of ``graph`` that meets int registers (``ints``,
    :func:`~stitchtune.plan.ints.int_registers`): one that reads an int tensor, or the first of them
    when an int tensor is computed from an index op's result (a remapped evaluation computes in float
    registers only) or is a graph input. None when the int values are computed from ``iota`` alone,
    apart from the index ops (rotary's positions ``iota`` cast to float beside rotate_half's slice /
    concat); ``gather_elements`` picks are never named (:mod:`stitchtune.plan.pick`)."""
    index_ops = [nd for nd in graph.nodes if OPS[nd.op].kind in INDEX_KINDS and nd.op != "gather_elements"]
    if not ints or not index_ops:
        return None
    if ints & (_after_index_ops(graph) | set(graph.input_names)):   # (an int input: loaded as an int)
        return index_ops[0]
    return next((nd for nd in index_ops if any(a in ints for a in nd.tensor_args)), None)


def _feeds_layout(graph: Graph, loaded: frozenset[str] | None = None) -> set[str]:
    """The nodes before the index ops that a transpose / reshape / expand before the index ops is
    computed from (they keep their own shapes: :func:`layout_part`); ``loaded`` as for
    :func:`_after_index_ops`."""
    after = _after_index_ops(graph, loaded)
    out: set[str] = set()
    for nd in reversed(graph.nodes):
        if nd.id in after:
            continue
        if any(c.id in out or (OPS[c.op].kind == "layout" and c.id not in after) for c in graph.consumers(nd.id)):
            out.add(nd.id)
    return out


def layout_tails(graph: Graph) -> set[str]:
    """The transpose / reshape / expand nodes of a region with index ops that rearrange a tensor
    computed from an index op's result (``k^T`` after Llama's rotary). Each may be read only by
    other such nodes and be an output (it is stored through its map, never evaluated at a shifted
    position); :class:`UnsupportedGraphError` naming the node otherwise. A layout node of a tensor
    computed *before* any index op (a per-head RMSNorm's result transposed to ``[B, H, S, D]`` and
    rotated, the rotary angles ``cat(freqs, freqs)`` made by expand + reshape) is not a tail: it is
    part of :func:`layout_part`."""
    if not has_index_ops(graph):
        return set()
    after = _after_index_ops(graph)
    tails: set[str] = set()
    for nd in graph.nodes:
        if OPS[nd.op].kind == "layout":
            if nd.id in after:
                tails.add(nd.id)
            continue
        for a in nd.tensor_args:
            if a in tails:
                _refuse_shared_slice(graph, a, nd.id)
                raise UnsupportedGraphError(
                    f"node '{a}' (transpose / reshape) rearranges a "
                    f"tensor computed in a region with slice, concat or gather and is read by '{nd.id}'; there a "
                    "transpose / reshape of a computed tensor may only make an output")
    return tails


def _refuse_shared_slice(graph: Graph, head: str, reader: str) -> None:
    """The refusal of a layout tail read by ``reader`` that would be a :func:`sliced_chains` head but for
    what else reads the input it slices (a chain of another head shape, or an op outside the chains):
    one line naming the head (a region finder that leaves it out keeps the rest), the input and why."""
    chain = _sliced_candidates(graph).get(head)
    if chain is None:
        return
    src = chain[-1]
    others = sorted({c.id for m in chain[1:] for c in graph.consumers(m)} - set(chain))
    if not others:   # (dropped for a per-head norm before a transpose: the general refusal)
        return
    raise UnsupportedGraphError(
        f"node '{head}' (transpose / reshape) rearranges a slice of input '{src}' and is read by '{reader}', but "
        f"'{', '.join(others)}' also read that input (or its slice) in another layout or head count; slices of one "
        "input rearranged into tensors of different shapes belong in separate regions")


def _sur(shape: tuple[int, ...], domain: tuple[int, ...], name: str) -> tuple[int, ...]:
    off = len(domain) - len(shape)
    if off < 0:
        raise UnsupportedGraphError(f"tensor '{name}' {list(shape)} has a higher rank than the iteration "
                                    f"domain {list(domain)}")
    return tuple(1 if s == 1 else domain[off + k] for k, s in enumerate(shape))


def _gather_shapes(graph: Graph, domain: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
    """Surrogate shapes of the gather tables (one row) and their indices (per row)."""
    out: dict[str, tuple[int, ...]] = {}
    tables = set(gather_tables(graph).values())
    for n in graph.nodes:
        if n.op != "gather":
            if any(a in tables for a in n.tensor_args):
                raise UnsupportedGraphError(f"node '{n.id}' reads gather table '{next(a for a in n.tensor_args if a in tables)}'; "
                                            "a gather table may only be read by gather")
            continue
        table, idx = n.args
        tspec, ispec = graph.spec(str(table)), graph.spec(str(idx))
        isur = _sur(tuple(ispec.shape) + (1,) * (tspec.rank - 1), domain, str(idx))
        if out.setdefault(str(idx), isur) != isur:
            raise UnsupportedGraphError(f"gather '{n.id}': index '{idx}' is used with tables of different ranks")
        out[str(table)] = _sur(tuple(tspec.shape[1:]), domain, str(table))
    for o in graph.outputs:
        if o in tables:
            raise UnsupportedGraphError(f"output '{o}' is a gather table; a table may only be read by gather")
    return out


def has_layout_ops(graph: Graph) -> bool:
    """Whether ``graph`` has a transpose or reshape (a general index map)."""
    return any(OPS[n.op].kind == "layout" for n in graph.nodes)


def composed_chains(graph: Graph) -> dict[str, tuple[str, ...]]:
    """The layout chains a remap reads through in a region with index ops: head tensor -> ``(head,
    ..., input)``. A chain is a run of transpose / reshape nodes from one graph input, each member
    read only by the next (and no member an output), whose head is read by other ops and does not
    align with the iteration domain (right-aligned; ViT's patch flatten: conv ``[1, 32, 4, 4]`` ->
    reshape ``[1, 32, 16]`` -> transpose ``[1, 16, 32]``, concatenated after the class token along the
    sequence, domain ``[1, 17, 32]``). The planner sees the chain as one input of the head's aligned
    shape; the kernel loads the head's element at a (shifted) domain position through the chain's
    index arithmetic (:mod:`stitchtune.lower.remap`). Empty without index ops."""
    if not has_index_ops(graph) or not has_layout_ops(graph):
        return {}
    domain = domain_of(graph)
    nodes = {n.id: n for n in graph.nodes}
    outputs, inputs = set(graph.outputs), set(graph.input_names)
    feeds = _feeds_layout(graph)
    out: dict[str, tuple[str, ...]] = {}
    for nd in graph.nodes:
        cons = graph.consumers(nd.id)
        if (nd.op not in ("transpose", "reshape") or not cons or nd.id in outputs or len(nd.shape) > len(domain)
                or any(c.id in feeds for c in cons)
                or any(OPS[c.op].kind == "layout" for c in cons) or _sur(nd.shape, domain, nd.id) == nd.shape):
            continue
        chain, cur = [nd.id], nd
        while True:
            arg = str(cur.args[0])
            if graph.consumers(arg) != (cur,) or arg in outputs:
                break
            chain.append(arg)
            if arg in inputs:
                out[nd.id] = tuple(chain)
                break
            cur = nodes[arg]
            if cur.op not in ("transpose", "reshape"):
                break
    out.update(sliced_chains(graph))
    return out


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
        feeds = _feeds_layout(graph, frozenset(n for c in cands.values() for n in c[:-1]))
        bad = {h for h in cands if any(c.id in feeds for c in graph.consumers(h))}
        if not bad:
            break
        cands = _shared_members(graph, {h: c for h, c in cands.items() if h not in bad})
    return tuple(cands.items())


def _sliced_members(graph: Graph) -> frozenset[str]:
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


def _chained(graph: Graph) -> set[str]:
    return {n for c in composed_chains(graph).values() for n in c}


def mixed_layout(graph: Graph) -> bool:
    """Whether ``graph`` has a transpose / reshape / expand outside :func:`composed_chains` (a
    *mixed* region: general maps from :func:`~stitchtune.plan.axes.tensor_axes`, column shifts only)."""
    chained = _chained(graph)
    return any(OPS[n.op].kind == "layout" and n.id not in chained for n in graph.nodes)


def layout_part(graph: Graph) -> set[str]:
    """The tensors of a *mixed* region (index ops and layout ops) that keep their own shape in the
    surrogate: every layout node, and everything a layout node that precedes the index ops is
    computed from (its inputs, and the nodes before it: a per-head RMSNorm of ``[B, S, H, D]``
    transposed to ``[B, H, S, D]`` and rotated). A tensor of this part read by a node outside it
    must span the iteration domain (right-aligned: every dim 1 or the domain's), so that slice /
    concat / gather see a domain-shaped tensor; :class:`UnsupportedGraphError` naming the tensor
    otherwise."""
    if not has_layout_ops(graph):
        return set()
    domain = domain_of(graph)
    tails = layout_tails(graph)
    chained = _chained(graph)
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
    for nd in graph.nodes:
        if nd.id in keep:
            continue
        for a in nd.tensor_args:
            if a in keep and _sur(graph.spec(a).shape, domain, a) != tuple(graph.spec(a).shape):
                raise UnsupportedGraphError(
                    f"tensor '{a}' {list(graph.spec(a).shape)} is read by '{nd.id}' in a region with slice, concat "
                    f"or gather but does not align with the iteration domain {list(domain)}")
    return keep


def surrogate(graph: Graph) -> Graph:
    """The graph the planner analyses in place of ``graph`` (module docstring); ``graph`` itself
    when it has no index op. In a mixed region the tensors of :func:`layout_part` keep their shapes
    (the planner maps them with :func:`~stitchtune.plan.axes.tensor_axes`)."""
    if not has_index_ops(graph):
        return graph
    domain = domain_of(graph)
    special = _gather_shapes(graph, domain)
    keep = layout_part(graph)
    for head, chain in composed_chains(graph).items():  # one input of the head's aligned shape
        special.update({n: _sur(graph.spec(head).shape, domain, head) for n in chain})
    inputs = tuple((n, TensorSpec(tuple(s.shape) if n in keep else special.get(n) or _sur(s.shape, domain, n),
                                  s.dtype)) for n, s in graph.inputs)
    nodes = []
    for nd in graph.nodes:
        kind = OPS[nd.op].kind
        shape = tuple(nd.shape) if nd.id in keep else special.get(nd.id) or _sur(nd.shape, domain, nd.id)
        op = {"slice": "neg", "concat": "add", "gather": "add", "gather_elements": "add", "layout": "neg"}.get(kind, nd.op)
        if nd.id in keep:  # a layout node of a mixed region, as it is (perm / target shape)
            nodes.append(nd)
            continue
        args = nd.args
        if kind == "gather_elements":  # one value per row: of its index and the per-row values it reads
            args = (str(nd.args[1]), *pick_leaves(graph, nd, domain)[0])
        nodes.append(Node(id=nd.id, op=op, args=args, axes=nd.axes, keepdims=nd.keepdims, to=nd.to,
                          shape=shape, dtype=nd.dtype))
    for name in [o for o in graph.outputs if o not in keep] + [str(n.args[0]) for n in graph.reductions()
                                                               if str(n.args[0]) not in keep]:
        if tuple(graph.spec(name).shape) != _sur(graph.spec(name).shape, domain, name):
            raise UnsupportedGraphError(
                f"tensor '{name}' {list(graph.spec(name).shape)} is stored or reduced but does not span the "
                f"iteration domain {list(domain)}; stitched kernels store and reduce whole tensors only (tensors "
                "of unrelated shapes, e.g. rotary's q with 4 heads and k with 2, belong in separate regions)")
    return Graph(name=graph.name, inputs=inputs, nodes=tuple(nodes), outputs=graph.outputs)


def check_mixed(graph: Graph, sur: Graph, domain: tuple[int, ...], out_cols: tuple[int, ...],
                col_axes: tuple[int, ...], family: str) -> None:
    """A mixed region (slice / concat with transpose / reshape) is lowered with column shifts only
    (:func:`~stitchtune.plan.shift.column_shift`): no gather, a row-family (or element-wise) view whose columns are exactly
    the innermost dim of the domain (``out_cols``: the axes of an output's last dim; any view when
    every input is loaded through a :func:`composed_chains` chain: GPT-2's q/k/v split), and every input
    outside :func:`layout_part` of its surrogate shape (no sliced input larger than the domain)."""
    for n in graph.nodes:
        if n.op in ("gather", "gather_elements"):
            raise UnsupportedGraphError(f"{n.op} '{n.id}' is in a region with transpose / reshape; stitched "
                                        "kernels do not combine the two yet")
    if family == Family.COL:
        raise UnsupportedGraphError(f"{_column_reductions(graph)}slice / concat with transpose / reshape are supported "
                                    "in row-reduction and element-wise kernels only, not in column reductions")
    chained = _chained(graph)
    every_chained = all(n in chained for n in graph.input_names)  # loads by chain arithmetic only
    if (tuple(out_cols) != tuple(col_axes) and not every_chained) or domain[-1] < 2:
        raise UnsupportedGraphError(
            f"the columns of the kernel are not the innermost axis of the iteration domain {list(domain)}; "
            "slice / concat with transpose / reshape need the innermost axis as the kernel's columns")
    wide = wide_inputs(graph)
    for name, spec in graph.inputs:
        if tuple(spec.shape) != tuple(sur.spec(name).shape) and name not in chained and name not in wide:
            raise UnsupportedGraphError(
                f"input '{name}' {list(spec.shape)} is sliced beyond the iteration domain {list(domain)} in a "
                "region with transpose / reshape, along an outer axis or read through a transpose / reshape; "
                "there an input may be wider than the domain along its innermost axis only")


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
    skip = layout_part(graph) | _chained(graph) | set(gather_tables(graph).values())
    out = set()
    for name in sliced:
        shape = tuple(graph.spec(name).shape)
        if name in skip or len(shape) > len(domain) or shape[-1] <= domain[-1]:
            continue
        if _sur(shape, domain, name)[:-1] == shape[:-1]:
            out.add(name)
    return frozenset(out)


def root_shift(graph: Graph, name: str, domain: tuple[int, ...], row_axes: tuple[int, ...]) -> Shift:
    """The shift output ``name`` is evaluated at: ``Shift()``, except where it broadcasts along a row
    axis ``a`` of the domain (its own dim 1 there) and has a size-1 slice along ``a`` in its subtree
    (BERT's pooler / ViT's class token: ``x[:, 0:1, :]`` of a LayerNorm output, stored next to it).
    Such an output is stored only by the positions at coordinate 0 of ``a`` (per-column outputs by
    row 0, others by :attr:`~stitchtune.plan.index_map.IndexMap.store_once`), so its evaluation is
    limited to ``0 <= p[a] < 1``; under that condition the slice is a one-position piece moved by its
    start (the remap of a size-1 concat piece), and the other positions' loads are masked."""
    if not has_index_ops(graph):
        return Shift()
    nodes = {n.id: n for n in graph.nodes}
    shape = graph.spec(name).shape
    off = len(domain) - len(shape)
    bcast = {a for a in row_axes if domain[a] > 1 and (a < off or shape[a - off] == 1)}
    found: set[int] = set()
    stack, seen = [name], set()
    while stack and bcast - found:
        cur = stack.pop()
        nd = nodes.get(cur)
        if nd is None or cur in seen:
            continue
        seen.add(cur)
        if nd.op == "slice" and nd.shape[_axis(nd)] == 1:
            found.add(len(domain) - len(nd.shape) + _axis(nd))
        stack.extend(nd.tensor_args)
    sh = Shift()
    for a in sorted(bcast & found):
        lim = sh.limited(a, 0, 1, domain[a])
        assert lim is not None, "0 <= p < 1 is never empty on a broadcast axis (extent > 1)"
        sh = lim
    return sh


def check_remaps(graph: Graph, domain: tuple[int, ...], row_axes: tuple[int, ...],
                 varies: dict[str, bool], mixed: bool = False) -> None:
    """Walk the remapped evaluations a kernel will make (the rules of :mod:`stitchtune.lower.remap`),
    from the outputs and the reduction arguments, so that every refusal is a planning error:
    a per-row value (``varies[name]`` false: it does not vary along the columns) or a gather under a
    row-axis shift, a remapped load outside a tensor. ``varies``: tensor -> varies along the columns.
    ``mixed``: a region with transpose / reshape, where a shift that reaches an input through a layout
    node (or one of another layout than the domain's) is a column shift (:func:`~stitchtune.plan.shift.column_shift`); an input
    of the domain's layout read by slice / concat directly may be shifted along any axis (Swin's roll
    before the window partition), its load proven by :func:`~stitchtune.plan.shift.shift_offset`."""
    nodes = {n.id: n for n in graph.nodes}
    rows = set(row_axes)
    seen: set[tuple[str, Shift]] = set()
    chains = composed_chains(graph)
    keep = layout_part(graph) if mixed else set()
    outer = outer_sources(graph, domain) if mixed else OuterSources((), frozenset())
    wide = wide_inputs(graph) if mixed else frozenset()

    def visit(name: str, sh: Shift) -> None:
        if (name, sh) in seen:
            return
        seen.add((name, sh))
        nd = nodes.get(name)
        kind = OPS[nd.op].kind if nd is not None else "input"
        if nd is not None and kind == "slice":
            check_size1_slice(nd, sh, domain)
        if nd is not None and kind == "gather_elements":  # a per-row pick, loaded at its own row
            if {a for a, _ in sh.delta} & rows:
                raise UnsupportedGraphError(f"gather_elements '{name}' under a slice/concat along a row axis is "
                                            "not supported")
            return
        if not varies[name]:
            if nd is not None and kind in INDEX_KINDS:
                raise UnsupportedGraphError(
                    f"{nd.op} '{name}' gives a value that does not vary along the kernel's columns (one per row, "
                    "or a scalar); stitched kernels remap full and per-column values only")
            if {a for a, _ in sh.delta} & rows:  # conditions alone keep the own element
                raise UnsupportedGraphError(f"tensor '{name}': a per-row value under a slice/concat along a "
                                            "row axis is not supported")
            sh = Shift()  # evaluated as at the sweep's own element
        if name in chains:  # loaded through the chain: in bounds where the head's positions are
            shift_offset(name, graph.spec(name).shape, sh, domain)
            return
        if mixed and sh.axes() - {len(domain) - 1} and (nd is None or name in keep):
            src = outer.shape(name)
            if nd is not None and name not in outer.nodes or nd is None and src is None:
                raise UnsupportedGraphError(
                    f"node '{name}': a slice/concat along an outer axis reads it through a transpose / reshape "
                    "(or it does not have the iteration domain's layout); there slice and concat may act along "
                    "the innermost axis only")
            if not any(OPS[n.op].kind != "layout" and tuple(n.shape) == tuple(domain) for n in graph.nodes):
                raise UnsupportedGraphError(
                    f"tensor '{name}': a slice/concat along an outer axis in a region with transpose / reshape "
                    "needs a computed tensor of the iteration domain's shape (the kernel's positions)")
            if src is not None:  # an input: p + delta in row-major strides (Swin's roll)
                shift_offset(name, src, sh, domain)
                return
        if nd is None:
            if mixed:
                column_shift(name, sh, domain, graph.spec(name).shape[-1] if name in wide else None)
            elif not (not sh.delta and spans(graph, name, domain)):
                shift_offset(name, graph.spec(name).shape, sh, domain)
            return
        off = len(domain) - len(nd.shape)
        if kind == "slice":
            a = off + _axis(nd)
            visit(str(nd.args[0]), sh.moved(a, nd.start))
        elif kind == "concat":
            a, o = off + _axis(nd), 0
            for arg in nd.tensor_args:
                ln = graph.spec(arg).shape[_axis(nd)]
                psh = sh.limited(a, o - sh.d(a), o + ln - sh.d(a), domain[a])
                if psh is not None:
                    visit(arg, psh.moved(a, -o))
                o += ln
        elif kind == "gather":
            if sh.axes() & rows:
                raise UnsupportedGraphError(f"gather '{nd.id}' under a slice/concat along a row axis is not supported")
            shift_offset(nd.id, tuple(graph.spec(str(nd.args[0])).shape[1:]), sh, domain)
        else:
            for arg in nd.tensor_args:
                visit(arg, sh)

    for name in graph.outputs:
        visit(name, root_shift(graph, name, domain, row_axes))
    for name in [str(n.args[0]) for n in graph.reductions()]:
        visit(name, Shift())


@dataclass(frozen=True)
class OuterSources:
    """What a shift along an outer axis may reach in a mixed region (:func:`outer_sources`):
    ``shapes`` input -> the shape in whose row-major strides it is loaded at a shifted position;
    ``nodes``: the layout and computed nodes it is evaluated through."""

    shapes: tuple[tuple[str, tuple[int, ...]], ...]
    nodes: frozenset[str]

    def shape(self, name: str) -> tuple[int, ...] | None:
        return dict(self.shapes).get(name)


def outer_sources(graph: Graph, domain: tuple[int, ...]) -> OuterSources:
    """In a mixed region: the inputs a position shifted along an outer axis (Swin's roll) may be
    loaded from, each with the shape in whose row-major strides its offset moves: an input of the
    domain's layout outside :func:`layout_part` (its own shape); below a reshape to a shape that
    aligns with the domain (Swin's tokens ``[B, H*W, C]`` viewed as ``[B, H, W, C]``: a reshape keeps
    the row-major index), through element-wise nodes of the reshape's source shape, an input of that
    shape (the reshape's shape) or one that varies along the innermost dim only (a bias: its own
    shape, which the outer shift leaves alone). Anything else under an outer shift is refused."""
    if not (has_index_ops(graph) and mixed_layout(graph)):
        return OuterSources((), frozenset())
    keep = layout_part(graph)
    nodes = {n.id: n for n in graph.nodes}
    shapes: dict[str, tuple[int, ...]] = {
        n: tuple(s.shape) for n, s in graph.inputs if n not in keep and spans(graph, n, domain)}
    through: set[str] = set()
    for r in graph.nodes:
        if r.op != "reshape" or r.id not in keep or len(r.shape) > len(domain) or not spans(graph, r.id, domain):
            continue
        src = tuple(graph.spec(str(r.args[0])).shape)
        if src[-1:] != tuple(domain[-1:]):
            continue
        found: dict[str, tuple[int, ...]] = {}
        seen: set[str] = set()
        stack, ok = [str(r.args[0])], True
        while stack and ok:
            a = stack.pop()
            if a in seen:
                continue
            seen.add(a)
            shape = tuple(graph.spec(a).shape)
            if a in nodes:
                nd = nodes[a]
                ok = OPS[nd.op].kind not in ("reduce", "layout") and shape == src and nd.id not in _after_index_ops(graph)
                stack.extend(nd.tensor_args)
            elif shape == src:
                found[a] = tuple(r.shape)
            elif all(d == 1 for d in shape[:-1]) and shape[-1:] == src[-1:]:
                found[a] = shape
            else:
                ok = False
        if ok and all(shapes.get(n, v) == v for n, v in found.items()):
            shapes.update(found)
            through |= (seen - set(graph.input_names)) | {r.id}
    return OuterSources(tuple(sorted(shapes.items())), frozenset(through))


def real_index_maps(graph: Graph, sur: Graph, axes: dict[str, tuple[int | None, ...]], domain: tuple[int, ...],
                    row_axes: tuple[int, ...], col_axes: tuple[int, ...]) -> dict[str, IndexMap]:
    """The maps of the inputs whose own shape (same rank) differs from the surrogate one: the same
    domain axes, addressed with their own strides (a sliced input larger than the domain)."""
    tables = set(gather_tables(graph).values()) | _chained(graph)
    out: dict[str, IndexMap] = {}
    for name, spec in graph.inputs:
        s = sur.spec(name).shape
        if name in tables or tuple(spec.shape) == tuple(s) or len(spec.shape) != len(s):
            continue
        out[name] = index_map(spec.shape, axes[name], dict(enumerate(domain)), row_axes, col_axes)
    return out


def _column_reductions(graph: Graph) -> str:
    """The refusal's head naming a column-family graph's reductions first (``"column reduction
    'sum_13' next to "``): a region finder that declines the node a refusal names first then keeps
    the index ops (a concat of the q/k/v gradients) and leaves the column sum out, not the reverse."""
    reds = [nd.id for nd in graph.nodes if OPS[nd.op].kind == "reduce"]
    return f"column reduction {', '.join(repr(r) for r in reds)} next to " if reds else ""


def check_gathers(graph: Graph, domain: tuple[int, ...], col_axes: tuple[int, ...], family: str) -> None:
    """A gather's table rows must be the view's columns: ``table.shape[1:]`` spans exactly the column
    axes (so element ``(r, c)`` is ``table[idx[r], c]``), in a row-family view."""
    for n in graph.nodes:
        if n.op not in ("gather", "gather_elements", "slice", "concat"):
            continue
        if family == Family.COL:
            raise UnsupportedGraphError(f"{_column_reductions(graph)}{n.op} '{n.id}': index ops are supported in "
                                        "row-reduction and element-wise kernels only, not in column reductions")
        if n.op == "gather_elements":
            check_picks(graph, domain, col_axes)
        if n.op != "gather":
            continue
        trail = graph.spec(str(n.args[0])).shape[1:]
        cols = tuple(domain[a] for a in col_axes)
        live = tuple(d for d in cols if d > 1)
        if prod(trail) != prod(cols) or tuple(d for d in trail if d > 1) != live or (
                col_axes and col_axes[0] < len(domain) - len(trail)):
            raise UnsupportedGraphError(
                f"gather '{n.id}': the table's rows {list(trail)} are not the contiguous axes {list(cols)} "
                "of the kernel (gather whole rows of a table whose rows are the innermost axes)")
