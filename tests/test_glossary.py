"""docs/glossary.md (issue 42): the words a newcomer meets are defined, every scheme and reuse level
the code has is named there, and the README and docs/README.md link to it."""

from __future__ import annotations

import re

from helpers.common import REPO

GLOSSARY = (REPO / "docs" / "glossary.md").read_text()


def _entry(word: str) -> str:
    """The paragraph of the entry whose bold title contains ``word``."""
    m = re.search(r"^\*\*([^*]*\b" + re.escape(word) + r"\b[^*]*)\*\*(.*?)(?=^\*\*|\Z)", GLOSSARY, flags=re.M | re.S)
    assert m, f"docs/glossary.md has no entry for {word!r}"
    return m.group(2)


def test_the_words_of_the_issue_have_entries() -> None:
    for word in ("tpr", "Cubin", "Region", "Bucket", "Scheme", "Reuse level", "Floor", "Workload",
                 "Heuristic schedule", "estimated", "Call pattern"):
        assert len(_entry(word).split()) >= 10, word


def test_every_scheme_and_reuse_level_of_the_code_is_named() -> None:
    from stitchtune.space.levels import ReuseLevel
    from stitchtune.space.schemes import SCHEMES

    schemes, levels = _entry("Scheme"), _entry("Reuse level")
    for scheme in SCHEMES:
        assert f"`{scheme.name.value}`" in schemes, scheme.name
    for level in ReuseLevel:
        assert f"`{level.value}`" in levels, level


def test_the_readme_and_the_docs_index_link_to_it() -> None:
    assert "(docs/glossary.md)" in (REPO / "README.md").read_text()
    assert "(glossary.md)" in (REPO / "docs" / "README.md").read_text()
