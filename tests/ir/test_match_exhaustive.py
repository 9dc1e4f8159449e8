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


def _mypy(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    mod = tmp_path / "consumer.py"
    mod.write_text(source)
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary", "--follow-imports=silent",
         "--cache-dir", str(tmp_path / ".mypy_cache"), "--config-file", "", str(mod)],
        capture_output=True, text=True, cwd=_REPO, timeout=300,
    )


@pytest.mark.parametrize(("union", "names", "left_out"), [("Stmt", _STMTS, "Comment"), ("Expr", _EXPRS, "Extent")])
def test_mypy_reports_a_consumer_that_misses_a_node_type(tmp_path: Path, union: str, names: list[str],
                                                          left_out: str) -> None:
    assert left_out in names
    complete = _mypy(tmp_path, _consumer(union, names))
    assert complete.returncode == 0, complete.stdout + complete.stderr  # the control: every case, no error
    missing = _mypy(tmp_path, _consumer(union, [n for n in names if n != left_out]))
    assert missing.returncode == 1, missing.stdout + missing.stderr
    assert "assert_never" in missing.stdout and left_out in missing.stdout, missing.stdout


@pytest.mark.parametrize("module", ["gpu/render.py", "emulate/translate.py", "emulate/translate_expr.py",
                                    "lower/counts.py", "cost/ir_walk.py",
                                    "ir/verify.py", "lower/scatter.py", "lower/dynamic.py"])
def test_ir_consumers_dispatch_with_assert_never(module: str) -> None:
    """The converted consumers keep their exhaustive dispatch (no isinstance chain over node types)."""
    src = (_REPO / "stitchtune" / module).read_text()
    assert "assert_never(" in src and "match " in src
