"""The default tuning database: ``$STITCHTUNE_DB``, else ``./tuning-db`` (git-ignored), the same for every
command and API; the README's search in a clean checkout leaves ``git status`` clean."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import stitchtune
from stitchtune.cli import build_parser
from stitchtune.tune.dbpath import DEFAULT_DB_DIR, default_db
from stitchtune.tune.search import SearchConfig
from helpers.common import COMMITTED_DB, EXAMPLES_DIR, REPO

G = str(EXAMPLES_DIR / "layernorm_small.json")

#: every subcommand with a --db, with the other arguments it needs
DB_COMMANDS = {
    "search": ["search", G],
    "show": ["show"],
    "export": ["export", "--csv", "x.csv"],
    "compile": ["compile", G],
    "run": ["run", G, "--random-inputs", "0", "--out", "x.npz"],
    "bench": ["bench", G],
    "report": ["report", "-o", "r"],
    "calibrate": ["calibrate"],
    "model-check": ["model-check"],
    "tune": ["tune", "m:f", "--shapes", "x=2x3"],
}


def test_db_default_is_tuning_db_unless_the_environment_names_one(monkeypatch) -> None:
    monkeypatch.delenv("STITCHTUNE_DB")
    assert default_db() == DEFAULT_DB_DIR == "tuning-db"
    monkeypatch.setenv("STITCHTUNE_DB", "")
    assert default_db() == "tuning-db"
    monkeypatch.setenv("STITCHTUNE_DB", "/elsewhere/db")
    assert default_db() == "/elsewhere/db"


@pytest.mark.parametrize("env", [None, "/elsewhere/db"])
def test_every_db_option_has_the_same_default(env: str | None, monkeypatch) -> None:
    if env is None:
        monkeypatch.delenv("STITCHTUNE_DB")
    else:
        monkeypatch.setenv("STITCHTUNE_DB", env)
    want = env or "tuning-db"
    for name, argv in DB_COMMANDS.items():
        assert build_parser().parse_args(argv).db == want, name
        assert build_parser().parse_args([*argv, "--db", "mine"]).db == "mine", name
    assert build_parser().parse_args(DB_COMMANDS["bench"]).out is None   # bench writes next to --db
    assert SearchConfig(graph_path=G).db == want


def test_git_ignores_the_default_db_and_not_the_committed_one() -> None:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    check = ["git", "check-ignore", "-q", "--no-index"]
    assert subprocess.run([*check, "tuning-db/part-x.parquet"], cwd=REPO).returncode == 0
    committed = str((COMMITTED_DB / "part-x.parquet").relative_to(REPO))
    assert subprocess.run([*check, committed], cwd=REPO).returncode == 1


def test_compile_api_reads_the_default_db_at_call_time(monkeypatch, tmp_path) -> None:
    """``stitchtune.compile`` without ``db``: $STITCHTUNE_DB as it is at the call (the committed H200 run holds a
    tuned layernorm record); an empty default -> heuristic; ``db=None`` -> no database even when one is set."""
    graph = EXAMPLES_DIR / "layernorm.json"
    monkeypatch.setenv("STITCHTUNE_DB", str(COMMITTED_DB))
    assert stitchtune.compile(graph, device="h200", build=False).source == "tuned"
    assert stitchtune.compile(graph, db=None, device="h200", build=False).source == "heuristic"
    monkeypatch.setenv("STITCHTUNE_DB", str(tmp_path / "empty"))
    assert stitchtune.compile(graph, device="h200", build=False).source == "heuristic"


def _copy_checkout(dst: Path) -> None:
    """The files a clean clone of this working tree would hold (tracked and not-ignored new files),
    committed in a new repository at ``dst``."""
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=REPO, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = REPO / rel
        if src.is_file():   # a tracked file deleted in the working tree is left out, as a commit would
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "snapshot"]):
        subprocess.run([*git, *cmd], cwd=dst, check=True, capture_output=True)


@pytest.mark.slow
def test_the_readme_search_leaves_git_status_clean(tmp_path, monkeypatch) -> None:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    clone = tmp_path / "clone"
    _copy_checkout(clone)
    status = ["git", "status", "--porcelain", "--untracked-files=all"]
    assert subprocess.run(status, cwd=clone, check=True, capture_output=True, text=True).stdout == ""
    monkeypatch.delenv("STITCHTUNE_DB")
    env = dict(os.environ, PYTHONPATH=str(clone))   # the copy's own code
    proc = subprocess.run([sys.executable, "-m", "stitchtune", "search", "examples/layernorm_small.json",
                           "--trials", "2", "--jobs", "1", "--no-progress"],
                          cwd=clone, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert list((clone / "tuning-db").glob("part-*.parquet")), "the rows did not go to ./tuning-db"
    assert (clone / "tuning-db" / "optuna.journal").is_file()
    assert subprocess.run(status, cwd=clone, check=True, capture_output=True, text=True).stdout == ""
