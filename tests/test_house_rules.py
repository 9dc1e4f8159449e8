"""The house's own rules, checked (issue 43, item 6): every module of the package is named in
docs/architecture.md, no module is part of an import circle (deferred, function-level and TYPE_CHECKING imports
included), no module is over :data:`MAX_LINES` lines and no function over :data:`MAX_FUNCTION_LINES`, the strict
mypy rooms stay strict and the typed test code (:data:`TYPED_TESTS`) stays clean under mypy.

Known exceptions are listed here; the lists may only shrink: a listed exception that no longer holds
(the circle broken, the module under the limit) fails its test too, so the lists stay true.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from helpers.common import REPO

PACKAGE = REPO / "stitchtune"
ARCHITECTURE = REPO / "docs" / "architecture.md"

#: the size limit of a module, in lines (CONTRIBUTING.md, DESIGN.md: "no module over ~500 lines")
MAX_LINES = 500

#: modules over the limit today, to be split (the list may only shrink)
KNOWN_LARGE: frozenset[str] = frozenset({
})

#: the length limit of a function or method, in lines (issue 43: long functions split into named steps)
MAX_FUNCTION_LINES = 80

#: import circles today (the list may only shrink; it is empty: keep it so)
KNOWN_CIRCLES: frozenset[frozenset[str]] = frozenset()


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


# ------------------------------------------------------------------------------------ architecture.md
def _documented() -> dict[str, set[str]]:
    """Room -> the module file names its row of the rooms table in docs/architecture.md lists."""
    rows: dict[str, set[str]] = {}
    for line in ARCHITECTURE.read_text().splitlines():
        m = re.match(r"\| `([a-z_]+)/` \| (.*?) \| ", line)
        if m:
            rows[m.group(1)] = set(re.findall(r"`([^`/]+\.py)`", m.group(2)))
    return rows


def _holds_code(path: Path) -> bool:
    """Whether a module has a statement besides its docstring and ``from __future__`` imports."""
    body = ast.parse(path.read_text()).body
    return any(not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
               and not (isinstance(s, ast.ImportFrom) and s.module == "__future__") for s in body)


def _room_modules() -> dict[str, set[str]]:
    """Room -> its module file names (a room's ``__init__.py`` counts only where it holds code)."""
    out: dict[str, set[str]] = {}
    for p in _modules():
        rel = p.relative_to(PACKAGE)
        if len(rel.parts) != 2:
            continue
        if rel.name == "__init__.py" and not _holds_code(p):
            continue
        out.setdefault(rel.parts[0], set()).add(rel.name)
    return out


def test_every_module_is_named_in_the_architecture_doc() -> None:
    doc, code = _documented(), _room_modules()
    missing = sorted(f"{room}/{m}" for room, mods in code.items() for m in mods - doc.get(room, set()))
    assert not missing, f"add these modules to the rooms table of docs/architecture.md: {missing}"
    text = ARCHITECTURE.read_text()
    top = sorted(p.name for p in PACKAGE.glob("*.py") if not p.name.startswith("__"))
    assert [m for m in top if f"`{m}`" not in text and f"`stitchtune/{m}`" not in text] == [], \
        "a top-level module of the package is missing from docs/architecture.md"


def test_the_architecture_doc_names_no_module_that_is_gone() -> None:
    doc, code = _documented(), _room_modules()
    gone = sorted(f"{room}/{m}" for room, mods in doc.items() for m in mods - code.get(room, set()))
    assert not gone, f"docs/architecture.md names modules that do not exist: {gone}"
    # the one-line entries (`room/module.py`: ...) name existing modules too
    named = re.findall(r"^- `([a-z_]+/[a-z_]+\.py)`:", ARCHITECTURE.read_text(), re.M)
    assert named and [n for n in named if not (PACKAGE / n).is_file()] == []


# ------------------------------------------------------------------------------------ import circles
def _import_graph(package: str = "stitchtune") -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports anywhere in its body: function-level imports and
    ``if TYPE_CHECKING:`` imports included (a type-only circle is a circle of the design too, and mypy
    and a later refactor that makes the import real both meet it)."""
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph(package, cache_dir=None, exclude_type_checking_imports=False)
    mods = set(graph.modules)
    return {m: set(graph.find_modules_directly_imported_by(m)) & mods for m in mods}


def circles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of ``graph`` with more than one module (or a self-import):
    each is a set of modules that import one another in a circle (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1 or v in graph.get(v, ()):
                    found.add(frozenset(comp))
    return found


def test_circles_finds_deferred_and_indirect_circles() -> None:
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "d"}, "e": {"f"}, "f": set()}
    assert circles(g) == {frozenset("abc"), frozenset("d")}
    assert circles({"a": {"b"}, "b": set()}) == set()


def test_the_import_graph_holds_deferred_and_type_checking_imports(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A planted package whose circles close only through a function-level import (a <-> b) and only
    through an ``if TYPE_CHECKING:`` import (c <-> d): both are found."""
    pkg = tmp_path / "planted_circles"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("import planted_circles.b\n")
    (pkg / "b.py").write_text("def f():\n    import planted_circles.a\n")
    (pkg / "c.py").write_text("from planted_circles import d\n")
    (pkg / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from planted_circles.c import x\n")
    (pkg / "e.py").write_text("import planted_circles.a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert circles(_import_graph("planted_circles")) == {
        frozenset({"planted_circles.a", "planted_circles.b"}), frozenset({"planted_circles.c", "planted_circles.d"})}


def test_no_module_is_in_an_import_circle() -> None:
    found = circles(_import_graph())
    new = sorted(sorted(c) for c in found - KNOWN_CIRCLES)
    assert not new, f"import circles (deferred imports included): {new}"
    broken = sorted(sorted(c) for c in KNOWN_CIRCLES - found)
    assert not broken, f"these known circles are gone: take them off KNOWN_CIRCLES: {broken}"


# ------------------------------------------------------------------------------------ module size
def test_no_module_is_over_the_size_limit() -> None:
    sizes = {str(p.relative_to(PACKAGE)): _lines(p) for p in _modules()}
    over = sorted(f"{m} ({n} lines)" for m, n in sizes.items() if n > MAX_LINES and m not in KNOWN_LARGE)
    assert not over, f"modules over {MAX_LINES} lines: split them (add a module) rather than grow them: {over}"
    fixed = sorted(m for m in KNOWN_LARGE if sizes.get(m, 0) <= MAX_LINES)
    assert not fixed, f"these modules are within {MAX_LINES} lines (or gone): take them off KNOWN_LARGE: {fixed}"


# ------------------------------------------------------------------------------------ function length
def _long_functions(source: str, limit: int) -> list[tuple[str, int]]:
    """(name, lines) of every function or method of ``source`` longer than ``limit`` lines (its
    decorators left out, its docstring counted)."""
    return [(n.name, n.end_lineno - n.lineno + 1) for n in ast.walk(ast.parse(source))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno is not None
            and n.end_lineno - n.lineno + 1 > limit]


def test_long_functions_finds_a_planted_long_method() -> None:
    body = "".join(f"        x{i} = {i}\n" for i in range(5))
    src = f"class C:\n    def short(self):\n        pass\n\n    def long(self):\n{body}"
    assert _long_functions(src, 5) == [("long", 6)]
    assert _long_functions(src, 6) == []


def test_no_function_is_over_the_length_limit() -> None:
    long = sorted(f"{p.relative_to(PACKAGE)}:{name} ({n} lines)" for p in _modules()
                  for name, n in _long_functions(p.read_text(), MAX_FUNCTION_LINES))
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: extract named steps: {long}"


# ------------------------------------------------------------------------------------ strict typing
#: the rooms mypy checks strictly (issue 43: every room below the importers, the tuner, the GPU layer and
#: deployment); the list may only grow
STRICT_ROOMS = frozenset({"graph", "hardware", "ir", "space", "plan", "cost", "lower", "tune", "gpu", "deploy"})


def test_the_strict_rooms_are_strict_in_pyproject() -> None:
    import tomllib

    overrides = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]["overrides"]
    strict = [o for o in overrides if o.get("disallow_untyped_defs") and o.get("disallow_untyped_calls")
              and o.get("warn_return_any")]
    assert len(strict) == 1, "one override holds the strict settings"
    rooms = {m.removeprefix("stitchtune.").removesuffix(".*") for m in strict[0]["module"]}
    assert STRICT_ROOMS <= rooms, f"rooms no longer strict: {sorted(STRICT_ROOMS - rooms)}"


#: the test code mypy checks (issue 43: the tests' shared helpers, the planner's tests; the list may only grow)
TYPED_TESTS = ("tests/helpers", "tests/plan")


@pytest.mark.slow
def test_the_typed_test_code_is_clean() -> None:
    """``mypy`` of :data:`TYPED_TESTS` (the package's settings, ``stitchtune`` and ``helpers`` of this checkout;
    module names relative to ``tests/``, as pytest's ``pythonpath`` imports them: ``plan.test_refusals``)
    reports nothing: a helper whose types drift from the package's (a fake that no longer fits its Protocol,
    a graph builder typed ``object``) fails here."""
    import os
    import subprocess
    import sys

    pytest.importorskip("mypy")
    env = {**os.environ, "MYPYPATH": os.pathsep.join((str(REPO), str(REPO / "tests")))}
    run = subprocess.run([sys.executable, "-m", "mypy", "--explicit-package-bases", *TYPED_TESTS], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, f"mypy {' '.join(TYPED_TESTS)}:\n{run.stdout[-6000:]}{run.stderr[-2000:]}"
