"""The CUDA sources of the cost fit's measured programs, lowered again at the checkout that built them.

    git archive ca1a075 | tar -x -C /tmp/old          # the checkout whose programs were measured
    (cd /tmp/old && PYTHONPATH=$PWD python <this worktree>/scripts/measured_sources.py --out /tmp/old/sources.json)
    python scripts/sass_dataset.py --sources /tmp/old/sources.json ...   # compile, read SASS, add to the dataset

Runs **inside the old checkout** (``PYTHONPATH`` pointing at it): it imports that checkout's
``scripts/fit_cost_model.py`` and runs its row builders (the tuning database's rows, BERT's training
trace, BERT inference's tuning log: torch and transformers needed for the BERT captures), recording every
program they lower. Writes ``{"checkout": path, "programs": {fingerprint: {"source": CUDA text, "launches": [[kernel, grid, block,
smem, args], ...]}}}`` where the fingerprint is :func:`stitchtune.gpu.render.program_fingerprint`'s (sha256 of the rendered
source, a newline and the launch list, computed here with the old checkout's ``render``): the key the
stored dataset's rows carry as ``source_sha256``. Nothing is compiled, measured or predicted here.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any


def fingerprint(program: Any, source: str) -> str:
    """:func:`stitchtune.gpu.render.program_fingerprint` (written out: older checkouts lack it)."""
    launches = json.dumps([[ln.kernel, ln.grid, ln.block, ln.smem_bytes, list(ln.args)] for ln in program.launches])
    return hashlib.sha256((source + "\n" + launches).encode()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="h200")
    ap.add_argument("--skip-bert", action="store_true", help="the database's rows only (no torch capture)")
    a = ap.parse_args(argv)
    checkout = Path(os.environ.get("PYTHONPATH", ".").split(os.pathsep)[0]).resolve()
    sys.path.insert(0, str(checkout / "scripts"))
    import fit_cost_model as old  # the old checkout's script

    from stitchtune.gpu.render import render
    from stitchtune.hardware.device import get_device

    dev = get_device(a.device)
    seen: dict[str, Any] = {}
    inner = old.program_features

    def recording(prog: Any, *args: Any, **kw: Any) -> Any:
        src = render(prog)
        seen[fingerprint(prog, src)] = {"source": src, "launches": [[ln.kernel, ln.grid, ln.block, ln.smem_bytes,
                                                                      list(ln.args)] for ln in prog.launches]}
        return inner(prog, *args, **kw)

    old.program_features = recording
    old.db_rows(dev)
    print(f"database: {len(seen)} programs", file=sys.stderr)
    if not a.skip_bert:
        old.bert_train_rows(dev)
        old.bert_inference_rows(dev)
    print(f"all: {len(seen)} programs", file=sys.stderr)
    Path(a.out).write_text(json.dumps({"checkout": str(checkout), "programs": seen}, indent=0) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
