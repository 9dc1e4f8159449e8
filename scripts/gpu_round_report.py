"""The headline figures of a GPU round's results folder, as markdown for the README and docs/results.md.

    python scripts/gpu_round_report.py results/<device>-<date>   # prints; gpu_round.sh puts it in summary.md

Reads ``gpu_step.jsonl`` and ``gpu_peers.jsonl`` (whatever of them exists) and prints, per table, one
line per group, every figure a ratio of two times MEASURED in that run (nothing predicted):

* **steps**: per model x dtype x mode, the backend's step / Inductor's (``stitchtune`` / ``inductor``) and
  with CUDA graphs on both sides (``stitchtune+cg`` / ``inductor-ro``), and the memory-bound device time
  of each (matmuls and copies apart);
* **regions**: per model x dtype x mode, the regions' summed device time, each weighted by how often it
  occurs in the model, ours / Inductor's, and how many regions are within 1.1x of Inductor's;
* **decode**: the backend's us per token step / eager's and / Inductor's;
* **peers**: per op x size x dtype, the backend / the native op, and the native op / the floor.

A ratio below 1 means the backend is faster. Exit 0, or 2 with one error line when DIR has neither file.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Sequence


def _rows(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [r for r in (json.loads(x) for x in path.read_text().splitlines() if x.strip()) if "skipped" not in r]


def _ratio(a: Any, b: Any) -> str:
    return f"{a / b:.2f}" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a and b else "-"


def step_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The steps' headline table (pure)."""
    by: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = {}
    for r in rows:
        if r.get("phase") == "steps" and "error" not in r:
            by.setdefault((r["model"], r["dtype"], r["mode"]), {})[r["variant"]] = r
    if not by:
        return []
    out = ["| model | dtype | mode | backend / Inductor (step) | backend+CUDA graphs / Inductor reduce-overhead | "
           "memory-bound us: backend, Inductor | host gap us: backend, Inductor |", "|---|---|---|---|---|---|---|"]
    for (m, d, mode), v in by.items():
        st, ind, stc, ro = (v.get(k, {}) for k in ("stitchtune", "inductor", "stitchtune+cg", "inductor-ro"))
        out.append(f"| {m} | {d} | {mode} | {_ratio(st.get('median_us'), ind.get('median_us'))} | "
                   f"{_ratio(stc.get('median_us'), ro.get('median_us'))} | {st.get('membound_us', '-')}, "
                   f"{ind.get('membound_us', '-')} | {st.get('gap_us', '-')}, {ind.get('gap_us', '-')} |")
    return out


def region_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The regions' headline table (pure): count-weighted sums of the regions timed on both sides."""
    by: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("phase") == "regions" and r.get("ours_us") and r.get("inductor_us"):
            by.setdefault((r["model"], r.get("dtype", ""), r["mode"]), []).append(r)
    if not by:
        return []
    out = ["| model | dtype | mode | regions | ours / Inductor (summed, weighted by occurrences) | "
           "geomean ours / Inductor | within 1.1x |", "|---|---|---|---|---|---|---|"]
    for (m, d, mode), rs in by.items():
        ours = sum(r["ours_us"] * r.get("count", 1) for r in rs)
        ind = sum(r["inductor_us"] * r.get("count", 1) for r in rs)
        geo = math.exp(sum(math.log(r["ours_us"] / r["inductor_us"]) for r in rs) / len(rs))
        near = sum(1 for r in rs if r["ours_us"] <= 1.1 * r["inductor_us"])
        out.append(f"| {m} | {d} | {mode} | {len(rs)} | {_ratio(ours, ind)} | {geo:.2f} | {near}/{len(rs)} |")
    return out


def decode_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The decode headline table (pure)."""
    by: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        if r.get("phase") == "decode" and "error" not in r:
            by.setdefault(r["model"], {})[r["variant"]] = r
    if not by:
        return []
    out = ["| model | us/token: eager, Inductor, backend | backend / eager | backend / Inductor | tokens equal |",
           "|---|---|---|---|---|"]
    for m, v in by.items():
        e, i, s = (v.get(k, {}).get("median_us") for k in ("eager", "inductor", "stitchtune"))
        out.append(f"| {m} | {e or '-'}, {i or '-'}, {s or '-'} | {_ratio(s, e)} | {_ratio(s, i)} | "
                   f"{v.get('stitchtune', {}).get('tokens_equal', '-')} |")
    return out


def peer_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The native peers' headline table (pure)."""
    by: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = {}
    for r in rows:
        if r.get("phase") == "peers" and "median_us" in r:
            by.setdefault((r["op"], r.get("size", "full"), r["dtype"]), {})[r["variant"]] = r
    if not by:
        return []
    out = ["| op | size | dtype | backend / native | backend+CUDA graphs / native+CUDA graph | native / floor |",
           "|---|---|---|---|---|---|"]
    for (op, z, d), v in by.items():
        nat = v.get("native", {})
        out.append(f"| {op} | {z} | {d} | {_ratio(v.get('stitchtune', {}).get('median_us'), nat.get('median_us'))} | "
                   f"{_ratio(v.get('stitchtune+cg', {}).get('median_us'), v.get('native+graph', {}).get('median_us'))} | "
                   f"{_ratio(nat.get('median_us'), nat.get('floor_us'))} |")
    return out


def report(folder: Path) -> list[str]:
    """Every headline table of ``folder`` (pure but for reading the files)."""
    step, peers = _rows(folder / "gpu_step.jsonl"), _rows(folder / "gpu_peers.jsonl")
    out: list[str] = []
    if any("dry run" in str(r.get("timing", "")) for r in step + peers):
        out += ["**DRY RUN: CPU wall clock of tiny models; these ratios are no GPU figure.**", ""]
    for title, lines in (("Per step", step_lines(step)), ("Per region", region_lines(step)),
                         ("Decode", decode_lines(step)), ("Native peers", peer_lines(peers))):
        if lines:
            out += [f"### {title} (ratios of measured times; below 1: the backend is faster)", ""] + lines + [""]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", help="a round's results folder (gpu_step.jsonl and / or gpu_peers.jsonl)")
    try:
        a = ap.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    if not any((Path(a.folder) / f).is_file() for f in ("gpu_step.jsonl", "gpu_peers.jsonl")):
        print("gpu_round_report: error: give one results folder holding gpu_step.jsonl or gpu_peers.jsonl",
              file=sys.stderr)
        return 2
    print("\n".join(report(Path(a.folder))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
