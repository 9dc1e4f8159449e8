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
(:func:`~stitchtune.plan.shift.shift_offset`). Refused (a :class:`~stitchtune.plan.refusal.Refusal`) naming the tensor or node: an
output or a reduction argument that does not span the domain, a tensor of higher rank than the
domain, a gather table read by anything but gather, a table whose trailing dims are not the view's
columns or an index op in a column reduction (:func:`~stitchtune.plan.view_checks.check_gathers`), an index tensor used with two
table ranks, a per-row value or a gather under a row-axis slice/concat, a size-1 slice broadcast
over several positions inside a computation (a size-1 concat piece is fine, and so is a size-1 slice
that is only stored, e.g. ``x[:, 0:1, :]`` as an output: :func:`root_shift`).

*Mixed* regions (:func:`~stitchtune.plan.index_ops.has_layout_ops`: transpose / reshape too, e.g. Llama's rotary after the head
split ``x [B, S, H*D] -> [B, S, H, D] -> [B, H, S, D]``): the layout nodes and the inputs they read
(:func:`~stitchtune.plan.chains.layout_part`) keep their own shapes in the surrogate, which the planner maps with
:func:`~stitchtune.plan.axes.tensor_axes` (general index maps); every shift must then be a column
shift (:func:`~stitchtune.plan.shift.column_shift`: slice / concat along the innermost domain axis, which must be the view's
columns, :func:`~stitchtune.plan.view_checks.check_mixed`), so a shifted load is the general map's address of view element
``(r, c + d)``; an input of the domain's own layout read by slice / concat directly, or tokens
viewed as the domain by a reshape (:func:`outer_sources`), may be shifted along any axis (Swin's
``roll`` as slice + concat along H and W, then the window partition as trailing maps): its load is
proven by :func:`~stitchtune.plan.shift.shift_offset`, in row-major strides. A
transpose / reshape / expand of a tensor computed *before* the index ops (a per-head RMSNorm, the
rotary angles made in the region) keeps its shapes with everything it is computed from
(:func:`~stitchtune.plan.chains.layout_part`); one of a tensor computed from an index op's result (``k^T`` after the rotary,
:func:`~stitchtune.plan.chains.layout_tails`) may only make an output, stored through its map. Refused there: such a node
read by another op (but see :mod:`stitchtune.plan.row_views`), a slice / concat along an outer axis
of an input read through a transpose / reshape that is not a chain (a transpose of a computed tensor), gather, column reductions, an input sliced beyond the domain other than along its innermost
axis alone (:func:`~stitchtune.plan.chains.wide_inputs`: its own row strides, a column shift up to its width).


The layout nodes of such regions (chains of inputs, tails, the layout part) and the iteration domain
are decided in :mod:`stitchtune.plan.chains`; the primitives both read in :mod:`stitchtune.plan.index_ops`.
"""

from __future__ import annotations

from dataclasses import dataclass

from stitchtune.graph.ops import INDEX_KINDS, OPS
from stitchtune.graph.parse import Graph, Node, TensorSpec
from stitchtune.plan.chains import (chain_members, composed_chains, domain_of, domain_refusal, layout_part,
                                    layout_part_refusal, layout_tails, mixed_layout, outer_part_cuts,
                                    part_domains, sliced_members, wide_inputs)
from stitchtune.plan.index_map import IndexMap, index_map
from stitchtune.plan.index_ops import after_index_ops, align_refusal, aligned_shape, gather_shapes, gather_tables, has_index_ops
from stitchtune.plan.pick import node_axis as _axis
from stitchtune.plan.pick import pick_walk
from stitchtune.plan.pieces import concat_pieces, index_free, layout_reader_shift, unit_pieces
from stitchtune.plan.refusal import Refusal
from stitchtune.plan.shift import Shift, column_offset, offset_of, size1_slice_refusal, spans

__all__ = ["OuterSources", "outer_sources", "root_shift", "int_index_op", "surrogate", "real_index_maps",
           "check_remaps", "remap_visits"]


def int_index_op(graph: Graph, ints: frozenset[str]) -> Node | Refusal | None:
    """The first slice / concat / gather of ``graph`` whose remapped evaluation meets int registers
    (``ints``, :func:`~stitchtune.plan.ints.int_registers`), or None. A remapped evaluation
    (:mod:`stitchtune.lower.remap`) loads and computes in float registers only, so an index op is named
    when its result is an int tensor or an int tensor lies :func:`_under_index_ops` it (read at a
    moved position); and while an int tensor is computed from an index op's result or belongs to a
    layout chain (:func:`~stitchtune.plan.chains.chain_members`), the first index op.
    Int values computed beside the index ops (dropout's counter ``iota`` arithmetic and its
    ``uniform`` draw next to BERT's embedding gathers, rotary's positions next to rotate_half), and
    int inputs read there or as gather indices, are evaluated by the sweep itself in int registers:
    not named. ``gather_elements`` picks are never named (:mod:`stitchtune.plan.pick`). The
    :class:`Refusal` of :func:`~stitchtune.plan.chains.domain_refusal` where the chains it asks for
    cannot be decided."""
    index_ops = [nd for nd in graph.nodes if OPS[nd.op].kind in INDEX_KINDS and nd.op != "gather_elements"]
    if not ints or not index_ops:
        return None
    under = _under_index_ops(graph, index_ops)
    named = next((nd for nd in index_ops if nd.id in ints or ints & under[nd.id]), None)
    if named is not None:
        return named
    if ints & after_index_ops(graph, sliced_members(graph)):
        return index_ops[0]
    if any(OPS[nd.op].kind == "layout" and nd.id in ints for nd in graph.nodes):
        refused = domain_refusal(graph)   # (the chains are decided over the domain)
        if refused is not None:
            return refused
        if ints & chain_members(graph):
            return index_ops[0]   # (a chain of an input is loaded by index arithmetic, as floats)
    return None


def _under_index_ops(graph: Graph, index_ops: list[Node]) -> dict[str, frozenset[str]]:
    """Index op id -> the tensors a remapped evaluation of it reads at moved positions (through
    :class:`~stitchtune.lower.remap.RemapValues`: the arguments of a slice / concat and what they
    are computed from, through other slices / concats and element-wise nodes). A gather stops the
    walk: its table row is loaded directly and its index read once per row as an int
    (:func:`~stitchtune.lower.remap.gather_index`)."""
    return {op.id: graph.upstream(() if op.op == "gather" else op.tensor_args, lambda nd: nd.op != "gather")
            for op in index_ops}


def surrogate(graph: Graph) -> Graph | Refusal:
    """The graph the planner analyses in place of ``graph`` (module docstring); ``graph`` itself
    when it has no index op. In a mixed region the tensors of :func:`~stitchtune.plan.chains.layout_part` keep their shapes
    (the planner maps them with :func:`~stitchtune.plan.axes.tensor_axes`). The :class:`Refusal` of the
    first rule it meets (in this order: :func:`~stitchtune.plan.chains.domain_refusal`, an outer move in
    another part than the domain's (``apart``/``edges``: the reads to cut), the gather tables,
    :func:`~stitchtune.plan.chains.layout_part_refusal`, a tensor of a higher rank than its domain, a
    pick's subtree (:func:`~stitchtune.plan.pick.pick_walk`), an output or reduction argument that does
    not span the domain) where it cannot be made."""
    if not has_index_ops(graph):
        return graph
    refused = domain_refusal(graph)
    if refused is not None:
        return refused
    domain, parts = domain_of(graph), part_domains(graph)   # (parts: independent q / k rotary)
    cuts = outer_part_cuts(graph, parts, domain) if parts else ()
    if cuts:
        return Refusal(
            f"node '{cuts[0][0]}' concatenates or slices along an outer axis in a part of the region other than the "
            f"iteration domain's {list(domain)} (tensors of unrelated shapes); it reads '{cuts[0][1]}', which the other "
            "parts read too (a region each)", (cuts[0][0],), cuts)
    special = gather_shapes(graph, domain)
    if isinstance(special, Refusal):
        return special
    refused = layout_part_refusal(graph)
    if refused is not None:
        return refused
    keep = layout_part(graph)
    for head, chain in composed_chains(graph).items():  # one input of the head's aligned shape
        head_shape = aligned_shape(graph.spec(head).shape, domain, head)
        if isinstance(head_shape, Refusal):
            return head_shape
        special.update({n: head_shape for n in chain})
    special.update(unit_pieces(graph, domain))

    def shape_of(name: str, shape: tuple[int, ...]) -> tuple[int, ...] | Refusal:
        return tuple(shape) if name in keep else special.get(name) or aligned_shape(shape, parts.get(name, domain), name)

    inputs = []
    for n, s in graph.inputs:
        shape = shape_of(n, s.shape)
        if isinstance(shape, Refusal):
            return shape
        inputs.append((n, TensorSpec(shape, s.dtype)))
    nodes = []
    for nd in graph.nodes:
        kind = OPS[nd.op].kind
        shape = shape_of(nd.id, nd.shape)
        if isinstance(shape, Refusal):
            return shape
        op = {"slice": "neg", "concat": "add", "gather": "add", "gather_elements": "add", "layout": "neg"}.get(kind, nd.op)
        if nd.id in keep:  # a layout node of a mixed region, as it is (perm / target shape)
            nodes.append(nd)
            continue
        args = nd.args
        if kind == "gather_elements":  # one value per row: of its index and the per-row values it reads
            leaves = pick_walk(graph, nd, domain)
            if isinstance(leaves, Refusal):
                return leaves
            args = (str(nd.args[1]), *leaves[0])
        nodes.append(Node(id=nd.id, op=op, args=args, axes=nd.axes, keepdims=nd.keepdims, to=nd.to,
                          shape=shape, dtype=nd.dtype))
    for name in [o for o in graph.outputs if o not in keep] + [str(n.args[0]) for n in graph.reductions()
                                                               if str(n.args[0]) not in keep]:
        refused = align_refusal(
            tuple(graph.spec(name).shape), parts.get(name, domain), name,
            f"is stored or reduced but does not span the iteration domain {list(domain)}; stitched kernels store "
            "and reduce whole tensors only (tensors of unrelated shapes, e.g. rotary's q with 4 heads and k with 2 "
            "without k's grouped copy, belong in separate regions: plan.chains.part_domains)")
        if refused is not None:
            return refused
    return Graph(name=graph.name, inputs=tuple(inputs), nodes=tuple(nodes), outputs=graph.outputs)


def root_shift(graph: Graph, name: str, domain: tuple[int, ...], row_axes: tuple[int, ...]) -> Shift:
    """The shift output ``name`` is evaluated at: ``Shift()``, except where it broadcasts along a row
    axis ``a`` of the domain (its own dim 1 there) and has a size-1 slice along ``a`` in its subtree
    (BERT's pooler / ViT's class token: ``x[:, 0:1, :]`` of a LayerNorm output, stored next to it).
    Such an output is stored only by the positions at coordinate 0 of ``a`` (per-column outputs by
    row 0, others by :attr:`~stitchtune.plan.index_map.IndexMap.store_once`), so its evaluation is
    limited to ``0 <= p[a] < 1``; under that condition the slice is a one-position piece moved by its
    start (the remap of a size-1 concat piece), and the other positions' loads are masked. An output
    made by a trailing transpose / reshape (:func:`~stitchtune.plan.chains.layout_tails`) is the tensor
    it rearranges, stored through its map (its own shape is not right-aligned with the domain)."""
    if not has_index_ops(graph):
        return Shift()
    nodes = {n.id: n for n in graph.nodes}
    tails = layout_tails(graph)
    while name in tails:
        name = nodes[name].tensor_args[0]
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
                 varies: dict[str, bool], mixed: bool = False) -> Refusal | None:
    """Walk the remapped evaluations a kernel will make (the rules of :mod:`stitchtune.lower.remap`),
    from the outputs and the reduction arguments, so that every refusal is a planning error: the
    :class:`Refusal` of the first evaluation the walk meets that breaks a rule (a per-row value
    (``varies[name]`` false: it does not vary along the columns) or a gather under a row-axis shift, a
    remapped load outside a tensor), None when every one is proven. ``varies``: tensor -> varies along the columns.
    ``mixed``: a region with transpose / reshape, where a shift that reaches an input through a layout
    node (or one of another layout than the domain's) is a column shift (:func:`~stitchtune.plan.shift.column_offset`); an input
    of the domain's layout read by slice / concat directly may be shifted along any axis (Swin's roll
    before the window partition), its load proven by :func:`~stitchtune.plan.shift.offset_of`. Called on a
    graph whose :func:`surrogate` the planner has made (the chain and layout rules it reads refused there)."""
    walk = _RemapWalk(graph, domain, frozenset(row_axes), varies, mixed)
    for name in graph.outputs:
        refused = walk.visit(name, root_shift(graph, name, domain, row_axes))
        if refused is not None:
            return refused
    for name in [str(n.args[0]) for n in graph.reductions()]:
        refused = walk.visit(name, Shift())
        if refused is not None:
            return refused
    return None


def remap_visits(graph: Graph, domain: tuple[int, ...], row_axes: tuple[int, ...], varies: dict[str, bool],
                 mixed: bool = False) -> frozenset[tuple[str, Shift]]:
    """The (tensor, shift) evaluations :func:`check_remaps` walks (those a row kernel makes), for a graph it
    proves: how many times each tensor is read, at which shifts (a layout chain's loads per element)."""
    walk = _RemapWalk(graph, domain, frozenset(row_axes), varies, mixed)
    for name in graph.outputs:
        walk.visit(name, root_shift(graph, name, domain, row_axes))
    for name in [str(n.args[0]) for n in graph.reductions()]:
        walk.visit(name, Shift())
    return frozenset(walk.seen)


def _refused(value: int | Refusal) -> Refusal | None:
    """The refusal of a bounds proof (:func:`~stitchtune.plan.shift.offset_of`,
    :func:`~stitchtune.plan.shift.column_offset`), None for its offset."""
    return value if isinstance(value, Refusal) else None


class _RemapWalk:
    """One walk of :func:`check_remaps`: the evaluations proven so far (``seen``), and what the
    region decides once (its chains, layout part, outer sources and wide inputs). Each step answers
    the first :class:`Refusal` it meets, or None."""

    def __init__(self, graph: Graph, domain: tuple[int, ...], rows: frozenset[int], varies: dict[str, bool],
                 mixed: bool) -> None:
        self.graph, self.domain, self.rows, self.varies, self.mixed = graph, domain, rows, varies, mixed
        self.nodes = {n.id: n for n in graph.nodes}
        self.seen: set[tuple[str, Shift]] = set()
        self.chains = composed_chains(graph)
        self.keep = layout_part(graph) if mixed else set()
        self.outer = outer_sources(graph, domain) if mixed else OuterSources((), frozenset())
        self.wide = wide_inputs(graph) if mixed else frozenset()
        self.unit = unit_pieces(graph, domain)   # (size 1 along a concat's axis: positions, not a broadcast)
        self.free = index_free(graph)

    def visit(self, name: str, sh: Shift) -> Refusal | None:
        """Prove tensor ``name`` evaluated at shift ``sh``, and what it reads at theirs."""
        nd = self.nodes.get(name)
        if self.mixed:
            sh = layout_reader_shift(self.graph, self.keep, name, sh, self.domain, not self.varies[name], self.free)
        if (name, sh) in self.seen:
            return None
        self.seen.add((name, sh))
        own = self._own_checks(nd, sh) if nd is not None else True
        if isinstance(own, Refusal) or not own:
            return own or None
        if not self.varies[name]:
            per_row = self._per_row(name, nd, sh)
            if isinstance(per_row, Refusal):
                return per_row
            sh = per_row
        if name in self.chains:  # loaded through the chain: in bounds where the head's positions are
            return _refused(offset_of(name, self.graph.spec(name).shape, sh, self.domain))
        outer = self._outer_load(name, nd, sh)
        if isinstance(outer, Refusal) or outer:
            return outer if isinstance(outer, Refusal) else None
        if nd is None:
            return self._input_load(name, sh)
        return self._through(nd, sh)

    def _own_checks(self, nd: Node, sh: Shift) -> bool | Refusal:
        """The checks of ``nd`` itself: a size-1 slice broadcast over several positions; a pick under a
        row-axis shift (the refusal). False where the walk stops (a pick is loaded at its own row),
        True where it goes on."""
        kind = OPS[nd.op].kind
        if kind == "slice":
            refused = size1_slice_refusal(nd, sh, self.domain)
            if refused is not None:
                return refused
        if kind == "gather_elements":
            if {a for a, _ in sh.delta} & self.rows:
                return Refusal(f"gather_elements '{nd.id}' under a slice/concat along a row axis is not supported")
            return False
        return True

    def _per_row(self, name: str, nd: Node | None, sh: Shift) -> Shift | Refusal:
        """The shift a value that does not vary along the columns is evaluated at: the sweep's own
        element; refused for an index op's result and under a row-axis shift."""
        if nd is not None and OPS[nd.op].kind in INDEX_KINDS:
            return Refusal(
                f"{nd.op} '{name}' gives a value that does not vary along the kernel's columns (one per row, "
                "or a scalar); stitched kernels remap full and per-column values only")
        if {a for a, _ in sh.delta} & self.rows:  # conditions alone keep the own element
            return Refusal(f"tensor '{name}': a per-row value under a slice/concat along a row axis is not supported")
        return Shift()

    def _outer_load(self, name: str, nd: Node | None, sh: Shift) -> bool | Refusal:
        """In a mixed region, a shift along an outer axis reaching an input or the layout part: True
        where it is an input of :func:`outer_sources` (its load ``p + delta`` in row-major strides,
        Swin's roll, proven here); the refusal where the shift may not reach it or the load is out of
        bounds; False otherwise (the walk goes on)."""
        if not (self.mixed and sh.axes() - {len(self.domain) - 1} and (nd is None or name in self.keep)):
            return False
        src = self.outer.shape(name)
        if nd is not None and name not in self.outer.nodes or nd is None and src is None:
            return Refusal(
                f"node '{name}': a slice/concat along an outer axis reads it through a transpose / reshape "
                "(or it does not have the iteration domain's layout); there slice and concat may act along "
                "the innermost axis only")
        if not any(OPS[n.op].kind != "layout" and tuple(n.shape) == tuple(self.domain) for n in self.graph.nodes):
            return Refusal(
                f"tensor '{name}': a slice/concat along an outer axis in a region with transpose / reshape "
                "needs a computed tensor of the iteration domain's shape (the kernel's positions)")
        if src is None:
            return False
        return _refused(offset_of(name, src, sh, self.domain)) or True

    def _input_load(self, name: str, sh: Shift) -> Refusal | None:
        """A graph input loaded at shift ``sh``: a column shift in a mixed region (up to its width for
        a wide input), else in bounds of its own shape."""
        if self.mixed:
            return _refused(column_offset(name, sh, self.domain,
                                          self.graph.spec(name).shape[-1] if name in self.wide else None))
        if not (not sh.delta and spans(self.graph, name, self.domain) and name not in self.unit):
            return _refused(offset_of(name, self.graph.spec(name).shape, sh, self.domain))
        return None

    def _through(self, nd: Node, sh: Shift) -> Refusal | None:
        """Walk on from node ``nd`` at shift ``sh``: a slice moves the shift by its start, a concat
        limits it to each piece, a gather's table row is loaded at it, any other op passes it on."""
        kind = OPS[nd.op].kind
        off = len(self.domain) - len(nd.shape)
        if kind == "slice":
            return self.visit(str(nd.args[0]), sh.moved(off + _axis(nd), nd.start))
        if kind == "concat":
            a, o = off + _axis(nd), 0
            for arg in nd.tensor_args:
                ln = self.graph.spec(arg).shape[_axis(nd)]
                psh = sh.limited(a, o - sh.d(a), o + ln - sh.d(a), self.domain[a])
                refused = self.visit(arg, psh.moved(a, -o)) if psh is not None else None
                if refused is not None:
                    return refused
                o += ln
            return None
        if kind == "gather":
            if sh.axes() & self.rows:
                return Refusal(f"gather '{nd.id}' under a slice/concat along a row axis is not supported")
            return _refused(offset_of(nd.id, tuple(self.graph.spec(str(nd.args[0])).shape[1:]), sh, self.domain))
        for arg in nd.tensor_args:
            refused = self.visit(arg, sh)
            if refused is not None:
                return refused
        return None


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
    domain's layout outside :func:`~stitchtune.plan.chains.layout_part` (its own shape); below a reshape to a shape that
    aligns with the domain (Swin's tokens ``[B, H*W, C]`` viewed as ``[B, H, W, C]``: a reshape keeps
    the row-major index), through element-wise nodes of the reshape's source shape, an input of that
    shape (the reshape's shape) or one that varies along the innermost dim only (a bias: its own
    shape, which the outer shift leaves alone). Anything else under an outer shift is refused."""
    if not (has_index_ops(graph) and mixed_layout(graph)):
        return OuterSources((), frozenset())
    keep = layout_part(graph)
    nodes = {n.id: n for n in graph.nodes}
    pieces = concat_pieces(graph, domain)
    shapes: dict[str, tuple[int, ...]] = {
        n: tuple(s.shape) for n, s in graph.inputs if n not in keep and (spans(graph, n, domain) or n in pieces)}
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
                ok = OPS[nd.op].kind not in ("reduce", "layout") and shape == src and nd.id not in after_index_ops(graph, sliced_members(graph))
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
    tables = set(gather_tables(graph).values()) | chain_members(graph)
    out: dict[str, IndexMap] = {}
    for name, spec in graph.inputs:
        s = sur.spec(name).shape
        if name in tables or tuple(spec.shape) == tuple(s) or len(spec.shape) != len(s):
            continue
        out[name] = index_map(spec.shape, axes[name], dict(enumerate(domain)), row_axes, col_axes)
    return out
