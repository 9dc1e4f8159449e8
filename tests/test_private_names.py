"""The rooms' walls: no module uses a private name (``_name``) of a module in another room.

import-linter checks which modules import which (pyproject's layers contract), not which names they
take, so this is checked here on the syntax tree: ``from stitchtune.<room>.<mod> import _name`` and
``<module>._name`` where ``<module>`` was imported from another room. Inside a room, private helpers
may be shared between its modules."""

from __future__ import annotations

import ast
from pathlib import Path

from helpers.common import REPO


def _room(module: str) -> str:
    """``stitchtune.tune.database`` -> ``tune``; the package's own top-level modules form the room ''."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (REPO / "stitchtune" / parts[1]).is_dir()) else ""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def cross_room_private_uses(path: Path) -> list[str]:
    """``"file:line: module.name"`` for each private name of another room that ``path`` uses."""
    own = _room(_module_name(path))
    tree = ast.parse(path.read_text(), str(path))
    foreign: dict[str, str] = {}   # local name -> module of another room
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("stitchtune."):
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if _room(node.module) == own:
                    continue
                if a.name.startswith("_") and not a.name.startswith("__"):
                    out.append(f"{path.relative_to(REPO)}:{node.lineno}: {full}")
                elif (REPO / (full.replace(".", "/") + ".py")).is_file() and _room(full) != own:
                    foreign[a.asname or a.name] = full
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("stitchtune.") and a.asname and _room(a.name) != own:
                    foreign[a.asname] = a.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in foreign
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            out.append(f"{path.relative_to(REPO)}:{node.lineno}: {foreign[node.value.id]}.{node.attr}")
    return out


def test_no_module_uses_a_private_name_of_another_room() -> None:
    found = [u for p in sorted((REPO / "stitchtune").rglob("*.py")) for u in cross_room_private_uses(p)]
    assert not found, "private names used across rooms (make them public or move them):\n" + "\n".join(found)


def test_the_check_finds_a_private_import_and_a_private_attribute(tmp_path: Path, monkeypatch) -> None:
    from helpers import common as helpers_common

    fake = tmp_path / "stitchtune" / "deploy"
    fake.mkdir(parents=True)
    (tmp_path / "stitchtune" / "tune").mkdir()
    (tmp_path / "stitchtune" / "tune" / "database.py").write_text("")
    (fake / "x.py").write_text("from stitchtune.tune.database import _row_dict, read_parts\n"
                               "from stitchtune.tune import database\n"
                               "database._private(1)\ndatabase.public(2)\n")
    monkeypatch.setattr(helpers_common, "REPO", tmp_path)
    monkeypatch.setitem(globals(), "REPO", tmp_path)
    assert cross_room_private_uses(fake / "x.py") == [
        "stitchtune/deploy/x.py:1: stitchtune.tune.database._row_dict",
        "stitchtune/deploy/x.py:3: stitchtune.tune.database._private"]
