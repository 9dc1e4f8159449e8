"""Embedding gradients inside stitched regions: a training step of tiny BERT and GPT-2 (transformers
configs, random weights, 1 layer, no dropout) under ``torch.compile(backend="stitchtune")`` (regions
emulated, the rest eager) gives gradients equal to eager (1e-4 of the model's largest), and the
word embedding's gradient (``_unsafe_masked_index_put_accumulate``) is computed in a stitched backward
region (``scatter_add``). With ``deterministic=True`` those regions are declined (float atomics) with
the reason shown by ``explain``, and gradients still equal eager; ``stitchtune compile`` / ``search
--deterministic`` refuse a graph with a scatter in one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from stitchtune import cli  # noqa: E402
from stitchtune.deploy.torch_backend import explain  # noqa: E402

pytestmark = pytest.mark.slow

_SCATTER = "aten._unsafe_masked_index_put_accumulate"


def _model(name: str) -> Any:
    torch.manual_seed(0)
    if name == "gpt2":
        cfg = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=16, resid_pdrop=0.0,
                                      embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
        return transformers.GPT2Model(cfg).train()
    cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                  vocab_size=64, max_position_embeddings=16, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0, pad_token_id=0)
    return transformers.BertModel(cfg).train()


def _grads(m: Any, ids: Any, call: Any = None) -> dict[str, Any]:
    out = (m if call is None else call)(ids).last_hidden_state
    (out * out).sum().backward()
    return {n: p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None}


def _step(name: str, **options: Any) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """(eager gradients, backend gradients, the backend's explanation of the step)."""
    ids = torch.randint(1, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    ids[0, :3] = torch.tensor([0, 7, 7])   # a padding id (BERT's padding_idx 0) and a repeated row
    want = _grads(_model(name), ids)
    torch._dynamo.reset()
    m = _model(name)
    got = _grads(m, ids, torch.compile(m, backend="stitchtune", options=options or None))
    return want, got, explain(_model(name), ids, backward=True, **options)


def _assert_equal(want: dict[str, Any], got: dict[str, Any]) -> None:
    """Every gradient within 1e-4 of the model's largest (one scale per model: some are zero in
    theory, e.g. a layer norm's bias before a sum of squares of a normalised value); a gradient one side
    leaves None (the unused pooler) is zeros."""
    scale = max(float(w.abs().max()) for w in want.values())
    for n in set(want) | set(got):
        w, g = want.get(n), got.get(n)
        diff = (g - w) if w is not None and g is not None else (w if g is None else g)
        assert diff is not None and float(diff.abs().max()) <= 1e-4 * scale, n


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_embedding_gradients_in_a_stitched_region(name: str, fresh_backend: None) -> None:
    want, got, ex = _step(name)
    _assert_equal(want, got)
    scatters = [s for s in ex.stitched if s.graph == "backward" and _SCATTER in s.ops]
    assert scatters, ex
    assert not any(d.what == f"op {_SCATTER}" for d in ex.declined), ex.declined


def test_deterministic_declines_the_scatter_regions_with_a_reason(fresh_backend: None) -> None:
    want, got, ex = _step("bert", deterministic=True)
    _assert_equal(want, got)
    assert not any(_SCATTER in s.ops for s in ex.stitched)
    assert any(_SCATTER in d.what or "float atomics" in d.reason for d in ex.declined), ex.declined
    assert any("float atomics" in d.reason for d in ex.declined), ex.declined


def _scatter_graph(tmp: Path) -> Path:
    p = tmp / "emb_bwd.json"
    p.write_text(json.dumps({
        "name": "emb_bwd", "inputs": {"dy": {"shape": [2, 8, 16], "dtype": "float32"},
                                      "ids": {"shape": [2, 8], "dtype": "int64"}},
        "nodes": [{"id": "v", "op": "mul", "args": ["dy", 2.0]},
                  {"id": "dw", "op": "scatter_add", "args": ["v", "ids"], "shape": [10, 16]}],
        "outputs": ["dw"]}))
    return p


@pytest.mark.parametrize("cmd", ["compile", "search"])
def test_cli_deterministic_refuses_a_scatter_in_one_line(cmd: str, tmp_path: Path, capsys: Any) -> None:
    g = str(_scatter_graph(tmp_path))
    base = ["compile", g, "--no-cubin", "--device", "h200", "-o", str(tmp_path / "out")] if cmd == "compile" else \
        ["search", g, "--backend", "emulate", "--trials", "2", "--jobs", "1", "--no-build", "--no-progress",
         "--db", str(tmp_path / "db")]
    assert cli.main(base) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert cli.main(base + ["--deterministic"]) == 2
    err = capsys.readouterr().err
    [line] = [x for x in err.splitlines() if "error" in x]   # (search notes its backend first)
    assert line.startswith("stitchtune: error: scatter_add 'dw' sums its table with float atomics"), err
    assert "Traceback" not in err
