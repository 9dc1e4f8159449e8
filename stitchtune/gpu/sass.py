"""What a cubin's SASS says about a kernel: widths, spills, division slow paths, MUFU, loads in flight.

Contract
--------
* :func:`find_cuobjdump` -> the path of ``cuobjdump`` (``$STITCHTUNE_CUOBJDUMP``, ``PATH``, the CUDA
  toolkit next to nvcc, the ``nvidia-cuda-cuobjdump`` wheel, Triton's bundled copy) or None. Every
  caller treats None as "SASS metrics not available" (the tool is optional). ``cuobjdump -sass`` runs
  ``nvdisasm``, which it finds in its own folder (both wheels install into ``nvidia/cu13/bin``) or on ``PATH``.
* :func:`read_cubin(path)` -> ``{kernel name: SassMetrics}`` from ``cuobjdump -sass`` and
  ``cuobjdump -res-usage`` (run with an argument list and a timeout; a failure raises
  :class:`~stitchtune.errors.ToolchainError`). :func:`parse_sass` / :func:`parse_res_usage` are the
  pure parsers (tests feed them text).
* Loads in flight: walking one kernel's instructions in program order, a global load (``LDG``) is
  *pending* from its issue until an instruction reads one of its destination registers;
  ``max_loads_in_flight`` is the most loads pending at once and ``max_bytes_in_flight`` their bytes
  (per thread). Straight-line order only: a load consumed in the next loop iteration counts as
  consumed at its first use below it, or never (then it stays pending to the end).
* :func:`compiled_facts(metrics) -> CompiledFacts`: what the fitted cost model reads of a kernel's SASS
  (:mod:`stitchtune.cost.compiled`): registers, bytes and loads in flight (as above), spill instructions.
* Widths are the access size of one lane in bits (``LDG.E.128`` -> 128, ``LDG.E`` -> 32,
  ``.U16`` -> 16); ``mufu`` counts ``MUFU.<fn>`` by function (``RCP``, ``EX2``, ``RSQ`` ...); ``fchk``
  counts ``FCHK`` (the IEEE division's range check, whose failure branches to the slow path) and
  ``calls`` ``CALL`` instructions (the division / sqrt slow-path subroutines among them); ``atomics`` counts
  ``RED`` / ``REDG`` / ``ATOM`` / ``ATOMG``, ``float_atoms`` those float adds that return the old value
  (``ATOMG.E.ADD.F32x4 ... PT, RZ``: a returning atomic whose result nothing reads).
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shutil
import site
import subprocess
import sysconfig
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stitchtune.cost.compiled import CompiledFacts
from stitchtune.errors import ToolchainError

log = logging.getLogger(__name__)

TOOL_TIMEOUT_S = 60.0
_FUNC_RE = re.compile(r"^\s*Function\s*:\s*(\S+)")
_INSTR_RE = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*(.*?)\s*;")
_REG_RE = re.compile(r"(?<![A-Z0-9_])R(\d+)(\.64)?")
_RES_RE = re.compile(r"^\s*Function\s+(\S+?):\s*$")
_WIDTHS = {"128": 128, "64": 64, "U16": 16, "S16": 16, "U8": 8, "S8": 8}
_STORES = ("STG", "STS", "STL", "ST", "RED", "STSM")


@dataclass(frozen=True)
class SassMetrics:
    """One kernel's SASS (see module docstring). ``registers``, ``stack_bytes``, ``local_bytes`` and
    ``shared_bytes`` (static) come from ``-res-usage``; ``ldg`` / ``stg``: access width in bits ->
    instructions; ``spill_loads`` / ``spill_stores``: ``LDL`` / ``STL`` instructions."""

    kernel: str
    instructions: int
    registers: int = 0
    stack_bytes: int = 0
    local_bytes: int = 0
    shared_bytes: int = 0
    ldg: dict[int, int] = field(default_factory=dict)
    stg: dict[int, int] = field(default_factory=dict)
    lds: int = 0
    sts: int = 0
    spill_loads: int = 0
    spill_stores: int = 0
    barriers: int = 0
    atomics: int = 0
    #: float atomic adds whose old value comes back to the SM (``ATOM`` / ``ATOMG`` ``.F32``), a subset of
    #: ``atomics``; the fire-and-forget ``RED`` / ``REDG`` are not (:mod:`stitchtune.gpu.render_atomics`)
    float_atoms: int = 0
    mufu: dict[str, int] = field(default_factory=dict)
    fchk: int = 0
    calls: int = 0
    max_loads_in_flight: int = 0
    max_bytes_in_flight: int = 0

    @property
    def division_slow_path(self) -> bool:
        """An IEEE division (``FCHK`` + a call to the slow path) is in the code."""
        return self.fchk > 0

    @property
    def spills(self) -> int:
        return self.spill_loads + self.spill_stores

    def to_dict(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "instructions": self.instructions, "registers": self.registers,
                "stack_bytes": self.stack_bytes, "local_bytes": self.local_bytes, "shared_bytes": self.shared_bytes,
                "ldg": {str(k): v for k, v in sorted(self.ldg.items())},
                "stg": {str(k): v for k, v in sorted(self.stg.items())}, "lds": self.lds, "sts": self.sts,
                "spill_loads": self.spill_loads, "spill_stores": self.spill_stores, "barriers": self.barriers,
                "atomics": self.atomics, "float_atoms": self.float_atoms,
                "mufu": dict(sorted(self.mufu.items())), "fchk": self.fchk,
                "calls": self.calls, "max_loads_in_flight": self.max_loads_in_flight,
                "max_bytes_in_flight": self.max_bytes_in_flight}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SassMetrics:
        return cls(**{**d, "ldg": {int(k): v for k, v in d["ldg"].items()},
                      "stg": {int(k): v for k, v in d["stg"].items()}})


@dataclass(frozen=True)
class _Instr:
    opcode: str
    operands: str


def _width(opcode: str) -> int:
    """Bits per lane of a memory opcode (``LDG.E.128.CONSTANT`` -> 128; default 32)."""
    for part in opcode.split(".")[1:]:
        if part in _WIDTHS:
            return _WIDTHS[part]
    return 32


def _regs(text: str, count: int = 1) -> set[int]:
    """Register numbers named in ``text`` (``R18.64`` names R18 and R19; ``count``: registers per name)."""
    out: set[int] = set()
    for m in _REG_RE.finditer(text):
        n = 2 if m.group(2) else count
        out.update(range(int(m.group(1)), int(m.group(1)) + n))
    return out


def _dest_and_reads(ins: _Instr) -> tuple[set[int], set[int]]:
    """(registers written, registers read) of one instruction, from its operand text."""
    ops = [o.strip() for o in ins.operands.split(",")] if ins.operands else []
    base = ins.opcode.split(".")[0]
    if not ops or base in _STORES or base.startswith(("BRA", "BAR", "EXIT", "RET", "CALL", "ISETP", "FSETP")):
        return set(), _regs(ins.operands)
    width = _width(ins.opcode) if base in ("LDG", "LDS", "LDL", "LD") else 32
    return _regs(ops[0], max(1, width // 32)), _regs(", ".join(ops[1:]))


def _in_flight(instrs: list[_Instr]) -> tuple[int, int]:
    """(most LDG pending at once, their bytes) in program order (see module docstring)."""
    pending: list[tuple[set[int], int]] = []
    most, most_bytes = 0, 0
    for ins in instrs:
        dest, reads = _dest_and_reads(ins)
        if pending and reads:
            pending = [p for p in pending if not (p[0] & reads)]
        if ins.opcode.startswith("LDG"):
            pending.append((dest, _width(ins.opcode) // 8))
            most = max(most, len(pending))
            most_bytes = max(most_bytes, sum(b for _, b in pending))
    return most, most_bytes


def _metrics(name: str, instrs: list[_Instr]) -> SassMetrics:
    ldg: Counter[int] = Counter()
    stg: Counter[int] = Counter()
    mufu: Counter[str] = Counter()
    c: Counter[str] = Counter()
    for ins in instrs:
        base = ins.opcode.split(".")[0]
        if base == "LDG":
            ldg[_width(ins.opcode)] += 1
        elif base == "STG":
            stg[_width(ins.opcode)] += 1
        elif base == "MUFU":
            mufu[ins.opcode.split(".")[1] if "." in ins.opcode else "?"] += 1
        elif base in ("RED", "ATOM", "ATOMG", "REDG"):
            c["atomics"] += 1
            c["float_atoms"] += base in ("ATOM", "ATOMG") and any(p.startswith("F32") for p in ins.opcode.split("."))
        elif base in ("BAR", "BARRIER", "UCGABAR_ARV", "UCGABAR_WAIT"):
            c["barriers"] += 1
        else:
            c[base] += 1
    most, most_bytes = _in_flight(instrs)
    return SassMetrics(name, len(instrs), ldg=dict(ldg), stg=dict(stg), lds=c["LDS"], sts=c["STS"],
                       spill_loads=c["LDL"], spill_stores=c["STL"], barriers=c["barriers"], atomics=c["atomics"],
                       float_atoms=c["float_atoms"], mufu=dict(mufu), fchk=c["FCHK"], calls=c["CALL"],
                       max_loads_in_flight=most,
                       max_bytes_in_flight=most_bytes)


def parse_sass(text: str) -> dict[str, SassMetrics]:
    """``cuobjdump -sass`` text -> metrics per function (no resource usage: those fields are 0)."""
    funcs: dict[str, list[_Instr]] = {}
    cur: list[_Instr] | None = None
    for line in text.splitlines():
        m = _FUNC_RE.match(line)
        if m:
            cur = funcs.setdefault(m.group(1), [])
            continue
        i = _INSTR_RE.match(line)
        if i and cur is not None:
            cur.append(_Instr(i.group(3), i.group(4)))
    return {name: _metrics(name, instrs) for name, instrs in funcs.items()}


def parse_res_usage(text: str) -> dict[str, dict[str, int]]:
    """``cuobjdump -res-usage`` text -> ``{function: {"REG": n, "STACK": n, "SHARED": n, "LOCAL": n, ...}}``."""
    out: dict[str, dict[str, int]] = {}
    cur: str | None = None
    for line in text.splitlines():
        m = _RES_RE.match(line)
        if m:
            cur = m.group(1)
            continue
        if cur is not None and "REG:" in line:
            out[cur] = {k: int(v) for k, v in re.findall(r"([A-Z]+(?:\[\d+\])?):(\d+)", line)}
            cur = None
    return out


def _tool_dirs() -> list[Path]:
    dirs: list[Path] = []
    nvcc = shutil.which("nvcc")
    if nvcc:
        dirs.append(Path(os.path.realpath(nvcc)).parent)
    dirs.append(Path("/usr/local/cuda/bin"))
    roots = [*site.getsitepackages(), site.getusersitepackages(), sysconfig.get_paths()["purelib"]]
    for root in dict.fromkeys(roots):
        for sub in ("nvidia/cu13/bin", "nvidia/cu12/bin", "nvidia/cuda_cuobjdump/bin", "triton/backends/nvidia/bin"):
            dirs.append(Path(root) / sub)
    return dirs


@functools.lru_cache(maxsize=None)
def find_cuobjdump() -> str | None:
    """The ``cuobjdump`` to use, or None when none is installed (see module docstring)."""
    env = os.environ.get("STITCHTUNE_CUOBJDUMP")
    if env:
        return env if os.access(env, os.X_OK) else None
    found = shutil.which("cuobjdump")
    if found:
        return found
    for d in _tool_dirs():
        p = d / "cuobjdump"
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
    return None


def _run(tool: str, *args: str) -> str:
    try:
        r = subprocess.run([tool, *args], capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolchainError(f"{tool} {' '.join(args[:1])}: {exc}") from exc
    if r.returncode != 0:
        raise ToolchainError(f"{tool} {' '.join(args[:1])} failed: {r.stderr.strip()[:500]}")
    return r.stdout


def read_cubin(path: str | os.PathLike[str], tool: str | None = None) -> dict[str, SassMetrics]:
    """Metrics of every function of the cubin at ``path`` (see module docstring)."""
    tool = tool or find_cuobjdump()
    if tool is None:
        raise ToolchainError("cuobjdump not found (pip install nvidia-cuda-cuobjdump)")
    metrics = parse_sass(_run(tool, "-sass", str(path)))
    res = parse_res_usage(_run(tool, "-res-usage", str(path)))
    out = {}
    for name, m in metrics.items():
        r = res.get(name, {})
        out[name] = SassMetrics(**{**m.__dict__, "registers": r.get("REG", 0), "stack_bytes": r.get("STACK", 0),
                                   "local_bytes": r.get("LOCAL", 0), "shared_bytes": r.get("SHARED", 0)})
    return out


def compiled_facts(m: SassMetrics) -> CompiledFacts:
    """The facts of ``m`` the fitted cost model reads (:class:`~stitchtune.cost.compiled.CompiledFacts`)."""
    return CompiledFacts(registers=m.registers, bytes_in_flight=float(m.max_bytes_in_flight),
                         loads_in_flight=float(m.max_loads_in_flight), spill_instructions=m.spills)
