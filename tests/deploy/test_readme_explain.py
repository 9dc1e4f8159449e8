"""README quick start 1 prints what the README shows: its Python block, run as written (CPU, emulated
kernels, no database in the working folder), prints the explain table and counts line of the block after it."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
from pathlib import Path

import pytest

from helpers.common import REPO


def _quick_start_1() -> tuple[str, str, str]:
    text = (REPO / "README.md").read_text()
    section = text.split("## Quick start 1", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```(\w*)\n(.*?)^```", section, flags=re.M | re.S)
    code = next(body for lang, body in blocks if lang == "python")
    shown = next(body for lang, body in blocks if lang == "")
    logged = next(body for lang, body in blocks if lang == "log")
    return code, shown, logged


def test_quick_start_1_prints_what_the_readme_shows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    """Stdout as shown, and the warnings a user sees (one line per graph, not one per region) as shown."""
    from stitchtune.deploy import selection

    code, shown, logged = _quick_start_1()
    selection.clear_cache()    # a fresh process: no fallback warned about yet
    caplog.set_level(logging.WARNING)
    monkeypatch.delenv("STITCHTUNE_DB", raising=False)
    out = io.StringIO()
    here = os.getcwd()
    os.chdir(tmp_path)   # the default database ./tuning-db does not exist here: heuristic schedules, as shown
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, "README.md quick start 1", "exec"), {"__name__": "readme"})
    finally:
        os.chdir(here)
    printed = out.getvalue()
    first, _, explained = printed.partition("\n")
    assert first.startswith("tensor(") and float(first[len("tensor("):-1]) < 1e-4, first
    assert explained.strip() == shown.strip()   # the table and the counts line, exactly
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("stitchtune")]
    assert warned == logged.strip().splitlines()
