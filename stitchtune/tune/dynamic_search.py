"""``stitchtune search graph.json --dynamic seq=1..2048``: tune the generic kernels of every bucket.

Contract
--------
:func:`run_dynamic_search(config, dims)` loads the graph as a
:class:`~stitchtune.graph.dynamic.DynamicGraph` (``dims``, from ``--dynamic``, replace the bounds and
buckets the file declares for those names; a name no shape uses is a GraphError), then, bucket key by
bucket key (the product of the dims' buckets), runs one ordinary search (:func:`~stitchtune.tune.search.run_search`)
on the bucket's representative graph (every dim at its bucket's largest extent) with:

* the trial budget ``config.trials`` split by each bucket's expected share of calls (extents uniform over
  each dim's range) over the buckets the generic kernel takes, exactly ``config.trials`` in all
  (:func:`~stitchtune.tune.budget.split_by_share`; at least one trial per bucket, the heuristic, trial 0,
  while the budget covers every bucket);
* lowering by :func:`~stitchtune.lower.dynamic.lower_dynamic` (a schedule the generic kernel refuses is a
  ``pruned`` row naming the refusal);
* a runner that checks every schedule at the bucket's other probe extents (its smallest and an odd
  one, :meth:`~stitchtune.graph.dynamic.Bucket.probes`) in the emulator against the float64 reference,
  besides the configured runner's run at the largest extent (timed on the GPU with ``cuda``, predicted
  with ``emulate``);
* ``config.bucket`` set to the key's label: every row has the ``bucket`` column, and the study is the
  bucket's own.

A bucket that is not searched is an outcome too, ``skipped`` saying why: the generic kernel refuses its
graph (:class:`~stitchtune.graph.dynamic.DynamicRefusal`, e.g. a column reduction over dynamic rows; also
in ``refusal``), the budget left it no trial, or Ctrl-C stopped an earlier bucket's search (the search
of that bucket keeps its finished rows; no later bucket is searched). Trial 0 is
:func:`~stitchtune.cost.heuristic.generic_heuristic` (the heuristic, made generic where it is not). ``progress(line)`` is told one line per bucket.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from stitchtune.errors import GraphError, ScheduleError
from stitchtune.graph.dynamic import (BucketKey, DynamicDim, DynamicGraph, DynamicRefusal, key_share, load_dynamic)
from stitchtune.tune.budget import split_by_share
from stitchtune.tune.config import Components, SearchConfig, default_components
from stitchtune.tune.result import SearchResult

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BucketOutcome:
    """One bucket of a dynamic search: its trials and result, or why it was not searched (``skipped``:
    the generic kernel's ``refusal``, no trial left in the budget, or an interruption before it began)."""

    key: BucketKey
    trials: int
    result: SearchResult | None
    refusal: DynamicRefusal | None = None
    skipped: str | None = None

    def __post_init__(self) -> None:
        if (self.result is None) == (self.skipped is None):
            raise ValueError("a bucket outcome has a result or says why it was skipped, not both")


def with_dims(dg: DynamicGraph, dims: Sequence[DynamicDim]) -> DynamicGraph:
    """``dg`` with the bounds and buckets of ``dims`` (each must name a dim of the graph and lie within the
    bounds the graph declares for it: a range beyond them is a GraphError naming the dim and its bounds)."""
    by = {d.name: d for d in dg.dims}
    for d in dims:
        if d.name not in by:
            raise GraphError(f"--dynamic {d.name}: the graph has no dynamic dim {d.name!r} "
                             f"(its shapes name: {', '.join(sorted(by)) or 'none'})")
        own = by[d.name]
        if not own.lo <= d.lo <= d.hi <= own.hi:
            raise GraphError(f"--dynamic {d.name}={d.lo}..{d.hi}: outside the bounds the graph declares for "
                             f"{d.name}, {own.lo}..{own.hi} (give a range within them, e.g. "
                             f"--dynamic {d.name}={own.lo}..{own.hi})")
        by[d.name] = d
    return dataclasses.replace(dg, dims=tuple(sorted(by.values(), key=lambda d: d.name)))


def split_trials(dg: DynamicGraph, total: int, keys: Sequence[BucketKey] | None = None) -> list[tuple[BucketKey, int]]:
    """Each bucket key (of ``keys``, default every key of ``dg``) and its trials: ``total`` split by
    expected share (:func:`~stitchtune.tune.budget.split_by_share`: exactly ``total`` in all, at least 1
    each while ``total`` covers every key)."""
    keys = list(dg.keys()) if keys is None else list(keys)
    return list(zip(keys, split_by_share([key_share(dg.dims, k) for k in keys], total)))


class ProbeRunner:
    """A runner that checks each generic program at the bucket's other probe extents in the emulator,
    then runs it with ``inner`` (at the planned, largest extents). A fault or a wrong result at a probe
    is that measurement (``launch_error`` / ``wrong_result``, the extent named in the error)."""

    def __init__(self, inner: Any, dg: DynamicGraph, key: BucketKey, device: Any) -> None:
        from stitchtune.graph.reference import random_inputs
        from stitchtune.gpu.runners import output_dtypes, reference_outputs

        self.inner, self.device = inner, device
        largest = key.largest()
        self.probes: list[tuple[dict[str, int], dict[str, Any], dict[str, Any], dict[str, str]]] = []
        for b in key.buckets:
            for e in b.probes():
                if e == b.hi:
                    continue
                ext = {**largest, b.dim: e}
                g = dg.at(ext)
                ins = random_inputs(g, e)
                self.probes.append((ext, ins, reference_outputs(g, ins), output_dtypes(g)))

    def close(self) -> None:
        self.inner.close()

    def run(self, items: list[tuple[Any, Any]]) -> list[Any]:
        from stitchtune.emulate.emulator import EmulatorFault, emulate_program
        from stitchtune.gpu.runners import Measurement, MeasureStatus, check_outputs, clip_error, emulator_limits

        out: list[Any] = [None] * len(items)
        passed = []
        for i, (program, build) in enumerate(items):
            for ext, ins, ref, dtypes in self.probes:
                limit, climit = emulator_limits(self.device, program, {})
                try:
                    got = emulate_program(program, ins, coresident_limit=limit, cluster_limit=climit, extents=ext)
                except EmulatorFault as exc:
                    out[i] = Measurement(MeasureStatus.LAUNCH_ERROR, estimated=True,
                                         error=clip_error(f"emulator fault at {ext}: {exc}"))
                    break
                chk = check_outputs(got, ref, dtypes)
                if not chk.ok:
                    out[i] = Measurement(MeasureStatus.WRONG_RESULT, max_rel_error=chk.max_rel_error, estimated=True,
                                         error=clip_error(f"at {ext}: {chk.error}"))
                    break
            else:
                passed.append(i)
        for i, m in zip(passed, self.inner.run([items[i] for i in passed])):
            out[i] = m
        return out


def _bucket_components(base: Components, dg: DynamicGraph, key: BucketKey, fit: Any) -> Components:
    from stitchtune.lower.dynamic import lower_dynamic

    def lower(graph: Any, plan: Any, schedule: Any, device: Any, space: Any = None) -> Any:
        prog = lower_dynamic(fit, schedule, device, space)
        if isinstance(prog, DynamicRefusal):
            raise ScheduleError(f"generic kernel: {prog}")
        return prog

    def stages() -> Any:
        return dataclasses.replace(base.stages(), lower=lower)

    def make_runner(backend: str, graph: Any, device: Any) -> Any:
        return ProbeRunner(base.make_runner(backend, graph, device), dg, key, device)

    def heuristic(plan: Any, device: Any) -> Any:  # trial 0: the heuristic, made generic where it is not
        from stitchtune.cost.heuristic import generic_heuristic

        return generic_heuristic(fit, device)

    return dataclasses.replace(base, load_graph=lambda _path: fit.graph, make_plan=lambda _g: fit.plan,
                               stages=stages, make_runner=make_runner, heuristic_schedule=heuristic)


def run_dynamic_search(config: SearchConfig, dims: Sequence[DynamicDim] = (), components: Components | None = None,
                       progress: Callable[[str], None] | None = None) -> list[BucketOutcome]:
    """Search every bucket of the graph at ``config.graph_path`` (module docstring)."""
    from stitchtune.lower.dynamic import fit_rows
    from stitchtune.tune.search import run_search

    dg = with_dims(load_dynamic(config.graph_path), dims)
    if not dg.dims:
        raise GraphError(f"{ascii(config.graph_path)}: no dynamic dim (name one in a shape and give --dynamic "
                         "NAME=LO..HI, or declare \"dynamic\" in the file)")
    base = components or default_components()
    say = progress or (lambda line: None)
    keys = list(dg.keys())
    fits = {k: fit_rows(dg, k) for k in keys}
    budget = dict(split_trials(dg, config.trials, [k for k in keys if not isinstance(fits[k], DynamicRefusal)]))
    say(f"{len(keys)} bucket(s), {sum(budget.values())} trials split by expected share over the "
        f"{len(budget)} the generic kernel takes")
    outcomes: list[BucketOutcome] = []
    interrupted = False
    for i, key in enumerate(keys, 1):
        fit, n = fits[key], budget.get(key, 0)
        if isinstance(fit, DynamicRefusal):
            outcomes.append(BucketOutcome(key, 0, None, fit, skipped=f"generic kernel refused: {fit}"))
        elif interrupted:
            outcomes.append(BucketOutcome(key, 0, None, skipped="not searched: interrupted"))
        elif n == 0:
            outcomes.append(BucketOutcome(key, 0, None, skipped=f"no trial left (--trials {config.trials} is below "
                                          f"the {len(budget)} buckets): the heuristic schedule"))
        else:
            say(f"[{i}/{len(keys)}] {key.label()}: {n} trial(s) at {dict(fit.extents)}")
            cfg = dataclasses.replace(config, trials=n, bucket=key.label(), graph_path=config.graph_path)
            res = run_search(cfg, _bucket_components(base, dg, key, fit))
            outcomes.append(BucketOutcome(key, n, res))
            interrupted = res.stopped == "interrupted"
            continue
        say(f"[{i}/{len(keys)}] {key.label()}: skipped ({outcomes[-1].skipped})")
    return outcomes
