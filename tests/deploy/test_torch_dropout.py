"""Training dropout drawn inside stitched regions, on tiny BERT and GPT-2 (transformers configs,
random weights, 1 layer, every dropout 0.1): a training step under ``torch.compile(backend=
"stitchtune")`` (regions emulated, the rest eager) equals AOTAutograd's graphs run eagerly with the
same draws (``seed_rands``: the same seeds from the same ``randint``, hashed by torch; a draw that no
region takes is Inductor's random op in both), outputs within 1e-5 and gradients within 1e-4 of the
largest; the regions draw the attention, residual and embedding dropouts."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from stitchtune.deploy import torch_backend, torch_rest  # noqa: E402
from stitchtune.importers.torch_random import seed_rands, unseed_rands  # noqa: E402
from stitchtune.importers.torch_regions import find_regions  # noqa: E402

pytestmark = pytest.mark.slow

_RAND = torch.ops.stitchtune.rand.default


def _model(name: str) -> Any:
    torch.manual_seed(0)
    if name == "gpt2":
        cfg = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=16,
                                      resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1, bos_token_id=0, eos_token_id=0)
        return transformers.GPT2Model(cfg).train()
    cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                  vocab_size=64, max_position_embeddings=16, hidden_dropout_prob=0.1,
                                  attention_probs_dropout_prob=0.1)
    return transformers.BertModel(cfg).train()


def _same_draws(gm: Any) -> Any:
    """``gm`` with the draws the backend's regions take as ``stitchtune::rand`` (run by torch), the
    others as Inductor's random op, as the backend leaves them."""
    seeded = seed_rands(gm)
    if seeded is None:
        return gm
    taken = {n for r in find_regions(seeded).regions for n in r.nodes}
    kept = [n for n in seeded.graph.nodes if n in taken and n.target is _RAND]
    for n in kept:   # hidden from unseed_rands, which turns every other draw into Inductor's
        n.target = torch.ops.aten.alias.default
    unseed_rands(seeded)
    for n in kept:
        n.target = _RAND
    seeded.recompile()
    return seeded


def _step(name: str, backend: Any) -> tuple[Any, dict[str, Any]]:
    m = _model(name)
    ids = torch.randint(0, 64, (2, 8))
    torch._dynamo.reset()
    torch.manual_seed(5)
    out = torch.compile(m, backend=backend)(ids).last_hidden_state
    (out * torch.linspace(-1.0, 1.0, 32)).sum().backward()
    return out.detach(), {k: p.grad for k, p in m.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_a_training_step_with_dropout_drawn_in_regions_matches_the_same_draws_eagerly(name: str) -> None:
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    eager = aot_autograd(fw_compiler=lambda gm, _: make_boxed_func(_same_draws(gm).forward),
                         decompositions=torch_rest.decompositions())
    want_y, want_g = _step(name, eager)
    torch_backend.LAST_REPORTS.clear()
    got_y, got_g = _step(name, lambda gm, inputs: torch_backend.stitchtune_backend(
        gm, inputs, options={"db": None, "fallback": "eager"}))
    ops = [o for r in torch_backend.LAST_REPORTS for s in r.stitched for o in s.ops]
    # attention probabilities, attention output, MLP output, and the embeddings' (beside their gathers)
    assert ops.count("stitchtune.rand") == 4
    assert not [d for r in torch_backend.LAST_REPORTS for d in r.declined if "failed" in d.reason]
    assert torch.allclose(got_y, want_y, atol=1e-5)
    scale = max(float(g.abs().max()) for g in want_g.values())
    assert set(got_g) == set(want_g) and scale > 1e-3
    assert max(float((got_g[k] - want_g[k]).abs().max()) for k in want_g) <= 1e-4 * scale
