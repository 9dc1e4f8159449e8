"""Kernels per step: ``torch.compile(backend="stitchtune")`` against Inductor alone, and the ideal.

    PYTHONPATH=$PWD python scripts/kernel_counts.py [--models bert,gpt2,llama,vit,convnext,resnet,phi3,swin]
                                                    [--modes inference,train] [--json OUT] [--markdown]

``--models gpt2-labels,llama-labels`` (not in the default list) counts the causal LMs with their head
called with ``labels=`` (the output is the loss, so ``train`` differentiates the loss itself).

Each model is built from a transformers config by ``scripts/model_coverage.py`` (2 layers, small
hidden sizes, random weights, batch 1, sequence 8 or 32x32 images; nothing is downloaded) and called
as :data:`stitchtune.deploy.model_tuning.CALL_PATTERNS` says: ``inference`` (eval, under no_grad: the
inference graph), ``train`` (train mode, forward and backward of the output's sum). Three counts
per model and mode, all on this machine's CPU:

* ``inductor`` -- the kernels Inductor makes for the whole step: the nodes its scheduler hands to
  code generation after fusion, less extern calls (matmuls, convolutions: a library's kernels, in
  neither column) and no-ops, plus the memory-intensive ATen ops it runs as fallbacks (one launch
  each: the ``randint`` of its random seeds; in the backend's rest, dropout's ``rand``, which the
  backend leaves to PyTorch with ``fallback_random``). Each is one loop nest, one kernel on a GPU; Inductor's CPU code
  generator then packs the loop nests between two extern calls into one ``cpp_fused_*`` C++ function
  (those are counted too, as ``cpp_functions``, but are not kernels in the GPU sense). Horizontal
  fusion is what Inductor's CPU scheduler allows (``cpp.max_horizontal_fusion_size``, default 16).
* ``backend`` -- with the stitchtune backend: the stitched regions' kernels (launches of their programs;
  one per region unless a combine needs a second kernel) plus the kernels Inductor generates for the
  rest of the graphs (counted as above). The backend's own graph compiler (the one
  ``torch.compile(backend="stitchtune")`` runs) is applied to each graph AOTAutograd hands it
  (captured by :func:`stitchtune.deploy.model_tuning.capture_graphs`); the step is compiled, not
  run, and no database is read (heuristic schedules: a tuned schedule may choose another combine of
  a cross reduction, one launch instead of two or the reverse). Where Inductor fails on the rest of a graph (the backend then runs it eagerly) every
  memory-intensive ATen op of it counts as one kernel and the row lists the graph and the
  reason in ``eager_rest``. Plus ``copies``: the region op makes a strided input that its graph
  does not read in place (a slice with steps; a permuted one is read in its memory order, a split
  part through its window) contiguous
  before its launch, one copy kernel each; counted from the strides of the graph's fake values
  (:func:`input_copies`).
* ``ideal`` -- one kernel per maximal memory-intensive region between compute ops in the ATen graphs
  the backend receives: nodes that are not compute ops (``COMPUTE_OPS`` of the torch importer, plus
  convolution backward) and not free views are joined along data edges (through views) while no
  compute op lies on a path between two nodes of the joined region (a node that reads only graph
  inputs, such as a running statistic's momentum product, so joins the consumer it feeds after a
  compute op: it can run as late as that); nodes of one *stage* (the number of compute ops on the
  longest path from the graph's inputs) that read the same value join too, under the same
  condition (as Inductor's horizontal fusion does). What cannot be fused in theory (a compute op) is the only
  cut. The graphs are those AOTAutograd hands the stitchtune backend (its default partitioner), so in
  training they can differ from Inductor's own (min-cut partitioner, recomputation).

Inductor's CPU code generator fuses differently from its Triton one, so ``inductor`` here is a CPU
figure; ``backend/inductor`` is the ratio the issue's goal is stated in. A model or mode that fails
is a row with its reason; exit 0 when the script ran, 2 (one line on stderr) for bad options.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import logging
import operator
import re
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

MODELS = ("bert", "gpt2", "llama", "vit", "convnext", "resnet", "phi3", "swin")
#: the causal LMs with their head, called with ``labels=`` (the loss is the output; not in the default list)
LABELS_MODELS = ("gpt2-labels", "llama-labels")
MODES = ("inference", "train")
_KERNEL_DEF = re.compile(r"async_compile\.(?:cpp_pybinding|cpp|triton)\(")
#: compute ops of backward graphs, besides the torch importer's COMPUTE_OPS
_BACKWARD_COMPUTE = frozenset({"aten.convolution_backward", "aten._scaled_dot_product_flash_attention_backward",
                               "aten._scaled_dot_product_efficient_attention_backward",
                               "aten._scaled_dot_product_flash_attention_for_cpu_backward"})
#: ops that return several views of their input
_MULTI_VIEWS = frozenset({"aten.split", "aten.split_with_sizes", "aten.unbind", "aten.chunk", "aten.as_strided"})


def _coverage() -> Any:
    """``scripts/model_coverage.py`` (its ``build_model``: the same small models; its list parser)."""
    spec = importlib.util.spec_from_file_location("model_coverage", Path(__file__).with_name("model_coverage.py"))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------------------- counting
def generated_functions(codes: Sequence[str]) -> int:
    """Kernel definitions in Inductor's output code (one per generated C++ function or Triton kernel)."""
    return sum(len(_KERNEL_DEF.findall(c)) for c in codes)


def _fallback_kernel(node: Any) -> bool:
    """True for an extern node of Inductor's scheduler that runs a memory-intensive ATen op eagerly
    (a *fallback*: dropout's ``rand`` under ``fallback_random``, the ``randint`` of Inductor's seeds,
    a pooling window): one kernel launch. Library calls (matmuls, convolutions), the stitched
    regions' custom op (counted as stitched) and the fields of multi-output nodes are not."""
    from stitchtune.importers.torch_candidates import COMPUTE_OPS

    name = str(getattr(node.node, "python_kernel_name", "") or "").removeprefix("torch.ops.")
    if not name.startswith("aten."):
        return False
    key = ".".join(name.split(".")[:2])
    return key not in COMPUTE_OPS and key not in _BACKWARD_COMPUTE


@contextlib.contextmanager
def scheduled_kernels() -> Iterator[list[int]]:
    """Counts, per graph Inductor generates code for, the scheduler's nodes after fusion that become
    kernels: generated ones (not extern calls, not no-ops) and ATen fallbacks of memory-intensive
    ops (:func:`_fallback_kernel`)."""
    from torch._inductor import scheduler as sched

    counts: list[int] = []
    original = sched.Scheduler._codegen

    def counting(self: Any, nodes: list[Any]) -> Any:
        counts.append(sum(1 for n in nodes if not isinstance(n, (sched.ExternKernelSchedulerNode,
                                                                  sched.NopKernelSchedulerNode))
                          or isinstance(n, sched.ExternKernelSchedulerNode) and _fallback_kernel(n)))
        return original(self, nodes)

    sched.Scheduler._codegen = counting
    try:
        yield counts
    finally:
        sched.Scheduler._codegen = original


def ideal_regions(gm: Any) -> int:
    """Maximal memory-intensive regions of an ATen graph with no compute op between their nodes
    (see module docstring)."""
    nodes = list(gm.graph.nodes)
    root: dict[Any, Any] = {}        # a view -> the node whose value it views
    kind: dict[Any, str] = {}
    ins: dict[Any, list[Any]] = {}
    above: dict[Any, int] = {}       # bit set of the compute ops a node depends on
    for n in nodes:
        ins[n] = list(n.all_input_nodes)
        kind[n] = _classify(n) if n.op == "call_function" else "input"
    bit = {n: 1 << i for i, n in enumerate(n for n in nodes if kind[n] == "compute")}
    for n in nodes:
        above[n] = 0
        for a in ins[n]:
            above[n] |= above[a] | bit.get(a, 0)
    below: dict[Any, int] = {n: 0 for n in nodes}   # bit set of the compute ops depending on a node
    for n in reversed(nodes):
        for a in ins[n]:
            below[a] |= below[n] | bit.get(n, 0)
    parent: dict[Any, Any] = {}
    readers: dict[tuple[Any, int], list[Any]] = {}   # (a value, a stage) -> memory nodes reading it
    stage: dict[Any, int] = {}   # compute ops on the longest path from the graph's inputs

    def find(n: Any) -> Any:
        while parent[n] is not n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    def join(x: Any, y: Any) -> bool:
        """Join the regions of x and y unless a compute op lies on a path between two of their nodes
        (each root holds its region's ``above`` / ``below`` sets)."""
        x, y = find(x), find(y)
        if x is y:
            return True
        if below[x] & above[y] or below[y] & above[x]:
            return False
        parent[x] = y
        above[y] |= above[x]
        below[y] |= below[x]
        return True

    for n in nodes:
        stage[n] = max((stage[a] + (kind[a] == "compute") for a in ins[n]), default=0)
        if kind[n] == "view" and ins[n]:
            root[n] = root.get(ins[n][0], ins[n][0])
        if kind[n] != "memory":
            continue
        parent[n] = n
        for a in {root.get(a, a) for a in ins[n]}:
            if kind.get(a) == "memory":          # producer -> consumer
                join(a, n)
            siblings = readers.setdefault((a, stage[n]), [])   # of one stage, reading one value
            if not any(join(other, n) for other in siblings):
                siblings.append(n)
    return len({find(n) for n in parent})


def _classify(n: Any) -> str:
    """``"compute"``, ``"view"`` (no kernel: a view, a field of a multi-output node, a size) or
    ``"memory"`` for an fx ``call_function`` node."""
    import torch

    from stitchtune.importers.torch_candidates import COMPUTE_OPS
    from stitchtune.importers.torch_fx_util import _key
    from stitchtune.importers.torch_subgraph import _is_view

    if n.target is operator.getitem:
        return "view"
    key = _key(n.target)
    if key in COMPUTE_OPS or key in _BACKWARD_COMPUTE or key == "stitchtune.region":
        return "compute"
    val = n.meta.get("val")
    vals = val if isinstance(val, (tuple, list)) else [val]
    if _is_view(n) or key in _MULTI_VIEWS or not any(isinstance(v, torch.Tensor) for v in vals):
        return "view"
    return "memory"


def input_copies(gm: Any) -> int:
    """Copy kernels the region op launches before its kernels: one per region input that its kernel
    cannot read where it lies (a strided input the region's graph does not declare in its memory
    order: :meth:`GuardedRegion.copies <stitchtune.deploy.torch_guard.GuardedRegion.copies>`), by the
    strides of the fx graph's fake values."""
    import torch

    from stitchtune.deploy import torch_ops

    n = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.stitchtune.region.default:
            vals = [getattr(a, "meta", {}).get("val") for a in node.args[1]]
            if all(isinstance(v, torch.Tensor) for v in vals):
                n += torch_ops.lookup(node.args[0]).copies(vals)
            else:   # (not a tensor we can read the strides of: every strided one counts)
                n += sum(isinstance(v, torch.Tensor) and not v.is_contiguous() for v in vals)
    return n


def eager_kernels(gm: Any) -> int:
    """Kernels of ``gm`` run eagerly: one per memory-intensive ATen op (views and compute ops aside)."""
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and _classify(n) == "memory")


# ---------------------------------------------------------------------------- one model, one mode
@contextlib.contextmanager
def _warnings_of(logger: str) -> Iterator[list[str]]:
    """The warning messages ``logger`` emits inside the block (kept from the console)."""
    heard: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: heard.append(record.getMessage()[:300])  # type: ignore[method-assign]
    lg = logging.getLogger(logger)
    level, propagate = lg.level, lg.propagate
    lg.setLevel(logging.WARNING)
    lg.propagate = False
    lg.addHandler(handler)
    try:
        yield heard
    finally:
        lg.removeHandler(handler)
        lg.setLevel(level)
        lg.propagate = propagate


def _fresh_inductor() -> None:
    import torch
    import torch._inductor.config as icfg

    torch._dynamo.reset()
    icfg.fx_graph_cache = False       # every graph is generated again, never loaded from the cache
    if hasattr(icfg, "autotune_local_cache"):
        icfg.autotune_local_cache = False


def count_step(model: Any, args: Sequence[Any], mode: str) -> dict[str, Any]:
    """{"inductor", "backend", "stitched", "rest", "ideal", "graphs"} for one step of ``model``."""
    import torch
    from torch._inductor.utils import run_and_get_code

    from stitchtune.deploy import torch_backend, torch_rest
    from stitchtune.deploy.model_tuning import CALL_PATTERNS, capture_graphs, run_call

    call = CALL_PATTERNS[mode]

    def step(backend: Any) -> tuple[int, int]:
        _fresh_inductor()
        compiled = torch.compile(model, backend=backend)
        with scheduled_kernels() as counts:
            _, codes = run_and_get_code(lambda: run_call(compiled, model, args, call))
        model.zero_grad(set_to_none=True)
        return sum(counts), generated_functions(codes)

    inductor, inductor_functions = step("inductor")
    graphs = capture_graphs(model, args, mode)
    model.zero_grad(set_to_none=True)
    stitched = regions = rest = rest_functions = copies = 0
    opts = torch_backend.BackendOptions.from_options({"db": None, "cpu": "reference"})
    _fresh_inductor()
    eager: list[str] = []
    with _warnings_of(torch_rest.__name__) as heard:   # where Inductor's failure on the rest is logged
        for g in graphs:   # what the backend's graph compiler does with each graph AOTAutograd hands it
            inputs = list(g.example_inputs)
            stitched_gm, report = torch_backend.stitch_graph(g.module, inputs, opts, g.kind)
            with scheduled_kernels() as counts:
                _, codes = run_and_get_code(lambda: torch_rest.compile_rest(stitched_gm, inputs, opts, None, g.kind,
                                                                                   len(report.stitched)))
            if counts:
                rest += sum(counts)
                rest_functions += generated_functions(codes)
            else:   # Inductor failed on the rest (the backend runs it eagerly): one kernel per ATen op
                eager.append(f"{g.kind}: {heard[-1] if heard else 'Inductor generated no code'}")
                rest += eager_kernels(stitched_gm)
            stitched += sum(s.kernels for s in report.stitched)
            regions += len(report.stitched)
            copies += input_copies(stitched_gm)
    ideal = sum(ideal_regions(g.module) for g in graphs)
    return {"inductor": inductor, "backend": stitched + rest + copies, "stitched": stitched, "rest": rest,
            "copies": copies,
            "regions": regions, "ideal": ideal,
            "cpp_functions": {"inductor": inductor_functions, "rest": rest_functions},
            "graphs": [g.kind for g in graphs], "eager_rest": eager}


def run(models: Sequence[str], modes: Sequence[str], say: Callable[[str], None] = lambda s: None) -> list[dict[str, Any]]:
    """One row per model and mode (a failure is a row with its reason)."""
    build = _coverage().build_model
    rows = []
    for name in models:
        for mode in modes:
            t0 = time.time()
            row: dict[str, Any] = {"model": name, "mode": mode}
            try:
                model, args, _names = build(name.removesuffix("-labels"), labels=name.endswith("-labels"))
                row.update(count_step(model, args, mode), status="ran")
            except Exception as exc:  # noqa: BLE001 - a row with its reason, never an exception
                row.update(status="failed", reason=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200])
            row["seconds"] = round(time.time() - t0, 1)
            rows.append(row)
            say(_line(row))
    return rows


# ---------------------------------------------------------------------------- output
def _ratio(a: int, b: int) -> str:
    return f"{a / b:.2f}x" if b else "-"


def _line(row: dict[str, Any]) -> str:
    if row["status"] != "ran":
        return f"{row['model']:<9} {row['mode']:<10} failed: {row['reason']}"
    return (f"{row['model']:<9} {row['mode']:<10} {row['inductor']:>8} {row['backend']:>8} "
            f"({row['stitched']} stitched + {row['rest']} Inductor + {row['copies']} copies) "
            f"{_ratio(row['backend'], row['inductor']):>7} "
            f"{row['ideal']:>6} {_ratio(row['ideal'], row['inductor']):>7}")


def markdown(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The table as markdown (one row per model and mode)."""
    out = ["| model | mode | Inductor alone | backend (stitched + Inductor + copies) | backend / Inductor | ideal "
           "| ideal / Inductor |",
           "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        if r["status"] != "ran":
            out.append(f"| {r['model']} | {r['mode']} | failed: {r['reason']} | | | | |")
            continue
        out.append(f"| {r['model']} | {r['mode']} | {r['inductor']} | {r['backend']} "
                   f"({r['stitched']} + {r['rest']} + {r['copies']}) "
                   f"| {_ratio(r['backend'], r['inductor'])} | {r['ideal']} | {_ratio(r['ideal'], r['inductor'])} |")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="kernels per step: stitchtune backend vs Inductor alone, and the ideal")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--json", default=None, metavar="OUT", help="also write the rows as JSON")
    p.add_argument("--markdown", action="store_true", help="print the table as markdown too")
    a = p.parse_args(argv)
    try:
        parse_list = _coverage()._parse_list
        models = parse_list(a.models, MODELS + LABELS_MODELS, "models")
        modes = parse_list(a.modes, MODES, "modes")
    except ValueError as e:
        print(f"kernel_counts: error: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.ERROR)
    warnings.filterwarnings("ignore")
    print(f"{'model':<9} {'mode':<10} {'inductor':>8} {'backend':>8} {'':<41} {'ratio':>7} {'ideal':>6} {'ratio':>7}",
          flush=True)
    rows = run(models, modes, say=lambda s: print(s, flush=True))
    if a.markdown:
        print("\n".join(["", *markdown(rows)]))
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
