"""SASS facts of a few heuristic kernels, read without a GPU: compiled for sm_90 and disassembled.

    python scripts/sass_facts.py [--exact] [--name softmax ...]

Kernels (the GPU script's shapes, ``scripts/gpu_models.py``: batch 8, sequence 512, BERT's 12 heads of 64):
``attn_softmax`` (scores scaled, masked, softmaxed), ``softmax`` (examples/softmax.json), ``layernorm``
(examples/layernorm.json), ``head_split`` (``[8, 512, 768] -> [8, 12, 512, 64]``, the view + permute +
clone of a head split). Each is lowered with its heuristic schedule, rendered, compiled with
``nvcc -cubin -arch=sm_90 -O3 -Xptxas -v`` and read with ``cuobjdump -sass`` (pip
``nvidia-cuda-cuobjdump`` / ``nvidia-cuda-nvdisasm``). Per kernel: registers and shared bytes (ptxas),
blocks, grid, and counts of SASS instructions: ``MUFU.EX2``, ``MUFU.RCP``, ``FCHK`` (the IEEE division's
range check), ``CALL`` (its slow path), ``LDG.E.128`` / ``STG.E.128`` (128-bit global accesses), all
``LDG`` / ``STG``, ``STS`` / ``LDS`` (shared memory), and the ``LDG`` issued before the first float instruction (loads in
flight before their first use). ``--exact``: schedules with ``exact_math`` 1 (where
the code generator has the option). Uses whichever ``stitchtune`` is importable (so the same script reads
another checkout's kernels with ``PYTHONPATH=<checkout>``).
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FP_OPS = ("FADD", "FMUL", "FFMA", "FMNMX", "FSETP", "MUFU")
COUNTED = ("MUFU.EX2", "MUFU.RCP", "MUFU.RSQ", "FCHK", "CALL", "LDG.E.128", "STG.E.128", "LDG", "STG", "STS", "LDS")


def graphs() -> dict[str, Any]:
    from stitchtune.graph.parse import load_graph, parse_graph

    f32 = "float32"
    attn = parse_graph({
        "name": "attn_softmax",
        "inputs": {"scores": {"shape": [8, 12, 512, 512], "dtype": f32}, "mask": {"shape": [8, 1, 1, 512], "dtype": f32}},
        "nodes": [{"id": "sc", "op": "mul", "args": ["scores", 0.125]}, {"id": "z", "op": "add", "args": ["sc", "mask"]},
                  {"id": "m", "op": "reduce_max", "args": ["z"], "axes": [-1], "keepdims": True},
                  {"id": "d", "op": "sub", "args": ["z", "m"]}, {"id": "e", "op": "exp", "args": ["d"]},
                  {"id": "s", "op": "reduce_sum", "args": ["e"], "axes": [-1], "keepdims": True},
                  {"id": "y", "op": "div", "args": ["e", "s"]}],
        "outputs": ["y"]})
    split = parse_graph({
        "name": "head_split", "inputs": {"x": {"shape": [8, 512, 768], "dtype": f32}},
        "nodes": [{"id": "v", "op": "reshape", "args": ["x"], "shape": [8, 512, 12, 64]},
                  {"id": "t", "op": "transpose", "args": ["v"], "perm": [0, 2, 1, 3]},
                  {"id": "y", "op": "mul", "args": ["t", 1.0]}],
        "outputs": ["y"]})
    return {"attn_softmax": attn, "softmax": load_graph(REPO / "examples" / "softmax.json"),
            "layernorm": load_graph(REPO / "examples" / "layernorm.json"), "head_split": split}


def tool(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    import nvidia  # the pip wheels' bin folders

    for base in nvidia.__path__:
        for p in glob.glob(os.path.join(base, "*", "bin", name)):
            return p
    raise SystemExit(f"sass_facts: error: {name} not found (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")


def facts(name: str, g: Any, exact: bool) -> list[dict[str, Any]]:
    from stitchtune.cost.heuristic import heuristic_schedule
    from stitchtune.gpu.build import find_nvcc, parse_ptxas
    from stitchtune.gpu.render import render
    from stitchtune.hardware.device import get_device
    from stitchtune.lower.entry import lower
    from stitchtune.plan.planner import make_plan
    from stitchtune.space import SearchSpace

    dev = get_device("H200")
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, dev)
    s = heuristic_schedule(plan, dev, space)
    if exact and "exact_math" in s.table:
        s = dataclasses.replace(s, exact_math=1)  # type: ignore[call-arg]
    prog = lower(g, plan, s, dev, space)
    with tempfile.TemporaryDirectory() as d:
        src, cubin = Path(d) / "k.cu", Path(d) / "k.cubin"
        src.write_text(render(prog))
        r = subprocess.run([find_nvcc(), "-cubin", "-arch=sm_90", "-O3", "-Xptxas", "-v", "-o", str(cubin), str(src)],
                           capture_output=True, text=True, timeout=300, check=True)
        res = parse_ptxas(r.stderr + r.stdout)
        env = dict(os.environ, PATH=os.path.dirname(tool("nvdisasm")) + os.pathsep + os.environ.get("PATH", ""))
        sass = subprocess.run([tool("cuobjdump"), "-sass", str(cubin)], capture_output=True, text=True, timeout=300,
                              check=True, env=env).stdout
    out = []
    per_kernel = re.split(r"\n\s*Function : ", sass)[1:]
    for k, launch in zip(prog.kernels, prog.launches):
        text = next((t for t in per_kernel if t.startswith(k.name)), "")
        ins = re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", text)
        row = {"region": name, "kernel": k.name, "schedule": s.to_json(), "regs": res[k.name].registers,
               "smem": k.smem_bytes, "block": launch.block, "grid": launch.grid}
        for c in COUNTED:
            row[c] = sum(1 for i in ins if i == c or (i.startswith(c + ".") and c not in ("LDG.E.128", "STG.E.128"))
                         or (c in ("LDG.E.128", "STG.E.128") and i.startswith(c)))
        first_fp = next((i for i, op in enumerate(ins) if op.split(".")[0] in FP_OPS), len(ins))
        row["LDG before first FP"] = sum(1 for op in ins[:first_fp] if op.startswith("LDG"))
        out.append(row)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exact", action="store_true", help="exact_math 1 where the code generator has it")
    ap.add_argument("--name", nargs="+", help="only these kernels")
    a = ap.parse_args()
    gs = graphs()
    cols = ["region", "kernel", "regs", "smem", "block", "grid", *COUNTED, "LDG before first FP"]
    print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for name, g in gs.items():
        if a.name and name not in a.name:
            continue
        for row in facts(name, g, a.exact):
            print("| " + " | ".join(str(row[c]) for c in cols) + " |", flush=True)
            print(f"<!-- {row['region']}: {row['schedule']} -->")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
