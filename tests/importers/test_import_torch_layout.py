"""PyTorch importer: ATen ops that move elements onto graph.json's layout and index ops (transpose,
reshape, slice, concat, gather), identities, casts and broadcast views, checked against PyTorch."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from stitchtune.errors import StitchtuneError  # noqa: E402
from stitchtune.graph.reference import run_reference  # noqa: E402
from stitchtune.importers.torch_import import import_torch  # noqa: E402


def _check(fn: Any, inputs: dict[str, tuple[tuple[int, ...], str]], high: int = 8) -> set[str]:
    """Import ``fn``, run the reference on seeded inputs (ints in [0, high)), compare with PyTorch;
    return the graph's ops."""
    rng = np.random.default_rng(0)
    arrays = {n: (rng.integers(0, high, s).astype(dt) if dt.startswith("int")
                  else rng.standard_normal(s).astype(np.float32)) for n, (s, dt) in inputs.items()}
    res = import_torch(fn, inputs)
    got = run_reference(res.graph, {**arrays, **dict(res.params)})
    with torch.no_grad():
        want = fn(*[torch.from_numpy(a) for a in arrays.values()])
    want = want if isinstance(want, tuple) else (want,)
    assert len(want) == len(res.graph.outputs)
    for name, w in zip(res.graph.outputs, want):
        assert got[name].shape == tuple(w.shape)
        assert np.abs(got[name].astype(np.float64) - w.double().numpy()).max() < 1e-5
    return {n.op for n in res.graph.nodes}


def test_transpose_permute_and_t() -> None:
    def f(x: Any, y: Any) -> Any:
        a = x.transpose(1, 2).exp() + 1.0
        b = x.permute(2, 0, 1) * 2.0
        return a, b, y.t().sigmoid()

    ops = _check(f, {"x": ((2, 3, 4), "float32"), "y": ((3, 5), "float32")})
    assert "transpose" in ops


def test_a_transpose_of_unit_axes_is_a_reshape_or_nothing() -> None:
    ops = _check(lambda x: (x * 2.0).transpose(0, 1) + 1.0, {"x": ((1, 6), "float32")})
    assert "transpose" not in ops


def test_views_that_move_elements_are_reshapes() -> None:
    def f(x: Any) -> Any:
        y = (x + 1.0).view(2, 12).exp()
        z = x.reshape(4, 6).sigmoid().flatten()
        return y, z, (x * 3.0).unsqueeze(1).flatten(0, 1)

    ops = _check(f, {"x": ((2, 3, 4), "float32")})
    assert "reshape" in ops


def test_unit_views_of_a_broadcast_value_keep_it_broadcast() -> None:
    def f(x: Any, b: Any) -> Any:
        bb = b.unsqueeze(0).expand(x.shape[0], -1).unsqueeze(1)   # [5, 1, 7] of a [7] bias
        return (x.unsqueeze(1) * bb).squeeze(1)

    _check(f, {"x": ((5, 7), "float32"), "b": ((7,), "float32")})


def test_expand_that_must_be_materialised_is_an_expand_node() -> None:
    # repeat_kv: unsqueeze, expand, reshape (the reshape needs the broadcast materialised), rank 5
    ops = _check(lambda x: x.unsqueeze(0).expand(2, 4, 4).reshape(8, 4) + 1.0, {"x": ((4, 4), "float32")})
    assert {"expand", "reshape"} <= ops
    ops = _check(lambda x: x[:, :, None].expand(1, 2, 3, 4, 5).reshape(1, 6, 4, 5) * 2.0,
                 {"x": ((1, 2, 4, 5), "float32")})
    assert "expand" in ops


def test_cat_and_rotate_half() -> None:
    def f(x: Any, y: Any) -> Any:
        x1, x2 = x[..., :4], x[..., 4:]
        rot = torch.cat((-x2, x1), dim=-1)
        return x * 0.5 + rot * 2.0, torch.cat([x.exp(), y], 0)

    ops = _check(f, {"x": ((3, 8), "float32"), "y": ((2, 8), "float32")})
    assert {"concat", "slice"} <= ops


def test_slice_scatter_into_a_tensor_is_a_concat_of_its_slices() -> None:
    def f(x: Any, y: Any) -> Any:
        return torch.slice_scatter(x, y.exp(), 1, 2, 5) * 2.0, torch.slice_scatter(x, y[:, :2], -1, 4) + 1.0

    ops = _check(f, {"x": ((4, 6), "float32"), "y": ((4, 3), "float32")})
    assert {"concat", "slice"} <= ops


def test_slice_clamps_and_negative_bounds_and_select() -> None:
    def f(x: Any) -> Any:
        return x[:, 1:100] * 2.0, x[:, -3:-1].exp(), x[:, 0] + 1.0, x[1] * x[:, 2:3]

    ops = _check(f, {"x": ((4, 6), "float32")})
    assert "slice" in ops


def test_slicing_an_axis_a_value_broadcasts_along_changes_nothing() -> None:
    def f(x: Any, b: Any) -> Any:
        return (x + b)[1:3] * 2.0 + b.expand(4, 6)[2:4]

    _check(f, {"x": ((4, 6), "float32"), "b": ((6,), "float32")})


def test_embedding_is_a_gather_of_int64_ids() -> None:
    emb = torch.nn.Embedding(8, 6).eval()
    ln = torch.nn.LayerNorm(6).eval()

    def f(ids: Any, pos: Any) -> Any:
        return ln(emb(ids) + pos)

    ops = _check(f, {"ids": ((1, 5), "int64"), "pos": ((5, 6), "float32")})
    assert "gather" in ops


def test_identities_and_casts() -> None:
    def f(x: Any) -> Any:
        y = torch.nn.functional.dropout(x.clone().detach().contiguous(), 0.5, training=False)
        h = y.to(torch.float16).to(torch.float32)
        return torch.where(x.relu().to(torch.bool), h, 0.0) + 1.0

    ops = _check(f, {"x": ((4, 6), "float32")})
    assert "cast" in ops


def test_slice_of_a_reduction_that_unsqueeze_turns_into_keepdims() -> None:
    def f(x: Any) -> Any:
        s = x.sum(-1)                     # [4, 6] -> [4]
        return x * s.unsqueeze(-1) + s[1:3].sum() * 0.0 + 1.0

    _check(f, {"x": ((4, 6), "float32")})


def test_embedding_ids_computed_by_integer_arithmetic_are_refused_clearly() -> None:
    emb = torch.nn.Embedding(8, 6).eval()
    with pytest.raises(StitchtuneError, match="aten.embedding.*indices must be an int32/int64 tensor that is a graph input"):
        import_torch(lambda ids: emb(ids + 1), {"ids": ((1, 5), "int64")})
