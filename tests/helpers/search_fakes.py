"""Search fakes: a 15-point fake space (block in ``BLOCKS`` x vec in ``VECS``) whose outcomes are fixed per
point (``FATES``: (32,4) illegal -> pruned; (512,4) cost-model prune_reason -> pruned; (64,4)
compile_error; (64,2) build timeout -> timeout; (512,1) launch_error; (512,2) run timeout; (128,1)
wrong_result; all others ok with time = predicted time, fake, not a measurement), with ``fake_stages``,
``FakeBuilder``, ``FakeRunner`` and ``fake_components`` for ``run_search``."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, cast

import optuna

from stitchtune.errors import ScheduleError
from stitchtune.gpu.build import Builder
from stitchtune.gpu.runners import Runner
from stitchtune.graph.parse import load_graph
from stitchtune.hardware.device import get_device
from stitchtune.lower.entry import lower
from stitchtune.plan.planner import make_plan
from stitchtune.tune.pipeline import Stages
from stitchtune.tune.search import Components


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

    def as_of(self, version: str) -> FakeSpace:
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

    def io_bytes(self) -> int:
        return self.min_bytes()


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


def fake_predict(program: FakeProgram, device, registers=None, compiled=None) -> FakePrediction:
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
            status = {"compile_error": "compile_error", "build_timeout": "timeout"}.get(fate or "", "ok")
            error = {"compile_error": "fake.cu(3): error: identifier undefined",
                     "build_timeout": "nvcc timed out after 1 s"}.get(fate or "", "")
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
        # (the fakes' results duck-type BuildResult / Measurement: the search reads their fields only)
        make_builder=lambda cfg, dev, backend: cast(Builder, builder),
        make_runner=lambda backend, g, d: cast(Runner, runner),
        stages=fake_stages, cuda_available=lambda: False)
