"""Hostile input (issue 9, part 1): >= 10,000 malformed or hostile graphs through the CLI in-process.

What is checked, for every generated graph file and every command that reads a graph (``validate``,
``run``, ``search`` and ``compile``; a command that does not exist yet is skipped):

* exit code 2, nothing on stdout, no traceback, and every stderr line is
  ``stitchtune: error: <where>: <what>`` (the problem is named, one line each);
* a hostile string from the file never reaches stderr raw (newlines, quotes, ``*/``, control
  characters are escaped), and the expected problem is named for the kinds we construct ourselves
  (``too many nodes``, ``cycle``, ``too large``, ``unknown op``, ``not UTF-8``, ...);
* no hang: each call runs under a SIGALRM guard (:data:`CALL_LIMIT_S`) and hypothesis' deadline.

Example budget (``derandomize=True``, so the run is the same every time): see :data:`EXAMPLES`;
the total over all four commands is :data:`TOTAL_EXAMPLES` (>= 10,000).

Also here: the generated CUDA source never contains a graph string (it is identical for a graph
whose every name is renamed, including to C keywords), nvcc's argument list is fixed (a recording
fake nvcc), and a graph that does not fit in the device's memory is refused with both numbers.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import random
import re
import stat
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stitchtune import cli
from stitchtune.graph.parse import (
    MAX_ELEMENTS,
    MAX_INPUTS,
    MAX_NODES,
    MAX_OUTPUTS,
    MAX_TOTAL_BYTES,
    NAME_RE,
)
from stitchtune.graph.ops import OPS

from helpers.common import time_limit
from helpers.hostile import hostile_names, json_values, LOWER, malformed_graph, pick, SMALL_GRAPHS

pytestmark = pytest.mark.slow

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"
SMALL = sorted(EXAMPLES_DIR.glob("*_small.json"))
SMALL_DICTS = [json.loads(p.read_text()) for p in SMALL]

#: examples per command (hypothesis max_examples); the sum is the figure the README quotes
EXAMPLES = {"validate": 4000, "run": 2000, "search": 2500, "compile": 1500}
TOTAL_EXAMPLES = sum(EXAMPLES.values())
SCALE = float(os.environ.get("STITCHTUNE_FUZZ_SCALE", "1"))  # for quick local runs only; CI runs 1
CALL_LIMIT_S = 20.0  # one CLI call on a hostile graph; a hang fails the example
FUZZ = settings(deadline=timedelta(seconds=CALL_LIMIT_S), derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                       HealthCheck.function_scoped_fixture, HealthCheck.data_too_large])

ERROR_LINE = re.compile(r"^stitchtune: error: \S.*: \S")
INFO_LINES = ("backend ", "stitchtune: WARNING: ")  # search says which backend it uses; logged warnings
HOSTILE_CHARS = ['"', "'", "\n", "\r", "\t", "*/", "/*", ";", "\\", "$(", "`", "|", "&", ">", "\x00",
                 "\x1b[31m", "é", "\u2028", "{", "}", "%s", "%n", "..", "/"]


# ------------------------------------------------------------------------------------------ commands
def _commands() -> dict[str, Any]:
    parser = cli.build_parser()
    for action in parser._actions:
        if hasattr(action, "choices") and isinstance(action.choices, dict):
            return action.choices
    return {}


COMMANDS = _commands()


def test_every_fuzzed_command_exists() -> None:
    """The fuzzers below run every command they know; none may be missing from the CLI."""
    assert set(EXAMPLES) <= set(COMMANDS), sorted(set(EXAMPLES) - set(COMMANDS))


def _options(command: str) -> set[str]:
    sub = COMMANDS[command]
    return {o for a in sub._actions for o in a.option_strings}


def argv_for(command: str, graph: str, work: Path) -> list[str]:
    """The command line for ``command`` on ``graph`` (cheap flags, outputs under ``work``)."""
    if command == "validate":
        return ["validate", graph]
    if command == "run":
        return ["run", graph, "--random-inputs", "0", "--out", str(work / "out.npz")]
    opts = _options(command)
    argv = [command, graph]
    wanted = {"search": [("--backend", "emulate"), ("--trials", "1"), ("--db", str(work / "db")),
                         ("--jobs", "1"), ("--device", "h200"), ("--no-progress", None), ("--no-build", None)],
              "compile": [("--db", str(work / "db")), ("--device", "h200"), ("-o", str(work / "out")),
                          ("--out", str(work / "out")), ("--no-cubin", None)]}[command]
    for flag, value in wanted:
        if flag in opts and not (flag == "--out" and "-o" in opts):
            argv += [flag] if value is None else [flag, value]
    return argv


def call(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), time_limit(CALL_LIMIT_S):
        rc = cli.main(argv)
    return rc, out.getvalue(), err.getvalue()


def assert_named_refusal(rc: int, out: str, err: str, expect: tuple[str, ...], raw: tuple[str, ...],
                         where: bool = True) -> None:
    """Exit 2, one ``where: what`` line per problem (``where=False``: any non-empty problem line), the
    expected words, no raw hostile string."""
    assert rc == 2, (rc, out[-500:], err[-2000:])
    assert out == "", out[-500:]
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if not ln.startswith(INFO_LINES)]
    assert lines, f"no error message: {err!r}"
    for line in lines:
        if where:
            assert ERROR_LINE.match(line) or line.startswith("stitchtune: error: ... and "), line
        else:
            assert re.match(r"^stitchtune: error: \S", line), line
    for line in err.splitlines():
        assert all(ch.isprintable() for ch in line), ascii(line)
    if expect:
        assert any(e in err for e in expect), (expect, err[-2000:])
    for s in raw:
        assert s not in err, (s, err[-2000:])


# ------------------------------------------------------------------------------------------ strategies
hostile = st.builds(lambda a, c, b: a + c + b, st.text(LOWER, max_size=4),   # [a-z]{0,4} + char + text
                    st.sampled_from(HOSTILE_CHARS), st.text(max_size=6))

# Every strategy hostile_graph draws from is built once, here: one made inside the draw is a new object per
# example, validated and labelled again each time (10,000 examples).
KINDS = st.sampled_from([
    "mutated", "mutated", "mutated", "random_json", "deep_chain", "cycle", "self_cycle", "huge_dim",
    "negative_dim", "total_bytes", "unknown_op", "hostile_name", "wrong_type", "non_utf8",
    "truncated", "deep_json", "too_many_inputs", "too_many_outputs", "big_file", "huge_int",
])
CYCLE_OPS = ("neg", "exp", "relu")
HUGE_SHAPES = st.lists(st.integers(2**16, 2**40), min_size=2, max_size=4)
OP_NAMES = hostile | st.text(min_size=1, max_size=12)
NAMES = hostile | hostile_names
NAME_PLACES = st.sampled_from(["graph", "input", "node", "output", "arg", "dtype", "axes_key"])
WRONG_VALUES = (st.none() | st.booleans() | st.floats(allow_nan=True) | st.integers()
                | st.lists(st.integers(), max_size=2) | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)
                | st.text(max_size=4))
WRONG_PLACES = st.sampled_from(["name", "inputs", "nodes", "outputs", "shape", "dtype", "id", "op", "args", "axes",
                                "keepdims", "node", "spec"])
BAD_UTF8 = st.sampled_from([b"\xff", b"\xc3", b"\x80\x80", b"\xed\xa0\x80"])
NESTERS = st.sampled_from([(b"[", b"]"), (b'{"a":', b"}")])
HUGE_INT_HEADS = st.sampled_from(["9", "-9", "0.9e"])
BIG_DESCRIPTION = 4 * 1024 * 1024  # characters: the file is over MAX_FILE_BYTES


def dumps_with(d: dict[str, Any], key: str, value_json: bytes) -> bytes:
    """``json.dumps(d).encode()`` with ``d[key]`` serialised as ``value_json`` (JSON text), byte for byte what
    json.dumps writes when ``d[key]`` is that value; for values too large to build as Python objects per
    example (thousands of nodes, megabytes of text). ``d`` is changed: ``d[key]`` becomes a placeholder."""
    d[key] = "\x00splice\x00"
    text = json.dumps(d).encode()
    marker = json.dumps(d[key]).encode()
    assert text.count(marker) == 1
    return text.replace(marker, value_json)


@functools.lru_cache(maxsize=1)
def _chain_nodes() -> tuple[bytes, ...]:
    """JSON of nodes ``n1 .. n{MAX_NODES + 63}`` of the deep chain (``n{i} = neg(n{i-1})``), built once."""
    return tuple(json.dumps({"id": f"n{i}", "op": "neg", "args": [f"n{i - 1}"]}).encode()
                 for i in range(1, MAX_NODES + 64))


def chain_nodes_json(first_in: str, n: int) -> bytes:
    """JSON of the list of ``n`` nodes ``n0 = neg(first_in)``, ``n{i} = neg(n{i-1})``."""
    head = json.dumps({"id": "n0", "op": "neg", "args": [first_in]}).encode()
    return b"[" + b", ".join((head, *_chain_nodes()[:n - 1])) + b"]"


@functools.lru_cache(maxsize=1)
def _big_description() -> bytes:
    return json.dumps("x" * BIG_DESCRIPTION).encode()


def _raw_markers(s: str) -> tuple[str, ...]:
    """Substrings of a hostile string that must never appear unescaped in an error message."""
    return (s,) if any(c in s for c in "\n\r\x00\x1b\u2028\t") and len(s) > 1 else ()


def _base(draw: st.DrawFn) -> dict[str, Any]:
    return json.loads(json.dumps(draw(SMALL_GRAPHS)))


@st.composite
def hostile_graph(draw: st.DrawFn) -> tuple[bytes, tuple[str, ...], tuple[str, ...]]:
    """(file bytes, words one of which the error must contain (empty: any named problem), raw
    strings that must not be echoed)."""
    kind = draw(KINDS)
    if kind == "mutated":
        return json.dumps(draw(malformed_graph())).encode(), (), ()
    if kind == "random_json":
        v = draw(json_values)
        return json.dumps(v).encode(), (), ()
    d = _base(draw)
    inputs = sorted(d["inputs"])
    first_in = inputs[0]
    if kind == "deep_chain":
        n = draw(st.integers(MAX_NODES + 1, MAX_NODES + 64))
        d["outputs"] = [f"n{n - 1}"]
        return dumps_with(d, "nodes", chain_nodes_json(first_in, n)), ("too many nodes",), ()
    if kind == "cycle":
        k = draw(st.integers(2, 60))
        ops = draw(st.integers(0, len(CYCLE_OPS) ** k - 1))  # node i's op: base-3 digit i (one draw, not k)
        d["nodes"] = [{"id": f"c{i}", "op": CYCLE_OPS[ops // len(CYCLE_OPS) ** i % len(CYCLE_OPS)],
                       "args": [f"c{(i + 1) % k}"]} for i in range(k)]
        d["outputs"] = ["c0"]
        return json.dumps(d).encode(), ("cycle", "unknown tensor"), ()
    if kind == "self_cycle":
        node = d["nodes"][draw(st.integers(0, len(d["nodes"]) - 1))]
        node["args"][0] = node["id"]
        return json.dumps(d).encode(), ("cycle", "unknown tensor", "args"), ()
    if kind == "huge_dim":
        spec = d["inputs"][pick(draw, inputs)]
        spec["shape"] = draw(HUGE_SHAPES)
        return json.dumps(d).encode(), ("too large",), ()
    if kind == "negative_dim":
        spec = d["inputs"][pick(draw, inputs)]
        j = draw(st.integers(0, len(spec["shape"]) - 1))
        spec["shape"][j] = draw(st.integers(-(2**63), 0))
        return json.dumps(d).encode(), ("must be positive",), ()
    if kind == "total_bytes":
        # every tensor within MAX_ELEMENTS, together over MAX_TOTAL_BYTES
        per = MAX_ELEMENTS * 4
        count = MAX_TOTAL_BYTES // per + draw(st.integers(1, 8))
        d["inputs"] = {f"t{i}": {"shape": [32768, 65535], "dtype": "float32"} for i in range(count)}
        d["nodes"] = [{"id": "s0", "op": "add", "args": ["t0", "t1"]}] + [
            {"id": f"s{i}", "op": "add", "args": [f"s{i - 1}", f"t{i + 1}"]} for i in range(1, count - 1)]
        d["outputs"] = [f"s{count - 2}"]
        return json.dumps(d).encode(), ("too large",), ()
    if kind == "unknown_op":
        node = d["nodes"][draw(st.integers(0, len(d["nodes"]) - 1))]
        op = draw(OP_NAMES).strip("\x00") or "bogus"
        if op in OPS:
            op = op + "_x"
        node["op"] = op
        return json.dumps(d).encode(), ("unknown op",), _raw_markers(op)
    if kind == "hostile_name":
        name = draw(NAMES)
        where = draw(NAME_PLACES)
        if where == "graph":
            d["name"] = name
        elif where == "input":
            d["inputs"][name] = d["inputs"].pop(first_in)
        elif where == "node":
            d["nodes"][draw(st.integers(0, len(d["nodes"]) - 1))]["id"] = name
        elif where == "output":
            d["outputs"][0] = name
        elif where == "arg":
            d["nodes"][0]["args"][0] = name
        elif where == "dtype":
            d["inputs"][first_in]["dtype"] = name
        else:
            d["nodes"][0][name] = 1
        return json.dumps(d).encode(), (), _raw_markers(name)
    if kind == "wrong_type":
        bad = draw(WRONG_VALUES)
        target = draw(WRONG_PLACES)
        node = d["nodes"][draw(st.integers(0, len(d["nodes"]) - 1))]
        if target in ("name", "inputs", "nodes", "outputs"):
            if target == "name" and isinstance(bad, str):
                bad = None
            if target in ("inputs",) and isinstance(bad, dict):
                bad = [bad]
            if target in ("nodes", "outputs") and isinstance(bad, list):
                bad = {"a": bad}
            d[target] = bad
        elif target == "shape":
            d["inputs"][first_in]["shape"] = bad if not isinstance(bad, list) else [bad]
        elif target == "dtype":
            d["inputs"][first_in]["dtype"] = bad if not isinstance(bad, str) else bad + "?"
        elif target in ("id", "op"):
            node[target] = bad if not isinstance(bad, str) else bad + "!"
        elif target == "args":
            node["args"] = bad if not isinstance(bad, list) else [{"x": 1}]
        elif target == "axes":
            node["op"] = "reduce_sum"
            node["args"] = node["args"][:1]
            node["axes"] = bad if not isinstance(bad, list) else ["0"]
        elif target == "keepdims":
            node["op"] = "reduce_sum"
            node["args"] = node["args"][:1]
            node["axes"] = [0]
            node["keepdims"] = bad if not isinstance(bad, bool) else "yes"
        elif target == "node":
            d["nodes"][0] = bad if not isinstance(bad, dict) else [bad]
        else:
            d["inputs"][first_in] = bad if not isinstance(bad, dict) else {"shape": bad}
        return json.dumps(d).encode(), (), ()
    if kind == "non_utf8":
        text = json.dumps(d).encode()
        cut = draw(st.integers(0, len(text)))
        return text[:cut] + draw(BAD_UTF8) + text[cut:], \
            ("not UTF-8",), ()
    if kind == "truncated":
        text = json.dumps(d).encode()
        return text[:draw(st.integers(0, len(text) - 1))], ("not JSON", "must be a JSON object"), ()
    if kind == "deep_json":
        depth = draw(st.integers(1000, 200_000))
        opener, closer = draw(NESTERS)
        return opener * depth + b"null" + closer * depth, ("nested too deeply", "must be a JSON object",
                                                           "unknown key"), ()
    if kind == "too_many_inputs":
        n = draw(st.integers(MAX_INPUTS + 1, MAX_INPUTS + 40))
        d["inputs"] = {f"i{k}": {"shape": [4], "dtype": "float32"} for k in range(n)}
        return json.dumps(d).encode(), ("too many inputs",), ()
    if kind == "too_many_outputs":
        n = draw(st.integers(MAX_OUTPUTS + 1, MAX_OUTPUTS + 40))
        d["outputs"] = [d["nodes"][-1]["id"]] * n
        return json.dumps(d).encode(), ("too many outputs",), ()
    if kind == "big_file":
        return dumps_with(d, "description", _big_description()), ("too large",), ()
    # huge_int: a number with thousands of digits where an int is expected
    spec = d["inputs"][first_in]
    spec["shape"][0] = "__HUGE__"
    digits = draw(HUGE_INT_HEADS) + "9" * draw(st.integers(30, 20000))
    raw = json.dumps(d).encode().replace(b'"__HUGE__"', digits.encode())
    return raw, ("too large", "must be positive", "not JSON", "must be an integer", "digits"), ()


FILE_NAMES = st.sampled_from(["g.json", "g'\"; $(touch pwned).json", "g\n*.json", "g\u2028é.json", "-g.json"])


# ------------------------------------------------------------------------------------------ the fuzz
@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def _fuzz_one(command: str, work: Path, case: tuple[bytes, tuple[str, ...], tuple[str, ...]], fname: str) -> None:
    raw, expect, markers = case
    path = work / fname
    path.write_bytes(raw)
    try:
        arg = str(path)
        rc, out, err = call(argv_for(command, arg, work))
    finally:
        path.unlink()
    # the hostile file name itself is shown escaped too
    assert_named_refusal(rc, out, err, expect, markers + _raw_markers(fname))
    assert not (work / "pwned").exists() and not Path("pwned").exists()
    for leftover in ("out.npz", "out"):
        assert not (work / leftover).exists(), f"{command} wrote {leftover} for a refused graph"


def _make_test(command: str):
    @settings(FUZZ, max_examples=max(1, int(EXAMPLES[command] * SCALE)))
    @given(case=hostile_graph(), fname=FILE_NAMES)
    def test(work: Path, case: tuple[bytes, tuple[str, ...], tuple[str, ...]], fname: str) -> None:
        _fuzz_one(command, work, case, fname)

    test.__name__ = f"test_fuzz_{command}"
    test.__doc__ = f"{EXAMPLES[command]} hostile graphs through `stitchtune {command}`: exit 2, problem named."
    return test


test_fuzz_validate = _make_test("validate")
test_fuzz_run = _make_test("run")
test_fuzz_search = _make_test("search")
test_fuzz_compile = _make_test("compile")


def test_fuzz_budget_is_at_least_10000() -> None:
    assert TOTAL_EXAMPLES >= 10_000


def test_missing_and_unreadable_graph_files(work: Path) -> None:
    """A path that is a directory, missing, or unreadable: a named refusal from every command."""
    missing = work / "nope'\n.json"
    unreadable = work / "locked.json"
    unreadable.write_text(json.dumps(SMALL_DICTS[0]))
    unreadable.chmod(0)
    try:
        for command in EXAMPLES:
            for p in (missing, work):
                rc, out, err = call(argv_for(command, str(p), work))
                assert_named_refusal(rc, out, err, ("cannot read", "No such file", "does not exist", "directory"), (str(missing),))
            if os.geteuid() != 0:  # root reads anything
                rc, out, err = call(argv_for(command, str(unreadable), work))
                assert_named_refusal(rc, out, err, ("cannot read",), ())
    finally:
        unreadable.chmod(stat.S_IRUSR | stat.S_IWUSR)


# ------------------------------------------------------------------------------------------ no graph string in source
C_WORDS = ["int", "return", "__global__", "threadIdx", "__syncthreads", "asm", "main", "printf", "float4",
           "in0", "out0", "st_k0", "sred", "bar", "include", "define", "volatile", "__shared__", "extern"]


def _rename(d: dict[str, Any], mapping: dict[str, str]) -> dict[str, Any]:
    out = json.loads(json.dumps(d))
    out["name"] = mapping.get("__graph__", out["name"])
    out["inputs"] = {mapping[k]: v for k, v in out["inputs"].items()}
    for n in out["nodes"]:
        n["id"] = mapping[n["id"]]
        n["args"] = [mapping[a] if isinstance(a, str) else a for a in n["args"]]
    out["outputs"] = [mapping[o] for o in out["outputs"]]
    return out


def _names(d: dict[str, Any]) -> list[str]:
    return list(d["inputs"]) + [n["id"] for n in d["nodes"]]


def _sources(d: dict[str, Any], seeds: range) -> list[str]:
    from stitchtune.hardware.device import get_device
    from stitchtune.errors import ScheduleError
    from stitchtune.graph.parse import parse_graph
    from stitchtune.lower.entry import lower
    from stitchtune.plan.planner import make_plan
    from stitchtune.gpu.render import render
    from stitchtune.space import SearchSpace

    dev = get_device("h200")
    g = parse_graph(d)
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, dev)
    out = []
    for seed in seeds:
        s = space.sample(random.Random(seed))
        try:
            out.append(render(lower(g, plan, s, dev)))
        except ScheduleError as exc:  # an illegal point is fine; it renders nothing
            out.append(f"illegal: {exc}")
    return out


@pytest.mark.parametrize("example", [p.stem for p in SMALL])
def test_graph_strings_never_reach_generated_source(example: str) -> None:
    """Every name renamed (to distinctive random identifiers, then to C/CUDA keywords and the
    generator's own identifiers): the CUDA source is byte-identical, and contains no graph name."""
    d = json.loads((EXAMPLES_DIR / f"{example}.json").read_text())
    names = _names(d)
    rng = random.Random(example)
    distinct = {k: f"zq{rng.getrandbits(40):010x}" for k in names}
    distinct["__graph__"] = f"zgraph{rng.getrandbits(40):010x}"
    words = {k: C_WORDS[i % len(C_WORDS)] + ("" if i < len(C_WORDS) else f"_{i}") for i, k in enumerate(names)}
    words["__graph__"] = "__global__"
    seeds = range(4)
    base = _sources(d, seeds)
    renamed = _sources(_rename(d, distinct), seeds)
    keywords = _sources(_rename(d, words), seeds)
    assert renamed == base and keywords == base
    for src in renamed:
        for v in distinct.values():
            assert v not in src


def test_nvcc_argv_is_fixed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A recording fake nvcc: every call is ``nvcc -cubin -arch=sm_90 <our flags> -o kernel.cubin
    kernel.cu`` in a private temporary directory; no graph string is on any command line."""
    from stitchtune.gpu.build import NvccBuilder

    record = tmp_path / "argv.jsonl"
    fake = tmp_path / "nvcc"
    fake.write_text(
        "#!" + sys.executable + "\n"
        "import json, os, sys\n"
        "if '--version' in sys.argv:\n"
        "    print('Cuda compilation tools, fake'); print('Build fake_nvcc_argv'); sys.exit(0)\n"
        f"open({str(record)!r}, 'a').write(json.dumps({{'argv': sys.argv[1:], 'cwd': os.getcwd()}}) + '\\n')\n"
        "out = sys.argv[sys.argv.index('-o') + 1]\n"
        "open(out, 'wb').write(b'FAKE:ok')\n"
        "print(\"ptxas info    : Used 10 registers, used 0 barriers\")\n")
    fake.chmod(0o755)
    monkeypatch.setenv("STITCHTUNE_NVCC", str(fake))
    d = json.loads((EXAMPLES_DIR / "layernorm_small.json").read_text())
    mapping = {k: f"zq{i:04d}" for i, k in enumerate(_names(d))}
    mapping["__graph__"] = "zgraph_hostile"
    hostile_d = _rename(d, mapping)
    sources = [s for s in _sources(hostile_d, range(3)) if not s.startswith("illegal")]
    assert sources
    builder = NvccBuilder(jobs=2, timeout_s=30, cache_dir=tmp_path / "cache")
    results = builder.build(sources, "sm_90")
    assert [r.status for r in results] == ["ok"] * len(sources)
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(calls) == len(sources)
    for c in calls:
        assert c["argv"] == ["-cubin", "-arch=sm_90", "-O3", "-Xptxas", "-v", "-lineinfo", "-o", "kernel.cubin",
                             "kernel.cu"], c
        assert Path(c["cwd"]).name.startswith("stitchtune-nvcc-") and not Path(c["cwd"]).exists()
        assert not any(v in " ".join(c["argv"]) for v in mapping.values())


# ------------------------------------------------------------------------------------------ device memory
def _big_graph(path: Path, tensors: int) -> int:
    """x0 + x1 + ... with [32768, 65535] float32 tensors (each just under 2**31 elements); returns the
    bytes its inputs and output need."""
    d = {"name": "too_big", "inputs": {f"x{i}": {"shape": [32768, 65535], "dtype": "float32"}
                                       for i in range(tensors)},
         "nodes": [{"id": "s1", "op": "add", "args": ["x0", "x1"]}]
         + [{"id": f"s{i}", "op": "add", "args": [f"s{i - 1}", f"x{i}"]} for i in range(2, tensors)],
         "outputs": [f"s{tensors - 1}"]}
    path.write_text(json.dumps(d))
    return (tensors + 1) * 32768 * 65535 * 4


def test_graph_larger_than_device_memory_is_refused_with_numbers(tmp_path: Path) -> None:
    """24 GiB of inputs+outputs (under the 64 GiB graph limit) on a 16 GB T4: refused before any
    allocation, the message gives the bytes needed and the bytes the device has."""
    from stitchtune.hardware.device import get_device

    need = _big_graph(tmp_path / "big.json", 2)
    t4 = get_device("t4")
    assert t4.memory_bytes is not None and need > t4.memory_bytes
    argv = argv_for("search", str(tmp_path / "big.json"), tmp_path)
    argv[argv.index("--device") + 1] = "t4"
    rc, out, err = call(argv)
    assert_named_refusal(rc, out, err, ("device memory",), ())
    assert str(need) in err and str(t4.memory_bytes) in err, err
    assert not (tmp_path / "db").exists() or not any((tmp_path / "db").glob("part-*"))


def test_device_memory_check_function() -> None:
    from stitchtune.hardware.device import DeviceError, check_fits, get_device
    from stitchtune.graph.parse import load_graph

    g = load_graph(EXAMPLES_DIR / "layernorm_small.json")
    for name in ("h200", "h100", "a100", "l4", "t4", "v100"):
        check_fits(g, get_device(name))  # a small graph fits everywhere

    class Tiny:
        name = "tiny"
        key = "tiny/sm_90"
        memory_bytes = g.min_bytes() - 1

    with pytest.raises(DeviceError) as e:
        check_fits(g, Tiny())
    assert str(g.min_bytes()) in str(e.value) and str(g.min_bytes() - 1) in str(e.value)


def test_hostile_names_really_are_hostile() -> None:
    """The strategies produce what the docstring promises (guards against a silently tame fuzz)."""
    rnd = random.Random(0)
    assert not any(NAME_RE.fullmatch(c) for c in HOSTILE_CHARS)
    assert len({rnd.choice(HOSTILE_CHARS) for _ in range(200)}) > 10


def test_spliced_payloads_are_what_json_dumps_writes() -> None:
    """The deep chain's nodes and the big file's description, spliced in as JSON built once, give byte for
    byte the file json.dumps writes for the same graph (the fuzz's cheap path writes the same files)."""
    for d0 in SMALL_DICTS[:3]:
        first_in = sorted(d0["inputs"])[0]
        for n in (MAX_NODES + 1, MAX_NODES + 64):
            d = json.loads(json.dumps(d0))
            d["outputs"] = [f"n{n - 1}"]
            plain = dict(d, nodes=[{"id": f"n{i}", "op": "neg", "args": [f"n{i - 1}" if i else first_in]}
                                   for i in range(n)])
            assert dumps_with(d, "nodes", chain_nodes_json(first_in, n)) == json.dumps(plain).encode()
        d = json.loads(json.dumps(d0))
        plain = dict(d, description="x" * BIG_DESCRIPTION)
        assert dumps_with(d, "description", _big_description()) == json.dumps(plain).encode()


# ------------------------------------------------------------------------------------------ hostile --schedule
schedule_values = st.one_of(
    json_values.map(json.dumps),
    st.fixed_dictionaries({}, optional={
        k: st.one_of(st.integers(-(2**70), 2**70), st.floats(allow_nan=True), st.text(max_size=4), st.none(),
                     st.lists(st.sampled_from(["local", "regional", "global", "independent", "register", "shared",
                                               "recompute", "*/", "\n"]), max_size=4))
        for k in ("tpr", "block", "split", "vec", "tasks_per_block", "min_blocks", "schemes", "reuse")}).map(
        lambda d: json.dumps(d)),
    st.sampled_from(["[" * 50_000, '{"tpr": 1' + "0" * 5000 + "}", '{"tpr": 1e400}', "", "@/nonexistent'\n",
                     "@/dev/null", '{"tpr": 4, "block": 256'])
)


@settings(FUZZ, max_examples=max(1, int(400 * SCALE)))
@given(text=schedule_values)
def test_fuzz_schedule_argument(work: Path, text: str) -> None:
    """Hostile ``--schedule`` values to ``compile``: a legal schedule compiles (exit 0), anything else is
    a named refusal (exit 2); never a traceback."""
    rc, out, err = call(["compile", str(EXAMPLES_DIR / "softmax_small.json"), "--no-cubin", "--db", str(work / "db"),
                         "--device", "h200", "-o", str(work / "out"), f"--schedule={text}"])
    if rc != 0:
        assert_named_refusal(rc, out, err, (), (), where=False)


def test_integer_over_python_digit_limit_is_a_named_refusal(work: Path) -> None:
    """Regression: a 5000-digit integer made json.loads raise ValueError (a traceback) in graph.py,
    cli.parse_schedule_arg and Schedule.from_json."""
    d = json.loads(SMALL[0].read_text())
    raw = json.dumps(d).replace("[", "[1" + "0" * 5000 + ", ", 1).encode()
    (work / "huge.json").write_bytes(raw)
    rc, out, err = call(["validate", str(work / "huge.json")])
    assert_named_refusal(rc, out, err, ("digits",), ())
    from stitchtune.errors import ScheduleError
    from stitchtune.space import Schedule

    with pytest.raises(ScheduleError, match="digits"):
        Schedule.from_json('{"tpr": 1' + "0" * 5000 + "}")
    with pytest.raises(ScheduleError, match="malformed"):
        Schedule.from_dict({"tpr": float("inf"), "block": 1})


# ------------------------------------------------------------------------------------------ valid but unusual graphs
UNARY = [n for n, o in OPS.items() if o.kind == "unary"]
BINARY = [n for n, o in OPS.items() if o.kind == "binary" and not o.arg_types]   # float operands (not uniform)
REDUCE = [n for n, o in OPS.items() if o.kind == "reduce"]


def random_valid_graph(rng: random.Random) -> dict[str, Any]:
    """A small valid graph of random structure: broadcasts, reductions over any axis, casts, several
    outputs, mixed dtypes. Most are not stitchable (``compile`` must then refuse with a reason)."""
    import numpy as np

    rank = rng.choice([1, 2, 2, 2, 3])
    full = [rng.choice([1, 2, 3, 5, 8, 32, 33, 64, 128, 256]) for _ in range(rank)]
    dt = rng.choice(["float32", "float32", "float16", "bfloat16"])
    inputs: dict[str, Any] = {"x": {"shape": full, "dtype": dt}}
    shapes: dict[str, list[int]] = {"x": list(full)}
    for i in range(rng.randint(0, 2)):
        sh = [d if rng.random() < 0.6 else 1 for d in full]
        if rng.random() < 0.3 and len(sh) > 1:
            sh = sh[1:]
        inputs[f"p{i}"] = {"shape": sh, "dtype": rng.choice([dt, "float32"])}
        shapes[f"p{i}"] = sh
    nodes: list[dict[str, Any]] = []
    for j in range(rng.randint(1, 8)):
        a = rng.choice(list(shapes))
        nid = f"n{j}"
        r = rng.random()
        if r < 0.35:
            nodes.append({"id": nid, "op": rng.choice(UNARY), "args": [a]})
            shapes[nid] = shapes[a]
        elif r < 0.7:
            b: str | float = rng.choice([*shapes, 1.5])
            try:
                out = list(np.broadcast_shapes(tuple(shapes[a]), tuple(shapes[b]) if isinstance(b, str) else ()))
            except ValueError:
                continue
            nodes.append({"id": nid, "op": rng.choice(BINARY), "args": [a, b] if rng.random() < 0.5 else [b, a]})
            shapes[nid] = out
        elif r < 0.95:
            sa = shapes[a]
            ax = rng.randrange(len(sa))
            keep = rng.random() < 0.7 or len(sa) == 1
            nodes.append({"id": nid, "op": rng.choice(REDUCE), "args": [a],
                          "axes": [ax - (len(sa) if rng.random() < 0.5 else 0)], "keepdims": keep})
            shapes[nid] = [1 if i == ax else d for i, d in enumerate(sa)] if keep else \
                [d for i, d in enumerate(sa) if i != ax]
        else:
            nodes.append({"id": nid, "op": "cast", "args": [a], "to": rng.choice(["float32", "float16", "bfloat16"])})
            shapes[nid] = shapes[a]
    if not nodes:
        nodes.append({"id": "n0", "op": "neg", "args": ["x"]})
    used = {x for n in nodes for x in n["args"] if isinstance(x, str)}
    return {"name": "g", "inputs": inputs, "nodes": nodes, "outputs": [n["id"] for n in nodes if n["id"] not in used]}


@settings(FUZZ, max_examples=max(1, int(40 * SCALE)))
@given(seed=st.integers(0, 2**32 - 1))
def test_fuzz_valid_unusual_graphs_compile_or_refuse(work: Path, seed: int) -> None:
    """Valid graphs of random structure through ``compile --no-cubin``: a kernel (exit 0) or a named
    refusal (exit 2, e.g. "not stitchable"), never a traceback. (Found: a float32 vec-8 store KeyError.)"""
    (work / "valid.json").write_text(json.dumps(random_valid_graph(random.Random(seed))))
    rc, out, err = call(["compile", str(work / "valid.json"), "--no-cubin", "--db", str(work / "nodb"),
                         "--device", "h200", "-o", str(work / "valid_out")])
    if rc != 0:
        assert_named_refusal(rc, out, err, (), (), where=False)


def test_float32_buffers_of_a_16bit_graph_with_vec_8_compile(work: Path) -> None:
    """Regression (found by the fuzz above): a bfloat16 column reduction with a float32 output made the
    renderer look up an 8-wide float32 vector type (KeyError: 8)."""
    d = {"name": "g", "inputs": {"x": {"shape": [64, 128], "dtype": "bfloat16"}, "p0": {"shape": [1], "dtype": "float32"}},
         "nodes": [{"id": "n0", "op": "reduce_mean", "args": ["x"], "axes": [0], "keepdims": True},
                   {"id": "n1", "op": "pow", "args": [1.5, "p0"]}], "outputs": ["n0", "n1"]}
    (work / "vec8.json").write_text(json.dumps(d))
    rc, _out, err = call(["compile", str(work / "vec8.json"), "--no-cubin", "--db", str(work / "nodb"),
                         "--device", "h200", "-o", str(work / "vec8_out")])
    assert rc == 0, err
    src = (work / "vec8_out" / "kernels.cu").read_text()
    assert "float4" in src


def test_graph_larger_than_host_memory_is_refused_with_numbers(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A valid graph (within the 64 GiB graph limit) whose float64 reference would not fit in this
    host's memory: ``run`` and ``search`` refuse it before allocating, giving both numbers. (Simulated
    with a 64 MiB host; without the check, `run` on a 2**31-element graph was an OOM kill.)"""
    import stitchtune.graph.reference as ref
    from stitchtune.graph.parse import load_graph

    monkeypatch.setattr(ref, "host_memory_bytes", lambda: 64 * 2**20)
    d = {"name": "host_big", "inputs": {"x": {"shape": [4096, 4096], "dtype": "float32"}},
         "nodes": [{"id": "y", "op": "exp", "args": ["x"]}], "outputs": ["y"]}
    path = work / "host_big.json"
    path.write_text(json.dumps(d))
    need = ref.reference_bytes(load_graph(path))
    assert need == 4096 * 4096 * (4 + 8 + 8)
    search = argv_for("search", str(path), work)
    search[search.index("--db") + 1] = str(work / "host-db")
    for argv in (argv_for("run", str(path), work), search):
        rc, out, err = call(argv)
        assert_named_refusal(rc, out, err, ("too large for this host",), (), where=False)
        assert str(need) in err and str(64 * 2**20) in err
    assert not (work / "host-db").exists()   # refused before the study storage (optuna.journal) was made
