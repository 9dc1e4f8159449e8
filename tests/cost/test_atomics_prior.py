"""The fitted model's atomics coefficient is the prior ``scripts/atomics_prior.py`` derives from the one measured H200
kernel with atomic adds (Inductor's BERT-training embedding backward), not a number of its own: a refit of the
ceiling or a new measurement changes both or the test says so. Every time here but ``measured_us`` is PREDICTED."""

from __future__ import annotations

import pytest

from helpers.common import load_script
from stitchtune.cost.fitted import FIT_BOUNDS, Coefficients, package_coefficients
from stitchtune.hardware.device import get_device


def test_the_shipped_atomics_coefficient_is_the_documented_prior(monkeypatch: pytest.MonkeyPatch) -> None:
    d = load_script("atomics_prior", monkeypatch).derive()
    assert d["measured_us"] == 64.9 and d["lanes"] == 4096 * 768 // 4 * 2
    assert 20.0 < d["non_atomic_us"] < d["measured_us"]
    assert package_coefficients(get_device("h200")).atomic_ns == d["prior_ns"]
    assert Coefficients().atomic_ns == d["prior_ns"]          # the defaults (a fit's base) carry it too
    assert "atomic_ns" not in FIT_BOUNDS                         # a prior: no fit row has atomics
    assert d["alternatives"]["inductor_line"] > d["prior_ns"] and d["alternatives"]["word_table_only"] > d["prior_ns"]


def test_zero_fills_stream_at_the_measured_store_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    """The store rate is the prior from Inductor's 98.3 MB zero fill, checked on its 3.1 MB one (within 10%)."""
    z = load_script("atomics_prior", monkeypatch).derive()["zero_fill"]
    assert package_coefficients(get_device("h200")).store_bw_factor == z["store_bw_factor"] == Coefficients().store_bw_factor
    _, _, measured, predicted = z["check"]
    assert abs(predicted / measured - 1.0) < 0.1


def test_a_zero_fill_is_predicted_at_the_store_rate_and_its_ideal_keeps_it() -> None:
    """A kernel without loads: ramp + bytes / (store_bw_factor x copy); 0 restores the ceiling (bw_efficiency)."""
    import dataclasses

    from stitchtune.analysis.fitted_ideal import ideal_features
    from stitchtune.cost.fitted import kernel_device_us
    from stitchtune.graph.parse import parse_graph
    from stitchtune.lower.entry import lower
    from stitchtune.lower.resources import legal_space
    from stitchtune.cost.heuristic import heuristic_schedule
    from stitchtune.cost.features import program_features
    from stitchtune.plan.planner import make_plan

    dev = get_device("h200")
    g = parse_graph({"name": "fill", "inputs": {"ids": {"shape": [64], "dtype": "int64"},
                                                "v": {"shape": [64, 256], "dtype": "float32"}},
                     "nodes": [{"id": "t", "op": "scatter_add", "args": ["v", "ids"], "shape": [8192, 256]}],
                     "outputs": ["t"]})
    plan = make_plan(g)
    space = legal_space(g, plan, dev)
    prog = lower(g, plan, heuristic_schedule(plan, dev, space), dev, space)
    fills = [f for f in program_features(prog, dev) if f.bytes_in_flight_per_thread <= 0 and f.load_rounds <= 0]
    assert fills, [f.name for f in program_features(prog, dev)]
    f, c = fills[0], package_coefficients(dev)
    copy = dev.effective_copy_bandwidth_gbs()
    assert kernel_device_us(f, dev, c) == pytest.approx(c.ramp_us + f.unique_bytes / (c.store_bw_factor * copy) / 1e3,
                                                        rel=0.02)
    before = kernel_device_us(f, dev, dataclasses.replace(c, store_bw_factor=0.0))
    assert before == pytest.approx(c.ramp_us + f.unique_bytes / (c.bw_efficiency * copy) / 1e3, rel=0.02)
    assert kernel_device_us(ideal_features(f), dev, c) <= kernel_device_us(f, dev, c) + 1e-9


def test_the_script_prints_prior_figures(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert load_script("atomics_prior", monkeypatch).main([]) == 0
    out = capsys.readouterr().out
    assert "MEASURED" in out and "PREDICTED" in out and "prior atomic_ns = 0.023" in out
