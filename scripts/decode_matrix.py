"""Greedy decoding with a KV cache through ``torch.compile(model, backend="stitchtune", dynamic=True)``.

    PYTHONPATH=$PWD python scripts/decode_matrix.py [--models gpt2,llama,qwen2,phi3,mistral] [--steps 32]
                                                    [--prompt 7] [--cache dynamic|static] [--cpu emulate|reference]
                                                    [--declined N] [--json OUT]

Each model is a tiny transformers config (2 layers, hidden 64, 4 heads, random weights, nothing
downloaded; eval mode, no_grad). A ``--prompt``-token prompt, then ``--steps`` greedy steps feeding
one token at a time with the model's cache (``DynamicCache``, or ``StaticCache`` with ``--cache
static``), through the compiled model and through the eager one. Per model the script prints one JSON
row, measured on this machine's CPU (the regions run in the emulator by default):

* ``tokens_equal``: the compiled model's tokens equal eager's;
* ``graphs``: graphs dynamo compiled (``torch._dynamo`` counters ``stats.unique_graphs``);
* ``stitched`` / ``declined``: regions stitched and things declined over every compiled graph
  (:data:`stitchtune.deploy.torch_backend.LAST_REPORTS`, what ``explain`` lists); ``reasons``: the
  first ``--declined`` declines (``what: reason``);
* ``builds``, ``eager``: kernels made and region calls that ran the ATen ops
  (``stitchtune.torch.stats()``); ``max_builds``: the most kernels one region built;
* ``left_out``: the memory-intensive ops left out of every region, ``{"op (reason)": count}`` over every
  compiled graph (views and compute-intensive ops are not listed: they stay outside by design; a
  declined region counts each of its ops; :func:`left_out`), and ``left_out_ops``: their total;
* ``seconds``: wall time of the compiled calls (compiling included).

Exit 0 when it ran (a model that fails is a row with its reason), 2 (one line on stderr) for bad options.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import warnings
from collections.abc import Sequence
from typing import Any

MODELS = ("gpt2", "llama", "qwen2", "phi3", "mistral")
VOCAB = 128


def make_model(name: str, max_len: int = 256) -> Any:
    """A tiny causal LM of family ``name`` (2 layers, hidden 64, 4 heads, random weights)."""
    import transformers as tf

    if name == "gpt2":
        cfg: Any = tf.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=max_len)
        return tf.GPT2LMHeadModel(cfg)
    common = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                  vocab_size=VOCAB, max_position_embeddings=max_len)
    if name == "llama":
        return tf.LlamaForCausalLM(tf.LlamaConfig(num_key_value_heads=2, **common))
    if name == "qwen2":
        return tf.Qwen2ForCausalLM(tf.Qwen2Config(num_key_value_heads=2, **common))
    if name == "phi3":
        return tf.Phi3ForCausalLM(tf.Phi3Config(num_key_value_heads=4, pad_token_id=0, **common))
    if name == "mistral":
        return tf.MistralForCausalLM(tf.MistralConfig(num_key_value_heads=2, sliding_window=None, **common))
    raise ValueError(f"unknown model {name!r}")


def _cache(model: Any, kind: str, max_len: int) -> Any:
    import transformers as tf

    if kind == "static":
        return tf.StaticCache(config=model.config, max_cache_len=max_len)
    return tf.DynamicCache()


def greedy(model: Any, prompt: Any, steps: int, cache_kind: str, max_len: int) -> list[int]:
    """The prompt's next token, then ``steps`` more, feeding one token at a time with a cache."""
    import torch

    cache = _cache(model, cache_kind, max_len)
    ids, pos, out = prompt, 0, []
    for _ in range(steps + 1):
        n = ids.shape[1]
        kw: dict[str, Any] = {"past_key_values": cache, "use_cache": True}
        if cache_kind == "static":
            kw["cache_position"] = torch.arange(pos, pos + n)
        logits = model(input_ids=ids, **kw).logits
        tok = int(logits[0, -1].argmax())
        out.append(tok)
        pos += n
        ids = torch.tensor([[tok]])
    return out


#: declines that are not memory-intensive work left out: views (PyTorch applies them for free) and
#: compute-intensive ops (Inductor's); everything else is an op that should be in a region
_EXPECTED = ("compute-intensive op",)


def left_out(declined: Sequence[Any]) -> dict[str, int]:
    """``{"op (reason)": count}`` of the memory-intensive ops in ``declined`` (``DeclinedInfo`` rows):
    an ``op X`` row unless X is a view (:data:`stitchtune.importers.torch_subgraph.VIEW_OPS`) or a
    compute-intensive op; a ``region R (op, op, ...)`` row counts each of its ops but the views; the
    reason is cut after its first clause (and at 90 characters)."""
    from stitchtune.importers.torch_subgraph import VIEW_OPS

    out: dict[str, int] = {}
    for d in declined:
        if d.reason.startswith(_EXPECTED):
            continue
        why = d.reason.split(";")[0]
        why = why if len(why) <= 90 else why[:87] + "..."
        if d.what.startswith("op "):
            ops = [d.what[3:]]
        elif d.what.startswith("region ") and "(" in d.what:
            ops = [o.strip() for o in d.what[d.what.index("(") + 1:-1].split(",")]
        else:
            ops = [d.what]
        for op in ops:
            if op not in VIEW_OPS:
                key = f"{op} ({why})"
                out[key] = out.get(key, 0) + d.count
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def run_model(name: str, steps: int, prompt_len: int, cache_kind: str, cpu: str, shown: int) -> dict[str, Any]:
    import torch

    import stitchtune.torch as st_torch
    from stitchtune.deploy import torch_backend

    torch.manual_seed(0)
    max_len = prompt_len + steps + 8
    model = make_model(name).eval()
    prompt = torch.randint(0, VOCAB, (1, prompt_len), generator=torch.Generator().manual_seed(1))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch_backend.LAST_REPORTS.clear()
    st_torch.reset_stats()
    c = torch.compile(model, backend="stitchtune", dynamic=True,
                      options={"db": None, "fallback": "eager", "cpu": cpu})
    with torch.no_grad():
        want = greedy(model, prompt, steps, cache_kind, max_len)
        t0 = time.perf_counter()
        got = greedy(c, prompt, steps, cache_kind, max_len)
        secs = time.perf_counter() - t0
    reports = list(torch_backend.LAST_REPORTS)
    declined = [d for r in reports for d in r.declined]
    s = st_torch.stats()
    lo = left_out(declined)
    return {"model": name, "cache": cache_kind, "steps": steps, "tokens_equal": got == want,
            "graphs": int(torch._dynamo.utils.counters["stats"]["unique_graphs"]),
            "stitched": sum(len(r.stitched) for r in reports), "declined": sum(d.count for d in declined),
            "builds": s.builds, "eager": s.eager, "max_builds": max((r.builds for r in s.regions), default=0),
            "left_out_ops": sum(lo.values()), "left_out": lo, "seconds": round(secs, 1),
            "reasons": [f"{d.what}{f' x{d.count}' if d.count > 1 else ''}: {d.reason}"[:240] for d in declined[:shown]]}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--prompt", type=int, default=7)
    p.add_argument("--cache", choices=("dynamic", "static"), default="dynamic")
    p.add_argument("--cpu", choices=("emulate", "reference"), default="emulate")
    p.add_argument("--declined", type=int, default=20)
    p.add_argument("--json")
    try:
        a = p.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    models = [m for m in a.models.split(",") if m]
    bad = [m for m in models if m not in MODELS]
    if bad or not models or a.steps < 0 or a.prompt < 1:
        print(f"decode_matrix: bad options (models: {', '.join(MODELS)}; --steps >= 0, --prompt >= 1)",
              file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.ERROR)
    warnings.filterwarnings("ignore")
    rows = []
    for m in models:
        try:
            rows.append(run_model(m, a.steps, a.prompt, a.cache, a.cpu, a.declined))
        except Exception as exc:  # noqa: BLE001 - a failing model is a row
            rows.append({"model": m, "error": f"{type(exc).__name__}: {exc}"[:300]})
        print(json.dumps(rows[-1], indent=None), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
