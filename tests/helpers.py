"""What the tests share (the one helpers module; fixtures are in conftest.py).

* Paths: ``REPO``, ``EXAMPLES_DIR``, ``SMALL_EXAMPLES`` / ``FULL_EXAMPLES`` (sorted Paths), ``COMMITTED_DB``
  (the committed H200 tuning database, ``results/h200-2026-11-29``).
* Lowering: ``DEV`` (H200 preset), ``setup(name)`` -> (graph, plan, space), ``rel_err``,
  ``emulated_errors`` and ``suggested`` (schedules drawn the way optuna would); ``ce_graph`` (cross
  entropy with integer targets: log-softmax, a ``gather_elements`` pick, a scalar epilogue).
* nvcc: ``batch_source`` (many programs in one translation unit), ``ptxas_report`` (one nvcc -O3 build
  for sm_90 and its ``-Xptxas -v`` report), ``compile_programs_sm90`` (both, registers per kernel) and
  ``shared_ptxas_report`` (one build per source for the whole run, shared by the xdist workers);
  ``BUILDER_FLAGS`` (what the NvccBuilder adds, for batched builds of what it would build one by one).
* Search fakes: a 15-point fake space (block in ``BLOCKS`` x vec in ``VECS``) whose outcomes are fixed
  per point (``FATES``: (32,4) illegal -> pruned; (512,4) cost-model prune_reason -> pruned; (64,4)
  compile_error; (64,2) build timeout -> timeout; (512,1) launch_error; (512,2) run timeout; (128,1)
  wrong_result; all others ok with time = predicted time, fake, not a measurement), with
  ``fake_stages``, ``FakeBuilder``, ``FakeRunner`` and ``fake_components`` for ``run_search``.
* Hypothesis strategies for hostile graph files: ``hostile_names``, ``json_values``, ``malformed_graph``
  (strategies built once at import, not per draw); ``pick(draw, items)`` draws one of a sequence that
  changes per example without building a ``sampled_from`` for it; ``SMALL_GRAPHS`` (one of the small
  examples, as a dict: copy before changing it); ``LOWER`` (a-z).
* ``call_cli(argv)``: ``stitchtune ARGV`` in this process -> (exit status, stdout, stderr).
* ``time_limit(seconds)``: a context manager that raises ``Hang`` when its body runs longer (SIGALRM;
  the main thread only), for in-process CLI calls that must not hang.
* ``forked_cli(argv, out, err)`` / ``run_forked_cli(argv, tmp)``: ``python -m stitchtune ARGV`` as a process
  of its own forked from a server that imported the CLI's search path once (``FORKED_PRELOAD``), for the
  tests that start, kill and wait on many CLI processes; ``start_fork_server()`` starts the server ahead
  (a test that times its first process), ``stop_fork_server()`` ends (and waits for) it.
"""

from __future__ import annotations

import contextlib
import json
import math
import multiprocessing
import os
import random
import signal
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from hypothesis import strategies as st

from stitchtune.emulate.emulator import emulate_program
from stitchtune.errors import ScheduleError
from stitchtune.graph.parse import DTYPES, MAX_RANK, NAME_RE, load_graph, parse_graph
from stitchtune.graph.ops import OPS
from stitchtune.hardware.device import get_device
from stitchtune.lower.entry import lower
from stitchtune.plan.planner import make_plan
from stitchtune.space import Schedule, Scheme, SearchSpace
from stitchtune.tune.pipeline import Stages
from stitchtune.tune.search import Components

REPO = Path(__file__).resolve().parent.parent


class Hang(Exception):
    """A call under :func:`time_limit` ran past its limit."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise :class:`Hang` in the body after ``seconds`` (SIGALRM; restores the previous handler)."""
    def boom(signum: int, frame: Any) -> None:
        raise Hang(f"no answer after {seconds} s")

    old = signal.signal(signal.SIGALRM, boom)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# ------------------------------------------------------------------------------------------ forked CLI
#: what a ``stitchtune search`` imports before its first trial: imported once by the fork server
FORKED_PRELOAD = ["helpers", "stitchtune.cli", "stitchtune.cli.tuning", "stitchtune.tune.search",
                  "stitchtune.tune.database", "stitchtune.tune.config", "stitchtune.lower.entry",
                  "stitchtune.cost.heuristic", "stitchtune.emulate.emulator", "stitchtune.gpu.runners",
                  "optuna", "pandas", "pyarrow.parquet"]


def _cli_child(argv: list[str], env: dict[str, str], cwd: str, out: str, err: str) -> None:
    """In the forked process: the caller's environment and directory, stdout/stderr (the file
    descriptors, so that everything the process writes lands there) into ``out``/``err``, then the
    CLI's ``main`` as ``python -m stitchtune`` runs it; its return value is the exit code."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    # the platform's default start method, as in ``python -m stitchtune`` (the fork server's child inherits
    # "forkserver": its locks would be named semaphores, reported leaked when the process is killed)
    multiprocessing.set_start_method(None, force=True)
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)   # noqa: SIM115 (the process's own stream)
    sys.stderr = open(2, "w", encoding="utf-8", closefd=False)   # noqa: SIM115
    from stitchtune.cli import main

    sys.exit(main(argv))


def forked_cli(argv: list[str], out: Path | str = os.devnull, err: Path | str = os.devnull,
               env: dict[str, str] | None = None) -> Any:
    """Start ``python -m stitchtune ARGV`` as a process forked from the fork server (a
    ``multiprocessing.Process``: ``pid``, ``kill()``, ``join(timeout)``, ``exitcode``, negative for a signal).

    The process runs the real CLI (``main``) on its own, like a subprocess, without paying the
    interpreter's start-up and the imports of ``FORKED_PRELOAD`` again (about 2-3 CPU-s per process
    here): the server (started on first use, once per test process) did them. ``env`` (default: this
    process's environment now) replaces the process's environment."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(FORKED_PRELOAD)   # takes effect when the server starts
    proc = ctx.Process(target=_cli_child, args=(list(argv), dict(os.environ if env is None else env), os.getcwd(),
                                                str(out), str(err)), daemon=False)
    proc.start()
    return proc


def run_forked_cli(argv: list[str], tmp: Path, env: dict[str, str] | None = None,
                   timeout: float = 600) -> tuple[int, str, str]:
    """:func:`forked_cli` to completion: (exit code, stdout, stderr); the output files go in ``tmp``."""
    tmp.mkdir(parents=True, exist_ok=True)
    run_dir = Path(tempfile.mkdtemp(dir=tmp, prefix="cli-"))
    out, err = run_dir / "stdout", run_dir / "stderr"
    proc = forked_cli(argv, out, err, env)
    proc.join(timeout)
    if proc.exitcode is None:
        proc.kill()
        proc.join()
        raise TimeoutError(f"stitchtune {' '.join(argv[:2])} ran longer than {timeout} s")
    # (no file: the process died before its CLI started; the exit code tells)
    return proc.exitcode, *(p.read_text() if p.exists() else "" for p in (out, err))


def start_fork_server() -> Any:
    """Start the fork server unless it runs and wait until it has imported ``FORKED_PRELOAD``
    (seconds); its context."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(FORKED_PRELOAD)   # takes effect when the server starts
    first = ctx.Process(target=os.getpid)   # forked once the imports are done
    first.start()
    first.join()
    return ctx


def stop_fork_server() -> None:
    """End the fork server (it exits once its forked processes are done) and wait for it, so that no
    process outlives the tests and the CPU time of what it ran is counted with the test run's."""
    from multiprocessing import forkserver

    stop = getattr(forkserver._forkserver, "_stop", None)   # private, CPython 3.8+
    if stop is not None:
        stop()


EXAMPLES_DIR = REPO / "examples"
EXAMPLES = EXAMPLES_DIR
SMALL_EXAMPLES = sorted(EXAMPLES_DIR.glob("*_small.json"))
FULL_EXAMPLES = sorted(p for p in EXAMPLES_DIR.glob("*.json") if not p.stem.endswith("_small"))
SMALL_DICTS = [json.loads(p.read_text()) for p in SMALL_EXAMPLES]
COMMITTED_DB = REPO / "results" / "h200-2026-11-29"


# ---------------------------------------------------------------------------- lowering

DEV = get_device("H200")


def setup(name: str) -> tuple[Any, Any, SearchSpace]:
    """(graph, plan, space on the H200 preset) of ``examples/<name>``."""
    g = load_graph(EXAMPLES / name)
    plan = make_plan(g)
    return g, plan, SearchSpace.for_plan(plan, DEV)


def rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    """||out - ref||_2 / ||ref||_2 in float64; ``inf`` when ``out`` holds a NaN or an infinity (so a
    ``< tol`` check fails on it, also inside ``max`` over several outputs)."""
    r = np.asarray(ref, dtype=np.float64)
    x = np.asarray(out, dtype=np.float64).reshape(r.shape)
    if not np.all(np.isfinite(x)):
        return float("inf")
    return float(np.linalg.norm(x - r) / max(np.linalg.norm(r), 1e-30))


def emulated_errors(g: Any, plan: Any, space: SearchSpace, s: Schedule, inputs: dict[str, np.ndarray],
                    ref: dict[str, np.ndarray]) -> dict[str, float]:
    """Relative error per output of schedule ``s`` run in the emulator (every grid co-resident)."""
    out = emulate_program(lower(g, plan, s, DEV, space), inputs, coresident_limit=lambda k: 1 << 30)
    return {o: rel_err(out[o], ref[o]) for o in ref}


def float_graph(inputs: dict[str, list[int]], nodes: list[dict[str, Any]], outputs: list[str]) -> Any:
    """The validated graph ``t`` with float32 ``inputs`` (name -> shape), ``nodes`` and ``outputs``."""
    from stitchtune.graph.parse import parse_graph

    return parse_graph({"name": "t", "inputs": {k: {"shape": v, "dtype": "float32"} for k, v in inputs.items()},
                        "nodes": nodes, "outputs": outputs})


def plan_or_refused(obj: dict[str, Any]) -> tuple[Any, Any]:
    """(graph, plan) of a graph dict, or (graph, None) when the planner refuses it; a refusal must be
    one line (the contract for every unsupported graph)."""
    from stitchtune.errors import UnsupportedGraphError
    from stitchtune.graph.parse import parse_graph

    g = parse_graph(obj)
    try:
        return g, make_plan(g)
    except UnsupportedGraphError as e:
        assert "\n" not in str(e), str(e)
        return g, None


def check_emulates(g: Any, n_samples: int = 3, input_seed: int = 4, tol: float = 1e-5) -> None:
    """Plan ``g``; its heuristic schedule and ``n_samples`` seeded samples (seeds 0..n-1) emulate within
    ``tol`` (relative L2 per output) of the float64 reference on seeded random inputs."""
    from stitchtune.cost.heuristic import heuristic_schedule
    from stitchtune.graph.reference import random_inputs, run_reference

    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    inputs = random_inputs(g, input_seed)
    ref = run_reference(g, inputs)
    for s in [heuristic_schedule(plan, DEV, space)] + [space.sample(random.Random(i)) for i in range(n_samples)]:
        for o, err in emulated_errors(g, plan, space, s, inputs, ref).items():
            assert err < tol, (g.name, s.to_json(), o, err)


def channels_last_ln_backward(h: int = 4, w: int = 4, c: int = 32, grad: str = "merged") -> Any:
    """A channels-last layer norm's backward as ConvNeXt's training step has it: ``dx`` (row sums over
    ``C`` of ``[1, H, W, C]``) and the column sums ``dgamma``, ``dbeta`` over ``(1, H, W)``. ``grad``:
    how the gradient ``dy`` comes in: ``"merged"`` (a matmul's ``[H*W, C]`` viewed as ``[1, H, W, C]``)
    or ``"nchw"`` (a convolution's ``[1, C, H, W]`` transposed to ``[1, H, W, C]``)."""
    def red(i: str, a: str, axes: list[int], keep: bool) -> dict[str, Any]:
        return {"id": i, "op": "reduce_sum", "args": [a], "axes": axes, "keepdims": keep}

    first = ({"id": "v", "op": "reshape", "args": ["dy"], "shape": [1, h, w, c]} if grad == "merged" else
             {"id": "v", "op": "transpose", "args": ["dy"], "perm": [0, 2, 3, 1]})
    nodes = [first, {"id": "xc", "op": "sub", "args": ["x", "mu"]}, {"id": "xh", "op": "mul", "args": ["xc", "rs"]},
             {"id": "g", "op": "mul", "args": ["v", "gamma"]}, {"id": "gn", "op": "mul", "args": ["g", float(c)]},
             red("s1", "g", [3], True), {"id": "gx", "op": "mul", "args": ["g", "xh"]}, red("s2", "gx", [3], True),
             {"id": "t", "op": "mul", "args": ["xh", "s2"]}, {"id": "a", "op": "sub", "args": ["gn", "s1"]},
             {"id": "b", "op": "sub", "args": ["a", "t"]}, {"id": "d", "op": "div", "args": ["rs", float(c)]},
             {"id": "dx", "op": "mul", "args": ["d", "b"]}, {"id": "vx", "op": "mul", "args": ["v", "xh"]},
             red("dgamma", "vx", [0, 1, 2], False), red("dbeta", "v", [0, 1, 2], False)]
    dy = [h * w, c] if grad == "merged" else [1, c, h, w]
    return float_graph({"dy": dy, "x": [1, h, w, c], "mu": [1, h, w, 1], "rs": [1, h, w, 1], "gamma": [c]},
                       nodes, ["dx", "dgamma", "dbeta"])


GLOBAL_ROWS = Scheme(
    "global_rows", "split == 1 and family == 'row'", partials=True, grid_barrier=True, cost_term="grid_barriers",
    doc="global stitching of whole rows: each row's value through global scratch after a grid barrier")
"""A scheme made of existing exchange steps and declared only in the tests (``tests/space/test_schemes.py``,
``tests/lower/test_scheme_contract.py``): a row that one block holds still hands its reduced value over
through global memory and a grid barrier (AStitch's global stitching without a split)."""


def local_scheme_space(name: str) -> SearchSpace:
    """The space of ``examples/<name>`` on the H200 with :data:`GLOBAL_ROWS` declared and offered (a table
    with it added, its name appended to the space file's scheme choices)."""
    from stitchtune.space import SCHEMES, load_space_file

    plan = make_plan(load_graph(EXAMPLES / name))
    data = load_space_file()
    data["params"]["scheme"]["choices"] = [*data["params"]["scheme"]["choices"], GLOBAL_ROWS.name]
    return SearchSpace(plan, DEV, data, schemes=SCHEMES.extended(GLOBAL_ROWS))


def assert_matches_golden(path: Path, text: str, what: str) -> None:
    """``text`` equals the golden file ``path``, else fail with a unified diff of the two (the first
    200 lines of it). ``STITCHTUNE_REGEN_GOLDEN=1`` rewrites the file instead (a deliberate change of
    generated code, to be said in its commit); a missing file is written and the test fails."""
    import difflib

    import pytest

    if os.environ.get("STITCHTUNE_REGEN_GOLDEN") or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if not os.environ.get("STITCHTUNE_REGEN_GOLDEN"):
            pytest.fail(f"golden file {path.name} was missing and has been written; commit it")
        return
    want = path.read_text()
    if text != want:
        diff = list(difflib.unified_diff(want.splitlines(), text.splitlines(), f"{path.name} (golden)",
                                         f"{path.name} (generated)", lineterm=""))
        pytest.fail(f"{what} differs from {path.name} ({len(diff)} diff lines; regenerate with "
                    f"STITCHTUNE_REGEN_GOLDEN=1 only for an intended change):\n" + "\n".join(diff[:200]),
                    pytrace=False)


def check_compiles_sm90(g: Any, seed: int, tmp_path: Path) -> None:
    """The heuristic schedule of ``g`` and the sample drawn with ``seed`` render to CUDA that nvcc builds
    for sm_90 with the NvccBuilder's flags, both in one translation unit (:func:`compile_programs_sm90`;
    ptxas must report every kernel)."""
    from stitchtune.cost.heuristic import heuristic_schedule

    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    programs = [lower(g, plan, s, DEV, space)
                for s in (heuristic_schedule(plan, DEV, space), space.sample(random.Random(seed)))]
    compile_programs_sm90(programs, tmp_path, flags=BUILDER_FLAGS)


def batch_source(programs: list[Any]) -> tuple[str, list[str]]:
    """One CUDA translation unit for many kir programs (the preamble once, kernels renamed ``p<i>_<name>``)
    and the kernel names in it. One nvcc call for many kernels: each nvcc process costs ~0.8 s of CPU
    before it compiles anything (headers, cicc and ptxas start-up), one kernel a small part of that."""
    import dataclasses

    from stitchtune.gpu.render import preamble, render_kernel

    src = preamble([k for prog in programs for k in prog.kernels])
    names = []
    for i, prog in enumerate(programs):
        for k in prog.kernels:
            k2 = dataclasses.replace(k, name=f"p{i}_{k.name}")
            names.append(k2.name)
            src += "\n" + render_kernel(k2) + "\n"
    return src, names


#: the flags :class:`stitchtune.gpu.build.NvccBuilder` adds to ``-O3 -Xptxas -v`` by default (line info)
BUILDER_FLAGS = ("-lineinfo",)


def ptxas_report(src: str, tmp_path: Path, timeout: int, flags: tuple[str, ...] = ()) -> str:
    """Compile ``src`` for sm_90 with nvcc -O3 and ``flags`` (the test skips without nvcc; a failed build
    fails it) and return ptxas's ``-v`` report."""
    import shutil
    import subprocess

    import pytest

    nvcc = shutil.which("nvcc") or shutil.which("/usr/local/cuda/bin/nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found")
    (tmp_path / "k.cu").write_text(src)
    r = subprocess.run([nvcc, "-cubin", "-arch=sm_90", "-O3", "-Xptxas", "-v", *flags, "-o", "k.cubin", "k.cu"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stderr


def shared_ptxas_report(src: str, shared_dir: Path, timeout: int = 600) -> str:
    """:func:`ptxas_report` of ``src``, built once per run: the first test (on any xdist worker) to ask
    builds it under an exclusive lock and stores the report by the source's sha256; the others wait
    for the lock and read it (conftest's ``shared_build_dir`` fixture gives ``shared_dir``)."""
    import fcntl
    import hashlib

    key = hashlib.sha256(src.encode()).hexdigest()[:24]
    out = shared_dir / f"{key}.ptxas.txt"
    with open(shared_dir / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not out.is_file():
                work = shared_dir / key
                work.mkdir(exist_ok=True)
                report = ptxas_report(src, work, timeout)
                tmp = out.with_suffix(".tmp")
                tmp.write_text(report)
                tmp.replace(out)
            return out.read_text()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def compile_programs_sm90(programs: list[Any], tmp_path: Path, timeout: int = 600,
                          flags: tuple[str, ...] = ()) -> list[dict[str, int]]:
    """Build ``programs`` for sm_90 in one nvcc call (:func:`batch_source`, :func:`ptxas_report` with
    ``flags``); the registers ptxas reports for each program's kernels (``{kernel name: registers}``, one
    dict per program, every kernel present)."""
    import re

    src, names = batch_source(programs)
    report = ptxas_report(src, tmp_path, timeout, flags)
    regs = {n: int(r) for n, r in re.findall(r"Compiling entry function '(\w+)'.*?Used (\d+) registers", report, re.S)}
    assert set(regs) == set(names), sorted(set(names) ^ set(regs))
    return [{k.name: regs[f"p{i}_{k.name}"] for k in prog.kernels} for i, prog in enumerate(programs)]


def heuristic_programs(graphs: list[Any], vec4: bool = False) -> list[Any]:
    """The programs of each graph's heuristic schedule on the H200 (planned, spaced and lowered as a search
    would), and with ``vec4`` also each one's ``vec = 4`` variant where the space allows it: the input of a
    batched compile test (:func:`compile_programs_sm90`)."""
    import dataclasses

    from stitchtune.cost.heuristic import heuristic_schedule

    dev = DEV
    programs = []
    for g in graphs:
        plan = make_plan(g)
        space = SearchSpace.for_plan(plan, dev)
        base = heuristic_schedule(plan, dev, space)
        wide = dataclasses.replace(base, vec=4)
        keep = [base, wide] if vec4 and not space.violations(wide) else [base]
        programs += [lower(g, plan, s, dev, space) for s in keep]
    return programs


def suggested(space: SearchSpace, n: int, seed: int) -> list[tuple[dict[str, Any], Schedule]]:
    """``n`` (optuna parameters, schedule) pairs suggested by a random-sampler study (define-by-run);
    every schedule's :meth:`SearchSpace.params_of` is checked to give back its trial's parameters."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    out = []
    for _ in range(n):
        t = study.ask()
        s = space.suggest(t)
        assert space.params_of(s) == t.params
        out.append((dict(t.params), s))
        study.tell(t, 1.0)
    return out



# ---------------------------------------------------------------------------- search fakes
BLOCKS = (32, 64, 128, 256, 512)
VECS = (1, 2, 4)
FATES = {
    (32, 4): "illegal", (512, 4): "prune_reason", (64, 4): "compile_error", (64, 2): "build_timeout",
    (512, 1): "launch_error", (512, 2): "timeout", (128, 1): "wrong_result",
}


@dataclass(frozen=True)
class FakeSchedule:
    block: int
    vec: int

    def key(self) -> str:
        return f"b{self.block}-v{self.vec}"

    def to_dict(self) -> dict[str, Any]:
        return {"block": self.block, "vec": self.vec}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FakeSchedule:
        return cls(int(d["block"]), int(d["vec"]))

    def flat(self) -> dict[str, Any]:
        return self.to_dict()

    @property
    def deterministic(self) -> bool:
        return True


class FakeSpace:
    """A two-parameter space (tune.protocols.SpaceLike): nothing atomic, no variants, already flat."""

    version = "fake-space-1"
    deterministic = False

    def suggest(self, trial: optuna.Trial) -> FakeSchedule:
        return FakeSchedule(trial.suggest_categorical("block", list(BLOCKS)),
                            trial.suggest_categorical("vec", list(VECS)))

    def params_of(self, s: FakeSchedule) -> dict[str, Any]:
        return {"block": s.block, "vec": s.vec}

    def grid(self) -> list[FakeSchedule]:
        return [FakeSchedule(b, v) for b in BLOCKS for v in VECS]

    def sample(self, rng) -> FakeSchedule:
        return FakeSchedule(int(rng.choice(BLOCKS)), int(rng.choice(VECS)))

    def variants(self, s: FakeSchedule) -> list[FakeSchedule]:
        return []

    def deterministic_only(self) -> FakeSpace:
        return self

    def flat_mode(self) -> FakeSpace:
        return self


@dataclass(frozen=True)
class FakePlan:
    """tune.protocols.PlanLike: no reduction combined across blocks."""

    cross: tuple[Any, ...] = ()


@dataclass(frozen=True)
class FakeSpec:
    shape: tuple[int, ...]
    dtype: str = "float32"


class FakeGraph:
    def __init__(self, name: str = "fake_ln", rows: int = 64) -> None:
        self.name = name
        self.rows = rows
        self.inputs = (("x", FakeSpec((rows, 1024))),)
        self.outputs = ("y",)

    def spec(self, name: str) -> FakeSpec:
        return FakeSpec((self.rows, 1024))

    def workload_key(self) -> str:
        return f"{self.name}-{self.rows}".encode().hex().ljust(64, "0")

    def structure_key(self) -> str:
        return self.name.encode().hex().ljust(64, "0")

    def min_bytes(self) -> int:
        return 2 * self.rows * 1024 * 4


@dataclass(frozen=True)
class FakeDevice:
    key: str = "fakegpu-sm90"
    name: str = "fakegpu"
    arch: str = "sm_90"
    compute_capability: tuple[int, int] = (9, 0)
    copy_bandwidth_gbs: float = 1000.0

    def effective_copy_bandwidth_gbs(self) -> float:
        return self.copy_bandwidth_gbs


@dataclass(frozen=True)
class FakeProfile:
    schedule: FakeSchedule


@dataclass(frozen=True)
class FakeProgram:
    schedule: FakeSchedule
    profile: FakeProfile


@dataclass(frozen=True)
class FakePrediction:
    time_us: float
    occupancy: float
    prune_reason: str | None
    per_kernel_us: tuple[float, ...] = ()
    limiter: str = "fake"


@dataclass(frozen=True)
class FakeBuild:
    status: str
    source_hash: str
    cubin_path: str | None
    arch: str
    registers: dict
    smem_bytes: dict
    spill_bytes: dict
    stack_bytes: dict
    compile_s: float
    error: str


@dataclass(frozen=True)
class FakeMeasurement:
    status: str
    median_us: float | None
    samples_us: tuple[float, ...]
    max_rel_error: float | None
    estimated: bool
    error: str


def fake_time(s: FakeSchedule) -> float:
    """The fake objective: best at block 256, vec 2 (not a measured figure)."""
    return 10.0 + abs(s.block - 256) / 16.0 + {1: 6.0, 2: 0.0, 4: 3.0}[s.vec]


def fake_lower(graph, plan, s: FakeSchedule, device) -> FakeProgram:
    if FATES.get((s.block, s.vec)) == "illegal":
        raise ScheduleError(f"vec 4 needs block >= 64 (block {s.block})")
    return FakeProgram(s, FakeProfile(s))


def fake_predict(program: FakeProgram, device, registers=None) -> FakePrediction:
    s = program.schedule
    reason = "occupancy 0: shared memory over the limit" if FATES.get((s.block, s.vec)) == "prune_reason" else None
    return FakePrediction(fake_time(s), 0.5, reason)


def fake_should_prune(pred, best, factor) -> str | None:
    if best is not None and pred.time_us > factor * best:
        return f"predicted {pred.time_us:.1f} us > {factor} x best {best:.1f} us"
    return None


def fake_render(program: FakeProgram) -> str:
    return f"// fake kernel block={program.schedule.block} vec={program.schedule.vec}\n"


def fake_stages() -> Stages:
    return Stages(lower=fake_lower, render=fake_render, predict=fake_predict, should_prune=fake_should_prune,
                  codegen_version="fake-cg-1")


class FakeBuilder:
    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def build(self, sources: list[str], arch: str) -> list[FakeBuild]:
        self.calls.append(list(sources))
        out = []
        for src in sources:
            fate = None
            for (b, v), f in FATES.items():
                if f"block={b} vec={v}\n" in src:
                    fate = f
            status = {"compile_error": "compile_error", "build_timeout": "timeout"}.get(fate, "ok")
            error = {"compile_error": "fake.cu(3): error: identifier undefined",
                     "build_timeout": "nvcc timed out after 1 s"}.get(fate, "")
            out.append(FakeBuild(status, str(hash(src)), None, arch, {"k0": 40}, {"k0": 0}, {"k0": 0}, {"k0": 0},
                                 0.01, error))
        return out


class FakeRunner:
    """Counts measurements per schedule key; optionally appends one line per measurement to a log file."""

    def __init__(self, log_path: str | None = None) -> None:
        self.measured: list[str] = []
        self.log_path = log_path
        self.closed = False

    def run(self, items) -> list[FakeMeasurement]:
        out = []
        for program, build in items:
            s = program.schedule
            self.measured.append(s.key())
            if self.log_path:
                with open(self.log_path, "a") as fh:
                    fh.write(f"{os.getpid()} {s.key()}\n")
            fate = FATES.get((s.block, s.vec))
            t = fake_time(s)
            if fate == "launch_error":
                out.append(FakeMeasurement("launch_error", None, (), None, True, "CUDA_ERROR_ILLEGAL_ADDRESS"))
            elif fate == "timeout":
                out.append(FakeMeasurement("timeout", None, (), None, True, "kernel did not return in 5 s"))
            elif fate == "wrong_result":
                out.append(FakeMeasurement("wrong_result", None, (t,), 0.5, True, "max rel error 0.5 > 1e-3"))
            else:
                out.append(FakeMeasurement("ok", t, (t, t, t), 1e-7, True, ""))
        return out

    def close(self) -> None:
        self.closed = True


def fake_components(runner: FakeRunner | None = None, builder: FakeBuilder | None = None,
                    graph: FakeGraph | None = None) -> Components:
    runner = runner or FakeRunner()
    builder = builder or FakeBuilder()
    graph = graph or FakeGraph()
    return Components(
        load_graph=lambda path: graph, make_plan=lambda g: FakePlan(), space_for_plan=lambda p, d: FakeSpace(),
        heuristic_schedule=lambda p, d: FakeSchedule(128, 4), get_device=lambda name: FakeDevice(),
        make_builder=lambda cfg, dev, backend: builder, make_runner=lambda backend, g, d: runner,
        stages=fake_stages, cuda_available=lambda: False)



# ---------------------------------------------------------------------------- hostile graph files
HOSTILE_CHARS = ['"', "'", "\n", "\r", "*/", "/*", ";", "\\", " ", "-", "$(", "`", "\x00", "é",
                 "\u2028", "{", "}", "#", "%", "."]
#: ``[a-z]{0,n}`` and ``[0-9][A-Za-z0-9_]{0,6}`` as plain text strategies over those alphabets: the same
#: strings as ``st.from_regex`` draws, at a third of its cost per example (the fuzzers draw thousands)
LOWER = "abcdefghijklmnopqrstuvwxyz"
_WORD_CHARS = LOWER + LOWER.upper() + "0123456789_"
hostile_names = st.one_of(
    st.builds(lambda a, c, b: a + c + b, st.text(LOWER, max_size=5),
              st.sampled_from(HOSTILE_CHARS), st.text(max_size=8)),
    st.builds(lambda a, b: a + b, st.sampled_from("0123456789"), st.text(_WORD_CHARS, max_size=6)),
    st.just(""), st.just("a" * 65), st.text(min_size=1, max_size=12),
).filter(lambda s: not NAME_RE.fullmatch(s))

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=10),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=12,
)
not_a_list = st.none() | st.booleans() | st.integers() | st.text(max_size=5) | \
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)
not_a_dict = st.none() | st.booleans() | st.integers() | st.text(max_size=5) | st.lists(st.integers(), max_size=2)


def _defined(d: dict[str, Any]) -> set[str]:
    return set(d["inputs"]) | {n["id"] for n in d["nodes"]}


# Strategies that malformed_graph draws from, built once: a strategy made inside a draw is a new object
# each time, validated and labelled again on every example.
SMALL_GRAPHS = st.sampled_from(SMALL_DICTS)
_MUTATIONS = st.sampled_from([
    "node_id", "input_name", "graph_name", "dim", "dtype", "op", "drop_top", "drop_node_key",
    "unknown_arg", "arity", "axes", "constant", "extra_key", "output", "swap", "top_type",
    "nodes_type", "inputs_type", "node_type", "shape_type", "dup_id", "cast_to", "rank",
])
_GRAPH_NAMES = hostile_names | st.integers() | st.none()
_BAD_DIMS = (st.integers(max_value=0) | st.floats() | st.text(max_size=3) | st.booleans() | st.none()
             | st.integers(min_value=2**31))
_NOT_DTYPES = json_values.filter(lambda v: v not in DTYPES)
_NOT_OPS = json_values.filter(lambda v: not (isinstance(v, str) and v in OPS))
_TOP_KEYS = st.sampled_from(["name", "inputs", "nodes", "outputs"])
_NODE_KEYS = st.sampled_from(["id", "op", "args"])
_NOT_ARG_NAMES = st.none() | st.booleans() | st.lists(st.integers(), max_size=2)
_BAD_AXES: st.SearchStrategy[Any] = (
    st.lists(st.integers(min_value=4) | st.integers(max_value=-5), min_size=1, max_size=3) | not_a_list | st.just([]))
_BAD_CONSTANTS: st.SearchStrategy[Any] = st.sampled_from([True, False, math.nan, 1e39, -1e300, None, {}, [1.0]])
_EXTRA_TARGETS = st.sampled_from(["top", "node", "input"])
_KNOWN_KEYS = ("id", "op", "args", "axes", "keepdims", "to", "name", "inputs", "nodes", "outputs", "description",
               "shape", "dtype")
_EXTRA_KEYS = st.text(max_size=8).filter(lambda k: k not in _KNOWN_KEYS)
_NOT_A_LIST_OR_EMPTY: st.SearchStrategy[Any] = not_a_list | st.just([])
_NOT_A_DICT_NOR_DICT = not_a_dict.filter(lambda v: not isinstance(v, dict))
_BAD_RANKS = st.lists(st.integers(1, 3), min_size=MAX_RANK + 1, max_size=MAX_RANK + 3)


def pick(draw: st.DrawFn, items: Any) -> Any:
    """One of ``items`` (a non-empty sequence), drawn as ``st.sampled_from(items)`` draws it (an index),
    without building a new strategy per call."""
    return items[draw(st.integers(0, len(items) - 1))]


@st.composite
def malformed_graph(draw: st.DrawFn) -> dict[str, Any]:
    """A small example with one mutation that certainly makes it invalid."""
    d = json.loads(json.dumps(draw(SMALL_GRAPHS)))
    nodes = d["nodes"]
    i = draw(st.integers(0, len(nodes) - 1))
    node = nodes[i]
    kind = draw(_MUTATIONS)
    if kind == "node_id":
        node["id"] = draw(hostile_names)
    elif kind == "input_name":
        k = pick(draw, sorted(d["inputs"]))
        d["inputs"][draw(hostile_names)] = d["inputs"].pop(k)
    elif kind == "graph_name":
        d["name"] = draw(_GRAPH_NAMES)
    elif kind == "dim":
        spec = d["inputs"][pick(draw, sorted(d["inputs"]))]
        j = draw(st.integers(0, len(spec["shape"]) - 1))
        spec["shape"][j] = draw(_BAD_DIMS)
    elif kind == "dtype":
        spec = d["inputs"][pick(draw, sorted(d["inputs"]))]
        spec["dtype"] = draw(_NOT_DTYPES)
    elif kind == "op":
        node["op"] = draw(_NOT_OPS)
    elif kind == "drop_top":
        del d[draw(_TOP_KEYS)]
    elif kind == "drop_node_key":
        del node[draw(_NODE_KEYS)]
    elif kind == "unknown_arg":
        defined = _defined(d)
        node["args"][0] = draw(st.text(max_size=10).filter(lambda s: s not in defined) | _NOT_ARG_NAMES)
    elif kind == "arity":
        node["args"] = node["args"] + draw(st.lists(st.sampled_from(sorted(d["inputs"])) | st.floats(0, 1),
                                                    min_size=1, max_size=3))
    elif kind == "axes":
        red = [n for n in nodes if n["op"].startswith("reduce_")]
        if red:
            red[0]["axes"] = draw(_BAD_AXES)
        else:
            node["axes"] = [0]  # not a reduction
    elif kind == "constant":
        consts = [(n, j) for n in nodes for j, a in enumerate(n["args"]) if not isinstance(a, str)]
        bad = draw(_BAD_CONSTANTS)
        if consts:
            n, j = consts[0]
            n["args"][j] = bad
        else:
            node["args"][0] = bad
    elif kind == "extra_key":
        target = draw(_EXTRA_TARGETS)
        key = draw(_EXTRA_KEYS)
        if target == "top":
            d[key] = draw(json_values)
        elif target == "node":
            node[key] = draw(json_values)
        else:
            d["inputs"][sorted(d["inputs"])[0]][key] = draw(json_values)
    elif kind == "output":
        defined = _defined(d)
        d["outputs"] = draw(st.lists(st.text(max_size=8).filter(lambda s: s not in defined),
                                     min_size=1, max_size=3) | _NOT_A_LIST_OR_EMPTY)
    elif kind == "swap":
        # move the last node (which reads an earlier node) to the front: a forward reference
        nodes.insert(0, nodes.pop())
        if all(a in d["inputs"] or not isinstance(a, str) for a in nodes[0]["args"]):
            nodes[0]["args"][0] = nodes[-1]["id"]
    elif kind == "top_type":
        d = draw(not_a_dict)  # type: ignore[assignment]
    elif kind == "nodes_type":
        d["nodes"] = draw(_NOT_A_LIST_OR_EMPTY)
    elif kind == "inputs_type":
        d["inputs"] = draw(_NOT_A_DICT_NOR_DICT)
    elif kind == "node_type":
        nodes[i] = draw(not_a_dict)
    elif kind == "shape_type":
        spec = d["inputs"][sorted(d["inputs"])[0]]
        spec["shape"] = draw(_NOT_A_LIST_OR_EMPTY)
    elif kind == "dup_id":
        node["id"] = pick(draw, sorted(_defined(d) - {node["id"]}))
    elif kind == "cast_to":
        node["op"], node["args"], node["to"] = "cast", node["args"][:1], draw(
            _NOT_DTYPES)
        node.pop("axes", None)
        node.pop("keepdims", None)
        if isinstance(node["args"][0], (int, float)):
            node["args"][0] = "x"
    elif kind == "rank":
        spec = d["inputs"][sorted(d["inputs"])[0]]
        spec["shape"] = draw(_BAD_RANKS)
    return d


def emulator_kernels(program: Any) -> dict[str, Any]:
    """FakeDriver kernels (``stitchtune.gpu.fake_driver.FakeDriver(kernels=...)``) that run each kernel of
    ``program`` in the SIMT emulator on the fake device memory the launch's arguments point at."""
    from stitchtune.emulate.emulator import elem_dtype, emulate_kernel

    def make(kernel: Any) -> Any:
        def run(drv: Any, args: tuple[int, ...], ln: Any) -> None:
            assert ln.block == (kernel.block, 1, 1) and len(args) == len(kernel.params), kernel.name
            bufs = {p.name: drv.buffer(a).view(elem_dtype(p.dtype, p.role)) for p, a in zip(kernel.params, args)}
            emulate_kernel(kernel, ln.grid[0], bufs)

        return run

    return {ln.kernel: make(program.kernel(ln.kernel)) for ln in program.launches}


# ---------------------------------------------------------------------------- ONNX importer

def onnx_vi(name: str, shape: Any, elem: int | None = None) -> Any:
    """An ONNX value info (``elem``: a TensorProto element type, default FLOAT)."""
    from onnx import TensorProto, helper

    return helper.make_tensor_value_info(name, TensorProto.FLOAT if elem is None else elem, shape)


def onnx_model(nodes: list[Any], inputs: list[Any], outputs: list[Any], inits: Any = (), opset: int = 17) -> Any:
    """A checked ONNX model of one graph ``g`` from hand-built nodes (opset ``opset``)."""
    import onnx
    from onnx import helper

    m = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, list(inits)),
                          opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(m)
    return m


def onnx_values(model: Any, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every tensor of ONNX ``model`` evaluated by onnxruntime (onnx's reference evaluator where
    onnxruntime is not installed or has no kernel for a node)."""
    from onnx import ModelProto
    from onnx import helper as onnx_helper

    m = ModelProto()
    m.CopyFrom(model)
    names = [t for n in m.graph.node for t in n.output if t]
    del m.graph.output[:]
    m.graph.output.extend(onnx_helper.make_empty_tensor_value_info(t) for t in names)
    try:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL   # every tensor kept
        opts.log_severity_level = 3
        session = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        return dict(zip(names, session.run(names, feeds)))
    except ImportError:
        pass
    except Exception as exc:  # noqa: BLE001 - e.g. NOT_IMPLEMENTED for a bfloat16 kernel: the reference evaluator
        import logging

        logging.getLogger(__name__).info("onnxruntime cannot run the model (%s); onnx's reference evaluator", exc)
    from onnx.reference import ReferenceEvaluator

    return dict(zip(names, ReferenceEvaluator(m).run(None, feeds)))


def check_onnx_numerics(result: Any, model: Any, feeds: dict[str, np.ndarray], tol: float = 1e-5) -> int:
    """Each subgraph of an ``OnnxImport``, fed the ONNX-evaluated values of its inputs (its constants
    from the import), reproduces its ONNX outputs within ``tol`` (relative to the largest value),
    each input and output in exactly the shape of the ONNX tensor the subgraph names (so a user
    substitutes subgraphs mechanically). Returns the number of outputs compared."""
    from stitchtune.graph.reference import run_reference

    values = {**onnx_values(model, feeds), **feeds}
    compared = 0
    for sg in result.subgraphs:
        onnx_name = dict(sg.tensor_names)
        consts = dict(sg.constants)
        inputs = {n: (consts[n] if n in consts else values[onnx_name[n]]) for n, _ in sg.graph.inputs}
        for n, spec in sg.graph.inputs:
            assert tuple(inputs[n].shape) == spec.shape, (sg.graph.name, n, inputs[n].shape, spec.shape)
        got = run_reference(sg.graph, inputs)
        for o in sg.graph.outputs:
            if values[onnx_name[o]].dtype == np.bool_:   # a mask: bools, bit for bit
                assert got[o].dtype == np.bool_ and np.array_equal(got[o], values[onnx_name[o]]), (sg.graph.name, o)
            want = values[onnx_name[o]].astype(np.float64)
            mine = got[o].astype(np.float64)
            assert mine.shape == want.shape, (sg.graph.name, o, onnx_name[o], mine.shape, want.shape)
            err = np.max(np.abs(mine - want)) / max(np.max(np.abs(want)), 1e-30)
            assert err < tol, (sg.graph.name, o, err)
            compared += 1
    return compared


# ---------------------------------------------------------------------------- loss heads

def _keep_red(i: str, op: str, a: str, axes: list[int]) -> dict:
    return {"id": i, "op": op, "args": [a], "axes": axes, "keepdims": True}


def int_next_to_pick_graph(rows: int, cols: int) -> object:
    """Int registers (``t + 1`` cast to float) beside a pick whose index is the input ``t`` itself,
    plus a row sum: ``y = x[r, t[r]] + (t[r] + 1) + sum(x[r])``."""
    return parse_graph({
        "name": "g", "inputs": {"x": {"shape": [rows, cols], "dtype": "float32"},
                                "t": {"shape": [rows, 1], "dtype": "int64"}},
        "nodes": [{"id": "s", "op": "reduce_sum", "args": ["x"], "axes": [-1], "keepdims": True},
                  {"id": "p", "op": "gather_elements", "args": ["x", "t"], "axis": 1},
                  {"id": "ti", "op": "add", "args": ["t", 1]},
                  {"id": "tf", "op": "cast", "args": ["ti"], "to": "float32"},
                  {"id": "o", "op": "add", "args": ["p", "tf"]},
                  {"id": "y", "op": "add", "args": ["o", "s"]}],
        "outputs": ["y"]})


def ce_graph(rows: int = 16, cols: int = 1000, dtype: str = "float32", idx_shape: list[int] | None = None,
             axis: int = 1, outputs: tuple[str, ...] = ("loss",)) -> object:
    """Cross entropy: log-softmax, the target's log-probability picked, the mean over rows as a sum
    times ``1 / rows`` (the scalar epilogue)."""
    return parse_graph({
        "name": "ce", "inputs": {"logits": {"shape": [rows, cols], "dtype": dtype},
                                 "target": {"shape": idx_shape or [rows, 1], "dtype": "int64"}},
        "nodes": [_keep_red("mx", "reduce_max", "logits", [-1]), {"id": "sh", "op": "sub", "args": ["logits", "mx"]},
                  {"id": "e", "op": "exp", "args": ["sh"]}, _keep_red("se", "reduce_sum", "e", [-1]),
                  {"id": "ls", "op": "log", "args": ["se"]}, {"id": "logp", "op": "sub", "args": ["sh", "ls"]},
                  {"id": "picked", "op": "gather_elements", "args": ["logp", "target"], "axis": axis},
                  {"id": "nll", "op": "neg", "args": ["picked"]}, _keep_red("total", "reduce_sum", "nll", [0, 1]),
                  {"id": "loss", "op": "mul", "args": ["total", 1.0 / rows]}],
        "outputs": list(outputs)})


def ce_ignore_graph(rows: int = 16, cols: int = 100, ignore: int = -100, outputs: tuple[str, ...] = ("loss",)) -> object:
    """Cross entropy with ``ignore_index`` (``F.cross_entropy(x, t, ignore_index=ignore)``): the pick's index
    is computed in the region (``where(t != ignore, t, 0)``) and the loss is the mean over the rows kept,
    ``sum(where(valid, -picked, 0)) / sum(valid)`` (the scalar epilogue of two cross reductions)."""
    return parse_graph({
        "name": "cei", "inputs": {"logits": {"shape": [rows, cols], "dtype": "float32"},
                                  "target": {"shape": [rows, 1], "dtype": "int64"}},
        "nodes": [{"id": "valid", "op": "ne", "args": ["target", ignore]},
                  {"id": "tc", "op": "where", "args": ["valid", "target", 0]},
                  _keep_red("mx", "reduce_max", "logits", [-1]), {"id": "sh", "op": "sub", "args": ["logits", "mx"]},
                  {"id": "e", "op": "exp", "args": ["sh"]}, _keep_red("se", "reduce_sum", "e", [-1]),
                  {"id": "ls", "op": "log", "args": ["se"]}, {"id": "logp", "op": "sub", "args": ["sh", "ls"]},
                  {"id": "picked", "op": "gather_elements", "args": ["logp", "tc"], "axis": 1},
                  {"id": "nll", "op": "neg", "args": ["picked"]},
                  {"id": "nz", "op": "where", "args": ["valid", "nll", 0.0]},
                  _keep_red("total", "reduce_sum", "nz", [0, 1]), _keep_red("cnt", "reduce_sum", "valid", [0, 1]),
                  {"id": "loss", "op": "div", "args": ["total", "cnt"]}],
        "outputs": list(outputs)})


def ce_items_graph(rows: int = 16, cols: int = 100, dtype: str = "int64") -> object:
    """:func:`ce_ignore_graph` as transformers' causal-LM loss with ``num_items_in_batch``: the masked sum
    over a ``[1]`` input (PyTorch's 0-d count, cast to float when it is an int) in the scalar epilogue."""
    d = ce_ignore_graph(rows, cols).to_dict()
    d["inputs"]["items"] = {"shape": [1], "dtype": dtype}
    d["nodes"] = [nd for nd in d["nodes"] if nd["id"] not in ("cnt", "loss")]
    n = "items"
    if dtype != "float32":
        d["nodes"].append({"id": "items_f", "op": "cast", "args": ["items"], "to": "float32"})
        n = "items_f"
    d["nodes"].append({"id": "loss", "op": "div", "args": ["total", n]})
    return parse_graph(d)


def ce_backward_graph(rows: int = 16, cols: int = 100, ignore: int = -100) -> object:
    """Cross entropy's backward as the torch backend imports it (mean reduction, ``ignore_index``):
    ``g / count`` of two ``[1]`` inputs (PyTorch's 0-d incoming gradient and count), the target's
    one-hot ``where(iota == where(t != ignore, t, 0), -1, 0)`` (``scatter`` of a number into zeros),
    times the masked scale, minus ``softmax * rowsum`` (log-softmax's backward from the saved ``logp``)."""
    return parse_graph({
        "name": "ceb", "inputs": {"g": {"shape": [1], "dtype": "float32"}, "count": {"shape": [1], "dtype": "float32"},
                                  "target": {"shape": [rows, 1], "dtype": "int64"},
                                  "logp": {"shape": [rows, cols], "dtype": "float32"}},
        "nodes": [{"id": "scale", "op": "div", "args": ["g", "count"]},
                  {"id": "valid", "op": "ne", "args": ["target", ignore]},
                  {"id": "tc", "op": "where", "args": ["valid", "target", 0]},
                  {"id": "pos", "op": "iota", "args": [], "shape": [1, cols], "dtype": "int64", "axis": 1},
                  {"id": "hit", "op": "eq", "args": ["pos", "tc"]},
                  {"id": "onehot", "op": "where", "args": ["hit", -1.0, 0.0]},
                  {"id": "w", "op": "where", "args": ["valid", "scale", 0.0]},
                  {"id": "gl", "op": "mul", "args": ["onehot", "w"]},
                  {"id": "p", "op": "exp", "args": ["logp"]},
                  _keep_red("rs", "reduce_sum", "gl", [1]),
                  {"id": "pr", "op": "mul", "args": ["p", "rs"]},
                  {"id": "dx", "op": "sub", "args": ["gl", "pr"]}],
        "outputs": ["dx"]})


# ---------------------------------------------------------------------------- torch backend
def torch_block(h: int = 16) -> Any:
    """A torch module (torch is imported here): LayerNorm -> Linear -> GELU -> softmax, two
    memory-intensive regions around a matmul, in eval mode."""
    import torch

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln = torch.nn.LayerNorm(h)
            self.fc = torch.nn.Linear(h, h)

        def forward(self, x: Any) -> Any:
            return torch.nn.functional.gelu(self.fc(self.ln(x * 2.0 + 1.0))).softmax(-1)

    return Block().eval()


def explain_with_eager(model: Any, *args: Any) -> tuple[Any, Any]:
    """(the torch backend's ``explain`` of ``model(*args)``: regions emulated on the CPU, the rest eager;
    ``model(*args)`` itself), both under ``no_grad``; dynamo's caches are reset afterwards."""
    import torch

    from stitchtune.deploy import torch_backend

    with torch.no_grad():
        want = model(*args)
        try:
            return torch_backend.explain(model, *args, db=None, fallback="eager", cpu="emulate"), want
        finally:
            torch._dynamo.reset()


def rotary_positions_graph(batch: int = 2, seq: int = 8, dim: int = 16, start: int = 3,
                           from_slice: bool = False) -> object:
    """Rotary beside positions computed in the region: ``x * cos(a) + rotate_half(x) * sin(a)`` with
    ``a = float(iota(seq) + start) * f`` (int registers apart from rotate_half's slice / neg / concat).
    ``from_slice``: the positions are cast to int from a slice of ``x`` instead (int values computed
    from an index op's result)."""
    half = dim // 2
    pos: list[dict[str, Any]] = [{"id": "pos", "op": "iota", "args": [], "shape": [seq, 1], "axis": 0, "dtype": "int64"}]
    if from_slice:
        pos = [{"id": "x0", "op": "slice", "args": ["x"], "axis": 2, "start": 0, "stop": 1},
               {"id": "pos", "op": "cast", "args": ["x0"], "to": "int64"}]
    return parse_graph({
        "name": "rot", "inputs": {"x": {"shape": [batch, seq, dim], "dtype": "float32"},
                                  "f": {"shape": [dim], "dtype": "float32"}},
        "nodes": [*pos, {"id": "p1", "op": "add", "args": ["pos", start]},
                  {"id": "pf", "op": "cast", "args": ["p1"], "to": "float32"},
                  {"id": "ang", "op": "mul", "args": ["pf", "f"]},
                  {"id": "c", "op": "cos", "args": ["ang"]}, {"id": "s", "op": "sin", "args": ["ang"]},
                  {"id": "hi", "op": "slice", "args": ["x"], "axis": 2, "start": half, "stop": dim},
                  {"id": "lo", "op": "slice", "args": ["x"], "axis": 2, "start": 0, "stop": half},
                  {"id": "nh", "op": "neg", "args": ["hi"]},
                  {"id": "rh", "op": "concat", "args": ["nh", "lo"], "axis": 2},
                  {"id": "a", "op": "mul", "args": ["x", "c"]}, {"id": "b", "op": "mul", "args": ["rh", "s"]},
                  {"id": "y", "op": "add", "args": ["a", "b"]}],
        "outputs": ["y"]})


def embedding_dropout_graph(p: float = 0.1, S: int = 8, H: int = 32, V: int = 20) -> Any:
    """BERT's embeddings in its training step as the torch importer maps them (three gathers, their
    sum, a layer norm) with the embedding dropout drawn in the region (tests/plan/test_int_beside_gather.py): ``uniform(seed, counter)`` of
    an ``iota`` counter over ``[1, S, H]``, compared, cast and scaled."""
    i64, f32 = {"dtype": "int64"}, {"dtype": "float32"}
    return parse_graph({
        "name": "emb_dropout",
        "inputs": {"tok": {"shape": [1, S], **i64}, "wte": {"shape": [V, H], **f32},
                   "typ": {"shape": [1, S], **i64}, "tte": {"shape": [2, H], **f32},
                   "pos": {"shape": [1, S], **i64}, "wpe": {"shape": [S, H], **f32},
                   "gamma": {"shape": [H], **f32}, "beta": {"shape": [H], **f32}, "seed": {"shape": [1], **i64}},
        "nodes": [
            {"id": "e0", "op": "gather", "args": ["wte", "tok"], "axis": 0},
            {"id": "e1", "op": "gather", "args": ["tte", "typ"], "axis": 0},
            {"id": "e2", "op": "gather", "args": ["wpe", "pos"], "axis": 0},
            {"id": "s0", "op": "add", "args": ["e0", "e1"]}, {"id": "x", "op": "add", "args": ["s0", "e2"]},
            {"id": "mu", "op": "reduce_mean", "args": ["x"], "axes": [2], "keepdims": True},
            {"id": "xc", "op": "sub", "args": ["x", "mu"]}, {"id": "sq", "op": "mul", "args": ["xc", "xc"]},
            {"id": "var", "op": "reduce_mean", "args": ["sq"], "axes": [2], "keepdims": True},
            {"id": "ve", "op": "add", "args": ["var", 1e-12]}, {"id": "rs", "op": "rsqrt", "args": ["ve"]},
            {"id": "xn", "op": "mul", "args": ["xc", "rs"]}, {"id": "xg", "op": "mul", "args": ["xn", "gamma"]},
            {"id": "ln", "op": "add", "args": ["xg", "beta"]},
            {"id": "i2", "op": "iota", "args": [], "shape": [1, S, H], "dtype": "int32", "axis": 2},
            {"id": "i1", "op": "iota", "args": [], "shape": [1, S, H], "dtype": "int32", "axis": 1},
            {"id": "s1", "op": "mul", "args": ["i1", float(H)]}, {"id": "c1", "op": "add", "args": ["i2", "s1"]},
            {"id": "u", "op": "uniform", "args": ["seed", "c1"]},
            {"id": "keep", "op": "gt", "args": ["u", p]}, {"id": "kf", "op": "cast", "args": ["keep"], "to": "float32"},
            {"id": "m", "op": "mul", "args": ["kf", "ln"]}, {"id": "y", "op": "mul", "args": ["m", 1.0 / (1.0 - p)]}],
        "outputs": ["x", "mu", "rs", "keep", "y"]})


def call_cli(argv: list[str]) -> tuple[int, str, str]:
    """``stitchtune ARGV`` in this process (``cli.main``): its exit status, stdout and stderr."""
    import io

    from stitchtune import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(argv)
    return rc, out.getvalue(), err.getvalue()
