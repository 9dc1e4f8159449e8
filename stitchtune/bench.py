"""``stitchtune bench``: the tuned kernels against PyTorch eager, torch.compile and JAX jit, in one run.

Contract of :func:`run_bench` (needs a CUDA GPU, torch and cupy; the peers also need their frameworks):

* for each graph the tuned program comes from the tuning database (:func:`stitchtune.api.compile`);
  when the database has no measured record for it and ``trials > 0``, the search runs first;
* everything is timed in this one process with one method: inputs built once from
  ``reference.random_inputs``; ``rotations`` copies of the inputs (enough that together they exceed
  twice the L2 cache) are cycled so no call finds its inputs in L2; warm-up calls; a CUDA event pair
  around each call on the current torch stream; the median of ``iters`` calls. JAX runs on its own
  streams, so XLA is timed by wall clock, both as ``iters`` queued calls ended by
  ``block_until_ready`` (dispatch overlaps the GPU: fair to XLA) and as single synchronised calls;
  the better of the two is kept and named in the note;
* before timing, every system's outputs (after a few calls, so state left by a previous call is
  exercised) are compared with the float64 numpy reference by :func:`stitchtune.runners.check_outputs`
  (the tuner's own check: 2-norm relative error, ``runners.TOLERANCE`` per output dtype); ``checked``
  says whether it passed; a system that fails is still timed but is left out of every summary;
* the device-to-device copy bandwidth is measured in the same run (a 1 GiB torch copy, bytes read
  plus written over the median time); each workload's floor is :func:`floor_reason`'s byte count
  over that bandwidth.

The results table (:data:`BENCH_COLUMNS`), one row per (workload, system):
``median_us`` (median time per call, measured), ``min_bytes`` (each input read once + each output
written once), ``floor_bytes`` (``min_bytes`` + the re-read a dependency forces, see
:func:`floor_reason`), ``floor_us`` (``floor_bytes`` / copy bandwidth), ``fraction_of_floor``
(``floor_us / median_us``: 1.0 = at the floor), ``speedup_vs_this`` (this system's ``median_us`` /
stitchtune's ``median_us`` for the same workload: > 1 means stitchtune is that many times faster;
1.0 on stitchtune's own row), ``checked`` and ``note``. :func:`write_results` writes it as
``bench_<device>.csv`` plus a bar chart ``bench_<device>.png``.

torch, cupy, jax and matplotlib are imported inside the functions that use them.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from .errors import StitchtuneError, ToolchainError
from .ops import REDUCTIONS

if TYPE_CHECKING:
    from .device import Device
    from .graph import Graph

log = logging.getLogger(__name__)

STITCHTUNE = "stitchtune"

BENCH_COLUMNS: tuple[str, ...] = (
    "workload", "system", "median_us", "min_bytes", "floor_bytes", "floor_us", "fraction_of_floor",
    "speedup_vs_this", "checked", "note",
)

_ELEM_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


# ----------------------------------------------------------------------------------------------
# floors
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Floor:
    """The fewest DRAM bytes a schedule of a workload moves, and why.

    ``floor_bytes = min_bytes + reread_bytes``; ``on_chip_bytes`` is the device's registers + shared
    memory of all SMs + L2, the most a kernel could keep on chip between two uses of a value.
    """

    min_bytes: int
    reread_bytes: int
    on_chip_bytes: int
    reason: str

    @property
    def floor_bytes(self) -> int:
        return self.min_bytes + self.reread_bytes


def on_chip_bytes(device: Device) -> int:
    """Registers + shared memory of every SM + the L2 cache, in bytes, from the device description."""
    return int(device.sm_count * (4 * device.regs_per_sm + device.smem_per_sm) + device.l2_bytes)


def _fmt_bytes(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def _ancestors(graph: Graph, name: str) -> set[str]:
    """All tensors ``name`` depends on (inputs and nodes), ``name`` excluded."""
    seen: set[str] = set()
    todo = [name]
    input_names = {n for n, _ in graph.inputs}
    while todo:
        t = todo.pop()
        if t in input_names:
            continue
        for a in graph.node(t).args:
            if isinstance(a, str) and a not in seen:
                seen.add(a)
                todo.append(a)
    return seen


def _reduction_group_elems(shape: tuple[int, ...], axes: tuple[int, ...]) -> int:
    """Elements that must all be read, in row-major (coalesced) order, before one result of a
    reduction over ``axes`` exists: from the first reduced axis to the last axis."""
    first = min(axes)
    return int(np.prod(shape[first:], dtype=np.int64))


def floor_reason(graph: Graph, device: Any) -> Floor:
    """The DRAM byte floor of ``graph`` on ``device`` with its reasoning.

    ``min_bytes``: each input read once, each output written once (``Graph.min_bytes``).
    A forced re-read exists only where a reduction's result is broadcast back to a consumer that
    also needs the reduction's own input data (AStitch's one-to-many dependency): the input must then
    stay on chip from the moment it is read for the reduction until the consumer uses it. Reading in
    row-major order with coalesced accesses (what every schedule in stitchtune's space and every peer
    does), one reduction result needs all elements from the first reduced axis to the last before it
    exists (a row for a last-axis reduction, the whole tensor for a reduction over axis 0 of a 2-D
    tensor). If one such group of the re-used graph inputs fits in ``on_chip_bytes`` (registers +
    shared memory + L2) nothing must be re-read; otherwise at least the excess of every group is read
    twice. Caveat stated in the reason: a schedule reading a column reduction in narrow column strips
    (32-byte sectors) could in principle avoid that re-read; such schedules are outside the space.
    """
    min_bytes = int(graph.min_bytes())
    chip = on_chip_bytes(device)
    input_names = {n for n, _ in graph.inputs}
    parts: list[str] = [f"min {_fmt_bytes(min_bytes)} = inputs read once + outputs written once"]
    reread = 0
    reductions = [n for n in graph.nodes if n.op in REDUCTIONS]
    if not reductions:
        parts.append("no reduction: element-wise, nothing is needed twice")
    for red in reductions:
        src = red.args[0]
        feeds = (_ancestors(graph, red.id) | {red.id}) & input_names  # graph inputs the reduction reads
        after = [n for n in graph.nodes if red.id in _ancestors(graph, n.id)]
        # graph inputs that a consumer of the result needs again through a path that avoids the reduction
        reused_set: set[str] = set()
        for n in after:
            for a in n.args:
                if isinstance(a, str) and a != red.id and red.id not in _ancestors(graph, a):
                    reused_set |= (_ancestors(graph, a) | {a}) & feeds
        reused = sorted(reused_set)
        in_shape = tuple(graph.spec(src).shape)
        if not after or not reused:
            parts.append(f"{red.id}: {red.op} over axes {list(red.axes)}, its input is not needed after it")
            continue
        group = _reduction_group_elems(in_shape, tuple(red.axes))
        total = int(np.prod(in_shape, dtype=np.int64))
        groups = max(1, total // group)
        held = sum(min(group, int(np.prod(graph.spec(t).shape, dtype=np.int64))) * _ELEM_BYTES[graph.spec(t).dtype]
                   for t in reused)
        if held <= chip:
            parts.append(f"{red.id}: {red.op} over axes {list(red.axes)} of {list(in_shape)}, result broadcast "
                         f"back to {', '.join(reused)}; one group ({_fmt_bytes(held)}) fits on chip "
                         f"({_fmt_bytes(chip)} = registers + shared memory + L2): no forced re-read")
        else:
            extra = (held - chip) * groups
            reread += extra
            parts.append(f"{red.id}: {red.op} over axes {list(red.axes)} of {list(in_shape)} needs all "
                         f"{_fmt_bytes(held)} of {', '.join(reused)} before its result exists, more than fits "
                         f"on chip ({_fmt_bytes(chip)} = registers + shared memory + L2): at least "
                         f"{_fmt_bytes(extra)} must be read twice (a column-strip schedule could avoid it; "
                         "not in the space)")
    return Floor(min_bytes=min_bytes, reread_bytes=int(reread), on_chip_bytes=chip, reason="; ".join(parts))


# ----------------------------------------------------------------------------------------------
# the results table (CPU, pure)
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SystemTiming:
    """One system's outcome on one workload. ``median_us`` None = not timed (see ``note``)."""

    workload: str
    system: str
    median_us: float | None
    checked: bool
    note: str = ""
    samples_us: tuple[float, ...] = field(default=(), repr=False)


def results_table(timings: Iterable[SystemTiming], floors: dict[str, Floor], copy_bw: float) -> pd.DataFrame:
    """The results table (:data:`BENCH_COLUMNS`) from timings, per-workload floors and the copy
    bandwidth in bytes/s (read + written) measured in the same run."""
    if not copy_bw > 0:
        raise ValueError("copy bandwidth must be positive")
    rows = []
    timings = list(timings)
    st_time = {t.workload: t.median_us for t in timings if t.system == STITCHTUNE and t.median_us}
    for t in timings:
        fl = floors[t.workload]
        floor_us = fl.floor_bytes / copy_bw * 1e6
        med = t.median_us if t.median_us is not None and math.isfinite(t.median_us) else None
        st = st_time.get(t.workload)
        rows.append({
            "workload": t.workload,
            "system": t.system,
            "median_us": med,
            "min_bytes": fl.min_bytes,
            "floor_bytes": fl.floor_bytes,
            "floor_us": floor_us,
            "fraction_of_floor": floor_us / med if med else None,
            "speedup_vs_this": med / st if med and st else None,
            "checked": bool(t.checked),
            "note": t.note,
        })
    df = pd.DataFrame(rows, columns=list(BENCH_COLUMNS))
    for c in ("median_us", "floor_us", "fraction_of_floor", "speedup_vs_this"):
        df[c] = df[c].astype("float64")
    return df


def _geomean(xs: Sequence[float]) -> float | None:
    xs = [x for x in xs if x and x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def summarize(df: pd.DataFrame) -> dict[str, Any]:
    """Geometric-mean speedups of stitchtune over the best checked peer of each workload and over
    each peer system, and the workloads where stitchtune reaches 0.9 of the floor. Unchecked rows
    are ignored."""
    ok = df[df["checked"] & df["median_us"].notna()]
    peers = ok[ok["system"] != STITCHTUNE]
    st = ok[ok["system"] == STITCHTUNE].set_index("workload")
    best: list[float] = []
    for wl, g in peers.groupby("workload"):
        if wl in st.index:
            best.append(float(g["median_us"].min()) / float(st.loc[wl, "median_us"]))
    per_system = {sys_: _geomean(list(g["speedup_vs_this"])) for sys_, g in peers.groupby("system")}
    return {
        "geomean_speedup_vs_best_peer": _geomean(best),
        "geomean_speedup_vs": per_system,
        "at_0.9_floor": sorted(st.index[st["fraction_of_floor"] >= 0.9].tolist()),
        "workloads": int(st.shape[0]),
    }


def format_table(df: pd.DataFrame) -> str:
    """A plain-text table for the terminal (one line per row, then the summary)."""
    header = (f"{'workload':<34} {'system':<42} {'median_us':>10} {'floor_us':>9} {'of_floor':>8} "
              f"{'speedup':>8} {'ok':>3}")
    lines = [header]
    for r in df.itertuples(index=False):
        med = f"{r.median_us:10.1f}" if pd.notna(r.median_us) else f"{'-':>10}"
        frac = f"{r.fraction_of_floor:8.2f}" if pd.notna(r.fraction_of_floor) else f"{'-':>8}"
        spd = f"{r.speedup_vs_this:7.2f}x" if pd.notna(r.speedup_vs_this) else f"{'-':>8}"
        lines.append(f"{r.workload[:34]:<34} {r.system[:42]:<42} {med} {r.floor_us:9.1f} {frac} {spd} "
                     f"{'yes' if r.checked else 'NO':>3}")
    s = summarize(df)

    def f(x: float | None) -> str:
        return f"{x:.2f}x" if x else "-"

    lines.append(f"geomean speedup of stitchtune over the best peer: {f(s['geomean_speedup_vs_best_peer'])}; "
                 + ", ".join(f"over {k}: {f(v)}" for k, v in s["geomean_speedup_vs"].items()))
    lines.append(f"stitchtune at >= 0.9 of the floor on {len(s['at_0.9_floor'])}/{s['workloads']} workloads")
    return "\n".join(lines)


def device_slug(name: str) -> str:
    """A file-name-safe short device name: ``NVIDIA H200`` -> ``h200``."""
    s = re.sub(r"^nvidia[\s_-]*", "", name.strip(), flags=re.IGNORECASE).lower()
    s = re.sub(r"[^a-z0-9]+", "_", s).strip("_")
    return s or "device"


def plot_results(df: pd.DataFrame, path: str | os.PathLike[str], title: str) -> None:
    """Grouped bar chart: per workload, each system's time (µs, log scale) and fraction of the floor."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    workloads = list(dict.fromkeys(df["workload"]))
    systems = list(dict.fromkeys(df["system"]))
    n = len(systems)
    width = 0.8 / max(n, 1)
    x = np.arange(len(workloads))
    fig, (ax_t, ax_f) = plt.subplots(2, 1, figsize=(max(9, 1.4 * len(workloads) + 5), 8), sharex=True)
    for i, sys_ in enumerate(systems):
        sub = df[df["system"] == sys_].set_index("workload")

        def col(c: str, sub: pd.DataFrame = sub) -> list[float]:
            return [float(sub.loc[w, c]) if w in sub.index and pd.notna(sub.loc[w, c]) else 0.0 for w in workloads]

        bad = [w in sub.index and not bool(sub.loc[w, "checked"]) for w in workloads]
        off = x - 0.4 + width * (i + 0.5)
        for ax, vals in ((ax_t, col("median_us")), (ax_f, col("fraction_of_floor"))):
            bars = ax.bar(off, vals, width, label=sys_ if ax is ax_t else None, color=f"C{i}")
            for b, is_bad in zip(bars, bad):
                if is_bad:  # failed the reference check: hatched, left out of the summary
                    b.set_hatch("xx")
                    b.set_alpha(0.4)
    floors = df.drop_duplicates("workload").set_index("workload")["floor_us"]
    ax_t.hlines([floors[w] for w in workloads], x - 0.42, x + 0.42, colors="black", linewidth=2, zorder=3,
                label="floor: bytes / measured copy bandwidth")
    ax_t.set_yscale("log")
    ax_t.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax_t.yaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax_t.set_ylabel("median time per call (µs, log scale)")
    ax_t.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax_f.axhline(0.9, color="black", linestyle="--", linewidth=1, label="0.9 of the floor (target)")
    ax_f.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax_f.set_ylabel("fraction of the copy-bandwidth floor\n(floor_us / median_us, higher is better)")
    ax_f.set_xticks(x)
    ax_f.set_xticklabels(workloads, rotation=30, ha="right", fontsize=8)
    ax_f.text(1.02, 0.8, "hatched bars: output failed\nthe reference check", transform=ax_f.transAxes, fontsize=8,
              va="top")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_results(df: pd.DataFrame, out_dir: str | os.PathLike[str], device_name: str,
                  title_extra: str = "") -> tuple[Path, Path]:
    """Write ``bench_<device>.csv`` and ``bench_<device>.png`` under ``out_dir``; return both paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    slug = device_slug(device_name)
    csv_path, png_path = out / f"bench_{slug}.csv", out / f"bench_{slug}.png"
    df.to_csv(csv_path, index=False, float_format="%.6g")
    title = f"stitchtune bench on {device_name}" + (f" ({title_extra})" if title_extra else "")
    plot_results(df, png_path, title)
    return csv_path, png_path


# ----------------------------------------------------------------------------------------------
# GPU side: the tuned program, a launcher from raw pointers, timing (imports inside functions)
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TunedProgram:
    """The program stitchtune runs for a workload and where it came from (``origin``, for the note)."""

    program: Any  # kir.Program
    cubin_path: str
    origin: str


def tuned_program(graph_path: str, graph: Graph, db: str, trials: int, device: Device) -> TunedProgram:
    """The best measured schedule of ``graph`` on ``device`` from the database ``db``; when there is
    none and ``trials > 0``, :func:`stitchtune.search.run_search` (cuda backend) runs first. Without any
    measured record the heuristic schedule is used (said in ``origin``). Raises ToolchainError when
    nvcc cannot build the source."""
    from .build import NvccBuilder
    from .db import TuningDB
    from .lower import CODEGEN_VERSION, lower
    from .plan import make_plan
    from .render_cuda import render
    from .schedule import Schedule, SearchSpace

    tdb = TuningDB(db)
    plan = make_plan(graph)
    space = SearchSpace.for_plan(plan, device)
    want = {"workload_key": graph.workload_key(), "device_key": device.key, "space_version": str(space.version),
            "codegen_version": str(CODEGEN_VERSION), "backend": "cuda"}
    best = tdb.best(**want)
    if best is None and trials > 0:
        from .search import SearchConfig, run_search

        log.info("%s: no tuned record for %s, searching %d trials", graph.name, device.key, trials)
        # a queried device is what `stitchtune search` finds by itself (device=None); a preset goes by name
        dev_name = None if getattr(device, "source", "preset") == "pycuda" else device.name
        res = run_search(SearchConfig(graph_path=str(graph_path), trials=trials, backend="cuda", device=dev_name,
                                      db=str(db), progress=False))
        log.info("%s: search stopped (%s) after %d trials", graph.name, res.stopped, res.trials_run)
        best = tdb.best(**want)
    if best is not None:
        schedule = Schedule.from_json(str(best["schedule_json"]))
        origin = (f"tuned: schedule {best.get('schedule_key')} from the database "
                  f"(search measured {float(best['measured_us']):.1f} us)")
    else:
        from .heuristic import heuristic_schedule

        schedule = heuristic_schedule(plan, device)
        origin = "heuristic schedule (no measured record in the database)"
    program = lower(graph, plan, schedule, device, space)
    [built] = NvccBuilder().build([render(program)], device.arch)
    if built.status != "ok" or not built.cubin_path:
        raise ToolchainError(f"{graph.name}: nvcc failed on the tuned schedule: {built.error[:500]}")
    return TunedProgram(program=program, cubin_path=str(built.cubin_path), origin=origin)


class CupyLauncher:
    """Runs a :class:`~stitchtune.kir.Program` from raw device pointers on the current torch stream.

    The cubin is loaded with ``cupy.RawModule``; scratch and barrier buffers are allocated (zeroed) once
    here, as the program contract asks. ``__call__(pointers)`` takes the input/output buffer name ->
    device pointer map and enqueues every launch in order.
    """

    def __init__(self, program: Any, cubin_path: str, torch_device: str = "cuda") -> None:
        import cupy
        import torch

        from .cuda_runner import DEFAULT_SMEM_LIMIT, launch_plan

        self._cupy = cupy
        self.plan = launch_plan(program)
        self.module = cupy.RawModule(path=cubin_path)
        self.scratch: dict[str, Any] = {}
        for b in self.plan.buffers:
            if b.role in ("scratch", "barrier"):
                t = torch.zeros(max(b.nbytes, 1), dtype=torch.uint8, device=torch_device)
                if not b.zero_init and b.role == "scratch":
                    t.fill_(0xFF)  # like the runner: only zero_init buffers start at zero
                self.scratch[b.name] = t
        self.io_names = tuple(b.name for b in self.plan.buffers if b.role in ("input", "output"))
        funcs: dict[str, Any] = {}
        self.calls: list[tuple[Any, tuple[int, int, int], tuple[int, int, int], int, tuple[str, ...]]] = []
        for ln in self.plan.launches:
            f = funcs.get(ln.kernel) or self.module.get_function(ln.kernel)
            funcs[ln.kernel] = f
            if ln.smem_bytes > DEFAULT_SMEM_LIMIT:
                f.max_dynamic_shared_size_bytes = max(ln.smem_bytes, f.max_dynamic_shared_size_bytes)
            self.calls.append((f, ln.grid, ln.block, ln.smem_bytes, ln.args))

        sp = int(torch.cuda.current_stream().cuda_stream) if torch_device != "cpu" else 0
        self.stream = cupy.cuda.Stream.null if sp == 0 else cupy.cuda.ExternalStream(sp)

    def bind(self, pointers: dict[str, int]) -> list[tuple[Any, ...]]:
        """The launches with their arguments for one set of input/output pointers (prepared once, so
        that a timed call costs only the launches themselves)."""
        ptrs = {n: int(t.data_ptr()) for n, t in self.scratch.items()}
        ptrs.update(pointers)
        return [(f, grid, block, tuple(np.uint64(ptrs[a]) for a in args), smem)
                for f, grid, block, smem, args in self.calls]

    def run(self, bound: list[tuple[Any, ...]]) -> None:
        """Enqueue every launch of ``bound`` (from :meth:`bind`) on the torch stream of construction time."""
        for f, grid, block, args, smem in bound:
            f(grid, block, args, shared_mem=smem, stream=self.stream)

    def __call__(self, pointers: dict[str, int]) -> None:
        self.run(self.bind(pointers))


def _torch_dtype(name: str) -> Any:
    import torch

    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]


def _to_torch(arr: np.ndarray, device: str = "cuda") -> Any:
    import torch

    a = np.ascontiguousarray(arr)
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).to(device)
    return torch.from_numpy(a).to(device)


def _torch_out(t: Any) -> np.ndarray:
    return t.float().cpu().numpy()


def copy_bandwidth(nbytes: int = 1 << 30, iters: int = 20) -> float:
    """Device-to-device copy bandwidth in bytes/s (read + written): median of ``iters`` torch copies."""
    import torch

    def measure() -> float:
        src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").fill_(1)
        dst = torch.empty_like(src)
        return statistics.median(_event_times(lambda i: dst.copy_(src), warmup=3, iters=iters))

    med_us = measure()
    torch.cuda.empty_cache()
    return 2.0 * nbytes / (med_us * 1e-6)


def _sync(torch_device: str) -> None:
    import torch

    if torch_device != "cpu":
        torch.cuda.synchronize()


def _event_times(call: Callable[[int], Any], warmup: int, iters: int, torch_device: str = "cuda") -> list[float]:
    """CUDA events around each of ``iters`` calls ``call(i)`` (µs), after ``warmup`` calls.
    (``torch_device="cpu"``: wall clock per call, only for CPU tests of this module.)"""
    import torch

    for i in range(warmup):
        call(i)
    _sync(torch_device)
    if torch_device == "cpu":
        times = []
        for i in range(iters):
            t0 = time.perf_counter()
            call(warmup + i)
            times.append((time.perf_counter() - t0) * 1e6)
        return times
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        starts[i].record()
        call(warmup + i)
        ends[i].record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends)]


def _jax_times(fn: Callable[..., Any], arg_sets: list[dict[str, Any]], warmup: int, iters: int) -> tuple[float, str]:
    """Best of two wall-clock methods for JAX (µs per call, method text): median of single calls each
    ended by ``block_until_ready``, and median over 5 batches of ``iters`` queued calls ended by one
    ``block_until_ready`` (XLA runs them in order on its stream; dispatch overlaps the GPU)."""
    import jax

    k = len(arg_sets)
    for i in range(warmup):
        jax.block_until_ready(fn(**arg_sets[i % k]))
    single = []
    for i in range(iters):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(**arg_sets[i % k]))
        single.append((time.perf_counter() - t0) * 1e6)
    batches = []
    for _ in range(5):
        t0 = time.perf_counter()
        out = None
        for i in range(iters):
            out = fn(**arg_sets[i % k])
        jax.block_until_ready(out)
        batches.append((time.perf_counter() - t0) * 1e6 / iters)
    s, q = statistics.median(single), statistics.median(batches)
    if q <= s:
        return q, f"wall clock, {iters} queued calls per batch, median of 5 batches (single-call median {s:.1f} us)"
    return s, f"wall clock, single synchronised calls, median of {iters} (queued: {q:.1f} us)"


def rotations_needed(input_bytes: int, l2_bytes: int) -> int:
    """Copies of the inputs to cycle through so that together they exceed twice the L2 (at least 2)."""
    return max(2, 2 * l2_bytes // max(input_bytes, 1) + 1)


def _check(graph: Graph, outs: Sequence[np.ndarray], expected: dict[str, np.ndarray]) -> tuple[bool, str]:
    from .runners import check_outputs, output_dtypes

    res = check_outputs(dict(zip(graph.outputs, outs)), expected, output_dtypes(graph))
    err = f"rel err {res.max_rel_error:.1e}" if res.max_rel_error is not None else ""
    return res.ok, err if res.ok else f"WRONG RESULT: {res.error}"


class _Skip(Exception):
    """Internal: this system is not part of the current phase."""


def _reference(graph: Graph, seed: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(random inputs, float64 numpy reference outputs) of ``graph``."""
    from .reference import random_inputs
    from .runners import reference_outputs

    t0 = time.perf_counter()
    inputs = random_inputs(graph, seed)
    expected = reference_outputs(graph, inputs)
    log.info("%s: inputs + numpy reference in %.1f s", graph.name, time.perf_counter() - t0)
    return inputs, expected


def bench_graph(graph_path: str, graph: Graph, *, db: str, trials: int, peer_names: Sequence[str], device: Device,
                iters: int = 100, warmup: int = 10, seed: int = 0, torch_device: str = "cuda",
                reference: tuple[dict[str, np.ndarray], dict[str, np.ndarray]] | None = None,
                stitchtune: bool = True) -> list[SystemTiming]:
    """Time stitchtune and each peer on one graph (see the module docstring). Never raises for a
    failing system: its row carries the failure in ``note``. ``reference``: (inputs, float64 reference
    outputs) from :func:`_reference` when already computed; ``stitchtune=False`` times only the peers.
    ``torch_device="cpu"`` exists only for CPU tests of this function (wall-clock timing; the stitchtune
    launcher needs CUDA)."""
    import torch

    from .peers import build_peers

    wl = graph.name
    inputs, expected = reference or _reference(graph, seed)
    in_bytes = sum(a.nbytes for a in inputs.values())
    k = rotations_needed(in_bytes, device.l2_bytes)
    sets = [{n: _to_torch(a, torch_device) for n, a in inputs.items()} for _ in range(k)]
    rot = f"{k} rotating input copies"
    results: list[SystemTiming] = []

    # -- stitchtune
    try:
        if not stitchtune:
            raise _Skip
        tp = tuned_program(graph_path, graph, db, trials, device)
        launcher = CupyLauncher(tp.program, tp.cubin_path)
        outs = [{o: torch.full(graph.spec(o).shape, float("nan"), dtype=_torch_dtype(graph.spec(o).dtype),
                               device="cuda") for o in graph.outputs} for _ in range(k)]
        ptr_sets = []
        for i in range(k):
            p = {}
            for b in launcher.plan.buffers:
                if b.role == "input":
                    p[b.name] = int(sets[i][b.tensor].data_ptr())
                elif b.role == "output":
                    p[b.name] = int(outs[i][b.tensor].data_ptr())
            ptr_sets.append(p)
        bound = [launcher.bind(p) for p in ptr_sets]
        for i in range(3):
            launcher.run(bound[i % k])
        _sync(torch_device)
        ok, err = _check(graph, [_torch_out(outs[2 % k][o]) for o in graph.outputs], expected)
        samples = _event_times(lambda i: launcher.run(bound[i % k]), warmup, iters, torch_device)
        results.append(SystemTiming(wl, STITCHTUNE, statistics.median(samples), ok,
                                    f"{tp.origin}; CUDA events, median of {iters}, {rot}; {err}", tuple(samples)))
    except _Skip:
        pass
    except StitchtuneError as exc:
        results.append(SystemTiming(wl, STITCHTUNE, None, False, f"not run: {'; '.join(exc.problems)}"))
    except Exception as exc:
        log.exception("%s: stitchtune failed", wl)
        results.append(SystemTiming(wl, STITCHTUNE, None, False, f"failed: {type(exc).__name__}: {exc}"[:500]))

    # -- peers
    peers, notes = build_peers(graph, tuple(peer_names))
    for note in notes:
        sys_ = note.split(":", 1)[0]
        results.append(SystemTiming(wl, sys_, None, False, note))
    for peer in peers:
        try:
            if peer.framework == "torch":
                t0 = time.perf_counter()
                for i in range(3):
                    res = peer.fn(**sets[i % k])
                _sync(torch_device)
                first_s = time.perf_counter() - t0
                ok, err = _check(graph, [_torch_out(t) for t in res], expected)
                del res
                samples = _event_times(lambda i, fn=peer.fn: fn(**sets[i % k]), warmup, iters, torch_device)
                med = statistics.median(samples)
                how = f"{'CUDA events' if torch_device != 'cpu' else 'CPU wall clock'}, median of {iters}, {rot}"
            else:
                import jax

                jsets = [{n: jax.device_put(a) for n, a in inputs.items()} for _ in range(k)]
                t0 = time.perf_counter()
                res = jax.block_until_ready(peer.fn(**jsets[0]))
                first_s = time.perf_counter() - t0
                ok, err = _check(graph, [np.asarray(r, dtype=np.float32) for r in res], expected)
                del res
                med, how = _jax_times(peer.fn, jsets, warmup, iters)
                how += f", {rot}"
                samples = []
            results.append(SystemTiming(wl, peer.system, med, ok,
                                        f"{how}; first calls (compile) {first_s:.1f} s; {err}", tuple(samples)))
        except Exception as exc:
            log.exception("%s: peer %s failed", wl, peer.system)
            results.append(SystemTiming(wl, peer.system, None, False, f"failed: {type(exc).__name__}: {exc}"[:500]))
        finally:
            _sync(torch_device)
    return results


def run_bench(graphs: Sequence[str | os.PathLike[str]], db: str, trials: int, peers: Sequence[str],
              device: Device | None = None, *, out_dir: str | os.PathLike[str] = "results", iters: int = 100,
              warmup: int = 10, seed: int = 0, progress: Callable[[str], None] | None = None) -> pd.DataFrame:
    """Benchmark the graph files ``graphs`` (see the module docstring); write the CSV and chart under
    ``out_dir`` and return the table. Raises ToolchainError without torch, cupy or a CUDA GPU."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX shares the GPU with torch
    missing = [m for m in ("torch", "cupy") if m not in sys.modules and importlib.util.find_spec(m) is None]
    if missing:
        raise ToolchainError(f"stitchtune bench needs torch and cupy ({', '.join(missing)} not installed)")
    import torch

    if not torch.cuda.is_available():
        raise ToolchainError("stitchtune bench needs a CUDA GPU (torch sees none)")
    from .device import get_device, query_device
    from .graph import load_graph

    if device is None:  # the same description (and database key) `stitchtune search` uses by default
        try:
            device = query_device(0)
        except ToolchainError:
            device = get_device(torch.cuda.get_device_name(0))
    loaded = [(str(p), load_graph(p)) for p in graphs]
    say = progress or (lambda s: log.info("%s", s))
    t_start = time.perf_counter()
    bw = copy_bandwidth()
    say(f"device-to-device copy bandwidth: {bw / 1e12:.2f} TB/s (1 GiB torch copy, read + written, median of 20)")
    timings: list[SystemTiming] = []
    # the float64 numpy references of full-size graphs take seconds each: compute them all at once, in
    # threads (numpy releases the GIL in its loops), before anything is timed
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, min(len(loaded), (os.cpu_count() or 2) // 2))) as ex:
        refs = list(ex.map(lambda pg: _reference(pg[1], seed), loaded))
    say(f"inputs and numpy references of {len(loaded)} graph(s) in {time.perf_counter() - t0:.1f} s")
    floors = {g.name: floor_reason(g, device) for _, g in loaded}
    title = f"copy bw {bw / 1e12:.2f} TB/s; {_versions()}"
    # phases: cheap systems of every graph first, the slow-compiling torch.compile modes last, so that a
    # run cut short by a timeout still has stitchtune, eager and XLA for every graph; results are
    # rewritten after every graph
    cheap = tuple(p for p in peers if p in ("eager", "xla"))
    phases = [(True, cheap)] + [(False, (p,)) for p in peers if p not in cheap]
    for with_st, names in phases:
        for (path, g), ref in zip(loaded, refs):
            t0 = time.perf_counter()
            timings += bench_graph(path, g, db=db, trials=trials, peer_names=names, device=device, iters=iters,
                                   warmup=warmup, seed=seed, reference=ref, stitchtune=with_st)
            torch.cuda.empty_cache()  # this graph's tensors are gone with bench_graph's frame
            say(f"{g.name}: {', '.join(([STITCHTUNE] if with_st else []) + list(names))} done in "
                f"{time.perf_counter() - t0:.1f} s")
            write_results(_ordered(results_table(timings, floors, bw), loaded, peers), out_dir, device.name, title)
    del refs
    bw_end = copy_bandwidth()
    say(f"copy bandwidth at the end: {bw_end / 1e12:.2f} TB/s; the floor uses the larger of the two")
    bw = max(bw, bw_end)
    df = _ordered(results_table(timings, floors, bw), loaded, peers)
    csv_path, png_path = write_results(df, out_dir, device.name, f"copy bw {bw / 1e12:.2f} TB/s; {_versions()}")
    for wl, fl in floors.items():
        say(f"floor {wl}: {fl.reason}")
    say(f"wrote {csv_path} and {png_path} ({time.perf_counter() - t_start:.0f} s in all)")
    return df


def _ordered(df: pd.DataFrame, loaded: Sequence[tuple[str, Graph]], peers: Sequence[str]) -> pd.DataFrame:
    """Rows in graph order, then stitchtune, then the peers in ``peers`` order."""
    from .peers import PEER_SYSTEMS

    wl = {g.name: i for i, (_, g) in enumerate(loaded)}
    sy = {STITCHTUNE: -1} | {PEER_SYSTEMS[p]: i for i, p in enumerate(peers)}
    key = df["workload"].map(wl).fillna(len(wl)) * 1000 + df["system"].map(sy).fillna(999)
    return df.assign(_k=key).sort_values("_k", kind="stable").drop(columns="_k").reset_index(drop=True)


def _versions() -> str:
    """Framework versions for the chart title (those that are importable)."""
    import importlib.metadata as md

    parts = []
    for pkg in ("torch", "jax", "cupy-cuda12x", "cupy-cuda13x", "cupy"):
        try:
            parts.append(f"{pkg.split('-')[0]} {md.version(pkg)}")
        except md.PackageNotFoundError:
            continue
    return ", ".join(dict.fromkeys(parts))
