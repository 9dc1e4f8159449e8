"""``stitchtune import torch|onnx``: a PyTorch function or an ONNX model as graph.json file(s).

A pair ``_add_import(sub)`` / ``_cmd_torch`` + ``_cmd_onnx`` as described in :mod:`stitchtune.cli`; the
importers themselves are :mod:`stitchtune.importers` (torch and onnx are imported when a command runs).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from stitchtune.cli import checks
from stitchtune.cli.options import add_callable, add_out
from stitchtune.cli.outputs import write_whole


def _add_import(subparsers: Any) -> None:
    p = subparsers.add_parser("import", help="import a PyTorch function or ONNX model as graph.json")
    sub = p.add_subparsers(dest="import_kind", metavar="KIND", required=True)

    t = sub.add_parser("torch", help="capture a PyTorch function or nn.Module with torch.export")
    add_callable(t, "x=16384x1024,gamma=1024",
                 "float32|float16|bfloat16 for all inputs, or per input: x=bfloat16,gamma=float32")
    add_out(t, checks.out_file, "graph.json to write", metavar="GRAPH.json", required=True, old=("--output",))
    t.add_argument("--name", default=None, help="graph name (default: the callable's name)")
    checks.checked(t, t.add_argument("--params-out", default=None, metavar="PARAMS.npz",
                                     help="write the module's parameter/buffer values (graph inputs) to this .npz"),
                   checks.out_file)
    t.set_defaults(func=_cmd_torch)

    o = sub.add_parser("onnx", help="split an ONNX model into memory-intensive subgraphs")
    checks.checked(o, o.add_argument("model", metavar="MODEL.onnx", help="ONNX model file"), checks.in_file)
    o.add_argument("--node-range", default=None, metavar="A..B",
                   help="only nodes A..B-1 (python slice over node indices)")
    o.add_argument("--shapes", default=None, metavar="NAME=DIMS,...",
                   help="fix dynamic dims: per input (x=8x512) or per dimension symbol (batch=8)")
    add_out(o, checks.out_dir, "directory for the graph.json files + manifest.json", metavar="DIR", required=True,
            old=("--output",))
    o.add_argument("--name", default=None, help="name prefix of the subgraphs (default: the ONNX graph name)")
    o.set_defaults(func=_cmd_onnx)


def _cmd_torch(args: argparse.Namespace) -> int:
    from stitchtune.graph.npz import save_npz
    from stitchtune.importers.builder import parse_dtypes, parse_shapes
    from stitchtune.importers.torch_import import import_torch, load_callable

    from stitchtune.deploy.tune_inputs import check_runs, example_inputs

    shapes = parse_shapes(args.shapes)
    dtypes = parse_dtypes(args.dtype, list(shapes))
    fn, label = load_callable(args.callable)
    # the checks tune runs: sizes bounded before anything is allocated, then one eager call (a model that
    # fails is one line, not torch.export's logged trace)
    check_runs(fn, example_inputs(fn, shapes, args.dtype))
    res = import_torch(fn, {n: (s, dtypes[n]) for n, s in shapes.items()}, name=args.name or label)
    g = res.graph
    path = Path(args.out)
    text = json.dumps(g.to_dict(), indent=1) + "\n"
    write_whole(args.out, lambda tmp: Path(tmp).write_text(text))
    ops = ", ".join(sorted({n.op for n in g.nodes}))
    print(f"wrote {path}: graph {g.name}, {len(g.nodes)} nodes ({ops}), captured with {res.method}")
    print("  inputs: " + ", ".join(f"{n}{list(s.shape)}:{s.dtype}" for n, s in g.inputs))
    print("  outputs: " + ", ".join(g.outputs))
    if res.params:
        if args.params_out:
            write_whole(args.params_out, lambda tmp: save_npz(tmp, dict(res.params)))
            print(f"  wrote {len(res.params)} parameter values to {args.params_out}")
        else:
            print(f"  {len(res.params)} inputs are module parameters ({', '.join(n for n, _ in res.params)}); "
                  "--params-out FILE.npz saves their values")
    return 0


def _cmd_onnx(args: argparse.Namespace) -> int:
    from stitchtune.importers.builder import parse_shapes
    from stitchtune.importers.onnx_import import (
        import_onnx,
        parse_node_range,
        summary_lines,
        write_subgraphs,
    )

    res = import_onnx(args.model, node_range=parse_node_range(args.node_range),
                      shapes=parse_shapes(args.shapes), name=args.name)
    paths = write_subgraphs(res, args.out)
    print(f"{len(paths)} memory-intensive subgraph(s), {len(res.boundaries)} boundary node(s); "
          f"wrote {Path(args.out) / 'manifest.json'}")
    for p, sg in zip(paths, res.subgraphs):
        print(f"  {p}: {len(sg.graph.nodes)} nodes from ONNX nodes "
              f"{sg.onnx_nodes[0].split(':')[0]}..{sg.onnx_nodes[-1].split(':')[0]}, "
              f"inputs {', '.join(n for n, _ in sg.graph.inputs)}, outputs {', '.join(sg.graph.outputs)}")
    for line in summary_lines(res):
        for part in line.split("\n"):
            print("  " + part)
    return 0
