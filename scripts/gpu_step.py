"""Issue 44's per-region, per-step and decode tables, in fp32 and bf16 (the GPU round's phases 2-3).

    python scripts/gpu_step.py --phases regions,steps,decode [--models bert,gpt2,llama] [--dtypes fp32,bf16]
                               [--modes inference,train] [--iters 20] [--budget-s 300] --out DIR
    python scripts/gpu_step.py --cpu --phases regions,steps,decode --out DIR    # dry run, tiny models

Every row goes to ``DIR/gpu_step.jsonl`` as soon as it is known (a run cut short keeps what finished;
runs into one DIR append), and the tables of every row in that file to ``DIR/gpu_step.md``.

``regions``
    :func:`gpu_regions.regions_case` on the medium models (``gpu_models._medium``: 2 layers, batch
    8 x 512) cast to ``dtype``: per distinct stitched region our device time (heuristic schedules, no
    database) beside Inductor's kernels for the same ops (both MEASURED, CUPTI), the DRAM floor and
    the fitted cost model's time (both PREDICTED, for the heuristic program). Each launch's measured
    device time also becomes a cost-fit row in ``DIR/fit_rows.jsonl`` (scripts/gpu_fit_rows.py).
``steps``
    One step (inference under no_grad, or forward + backward of ``mean(out**2)``) per variant:
    ``eager``, ``inductor`` (``torch.compile()``), ``inductor-ro`` (``mode="reduce-overhead"``),
    ``stitchtune`` (heuristic schedules) and ``stitchtune+cg`` (``options={"cudagraphs": True}``):
    median us per step (CUDA events), the kernels of one step under the profiler and their summed
    device time split into ``matmul_us`` (cuBLAS / CUTLASS) and ``membound_us`` (everything else but
    copies: the memory-bound share), and ``gap_us`` = step - summed kernel time (host time the device
    waited; negative where kernels overlap). The tuned step is gpu_models.py's ``tuned`` phase.
``decode``
    A batch-1 greedy decode with a ``DynamicCache`` (decode_matrix's tiny GPT-2 / Llama configs): a
    ``--prompt``-token prompt, then ``--decode-steps`` single-token steps, per variant ``eager``,
    ``inductor`` and ``stitchtune`` (both ``dynamic=True``): the median wall-clock us per token step
    (synchronised; at batch 1 the host path is the cost) and whether the tokens equal eager's.

``--cpu``: the same code on the CPU with the backend's regions emulated and the matrix's tiny models
(regions: predicted columns only; steps: ``eager`` and ``stitchtune`` only, wall clock; decode: eager
and stitchtune): a dry run of the orchestration, every time labelled ``cpu wall (dry run)``, never a
GPU figure. Exit 0 when it ran (a failure is a row), 2 for bad options.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

MODELS = ("bert", "gpt2", "llama")
DTYPES = ("fp32", "bf16")
STEP_VARIANTS = ("eager", "inductor", "inductor-ro", "stitchtune", "stitchtune+cg")
#: the step variants whose per-kernel trace (name, device us in start order) a row keeps: ours (cost-fit rows) and
#: Inductor's default (results/l2-2026-12-07-s14 checks the L2 estimate on both makers' in-model kernel times)
TRACED = ("inductor", "stitchtune", "stitchtune+cg")
DECODE_MODELS = ("gpt2", "llama")


def _err(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"


def _model(gm: Any, mx: Any, torch: Any, name: str, dtype: str, cpu: bool) -> tuple[Any, tuple[Any, ...]]:
    """The medium model (GPU) or the matrix's tiny one (``cpu``), on its device, cast to ``dtype``."""
    torch.manual_seed(0)
    model, args = mx.MODELS[name]() if cpu else gm._medium(name)
    dev = "cpu" if cpu else "cuda"
    model = model.to(dev)
    if dtype == "bf16":
        model = model.to(torch.bfloat16)
    return model, tuple(a.to(dev) for a in args)


def _compile(torch: Any, model: Any, variant: str, cpu: bool, dynamic: bool | None = None) -> Any:
    from stitchtune.deploy import torch_backend

    torch._dynamo.reset()
    torch_backend.LAST_REPORTS.clear()
    if variant == "eager":
        return model
    if variant == "inductor":
        return torch.compile(model, dynamic=dynamic)
    if variant == "inductor-ro":
        return torch.compile(model, mode="reduce-overhead", dynamic=dynamic)
    opts: dict[str, Any] = {"db": None, **({"cpu": "emulate"} if cpu else {})}
    if variant == "stitchtune+cg":
        opts["cudagraphs"] = True
    return torch.compile(model, backend=torch_backend.stitchtune_backend, options=opts, dynamic=dynamic)


def split_kernels(k: dict[str, Any], median_us: float | None) -> dict[str, Any]:
    """``gpu_models._kernels`` output -> matmul / memory-bound device us and the host gap (pure)."""
    by = k.get("by_maker", {})
    matmul = float(by.get("matmul", [0, 0.0])[1])
    copy = float(by.get("copy", [0, 0.0])[1])
    total = float(k.get("kernel_us", 0.0))
    out = {"matmul_us": round(matmul, 1), "membound_us": round(total - matmul - copy, 1)}
    if median_us is not None:
        out["gap_us"] = round(median_us - total, 1)
    return out


def step_rows(gm: Any, mx: Any, torch: Any, name: str, dtype: str, mode: str, iters: int,
              cpu: bool) -> Iterator[dict[str, Any]]:
    """Phase ``steps`` for one model x dtype x mode: one row per variant, each as soon as it is
    known (module docstring)."""
    model, args = _model(gm, mx, torch, name, dtype, cpu)
    model.train(mode == "train")
    for variant in (("eager", "stitchtune") if cpu else STEP_VARIANTS):
        row: dict[str, Any] = {"phase": "steps", "model": name, "dtype": dtype, "mode": mode, "variant": variant,
                               "timing": "cpu wall (dry run)" if cpu else "cuda events (measured)"}
        t0 = time.perf_counter()
        try:
            fn = _compile(torch, model, variant, cpu)
            run = gm._step(mx, torch, fn, model, args, mode)
            run()
            row["compile_s"] = round(time.perf_counter() - t0, 1)
            row["median_us"] = round(gm._host_median_us(run, iters) if cpu else gm._median_us(torch, run, iters), 1)
            if not cpu:
                k = gm._kernels(torch, run)
                if variant not in TRACED:   # per-kernel traces kept: fit data and the L2 estimate's check
                    k.pop("trace", None)
                row.update(k)
                row.update(split_kernels(k, row["median_us"]))
            if variant.startswith("stitchtune"):
                row.update(gm._reports())
        except Exception as e:  # a failure is a row
            row["error"] = _err(e)
            row["trace_tail"] = traceback.format_exc().splitlines()[-4:]
        yield row


def region_rows(gm: Any, mx: Any, torch: Any, name: str, dtype: str, mode: str, iters: int,
                cpu: bool) -> list[dict[str, Any]]:
    """Phase ``regions`` for one model x dtype x mode (:func:`gpu_regions.regions_case`)."""
    import gpu_regions

    model, args = _model(gm, mx, torch, name, dtype, cpu)
    rows = gpu_regions.regions_case(torch, model, args, name, mode, iters, cpu)
    for r in rows:
        r["dtype"] = dtype
    return rows


def _greedy(torch: Any, fn: Any, prompt: Any, steps: int, dev: str) -> tuple[list[int], list[float]]:
    """Greedy tokens and the wall-clock us of each single-token step (synchronised)."""
    import transformers as tf

    cache = tf.DynamicCache()
    ids, out, times = prompt, [], []
    for i in range(steps + 1):
        t0 = time.perf_counter()
        logits = fn(input_ids=ids, past_key_values=cache, use_cache=True).logits
        tok = int(logits[0, -1].argmax())   # .item() synchronises
        if i > 0:
            times.append((time.perf_counter() - t0) * 1e6)
        out.append(tok)
        ids = torch.tensor([[tok]], device=dev)
    return out, times


def decode_rows(torch: Any, name: str, prompt_len: int, steps: int, cpu: bool) -> Iterator[dict[str, Any]]:
    """Phase ``decode`` for one tiny model: eager, Inductor and the backend (module docstring)."""
    import decode_matrix

    dev = "cpu" if cpu else "cuda"
    torch.manual_seed(0)
    model = decode_matrix.make_model(name, max_len=prompt_len + 2 * steps + 8).to(dev).eval()
    prompt = torch.randint(0, decode_matrix.VOCAB, (1, prompt_len),
                           generator=torch.Generator().manual_seed(1)).to(dev)
    want = None
    for variant in (("eager", "stitchtune") if cpu else ("eager", "stitchtune", "inductor")):   # the backend first
        row: dict[str, Any] = {"phase": "decode", "model": name, "dtype": "fp32", "mode": "decode b1",
                               "variant": variant, "prompt": prompt_len, "steps": steps,
                               "timing": "cpu wall (dry run)" if cpu else "wall clock, synchronised (measured)"}
        try:
            t0 = time.perf_counter()
            fn = _compile(torch, model, variant, cpu, dynamic=None if variant == "eager" else True)
            with torch.no_grad():
                _greedy(torch, fn, prompt, steps, dev)   # compile every shape the run meets
                row["compile_s"] = round(time.perf_counter() - t0, 1)
                got, times = _greedy(torch, fn, prompt, steps, dev)
            want = got if variant == "eager" else want
            row["tokens_equal"] = got == want
            row["median_us"] = round(statistics.median(times), 1) if times else None
        except Exception as e:  # a failure is a row
            row["error"] = _err(e)
            row["trace_tail"] = traceback.format_exc().splitlines()[-4:]
        yield row


def _f(x: Any) -> str:
    return "-" if x is None or x == "" else f"{float(x):.1f}"


def tables(rows: list[dict[str, Any]]) -> list[str]:
    """Markdown tables of the rows: regions (gpu_regions' table with the dtype), steps, decode (pure)."""
    import gpu_regions

    out: list[str] = []
    regs = [dict(r, mode=f"{r['mode']} {r.get('dtype', '')}".strip()) for r in rows if r.get("phase") == "regions"]
    if regs:
        out += ["## Per region", ""] + gpu_regions.region_table(regs) + [""]
    steps = [r for r in rows if r.get("phase") == "steps"]
    if steps:
        out += ["## Per step", "",
                "| model | dtype | mode | variant | us/step | kernels | kernel us | matmul us | memory-bound us | "
                "host gap us | stitched | compile s | timing / note |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in steps:
            out.append(f"| {r['model']} | {r['dtype']} | {r['mode']} | {r['variant']} | {_f(r.get('median_us'))} | "
                       f"{r.get('kernels', '-')} | {_f(r.get('kernel_us'))} | {_f(r.get('matmul_us'))} | "
                       f"{_f(r.get('membound_us'))} | {_f(r.get('gap_us'))} | {r.get('stitched', '-')} | "
                       f"{r.get('compile_s', '-')} | {str(r.get('error', r.get('timing', '')))[:90]} |")
        out.append("")
    dec = [r for r in rows if r.get("phase") == "decode"]
    if dec:
        out += ["## Decode (batch 1, KV cache)", "",
                "| model | variant | us/token step | tokens equal eager | compile s | timing / note |",
                "|---|---|---|---|---|---|"]
        for r in dec:
            out.append(f"| {r['model']} | {r['variant']} | {_f(r.get('median_us'))} | {r.get('tokens_equal', '-')} | "
                       f"{r.get('compile_s', '-')} | {str(r.get('error', r.get('timing', '')))[:90]} |")
    return out


def _guarded(job: Callable[[], Iterable[dict[str, Any]]], phase: str, key: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """``job()``'s rows; an exception (before or between rows) ends the job as one more row."""
    try:
        yield from job()
    except Exception as e:  # a failure is a row
        yield {"phase": phase, **key, "error": _err(e), "trace_tail": traceback.format_exc().splitlines()[-6:]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gpu_step_out")
    ap.add_argument("--phases", default="regions,steps,decode")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--modes", default="inference,train")
    ap.add_argument("--decode-models", default=",".join(DECODE_MODELS))
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--decode-steps", type=int, default=32)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--budget-s", type=float, default=300.0)
    ap.add_argument("--cpu", action="store_true", help="dry run on the CPU (tiny models, emulated regions)")
    try:
        a = ap.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    split = lambda s: [x for x in s.split(",") if x]   # noqa: E731
    phases, models, dtypes, modes = split(a.phases), split(a.models), split(a.dtypes), split(a.modes)
    bad = ([p for p in phases if p not in ("regions", "steps", "decode")] + [m for m in models if m not in MODELS]
           + [d for d in dtypes if d not in DTYPES] + [m for m in modes if m not in ("inference", "train")]
           + [m for m in split(a.decode_models) if m not in DECODE_MODELS])
    import gpu_timing
    import torch

    check = gpu_timing.options_only()
    if bad or a.iters < 1 or a.decode_steps < 1 or (not a.cpu and not check and not torch.cuda.is_available()):
        print(f"gpu_step: error: bad options {bad or ''} (without a GPU pass --cpu)", file=sys.stderr)
        return 2
    if check:
        print("gpu_step: options ok")
        return 0
    import gpu_models as gm

    mx = gm._matrix()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "gpu_step.jsonl"
    start = time.monotonic()
    if not a.cpu:
        print(f"device: {torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
    jobs: list[tuple[str, Callable[[], Iterable[dict[str, Any]]], dict[str, Any]]] = []
    for phase in phases:   # in the order asked: the most valuable first
        if phase == "decode":
            for m in split(a.decode_models):
                jobs.append((phase, lambda m=m: decode_rows(torch, m, a.prompt, a.decode_steps, a.cpu), {"model": m}))
            continue
        fn = region_rows if phase == "regions" else step_rows
        for d in dtypes:
            for m in models:
                for mode in modes:
                    jobs.append((phase, lambda fn=fn, m=m, d=d, mode=mode: fn(gm, mx, torch, m, d, mode, a.iters, a.cpu),
                                 {"model": m, "dtype": d, "mode": mode}))
    with path.open("a") as log, (out / "fit_rows.jsonl").open("a") as fit_log:
        for phase, job, key in jobs:
            t0 = time.monotonic()
            if t0 - start > a.budget_s:
                got: Iterable[dict[str, Any]] = [{"phase": phase, **key, "skipped": "budget spent"}]
            else:
                got = _guarded(job, phase, key)
            for r in got:   # each row written as it comes: a run killed mid-job keeps the rows before
                r.setdefault("job_s", round(time.monotonic() - t0, 1))
                fits = r.pop("fit_rows", None)   # the cost fit's per-kernel rows (gpu_fit_rows)
                if fits is not None:
                    r["fit_rows_n"] = len(fits)
                    fit_log.writelines(json.dumps(x) + "\n" for x in fits)
                    fit_log.flush()
                log.write(json.dumps(r) + "\n")
                log.flush()
                print(json.dumps(r), flush=True)
                every = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
                (out / "gpu_step.md").write_text("\n".join(tables([r for r in every if "skipped" not in r])) + "\n")
    print((out / "gpu_step.md").read_text())
    print(f"total {time.monotonic() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
