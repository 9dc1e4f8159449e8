"""How much of real model graphs stitchtune covers: small transformers models, exported to ONNX or
captured with torch.export, imported, planned and checked in the emulator.

    PYTHONPATH=$PWD python scripts/model_coverage.py [--models bert,gpt2,llama,vit,convnext,resnet]
                                                     [--exporters legacy,dynamo,export] [--json OUT] [--seed 0]

``--models`` also takes ``phi3`` and ``swin`` (not in the default list; ``scripts/kernel_counts.py``
counts them by default). For each model (built from a transformers config with 2 layers and small
hidden sizes (Swin: one stage of two blocks), randomly
initialised, eval mode, CPU; nothing is downloaded) and each exporter (``legacy`` =
``torch.onnx.export(dynamo=False)``, ``dynamo`` = ``dynamo=True``, which needs onnxscript,
``export`` = ``torch.export.export(strict=False)``):

1. export at small shapes (batch 1, sequence 8, 32x32 images), output ``last_hidden_state`` only;
2. import: ONNX with :func:`stitchtune.importers.onnx_import.import_onnx`; torch.export by
   :func:`import_exported` (the fx graph cut into graphs by the torch importer's
   :func:`stitchtune.importers.torch_regions.find_regions`, the one the torch.compile backend uses);
3. plan every imported subgraph with :func:`stitchtune.plan.planner.make_plan`;
4. for every planned subgraph, lower the heuristic schedule and one sampled schedule, run them in the
   emulator and compare with the float64 reference (relative L2 error < 1e-5 for fp32 outputs, 1e-2
   for 16-bit ones). Inputs: the model's own values for constant inputs (weights, folded tables),
   seeded standard-normal values for the others.

Table columns, per model and exporter (counts of ONNX *regions*, i.e. connected groups of
memory-intensive nodes, unless said otherwise):

* ``regions``  -- regions found; ``whole`` -- imported as one graph; ``planned`` -- whole regions whose
  graph was planned; ``correct`` -- planned whole regions whose two schedules both matched the
  reference (so ``planned <= whole <= regions`` and, when all is well, ``correct == planned``);
* ``cut``      -- regions imported as several graphs; ``pieces`` -- ``correct/planned/graphs`` of the
  graphs made from cut regions; ``dropped`` -- regions dropped as no-ops; ``skipped`` -- not imported;
* then the ops that cut regions (counted), the planner's refusals (counted, first words of the
  message) and the compute ops left to the framework (counted).

An exporter or model that fails is a row with its reason, never an exception; exit 0 when the script
ran, 2 (one line on stderr) for bad options.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import logging
import os
import random
import re
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

MODELS = ("bert", "gpt2", "llama", "vit", "convnext", "resnet")
#: models :func:`build_model` also builds (``--models`` accepts them; not in the default list)
MORE_MODELS = ("phi3", "swin")
#: the models that take ``pixel_values`` (the others take ``input_ids`` and ``attention_mask``)
IMAGE_MODELS = ("vit", "convnext", "resnet", "swin")
EXPORTERS = ("legacy", "dynamo", "export")
BATCH, SEQ, IMAGE = 1, 8, 32
MAX_ELEMENTS = 1 << 20   # per subgraph (inputs + outputs); bigger ones are not emulated ("too big")


# ---------------------------------------------------------------------------- models
def build_model(name: str, labels: bool = False) -> tuple[Any, tuple[Any, ...], list[str]]:
    """(module returning last_hidden_state, example args, input names) for ``name``; ``labels``
    (``gpt2`` and ``llama`` only): the causal LM with its head, called with ``labels=input_ids``
    (the first three labels ignored, -100), returning the loss."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    text = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64)
    if name == "bert":
        cfg = tf.BertConfig(vocab_size=100, max_position_embeddings=64, **text)
    elif name == "gpt2":
        cfg = tf.GPT2Config(vocab_size=100, n_positions=64, n_embd=32, n_layer=2, n_head=4, n_inner=64)
    elif name == "llama":
        cfg = tf.LlamaConfig(vocab_size=100, max_position_embeddings=64, num_key_value_heads=2, **text)
    elif name == "vit":
        cfg = tf.ViTConfig(image_size=IMAGE, patch_size=8, num_channels=3, **text)
    elif name == "convnext":
        cfg = tf.ConvNextConfig(num_channels=3, hidden_sizes=[16, 32], depths=[1, 1], num_stages=2,
                                patch_size=4, image_size=IMAGE)
    elif name == "resnet":
        cfg = tf.ResNetConfig(num_channels=3, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                              layer_type="basic")
    elif name == "phi3":   # fused qkv_proj and gate_up_proj, split in the graph
        cfg = tf.Phi3Config(vocab_size=100, max_position_embeddings=64, num_key_value_heads=2, pad_token_id=0,
                            bos_token_id=0, eos_token_id=0, **text)
    elif name == "swin":   # one stage of 8x8 patches, 4x4 windows; its second block shifts its windows
        cfg = tf.SwinConfig(image_size=IMAGE, patch_size=4, num_channels=3, embed_dim=16, depths=[2], num_heads=[2],
                            window_size=4)
    else:
        raise ValueError(name)
    cfg._attn_implementation = "eager"
    if hasattr(cfg, "use_cache"):
        cfg.use_cache = False
    if labels:
        if name not in ("gpt2", "llama"):
            raise ValueError(f"{name}: a labels (causal LM) variant exists for gpt2 and llama only")
        return _with_labels(tf.AutoModelForCausalLM.from_config(cfg).eval())
    model = tf.AutoModel.from_config(cfg).eval()

    class LastHidden(torch.nn.Module):   # inputs by keyword: GPT2Model's 2nd positional is past_key_values
        def __init__(self, m: Any, names: list[str]) -> None:
            super().__init__()
            self.m, self.names = m, names

        def forward(self, *args: Any) -> Any:
            return self.m(**dict(zip(self.names, args)), return_dict=True).last_hidden_state

    g = torch.Generator().manual_seed(0)
    if name in IMAGE_MODELS:
        return LastHidden(model, ["pixel_values"]).eval(), (torch.randn(BATCH, 3, IMAGE, IMAGE, generator=g),), ["pixel_values"]
    ids = torch.randint(0, 100, (BATCH, SEQ), generator=g)
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    names = ["input_ids", "attention_mask"]
    return LastHidden(model, names).eval(), (ids, mask), names


def _with_labels(lm: Any) -> tuple[Any, tuple[Any, ...], list[str]]:
    """(module returning ``lm``'s loss for ``labels``, example args, input names)."""
    import torch

    class Loss(torch.nn.Module):
        def __init__(self, m: Any) -> None:
            super().__init__()
            self.m = m

        def forward(self, input_ids: Any, labels: Any) -> Any:
            return self.m(input_ids=input_ids, labels=labels, return_dict=True).loss

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 100, (BATCH, SEQ), generator=g)
    lab = ids.clone()
    lab[:, :3] = -100
    return Loss(lm).eval(), (ids, lab), ["input_ids", "labels"]


def export(name: str, exporter: str, path: Path) -> None:
    import torch

    module, args, names = build_model(name)
    with warnings.catch_warnings(), _quiet():
        warnings.simplefilter("ignore")
        if exporter == "legacy":
            torch.onnx.export(module, args, str(path), dynamo=False, input_names=names,
                              output_names=["last_hidden_state"])
        else:
            import onnxscript  # noqa: F401  (the dynamo exporter needs it; fail early with its reason)

            prog = torch.onnx.export(module, args, dynamo=True, input_names=names,
                                     output_names=["last_hidden_state"], external_data=False)
            prog.save(str(path))


class _quiet:
    """Silence the exporters' prints (the dynamo exporter writes progress to stdout)."""

    def __enter__(self) -> None:
        self._out, self._err = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = io.StringIO(), io.StringIO()

    def __exit__(self, *exc: Any) -> None:
        sys.stdout, sys.stderr = self._out, self._err


def _reason(e: BaseException) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", f"{type(e).__name__}: {e}" if str(e).strip() else type(e).__name__)
    return text.strip().splitlines()[0][:160]


def _counted(items: list[str]) -> str:
    return ", ".join(f"{k} x{n}" if n > 1 else k for k, n in sorted(Counter(items).items(), key=lambda kv: (-kv[1], kv[0])))


# ---------------------------------------------------------------------------- torch.export
_ATEN_COMPUTE = {"linear": "Gemm", "matmul": "MatMul", "mm": "MatMul", "bmm": "MatMul", "addmm": "Gemm",
                 "baddbmm": "MatMul", "convolution": "Conv", "conv2d": "Conv", "conv1d": "Conv",
                 "scaled_dot_product_attention": "Attention", "max_pool2d": "MaxPool",
                 "max_pool2d_with_indices": "MaxPool", "avg_pool2d": "AveragePool"}
_ATEN_HEAVY = ("sum", "mean", "amax", "amin", "max", "min", "softmax", "norm", "var", "std")


class _FxNode:
    """An fx node seen through the ONNX partitioner's eyes: ``input``/``output`` tensor names, an
    ``op_type`` (aten compute ops get the ONNX compute op names), a ``name``."""

    def __init__(self, n: Any, tensors: set[str]) -> None:
        self.fx = n
        self.input = [a.name for a in n.all_input_nodes if a.name in tensors]
        self.output = [n.name]
        key = str(n.target).split(".")[1] if str(n.target).startswith("aten.") else getattr(n.target, "__name__", str(n.target))
        self.op_type = _ATEN_COMPUTE.get(key, key)
        self.name = n.name


class TorchExportImport:
    """What :func:`import_exported` found: the same fields the table reads off an ``OnnxImport``."""

    def __init__(self, subgraphs: list[Any], regions: tuple[Any, ...], compute_ops: tuple[str, ...]) -> None:
        self.subgraphs, self.regions, self.compute_ops = subgraphs, regions, compute_ops


class _Sub:
    def __init__(self, graph: Any, constants: tuple[tuple[str, Any], ...] = ()) -> None:
        self.graph, self.constants = graph, constants


def _state_values(ep: Any) -> dict[str, Any]:
    """Placeholder name -> value (numpy) of the exported program's parameters, buffers and constants."""
    from torch.export.graph_signature import InputKind

    out = {}
    for s in ep.graph_signature.input_specs:
        if s.kind != InputKind.USER_INPUT and s.target is not None:
            t = ep.state_dict.get(s.target, ep.constants.get(s.target))
            if t is not None:
                out[s.arg.name] = t.detach().float().numpy()
    return out


def _region_sub(region: Any, values: dict[str, Any]) -> _Sub:
    """A region's graph with the model's own values for its parameter and buffer inputs (a batch
    norm's running variance must not be a standard-normal draw)."""
    consts = tuple((name, values[n.name]) for (name, _), n in zip(region.graph.inputs, region.inputs)
                   if n.name in values)
    return _Sub(region.graph, consts)


def _aten_key(target: Any) -> str:
    return ".".join(str(target).split(".")[:2])


def _fx_partition(nodes: list[_FxNode], groups: list[list[int]]) -> Any:
    """The ONNX partitioner's :class:`Partition` of ``groups`` (the torch regions), for its region count."""
    from stitchtune.importers.onnx_partition import Partition

    producer = {t: i for i, nd in enumerate(nodes) for t in nd.output}
    consumers: dict[str, set[int]] = {}
    for i, nd in enumerate(nodes):
        for t in nd.input:
            consumers.setdefault(t, set()).add(i)
    succ = {i: {c for t in nd.output for c in consumers.get(t, ())} for i, nd in enumerate(nodes)}
    return Partition(groups=groups, consumers=consumers, producer=producer, succ=succ, cores=[set(g) for g in groups])


def _buffers(ep: Any) -> dict[str, Any]:
    """Placeholder name -> value of the exported program's buffers and lifted constants (constant
    model state, as ONNX initializers are)."""
    sig = ep.graph_signature
    names = {**sig.inputs_to_buffers, **sig.inputs_to_lifted_tensor_constants}
    state = {**ep.state_dict, **ep.constants}
    return {ph: state[fqn] for ph, fqn in names.items() if fqn in state}


def import_exported(model: str) -> TorchExportImport:
    """``torch.export`` the model (non-strict, eval, the example inputs) and cut its fx graph into
    stitchtune graphs with the torch importer's :func:`stitchtune.importers.torch_regions.find_regions`
    (no planner check there: the table plans every graph itself). Regions are counted as for ONNX:
    connected groups of memory-intensive fx nodes, cheap nodes of the model inputs counted in every
    region that reads them."""
    import torch

    from stitchtune.importers.onnx_partition import COMPUTE_OPS, label, regions
    from stitchtune.importers.torch_regions import find_regions

    module, args, _ = build_model(model)
    with warnings.catch_warnings(), _quiet():
        warnings.simplefilter("ignore")
        ep = torch.export.export(module, args, strict=False)
    gm = ep.graph_module
    split = find_regions(gm, accept=None, prefix=model, constants=_buffers(ep))
    fx = list(gm.graph.nodes)
    tensors = {n.name for n in fx if isinstance(n.meta.get("val"), torch.Tensor)}
    nodes = [_FxNode(n, tensors) for n in fx if n.op == "call_function" and n.name in tensors]
    index = {nd.name: i for i, nd in enumerate(nodes)}
    folded = {n.name for n in split.constants}
    for nd in nodes:   # nodes of constants only (arange, zeros, ...) are constants, as folded in ONNX
        if nd.name in folded or all(t in index and nodes[index[t]].op_type == "Constant" for t in nd.input):
            nd.op_type = "Constant"
    groups = [sorted(index[n.name] for n in (*r.nodes, *r.pulled) if n.name in index) for r in split.regions]
    in_region = set().union(*groups) if groups else set()
    declined = {d.what.removeprefix("op "): d.reason for d in split.declined if d.what.startswith("op ")}
    # free views/no-ops at region boundaries and groups dropped as no-ops are not cuts
    free = {n.name for n in split.free} | {n.name for g in split.dropped for n in g}
    reasons: dict[int, str | None] = {}
    for i, nd in enumerate(nodes):
        if nd.op_type == "Constant" or nd.op_type in COMPUTE_OPS:
            reasons[i] = "constant" if nd.op_type == "Constant" else "compute op, left to the framework"
        elif nd.name in free:
            reasons[i] = None
        elif i not in in_region:
            reasons[i] = declined.get(_aten_key(nd.fx.target), "not in a region (only views and casts, or declined)")
        else:
            reasons[i] = None
    placeholders = {n.name for n in fx if n.op == "placeholder"}
    pre: set[int] = set()
    for i, nd in enumerate(nodes):
        if nd.op_type not in COMPUTE_OPS and nd.op_type != "Constant" and nd.input \
                and not any(w in nd.op_type for w in _ATEN_HEAVY) \
                and all(t in placeholders or nodes[index[t]].op_type == "Constant" or index[t] in pre for t in nd.input):
            pre.add(i)
    found = regions(nodes, set(range(len(nodes))), reasons, _fx_partition(nodes, groups),
                    [r.name for r in split.regions], frozenset(pre))
    found = tuple(dataclasses.replace(r, status="dropped") if r.status == "skipped" and not r.stopped_by else r
                  for r in found)   # only free views and dropped no-ops: nothing to stitch
    compute = tuple(label(i, nd) for i, nd in enumerate(nodes) if nd.op_type in COMPUTE_OPS)
    values = _state_values(ep)
    return TorchExportImport([_region_sub(r, values) for r in split.regions], found, compute)


# ---------------------------------------------------------------------------- checks
def check_subgraph(sg: Any, device: Any, seed: int) -> dict[str, Any]:
    """Plan ``sg``'s graph and emulate its heuristic schedule and one sampled schedule."""
    from stitchtune.cost.heuristic import heuristic_schedule
    from stitchtune.emulate.emulator import emulate_program
    from stitchtune.errors import UnsupportedGraphError
    from stitchtune.graph.reference import random_inputs, run_reference
    from stitchtune.lower.entry import lower
    from stitchtune.plan.planner import make_plan
    from stitchtune.space import SearchSpace

    g = sg.graph
    res: dict[str, Any] = {"graph": g.name, "planned": False, "correct": False}
    try:
        plan = make_plan(g)
    except UnsupportedGraphError as e:
        res["unplanned"] = str(e).splitlines()[0] if str(e) else "UnsupportedGraphError"
        return res
    except Exception as e:   # a crash of the planner is a finding, not the end of the run
        res["unplanned"] = f"planner crashed: {_reason(e)}"
        return res
    res["planned"] = True
    size = sum(int(np.prod(g.spec(n).shape)) for n, _ in g.inputs) + sum(int(np.prod(g.spec(o).shape)) for o in g.outputs)
    if size > MAX_ELEMENTS:
        res["error"] = f"too big for the emulator ({size} elements)"
        return res
    try:
        space = SearchSpace.for_plan(plan, device)
        inputs = random_inputs(g, seed)
        for cname, arr in sg.constants:
            if cname in inputs:
                inputs[cname] = np.asarray(arr).reshape(inputs[cname].shape).astype(inputs[cname].dtype)
        ref = run_reference(g, inputs)
        tol = 1e-5 if all(g.spec(o).dtype == "float32" for o in g.outputs) else 1e-2
        errs = {}
        for label, sched in (("heuristic", heuristic_schedule(plan, device, space)),
                             ("sampled", space.sample(random.Random(seed)))):
            out = emulate_program(lower(g, plan, sched, device, space), inputs, coresident_limit=lambda k: 1 << 30)
            errs[label] = max(_rel_err(out[o], ref[o]) for o in ref)
        res["errors"] = errs
        res["correct"] = all(e < tol for e in errs.values())
        if not res["correct"]:
            res["error"] = "wrong result: " + ", ".join(f"{k} {v:.2e}" for k, v in errs.items())
    except Exception as e:
        res["error"] = _reason(e)
    return res


def _rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    r = np.asarray(ref, dtype=np.float64)
    x = np.asarray(out, dtype=np.float64).reshape(r.shape)
    if not np.all(np.isfinite(x)) and not np.array_equal(np.isfinite(x), np.isfinite(r)):
        return float("inf")
    fin = np.isfinite(r)
    if not np.array_equal(x[~fin], r[~fin]):
        return float("inf")
    return float(np.linalg.norm(x[fin] - r[fin]) / max(np.linalg.norm(r[fin]), 1e-30))


def cover(model: str, exporter: str, seed: int = 0, device_name: str = "H200") -> dict[str, Any]:
    """One row of the table (a dict; see the module docstring). Never raises for a model's failure."""
    from stitchtune.importers.onnx_import import import_onnx

    row: dict[str, Any] = {"model": model, "exporter": exporter}
    t0 = time.perf_counter()
    if exporter == "export":
        try:
            result = import_exported(model)
        except Exception as e:
            row.update(status="import failed", reason=_reason(e), seconds=round(time.perf_counter() - t0, 1))
            return row
        return _tally(row, result, seed, device_name, t0)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{model}.onnx"
        try:
            export(model, exporter, path)
        except Exception as e:
            row.update(status="export failed", reason=_reason(e), seconds=round(time.perf_counter() - t0, 1))
            return row
        row["export_s"] = round(time.perf_counter() - t0, 1)
        try:
            result = import_onnx(path, name=model)
        except Exception as e:
            row.update(status="import failed", reason=_reason(e), seconds=round(time.perf_counter() - t0, 1))
            return row
    return _tally(row, result, seed, device_name, t0)


def _tally(row: dict[str, Any], result: Any, seed: int, device_name: str, t0: float) -> dict[str, Any]:
    """Check every subgraph of ``result`` (an ``OnnxImport`` or :class:`TorchExportImport`) and fill ``row``."""
    from stitchtune.hardware.device import get_device

    device = get_device(device_name)
    checks = {sg.graph.name: (sg, check_subgraph(sg, device, seed)) for sg in result.subgraphs}
    by = Counter(r.status for r in result.regions)
    whole = [r for r in result.regions if r.status == "whole"]
    cut = [r for r in result.regions if r.status == "cut"]
    whole_checks = [checks[n][1] for r in whole for n in r.subgraphs if n in checks]
    piece_checks = [checks[n][1] for n in dict.fromkeys(n for r in cut for n in r.subgraphs) if n in checks]
    cut_ops = [b.split(":")[1] for r in cut for b in r.stopped_by]
    row.update(
        status="ran",
        regions=len(result.regions), whole=by["whole"],
        planned=sum(1 for r in whole if r.subgraphs and all(checks[n][1]["planned"] for n in r.subgraphs)),
        correct=sum(1 for r in whole if r.subgraphs and all(checks[n][1]["correct"] for n in r.subgraphs)),
        cut=by["cut"], dropped=by["dropped"], skipped=by["skipped"],
        pieces={"graphs": len(piece_checks), "planned": sum(c["planned"] for c in piece_checks),
                "correct": sum(c["correct"] for c in piece_checks)},
        cut_by=dict(Counter(cut_ops)),
        skipped_by=dict(Counter(b.split(":")[1] for r in result.regions if r.status == "skipped" for b in r.stopped_by)),
        cut_regions=[{"nodes": f"{r.nodes[0].split(':')[0]}..{r.nodes[-1].split(':')[0]}",
                      "stopped_by": list(r.stopped_by)} for r in cut],
        unplanned=dict(Counter(c["unplanned"] for _, c in checks.values() if "unplanned" in c)),
        wrong=[{"graph": c["graph"], "error": c["error"]} for _, c in checks.values() if c.get("error")],
        compute_ops=dict(Counter(c.split(":")[1] for c in result.compute_ops)),
        subgraphs=[c for _, c in checks.values()],
    )
    row["whole_subgraphs"] = len(whole_checks)
    row["seconds"] = round(time.perf_counter() - t0, 1)
    return row


# ---------------------------------------------------------------------------- table
def table_lines(rows: list[dict[str, Any]]) -> list[str]:
    head = f"{'model':<9} {'exporter':<8} {'regions':>7} {'whole':>5} {'planned':>7} {'correct':>7} {'cut':>4} " \
           f"{'pieces c/p/n':>12} {'dropped':>7} {'skipped':>7} {'secs':>5}"
    lines = [head, "-" * len(head)]
    tot: Counter = Counter()
    for r in rows:
        if r["status"] != "ran":
            lines.append(f"{r['model']:<9} {r['exporter']:<8} {r['status']}: {r['reason']}")
            continue
        p = r["pieces"]
        lines.append(f"{r['model']:<9} {r['exporter']:<8} {r['regions']:>7} {r['whole']:>5} {r['planned']:>7} "
                     f"{r['correct']:>7} {r['cut']:>4} {p['correct']:>4}/{p['planned']}/{p['graphs']:<4} "
                     f"{r['dropped']:>7} {r['skipped']:>7} {r['seconds']:>5}")
        if r["cut_by"]:
            lines.append(f"{'':<19}cut by: {_counted([k for k, n in r['cut_by'].items() for _ in range(n)])}")
        if r["skipped_by"]:
            lines.append(f"{'':<19}not imported (stopped by): {_counted([k for k, n in r['skipped_by'].items() for _ in range(n)])}")
        if r["unplanned"]:
            lines.append(f"{'':<19}not planned: " + "; ".join(f"{k} (x{n})" for k, n in r["unplanned"].items()))
        for w in r["wrong"]:
            lines.append(f"{'':<19}FAILED {w['graph']}: {w['error']}")
        lines.append(f"{'':<19}compute ops: {_counted([k for k, n in r['compute_ops'].items() for _ in range(n)]) or 'none'}")
        for k in ("regions", "whole", "planned", "correct", "cut", "dropped", "skipped"):
            tot[k] += r[k]
        for k in ("correct", "planned", "graphs"):
            tot["p_" + k] += p[k]
        tot["ran"] += 1
    failed = sum(1 for r in rows if r["status"] != "ran")
    lines.append("-" * len(head))
    lines.append(f"{'total':<9} {str(tot['ran']) + ' ran':<8} {tot['regions']:>7} {tot['whole']:>5} {tot['planned']:>7} "
                 f"{tot['correct']:>7} {tot['cut']:>4} {tot['p_correct']:>4}/{tot['p_planned']}/{tot['p_graphs']:<4} "
                 f"{tot['dropped']:>7} {tot['skipped']:>7}   ({failed} failed to export/import)")
    return lines


def _parse_list(text: str, allowed: tuple[str, ...], what: str) -> list[str]:
    items = [t.strip().lower() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in allowed]
    if bad or not items:
        raise ValueError(f"--{what} {text!a}: expected a comma-separated subset of {','.join(allowed)}")
    return list(dict.fromkeys(items))


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:   # one line, exit 2
        print(f"model_coverage: {message}", file=sys.stderr)
        sys.exit(2)


def main(argv: list[str] | None = None) -> int:
    ap = _Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--exporters", default=",".join(EXPORTERS))
    ap.add_argument("--json", type=Path, default=None, help="write the rows as JSON to this path")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    try:
        models = _parse_list(a.models, MODELS + MORE_MODELS, "models")
        exporters = _parse_list(a.exporters, EXPORTERS, "exporters")
    except ValueError as e:
        print(f"model_coverage: {e}", file=sys.stderr)
        return 2
    logging.disable(logging.WARNING)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    t0 = time.perf_counter()
    rows = []
    for m in models:
        for x in exporters:
            try:
                rows.append(cover(m, x, a.seed))
            except Exception as e:   # a bug of this script or the library: still a row
                rows.append({"model": m, "exporter": x, "status": "crashed", "reason": _reason(e),
                             "traceback": traceback.format_exc()})
    for line in table_lines(rows):
        print(line)
    print(f"runtime: {time.perf_counter() - t0:.1f} s")
    if a.json:
        try:
            a.json.write_text(json.dumps({"seed": a.seed, "rows": rows}, indent=1, default=str) + "\n")
        except OSError as e:
            print(f"model_coverage: cannot write {a.json}: {e.strerror or e}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
