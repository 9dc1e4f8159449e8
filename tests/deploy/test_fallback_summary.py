"""The torch backend's fallback warnings: collected per graph, said once (issue 42)."""

from __future__ import annotations

import logging

import pytest

from stitchtune.deploy import selection
from helpers.common import EXAMPLES_DIR


def test_fallbacks_inside_the_block_are_collected_not_warned(caplog: pytest.LogCaptureFixture) -> None:
    from stitchtune.graph.parse import load_graph

    selection.clear_cache()
    g = load_graph(EXAMPLES_DIR / "layernorm_small.json")
    with caplog.at_level(logging.WARNING, logger="stitchtune.deploy.selection"):
        with selection.collecting_fallbacks() as notes:
            import stitchtune

            stitchtune.compile(g, db="no-such-db-here", build=False)
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert notes == [(g.name, "heuristic", "no database at 'no-such-db-here'")]
        stitchtune.compile(g, db="no-such-db-here", build=False)   # the same fallback again: not repeated
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_summary_names_each_source_its_regions_and_distinct_reasons() -> None:
    notes = [("region_add", "heuristic", "no database at 'db'"), ("region_gelu", "heuristic", "no database at 'db'"),
             ("region_mul", "nearest-shape", "records at other shapes")]
    assert selection.fallback_summary(notes) == (
        "3 region(s) without a tuned schedule: nearest-shape for region_mul (records at other shapes); "
        "heuristic for region_add, region_gelu (no database at 'db')")
