"""docs/INTERFACES.md's signatures checked against the code (issue 43, item 6).

Every call form ``name(params)`` the document writes (in its module table, its ``- `room/module.py`:``
entries and its code blocks) is resolved in the module that text is about (the table row's or entry's
module; in a code block the module a ``# room/module.py`` comment names, else the section's room) and,
where it names a function or class of the package, compared with :func:`inspect.signature`: the
parameter names in order (``...`` in the document stands for parameters left out, ``*`` for the start of
the keyword-only ones), and each default the document states as a literal. A call form whose arguments
are not parameter names (an example call such as ``bucket_of(7)``) is no signature and is not checked.

The frozen dataclasses the code blocks show (``@dataclass(frozen=True) class Kernel: name: str; ...``) are
checked too: every field the block declares (``name: type``) is a field of the class, and every public field
of the class is named in its block (a ``<...>`` placeholder, "every other column", exempts a block).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
from dataclasses import dataclass
from typing import Any

import pytest

from helpers.common import REPO

INTERFACES = REPO / "docs" / "INTERFACES.md"

#: ``name(args)`` where the arguments hold no parentheses (one nesting level of brackets is fine)
_CALL = re.compile(r"(?<![\w.`])([A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*)\(([^()]*)\)")
_MODULE = re.compile(r"(?:stitchtune/)?([a-z_]+)/([a-z_]+)\.py")
_NAME = re.compile(r"^\*{0,2}[A-Za-z_]\w*$")


@dataclass(frozen=True)
class DocCall:
    """One call form of the document: where (line), the modules it is resolved in, the name and the
    parameters as written."""

    line: int
    modules: tuple[str, ...]
    name: str
    params: str


def _room_modules(room: str) -> tuple[str, ...]:
    pkg = REPO / "stitchtune" / room
    if not pkg.is_dir():
        return ()
    return tuple(f"stitchtune.{room}.{p.stem}" for p in sorted(pkg.glob("*.py")) if p.stem != "__main__")


def _module_of(text: str) -> str | None:
    m = _MODULE.search(text)
    return f"stitchtune.{m.group(1)}.{m.group(2)}" if m else None


def _calls(text: str, line: int, modules: tuple[str, ...]) -> list[DocCall]:
    """The call forms of ``text``; ``class Name(Base)`` is none, and ``Name(Base)(params)`` (an exception
    class with its base) is ``Name(params)``."""
    out = []
    for m in _CALL.finditer(text):
        if re.search(r"\bclass\s*$", text[:m.start()]):
            continue
        params = m.group(2)
        after = re.match(r"\(([^()]*)\)", text[m.end():])
        if after:
            params = after.group(1)
        out.append(DocCall(line, modules, m.group(1), params))
    return out


@dataclass(frozen=True)
class DocLine:
    """One line of the document: its number, its text, whether it lies inside a code block (a fence
    line does not), and the modules a name on it resolves in: inside a code block the module the
    block's latest ``# room/module.py`` comment names (this line's included), then the section's room;
    outside, the section's room (``## room/``)."""

    number: int
    text: str
    code: bool
    modules: tuple[str, ...]


def doc_lines(text: str | None = None) -> list[DocLine]:
    """INTERFACES.md (or ``text``) line by line, with the room and code-block module tracking that
    both checks (signatures, dataclass fields) read."""
    out: list[DocLine] = []
    room: tuple[str, ...] = ()
    in_code, code_module = False, None
    for i, line in enumerate((text if text is not None else INTERFACES.read_text()).splitlines()):
        if line.startswith("```"):
            in_code, code_module = not in_code, None
            out.append(DocLine(i + 1, line, False, room))
            continue
        if in_code:
            code_module = _module_of(line.split("#", 1)[1] if "#" in line else "") or code_module
        else:
            head = re.match(r"^## ([a-z_]+)/", line)
            room = _room_modules(head.group(1)) if head else room
        out.append(DocLine(i + 1, line, in_code, ((code_module,) if in_code and code_module else ()) + room))
    return out


def documented_calls(text: str | None = None) -> list[DocCall]:
    """The call forms of INTERFACES.md (or of ``text``), each with the modules to resolve it in."""
    lines = doc_lines(text)
    out: list[DocCall] = []
    i = 0
    while i < len(lines):
        d = lines[i]
        i += 1
        if d.code:
            out += _calls(d.text.split("#", 1)[0], d.number, d.modules)
            continue
        row = re.match(r"^\| [a-z_]* *\| `(stitchtune/[a-z_/]+\.py)` \| (.*) \|$", d.text)
        entry = re.match(r"^- `([a-z_]+/[a-z_]+\.py)`[:,]", d.text)
        if row:
            mod = _module_of(row.group(1))
            if mod:
                out += _calls(" ".join(re.findall(r"`([^`]*)`", row.group(2))), d.number, (mod,))
        elif entry:
            body = [d.text]
            while i < len(lines) and not lines[i].code and lines[i].text.startswith("  ") and lines[i].text.strip():
                body.append(lines[i].text.strip())
                i += 1
            mod = _module_of(entry.group(1))
            spans = re.findall(r"`([^`]*)`", " ".join(body))
            out += _calls(" ".join(spans), d.number, ((mod,) if mod else ()) + d.modules)
    return out


def _split(params: str) -> list[str]:
    """``params`` split at its top-level commas."""
    parts, depth, cur = [], 0, ""
    for ch in params:
        if ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def _resolve(call: DocCall) -> Any:
    """The package's function or class ``call.name`` names in the first of its modules that holds it."""
    head, *rest = call.name.split(".")
    for mod_name in call.modules:
        try:
            mod = importlib.import_module(mod_name)
        except ImportError:   # an optional dependency (torch, onnx) missing: nothing to check there
            continue
        obj = getattr(mod, head, None)
        for attr in rest:
            obj = getattr(obj, attr, None)
        if (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.ismethod(obj)) and \
                getattr(obj, "__module__", "").startswith("stitchtune"):
            return obj
    return None


def _documented(params: str) -> list[tuple[str, str | None]] | None:
    """(name, default as written or None) per documented parameter (``...`` and ``*`` kept as names);
    None when the text is no signature (an argument that is not a parameter name)."""
    out: list[tuple[str, str | None]] = []
    for p in _split(params):
        if p in ("...", "*", "/"):
            out.append((p, None))
            continue
        name, _, default = p.partition("=")
        name = name.split(":")[0].strip()
        if not _NAME.match(name):
            return None
        out.append((name.lstrip("*"), default.strip() or None))
    return out


def check(call: DocCall) -> str | None:
    """What is wrong with one documented call form (None: it matches, or it is no signature of the package)."""
    obj = _resolve(call)
    doc = _documented(call.params)
    if obj is None or doc is None:
        return None
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    doc_names = {n for n, _ in doc}
    if inspect.isclass(obj) and doc_names and doc_names <= {c.__name__ for c in obj.__mro__}:
        return None   # ``Name(Base)``: the class and its base, no signature
    # a private parameter (``_device``) is not part of the interface unless the document names it
    real = [p for p in sig.parameters.values()
            if p.name not in ("self", "cls") and not (p.name.startswith("_") and p.name not in doc_names)]
    names = [p.name for p in real]
    where = f"INTERFACES.md:{call.line}: {call.name}({call.params})"
    documented = [n for n, _ in doc if n not in ("*", "/")]
    if not documented and call.params.strip() == "":
        required = [p.name for p in real if p.default is p.empty
                    and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        return f"{where}: the code requires {required}" if required else None
    if "..." in documented:
        it = iter(names)
        shown = [n for n in documented if n != "..."]
        if not all(n in it for n in shown):
            return f"{where}: the code's parameters are {names}"
    elif documented != names:
        return f"{where}: the code's parameters are {names}"
    by_name = {p.name: p for p in real}
    for n, default in doc:
        if default is None or n not in by_name:
            continue
        try:
            want = ast.literal_eval(default)
        except (ValueError, SyntaxError):
            continue
        have = by_name[n].default
        if have is inspect.Parameter.empty:
            return f"{where}: {n} has no default in the code"
        if type(have) in (int, float, str, bool, tuple, type(None)) and have != want:
            return f"{where}: {n} defaults to {have!r} in the code"
    if "*" in [n for n, _ in doc] and "..." not in documented:
        first_kw = next((p.name for p in real if p.kind == p.KEYWORD_ONLY), None)
        after_star = [n for n, _ in doc][[n for n, _ in doc].index("*") + 1:]
        if after_star and after_star[0] != first_kw:
            return f"{where}: the keyword-only parameters start at {first_kw!r} in the code"
    return None


def test_interfaces_signatures_match_the_code() -> None:
    calls = documented_calls()
    checked = [c for c in calls if _resolve(c) is not None and _documented(c.params) is not None]
    assert len(checked) > 100, f"only {len(checked)} signatures found in INTERFACES.md: is the parser stale?"
    drift = [p for p in map(check, calls) if p]
    assert not drift, "INTERFACES.md differs from the code:\n" + "\n".join(drift)


@pytest.mark.parametrize(("text", "wrong"), [
    ("- `graph/reference.py`: `random_inputs(graph, seed)` draws inputs.", False),
    ("- `graph/reference.py`: `random_inputs(graph, seed, scale)` draws inputs.", True),
    ("- `graph/reference.py`: `random_inputs(seed, graph)` draws inputs.", True),
    ("- `graph/reference.py`: `random_inputs(graph, seed=7)` draws inputs.", True),
    ("- `graph/reference.py`: `random_inputs(graph, ...)` draws inputs.", False),
    ("- `graph/reference.py`: `random_inputs(graph)` draws inputs.", True),
    ("- `graph/reference.py`: `random_inputs(\"g\", 3)` an example call, no signature.", False),
    ("## graph/\n```python\nrandom_inputs(graph, seed, rows)   # graph/reference.py\n```", True),
    ("| | `stitchtune/graph/reference.py` | `random_inputs(graph, sed)` |", True),
])
def test_a_planted_drift_is_found(text: str, wrong: bool) -> None:
    calls = documented_calls(text)
    assert [c.name for c in calls] == ["random_inputs"]
    assert (check(calls[0]) is not None) == wrong, check(calls[0])


# ------------------------------------------------------------------------------------ dataclass fields
@dataclass(frozen=True)
class DocClass:
    """A class block of a code block: where (line), the modules to resolve it in, its name, the fields it
    declares (``name: type``) and its whole text."""

    line: int
    modules: tuple[str, ...]
    name: str
    declared: tuple[str, ...]
    text: str


_CLASS = re.compile(r"^(?:@dataclass\S*\s+)?class (\w+)(\([^)]*\))?:")


def documented_classes(text: str | None = None) -> list[DocClass]:
    """The class blocks of INTERFACES.md's code blocks (or of ``text``): the class line and the indented
    lines under it."""
    lines = doc_lines(text)
    out: list[DocClass] = []
    for k, d in enumerate(lines):
        m = _CLASS.match(d.text) if d.code else None
        if m and not m.group(2):   # a class with a base inherits fields documented elsewhere
            block, j = [d.text[m.end():]], k + 1
            while j < len(lines) and lines[j].code and lines[j].text.startswith("    "):
                block.append(lines[j].text)
                j += 1
            declared = tuple(fm.group(1) for b in block for piece in b.split("#", 1)[0].split(";")
                             for fm in [re.match(r"^\s*([A-Za-z_]\w*)\s*:\s*\S", piece)] if fm)
            out.append(DocClass(d.number, d.modules, m.group(1), declared, "\n".join(block)))
    return out


def check_fields(doc: DocClass) -> str | None:
    """What is wrong with one documented dataclass (None: it matches, or it is no dataclass of the package)."""
    cls = None
    for mod_name in doc.modules:
        try:
            cls = getattr(importlib.import_module(mod_name), doc.name, None)
        except ImportError:
            continue
        if cls is not None and dataclasses.is_dataclass(cls):
            break
        cls = None
    if cls is None:
        return None
    real = [f.name for f in dataclasses.fields(cls) if not f.name.startswith("_")]
    where = f"INTERFACES.md:{doc.line}: class {doc.name}"
    unknown = [f for f in doc.declared if f not in real]
    if unknown:
        return f"{where}: fields {unknown} are not in the code"
    if re.search(r"<[^>]+>", doc.text):
        return None
    missing = [f for f in real if not re.search(rf"(?<![\w.]){f}\b", doc.text)]
    return f"{where}: the code's fields {missing} are not documented" if missing else None


def test_interfaces_dataclass_fields_match_the_code() -> None:
    docs = documented_classes()
    assert len([d for d in docs if d.declared]) > 20, "few dataclass blocks found in INTERFACES.md: is the parser stale?"
    drift = [p for p in map(check_fields, docs) if p]
    assert not drift, "INTERFACES.md differs from the code:\n" + "\n".join(drift)


@pytest.mark.parametrize(("block", "wrong"), [
    ("name: str; params: tuple; body: tuple; block: int; shared; locals; min_blocks_per_sm; barrier_param; "
     "extents; cluster: int", False),
    ("name: str; params: tuple; body: tuple; block: int; shared; locals; min_blocks_per_sm; barrier_param; "
     "extents", True),    # a field of the code left out (the drift issue 43 found: no cluster)
    ("name: str; params: tuple; body: tuple; block: int; shared; locals; min_blocks_per_sm; barrier_param; "
     "extents; cluster: int; grid: int", True),   # a field the code does not have
])
def test_a_planted_field_drift_is_found(block: str, wrong: bool) -> None:
    text = f"## ir/\n```python\n@dataclass(frozen=True) class Kernel: {block}   # ir/kir.py\n```"
    [doc] = documented_classes(text)
    assert (check_fields(doc) is not None) == wrong, check_fields(doc)
