"""Inductor's Triton kernels of a model's training step or inference call, generated on a CPU for a fake H200 (no GPU).

    python scripts/inductor_kernels_cpu.py [--models bert,gpt2,llama] [--call train|inference] [--out DIR]

For each model of ``scripts/gpu_models.py``'s ``time`` phase (2 layers, batch 8 x 512, fp32):

1. ``capture`` (a subprocess, the real CPU): ``torch.compile(model)`` with Inductor's own ``compile_fx``
   whose ``inner_compile`` only keeps the ATen graphs: a training step's forward and backward as
   AOTAutograd partitioned them (Inductor's decompositions, joint-graph passes and min-cut partition: what it
   would compile on a GPU), or the one graph of an inference call (``--call inference``: ``model.eval()``
   under ``torch.no_grad()``). Inductor's attention patterns are turned off: on the H200 in fp32 without TF32
   they refuse (``_sfdp_params_check``) and the eager attention's kernels run; on the CPU they would match;
2. ``codegen`` (a subprocess per graph): ``compile_fx_inner`` on that graph with fake CUDA tensors and
   ``torch.cuda`` / Triton's driver answering as an H200 (sm_90, 132 SMs); Inductor lowers, schedules,
   fuses and writes its wrapper module, then fails to import it (no CUDA in this torch): the module is
   what we read. ``benchmark_kernel`` makes every kernel carry Inductor's own bytes estimate
   (``kernel_num_gb``: each argument buffer once, an in/out buffer twice);
3. the wrapper's launch sequence parsed: per launch the kernel, its kind (pointwise / persistent /
   looped reduction), bytes, the ATen ops of its graph fragment, and whether it uses atomics.

Checked on BERT training: the 76 launches generated here are, in order, the 76 Triton kernels of the
measured H200 CUPTI trace (results/h200-2026-12-04-models/logs/time_run3.log), kind for kind; BERT
inference: 18 launches, the measured call's 18. That trace also gives an ESTIMATE for the kernels whose
times were never recorded: t = a + bytes / B fitted on BERT's non-atomic training kernels (for
``--call inference``, read from ``--fit-from``, a previous training output); atomic kernels at BERT's
measured atomic rate. BERT inference's launches also get ``measured_fw_us``: the time of the same kernel
(kind, ops, bytes within 1%) MEASURED in the training step's forward.

Fragile by design: it patches private torch / Triton APIs (torch 2.13, Triton 3.9); a CPU-only torch
build is assumed. Writes ``OUT/inductor_<model>_<call>.json`` and prints a summary. Nothing here is a
measured time except the BERT trace it is checked against.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TRACE = REPO / "results" / "h200-2026-12-04-models" / "logs" / "time_run3.log"
#: the measured Inductor totals of a training step (results/h200-2026-12-04-models/gpu_models.md)
MEASURED = {"train": {"bert": (76, 887.1), "gpt2": (67, 908.0), "llama": (48, 1038.0)},
            #: inference: Triton launches and their summed time (gpu_models.md; no per-kernel trace)
            "inference": {"bert": (18, 243.4), "gpt2": (18, 344.0), "llama": (19, 412.0)}}
#: call -> the graphs Inductor compiles for it: (index in the capture, name)
GRAPHS = {"train": ((0, "forward"), (1, "backward")), "inference": ((0, "inference"),)}
#: BERT's training launches with their measured times (this script's --call train output, s14)
FIT_FROM = REPO / "results" / "train-gap-2026-12-07-s14" / "inductor_bert_train.json"


def _medium(name: str) -> tuple[Any, tuple[Any, ...]]:
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_models", REPO / "scripts" / "gpu_models.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod._medium(name)


def capture(name: str, work: Path, call: str = "train") -> None:
    """Phase 1 (CPU): the graphs Inductor would compile for ``call``, saved: a training step's partitioned
    forward and backward, or an inference call's one graph (``model.eval()`` under ``torch.no_grad()``,
    as the GPU script times it)."""
    import torch
    from torch._functorch.aot_autograd import make_boxed_func
    from torch._inductor.compile_fx import compile_fx

    graphs: list[tuple[Any, list[Any]]] = []

    def inner(gm: Any, example_inputs: Any, **_: Any) -> Any:
        graphs.append((gm, [(tuple(t.shape), tuple(t.stride()), t.dtype) if isinstance(t, torch.Tensor) else t
                            for t in example_inputs]))
        return make_boxed_func(gm.forward)

    import torch._inductor.fx_passes.fuse_attention as fuse_attention

    # on the GPU in fp32 without TF32 Inductor keeps eager attention (its scaled-dot-product patterns refuse
    # CUDA fp32: _sfdp_params_check); on the CPU they match and would put SDPA where the H200 ran its kernels
    fuse_attention._sfdp_params_check = lambda match: False
    model, args = _medium(name)
    compiled = torch.compile(model, backend=lambda gm, ins: compile_fx(gm, ins, inner_compile=inner))
    if call == "inference":                     # scripts/gpu_models.py _step, inference
        model.eval()
        with torch.no_grad():
            compiled(*args)
    else:
        out = compiled(*args)
        hidden = out[0] if isinstance(out, tuple) else out.last_hidden_state
        (hidden.float() ** 2).mean().backward()     # the GPU script's step (scripts/gpu_models.py _step)
    torch.save([g for g, _ in graphs], work / "graphs.pt")
    torch.save([i for _, i in graphs], work / "inputs.pt")


def _fake_h200() -> None:
    """torch.cuda and Triton's driver answer as an H200; a few fake-tensor paths that need a CUDA
    device guard replaced by equivalent ones."""
    import types

    import torch

    props = types.SimpleNamespace(
        name="NVIDIA H200", major=9, minor=0, multi_processor_count=132, total_memory=140 * 2**30, warp_size=32,
        max_threads_per_multi_processor=2048, regs_per_multiprocessor=65536, shared_memory_per_block_optin=232448,
        shared_memory_per_block=49152, shared_memory_per_multiprocessor=233472, L2_cache_size=60 * 2**20,
        gcnArchName="", type="cuda", max_threads_per_block=1024, clock_rate=1980000, memory_clock_rate=3201000,
        memory_bus_width=6144, uuid="fake")
    cuda = torch.cuda
    cuda.get_device_properties = lambda *a, **k: props
    cuda.is_available = lambda: True
    cuda.device_count = lambda: 1
    cuda.current_device = lambda: 0
    cuda.get_device_capability = lambda *a, **k: (9, 0)
    cuda.get_device_name = lambda *a, **k: props.name
    cuda.get_rng_state = lambda *a, **k: torch.zeros(16, dtype=torch.uint8)
    cuda.set_rng_state = lambda *a, **k: None
    cuda._lazy_init = lambda: None
    cuda._exchange_device = lambda i: 0
    cuda._maybe_exchange_device = lambda i: 0
    cuda.set_device = lambda *a: None
    cuda.synchronize = lambda *a, **k: None

    import torch.utils._triton as tut
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    target = GPUTarget("cuda", 90, 32)
    tut.triton_backend = lambda: make_backend(target)
    tut.triton_hash_with_backend = lambda: "fake-h200"

    class _Driver:
        def get_current_target(self) -> Any:
            return target

        def get_current_device(self) -> int:
            return 0

        def get_current_stream(self, *a: Any) -> int:
            return 0

        def get_device_interface(self) -> Any:
            return torch.cuda

        def is_active(self) -> bool:
            return True

        def get_active_torch_device(self) -> Any:
            return torch.device("cuda", 0)

    sys.modules["triton.runtime.driver"].driver.set_active(_Driver())  # type: ignore[attr-defined]

    aten = torch.ops.aten

    def masked_index_put(x: Any, indices: Any, mask: Any, values: Any) -> Any:
        # torch._decomp's, with where() for masked_fill() (a CPU scalar on a fake CUDA tensor)
        if x.numel() == 0:
            return x.clone()
        indices = [None if i is None else i.clamp(min=-x.size(d), max=x.size(d) - 1) for d, i in enumerate(indices)]
        return aten._unsafe_index_put(x, indices, torch.where(mask, values, values.new_zeros(())), accumulate=True)

    from torch._decomp import decomposition_table

    decomposition_table[aten._unsafe_masked_index_put_accumulate.default] = masked_index_put
    import torch._inductor.fx_passes.reinplace as reinplace

    reinplace._inplace_generalized_scatter = lambda inp, src, view_ops: inp   # shapes only (fake)


def codegen(work: Path, index: int, call: str = "train") -> None:
    """Phase 2: graph ``index`` compiled by Inductor for the fake H200; the wrapper's path is printed."""
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(work / "inductor")
    import torch

    _fake_h200()
    import torch._inductor.config as cfg
    from torch._guards import TracingContext, tracing
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._subclasses.fake_tensor import FakeTensorMode

    cfg.compile_threads = 1
    cfg.benchmark_kernel = True
    gm = torch.load(work / "graphs.pt", weights_only=False)[index]
    inputs = torch.load(work / "inputs.pt", weights_only=False)[index]
    dev = torch.device("cuda", 0)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    for n in gm.graph.nodes:
        if "device" in n.kwargs:
            n.kwargs = {**n.kwargs, "device": dev}
        n.args = tuple(dev if isinstance(a, torch.device) else a for a in n.args)
    real = {n.target: getattr(gm, n.target) for n in gm.graph.nodes if n.op == "get_attr"}
    for n in list(gm.graph.nodes):
        t = real.get(n.target) if n.op == "get_attr" else None
        if not isinstance(t, torch.Tensor):
            continue
        if t.numel() > 4096 and bool((t == t.flatten()[0]).all()):   # a zero table folded to a constant
            with gm.graph.inserting_before(n):
                full = gm.graph.call_function(aten_full(), (list(t.shape), t.flatten()[0].item()),
                                              {"dtype": t.dtype, "device": dev, "pin_memory": False})
            n.replace_all_uses_with(full)
            continue
        with mode:
            setattr(gm, n.target, torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cuda"))
    gm.graph.eliminate_dead_code()
    gm.recompile()
    with mode:
        fake = [torch.empty_strided(i[0], i[1], dtype=i[2], device="cuda") if isinstance(i, tuple) else i
                for i in inputs]
    try:
        with tracing(TracingContext(mode)):
            compile_fx_inner(gm, fake, is_backward=call == "train" and index == 1, is_inference=call == "inference")
    except Exception as exc:  # noqa: BLE001 - expected: the wrapper module cannot import without CUDA
        m = re.search(r"get_raw_stream|_cuda_getCurrentRawStream", str(exc))
        if not m:
            raise
    wrappers = [p for p in (work / "inductor").rglob("*.py") if "def call(self, args)" in p.read_text()]
    newest = max(wrappers, key=lambda p: p.stat().st_mtime)
    print(f"WRAPPER {newest}")


def aten_full() -> Any:
    import torch

    return torch.ops.aten.full.default


def parse(path: Path) -> list[dict[str, Any]]:
    """The launches of an Inductor wrapper module, in order: kernel, kind, bytes, ops, atomics."""
    src = path.read_text()
    kernels: dict[str, dict[str, Any]] = {}
    for m in re.finditer(r"^(triton_\w+) = async_compile\.triton\('\w+', '''(.*?)''', device_str", src, re.S | re.M):
        name, body = m.group(1), m.group(2)
        head = src[src.rfind("# kernel path:", 0, m.start()):m.start()]
        ops = sorted({o for o in re.findall(r"target=torch\.ops\.(?:aten|prims)\.(\w+)\.", head)})
        gb = re.search(r"'kernel_num_gb': ([0-9.e-]+)", body)
        kind = ("persistent" if "persistent_reduction" in body else
                "reduction" if "@triton_heuristics.reduction" in body else "pointwise")
        kernels[name] = {"kernel": name, "kind": kind, "bytes": round(float(gb.group(1)) * 1e9) if gb else 0,
                         "ops": ops, "atomic": "'atomic_add_found': True" in body}
    main = src[src.index("    def call(self, args):"):]
    out = []
    for line in main.splitlines():
        m = re.match(r"\s*(triton_\w+)\.run\(", line)
        if m:
            out.append(dict(kernels[m.group(1)]))
        elif re.match(r"\s*return", line):
            break
    return out


def _fit_on_bert(bert: list[dict[str, Any]]) -> tuple[float, float, float]:
    """(a us, B bytes/us, atomic bytes/us): t = a + bytes / B least squares on BERT's measured
    non-atomic Triton kernels (aligned in order with the generated launches); atomic kernels at
    BERT's measured atomic rate (their bytes over their time summed)."""
    rows = [json.loads(line) for line in TRACE.read_text().splitlines() if line.startswith("{")]
    row = next(r for r in rows if (r.get("model"), r.get("mode"), r.get("variant")) == ("bert", "train", "inductor"))
    measured = [t for n, t in row["trace"] if n.startswith("triton_")]
    if len(measured) != len(bert):
        raise SystemExit(f"BERT: {len(bert)} generated launches, {len(measured)} measured: cannot align")
    for a, t in zip(bert, measured):
        a["measured_us"] = t
    plain = [a for a in bert if not a["atomic"]]
    n = len(plain)
    sx = sum(a["bytes"] for a in plain)
    sy = sum(a["measured_us"] for a in plain)
    sxx = sum(a["bytes"] ** 2 for a in plain)
    sxy = sum(a["bytes"] * a["measured_us"] for a in plain)
    slope = (n * sxy - sx * sy) / (n * sxx - sx * sx)
    a0 = (sy - slope * sx) / n
    atomic = [a for a in bert if a["atomic"]]
    rate = sum(a["bytes"] for a in atomic) / sum(a["measured_us"] for a in atomic)
    return a0, 1.0 / slope, rate


def _generate(name: str, call: str) -> list[dict[str, Any]]:
    """Inductor's launches of model ``name``'s ``call``, in order (phases 1-3 in subprocesses)."""
    work = Path(tempfile.mkdtemp(prefix=f"inductor-{name}-{call}-"))
    me = [sys.executable, __file__, "--work", str(work), "--call", call]
    subprocess.run(me + ["--phase", "capture", "--models", name], check=True, timeout=1200)
    launches: list[dict[str, Any]] = []
    for index, graph in GRAPHS[call]:
        res = subprocess.run(me + ["--phase", "codegen", "--index", str(index)], check=True, timeout=1200,
                             capture_output=True, text=True)
        wrapper = Path(res.stdout.strip().splitlines()[-1].split(" ", 1)[1])
        launches += [{"graph": graph, **a} for a in parse(wrapper)]
    return launches


def _same_kernel_in_training(launches: list[dict[str, Any]], bert_train: list[dict[str, Any]]) -> None:
    """BERT inference: each launch gets ``measured_fw_us``, the measured time of the training step's
    forward launch doing the same work: same kind and ATen ops, bytes within 1% (an inference kernel may add
    a bias the training forward's ``addmm`` adds: 12 KB of 101 MB); the n-th such inference launch takes
    the n-th such forward launch. None where no forward launch matches (a layer norm that does not write
    the values the backward reads: other bytes)."""
    pool: list[dict[str, Any]] = [dict(a) for a in bert_train
                                  if a["graph"] == "forward" and a.get("measured_us") is not None]
    for a in launches:
        hit = next((f for f in pool if f["kind"] == a["kind"] and f["ops"] == a["ops"]
                    and abs(f["bytes"] - a["bytes"]) <= 0.01 * a["bytes"]), None)
        a["measured_fw_us"] = hit["measured_us"] if hit is not None else None
        if hit is not None:
            pool.remove(hit)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="bert,gpt2,llama")
    ap.add_argument("--call", choices=tuple(GRAPHS), default="train",
                    help="a training step (forward + backward graphs) or an inference call (one graph)")
    ap.add_argument("--fit-from", type=Path, default=FIT_FROM,
                    help="BERT training launches with measured_us (a previous --call train output), used for "
                         "the estimate when this run does not generate BERT's training step")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--phase", choices=("capture", "codegen"), help=argparse.SUPPRESS)
    ap.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.phase == "capture":
        capture(args.models, args.work, args.call)
        return 0
    if args.phase == "codegen":
        codegen(args.work, args.index, args.call)
        return 0
    models = [m for m in args.models.split(",") if m]
    if args.call == "train" and "bert" not in models:
        models.insert(0, "bert")            # the estimate is fitted on BERT's measured trace
    found = {name: _generate(name, args.call) for name in models}
    if args.call == "train":
        bert_train = found["bert"]
        a0, bw, atomic_rate = _fit_on_bert(bert_train)
    else:
        bert_train = json.loads(args.fit_from.read_text())["launches"]
        a0, bw, atomic_rate = _fit_on_bert([{k: v for k, v in a.items() if k != "measured_us"} for a in bert_train])
    print(f"estimate (fitted on BERT's measured Triton kernels): t = {a0:.2f} us + bytes / {bw / 1e3:.0f} GB/s;"
          f" atomic kernels at {atomic_rate / 1e3:.0f} GB/s")
    for name, launches in found.items():
        for a in launches:
            a["estimated_us"] = round(a["bytes"] / atomic_rate if a["atomic"] else a0 + a["bytes"] / bw, 2)
        if name == "bert" and args.call == "inference":
            _same_kernel_in_training(launches, bert_train)
        n, total = MEASURED[args.call].get(name, (None, None))
        est = sum(a["estimated_us"] for a in launches)
        print(f"{name}: {len(launches)} launches (measured: {n}), {sum(a['bytes'] for a in launches) / 1e6:.0f} MB,"
              f" ESTIMATED {est:.0f} us (measured: {total} us)")
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            what = "one training step" if args.call == "train" else "one inference call (eval, no_grad)"
            (args.out / f"inductor_{name}_{args.call}.json").write_text(json.dumps({
                "note": f"Inductor's Triton launches of {what}, generated on a CPU for a fake H200 "
                        "(scripts/inductor_kernels_cpu.py); bytes: Inductor's kernel_num_gb; estimated_us: "
                        f"ESTIMATED, t = {a0:.2f} us + bytes / {bw / 1e3:.0f} GB/s (atomic: bytes / "
                        f"{atomic_rate / 1e3:.0f} GB/s) fitted on BERT's measured training trace; measured_us: "
                        "BERT training only (H200 CUPTI, results/h200-2026-12-04-models/logs/time_run3.log); "
                        "measured_fw_us (BERT inference): the same kernel's measured time in that training "
                        "step's forward (same kind, ops and bytes), MEASURED there, not in an inference call",
                "measured": {"launches": n, "us": total},
                "launches": launches}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
