"""Whole-model tuning (``stitchtune tune MODULE:CALLABLE --shapes ...``): search every region the
``torch.compile`` backend will stitch, with one trial budget split by each region's predicted share.

Contract
--------
* :func:`model_workloads(model, example_inputs, device)` captures ``model`` as the backend does
  (``torch.compile`` + AOTAutograd with the backend's decompositions, one call under ``no_grad``;
  with ``train``, one forward and backward step, so the backward graph's regions are tuned too),
  finds the regions of every graph (:func:`~stitchtune.importers.torch_regions.find_regions`, the
  planner as the judge), and de-duplicates equal workloads (same ``Graph.workload_key()``: e.g. the
  same layer norm in every layer). Each :class:`Workload` has its region count and the cost model's
  prediction of its heuristic schedule (``predicted_us``, per call) on ``device``; ``share`` is its
  fraction of the summed ``count x predicted_us`` (the stitched part of the model, as predicted).
  Workloads come largest share first.
* :func:`split_budget(workloads, trials)` gives each workload ``round(share x trials)`` trials by the
  largest-remainder rule, in that order; when ``trials`` is below the number of workloads the smallest
  get 0 (they keep the heuristic). The sum is exactly ``trials``.
* :func:`tune_model` runs :func:`stitchtune.tune.search.run_search` on each workload with its trials
  (largest first; graph files in a temporary folder), all into one database ``db``, which the backend
  then reads (``options={"db": ...}``). ``say`` receives one progress line per region and the summary
  lines; the model-level gain is ``sum(count x heuristic time) / sum(count x best time)`` over the
  stitched regions, labelled *estimated* when the times are the emulate backend's cost-model times.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Workload:
    graph: Any            # graph.parse.Graph
    regions: tuple[str, ...]
    ops: tuple[str, ...]
    count: int
    predicted_us: float
    share: float = 0.0


@dataclass(frozen=True)
class TunedWorkload:
    workload: Workload
    trials: int
    heuristic_us: float | None
    best_us: float | None
    estimated: bool
    source: str          # "search" | "no budget"


def predicted_us(graph: Any, device: Any) -> float:
    """The cost model's time of the heuristic schedule of ``graph`` on ``device`` (microseconds)."""
    from stitchtune.cost.model import predict
    from stitchtune.deploy.selection import heuristic_schedule
    from stitchtune.lower.entry import lower
    from stitchtune.plan.planner import make_plan
    from stitchtune.space import SearchSpace

    plan = make_plan(graph)
    space = SearchSpace.for_plan(plan, device)
    program = lower(graph, plan, heuristic_schedule(plan, device, space), device, space)
    return float(predict(program.profile, device).time_us)


def capture_regions(model: Any, example_inputs: Sequence[Any], train: bool = False) -> list[Any]:
    """Every :class:`~stitchtune.importers.torch_regions.TorchRegion` the backend would find in
    ``model`` at ``example_inputs``, in graph order: the inference graphs, or with ``train`` the
    forward and backward graphs of one step (the float outputs' sum is differentiated)."""
    import torch
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    from stitchtune.deploy.torch_backend import _decompositions
    from stitchtune.importers.torch_regions import find_regions

    found: list[Any] = []

    def collect(gm: Any, _inputs: Any) -> Any:
        found.extend(find_regions(gm).regions)
        return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    try:
        compiled = torch.compile(model, backend=aot_autograd(fw_compiler=collect, bw_compiler=collect,
                                                             inference_compiler=collect,
                                                             decompositions=_decompositions()))
        if train:
            out = compiled(*example_inputs)
            leaves = [t for t in _tensors(out) if t.requires_grad]
            if leaves:
                sum(t.float().sum() for t in leaves).backward()
        else:
            with torch.no_grad():
                compiled(*example_inputs)
    finally:
        torch._dynamo.reset()
    return found


def _tensors(out: Any) -> list[Any]:
    """The tensors in a model's output (tensor, tuple/list/dict, or an object with tensor fields)."""
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for v in out.values() for t in _tensors(v)]
    if isinstance(out, (tuple, list)):
        return [t for v in out for t in _tensors(v)]
    if hasattr(out, "to_tuple"):
        return _tensors(out.to_tuple())
    return []


def model_workloads(model: Any, example_inputs: Sequence[Any], device: Any, train: bool = False) -> list[Workload]:
    """The de-duplicated workloads of ``model``, largest predicted share first (see module docstring)."""
    groups: dict[str, list[Any]] = {}
    for r in capture_regions(model, example_inputs, train):
        groups.setdefault(r.graph.workload_key(), []).append(r)
    out = []
    for regions in groups.values():
        g = regions[0].graph
        try:
            t = predicted_us(g, device)
        except Exception as exc:  # noqa: BLE001 - the backend would decline it too
            log.warning("region %s cannot be lowered (%s); not tuned", g.name, exc)
            continue
        out.append(Workload(g, tuple(r.name for r in regions), regions[0].ops, len(regions), t))
    total = sum(w.count * w.predicted_us for w in out) or 1.0
    out = [replace(w, share=w.count * w.predicted_us / total) for w in out]
    return sorted(out, key=lambda w: -w.share)


def split_budget(workloads: Sequence[Workload], trials: int) -> list[int]:
    """Trials per workload (see module docstring); ``sum == trials``."""
    if not workloads or trials <= 0:
        return [0] * len(workloads)
    exact = [w.share * trials for w in workloads]
    got = [math.floor(x) for x in exact]
    left = trials - sum(got)
    order = sorted(range(len(workloads)), key=lambda i: (-(exact[i] - got[i]), i))
    for i in order[:left]:
        got[i] += 1
    return got


def _write_graph(folder: str, w: Workload) -> str:
    path = os.path.join(folder, f"{w.graph.name}-{w.graph.workload_key()[:12]}.json")
    with open(path, "w") as f:
        json.dump(w.graph.to_dict(), f)
    return path


def _time(row: Any) -> float | None:
    v = None if row is None else row.get("measured_us")
    try:
        return float(v) if v is not None and math.isfinite(float(v)) else None
    except (TypeError, ValueError):
        return None


def tune_model(model: Any, example_inputs: Sequence[Any], *, trials: int, db: str, backend: str,
               device: str | None = None, build: bool = True, jobs: int = 1, train: bool = False,
               say: Callable[[str], None] = lambda s: None) -> list[TunedWorkload]:
    """Search every workload of ``model`` into ``db`` with ``trials`` in total (see module docstring)."""
    from stitchtune.hardware.device import get_device
    from stitchtune.tune.config import SearchConfig
    from stitchtune.tune.search import run_search

    if device is None:
        from stitchtune.gpu.device_query import default_device

        dev = default_device()
    else:
        dev = get_device(device)
    workloads = model_workloads(model, example_inputs, dev, train)
    budget = split_budget(workloads, trials)
    n_regions = sum(w.count for w in workloads)
    say(f"{n_regions} stitchable region(s), {len(workloads)} distinct workload(s) on {dev.key}; "
        f"{trials} trials split by predicted share")
    done: list[TunedWorkload] = []
    with tempfile.TemporaryDirectory(prefix="stitchtune-tune-") as folder:
        for i, (w, n) in enumerate(zip(workloads, budget), 1):
            ops = [o.removeprefix("aten.") for o in w.ops]
            ops_text = ", ".join(ops[:6]) + (f", ... ({len(ops)} ops)" if len(ops) > 6 else "")
            head = (f"[{i}/{len(workloads)}] {w.graph.name} x{w.count} ({ops_text})"
                    f": predicted {w.predicted_us:.2f} us, share {100 * w.share:.1f}%")
            if n == 0:
                done.append(TunedWorkload(w, 0, w.predicted_us, w.predicted_us, True, "no budget"))
                say(f"{head}: 0 trials (heuristic kept)")
                continue
            cfg = SearchConfig(graph_path=_write_graph(folder, w), trials=n, backend=backend, device=device, db=db,
                               jobs=jobs, build=build, progress=False)
            res = run_search(cfg)
            h, b = _time(res.heuristic), _time(res.best)
            done.append(TunedWorkload(w, n, h, b, bool(res.estimated), "search"))
            kind = "estimated" if res.estimated else "measured"
            say(f"{head}: {res.trials_run} trial(s), heuristic {_fmt(h)} -> best {_fmt(b)} ({kind})")
    for line in summary_lines(done):
        say(line)
    return done


def _fmt(us: float | None) -> str:
    return "-" if us is None else f"{us:.2f} us"


def summary_lines(done: Sequence[TunedWorkload]) -> list[str]:
    """The model-level expected gain over the stitched regions (labelled)."""
    pairs = [(t.workload.count * t.heuristic_us, t.workload.count * t.best_us) for t in done
             if t.heuristic_us is not None and t.best_us is not None]
    if not pairs:
        return ["no region was tuned"]
    before, after = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
    est = any(t.estimated for t in done)
    label = "predicted (emulate backend: cost-model times)" if est else "measured"
    gain = before / after if after > 0 else float("nan")
    return [f"stitched regions per model call, {label}: heuristic {before:.2f} us -> tuned {after:.2f} us "
            f"({gain:.2f}x over the stitched part; the rest of the model is not counted)"]
