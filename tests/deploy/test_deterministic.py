"""Determinism end to end: the tuning database records whether a schedule is bitwise reproducible,
``choose_schedule(deterministic=True)`` / ``stitchtune compile --deterministic`` pass over float-atomic
records, ``stitchtune search --deterministic`` suggests none, and a given atomic schedule is refused."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from helpers.common import EXAMPLES
from helpers.lowering import DEV, setup
from stitchtune import cli
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.deploy.selection import choose_schedule, clear_cache
from stitchtune.errors import ScheduleError
from stitchtune.lower.entry import CODEGEN_VERSION
from stitchtune.tune.database import TuningDB
from stitchtune.tune.pipeline import context_row, schedule_columns
from stitchtune.space.options import CROSS_COMBINE

NAME = "softmax_colsum_small.json"


def _row(g: Any, space: Any, s: Any, us: float, trial: int) -> dict[str, Any]:
    return {**context_row(g, DEV), **schedule_columns(s), "space_version": space.version,
            "codegen_version": CODEGEN_VERSION, "backend": "emulate", "estimated": True, "status": "ok",
            "measured_us": us, "study": "test-deterministic", "trial_number": trial}


@pytest.fixture(scope="module")
def db(tmp_path_factory: Any) -> tuple[Path, Any, Any]:
    g, plan, space = setup(NAME)
    base = heuristic_schedule(plan, DEV, space)
    fast = dataclasses.replace(base, cross_combine="atomic")
    slow = dataclasses.replace(base, cross_combine="grid")
    assert not space.violations(fast) and not space.violations(slow)
    path = tmp_path_factory.mktemp("db")
    TuningDB(path).append([_row(g, space, fast, 1.0, 0), _row(g, space, slow, 2.0, 1)])
    return path, fast, slow


def test_the_database_records_determinism(db) -> None:
    path, fast, slow = db
    df = TuningDB(path).read()
    got = dict(zip(df["schedule_key"], df["deterministic"]))
    assert got == {fast.key(): False, slow.key(): True}


def test_selection_honours_deterministic(db) -> None:
    path, fast, slow = db
    g, plan, space = setup(NAME)
    clear_cache()
    assert choose_schedule(g, path, DEV, plan=plan, space=space).schedule == fast
    ch = choose_schedule(g, path, DEV, plan=plan, space=space, deterministic=True)
    assert ch.schedule == slow and ch.source == "tuned" and ch.schedule.deterministic


def test_compile_cli_deterministic(db, tmp_path: Path, capsys: Any) -> None:
    path, fast, slow = db
    clear_cache()
    args = ["compile", str(EXAMPLES / NAME), "--db", str(path), "--no-cubin", "--device", "h200"]
    assert cli.main(args + ["-o", str(tmp_path / "a")]) == 0
    assert cli.main(args + ["-o", str(tmp_path / "b"), "--deterministic"]) == 0
    keys = [json.loads((tmp_path / d / "manifest.json").read_text())["schedule_key"] for d in "ab"]
    assert keys == [fast.key(), slow.key()]
    bad = ["compile", str(EXAMPLES / NAME), "--no-cubin", "--device", "h200", "--deterministic",
           "-o", str(tmp_path / "c"), "--schedule", fast.to_json()]
    capsys.readouterr()
    assert cli.main(bad) == 2
    err = capsys.readouterr().err
    assert "bitwise reproducible" in err and err.count("\n") == 1


def test_deterministic_space_never_offers_atomics() -> None:
    import random

    _, plan, space = setup(NAME)
    det = space.deterministic_only()
    draws = {det.sample(random.Random(i)).option(CROSS_COMBINE) for i in range(40)}
    assert "atomic" not in draws and draws
    assert any("cross_combine=atomic" in v for v in det.violations(dataclasses.replace(
        heuristic_schedule(plan, DEV, space), cross_combine="atomic")))
    with pytest.raises(ScheduleError):
        det.check(dataclasses.replace(heuristic_schedule(plan, DEV, space), cross_combine="atomic"))


def test_search_deterministic_records_only_deterministic_schedules(tmp_path: Path, capsys: Any) -> None:
    from stitchtune.tune.database import TuningDB

    args = ["search", str(EXAMPLES / "mse_loss_small.json"), "--backend", "emulate", "--trials", "5", "--jobs", "1",
            "--no-build", "--no-progress", "--seed", "0", "--db", str(tmp_path), "--deterministic"]
    assert cli.main(args) == 0, capsys.readouterr().err
    df = TuningDB(tmp_path).read()
    assert len(df) >= 5 and df["deterministic"].astype(bool).all()
    assert (df["p_cross_combine"] != "atomic").all()
    assert df["study"].str.endswith("-deterministic").all()


def test_torch_backend_deterministic_selects_past_atomic_records(db) -> None:
    """The torch.compile backend's ``deterministic`` option reaches schedule selection: the tuned
    atomic record is passed over for the deterministic one instead of declining the region."""
    pytest.importorskip("torch")
    from stitchtune.deploy.backend_options import BackendOptions
    from stitchtune.deploy.torch_region_compile import compile_region_graph, program_atomics

    path, fast, slow = db
    g, _, _ = setup(NAME)
    clear_cache()
    plain = compile_region_graph(g, BackendOptions.from_options({"db": str(path)}), DEV)
    assert plain.schedule == fast and program_atomics(plain.program) > 0
    det = compile_region_graph(g, BackendOptions.from_options({"db": str(path), "deterministic": True}), DEV)
    assert det.schedule == slow and det.source == "tuned" and program_atomics(det.program) == 0
