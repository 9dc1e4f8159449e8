"""Regions that write the same values twice (issue 39): per captured region of BERT, GPT-2 and Llama,
the outputs that are a view / reshape / copy of another output of the same region.

    python scripts/duplicate_writes.py [--models bert,gpt2,llama] [--calls inference,eval-grad,train]
                                       [--batch 8] [--seq 512]

The models are ``scripts/gpu_models.py``'s (``_medium``: transformers configs, random weights, 2 layers),
captured as the torch.compile backend captures them (``stitchtune.deploy.model_tuning.capture_regions``;
the capture runs each model eagerly on the CPU: use ``nice``, and a small ``--batch`` / ``--seq`` when the
region names are all you need: they do not depend on the sizes). Per region it prints each output that
the kernel stores although it holds the values of another stored output
(``stitchtune.importers.torch_duplicates``: a reshape / transpose chain of another output's value), with
its bytes, split into the same layout (a view PyTorch could take: issue 39's "writes the same values
twice") and another layout (a transposed copy that eager writes too), and the outputs the region returns
as views of another (``TorchRegion.aliases``: not stored). Nothing is timed.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _gpu_models() -> Any:
    spec = importlib.util.spec_from_file_location("gpu_models", REPO / "scripts" / "gpu_models.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def main(argv: list[str] | None = None) -> int:
    import torch

    from stitchtune.deploy.model_tuning import capture_regions
    from stitchtune.importers.torch_duplicates import duplicate_outputs

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="bert,gpt2,llama")
    ap.add_argument("--calls", default="inference,eval-grad,train")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    a = ap.parse_args(argv)
    gm = _gpu_models()
    total = 0
    for name in a.models.split(","):
        model, _ = gm._medium(name)
        args = (torch.randint(0, 32000, (a.batch, a.seq)),)
        for call in a.calls.split(","):
            regions = capture_regions(model, args, call)
            dups = [(r, d) for r in regions for d in duplicate_outputs(r.graph)]
            aliased = sum(len(r.aliases) for r in regions)
            outs = sum(len(r.outputs) for r in regions)
            same = [x for x in dups if x[1].same_layout]
            print(f"{name} {call}: {len(regions)} regions, {outs} stored outputs, {len(same)} stored twice in the "
                  f"same layout, {len(dups) - len(same)} again in another layout, {aliased} returned as views "
                  f"of another output (not stored)")
            for r, d in dups:
                mb = r.graph.spec(d.output).nbytes / 1e6
                what = "again" if d.same_layout else "again transposed"
                print(f"  {r.name}: output {d.output} stores {d.same} {what} ({' > '.join(d.how) or 'itself'}; "
                      f"{mb:.1f} MB at these sizes)")
            total += len(same)
    print(f"total outputs stored twice in the same layout: {total}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
