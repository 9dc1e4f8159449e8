"""The shipped fitted model's predictions, pinned (stitchtune/cost/fitted.py with the package's coefficients file).

A study term added to the model (s14's ``sm_inflight_kib`` / ``loaded_latency``, s15's ``overlap_warps``,
``l2_latency_ns``, ``phase_tasks``) must be exactly off as shipped: the package's predictions do not move unless
the coefficients file or a term is changed on purpose. Two golden tables of PREDICTED device times (µs, 12
significant digits), written at ef5e52a (before s15-order's terms) and unchanged by them:

* ``shipped_predictions_rows.txt``: every row of the stored fit dataset
  (``results/cost-fit-2026-12-07-s13-walk/dataset.json``: the 153 measured kernels' stored features) as
  :func:`~stitchtune.cost.fitting.predict_rows` predicts it: the model alone, whatever the lowering does;
* ``shipped_predictions_examples.txt``: a handful of examples at the heuristic's schedule, planned, lowered and
  predicted end to end (:func:`~stitchtune.cost.fitted.predict_program`): the model with today's features.

The user's calibrated file never enters (the package's coefficients are passed explicitly). A deliberate change
(a refit, a term switched on, a lowering change of these examples) regenerates them with
``STITCHTUNE_REGEN_GOLDEN=1`` and says so in its commit.
"""

from __future__ import annotations

import json
from pathlib import Path

from helpers.common import EXAMPLES
from helpers.lowering import assert_matches_golden
from stitchtune.cost.fitted import package_coefficients, predict_program
from stitchtune.cost.fitting import predict_rows
from stitchtune.cost.heuristic import heuristic_schedule
from stitchtune.graph.parse import load_graph
from stitchtune.hardware.device import get_device
from stitchtune.lower.entry import lower
from stitchtune.plan.planner import make_plan
from stitchtune.space import SearchSpace

H200 = get_device("h200")
DATA = Path(__file__).parent / "data"
DATASET = Path(__file__).resolve().parents[2] / "results" / "cost-fit-2026-12-07-s13-walk" / "dataset.json"
EXAMPLE_NAMES = ("layernorm", "softmax", "layernorm_backward", "colsum_sigmoid_scale", "k_transpose", "bias_gelu",
                 "cross_entropy", "embed_gather_layernorm", "rmsnorm_backward", "repeat_kv_rotary")


def test_the_shipped_coefficients_predict_the_fit_dataset_as_pinned() -> None:
    rows = json.loads(DATASET.read_text())["rows"]
    assert len(rows) == 153
    pred = predict_rows(rows, H200, package_coefficients(H200))
    text = "".join(f"{r['group']} {r['label']} {r.get('workload')} {float(p):.12g}\n" for r, p in zip(rows, pred))
    assert_matches_golden(DATA / "shipped_predictions_rows.txt", text, "the shipped model's predictions of the dataset")


def test_the_shipped_coefficients_predict_the_examples_as_pinned() -> None:
    c = package_coefficients(H200)
    lines = []
    for name in EXAMPLE_NAMES:
        g = load_graph(EXAMPLES / f"{name}.json")
        plan = make_plan(g)
        space = SearchSpace.for_plan(plan, H200)
        s = heuristic_schedule(plan, H200, space)
        pr = predict_program(lower(g, plan, s, H200, space), H200, coefficients=c)
        assert pr.prune_reason is None, (name, pr.prune_reason)
        kernels = " ".join(f"{t:.12g}" for t in pr.per_kernel_us)
        lines.append(f"{name} {pr.time_us:.12g} [{kernels}] {s.to_json()}\n")
    assert_matches_golden(DATA / "shipped_predictions_examples.txt", "".join(lines),
                          "the shipped model's predictions of the examples")
