"""Whole models under ``torch.compile(backend="stitchtune")`` on a CUDA GPU: correctness, then time.

    python scripts/gpu_models.py [--out DIR] [--budget-s 400] [--phases check,time,graphs] [--iters 20]
    python scripts/gpu_models.py --cpu --phases check --models bert,gpt2     # CPU dry run (emulated)
    python scripts/gpu_models.py --phases regions                # each region against Inductor's kernels

Two phases, each row written to ``DIR/gpu_models.jsonl`` as soon as it is known (a run cut short keeps
every finished row; runs into one DIR append), then a markdown table of every row in that file to
``DIR/gpu_models.md`` and stdout:

``graphs`` (issue 40)
    ``--time-models`` (medium size) under the backend without and with CUDA graphs
    (``options={"cudagraphs": True}``: Inductor's CUDA-graph trees capture the whole graph, the
    stitched regions included): a replay's output against eager, and the median step time of each
    (CUDA events). With ``--cpu`` a dry run of this code on the matrix's tiny models (nothing is
    captured on a CPU; wall-clock times of emulated regions, not comparable).
``tuned`` (after ``time``)
    ``--tune-models`` searched with ``stitchtune tune``'s whole-model tuning (``--trials`` in all,
    split among the regions by predicted share; the ``cuda`` backend: every trial built and measured)
    into a fresh database, then timed as in ``time`` with the backend reading it; the row says how
    many regions took a tuned schedule (``sources``).
``check``
    every model of the backend matrix (``tests/deploy/test_torch_matrix.py``: tiny transformers
    configs, random weights) on the GPU, inference (eval, no_grad) and one training step (forward +
    backward of ``mean(out**2)``); the regions launch real cubins (nvcc), the rest goes to Inductor.
    Error = max |out - eager|, and for training the gradients' max |g - g_eager| / max |g_eager|
    (the larger); regions stitched / declined / declined at run time, from the backend's reports.
``time``
    ``--time-models`` at a realistic size (2 layers; BERT/GPT-2 hidden 768, Llama hidden 1024 with
    GQA 16/4 heads; batch 8, sequence 512; fp32; dropout 0): per step, eager, Inductor
    (``torch.compile()``) and the backend (heuristic schedules: no tuning database), each the median
    of ``--iters`` steps timed with CUDA events, plus the CUDA kernels of one step seen by the
    profiler (CUPTI: every kernel on the device, matmuls and copies included), their summed device
    time and the same per maker (stitchtune ``st_*``, Inductor's Triton, matmul libraries, ATen, copies):
    a step much longer than its kernels' sum waits on the host.

``regions``
    every distinct stitched region of ``--time-models`` (the ``time`` phase's sizes) timed against
    Inductor's kernels for the same ops (:mod:`gpu_regions`): per region our device time, Inductor's,
    their ratio, the DRAM floor and the fitted cost model's prediction (both labelled predicted). With
    ``--cpu``: the matrix's tiny models, predicted columns only.

Every figure printed is measured in this run on this machine, except the ``regions`` table's floor
and model columns (labelled predicted). ``--cpu`` runs the
check phase on the CPU (regions emulated) to test this script without a GPU. Exit 0 when the script
ran (failed rows are rows), 2 for bad options.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
import gpu_timing  # noqa: E402  (scripts/, on the path above)

MATRIX = REPO / "tests" / "deploy" / "test_torch_matrix.py"
TIME_MODELS = ("bert", "gpt2", "llama")


def _matrix() -> Any:
    spec = importlib.util.spec_from_file_location("torch_matrix", MATRIX)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["torch_matrix"] = mod   # its dataclasses look their module up
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def _to(args: tuple[Any, ...], dev: str) -> tuple[Any, ...]:
    return tuple(a.to(dev) for a in args)


def _backend(torch: Any, model: Any, cpu: bool) -> Any:
    from stitchtune.deploy import torch_backend

    torch._dynamo.reset()
    torch_backend.LAST_REPORTS.clear()
    opts = {"db": None, "cpu": "emulate"} if cpu else {"db": None}
    return torch.compile(model, backend=torch_backend.stitchtune_backend, options=opts)


def _reports() -> dict[str, int]:
    from stitchtune.deploy import torch_backend

    reps = list(torch_backend.LAST_REPORTS)
    stitched = [s for r in reps for s in r.stitched]
    declined = [d for r in reps for d in r.declined if d.what.startswith("region")]
    return {"graphs": len(reps), "stitched": len(stitched), "declined": len(declined),
            "stitched_kernels": sum(s.kernels for s in stitched),
            "failed_at_run": sum(1 for d in declined if "failed at run time" in d.reason)}


def check_case(mx: Any, torch: Any, name: str, mode: str, dev: str, cpu: bool) -> dict[str, Any]:
    """One model x mode of the matrix on ``dev`` (see module docstring)."""
    torch.manual_seed(0)
    model, args = mx.MODELS[name]()
    model, args = model.to(dev), _to(args, dev)
    compiled = _backend(torch, model, cpu)
    t0 = time.perf_counter()
    if mode == "inference":
        model.eval()
        with torch.no_grad():
            got, want = mx._first(compiled(*args)), mx._first(model(*args))
        error = (got - want).abs().max().item()
    else:
        model.train()
        got = mx._first(compiled(*args))
        (got.float() ** 2).mean().backward()
        g_got = mx._grads(model)
        model.zero_grad(set_to_none=True)
        want = mx._first(model(*args))
        (want.float() ** 2).mean().backward()
        g_want = mx._grads(model)
        scale = max(g.abs().max().item() for g in g_want.values()) or 1.0
        error = max((got - want).abs().max().item(),
                    max((g_got[k] - g_want[k]).abs().max().item() for k in g_want) / scale)
    row = {"phase": "check", "model": name, "mode": mode, "error": error, "ok": error <= mx.TOL,
           "seconds": round(time.perf_counter() - t0, 2)}
    row.update(_reports())
    row["ok"] = bool(row["ok"] and row["stitched"] > 0 and row["failed_at_run"] == 0)
    return row


def _medium(name: str) -> tuple[Any, tuple[Any, ...]]:
    import torch
    import transformers as tf

    torch.manual_seed(0)
    common = dict(num_hidden_layers=2, vocab_size=32000, max_position_embeddings=1024)
    if name == "bert":
        cfg = tf.BertConfig(hidden_size=768, num_attention_heads=12, intermediate_size=3072,
                            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **common)
        model = tf.BertModel(cfg)
    elif name == "gpt2":
        cfg = tf.GPT2Config(n_embd=768, n_layer=2, n_head=12, vocab_size=32000, n_positions=1024,
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
        model = tf.GPT2Model(cfg)
    elif name == "llama":
        cfg = tf.LlamaConfig(hidden_size=1024, num_attention_heads=16, num_key_value_heads=4,
                             intermediate_size=2816, **common)
        model = tf.LlamaModel(cfg)
    else:
        raise ValueError(name)
    cfg._attn_implementation = "eager"
    if hasattr(cfg, "use_cache"):
        cfg.use_cache = False
    return model, (torch.randint(0, 32000, (8, 512)),)


def _step(mx: Any, torch: Any, fn: Any, model: Any, args: tuple[Any, ...], mode: str) -> Any:
    def run() -> None:
        if mode == "inference":
            with torch.no_grad():
                fn(*args)
        else:
            model.zero_grad(set_to_none=True)
            (mx._first(fn(*args)).float() ** 2).mean().backward()
    return run


def _median_us(torch: Any, run: Any, iters: int) -> float:
    """Median device microseconds of ``run`` from CUDA events (:func:`gpu_timing.event_times_us`)."""
    return gpu_timing.median(gpu_timing.event_times_us(run, iters, cuda=torch.cuda))


def _kind(name: str) -> str:
    """A CUDA kernel's maker, from its name: ``stitchtune`` (``st_*``), ``inductor`` (Triton),
    ``matmul`` (cuBLAS / CUTLASS), ``copy`` (memcpy / memset), else ``aten``."""
    low = name.lower()
    if name.startswith("st_"):
        return "stitchtune"
    if low.startswith("triton") or "triton_" in low:
        return "inductor"
    if any(k in low for k in ("gemm", "cutlass", "nvjet", "xmma", "cublas", "sm90_", "sm80_")):
        return "matmul"
    if name.startswith(("Memcpy", "Memset")):
        return "copy"
    return "aten"


def _kernels(torch: Any, run: Any) -> dict[str, Any]:
    """One step under the profiler: CUDA kernels (copies apart) and their summed device time (us),
    in all and per maker (:func:`_kind`), and each kernel (name, us) in start order (``trace``)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    evs = [e for e in prof.events() if str(getattr(e, "device_type", "")).endswith("CUDA")]
    n: dict[str, int] = {}
    us: dict[str, float] = {}
    for e in evs:
        k = _kind(e.name)
        n[k] = n.get(k, 0) + 1
        us[k] = us.get(k, 0.0) + e.time_range.elapsed_us()
    order = sorted(evs, key=lambda e: e.time_range.start)
    return {"trace": [[e.name[:48], round(e.time_range.elapsed_us(), 1)] for e in order],
            "kernels": len(evs) - n.get("copy", 0), "memcpy_memset": n.get("copy", 0),
            "kernel_us": round(sum(us.values()), 1), "by_maker": {k: [n[k], round(us[k], 1)] for k in sorted(n)}}


def time_case(mx: Any, torch: Any, name: str, mode: str, iters: int) -> list[dict[str, Any]]:
    """Eager, Inductor and the backend for model ``name`` (medium size) in ``mode``: one row each."""
    rows = []
    model, args = _medium(name)
    model, args = model.cuda(), _to(args, "cuda")
    model.train(mode == "train")
    for variant in ("eager", "inductor", "stitchtune"):
        row: dict[str, Any] = {"phase": "time", "model": name, "mode": mode, "variant": variant}
        t0 = time.perf_counter()
        try:
            torch._dynamo.reset()
            fn = (model if variant == "eager" else torch.compile(model) if variant == "inductor"
                  else _backend(torch, model, cpu=False))
            run = _step(mx, torch, fn, model, args, mode)
            run()  # compile
            row["compile_s"] = round(time.perf_counter() - t0, 1)
            row["median_us"] = round(_median_us(torch, run, iters), 1)
            row.update(_kernels(torch, run))
            if variant == "stitchtune":
                row.update(_reports())
        except Exception as e:  # a failure is a row
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
            row["trace_tail"] = traceback.format_exc().splitlines()[-4:]
        rows.append(row)
    return rows


def _host_median_us(run: Any, iters: int) -> float:
    """Median wall-clock microseconds of ``run`` (the CPU dry run's stand-in for CUDA events)."""
    return gpu_timing.median(gpu_timing.host_times_us(run, iters))


def graphs_case(mx: Any, torch: Any, name: str, mode: str, iters: int, cpu: bool) -> list[dict[str, Any]]:
    """Phase ``graphs``: model ``name`` (medium size; the matrix's tiny one with ``--cpu``) under the
    backend without and with CUDA graphs (``options={"cudagraphs": True}``, what ``mode="reduce-overhead"``
    turns on): after compiling, warming up and recording, one more call (a replay) is compared with
    eager (max |out - eager|), then each variant's step is timed (CUDA events; wall clock on the CPU,
    where nothing is captured: a dry run of this code only)."""
    from stitchtune.deploy import torch_backend

    torch.manual_seed(0)
    model, args = mx.MODELS[name]() if cpu else _medium(name)
    dev = "cpu" if cpu else "cuda"
    model, args = model.to(dev), _to(args, dev)
    model.train(mode == "train")
    with torch.no_grad():
        want = mx._first(model(*args)).float().clone()
    rows = []
    for variant, extra in (("stitchtune", {}), ("stitchtune+cudagraphs", {"cudagraphs": True})):
        row: dict[str, Any] = {"phase": "graphs", "model": name, "mode": mode, "variant": variant}
        t0 = time.perf_counter()
        try:
            torch._dynamo.reset()
            torch_backend.LAST_REPORTS.clear()
            opts = {"db": None, **({"cpu": "emulate"} if cpu else {}), **extra}
            fn = torch.compile(model, backend=torch_backend.stitchtune_backend, options=opts)
            run = _step(mx, torch, fn, model, args, mode)
            for _ in range(3):   # compile, warm up, record
                run()
            with torch.no_grad():
                got = mx._first(fn(*args)).float().clone()   # a replay (its buffers are the graph's)
            row["error"] = (got - want).abs().max().item()
            row["ok"] = row["error"] <= (mx.TOL if cpu else 1e-3)
            row["compile_s"] = round(time.perf_counter() - t0, 1)
            row["median_us"] = round(_host_median_us(run, iters) if cpu else _median_us(torch, run, iters), 1)
            row.update(_reports())
        except Exception as e:  # a failure is a row
            row["ok"] = False
            row["exception"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
            row["trace_tail"] = traceback.format_exc().splitlines()[-4:]
        rows.append(row)
    return rows


def tuned_case(mx: Any, torch: Any, name: str, mode: str, trials: int, cpu: bool) -> dict[str, Any]:
    """``stitchtune tune``'s whole-model search (``tune_model``, ``trials`` in all, the call pattern of
    ``mode``) into a fresh database, then the backend reading it: the step timed as in ``time``
    (GPU), or run once (``cpu``: a tiny matrix model, the emulate backend)."""
    import os
    import tempfile

    from stitchtune.deploy.model_tuning import tune_model

    model, args = mx.MODELS[name]() if cpu else _medium(name)
    dev = "cpu" if cpu else "cuda"
    model, args = model.to(dev), _to(args, dev)
    row: dict[str, Any] = {"phase": "tuned", "model": name, "mode": mode, "variant": "stitchtune-tuned",
                           "trials": trials}
    db = tempfile.mkdtemp(prefix="gpu-models-db-")
    t0 = time.perf_counter()
    lines: list[str] = []
    tune_model(model, args, trials=trials, db=db, backend="emulate" if cpu else "cuda", jobs=os.cpu_count() or 1,
               calls=(mode,), say=lambda line: (lines.append(line), print(line, flush=True)))
    row["tune_s"] = round(time.perf_counter() - t0, 1)
    row["tune_lines"] = lines   # per region: predicted, heuristic -> best (measured on the GPU)
    from stitchtune.deploy import torch_backend

    torch._dynamo.reset()
    torch_backend.LAST_REPORTS.clear()
    fn = torch.compile(model, backend=torch_backend.stitchtune_backend,
                       options={"db": db, **({"cpu": "emulate"} if cpu else {})})
    model.train(mode == "train")
    run = _step(mx, torch, fn, model, args, mode)
    run()
    if not cpu:
        row["median_us"] = round(_median_us(torch, run, 20), 1)
        row.update(_kernels(torch, run))
    row.update(_reports())
    sources = [s.source for r in torch_backend.LAST_REPORTS for s in r.stitched]
    row["sources"] = {k: sources.count(k) for k in sorted(set(sources))}
    return row


def regions_job(mx: Any, torch: Any, name: str, mode: str, iters: int, cpu: bool) -> list[dict[str, Any]]:
    """The ``regions`` phase for model ``name`` in ``mode`` (:func:`gpu_regions.regions_case`)."""
    import gpu_regions

    model, args = mx.MODELS[name]() if cpu else _medium(name)
    dev = "cpu" if cpu else "cuda"
    model, args = model.to(dev), _to(args, dev)
    return gpu_regions.regions_case(torch, model, args, name, mode, iters, cpu)


def _note(r: dict[str, Any]) -> str:
    if "error" in r:
        return str(r["error"])[:120]
    if r["phase"] == "tuned":
        return f"{r['trials']} trials tuned in {r['tune_s']} s; schedules {r.get('sources', {})}"
    return ""


def table(rows: list[dict[str, Any]]) -> list[str]:
    out = ["| model | mode | ok | error | stitched | declined | failed at run | stitched kernels | s |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["phase"] == "check":
            if "exception" in r:
                out.append(f"| {r['model']} | {r['mode']} | FAIL | {r['exception'][:80]} | | | | | |")
            else:
                out.append(f"| {r['model']} | {r['mode']} | {'pass' if r['ok'] else 'FAIL'} | {r['error']:.1e} | "
                           f"{r['stitched']} | {r['declined']} | {r['failed_at_run']} | {r['stitched_kernels']} | "
                           f"{r['seconds']} |")
    graphed = [r for r in rows if r["phase"] == "graphs"]
    if graphed:
        out += ["", "| model | mode | variant | ok | replay vs eager | median us/step | stitched | compile s | note |",
                "|---|---|---|---|---|---|---|---|---|"]
        for r in graphed:
            err = f"{r['error']:.1e}" if "error" in r else ""
            out.append(f"| {r['model']} | {r['mode']} | {r['variant']} | {'pass' if r.get('ok') else 'FAIL'} | {err} | "
                       f"{r.get('median_us', '')} | {r.get('stitched', '')} | {r.get('compile_s', '')} | "
                       f"{r.get('exception', '')[:100]} |")
    timed = [r for r in rows if r["phase"] in ("time", "tuned")]
    if timed:
        out += ["", "| model | mode | variant | median us/step | CUDA kernels/step | memcpy+memset | "
                    "kernel us (sum) | per maker: kernels, us | compile s | note |",
                "|---|---|---|---|---|---|---|---|---|---|"]
        for r in timed:
            makers = "; ".join(f"{k} {v[0]}, {v[1]:.0f}" for k, v in r.get("by_maker", {}).items())
            out.append(f"| {r['model']} | {r['mode']} | {r['variant']} | {r.get('median_us', '')} | "
                       f"{r.get('kernels', '')} | {r.get('memcpy_memset', '')} | {r.get('kernel_us', '')} | {makers} | "
                       f"{r.get('compile_s', '')} | {_note(r)} |")
    if any(r["phase"] == "regions" for r in rows):
        import gpu_regions

        out += [""] + gpu_regions.region_table(rows)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gpu_models_out")
    ap.add_argument("--budget-s", type=float, default=400.0)
    ap.add_argument("--phases", default="check,time")
    ap.add_argument("--models", default="", help="check phase: comma-separated matrix models (default all)")
    ap.add_argument("--time-models", default=",".join(TIME_MODELS))
    ap.add_argument("--modes", default="inference,train")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--tune-models", default="bert", help="phase tuned: models tuned, then timed")
    ap.add_argument("--trials", type=int, default=48, help="phase tuned: trials per model, all regions together")
    ap.add_argument("--cpu", action="store_true", help="dry run on the CPU (regions emulated; check phase only)")
    a = ap.parse_args(argv)
    import torch

    mx = _matrix()
    phases = [p for p in a.phases.split(",") if p]
    models = [m for m in a.models.split(",") if m] or list(mx.MODELS)
    modes = [m for m in a.modes.split(",") if m]
    bad = ([p for p in phases if p not in ("check", "time", "tuned", "regions", "graphs")]
           + [m for m in models if m not in mx.MODELS]
           + [m for m in modes if m not in ("inference", "train")]
           + [m for m in a.time_models.split(",") if m and m not in (mx.MODELS if a.cpu else TIME_MODELS)]
           + [m for m in a.tune_models.split(",") if m and m not in (mx.MODELS if a.cpu else TIME_MODELS)])
    check = gpu_timing.options_only()
    if bad or (a.cpu and "time" in phases) or (not a.cpu and not check and not torch.cuda.is_available()):
        print(f"gpu_models: bad options {bad or ''} (time needs a GPU; without one pass --cpu)", file=sys.stderr)
        return 2
    if check:
        print("gpu_models: options ok")
        return 0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    log = (out / "gpu_models.jsonl").open("a")
    start, rows = time.monotonic(), []
    dev = "cpu" if a.cpu else "cuda"
    if not a.cpu:
        print(f"device: {torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)

    def emit(row: dict[str, Any]) -> None:
        rows.append(row)
        log.write(json.dumps(row) + "\n")
        log.flush()
        print(json.dumps(row), flush=True)

    jobs: list[tuple[str, str, str]] = []
    if "check" in phases:
        jobs += [("check", m, mode) for m in models for mode in modes]
    if "time" in phases:
        jobs += [("time", m, mode) for m in a.time_models.split(",") if m for mode in modes]
    if "tuned" in phases:
        jobs += [("tuned", m, mode) for m in a.tune_models.split(",") if m for mode in modes]
    if "regions" in phases:
        jobs += [("regions", m, mode) for m in a.time_models.split(",") if m for mode in modes]
    if "graphs" in phases:
        jobs += [("graphs", m, mode) for m in a.time_models.split(",") if m for mode in modes]
    for phase, m, mode in jobs:
        if time.monotonic() - start > a.budget_s:
            emit({"phase": phase, "model": m, "mode": mode, "skipped": "budget spent"})
            continue
        try:
            if phase == "check":
                emit(check_case(mx, torch, m, mode, dev, a.cpu))
            elif phase == "tuned":
                emit(tuned_case(mx, torch, m, mode, a.trials, a.cpu))
            elif phase == "regions":
                for r in regions_job(mx, torch, m, mode, a.iters, a.cpu):
                    emit(r)
            elif phase == "graphs":
                for r in graphs_case(mx, torch, m, mode, a.iters, a.cpu):
                    emit(r)
            else:
                for r in time_case(mx, torch, m, mode, a.iters):
                    emit(r)
        except Exception as e:  # a failure is a row
            emit({"phase": phase, "model": m, "mode": mode, "ok": False,
                  "exception": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}",
                  "trace_tail": traceback.format_exc().splitlines()[-6:]})
    log.close()
    every = [json.loads(x) for x in (out / "gpu_models.jsonl").read_text().splitlines() if x.strip()]
    lines = table([r for r in every if "skipped" not in r])   # this run's rows and earlier runs' into DIR
    (out / "gpu_models.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"total {time.monotonic() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
