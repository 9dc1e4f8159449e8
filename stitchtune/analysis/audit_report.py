"""Markdown and JSON of kernel audits (:mod:`stitchtune.analysis.audit`).

Contract: :func:`audit_markdown(audits, title)` -> one Markdown document (a summary table of the
regions, then per region its kernels, the Triton peer beside them, each kernel's unmet floor-ready
criteria and the notes); :func:`audit_json(audits)` -> a JSON-ready dict. Every time in them is a
floor (bytes / datasheet bandwidth) or a prediction of the cost model, and says so: nothing is measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stitchtune.analysis.audit import KernelAudit, RegionAudit

HEADER = ("CPU static analysis (no GPU): floors are unique bytes at the device's datasheet bandwidth, "
          "`pred` times are the cost model's predictions and `fitted` times those of the IR-feature model fitted "
          "to GPU data (device time, no launch term); nothing here is a measured time.")


def _widths(d: dict[Any, int]) -> str:
    return " ".join(f"{v}x{k}" for k, v in sorted(d.items(), key=lambda kv: -int(kv[0]))) or "-"


def _mufu(d: dict[str, int]) -> str:
    return " ".join(f"{k}:{v}" for k, v in sorted(d.items())) or "-"


def _f(x: float | None, nd: int = 1) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


_COLS = ("kernel", "grid x block", "regs", "smem KiB", "blocks/SM (limiter)", "waves", "lanes", "worst sectors",
         "banks",
         "LDG", "STG", "LDS/STS/BAR", "in flight/SM KiB", "MUFU", "FCHK", "spills", "dead smem", "floor us",
         "pred us", "fitted us")


def _kernel_row(k: KernelAudit) -> str:
    s = k.sass
    cells = [
        f"`{k.name}`", f"{k.grid} x {k.block}", f"{k.registers}{'' if k.registers_from == 'sass' else '~'}",
        _f(k.smem_bytes / 1024), f"{k.blocks_per_sm} ({k.limiter})", _f(k.waves, 2),
        "-" if k.active_lanes is None else f"{k.active_lanes:.0%}",
        "-" if k.worst_sector_ratio is None else f"{k.worst_sector_ratio:.2f}x",
        "-" if k.worst_bank_ratio is None else f"{k.worst_bank_ratio:.2f}x",
        _widths(s.ldg) if s else "-", _widths(s.stg) if s else "-", f"{s.lds}/{s.sts}/{s.barriers}" if s else "-",
        _f(k.in_flight_per_sm / 1024), _mufu(s.mufu) if s else "-", str(s.fchk) if s else "-",
        str(s.spills) if s else "-", ", ".join(k.dead_shared) or "-", _f(k.floor_us), _f(k.predicted_us),
        _f(k.fitted_us),
    ]
    return "| " + " | ".join(cells) + " |"


def _peer_row(p: dict[str, Any]) -> str:
    s = p["sass"]
    per_thread = s["max_bytes_in_flight"]
    resident = min(p["blocks_per_sm"], p["grid"])
    cells = [
        f"Triton peer `{p['kernel']}`", f"{p['grid']} x {p['block']}", str(s["registers"]),
        _f(s["shared_bytes"] / 1024), f"{p['blocks_per_sm']}", _f(p["waves"], 2), "-", "-", "-",
        _widths(s["ldg"]), _widths(s["stg"]), f"{s['lds']}/{s['sts']}/{s['barriers']}",
        _f(per_thread * p["block"] * resident / 1024), _mufu(s["mufu"]), str(s["fchk"]),
        str(s["spill_loads"] + s["spill_stores"]), "-", _f(p["floor_us"]), "-", "-",
    ]
    return "| " + " | ".join(cells) + " |"


def _region(a: RegionAudit) -> list[str]:
    out = [f"### {a.graph} (`{a.workload_key[:12]}`)", "",
           f"ops: {a.ops}", "",
           f"{a.family} {a.rows} x {a.cols}; unique bytes {a.unique_bytes / 1e6:.1f} MB, floor {a.floor_us:.1f} us, "
           f"predicted {_f(a.predicted_us)} us, fitted {_f(a.fitted_us)} us; floor-ready: {'yes' if a.floor_ready else 'no'}"
           + (f"; occurs: {a.uses}" if a.uses else ""), "",
           f"schedule ({a.schedule_from}): `{a.schedule}`", "",
           "| " + " | ".join(_COLS) + " |", "|" + "---|" * len(_COLS)]
    out += [_kernel_row(k) for k in a.kernels]
    if a.peer:
        out.append(_peer_row(a.peer))
    out.append("")
    if a.peer:
        out += [f"Triton peer: {a.peer['kind']}, {a.peer['choices']} (Inductor's rules; its own operands, "
                f"{a.peer['bytes'] / 1e6:.1f} MB)", ""]
    for k in a.kernels:
        if k.problems:
            out.append(f"- `{k.name}` misses: " + "; ".join(_short(k.problems)))
    out += [f"- note: {n}" for n in a.notes]
    out.append("")
    return out


def _short(problems: Sequence[str], most: int = 6) -> list[str]:
    """At most ``most`` problems, the rest counted."""
    ps = list(problems)
    return ps[:most] + ([f"and {len(ps) - most} more"] if len(ps) > most else [])


def audit_markdown(audits: Sequence[RegionAudit], title: str = "Kernel audit", skipped: Sequence[str] = ()) -> str:
    """The Markdown document (see module docstring); ``skipped``: regions not audited, one line each."""
    out = [f"# {title}", "", HEADER, "",
           "`regs` with `~`: the lowering's estimate (no cubin read). `lanes`: active lanes per warp request in the "
           "emulated slice. `worst sectors`: the largest ratio of 32-byte sectors to the ideal over the kernel's "
           "global accesses; `banks`: the most shared-memory wavefronts per warp request (1.00x: no bank conflict). "
           "Floor-ready criteria: docs/audit.md.", "",
           "`fitted ideal`: the fitted model's time of the same launches with every inefficiency the IR walk sees "
           "taken away (the least a kernel moving these bytes in this grid is predicted at).", "",
           "| region | ops | occurs | kernels | floor us | pred us | fitted us | fitted ideal us | fitted / floor "
           "| floor-ready | peer |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for a in audits:
        ratio = f"{a.fitted_us / a.floor_us:.2f}" if a.fitted_us and a.floor_us else "-"
        peer = a.peer["kind"] if a.peer else "-"
        ready = sum(k.floor_ready for k in a.kernels)
        ops = a.ops if len(a.ops) <= 60 else a.ops[:57] + "..."
        out.append(f"| {a.graph} | {ops} | {a.uses or '-'} | {len(a.kernels)} | {a.floor_us:.1f} | "
                   f"{_f(a.predicted_us)} | {_f(a.fitted_us)} | {_f(a.fitted_ideal_us)} | {ratio} | "
                   f"{ready}/{len(a.kernels)} | {peer} |")
    out.append("")
    out += [f"- not audited: {s}" for s in skipped] + ([""] if skipped else [])
    for a in audits:
        out += _region(a)
    return "\n".join(out)


def audit_json(audits: Sequence[RegionAudit], skipped: Sequence[str] = ()) -> dict[str, Any]:
    """A JSON-ready dict of the audits (see module docstring)."""
    return {"note": HEADER, "regions": [a.to_dict() for a in audits], "skipped": list(skipped)}
