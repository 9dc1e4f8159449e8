"""``torch.compile(model, backend="stitchtune")``: stitch a whole model's memory-intensive regions.

Contract
--------
* :func:`stitchtune_backend(gm, example_inputs, mode=None, options=None)` is a torch.compile backend.
  Through AOTAutograd (forward, and backward when training) it receives ATen graphs; Inductor's
  decompositions are applied except to the composite ops the importer maps whole (layer norm,
  softmax, GELU, ...), so backward ops arrive as primitives; forward and backward are partitioned as
  Inductor partitions them (:func:`~stitchtune.deploy.torch_rest.partition`). In each graph
  :func:`~stitchtune.importers.torch_regions.find_regions` finds the memory-intensive regions the
  planner accepts; each is compiled with :func:`stitchtune.deploy.compiled.compile` (schedule through
  :func:`~stitchtune.deploy.selection.choose_schedule`: tuned, nearest shape or heuristic,
  re-validated) and replaced by one call of the opaque custom op ``stitchtune::region``
  (:mod:`stitchtune.deploy.torch_ops`). The rest of the graph is re-decomposed and compiled by
  Inductor (``fallback="inductor"``, the default; dropout's random ops become Inductor's own, made
  inside the kernel that reads them, as Inductor's joint-graph pass does) or run as it is
  (``"eager"``); if Inductor fails on it, it runs eagerly (logged).
* ``options``: ``db`` (tuning database; default ``$STITCHTUNE_DB`` else ``./tuning-db``; None: none,
  the heuristic), ``device`` (a Device or preset name schedules are chosen for; default the local GPU,
  else the H200 preset), ``fallback``, ``deterministic`` (True: schedule selection passes over tuned
  records that combine with float atomics, ``cross_combine="atomic"``, and a region whose program still
  uses them is declined; heuristic schedules use none), ``cpu`` (``"emulate"`` | ``"reference"``:
  how CPU tensors run), ``min_nodes`` (smallest region worth a kernel, in graph nodes; default 1),
  ``check_gather`` (default True: a region with a gather has its index error flag in mapped host
  memory, read without a synchronisation at its next call and after each call of the compiled graph,
  which raise naming the region and the input; ``"sync"``, a debug option: also wait for each launch
  and read it at once; False: never, see :mod:`stitchtune.deploy.torch_flags`), ``max_extent``
  (default 2048: symbolic sizes are bucketed over ``1..max_extent``, see
  :mod:`stitchtune.deploy.torch_dynamic`; larger ones get kernels per shape), ``cudagraphs`` (default:
  True under ``mode="reduce-overhead"``: each compiled graph, its stitched regions included, is
  captured and replayed by Inductor's CUDA-graph trees, see :mod:`stitchtune.deploy.torch_graphs`).
  Every name and value is checked when the backend is built, before any graph is compiled
  (:mod:`stitchtune.deploy.backend_options`): an unknown option or a bad value (wrong type, out of
  range, an unknown device name) raises :class:`~stitchtune.errors.StitchtuneError` naming the option.
  ``strict`` (default False, or ``$STITCHTUNE_STRICT``; on in the test suite): an error that is not a
  :class:`~stitchtune.errors.StitchtuneError` where a region, a graph or the Inductor fallback would be
  declined is re-raised instead (a bug surfaces; refusals are still declined). Failures inside a
  registered kernel at run time are not covered (they are wrapped in a ``RegionError``).
* Never breaks a model (unless ``strict``): an op or region that cannot be stitched stays in the graph; any error while
  compiling a region declines it with the reason. The rewritten graph's region calls are run on fake
  tensors (as AOTAutograd and Inductor will): a region whose fake result fails, or differs from
  PyTorch's value in shape, dtype or strides, is declined. Each registered kernel is guarded
  (:class:`~stitchtune.deploy.torch_guard.GuardedRegion`): a region that fails at run time, forward or
  backward, or returns other shapes than its fake result, is declined then (logged once as a warning,
  in the report and so in :func:`explain`) and runs its ATen ops from then on; a gather's
  out-of-range index is raised, not hidden. A failure of the whole stitching step leaves the graph
  as it is (declined ``graph``). Each graph's declines are logged once (info level, one line each);
  its regions without a tuned schedule are one warning for the graph (regions warned about before in
  the process left out; :func:`stitchtune.deploy.selection.collecting_fallbacks`), not one per region. With static shapes torch recompiles per new shape (dynamo's cache); a region with
  symbolic shapes is checked at the example shapes and gets a
  :class:`~stitchtune.deploy.torch_region_dynamic.DynamicRegionKernel` whose kernels are cached by
  (structure, bucket of its symbols' values) (:mod:`stitchtune.deploy.torch_dynamic`), the
  region's ATen ops where none can be made.
* In an inference graph, a static cache's write ``index_put(cache, [.., iota(S) + start], new)`` whose
  cache is a graph input AOTAutograd marks as mutated (or a fresh tensor of the graph), read by nothing
  else, is first made one in-place ``stitchtune::put`` call (:mod:`stitchtune.deploy.torch_put`: only the
  ``S`` new rows written, the graph returning the cache itself, so AOTAutograd's copy back is a copy onto
  itself), reported stitched with the source ``"cache write in place"``; the graph handed on calls
  ``stitchtune::put_`` (no result), which Inductor lowers.
* Every region's schedule selections, kernels built, cache hits and eager calls are counted
  (:mod:`stitchtune.deploy.torch_stats`; ``stitchtune.torch.stats()``).
* :func:`explain(model, *example_inputs, backward=False, **options)` compiles and runs ``model`` once
  on the examples with this backend, as a compiled call in the caller's grad mode would run (with
  ``backward``, a backward pass too), and returns an :class:`Explanation` (``.stitched``, ``.declined``;
  ``str()`` is a table ending with the counts of this call, ``.stats``). :data:`LAST_REPORTS` holds the reports of the graphs compiled since the
  last :func:`explain` started.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stitchtune.deploy.backend_options import BackendOptions
from stitchtune.deploy.torch_prepare import prepared_regions
from stitchtune.deploy.torch_region_compile import attach_cubins, compile_region_graph, device_for, kept_outputs
from stitchtune.deploy.torch_rest import compile_rest, decompositions, partition
from stitchtune.deploy.torch_rewrite import fake_check, replace_regions

if TYPE_CHECKING:
    from stitchtune.deploy.torch_region_protocols import GuardedKernel
    from stitchtune.deploy.torch_stats import TorchStats

log = logging.getLogger(__name__)

_keys = itertools.count()


@dataclass(frozen=True)
class StitchedInfo:
    """One stitched region: its ATen ops, input shapes (as its kernels read them: an input PyTorch holds
    permuted in its memory order), output dtype and where its schedule came from."""

    graph: str         # "forward" | "backward" | "inference"
    region: str
    ops: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtype: str
    source: str
    kernels: int


@dataclass(frozen=True)
class DeclinedInfo:
    graph: str
    what: str
    reason: str
    count: int = 1


@dataclass
class GraphReport:
    graph: str
    stitched: list[StitchedInfo] = field(default_factory=list)
    declined: list[DeclinedInfo] = field(default_factory=list)
    #: the registered kernels (GuardedRegion) whose regions have gathers: their flags are checked after each call
    gathers: list[Any] = field(default_factory=list, repr=False, compare=False)

    def log_once(self) -> None:
        log.info("stitchtune: %s graph: %d region(s) stitched, %d op kind(s)/region(s) declined",
                 self.graph, len(self.stitched), len(self.declined))
        for d in self.declined:
            log.info("stitchtune: declined %s%s: %s", d.what, f" x{d.count}" if d.count > 1 else "", d.reason)


#: reports of the graphs compiled since the last :func:`explain` started (also outside explain)
LAST_REPORTS: list[GraphReport] = []


# ---------------------------------------------------------------------------- compiling regions
def _compile_region(region: Any, opts: BackendOptions, device: Any, kind: str = "inference",
                    counter: Any = None) -> GuardedKernel:
    """The :class:`~stitchtune.deploy.torch_ops.RegionKernel` of one region (errors propagate); for
    symbolic shapes a :class:`~stitchtune.deploy.torch_region_dynamic.DynamicRegionKernel` that makes kernels
    per (structure, bucket) of the shapes it meets (the region was checked at the example shapes
    here). ``counter`` (:mod:`~stitchtune.deploy.torch_stats`; None: a new one) counts the
    selections and builds."""
    from stitchtune.deploy import torch_stats
    from stitchtune.deploy.torch_ops import RegionKernel

    if counter is None:
        counter = torch_stats.region_counter(kind, region.name, region.ops, region.dynamic)
    cg = compile_region_graph(region.graph, opts, device, counter)
    if not region.dynamic:
        counter.add(builds=1)
        return RegionKernel(region.name, region.ops, cg, cpu=opts.cpu, out_shapes=region.output_shapes,
                            check_gather=opts.check_gather, in_perms=region.input_perms,
                            in_windows=region.input_windows)

    from stitchtune.deploy.torch_dynamic import dynamic_region_kernel

    return dynamic_region_kernel(region, opts, device, counter, cg)


def _info(kind: str, region: Any, kernel: Any) -> StitchedInfo:
    g = region.graph
    dtypes = sorted({g.spec(o).dtype for o in g.outputs})
    return StitchedInfo(kind, region.name, region.ops, tuple(tuple(s.shape) for _, s in g.inputs),
                        "/".join(dtypes), kernel.compiled.source + (", per bucket" if region.dynamic else ""),
                        len(kernel.compiled.program.launches))


def _make_region(r: Any, opts: BackendOptions, device: Any, kind: str, report: GraphReport,
                 made: list[tuple[Any, GuardedKernel]],
                 counters: dict[str, Any]) -> None:
    """Compile region ``r`` into ``made`` (with its counter in ``counters``), or decline it in ``report``."""
    from stitchtune.deploy import torch_stats

    if len(r.graph.nodes) < opts.min_nodes:
        report.declined.append(DeclinedInfo(kind, f"region {r.name}", f"{len(r.graph.nodes)} node(s) < min_nodes"))
        return
    counters[r.name] = torch_stats.region_counter(kind, r.name, r.ops, r.dynamic)
    try:
        made.append((r, _compile_region(r, opts, device, kind, counters[r.name])))
    except Exception as exc:  # noqa: BLE001 - any stitchtune error declines the region (strict: only those)
        opts.reraise(exc)
        report.declined.append(DeclinedInfo(kind, f"region {r.name} ({', '.join(r.ops)})",
                                            f"{type(exc).__name__}: {exc}"))
        counters[r.name].decline(report.declined[-1].reason)


def stitch_graph(gm: Any, example_inputs: Sequence[Any], opts: BackendOptions, kind: str) -> tuple[Any, GraphReport]:
    """``gm`` with every region it can stitch replaced by ``stitchtune::region`` calls, and the report."""
    from stitchtune.deploy import torch_ops
    from stitchtune.deploy.torch_guard import GuardedRegion
    from stitchtune.deploy.selection import collecting_fallbacks, fallback_summary
    from stitchtune.importers.torch_random import unseed_rands
    from stitchtune.importers.torch_symvalues import bound_inputs

    report = GraphReport(kind)
    gm = _cache_writes(gm, opts, report, kind)   # a static cache's writes in place (inference graphs)
    try:   # the graph-wide rewrites and the regions (torch_prepare), as the model capture finds them
        work, split = prepared_regions(gm, kind)
    except Exception as exc:  # noqa: BLE001 - never break a model
        opts.reraise(exc)
        report.declined.append(DeclinedInfo(kind, "graph", f"region finder failed: {type(exc).__name__}: {exc}"))
        return gm, report
    report.declined += [DeclinedInfo(kind, d.what, d.reason, d.count) for d in split.declined]
    cuda_devices = [t.device for t in example_inputs if getattr(getattr(t, "device", None), "type", "") == "cuda"]
    on_cuda = bool(cuda_devices)
    graph_device = cuda_devices[0] if on_cuda else None   # where a region that reads no tensor runs
    device = device_for(opts)
    made: list[tuple[Any, GuardedKernel]] = []
    counters: dict[str, Any] = {}
    with collecting_fallbacks() as fallbacks:   # one warning for the graph, not one per region
        for r in split.regions:
            _make_region(r, opts, device, kind, report, made, counters)
    if fallbacks:
        log.warning("stitchtune: %s graph: %s; `stitchtune tune` searches a model's regions",
                    kind, fallback_summary(fallbacks))
    failed = attach_cubins([k for _, k in made], device.arch, opts) if on_cuda else {}
    folded = dict(split.folded)
    held: dict[str, frozenset[int]] = {}
    chosen = []
    for i, (r, kernel) in enumerate(made):
        if i in failed:
            report.declined.append(DeclinedInfo(kind, f"region {r.name} ({', '.join(r.ops)})", failed[i]))
            counters[r.name].decline(failed[i])
            continue
        key = f"{r.name}#{next(_keys)}"
        consts = _held_constants(r, folded)
        held[key] = frozenset(i for i, _ in consts)
        torch_ops.register(key, GuardedRegion(kernel, r.module, r.output_perms or (None,) * len(r.outputs),
                                                        _runtime_decline(report, kind, r, counters[r.name]),
                                                        kept_outputs(r), held=consts, device=graph_device,
                                                        bound=bound_inputs(r.inputs)))
        chosen.append((r, key, kernel))
    new_gm = gm
    while chosen:
        try:
            new_gm, origin = replace_regions(work, [(r, key) for r, key, _ in chosen], held)
            bad = fake_check(new_gm, origin, example_inputs)
        except Exception as exc:  # noqa: BLE001 - never break a model: no region in this graph
            opts.reraise(exc)
            bad = {key: f"the rewritten graph failed: {type(exc).__name__}: {exc}" for _, key, _ in chosen}
        if not bad:
            break
        for r, key, _ in chosen:
            if key in bad:
                report.declined.append(DeclinedInfo(kind, f"region {r.name} ({', '.join(r.ops)})",
                                                    f"fake (meta) check: {bad[key]}"))
                counters[r.name].decline(report.declined[-1].reason)
        chosen = [c for c in chosen if c[1] not in bad]
        new_gm = gm
    report.stitched += [_info(kind, r, kernel) for r, _, kernel in chosen]
    report.gathers += [torch_ops.lookup(key) for r, key, _ in chosen
                       if opts.check_gather and any(n.op in ("gather", "gather_elements") for n in r.graph.nodes)]
    if new_gm is not gm:
        new_gm = unseed_rands(new_gm)   # the draws no region took: Inductor's again
    return _final_puts(new_gm, kind), report


def _cache_writes(gm: Any, opts: BackendOptions, report: GraphReport, kind: str) -> Any:
    """``gm`` with its static cache writes as in-place ``stitchtune::put`` calls
    (:mod:`stitchtune.deploy.torch_put`), each reported stitched; ``gm`` itself when it has none, is
    not an inference graph, or finding them fails (logged; strict: raised)."""
    from stitchtune.deploy import torch_stats
    from stitchtune.deploy.torch_put import PutKernel, inplace_puts

    if kind != "inference":
        return gm
    def make(name: str, axis: int, positions: bool) -> PutKernel:
        counter = torch_stats.region_counter("inference", f"put_{name}", ("aten.index_put",), False)
        return PutKernel(name, axis, device_for(opts), cpu=opts.cpu, counter=counter, positions=positions)

    try:
        new_gm, sites = inplace_puts(gm, make)
    except Exception as exc:  # noqa: BLE001 - never break a model: the writes stay functional
        opts.reraise(exc)
        log.info("stitchtune: cache writes left functional: %s: %s", type(exc).__name__, exc)
        return gm
    report.stitched += [StitchedInfo("inference", f"put_{p.name}", ("aten.index_put",), p.shapes, p.dtype,
                                     "cache write in place", 1) for p in sites]
    return new_gm


def _final_puts(gm: Any, kind: str) -> Any:
    """``gm`` with its cache writes as ``stitchtune::put_`` calls (no result: Inductor lowers them),
    once nothing reorders its nodes any more (:func:`stitchtune.deploy.torch_put.final_puts`)."""
    if kind != "inference":
        return gm
    from stitchtune.deploy.torch_put import final_puts

    return final_puts(gm)


def _held_constants(region: Any, folded: dict[Any, Any]) -> tuple[tuple[int, Any], ...]:
    """(position, value) of ``region``'s inputs computed from constants only (``RegionSplit.folded``: a
    causal mask, position ids), which its registered kernel holds instead of reading them from the
    graph (no kernel computes them at run time); none when every input is one (the call keeps one
    tensor argument, whose device the constants follow)."""
    consts = tuple((i, folded[x]) for i, x in enumerate(region.inputs) if x in folded)
    return consts if len(consts) < len(region.inputs) else ()


def _runtime_decline(report: GraphReport, kind: str, region: Any, counter: Any = None) -> Any:
    """The callback a :class:`~stitchtune.deploy.torch_guard.GuardedRegion` calls (once) when its
    kernel fails at run time: the region is reported as declined (its ATen ops run from then on;
    ``counter`` says so too)."""
    def decline(reason: str) -> None:
        if counter is not None:
            counter.decline(f"failed at run time: {reason}")
        report.stitched[:] = [s for s in report.stitched if s.region != region.name]
        report.declined.append(DeclinedInfo(kind, f"region {region.name} ({', '.join(region.ops)})",
                                            f"failed at run time, runs its ATen ops: {reason}"))

    return decline


# ---------------------------------------------------------------------------- the backend
def _checking_gathers(run: Any, regions: tuple[Any, ...]) -> Any:
    """``run`` (a boxed compiled graph) followed by a check of the gather error flags of ``regions``
    (host reads of mapped memory, :mod:`~stitchtune.deploy.torch_flags`): an out-of-range index met by
    this or an earlier call (also one replayed in a CUDA graph, where no region call runs) raises."""
    def checked(args: Any) -> Any:
        out = run(args)
        for region in regions:
            for flags in region.flag_sets:
                flags.raise_if_set("after the compiled graph ran")
        return out

    checked._boxed_call = True  # type: ignore[attr-defined]
    return checked


def _graph_compiler(opts: BackendOptions, graphs: Any, kind: str) -> Any:
    def compiler(gm: Any, example_inputs: Sequence[Any]) -> Any:
        try:
            new_gm, report = stitch_graph(gm, example_inputs, opts, kind)
        except Exception as exc:  # noqa: BLE001 - never break a model: this graph without regions
            opts.reraise(exc)
            new_gm, report = gm, GraphReport(kind)
            report.declined.append(DeclinedInfo(kind, "graph", f"stitching failed: {type(exc).__name__}: {exc}"))
        LAST_REPORTS.append(report)
        report.log_once()
        rest = compile_rest(new_gm, example_inputs, opts, graphs, kind, len(report.stitched))
        return _checking_gathers(rest, tuple(report.gathers)) if report.gathers else rest

    return compiler


def stitchtune_backend(gm: Any, example_inputs: Sequence[Any], mode: str | None = None,
                       options: Mapping[str, Any] | None = None) -> Any:
    """The ``"stitchtune"`` torch.compile backend (see module docstring)."""
    from torch._dynamo.backends.common import aot_autograd

    from stitchtune.deploy.torch_graphs import GraphMode

    opts = BackendOptions.from_options(options)
    graphs = GraphMode(opts.cudagraphs if opts.cudagraphs is not None else mode == "reduce-overhead",
                       len(example_inputs))
    backend = aot_autograd(fw_compiler=_graph_compiler(opts, graphs, "forward"),
                           bw_compiler=_graph_compiler(opts, graphs, "backward"),
                           inference_compiler=_graph_compiler(opts, graphs, "inference"),
                           decompositions=decompositions(), partition_fn=partition())
    return backend(gm, example_inputs)


def register() -> None:
    """Register the backend as ``"stitchtune"`` unless torch already knows it (e.g. by entry point)."""
    from torch._dynamo.backends import registry

    if "stitchtune" not in registry._COMPILER_FNS:
        registry.register_backend(stitchtune_backend, name="stitchtune")


# ---------------------------------------------------------------------------- explain
@dataclass(frozen=True)
class Explanation:
    """What :func:`explain` found: ``stitched`` and ``declined`` over every compiled graph; ``outputs``
    is what the compiled model returned for the examples."""

    stitched: tuple[StitchedInfo, ...]
    declined: tuple[DeclinedInfo, ...]
    graphs: int
    #: what the compiled model returned (a tensor, or whatever structure the model returns)
    outputs: object = field(default=None, compare=False, repr=False)
    #: kernels built, selections and cache hits of this call (:func:`stitchtune.torch.stats`)
    stats: TorchStats | None = field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        rows = [f"stitchtune: {len(self.stitched)} region(s) stitched, {len(self.declined)} declined "
                f"in {self.graphs} graph(s)", "",
                f"{'graph':<9} {'region':<28} {'ops':<48} {'shapes':<28} {'dtype':<9} {'source':<13} kernels"]
        for s in self.stitched:
            ops = ", ".join(o.removeprefix("aten.") for o in s.ops)
            shapes = " ".join("x".join(map(str, sh)) for sh in s.shapes)
            rows.append(f"{s.graph:<9} {s.region[:28]:<28} {_cut(ops, 48):<48} {_cut(shapes, 28):<28} "
                        f"{s.dtype:<9} {s.source:<13} {s.kernels}")
        rows += ["", f"{'graph':<9} {'declined':<44} {'count':>5}  reason"]
        for d in self.declined:
            rows.append(f"{d.graph:<9} {_cut(d.what, 44):<44} {d.count:>5}  {_cut(d.reason, 120)}")
        if self.stats is not None:
            rows += ["", self.stats.summary()]
        return "\n".join(rows)


def _cut(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 3] + "..."


def explain(model: Any, *example_inputs: Any, backward: bool = False, **options: Any) -> Explanation:
    """Compile ``model`` with the stitchtune backend, call it once on ``example_inputs`` exactly as a
    compiled call here would run (the caller's grad mode and the module's train/eval mode: under
    ``torch.no_grad()`` or ``torch.inference_mode()`` the inference graph, with grad enabled and
    parameters requiring grad the training forward) and report what was stitched and declined, with
    each region's schedule source. ``backward=True`` then differentiates the sum of the float outputs
    that require grad, so the backward graph is compiled and reported too. Like
    ``torch._dynamo.explain`` it starts from ``torch._dynamo.reset()`` (so every graph is compiled
    and reported), which drops the process's other compiled graphs."""
    import torch

    from stitchtune.deploy import torch_stats
    from stitchtune.deploy.model_tuning import differentiate

    LAST_REPORTS.clear()
    torch_stats.reset()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=stitchtune_backend, options=options or None)
    outputs = compiled(*example_inputs)  # type: ignore[no-untyped-call]  # torch.compile's result is untyped
    if backward:
        differentiate(outputs)
    reports = list(LAST_REPORTS)
    return Explanation(tuple(s for r in reports for s in r.stitched),
                       tuple(d for r in reports for d in r.declined), len(reports), outputs, torch_stats.stats())
