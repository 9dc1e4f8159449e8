"""Shared fixtures: the example graphs.

``examples_dir``: Path of ``examples/``. ``small_examples`` / ``full_examples``: sorted lists of Paths
(``*_small.json`` and the rest). ``load_example(name)``: the validated Graph of ``examples/<name>.json``.
``demo_db_script``: ``scripts/make_demo_db.py`` loaded as a module.

Every test runs with ``STITCHTUNE_DB`` pointing at a fresh empty directory of its own (autouse
``default_db``): a command or API call that falls back on the default database never reads or writes the
developer's ``$STITCHTUNE_DB`` or a ``tuning-db/`` in the working directory. Likewise
``STITCHTUNE_DATA_DIR`` (autouse ``user_data_dir``): the user's fitted cost coefficients that ``stitchtune
calibrate`` writes are never read from or written to the developer's own folder.

``shared_build_dir``: one directory for the whole run, shared by the pytest-xdist workers (under the run's
base temporary directory), where ``helpers.nvcc.shared_ptxas_report`` keeps one nvcc build per source for
every test and worker that asks for it.

Every test runs under ``helpers.planning.refusals_stay_values`` (autouse ``refusals_are_values``): a planner
rule that raises an ``UnsupportedGraphError`` inside the planning pipeline, instead of answering its
``Refusal``, fails the test.

Every test runs with the torch backend's ``strict`` option on (autouse ``strict_backend``:
``STITCHTUNE_STRICT=1``) unless it is marked ``not_strict("why")``.

Tests marked ``waits`` (long wall-clock, mostly waiting on subprocesses) are moved to the front of the
collection, so that pytest-xdist starts them first and the many short tests even out the end of the
run (collected late, they kept one worker busy for a minute or two after the other had finished).

Under pytest-xdist every worker runs its math libraries (OpenMP: torch's intra-op pool; OpenBLAS, MKL)
with one thread, unless the variable is set already: ``-n auto`` starts one worker per core, and a
second thread per worker only oversubscribes the cores (idle pool threads spin for their next task).
Set here, before numpy or torch is imported; the tests' subprocesses inherit it. Likewise Inductor (the
``fallback="inductor"`` tests) compiles its C++ in the worker itself (``TORCHINDUCTOR_COMPILE_THREADS=1``)
instead of starting a pool of compile processes, each of which imports torch (about 6 CPU-s per worker).

An xdist worker collects its garbage at the end of its session, then freezes what is left
(``gc.freeze``), before it reports back (``pytest_sessionfinish``). pytest's own clean-up runs five full
collections after that report, and execnet gives a worker 5 s to finish once the controller has all
reports, then sends it SIGINT: five passes over a heap with torch and transformers in it took longer on a
loaded machine, and the KeyboardInterrupt either cut the clean-up short (its unraisable-exception
report lost) or landed in hypothesis' gc callback (``PytestUnraisableExceptionWarning``). The same
garbage is collected, and its unraisable exceptions reported, as before.

Garbage collection during the run: once the tests are collected, what is alive (the imported libraries,
the test modules) is frozen out of the cyclic collector's reach, and the young generation is collected
every 10,000 allocations instead of 700 (``gc.set_threshold(10000, 50, 100)``): the default made the
collector walk torch's and transformers' objects again and again. Cyclic garbage is still collected,
later and in fewer, larger passes.

Bytecode: the run writes ``__pycache__`` even where ``PYTHONDONTWRITEBYTECODE`` is set (this conftest
clears ``sys.dont_write_bytecode`` before any test module is imported). Without the cache every pytest
process (each xdist worker) compiles the package again and pytest rewrites the asserts of every test
module again: ~6.5 of the ~19 CPU-s a ``--collect-only`` took. Set ``STITCHTUNE_TEST_NO_PYC=1`` to keep
the environment's choice. (``__pycache__`` and ``*.pyc`` are git-ignored; Python checks a cached file
against its source's size and mtime, pytest too.)
"""

from __future__ import annotations

import os
import sys

if not os.environ.get("STITCHTUNE_TEST_NO_PYC"):
    sys.dont_write_bytecode = False

if os.environ.get("PYTEST_XDIST_WORKER"):
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "TORCHINDUCTOR_COMPILE_THREADS"):
        os.environ.setdefault(_var, "1")

from pathlib import Path  # noqa: E402
from typing import Callable, Iterator

import pytest  # noqa: E402

from helpers.common import EXAMPLES_DIR, FULL_EXAMPLES, SMALL_EXAMPLES


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what the collection left alive and collect less often (see the module docstring)."""
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(10000, 50, 100)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """In an xdist worker: collect garbage (at most five passes, as pytest's clean-up), then freeze the rest,
    so that the clean-up after the worker's report is quick (see the module docstring)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import gc

        for _ in range(5):
            if not gc.collect():
                break
        gc.freeze()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``waits`` tests first (stable: the rest keep their order)."""
    items.sort(key=lambda item: item.get_closest_marker("waits") is None)


@pytest.fixture(autouse=True)
def default_db(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test's own default tuning database (``$STITCHTUNE_DB``; the directory is not created)."""
    path = tmp_path_factory.mktemp("default-db", numbered=True) / "tuning-db"
    monkeypatch.setenv("STITCHTUNE_DB", str(path))
    return path


@pytest.fixture(autouse=True)
def refusals_are_values() -> Iterator[None]:
    """Planning in the test constructs no ``UnsupportedGraphError`` (``helpers.planning``)."""
    from helpers.planning import refusals_stay_values

    with refusals_stay_values():
        yield


@pytest.fixture(autouse=True)
def user_data_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test's own user data folder (``$STITCHTUNE_DATA_DIR``; not created): calibrated coefficients."""
    path = tmp_path_factory.mktemp("user-data", numbered=True) / "stitchtune"
    monkeypatch.setenv("STITCHTUNE_DATA_DIR", str(path))
    return path


@pytest.fixture(autouse=True)
def strict_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """The torch backend's ``strict`` option on by default in every test (``$STITCHTUNE_STRICT=1``): an
    error that is not a StitchtuneError is raised, not declined, so a bug cannot hide behind a decline. A
    test that needs the lenient default is marked ``@pytest.mark.not_strict("why")`` (the reason is
    required), or passes ``strict=False`` in its options. Returns whether strict is on."""
    marker = request.node.get_closest_marker("not_strict")
    if marker is None:
        monkeypatch.setenv("STITCHTUNE_STRICT", "1")
        return True
    if not (marker.args and str(marker.args[0]).strip()):
        raise pytest.UsageError(f"{request.node.nodeid}: not_strict needs its reason")
    monkeypatch.delenv("STITCHTUNE_STRICT", raising=False)
    return False


@pytest.fixture(scope="session")
def shared_build_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory of this run shared by all xdist workers (each worker's base temp is one level down)."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    path = root / "shared-nvcc"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="session")
def examples_dir() -> Path:
    return EXAMPLES_DIR


@pytest.fixture(scope="session")
def small_examples() -> list[Path]:
    return list(SMALL_EXAMPLES)


@pytest.fixture(scope="session")
def full_examples() -> list[Path]:
    return list(FULL_EXAMPLES)


@pytest.fixture(scope="session")
def load_example() -> Callable[[str], object]:
    from stitchtune.graph.parse import load_graph

    def _load(name: str) -> object:
        return load_graph(EXAMPLES_DIR / f"{name}.json")

    return _load


@pytest.fixture(scope="session")
def demo_db_script():
    """``scripts/make_demo_db.py`` as a module (writes the synthetic tuning database and bench CSV)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_demo_db", EXAMPLES_DIR.parent / "scripts" / "make_demo_db.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
