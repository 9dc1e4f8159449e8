"""Paths and limits every test room uses: ``REPO``, ``EXAMPLES_DIR`` (``EXAMPLES``), ``SMALL_EXAMPLES`` /
``FULL_EXAMPLES`` (sorted Paths), ``SMALL_DICTS``, ``COMMITTED_DB`` (the committed H200 tuning database,
``results/h200-2026-11-29``); ``time_limit(seconds)``: a context manager that raises ``Hang`` when its
body runs longer (SIGALRM; the main thread only), for in-process CLI calls that must not hang;
``load_script(name, monkeypatch)``: ``scripts/<name>.py`` imported as module ``name`` for one test."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import signal
import sys
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


def load_script(name: str, monkeypatch: Any) -> Any:
    """``scripts/<name>.py`` imported as module ``name`` (``scripts/`` on ``sys.path`` so its sibling
    imports work), both undone by ``monkeypatch`` (a ``pytest.MonkeyPatch``) after the test."""
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None, name
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, mod)
    spec.loader.exec_module(mod)
    return mod


def experiment_cases() -> Any:
    """``scripts/gpu_experiment_cases.py`` (the GPU round's model-region graphs: one builder for the experiments
    and the tests that check the same regions on the CPU), loaded once as module ``_gpu_experiment_cases``; the
    script imports no sibling, so ``sys.path`` is left alone."""
    name = "_gpu_experiment_cases"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / "gpu_experiment_cases.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod      # dataclasses look their module up while the class is made
        spec.loader.exec_module(mod)
    return sys.modules[name]
