"""A region of the torch backend mapped at other shapes than the ones it was found at: at concrete
input shapes (:func:`map_at_shapes`, a kernel per shape) and once for every value of its symbolic
dims (:func:`symbolic_dims`, :func:`symbolic_region` -> :class:`SymbolicRegion`: the graph.json of a
dynamic graph whose dims are named ``d0, d1, ...``). The regions themselves are found by
:func:`stitchtune.importers.torch_regions.find_regions`; nothing here modifies the module given."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stitchtune.errors import StitchtuneError
from stitchtune.importers.torch_cuts import Accept, plan_check, reason_of
from stitchtune.importers.torch_mapping import Declined, _Culprit, _map_group

__all__ = ["SymbolicRegion", "map_at_shapes", "symbolic_dims", "symbolic_region", "unify_symbols"]


def map_at_shapes(module: Any, inputs: Sequence[Any], name: str,
                  accept: Accept | None = plan_check,
                  perms: Sequence[tuple[int, ...] | None] = ()) -> tuple[Any, list[int], tuple[Any, ...]]:
    """A region's ``module`` mapped again for the concrete ``inputs`` (tensors): (Graph, for each of
    the module's outputs its index in ``graph.outputs``, the output shapes as the kernel writes them:
    PyTorch's, permuted by ``perms``). The module's outputs that are no-op views of a value the region
    reads (the region's ``aliases``: GPT-2's fused qkv viewed for q beside the cache concats) are
    PyTorch's, not the kernel's: they are left out of both lists. ``perms`` (the region's
    ``output_perms``, per kept module output; empty: all None) is the axis order each output must be
    stored in: the mapping at these shapes
    must store it so (a region whose outputs PyTorch keeps permuted writes them row-major in that
    order). Raises :class:`~stitchtune.errors.StitchtuneError` when the region does not map or plan
    at these shapes, or would store an output in another order."""
    import copy

    import torch

    gm = copy.deepcopy(module)

    class _Meta(torch.fx.Interpreter):
        def run_node(self, n: Any) -> Any:
            out = super().run_node(n)
            n.meta["val"] = out
            return out

        def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
            if "device" in kwargs:   # a factory (iota, full) made where the graph ran: here beside the meta inputs
                kwargs = {**kwargs, "device": torch.device("meta")}
            return super().call_function(target, args, kwargs)

    _Meta(gm).run(*[torch.empty(tuple(t.shape), dtype=t.dtype, device="meta") for t in inputs])
    group = [n for n in gm.graph.nodes if n.op == "call_function"]
    held = {n: n.meta["folded"] for n in gm.graph.nodes if "folded" in n.meta}
    group = [n for n in group if n not in held]
    res = _map_group(group, name, held)
    if res is None:
        raise StitchtuneError(f"region {name}: nothing reads its outputs")
    if isinstance(res, (_Culprit, Declined)):
        raise StitchtuneError(f"region {name} at shapes {[list(t.shape) for t in inputs]}: {res.reason}")
    graph, outputs = res.graph, res.outputs
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    aliased = {a for a, _ in res.aliases}   # no-op views the module returns beside the kernel's outputs
    wanted = [o for o in out_node.args[0] if o not in aliased]
    want = tuple(perms) or (None,) * len(wanted)
    if len(want) != len(wanted) or any(o in outputs and res.perms[outputs.index(o)] != p for o, p in zip(wanted, want)):
        raise StitchtuneError(f"region {name} at shapes {[list(t.shape) for t in inputs]}: an output is "
                              "not stored in the region's axis order")
    why = accept(graph) if accept is not None else None
    if why:
        raise StitchtuneError(f"region {name} at shapes {[list(t.shape) for t in inputs]}: {reason_of(why)}")
    if any(o not in outputs for o in wanted):
        raise StitchtuneError(f"region {name}: an output is not computed by the region at these shapes")
    index = [outputs.index(o) for o in wanted]
    return graph, index, tuple(tuple(int(d) for d in (o.meta["val"] if p is None else o.meta["val"].permute(p)).shape)
                               for o, p in zip(wanted, want))


# ---------------------------------------------------------------------------- symbolic dims
def symbolic_dims(nodes: Sequence[Any]) -> tuple[tuple[int | str | None, ...], ...]:
    """Per fx node (a region's inputs), per dim of its ``meta["val"]``: the int of a static dim, the
    name of the symbol a symbolic dim is (``"s0"``: dynamo's symbol, the same name in every region
    of a graph), or None for a symbolic dim that is an expression of symbols (``2*s0``)."""
    out = []
    for n in nodes:
        dims: list[int | str | None] = []
        for d in n.meta["val"].shape:
            if isinstance(d, int):
                dims.append(d)
                continue
            expr = d.node.expr
            if getattr(expr, "is_number", False):
                dims.append(int(expr))
            elif getattr(expr, "is_Symbol", False):
                dims.append(str(expr))
            else:
                dims.append(None)
        out.append(tuple(dims))
    return tuple(out)


def unify_symbols(nodes: Sequence[Any], dims: Sequence[Sequence[int | str | None]]
                  ) -> tuple[tuple[int | str | None, ...], ...]:
    """``dims`` (:func:`symbolic_dims` of ``nodes``) with symbols that play the same part written as
    one: two symbols are one when dynamo's shape env proves them equal, or when they are the same axis
    of inputs of one shape pattern (the same rank and static dims: a decode step's past keys and past
    values, ``[1, H, s0, D]`` and ``[1, H, s1, D]``, which dynamo gives separate symbols since nothing
    in the graph compares them) and equal at the example shapes. The second kind is not proven: the
    :class:`SymbolicRegion` of the result lists every repeated position in ``ties`` and its caller
    must check them at run time (:meth:`SymbolicRegion.tied`), running unequal extents otherwise."""
    import sympy  # type: ignore[import-untyped]  # dynamo's shape expressions (torch depends on it)

    first: dict[tuple[object, ...], str] = {}   # (pattern, axis, hint) -> the symbol kept
    exprs: dict[str, Any] = {}                  # a kept symbol -> its expression in dynamo's shape env
    rename: dict[str, str] = {}
    for n, ds in zip(nodes, dims):
        shape = n.meta["val"].shape
        pattern = tuple(x if isinstance(x, int) else "?" for x in ds)
        for axis, d in enumerate(ds):
            if not isinstance(d, str) or d in rename or d in exprs:
                continue
            node = shape[axis].node
            kept = first.setdefault((pattern, axis, node.hint), d)
            if kept != d:
                rename[d] = kept
                continue
            for other, expr in exprs.items():
                try:
                    proven = node.shape_env._maybe_evaluate_static(sympy.Eq(expr, node.expr))
                except Exception:  # noqa: BLE001 - a shape env without the method: no proof
                    proven = None
                if proven is not None and bool(proven):
                    rename[d] = first[(pattern, axis, node.hint)] = other
                    break
            else:
                exprs[d] = node.expr
    return tuple(tuple(rename.get(d, d) if isinstance(d, str) else d for d in ds) for ds in dims)


#: the values symbolic dims are mapped at, two sets (see :func:`symbolic_region`): primes far from
#: the sizes of models, so that no static dim or product of them equals one by chance
_PROBES = ((1009, 1013, 1019, 1021, 1031, 1033, 1039, 1049), (1051, 1061, 1063, 1069, 1087, 1091, 1093, 1097))


@dataclass(frozen=True)
class SymbolicRegion:
    """A region's graph with its symbolic dims named (see :func:`symbolic_region`).

    ``template`` is graph.json (:meth:`Graph.to_dict`) with each symbolic extent written as its name
    in the shapes of inputs and of ``reshape``/``expand`` nodes; ``names`` the dim names, sorted;
    ``where[name]`` the (region input, axis) its extent is read from at run time; ``index[i]`` the
    position in the graph's outputs of the module's output ``i`` and ``output_shapes[i]`` its PyTorch
    shape (ints and names); ``ties`` every further (name, input, axis) a dim appears at (one name on
    two inputs: :func:`unify_symbols`), whose extents :meth:`tied` checks."""

    template_json: str
    names: tuple[str, ...]
    where: tuple[tuple[str, int, int], ...]
    index: tuple[int, ...]
    output_shapes: tuple[tuple[int | str, ...], ...]
    ties: tuple[tuple[str, int, int], ...] = ()

    @property
    def template(self) -> dict[str, Any]:
        import json

        out: dict[str, Any] = json.loads(self.template_json)
        return out

    def extents(self, shapes: Sequence[Sequence[int]]) -> dict[str, int]:
        """Each dim's extent in the region inputs' ``shapes`` (PyTorch's, in input order)."""
        return {name: int(shapes[i][axis]) for name, i, axis in self.where}

    def tied(self, shapes: Sequence[Sequence[int]]) -> bool:
        """Whether every position of each dim in ``ties`` has the extent of its first position in ``shapes``
        (the region's kernels serve these shapes only when it does)."""
        if not self.ties:
            return True
        ext = self.extents(shapes)
        return all(int(shapes[i][axis]) == ext[name] for name, i, axis in self.ties)

    def graph_json(self, bounds: Mapping[str, tuple[int, int]]) -> dict[str, Any]:
        """graph.json with its ``"dynamic"`` section: each dim's (min, max) from ``bounds``."""
        return {**self.template, "dynamic": {n: {"min": bounds[n][0], "max": bounds[n][1]} for n in self.names}}

    def shapes_at(self, extents: Mapping[str, int]) -> tuple[tuple[int, ...], ...]:
        """PyTorch's output shapes at ``extents`` (a dim ``"d0+1"``: the extent of ``d0`` plus 1)."""
        return tuple(tuple(_extent(d, extents) for d in s) for s in self.output_shapes)

    def graph_output_shapes(self, extents: Mapping[str, int]) -> tuple[tuple[int, ...], ...]:
        """PyTorch's output shapes at ``extents`` in the graph's output order (output ``index[i]`` is
        the module's output ``i``)."""
        shapes = self.shapes_at(extents)
        out: list[tuple[int, ...]] = [()] * len(shapes)
        for j, i in enumerate(self.index):
            out[i] = shapes[j]
        return tuple(out)


def _extent(dim: int | str, extents: Mapping[str, int]) -> int:
    """The value of an output dim: an int, a dim name, or a sum of names and a small offset
    (``"d0+1"``, ``"d0-1"``, ``"d0+d1"``: :func:`_offset_names`)."""
    if isinstance(dim, int):
        return dim
    total, sign, tok = 0, 1, ""
    for ch in dim + "+":
        if ch in "+-":
            if tok:
                total += sign * (int(tok) if tok.isdigit() else extents[tok])
            sign, tok = (1 if ch == "+" else -1), ""
        else:
            tok += ch
    return total


#: the largest offset of an output dim from a symbol (a KV cache's ``s + 1``)
_MAX_OFFSET = 8


def _dim_name(x: int, y: int, va: Mapping[str, int], vb: Mapping[str, int]) -> str | None:
    """The dim that is ``x`` at probes ``va`` and ``y`` at ``vb``: one symbol or the sum of two (a chunked
    prefill's cache ``d0 + d1``: past and new positions), plus or minus at most :data:`_MAX_OFFSET`;
    None when none is."""
    names = sorted(va)
    for group in [(n,) for n in names] + [(m, n) for i, m in enumerate(names) for n in names[i + 1:]]:
        k = x - sum(va[n] for n in group)
        if k == y - sum(vb[n] for n in group) and abs(k) <= _MAX_OFFSET:
            return "+".join(group) + (f"{'+' if k > 0 else '-'}{abs(k)}" if k else "")
    return None


def _offset_names(a: tuple[tuple[int, ...], ...], b: tuple[tuple[int, ...], ...], va: Mapping[str, int],
                  vb: Mapping[str, int]) -> tuple[tuple[int | str, ...], ...] | None:
    """The output shapes mapped at the two probe sets ``va`` and ``vb`` (symbol -> probe) as one shape
    each: a dim equal in both is static (an int); one that differs is a symbol's name (``"d0"``), a
    symbol plus or minus a small offset (``"d0+1"``: the concat of a cache of ``d0`` positions and one
    new one) or the sum of two (``"d0+d1"``, :func:`_dim_name`); None when none gives both values."""
    out: list[tuple[int | str, ...]] = []
    for sa, sb in zip(a, b):
        dims: list[int | str] = []
        for x, y in zip(sa, sb):
            if x == y:
                dims.append(x)
                continue
            name = _dim_name(x, y, va, vb)
            if name is None:
                return None
            dims.append(name)
        out.append(tuple(dims))
    return tuple(out)


def _named(obj: Any, names: Mapping[int, str]) -> Any:
    """``obj`` (graph.json) with every int in a ``shape`` list that is a key of ``names`` replaced by its name."""
    if isinstance(obj, dict):
        return {k: ([names.get(x, x) if isinstance(x, int) else x for x in v]
                    if k == "shape" and isinstance(v, list) else _named(v, names)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_named(x, names) for x in obj]
    return obj


def _slices_from_end(graph: Any, probes: Mapping[int, str]) -> dict[str, Any]:
    """``graph.to_dict()`` with each slice along an axis of a probe extent (a key of ``probes``) written
    from the axis's end: a stop at the end as ``null``, a start or stop in the axis's upper half as a
    negative count from the end (``x[:, 1:]`` is ``1:null``, ``x[:, :-1]`` ``0:-1``, ``x[:, -3:]``
    ``-3:null`` at every probe), so that both probe sets give one template; a static bound stays."""
    d = graph.to_dict()
    for nd in d["nodes"]:
        if nd["op"] != "slice":
            continue
        n = graph.spec(nd["args"][0]).shape[nd["axis"]]
        if n not in probes:
            continue
        if nd["stop"] == n:
            nd["stop"] = None
        elif 2 * nd["stop"] > n:
            nd["stop"] -= n
        if 2 * nd["start"] > n:
            nd["start"] -= n
    return d


def symbolic_region(module: Any, dims: Sequence[Sequence[int | str | None]], dtypes: Sequence[Any], name: str,
                    accept: Accept | None = plan_check,
                    perms: Sequence[tuple[int, ...] | None] = ()) -> SymbolicRegion:
    """A region's ``module`` mapped once for every value of its symbolic dims: ``dims`` per input as
    :func:`symbolic_dims` gives them, ``dtypes`` the inputs' torch dtypes. The symbols are named
    ``d0, d1, ...`` in order of first appearance (input by input, axis by axis), not by dynamo's
    symbol names, so equal regions get equal graphs and bucket labels (``d0=33..64``) in every run. The module is mapped
    (:func:`map_at_shapes`) at two sets of probe values of the symbols; with each probe written as
    its symbol's name both graphs must be the same graph.json (so no static number of the graph
    depends on a symbol, and every extent that does is a dim of a shape). Raises
    :class:`~stitchtune.errors.StitchtuneError` saying why not (a dim that is an expression of
    symbols, a symbol read in a number other than a shape, a region that does not map). ``perms``:
    the region's ``output_perms`` (see :func:`map_at_shapes`)."""
    import json

    import torch

    if any(d is None for ds in dims for d in ds):
        raise StitchtuneError(f"region {name}: a symbolic input dim is an expression of symbols")
    where: dict[str, tuple[str, int, int]] = {}   # symbol -> (its name d<k>, input, axis) at first appearance
    repeated: list[tuple[str, int, int]] = []     # (symbol, input, axis) of every later appearance
    for i, ds in enumerate(dims):
        for axis, d in enumerate(ds):
            if isinstance(d, str) and d not in where:
                where[d] = (f"d{len(where)}", i, axis)
            elif isinstance(d, str):
                repeated.append((d, i, axis))
    if not where:
        raise StitchtuneError(f"region {name}: no symbolic input dim")
    if len(where) > len(_PROBES[0]):
        raise StitchtuneError(f"region {name}: {len(where)} symbolic dims (at most {len(_PROBES[0])})")
    names = sorted(w[0] for w in where.values())
    mapped: list[tuple[str, tuple[int, ...]]] = []
    raw: list[tuple[tuple[tuple[int, ...], ...], dict[str, int]]] = []
    for probes in _PROBES:
        value = dict(zip(names, probes))
        metas = [torch.empty(tuple(value[where[d][0]] if isinstance(d, str) else int(d or 0) for d in ds), dtype=dt,
                             device="meta") for ds, dt in zip(dims, dtypes)]
        graph, index, shapes = map_at_shapes(module, metas, name, accept, perms)
        back = {v: k for k, v in value.items()}
        text = json.dumps(_named(_slices_from_end(graph, back), back), sort_keys=True)
        mapped.append((text, tuple(index)))
        raw.append((tuple(tuple(int(d) for d in sh) for sh in shapes), value))
    out_shapes = _offset_names(raw[0][0], raw[1][0], raw[0][1], raw[1][1])
    if mapped[0] != mapped[1] or out_shapes is None:
        raise StitchtuneError(f"region {name}: its graph depends on a symbolic dim other than through shapes")
    text, order = mapped[0]
    by_name = {w[0]: w for w in where.values()}
    ties = tuple((where[d][0], i, axis) for d, i, axis in repeated)
    return SymbolicRegion(text, tuple(names), tuple(by_name[n] for n in names), order, out_shapes, ties)
