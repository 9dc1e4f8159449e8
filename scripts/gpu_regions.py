"""The ``regions`` phase of scripts/gpu_models.py: every stitched region of a model timed against
Inductor's kernels for the same ops, one row per distinct workload.

For each distinct workload (``Graph.workload_key()``) of the model's regions in a call pattern
(:func:`stitchtune.deploy.model_tuning.capture_regions`), the region's ATen ops (``TorchRegion.module``)
run on inputs made from their recorded shapes (floats random normal, ints zero, bools true) under

* ``ours``: ``torch.compile(module, backend=stitchtune)`` (heuristic schedules, no database), and
* ``inductor``: ``torch.compile(module)``,

each called ``iters`` times under the profiler (CUPTI); a variant's time is the summed device time of
its CUDA kernels per call (copies included), with the kernels' names. Beside them: ``floor_us`` (the
unique bytes of the heuristic program's launches at the device's copy bandwidth,
:func:`stitchtune.cost.features.floor_us`) and ``predicted_us`` (the fitted model's device time,
:func:`stitchtune.cost.fitted.predict_program`, the kernel audit's ``fitted`` time without the SASS facts) and
``cost_model_us`` (the analytic model the search prunes with, :func:`stitchtune.cost.model.predict` at the
estimated registers: the audit's ``predicted`` time without ptxas's registers), all PREDICTED. ``cpu=True``
(the dry run) fills only the predicted columns.

Pure parts (tested without a GPU): :func:`summarise` (profiler rows -> time per call),
:func:`region_row`, :func:`region_table`, :func:`region_inputs`.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence


def summarise(events: Iterable[tuple[str, float]], calls: int) -> dict[str, Any]:
    """Profiler rows ``(kernel name, device us)`` of ``calls`` calls -> ``{"us": per call, "kernels":
    per call, "names": distinct names in first-seen order}``."""
    evs = list(events)
    names: list[str] = []
    for n, _ in evs:
        if n not in names:
            names.append(n)
    calls = max(int(calls), 1)
    return {"us": round(sum(us for _, us in evs) / calls, 2), "kernels": round(len(evs) / calls, 2),
            "names": names}


def region_row(model: str, mode: str, region: str, workload: str, count: int, ours: dict[str, Any] | None,
               inductor: dict[str, Any] | None, floor_us: float, predicted_us: float,
               cost_model_us: float | None = None) -> dict[str, Any]:
    """One row of the phase (``ours`` / ``inductor``: :func:`summarise` results, None when not run;
    ``cost_model_us`` None: the analytic model pruned the program)."""
    row: dict[str, Any] = {"phase": "regions", "model": model, "mode": mode, "region": region,
                           "workload": workload[:12], "count": int(count), "floor_us": round(floor_us, 2),
                           "predicted_us": round(predicted_us, 2),
                           "cost_model_us": None if cost_model_us is None else round(cost_model_us, 2)}
    if ours is not None:
        row.update(ours_us=ours["us"], ours_kernels=ours["names"])
    if inductor is not None:
        row.update(inductor_us=inductor["us"], inductor_kernels=inductor["names"])
    return row


def _f(x: Any) -> str:
    return "-" if x is None else f"{float(x):.1f}"


def region_table(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The markdown table of the phase's rows (measured columns say so; floor and model are predicted)."""
    out = ["| model | mode | region | x | ours us (measured) | Inductor us (measured) | ours / Inductor | "
           "floor us (predicted) | model us (predicted) | cost model us (predicted) | note |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("phase") != "regions":
            continue
        o, i = r.get("ours_us"), r.get("inductor_us")
        ratio = f"{o / i:.2f}" if o and i else "-"
        out.append(f"| {r['model']} | {r['mode']} | {r.get('region', '')} | {r.get('count', '')} | {_f(o)} | {_f(i)} | "
                   f"{ratio} | {_f(r.get('floor_us'))} | {_f(r.get('predicted_us'))} | {_f(r.get('cost_model_us'))} | "
                   f"{str(r.get('error', ''))[:80]} |")
    return out


def region_inputs(torch: Any, module: Any, device: str) -> list[Any]:
    """Tensors for the placeholders of ``module`` (an fx GraphModule whose placeholders carry
    ``meta["val"]``): floats random normal, ints zero (valid indices), bools true."""
    out = []
    gen = torch.Generator(device="cpu").manual_seed(0)
    for node in module.graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta["val"]
        shape, dtype = tuple(int(s) for s in val.shape), val.dtype
        if dtype.is_floating_point:
            t = torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype)
        elif dtype == torch.bool:
            t = torch.ones(shape, dtype=torch.bool)
        else:
            t = torch.zeros(shape, dtype=dtype)
        out.append(t.to(device))
    return out


def _profiled(torch: Any, fn: Callable[[], Any], iters: int) -> list[tuple[str, float]]:
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():   # the region's ops alone, as the backend's inference graphs run them
        fn()   # compile and warm up
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(iters):
                fn()
            torch.cuda.synchronize()
    return [(e.name[:48], float(e.time_range.elapsed_us())) for e in prof.events()
            if str(getattr(e, "device_type", "")).endswith("CUDA")]


def regions_case(torch: Any, model: Any, args: Sequence[Any], name: str, mode: str, iters: int,
                 cpu: bool) -> list[dict[str, Any]]:
    """One row per distinct workload of ``model``'s regions called as ``mode`` (module docstring); on
    a GPU each row also carries ``fit_rows`` (:func:`gpu_fit_rows.fit_rows`, group
    ``round-<model>-<mode>-<dtype>``; empty when the profiled kernels are not the program's launches)."""
    import gpu_fit_rows

    from stitchtune.cost.features import floor_us, program_features
    from stitchtune.cost.fitted import predict_program
    from stitchtune.cost.model import predict
    from stitchtune.deploy import torch_backend
    from stitchtune.deploy.model_tuning import capture_regions
    from stitchtune.deploy.selection import heuristic_schedule
    from stitchtune.hardware.device import get_device
    from stitchtune.lower.entry import lower
    from stitchtune.lower.resources import legal_space
    from stitchtune.plan.planner import make_plan

    dev = "cpu" if cpu else "cuda"
    dtype = {"torch.bfloat16": "bf16", "torch.float16": "fp16"}.get(str(next(model.parameters()).dtype), "fp32")
    device = get_device("h200") if cpu else None
    if device is None:
        from stitchtune.gpu.device_query import default_device

        device = default_device()
    found: dict[str, list[Any]] = {}
    for r in capture_regions(model, args, "inference" if mode == "inference" else "train"):
        found.setdefault(r.graph.workload_key(), []).append(r)
    rows = []
    for key, regs in found.items():
        r = regs[0]
        try:
            plan = make_plan(r.graph)
            space = legal_space(r.graph, plan, device)
            prog = lower(r.graph, plan, heuristic_schedule(plan, device, space), device, space)
            floor, pred = floor_us(program_features(prog, device), device), predict_program(prog, device).time_us
            analytic = predict(prog.profile, device)
            ours = ind = None
            if not cpu:
                inputs = region_inputs(torch, r.module, dev)
                torch._dynamo.reset()
                ours_fn = torch.compile(r.module, backend=torch_backend.stitchtune_backend)
                ours_ev = _profiled(torch, lambda: ours_fn(*inputs), iters)
                ours = summarise(ours_ev, iters)
                torch._dynamo.reset()
                ind_fn = torch.compile(r.module)
                ind = summarise(_profiled(torch, lambda: ind_fn(*inputs), iters), iters)
            row = region_row(name, mode, r.name, key, len(regs), ours, ind, floor, pred,
                             None if analytic.prune_reason else analytic.time_us)
            if not cpu:   # the cost fit's per-kernel rows (gpu_fit_rows), when the kernels are the program's
                per = gpu_fit_rows.per_launch_us(ours_ev, [lc.kernel for lc in prog.launches], iters)
                row["fit_rows"] = [] if per is None else [
                    dict(x, device=device.key) for x in gpu_fit_rows.fit_rows(
                        f"round-{name}-{mode}-{dtype}", r.name, key, prog, device, per)]
            rows.append(row)
        except Exception as e:  # a failure is a row
            rows.append({"phase": "regions", "model": name, "mode": mode, "region": r.name, "workload": key[:12],
                         "count": len(regs), "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"})
    return rows
