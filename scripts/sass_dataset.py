"""Compiled-code facts of the cost fit's measured kernels: each measured program compiled for sm_90 and read in SASS.

    python scripts/sass_dataset.py --sources results/cost-fit-2026-12-07-s12/sources.json.gz \\
        [--dataset results/cost-fit-2026-12-07-s11/dataset.json] --out results/cost-fit-2026-12-07-s12/dataset.json
    python scripts/sass_dataset.py --sources ... --check results/cost-fit-2026-12-07-s12/dataset.json

``--sources`` holds the CUDA source and launch list of every measured program (written by
``scripts/measured_sources.py`` inside the checkout that built them; ``.gz`` is read too). For each stored
row this script

1. finds its program by fingerprint and **checks** that the source and launches hash to the row's
   ``source_sha256`` (the program that was measured, byte for byte);
2. compiles it as the GPU run's builder did (``nvcc -cubin -arch=sm_90 -O3 -Xptxas -v -lineinfo``; the
   H200 runs used the same nvcc build, ``cuda_13.0.r13.0/compiler.36424714_0``, results/h200-2026-11-29's
   versions.log) and reads the cubin with :func:`stitchtune.gpu.sass.read_cubin` (cuobjdump);
3. **checks**, for the database's rows, that the most registers of the program's kernels equal the
   registers its ptxas reported on the GPU machine (the database stores one count per program): the
   same compiler made the same code;
4. adds to each kernel the fitted model's compiled fields (``compiled_bytes_in_flight``,
   ``spill_instructions``: :func:`stitchtune.gpu.sass.compiled_facts`) and the SASS summary under
   ``sass`` (:class:`~stitchtune.gpu.sass.SassMetrics`). The stored IR features are kept as they are.

``--check DATASET``: compiles again and compares every kernel's compiled fields and ``sass`` with
``DATASET``'s (exit 1 on a difference): the facts are reproducible from the committed sources. Nothing is
measured or predicted here. Needs nvcc and cuobjdump (pip ``nvidia-cuda-cuobjdump``, ``nvidia-cuda-nvdisasm``).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from stitchtune.gpu.sass import compiled_facts, read_cubin  # noqa: E402
from stitchtune.gpu.build import find_nvcc, nvcc_version  # noqa: E402

FLAGS = ("-O3", "-Xptxas", "-v", "-lineinfo")   # stitchtune.gpu.build.NvccBuilder's flags at ca1a075
ARCH = "sm_90"


def _read_json(path: Path) -> Any:
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)


def fingerprint(source: str, launches: list[list[Any]]) -> str:
    """:func:`stitchtune.gpu.render.program_fingerprint` of a stored source and launch list."""
    return hashlib.sha256((source + "\n" + json.dumps(launches)).encode()).hexdigest()


def sass_of(source: str, workdir: Path, key: str) -> dict[str, Any]:
    """``{kernel: SassMetrics}`` of ``source`` compiled for :data:`ARCH`."""
    src, cubin = workdir / f"{key}.cu", workdir / f"{key}.cubin"
    src.write_text(source)
    subprocess.run([find_nvcc(), "-cubin", f"-arch={ARCH}", *FLAGS, "-o", str(cubin), str(src)],
                   capture_output=True, text=True, timeout=600, check=True)
    return read_cubin(cubin)


def facts_of_rows(rows: list[dict[str, Any]], programs: dict[str, Any], jobs: int) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows with compiled fields added, and the problems found (empty: every check passed)."""
    problems = []
    for fp, p in programs.items():
        if fingerprint(p["source"], p["launches"]) != fp:
            problems.append(f"program {fp[:12]}: its source and launches do not hash to its fingerprint")
    wanted = sorted({r["source_sha256"] for r in rows})
    missing = [fp for fp in wanted if fp not in programs]
    problems += [f"program {fp[:12]}: not in the sources" for fp in missing]
    with tempfile.TemporaryDirectory() as d, ThreadPoolExecutor(max_workers=jobs) as ex:
        todo = [fp for fp in wanted if fp in programs]
        metrics = dict(zip(todo, ex.map(lambda fp: sass_of(programs[fp]["source"], Path(d), fp), todo)))
    out = []
    for r in rows:
        m = metrics.get(r["source_sha256"])
        if m is None:
            out.append(r)
            continue
        kernels = []
        for k in r["kernels"]:
            s = m.get(k["name"])
            if s is None:
                problems.append(f"{r['label']}: kernel {k['name']} not in the cubin")
                kernels.append(k)
                continue
            c = compiled_facts(s)
            kernels.append({**k, "compiled_bytes_in_flight": c.bytes_in_flight,
                            "spill_instructions": float(c.spill_instructions), "sass": s.to_dict()})
        if r["group"].startswith("db:"):
            ours = max(k["sass"]["registers"] for k in kernels if "sass" in k)
            theirs = max(int(k["registers"]) for k in r["kernels"])
            if ours != theirs:
                problems.append(f"{r['label']}: compiled here {ours} registers, the GPU run's ptxas {theirs}")
        out.append({**r, "kernels": kernels})
    return out, problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sources", required=True, help="measured_sources.py's output (.json or .json.gz)")
    ap.add_argument("--dataset", default="results/cost-fit-2026-12-07-s11/dataset.json")
    ap.add_argument("--out", help="write the dataset with compiled facts here")
    ap.add_argument("--check", help="compile again and compare with this dataset's compiled facts")
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args(argv)
    programs = _read_json(REPO / a.sources)["programs"]
    stored = json.loads((REPO / (a.check or a.dataset)).read_text())
    rows, problems = facts_of_rows([dict(r) for r in stored["rows"]], programs, a.jobs)
    if problems:
        print("sass_dataset: refused:\n  " + "\n  ".join(problems[:30]), file=sys.stderr)
        return 1
    if a.check:
        keys = ("compiled_bytes_in_flight", "spill_instructions", "sass")
        diff = [f"{r['label']} {k['name']}: {f}" for r, s in zip(rows, stored["rows"])
                for k, ks in zip(r["kernels"], s["kernels"]) for f in keys if k.get(f) != ks.get(f)]
        print(f"{len(rows)} rows, {sum(len(r['kernels']) for r in rows)} kernels compiled again: "
              + ("identical compiled facts" if not diff else f"{len(diff)} differences"))
        for line in diff[:20]:
            print("  " + line)
        return 1 if diff else 0
    n_db = sum(1 for r in rows if r["group"].startswith("db:"))
    prov = {**stored.get("provenance", {}),
            "compiled": f"compiled_bytes_in_flight, spill_instructions and sass added by scripts/sass_dataset.py from "
                        f"{a.sources}: every row's source hashes to its source_sha256; nvcc -cubin -arch={ARCH} "
                        f"{' '.join(FLAGS)} ({nvcc_version(find_nvcc())}); registers equal the GPU run's ptxas "
                        f"for all {n_db} database rows"}
    out = REPO / a.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**stored, "provenance": prov, "rows": rows}, indent=0) + "\n")
    print(f"wrote {a.out}: {len(rows)} rows; {prov['compiled']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
