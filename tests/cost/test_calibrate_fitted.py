"""``stitchtune calibrate`` refits the fitted IR-feature cost model (stitchtune.cost.calibrate_fitted) from a
small tuning database whose rows carry ``features_json``; the user's coefficients are read before the
package's. The "measured" times here are made by the model itself with known coefficients (no GPU):
the tests check that the fit moves towards them, not the model's quality."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from stitchtune.cli import main
from stitchtune.cost import calibrate_fitted, fitted
from stitchtune.cost.calibrate import CalibrationError
from stitchtune.cost.features import KernelFeatures, program_features
from stitchtune.cost.fitted_store import user_path, write_json_atomic
from stitchtune.cost.fitting import predict_rows
from stitchtune.hardware.device import get_device
from stitchtune.tune.database import TuningDB, read_db

H200 = get_device("h200")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def base_features() -> tuple[KernelFeatures, ...]:
    from stitchtune.deploy.selection import heuristic_schedule
    from stitchtune.graph.parse import load_graph
    from stitchtune.lower.entry import lower
    from stitchtune.lower.resources import legal_space
    from stitchtune.plan.planner import make_plan

    g = load_graph(EXAMPLES / "masked_softmax_small.json")
    plan = make_plan(g)
    space = legal_space(g, plan, H200)
    return program_features(lower(g, plan, heuristic_schedule(plan, H200, space), H200, space), H200)


TRUTH = {"bw_efficiency": 0.45, "ramp_us": 4.0, "cta_ns": 200.0}


def db_rows(base: tuple[KernelFeatures, ...], n: int, with_features: bool = True, start: int = 0) -> list[dict]:
    """``n`` measured rows over 4 workloads: the base program's kernels scaled in size; measured = the model's
    time with :data:`TRUTH` (events timing)."""
    truth = dataclasses.replace(fitted.package_coefficients(H200), **TRUTH)
    out = []
    for i in range(start, start + n):
        s = 2 ** (i % 9)
        feats = [dataclasses.replace(f, grid=f.grid * s, unique_bytes=f.unique_bytes * s,
                                     requested_bytes=f.requested_bytes * s, sector_bytes=f.sector_bytes * s,
                                     excess_sector_bytes=f.excess_sector_bytes * s, waves=f.waves * s)
                 for f in base]
        fj = calibrate_fitted.features_json(f"{i:064x}", feats)
        (meas,) = predict_rows([{"kernels": json.loads(fj)["kernels"], "timing": "events"}], H200, truth)
        row = {"workload_key": f"wk{i % 4}", "graph_name": f"g{i % 4}", "schedule_key": f"s{i}", "status": "ok",
               "device_key": H200.key, "device_name": H200.name, "estimated": False,
               "predicted_us": 1.0, "measured_us": float(meas), "trial_number": i}
        if with_features:
            row["features_json"] = fj
        out.append(row)
    return out


def test_calibrate_moves_the_coefficients_towards_the_truth(base_features) -> None:
    import pandas as pd

    df = pd.DataFrame(db_rows(base_features, 36) + db_rows(base_features, 3, with_features=False, start=36))
    cal = calibrate_fitted.calibrate(df, H200)
    c, p = cal.coefficients, cal.coefficients.provenance
    assert cal.rows == 36 and cal.workloads == 4 and "3 measured rows have no features_json" in cal.notes[0]
    assert c.source == "calibrated" and p["base"] == "fitted" and p["rows"] == 36
    assert p["insample_within25_after"] >= p["insample_within25_before"]
    shipped = fitted.package_coefficients(H200)
    assert abs(c.bw_efficiency - 0.45) < abs(shipped.bw_efficiency - 0.45)


def test_too_few_rows_is_a_calibration_error(base_features) -> None:
    import pandas as pd

    with pytest.raises(CalibrationError, match=r"5 measured rows with IR features .* at least 20"):
        calibrate_fitted.calibrate(pd.DataFrame(db_rows(base_features, 5)), H200)


def test_cli_calibrate_writes_the_users_coefficients_which_the_model_reads(base_features, tmp_path, capsys) -> None:
    db = str(tmp_path / "db")
    TuningDB(db).append(db_rows(base_features, 30))
    before = fitted.coefficients_for(H200)
    assert before.source == "fitted" and not user_path(H200).exists()
    assert main(["calibrate", "--db", db]) == 0
    out = capsys.readouterr().out
    assert f"{H200.key}: 30 measured rows with IR features" in out
    assert f"fitted on 30 measured rows of 4 workloads -> {user_path(H200)}" in out and "in-sample" in out
    after = fitted.coefficients_for(H200)
    assert after.source == "calibrated" and after != before and after.provenance["db"] == db
    assert fitted.package_coefficients(H200) == before     # the package's file is untouched
    assert os.listdir(user_path(H200).parent) == [user_path(H200).name]   # no temporary file left


def test_cli_calibrate_too_few_rows_is_one_error_line(base_features, tmp_path, capsys) -> None:
    db = str(tmp_path / "db")
    TuningDB(db).append(db_rows(base_features, 4) + db_rows(base_features, 30, with_features=False, start=4))
    assert main(["calibrate", "--db", db]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("stitchtune: error: 4 measured rows with IR features")
    assert "30 measured rows have no features_json" in err[0]
    assert not user_path(H200).exists()


def test_held_out_judges_the_calibration_on_unseen_workloads(base_features, tmp_path, capsys) -> None:
    rows, _ = calibrate_fitted.fit_rows(__import__("pandas").DataFrame(db_rows(base_features, 24)), H200.key)
    h = calibrate_fitted.held_out(rows, H200)
    assert h["workloads"] == 4 and h["held_out"]["n"] == h["base"]["n"] == 24
    assert h["held_out"]["within25"] > h["base"]["within25"]    # the truth is not the package's coefficients
    with pytest.raises(CalibrationError, match="two workloads"):
        calibrate_fitted.held_out([r for r in rows if r["group"] == rows[0]["group"]], H200)
    db = str(tmp_path / "db")
    TuningDB(db).append(db_rows(base_features, 24))
    assert main(["calibrate", "--db", db, "--held-out"]) == 0
    assert "held out (each of 4 workloads predicted by a fit without it)" in capsys.readouterr().out


def test_cli_calibrate_out_names_the_file(base_features, tmp_path, capsys) -> None:
    db = str(tmp_path / "db")
    TuningDB(db).append(db_rows(base_features, 24))
    out = tmp_path / "mine.json"
    assert main(["calibrate", "--db", db, "--device", "h200", "-o", str(out)]) == 0
    assert json.loads(out.read_text())["source"] == "calibrated" and not user_path(H200).exists()


def test_a_crash_while_writing_leaves_the_previous_file(base_features, tmp_path, monkeypatch) -> None:
    import pandas as pd

    target = tmp_path / "c.json"
    target.write_text("previous\n")
    cal = calibrate_fitted.calibrate(pd.DataFrame(db_rows(base_features, 24)), H200)

    def crash(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        calibrate_fitted.save(cal, target)
    assert target.read_text() == "previous\n" and os.listdir(tmp_path) == ["c.json"]
    monkeypatch.undo()
    write_json_atomic(target, {"a": 1})
    assert json.loads(target.read_text()) == {"a": 1}


def test_a_users_file_of_another_device_or_unreadable_is_ignored(tmp_path) -> None:
    shipped = fitted.package_coefficients(H200)
    user_path(H200).parent.mkdir(parents=True)
    user_path(H200).write_text("{not json")
    assert fitted.coefficients_for(H200) == shipped
    write_json_atomic(user_path(H200), dataclasses.replace(shipped, device_key="Other/sm_80").to_dict())
    assert fitted.coefficients_for(H200) == shipped


def test_a_users_file_from_an_older_version_takes_the_missing_fields_from_the_package() -> None:
    shipped = fitted.package_coefficients(H200)
    old = {k: v for k, v in shipped.to_dict().items() if k not in ("round_ns", "provenance")}
    write_json_atomic(user_path(H200), {**old, "bw_efficiency": 0.5, "source": "calibrated"})
    c = fitted.coefficients_for(H200)
    assert c.source == "calibrated" and c.bw_efficiency == 0.5 and c.round_ns == shipped.round_ns != 600.0


def test_rows_without_features_are_left_out_and_counted() -> None:
    import pandas as pd

    df = pd.DataFrame([{"status": "ok", "measured_us": 5.0, "predicted_us": 4.0, "device_key": H200.key,
                        "estimated": False, "features_json": "{bad"},
                       {"status": "ok", "measured_us": 5.0, "predicted_us": 4.0, "device_key": H200.key,
                        "estimated": True, "features_json": None}])
    rows, notes = calibrate_fitted.fit_rows(df, H200.key)
    assert rows == [] and notes == ["1 measured rows have an unreadable features_json (or one of a newer stitchtune): left out"]
    assert read_db  # the CLI's reader is what the tests above go through


# ------------------------------------------------------------------ compiled facts in features_json (version 2)
def _facts(base, bytes_in_flight: float = 4.0, spills: int = 0) -> dict:
    from stitchtune.cost.compiled import CompiledFacts

    return {f.name: CompiledFacts(registers=int(f.registers), bytes_in_flight=bytes_in_flight, loads_in_flight=1.0,
                                  spill_instructions=spills) for f in base}


def compiled_rows(base, n: int, start: int = 0, facts_every: int = 1) -> list[dict]:
    """Like :func:`db_rows`, but each program's cubin keeps one 4-byte load in flight per thread (its compiled
    facts, recorded in ``features_json``; rows ``i % facts_every != 0`` have none) and the measured time is the
    model's with :data:`TRUTH` on the compiled features: a fit that ignores the facts cannot match it."""
    from stitchtune.cost.compiled import with_compiled

    truth = dataclasses.replace(fitted.package_coefficients(H200), **TRUTH)
    out = db_rows(base, n, start=start)
    for row in out:
        i = row["trial_number"]
        kernels = json.loads(row["features_json"])["kernels"]
        feats = [KernelFeatures(**k) for k in kernels]
        facts = _facts(base)
        (meas,) = predict_rows([{"kernels": [dict(f.to_dict(), per_access=None) for f in with_compiled(feats, facts)],
                                 "timing": "events"}], H200, truth)
        row["measured_us"] = float(meas)
        row["features_json"] = calibrate_fitted.features_json(f"{i:064x}", feats,
                                                              compiled=facts if i % facts_every == 0 else None)
    return out


def test_features_json_version_2_carries_the_compiled_facts_and_version_1_still_reads(base_features) -> None:
    import pandas as pd

    v2 = json.loads(calibrate_fitted.features_json("ab" * 32, base_features, compiled=_facts(base_features, 76.0, 3)))
    assert v2["version"] == calibrate_fitted.FEATURES_VERSION == 2
    assert v2["compiled"] == {f.name: {"registers": int(f.registers), "bytes_in_flight": 76.0, "loads_in_flight": 1.0,
                                       "spill_instructions": 3} for f in base_features}
    assert json.loads(calibrate_fitted.features_json("ab" * 32, base_features))["compiled"] is None
    v1 = json.dumps({k: v for k, v in v2.items() if k not in ("version", "compiled")})   # written before s13
    newer = json.dumps({**v2, "version": 3})
    bad = json.dumps({**v2, "compiled": {"k": {"registers": 1}}})
    partial = json.dumps({**v2, "compiled": {"other_kernel": v2["compiled"][base_features[0].name]}})
    rows = [{"status": "ok", "measured_us": 5.0, "predicted_us": 4.0, "device_key": H200.key, "estimated": False,
             "graph_name": "g", "workload_key": "w", "schedule_key": f"s{i}", "features_json": fj}
            for i, fj in enumerate((json.dumps(v2), v1, newer, bad, partial))]
    got, notes = calibrate_fitted.fit_rows(pd.DataFrame(rows), H200.key, "auto")
    assert [r["label"] for r in got] == ["s0", "s1", "s4"] and {r["fit_on"] for r in got} == {"ir"}
    assert "2 measured rows have an unreadable features_json (or one of a newer stitchtune)" in notes[0]
    assert "2 of 3 rows have no compiled facts" in notes[1]     # v1, and facts that miss the measured kernel


def test_auto_fits_on_compiled_facts_when_every_row_has_them(base_features) -> None:
    import pandas as pd

    df = pd.DataFrame(compiled_rows(base_features, 30))
    assert {r["fit_on"] for r in calibrate_fitted.fit_rows(df, H200.key)[0]} == {"ir"}   # the default
    rows, notes = calibrate_fitted.fit_rows(df, H200.key, "auto")
    assert notes == [] and {r["fit_on"] for r in rows} == {"compiled"}
    assert all(k["compiled_bytes_in_flight"] == 4.0 for r in rows for k in r["kernels"])
    ir_rows, _ = calibrate_fitted.fit_rows(df, H200.key, "ir")
    assert all(k["compiled_bytes_in_flight"] == 0.0 for r in ir_rows for k in r["kernels"])
    on_compiled = calibrate_fitted.calibrate(df, H200, fit_on="auto")
    on_ir = calibrate_fitted.calibrate(df, H200)
    assert on_compiled.fitted_on == "compiled" and on_compiled.coefficients.provenance["fitted_on"] == "compiled"
    assert on_ir.fitted_on == "ir" and on_ir.coefficients.provenance["fitted_on"] == "ir"
    meas = [r["measured_us"] for r in rows]

    def err(c, rs) -> float:
        import numpy as np

        return float(np.median(np.abs(np.log(predict_rows(rs, H200, c) / meas))))

    # the times were made on the compiled features: the fit that reads them matches them better
    assert err(on_compiled.coefficients, rows) < 0.5 * err(on_ir.coefficients, ir_rows)


def test_auto_falls_back_to_ir_features_with_a_log_line_and_compiled_is_an_error(base_features, tmp_path, capsys,
                                                                                 caplog) -> None:
    import logging

    import pandas as pd

    df = pd.DataFrame(compiled_rows(base_features, 30, facts_every=3))
    with caplog.at_level(logging.INFO, logger="stitchtune.cost.calibrate_fitted"):
        cal = calibrate_fitted.calibrate(df, H200, fit_on="auto")
    assert cal.fitted_on == "ir" and "20 of 30 rows have no compiled facts" in cal.notes[-1]
    assert any("20 of 30 rows have no compiled facts" in r.getMessage() and "IR features" in r.getMessage()
               for r in caplog.records)
    with pytest.raises(CalibrationError, match="20 of 30 measured rows .* have no compiled facts"):
        calibrate_fitted.calibrate(df, H200, fit_on="compiled")
    db = str(tmp_path / "db")
    TuningDB(db).append(compiled_rows(base_features, 30, facts_every=3))
    assert main(["calibrate", "--db", db, "--fit-on", "compiled"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("stitchtune: error: 20 of 30 measured rows")
    assert not user_path(H200).exists()
    assert main(["calibrate", "--db", db, "--fit-on", "auto"]) == 0
    assert "fitting on IR features; 20 of 30 rows have no compiled facts" in capsys.readouterr().out
    db2 = str(tmp_path / "db2")
    TuningDB(db2).append(compiled_rows(base_features, 30))
    assert main(["calibrate", "--db", db2, "-o", str(tmp_path / "c.json"), "--fit-on", "auto"]) == 0
    assert "30 measured rows with IR features, fitting with compiled facts" in capsys.readouterr().out
    assert json.loads((tmp_path / "c.json").read_text())["provenance"]["fitted_on"] == "compiled"
    # --fit-on is the fitted model's: with --profile-model (which never reads it) a user mistake, one line, exit 2
    assert main(["calibrate", "--db", db2, "--profile-model", "--fit-on", "compiled"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["stitchtune: error: --fit-on chooses what the fitted model is fitted on; --profile-model refits the "
                   "profile-based model, which reads neither: drop one of them"]
    assert not (tmp_path / "db2" / "cost_params_h200.json").exists() and not any((tmp_path / "db2").glob("cost_params*"))


def test_the_committed_database_without_features_still_loads_beside_new_rows(base_features, tmp_path,
                                                                            capsys) -> None:
    """results/h200-2026-11-29 (written before features_json existed): it loads, its 109 measured rows are
    counted as having no features; a database holding its parts and new parts fits on the new rows."""
    import shutil

    committed = Path(__file__).resolve().parents[2] / "results" / "h200-2026-11-29"
    df = read_db(str(committed))
    rows, notes = calibrate_fitted.fit_rows(df, H200.key)
    assert rows == [] and notes == ["109 measured rows have no features_json (written before this version, or by an "
                                    "older stitchtune): left out"]
    db = tmp_path / "db"
    db.mkdir()
    for part in committed.glob("*.parquet"):
        shutil.copy(part, db / part.name)
    assert main(["calibrate", "--db", str(db)]) == 2
    assert "0 measured rows with IR features" in capsys.readouterr().err
    TuningDB(str(db)).append(compiled_rows(base_features, 24))
    cal = calibrate_fitted.calibrate(read_db(str(db)), H200, fit_on="auto")
    assert cal.rows == 24 and cal.fitted_on == "compiled" and "109 measured rows have no features_json" in cal.notes[0]
