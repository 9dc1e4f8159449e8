"""Whole-model tuning (``stitchtune tune MODULE:CALLABLE --shapes ...``): search every region the
``torch.compile`` backend will stitch, with one trial budget split by each region's predicted share.

Contract
--------
* A :class:`CallPattern` is one way a user calls the compiled model, and so one set of graphs
  AOTAutograd hands the backend (:data:`CALL_PATTERNS`): ``inference`` (``model.eval()`` under
  ``torch.no_grad()`` or ``torch.inference_mode()``: the inference graph), ``eval-grad``
  (``model.eval()`` with grad enabled, parameters requiring grad: AOTAutograd's *training forward*,
  whose regions also return what backward would need, e.g. a layer norm's mean and rstd) and
  ``train`` (``model.train()``, forward and backward of one step). The graphs differ, so their
  regions are different workloads: a record tuned for one is never used for another.
  :data:`DEFAULT_CALLS` (``inference``, ``eval-grad``) are tuned unless the caller says otherwise.
* :func:`capture_graphs(model, example_inputs, call)` captures ``model`` as the backend does in that
  call pattern (``torch.compile`` + AOTAutograd with the backend's decompositions; an ``nn.Module``
  is put in the pattern's train/eval mode and restored after; ``train`` differentiates the float
  outputs' sum) and returns its ATen graphs; :func:`capture_regions` the regions of every graph
  (:func:`~stitchtune.importers.torch_regions.find_regions`, the planner as the judge).
* :func:`model_workloads(model, example_inputs, device, calls)` de-duplicates the regions of all
  ``calls`` by workload (same ``Graph.workload_key()``: e.g. the same layer norm in every layer, or
  in the inference and the training graphs). Each :class:`Workload` has its region count (over all
  patterns; ``calls`` per pattern) and the cost model's prediction of its heuristic schedule
  (``predicted_us``, per call) on ``device``: the device time of the IR-feature model fitted to GPU
  data (:func:`stitchtune.cost.fitted.predict_program`, no launch term), and the least predicted over the
  heuristic, its variants and a few seeded samples of its space (``best_predicted_us``,
  :func:`stitchtune.tune.budget.predicted_gain`); ``share`` is its fraction of the summed
  :func:`stitchtune.tune.budget.gain_weight` (``count x (predicted gain + 0.1 x predicted_us)``: trials go where
  the model predicts a gain; a region predicted at its best sampled schedule keeps a tenth of its time's weight,
  for what the model cannot see). Workloads come largest share first.
* :func:`split_budget(workloads, trials)` gives each workload ``round(share x trials)`` trials by the
  largest-remainder rule (:func:`~stitchtune.tune.budget.split_by_share`), in that order, then, when ``trials`` covers every workload, moves one trial
  from the largest to each workload left with 0 (its heuristic schedule becomes a record, so every
  region compiles from a tuned record); when ``trials`` is below the number of workloads the
  smallest get 0 (they keep the heuristic). The sum is exactly ``trials``.
* :func:`tune_model` runs :func:`stitchtune.tune.search.run_search` on each workload with its trials
  (largest first; graph files in a temporary folder), all into one database ``db``, which the backend
  then reads (``options={"db": ...}``). Ctrl-C stops it: a region's search keeps its finished rows, and
  ``KeyboardInterrupt`` leaves :func:`tune_model` (no further region is searched). ``say`` receives one progress line per workload (:func:`region_heads`: which call patterns' graphs hold
  it, so the inference and the training forward's version of one layer norm read apart) and the summary
  lines, one per call pattern; the gain is ``sum(count x heuristic time) / sum(count x best time)``
  over that pattern's stitched regions, labelled *estimated* when the times are the emulate backend's
  cost-model times.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from stitchtune.errors import StitchtuneError

if TYPE_CHECKING:
    from torch.fx import GraphModule

    from stitchtune.graph.parse import Graph
    from stitchtune.hardware.device import Device
    from stitchtune.tune.budget import PredictedGain
    from stitchtune.tune.records import TrialRecord

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CallPattern:
    """One way of calling a compiled model (see module docstring)."""

    name: str
    training: bool   # nn.Module.train() (dropout, batch statistics) rather than eval()
    grad: bool       # autograd enabled: AOTAutograd compiles the training forward
    backward: bool   # a backward pass follows: its graph is captured too
    help: str


CALL_PATTERNS: dict[str, CallPattern] = {p.name: p for p in (
    CallPattern("inference", False, False, False,
                "model.eval() under torch.no_grad() or torch.inference_mode() (the inference graph)"),
    CallPattern("eval-grad", False, True, False,
                "model.eval() with grad enabled (the training forward graph, which also saves what backward needs)"),
    CallPattern("train", True, True, True, "model.train(), forward and backward of one step"),
)}
DEFAULT_CALLS: tuple[str, ...] = ("inference", "eval-grad")


def parse_calls(text: str) -> tuple[str, ...]:
    """``"inference,train"`` -> the pattern names, in :data:`CALL_PATTERNS` order; an unknown name is
    a :class:`~stitchtune.errors.StitchtuneError` naming the known ones."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in CALL_PATTERNS]
    if bad or not names:
        raise StitchtuneError(f"--calls {text!a}: a comma-separated list of {', '.join(CALL_PATTERNS)}")
    return tuple(n for n in CALL_PATTERNS if n in names)


@dataclass(frozen=True)
class Workload:
    graph: Graph
    regions: tuple[str, ...]
    ops: tuple[str, ...]
    count: int
    predicted_us: float
    share: float = 0.0
    calls: tuple[tuple[str, int], ...] = ()   # (call pattern, regions of this workload in its graphs)
    best_predicted_us: float | None = None    # the least predicted of the points tried (None: not tried)

    @property
    def gain(self) -> PredictedGain:
        """The predicted gain of searching this workload (``best_predicted_us`` None: no gain seen)."""
        from stitchtune.tune.budget import PredictedGain

        best = self.predicted_us if self.best_predicted_us is None else self.best_predicted_us
        return PredictedGain(self.predicted_us, best, 0)


@dataclass(frozen=True)
class TunedWorkload:
    workload: Workload
    trials: int
    heuristic_us: float | None
    best_us: float | None
    estimated: bool
    source: str          # "search" | "no budget"


def predicted_gain(graph: Graph, device: Device) -> PredictedGain:
    """:func:`stitchtune.tune.budget.predicted_gain` with the backend's heuristic (:mod:`stitchtune.deploy.selection`)."""
    from stitchtune.deploy.selection import heuristic_schedule
    from stitchtune.tune.budget import predicted_gain as gain

    return gain(graph, device, heuristic=heuristic_schedule)


@contextlib.contextmanager
def calling_as(model: Any, call: CallPattern) -> Iterator[None]:
    """``model`` in ``call``'s train/eval mode (an ``nn.Module``; restored after) and grad mode."""
    import torch

    was = getattr(model, "training", None)
    if isinstance(model, torch.nn.Module):
        model.train(call.training)
    try:
        with torch.enable_grad() if call.grad else torch.no_grad():
            yield
    finally:
        if isinstance(model, torch.nn.Module) and was is not None:
            model.train(was)


def run_call(compiled: Any, model: Any, example_inputs: Sequence[Any], call: CallPattern) -> Any:
    """Call ``compiled`` on ``example_inputs`` as ``call`` says (``model`` is the module whose mode is
    set); with ``call.backward``, differentiate the sum of the float outputs that require grad."""
    with calling_as(model, call):
        out = compiled(*example_inputs)
        if call.backward:
            differentiate(out)
    return out


def differentiate(out: Any) -> None:
    """Backward of the sum of the tensors in ``out`` that require grad (what a loss does to a
    compiled model: its backward graph is compiled and run); nothing when none does."""
    leaves = [t for t in _tensors(out) if t.requires_grad]
    if leaves:
        sum(t.float().sum() for t in leaves).backward()


@dataclass(frozen=True)
class CapturedGraph:
    """One ATen graph AOTAutograd handed the backend: ``kind`` is ``"inference"``, ``"forward"`` or
    ``"backward"``; ``example_inputs`` are the (fake) tensors it was compiled for."""

    kind: str
    module: GraphModule
    example_inputs: tuple[Any, ...]


def capture_graphs(model: Any, example_inputs: Sequence[Any], call: str = "inference") -> list[CapturedGraph]:
    """The ATen graphs AOTAutograd hands the backend when ``model`` is called on ``example_inputs`` as
    ``call`` (a :data:`CALL_PATTERNS` name), in compile order (the backend's decompositions applied;
    the graphs run eagerly here)."""
    import torch
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    from stitchtune.deploy.torch_rest import decompositions, partition
    from stitchtune.importers.torch_saved import mark_saved_outputs

    found: list[CapturedGraph] = []

    def collector(kind: str) -> Callable[[Any, Any], Any]:
        def collect(gm: Any, inputs: Any) -> Any:
            if kind == "forward":   # as the backend marks it: which outputs only the backward reads
                mark_saved_outputs(gm)
            found.append(CapturedGraph(kind, gm, tuple(inputs)))
            return make_boxed_func(gm.forward)

        return collect

    torch._dynamo.reset()
    try:
        compiled = torch.compile(model, backend=aot_autograd(fw_compiler=collector("forward"),
                                                             bw_compiler=collector("backward"),
                                                             inference_compiler=collector("inference"),
                                                             decompositions=decompositions(),
                                                             partition_fn=partition()))
        run_call(compiled, model, example_inputs, CALL_PATTERNS[call])
    finally:
        torch._dynamo.reset()
    return found


def capture_regions(model: Any, example_inputs: Sequence[Any], call: str = "inference",
                    prepare: Callable[[Any, str], tuple[Any, Any]] | None = None) -> list[Any]:
    """Every :class:`~stitchtune.importers.torch_regions.TorchRegion` the backend would find in
    ``model`` at ``example_inputs`` called as ``call`` (a :data:`CALL_PATTERNS` name), in graph order.
    ``prepare(gm, kind) -> (graph, RegionSplit)`` cuts each graph's regions; None: the backend's own
    (:func:`~stitchtune.deploy.torch_prepare.prepared_regions`: the same graph-wide rewrites, dropout's
    draws, splits as slices, bias adds, transposed matmul operands as views, ...). A script that matches
    regions with a GPU log of an older backend passes that backend's cut."""
    from stitchtune.deploy.torch_prepare import prepared_regions

    cut = prepare or prepared_regions
    out: list[Any] = []
    for g in capture_graphs(model, example_inputs, call):
        out += cut(g.module, g.kind)[1].regions
    return out


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


def model_workloads(model: Any, example_inputs: Sequence[Any], device: Any,
                    calls: Sequence[str] = DEFAULT_CALLS) -> list[Workload]:
    """The de-duplicated workloads of ``model`` over ``calls``, largest predicted share first (see
    module docstring)."""
    groups: dict[str, list[tuple[str, Any]]] = {}
    for call in calls:
        for r in capture_regions(model, example_inputs, call):
            groups.setdefault(r.graph.workload_key(), []).append((call, r))
    out = []
    for found in groups.values():
        g = found[0][1].graph
        try:
            gain = predicted_gain(g, device)
        except Exception as exc:  # noqa: BLE001 - the backend would decline it too
            log.warning("region %s cannot be lowered (%s); not tuned", g.name, exc)
            continue
        per_call = tuple((c, sum(1 for cc, _ in found if cc == c)) for c in calls if any(cc == c for cc, _ in found))
        out.append(Workload(g, tuple(r.name for _, r in found), found[0][1].ops, len(found), gain.heuristic_us,
                            calls=per_call, best_predicted_us=gain.best_us))
    from stitchtune.tune.budget import gain_weight

    weights = [gain_weight(w.gain, w.count) for w in out]
    total = sum(weights) or 1.0
    out = [replace(w, share=x / total) for w, x in zip(out, weights)]
    return sorted(out, key=lambda w: -w.share)


def split_budget(workloads: Sequence[Workload], trials: int) -> list[int]:
    """Trials per workload (see module docstring); ``sum == trials``."""
    from stitchtune.tune.budget import split_by_share

    return split_by_share([w.share for w in workloads], trials)


def _write_graph(folder: str, w: Workload) -> str:
    path = os.path.join(folder, f"{w.graph.name}-{w.graph.workload_key()[:12]}.json")
    with open(path, "w") as f:
        json.dump(w.graph.to_dict(), f)
    return path


def _time(row: TrialRecord | None) -> float | None:
    v = None if row is None else row.measured_us
    try:
        return float(v) if v is not None and math.isfinite(float(v)) else None
    except (TypeError, ValueError):
        return None


def tune_model(model: Any, example_inputs: Sequence[Any], *, trials: int, db: str, backend: str,
               device: str | None = None, build: bool = True, jobs: int = 1,
               calls: Sequence[str] = DEFAULT_CALLS,
               say: Callable[[str], None] = lambda s: None) -> list[TunedWorkload]:
    """Search every workload of ``model`` called as ``calls`` into ``db`` with ``trials`` in total
    (see module docstring)."""
    from stitchtune.hardware.device import get_device
    from stitchtune.tune.config import SearchConfig
    from stitchtune.tune.search import run_search

    if device is None:
        from stitchtune.gpu.device_query import default_device

        dev = default_device()
    else:
        dev = get_device(device)
    workloads = model_workloads(model, example_inputs, dev, calls)
    budget = split_budget(workloads, trials)
    n_regions = sum(w.count for w in workloads)
    say(f"{n_regions} stitchable region(s) in the graphs of {', '.join(calls)} calls, {len(workloads)} distinct "
        f"workload(s) on {dev.key}; {trials} trials split by predicted gain")
    done: list[TunedWorkload] = []
    with tempfile.TemporaryDirectory(prefix="stitchtune-tune-") as folder:
        for w, n, head in zip(workloads, budget, region_heads(workloads)):
            if n == 0:
                done.append(TunedWorkload(w, 0, w.predicted_us, w.predicted_us, True, "no budget"))
                say(f"{head}: 0 trials (heuristic kept)")
                continue
            cfg = SearchConfig(graph_path=_write_graph(folder, w), trials=n, backend=backend, device=device, db=db,
                               jobs=jobs, build=build, progress=False)
            res = run_search(cfg)
            if res.stopped == "interrupted":  # Ctrl-C: the rows written so far stay; no further region
                raise KeyboardInterrupt
            h, b = _time(res.heuristic), _time(res.best)
            done.append(TunedWorkload(w, n, h, b, bool(res.estimated), "search"))
            kind = "estimated" if res.estimated else "measured"
            say(f"{head}: {res.trials_run} trial(s), heuristic {_fmt(h)} -> best {_fmt(b)} ({kind})")
    for line in summary_lines(done):
        say(line)
    return done


def _best(w: Workload) -> str:
    return "" if w.best_predicted_us is None else f" (best tried {w.best_predicted_us:.2f})"


def region_heads(workloads: Sequence[Workload]) -> list[str]:
    """The start of each workload's progress line: ``[i/n] NAME xCOUNT (ops) in CALLS`` (the call
    patterns whose graphs hold it, e.g. ``in inference`` or ``in eval-grad, train``), its
    predicted time and share. Two lines that would still read alike (same name, ops and calls: e.g.
    one layer norm at two shapes) also name their workload key's first 8 characters."""
    texts = []
    for w in workloads:
        ops = [o.removeprefix("aten.") for o in w.ops]
        ops_text = ", ".join(ops[:6]) + (f", ... ({len(ops)} ops)" if len(ops) > 6 else "")
        calls = f" in {', '.join(c for c, _ in w.calls)}" if w.calls else ""
        texts.append(f"{w.graph.name} x{w.count} ({ops_text}){calls}")
    heads = []
    for i, (w, text) in enumerate(zip(workloads, texts), 1):
        if texts.count(text) > 1:
            text += f" [workload {w.graph.workload_key()[:8]}]"
        heads.append(f"[{i}/{len(workloads)}] {text}: predicted {w.predicted_us:.2f} us{_best(w)}, share {100 * w.share:.1f}%")
    return heads


def _fmt(us: float | None) -> str:
    return "-" if us is None else f"{us:.2f} us"


def summary_lines(done: Sequence[TunedWorkload]) -> list[str]:
    """The expected gain over the stitched regions of each call pattern's graphs (labelled)."""
    calls: list[str | None] = [c for c in CALL_PATTERNS if any(c == cc for t in done for cc, _ in t.workload.calls)]
    est = any(t.estimated for t in done)
    label = "predicted (emulate backend: cost-model times)" if est else "measured"
    lines = []
    for call in calls or [None]:   # None: workloads without per-call counts
        pairs = []
        for t in done:
            n = t.workload.count if call is None else dict(t.workload.calls).get(call, 0)
            if n and t.heuristic_us is not None and t.best_us is not None:
                pairs.append((n * t.heuristic_us, n * t.best_us))
        if not pairs:
            continue
        before, after = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
        gain = before / after if after > 0 else float("nan")
        what = "stitched regions per model call" if call is None else f"{call} call: stitched regions"
        lines.append(f"{what}, {label}: heuristic {before:.2f} us -> tuned {after:.2f} us "
                     f"({gain:.2f}x over the stitched part; the rest of the model is not counted)")
    return lines or ["no region was tuned"]
