"""Command-line interface (``stitchtune``, ``python -m stitchtune``): the only package that prints for users.

Contract: :func:`main(argv)` returns the exit code (0 ok, 2 user error or usage error, 130
interrupted: one line, ``stitchtune: interrupted: <what was kept>`` for an
:class:`~stitchtune.errors.Interrupted`). Every :class:`~stitchtune.errors.StitchtuneError` becomes one
``stitchtune: error: <problem>`` line per problem on stderr, without a traceback. Before a command
runs, every path argument is checked (:mod:`stitchtune.cli.checks`); an ``OSError`` on one of those
paths that still happens later is an error line too. A closed stdout (``... | head``) ends the
command quietly with exit 0. Any other exception is a bug and propagates.

Adding a subcommand: write ``_add_<name>(sub)`` (creates the subparser, using the shared arguments
of :mod:`stitchtune.cli.options`, and calls ``p.set_defaults(func=_cmd_<name>)``) and
``_cmd_<name>(args) -> int``, then append ``_add_<name>`` to ``_SUBCOMMANDS``; give the subparser a
``help`` (it is also its description) and every argument a ``help``. Adding a ``run`` backend: put a
function ``(graph, inputs, schedule_dict_or_None, *, db=DIR, device=NAME_or_None) -> {output name: array}``
into :data:`BACKENDS` (import heavy modules inside the function; ignore options it does not use).

The graph, device and space commands are here; the commands on a tuning database (search, show,
export, report, calibrate, model-check, bench, tune) are in :mod:`stitchtune.cli.tuning`, ``import
torch|onnx`` in :mod:`stitchtune.cli.importing`.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import sys
from collections import Counter
from typing import Any, Callable, Mapping, Protocol, Sequence

import numpy as np

from stitchtune._version import __version__
from stitchtune.cli import checks
from stitchtune.cli import dynamic as dynamic_cli
from stitchtune.cli.audit import _add_audit
from stitchtune.cli.importing import _add_import
from stitchtune.cli.options import (
    MAX_SAMPLES,
    Parser,
    add_db,
    add_device,
    add_graph,
    add_out,
    int_at_most,
    seed,
)
from stitchtune.cli.tuning import (
    _add_bench,
    _add_calibrate,
    _add_export,
    _add_model_check,
    _add_report,
    _add_search,
    _add_tune,
    _add_show,
)
from stitchtune.errors import Interrupted, StitchtuneError, from_ctrl_c
from stitchtune.cli.inputs import load_inputs_npz, parse_schedule_arg  # noqa: F401 - re-exported
from stitchtune.cli.outputs import no_cubin_line, save_outputs_npz
from stitchtune.tune.dbpath import default_db

log = logging.getLogger("stitchtune")

class BackendFn(Protocol):
    """A `stitchtune run` backend: the graph's outputs for ``inputs`` (options it does not use ignored)."""

    def __call__(self, graph: Any, inputs: Mapping[str, np.ndarray], schedule: dict[str, Any] | None,
                 **options: Any) -> dict[str, np.ndarray]: ...


# ---------------------------------------------------------------------------- shared helpers
def _load(path: str) -> Any:
    from stitchtune.graph.parse import load_graph

    return load_graph(path)


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"


# ---------------------------------------------------------------------------- run backends
def _backend_reference(graph: Any, inputs: Mapping[str, np.ndarray],
                       schedule: dict[str, Any] | None, **_options: Any) -> dict[str, np.ndarray]:
    from stitchtune.graph.reference import run_reference

    if schedule is not None:
        log.warning("the reference backend ignores --schedule")
    return run_reference(graph, inputs)


def _compiled_for_run(graph: Any, schedule: dict[str, Any] | None, db: str | None, device: str | None,
                      build: bool) -> Any:
    """The schedule `stitchtune compile` would choose (or the given one), compiled; says where it came from."""
    from stitchtune.deploy.compiled import compile as st_compile

    cg = st_compile(graph, db=db, device=device, schedule=schedule, build=build)
    print(f"schedule: {cg.source} ({cg.manifest['choice']['reason']})")
    return cg


def _backend_emulate(graph: Any, inputs: Mapping[str, np.ndarray], schedule: dict[str, Any] | None,
                     *, db: str | None = None, device: str | None = None, **_options: Any) -> dict[str, np.ndarray]:
    from stitchtune.emulate.memory import EmulatorFault

    cg = _compiled_for_run(graph, schedule, db, device, build=False)
    try:
        return cg.emulate(**inputs)
    except EmulatorFault as e:  # the user's schedule (e.g. a grid barrier over more blocks than fit); else a bug
        if cg.source != "given":
            raise
        raise StitchtuneError(f"--schedule cannot run on {cg.device.key}: {e}") from None


def _backend_cuda(graph: Any, inputs: Mapping[str, np.ndarray], schedule: dict[str, Any] | None,
                  *, db: str | None = None, device: str | None = None, **_options: Any) -> dict[str, np.ndarray]:
    return _compiled_for_run(graph, schedule, db, device, build=True)(**inputs)


BACKENDS: dict[str, BackendFn] = {
    "reference": _backend_reference,
    "emulate": _backend_emulate,  # stitched kernels in the CPU emulator (small shapes)
    "cuda": _backend_cuda,  # stitched kernels on the GPU (nvcc + stitchtune.gpu.launch over cuda-python)
}


# ---------------------------------------------------------------------------- validate
def _add_validate(sub: Any) -> None:
    p = sub.add_parser("validate", help="check a graph.json and print a summary")
    add_graph(p)
    p.set_defaults(func=_cmd_validate)


def _cmd_validate(args: argparse.Namespace) -> int:
    from stitchtune.graph.ops import OPS

    g = dynamic_cli.validate_load(args.graph)
    ops = Counter(n.op for n in g.nodes)
    print(f"graph {g.name}: valid")
    print(f"  inputs ({len(g.inputs)}):")
    for name, s in g.inputs:
        print(f"    {name}: {s.dtype}{list(s.shape)}")
    print(f"  nodes: {len(g.nodes)}")
    print("  ops: " + ", ".join(f"{op} x{c}" for op, c in sorted(ops.items())))
    reds = [n for n in g.nodes if OPS[n.op].kind == "reduce"]
    if reds:
        print(f"  reductions ({len(reds)}):")
        for n in reds:
            src = g.spec(n.tensor_args[0])
            print(f"    {n.id} = {n.op}({n.tensor_args[0]}{list(src.shape)}) axes={list(n.axes)} "
                  f"keepdims={str(n.keepdims).lower()} -> {list(n.shape)}")
    else:
        print("  reductions: none")
    print(f"  outputs ({len(g.outputs)}):")
    for o in g.outputs:
        s = g.spec(o)
        print(f"    {o}: {s.dtype}{list(s.shape)}")
    print(f"  min bytes moved: {g.min_bytes()} ({_human_bytes(g.min_bytes())})")
    print(f"  workload key: {g.workload_key()}")
    return 0


# ---------------------------------------------------------------------------- run
def _add_run(sub: Any) -> None:
    p = sub.add_parser("run", help="execute a graph on given or random inputs")
    add_graph(p)
    checks.checked(p, p.add_argument(
        "--inputs", metavar="IN.npz", action="append",
        help="input arrays by name (.npz); repeatable, e.g. your inputs plus the *.constants.npz an ONNX "
             "import wrote (a later file wins for a name in both)"), checks.in_file)
    p.add_argument("--random-inputs", metavar="SEED", type=seed,
                   help="draw standard-normal inputs with this seed (with --inputs: only those the files lack)")
    p.add_argument("--dynamic", action="append", default=None, metavar="NAME=N",
                   help="a graph with dynamic dims: the extent of dim NAME for --random-inputs (default: the "
                        "extents of the --inputs arrays); the bucket holding it runs (repeatable)")
    add_out(p, checks.out_file, "where to write the outputs (.npz)", metavar="OUT.npz", required=True)
    p.add_argument("--backend", default="reference", choices=sorted(BACKENDS),
                   help="how to execute (default: reference)")
    p.add_argument("--schedule", metavar="JSON|@FILE", default=None,
                   help="schedule for kernel backends: inline JSON or @file")
    add_db(p, checks.db_maybe, "tuning database the kernel backends choose the schedule from")
    add_device(p, "device preset for kernel backends (default: the local GPU, else h200)")
    p.set_defaults(func=_cmd_run)


def _cmd_run(args: argparse.Namespace) -> int:
    from stitchtune.graph.reference import check_inputs, random_inputs

    if not args.inputs and args.random_inputs is None:
        raise StitchtuneError("the inputs are needed: --inputs IN.npz (repeatable) and/or --random-inputs SEED")
    g = dynamic_cli.load_for(args)
    if dynamic_cli.is_dynamic(g):
        return dynamic_cli.cmd_run(args, g)
    schedule = parse_schedule_arg(args.schedule)
    inputs: dict[str, np.ndarray] = {}
    for path in args.inputs or ():
        inputs.update(load_inputs_npz(path, g))
    if args.random_inputs is not None:
        inputs = {**random_inputs(g, args.random_inputs), **inputs}
    else:
        try:
            check_inputs(g, inputs)
        except StitchtuneError as e:
            hint = ["--random-inputs SEED draws the inputs that no --inputs file has"] \
                if any(": missing" in p for p in e.problems) else []
            raise StitchtuneError(problems=[*e.problems, *hint]) from None
    outputs = BACKENDS[args.backend](g, inputs, schedule, db=args.db, device=args.device)
    save_outputs_npz(args.out, outputs)
    for name, a in outputs.items():
        print(f"{name}: {a.dtype}{list(a.shape)}")
    print(f"wrote {args.out}")
    return 0


# ---------------------------------------------------------------------------- compile
def _add_compile(sub: Any) -> None:
    p = sub.add_parser("compile", help="write the kernels the tuning database selects (CUDA, cubin, manifest)")
    add_graph(p)
    add_db(p, checks.db_maybe)
    add_out(p, checks.out_dir, "output directory (default: compiled/<graph name>)", metavar="DIR")
    add_device(p)
    p.add_argument("--schedule", metavar="JSON|@FILE", default=None,
                   help="compile this schedule instead of the database's choice")
    p.add_argument("--no-cubin", action="store_true", help="do not run nvcc (source and manifest only)")
    p.add_argument("--deterministic", action="store_true",
                   help="only a bitwise-reproducible schedule (no float atomics)")
    p.add_argument("--dynamic", action="append", default=None, metavar="NAME=LO..HI[:B1,...]",
                   help="a graph with dynamic dims: compile these buckets of dim NAME, within the graph's "
                        "bounds (default: the buckets the graph declares; use the ones search --dynamic tuned)")
    p.set_defaults(func=_cmd_compile)


def _cmd_compile(args: argparse.Namespace) -> int:
    from stitchtune.deploy.compiled import compile as st_compile

    g = dynamic_cli.load_for(args)
    if dynamic_cli.is_dynamic(g):  # every bucket
        return dynamic_cli.cmd_compile(args, g)
    out = args.out or os.path.join("compiled", g.name)
    why = checks.out_dir(out) if args.out is None else None
    if why:
        raise StitchtuneError(f"output directory {ascii(out)} (the default; -o/--out DIR names another): {why}")
    cg = st_compile(g, db=args.db, device=args.device, schedule=parse_schedule_arg(args.schedule),
                    build=False if args.no_cubin else None, deterministic=args.deterministic)
    paths = cg.write(out)
    m = cg.manifest
    print(f"{g.name} on {m['device_key']}: schedule {m['schedule_key']} ({cg.source})")
    if cg.source in ("tuned", "given"):  # a fallback's reason was logged as a warning already
        print(f"  why: {m['choice']['reason']}")
    for k in m["kernels"]:
        regs = f", {k['registers']} registers" if k.get("registers") is not None else ""
        print(f"  {k['kernel']}<<<{k['grid'][0]}, {k['block'][0]}, {k['dynamic_smem_bytes']}>>>"
              f"({', '.join(a['buffer'] for a in k['args'])}){regs}")
    if cg.cubin is None:
        print(no_cubin_line(args.no_cubin))
    print(f"wrote {', '.join(str(p) for p in paths)}")
    return 0


# ---------------------------------------------------------------------------- devices
def _add_devices(sub: Any) -> None:
    p = sub.add_parser("devices", help="list device presets and the GPU cuda-python finds")
    add_device(p, "print one device's full description")
    p.add_argument("--check", action="store_true",
                   help="compare the occupancy model with the CUDA driver on the local GPU (needs nvcc)")
    p.set_defaults(func=_cmd_devices)


def _cmd_devices(args: argparse.Namespace) -> int:
    from stitchtune.hardware.device import PRESETS, get_device
    from stitchtune.errors import ToolchainError
    from stitchtune.gpu.device_query import query_device
    from stitchtune.hardware.occupancy import driver_check

    if args.device:
        print(json.dumps(get_device(args.device).to_dict(), indent=1))
        return 0
    try:
        gpu = query_device()
    except ToolchainError as e:
        gpu = None
        print(f"no GPU found through cuda-python ({e}); --device NAME picks a preset")
    rows = ([("gpu", gpu)] if gpu else []) + list(PRESETS.items())
    for short, d in rows:
        copy = f"{d.copy_bandwidth_gbs:.0f} (measured)" if d.copy_bandwidth_gbs else "-"
        print(f"{short:5s} {d.key:32s} SMs {d.sm_count:4d}  smem/SM {d.smem_per_sm // 1024:3d} KiB  "
              f"L2 {d.l2_bytes / 2**20:5.1f} MiB  DRAM {d.dram_bandwidth_gbs:6.0f} GB/s  copy {copy}")
    if args.check:
        if gpu is None:
            raise ToolchainError("--check needs a GPU")
        from stitchtune.gpu.build import find_nvcc
        from stitchtune.gpu.driver import default_ordinal

        total, bad = driver_check(gpu, ordinal=default_ordinal(), nvcc=find_nvcc())
        for m in bad:
            print(f"MISMATCH {m}")
        print(f"occupancy check on {gpu.key}: {total - len(bad)}/{total} configurations agree with "
              "cuOccupancyMaxActiveBlocksPerMultiprocessor")
        return 1 if bad else 0
    return 0


# ---------------------------------------------------------------------------- parser / main
def _add_space(sub: Any) -> None:
    p = sub.add_parser("space", help="print valid schedules of a graph's search space as JSON lines")
    add_graph(p)
    p.add_argument("--sample", type=int_at_most(MAX_SAMPLES), default=5, metavar="N",
                   help="how many schedules (default 5)")
    p.add_argument("--seed", type=seed, default=0, metavar="S", help="random seed (default 0)")
    add_device(p)
    p.add_argument("--heuristic", action="store_true", help="print the heuristic schedule first")
    p.set_defaults(func=_cmd_space)


def _cmd_space(args: argparse.Namespace) -> int:
    import random

    from stitchtune.hardware.device import get_device
    from stitchtune.gpu.device_query import default_device
    from stitchtune.cost.heuristic import heuristic_schedule
    from stitchtune.lower.resources import legal_space
    from stitchtune.plan.planner import make_plan

    if args.sample < 0:
        raise StitchtuneError(f"--sample must be >= 0 (got {args.sample})")
    g = dynamic_cli.static_only(args.graph)
    dev = get_device(args.device) if args.device else default_device()
    plan = make_plan(g)
    space = legal_space(g, plan, dev)
    if args.heuristic:
        print(heuristic_schedule(plan, dev, space).to_json())
    rng = random.Random(args.seed)
    for _ in range(args.sample):
        print(space.sample(rng).to_json())
    return 0


_SUBCOMMANDS: list[Callable[[Any], None]] = [
    _add_space,
    _add_validate,
    _add_run,
    _add_compile,
    _add_report,
    _add_calibrate,
    _add_model_check,
    _add_devices,
    _add_bench,
    _add_search,
    _add_show,
    _add_export,
    _add_tune,
    _add_import,
    _add_audit,
]


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="stitchtune",
        description="Autotune stitch schedules for memory-intensive GPU subgraphs.")
    parser.add_argument("--version", action="version", version=f"stitchtune {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="more logging (-v info, -vv debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in _SUBCOMMANDS:
        add(sub)
    return parser


def _print_error(msg: str) -> None:
    for line in str(msg).splitlines() or [""]:
        print(f"stitchtune: error: {line}", file=sys.stderr)


@functools.lru_cache(maxsize=4)
def _parser(db_default: str) -> argparse.ArgumentParser:
    """:func:`build_parser`, built once per default database: building it costs ~8 ms (hundreds of
    ``add_argument`` calls and gettext lookups), more than validating a graph, and the only part of it
    that depends on the environment is the ``--db`` default (``$STITCHTUNE_DB``), hence the key.
    argparse parsers hold no per-call state, so reuse across :func:`main` calls is safe."""
    return build_parser()


def _quiet_stdout() -> None:
    """After a closed pipe: point stdout at /dev/null so that the interpreter's final flush is quiet."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):   # in-process callers' StringIO: nothing to flush at exit
        return
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
    except OSError:
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (see module docstring)."""
    parser = _parser(str(default_db()))
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse usage errors (2), --help/--version (0)
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    except BrokenPipeError:  # --help into a closed pipe
        _quiet_stdout()
        return 0
    level = logging.WARNING if args.verbose == 0 else logging.INFO if args.verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="stitchtune: %(levelname)s: %(message)s")
    try:
        checks.preflight(args)
        rc = int(args.func(args))
        if sys.stdout is not None:  # None when started with stdout closed (print then writes nothing)
            sys.stdout.flush()
        return rc
    except StitchtuneError as e:
        for problem in e.problems:
            _print_error(problem)
        return 2
    except KeyboardInterrupt as e:  # Interrupted says what was kept (cli.interrupts)
        print(f"stitchtune: {e if isinstance(e, Interrupted) else 'interrupted'}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of stdout went away (`... | head`): stop quietly
        _quiet_stdout()
        return 0
    except OSError as e:  # a path the user named that the checks could not foresee (a race, /proc as root)
        if from_ctrl_c(e):  # Ctrl-C inside a library's clean-up (module docstring of errors.from_ctrl_c)
            print("stitchtune: interrupted", file=sys.stderr)
            return 130
        if not checks.is_about(e, checks.user_paths(args)):
            raise
        _print_error(f"{ascii(e.filename)}: {e.strerror or e}")
        return 2


def entry() -> int:
    """The process entry (the ``stitchtune`` script, ``python -m stitchtune``): :func:`main`, and after an
    interrupt (130) the rest of the exit ignores Ctrl-C: a second SIGINT (a key pressed twice, or one still
    pending from a library's C code when the first was reported) would otherwise kill the interpreter
    during its shutdown, exiting by signal instead of 130 after the line saying what was kept."""
    import signal
    import threading

    rc = main()
    if rc == 130 and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    return rc

