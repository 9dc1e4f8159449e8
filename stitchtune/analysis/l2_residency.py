"""Which bytes of a model region's traffic the L2 serves: a cache simulation over the FX graph (an estimate).

Contract
--------
* :func:`simulate(regions, capacity, policy="lru", streaming=frozenset(), gemm=None) -> dict[str, L2Occurrence]`:
  walks the FX graph(s) of
  ``regions`` (the captured :class:`~stitchtune.importers.torch_regions.TorchRegion` of one call: every region of a
  graph, so that each is one fused op, emitted at its first node) in graph order and keeps a cache of ``capacity``
  bytes of **storages** (``policy`` in :data:`POLICIES`: ``lru``, or ``random``: the expectation of random
  replacement, every storage losing its share of the room each new byte takes). A view, ``getitem`` or other
  :data:`NO_TRAFFIC` op is its base's storage; a multi-output op writes one storage per
  output; a placeholder (parameter, model input, a tensor saved for the backward) is a storage that is not in the
  cache when the graph starts. Each op reads its distinct input storages, then writes its outputs (a region: its
  ``inputs`` and ``outputs``; its inner nodes move nothing; any other ``call_function``: its FX inputs and
  ``meta["val"]``). Residency is by bytes, not all-or-nothing: a storage holds the bytes of its last touch
  (at most ``capacity``) and, under ``lru``, loses them from the least recently touched end as newer bytes come
  in, so a tensor larger than the cache is partly resident. Every touch counts (reads too: an input last read by a GEMM two ops
  before is as resident as one it wrote). Dirty bytes (written, not yet written back) are tracked: evicting them
  is a DRAM write-back charged to the op that evicts them; a write larger than the cache writes its overflow back
  at once. Returns, per region name, an :class:`L2Occurrence`.
  With ``streaming`` (FX op names, e.g. ``{"mm", "bmm"}``), those ops' reads hit what is resident but neither enter
  the cache nor evict (operands read evict-first). With ``gemm`` (a
  :class:`~stitchtune.analysis.gemm_traffic.GemmTiling`), every op of :data:`GEMM_OPS` with 2-D or batched operands
  runs wave by wave of output tiles (:func:`~stitchtune.analysis.gemm_traffic.waves`): per wave the operand bytes
  touched so far, then the wave's tiles written as one piece of the output's storage (a later read of it reads its
  pieces in proportion, each piece's hits counted before any is touched); without it a GEMM is one op (operands
  read, then the output written whole). The audit's parameters (:func:`stitchtune.analysis.l2_credit.simulate_l2`)
  use both on the H200 (results/l2-2026-12-07-s15/).
* :func:`resident_bytes(regions, capacity, policy="lru") -> dict[str, float]`: per region name, its ``resident`` bytes.

An :class:`L2Occurrence` compares a region's DRAM traffic in the model with the accounting of the fitted cost model,
whose rows were timed after an L2 flush and which counts every unique byte (``read_bytes + write_bytes``) as a DRAM
byte: in the model the region reads ``resident`` bytes from the L2, leaves its outputs dirty in the L2 (written back
later, by whichever op evicts them) and writes back the dirty lines its own traffic evicts (``writeback``: earlier
ops' outputs and its own overflow), so ``saved_bytes = read_bytes + write_bytes - dram_bytes`` with
``dram_bytes = read_bytes - resident + writeback`` (negative when it writes back more than it leaves dirty).
:meth:`L2Occurrence.saved` counts the saving four ways (:data:`ACCOUNTINGS`); the checked one is ``reads`` (the
resident input bytes alone; ``flushed`` adds the write-backs of the flush's dirty bytes that the fitted rows' run
paid, :attr:`L2Occurrence.flush_writeback`, and scores worse), see results/l2-2026-12-07-s14/ and s15/.

Limits (why it is an estimate, checked in results/l2-2026-12-07-s14/): the H200's L2 is two partitions and
neither LRU nor random (``capacity`` is ``keep`` x the device's L2; policy and ``keep`` chosen there); inside a
region the inputs are taken as read before its outputs are written, each at its resident bytes when the region starts (a strict LRU
streaming an input larger than the cache in write order would hit less); an op's bytes are its tensors' sizes
(a GEMM reads its operands once, wave by wave with ``gemm``; split-K partials, the cuBLAS workspace and the
CPU-side copies are not seen).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Hashable, Iterable, Sequence

from stitchtune.analysis.gemm_traffic import GemmTiling, gemm_shape, waves

__all__ = ["ACCOUNTINGS", "GEMM_OPS", "L2Occurrence", "NO_TRAFFIC", "POLICIES", "resident_bytes", "simulate"]

#: the replacement policies :func:`simulate` offers (see :class:`_Cache`)
POLICIES = ("lru", "random")
#: how a region's saved DRAM bytes are counted (see :meth:`L2Occurrence.saved`)
ACCOUNTINGS = ("reads", "writeback", "deferred", "flushed")

#: FX ops that move no data (views, tuple access): their output is their first input's storage
NO_TRAFFIC = frozenset({"view", "_unsafe_view", "permute", "expand", "t", "transpose", "alias", "select", "slice",
                        "unsqueeze", "squeeze", "reshape", "as_strided", "getitem", "detach", "lift_fresh_copy"})


@dataclass(frozen=True)
class L2Occurrence:
    """One region occurrence's traffic (bytes): what it reads and writes, what of it the L2 serves (module docstring)."""

    read_bytes: float
    write_bytes: float
    resident: float      # input bytes in the L2 when the region starts
    writeback: float     # dirty bytes written back to DRAM during the region (earlier ops' and its own overflow)
    own_writeback: float = 0.0   # the part of ``writeback`` that is the region's own outputs (they did not fit)
    flush_writeback: float = 0.0  # the flush's dirty bytes the same traffic writes back when run after an L2 flush

    @property
    def dram_bytes(self) -> float:
        """The region's DRAM traffic in the model: reads that miss, plus the write-backs it causes."""
        return self.read_bytes - self.resident + self.writeback

    @property
    def saved_bytes(self) -> float:
        """DRAM bytes the fitted model's accounting (every unique byte from / to DRAM) charges and the model does not."""
        return self.read_bytes + self.write_bytes - self.dram_bytes

    def saved(self, accounting: str) -> float:
        """The DRAM bytes saved against the fitted model's rows (timed after an L2 flush) under ``accounting``
        (:data:`ACCOUNTINGS`): ``reads``: the resident input bytes; ``writeback``: those less the earlier ops'
        dirty bytes this region writes back (a flushed run writes back the flush's instead: the fit absorbed those);
        ``deferred``: :attr:`saved_bytes` (its own outputs left dirty in the L2 count as saved too); ``flushed``: the
        DRAM bytes of the fitted rows' run (every read a miss, the flush's dirty bytes written back as the traffic
        evicts them: :attr:`flush_writeback`) less those of the model's run (``writeback``'s count), own overflow
        alike in both: a region after a GEMM, whose L2 holds the GEMM's clean operands, writes back less than the
        flushed run, one after an element-wise op about as much."""
        if accounting == "reads":
            return self.resident
        if accounting == "writeback":
            return self.resident - (self.writeback - self.own_writeback)
        if accounting == "deferred":
            return self.saved_bytes
        if accounting == "flushed":
            return self.resident - (self.writeback - self.own_writeback) + self.flush_writeback
        raise ValueError(f"L2 accounting {accounting!r}: one of {', '.join(ACCOUNTINGS)}")


def _val_bytes(val: Any) -> float:
    """The bytes of one tensor value (anything else: 0)."""
    if not (hasattr(val, "numel") and hasattr(val, "element_size")):
        return 0.0
    return float(val.numel() * val.element_size())


def _outputs(node: Any) -> list[tuple[Hashable, float]]:
    """The storages a node writes: one per tensor of its ``meta["val"]`` (a tuple / list: one per element)."""
    val = getattr(node, "meta", {}).get("val")
    if isinstance(val, (tuple, list)):
        return [((node, i), _val_bytes(v)) for i, v in enumerate(val) if _val_bytes(v) > 0]
    b = _val_bytes(val)
    return [(node, b)] if b > 0 else []


def _op(node: Any) -> str:
    """``aten.mm.default`` -> ``mm``; ``operator.getitem`` -> ``getitem``."""
    parts = str(getattr(node.target, "__name__", node.target)).split(".")
    return parts[0] if len(parts) < 3 else parts[-2]


class _Cache:
    """A cache of storages by bytes with dirty tracking; counts write-backs. ``policy`` (:data:`POLICIES`):
    ``lru`` evicts the least recently touched bytes first; ``random`` takes each incoming byte's room from every
    other storage in proportion to its resident bytes (the expectation of random replacement: no storage is safe,
    none is evicted whole)."""

    def __init__(self, capacity: float, policy: str = "lru") -> None:
        if policy not in POLICIES:
            raise ValueError(f"L2 policy {policy!r}: one of {', '.join(POLICIES)}")
        self.capacity = max(0.0, float(capacity))
        self.policy = policy
        self.lines: OrderedDict[Hashable, list[float]] = OrderedDict()   # key -> [resident, dirty], LRU first
        self.total = 0.0
        self.writeback = 0.0
        self.own: set[Hashable] = set()     # the current op's outputs: their write-backs are its own
        self.own_writeback = 0.0
        self.pieces: dict[Hashable, list[tuple[Hashable, float]]] = {}   # a storage written in pieces: (key, bytes)

    def _split(self, key: Hashable, nbytes: float) -> list[tuple[Hashable, float]]:
        """``nbytes`` of ``key`` as (line, bytes): its pieces in proportion where it was written in pieces."""
        pieces = self.pieces.get(key)
        if not pieces:
            return [(key, nbytes)]
        full = sum(b for _, b in pieces) or 1.0
        return [(p, nbytes * b / full) for p, b in pieces]

    def peek(self, key: Hashable, nbytes: float) -> float:
        """Read ``nbytes`` of ``key`` without touching the cache (a streaming read): the bytes resident (hits)."""
        return sum(min(self.lines.get(k, [0.0, 0.0])[0], nb) for k, nb in self._split(key, nbytes))

    def read(self, key: Hashable, nbytes: float) -> float:
        """Touch ``nbytes`` of ``key`` for reading; returns the bytes that were resident (hits) when the read began
        (a storage in pieces: every piece's hits counted before any piece is touched)."""
        parts = self._split(key, nbytes)
        hits = self.peek(key, nbytes)
        for k, nb in parts:
            self._read(k, nb)
        return hits

    def _read(self, key: Hashable, nbytes: float) -> float:
        res, dirty = self.lines.pop(key, [0.0, 0.0])
        self.total -= res
        hit = min(res, nbytes)
        keep = min(max(res, nbytes), self.capacity)
        self._put(key, keep, min(dirty, keep))
        return hit

    def write(self, key: Hashable, nbytes: float) -> None:
        """Write ``nbytes`` to ``key``: all of it dirty; what does not fit is written back at once."""
        for piece, _ in self.pieces.pop(key, []):
            self.total -= self.lines.pop(piece, [0.0, 0.0])[0]
        res, _ = self.lines.pop(key, [0.0, 0.0])
        self.total -= res
        keep = min(nbytes, self.capacity)
        self.writeback += nbytes - keep
        self.own_writeback += nbytes - keep
        self._put(key, keep, keep)

    def write_piece(self, key: Hashable, index: int, nbytes: float) -> None:
        """Write the ``index``-th piece (``nbytes``) of ``key`` (a GEMM wave's output tiles); a later read of ``key``
        reads its pieces in proportion."""
        piece = (key, "piece", index)
        if key in self.own:
            self.own.add(piece)
        self.write(piece, nbytes)
        self.pieces.setdefault(key, []).append((piece, nbytes))

    def _put(self, key: Hashable, resident: float, dirty: float) -> None:
        need = self.total + resident - self.capacity
        if need > 1e-6 and self.total > 0:
            if self.policy == "random":
                share = min(1.0, need / self.total)
                for k, line in self.lines.items():
                    self.writeback += line[1] * share
                    self.own_writeback += line[1] * share if k in self.own else 0.0
                    line[0] -= line[0] * share
                    line[1] -= line[1] * share
                self.total -= min(need, self.total)
            else:
                while need > 1e-6 and self.lines:
                    old = next(iter(self.lines))
                    res, d = self.lines[old]
                    take = min(res, need)
                    dirty_out = take * d / res if res > 0 else 0.0
                    self.writeback += dirty_out
                    self.own_writeback += dirty_out if old in self.own else 0.0
                    self.total -= take
                    need -= take
                    if take >= res - 1e-9:
                        del self.lines[old]
                    else:
                        self.lines[old] = [res - take, d - dirty_out]
        self.lines[key] = [resident, dirty]
        self.total += resident


def _storage(node: Any, base: dict[Any, Hashable]) -> Hashable:
    return base.get(node, node)


def _storage_bytes(key: Hashable) -> float:
    """The bytes of the storage ``key`` (a node, or ``(node, i)``: the ``i``-th tensor of its ``meta["val"]``)
    as its own value says; infinity where that is not known."""
    node, i = key if isinstance(key, tuple) else (key, None)
    val = getattr(node, "meta", {}).get("val")
    if i is not None:
        val = val[i] if isinstance(val, (tuple, list)) and isinstance(i, int) and 0 <= i < len(val) else None
    return _val_bytes(val) or float("inf")


def _graph_ops(graph_nodes: Sequence[Any], regions: Sequence[Any]) -> Iterable[tuple[Any, list[Any], list[Any]]]:
    """(region or None, read nodes, write nodes) per op in graph order; a region is one op at its first node."""
    owner = {n: r for r in regions for n in r.nodes}
    seen: set[int] = set()
    for n in graph_nodes:
        if getattr(n, "op", "") != "call_function":
            continue
        r = owner.get(n)
        if r is not None:
            if id(r) in seen:
                continue
            seen.add(id(r))
            yield r, list(dict.fromkeys(r.inputs)), list(dict.fromkeys(r.outputs))
        elif _op(n) not in NO_TRAFFIC:
            yield None, list(dict.fromkeys(n.all_input_nodes)), [n]


def _read(src: Any, base: dict[Any, Hashable], size: dict[Hashable, float]) -> tuple[Hashable, float]:
    """(storage, bytes) of a read of fx node ``src``: its value's bytes, at most its storage's (sized from the
    storage's own value the first time it is seen, not from the view read: a slice read first is not all)."""
    key = _storage(src, base)
    full = size.setdefault(key, _storage_bytes(key))
    return key, min(_val_bytes(getattr(src, "meta", {}).get("val")), full)


#: FX ops :func:`simulate` with ``gemm=`` walks wave by wave (:mod:`stitchtune.analysis.gemm_traffic`):
#: op -> the positions of ``A`` and ``B`` in its arguments
GEMM_OPS = {"mm": (0, 1), "bmm": (0, 1), "addmm": (1, 2), "baddbmm": (1, 2)}


def _gemm(node: Any, made: list[tuple[Hashable, float]], base: dict[Any, Hashable], size: dict[Hashable, float],
          cache: _Cache, tiling: GemmTiling, stream: bool = False) -> bool:
    """Run a GEMM node through ``cache`` wave by wave (:func:`~stitchtune.analysis.gemm_traffic.waves`): its other
    inputs (a bias) read whole first, then per wave the ``A`` and ``B`` bytes touched so far (re-read panels hit and
    stay warm) and the wave's output tiles written as one piece. False (nothing done) where ``node`` is not a GEMM of
    :data:`GEMM_OPS` with 2-D or batched 3-D operands and one output."""
    where = GEMM_OPS.get(_op(node))
    if where is None or len(made) != 1 or len(node.args) <= max(where):
        return False
    a, b = node.args[where[0]], node.args[where[1]]
    vals = [getattr(x, "meta", {}).get("val") for x in (a, b)]
    shape = gemm_shape(*(getattr(v, "shape", ()) for v in vals)) if all(v is not None for v in vals) else None
    if shape is None:
        return False
    operands = [_read(src, base, size) for src in (a, b)]
    for src in dict.fromkeys(node.all_input_nodes):
        if src is not a and src is not b:
            cache.read(*_read(src, base, size))
    out, out_bytes = made[0]
    touch = cache.peek if stream else cache.read
    for i, w in enumerate(waves(shape, tiling)):
        touch(operands[0][0], operands[0][1] * w.a_seen)
        touch(operands[1][0], operands[1][1] * w.b_seen)
        cache.write_piece(out, i, out_bytes * w.out)
    size[out] = out_bytes
    return True


def _flushed_writeback(reads: Sequence[tuple[Hashable, float]], writes: Sequence[tuple[Hashable, float]],
                       capacity: float, policy: str) -> float:
    """The dirty bytes of an L2 flush (a memset: the cache full of dirty lines) that an op reading ``reads`` and
    writing ``writes`` (storage, bytes) writes back when it runs right after the flush, as the fitted rows did."""
    cache = _Cache(capacity, policy)
    flush = object()
    cache.write(flush, cache.capacity)
    cache.writeback = cache.own_writeback = 0.0
    cache.own = {k for k, _ in writes}
    for key, nb in reads:
        cache.read(key, nb)
    for key, nb in writes:
        cache.write(key, nb)
    return cache.writeback - cache.own_writeback


def simulate(regions: Sequence[Any], capacity: float, policy: str = "lru",
             streaming: frozenset[str] = frozenset(), gemm: GemmTiling | None = None) -> dict[str, L2Occurrence]:
    """See the module docstring. ``regions``: captured regions (``name``, ``nodes``, ``inputs``, ``outputs``)."""
    graphs: dict[int, list[Any]] = {}
    for r in regions:
        if r.nodes:
            graphs.setdefault(id(r.nodes[0].graph), []).append(r)
    out: dict[str, L2Occurrence] = {}
    for mine in graphs.values():
        nodes = list(mine[0].nodes[0].graph.nodes)
        cache = _Cache(capacity, policy)
        base: dict[Any, Hashable] = {}
        for n in nodes:   # views alias their source's storage; getitem the tuple element it takes
            if getattr(n, "op", "") == "call_function" and _op(n) in NO_TRAFFIC and n.all_input_nodes:
                src = n.args[0] if _op(n) == "getitem" else n.all_input_nodes[0]
                idx = n.args[1] if _op(n) == "getitem" and len(n.args) > 1 else None
                key = (src, idx) if isinstance(idx, int) else src
                base[n] = base.get(key, key) if not isinstance(key, tuple) else key
        size: dict[Hashable, float] = {}   # a storage's bytes when written (a view of it reads at most that)
        for region, reads, writes in _graph_ops(nodes, mine):
            made = [(_storage(k, base) if not isinstance(k, tuple) else k, nb) for w in writes for k, nb in _outputs(w)]
            if region is None and not made:
                continue   # a view, a tuple access, a scalar op: moves nothing
            before, own_before, cache.own = cache.writeback, cache.own_writeback, {k for k, _ in made}
            if region is None and gemm is not None and _gemm(writes[0], made, base, size, cache, gemm,
                                                                _op(writes[0]) in streaming):
                continue
            rb = hit = wb = 0.0
            touched: list[tuple[Hashable, float]] = []
            for src in reads:
                key, nb = _read(src, base, size)
                if nb > 0:
                    rb += nb
                    touched.append((key, nb))
                    stream = region is None and _op(writes[0]) in streaming
                    hit += cache.peek(key, nb) if stream else cache.read(key, nb)
            for key, nb in made:
                size[key] = nb
                wb += nb
                cache.write(key, nb)
            if region is not None:
                out[region.name] = L2Occurrence(rb, wb, hit, cache.writeback - before, cache.own_writeback - own_before,
                                                _flushed_writeback(touched, made, capacity, policy))
    return out


def resident_bytes(regions: Sequence[Any], capacity: float, policy: str = "lru") -> dict[str, float]:
    """See the module docstring."""
    return {name: o.resident for name, o in simulate(regions, capacity, policy).items()}
