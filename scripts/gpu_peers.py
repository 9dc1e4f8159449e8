"""Native peers on the full-size examples (issue 44 item 4): PyTorch's own fused ops beside the backend.

    python scripts/gpu_peers.py --out DIR [--ops layer_norm,rms_norm,softmax,cross_entropy] [--dtypes fp32,bf16]
                                [--sizes full,small] [--iters 50] [--budget-s 90]
    python scripts/gpu_peers.py --cpu --out DIR        # dry run: tiny shapes, CPU wall clock

Each op runs on its full-size example's shapes (examples/layernorm.json 16384x1024, rmsnorm.json
16384x4096, softmax.json 98304x512, cross_entropy.json 8192x32000 logits; ``F.cross_entropy`` takes
int64 labels where the graph takes the target logit) as a one-op ``nn.Module``, and at ``small`` size
(8 rows of the same width: a batch-1 decode step's shape, where launch overhead dominates), per variant:

* ``native``: ``F.layer_norm`` / ``F.rms_norm`` / ``F.softmax`` / ``F.cross_entropy`` eager;
* ``native+graph``: the same captured once in a CUDA graph and replayed (launch overhead removed);
* ``inductor``: ``torch.compile(module)``; ``stitchtune`` / ``stitchtune+cg``: the backend (heuristic
  schedules, no database) without and with ``options={"cudagraphs": True}`` (``stitched``: the regions
  it stitched; 0 means Inductor ran the op);
* ``liger`` / ``quack``: Liger-Kernel's and QuACK's functions where they import (a row says when not).

Times are medians of ``--iters`` calls, each between two CUDA events (MEASURED). Beside them: the
output's max |error| against ``native`` in fp32, and the DRAM floor = unique bytes read + written /
this run's measured device copy bandwidth (PREDICTED: a bound, not a kernel). Rows go to
``DIR/gpu_peers.jsonl`` as they come, the table to ``DIR/gpu_peers.md``. ``--cpu``: tiny shapes on the
CPU, wall clock, labelled dry run. Exit 0 when it ran (a failure is a row), 2 for bad options.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
import gpu_timing  # noqa: E402  (scripts/, on the path above)

#: op -> (example file, its input shape (rows, cols))
OPS = {"layer_norm": ("layernorm.json", (16384, 1024)), "rms_norm": ("rmsnorm.json", (16384, 4096)),
       "softmax": ("softmax.json", (98304, 512)), "cross_entropy": ("cross_entropy.json", (8192, 32000))}
DTYPES = ("fp32", "bf16")
SIZES = ("full", "small")
#: rows of the ``small`` size: one decode step of a batch of 8 sequences
SMALL_ROWS = 8
VARIANTS = ("native", "native+graph", "inductor", "stitchtune", "stitchtune+cg", "liger", "quack")


def unique_bytes(op: str, rows: int, cols: int, elem: int) -> int:
    """Bytes one call must read and write at least (pure): x (and y where the op writes one), weights."""
    if op == "cross_entropy":
        return rows * cols * elem + rows * 8 + 4   # logits, int64 labels, the scalar loss
    weights = {"layer_norm": 2, "rms_norm": 1, "softmax": 0}[op] * cols * elem
    return 2 * rows * cols * elem + weights


def make_case(torch: Any, op: str, rows: int, cols: int, dtype: Any, dev: str) -> tuple[Any, tuple[Any, ...]]:
    """The one-op module and its inputs (seeded)."""
    F = torch.nn.functional
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(rows, cols, generator=g).to(dtype).to(dev)

    class One(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.rand(cols, generator=g).to(dtype).to(dev) + 0.5)
            self.b = torch.nn.Parameter(torch.randn(cols, generator=g).to(dtype).to(dev))

        def forward(self, x: Any, *rest: Any) -> Any:
            if op == "layer_norm":
                return F.layer_norm(x, (cols,), self.w, self.b, 1e-5)
            if op == "rms_norm":
                return F.rms_norm(x, (cols,), self.w, 1e-6)
            if op == "softmax":
                return F.softmax(x, dim=-1)
            return F.cross_entropy(x, rest[0])

    args: tuple[Any, ...] = (x,)
    if op == "cross_entropy":
        args = (x, torch.randint(0, cols, (rows,), generator=g).to(dev))
    return One().eval(), args


def _external(name: str, op: str, m: Any) -> Callable[..., Any]:
    """Liger's / QuACK's function for ``op`` bound to module ``m``'s weights; raises ImportError /
    KeyError when the library or that op is missing."""
    if name == "liger":
        from liger_kernel.transformers import functional as lf   # type: ignore[import-not-found]

        return {"layer_norm": lambda x: lf.liger_layer_norm(x, m.w, m.b, 1e-5),
                "rms_norm": lambda x: lf.liger_rms_norm(x, m.w, 1e-6),
                "cross_entropy": lambda x, t: lf.liger_cross_entropy(x, t)}[op]
    import quack   # type: ignore[import-not-found]  # noqa: F401

    if op == "rms_norm":
        from quack.rmsnorm import rmsnorm   # type: ignore[import-not-found]

        return lambda x: rmsnorm(x, m.w, eps=1e-6)
    if op == "softmax":
        from quack.softmax import softmax   # type: ignore[import-not-found]

        return softmax
    if op == "cross_entropy":
        from quack.cross_entropy import cross_entropy   # type: ignore[import-not-found]

        return lambda x, t: cross_entropy(x, t).mean()
    raise KeyError(f"quack has no {op}")


def _times(torch: Any, call: Callable[[], Any], iters: int, cpu: bool) -> list[float]:
    """Microseconds per call: CUDA events, or the wall clock on the CPU (:func:`gpu_timing.times_us`)."""
    return gpu_timing.times_us(call, iters, cpu, warmup=3, cuda=None if cpu else torch.cuda)


def _callable(torch: Any, variant: str, op: str, m: Any, args: tuple[Any, ...], cpu: bool) -> Callable[[], Any]:
    from stitchtune.deploy import torch_backend

    torch._dynamo.reset()
    if variant == "native":
        return lambda: m(*args)
    if variant == "native+graph":
        if cpu:
            raise RuntimeError("no CUDA graphs on the CPU")
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                m(*args)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static = m(*args)

        def replay() -> Any:
            graph.replay()
            return static
        return replay
    if variant == "inductor":
        f = torch.compile(m)
        return lambda: f(*args)
    if variant.startswith("stitchtune"):
        torch_backend.LAST_REPORTS.clear()
        opts: dict[str, Any] = {"db": None, **({"cpu": "emulate"} if cpu else {})}
        if variant == "stitchtune+cg":
            opts["cudagraphs"] = True
        f = torch.compile(m, backend=torch_backend.stitchtune_backend, options=opts)
        return lambda: f(*args)
    ext = _external(variant, op, m)
    return lambda: ext(*args)


def case_rows(torch: Any, op: str, dtype: str, iters: int, cpu: bool, bw: float | None,
              size: str = "full") -> list[dict[str, Any]]:
    """Every variant of one op x dtype x size (module docstring)."""
    rows_, cols = OPS[op][1]
    if cpu:
        rows_, cols = 64, 256
    if size == "small":
        rows_ = SMALL_ROWS
    dev = "cpu" if cpu else "cuda"
    tdt = torch.bfloat16 if dtype == "bf16" else torch.float32
    m, args = make_case(torch, op, rows_, cols, tdt, dev)
    nbytes = unique_bytes(op, rows_, cols, 2 if dtype == "bf16" else 4)
    floor = round(nbytes / bw * 1e6, 1) if bw else None
    with torch.no_grad():
        want = m(*args).float().clone()
    out = []
    for v in VARIANTS:
        row: dict[str, Any] = {"phase": "peers", "op": op, "example": OPS[op][0], "size": size, "shape": [rows_, cols],
                               "dtype": dtype, "variant": v, "floor_us": floor,
                               "timing": "cpu wall (dry run)" if cpu else "cuda events (measured)"}
        if cpu and v == "native+graph":
            row["skipped"] = "dry run: no CUDA graphs on the CPU"
            out.append(row)
            continue
        try:
            with torch.no_grad():
                call = _callable(torch, v, op, m, args, cpu)
                got = call()
                row["max_err"] = float((got.float() - want).abs().max())
                if v.startswith("stitchtune"):   # regions the backend stitched (0: Inductor ran the op)
                    from stitchtune.deploy import torch_backend

                    row["stitched"] = sum(len(r.stitched) for r in torch_backend.LAST_REPORTS)
                t = _times(torch, call, iters, cpu)
            row["median_us"] = round(statistics.median(t), 1)
            row["min_us"] = round(min(t), 1)
        except (ImportError, KeyError) as e:
            row["skipped"] = f"not importable / no such op: {type(e).__name__}: {str(e)[:100]}"
        except Exception as e:  # a failure is a row
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            row["trace_tail"] = traceback.format_exc().splitlines()[-3:]
        out.append(row)
    return out


def table(rows: list[dict[str, Any]]) -> list[str]:
    """The markdown table of the rows (pure)."""
    out = ["| op | shape | dtype | variant | median us | min us | floor us (predicted) | max err vs native | stitched | note |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("phase") != "peers" or "variant" not in r:
            continue
        note = r.get("error") or r.get("skipped") or r.get("timing", "")
        err = f"{r['max_err']:.1e}" if "max_err" in r else "-"
        shape = "x".join(str(s) for s in r.get("shape", []))
        out.append(f"| {r['op']} | {shape} | {r['dtype']} | {r['variant']} | {r.get('median_us', '-')} | "
                   f"{r.get('min_us', '-')} | {r.get('floor_us') or '-'} | {err} | {r.get('stitched', '-')} | "
                   f"{str(note)[:90]} |")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gpu_peers_out")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--sizes", default=",".join(SIZES))
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--budget-s", type=float, default=90.0)
    ap.add_argument("--cpu", action="store_true", help="dry run on the CPU (tiny shapes, wall clock)")
    try:
        a = ap.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    ops = [o for o in a.ops.split(",") if o]
    dtypes = [d for d in a.dtypes.split(",") if d]
    sizes = [z for z in a.sizes.split(",") if z]
    bad = [o for o in ops if o not in OPS] + [d for d in dtypes if d not in DTYPES] + [z for z in sizes if z not in SIZES]
    import torch

    check = gpu_timing.options_only()
    if bad or a.iters < 1 or (not a.cpu and not check and not torch.cuda.is_available()):
        print(f"gpu_peers: error: bad options {bad or ''} (without a GPU pass --cpu)", file=sys.stderr)
        return 2
    if check:
        print("gpu_peers: options ok")
        return 0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    bw = None
    if not a.cpu:
        from stitchtune.bench.measure import copy_bandwidth

        bw = copy_bandwidth()
        print(f"device: {torch.cuda.get_device_name()}; copy bandwidth {bw / 1e12:.2f} TB/s (measured)", flush=True)
    start, path = time.monotonic(), out / "gpu_peers.jsonl"
    with path.open("a") as log:
        for d, z, op in [(d, z, op) for d in dtypes for z in sizes for op in ops]:   # fp32 full size first: as written
            if time.monotonic() - start > a.budget_s:
                got = [{"phase": "peers", "model": op, "op": op, "dtype": d, "size": z, "skipped": "budget spent"}]
            else:
                got = case_rows(torch, op, d, a.iters, a.cpu, bw, z)
            for r in got:
                log.write(json.dumps(r) + "\n")
                print(json.dumps(r), flush=True)
            log.flush()
            every = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
            (out / "gpu_peers.md").write_text("\n".join(table(every)) + "\n")
    print((out / "gpu_peers.md").read_text())
    print(f"total {time.monotonic() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
