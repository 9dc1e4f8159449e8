"""The fitted model's time of ideal launches (stitchtune/analysis/fitted_ideal.py): never above the fitted
prediction of the same program, strictly below it where a kernel has an inefficiency the features see, and
carried by the audit (``RegionAudit.fitted_ideal_us``). All figures are predictions."""

from __future__ import annotations

import dataclasses

import pytest

from helpers.lowering import DEV, setup
from stitchtune.analysis.audit import audit_graph
from stitchtune.analysis.fitted_ideal import ideal_features, ideal_us
from stitchtune.cost.features import program_features
from stitchtune.cost.fitted import coefficients_for, kernel_device_us, predict_program
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.lower.entry import lower


def _program(name: str, **change: object):  # type: ignore[no-untyped-def]
    g, plan, space = setup(name)
    s = dataclasses.replace(heuristic_schedule(plan, DEV, space), **change)
    return lower(g, plan, s, DEV, space)


@pytest.mark.parametrize("name", ["softmax.json", "layernorm.json", "bias_gelu.json", "layernorm_backward.json"])
def test_the_ideal_is_at_most_the_prediction(name: str) -> None:
    program = _program(name)
    ideal, fitted = ideal_us(program, DEV), predict_program(program, DEV).time_us
    assert 0.0 < ideal <= fitted + 1e-9, (ideal, fitted)


def test_an_inefficient_kernel_is_predicted_above_its_ideal() -> None:
    """One thread per row of a 4096-float softmax row (tpr 1): few lanes' requests, long serial loops."""
    program = _program("softmax.json", tpr=32, block=32)
    feats = program_features(program, DEV)
    c = coefficients_for(DEV)
    assert all(kernel_device_us(ideal_features(f), DEV, c) < kernel_device_us(f, DEV, c) for f in feats)


def test_the_ideal_keeps_bytes_and_grid() -> None:
    (f,) = program_features(_program("softmax.json"), DEV)
    i = ideal_features(f)
    assert (i.unique_bytes, i.grid, i.block, i.blocks_per_sm) == (f.unique_bytes, f.grid, f.block, f.blocks_per_sm)
    assert i.sector_bytes == f.unique_bytes and i.excess_sector_bytes == 0 and i.active_lanes == 1.0


def test_the_audit_reports_the_ideal() -> None:
    g, _, _ = setup("softmax_small.json")
    a = audit_graph(g, DEV, sass=False)
    assert a.fitted_ideal_us is not None and 0.0 < a.fitted_ideal_us <= a.fitted_us
    assert type(a).from_dict(a.to_dict()).fitted_ideal_us == a.fitted_ideal_us
