"""``stitchtune audit``: the kernel audit without a GPU (:mod:`stitchtune.analysis.audit`, docs/audit.md).

``stitchtune audit GRAPH`` audits one region's heuristic schedule; ``stitchtune audit --model
MODULE:CALLABLE --shapes ...`` every region the torch.compile backend stitches in a model (``--calls``:
inference, eval-grad, train). Markdown goes to stdout (or ``--markdown FILE``), JSON to ``--json FILE``.
Bad input is one ``stitchtune: error:`` line and exit 2 (the CLI's rule).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from stitchtune.cli import checks
from stitchtune.cli.options import add_device, int_at_most
from stitchtune.cli.outputs import write_whole
from stitchtune.errors import StitchtuneError

MAX_SLICE_BLOCKS = 4096


def _add_audit(sub: Any) -> None:
    p = sub.add_parser("audit", help="audit the kernels of a graph or of a model's regions on the CPU: sectors per "
                                     "request, SASS, occupancy, floor (docs/audit.md; nothing is timed)")
    checks.checked(p, p.add_argument("graph", nargs="?", metavar="GRAPH", help="graph.json file (or --model)"),
                   checks.in_file)
    checks.checked(p, p.add_argument("--model", metavar="MODULE:CALLABLE", default=None,
                                     help="audit every region of this model instead (path/to/file.py:NAME or "
                                          "dotted.module:NAME), with --shapes"), checks.in_module)
    p.add_argument("--shapes", metavar="NAME=DIMS,...", default=None, help="--model's example shapes, e.g. x=8x512")
    p.add_argument("--dtype", default=None, metavar="DTYPE", help="--model's input dtypes (as for `tune`)")
    p.add_argument("--calls", default=None, metavar="LIST",
                   help="--model: the call patterns whose regions are audited: inference, eval-grad, train "
                        "(default inference)")
    p.add_argument("--schedule", metavar="JSON|@FILE", default=None,
                   help="GRAPH: audit this schedule (inline JSON or @file) instead of the heuristic's")
    add_device(p, "device preset (default h200: the audit is for a device description, not the local GPU)")
    p.add_argument("--slice-blocks", type=int_at_most(MAX_SLICE_BLOCKS, 1), default=4, metavar="N",
                   help="blocks of each launch emulated for the sector counts (default 4)")
    p.add_argument("--no-sass", action="store_true", help="skip compiling and reading the SASS")
    p.add_argument("--no-peer", action="store_true", help="skip the Triton peer")
    checks.checked(p, p.add_argument("--json", metavar="FILE", default=None, help="also write the audit as JSON"),
                   checks.out_file)
    checks.checked(p, p.add_argument("--markdown", metavar="FILE", default=None,
                                     help="write the Markdown here instead of stdout"), checks.out_file)
    p.set_defaults(func=_cmd_audit)


def _cmd_audit(args: argparse.Namespace) -> int:
    from stitchtune.analysis.audit import audit_graph, audit_model
    from stitchtune.analysis.audit_report import audit_json, audit_markdown
    from stitchtune.hardware.device import get_device

    if (args.graph is None) == (args.model is None):
        raise StitchtuneError("give a GRAPH or --model MODULE:CALLABLE (one of them)")
    if args.model is not None and not args.shapes:
        raise StitchtuneError("--model needs --shapes (e.g. --shapes input_ids=8x512)")
    if args.model is not None and args.schedule is not None:
        raise StitchtuneError("--schedule is for a GRAPH (a model's regions use their heuristic schedules)")
    model_only = [f"--{k}" for k in ("shapes", "dtype", "calls") if getattr(args, k) is not None]
    if args.graph is not None and model_only:
        raise StitchtuneError(f"{', '.join(model_only)}: for --model (a GRAPH has its shapes and dtypes)")
    device = get_device(args.device or "h200")
    options = dict(slice_blocks=args.slice_blocks, sass=not args.no_sass, peer=not args.no_peer)
    skipped: list[str] = []
    if args.graph is not None:
        from stitchtune.cli.dynamic import static_only
        from stitchtune.cli.inputs import parse_schedule_arg
        from stitchtune.space import Schedule

        given = parse_schedule_arg(args.schedule)
        schedule = Schedule.from_dict(given) if given is not None else None
        audits = [audit_graph(static_only(args.graph), device, schedule, **options)]
        title = f"Kernel audit: {args.graph}"
    else:
        from stitchtune.deploy.model_tuning import parse_calls
        from stitchtune.deploy.tune_inputs import check_runs, example_inputs
        from stitchtune.importers.builder import parse_shapes
        from stitchtune.importers.torch_import import load_callable

        calls = parse_calls(args.calls or "inference")
        fn, label = load_callable(args.model)
        inputs = example_inputs(fn, parse_shapes(args.shapes), args.dtype)
        check_runs(fn, inputs)
        audits, skipped = audit_model(fn, inputs, device, calls, **options)
        title = f"Kernel audit: {label} ({', '.join(calls)})"
    text = audit_markdown(audits, title, skipped)
    if args.json:
        doc = json.dumps(audit_json(audits, skipped), indent=1)
        write_whole(args.json, lambda tmp: Path(tmp).write_text(doc))
    if args.markdown:
        write_whole(args.markdown, lambda tmp: Path(tmp).write_text(text + "\n"))
    else:
        sys.stdout.write(text + "\n")
    return 0
