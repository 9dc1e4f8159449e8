"""nvcc from a test: ``batch_source`` (many programs in one translation unit), ``ptxas_report`` (one nvcc
-O3 build for sm_90 and its ``-Xptxas -v`` report), ``compile_programs_sm90`` (both, registers per kernel),
``shared_ptxas_report`` (one build per source for the whole run, shared by the xdist workers),
``check_compiles_sm90``, ``heuristic_programs``; ``BUILDER_FLAGS`` (what the NvccBuilder adds, for batched
builds of what it would build one by one)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from helpers.lowering import DEV
from stitchtune.lower.entry import lower
from stitchtune.plan.planner import make_plan
from stitchtune.space import SearchSpace


def check_compiles_sm90(g: Any, seed: int, tmp_path: Path) -> None:
    """The heuristic schedule of ``g`` and the sample drawn with ``seed`` render to CUDA that nvcc builds
    for sm_90 with the NvccBuilder's flags, both in one translation unit (:func:`compile_programs_sm90`;
    ptxas must report every kernel)."""
    from stitchtune.cost.heuristic import heuristic_schedule

    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, DEV)
    programs = [lower(g, plan, s, DEV, space)
                for s in (heuristic_schedule(plan, DEV, space), space.sample(random.Random(seed)))]
    compile_programs_sm90(programs, tmp_path, flags=BUILDER_FLAGS)


def batch_source(programs: list[Any]) -> tuple[str, list[str]]:
    """One CUDA translation unit for many kir programs (the preamble once, kernels renamed ``p<i>_<name>``)
    and the kernel names in it. One nvcc call for many kernels: each nvcc process costs ~0.8 s of CPU
    before it compiles anything (headers, cicc and ptxas start-up), one kernel a small part of that."""
    import dataclasses

    from stitchtune.gpu.render import preamble, render_kernel

    src = preamble([k for prog in programs for k in prog.kernels])
    names = []
    for i, prog in enumerate(programs):
        for k in prog.kernels:
            k2 = dataclasses.replace(k, name=f"p{i}_{k.name}")
            names.append(k2.name)
            src += "\n" + render_kernel(k2) + "\n"
    return src, names


#: the flags :class:`stitchtune.gpu.build.NvccBuilder` adds to ``-O3 -Xptxas -v`` by default (line info)
BUILDER_FLAGS = ("-lineinfo",)


def ptxas_report(src: str, tmp_path: Path, timeout: int, flags: tuple[str, ...] = ()) -> str:
    """Compile ``src`` for sm_90 with nvcc -O3 and ``flags`` (the test skips without nvcc; a failed build
    fails it) and return ptxas's ``-v`` report."""
    import shutil
    import subprocess

    import pytest

    nvcc = shutil.which("nvcc") or shutil.which("/usr/local/cuda/bin/nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found")
    (tmp_path / "k.cu").write_text(src)
    r = subprocess.run([nvcc, "-cubin", "-arch=sm_90", "-O3", "-Xptxas", "-v", *flags, "-o", "k.cubin", "k.cu"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stderr


def shared_ptxas_report(src: str, shared_dir: Path, timeout: int = 600) -> str:
    """:func:`ptxas_report` of ``src``, built once per run: the first test (on any xdist worker) to ask
    builds it under an exclusive lock and stores the report by the source's sha256; the others wait
    for the lock and read it (conftest's ``shared_build_dir`` fixture gives ``shared_dir``)."""
    import fcntl
    import hashlib

    key = hashlib.sha256(src.encode()).hexdigest()[:24]
    out = shared_dir / f"{key}.ptxas.txt"
    with open(shared_dir / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not out.is_file():
                work = shared_dir / key
                work.mkdir(exist_ok=True)
                report = ptxas_report(src, work, timeout)
                tmp = out.with_suffix(".tmp")
                tmp.write_text(report)
                tmp.replace(out)
            return out.read_text()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def compile_programs_sm90(programs: list[Any], tmp_path: Path, timeout: int = 600,
                          flags: tuple[str, ...] = ()) -> list[dict[str, int]]:
    """Build ``programs`` for sm_90 in one nvcc call (:func:`batch_source`, :func:`ptxas_report` with
    ``flags``); the registers ptxas reports for each program's kernels (``{kernel name: registers}``, one
    dict per program, every kernel present)."""
    import re

    src, names = batch_source(programs)
    report = ptxas_report(src, tmp_path, timeout, flags)
    regs = {n: int(r) for n, r in re.findall(r"Compiling entry function '(\w+)'.*?Used (\d+) registers", report, re.S)}
    assert set(regs) == set(names), sorted(set(names) ^ set(regs))
    return [{k.name: regs[f"p{i}_{k.name}"] for k in prog.kernels} for i, prog in enumerate(programs)]


def heuristic_programs(graphs: list[Any], vec4: bool = False) -> list[Any]:
    """The programs of each graph's heuristic schedule on the H200 (planned, spaced and lowered as a search
    would), and with ``vec4`` also each one's ``vec = 4`` variant where the space allows it: the input of a
    batched compile test (:func:`compile_programs_sm90`)."""
    import dataclasses

    from stitchtune.cost.heuristic import heuristic_schedule

    dev = DEV
    programs = []
    for g in graphs:
        plan = make_plan(g)
        space = SearchSpace.for_plan(plan, dev)
        base = heuristic_schedule(plan, dev, space)
        wide = dataclasses.replace(base, vec=4)
        keep = [base, wide] if vec4 and not space.violations(wide) else [base]
        programs += [lower(g, plan, s, dev, space) for s in keep]
    return programs
