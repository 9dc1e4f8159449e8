"""Kernels of a stitched region with symbolic (dynamic) sizes, for the torch.compile backend.

Contract
--------
* :func:`region_dynamic_graph(region, max_extent)` names the region's symbolic input sizes
  (:func:`~stitchtune.importers.torch_symbolic.symbolic_region`: ``d0, d1, ...`` by first
  appearance) and returns its :class:`~stitchtune.graph.dynamic.DynamicGraph`, each size bounded
  ``1..max_extent`` (or from the smallest size at which the graph is valid: ``x[:, 1:]`` needs 2) with
  the default power-of-two buckets
  (:class:`~stitchtune.graph.dynamic.Buckets`). Raises :class:`~stitchtune.errors.StitchtuneError`
  saying why a region has none (a size that is an expression of symbols, a number of the graph
  that depends on a symbol).
* :func:`dynamic_region_kernel(region, opts, device, counter, compiled)` -> a
  :class:`~stitchtune.deploy.torch_region_dynamic.DynamicRegionKernel` whose cache is keyed by (structure,
  :class:`~stitchtune.graph.dynamic.BucketKey` of the sizes). A miss makes the bucket's *generic*
  kernel (:func:`stitchtune.deploy.dynamic.compile_dynamic`: one schedule selection and one
  program, built once by nvcc on a GPU, that runs every extent of the bucket; a
  :class:`~stitchtune.deploy.torch_ops.RegionKernel` with ``sym``), counted by ``counter``. A
  bucket the generic kernel refuses (a ``DynamicRefusal``, e.g. a ``gather_elements`` or a slice
  across rows; with ``deterministic``, a program with float atomics) is remembered, logged once, and
  gets kernels specialised per extent: the graph at those extents (``DynamicGraph.at``), one
  selection and one build each. A region without a dynamic graph, or extents outside
  its dims' bounds, keys by the exact shapes and maps the region again per shape
  (:func:`~stitchtune.importers.torch_symbolic.map_at_shapes`). A region makes at most
  :data:`MAX_SPECIALISED` such specialised kernels; later shapes without a kernel run its ATen ops.
  Build failures are the DynamicRegionKernel's: that shape runs the region's ATen ops.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from stitchtune.errors import ScheduleError, StitchtuneError
from stitchtune.graph.dynamic import DynamicRefusal

if TYPE_CHECKING:
    from stitchtune.deploy.backend_options import BackendOptions
    from stitchtune.deploy.compiled_graph import CompiledGraph
    from stitchtune.deploy.torch_region_dynamic import DynamicRegionKernel
    from stitchtune.deploy.torch_stats import RegionCounter

__all__ = ["dynamic_region_kernel", "region_dynamic_graph"]

log = logging.getLogger(__name__)

#: bucket keys remembered per region (by the symbols' values; forgotten all at once beyond)
MAX_KEYS = 4096
#: kernels specialised per extent (or per shape) one region makes; the shapes after them run the
#: region's ATen ops: a decode step's new past length would otherwise build a kernel per token
#: (nvcc on a GPU) where a bucket has no generic kernel (issue 41: at most 8 kernels per region)
MAX_SPECIALISED = 8


def region_dynamic_graph(region: Any, max_extent: int) -> tuple[Any, Any]:
    """(SymbolicRegion, DynamicGraph) of ``region`` (see module docstring)."""
    from stitchtune.graph.dynamic import parse_dynamic
    from stitchtune.importers.torch_symbolic import symbolic_dims, symbolic_region, unify_symbols

    dims = unify_symbols(region.inputs, symbolic_dims(region.inputs))
    sym = symbolic_region(region.module, dims, [n.meta["val"].dtype for n in region.inputs], region.name,
                          perms=region.output_perms)
    try:
        dg = parse_dynamic(sym.graph_json({n: (1, max_extent) for n in sym.names}))
    except StitchtuneError as exc:
        try:   # a slice of a dynamic axis (x[:, 1:]) is empty at its smallest extents: start the dims above them
            dg = parse_dynamic(sym.graph_json(_smallest_valid(sym, max_extent)))
        except StitchtuneError:
            raise StitchtuneError(f"region {region.name}: its graph with named sizes is refused: {exc}") from exc
    return sym, dg


#: the largest smallest extent :func:`_smallest_valid` tries (a slice dropping up to this many positions)
MAX_SMALLEST = 9


def _smallest_valid(sym: Any, max_extent: int) -> dict[str, tuple[int, int]]:
    """Each dim's bounds ``(lo, max_extent)``: ``lo`` the smallest extent up to :data:`MAX_SMALLEST` at which
    the graph is valid with the other dims at ``max_extent`` (a slice ``x[:, 1:]`` of dim ``s`` needs
    ``s >= 2``; a graph's validity only grows with an extent there), ``max_extent`` where none is; the
    extents below run per shape (:func:`dynamic_region_kernel`)."""
    from stitchtune.graph.dynamic import parse_dynamic

    out: dict[str, tuple[int, int]] = {}
    for n in sym.names:
        out[n] = (max_extent, max_extent)
        for lo in range(1, min(MAX_SMALLEST, max_extent) + 1):
            try:
                parse_dynamic(sym.graph_json({m: (lo, max_extent) if m == n else (max_extent, max_extent)
                                              for m in sym.names}))
            except StitchtuneError:
                continue
            out[n] = (lo, max_extent)
            break
    return out


def dynamic_region_kernel(region: Any, opts: BackendOptions, device: Any, counter: RegionCounter,
                          compiled: CompiledGraph | None) -> DynamicRegionKernel:
    """The :class:`~stitchtune.deploy.torch_region_dynamic.DynamicRegionKernel` of a region with symbolic sizes
    (see module docstring); ``compiled`` is its CompiledGraph at the example shapes (for explain)."""
    from stitchtune.deploy.torch_region_compile import compile_region_graph, kept_outputs
    from stitchtune.deploy.torch_ops import RegionKernel
    from stitchtune.deploy.torch_region_dynamic import Built, DynamicRegionKernel

    made = [0]   # kernels specialised per extent / shape so far

    def kernel(graph: Any, out_shapes: Sequence[Any]) -> Any:
        if made[0] >= MAX_SPECIALISED:
            raise StitchtuneError(f"region {region.name}: {MAX_SPECIALISED} kernels specialised per extent made "
                                  "already (no generic kernel serves these extents); this shape runs its ATen ops")
        made[0] += 1
        k = RegionKernel(region.name, region.ops, compile_region_graph(graph, opts, device, counter), cpu=opts.cpu,
                         out_shapes=tuple(out_shapes), check_gather=opts.check_gather)
        counter.add(builds=1)
        return k

    def per_shape(inputs: Sequence[Any]) -> Built:
        from stitchtune.importers.torch_symbolic import map_at_shapes

        graph, index, shapes = map_at_shapes(region.module, inputs, region.name, perms=region.output_perms)
        return Built(kernel(graph, _in_graph_order(index, shapes)), tuple(index))

    try:
        sym, dg = region_dynamic_graph(region, opts.max_extent)
    except StitchtuneError as exc:
        log.info("%s: kernels per input shape (%s)", region.name, exc)
        return DynamicRegionKernel(region.name, region.ops, region.module, per_shape, compiled=compiled,
                                   counter=counter, perms=region.output_perms, keep=kept_outputs(region))

    refused: dict[Any, str] = {}   # bucket key -> why no generic kernel serves it

    def generic(ext: dict[str, int]) -> Built | None:
        from stitchtune.deploy.dynamic import compile_dynamic

        key = dg.key_of(ext)
        if key in refused:
            return None
        try:
            res = compile_dynamic(dg, key, db=opts.db, device=device, build=False)
        except ScheduleError as exc:   # no schedule the generic kernel takes: kernels per extent, as for a refusal
            res = DynamicRefusal("schedule", str(exc))
        why = _why_not_generic(res, opts)
        if why is not None or isinstance(res, DynamicRefusal):
            refused[key] = why or str(res)
            log.info("%s: no generic kernel for bucket %s (%s); kernels per extent", region.name, key.label(),
                     refused[key])
            return None
        counter.add(selections=1, builds=1)
        k = RegionKernel(region.name, region.ops, res, cpu=opts.cpu, check_gather=opts.check_gather, sym=sym)
        return Built(k, sym.index, generic=True)

    keys: dict[tuple[int, ...], Any] = {}   # the symbols' values -> their BucketKey (a call's hot path)

    def bucket_of(inputs: Sequence[Any]) -> Any:
        if sym.ties and not sym.tied([t.shape for t in inputs]):
            raise StitchtuneError(f"region {region.name}: inputs whose extents the region's kernels take as one differ")
        values = tuple(int(inputs[i].shape[axis]) for _, i, axis in sym.where)
        key = keys.get(values)
        if key is None:
            key = dg.key_of(dict(zip(sym.names, values)))   # outside the bounds: raises, not kept
            if len(keys) >= MAX_KEYS:
                keys.clear()
            keys[values] = key
        return key

    def build(inputs: Sequence[Any]) -> Built:
        ext = sym.extents([t.shape for t in inputs])
        if not sym.tied([t.shape for t in inputs]) or not all(d.lo <= ext[d.name] <= d.hi for d in dg.dims):
            return per_shape(inputs)   # (below a dim's smallest extent: a slice of it would be empty there)
        return generic(ext) or Built(kernel(dg.at(ext), sym.graph_output_shapes(ext)), sym.index)

    return DynamicRegionKernel(region.name, region.ops, region.module, build, compiled=compiled,
                               bucket_of=bucket_of, counter=counter, perms=region.output_perms,
                               keep=kept_outputs(region))


def _why_not_generic(res: Any, opts: BackendOptions) -> str | None:
    """Why a bucket's :func:`~stitchtune.deploy.dynamic.compile_dynamic` answer serves no generic kernel: its
    refusal, or float atomics under ``deterministic=True``; None when the generic kernel serves the bucket."""
    from stitchtune.deploy.torch_region_compile import program_atomics

    if isinstance(res, DynamicRefusal):
        return str(res)
    if opts.deterministic and program_atomics(res.program):
        return "its program uses float atomics (deterministic=True)"
    return None


def _in_graph_order(index: Sequence[int], shapes: Sequence[Any]) -> list[Any]:
    """The module outputs' ``shapes`` in the graph's output order (``index[j]``: module output ``j``'s place)."""
    out: list[Any] = [None] * len(index)
    for j, i in enumerate(index):
        out[i] = shapes[j]
    return out
