"""PyTorch importer: round trips against PyTorch, workload keys equal to the hand-written examples,
the make_fx fallback, clear errors, name sanitising, and the CLI."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from stitchtune.cli import main
from stitchtune.errors import StitchtuneError
from stitchtune.graph.parse import NAME_RE, load_graph
from stitchtune.importers.builder import parse_dtypes, parse_shapes
from stitchtune.importers.torch_import import import_torch, load_callable
from stitchtune.graph.reference import numpy_dtype, run_reference

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MODULES = EXAMPLES / "torch_modules.py"


def _examples_module():
    spec = importlib.util.spec_from_file_location("stitchtune_test_torch_modules", MODULES)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


tm = _examples_module()


def _inputs(shapes: dict[str, tuple[int, ...]], dtypes: dict[str, str], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(s).astype(numpy_dtype(dtypes[n])) for n, s in shapes.items()}


def _round_trip(fn, shape_spec: str, dtype_spec: str | None = None) -> tuple[float, object]:
    """Max error of the imported graph's reference output vs. ``fn`` on the same inputs, relative to
    max(|PyTorch output|, 1e-3)."""
    shapes = parse_shapes(shape_spec)
    dtypes = parse_dtypes(dtype_spec, list(shapes))
    res = import_torch(fn, {n: (s, dtypes[n]) for n, s in shapes.items()})
    arrays = _inputs(shapes, dtypes)
    feed = dict(arrays)
    feed.update(dict(res.params))
    got = run_reference(res.graph, feed)
    targs = [torch.from_numpy(a.astype(np.float32)).to(getattr(torch, dtypes[n])) for n, a in arrays.items()]
    with torch.no_grad():
        want = fn(*targs)
    want = want if isinstance(want, (tuple, list)) else (want,)
    assert len(want) == len(res.graph.outputs)
    err = 0.0
    for name, w in zip(res.graph.outputs, want):
        g = got[name].astype(np.float64)
        w = w.double().numpy()
        assert g.shape == w.shape
        err = max(err, float(np.max(np.abs(g - w)) / max(np.max(np.abs(w)), 1e-3)))
    return err, res


@pytest.mark.parametrize("name", ["layernorm", "rmsnorm", "softmax", "bias_gelu", "colsum_sigmoid_scale",
                                  "log_softmax_manual", "RMSNormBlock", "LayerNormGelu"])
def test_round_trip_float32(name):
    fn = getattr(tm, name)
    fn = fn() if isinstance(fn, type) else fn
    err, res = _round_trip(fn, tm.SMALL_SHAPES[name])
    assert err < 1e-5, f"{name}: rel err {err}"
    assert res.method == "export"


def test_round_trip_bf16_layernorm():
    err, res = _round_trip(tm.layernorm_bf16, tm.SMALL_SHAPES["layernorm_bf16"], "x=bfloat16")
    assert err < 1e-2   # one bf16 rounding of the output
    assert res.graph.nodes[0].op == "cast" and res.graph.nodes[-1].op == "cast"
    assert res.graph.spec(res.graph.outputs[0]).dtype == "bfloat16"


@pytest.mark.parametrize("name,spec", [
    ("layernorm", "x=256x1024,gamma=1024,beta=1024"),
    ("rmsnorm", "x=128x1024,gamma=1024"),
    ("softmax", "x=512x128"),
    ("bias_gelu", "x=256x1024,b=1024"),
    ("colsum_sigmoid_scale", "x=1024x256"),
])
def test_same_workload_as_handwritten_example(name, spec):
    """Imported at the small example's shapes, the graph is the example (workload keys ignore ids)."""
    shapes = parse_shapes(spec)
    res = import_torch(getattr(tm, name), {n: (s, "float32") for n, s in shapes.items()})
    assert res.graph.workload_key() == load_graph(EXAMPLES / f"{name}_small.json").workload_key()


def test_multiple_outputs_and_half():
    def centre(x):
        m = x.mean(-1, keepdim=True)
        return x - m, m

    err, res = _round_trip(centre, "x=6x10", "float16")
    assert err < 1e-3
    assert len(res.graph.outputs) == 2
    assert all(res.graph.spec(o).dtype == "float16" for o in res.graph.outputs)


def test_scalar_ops_alpha_pow_clamp_casts():
    def f(x, y):
        z = torch.add(x, y, alpha=2.0) - 3.0 / x.abs().clamp(min=0.5)
        z = torch.sub(z, y, alpha=0.5) + torch.pow(y, 3) + (1.0 - x).clamp(-1.0, 1.0)
        z = z + torch.rsub(y, 2.0) * torch.tanh(x) + torch.erf(y) + F.relu(x)
        z = z.to(torch.bfloat16).to(torch.float32) + torch.maximum(x, y) + x.amin(0) + y.sum(dim=(0, 1))
        return torch.exp(-z.abs()) + torch.sqrt(y.abs() + 1) + torch.reciprocal(x.abs() + 1)

    F = torch.nn.functional
    err, res = _round_trip(f, "x=4x6,y=4x6")
    assert err < 1e-5
    ops = {n.op for n in res.graph.nodes}
    assert {"cast", "pow", "maximum", "minimum", "reduce_min", "reduce_sum", "relu", "erf"} <= ops


def test_views_leading_dims_expand_and_keepdim_unsqueeze():
    def f(x, b):
        s = x.sum(-1).unsqueeze(-1)          # keepdim=False + unsqueeze -> keepdims reduction
        bb = b.unsqueeze(0).expand(x.shape[0], -1)
        y = (x - s / x.shape[-1]) * bb
        return y.view(1, *y.shape).squeeze(0).contiguous()

    err, res = _round_trip(f, "x=5x7,b=7")
    assert err < 1e-5
    red = [n for n in res.graph.nodes if n.op == "reduce_sum"]
    assert len(red) == 1 and red[0].keepdims


def test_three_d_layernorm_over_two_dims():
    def f(x, w):
        return torch.nn.functional.layer_norm(x, x.shape[-2:], w, None, 1e-6)

    err, res = _round_trip(f, "x=3x4x5,w=4x5")
    assert err < 1e-5
    assert [n.axes for n in res.graph.nodes if n.op == "reduce_mean"] == [(1, 2), (1, 2)]


def test_make_fx_fallback(monkeypatch):
    """When torch.export fails, make_fx's ATen graph (native_layer_norm, _softmax, get_attr params,
    in-place add_) is imported and still matches."""
    def broken(*a, **k):
        raise RuntimeError("export unavailable")

    monkeypatch.setattr(torch.export, "export", broken)
    for name in ("LayerNormGelu", "RMSNormBlock", "softmax", "log_softmax_manual"):
        fn = getattr(tm, name)
        fn = fn() if isinstance(fn, type) else fn
        err, res = _round_trip(fn, tm.SMALL_SHAPES[name])
        assert res.method == "make_fx"
        assert err < 1e-5, name
    assert [n for n, _ in res.graph.inputs] == ["x"]
    _, res = _round_trip(tm.LayerNormGelu(), tm.SMALL_SHAPES["LayerNormGelu"])
    assert [n for n, _ in res.graph.inputs] == ["x", "norm_weight", "norm_bias"]


def test_unsupported_op_names_op_and_source_line():
    with pytest.raises(StitchtuneError) as ei:
        import_torch(tm.unsupported_cumsum, {"x": ((4, 4), "float32")})
    msg = ei.value.problems[0]
    assert "aten.cumsum" in msg
    line = next(i for i, t in enumerate(MODULES.read_text().splitlines(), 1) if "torch.cumsum(x, dim=0)" in t)
    assert f"torch_modules.py:{line}" in msg


@pytest.mark.parametrize("fn,why", [
    (lambda x: x[:, ::2] + 1, "slice step 2"),
    (lambda x: x.flip(0) + 1, "aten.flip"),
    (lambda x: x.sum(-1), None),          # fine: rank-1 output
    (lambda x: x.add_(1.0), "mutates"),
    (lambda x: x.sum(-1).squeeze(), None),
    (lambda x: (x > 0).float() * x, None),   # a comparison, cast to float: graph.json has both
    (lambda x: (x > 0) + x, "bool tensor"),   # arithmetic on a bool (a product casts it): refused
    (lambda x: x.argmax(-1, keepdim=True).float(), "aten.argmax"),
])
def test_rejections_are_clear(fn, why):
    if why is None:
        assert import_torch(fn, {"x": ((4, 4), "float32")}).graph.nodes
        return
    with pytest.raises(StitchtuneError) as ei:
        import_torch(fn, {"x": ((4, 4), "float32")})
    assert why in str(ei.value)


def test_generated_names_are_sanitised():
    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([torch.nn.LayerNorm(8) for _ in range(2)])
            self.register_buffer("s" * 80, torch.full((8,), 0.5))

        def forward(self, x):
            for ln in self.layers:
                x = ln(x)
            return x * getattr(self, "s" * 80)

    res = import_torch(Odd(), {"x": ((3, 8), "float32")})
    names = [n for n, _ in res.graph.inputs] + [n.id for n in res.graph.nodes]
    assert all(NAME_RE.fullmatch(n) for n in names)
    assert len(set(names)) == len(names)
    assert "layers_0_weight" in names and "layers_1_bias" in names
    assert {n for n, _ in res.params} == {n for n, _ in res.graph.inputs} - {"x"}


def test_argument_errors():
    with pytest.raises(StitchtuneError, match="missing shape for argument 'gamma'"):
        import_torch(tm.layernorm, {"x": ((4, 8), "float32"), "beta": ((8,), "float32")})
    with pytest.raises(StitchtuneError, match="not a parameter"):
        import_torch(tm.softmax, {"x": ((4, 8), "float32"), "y": ((8,), "float32")})
    with pytest.raises(StitchtuneError):
        parse_shapes("x=4xq")
    with pytest.raises(StitchtuneError):
        parse_dtypes("x=int8", ["x"])
    with pytest.raises(StitchtuneError, match="does not exist"):
        load_callable("no/such/file.py:f")
    with pytest.raises(StitchtuneError, match="has no attribute"):
        load_callable(f"{MODULES}:nope")


def test_load_callable_dotted_module_and_class(tmp_path, monkeypatch):
    (tmp_path / "my_user_mod.py").write_text(
        "import torch\nclass Block(torch.nn.Module):\n    def forward(self, x):\n        return torch.sigmoid(x)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    obj, label = load_callable("my_user_mod:Block")
    assert isinstance(obj, torch.nn.Module) and label == "Block"
    sys.modules.pop("my_user_mod", None)


def test_cli_import_torch(tmp_path, capsys):
    out = tmp_path / "g.json"
    rc = main(["import", "torch", f"{MODULES}:layernorm", "--shapes", "x=8x16,gamma=16,beta=16", "-o", str(out)])
    assert rc == 0
    g = load_graph(out)
    assert [n for n, _ in g.inputs] == ["x", "gamma", "beta"]
    assert "wrote" in capsys.readouterr().out
    params = tmp_path / "p.npz"
    rc = main(["import", "torch", f"{MODULES}:RMSNormBlock", "--shapes", "x=4x64", "--dtype", "bfloat16",
               "-o", str(tmp_path / "r.json"), "--params-out", str(params)])
    assert rc == 0
    assert set(np.load(params).files) == {"norm_weight"}
    assert json.loads((tmp_path / "r.json").read_text())["inputs"]["x"]["dtype"] == "bfloat16"


def test_cli_import_torch_error_is_one_line_exit_2(tmp_path, capsys):
    rc = main(["import", "torch", f"{MODULES}:unsupported_cumsum", "--shapes", "x=4x4", "-o",
               str(tmp_path / "g.json")])
    err = capsys.readouterr().err
    assert rc == 2
    lines = [ln for ln in err.splitlines() if ln.startswith("stitchtune: error:")]
    assert len(lines) == 1 and "aten.cumsum" in lines[0]
    assert "Traceback" not in err
    assert not (tmp_path / "g.json").exists()


def test_dropout_identity_in_eval_error_in_train_points_at_user_code():
    class Drop(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = torch.nn.Dropout(0.1)

        def forward(self, x):
            return self.drop(torch.sigmoid(x))

    assert [n.op for n in import_torch(Drop().eval(), {"x": ((4, 4), "float32")}).graph.nodes] == ["sigmoid"]
    with pytest.raises(StitchtuneError) as ei:
        import_torch(Drop().train(), {"x": ((4, 4), "float32")})
    assert "test_import_torch.py:" in str(ei.value) and "training mode" in str(ei.value)


_F = torch.nn.functional
_UNARY_FNS = [torch.sigmoid, torch.tanh, torch.relu, lambda t: torch.exp(-t.abs()), torch.abs, torch.neg,
              _F.silu, _F.gelu, lambda t: _F.gelu(t, approximate="tanh"), lambda t: torch.sqrt(t.abs() + 1),
              torch.erf, lambda t: torch.rsqrt(t * t + 1), lambda t: torch.log(t.abs() + 1)]
_BINARY_FNS = [torch.add, torch.sub, torch.mul, lambda a, b: a / (b.abs() + 1), torch.maximum, torch.minimum,
               lambda a, b: torch.add(a, b, alpha=-0.5)]
_REDUCE_FNS = [lambda t, d: t.sum(d, keepdim=True), lambda t, d: t.mean(d, keepdim=True),
               lambda t, d: t.amax(d, keepdim=True), lambda t, d: t.amin(d, keepdim=True),
               lambda t, d: t.sum(d).unsqueeze(d)]


def _program_fn(steps):
    def fn(x, y):
        vals = [x, y]
        for kind, i, j, c in steps:
            a, b = vals[i % len(vals)], vals[j % len(vals)]
            if kind == "unary":
                vals.append(_UNARY_FNS[j % len(_UNARY_FNS)](a))
            elif kind == "binary":
                vals.append(_BINARY_FNS[c % len(_BINARY_FNS)](a, b))
            elif kind == "scalar":
                vals.append(a * (c / 4.0 - 1.0) + c)
            else:
                vals.append(_REDUCE_FNS[c % len(_REDUCE_FNS)](a, j % 2))
        return vals[-1]
    return fn


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["unary", "binary", "scalar", "reduce"]), st.integers(0, 9),
                          st.integers(0, 12), st.integers(0, 8)), min_size=1, max_size=7))
def test_random_programs_round_trip(steps):
    """Random chains of supported element-wise ops and keepdim reductions import and match PyTorch."""
    err, _ = _round_trip(_program_fn(steps), "x=5x6,y=5x6")
    assert err < 1e-5
