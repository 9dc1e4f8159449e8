"""The CLI from a test: ``call_cli(argv)`` (``stitchtune ARGV`` in this process -> exit status, stdout,
stderr); ``forked_cli(argv, out, err)`` / ``run_forked_cli(argv, tmp)``: ``python -m stitchtune ARGV`` as a
process of its own forked from a server that imported the CLI's search path once (``FORKED_PRELOAD``), for
the tests that start, kill and wait on many CLI processes; ``start_fork_server()`` starts the server ahead
(a test that times its first process), ``stop_fork_server()`` ends (and waits for) it."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

import optuna


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


def call_cli(argv: list[str]) -> tuple[int, str, str]:
    """``stitchtune ARGV`` in this process (``cli.main``): its exit status, stdout and stderr."""
    import io

    from stitchtune import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(argv)
    return rc, out.getvalue(), err.getvalue()
