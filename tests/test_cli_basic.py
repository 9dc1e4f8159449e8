"""CLI: validate / run, error reporting (exit 2, one line per problem, no traceback), and a
hypothesis fuzz of > 1000 malformed graphs through ``cli.main(["validate", path])``."""

from __future__ import annotations

import contextlib
import io
import json
import math
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
from stitchtune.graph import DTYPES, NAME_RE, load_graph
from stitchtune.ops import OPS
from stitchtune.reference import random_inputs, run_reference

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SMALL = sorted(EXAMPLES.glob("*_small.json"))
SMALL_DICTS = [json.loads(p.read_text()) for p in SMALL]


def call(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(argv)
    return rc, out.getvalue(), err.getvalue()


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
                       timeout=120, cwd=Path(__file__).resolve().parent.parent)
    assert r.returncode == 0 and "graph softmax_small: valid" in r.stdout
    r = subprocess.run([sys.executable, "-m", "stitchtune", "validate", "/nonexistent.json"],
                       capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parent.parent)
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
    assert_user_error(*call(["run", str(gpath), "--random-inputs", "0", "--out",
                             str(tmp_path / "nodir" / "o.npz")]))
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
HOSTILE_CHARS = ['"', "'", "\n", "\r", "*/", "/*", ";", "\\", " ", "-", "$(", "`", "\x00", "é",
                 "\u2028", "{", "}", "#", "%", "."]
hostile_names = st.one_of(
    st.builds(lambda a, c, b: a + c + b, st.from_regex(r"[a-z]{0,5}", fullmatch=True),
              st.sampled_from(HOSTILE_CHARS), st.text(max_size=8)),
    st.from_regex(r"[0-9][A-Za-z0-9_]{0,6}", fullmatch=True),
    st.just(""), st.just("a" * 65), st.text(min_size=1, max_size=12),
).filter(lambda s: not NAME_RE.fullmatch(s))

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=10),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=12,
)
not_a_list = st.none() | st.booleans() | st.integers() | st.text(max_size=5) | \
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)
not_a_dict = st.none() | st.booleans() | st.integers() | st.text(max_size=5) | st.lists(st.integers(), max_size=2)


def _defined(d: dict[str, Any]) -> set[str]:
    return set(d["inputs"]) | {n["id"] for n in d["nodes"]}


@st.composite
def malformed_graph(draw: st.DrawFn) -> dict[str, Any]:
    """A small example with one mutation that certainly makes it invalid."""
    d = json.loads(json.dumps(draw(st.sampled_from(SMALL_DICTS))))
    nodes = d["nodes"]
    i = draw(st.integers(0, len(nodes) - 1))
    node = nodes[i]
    kind = draw(st.sampled_from([
        "node_id", "input_name", "graph_name", "dim", "dtype", "op", "drop_top", "drop_node_key",
        "unknown_arg", "arity", "axes", "constant", "extra_key", "output", "swap", "top_type",
        "nodes_type", "inputs_type", "node_type", "shape_type", "dup_id", "cast_to", "rank",
    ]))
    if kind == "node_id":
        node["id"] = draw(hostile_names)
    elif kind == "input_name":
        k = draw(st.sampled_from(sorted(d["inputs"])))
        d["inputs"][draw(hostile_names)] = d["inputs"].pop(k)
    elif kind == "graph_name":
        d["name"] = draw(hostile_names | st.integers() | st.none())
    elif kind == "dim":
        spec = d["inputs"][draw(st.sampled_from(sorted(d["inputs"])))]
        j = draw(st.integers(0, len(spec["shape"]) - 1))
        spec["shape"][j] = draw(st.integers(max_value=0) | st.floats() | st.text(max_size=3)
                                | st.booleans() | st.none() | st.integers(min_value=2**31))
    elif kind == "dtype":
        spec = d["inputs"][draw(st.sampled_from(sorted(d["inputs"])))]
        spec["dtype"] = draw(json_values.filter(lambda v: v not in DTYPES))
    elif kind == "op":
        node["op"] = draw(json_values.filter(lambda v: not (isinstance(v, str) and v in OPS)))
    elif kind == "drop_top":
        del d[draw(st.sampled_from(["name", "inputs", "nodes", "outputs"]))]
    elif kind == "drop_node_key":
        del node[draw(st.sampled_from(["id", "op", "args"]))]
    elif kind == "unknown_arg":
        defined = _defined(d)
        node["args"][0] = draw(st.text(max_size=10).filter(lambda s: s not in defined)
                               | st.none() | st.booleans() | st.lists(st.integers(), max_size=2))
    elif kind == "arity":
        node["args"] = node["args"] + draw(st.lists(st.sampled_from(sorted(d["inputs"])) | st.floats(0, 1),
                                                    min_size=1, max_size=3))
    elif kind == "axes":
        red = [n for n in nodes if n["op"].startswith("reduce_")]
        if red:
            red[0]["axes"] = draw(st.lists(st.integers(min_value=4) | st.integers(max_value=-5),
                                           min_size=1, max_size=3) | not_a_list | st.just([]))
        else:
            node["axes"] = [0]  # not a reduction
    elif kind == "constant":
        consts = [(n, j) for n in nodes for j, a in enumerate(n["args"]) if not isinstance(a, str)]
        bad = draw(st.sampled_from([True, False, math.nan, 1e39, -1e300, None, {}, [1.0]]))
        if consts:
            n, j = consts[0]
            n["args"][j] = bad
        else:
            node["args"][0] = bad
    elif kind == "extra_key":
        target = draw(st.sampled_from(["top", "node", "input"]))
        key = draw(st.text(max_size=8).filter(
            lambda k: k not in ("id", "op", "args", "axes", "keepdims", "to", "name", "inputs",
                                "nodes", "outputs", "description", "shape", "dtype")))
        if target == "top":
            d[key] = draw(json_values)
        elif target == "node":
            node[key] = draw(json_values)
        else:
            d["inputs"][sorted(d["inputs"])[0]][key] = draw(json_values)
    elif kind == "output":
        defined = _defined(d)
        d["outputs"] = draw(st.lists(st.text(max_size=8).filter(lambda s: s not in defined),
                                     min_size=1, max_size=3) | not_a_list | st.just([]))
    elif kind == "swap":
        # move the last node (which reads an earlier node) to the front: a forward reference
        nodes.insert(0, nodes.pop())
        if all(a in d["inputs"] or not isinstance(a, str) for a in nodes[0]["args"]):
            nodes[0]["args"][0] = nodes[-1]["id"]
    elif kind == "top_type":
        d = draw(not_a_dict)  # type: ignore[assignment]
    elif kind == "nodes_type":
        d["nodes"] = draw(not_a_list | st.just([]))
    elif kind == "inputs_type":
        d["inputs"] = draw(not_a_dict.filter(lambda v: not isinstance(v, dict)))
    elif kind == "node_type":
        nodes[i] = draw(not_a_dict)
    elif kind == "shape_type":
        spec = d["inputs"][sorted(d["inputs"])[0]]
        spec["shape"] = draw(not_a_list | st.just([]))
    elif kind == "dup_id":
        node["id"] = draw(st.sampled_from(sorted(_defined(d) - {node["id"]})))
    elif kind == "cast_to":
        node["op"], node["args"], node["to"] = "cast", node["args"][:1], draw(
            json_values.filter(lambda v: v not in DTYPES))
        node.pop("axes", None)
        node.pop("keepdims", None)
        if isinstance(node["args"][0], (int, float)):
            node["args"][0] = "x"
    elif kind == "rank":
        spec = d["inputs"][sorted(d["inputs"])[0]]
        spec["shape"] = draw(st.lists(st.integers(1, 3), min_size=5, max_size=7))
    return d


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


@settings(FUZZ, max_examples=600)
@given(d=malformed_graph())
def test_fuzz_mutated_examples(fuzz_dir: Path, d: Any) -> None:
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
