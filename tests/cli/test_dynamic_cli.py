"""Mistakes with graphs that have dynamic dims: one `stitchtune: error:` line each, exit 2, no traceback, no
internal name, and the line says what to type (`--dynamic seq=LO..HI` with the graph's own bounds)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from helpers.common import EXAMPLES_DIR
from stitchtune import cli

DYN = str(EXAMPLES_DIR / "dynamic" / "layernorm_seq.json")       # seq declared 1..2048
TWO = str(EXAMPLES_DIR / "dynamic" / "embed_add_layernorm_seq.json")  # tok [2, seq, 128], pos [seq, 128]
STATIC = str(EXAMPLES_DIR / "layernorm_small.json")


def one_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    rc = cli.main(argv)
    out, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("stitchtune: error: "), (rc, err)
    assert "Traceback" not in err and "load_dynamic" not in err and "stitchtune.graph" not in err
    return lines[0]


def test_search_without_dynamic_says_how(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = one_error(["search", DYN, "--db", str(tmp_path / "db"), "--trials", "1"], capsys)
    assert "search it with --dynamic seq=1..2048 (" in line and "has dynamic dims (seq=1..2048)" in line
    assert not (tmp_path / "db").exists()   # refused before anything ran
    # a graph that declares its own buckets: the hint tunes those (so that compile and run find the records)
    obj = json.loads(Path(DYN).read_text())
    obj["dynamic"]["seq"]["buckets"] = [64, 512, 2048]
    (tmp_path / "g.json").write_text(json.dumps(obj))
    line = one_error(["search", str(tmp_path / "g.json"), "--db", str(tmp_path / "db")], capsys)
    assert "search it with --dynamic seq=1..2048:64,512,2048 (" in line


@pytest.mark.parametrize("cmd", ["search", "compile"])
def test_a_range_beyond_the_declared_bounds_is_refused(cmd: str, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    extra = ["--trials", "1"] if cmd == "search" else ["--no-cubin", "-o", str(tmp_path / "c")]
    line = one_error([cmd, DYN, "--dynamic", "seq=1..99999", "--db", str(tmp_path / "db"), *extra], capsys)
    assert "seq=1..99999" in line and "declares for seq, 1..2048" in line
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("argv,want", [
    (["--random-inputs", "0"], "no extent for dynamic dim seq: give --dynamic seq=N (1 <= N <= 2048)"),
    (["--random-inputs", "0", "--dynamic", "seq=4096"], "--dynamic seq=4096: outside the bounds the graph declares for seq, 1..2048"),
    (["--random-inputs", "0", "--dynamic", "seq=x"], "run takes one extent per dynamic dim, NAME=N"),
    (["--random-inputs", "0", "--dynamic", "seq=1..64"], "run takes one extent per dynamic dim, NAME=N"),
    (["--random-inputs", "0", "--dynamic", "hid=3"], "the graph has no dynamic dim 'hid' (its dims: seq=1..2048)"),
    (["--random-inputs", "0", "--dynamic", "seq=3", "--dynamic", "seq=4"], "--dynamic seq: given twice (3 and 4)"),
])
def test_run_extent_mistakes(argv: list[str], want: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = one_error(["run", DYN, "--backend", "emulate", "-o", str(tmp_path / "y.npz"), *argv], capsys)
    assert want in line


def test_run_inputs_that_disagree_on_an_extent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    np.savez(tmp_path / "in.npz", tok=np.ones((2, 5, 128), np.float32), pos=np.ones((6, 128), np.float32))
    line = one_error(["run", TWO, "--inputs", str(tmp_path / "in.npz"), "--random-inputs", "0",
                      "-o", str(tmp_path / "y.npz")], capsys)
    assert "input 'pos' dim 0: seq=6, but input 'tok' has seq=5" in line
    np.savez(tmp_path / "in2.npz", tok=np.ones((2, 5, 128), np.float32))
    line = one_error(["run", TWO, "--inputs", str(tmp_path / "in2.npz"), "--random-inputs", "0", "--dynamic", "seq=7",
                      "-o", str(tmp_path / "y.npz")], capsys)
    assert "input 'tok' dim 1: seq=5, but --dynamic seq=7" in line


@pytest.mark.parametrize("cmd", ["run", "compile"])
def test_dynamic_on_a_static_graph(cmd: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    extra = ["--random-inputs", "0", "-o", str(tmp_path / "y.npz")] if cmd == "run" else ["-o", str(tmp_path / "c")]
    line = one_error([cmd, STATIC, "--dynamic", "seq=4" if cmd == "run" else "seq=1..4", *extra], capsys)
    assert "has no dynamic dim" in line


def test_space_of_a_dynamic_graph_names_the_commands_that_take_it(capsys: pytest.CaptureFixture[str]) -> None:
    line = one_error(["space", DYN], capsys)
    assert "has dynamic dims (seq=1..2048)" in line and "search --dynamic seq=1..2048" in line
