"""No region writes the same values twice (issue 39): a view of a region's output that the region also
reads (BERT's and GPT-2's input gradient ``mul_23`` and its ``view_51`` for the weight gradient's
matmul) is returned as PyTorch's view of that output, not stored again by the kernel
(:func:`stitchtune.importers.torch_mapping._viewed_output`). Checked on a small function (values,
shapes, strides and storage sharing equal to eager's, gradients too) and on training steps of small
transformers models (gradients equal to eager's; no region stores an output twice in the same layout,
:func:`stitchtune.importers.torch_duplicates.duplicate_outputs`). The backend runs its regions in the
emulator on the CPU."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from stitchtune.deploy import torch_backend  # noqa: E402
from stitchtune.deploy.model_tuning import capture_regions  # noqa: E402
from stitchtune.importers.torch_duplicates import duplicate_outputs  # noqa: E402


@pytest.fixture(autouse=True)
def _reset() -> Any:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _f(a: Any, b: Any, w: Any) -> Any:
    y = torch.tanh(a) * b          # the region's output, returned
    v = y.view(-1, 16)             # its view, read by the matmul (outside) and the row sum (inside)
    return y, v @ w, v.sum(1), v   # (v returned too: an output that aliases another)


def _args(grad: bool) -> tuple[Any, ...]:
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(*s, generator=g).requires_grad_(grad) for s in ((2, 8, 16), (2, 8, 16), (16, 4)))


def _same_layout_twice(regions: Any) -> list[tuple[str, str, str]]:
    return [(r.name, d.output, d.same) for r in regions for d in duplicate_outputs(r.graph) if d.same_layout]


def test_a_view_of_an_output_is_an_alias_not_a_second_store() -> None:
    regions = capture_regions(_f, _args(False), "inference")
    assert _same_layout_twice(regions) == []
    region = next(r for r in regions if "aten.tanh" in r.ops)
    assert [o.name for o in region.outputs] == ["mul", "sum_1"], region.outputs   # y and the row sum only
    assert [(a.name, b.name) for a, b in region.aliases] == [("view", "mul")]


@pytest.mark.parametrize(("grad", "dynamic"), [(False, False), (True, False), (False, True)])
def test_the_view_has_eagers_shape_strides_and_storage(grad: bool, dynamic: bool) -> None:
    args = _args(grad)
    want = _f(*args)
    compiled = torch.compile(_f, backend=torch_backend.stitchtune_backend, dynamic=dynamic,
                             options={"db": None, "fallback": "eager", "cpu": "emulate"})
    torch_backend.LAST_REPORTS.clear()
    with torch.enable_grad() if grad else torch.no_grad():
        got = compiled(*args)
    assert any("aten.tanh" in s.ops for r in torch_backend.LAST_REPORTS for s in r.stitched)
    assert not [d for r in torch_backend.LAST_REPORTS for d in r.declined if d.what.startswith("region")]
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.stride() == w.stride()
        assert torch.allclose(g, w, atol=1e-5)
    assert got[3].untyped_storage().data_ptr() == got[0].untyped_storage().data_ptr()   # v views y, as in eager
    if grad:
        gg = torch.autograd.grad(sum(t.sum() for t in got), args)
        ww = torch.autograd.grad(sum(t.sum() for t in want), args)
        for g, w in zip(gg, ww):
            assert torch.allclose(g, w, atol=1e-4)


def _bert() -> tuple[Any, tuple[Any, ...]]:
    import transformers

    cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                  vocab_size=64, max_position_embeddings=16, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)
    return transformers.BertModel(cfg), (torch.randint(0, 64, (2, 8)),)


def _gpt2() -> tuple[Any, tuple[Any, ...]]:
    import transformers

    cfg = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=16, resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    cfg._attn_implementation = "eager"
    return transformers.GPT2Model(cfg), (torch.randint(0, 64, (2, 8)),)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_a_training_step_stores_each_input_gradient_once_and_matches_eager(name: str) -> None:
    """The layer norm backward's input gradient and its 2-D view (for the weight gradient's matmul):
    stored once by the region (the view an alias of it), the step's gradients equal eager's."""
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model, args = {"bert": _bert, "gpt2": _gpt2}[name]()
    regions = capture_regions(model, args, "train")
    assert _same_layout_twice(regions) == []
    views = [(r.name, a.name) for r in regions for a, same in r.aliases if same in r.outputs and a.args[0] is same]
    assert len(views) >= 2, views   # one per layer norm backward whose input gradient a linear's backward reads
    model.zero_grad(set_to_none=True)   # (the capture ran a step of its own)
    model.train()
    torch._dynamo.reset()
    torch_backend.LAST_REPORTS.clear()
    compiled = torch.compile(model, backend=torch_backend.stitchtune_backend,
                             options={"db": None, "fallback": "eager", "cpu": "emulate"})
    got = compiled(*args).last_hidden_state
    (got ** 2).mean().backward()
    reports = list(torch_backend.LAST_REPORTS)
    g_got = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    want = model(*args).last_hidden_state
    (want ** 2).mean().backward()
    g_want = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert len(reports) == 2 and all(r.stitched for r in reports), reports   # forward and backward
    assert (got - want).abs().max().item() < 1e-4
    assert len(g_want) > 10
    scale = max(g.abs().max().item() for g in g_want.values())
    for k in g_got.keys() | g_want.keys():   # (BERT's pooler: no gradient eagerly, zeros compiled)
        g, w = g_got.get(k), g_want.get(k)
        assert (g if w is None else w if g is None else g - w).abs().max().item() <= 1e-4 * scale, k
