"""Defects a user's pass over the README and docs/cli.md found (session 11): each is one error line and
exit 2, or works as the docs say. ``--dynamic`` naming a dim twice; ``show`` of an older database."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from helpers.cli import call_cli as call
from helpers.common import EXAMPLES_DIR

DYN = str(EXAMPLES_DIR / "dynamic" / "layernorm_seq.json")


@pytest.mark.parametrize("command", ["search", "compile"])
def test_a_dynamic_dim_given_twice_is_one_error_line(tmp_path: Path, command: str) -> None:
    extra = ["--db", str(tmp_path / "db")] + (["-o", str(tmp_path / "out"), "--no-cubin"] if command == "compile" else [])
    rc, out, err = call([command, DYN, "--dynamic", "seq=1..2048", "--dynamic", "seq=1..64", *extra])
    assert rc == 2 and out == "" and "Traceback" not in err
    assert err.strip() == ("stitchtune: error: --dynamic seq: given twice ('seq=1..2048' and 'seq=1..64'); "
                           "give each dynamic dim once")
    assert not (tmp_path / "out").exists() and not (tmp_path / "db").exists()


def _old_db(tmp_path: Path, drop: list[str]) -> Path:
    """A database whose rows lack ``drop`` (as an older version wrote them): two ok rows of one workload."""
    db = tmp_path / "old-db"
    db.mkdir()
    rows = pd.DataFrame({"status": ["ok", "ok", "error"], "graph_name": ["ln", "ln", "ln"],
                         "workload_key": ["abc123abc123"] * 3, "device_key": ["NVIDIA H200/sm_90"] * 3,
                         "backend": ["cuda"] * 3, "measured_us": [5.0, 3.5, None],
                         "schedule_key": ["s1", "s2", "s3"]})
    rows.drop(columns=drop).to_parquet(db / "part-20200101T000000000000Z-1-aaaa.parquet")
    return db


@pytest.mark.parametrize("drop", [["device_key"], ["device_key", "backend", "graph_name"], ["measured_us"]])
def test_show_reads_a_database_whose_rows_lack_columns(tmp_path: Path, drop: list[str]) -> None:
    rc, out, err = call(["show", "--db", str(_old_db(tmp_path, drop))])
    assert rc == 0 and "Traceback" not in err, err
    if "measured_us" in drop:
        assert out.splitlines()[-1] == "no successful trials in this database"
    else:   # the best of the two ok rows, one line
        (line,) = [ln for ln in out.splitlines() if "abc123abc123" in ln]
        assert " s2 " in f"{line} " and "3.500" in line


def test_show_of_rows_without_a_status_is_one_error_line(tmp_path: Path) -> None:
    rc, _out, err = call(["show", "--db", str(_old_db(tmp_path, ["status"]))])
    assert rc == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("stitchtune: error: tuning database ")
    assert "no 'status' column" in err


def test_a_stitchtune_spaces_that_names_a_file_is_one_line_naming_the_variable(tmp_path: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """``$STITCHTUNE_SPACES`` names the folder that holds stitch.json (docs/cli.md said a file)."""
    from stitchtune.space import space_file

    spaces = tmp_path / "stitch.json"
    spaces.write_text("{}")
    monkeypatch.setenv("STITCHTUNE_SPACES", str(spaces))
    assert space_file.default_space_file() == spaces / "stitch.json"
    rc, out, err = call(["space", str(EXAMPLES_DIR / "layernorm_small.json"), "--sample", "1"])
    assert rc == 2 and out == "" and "Traceback" not in err
    assert err.strip() == (f"stitchtune: error: cannot read search space {spaces}/stitch.json "
                           f"($STITCHTUNE_SPACES={str(spaces)!a} names the folder that holds stitch.json): "
                           "Not a directory")


@pytest.mark.parametrize("graph", [str(EXAMPLES_DIR / "layernorm_small.json"), DYN])
def test_compile_says_why_it_wrote_no_cubin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, graph: str) -> None:
    """--no-cubin says so; a $STITCHTUNE_NVCC that is no executable is named (it read 'nvcc not found or
    --no-cubin' while nvcc was on PATH)."""
    rc, out, err = call(["compile", graph, "--no-cubin", "-o", str(tmp_path / "a")])
    assert rc == 0 and "  no cubin (--no-cubin)" in out.splitlines(), out + err
    monkeypatch.setenv("STITCHTUNE_NVCC", str(tmp_path / "no-nvcc"))
    rc, out, err = call(["compile", graph, "-o", str(tmp_path / "b")])
    assert rc == 0, err
    assert f"  no cubin (STITCHTUNE_NVCC={str(tmp_path / 'no-nvcc')!r} is not an executable file)" in out.splitlines()


def test_a_cubin_cache_that_cannot_be_written_is_one_error_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from stitchtune.gpu.build import nvcc_found

    if not nvcc_found():
        pytest.skip("nvcc not installed")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("STITCHTUNE_CACHE", str(blocker))
    rc, out, err = call(["compile", str(EXAMPLES_DIR / "layernorm_small.json"), "-o", str(tmp_path / "out")])
    assert rc == 2 and "Traceback" not in err
    assert err.strip() == f"stitchtune: error: cannot write the cubin cache {str(blocker)!a} ($STITCHTUNE_CACHE): Not a directory"


@pytest.mark.parametrize("value", ["abc", "-1", "1.5"])
def test_a_cuda_device_that_is_no_ordinal_is_a_named_error(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    """$STITCHTUNE_CUDA_DEVICE was read with a bare int(): a ValueError traceback on a GPU machine."""
    from stitchtune.errors import StitchtuneError
    from stitchtune.gpu.driver import default_ordinal

    monkeypatch.setenv("STITCHTUNE_CUDA_DEVICE", value)
    with pytest.raises(StitchtuneError, match=r"^\$STITCHTUNE_CUDA_DEVICE must be a GPU ordinal, a whole number >= 0 "):
        default_ordinal()
    monkeypatch.setenv("STITCHTUNE_CUDA_DEVICE", "2")
    assert default_ordinal() == 2


def test_many_illegal_tuned_records_are_one_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """An older database whose records all fail re-validation: one warning for all of them (it was one
    per record: 24 lines for the committed layernorm workload)."""
    import logging

    from stitchtune.tune.database import read_db

    df = read_db(str(EXAMPLES_DIR.parent / "results" / "h200-2026-11-29"))
    df = df[df["graph_name"] == "layernorm"].assign(schedule_json='{"tpr": "x"}')
    assert len(df[df["status"] == "ok"]) > 2
    db = tmp_path / "db"
    db.mkdir()
    df.to_parquet(db / "part-20200101T000000000000Z-1-aaaa.parquet")
    with caplog.at_level(logging.WARNING, logger="stitchtune.deploy.selection"):
        rc, out, err = call(["compile", str(EXAMPLES_DIR / "layernorm.json"), "--db", str(db), "--no-cubin",
                             "-o", str(tmp_path / "out")])
    assert rc == 0 and "(heuristic)" in out, err
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("layernorm: tuned record ")]
    assert len(lines) == 1, lines
    assert lines[0].endswith("more tuned record(s) no longer legal)") and "malformed schedule" in lines[0]
