"""GPU check of the compile-time entry points (needs a CUDA GPU, torch, cuda-python, nvcc).

    python scripts/gpu_torch_entry.py [--db DIR] [--iters 100] [--examples layernorm,rmsnorm,...]

(``--db`` default: ``$STITCHTUNE_DB``, else ``./tuning-db``, as for ``stitchtune compile``.)

1. ``stitchtune.compile(...)(**arrays)`` (the one launch path, ``stitchtune.gpu.launch``, over cuda-python)
   on every small example, with numpy arrays and, for graphs without bfloat16 inputs, torch CUDA tensors
   (``__cuda_array_interface__``, used in place): output vs. the float64 reference
   (``runners.check_outputs``).
2. ``stitchtune.deploy.torch_entry.compile(fn, db=..., example_inputs=...)`` on the full-size PyTorch examples of
   ``examples/torch_modules.py``: output vs. ``fn`` (max relative error), then the time per call of the
   stitched kernels, of ``fn`` eager and of ``torch.compile(fn)``, each the median of ``--iters`` calls
   timed with CUDA events on the current stream (inputs resident, no L2 flush: a same-input loop).
   Every time printed is measured here; where the schedule came from is printed next to it.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
import gpu_timing  # noqa: E402  (scripts/, on the path above)


def _events(call, iters: int, warmup: int = 10) -> float:
    """Median device microseconds per call from CUDA events (:func:`gpu_timing.event_times_us`)."""
    return gpu_timing.median(gpu_timing.event_times_us(call, iters, warmup))


def check_numpy_api(db: str) -> bool:
    import stitchtune
    from stitchtune.graph.reference import random_inputs, run_reference
    from stitchtune.gpu.runners import check_outputs, output_dtypes

    ok = True
    for path in sorted((REPO / "examples").glob("*_small.json")):
        cg = stitchtune.compile(path, db=db, build=True)
        x = random_inputs(cg.graph, 1)
        ref = run_reference(cg.graph, x)
        res = check_outputs(cg(**x), ref, output_dtypes(cg.graph))
        ok &= res.ok
        print(f"api  {path.stem:28s} {cg.source:13s} {'ok' if res.ok else 'WRONG: ' + res.error} "
              f"(rel err {res.max_rel_error:.1e})")
        if all(s.dtype != "bfloat16" for _, s in cg.graph.inputs):
            import torch

            dev = check_outputs(cg(**{n: torch.from_numpy(a).cuda() for n, a in x.items()}), ref,
                                output_dtypes(cg.graph))
            ok &= dev.ok
            print(f"api  {path.stem:28s} torch tensors {'ok' if dev.ok else 'WRONG: ' + dev.error}")
    return ok


def check_torch_entry(db: str, names: list[str], iters: int) -> bool:
    import torch

    import stitchtune.deploy.torch_entry as st_torch
    from stitchtune.importers.builder import parse_shapes

    spec = importlib.util.spec_from_file_location("torch_modules", REPO / "examples" / "torch_modules.py")
    tm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tm)
    ok = True
    print(f"{'torch':5s} {'example':22s} {'source':13s} {'rel_err':>8s} {'stitch_us':>10s} {'eager_us':>9s} "
          f"{'compile_us':>10s}  (measured: CUDA events, median of {iters}, {torch.cuda.get_device_name()})")
    for name in names:
        fn = getattr(tm, name)
        fn = fn().cuda() if isinstance(fn, type) else fn
        gen = torch.Generator(device="cuda").manual_seed(0)
        args = [torch.randn(tuple(s), generator=gen, device="cuda") for s in parse_shapes(tm.SHAPES[name]).values()]
        t0 = time.perf_counter()
        f = st_torch.compile(fn, db=db, example_inputs=args)
        t_compile = time.perf_counter() - t0
        with torch.no_grad():
            want = fn(*args)
            got = f(*args)
            torch.cuda.synchronize()
            err = float((got - want).abs().max() / want.abs().max().clamp_min(1e-3))
            good = err < 1e-4
            ok &= good
            tc = torch.compile(fn)
            tc(*args)
            t_st, t_eager, t_tc = (_events(lambda g=g, a=args: g(*a), iters) for g in (f, fn, tc))
        print(f"torch {name:22s} {f.source:13s} {err:8.1e} {t_st:10.1f} {t_eager:9.1f} {t_tc:10.1f}"
              f"  {'ok' if good else 'WRONG'} (stitchtune compile {t_compile:.1f} s)")
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    from stitchtune.tune.dbpath import default_db

    ap.add_argument("--db", default=default_db())
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--examples", default="layernorm,rmsnorm,softmax,bias_gelu,colsum_sigmoid_scale")
    args = ap.parse_args(argv)
    ok = check_numpy_api(args.db)
    ok &= check_torch_entry(args.db, [n for n in args.examples.split(",") if n], args.iters)
    print("ALL OK" if ok else "SOME CHECKS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
