"""Hostile command lines: every subcommand, whatever its arguments, ends with exit 0 or 2 (130 on Ctrl-C)
and never prints a traceback or a Python exception class name.

* The subcommands are enumerated from the argparse parser (``import torch`` and ``import onnx`` too),
  so a new command is covered without editing this file; :data:`BASE` gives the known ones a valid,
  cheap command line (a new command gets one built from its parser: every required argument "x").
* Each example starts from that command line and changes one thing: an argument gets a hostile value
  chosen by its kind (a path: missing, a directory, a FIFO, unreadable, unwritable, under a file,
  existing, a NUL byte, very long; a number: negative, NaN, 1e999, text; ``--schedule``: bad JSON), a
  required argument is dropped, or an unknown option is added. The command runs in-process
  (``cli.main`` with captured streams, in a scratch working directory) under a SIGALRM guard.
* Closed stdout: every command's baseline writes into a pipe whose reader is gone (in-process), and two
  real processes check what the interpreter does at exit: ``space`` piped into a reader that stops after
  one line, and ``validate`` started with stdout closed. Ctrl-C: SIGINT to a running ``space``.

The heavy commands' baselines stop early on purpose (``tune``/``import torch``: a module that does not
exist; ``report``: an empty database; ``bench``: no GPU here), so the paths are checked but no model is
traced and no figure is drawn; their success paths are tested in their own rooms. Derandomised,
:data:`EXAMPLES` examples per command.
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import io
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import stitchtune.errors
from stitchtune import cli
from helpers.common import COMMITTED_DB, EXAMPLES_DIR, REPO, time_limit

GRAPH = EXAMPLES_DIR / "layernorm_small.json"
EXAMPLES = 14          # per command (hypothesis max_examples)
CALL_LIMIT_S = 120.0   # one in-process call; a hang fails the example

#: a valid, cheap command line per known command; {names} are filled from the workspace
BASE: dict[tuple[str, ...], list[str]] = {
    ("validate",): ["{graph}"],
    ("space",): ["{graph}", "--sample", "2", "--device", "h200"],
    ("run",): ["{graph}", "--random-inputs", "0", "--out", "{work}/o.npz"],
    ("compile",): ["{graph}", "--no-cubin", "--device", "h200", "--db", "{db}", "-o", "{work}/compiled"],
    ("devices",): [],
    ("search",): ["{graph}", "--trials", "1", "--jobs", "1", "--backend", "emulate", "--no-build",
                  "--no-progress", "--device", "h200", "--db", "{work}/search-db"],
    ("show",): ["--db", "{db}"],
    ("export",): ["--db", "{db}", "-o", "{work}/x.csv"],
    ("report",): ["--db", "{empty}", "-o", "{work}/report", "--graphs"],
    ("calibrate",): ["--db", "{db}"],
    ("model-check",): ["--db", "{db}"],
    ("bench",): ["{graph}", "--db", "{work}/bench-db", "--peers", "none"],
    ("tune",): ["{work}/no_such_model.py:f", "--shapes", "x=2x3", "--db", "{work}/tune-db", "--backend", "emulate"],
    ("import", "torch"): ["{work}/no_such_model.py:f", "--shapes", "x=2x3", "-o", "{work}/g.json"],
    ("import", "onnx"): ["{garbage}", "-o", "{work}/onnx-out"],
    ("audit",): ["{graph}", "--no-sass", "--no-peer", "--slice-blocks", "1", "--json", "{work}/audit.json"],
}

BAD_NUMBERS = ["-1", "0", "-0", "nan", "inf", "-inf", "1e999", "abc", "", "9" * 40, "0x10", "3.5", " 3", "1_0"]
BAD_TEXT = ["", "-", "x", "=", ",", "x=", "x=0", "x=-1x3", "x=2x0", "a=b=c", "\x00", "é\u2028", "a" * 5000,
            "1e999", "nan", "..", "../../etc/passwd", "h200x", "none,none", "eager,", "m:f", ":", "a.b:c",
            "sqlite:////proc/stitchtune-no-such/x.db", "journal:///tmp"]
BAD_JSON = ["{", "[" * 3000, "null", "[]", '"s"', "{}", '{"tpr": 1e400}', '{"tpr": "x", "block": 7}',
            '{"block": 7}', '{"tpr": 1' + "0" * 5000 + "}", "@", "@{missing}", "@{dir}", "@{fifo}",
            "@{garbage}", "@{empty_file}"]
PATHS = ["{missing}", "{dir}", "{fifo}", "{unreadable}", "{unwritable}", "{under_file}", "{garbage}",
         "{empty_file}", "{proc}", "a\x00b", "{long}", "", "{existing_out}", "{valid_graph}"]

#: exception class names that must not reach the user: builtins, our own, and any CamelCase word ending in
#: Error, Exception or Fault (library errors such as sqlalchemy's OperationalError)
EXCEPTION_NAMES = sorted(
    {n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)
     and not issubclass(v, Warning)}
    | {n for n, v in vars(stitchtune.errors).items() if isinstance(v, type) and issubclass(v, BaseException)}
    | {"EmulatorFault", "BadZipFile", "JSONDecodeError", "ArgumentError", "ArgumentTypeError", "ParserError",
       "ArrowInvalid", "DecodeError", "UnpicklingError", "ImportError_", "DatabaseError"})
EXCEPTION_RE = re.compile(r"\b(" + "|".join(map(re.escape, EXCEPTION_NAMES)) + r"|[A-Z]\w*(Error|Exception|Fault))\b")


# ------------------------------------------------------------------------------------------ commands
def _walk(parser: argparse.ArgumentParser, prefix: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield prefix, parser
        return
    for name, sp in subs[0].choices.items():
        yield from _walk(sp, (*prefix, name))


COMMANDS = dict(_walk(cli.build_parser(), ()))


def _auto_base(parser: argparse.ArgumentParser) -> list[str]:
    """A command line for a command without a :data:`BASE` entry: every required argument "x"."""
    argv: list[str] = []
    for a in parser._actions:
        if not a.option_strings and a.nargs != 0:
            argv.append("x")
        elif a.required:
            argv += [a.option_strings[0], "x"]
    return argv


def _mutable(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if not isinstance(a, (argparse._HelpAction, argparse._VersionAction))]


# ------------------------------------------------------------------------------------------ workspace
@pytest.fixture(scope="module")
def space_dir(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The scratch files the placeholders name (made once; commands write only under ``work``)."""
    root = tmp_path_factory.mktemp("hostile")
    work = root / "work"
    work.mkdir()
    db = root / "db"
    db.mkdir()
    part = min(COMMITTED_DB.glob("part-*.parquet"), key=lambda p: p.stat().st_size)
    shutil.copy(part, db / part.name)
    (root / "empty-db").mkdir()
    (root / "a-dir").mkdir()
    os.mkfifo(root / "fifo")
    unreadable = root / "unreadable.json"
    unreadable.write_text("{}")
    unreadable.chmod(0)
    ro = root / "read-only"
    ro.mkdir()
    ro.chmod(0o500)
    (root / "garbage.bin").write_bytes(b"\x00\xffPK\x03\x04 not a zip, not JSON, not ONNX \n" * 20)
    (root / "empty").write_bytes(b"")
    (root / "existing-out").write_text("old")
    shutil.copy(GRAPH, root / "graph.json")  # the baselines' graph (never a hostile value)
    shutil.copy(GRAPH, root / "valid-graph.json")  # a hostile value: a valid graph, which an output may replace
    return {"work": str(work), "graph": str(root / "graph.json"), "valid_graph": str(root / "valid-graph.json"),
            "db": str(db), "empty": str(root / "empty-db"),
            "missing": str(root / "no" / "such" / "path"), "dir": str(root / "a-dir"), "fifo": str(root / "fifo"),
            "unreadable": str(unreadable), "unwritable": str(ro / "sub" / "x"),
            "under_file": str(root / "garbage.bin" / "x"), "garbage": str(root / "garbage.bin"),
            "empty_file": str(root / "empty"), "proc": "/proc/stitchtune-no-such/x", "long": "x" * 5000,
            "existing_out": str(root / "existing-out")}


def _fill(text: str, names: dict[str, str]) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: names.get(m.group(1), m.group(0)), text)


# ------------------------------------------------------------------------------------------ calling
def call(argv: list[str], cwd: str, stdout: Any = None) -> tuple[int, str, str]:
    out, err = stdout or io.StringIO(), io.StringIO()
    here = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), time_limit(CALL_LIMIT_S):
            rc = cli.main(argv)
    finally:
        os.chdir(here)
    return rc, (out.getvalue() if isinstance(out, io.StringIO) else ""), err.getvalue()


def assert_clean(argv: list[str], rc: int, out: str, err: str, codes: tuple[int, ...] = (0, 2)) -> None:
    shown = ascii(argv)[:600]
    assert rc in codes, (shown, rc, err[-1500:])
    for stream in (out, err):
        assert "Traceback" not in stream, (shown, stream[-3000:])
        m = EXCEPTION_RE.search(stream)
        assert m is None, (shown, m and m.group(0), stream[max(0, m.start() - 300):m.end() + 300] if m else "")
    if rc == 2:
        assert err.strip(), (shown, "exit 2 without a message")


# ------------------------------------------------------------------------------------------ strategies
@st.composite
def hostile_argv(draw: st.DrawFn, command: tuple[str, ...]) -> list[str]:
    parser = COMMANDS[command]
    base = list(BASE.get(command) or _auto_base(parser))
    how = draw(st.sampled_from(["value", "value", "value", "value", "drop", "unknown"]))
    if how == "unknown":
        return [*command, *base, draw(st.sampled_from(["--no-such-option", "-Z", "--", "---", "-o"]))]
    if how == "drop" and base:
        i = draw(st.integers(0, len(base) - 1))
        return [*command, *base[:i], *base[i + 1:]]
    action = draw(st.sampled_from(_mutable(parser)))
    checked = {d for d, _f, _k in (parser.get_default("_path_checks") or ())}
    if action.nargs == 0:
        return [*command, *base, action.option_strings[-1]]
    if action.dest in checked:
        pool = PATHS
    elif action.type in (int, float) or getattr(action.type, "numeric", False):
        pool = BAD_NUMBERS
    elif action.dest == "schedule":
        pool = BAD_JSON
    else:
        pool = BAD_TEXT + BAD_JSON[:4] + PATHS[:3]
    value = draw(st.sampled_from(pool))
    if not action.option_strings:  # a positional: replace the first one of the baseline (or add it)
        positional = [i for i, a in enumerate(base)
                      if not a.startswith("-") and (i == 0 or not base[i - 1].startswith("-"))]
        if positional:
            i = positional[0]
            return [*command, *base[:i], value, *base[i + 1:]]
        return [*command, value, *base]
    flag = draw(st.sampled_from(action.option_strings))
    if flag.startswith("--") and draw(st.booleans()):
        return [*command, *base, f"{flag}={value}"]
    return [*command, *base, flag, value]


HOSTILE = settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
                   suppress_health_check=list(HealthCheck))


@pytest.mark.parametrize("command", sorted(COMMANDS), ids=lambda c: "-".join(c))
def test_hostile_argv_exits_0_or_2_without_a_traceback(command: tuple[str, ...], space_dir: dict[str, str]) -> None:
    @HOSTILE
    @given(argv=hostile_argv(command))
    def check(argv: list[str]) -> None:
        argv = [_fill(a, space_dir) for a in argv]
        rc, out, err = call(argv, space_dir["work"])
        assert_clean(argv, rc, out, err)

    check()


def test_every_command_has_a_baseline() -> None:
    """A new subcommand is fuzzed with an automatic baseline; give it a real one in BASE."""
    assert set(COMMANDS) == set(BASE), sorted(set(COMMANDS) ^ set(BASE))


@pytest.mark.parametrize("command", sorted(COMMANDS), ids=lambda c: "-".join(c))
def test_baseline_into_a_closed_pipe_ends_quietly(command: tuple[str, ...], space_dir: dict[str, str]) -> None:
    """stdout is a pipe whose reader has gone: a command that prints stops quietly with exit 0 (a command
    that fails says so on stderr with exit 2)."""
    argv = [*command, *(_fill(a, space_dir) for a in BASE.get(command) or _auto_base(COMMANDS[command]))]
    r, w = os.pipe()
    os.close(r)
    closed = io.TextIOWrapper(io.FileIO(w, "w"), write_through=False)
    try:
        rc, _out, err = call(argv, space_dir["work"], stdout=closed)
    finally:
        with contextlib.suppress(OSError):
            closed.close()
    assert_clean(argv, rc, "", err)


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))


def test_a_real_pipe_closed_after_one_line_ends_quietly(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "stitchtune", "space", str(GRAPH), "--sample", "100000"],
                            cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b"{")
    proc.stdout.close()
    err = proc.stderr.read().decode()
    rc = proc.wait(timeout=120)
    assert rc == 0 and err == "", (rc, err[-2000:])


def test_stdout_closed_from_the_start(tmp_path: Path) -> None:
    proc = subprocess.run(["sh", "-c", f'exec "{sys.executable}" -m stitchtune validate "{GRAPH}" >&-'],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]


def test_ctrl_c_exits_130_without_a_traceback(tmp_path: Path) -> None:
    """SIGINT at its default action in the child, as in a terminal's foreground job (and as
    test_interrupts.py starts ``search``): a process started with SIGINT *ignored* keeps it ignored
    across exec and Python installs no KeyboardInterrupt handler. That is what a job started with ``&``
    by a shell without job control inherits, so a test run launched that way timed out here (120 s,
    the child printing samples to the end); Ctrl-C never reaches such a job."""
    proc = subprocess.Popen([sys.executable, "-m", "stitchtune", "space", str(GRAPH), "--sample", "1000000"],
                            cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith(b"{")   # it is running
    proc.send_signal(signal.SIGINT)
    try:
        _out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        _out, err = proc.communicate()
        pytest.fail(f"still running 120 s after SIGINT; stderr: {err.decode()[-2000:]}")
    assert proc.returncode == 130, (proc.returncode, err.decode()[-2000:])
    assert "Traceback" not in err.decode() and "stitchtune: interrupted" in err.decode()


# ------------------------------------------------------------------------------------------ model mistakes
MODELS = {
    "models.py": '''import torch

class Bad(torch.nn.Module):
    def __init__(self):
        super().__init__()
        raise RuntimeError("no weights file")

class NeedsArgs(torch.nn.Module):
    def __init__(self, d):
        super().__init__()

class Lin(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(256, 256)

    def forward(self, x, y):
        return self.fc(x) + y

def two(x, y):
    return x + y

NOT_CALLABLE = 3
''',
    "broken.py": "def f(x:\n    return x\n",
    "raising.py": "raise ValueError('boom at import')\n",
}

#: (MODULE:CALLABLE, --shapes, extra arguments, what the one error line says, the commands it applies to)
MODEL_MISTAKES: list[tuple[str, str, list[str], str, tuple[str, ...]]] = [
    ("{d}/missing.py:f", "x=2x3", [], "module file", ("tune", "import")),
    ("{d}/models.py:NoSuch", "x=2x3", [], "has no attribute 'NoSuch'", ("tune", "import")),
    ("{d}/models.py:Bad", "x=2x3", [], "building 'Bad' failed: RuntimeError: no weights file", ("tune", "import")),
    ("{d}/models.py:NeedsArgs", "x=2x3", [], "cannot be built without arguments", ("tune", "import")),
    ("{d}/models.py:NOT_CALLABLE", "x=2x3", [], "is not callable", ("tune", "import")),
    ("{d}/broken.py:f", "x=2x3", [], "importing", ("tune", "import")),
    ("{d}/raising.py:f", "x=2x3", [], "boom at import", ("tune", "import")),
    ("no_such_package_xyz:f", "x=2x3", [], "no module named 'no_such_package_xyz'", ("tune", "import")),
    ("{d}/models.py", "x=2x3", [], "is not MODULE:CALLABLE", ("tune", "import")),
    ("{d}/models.py:two", "x=2,3", [], "is not NAME=DIM", ("tune", "import")),
    ("{d}/models.py:two", "x=2x0,y=1", [], "dimensions must be positive", ("tune", "import")),
    ("{d}/models.py:two", "x=2xa,y=1", [], "integers joined by 'x'", ("tune", "import")),
    ("{d}/models.py:two", "x=2x3", [], "missing shape for argument 'y'", ("tune", "import")),
    ("{d}/models.py:two", "x=2x3,y=2x3,z=1", [], "'z' is not a parameter", ("tune", "import")),
    ("{d}/models.py:two", "x=2x3,y=2x3", ["--dtype", "float64"], "--dtype", ("tune", "import")),
    ("{d}/models.py:two", "x=2x3,y=5x7", [], "the model fails when called on the example inputs", ("tune", "import")),
    ("{d}/models.py:Lin", "x=4x3,y=4x256", [], "mat1 and mat2 shapes cannot be multiplied", ("tune", "import")),
    ("{d}/models.py:two", "x=100000x100000,y=1", [], "the example inputs take 40000000004 bytes", ("tune", "import")),
    ("{d}/models.py:two", "x=2x3,y=2x3", ["--calls", "inference,serve"], "--calls", ("tune",)),
]


@pytest.mark.parametrize("mistake", [(m, c) for m in MODEL_MISTAKES for c in m[4]],
                         ids=lambda mc: f"{mc[1]}-{mc[0][0].rsplit('/', 1)[-1]}-{mc[0][3][:24]}")
def test_model_mistakes_are_one_error_line(mistake: tuple[tuple[str, str, list[str], str, tuple[str, ...]], str],
                                           tmp_path: Path) -> None:
    """A mistake in the model or in --shapes: exit 2, one line on stderr saying what, no traceback, nothing
    written, before anything is traced or tuned (the user's own exception is named by its type)."""
    (spec, shapes, extra, says, _commands), command = mistake
    for name, text in MODELS.items():
        (tmp_path / name).write_text(text)
    spec = spec.replace("{d}", str(tmp_path))
    if command == "tune":
        argv = ["tune", spec, "--shapes", shapes, "--db", str(tmp_path / "db"), "--backend", "emulate", *extra]
    else:
        argv = ["import", "torch", spec, "--shapes", shapes, "-o", str(tmp_path / "g.json"), *extra]
    rc, out, err = call(argv, str(tmp_path))
    assert rc == 2 and "Traceback" not in err + out, (argv, err[-3000:])
    assert len(err.splitlines()) == 1 and err.startswith("stitchtune: error: ") and says in err, (argv, err)
    assert not (tmp_path / "db").exists() and not (tmp_path / "g.json").exists()
