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
