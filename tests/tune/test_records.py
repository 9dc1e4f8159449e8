"""Tests of stitchtune.tune.records: the typed database row and the status enum (on-disk form unchanged)."""

from __future__ import annotations

import dataclasses
import math

import pandas as pd
import pytest

from stitchtune.errors import DatabaseError
from stitchtune.tune.database import COLUMNS, STATUSES, TuningDB, read_db, row_dict
from stitchtune.tune.records import TrialRecord, TrialStatus
from helpers.common import COMMITTED_DB


def test_status_members_are_the_stored_strings():
    assert STATUSES == ("ok", "pruned", "compile_error", "launch_error", "timeout", "wrong_result")
    assert [s.value for s in TrialStatus] == list(STATUSES)
    assert TrialStatus.OK == "ok" and TrialStatus("wrong_result") is TrialStatus.WRONG_RESULT


def test_every_fixed_column_is_a_typed_field():
    names = {f.name for f in dataclasses.fields(TrialRecord)}
    assert set(COLUMNS) <= names
    assert names - set(COLUMNS) == {"profile_json", "features_json", "bucket", "predicted_from", "params", "extra"}


def test_from_row_types_values_and_keeps_unknown_columns():
    rec = TrialRecord.from_row({"status": "ok", "measured_us": 3, "registers": 32.0, "estimated": 1,
                                "prune_reason": float("nan"), "p_block": 256, "newer_column": "x",
                                "timestamp": pd.NaT})
    assert rec.status is TrialStatus.OK and rec.ok
    assert rec.measured_us == 3.0 and isinstance(rec.measured_us, float)
    assert rec.registers == 32 and isinstance(rec.registers, int)
    assert rec.estimated is True and rec.prune_reason is None and rec.timestamp is None
    assert rec.params == {"p_block": 256} and rec.extra == {"newer_column": "x"}
    assert not TrialRecord.from_row({"status": "ok"}).ok  # ok without a time is not a usable result


@pytest.mark.parametrize("status", ["done", None, "OK"])
def test_unknown_status_is_a_database_error_naming_it(status):
    with pytest.raises(DatabaseError, match=repr(status)):
        TrialRecord.from_row({"status": status})


def test_to_row_round_trips_and_writes_plain_strings():
    rec = TrialRecord.from_row({"status": TrialStatus.PRUNED, "prune_reason": "slow", "schedule_key": "k",
                                "bucket": "seq=1..64", "p_x": 1, "extra_col": 2})
    row = rec.to_row()
    assert type(row["status"]) is str and row["status"] == "pruned"
    assert list(row)[:len(COLUMNS)] == list(COLUMNS)
    assert row["bucket"] == "seq=1..64" and row["p_x"] == 1 and row["extra_col"] == 2
    assert "profile_json" not in row  # optional columns only when set
    assert TrialRecord.from_row(row) == rec


def test_records_written_read_back_as_the_same_strings(tmp_path):
    db = TuningDB(tmp_path)
    rec = TrialRecord.from_row({"status": "ok", "workload_key": "w", "device_key": "d", "backend": "emulate",
                                "schedule_key": "s", "measured_us": 2.5, "trial_number": 0})
    db.append([rec])
    raw = pd.read_parquet(db.parts()[0])
    assert raw["status"].tolist() == ["ok"] and raw["status"].dtype != "category"
    best = db.best("w", "d", backend="emulate")
    assert best is not None and best.replace(timestamp=None) == rec


def test_committed_database_reads_as_records():
    df = read_db(COMMITTED_DB)
    recs = [TrialRecord.from_row(row_dict(r)) for _, r in df.iterrows()]
    assert len(recs) == len(df) > 0
    assert [r.status.value for r in recs] == df["status"].tolist()
    ok = [r for r in recs if r.ok]
    assert len(ok) == int(((df["status"] == "ok") & df["measured_us"].notna()).sum())
    assert all(r.params for r in recs)  # the flattened schedule went to params
    assert all(math.isfinite(r.measured_us) for r in ok)


def test_a_search_writes_the_same_columns_and_plain_status_strings(tmp_path):
    """The on-disk form is unchanged by the record type: every part a search writes holds the fixed
    columns, the schedule's p_ columns and the optional profile_json/bucket/predicted_from only, statuses as strings;
    the search's result rows are the records those parts read back as."""
    import pyarrow.parquet as pq

    from helpers.search_fakes import fake_components, FakeRunner
    from stitchtune.tune.search import SearchConfig, run_search

    cfg = SearchConfig(graph_path="fake.json", trials=40, backend="emulate", db=str(tmp_path / "db"),
                       sampler="grid", seed=1, jobs=4, progress=False, prune_factor=100.0)
    res = run_search(cfg, fake_components(FakeRunner()))
    db = TuningDB(cfg.db)
    for part in db.parts():
        schema = pq.read_schema(part)
        names = set(schema.names)
        assert set(COLUMNS) <= names, sorted(set(COLUMNS) - names)
        assert {n for n in names - set(COLUMNS) if not n.startswith("p_")} <= {"profile_json", "bucket",
                                                                              "predicted_from"}
        assert str(schema.field("status").type) in ("string", "large_string")  # as the committed parts
    df = db.read()
    assert set(df["status"]) == set(STATUSES)
    # every row with a prediction says what it read: the fakes have no compiled facts, so the IR features
    predicted = df[df["predicted_us"].notna()]
    assert len(predicted) and set(predicted["predicted_from"]) == {"ir"}
    best = db.best(res.workload_key, res.device_key, backend="emulate")
    assert res.best is not None and best is not None
    assert best.replace(timestamp=None) == res.best.replace(timestamp=None)


def test_predicted_from_is_an_optional_column_that_round_trips(tmp_path):
    """A row says what its prediction read (the pipeline's ``predicted_from``); a row written before the
    column existed (the committed database) reads as None, and the column is written only when set."""
    db = TuningDB(tmp_path)
    base = {"status": "ok", "workload_key": "w", "device_key": "d", "backend": "emulate", "measured_us": 2.0}
    db.append([TrialRecord.from_row({**base, "schedule_key": "a", "trial_number": 0, "predicted_from": "compiled"}),
               TrialRecord.from_row({**base, "schedule_key": "b", "trial_number": 1, "predicted_from": "ir"})])
    df = db.read()
    assert dict(zip(df["schedule_key"], df["predicted_from"])) == {"a": "compiled", "b": "ir"}
    recs = {r.schedule_key: r for r in (TrialRecord.from_row(row_dict(x)) for _, x in df.iterrows())}
    assert recs["a"].predicted_from == "compiled" and "predicted_from" not in recs["a"].extra
    assert "predicted_from" not in TrialRecord.from_row(base).to_row()
    old = TrialRecord.from_row(row_dict(read_db(COMMITTED_DB).iloc[0]))
    assert old.predicted_from is None
