"""The DRAM latency each measured database kernel implies by Little's law, from its compiled bytes in flight.

    python scripts/implied_latency.py [--dataset results/cost-fit-2026-12-07-s13-walk/dataset.json] [--out FILE]

For every single-launch row of a database workload whose kernel has compiled facts (its sm_90 SASS: the most bytes
one thread has pending, ``compiled_bytes_in_flight``):

* read bytes = the kernel's sector bytes less the bytes it writes (the workload graph's outputs, examples/<w>.json);
* the read bandwidth = read bytes / (MEASURED time - the shipped fit's ``event_us`` and ``ramp_us``, PREDICTED
  constants of the launch start and the first loads / last wave);
* in flight = resident blocks (``min(grid, blocks_per_sm x SMs)``) x block x active lanes x the SASS bytes per thread;
* **implied latency = in flight / read bandwidth**: the latency at which Little's law gives the measured rate. A
  thread's loads are not all pending all the time, and a kernel limited by something else (the ceiling, issue)
  runs slower than its latency allows, so the latency the loads actually waited is at most this figure (an upper
  bound, up to the SASS count being the most pending, not a time average).

Rows are sorted by the share of the copy bandwidth they draw (``device.effective_copy_bandwidth_gbs``): the rows
drawing little say what the latency of a nearly idle machine is at most. Nothing is measured anew.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from stitchtune.cost.fit_dataset import DatasetError, load_dataset  # noqa: E402
from stitchtune.cost.fitted import package_coefficients  # noqa: E402
from stitchtune.graph.parse import load_graph  # noqa: E402
from stitchtune.hardware.device import get_device  # noqa: E402

DATASET = "results/cost-fit-2026-12-07-s13-walk/dataset.json"


def written_bytes(workload: str) -> float:
    """The bytes a workload's graph writes (its outputs' sizes), from examples/<workload>.json."""
    g = load_graph(REPO / "examples" / f"{workload}.json")
    return float(sum(g.spec(o).nbytes for o in g.outputs))


def implied(rows: list[dict[str, Any]], dev: Any) -> list[dict[str, Any]]:
    """Per single-launch database row with compiled facts: bandwidth share, in flight per busy SM, implied latency."""
    c = package_coefficients(dev)
    copy = dev.effective_copy_bandwidth_gbs()   # bytes per ns
    out = []
    for r in rows:
        if not r["group"].startswith("db:") or len(r["kernels"]) != 1:
            continue
        k = r["kernels"][0]
        if k.get("compiled_bytes_in_flight", 0) <= 0:
            continue
        reads = float(k["sector_bytes"]) - written_bytes(r["workload"])
        t_ns = (float(r["measured_us"]) - c.event_us - c.ramp_us) * 1000.0
        if reads <= 0 or t_ns <= 0:
            continue
        blocks = min(int(k["grid"]), max(int(k["blocks_per_sm"]), 1) * dev.sm_count)
        inflight = blocks * k["block"] * max(k["active_lanes"], 1 / 32) * k["compiled_bytes_in_flight"]
        bw = reads / t_ns
        out.append({"workload": r["workload"], "label": r["label"], "measured_us": r["measured_us"], "grid": k["grid"],
                    "block": k["block"], "read_share_of_copy": bw / copy, "kib_per_busy_sm":
                    inflight / min(int(k["grid"]), dev.sm_count) / 1024.0, "implied_latency_ns": inflight / bw})
    return sorted(out, key=lambda x: x["read_share_of_copy"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default=DATASET)
    ap.add_argument("--out", default="", help="write the table (markdown) here too")
    a = ap.parse_args(argv)
    dev = get_device("h200")
    try:
        rows = [dict(r) for r in load_dataset(REPO / a.dataset, dev.key).rows]
    except DatasetError as exc:
        print(f"implied_latency: error: {exc}", file=sys.stderr)
        return 2
    table = implied(rows, dev)
    cmd = " ".join(["python scripts/implied_latency.py", *(argv if argv is not None else sys.argv[1:])])
    lines = [f"# DRAM latency implied by Little's law ({len(table)} single-launch database rows with SASS facts)", "",
             f"    {cmd}", "", "MEASURED: the times. PREDICTED constants taken off: the shipped fit's event_us and "
             "ramp_us. In flight: the SASS's most bytes pending per thread. Implied latency: an upper bound of the "
             "latency the loads waited (module docstring).", "",
             "| workload | row | measured us | grid x block | read bandwidth / copy | KiB in flight per busy SM | "
             "implied latency ns |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {x['workload']} | {x['label'].split()[-1][:12]} | {x['measured_us']:.1f} | {x['grid']} x {x['block']} | "
              f"{x['read_share_of_copy']:.2f} | {x['kib_per_busy_sm']:.1f} | {x['implied_latency_ns']:.0f} |"
              for x in table]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
