"""A Triton peer on the CPU: the region's kind written as Inductor writes it, compiled for sm_90, read in SASS.

Contract
--------
* :func:`region_kind(graph, plan)` names the kind of a region (:data:`KINDS`): ``softmax`` (a row max,
  exp and row sum; an additive mask when a smaller input broadcasts over rows), ``layernorm`` (a row
  mean subtracted, a variance, ``rsqrt``), ``rmsnorm`` (a mean of squares and ``rsqrt``, nothing
  subtracted), ``gelu`` (element-wise with ``erf``, ``gelu`` / ``gelu_tanh``, or ``tanh`` of a cube), ``copy`` (element-wise
  layout ops only: the head split / merge, a transpose (0, 2, 1, 3) of a 4-D tensor), ``transpose``
  (the same with (0, 2, 3, 1): K transposed) or None (no peer).
* :func:`peer_kernel(graph, plan)` -> :class:`PeerKernel`: the kind's Triton source and launch
  choices at the region's shape, made by Inductor's rules (read in torch's
  ``_inductor/runtime/triton_heuristics.py``: an inner persistent reduction of ``R = next_pow2(N) <=
  1024`` columns takes ``XBLOCK = min(1024 // R, 8)`` rows per program and ``num_warps = 1`` when
  ``R >= 256`` and ``M // 8 >= 128``, else one row and ``num_warps = clamp(R // 128, 2, 8)``; a
  pointwise kernel ``XBLOCK = 1024`` elements and 4 warps, a transposing one 32 x 32 tiles and 4 warps). The peer is the kind at the region's row
  length, not a translation of the graph: its operands are the kind's (x, mask, weight, bias), so its
  bytes can differ from the region's by a small per-row or per-column input.
* :func:`compile_peer(peer, arch)` -> SASS metrics (:class:`~stitchtune.gpu.sass.SassMetrics`) of
  ``triton.compile`` with ``GPUTarget("cuda", cc, 32)``: no GPU needed. Raises ImportError without
  ``triton`` (the ``audit`` extra) and :class:`~stitchtune.errors.ToolchainError` without cuobjdump.
* :func:`peer_audit(graph, plan, device, notes)` -> a dict for :class:`~stitchtune.analysis.audit.RegionAudit`
  ``peer`` or None (with a note saying why: no peer for the kind, triton or cuobjdump missing, a compile error).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

from stitchtune.gpu.sass import SassMetrics, read_cubin

log = logging.getLogger(__name__)

KINDS = ("softmax", "layernorm", "rmsnorm", "gelu", "copy", "transpose")
MAX_PERSISTENT_R = 1024
POINTWISE_XBLOCK = 1024

_HEADER = "import triton\nimport triton.language as tl\nfrom triton.language.extra.cuda import libdevice\n"

# Inductor's inner persistent reduction: XBLOCK rows of RBLOCK columns per program, masks where ragged.
_ROW_PRELUDE = """
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < xnumel
    r0 = tl.arange(0, RBLOCK)[None, :]
    rmask = r0 < rnumel
    m = xmask & rmask
"""

_SOURCES = {
    "softmax": """
@triton.jit
def peer_softmax(in_ptr0, in_ptr1, out_ptr0, xnumel, scale, rnumel: tl.constexpr, MASK_DIV: tl.constexpr,
                 HAS_MASK: tl.constexpr, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
""" + _ROW_PRELUDE + """
    x = tl.load(in_ptr0 + (r0 + rnumel * xindex), m, other=0.0) * scale
    if HAS_MASK:
        x = x + tl.load(in_ptr1 + (r0 + rnumel * (xindex // MASK_DIV)), m, eviction_policy="evict_last", other=0.0)
    x = tl.where(m, x, float("-inf"))
    mx = tl.max(x, 1)[:, None]
    e = tl.where(m, tl.exp(x - mx), 0.0)
    s = tl.sum(e, 1)[:, None]
    tl.store(out_ptr0 + (r0 + rnumel * xindex), e / s, m)
""",
    "layernorm": """
@triton.jit
def peer_layernorm(in_ptr0, in_ptr1, w_ptr, b_ptr, out_ptr0, xnumel, eps, rnumel: tl.constexpr,
                   RESIDUAL: tl.constexpr, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
""" + _ROW_PRELUDE + """
    x = tl.load(in_ptr0 + (r0 + rnumel * xindex), m, other=0.0)
    if RESIDUAL:
        x = x + tl.load(in_ptr1 + (r0 + rnumel * xindex), m, other=0.0)
    mean = tl.sum(tl.where(m, x, 0.0), 1)[:, None] / rnumel
    d = tl.where(m, x - mean, 0.0)
    var = tl.sum(d * d, 1)[:, None] / rnumel
    rstd = libdevice.rsqrt(var + eps)
    w = tl.load(w_ptr + r0, rmask, eviction_policy="evict_last", other=0.0)
    b = tl.load(b_ptr + r0, rmask, eviction_policy="evict_last", other=0.0)
    tl.store(out_ptr0 + (r0 + rnumel * xindex), d * rstd * w + b, m)
""",
    "rmsnorm": """
@triton.jit
def peer_rmsnorm(in_ptr0, in_ptr1, w_ptr, out_ptr0, xnumel, eps, rnumel: tl.constexpr, RESIDUAL: tl.constexpr,
                 XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
""" + _ROW_PRELUDE + """
    x = tl.load(in_ptr0 + (r0 + rnumel * xindex), m, other=0.0)
    if RESIDUAL:
        x = x + tl.load(in_ptr1 + (r0 + rnumel * xindex), m, other=0.0)
    ms = tl.sum(tl.where(m, x * x, 0.0), 1)[:, None] / rnumel
    r = libdevice.rsqrt(ms + eps)
    w = tl.load(w_ptr + r0, rmask, eviction_policy="evict_last", other=0.0)
    tl.store(out_ptr0 + (r0 + rnumel * xindex), x * r * w, m)
""",
    "gelu": """
@triton.jit
def peer_gelu(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    xmask = xindex < xnumel
    x = tl.load(in_ptr0 + xindex, xmask)
    tl.store(out_ptr0 + xindex, 0.5 * x * (1.0 + libdevice.erf(x * 0.7071067811865476)), xmask)
""",
    # the head split [B, S, H, D] -> [B, H, S, D] (a permute's clone): index math per element, as Inductor's
    "copy": """
@triton.jit
def peer_copy(in_ptr0, out_ptr0, xnumel, D: tl.constexpr, S: tl.constexpr, H: tl.constexpr, XBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    xmask = xindex < xnumel
    x0 = xindex % D
    x1 = (xindex // D) % S
    x2 = (xindex // (D * S)) % H
    x3 = xindex // (D * S * H)
    v = tl.load(in_ptr0 + (x0 + D * x2 + D * H * x1 + D * H * S * x3), xmask)
    tl.store(out_ptr0 + xindex, v, xmask)
""",
    # K transposed [B, S, H, D] -> [B, H, D, S]: Inductor's 2-D tiled pointwise kernel (y: the output's
    # rows, b h d; x: its contiguous s); Triton converts the tile's layout between the load and the store
    "transpose": """
@triton.jit
def peer_transpose(in_ptr0, out_ptr0, ynumel, xnumel, D: tl.constexpr, H: tl.constexpr, S: tl.constexpr,
                   YBLOCK: tl.constexpr, XBLOCK: tl.constexpr):
    yindex = tl.program_id(1) * YBLOCK + tl.arange(0, YBLOCK)[None, :]
    ymask = yindex < ynumel
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < xnumel
    y0 = yindex % D
    y1 = (yindex // D) % H
    y3 = yindex // (D * H)
    v = tl.load(in_ptr0 + (y0 + D * y1 + D * H * xindex + D * H * S * y3), xmask & ymask, eviction_policy="evict_last")
    tl.store(out_ptr0 + (xindex + S * yindex), v, xmask & ymask)
""",
}
TILE = 32   # Inductor's square tile of a transposing pointwise kernel (TileHint.SQUARE: 32 x 32, 4 warps)


@dataclass(frozen=True)
class PeerKernel:
    """A Triton kernel of a region's kind: ``signature`` and ``constants`` for ``triton.compile``,
    ``num_warps``, the launch ``grid``, ``xnumel`` (rows, or elements of a pointwise kernel) and the
    bytes it moves (its own operands, each once)."""

    kind: str
    name: str
    signature: tuple[tuple[str, str], ...]
    constants: tuple[tuple[str, Any], ...]
    num_warps: int
    grid: int
    xnumel: int
    bytes: int
    choices: str
    notes: tuple[str, ...] = field(default=())
    ynumel: int = 0    # a 2-D tiled kernel's rows (0: a 1-D kernel)


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def reduction_choices(rows: int, cols: int) -> tuple[int, int, int]:
    """(XBLOCK, RBLOCK, num_warps) of Inductor's inner persistent reduction (see module docstring)."""
    r = next_pow2(cols)
    if 256 <= r <= MAX_PERSISTENT_R and rows // 8 >= 128:
        return min(MAX_PERSISTENT_R // r, 8), r, 1
    return 1, r, next_pow2(min(max(r // 128, 2), 8))


def region_kind(graph: Any, plan: Any) -> str | None:
    """The region's kind (see module docstring), or None."""
    ops = {n.op for n in graph.nodes}
    reds = {o for o in ops if o.startswith("reduce_")}
    family = str(getattr(plan, "family", ""))
    if getattr(plan, "cross", ()) or "log" in ops:   # cross reductions (losses), log-softmax: no peer here
        return None
    if "exp" in ops and "reduce_max" in reds and "reduce_sum" in reds:
        return "softmax"
    if "rsqrt" in ops or "sqrt" in ops:
        if "sub" in ops and ("reduce_mean" in reds or "reduce_sum" in reds):
            return "layernorm"
        if reds:
            return "rmsnorm"
    if not reds and family.endswith("elementwise"):
        if ops & {"erf", "gelu", "gelu_tanh"} or {"tanh", "pow"} <= ops:   # a tanh alone is not a GELU
            return "gelu"
        if ops <= {"transpose", "reshape", "expand", "mul", "cast"} and "transpose" in ops:
            if _copy_shape(graph, (0, 2, 1, 3)) is not None:
                return "copy"
            return "transpose" if _copy_shape(graph, (0, 2, 3, 1)) is not None else None
    return None


def _full_inputs(graph: Any, plan: Any) -> list[str]:
    size = int(plan.M) * int(plan.N)
    return [n for n, t in graph.inputs if _numel(t.shape) == size]


def _numel(shape: Any) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def peer_kernel(graph: Any, plan: Any) -> PeerKernel | None:
    """The Triton peer of ``graph`` (None: no peer for its kind, or rows longer than a persistent reduction)."""
    kind = region_kind(graph, plan)
    if kind is None:
        return None
    M, N = int(plan.M), int(plan.N)
    sig: tuple[tuple[str, str], ...]
    consts: tuple[tuple[str, Any], ...]
    if kind == "transpose":
        shape = _copy_shape(graph, (0, 2, 3, 1))
        assert shape is not None  # region_kind found it
        B, S, H, D = shape
        ynumel, xnumel = B * H * D, S
        sig = (("in_ptr0", "*fp32"), ("out_ptr0", "*fp32"), ("ynumel", "i32"), ("xnumel", "i32"))
        consts = (("D", D), ("H", H), ("S", S), ("YBLOCK", TILE), ("XBLOCK", TILE))
        grid = -(-ynumel // TILE) * -(-xnumel // TILE)
        return PeerKernel(kind, "peer_transpose", sig, consts, 4, grid, xnumel, 8 * B * S * H * D,
                          f"2-D tiled pointwise {TILE} x {TILE}, 4 warps; [B,S,H,D]=[{B},{S},{H},{D}] -> [B,H,D,S]",
                          ynumel=ynumel)
    if kind in ("gelu", "copy"):
        total = M * N
        grid = -(-total // POINTWISE_XBLOCK)
        if kind == "gelu":
            sig = (("in_ptr0", "*fp32"), ("out_ptr0", "*fp32"), ("xnumel", "i32"))
            return PeerKernel(kind, "peer_gelu", sig, (("XBLOCK", POINTWISE_XBLOCK),), 4, grid, total, 8 * total,
                              f"pointwise XBLOCK={POINTWISE_XBLOCK}, 4 warps")
        shape = _copy_shape(graph, (0, 2, 1, 3))
        if shape is None:
            return None
        B, S, H, D = shape
        sig = (("in_ptr0", "*fp32"), ("out_ptr0", "*fp32"), ("xnumel", "i32"))
        consts = (("D", D), ("S", S), ("H", H), ("XBLOCK", POINTWISE_XBLOCK))
        return PeerKernel(kind, "peer_copy", sig, consts, 4, grid, total, 8 * total,
                          f"pointwise XBLOCK={POINTWISE_XBLOCK}, 4 warps; [B,S,H,D]=[{B},{S},{H},{D}] -> [B,H,S,D]")
    if next_pow2(N) > MAX_PERSISTENT_R:
        return None
    xb, rb, warps = reduction_choices(M, N)
    grid = -(-M // xb)
    full = len(_full_inputs(graph, plan))
    choices = f"persistent reduction XBLOCK={xb}, RBLOCK={rb}, {warps} warp(s)"
    if kind == "softmax":
        small = [t for _, t in graph.inputs if 1 < _numel(t.shape) < M * N]
        mask_rows = _numel(small[0].shape) // N if small and _numel(small[0].shape) % N == 0 else 0
        has_mask = mask_rows > 0
        div = M // mask_rows if has_mask and M % mask_rows == 0 else 1
        sig = (("in_ptr0", "*fp32"), ("in_ptr1", "*fp32"), ("out_ptr0", "*fp32"), ("xnumel", "i32"), ("scale", "fp32"))
        consts = (("rnumel", N), ("MASK_DIV", div), ("HAS_MASK", has_mask), ("XBLOCK", xb), ("RBLOCK", rb))
        nbytes = 8 * M * N + (4 * mask_rows * N if has_mask else 0)
        return PeerKernel(kind, "peer_softmax", sig, consts, warps, grid, M, nbytes,
                          choices + (f"; mask of {mask_rows} rows" if has_mask else ""))
    residual = full >= 2
    sig = (("in_ptr0", "*fp32"), ("in_ptr1", "*fp32"), ("w_ptr", "*fp32"))
    sig += (("b_ptr", "*fp32"),) if kind == "layernorm" else ()
    sig += (("out_ptr0", "*fp32"), ("xnumel", "i32"), ("eps", "fp32"))
    consts = (("rnumel", N), ("RESIDUAL", residual), ("XBLOCK", xb), ("RBLOCK", rb))
    nbytes = 4 * M * N * (2 + residual) + 4 * N * (2 if kind == "layernorm" else 1)
    return PeerKernel(kind, f"peer_{kind}", sig, consts, warps, grid, M, nbytes,
                      choices + ("; residual add" if residual else ""))


def _copy_shape(graph: Any, perm: tuple[int, ...]) -> tuple[int, int, int, int] | None:
    """[B, S, H, D]: the 4-D argument of a transpose by ``perm`` ((0, 2, 1, 3): a head split / merge;
    (0, 2, 3, 1): K transposed), or None."""
    shapes = {**{n: tuple(t.shape) for n, t in graph.inputs}, **{n.id: tuple(n.shape) for n in graph.nodes}}
    for n in graph.nodes:
        if n.op == "transpose" and tuple(n.perm) == perm and isinstance(n.args[0], str):
            shape = shapes.get(n.args[0])
            if shape is not None and len(shape) == 4:
                return int(shape[0]), int(shape[1]), int(shape[2]), int(shape[3])
    return None


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def compile_peer(peer: PeerKernel, arch: str = "sm_90") -> SassMetrics:
    """SASS metrics of ``peer`` compiled by Triton for ``arch`` (see module docstring)."""
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, without its warning
    import triton
    from triton.backends.compiler import GPUTarget

    cc = int(arch.removeprefix("sm_").rstrip("af"))
    with tempfile.TemporaryDirectory(prefix="stitchtune-peer-") as tmp:
        path = os.path.join(tmp, f"{peer.name}.py")
        with open(path, "w") as f:
            f.write(_HEADER + _SOURCES[peer.kind])
        spec = importlib.util.spec_from_file_location(peer.name, path)
        mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(mod)  # type: ignore[union-attr]
        fn = getattr(mod, peer.name)
        consts = dict(peer.constants)
        signature = {**dict(peer.signature), **{k: "constexpr" for k in consts}}
        # as Inductor's triton_meta: pointers (and the element count where it divides) 16-byte aligned
        attrs = {(fn.arg_names.index(k),): [["tt.divisibility", 16]] for k, t in peer.signature
                 if t.startswith("*") or (k == "xnumel" and peer.xnumel % 16 == 0)
                 or (k == "ynumel" and peer.ynumel % 16 == 0)}
        src = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=consts, attrs=attrs)
        compiled = triton.compile(src, target=GPUTarget("cuda", cc, 32), options={"num_warps": peer.num_warps})
        cubin = os.path.join(tmp, f"{peer.name}.cubin")
        with open(cubin, "wb") as f:
            f.write(compiled.asm["cubin"])
        metrics = read_cubin(cubin)
    name = next((k for k in metrics if k.startswith(peer.name)), None)
    if name is None:
        raise ValueError(f"no function {peer.name} in the Triton cubin ({sorted(metrics)})")
    m = metrics[name]
    # Triton's shared memory is dynamic (its metadata), not the cubin's static figure
    shared = max(m.shared_bytes, int(getattr(compiled.metadata, "shared", 0) or 0))
    return SassMetrics(**{**m.__dict__, "shared_bytes": shared})


def peer_audit(graph: Any, plan: Any, device: Any, notes: list[str]) -> dict[str, Any] | None:
    """The peer's description and SASS metrics as a dict, or None with a note (see module docstring)."""
    from stitchtune.errors import ToolchainError
    from stitchtune.hardware.occupancy import occupancy

    if plan is None:
        notes.append("Triton peer: no plan given")
        return None
    peer = peer_kernel(graph, plan)
    if peer is None:
        notes.append(f"Triton peer: none for this region (kind {region_kind(graph, plan)})")
        return None
    if not triton_available():
        notes.append("Triton peer skipped: triton is not installed (pip install 'stitchtune[audit]')")
        return None
    arch = f"sm_{device.cc_major}{device.cc_minor}"
    try:
        m = compile_peer(peer, arch)
    except ToolchainError as exc:
        notes.append(f"Triton peer skipped: {exc}")
        return None
    except Exception as exc:  # noqa: BLE001 - a Triton compile failure is data for the audit
        log.warning("Triton peer %s did not compile: %s", peer.name, exc)
        notes.append(f"Triton peer {peer.name} did not compile: {type(exc).__name__}: {str(exc)[:200]}")
        return None
    block = 32 * peer.num_warps
    occ = occupancy(device, block, m.registers or 32, m.shared_bytes)
    capacity = occ.blocks_per_sm * device.sm_count
    return {"kind": peer.kind, "kernel": peer.name, "choices": peer.choices, "grid": peer.grid, "block": block,
            "bytes": peer.bytes, "floor_us": peer.bytes / (device.dram_bandwidth_gbs * 1e3),
            "blocks_per_sm": occ.blocks_per_sm, "occupancy": occ.occupancy,
            "waves": peer.grid / capacity if capacity else None, "sass": m.to_dict()}
