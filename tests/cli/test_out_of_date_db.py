"""A tuning database written by an older space (or codegen) version: ``compile`` falls back to the
heuristic with one warning that says the database is out of date (its versions, today's, re-tune), and
``show`` prints one warning line saying the same."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from helpers.cli import call_cli as call
from helpers.common import EXAMPLES_DIR

from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.deploy.selection import clear_cache
from stitchtune.graph.parse import load_graph
from stitchtune.hardware.device import get_device
from stitchtune.lower.entry import CODEGEN_VERSION
from stitchtune.plan.planner import make_plan
from stitchtune.space import SearchSpace
from stitchtune.tune.database import TuningDB
from stitchtune.tune.pipeline import context_row, schedule_columns

G = EXAMPLES_DIR / "layernorm_small.json"


def _old_db(path: Path) -> str:
    """A database with one ok record of G on the H200 tuned at space version ``0.old``; today's space version."""
    graph, dev = load_graph(G), get_device("h200")
    plan = make_plan(graph)
    space = SearchSpace.for_plan(plan, dev)
    s = heuristic_schedule(plan, dev, space)
    TuningDB(path).append([{**context_row(graph, dev), **schedule_columns(s), "space_version": "0.old",
                            "codegen_version": CODEGEN_VERSION, "backend": "cuda", "estimated": False,
                            "status": "ok", "measured_us": 1.0, "study": "t", "trial_number": 0}])
    return str(space.version)


def test_compile_from_an_older_database_says_it_is_out_of_date(tmp_path: Path, caplog: Any) -> None:
    clear_cache()
    sv = _old_db(tmp_path / "db")
    with caplog.at_level(logging.WARNING, logger="stitchtune"):
        rc, _out, _err = call(["compile", str(G), "--no-cubin", "--device", "h200", "--db", str(tmp_path / "db"),
                               "-o", str(tmp_path / "c")])
    assert rc == 0
    (w,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "heuristic" in w and "out of date" in w and "re-tune" in w
    assert f"space version 0.old / codegen version {CODEGEN_VERSION}" in w
    assert f"today's is space version {sv} / codegen version {CODEGEN_VERSION}" in w


def test_show_of_an_older_database_warns_once(tmp_path: Path) -> None:
    sv = _old_db(tmp_path / "db")
    rc, out, err = call(["show", "--db", str(tmp_path / "db")])
    assert rc == 0 and "1 trial rows" in out
    (line,) = [x for x in err.splitlines() if x.strip()]
    assert line.startswith("stitchtune: warning: 1 of 1 ok rows are out of date")
    assert f"space version 0.old / codegen version {CODEGEN_VERSION}" in line and "re-tune" in line
    assert f"today's is space version {sv}" in line


def test_show_of_an_up_to_date_database_does_not_warn(tmp_path: Path) -> None:
    sv = _old_db(tmp_path / "db")
    df = TuningDB(tmp_path / "db").read()
    df["space_version"] = sv
    TuningDB(tmp_path / "db2").append(df.to_dict("records"))
    rc, _out, err = call(["show", "--db", str(tmp_path / "db2")])
    assert rc == 0 and "out of date" not in err
