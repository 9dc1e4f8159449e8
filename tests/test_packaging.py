"""Packaging: pyproject's explicit package list is every package folder of ``stitchtune/`` (plus the schedule
space, shipped from the top-level ``search_spaces/`` as package data), and every third-party module the code
imports is a declared dependency, an extra's, or one of the few optional GPU libraries checked at run time.
(``scripts/check_wheel.sh`` builds and runs the wheel itself; CI calls it.)"""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

from helpers.common import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]

#: import name -> distribution name, where they differ or an import needs a named distribution
DIST_OF = {"ml_dtypes": "ml-dtypes", "cuda": "cuda-bindings", "yaml": "pyyaml"}
#: imported inside functions for `bench`'s XLA peer on a GPU, with a one-line error when absent; not an
#: extra, because the right wheel depends on the local CUDA version (jax[cuda12])
OPTIONAL_AT_RUN_TIME = {"jax"}


def _dist_name(requirement: str) -> str:
    name = requirement.split(";")[0].split("[")[0]
    for sep in "<>=!~ ":
        name = name.split(sep)[0]
    return name.strip().lower().replace("_", "-")


def test_packages_list_matches_the_package_folders() -> None:
    folders = {"stitchtune"} | {
        "stitchtune." + ".".join(d.relative_to(REPO / "stitchtune").parts)
        for d in (REPO / "stitchtune").rglob("*") if d.is_dir() and d.name != "__pycache__"}
    assert not [f for f in folders if not (REPO / f.replace(".", "/") / "__init__.py").is_file()], \
        "a folder of stitchtune/ without __init__.py"
    assert set(SETUPTOOLS["packages"]) == folders | {"stitchtune.search_spaces"}
    assert len(SETUPTOOLS["packages"]) == len(set(SETUPTOOLS["packages"])), "a package listed twice"


def test_the_schedule_space_ships_as_package_data() -> None:
    assert SETUPTOOLS["package-dir"] == {"stitchtune.search_spaces": "search_spaces"}
    assert SETUPTOOLS["package-data"]["stitchtune.search_spaces"] == ["*.json"]
    assert (REPO / "search_spaces" / "stitch.json").is_file()
    assert not (REPO / "stitchtune" / "search_spaces").exists()   # one copy, at the top level


def _imported_top_level_names() -> dict[str, str]:
    names: dict[str, str] = {}
    for path in sorted((REPO / "stitchtune").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                mods = [node.module]
            else:
                continue
            for m in mods:
                names.setdefault(m.split(".")[0], str(path.relative_to(REPO)))
    return names


def test_every_imported_third_party_module_is_declared() -> None:
    project = PYPROJECT["project"]
    declared = {_dist_name(r) for r in project["dependencies"]}
    extras = {_dist_name(r) for reqs in project["optional-dependencies"].values() for r in reqs}
    names = _imported_top_level_names()
    third_party = {n: where for n, where in names.items() if n not in sys.stdlib_module_names and n != "stitchtune"}
    assert {"numpy", "pandas", "optuna"} <= set(third_party)   # the scan sees the imports
    undeclared = {n: where for n, where in third_party.items()
                  if n not in OPTIONAL_AT_RUN_TIME and DIST_OF.get(n, n).replace("_", "-") not in declared | extras}
    assert undeclared == {}, f"imported but not a dependency or an extra's: {undeclared}"
