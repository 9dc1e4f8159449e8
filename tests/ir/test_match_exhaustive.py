"""The IR's consumers dispatch by ``match`` with ``assert_never``: mypy reports a consumer that misses a
node type (issue 43). The check itself is proven here on a tiny module; the consumers are checked by the
package's own mypy run."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stitchtune.ir import kir

pytestmark = pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed")

_REPO = Path(__file__).resolve().parents[2]

#: the statement / expression node types, in the order of kir's Unions
_STMTS = [t.__name__ for t in kir.Stmt.__args__]  # type: ignore[attr-defined]
_EXPRS = [t.__name__ for t in kir.Expr.__args__]  # type: ignore[attr-defined]


def _consumer(union: str, names: list[str]) -> str:
    cases = "".join(f"        case kir.{n}():\n            return {i}\n" for i, n in enumerate(names))
    return textwrap.dedent(f"""\
        from typing import assert_never
        from stitchtune.ir import kir


        def consume(x: kir.{union}) -> int:
            match x:
        """) + cases + "        case _:\n            assert_never(x)\n"


_CASES = [("Stmt", _STMTS, "Comment"), ("Expr", _EXPRS, "Extent")]


@pytest.fixture(scope="module")
def mypy_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """One mypy run over four consumers: per union, one with every case (the control) and one that leaves a
    node type out (one run: each run type-checks the IR and its imports again, ~20 CPU-s)."""
    d = tmp_path_factory.mktemp("consumers")
    for union, names, left_out in _CASES:
        (d / f"{union.lower()}_complete.py").write_text(_consumer(union, names))
        (d / f"{union.lower()}_missing.py").write_text(_consumer(union, [n for n in names if n != left_out]))
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary", "--follow-imports=silent",
         "--cache-dir", str(d / ".mypy_cache"), "--config-file", "", *sorted(map(str, d.glob("*.py")))],
        capture_output=True, text=True, cwd=_REPO, timeout=300,
    )
    return d, run


def _lines_of(report: str, path: Path) -> list[str]:
    return [ln for ln in report.splitlines() if ln.startswith(f"{path}:")]


@pytest.mark.parametrize(("union", "names", "left_out"), _CASES)
def test_mypy_reports_a_consumer_that_misses_a_node_type(mypy_report: tuple[Path, subprocess.CompletedProcess[str]],
                                                          union: str, names: list[str], left_out: str) -> None:
    d, run = mypy_report
    assert left_out in names
    assert run.returncode == 1 and not run.stderr, run.stdout + run.stderr  # errors found, mypy itself fine
    complete = _lines_of(run.stdout, d / f"{union.lower()}_complete.py")
    assert complete == [], complete  # the control: every case, no error
    missing = _lines_of(run.stdout, d / f"{union.lower()}_missing.py")
    assert any("assert_never" in ln and left_out in ln for ln in missing), run.stdout


@pytest.mark.parametrize("module", ["gpu/render.py", "emulate/translate.py", "emulate/translate_expr.py",
                                    "lower/counts.py", "cost/ir_walk.py",
                                    "ir/verify.py", "lower/scatter.py", "lower/dynamic.py"])
def test_ir_consumers_dispatch_with_assert_never(module: str) -> None:
    """The converted consumers keep their exhaustive dispatch (no isinstance chain over node types)."""
    src = (_REPO / "stitchtune" / module).read_text()
    assert "assert_never(" in src and "match " in src
