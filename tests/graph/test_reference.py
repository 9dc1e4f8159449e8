"""The numpy reference and the op table: semantics, dtypes, input checking, CUDA literals."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import scipy.special

from stitchtune.errors import StitchtuneError
from stitchtune.graph.parse import load_graph, parse_graph
from stitchtune.graph.int_ops import INT_CTYPES, INT_CUDA
from stitchtune.graph.ops import INDEX_KINDS, OPS, format_float_literal
from stitchtune.graph.reference import numpy_dtype, random_inputs, run_reference


# ---------------------------------------------------------------------------- op table
@pytest.mark.parametrize("name", sorted(OPS))
def test_np_fn_keeps_float32_and_float64(name: str) -> None:
    info = OPS[name]
    for dt in (np.float32, np.float64):
        x = np.linspace(0.1, 2.0, 12, dtype=dt).reshape(3, 4)
        if info.kind == "reduce":
            r = info.np_fn(x, axis=(1,), keepdims=True)
            assert r.shape == (3, 1)
        elif info.kind == "binary" and info.arg_types == "ii":   # uniform: int operands, float32 values
            r = info.np_fn(np.arange(12).reshape(3, 4), np.int64(7))
            assert r.dtype == np.float32 and r.shape == (3, 4) and ((r >= 0) & (r < 1)).all()
            continue
        elif info.kind == "binary":
            r = info.np_fn(x, x[::-1])
            assert info.np_fn(x, 1.5).dtype == dt
        elif info.kind == "ternary":
            r = info.np_fn(x, x[::-1], x * 2)
            assert info.np_fn(x, 1.5, x).dtype == dt and info.np_fn(x, x, 1.5).dtype == dt
        elif info.kind == "slice":
            r = info.np_fn(x, axis=1, start=1, stop=3)
            assert r.shape == (3, 2)
        elif info.kind == "concat":
            r = info.np_fn(x, x[:, :1], axis=1)
            assert r.shape == (3, 5)
        elif info.kind == "gather":
            r = info.np_fn(x, np.array([2, -1, 3, 0]), axis=0)
            assert r.shape == (4, 4) and (r[1] == 0).all() and (r[2] == 0).all() and (r[0] == x[2]).all()
        elif info.kind == "gather_elements":
            r = info.np_fn(x, np.array([[3], [-1], [0]]), axis=1)
            assert r.shape == (3, 1) and r[1, 0] == 0 and r[0, 0] == x[0, 3] and r[2, 0] == x[2, 0]
        elif info.kind == "scatter":   # rows of x added at the indices (2 twice, -1 nowhere)
            r = info.np_fn(x, np.array([2, -1, 2]), shape=(4, 4))
            assert r.shape == (4, 4) and (r[2] == x[0] + x[2]).all() and not r[[0, 1, 3]].any()
        elif info.kind == "iota":  # no operand: an int64 coordinate grid
            r = info.np_fn((3, 4), 1)
            assert r.dtype == np.int64 and (r == np.arange(4)).all() and r.shape == (3, 4)
            continue
        else:
            r = info.np_fn(x)
        assert r.dtype == dt, (name, dt, r.dtype)


def test_op_table_fields() -> None:
    assert set(OPS) == {"neg", "abs", "exp", "log", "sqrt", "rsqrt", "reciprocal", "square",
                        "tanh", "sin", "cos", "sigmoid", "relu", "erf", "gelu", "gelu_tanh", "silu",
                        "add", "sub", "mul", "div", "maximum", "minimum", "pow",
                        "lt", "le", "gt", "ge", "eq", "ne", "logical_and", "logical_or", "logical_not",
                        "where", "clamp",
                        "reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "cast",
                        "slice", "concat", "gather", "gather_elements", "transpose", "reshape", "expand", "iota",
                        "uniform", "scatter_add"}
    banned = re.compile(r"\b(exp|log|sqrt|tanh|sin|cos|erf|pow|fmax|fmin|fabs)\(")  # double-precision calls
    for info in OPS.values():
        assert info.kind in ("unary", "binary", "ternary", "reduce", "cast", "slice", "concat", "gather",
                             "gather_elements", "layout", "iota", "scatter")
        assert info.arity == {"binary": 2, "ternary": 3, "concat": 0, "gather": 2, "gather_elements": 2,
                              "iota": 0, "scatter": 2}.get(info.kind, 1)
        assert info.result in ("float", "bool", "float32") and set(info.arg_types) <= {"f", "b", "i"}
        assert info.arg_types == "" or len(info.arg_types) == info.arity
        assert info.cuda.count("(") == info.cuda.count(")")
        assert not banned.search(info.cuda), info.name
        assert not re.search(r"\d\.\d*(?![\dfe])", info.cuda), info.name  # every literal has an f
        assert info.flops >= 0 and info.sfu >= 0
        if info.kind == "reduce":
            assert info.identity is not None and info.cuda_combine and info.np_combine is not None
    assert OPS["reduce_max"].identity == -math.inf and OPS["reduce_sum"].identity == 0.0
    assert OPS["reduce_mean"].is_mean and not OPS["reduce_sum"].is_mean
    assert OPS["add"].render("a", "b") == "(a + b)"
    assert OPS["reduce_max"].combine("a", "b") == "fmaxf(a, b)"
    assert OPS["neg"].render(format_float_literal(-2.0)) == "(-(-2.0f))"


def test_np_fn_values() -> None:
    x = np.array([-3.0, -0.5, 0.0, 0.7, 2.5])
    assert np.allclose(OPS["sigmoid"].np_fn(x), 1 / (1 + np.exp(-x)))
    assert np.allclose(OPS["gelu"].np_fn(x), 0.5 * x * (1 + scipy.special.erf(x / math.sqrt(2))))
    t = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    assert np.allclose(OPS["gelu_tanh"].np_fn(x), t)
    assert np.allclose(OPS["silu"].np_fn(x), x / (1 + np.exp(-x)))
    assert np.allclose(OPS["sin"].np_fn(x), np.sin(x)) and np.allclose(OPS["cos"].np_fn(x), np.cos(x))
    assert OPS["sin"].render("a") == "sinf(a)" and OPS["cos"].render("a") == "cosf(a)"
    assert np.array_equal(OPS["relu"].np_fn(x), np.maximum(x, 0))
    assert np.allclose(OPS["rsqrt"].np_fn(np.array([4.0])), [0.5])


@pytest.mark.parametrize("x, lit", [
    (1e-5, "1e-05f"), (0.5, "0.5f"), (2, "2.0f"), (-0.5, "(-0.5f)"), (0.0, "0.0f"),
    (-0.0, "(-0.0f)"), (math.inf, "INFINITY"), (-math.inf, "(-INFINITY)"), (math.nan, "NAN"),
    (1e20, "1e+20f"), (0.1, "0.1f"), (3.4028234663852886e38, "3.4028235e+38f"),
])
def test_format_float_literal(x: float, lit: str) -> None:
    assert format_float_literal(x) == lit


def test_format_float_literal_exact_and_range() -> None:
    rng = np.random.default_rng(1)
    for v in list(rng.standard_normal(200) * 10.0 ** rng.integers(-40, 38, 200)) + [1e-45, 2**-149]:
        lit = format_float_literal(float(v))
        body = lit.strip("()").lstrip("-").rstrip("f")
        back = np.float32(body) * (-1 if lit.startswith("(-") else 1)
        assert back == np.float32(v), (v, lit)
    with pytest.raises(ValueError):
        format_float_literal(1e39)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_cuda_templates_compile(tmp_path: Path) -> None:
    """Every template and a few literals compile as fp32 device code, and the int templates at both
    widths (nvcc, no GPU needed)."""
    lines = []
    trig = []   # sinf/cosf use one double multiply in their slow path (|x| > ~1e5: Payne-Hanek)
    for k, info in enumerate(sorted(OPS.values(), key=lambda o: o.name)):
        if info.kind in INDEX_KINDS or info.kind == "iota":  # kernels never render these templates
            continue
        expr = info.render(*(["a", "b", "c"][: info.arity]))
        (trig if info.name in ("sin", "cos") else lines).append(f"  float r{k} = {expr};  out[{k}] = r{k};")
        if info.cuda_combine:
            lines.append(f"  out[{k}] += {info.combine('a', 'b')} + {format_float_literal(info.identity)};")
    for j, c in enumerate([1e-5, -2.5, math.inf, -math.inf, -0.0, 3.4e38]):
        lines.append(f"  out[{100 + j}] = a * {format_float_literal(c)};")
    ints = []   # the int templates at both widths (wrapping through the unsigned type; float -> int)
    for width, ct in INT_CTYPES.items():
        for op, tpl in sorted(INT_CUDA.items()):
            args = ["a"] if op == "from_float" else [f"(({ct['s']})(i{k}))" for k in range(OPS[op].arity)]
            ints.append(f"  {ct['s']} q_{width}_{op} = {tpl.format(*args, **ct)};  iout[0] += (long long)q_{width}_{op};")
    src = ("extern \"C\" __global__ void k(float* out, float a, float b, float c) {\n"
           + "\n".join(lines) + "\n}\n"
           + "extern \"C\" __global__ void k_trig(float* out, float a) {\n" + "\n".join(trig) + "\n}\n"
           + "extern \"C\" __global__ void k_int(long long* iout, float a, long long i0, long long i1) {\n"
           + "\n".join(ints) + "\n}\n")
    cu = tmp_path / "ops.cu"
    cu.write_text(src)
    r = subprocess.run(["nvcc", "-c", "-arch=sm_80", "-Werror", "all-warnings", str(cu), "-o",
                        str(tmp_path / "ops.o")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr + src
    ptx = subprocess.run(["nvcc", "--ptx", "-arch=sm_80", str(cu), "-o", str(tmp_path / "ops.ptx")],
                         capture_output=True, text=True, timeout=300)
    assert ptx.returncode == 0
    text = (tmp_path / "ops.ptx").read_text()
    body = text.split(".entry k(")[1].split(".entry k_trig")[0]   # kernel k alone
    assert ".f64" not in body  # fp32 only, no double promotion


# ---------------------------------------------------------------------------- reference
def test_numpy_dtype() -> None:
    assert numpy_dtype("float32") == np.float32
    assert numpy_dtype("float16") == np.float16
    assert numpy_dtype("bfloat16") == ml_dtypes.bfloat16
    assert numpy_dtype("float64") == np.float64   # a 0-d scalar input (dynamo's Python floats)
    with pytest.raises(StitchtuneError):
        numpy_dtype("complex64")


def test_examples_run_through_reference(small_examples: list[Path]) -> None:
    assert len(small_examples) >= 10
    for path in small_examples:
        g = load_graph(path)
        ins = random_inputs(g, seed=0)
        out = run_reference(g, ins)
        assert list(out) == list(g.outputs)
        for o, a in out.items():
            spec = g.spec(o)
            assert a.shape == spec.shape and a.dtype == numpy_dtype(spec.dtype)
            assert np.isfinite(a.astype(np.float64)).all(), path.name


def test_layernorm_matches_closed_form(load_example) -> None:
    g = load_example("layernorm_odd_small")
    ins = random_inputs(g, 3)
    x = ins["x"].astype(np.float64)
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    want = (x - mu) / np.sqrt(var + 1e-5) * ins["gamma"] + ins["beta"]
    got = run_reference(g, ins)["y"]
    assert np.allclose(got, want, rtol=1e-6, atol=1e-6)


def test_softmax_rows_sum_to_one_and_stable(load_example) -> None:
    g = load_example("softmax_odd_small")
    ins = random_inputs(g, 1)
    ins["x"] = (ins["x"] * 1000).astype(np.float32)  # would overflow exp without the max shift
    y = run_reference(g, ins)["y"].astype(np.float64)
    assert np.isfinite(y).all() and np.allclose(y.sum(-1), 1.0, atol=1e-5)


def test_colsum_and_bf16(load_example) -> None:
    g = load_example("colsum_sigmoid_scale_small")
    ins = random_inputs(g, 2)
    x = ins["x"].astype(np.float64)
    want = x * scipy.special.expit(x.sum(0, keepdims=True))
    assert np.allclose(run_reference(g, ins)["y"], want, rtol=1e-6)
    gb = load_example("layernorm_bf16_small")
    out = run_reference(gb, random_inputs(gb, 0))["y"]
    assert out.dtype == ml_dtypes.bfloat16


def test_cast_rounds_and_outputs_rounded() -> None:
    g = parse_graph({"name": "c", "inputs": {"x": {"shape": [3], "dtype": "float32"}},
                     "nodes": [{"id": "h", "op": "cast", "args": ["x"], "to": "float16"},
                               {"id": "d", "op": "sub", "args": ["x", "h"]},
                               {"id": "d32", "op": "cast", "args": ["d"], "to": "float32"}],
                     "outputs": ["d32", "h"]})
    x = np.array([1.0001, 2.0, 3.1], dtype=np.float32)
    out = run_reference(g, {"x": x})
    assert out["h"].dtype == np.float16
    want = x.astype(np.float64) - x.astype(np.float16).astype(np.float64)
    assert np.allclose(out["d32"], want.astype(np.float32))
    assert out["d32"][1] == 0.0 and out["d32"][0] != 0.0


def test_input_checking(load_example) -> None:
    g = load_example("layernorm_small")
    ins = random_inputs(g, 0)
    bad = dict(ins)
    del bad["gamma"]
    bad["extra"] = np.zeros(3, np.float32)
    bad["x"] = ins["x"][:10]
    bad["beta"] = ins["beta"].astype(np.float64)
    with pytest.raises(StitchtuneError) as ei:
        run_reference(g, bad)
    text = "\n".join(ei.value.problems)
    assert "'gamma': missing" in text and "'extra'" in text
    assert "'x': shape" in text and "'beta': dtype float64" in text


def test_random_inputs_deterministic_nonzero(load_example) -> None:
    g = load_example("layernorm_bf16_small")
    a, b, c = random_inputs(g, 5), random_inputs(g, 5), random_inputs(g, 6)
    for name, spec in g.inputs:
        assert a[name].dtype == numpy_dtype(spec.dtype) and a[name].shape == spec.shape
        assert np.array_equal(a[name], b[name])
        assert (a[name].astype(np.float32) != 0).all()
    assert not np.array_equal(a["x"], c["x"])
    x = a["x"].astype(np.float64)
    assert abs(x.mean()) < 0.05 and 0.9 < x.std() < 1.1


def test_reference_does_not_mutate_inputs(load_example) -> None:
    g = load_example("rmsnorm_small")
    ins = random_inputs(g, 0)
    copies = {k: v.copy() for k, v in ins.items()}
    run_reference(g, ins)
    assert all(np.array_equal(ins[k], copies[k]) for k in ins)


def test_inputs_feeding_domain_restricted_ops_are_drawn_positive() -> None:
    from stitchtune.graph.parse import parse_graph
    from stitchtune.graph.reference import positive_inputs, random_inputs, run_reference

    g = parse_graph({"name": "dom", "inputs": {"x": {"shape": [64, 32], "dtype": "float32"},
                                               "d": {"shape": [32], "dtype": "float32"},
                                               "z": {"shape": [64, 32], "dtype": "float32"}},
                     "nodes": [{"id": "l", "op": "log", "args": ["x"]},
                               {"id": "q", "op": "div", "args": ["l", "d"]},
                               {"id": "y", "op": "add", "args": ["q", "z"]}],
                     "outputs": ["y"]})
    assert positive_inputs(g) == {"x", "d"}
    inputs = random_inputs(g, 0)
    assert inputs["x"].min() >= 0.5 and inputs["d"].min() >= 0.5
    assert inputs["z"].min() < 0  # unrestricted inputs stay standard normal
    assert np.isfinite(run_reference(g, inputs)["y"]).all()
