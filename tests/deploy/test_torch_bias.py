"""A linear layer's bias added by the region that reads its product (importers/torch_bias.py): ``addmm``
whose readers are all element-wise becomes ``mm`` + ``add`` before the region finder (as Inductor's
``unfuse_bias_add_to_pointwise``), so no ``addmm`` with cuBLAS's slower bias epilogue reaches the library;
values equal PyTorch's; a BERT under the backend hands Inductor only ``mm``s and stitches the same number of
regions, each head split adding its bias; the model capture (tuning, the audit) cuts the regions the backend
cuts (deploy/torch_prepare.py)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from stitchtune.importers.torch_bias import unfused_bias_adds  # noqa: E402
from stitchtune.importers.torch_fx_util import op_key  # noqa: E402


def _traced(fn: Any, *args: Any) -> Any:
    from torch.fx.experimental.proxy_tensor import make_fx
    return make_fx(fn, tracing_mode="fake")(*args)


def _ops(gm: Any) -> list[str]:
    return [op_key(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def _linear_gelu(x: Any, w: Any, b: Any) -> Any:
    return torch.nn.functional.gelu(torch.addmm(b, x, w).view(2, 4, 6))


def test_an_addmm_read_element_wise_becomes_mm_and_add_with_pytorchs_values() -> None:
    x, w, b = torch.randn(8, 5), torch.randn(5, 6), torch.randn(6)
    gm = _traced(_linear_gelu, x, w, b)
    new = unfused_bias_adds(gm)
    assert new is not None and "aten.addmm" in _ops(gm)   # gm unchanged
    assert "aten.addmm" not in _ops(new) and {"aten.mm", "aten.add"} <= set(_ops(new))
    add = next(n for n in new.graph.nodes if op_key(n.target) == "aten.add")
    assert tuple(add.meta["val"].shape) == (8, 6)
    torch.testing.assert_close(new(x, w, b), _linear_gelu(x, w, b))


@pytest.mark.parametrize("case", ["returned", "reduced", "half", "scaled", "full bias"])
def test_an_addmm_outside_the_contract_is_left_alone(case: str) -> None:
    x, w, b = torch.randn(8, 5), torch.randn(5, 6), torch.randn(6)
    if case == "returned":     # the product itself leaves the graph (a training forward saving it)
        def fn(x: Any, w: Any, b: Any) -> Any:
            y = torch.addmm(b, x, w)
            return y, y.relu()
    elif case == "reduced":    # a reduction reads it: not element-wise
        fn = lambda x, w, b: torch.addmm(b, x, w).sum(-1)   # noqa: E731
    elif case == "half":       # half dtypes keep the epilogue (it adds in float32 before rounding once)
        x, w, b = x.bfloat16(), w.bfloat16(), b.bfloat16()
        fn = lambda x, w, b: torch.addmm(b, x, w).relu()   # noqa: E731
    elif case == "scaled":
        fn = lambda x, w, b: torch.addmm(b, x, w, beta=0.5).relu()   # noqa: E731
    else:                      # a full [M, N] addend is no bias
        b = torch.randn(8, 6)
        fn = lambda x, w, b: torch.addmm(b, x, w).relu()   # noqa: E731
    assert unfused_bias_adds(_traced(fn, x, w, b)) is None


def _tiny_bert() -> tuple[Any, Any]:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                  vocab_size=64, max_position_embeddings=16)
    cfg._attn_implementation = "eager"
    return transformers.BertModel(cfg).eval(), torch.randint(0, 64, (2, 8))


@pytest.mark.slow
def test_bert_under_the_backend_hands_over_no_addmm_and_equals_eager() -> None:
    from stitchtune.deploy import torch_backend

    model, ids = _tiny_bert()
    torch._dynamo.reset()
    with torch.no_grad():
        want = model(ids).last_hidden_state
        e = torch_backend.explain(model, ids, db=None, fallback="eager", cpu="emulate")
    torch._dynamo.reset()
    left = {d.what: d.count for d in e.declined}
    assert "op aten.addmm" not in left and left.get("op aten.mm") == 7, str(e)   # q, k, v, o, ffn x2, pooler
    assert len(e.stitched) == 10, str(e)   # as before: embeddings + LN, 3 splits, softmax, merge, 2 LN, GELU, tanh
    splits = [s for s in e.stitched if "aten.permute" in s.ops and "aten.clone" in s.ops]
    assert sum(1 for s in splits if s.ops[0] == "aten.add") == 3, str(e)   # q, k, v splits add their biases
    assert (e.outputs.last_hidden_state - want).abs().max().item() < 1e-4


@pytest.mark.slow
def test_the_model_capture_cuts_the_regions_the_backend_stitches() -> None:
    from stitchtune.deploy import torch_backend
    from stitchtune.deploy.model_tuning import capture_regions

    model, ids = _tiny_bert()
    with torch.no_grad():
        e = torch_backend.explain(model, ids, db=None, fallback="eager", cpu="emulate")
    torch._dynamo.reset()
    captured = capture_regions(model, (ids,), "inference")
    assert sorted(r.ops for r in captured) == sorted(s.ops for s in e.stitched)


def _qkv_split(x: Any, w: Any, b: Any) -> Any:
    """GPT-2's fused q / k / v projection: ``addmm`` viewed ``[B, S, 3H]``, sliced into q, k and v along the
    last axis, each split into heads (q, v ``[B, nh, S, D]``, k transposed ``[B, nh, D, S]``) and copied."""
    y = torch.addmm(b, x, w).view(2, 4, 12)
    q, k, v = (y[..., i * 4:(i + 1) * 4].reshape(2, 4, 2, 2) for i in range(3))
    return q.permute(0, 2, 1, 3).relu(), k.permute(0, 2, 3, 1).contiguous(), v.permute(0, 2, 1, 3) * 2.0


def test_a_column_split_of_the_product_adds_each_slice_of_the_bias_after_its_slice() -> None:
    """``slice(view(addmm(b, x, w)))`` -> ``add(slice(view(mm(x, w))), slice(b))``: the add joins the region
    of the head split that reads the slice (the planner refuses a slice of a computed tensor wider than the
    region's domain, so a bias add before the slices was a region of its own and the addmm stayed)."""
    from stitchtune.importers.torch_bias import BIAS_OF, column_slices

    x, w, b = torch.randn(8, 5), torch.randn(5, 12), torch.randn(12)
    gm = _traced(_qkv_split, x, w, b)
    addmm = next(n for n in gm.graph.nodes if op_key(n.target) == "aten.addmm")
    assert len(column_slices(addmm)) == 3
    new = unfused_bias_adds(gm)
    assert new is not None and "aten.addmm" not in _ops(new)
    adds = [n for n in new.graph.nodes if BIAS_OF in n.meta]
    assert len(adds) == 3 and all(n.meta[BIAS_OF] == addmm.name for n in adds)
    placeholders = [n for n in new.graph.nodes if n.op == "placeholder"]
    for add in adds:
        part, piece = add.args
        assert op_key(part.target) == "aten.slice" and op_key(piece.target) == "aten.slice"
        assert piece.args[0] is placeholders[2] and piece.args[2:] == part.args[2:]
        assert tuple(add.meta["val"].shape) == (2, 4, 4)
    for want, got in zip(_qkv_split(x, w, b), new(x, w, b)):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("case", ["rows", "and element-wise", "narrowing view"])
def test_a_product_read_otherwise_keeps_one_add_before_its_readers(case: str) -> None:
    """Slices along another axis, a slice beside an element-wise reader of the product, or a view that changes
    the last extent before the slice: no column split, the add stays whole (and the values equal PyTorch's)."""
    from stitchtune.importers.torch_bias import column_slices

    x, w, b = torch.randn(8, 5), torch.randn(5, 6), torch.randn(6)
    if case == "rows":
        fn = lambda x, w, b: (torch.addmm(b, x, w)[:4].relu(), torch.addmm(b, x, w)[4:].relu())   # noqa: E731
    elif case == "and element-wise":
        fn = lambda x, w, b: (lambda y: (y[:, :3].relu(), y.exp()))(torch.addmm(b, x, w))   # noqa: E731
    else:
        fn = lambda x, w, b: torch.addmm(b, x, w).view(8, 2, 3)[..., :2].relu()   # noqa: E731
    gm = _traced(fn, x, w, b)
    assert all(column_slices(n) == [] for n in gm.graph.nodes if op_key(n.target) == "aten.addmm")
    new = unfused_bias_adds(gm)
    assert new is not None and "aten.addmm" not in _ops(new)
    assert all(op_key(n.args[0].target) == "aten.mm" for n in new.graph.nodes if op_key(n.target) == "aten.add")
    for want, got in zip(fn(x, w, b), new(x, w, b)):
        torch.testing.assert_close(got, want)


@pytest.mark.slow
def test_gpt2_under_the_backend_hands_over_no_addmm_and_equals_eager() -> None:
    """A tiny GPT-2: its fused q / k / v projection's bias is added in the head-split region (three adds after
    the slices), so no ``addmm`` reaches the library; the output equals eager."""
    from stitchtune.deploy import torch_backend

    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=16, resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    cfg._attn_implementation = "eager"   # (SDPA reads q, k, v itself: no element-wise reader, the addmm stays)
    model, ids = transformers.GPT2Model(cfg).eval(), torch.randint(0, 64, (2, 8))
    torch._dynamo.reset()
    with torch.no_grad():
        want = model(ids).last_hidden_state
        e = torch_backend.explain(model, ids, db=None, fallback="eager", cpu="emulate")
    torch._dynamo.reset()
    left = {d.what: d.count for d in e.declined}
    assert "op aten.addmm" not in left and left.get("op aten.mm") == 4, str(e)   # c_attn, c_proj, c_fc, mlp c_proj
    split = [s for s in e.stitched if s.ops.count("aten.slice") >= 3]
    assert split and all(s.ops.count("aten.add") >= 3 for s in split), str(e)
    assert (e.outputs.last_hidden_state - want).abs().max().item() < 1e-4


def test_a_slice_of_fewer_dimensions_than_the_bias_keeps_its_shape() -> None:
    """A one-row product with a ``[1, N]`` bias, viewed ``[N]`` and sliced: an add after the slice would
    broadcast ``[k] + [1, k]`` to ``[1, k]`` (the graph's meta says ``[k]``), so the add stays before the
    view; the values and the output's shape equal PyTorch's."""
    from stitchtune.importers.torch_bias import column_slices

    def fn(x: Any, w: Any, b: Any) -> Any:
        return torch.addmm(b, x, w).view(12)[3:9].relu()

    x, w, b = torch.randn(1, 5), torch.randn(5, 12), torch.randn(1, 12)
    gm = _traced(fn, x, w, b)
    assert all(column_slices(n) == [] for n in gm.graph.nodes if op_key(n.target) == "aten.addmm")
    new = unfused_bias_adds(gm)
    assert new is not None and "aten.addmm" not in _ops(new)
    got = new(x, w, b)
    assert got.shape == (6,)
    torch.testing.assert_close(got, fn(x, w, b))


@pytest.mark.parametrize("case", ["step", "negative", "clamped", "overlapping", "partial"])
def test_column_slices_with_steps_negative_clamped_or_overlapping_bounds_add_the_same_bias(case: str) -> None:
    """Each slice's bias piece takes the slice's own bounds (step, negative or clamped start / stop), so a
    strided, negative, clamped, overlapping or partial column split equals PyTorch's."""
    from stitchtune.importers.torch_bias import column_slices

    aten = torch.ops.aten
    fns = {"step": lambda y: (aten.slice(y, 1, 1, 12, 3).relu(),),
           "negative": lambda y: (aten.slice(y, -1, -7, -2).relu(),),
           "clamped": lambda y: (aten.slice(y, 1, 4, 2 ** 63 - 1).relu(),),
           "overlapping": lambda y: (y[:, 0:8].relu(), y[:, 4:12].exp()),
           "partial": lambda y: (y.view(2, 4, 12)[..., 2:5].relu(),)}

    def fn(x: Any, w: Any, b: Any) -> Any:
        return fns[case](torch.addmm(b, x, w))

    x, w, b = torch.randn(8, 5), torch.randn(5, 12), torch.randn(12)
    gm = _traced(fn, x, w, b)
    assert all(len(column_slices(n)) >= 1 for n in gm.graph.nodes if op_key(n.target) == "aten.addmm")
    new = unfused_bias_adds(gm)
    assert new is not None and "aten.addmm" not in _ops(new)
    for got, want in zip(new(x, w, b), fn(x, w, b)):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want)
