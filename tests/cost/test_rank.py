"""One Spearman definition (issue 42): `report` (analysis.summary_table) and `model-check`
(cost.calibrate.model_check) print the same rho for the same rows."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from stitchtune.cost.rank import rho_points, spearman_rho
from helpers.common import COMMITTED_DB


def test_report_and_model_check_agree_on_the_committed_database() -> None:
    from stitchtune.analysis.data import summary_table
    from stitchtune.cost.calibrate import model_check
    from stitchtune.tune.database import read_db

    df = read_db(str(COMMITTED_DB))
    report = {w.split()[0]: r for w, r in zip(summary_table(df)["workload"], summary_table(df)["spearman"])}
    check = dict(zip(model_check(df)["graph_name"], model_check(df)["spearman"]))
    assert set(report) == set(check) and len(check) >= 5
    for name, rho in check.items():
        assert rho == pytest.approx(report[name], abs=1e-12), name
    assert round(check["layernorm_wide"], 2) == 0.50      # was 0.46 in model-check (its reused row counted)


def test_reused_rows_are_left_out_and_ties_share_their_average_rank() -> None:
    rows = pd.DataFrame({"predicted_us": [1.0, 2.0, 3.0, 4.0, 4.0, 9.0],
                         "measured_us": [10.0, 30.0, 20.0, 40.0, 40.0, 5.0],
                         "reused": [False, False, False, False, True, True]})
    assert len(rho_points(rows)) == 4
    assert spearman_rho(rows) == pytest.approx(0.8)          # ranks 1 2 3 4 vs 1 3 2 4
    ties = pd.DataFrame({"predicted_us": [1.0, 1.0, 2.0, 3.0], "measured_us": [1.0, 2.0, 3.0, 4.0]})
    # average ranks: predicted (1.5, 1.5, 3, 4) against (1, 2, 3, 4): Pearson's r of the ranks
    r = np.corrcoef([1.5, 1.5, 3, 4], [1, 2, 3, 4])[0, 1]
    assert spearman_rho(ties) == pytest.approx(r)


@pytest.mark.parametrize("rows", [
    {"predicted_us": [1.0, 2.0], "measured_us": [1.0, 2.0]},                       # two points
    {"predicted_us": [1.0, 2.0, 3.0], "measured_us": [5.0, 5.0, 5.0]},             # constant time
    {"predicted_us": [1.0, 2.0, np.nan, 4.0], "measured_us": [1.0, 0.0, 3.0, 2.0]},  # NaN, zero time
])
def test_too_few_points_give_nan(rows: dict) -> None:
    assert math.isnan(spearman_rho(pd.DataFrame(rows)))


def test_the_analysis_name_reads_time_us() -> None:
    from stitchtune.analysis.data import spearman

    rows = pd.DataFrame({"predicted_us": [3.0, 2.0, 1.0], "time_us": [1.0, 2.0, 3.0], "is_reused": False})
    assert spearman(rows) == pytest.approx(-1.0)
