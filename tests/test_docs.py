"""The user documentation stays true to the code and the repository.

* ``docs/cli.md`` names every subcommand and every option string the argparse parser of
  :mod:`stitchtune.cli` knows, each option in the section of its own command.
* README.md, CONTRIBUTING.md, SECURITY.md and ``docs/*.md`` link only to files (and headings) that
  exist in the repository, name only repository paths that exist, and tell no history of the work:
  no session or issue numbers, no files outside the repository. (History belongs in CHANGELOG.md.)
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from stitchtune.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
CLI_MD = ROOT / "docs" / "cli.md"
README_MAX_LINES = 260
# pages the docs index links to that are written on another branch: tolerated only while missing here


def _doc_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "SECURITY.md", ROOT / "results" / "README.md"]
    return [p for p in files if p.exists()] + sorted((ROOT / "docs").glob("*.md"))


def _commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> Iterator[
        tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every (sub)command path and its parser, the top-level parser first (path ``()``)."""
    yield prefix, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*prefix, name))


def _option_strings(parser: argparse.ArgumentParser) -> list[str]:
    return [s for a in parser._actions for s in a.option_strings]


def _sections(text: str) -> dict[str, str]:
    """``## heading`` -> the text up to the next ``## `` heading."""
    parts = re.split(r"^## +(.+)$", text, flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


def _names(option: str, text: str) -> bool:
    """Whether ``text`` names ``option`` as a code span (``--db`` or ``--db DIR``, not ``--dbx``)."""
    return re.search(r"`" + re.escape(option) + r"(?=[ `=\\])", text) is not None


def test_cli_md_names_every_subcommand_and_option() -> None:
    sections = _sections(CLI_MD.read_text())
    problems = []
    for path, parser in _commands(build_parser()):
        if not path:
            where = "Common behaviour"
            options = _option_strings(parser)
        else:
            where = f"`stitchtune {' '.join(path)}`"
            options = [o for o in _option_strings(parser) if o not in ("-h", "--help")]
            if parser._subparsers is not None and not options:
                continue  # a command group (``import``): its commands have their own sections
        if where not in sections:
            problems.append(f"docs/cli.md has no section '## {where}'")
            continue
        problems += [f"docs/cli.md, section {where}: {o} is not named" for o in options
                     if not _names(o, sections[where])]
    assert not problems, "\n".join(problems)


def _table_commands(text: str) -> set[str]:
    """The commands the first table of docs/cli.md lists (``| [`search`](#...) | ... |`` rows)."""
    return set(re.findall(r"^\| \[`([a-z -]+)`\]\(#stitchtune-", text, flags=re.M))


def test_cli_md_table_lists_every_command() -> None:
    listed = _table_commands(CLI_MD.read_text())
    commands = {" ".join(path) for path, parser in _commands(build_parser())
                if path and not (parser._subparsers is not None and not
                                 [o for o in _option_strings(parser) if o not in ("-h", "--help")])}
    assert commands - listed == set(), f"docs/cli.md's command table lacks {sorted(commands - listed)}"
    assert _table_commands("| [`search`](#stitchtune-search) | x |\n| `show` | y |") == {"search"}


README_EXAMPLES = re.compile(r"`examples/` has (\d+) at full size, each with a `\*_small` twin for CPUs, (\d+) more small ones "
                             r"at odd shapes, and (\d+) with a dynamic dimension")


def test_readme_counts_the_examples() -> None:
    """Quick start 2's count of examples is the folder's."""
    m = README_EXAMPLES.search(" ".join((ROOT / "README.md").read_text().split()))
    assert m, "README.md no longer counts the examples in the words this test reads"
    ex = ROOT / "examples"
    full = {p.name for p in ex.glob("*.json") if not p.name.endswith("_small.json")}
    small = {p.name for p in ex.glob("*_small.json")}
    twins = {n for n in full if n.replace(".json", "_small.json") in small}
    assert (int(m[1]), int(m[2]), int(m[3])) == (len(full), len(small) - len(twins), len(list((ex / "dynamic").glob("*.json"))))
    assert twins == full, f"full-size examples without a *_small twin: {sorted(full - twins)}"


def test_cli_md_test_can_fail() -> None:
    """The option check distinguishes a named option from a longer one that merely starts like it."""
    assert _names("--db", "| `--db DIR` | x |")
    assert _names("-o", "| `-o DIR`, `--out DIR` |")
    assert not _names("--db", "| `--dbx DIR` |")
    assert not _names("--seed", "the seed")


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
    return {_slug(h) for h in re.findall(r"^#+ +(.+)$", text, flags=re.M)}


LINK = re.compile(r"\]\(([^)\s]+)\)")
# a repository path (a file or folder under one of the top-level folders), in prose, code or commands
REPO_PATH = re.compile(r"(?<![\w/.-])((?:docs|results|scripts|examples|stitchtune|tests|search_spaces|notebooks)"
                       r"/[\w./-]*\w)(?![\w*<])")
FORBIDDEN = [
    (re.compile(r"\bsessions? \d", re.I), "a session number"),
    (re.compile(r"\bissues? \d", re.I), "an issue number"),
    (re.compile(r"(?<![\w&/])#\d+\b"), "an issue reference"),
    (re.compile(r"\bwork periods?\b", re.I), "a work period"),
    (re.compile(r"DESIGN\.md|METHOD\.md|\bshared/(?:baselines|DESIGN)|/work/"), "a file outside the repository"),
]


@pytest.mark.parametrize("doc", _doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_doc_links_and_paths_exist(doc: Path) -> None:
    text = doc.read_text()
    problems = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: outside links are fine
        file_part, _, anchor = target.partition("#")
        dest = (doc.parent / file_part).resolve() if file_part else doc
        if not dest.exists():
            problems.append(f"link to a missing file: {target}")
        elif not dest.is_relative_to(ROOT):
            problems.append(f"link outside the repository: {target}")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            problems.append(f"link to a missing heading: {target}")
    for path in REPO_PATH.findall(text):
        if not (ROOT / path).exists():
            problems.append(f"names a path that does not exist: {path}")
    for pattern, what in FORBIDDEN:
        problems += [f"mentions {what}: {m.group(0)!r}" for m in pattern.finditer(text)]
    assert not problems, f"{doc.relative_to(ROOT)}:\n" + "\n".join(problems)


def test_doc_checks_can_fail(tmp_path: Path) -> None:
    """The patterns catch what they are for (so a green run means something)."""
    assert _slug("`stitchtune import torch`") == "stitchtune-import-torch"
    assert _slug("Install (CPU)") == "install-cpu"
    bad = "issue 28, session 5, see #12 and shared/DESIGN.md"
    assert {what for pattern, what in FORBIDDEN if pattern.search(bad)} == {
        "a session number", "an issue number", "an issue reference", "a file outside the repository"}
    assert REPO_PATH.findall("see `results/nope.csv`, docs/cli.md, ../docs/x.md and tests/<room>/test_*.py") == [
        "results/nope.csv", "docs/cli.md"]


def test_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; the reference belongs in docs/"


def test_interfaces_names_every_module() -> None:
    """docs/INTERFACES.md has a row for every module of the package (it is the contract of each)."""
    text = (ROOT / "docs" / "INTERFACES.md").read_text()
    modules = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "stitchtune").rglob("*.py")
                     if p.name != "__init__.py")
    missing = [m for m in modules if f"`{m}`" not in text]
    assert not missing, "docs/INTERFACES.md does not name: " + ", ".join(missing)


def test_graph_format_names_every_op_and_node_key() -> None:
    """docs/graph-format.md documents every op of the op table and every key a node may have."""
    from stitchtune.graph.ops import OPS
    from stitchtune.graph.parse import _NODE_KEYS

    text = re.sub(r"^```.*?^```", "", (ROOT / "docs" / "graph-format.md").read_text(), flags=re.M | re.S)
    words = set(re.findall(r"[A-Za-z_]+", " ".join(re.findall(r"`([^`]+)`", text))))
    missing = [f"op {op}" for op in OPS if op not in words] + [f"key {k}" for k in _NODE_KEYS if k not in words]
    assert not missing, "docs/graph-format.md does not name: " + ", ".join(missing)


def _ignore_patterns() -> list[str]:
    lines = (ROOT / ".gitignore").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]


def _ignored(path: str, patterns: list[str]) -> bool:
    """Whether ``.gitignore``'s ``patterns`` ignore the repository path ``path`` (a file, or the folder it is
    in): ``/name`` anchors at the root, ``name/`` matches folders only, globs as fnmatch. Enough for the
    patterns this repository uses (no ``**``, no negation)."""
    import fnmatch

    parts = path.strip("/").split("/")
    for pat in patterns:
        body = pat.strip("/")
        anchored = pat.startswith("/") or "/" in body   # git: a slash before the end anchors at the root
        globs = body.split("/")   # a glob never matches across a "/"
        for i in range(len(parts)):
            if anchored:
                hit = i == len(globs) - 1 and all(fnmatch.fnmatchcase(p, g) for p, g in zip(parts, globs))
            else:
                hit = fnmatch.fnmatchcase(parts[i], body)
            if hit and (i < len(parts) - 1 or not pat.endswith("/")):
                return True
    return False


def _readme_outputs(text: str) -> set[str]:
    """What the README's commands and snippets write, as repository paths (run in the checkout): the values
    of ``-o``/``--out``, the default database of the commands that write one, and the files the Python
    snippets save (``np.savez``, ``torch.onnx.export``)."""
    out = set()
    for line in re.findall(r"^ {4}(stitchtune .+)$", text, flags=re.M):
        argv = line.split()
        out |= {argv[i + 1] + ("/" if argv[i] == "-o" and "." not in argv[i + 1] else "")
                for i in range(len(argv) - 1) if argv[i] in ("-o", "--out")}
        if argv[1] in ("search", "tune", "bench") and "--db" not in argv:
            out.add("tuning-db/")
        if argv[1] == "compile" and "-o" not in argv:
            out.add("compiled/")
    out |= set(re.findall(r'np\.savez\("([^"]+)"', text))
    out |= set(re.findall(r'torch\.onnx\.export\([^"\n]*"([^"]+)"', text))
    return out


def test_what_the_readme_writes_into_a_checkout_is_ignored() -> None:
    """Following the quick starts in a checkout leaves nothing for ``git status`` to show."""
    outputs = _readme_outputs((ROOT / "README.md").read_text())
    assert {"y.npz", "block.onnx", "block_graphs/", "block_inputs.npz", "tuning-db/", "out/layernorm_small/"} <= outputs
    patterns = _ignore_patterns()
    missing = sorted(p for p in outputs if not _ignored(p + ("x" if p.endswith("/") else ""), patterns))
    assert not missing, f".gitignore does not cover what the README writes: {missing}"


def test_ignore_matcher_can_fail() -> None:
    pats = ["/out/", "tuning-db/", "/*.npz", "*.pyc"]
    assert _ignored("out/a/b.cu", pats) and _ignored("x/tuning-db/part", pats) and _ignored("y.npz", pats)
    assert _ignored("deep/a.pyc", pats)
    assert not _ignored("out", pats) and not _ignored("examples/y.npz", pats) and not _ignored("src/out/x", pats)
    assert not _ignored("block.onnx", pats)
