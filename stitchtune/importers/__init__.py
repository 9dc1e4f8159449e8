"""Importers that turn PyTorch functions and ONNX models into graph.json.

``torch_import`` (PyTorch -> one graph.json), ``onnx_import`` (ONNX -> one graph.json per
memory-intensive subgraph), ``builder`` (the graph builder both use). This package's ``__init__``
only wires the ``stitchtune import`` CLI subcommand; torch and onnx are imported when it runs.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["add_import_parser"]


def add_import_parser(subparsers: Any, out: Callable[[str], None]) -> None:
    """Add ``import torch ...`` and ``import onnx ...`` to the CLI; ``out`` prints one line for the user."""
    p = subparsers.add_parser("import", help="import a PyTorch function or ONNX model as graph.json")
    sub = p.add_subparsers(dest="import_kind", metavar="KIND", required=True)

    t = sub.add_parser("torch", help="capture a PyTorch function or nn.Module with torch.export")
    t.add_argument("callable", metavar="MODULE:CALLABLE",
                   help="path/to/file.py:NAME or dotted.module:NAME (a function, nn.Module, or nn.Module class)")
    t.add_argument("--shapes", required=True, help="example shapes per argument, e.g. x=16384x1024,gamma=1024")
    t.add_argument("--dtype", default=None,
                   help="float32|float16|bfloat16 for all inputs, or per input: x=bfloat16,gamma=float32")
    t.add_argument("-o", "--output", required=True, help="graph.json to write")
    t.add_argument("--name", default=None, help="graph name (default: the callable's name)")
    t.add_argument("--params-out", default=None,
                   help="write the module's parameter/buffer values (graph inputs) to this .npz")
    t.set_defaults(func=lambda args: _cmd_torch(args, out))

    o = sub.add_parser("onnx", help="split an ONNX model into memory-intensive subgraphs")
    o.add_argument("model", metavar="MODEL.onnx")
    o.add_argument("--node-range", default=None, help="only nodes A..B-1 (python slice over node indices)")
    o.add_argument("--shapes", default=None,
                   help="fix dynamic dims: per input (x=8x512) or per dimension symbol (batch=8)")
    o.add_argument("-o", "--output", required=True, help="directory for the graph.json files + manifest.json")
    o.add_argument("--name", default=None, help="name prefix of the subgraphs (default: the ONNX graph name)")
    o.set_defaults(func=lambda args: _cmd_onnx(args, out))


def _cmd_torch(args: argparse.Namespace, out: Callable[[str], None]) -> int:
    from stitchtune.graph.npz import save_npz
    from stitchtune.importers.builder import parse_dtypes, parse_shapes
    from stitchtune.importers.torch_import import import_torch, load_callable

    shapes = parse_shapes(args.shapes)
    dtypes = parse_dtypes(args.dtype, list(shapes))
    fn, label = load_callable(args.callable)
    res = import_torch(fn, {n: (s, dtypes[n]) for n, s in shapes.items()}, name=args.name or label)
    g = res.graph
    path = Path(args.output)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(g.to_dict(), indent=1) + "\n")
    ops = ", ".join(sorted({n.op for n in g.nodes}))
    out(f"wrote {path}: graph {g.name}, {len(g.nodes)} nodes ({ops}), captured with {res.method}")
    out("  inputs: " + ", ".join(f"{n}{list(s.shape)}:{s.dtype}" for n, s in g.inputs))
    out("  outputs: " + ", ".join(g.outputs))
    if res.params:
        if args.params_out:
            save_npz(args.params_out, dict(res.params))
            out(f"  wrote {len(res.params)} parameter values to {args.params_out}")
        else:
            out(f"  {len(res.params)} inputs are module parameters ({', '.join(n for n, _ in res.params)}); "
                "--params-out FILE.npz saves their values")
    return 0


def _cmd_onnx(args: argparse.Namespace, out: Callable[[str], None]) -> int:
    from stitchtune.importers.builder import parse_shapes
    from stitchtune.importers.onnx_import import (
        import_onnx,
        parse_node_range,
        summary_lines,
        write_subgraphs,
    )

    res = import_onnx(args.model, node_range=parse_node_range(args.node_range),
                      shapes=parse_shapes(args.shapes), name=args.name)
    paths = write_subgraphs(res, args.output)
    out(f"{len(paths)} memory-intensive subgraph(s), {len(res.boundaries)} boundary node(s); "
        f"wrote {Path(args.output) / 'manifest.json'}")
    for p, sg in zip(paths, res.subgraphs):
        out(f"  {p}: {len(sg.graph.nodes)} nodes from ONNX nodes "
            f"{sg.onnx_nodes[0].split(':')[0]}..{sg.onnx_nodes[-1].split(':')[0]}, "
            f"inputs {', '.join(n for n, _ in sg.graph.inputs)}, outputs {', '.join(sg.graph.outputs)}")
    for line in summary_lines(res):
        for part in line.split("\n"):
            out("  " + part)
    return 0
