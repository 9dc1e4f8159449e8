"""The subcommands on a tuning database: ``search``, ``show``, ``export``, ``report``, ``calibrate``,
``model-check`` and ``bench`` (part of the CLI package: prints for users like the rest of it).

Each command is a pair ``_add_<name>(sub)`` / ``_cmd_<name>(args) -> int`` as described in
:mod:`stitchtune.cli`, which lists them in its ``_SUBCOMMANDS``. Heavy modules are imported inside
the functions.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from stitchtune.cli import checks
from stitchtune.cli.interrupts import interrupted_search, keeping_rows
from stitchtune.cli.outputs import write_whole
from stitchtune.cli.options import (
    MAX_JOBS,
    MAX_TRIALS,
    add_callable,
    add_db,
    add_device,
    add_graph,
    add_out,
    float_above,
    int_at_most,
    seed,
)
from stitchtune.errors import StitchtuneError


# ---------------------------------------------------------------------------- report
def _add_report(sub: Any) -> None:
    p = sub.add_parser("report", help="write figures (PNG) and a Markdown summary of a tuning database")
    add_db(p, checks.db_read)
    add_out(p, checks.out_dir, "output directory (created when missing)", metavar="DIR", required=True)
    checks.checked(p, p.add_argument("--bench", action="append", default=None, metavar="CSV",
                                     help="benchmark CSV (repeatable; default: DB/bench_*.csv)"), checks.in_file)
    checks.checked(p, p.add_argument("--graphs", nargs="*", default=None, metavar="GRAPH",
                                     help="graph.json files for min bytes (default: examples/*.json when present)"),
                   checks.in_file)
    p.add_argument("--bandwidth-gbs", type=float_above(0), default=None, metavar="GBS",
                   help="copy bandwidth for the floor in GB/s (default: from the device preset)")
    p.set_defaults(func=_cmd_report)


def _cmd_report(args: argparse.Namespace) -> int:
    import glob

    from stitchtune.analysis.report import write_report

    graphs = args.graphs if args.graphs is not None else sorted(glob.glob(os.path.join("examples", "*.json")))
    paths = write_report(args.db, args.out, bench_paths=args.bench, graph_paths=graphs,
                         bandwidth_gbs=args.bandwidth_gbs)
    print(f"wrote {len(paths)} files to {args.out} (summary: {os.path.join(args.out, 'report.md')})")
    return 0


# ---------------------------------------------------------------------------- calibrate / model-check
def _add_calibrate(sub: Any) -> None:
    p = sub.add_parser("calibrate", help="re-fit the fitted cost model to the measured rows of a tuning database")
    add_db(p, checks.db_update, "tuning database to read (--profile-model also saves its fit there)")
    add_device(p, "device preset or name (default: every device with measured rows)")
    add_out(p, checks.out_file, "where the coefficients go (default: the user's file of the device, which the "
            "cost model reads before the package's; one device only)", metavar="FILE")
    p.add_argument("--held-out", action="store_true",
                   help="also judge the fit on workloads it did not see (one fit per workload: slower) against the "
                        "package's coefficients")
    p.add_argument("--fit-on", choices=("auto", "ir", "compiled"), default=None,
                   help="what the fit reads: the IR features (ir, the default; scored better held out on the committed "
                        "H200 data), or with each kernel's compiled facts (its cubin's bytes in flight and "
                        "spills, recorded where cuobjdump was installed); auto: compiled when every measured row "
                        "has them, else the IR features")
    p.add_argument("--profile-model", action="store_true",
                   help="re-fit the older profile-based model's constants instead (cost_params_<device>.json in "
                        "the --db folder)")
    p.set_defaults(func=_cmd_calibrate)


def _calibration_devices(args: argparse.Namespace, df: Any) -> list[Any]:
    from stitchtune.cost.calibrate import CalibrationError, devices_in, resolve_devices
    from stitchtune.hardware.device import get_device

    if args.device:
        return [get_device(args.device)]
    from stitchtune.gpu.device_query import query_device

    devices, unknown = resolve_devices(devices_in(df), local=query_device)
    for key in unknown:
        print(f"skipping {key}: not a preset and not the local GPU (use --device NAME)")
    if not devices:
        raise CalibrationError(f"no measured ok rows of a known device in {ascii(args.db)} "
                               "(emulated rows do not count; --device NAME names an unknown one)")
    return devices


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from stitchtune.cost.calibrate import CalibrationError, calibrate_db
    from stitchtune.tune.database import read_db

    if args.profile_model and args.fit_on is not None:
        raise CalibrationError("--fit-on chooses what the fitted model is fitted on; --profile-model refits the "
                               "profile-based model, which reads neither: drop one of them")
    fit_on = args.fit_on or "ir"
    df = read_db(args.db)
    devices = _calibration_devices(args, df)
    if args.profile_model:
        for dev, params, path in calibrate_db(args.db, df, devices):
            fitted = ", ".join(f"{k}={v:.4g}" for k, v in params.to_dict().items() if isinstance(v, float))
            print(f"{dev.key}: fitted on {params.fitted_rows} measured rows -> {path}\n  {fitted}")
        return 0
    if args.out and len(devices) > 1:
        raise CalibrationError(f"--out names one file, but {len(devices)} devices have measured rows: "
                               "name one with --device")
    from tqdm import tqdm

    from stitchtune.cost import calibrate_fitted

    for dev in devices:
        rows, notes = calibrate_fitted.fit_rows(df, dev.key, fit_on)
        calibrate_fitted.check_rows(rows, notes, dev)
        on = "with compiled facts" if rows[0]["fit_on"] == "compiled" else "on IR features"
        print(f"{dev.key}: {len(rows)} measured rows with IR features, fitting {on}" + "".join(f"; {n}" for n in notes))
        with tqdm(desc=f"fitting {dev.key}", unit=" evaluations", file=sys.stderr, leave=False) as bar:
            cal = calibrate_fitted.calibrate(df, dev, progress=lambda n: bar.update(1), db=str(args.db),
                                             fit_on=fit_on)
        written = calibrate_fitted.save(cal, args.out)
        p = cal.coefficients.provenance
        print(f"{dev.key}: fitted on {cal.rows} measured rows of {cal.workloads} workloads -> {written}\n"
              f"  in-sample (the rows fitted, not a held-out figure): within +-25% "
              f"{_pct(p['insample_within25_before'])} -> {_pct(p['insample_within25_after'])}, Spearman "
              f"{p['insample_spearman_before']} -> {p['insample_spearman_after']} (before: the {p['base']} "
              "coefficients)")
        if args.held_out:
            with tqdm(desc=f"held out {dev.key}", unit=" evaluations", file=sys.stderr, leave=False) as bar:
                h = calibrate_fitted.held_out(rows, dev, progress=lambda n: bar.update(1))
            print(f"  held out (each of {h['workloads']} workloads predicted by a fit without it): within +-25% "
                  f"{_pct(h['held_out']['within25'])}, Spearman {h['held_out']['spearman']:.2f}; the package's "
                  f"coefficients on the same rows: {_pct(h['base']['within25'])}, {h['base']['spearman']:.2f}")
    return 0


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _add_model_check(sub: Any) -> None:
    p = sub.add_parser("model-check", help="rank correlation of predicted vs measured times, pruned winners")
    add_db(p, checks.db_read)
    p.add_argument("--factor", type=float_above(1), default=3.0, metavar="F",
                   help="pruning factor, > 1: predicted > FACTOR x best measured (default 3.0)")
    p.add_argument("--repredict", action="store_true",
                   help="judge the current cost model: predict every row again (re-lowering the workloads "
                        "of --graphs) instead of using the predictions stored at search time")
    checks.checked(p, p.add_argument(
        "--graphs", nargs="*", default=None, metavar="GRAPH",
        help="graph files whose workloads are re-lowered with --repredict (default: examples/*.json when that "
             "folder exists)"), checks.in_file)
    p.set_defaults(func=_cmd_model_check)


def _cmd_model_check(args: argparse.Namespace) -> int:
    import glob

    from stitchtune.cost.calibrate import format_model_check, model_check, repredict
    from stitchtune.graph.parse import load_graph
    from stitchtune.tune.database import read_db

    df = read_db(args.db)
    if args.repredict:
        paths = args.graphs if args.graphs is not None else sorted(glob.glob(os.path.join("examples", "*.json")))
        df = repredict(df, [load_graph(p) for p in paths])
        counts = df["prediction_source"].value_counts().to_dict() if len(df) else {}
        print("predictions by the current cost model (" + ", ".join(f"{k}: {v} rows" for k, v in
                                                                  sorted(counts.items())) + ")")
    else:
        print("predictions as stored at search time (--repredict judges the current model)")
    print(format_model_check(model_check(df, args.factor), args.factor))
    return 0


# ---------------------------------------------------------------------------- bench
def _add_bench(sub: Any) -> None:
    from stitchtune.bench.peers import PEER_NAMES

    p = sub.add_parser("bench", help="time tuned kernels against torch eager, torch.compile and JAX (GPU)")
    add_graph(p, nargs="+")
    add_db(p, checks.db_write, "tuning database (tuned records; --trials appends to it)")
    p.add_argument("--trials", type=int_at_most(MAX_TRIALS), default=0, metavar="N",
                   help="search N trials first for a graph without a tuned record (default 0: heuristic)")
    p.add_argument("--peers", default=",".join(PEER_NAMES), metavar="LIST",
                   help=f"comma-separated peers, or none (default: {','.join(PEER_NAMES)})")
    add_device(p, "device preset (default: the GPU torch sees)")
    add_out(p, checks.out_dir, "where bench_<device>.csv/.png go (default: the --db directory, where report "
            "finds them)", metavar="DIR")
    p.add_argument("--iters", type=int_at_most(MAX_TRIALS), default=100, metavar="N",
                   help="timed calls per system (default 100)")
    p.add_argument("--warmup", type=int_at_most(MAX_TRIALS), default=10, metavar="N", help="warm-up calls (default 10)")
    p.set_defaults(func=_cmd_bench)


def _cmd_bench(args: argparse.Namespace) -> int:
    from stitchtune.bench.peers import parse_peer_names
    from stitchtune.gpu.device_query import query_device

    peers = parse_peer_names(args.peers)
    problems = [f"--{k} must be >= {lo} (got {v})" for k, v, lo in
                (("trials", args.trials, 0), ("iters", args.iters, 5), ("warmup", args.warmup, 0)) if v < lo]
    if problems:
        raise StitchtuneError(problems=problems)
    query_device()  # no GPU: say so now, not after importing torch and the peers (seconds)
    from stitchtune.bench.measure import format_table, run_bench
    from stitchtune.hardware.device import get_device

    device = get_device(args.device) if args.device else None
    out_dir = args.out or args.db
    with keeping_rows(args.db, also=_bench_tables_since(out_dir)):
        df = run_bench(args.graphs, db=args.db, trials=args.trials, peers=peers, device=device,
                       out_dir=out_dir, iters=args.iters, warmup=args.warmup,
                       progress=lambda s: print(s, flush=True))
    print(format_table(df))
    return 0


def _bench_tables_since(out_dir: str) -> Any:
    """For :func:`keeping_rows`: names the bench tables in ``out_dir`` written after now (bench rewrites its
    CSV after every graph, so a Ctrl-C keeps the graphs finished)."""
    import glob
    import time

    t0 = time.time()

    def written() -> str | None:
        fresh = [p for p in sorted(glob.glob(os.path.join(glob.escape(out_dir), "bench_*.csv")))
                 if os.path.getmtime(p) >= t0]
        return f"the finished graphs' times in {', '.join(fresh)}" if fresh else None

    return written


# ---------------------------------------------------------------------------- search / show / export
def _add_search(sub: Any) -> None:
    p = sub.add_parser("search", help="tune a graph's stitch schedule (optuna; results in the tuning database)")
    add_graph(p)
    p.add_argument("--trials", type=int_at_most(MAX_TRIALS, lo=1), default=64, metavar="N",
                   help="trials in this run (default 64)")
    p.add_argument("--timeout", type=float_above(0), default=None, metavar="S", help="stop after S seconds")
    p.add_argument("--backend", default="auto", choices=("auto", "cuda", "emulate"),
                   help="auto: cuda when cuda-python finds a GPU, else emulate (estimated times)")
    add_device(p)
    add_db(p, checks.db_write)
    p.add_argument("--storage", default=None, metavar="URL",
                   help="optuna storage URL (postgresql://..., sqlite:///...; default: DIR/optuna.journal)")
    p.add_argument("--study", default=None, metavar="NAME",
                   help="study name (default: <graph>-<workload key[:12]>-<device>)")
    p.add_argument("--sampler", default="tpe", choices=("tpe", "gp", "cmaes", "random", "grid"),
                   help="optuna sampler: tpe, gp (Gaussian process), cmaes, random or grid (default: tpe)")
    p.add_argument("--seed", type=seed, default=None, metavar="S",
                   help="sampler seed, for a reproducible sequence of trials (default: random)")
    p.add_argument("--jobs", type=int_at_most(MAX_JOBS, lo=1), default=os.cpu_count() or 1, metavar="N",
                   help="trials per batch = parallel compiles (default: CPU count)")
    p.add_argument("--early-stop", type=int_at_most(MAX_TRIALS, lo=1), default=None, metavar="K",
                   help="stop after K trials without improvement")
    p.add_argument("--prune-factor", type=float_above(1), default=3.0, metavar="F",
                   help="skip points predicted F x slower than the best measured (default 3)")
    p.add_argument("--no-build", action="store_true", help="emulate backend: do not compile with nvcc")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--deterministic", action="store_true",
                   help="only bitwise-reproducible schedules (no float atomics; own study when that changes the space)")
    p.add_argument("--dynamic", action="append", default=None, metavar="NAME=LO..HI[:B1,...]",
                   help="tune generic kernels per bucket of dynamic dim NAME (a name in the graph's shapes): "
                        "power-of-two buckets, or the given upper bounds; --trials is split by each "
                        "bucket's share (repeatable)")
    p.set_defaults(func=_cmd_search)


def _cmd_search(args: argparse.Namespace) -> int:
    from stitchtune.cli.dynamic import search_dims
    from stitchtune.tune.search import SearchConfig, format_summary, resolve_backend, run_search

    dims = search_dims(args.graph, args.dynamic)  # bad text, bounds, a dynamic graph without it: one line first
    backend, why = resolve_backend(args.backend)
    print(why, file=sys.stderr, flush=True)
    cfg = SearchConfig(graph_path=args.graph, trials=args.trials, timeout_s=args.timeout, backend=backend,
                       device=args.device, db=args.db, storage=args.storage, study=args.study,
                       sampler=args.sampler, seed=args.seed, jobs=args.jobs, early_stop=args.early_stop,
                       prune_factor=args.prune_factor, build=not args.no_build, progress=not args.no_progress,
                       deterministic=args.deterministic)
    if dims:
        with keeping_rows(args.db):
            return _search_dynamic(cfg, dims)
    with keeping_rows(args.db):
        res = run_search(cfg)
    print(format_summary(res))
    if res.stopped == "interrupted":
        raise interrupted_search(res)
    return 0


def _search_dynamic(cfg: Any, dims: list[Any]) -> int:
    """``search --dynamic``: every bucket's search, one summary each, then one line per bucket."""
    from stitchtune.tune.dynamic_search import run_dynamic_search
    from stitchtune.tune.search import format_summary

    outcomes = run_dynamic_search(cfg, dims, progress=lambda line: print(line, flush=True))
    for o in outcomes:
        if o.result is not None:
            print(f"== bucket {o.key.label()} ({o.trials} trial(s))")
            print(format_summary(o.result))
    print("buckets:")
    for o in outcomes:
        if o.result is None:
            print(f"  {o.key.label()}: skipped: {o.skipped}")
        else:
            best = o.result.best
            what = "no ok schedule" if best is None else (
                f"best {float(best.measured_us or 0.0):.2f} us{' (estimated)' if best.estimated else ''} "
                f"schedule {best.schedule_key}")
            print(f"  {o.key.label()}: {what}")
    if any(o.result is not None and o.result.stopped == "interrupted" for o in outcomes):
        raise KeyboardInterrupt  # the caller's keeping_rows counts the rows of every bucket
    return 0


def _add_show(sub: Any) -> None:
    p = sub.add_parser("show", help="best schedule per workload and device in a tuning database")
    add_db(p, checks.db_read)
    p.set_defaults(func=_cmd_show)


def _cmd_show(args: argparse.Namespace) -> int:
    from stitchtune.deploy.stale_records import database_note
    from stitchtune.tune.database import TuningDB
    from stitchtune.tune.summary import format_best_table

    db = TuningDB(args.db)
    df = db.read()
    print(f"{ascii(args.db)}: {len(df)} trial rows in {len(db.parts())} parts")
    print(format_best_table(db.best_per_workload(df)))
    note = database_note(df)
    if note:
        print(f"stitchtune: warning: {note}", file=sys.stderr)
    return 0


def _add_export(sub: Any) -> None:
    p = sub.add_parser("export", help="write a tuning database as one CSV file")
    add_db(p, checks.db_read)
    add_out(p, checks.out_file, "output CSV file", metavar="FILE.csv", required=True, old=("--csv",))
    p.set_defaults(func=_cmd_export)


def _cmd_export(args: argparse.Namespace) -> int:
    from stitchtune.tune.database import read_db

    df = read_db(args.db)
    write_whole(args.out, lambda tmp: df.to_csv(tmp, index=False))
    print(f"wrote {len(df)} rows to {args.out}")
    return 0


# ---------------------------------------------------------------------------- tune (a whole model)
def _add_tune(sub: Any) -> None:
    p = sub.add_parser("tune", help="tune every region torch.compile(backend='stitchtune') stitches in a model")
    add_callable(p, "x=8x512x1024",
                 "float32|float16|bfloat16|int64 for all inputs, or per input: x=bfloat16,ids=int64 "
                 "(int64 inputs are zeros and ones, e.g. token ids)")
    p.add_argument("--trials", type=int_at_most(MAX_TRIALS, lo=1), default=64, metavar="N",
                   help="total trials, split over the regions by the cost model's predicted gain (default 64)")
    p.add_argument("--backend", default="auto", choices=("auto", "cuda", "emulate"),
                   help="auto: cuda when cuda-python finds a GPU, else emulate (estimated times)")
    add_device(p)
    add_db(p, checks.db_write)
    p.add_argument("--jobs", type=int_at_most(MAX_JOBS, lo=1), default=os.cpu_count() or 1, metavar="N",
                   help="trials per batch = parallel compiles (default: CPU count)")
    p.add_argument("--no-build", action="store_true", help="emulate backend: do not compile with nvcc")
    p.add_argument("--calls", default="inference,eval-grad", metavar="LIST",
                   help="the ways the model will be called, whose graphs are tuned: inference (eval, under no_grad "
                        "or inference_mode), eval-grad (eval with grad enabled: the training forward), train "
                        "(train mode, forward and backward); default inference,eval-grad")
    p.add_argument("--train", action="store_true",
                   help="also tune the regions of a training step (forward and backward graphs; module in train mode)")
    p.set_defaults(func=_cmd_tune)


def _cmd_tune(args: argparse.Namespace) -> int:
    from stitchtune.deploy.model_tuning import parse_calls
    from stitchtune.importers.builder import parse_shapes

    calls = parse_calls(args.calls + (",train" if args.train else ""))
    shapes = parse_shapes(args.shapes)
    with keeping_rows(args.db):
        from stitchtune.deploy.model_tuning import tune_model
        from stitchtune.deploy.tune_inputs import check_runs, example_inputs
        from stitchtune.importers.torch_import import load_callable
        from stitchtune.tune.config import resolve_backend

        fn, _label = load_callable(args.callable)
        inputs = example_inputs(fn, shapes, args.dtype)
        check_runs(fn, inputs)  # the user's model fails eagerly: one line now, not a torch.compile trace later
        backend, why = resolve_backend(args.backend)
        print(why, file=sys.stderr, flush=True)
        tune_model(fn, inputs, trials=args.trials, db=args.db, backend=backend, device=args.device,
                   build=not args.no_build, jobs=args.jobs, calls=calls, say=lambda s: print(s, flush=True))
    print(f"database: {args.db} (torch.compile(model, backend='stitchtune', options={{'db': {args.db!r}}}) reads it)")
    return 0
