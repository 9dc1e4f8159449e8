"""Transposed matmul operands handed over as views (importers/torch_mm_views.py): the K^T copy of
attention (``clone`` of ``k`` with its last two dims swapped, read only by ``bmm``) becomes a copy in
``k``'s own axis order (coalesced, like the q / v head splits) whose merged view ``bmm`` reads
transposed; values equal PyTorch's, and a BERT under the backend no longer stitches the transposed copy."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from stitchtune.importers.torch_fx_util import op_key  # noqa: E402
from stitchtune.importers.torch_mm_views import matmul_views  # noqa: E402


def _attention_scores(q4: Any, k4: Any) -> Any:
    """BERT's scores: heads split by a transpose of [B, S, H, D], then q @ k^T."""
    q, k = q4.transpose(1, 2), k4.transpose(1, 2)
    return torch.matmul(q, k.transpose(-1, -2)) * 0.25


def _traced(fn: Any, *args: Any) -> Any:
    from torch.fx.experimental.proxy_tensor import make_fx
    return make_fx(fn, tracing_mode="fake")(*args)


def _swapped_clones(gm: Any) -> int:
    """Clones (through an expand) of a tensor whose last two dims a permute / transpose swapped."""
    count = 0
    for n in gm.graph.nodes:
        if n.op == "call_function" and op_key(n.target) == "aten.clone":
            x = n.args[0]
            if op_key(x.target) == "aten.expand":
                x = x.args[0]
            r = len(x.meta["val"].shape)
            if op_key(x.target) == "aten.permute" and [d % r for d in x.args[1]][-2:] == [r - 1, r - 2] or (
                    op_key(x.target) == "aten.transpose" and sorted(d % r for d in x.args[1:3]) == [r - 2, r - 1]):
                count += 1
    return count


def test_the_transposed_operand_is_a_view_and_the_values_are_pytorchs() -> None:
    q4, k4 = torch.randn(2, 8, 3, 16), torch.randn(2, 8, 3, 16)
    gm = _traced(_attention_scores, q4, k4)
    assert _swapped_clones(gm) == 1
    new = matmul_views(gm)
    assert new is not None and _swapped_clones(new) == 0 and _swapped_clones(gm) == 1   # gm unchanged
    bmm = next(n for n in new.graph.nodes if op_key(n.target) == "aten.bmm")
    operand = bmm.args[1].meta["val"]
    assert tuple(operand.shape) == (6, 16, 8) and operand.stride()[-2] == 1   # a transposed view
    torch.testing.assert_close(new(q4, k4), _attention_scores(q4, k4))


def test_an_operand_read_elsewhere_too_or_a_plain_matmul_is_left_alone() -> None:
    def saved(q4: Any, k4: Any) -> Any:   # the copied K^T also returned (a training forward saves it)
        kt = k4.transpose(1, 2).transpose(-1, -2).reshape(6, 16, 8)
        return torch.bmm(q4.transpose(1, 2).reshape(6, 8, 16), kt), kt

    q4, k4 = torch.randn(2, 8, 3, 16), torch.randn(2, 8, 3, 16)
    assert matmul_views(_traced(saved, q4, k4)) is None
    assert matmul_views(_traced(lambda a, b: a @ b, torch.randn(4, 5), torch.randn(5, 6))) is None


@pytest.mark.slow
def test_bert_under_the_backend_stitches_no_transposed_copy() -> None:
    transformers = pytest.importorskip("transformers")
    from stitchtune.deploy import torch_backend

    torch._dynamo.reset()
    torch.manual_seed(0)
    cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                  vocab_size=64, max_position_embeddings=16)
    cfg._attn_implementation = "eager"
    model = transformers.BertModel(cfg).eval()
    ids = torch.randint(0, 64, (2, 8))   # batch 2: the heads' [B, H] cannot be merged by a view
    with torch.no_grad():
        want = model(ids).last_hidden_state
        e = torch_backend.explain(model, ids, db=None, fallback="eager", cpu="emulate")
    torch._dynamo.reset()
    def count(ops: tuple[str, ...], name: str) -> int:
        return sum(1 for o in ops if name in o)

    splits = [s for s in e.stitched if count(s.ops, "permute") and count(s.ops, "clone")]
    assert len(splits) >= 3, str(e)   # q, k and v head splits, and the heads' merge
    assert all(count(s.ops, "permute") == 1 for s in splits), str(e)   # none transposes k's last two dims
    assert (e.outputs.last_hidden_state - want).abs().max().item() < 1e-4
