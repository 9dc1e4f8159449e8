"""The peers on int values and ``uniform``: exactly the reference's values (int64 beyond float32's
24 bits, int32 wrapping, exact int constants, float -> int casts, random bits), and JAX's int64 scope."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from stitchtune.bench import jax_peer, peers
from stitchtune.graph.ops import uniform
from stitchtune.graph.parse import parse_graph
from stitchtune.graph.reference import run_reference

BIG = 2**40 + 3   # an int64 constant float32 cannot hold (its neighbours are 2**17 apart)


def _int_graph() -> dict:
    """Int arithmetic whose every result float32 would get wrong, and uniform's bits."""
    i64 = {"shape": [8], "dtype": "int64"}
    nodes = [
        {"id": "big", "op": "add", "args": ["ids", float(BIG)]},
        {"id": "prod", "op": "mul", "args": ["big", float(2**30)]},              # wraps int64
        {"id": "lt", "op": "lt", "args": ["big", float(BIG + 7)]},               # exact only in int64
        {"id": "w", "op": "where", "args": ["lt", "big", -5.0]},
        {"id": "mx", "op": "maximum", "args": ["w", float(BIG + 2)]},
        {"id": "n32", "op": "cast", "args": ["prod"], "to": "int32"},           # keeps the low 32 bits
        {"id": "s32", "op": "add", "args": ["n32", float(2**31 - 1)]},           # int32 wraps
        {"id": "ab", "op": "abs", "args": ["s32"]},
        {"id": "ng", "op": "neg", "args": ["ab"]},
        {"id": "f32i", "op": "cast", "args": ["x"], "to": "int32"},             # NaN, inf, beyond range
        {"id": "f64i", "op": "cast", "args": ["x"], "to": "int64"},
        {"id": "bf", "op": "cast", "args": ["big"], "to": "bfloat16"},          # via float32, as kernels
        {"id": "cnt", "op": "iota", "args": [], "shape": [8], "axis": 0, "dtype": "int64"},
        {"id": "cnt32", "op": "iota", "args": [], "shape": [8], "axis": 0, "dtype": "int32"},
        {"id": "u", "op": "uniform", "args": ["seed", "cnt"]},
        {"id": "u32", "op": "uniform", "args": ["seed32", "cnt32"]},
    ]
    return {"name": "ints", "nodes": nodes,
            "inputs": {"ids": i64, "x": {"shape": [8], "dtype": "float32"}, "seed": {"shape": [1], "dtype": "int64"},
                       "seed32": {"shape": [1], "dtype": "int32"}},
            "outputs": ["prod", "lt", "w", "mx", "s32", "ng", "f32i", "f64i", "bf", "u", "u32", "cnt32"]}


def _int_inputs() -> dict[str, np.ndarray]:
    return {"ids": np.array([0, 1, 2, 3, 2**35, -2**35, 7, 6], np.int64),
            "x": np.array([np.nan, np.inf, -np.inf, 3e9, -2.7, 2.7, 1e20, -0.5], np.float32),
            "seed": np.array([0x123456789ABCDEF], np.int64), "seed32": np.array([-123457], np.int32)}


def _assert_exact(graph, got: dict[str, np.ndarray], inputs: dict[str, np.ndarray]) -> None:
    ref = run_reference(graph, inputs)
    for name in graph.outputs:
        want = ref[name].astype(np.float32) if graph.spec(name).dtype == "bfloat16" else ref[name]
        assert got[name].dtype == want.dtype, (name, got[name].dtype, want.dtype)
        np.testing.assert_array_equal(got[name], want, err_msg=name)


def test_int_graph_reference_is_what_float32_would_miss() -> None:
    """The graph tests something: float32 arithmetic would give other values (so a peer computing ints
    in float32, or constants through float32, fails the exact comparison)."""
    ref = run_reference(parse_graph(_int_graph()), _int_inputs())
    assert ref["lt"].tolist() == [True, True, True, True, False, True, False, True]
    assert np.float32(BIG) == np.float32(BIG + 7)            # float32 cannot tell them apart
    assert ref["f32i"].tolist()[:4] == [0, 2**31 - 1, -2**31, 2**31 - 1]
    assert ref["s32"].dtype == np.int32 and int(ref["s32"][0]) != int(ref["prod"][0]) + 2**31 - 1   # wrapped


def test_torch_peer_is_exact_on_ints_and_uniform() -> None:
    torch = pytest.importorskip("torch")
    graph = parse_graph(_int_graph())
    inputs = _int_inputs()
    outs = peers.torch_function(graph)(**{k: torch.from_numpy(v) for k, v in inputs.items()})
    got = {n: (t.float() if t.dtype == torch.bfloat16 else t).numpy() for n, t in zip(graph.outputs, outs)}
    _assert_exact(graph, got, inputs)


def test_jax_peer_is_exact_on_ints_and_uniform() -> None:
    jax = pytest.importorskip("jax")
    graph = parse_graph(_int_graph())
    inputs = _int_inputs()
    assert not jax.config.jax_enable_x64
    fn = peers.jax_function(graph)
    for args in (inputs, jax_peer.jax_inputs(graph, inputs)):   # numpy arrays, or put on the device
        outs = fn(**args)
        got = {n: np.asarray(a) for n, a in zip(graph.outputs, outs)}
        got["bf"] = got["bf"].astype(np.float32)
        _assert_exact(graph, got, inputs)
    assert not jax.config.jax_enable_x64   # the scope did not leak into the process


def test_jax_inputs_keep_int64_only_in_an_int64_graph() -> None:
    pytest.importorskip("jax")
    graph = parse_graph(_int_graph())
    put = jax_peer.jax_inputs(graph, _int_inputs())
    assert str(put["ids"].dtype) == "int64" and int(put["ids"][4]) == 2**35
    assert jax_peer.uses_int64(graph)
    small = parse_graph({"name": "i32", "inputs": {"a": {"shape": [2], "dtype": "int32"}},
                         "nodes": [{"id": "b", "op": "add", "args": ["a", 1.0]}], "outputs": ["b"]})
    assert not jax_peer.uses_int64(small)
    assert str(jax_peer.jax_inputs(small, {"a": np.array([1, 2], np.int32)})["a"].dtype) == "int32"


def test_x64_scope_without_jax_enable_x64_restores_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a JAX without the ``jax.enable_x64`` context manager the config flag is set and restored."""
    jax = pytest.importorskip("jax")
    monkeypatch.delattr(jax, "enable_x64", raising=False)
    before = jax.config.jax_enable_x64
    with jax_peer.x64_scope():
        assert jax.config.jax_enable_x64
        assert str(jax.numpy.asarray(np.array([2**40])).dtype) == "int64"
    assert jax.config.jax_enable_x64 == before
    with jax_peer.x64_scope(False):
        assert jax.config.jax_enable_x64 == before


@pytest.mark.parametrize("seed_dtype", ["int64", "int32"])
def test_uniform_jax_has_the_reference_bits(seed_dtype: str) -> None:
    """Seeds with both 32-bit halves set, negative seeds and counters, int32 and int64 counters."""
    jax = pytest.importorskip("jax")
    rng = np.random.default_rng(0)
    info = np.iinfo(np.dtype(seed_dtype))
    seeds = rng.integers(info.min, info.max, size=(16, 1), dtype=np.dtype(seed_dtype))
    counters = np.concatenate([np.arange(-4, 60), rng.integers(-2**40, 2**40, 64)]).astype(np.int64)
    with jax_peer.x64_scope():
        for cnt in (counters, counters.astype(np.int32)):
            got = np.asarray(jax_peer.uniform_jax(jax.numpy.asarray(seeds), jax.numpy.asarray(cnt)))
            want = uniform(seeds, cnt)
            assert got.dtype == np.float32 and got.shape == want.shape == (16, len(cnt))
            np.testing.assert_array_equal(got, want)
            assert got.min() >= 0.0 and got.max() < 1.0 and abs(float(got.mean()) - 0.5) < 0.05


def test_bench_checks_both_peers_of_a_dropout_graph_on_cpu() -> None:
    """``stitchtune bench``'s peer rows for a graph with ``uniform`` and an int64 output (the JAX row
    failed before: no ``uniform``, no int output dtypes): both peers are checked against the reference."""
    pytest.importorskip("torch")
    from stitchtune.bench import measure
    from stitchtune.hardware.device import get_device

    graph = parse_graph({
        "name": "dropout", "inputs": {"x": {"shape": [256, 1024], "dtype": "float32"},
                   "seed": {"shape": [1], "dtype": "int64"}},
        "nodes": [{"id": "cnt", "op": "iota", "args": [], "shape": [256, 1024], "axis": 1, "dtype": "int64"},
                  {"id": "u", "op": "uniform", "args": ["seed", "cnt"]},
                  {"id": "keep", "op": "ge", "args": ["u", 0.25]},
                  {"id": "y", "op": "where", "args": ["keep", "x", 0.0]},
                  {"id": "out", "op": "mul", "args": ["y", 4.0 / 3.0]},
                  {"id": "pos", "op": "add", "args": ["cnt", float(BIG)]}],
        "outputs": ["out", "keep", "pos"]})
    # 1 MiB of input: ~120 rotating copies for the H200's L2 (a few bytes would make 10**5 of them)
    rows = measure.bench_graph("dropout.json", graph, db="unused", trials=0, peer_names=("eager", "xla"),
                               device=get_device("h200"), iters=3, warmup=1, torch_device="cpu", stitchtune=False)
    by = {r.system: r for r in rows}
    assert by["torch_eager"].checked, by["torch_eager"].note
    try:
        import jax  # noqa: F401
    except ImportError:
        assert "not installed" in by["jax_jit"].note
    else:
        assert by["jax_jit"].checked, by["jax_jit"].note


def _gather_graph() -> dict:
    """gather by an int32 input and gather_elements by a computed int64 index, both with indices out of
    range (a zero row / element, as the reference)."""
    f = {"shape": [5, 3], "dtype": "float32"}
    return {"name": "gathers", "inputs": {"t": f, "ids": {"shape": [4], "dtype": "int32"},
                                          "tgt": {"shape": [5, 1], "dtype": "int64"}},
            "nodes": [{"id": "rows", "op": "gather", "args": ["t", "ids"], "axis": 0},
                      {"id": "keep", "op": "ne", "args": ["tgt", -100.0]},
                      {"id": "idx", "op": "where", "args": ["keep", "tgt", 0.0]},
                      {"id": "pick", "op": "gather_elements", "args": ["t", "idx"], "axis": 1}],
            "outputs": ["rows", "idx", "pick"]}


def _gather_inputs() -> dict[str, np.ndarray]:
    return {"t": np.arange(15, dtype=np.float32).reshape(5, 3) + 1, "ids": np.array([4, -1, 0, 5], np.int32),
            "tgt": np.array([[2], [-100], [0], [3], [-7]], np.int64)}


def test_gathers_in_both_peers_are_exact() -> None:
    graph = parse_graph(_gather_graph())
    inputs = _gather_inputs()
    ran = 0
    try:
        import torch
    except ImportError:
        pass
    else:
        outs = peers.torch_function(graph)(**{k: torch.from_numpy(v) for k, v in inputs.items()})
        _assert_exact(graph, {n: t.numpy() for n, t in zip(graph.outputs, outs)}, inputs)
        ran += 1
    try:
        import jax  # noqa: F401
    except ImportError:
        pass
    else:
        outs = peers.jax_function(graph)(**inputs)
        _assert_exact(graph, {n: np.asarray(a) for n, a in zip(graph.outputs, outs)}, inputs)
        ran += 1
    if not ran:
        pytest.skip("neither torch nor jax is installed")


def test_bench_reads_int_outputs_back_exactly() -> None:
    """The bench checks a peer's int64 output as ints (through float32, 2**40 + 3 reads 2**40)."""
    from stitchtune.bench import measure

    big = np.array([BIG, -BIG], np.int64)
    if importlib.util.find_spec("torch") is not None:
        import torch

        assert measure._torch_host(torch.from_numpy(big)).tolist() == big.tolist()
        assert measure._torch_host(torch.ones(2, dtype=torch.bfloat16)).dtype == np.float32
    if importlib.util.find_spec("jax") is not None:
        with jax_peer.x64_scope():
            assert measure._jax_host(jax_peer.jax_inputs(parse_graph(_int_graph()), {"ids": big})["ids"]).tolist() \
                == big.tolist()
