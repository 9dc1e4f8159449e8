"""CLI: validate / run, error reporting (exit 2, one line per problem, no traceback), and a
hypothesis fuzz of > 1000 malformed graphs through ``cli.main(["validate", path])``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stitchtune import cli
from stitchtune.graph.parse import load_graph
from stitchtune.graph.reference import random_inputs, run_reference
from helpers.cli import call_cli as call
from helpers.hostile import json_values, malformed_graph

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SMALL = sorted(EXAMPLES.glob("*_small.json"))
SMALL_DICTS = [json.loads(p.read_text()) for p in SMALL]


def assert_user_error(rc: int, out: str, err: str) -> None:
    assert rc == 2, (rc, out, err)
    assert "Traceback" not in err and "Traceback" not in out
    lines = err.splitlines()
    assert lines, "no message"
    for line in lines:
        # our errors, or argparse's usage text + "stitchtune <cmd>: error: ..."
        assert line.startswith("stitchtune: error: ") or line.startswith("usage:") \
            or line.startswith(" ") or (line.startswith("stitchtune ") and ": error: " in line), line
    assert any(len(line) > len("stitchtune: error: ") for line in lines)


# ---------------------------------------------------------------------------- validate
def test_validate_summary(examples_dir: Path) -> None:
    rc, out, err = call(["validate", str(examples_dir / "layernorm.json")])
    assert rc == 0 and err == ""
    assert "graph layernorm: valid" in out
    assert "reduce_mean x2" in out and "rsqrt x1" in out
    assert "mean = reduce_mean(x[16384, 1024]) axes=[1] keepdims=true -> [16384, 1]" in out
    g = load_graph(examples_dir / "layernorm.json")
    assert f"min bytes moved: {g.min_bytes()} " in out
    assert g.min_bytes() == (2 * 16384 * 1024 + 2 * 1024) * 4
    assert g.workload_key() in out


def test_validate_every_example(small_examples: list[Path], full_examples: list[Path]) -> None:
    for p in small_examples + full_examples:
        rc, out, _ = call(["validate", str(p)])
        assert rc == 0 and "valid" in out, p


def test_validate_errors_one_line_each(tmp_path: Path) -> None:
    d = json.loads((EXAMPLES / "layernorm_small.json").read_text())
    d["nodes"][1]["args"] = ["x", "nope\n*/ system(\"rm\");"]
    d["nodes"][2]["op"] = "frob"
    p = tmp_path / "g.json"
    p.write_text(json.dumps(d))
    rc, out, err = call(["validate", str(p)])
    assert_user_error(rc, out, err)
    lines = err.splitlines()
    assert any(line.startswith("stitchtune: error: nodes[1].args[1]: unknown tensor") for line in lines)
    assert any("nodes[2].op: unknown op 'frob'" in line for line in lines)
    assert "\\n" in err  # the newline inside the name is escaped, not printed


def test_usage_errors_exit_2() -> None:
    assert_user_error(*call([]))
    assert_user_error(*call(["bogus"]))
    assert_user_error(*call(["run", str(EXAMPLES / "softmax_small.json"), "--out", "x.npz"]))
    assert_user_error(*call(["validate", "/nonexistent/graph.json"]))
    rc, out, _ = call(["--version"])
    assert rc == 0 and "stitchtune" in out


def test_python_dash_m() -> None:
    r = subprocess.run([sys.executable, "-m", "stitchtune", "validate",
                        str(EXAMPLES / "softmax_small.json")], capture_output=True, text=True,
                       timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 0 and "graph softmax_small: valid" in r.stdout
    r = subprocess.run([sys.executable, "-m", "stitchtune", "validate", "/nonexistent.json"],
                       capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 2 and r.stderr.startswith("stitchtune: error: ")


# ---------------------------------------------------------------------------- run
def test_run_random_then_inputs_round_trip(tmp_path: Path) -> None:
    gpath = EXAMPLES / "layernorm_bf16_small.json"
    g = load_graph(gpath)
    ins = random_inputs(g, 7)
    np.savez(tmp_path / "in.npz", **ins)
    rc, out, err = call(["run", str(gpath), "--inputs", str(tmp_path / "in.npz"),
                         "--out", str(tmp_path / "out.npz")])
    assert rc == 0, err
    rc, _, err = call(["run", str(gpath), "--random-inputs", "7", "--out", str(tmp_path / "r.npz"),
                       "--backend", "reference"])
    assert rc == 0, err
    want = run_reference(g, ins)["y"]
    for f in ("out.npz", "r.npz"):
        with np.load(tmp_path / f) as z:
            assert list(z.files) == ["y"]
            got = z["y"].view(ml_dtypes.bfloat16)  # stored as 2-byte void
            assert np.array_equal(got, want)


def test_run_float32_outputs(tmp_path: Path) -> None:
    gpath = EXAMPLES / "softmax_odd_small.json"
    rc, out, err = call(["run", str(gpath), "--random-inputs", "0", "--out", str(tmp_path / "o.npz"),
                         "--schedule", '{"ignored": true}'])
    assert rc == 0, err
    with np.load(tmp_path / "o.npz") as z:
        assert z["y"].dtype == np.float32 and np.allclose(z["y"].sum(-1), 1.0, atol=1e-5)


def test_run_input_errors(tmp_path: Path) -> None:
    gpath = EXAMPLES / "layernorm_small.json"
    g = load_graph(gpath)
    ins = random_inputs(g, 0)
    ins["x"] = ins["x"].astype(np.float64)
    del ins["beta"]
    np.savez(tmp_path / "bad.npz", **ins)
    rc, out, err = call(["run", str(gpath), "--inputs", str(tmp_path / "bad.npz"),
                         "--out", str(tmp_path / "o.npz")])
    assert_user_error(rc, out, err)
    assert "'beta': missing" in err and "'x': dtype float64" in err
    (tmp_path / "junk.npz").write_bytes(b"not an npz")
    assert_user_error(*call(["run", str(gpath), "--inputs", str(tmp_path / "junk.npz"),
                             "--out", str(tmp_path / "o.npz")]))
    rc, _out, err = call(["run", str(gpath), "--random-inputs", "0", "--out", str(tmp_path / "nodir" / "o.npz")])
    assert rc == 0 and (tmp_path / "nodir" / "o.npz").is_file(), err   # a missing folder is created
    assert_user_error(*call(["run", str(gpath), "--random-inputs", "0", "--out",
                             str(tmp_path / "junk.npz" / "o.npz")]))   # under a file: no folder can be made
    assert_user_error(*call(["run", str(gpath), "--random-inputs", "0", "--out",
                             str(tmp_path / "o.npz"), "--schedule", "{not json"]))
    assert_user_error(*call(["run", str(gpath), "--random-inputs", "0", "--out",
                             str(tmp_path / "o.npz"), "--schedule", "@" + str(tmp_path / "none")]))
    assert_user_error(*call(["run", str(gpath), "--random-inputs", "0", "--out",
                             str(tmp_path / "o.npz"), "--backend", "nonexistent"]))


def test_parse_schedule_arg(tmp_path: Path) -> None:
    (tmp_path / "s.json").write_text('{"a": 1}')
    assert cli.parse_schedule_arg("@" + str(tmp_path / "s.json")) == {"a": 1}
    assert cli.parse_schedule_arg('{"b": 2}') == {"b": 2}
    assert cli.parse_schedule_arg(None) is None


# ---------------------------------------------------------------------------- fuzz
@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def _validate_bytes(fuzz_dir: Path, raw: bytes) -> None:
    p = fuzz_dir / "g.json"
    p.write_bytes(raw)
    rc, out, err = call(["validate", str(p)])
    assert_user_error(rc, out, err)
    assert out == ""
    assert all(line.startswith("stitchtune: error: ") for line in err.splitlines()), err


FUZZ = settings(deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow,
                                                                         HealthCheck.filter_too_much])


@settings(FUZZ, max_examples=150)
@given(d=malformed_graph())
def test_fuzz_mutated_examples(fuzz_dir: Path, d: Any) -> None:
    """Mutated examples: one clear error line or a valid graph (the quick set's share; the slow set
    runs 600 more, :func:`test_fuzz_mutated_examples_more`)."""
    _validate_bytes(fuzz_dir, json.dumps(d).encode())


@pytest.mark.slow
@settings(FUZZ, max_examples=600)
@given(d=malformed_graph())
def test_fuzz_mutated_examples_more(fuzz_dir: Path, d: Any) -> None:
    _validate_bytes(fuzz_dir, json.dumps(d).encode())


@settings(FUZZ, max_examples=250)
@given(v=json_values)
def test_fuzz_random_json(fuzz_dir: Path, v: Any) -> None:
    _validate_bytes(fuzz_dir, json.dumps(v).encode())


@settings(FUZZ, max_examples=150)
@given(raw=st.binary(max_size=64), cut=st.integers(0, 400), bad=st.sampled_from([b"\xff", b"\xc3", b"\x80\x80"]))
def test_fuzz_bytes(fuzz_dir: Path, raw: bytes, cut: int, bad: bytes) -> None:
    text = (EXAMPLES / "softmax_small.json").read_bytes()
    _validate_bytes(fuzz_dir, text[:cut] + bad + text[cut:])  # not UTF-8
    if cut < len(text) - 1:
        _validate_bytes(fuzz_dir, text[:cut])  # truncated
    try:
        json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        _validate_bytes(fuzz_dir, raw)  # arbitrary bytes that are not a JSON document
