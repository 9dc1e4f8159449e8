"""``stitchtune bench``: the tuned kernels against PyTorch eager, torch.compile and JAX jit, in one run.

Contract of :func:`run_bench` (needs a CUDA GPU, torch and cuda-python; the peers also need their frameworks):

* for each graph stitchtune's program is :func:`stitchtune.deploy.compiled.compile`'s, i.e. the schedule
  :func:`stitchtune.deploy.selection.choose_schedule` picks from the tuning database (re-validated
  for today's space; tuned, nearest shape or heuristic, said in the note); when that is not a measured
  tuned record and ``trials > 0``, the search (cuda backend) runs first (:func:`stitchtune_program`).
  Its kernels run through the one launch path, :class:`stitchtune.gpu.launch.Launcher`, on the current
  torch stream with arguments packed once per rotation;
* everything is timed in this one process with one method: inputs built once from
  ``reference.random_inputs``; ``rotations`` copies of the inputs (enough that together they exceed
  twice the L2 cache) are cycled so no call finds its inputs in L2; warm-up calls; a CUDA event pair
  around each call on the current torch stream; the median of ``iters`` calls. JAX runs on its own
  streams, so XLA is timed by wall clock, both as ``max(iters, 200)`` queued calls ended by
  ``block_until_ready`` (dispatch overlaps the GPU: fair to XLA) and as single synchronised calls;
  the better of the two is kept and named in the note;
* before timing, every system's outputs (after a few calls, so state left by a previous call is
  exercised) are compared with the float64 numpy reference by :func:`stitchtune.gpu.runners.check_outputs`
  (the tuner's own check: 2-norm relative error, ``runners.TOLERANCE`` per output dtype); ``checked``
  says whether it passed; a system that fails is still timed but is left out of every summary;
* the device-to-device copy bandwidth is measured in the same run (a 1 GiB torch copy, bytes read
  plus written over the median time); each workload's floor is :func:`floor_reason`'s byte count
  over that bandwidth.

The results table (:data:`BENCH_COLUMNS`, one row per (workload, system)), the floors, the summary and
the CSV/chart writers are in :mod:`stitchtune.bench.table` (re-exported here).

torch, cuda-python, jax and matplotlib are imported inside the functions that use them.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from stitchtune.bench.table import (
    BENCH_COLUMNS,
    STITCHTUNE,
    Floor,
    SystemTiming,
    device_slug,
    floor_reason,
    format_table,
    on_chip_bytes,
    plot_results,
    results_table,
    summarize,
    write_results,
)
from stitchtune.deploy.torch_entry import to_torch, torch_dtype, to_host
from stitchtune.errors import StitchtuneError, ToolchainError
from stitchtune.hardware.device import QUERIED_SOURCE

if TYPE_CHECKING:
    from stitchtune.bench.peers import Peer
    from stitchtune.hardware.device import Device
    from stitchtune.graph.parse import Graph

__all__ = [
    "BENCH_COLUMNS", "STITCHTUNE", "Floor", "SystemTiming", "bench_graph", "copy_bandwidth", "device_slug",
    "floor_reason", "format_table", "on_chip_bytes", "plot_results", "results_table", "rotations_needed",
    "run_bench", "stitchtune_program", "summarize", "write_results",
]

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------------------
# GPU side: timing, one graph, the whole run (imports inside functions)
# ----------------------------------------------------------------------------------------------


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


#: queued JAX calls per timed batch, at least: with 200 calls Python dispatch overlaps the GPU work
#: (../shared/baselines: layernorm 55.2 us with 10 queued calls, 47.4 us with 200)
JAX_QUEUED_CALLS = 200


def _jax_times(fn: Callable[..., Any], arg_sets: list[dict[str, Any]], warmup: int, iters: int) -> tuple[float, str]:
    """Best of two wall-clock methods for JAX (µs per call, method text): median of ``iters`` single
    calls each ended by ``block_until_ready``, and median over 5 batches of ``max(iters,
    JAX_QUEUED_CALLS)`` queued calls ended by one ``block_until_ready`` (XLA runs them in order on its
    stream; dispatch overlaps the GPU)."""
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
    queued = max(iters, JAX_QUEUED_CALLS)
    for _ in range(5):
        t0 = time.perf_counter()
        out = None
        for i in range(queued):
            out = fn(**arg_sets[i % k])
        jax.block_until_ready(out)
        batches.append((time.perf_counter() - t0) * 1e6 / queued)
    s, q = statistics.median(single), statistics.median(batches)
    if q <= s:
        return q, f"wall clock, {queued} queued calls per batch, median of 5 batches (single-call median {s:.1f} us)"
    return s, f"wall clock, single synchronised calls, median of {iters} (queued: {q:.1f} us)"


def rotations_needed(input_bytes: int, l2_bytes: int) -> int:
    """Copies of the inputs to cycle through so that together they exceed twice the L2 (at least 2)."""
    return max(2, 2 * l2_bytes // max(input_bytes, 1) + 1)


def _check(graph: Graph, outs: Sequence[np.ndarray], expected: dict[str, np.ndarray]) -> tuple[bool, str]:
    from stitchtune.gpu.runners import check_outputs, output_dtypes

    res = check_outputs(dict(zip(graph.outputs, outs)), expected, output_dtypes(graph))
    err = f"rel err {res.max_rel_error:.1e}" if res.max_rel_error is not None else ""
    return res.ok, err if res.ok else f"WRONG RESULT: {res.error}"


def _torch_host(t: Any) -> np.ndarray:
    """A torch peer's output on the host: an int tensor as it is (an int64 value stays exact), any
    other as float32 (:func:`~stitchtune.deploy.torch_entry.to_host`)."""
    import torch

    return t.cpu().numpy() if t.dtype in (torch.int32, torch.int64) else to_host(t)


def _jax_host(a: Any) -> np.ndarray:
    """A JAX output on the host: an int array as it is (an int64 value stays exact), any other (float,
    bool) as float32 (every float graph dtype fits exactly)."""
    arr = np.asarray(a)
    return arr if arr.dtype.kind in "iu" else arr.astype(np.float32)


def stitchtune_program(graph_path: str, graph: Graph, db: str, trials: int, device: Device) -> Any:
    """The :class:`~stitchtune.deploy.compiled.CompiledGraph` (built) stitchtune runs for ``graph``: the
    schedule :func:`~stitchtune.deploy.selection.choose_schedule` picks from ``db``. When that is not a
    measured tuned record of this workload and ``trials > 0``, :func:`stitchtune.tune.search.run_search`
    (cuda backend) runs first and the choice is made again. Raises ToolchainError when nvcc fails."""
    from stitchtune.deploy.compiled import compile as st_compile

    cg = st_compile(graph, db=db, device=device, build=True)
    if trials > 0 and not cg.choice.measured:
        from stitchtune.tune.search import SearchConfig, run_search

        log.info("%s: no measured tuned record for %s (%s), searching %d trials", graph.name, device.key,
                 cg.source, trials)
        # a queried device is what `stitchtune search` finds by itself (device=None); a preset goes by name
        dev_name = None if getattr(device, "source", "preset") == QUERIED_SOURCE else device.name
        res = run_search(SearchConfig(graph_path=str(graph_path), trials=trials, backend="cuda", device=dev_name,
                                      db=str(db), progress=False))
        log.info("%s: search stopped (%s) after %d trials", graph.name, res.stopped, res.trials_run)
        cg = st_compile(graph, db=db, device=device, build=True)
    return cg


def _time_stitchtune(graph_path: str, graph: Graph, db: str, trials: int, device: Device,
                     sets: list[dict[str, Any]], expected: dict[str, np.ndarray], warmup: int, iters: int,
                     torch_device: str) -> SystemTiming:
    """stitchtune's row: its program launched through :class:`~stitchtune.gpu.launch.Launcher` on the
    current torch stream, arguments packed once per input rotation, checked, then timed."""
    import torch

    from stitchtune.gpu.driver import open_driver
    from stitchtune.gpu.launch import Launcher, launch_plan

    cg = stitchtune_program(graph_path, graph, db, trials, device)
    k = len(sets)
    stream = int(torch.cuda.current_stream().cuda_stream)
    launcher = Launcher(open_driver(torch.cuda.current_device()), launch_plan(cg.program), cg.cubin, stream)
    try:
        outs = [{o: torch.full(graph.spec(o).shape, float("nan"), dtype=torch_dtype(graph.spec(o).dtype),
                               device=torch_device) for o in graph.outputs} for _ in range(k)]
        bound = [launcher.bind({**{n: int(t.data_ptr()) for n, t in sets[i].items()},
                                **{n: int(t.data_ptr()) for n, t in outs[i].items()}}) for i in range(k)]
        for i in range(3):
            launcher.launch(bound[i % k], stream)
        _sync(torch_device)
        ok, err = _check(graph, [_torch_host(outs[2 % k][o]) for o in graph.outputs], expected)
        samples = _event_times(lambda i: launcher.launch(bound[i % k], stream), warmup, iters, torch_device)
    finally:
        _sync(torch_device)
        launcher.close()
    origin = f"{cg.source}: {cg.manifest['choice']['reason']}"
    return SystemTiming(graph.name, STITCHTUNE, statistics.median(samples), ok,
                        f"{origin}; CUDA events, median of {iters}, {k} rotating input copies; {err}", tuple(samples))


def _reference(graph: Graph, seed: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(random inputs, float64 numpy reference outputs) of ``graph``."""
    from stitchtune.graph.reference import random_inputs
    from stitchtune.gpu.runners import reference_outputs

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
    from stitchtune.bench.peers import build_peers
    from stitchtune.hardware.device import check_fits

    check_fits(graph, device)  # refused with the numbers before any allocation
    wl = graph.name
    inputs, expected = reference or _reference(graph, seed)
    in_bytes = sum(a.nbytes for a in inputs.values())
    k = rotations_needed(in_bytes, device.l2_bytes)
    sets = [{n: to_torch(a, torch_device) for n, a in inputs.items()} for _ in range(k)]
    results: list[SystemTiming] = []
    if stitchtune:
        results.append(_stitchtune_row(graph_path, graph, db, trials, device, sets, expected, warmup, iters,
                                       torch_device))
    peers, notes = build_peers(graph, tuple(peer_names))
    for note in notes:
        sys_ = note.split(":", 1)[0]
        results.append(SystemTiming(wl, sys_, None, False, note))
    for peer in peers:
        results.append(_peer_row(graph, peer, inputs, sets, expected, warmup, iters, torch_device))
    return results


def _stitchtune_row(graph_path: str, graph: Graph, db: str, trials: int, device: Device,
                    sets: list[dict[str, Any]], expected: dict[str, np.ndarray], warmup: int, iters: int,
                    torch_device: str) -> SystemTiming:
    """stitchtune's row of :func:`bench_graph` (:func:`_time_stitchtune`), or its failure in ``note``:
    a user-facing refusal as "not run", anything else as "failed" (logged). Never raises."""
    wl = graph.name
    try:
        return _time_stitchtune(graph_path, graph, db, trials, device, sets, expected, warmup, iters, torch_device)
    except StitchtuneError as exc:
        return SystemTiming(wl, STITCHTUNE, None, False, f"not run: {'; '.join(exc.problems)}")
    except Exception as exc:
        log.exception("%s: stitchtune failed", wl)
        return SystemTiming(wl, STITCHTUNE, None, False, f"failed: {type(exc).__name__}: {exc}"[:500])


def _peer_row(graph: Graph, peer: Peer, inputs: dict[str, np.ndarray], sets: list[dict[str, Any]],
              expected: dict[str, np.ndarray], warmup: int, iters: int, torch_device: str) -> SystemTiming:
    """One peer's row of :func:`bench_graph`: checked after its first calls, then timed (a torch peer
    on ``sets``, a JAX peer on as many copies of ``inputs`` put on its device); a failure is its note
    (logged). Never raises."""
    rot = f"{len(sets)} rotating input copies"
    try:
        if peer.framework == "torch":
            first_s, (ok, err), samples = _torch_peer_times(graph, peer, sets, expected, warmup, iters, torch_device)
            med = statistics.median(samples)
            how = f"{'CUDA events' if torch_device != 'cpu' else 'CPU wall clock'}, median of {iters}, {rot}"
        else:
            first_s, (ok, err), med, how = _jax_peer_times(graph, peer, inputs, len(sets), expected, warmup, iters)
            how += f", {rot}"
            samples = []
        return SystemTiming(graph.name, peer.system, med, ok,
                            f"{how}; first calls (compile) {first_s:.1f} s; {err}", tuple(samples))
    except Exception as exc:
        log.exception("%s: peer %s failed", graph.name, peer.system)
        return SystemTiming(graph.name, peer.system, None, False, f"failed: {type(exc).__name__}: {exc}"[:500])
    finally:
        _sync(torch_device)


def _torch_peer_times(graph: Graph, peer: Peer, sets: list[dict[str, Any]], expected: dict[str, np.ndarray],
                      warmup: int, iters: int, torch_device: str) -> tuple[float, tuple[bool, str], list[float]]:
    """(seconds of the first three calls, :func:`_check` of the third's outputs, :func:`_event_times`
    samples in µs) of a torch peer, cycling through the input rotations ``sets``."""
    k = len(sets)
    t0 = time.perf_counter()
    for i in range(3):
        res = peer.fn(**sets[i % k])
    _sync(torch_device)
    first_s = time.perf_counter() - t0
    checked = _check(graph, [_torch_host(t) for t in res], expected)
    del res
    return first_s, checked, _event_times(lambda i: peer.fn(**sets[i % k]), warmup, iters, torch_device)


def _jax_peer_times(graph: Graph, peer: Peer, inputs: dict[str, np.ndarray], k: int,
                    expected: dict[str, np.ndarray], warmup: int, iters: int
                    ) -> tuple[float, tuple[bool, str], float, str]:
    """(seconds of the first call, :func:`_check` of its outputs, µs per call and the method of
    :func:`_jax_times`) of a JAX peer, cycling through ``k`` copies of ``inputs`` on its device."""
    import jax

    from stitchtune.bench.jax_peer import jax_inputs

    jsets = [jax_inputs(graph, inputs) for _ in range(k)]   # int64 inputs stay int64 (x64 scope)
    t0 = time.perf_counter()
    res = jax.block_until_ready(peer.fn(**jsets[0]))
    first_s = time.perf_counter() - t0
    checked = _check(graph, [_jax_host(r) for r in res], expected)
    del res
    med, how = _jax_times(peer.fn, jsets, warmup, iters)
    return first_s, checked, med, how


def run_bench(graphs: Sequence[str | os.PathLike[str]], db: str, trials: int, peers: Sequence[str],
              device: Device | None = None, *, out_dir: str | os.PathLike[str] | None = None, iters: int = 100,
              warmup: int = 10, seed: int = 0, progress: Callable[[str], None] | None = None) -> pd.DataFrame:
    """Benchmark the graph files ``graphs`` (see the module docstring); write the CSV and chart under
    ``out_dir`` (default: the database ``db``, where ``stitchtune report`` looks for them) and return the
    table. Raises ToolchainError without torch, cuda-python or a CUDA GPU."""
    out_dir = db if out_dir is None else out_dir
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX shares the GPU with torch
    missing = [m for m in ("torch", "cuda") if m not in sys.modules and importlib.util.find_spec(m) is None]
    if missing:
        raise ToolchainError(f"stitchtune bench needs torch and cuda-python ({', '.join(missing)} not installed)")
    import torch

    if not torch.cuda.is_available():
        raise ToolchainError("stitchtune bench needs a CUDA GPU (torch sees none)")
    from stitchtune.hardware.device import get_device
    from stitchtune.gpu.device_query import query_device
    from stitchtune.graph.parse import load_graph

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
    from stitchtune.bench.peers import PEER_SYSTEMS

    wl = {g.name: i for i, (_, g) in enumerate(loaded)}
    sy = {STITCHTUNE: -1} | {PEER_SYSTEMS[p]: i for i, p in enumerate(peers)}
    key = df["workload"].map(wl).fillna(len(wl)) * 1000 + df["system"].map(sy).fillna(999)
    return df.assign(_k=key).sort_values("_k", kind="stable").drop(columns="_k").reset_index(drop=True)


def _versions() -> str:
    """Framework versions for the chart title (those that are importable)."""
    import importlib.metadata as md

    parts = []
    for pkg in ("torch", "jax", "cuda-bindings"):
        try:
            parts.append(f"{pkg.split('-')[0]} {md.version(pkg)}")
        except md.PackageNotFoundError:
            continue
    return ", ".join(dict.fromkeys(parts))
