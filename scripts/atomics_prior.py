"""The fitted cost model's atomics coefficient and its zero fills' store rate as priors, from measured H200 kernels.

    python scripts/atomics_prior.py [--json]

No fit row has atomics (results/cost-fit-2026-12-07-s13-walk/dataset.json: 0 of 153), and no public Hopper
figure of L2 reduction throughput was found (results/atomics-2026-12-07-s15/README.md). The one MEASURED kernel
with atomics is Inductor's in BERT's training step: ``triton_per_fused_19`` (the embedding layer norm's backward,
its ``dx`` added into the word table and the 2-row token-type table), 64.9 us in the CUPTI trace of
results/h200-2026-12-04-models/logs/time_run3.log. Its Triton code (generated on a CPU by
``scripts/inductor_kernels_cpu.py``, compiled for sm_90 by Triton: 8 warps, one row per program) issues one
``REDG.E.ADD.F32x4`` lane per 4 elements and table: ``rows x width / 4 x 2`` lanes. With the fitted model's additive
form (device time = body + atomics x atomic_ns + ...), the coefficient that reproduces the measurement is

    atomic_ns = (measured - non-atomic time) / lanes

with the non-atomic time the kernel's bytes (Inductor's ``kernel_num_gb``, results/train-gap-2026-12-07-s14/) at the
shipped model's ceiling (``bw_efficiency`` x copy bandwidth) plus ``ramp_us``: the prior. Alternatives printed
beside it: the non-atomic time by the line fitted on BERT's non-atomic Triton kernels (1.85 us + bytes / 4381 GB/s,
results/train-gap-2026-12-07-s14/README.md), and the word table's lanes only (the contended token-type adds free).
The table is zeroed before the adds (a kernel without loads). No fit row is store-only either; Inductor's zero fill
of the same 98.3 MB table, ``triton_poi_fused_18``, measured 21.9 us (and its 3.1 MB one, ``triton_poi_fused_20``,
1.4 us): ``store_bw_factor = bytes / (measured - ramp_us) / copy bandwidth`` of the large one, the small one
predicted with it as a check. Prints PRIOR figures derived from measurements, never a fit.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TRACE = REPO / "results" / "h200-2026-12-04-models" / "logs" / "time_run3.log"
INDUCTOR = REPO / "results" / "train-gap-2026-12-07-s14" / "inductor_bert_train.json"
KERNEL = "triton_per_fused_19"                         # Inductor's name in the generated wrapper
FILLS = ("triton_poi_fused_18", "triton_poi_fused_20")   # its zero fills of the word / position tables
TRACE_NAME = "triton_per_fused_add_embedding_dense_backward_ex"   # its name in the CUPTI trace (truncated)
ROWS, WIDTH, TABLES, VEC = 4096, 768, 2, 4            # BERT's tokens, hidden; word + token-type tables; float4 adds
INDUCTOR_LINE = (1.85, 4381.0)                        # us, GB/s: BERT's non-atomic Triton kernels (train-gap s14)


def measured_us(trace: Path = TRACE) -> float:
    """The kernel's MEASURED time in BERT's Inductor training step (the trace's one kernel of that name)."""
    for line in trace.read_text().splitlines():
        if '"model": "bert", "mode": "train", "variant": "inductor"' in line:
            times = [t for name, t in json.loads(line)["trace"] if name == TRACE_NAME]
            if len(times) != 1:
                raise ValueError(f"{trace}: {len(times)} kernels named {TRACE_NAME}")
            return float(times[0])
    raise ValueError(f"{trace}: no BERT train inductor row")


def kernel_bytes(path: Path = INDUCTOR) -> int:
    """Inductor's ``kernel_num_gb`` of the kernel (each argument buffer once, an in/out one twice), in bytes."""
    launches = json.loads(path.read_text())["launches"]
    (hit,) = [a for a in launches if a["kernel"] == KERNEL and a["atomic"]]
    return int(hit["bytes"])


def store_only(path: Path = INDUCTOR) -> list[tuple[str, int, float]]:
    """(kernel, bytes, MEASURED us) of Inductor's zero fills of the tables (store-only kernels: ops ``full``)."""
    launches = {a["kernel"]: a for a in json.loads(path.read_text())["launches"]}
    return [(k, int(launches[k]["bytes"]), float(launches[k]["measured_us"])) for k in FILLS]


def derive() -> dict[str, Any]:
    """The prior and its alternatives (module docstring); times in us, coefficients in ns per lane."""
    from stitchtune.cost.fitted import package_coefficients
    from stitchtune.hardware.device import get_device

    device = get_device("h200")
    c = package_coefficients(device)
    t, b = measured_us(), kernel_bytes()
    lanes = ROWS * WIDTH // VEC * TABLES
    ceiling = c.bw_efficiency * device.effective_copy_bandwidth_gbs()      # bytes per ns
    ours = b / ceiling / 1000.0 + c.ramp_us
    line = INDUCTOR_LINE[0] + b / INDUCTOR_LINE[1] / 1000.0
    ns = lambda rest, n: (t - rest) / n * 1000.0  # noqa: E731
    copy = device.effective_copy_bandwidth_gbs()
    (big, big_b, big_t), (small, small_b, small_t) = store_only()
    factor = round(big_b / (big_t - c.ramp_us) / 1000.0 / copy, 2)
    fills = {"store_bw_factor": factor, "shipped_store_bw_factor": c.store_bw_factor, "from": [big, big_b, big_t],
             "check": [small, small_b, small_t, round(c.ramp_us + small_b / (factor * copy) / 1000.0, 2)]}
    return {"measured_us": t, "bytes": b, "lanes": lanes, "non_atomic_us": round(ours, 2), "zero_fill": fills,
            "prior_ns": round(ns(ours, lanes), 3),
            "alternatives": {"inductor_line": round(ns(line, lanes), 3), "word_table_only": round(ns(ours, lanes // 2), 3)},
            "shipped_ns": c.atomic_ns}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    d = derive()
    if args.json:
        print(json.dumps(d, indent=1))
        return 0
    print(f"{KERNEL}: {d['measured_us']} us MEASURED (H200, CUPTI), {d['bytes'] / 1e6:.1f} MB, {d['lanes']:,} float4 "
          f"REDG lanes; non-atomic at the fitted ceiling + ramp {d['non_atomic_us']} us (PREDICTED)")
    print(f"prior atomic_ns = {d['prior_ns']} ns per lane (shipped {d['shipped_ns']}); alternatives: "
          + ", ".join(f"{k} {v}" for k, v in d["alternatives"].items()))
    z = d["zero_fill"]
    print(f"zero fill {z['from'][0]}: {z['from'][1] / 1e6:.1f} MB in {z['from'][2]} us MEASURED -> prior store_bw_factor "
          f"= {z['store_bw_factor']} x copy (shipped {z['shipped_store_bw_factor']}); check {z['check'][0]}: "
          f"{z['check'][1] / 1e6:.1f} MB, {z['check'][2]} us MEASURED vs {z['check'][3]} us PREDICTED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
