"""Paths and limits every test room uses: ``REPO``, ``EXAMPLES_DIR`` (``EXAMPLES``), ``SMALL_EXAMPLES`` /
``FULL_EXAMPLES`` (sorted Paths), ``SMALL_DICTS``, ``COMMITTED_DB`` (the committed H200 tuning database,
``results/h200-2026-11-29``); ``time_limit(seconds)``: a context manager that raises ``Hang`` when its
body runs longer (SIGALRM; the main thread only), for in-process CLI calls that must not hang."""

from __future__ import annotations

import contextlib
import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any


REPO = Path(__file__).resolve().parent.parent.parent


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


EXAMPLES_DIR = REPO / "examples"
EXAMPLES = EXAMPLES_DIR
SMALL_EXAMPLES = sorted(EXAMPLES_DIR.glob("*_small.json"))
FULL_EXAMPLES = sorted(p for p in EXAMPLES_DIR.glob("*.json") if not p.stem.endswith("_small"))
SMALL_DICTS = [json.loads(p.read_text()) for p in SMALL_EXAMPLES]
COMMITTED_DB = REPO / "results" / "h200-2026-11-29"
