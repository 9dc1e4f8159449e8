"""What ``torch.compile(model, backend="stitchtune", dynamic=...)`` builds over many sequence lengths.

    PYTHONPATH=$PWD python scripts/dynamic_shapes.py [--models bert,gpt2,llama,qwen2,phi3] [--lengths 100]
                                                     [--max-len 2048] [--batches 1] [--dynamic true|auto]
                                                     [--cpu emulate|reference] [--seed 0] [--json OUT]

Tiny BERT, GPT-2, Llama, Qwen2 and Phi-3 base models (transformers configs: 1 layer, hidden 32, 2 heads,
random weights, nothing downloaded; eval mode, under no_grad) are compiled with the stitchtune backend
(no tuning database: heuristic schedules; ``fallback="eager"`` for the rest of the graph) and called at
``--lengths`` distinct sequence lengths spread over 1..``--max-len`` (both ends included, the rest
drawn at random with ``--seed``), each with a batch size drawn from ``--batches`` (``1``, ``1-4`` or
``1,2,4``; the first length takes the smallest, the last the largest). ``--dynamic true`` compiles with ``dynamic=True``;
``auto`` leaves it unset (dynamo's automatic dynamic: the first length static, a recompile marks the
changed dimension dynamic). Per model the script prints, all measured on this machine's CPU (the
regions run in the emulator, ``--cpu emulate``, or the float64 reference):

* ``regions``: stitched regions over every compiled graph (``explain``'s count);
* ``specialised``: graphs compiled for one shape (calls of stitchtune.deploy.compiled.compile,
  counted by wrapping it; a bucket's generic kernel is compiled by
  ``stitchtune.deploy.dynamic.compile_dynamic`` instead); ``workloads``: distinct workload keys
  among them;
* ``selections``, ``builds``, ``hits``, ``eager``: schedule selections, kernels made (programs on
  CPU, nvcc builds on a GPU), region calls that found their kernel in the cache and calls that ran
  the ATen ops, from ``stitchtune.torch.stats()`` (where this checkout has it);
  ``builds_per_region``: each region's builds (``region:builds``, symbolic regions);
* ``recompiles``: graphs dynamo compiled (``torch._dynamo`` counters, ``stats.unique_graphs``);
* ``max_builds``: the most kernels one region built; ``over_8``: the regions that built more than 8
  (the done-when of issue 41: none, and no eager call);
* ``max_diff``: the largest |compiled - eager| of ``last_hidden_state`` over every length;
* ``seconds``: wall time of the calls (compiling included).

Exit 0 when it ran (a model that fails is a row with its reason), 2 (one line on stderr) for bad options.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import time
import warnings
from collections.abc import Sequence
from typing import Any

MODELS = ("bert", "gpt2", "llama", "qwen2", "phi3")


def _model(name: str, max_len: int) -> Any:
    import transformers as tf

    common = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=64,
                  max_position_embeddings=max_len)
    if name == "bert":
        return tf.BertModel(tf.BertConfig(**common))
    if name == "gpt2":
        return tf.GPT2Model(tf.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=max_len))
    if name == "qwen2":
        return tf.Qwen2Model(tf.Qwen2Config(num_key_value_heads=2, **common))
    if name == "phi3":
        return tf.Phi3Model(tf.Phi3Config(num_key_value_heads=2, pad_token_id=0, **common))
    return tf.LlamaModel(tf.LlamaConfig(num_key_value_heads=2, **common))


def batches(spec: str) -> list[int]:
    """``1``, ``1-4`` or ``1,2,4`` -> the batch sizes (ValueError for anything else)."""
    if "-" in spec:
        lo, hi = (int(x) for x in spec.split("-"))
        out = list(range(lo, hi + 1))
    else:
        out = [int(x) for x in spec.split(",") if x]
    if not out or min(out) < 1:
        raise ValueError(spec)
    return out


def shapes(lens: Sequence[int], sizes: Sequence[int], seed: int) -> list[tuple[int, int]]:
    """(batch, length) per length: the first the smallest batch, the last the largest, the rest drawn."""
    rnd = random.Random(seed + 1)
    out = [(rnd.choice(list(sizes)), n) for n in lens]
    if out:
        out[0] = (min(sizes), out[0][1])
        out[-1] = (max(sizes), out[-1][1])
    return out


def lengths(n: int, max_len: int, seed: int) -> list[int]:
    """``n`` distinct lengths in 1..max_len: both ends, the rest drawn with ``seed``, in drawn order."""
    rest = random.Random(seed).sample(range(2, max_len), max(0, min(n, max_len) - 2))
    return ([1] + rest + [max_len])[: min(n, max_len)]


def run_model(name: str, calls: Sequence[tuple[int, int]], dynamic: str, cpu: str) -> dict[str, Any]:
    import torch

    import stitchtune.deploy.compiled as compiled_mod
    import stitchtune.torch as st_torch
    from stitchtune.deploy import torch_backend

    torch.manual_seed(0)
    model = _model(name, max(n for _, n in calls)).eval()
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch_backend.LAST_REPORTS.clear()
    reset = getattr(st_torch, "reset_stats", None)
    if reset is not None:
        reset()
    workloads: list[str] = []
    real = compiled_mod.compile

    def counted(graph: Any, *a: Any, **k: Any) -> Any:
        workloads.append(graph.workload_key() if hasattr(graph, "workload_key") else repr(graph))
        return real(graph, *a, **k)

    compiled_mod.compile = counted
    kw: dict[str, Any] = {"backend": "stitchtune", "options": {"db": None, "fallback": "eager", "cpu": cpu}}
    if dynamic == "true":
        kw["dynamic"] = True
    c = torch.compile(model, **kw)
    diff = 0.0
    t0 = time.perf_counter()
    try:
        with torch.no_grad():
            for b, n in calls:
                ids = torch.randint(0, 64, (b, n))
                got = c(ids).last_hidden_state
                want = model(ids).last_hidden_state
                diff = max(diff, (got - want).abs().max().item())
    finally:
        compiled_mod.compile = real
    secs = time.perf_counter() - t0
    row: dict[str, Any] = {
        "model": name, "lengths": len(calls), "batches": sorted({b for b, _ in calls}), "dynamic": dynamic, "cpu": cpu,
        "regions": sum(len(r.stitched) for r in torch_backend.LAST_REPORTS),
        "specialised": len(workloads), "workloads": len(set(workloads)),
        "recompiles": int(torch._dynamo.utils.counters["stats"]["unique_graphs"]),
        "max_diff": diff, "seconds": round(secs, 1)}
    stats = getattr(st_torch, "stats", None)
    if stats is not None:
        s = stats()
        row.update(selections=s.selections, builds=s.builds, hits=s.hits, eager=s.eager,
                   max_builds=max((r.builds for r in s.regions), default=0),
                   over_8=sum(1 for r in s.regions if r.builds > 8),
                   builds_per_region=" ".join(f"{r.region}:{r.builds}" for r in s.regions if r.dynamic))
    return row


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--lengths", type=int, default=100)
    p.add_argument("--max-len", type=int, default=2048)
    p.add_argument("--batches", default="1")
    p.add_argument("--dynamic", choices=("true", "auto"), default="true")
    p.add_argument("--cpu", choices=("emulate", "reference"), default="emulate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json")
    try:
        a = p.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    models = [m for m in a.models.split(",") if m]
    bad = [m for m in models if m not in MODELS]
    if bad or not models:
        print(f"dynamic_shapes: unknown model(s) {', '.join(bad) or '(none)'} (models: {', '.join(MODELS)})",
              file=sys.stderr)
        return 2
    if a.lengths < 1 or a.max_len < 2:
        print("dynamic_shapes: --lengths must be >= 1 and --max-len >= 2", file=sys.stderr)
        return 2
    try:
        sizes = batches(a.batches)
    except ValueError:
        print(f"dynamic_shapes: --batches must be like 1, 1-4 or 1,2,4 (got {a.batches!r})", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.ERROR)
    warnings.filterwarnings("ignore")
    calls = shapes(lengths(a.lengths, a.max_len, a.seed), sizes, a.seed)
    rows = []
    for m in models:
        try:
            rows.append(run_model(m, calls, a.dynamic, a.cpu))
        except Exception as exc:  # noqa: BLE001 - a failing model is a row
            rows.append({"model": m, "error": f"{type(exc).__name__}: {exc}"[:300]})
        print(json.dumps(rows[-1]), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
