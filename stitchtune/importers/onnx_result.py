"""ONNX import results: the subgraphs and regions of one model, written to a folder or summarised.

Contract
--------
* :class:`OnnxSubgraph` (a validated graph, the ONNX nodes it holds, its tensor names and weights)
  and :class:`OnnxImport` (what :func:`~stitchtune.importers.onnx_import.import_onnx` returns).
* :func:`write_subgraphs(result, out_dir)` writes ``<name>.json`` (+ ``<name>.constants.npz``) per
  subgraph and ``manifest.json``, each through a temporary name; a file system error is an
  :class:`~stitchtune.importers.builder.ImportError_` naming the path.
* :func:`summary_lines(result)`: the CLI's summary (regions found / whole / cut by which ops /
  dropped / skipped, folding, compute ops left to the framework).
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from stitchtune.graph.npz import save_npz
from stitchtune.graph.parse import Graph
from stitchtune.importers.builder import ImportError_
from stitchtune.importers.onnx_fold import FoldReport
from stitchtune.importers.onnx_partition import OnnxRegion

__all__ = ["OnnxImport", "OnnxSubgraph", "summary_lines", "write_subgraphs"]


@dataclass(frozen=True)
class OnnxSubgraph:
    """One memory-intensive subgraph of the model, as a validated graph."""

    graph: Graph
    onnx_nodes: tuple[str, ...]                     # "index:op:name" of each ONNX node in it
    tensor_names: tuple[tuple[str, str], ...]       # (graph input/output name, ONNX tensor name)
    constants: tuple[tuple[str, np.ndarray], ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class OnnxImport:
    subgraphs: tuple[OnnxSubgraph, ...]
    boundaries: tuple[str, ...]   # "index:op:name: reason" for each node left out
    regions: tuple[OnnxRegion, ...] = ()
    dropped: tuple[str, ...] = ()      # no-op groups dropped: their nodes' labels, comma-separated
    compute_ops: tuple[str, ...] = ()  # "index:op:name" of the compute ops left to the framework
    fold: FoldReport = field(default_factory=lambda: FoldReport((), ()))


def _write_bytes(f: IO[bytes], data: bytes) -> None:
    f.write(data)


def _write_atomic(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_subgraphs(result: OnnxImport, out_dir: str | Path) -> list[Path]:
    """Write ``<name>.json`` (+ ``<name>.constants.npz`` when it has weights) per subgraph and
    ``manifest.json`` (subgraphs, boundaries, regions, dropped no-op groups, folded nodes, compute
    ops), each file through a temporary name; returns the graph.json paths. A file system error is
    an :class:`ImportError_` naming the path."""
    out = Path(out_dir)
    paths, manifest = [], []
    try:
        out.mkdir(parents=True, exist_ok=True)
        for sg in result.subgraphs:
            p = out / f"{sg.graph.name}.json"
            text = (json.dumps(sg.graph.to_dict(), indent=1) + "\n").encode()
            _write_atomic(p, functools.partial(_write_bytes, data=text))
            entry: dict[str, Any] = {"graph": p.name, "onnx_nodes": list(sg.onnx_nodes),
                                     "onnx_tensors": dict(sg.tensor_names)}
            if sg.constants:
                cp = out / f"{sg.graph.name}.constants.npz"
                arrays = dict(sg.constants)   # bfloat16 comes back as |V2; `stitchtune run` reads it
                _write_atomic(cp, functools.partial(save_npz, arrays=arrays))
                entry["constants"] = cp.name
            manifest.append(entry)
            paths.append(p)
        doc = {"subgraphs": manifest, "boundaries": list(result.boundaries),
               "regions": [{"nodes": list(r.nodes), "status": r.status, "subgraphs": list(r.subgraphs),
                            "stopped_by": list(r.stopped_by)} for r in result.regions],
               "dropped_noop_groups": list(result.dropped), "folded": list(result.fold.folded),
               "not_folded": list(result.fold.unfolded), "compute_ops": list(result.compute_ops)}
        text = (json.dumps(doc, indent=1) + "\n").encode()
        _write_atomic(out / "manifest.json", functools.partial(_write_bytes, data=text))
    except OSError as e:
        raise ImportError_(f"cannot write to {ascii(str(out))}: {e.strerror or e}") from None
    return paths


def _counted(ops: list[str]) -> str:
    counts: dict[str, int] = {}
    for op in ops:
        counts[op] = counts.get(op, 0) + 1
    return ", ".join(f"{op} x{n}" if n > 1 else op for op, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def summary_lines(result: OnnxImport) -> list[str]:
    """What the import did, for the CLI: regions found / imported whole / cut (by which ops) /
    dropped / skipped, the dropped no-op groups, folding, and the compute ops left to the framework."""
    by = {s: [r for r in result.regions if r.status == s] for s in ("whole", "cut", "dropped", "skipped")}
    lines = [f"regions: {len(result.regions)} found, {len(by['whole'])} imported whole, {len(by['cut'])} cut, "
             f"{len(by['dropped'])} dropped as no-ops, {len(by['skipped'])} not imported"]
    for r in by["cut"]:
        lines.append(f"  cut: nodes {r.nodes[0].split(':')[0]}..{r.nodes[-1].split(':')[0]} -> "
                     f"{', '.join(r.subgraphs)}; stopped by {_counted([b.split(':')[1] for b in r.stopped_by])}")
    stops = [b.split(":")[1] for r in by["skipped"] for b in r.stopped_by]
    if by["skipped"]:
        lines.append(f"  not imported: {len(by['skipped'])} region(s) of {_counted(stops) or 'unused nodes'}")
    lines.append(f"dropped no-op groups: {len(result.dropped)}" + "".join(f"\n  {d}" for d in result.dropped))
    lines.append(f"constant-only nodes folded: {len(result.fold.folded)}"
                 + (f" ({len(result.fold.unfolded)} left unfolded, see manifest.json)" if result.fold.unfolded else ""))
    lines.append("compute ops left to the framework: "
                 + (_counted([c.split(":")[1] for c in result.compute_ops]) or "none"))
    return lines
