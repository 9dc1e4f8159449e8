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


def test_the_script_prints_prior_figures(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert load_script("atomics_prior", monkeypatch).main([]) == 0
    out = capsys.readouterr().out
    assert "MEASURED" in out and "PREDICTED" in out and "prior atomic_ns = 0.023" in out
