"""The bench results (CPU, pure): DRAM byte floors, the results table, its summary, text and chart.

Contract
--------
* :func:`floor_reason` gives a workload's :class:`Floor` on a device: ``min_bytes`` (each input read
  once, a gathered table at most its gathered rows, + each output written once: ``Graph.min_bytes``), the re-read a dependency forces (``reread_bytes``) and the
  reasoning as text; :func:`on_chip_bytes` is the registers + shared memory + L2 it assumes can hold
  data between two uses.
* The results table (:data:`BENCH_COLUMNS`), one row per (workload, system), built by
  :func:`results_table` from :class:`SystemTiming` values, the floors and a copy bandwidth:
  ``median_us`` (median time per call, measured), ``min_bytes`` (each input read once + each output
  written once), ``floor_bytes`` (``min_bytes`` + the re-read a dependency forces, see
  :func:`floor_reason`), ``floor_us`` (``floor_bytes`` / copy bandwidth), ``fraction_of_floor``
  (``floor_us / median_us``: 1.0 = at the floor), ``speedup_vs_this`` (this system's ``median_us`` /
  stitchtune's ``median_us`` for the same workload: > 1 means stitchtune is that many times faster;
  1.0 on stitchtune's own row), ``checked`` and ``note``. :func:`summarize` and :func:`format_table`
  leave unchecked rows out of every summary. :func:`write_results` writes the table as
  ``bench_<device>.csv`` plus a bar chart ``bench_<device>.png`` (:func:`plot_results`).

No GPU and no timing here (that is :mod:`stitchtune.bench.measure`); matplotlib is imported inside
:func:`plot_results`. Everything here is re-exported by :mod:`stitchtune.bench.measure`.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from stitchtune.graph.ops import REDUCTIONS
from stitchtune.graph.values import ITEMSIZE

if TYPE_CHECKING:
    from stitchtune.hardware.device import Device
    from stitchtune.graph.parse import Graph

STITCHTUNE = "stitchtune"

BENCH_COLUMNS: tuple[str, ...] = (
    "workload", "system", "median_us", "min_bytes", "floor_bytes", "floor_us", "fraction_of_floor",
    "speedup_vs_this", "checked", "note",
)


# ----------------------------------------------------------------------------------------------
# floors
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Floor:
    """The fewest DRAM bytes a schedule of a workload moves, and why.

    ``floor_bytes = min_bytes + reread_bytes``; ``on_chip_bytes`` is the device's registers + shared
    memory of all SMs + L2, the most a kernel could keep on chip between two uses of a value.
    """

    min_bytes: int
    reread_bytes: int
    on_chip_bytes: int
    reason: str

    @property
    def floor_bytes(self) -> int:
        return self.min_bytes + self.reread_bytes


def on_chip_bytes(device: Device) -> int:
    """Registers + shared memory of every SM + the L2 cache, in bytes, from the device description."""
    return int(device.sm_count * (4 * device.regs_per_sm + device.smem_per_sm) + device.l2_bytes)


def _fmt_bytes(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def _ancestors(graph: Graph, name: str) -> set[str]:
    """All tensors ``name`` depends on (inputs and nodes), ``name`` excluded."""
    return set(graph.upstream([name])) - {name}


def _reduction_group_elems(shape: tuple[int, ...], axes: tuple[int, ...]) -> int:
    """Elements that must all be read, in row-major (coalesced) order, before one result of a
    reduction over ``axes`` exists: from the first reduced axis to the last axis."""
    first = min(axes)
    return int(np.prod(shape[first:], dtype=np.int64))


def floor_reason(graph: Graph, device: Any) -> Floor:
    """The DRAM byte floor of ``graph`` on ``device`` with its reasoning.

    ``min_bytes``: each input read once (a gathered table: at most the rows gathered), each output
    written once (``Graph.min_bytes``).
    A forced re-read exists only where a reduction's result is broadcast back to a consumer that
    also needs the reduction's own input data (AStitch's one-to-many dependency): the input must then
    stay on chip from the moment it is read for the reduction until the consumer uses it. Reading in
    row-major order with coalesced accesses (what every schedule in stitchtune's space and every peer
    does), one reduction result needs all elements from the first reduced axis to the last before it
    exists (a row for a last-axis reduction, the whole tensor for a reduction over axis 0 of a 2-D
    tensor). If one such group of the re-used graph inputs fits in ``on_chip_bytes`` (registers +
    shared memory + L2) nothing must be re-read; otherwise at least the excess of every group is read
    twice. Caveat stated in the reason: a schedule reading a column reduction in narrow column strips
    (32-byte sectors) could in principle avoid that re-read; such schedules are outside the space.
    """
    min_bytes = int(graph.min_bytes())
    chip = on_chip_bytes(device)
    input_names = {n for n, _ in graph.inputs}
    parts: list[str] = [f"min {_fmt_bytes(min_bytes)} = inputs read once + outputs written once"
                        + (" (gathered tables: the rows gathered)" if min_bytes < graph.io_bytes() else "")]
    reread = 0
    reductions = [n for n in graph.nodes if n.op in REDUCTIONS]
    if not reductions:
        parts.append("no reduction: element-wise, nothing is needed twice")
    for red in reductions:
        src = red.tensor_args[0]
        feeds = (_ancestors(graph, red.id) | {red.id}) & input_names  # graph inputs the reduction reads
        after = [n for n in graph.nodes if red.id in _ancestors(graph, n.id)]
        # graph inputs that a consumer of the result needs again through a path that avoids the reduction
        reused_set: set[str] = set()
        for n in after:
            for a in n.args:
                if isinstance(a, str) and a != red.id and red.id not in _ancestors(graph, a):
                    reused_set |= (_ancestors(graph, a) | {a}) & feeds
        reused = sorted(reused_set)
        in_shape = tuple(graph.spec(src).shape)
        if not after or not reused:
            parts.append(f"{red.id}: {red.op} over axes {list(red.axes)}, its input is not needed after it")
            continue
        group = _reduction_group_elems(in_shape, tuple(red.axes))
        total = int(np.prod(in_shape, dtype=np.int64))
        groups = max(1, total // group)
        held = sum(min(group, int(np.prod(graph.spec(t).shape, dtype=np.int64))) * ITEMSIZE[graph.spec(t).dtype]
                   for t in reused)
        if held <= chip:
            parts.append(f"{red.id}: {red.op} over axes {list(red.axes)} of {list(in_shape)}, result broadcast "
                         f"back to {', '.join(reused)}; one group ({_fmt_bytes(held)}) fits on chip "
                         f"({_fmt_bytes(chip)} = registers + shared memory + L2): no forced re-read")
        else:
            extra = (held - chip) * groups
            reread += extra
            parts.append(f"{red.id}: {red.op} over axes {list(red.axes)} of {list(in_shape)} needs all "
                         f"{_fmt_bytes(held)} of {', '.join(reused)} before its result exists, more than fits "
                         f"on chip ({_fmt_bytes(chip)} = registers + shared memory + L2): at least "
                         f"{_fmt_bytes(extra)} must be read twice (a column-strip schedule could avoid it; "
                         "not in the space)")
    return Floor(min_bytes=min_bytes, reread_bytes=int(reread), on_chip_bytes=chip, reason="; ".join(parts))


# ----------------------------------------------------------------------------------------------
# the results table (CPU, pure)
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SystemTiming:
    """One system's outcome on one workload. ``median_us`` None = not timed (see ``note``)."""

    workload: str
    system: str
    median_us: float | None
    checked: bool
    note: str = ""
    samples_us: tuple[float, ...] = field(default=(), repr=False)


def results_table(timings: Iterable[SystemTiming], floors: dict[str, Floor], copy_bw: float) -> pd.DataFrame:
    """The results table (:data:`BENCH_COLUMNS`) from timings, per-workload floors and the copy
    bandwidth in bytes/s (read + written) measured in the same run."""
    if not copy_bw > 0:
        raise ValueError("copy bandwidth must be positive")
    rows = []
    timings = list(timings)
    st_time = {t.workload: t.median_us for t in timings if t.system == STITCHTUNE and t.median_us}
    for t in timings:
        fl = floors[t.workload]
        floor_us = fl.floor_bytes / copy_bw * 1e6
        med = t.median_us if t.median_us is not None and math.isfinite(t.median_us) else None
        st = st_time.get(t.workload)
        rows.append({
            "workload": t.workload,
            "system": t.system,
            "median_us": med,
            "min_bytes": fl.min_bytes,
            "floor_bytes": fl.floor_bytes,
            "floor_us": floor_us,
            "fraction_of_floor": floor_us / med if med else None,
            "speedup_vs_this": med / st if med and st else None,
            "checked": bool(t.checked),
            "note": t.note,
        })
    df = pd.DataFrame(rows, columns=list(BENCH_COLUMNS))
    for c in ("median_us", "floor_us", "fraction_of_floor", "speedup_vs_this"):
        df[c] = df[c].astype("float64")
    return df


def _geomean(xs: Sequence[float]) -> float | None:
    xs = [x for x in xs if x and x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def summarize(df: pd.DataFrame) -> dict[str, Any]:
    """Geometric-mean speedups of stitchtune over the best checked peer of each workload and over
    each peer system, and the workloads where stitchtune reaches 0.9 of the floor. Unchecked rows
    are ignored."""
    ok = df[df["checked"] & df["median_us"].notna()]
    peers = ok[ok["system"] != STITCHTUNE]
    st = ok[ok["system"] == STITCHTUNE].set_index("workload")
    best: list[float] = []
    for wl, g in peers.groupby("workload"):
        if wl in st.index:
            best.append(float(g["median_us"].min()) / float(st.loc[wl, "median_us"]))
    per_system = {sys_: _geomean(list(g["speedup_vs_this"])) for sys_, g in peers.groupby("system")}
    return {
        "geomean_speedup_vs_best_peer": _geomean(best),
        "geomean_speedup_vs": per_system,
        "at_0.9_floor": sorted(st.index[st["fraction_of_floor"] >= 0.9].tolist()),
        "workloads": int(st.shape[0]),
    }


def format_table(df: pd.DataFrame) -> str:
    """A plain-text table for the terminal (one line per row, then the summary)."""
    header = (f"{'workload':<34} {'system':<42} {'median_us':>10} {'floor_us':>9} {'of_floor':>8} "
              f"{'speedup':>8} {'ok':>3}")
    lines = [header]
    for r in df.itertuples(index=False):
        med = f"{r.median_us:10.1f}" if pd.notna(r.median_us) else f"{'-':>10}"
        frac = f"{r.fraction_of_floor:8.2f}" if pd.notna(r.fraction_of_floor) else f"{'-':>8}"
        spd = f"{r.speedup_vs_this:7.2f}x" if pd.notna(r.speedup_vs_this) else f"{'-':>8}"
        lines.append(f"{r.workload[:34]:<34} {r.system[:42]:<42} {med} {r.floor_us:9.1f} {frac} {spd} "
                     f"{'yes' if r.checked else 'NO':>3}")
    s = summarize(df)

    def f(x: float | None) -> str:
        return f"{x:.2f}x" if x else "-"

    lines.append(f"geomean speedup of stitchtune over the best peer: {f(s['geomean_speedup_vs_best_peer'])}; "
                 + ", ".join(f"over {k}: {f(v)}" for k, v in s["geomean_speedup_vs"].items()))
    lines.append(f"stitchtune at >= 0.9 of the floor on {len(s['at_0.9_floor'])}/{s['workloads']} workloads")
    return "\n".join(lines)


def device_slug(name: str) -> str:
    """A file-name-safe short device name: ``NVIDIA H200`` -> ``h200``."""
    s = re.sub(r"^nvidia[\s_-]*", "", name.strip(), flags=re.IGNORECASE).lower()
    s = re.sub(r"[^a-z0-9]+", "_", s).strip("_")
    return s or "device"


def plot_results(df: pd.DataFrame, path: str | os.PathLike[str], title: str) -> None:
    """Grouped bar chart: per workload, each system's time (µs, log scale) and fraction of the floor."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    workloads = list(dict.fromkeys(df["workload"]))
    systems = list(dict.fromkeys(df["system"]))
    n = len(systems)
    width = 0.8 / max(n, 1)
    x = np.arange(len(workloads))
    fig, (ax_t, ax_f) = plt.subplots(2, 1, figsize=(max(9, 1.4 * len(workloads) + 5), 8), sharex=True)
    for i, sys_ in enumerate(systems):
        sub = df[df["system"] == sys_].set_index("workload")

        def col(c: str, sub: pd.DataFrame = sub) -> list[float]:
            return [float(sub.loc[w, c]) if w in sub.index and pd.notna(sub.loc[w, c]) else 0.0 for w in workloads]

        bad = [w in sub.index and not bool(sub.loc[w, "checked"]) for w in workloads]
        off = x - 0.4 + width * (i + 0.5)
        for ax, vals in ((ax_t, col("median_us")), (ax_f, col("fraction_of_floor"))):
            bars = ax.bar(off, vals, width, label=sys_ if ax is ax_t else None, color=f"C{i}")
            for b, is_bad in zip(bars, bad):
                if is_bad:  # failed the reference check: hatched, left out of the summary
                    b.set_hatch("xx")
                    b.set_alpha(0.4)
    floors = df.drop_duplicates("workload").set_index("workload")["floor_us"]
    ax_t.hlines([floors[w] for w in workloads], x - 0.42, x + 0.42, colors="black", linewidth=2, zorder=3,
                label="floor: bytes / measured copy bandwidth")
    ax_t.set_yscale("log")
    ax_t.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax_t.yaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax_t.set_ylabel("median time per call (µs, log scale)")
    ax_t.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax_f.axhline(0.9, color="black", linestyle="--", linewidth=1, label="0.9 of the floor (target)")
    ax_f.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax_f.set_ylabel("fraction of the copy-bandwidth floor\n(floor_us / median_us, higher is better)")
    ax_f.set_xticks(x)
    ax_f.set_xticklabels(workloads, rotation=30, ha="right", fontsize=8)
    ax_f.text(1.02, 0.8, "hatched bars: output failed\nthe reference check", transform=ax_f.transAxes, fontsize=8,
              va="top")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_results(df: pd.DataFrame, out_dir: str | os.PathLike[str], device_name: str,
                  title_extra: str = "") -> tuple[Path, Path]:
    """Write ``bench_<device>.csv`` and ``bench_<device>.png`` under ``out_dir``; return both paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    slug = device_slug(device_name)
    csv_path, png_path = out / f"bench_{slug}.csv", out / f"bench_{slug}.png"
    df.to_csv(csv_path, index=False, float_format="%.6g")
    title = f"stitchtune bench on {device_name}" + (f" ({title_extra})" if title_extra else "")
    plot_results(df, png_path, title)
    return csv_path, png_path
