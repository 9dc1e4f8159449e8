"""Draw docs/img/stitching.svg: a layer norm as separate kernels vs one stitched kernel.

    python scripts/draw_stitching.py [--png PATH]   # --png also writes a PNG (to look at it)
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "docs" / "img" / "stitching.svg"
KERNEL, STAGE, DRAM, ONCHIP = "#dbe8f6", "#ffffff", "#f3d9c4", "#2a7a3b"


def box(ax, x, y, w, h, text, color, size=10, weight="normal"):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.08",
                                fc=color, ec="#333333", lw=1.0))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size, weight=weight)


def arrow(ax, x0, y0, x1, y1, color="#8a4b1c", style="-|>", lw=1.3):
    ax.add_patch(FancyArrowPatch((x0, y0), (x1, y1), arrowstyle=style, mutation_scale=10, color=color, lw=lw))


def draw() -> plt.Figure:
    fig, ax = plt.subplots(figsize=(8.4, 3.6))
    ax.set_xlim(0, 12)
    ax.set_ylim(0, 5.2)
    ax.axis("off")

    # left: one kernel per step, every intermediate through DRAM
    ax.text(2.9, 5.0, "unfused: 3 kernels", ha="center", fontsize=11, weight="bold")
    box(ax, 0.2, 0.2, 5.4, 0.7, "DRAM (global memory)", DRAM, weight="bold")
    steps = [("kernel 1", "mean", "x", "mean"), ("kernel 2", "variance", "x, mean", "var"),
             ("kernel 3", "normalize", "x, mean, var", "y")]
    for i, (name, what, reads, writes) in enumerate(steps):
        x = 0.3 + i * 1.85
        box(ax, x, 2.9, 1.6, 1.1, f"{name}\n{what}", KERNEL, size=9)
        arrow(ax, x + 0.4, 0.9, x + 0.4, 2.9)
        arrow(ax, x + 1.2, 2.9, x + 1.2, 0.9)
        ax.text(x + 0.35, 1.9, reads, rotation=90, ha="right", va="center", fontsize=8, color="#8a4b1c")
        ax.text(x + 1.25, 1.9, writes, rotation=90, ha="left", va="center", fontsize=8, color="#8a4b1c")
    ax.text(2.9, 4.35, "each step reads and writes DRAM", ha="center", fontsize=9)
    ax.text(2.9, -0.15, "x read 3 times, mean and var round-trip DRAM", ha="center", fontsize=9, color="#8a4b1c")

    # right: one kernel, stages hand data over on chip
    ax.text(9.1, 5.0, "stitched: 1 kernel", ha="center", fontsize=11, weight="bold")
    box(ax, 6.4, 0.2, 5.4, 0.7, "DRAM (global memory)", DRAM, weight="bold")
    box(ax, 6.6, 1.35, 5.0, 3.35, "", KERNEL)
    ax.text(9.1, 4.45, "one kernel, row kept in registers", ha="center", fontsize=9)
    stages = ["mean: warp shuffles + shared memory", "var: from the registers", "normalize, write y"]
    for i, name in enumerate(stages):
        y = 3.55 - i * 0.9
        box(ax, 7.0, y, 4.2, 0.55, name, STAGE, size=9)
        if i:
            arrow(ax, 9.1, y + 0.9, 9.1, y + 0.55, color=ONCHIP, lw=1.6)
    arrow(ax, 7.6, 0.9, 7.6, 3.55)
    ax.text(7.7, 1.1, "x once", fontsize=8, color="#8a4b1c")
    arrow(ax, 10.6, 1.75, 10.6, 0.9)
    ax.text(10.7, 1.1, "y once", fontsize=8, color="#8a4b1c")
    ax.text(9.1, -0.15, "stages hand data over on chip", ha="center", fontsize=9, color=ONCHIP)
    fig.tight_layout()
    return fig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--png", default=None, help="also write a PNG here")
    args = ap.parse_args()
    plt.rcParams["svg.fonttype"] = "none"   # text stays text: a small, searchable SVG
    plt.rcParams["svg.hashsalt"] = "stitchtune"   # stable ids: the same drawing gives the same file
    fig = draw()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(OUT, metadata={"Date": None})
    if args.png:
        fig.savefig(args.png, dpi=110)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
