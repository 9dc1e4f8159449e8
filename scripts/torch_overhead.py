"""Per-call overhead of ``torch.compile(model, backend="stitchtune")``'s custom op.

    python scripts/torch_overhead.py [--shape 16384x1024[,...]] [--iters 1000] [--db DIR] [--cpu]

On a GPU the model is a LayerNorm over the last axis of ``x`` (one stitched region, one kernel).

* On a GPU (torch.cuda available, cuda-python, nvcc): with CUDA events over ``--iters`` queued calls,
  the region's kernel alone (launched through its Launcher with packed arguments, no Python op in
  between), the compiled model per call, and the same model captured in a CUDA graph (the op is
  capturable), next to PyTorch eager, ``torch.compile`` (Inductor default) and Inductor
  ``mode="reduce-overhead"``; plus the host time per call (wall clock of the queued loop).
* Without a GPU (or with ``--cpu``): the host side of the launch path on the CPU, per call, with
  a driver whose launch does nothing (``NullDriver``), for BERT's add + LayerNorm region
  (``LayerNorm(x + res)``: 4 inputs, 1 output) at each ``--shape`` (default 64x256 and 4096x768, a
  64 KiB and a 12 MiB output): the region call as the compiled graph makes it
  (``torch_ops.region_op``: the thin path of :mod:`stitchtune.deploy.torch_fast`, no dispatcher),
  a do-nothing ``torch.library`` custom op of the same schema, the region op through the dispatcher
  and an op returning one ``torch.empty``, interleaved run by run (fastest of 21 runs each; the
  ratios printed), then the steps apart (guard, allocation, packed launch), the full path, the whole
  compiled model (dynamo guards + the region call), and the same region compiled with
  ``dynamic=True`` next to the do-nothing op. Labelled **CPU host time**, not GPU time; outputs come
  from the CPU allocator (malloc), not CUDA's caching allocator. Eager ``LayerNorm(x + res)`` on the
  CPU is printed for scale (CPU compute, not comparable).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


class LayerNorm:
    """Built lazily so that ``--help`` does not import torch."""

    @staticmethod
    def make(h: int) -> Any:
        import torch

        class LN(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.ln = torch.nn.LayerNorm(h)

            def forward(self, x: Any) -> Any:
                return self.ln(x)

        return LN()


def _host_us(call: Any, iters: int) -> float:
    """Median over 5 runs of the wall-clock time per call of ``iters`` calls (microseconds)."""
    for _ in range(min(iters, 50)):
        call()
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(iters):
            call()
        runs.append((time.perf_counter() - t0) / iters * 1e6)
    return statistics.median(runs)


ROUNDS = 21   # runs per interleaved row: the fastest is kept (a busy shared CPU slows most of them)


#: the clock of the interleaved rows: this thread's CPU time (``time.thread_time``: the time it was
#: descheduled on a busy shared CPU is not counted; on an idle one it equals the wall clock)
CLOCK = time.thread_time


def _paired_us(*calls: Any, iters: int, rounds: int = ROUNDS) -> list[float]:
    """us per call of each of ``calls`` (:data:`CLOCK`): the fastest of ``rounds`` runs of ``iters``
    calls each, the calls interleaved run by run, so that a busy shared CPU slows them alike (the
    minimum is the least disturbed run, as ``timeit`` advises)."""
    for _ in range(min(iters, 50)):
        for call in calls:
            call()
    best = [float("inf")] * len(calls)
    for _ in range(rounds):
        for j, call in enumerate(calls):
            t0 = CLOCK()
            for _ in range(iters):
                call()
            best[j] = min(best[j], (CLOCK() - t0) / iters * 1e6)
    return best


def _null_driver() -> Any:
    from stitchtune.gpu.fake_driver import FakeDriver

    class NullDriver(FakeDriver):
        """A FakeDriver whose launch only counts (the host path without the fake's argument decoding)."""

        launched = 0

        def launch(self, function: Any, grid: Any, block: Any, smem: int, stream: int, params: int,
                   nparams: int, cooperative: bool = False) -> None:
            self.launched += 1

    return NullDriver()


class Residual:
    """BERT's output block without its matmul: ``LayerNorm(h + residual)`` (one stitched region: 4
    inputs, 1 output in inference, as each layer of BERT has two of)."""

    @staticmethod
    def make(h: int) -> Any:
        import torch

        class AddLN(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.ln = torch.nn.LayerNorm(h)

            def forward(self, x: Any, res: Any) -> Any:
                return self.ln(x + res)

        return AddLN()


def _region_inputs(compiled: Any, args: tuple[Any, ...], key: str) -> list[Any]:
    """The inputs the compiled graph passes to region ``key`` (recorded during one call)."""
    from stitchtune.deploy import torch_ops

    real = torch_ops._registry[key]
    seen: list[Any] = []

    class Recorder:
        def __call__(self, inputs: Any) -> Any:
            seen.append(list(inputs))
            return real(inputs)

        def fake(self, inputs: Any) -> Any:
            return real.fake(inputs)

    torch_ops._registry[key] = Recorder()
    try:
        compiled(*args)
    finally:
        torch_ops._registry[key] = real
    return seen[-1]


def steady_malloc() -> bool:
    """glibc's malloc without trimming and without mmap (``mallopt``), so that a freed output's block
    is handed out again as CUDA's caching allocator does, without a system call per call; False
    where there is no glibc (nothing changed)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_max = -1, -4
    return bool(mallopt(m_trim_threshold, 1 << 30)) and bool(mallopt(m_mmap_max, 0))


def cpu_mode(shape: tuple[int, ...], iters: int, allocator: str = "the CPU allocator (malloc, no caching)") -> None:
    import torch

    from stitchtune.deploy import torch_backend, torch_ops

    torch_backend.register()
    torch._dynamo.reset()   # a second shape: compiled for it, not recompiled with dynamic shapes
    model = Residual.make(shape[-1]).eval()
    x, res = torch.randn(*shape), torch.randn(*shape)
    compiled = torch.compile(model, backend="stitchtune", options={"db": None, "fallback": "eager"})
    with torch.no_grad():
        compiled(x, res)  # compiles: one region, registered with the custom op
        drv = _null_driver()
        kernels = [(key, getattr(k, "kernel", k)) for key, k in torch_ops._registry.items()]   # unguarded
        key, kernel = kernels[-1]
        for _, k in kernels:
            k.driver = drv
            if k.compiled.cubin is None:
                k.compiled = dataclasses.replace(k.compiled, cubin=b"FAKE cubin: host-path benchmark, never loaded by a GPU")
        inputs = _region_inputs(compiled, (x, res), key)
        out = kernel.empty_outputs(x.device)
        ptrs = tuple(int(t.data_ptr()) for t in (*inputs, *out))
        noop = _noop_op()
        op = torch.ops.stitchtune.region.default
        op(key, inputs)   # the first call takes the full path and keeps the thin one
        guarded = torch_ops.lookup(key)
        fast = guarded._fast
        if fast is None or fast(inputs) is None:
            raise SystemExit("torch_overhead: the region's thin path is not taken: nothing to measure")
        direct = torch_ops.region_op
        empty_op = _noop_op("empty1")
        oshape = tuple(out[0].shape)
        spec = fast.outs[0]
        alloc = fast.alloc
        first = inputs[0]
        n_in = len(inputs)
        # the figures the ratio is made of: interleaved run by run, fastest of ROUNDS runs each
        ours, via_op, floor, one_empty = _paired_us(
            lambda: direct(key, inputs), lambda: op(key, inputs), lambda: noop.default(key, inputs),
            lambda: empty_op.default(key, inputs, oshape), iters=iters)
        steps = _paired_us(
            lambda: fast.guard(*inputs) and [t.data_ptr() & 15 for t in inputs],
            lambda: alloc(*spec),
            lambda: torch.empty(oshape, dtype=first.dtype, device=first.device),
            lambda: kernel.launch_pointers(-1, ptrs, 0),
            iters=iters)
        rows = [
            ("region call as a compiled graph makes it (torch_ops.region_op: guard folded into the thin path, "
             "outputs, pointers, launch; no dispatcher)", ours),
            ("a do-nothing torch.library custom op, same schema (dispatch alone)", floor),
            ("custom op torch.ops.stitchtune.region.default (dispatcher + the same call): what Inductor's "
             "wrapper pays", via_op),
            ("a torch.library custom op that only returns one torch.empty of the output's shape", one_empty),
            (f"  step: the guard of {n_in} inputs (shape, dtype, device, strides: one C++ TensorGuards check; "
             "pointers, alignment)", steps[0]),
            ("  step: the output by _empty_strided_cpu (as the thin path allocates it)", steps[1]),
            ("  step: the output by torch.empty (Python argument parsing)", steps[2]),
            ("  step: packed-arguments lookup + pointers + launch (RegionKernel.launch_pointers)", steps[3]),
            ("RegionKernel call, full path (as_read, torch.empty, pointers, launch; wall clock, median of 5)", _host_us(lambda: kernel(inputs), iters)),
            ("compiled model per call (dynamo guards + AOT wrapper + the region call; wall clock, median of 5)",
             _host_us(lambda: compiled(x, res), iters)),
            ("for scale: eager LayerNorm(x + res) computing on the CPU (CPU compute, not comparable; wall clock)",
             _host_us(lambda: model(x, res), max(1, min(iters, 200)))),
        ]
    mb = out[0].numel() * out[0].element_size() / 2**20
    print(f"CPU HOST TIME per call (no GPU here: kernels are not run, launches go to a null driver), "
          f"LayerNorm(x + res) x={'x'.join(map(str, shape))}: region of {n_in} inputs, {len(out)} output(s) "
          f"({mb:.2f} MiB); outputs from {allocator} (on CUDA: torch's caching allocator); {iters} calls per run; {len(kernel.compiled.program.launches)} kernel launch(es) per "
          f"call; {drv.launched} launches made; the first four rows and the steps: this thread's CPU time")
    for label, us in rows:
        print(f"  {us:9.2f} us  {label}")
    print(f"  region call / do-nothing op: {ours / floor:.2f}x (target: at most 1.5x); through the dispatcher: "
          f"{via_op / floor:.2f}x; op returning one torch.empty / do-nothing op: {one_empty / floor:.2f}x "
          f"(these four interleaved, fastest of {ROUNDS} runs each, this thread's CPU time)")


def cpu_dynamic(shape: tuple[int, ...], iters: int) -> None:
    """The same region compiled with ``dynamic=True`` (a generic kernel, its extents bound as
    arguments): its call as the compiled graph makes it (the thin path kept for these shapes) next
    to the do-nothing op, interleaved."""
    import torch

    from stitchtune.deploy import torch_ops
    from stitchtune.deploy.torch_region_dynamic import DynamicRegionKernel

    torch._dynamo.reset()
    model = Residual.make(shape[-1]).eval()
    x, res = torch.randn(*shape), torch.randn(*shape)
    drv = _null_driver()
    with torch_ops.stand_in_driver(drv, lambda compiled: b"FAKE cubin: host-path benchmark"), torch.no_grad():
        compiled = torch.compile(model, backend="stitchtune", dynamic=True, options={"db": None, "fallback": "eager"})
        compiled(x, res)
        keys = [k for k, g in torch_ops._registry.items() if isinstance(getattr(g, "kernel", g), DynamicRegionKernel)]
        if not keys:
            print("  (dynamic=True: no region with symbolic shapes was stitched; not measured)")
            return
        key = keys[-1]
        inputs = _region_inputs(compiled, (x, res), key)
        direct, noop = torch_ops.region_op, _noop_op().default
        direct(key, inputs)
        ours, floor = _paired_us(lambda: direct(key, inputs), lambda: noop(key, inputs), iters=iters)
    print(f"  {ours:9.2f} us  dynamic=True: the region call (generic kernel, thin path per input shapes)")
    print(f"  {floor:9.2f} us  a do-nothing torch.library custom op (interleaved with the row above)")
    print(f"  dynamic region call / do-nothing op: {ours / floor:.2f}x")


def _noop_op(name: str = "noop") -> Any:
    """``stitchtune_bench::noop(str key, Tensor[] inputs) -> Tensor[]``: a plain torch.library custom op,
    defined and implemented as ``stitchtune::region`` is, that returns no tensor (the dispatcher's floor);
    ``"empty1"``: one that takes the output's shape too and returns one ``torch.empty`` of it (the floor
    of any op that returns a new tensor)."""
    import torch

    if not _LIBS:
        lib = torch.library.Library("stitchtune_bench", "DEF")
        lib.define("noop(str key, Tensor[] inputs) -> Tensor[]")
        lib.impl("noop", lambda key, inputs: [], "CompositeExplicitAutograd")
        lib.define("empty1(str key, Tensor[] inputs, int[] shape) -> Tensor[]")
        lib.impl("empty1", lambda key, inputs, shape: [torch.empty(shape, dtype=inputs[0].dtype)],
                 "CompositeExplicitAutograd")
        _LIBS.append(lib)
    return getattr(torch.ops.stitchtune_bench, name)


_LIBS: list[Any] = []   # the Library objects must outlive the call


def _events_us(call: Any, iters: int) -> tuple[float, float]:
    """(GPU time per call from CUDA events around ``iters`` queued calls, host time per call)."""
    import torch

    for _ in range(20):
        call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    for _ in range(iters):
        call()
    end.record()
    host = (time.perf_counter() - t0) / iters * 1e6
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000.0 / iters, host


def _graphed(fn: Any, x: Any) -> Any:
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn(x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn(x)
    return g.replay


def gpu_mode(shape: tuple[int, ...], iters: int, db: str | None) -> None:
    import torch

    from stitchtune.deploy import torch_backend, torch_ops

    torch_backend.register()
    model = LayerNorm.make(shape[-1]).cuda().eval()
    x = torch.randn(*shape, device="cuda")
    rows = []
    with torch.no_grad():
        ours = torch.compile(model, backend="stitchtune", options={"db": db})
        err = (ours(x) - model(x)).abs().max().item()
        key, kernel = list(torch_ops._registry.items())[-1]
        kernel = getattr(kernel, "kernel", kernel)   # the RegionKernel inside the backend's guard
        inputs = [x, model.ln.weight, model.ln.bias]
        out = kernel.empty_outputs(x.device)
        ptrs = tuple(int(t.data_ptr()) for t in (*inputs, *out))
        stream = int(torch.cuda.current_stream().cuda_stream)
        idx = x.device.index or 0
        rows.append(("stitchtune kernel alone (packed launch, no op)",
                     *_events_us(lambda: kernel.launch_pointers(idx, ptrs, stream), iters)))
        rows.append(("stitchtune backend, per call", *_events_us(lambda: ours(x), iters)))
        rows.append(("stitchtune backend in a CUDA graph", *_events_us(_graphed(ours, x), iters)))
        rows.append(("PyTorch eager", *_events_us(lambda: model(x), iters)))
        torch._dynamo.reset()
        ind = torch.compile(model)
        rows.append(("torch.compile (Inductor default)", *_events_us(lambda: ind(x), iters)))
        torch._dynamo.reset()
        ro = torch.compile(model, mode="reduce-overhead")
        rows.append(("torch.compile mode=reduce-overhead", *_events_us(lambda: ro(x), iters)))
    print(f"GPU {torch.cuda.get_device_name()}: LayerNorm x={'x'.join(map(str, shape))}, CUDA events over {iters} "
          f"queued calls; schedule source {kernel.compiled.source}; max abs error vs eager {err:.2e}")
    print(f"  {'GPU us/call':>11}  {'host us/call':>12}  what")
    for label, gpu_us, host_us in rows:
        print(f"  {gpu_us:11.2f}  {host_us:12.2f}  {label}")
    print(f"  per-call overhead above the kernel: {rows[1][1] - rows[0][1]:.2f} us (graph: {rows[2][1] - rows[0][1]:.2f} us)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default=None, help="x's shape, e.g. 16384x1024, or several, comma-separated (default: that on a GPU; 64x256,4096x768 on the CPU: a small output and one of BERT-base's, batch 8 x 512 tokens)")
    ap.add_argument("--iters", type=int, default=1000)
    ap.add_argument("--db", default=None, help="tuning database (default: none, the heuristic schedule)")
    ap.add_argument("--cpu", action="store_true", help="time the CPU host path even where a GPU exists")
    ap.add_argument("--malloc", choices=("steady", "default"), default="steady",
                    help="CPU mode: 'steady' (default): glibc malloc without trimming or mmap, so that an "
                         "output's block is reused as CUDA's caching allocator reuses it; 'default': as it is "
                         "(a large output may be an mmap and munmap per call)")
    args = ap.parse_args(argv)
    import torch

    gpu = torch.cuda.is_available() and not args.cpu
    shapes = [tuple(int(d) for d in s.split("x")) for s in (args.shape or ("16384x1024" if gpu else "64x256,4096x768")).split(",")]
    allocator = "the CPU allocator (glibc malloc as it is, no caching)"
    if not gpu and args.malloc == "steady" and steady_malloc():
        allocator = "the CPU allocator (glibc malloc, no trimming, no mmap: freed blocks reused)"
    for shape in shapes:
        if gpu:
            gpu_mode(shape, args.iters, args.db)
        else:
            cpu_mode(shape, args.iters, allocator)
    if not gpu:
        cpu_dynamic(shapes[0], args.iters)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
