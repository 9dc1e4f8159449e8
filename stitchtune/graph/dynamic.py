"""Dynamic dimensions: named extents in graph.json, their buckets, and the static graph of one extent.

The interface between the core pipeline (graph/plan/lower/emulate/gpu/tune/cost/cli) and the torch
backend (``deploy/torch_*``). Everything here is a frozen value; nothing imports torch.

Graph format
------------
A graph marks a dimension dynamic by writing a *name* instead of a number in a shape (an input's
``shape``, a ``reshape``/``expand`` node's ``shape``) and declaring the name's bounds at the top level::

    {"name": "ln", "dynamic": {"seq": {"min": 1, "max": 2048}},
     "inputs": {"x": {"shape": [4, "seq", 768], "dtype": "float32"}, ...}, ...}

A name matches :data:`~stitchtune.graph.checks.NAME_RE`; ``1 <= min <= max <= 2**31 - 1``; optional
``"buckets": [64, 256, 2048]`` (the upper bounds, ascending, the last one ``max``) replaces the
power-of-two default. Every declared name must be used and every name used must be declared.
:func:`load_dynamic` / :func:`parse_dynamic` read such a file into a :class:`DynamicGraph`;
:meth:`DynamicGraph.at` substitutes extents and validates the result as an ordinary static
:class:`~stitchtune.graph.parse.Graph` (so every stage below keeps its static input type). A file
without ``"dynamic"`` is a :class:`DynamicGraph` with no dims (``at({})`` is the graph itself).

Buckets
-------
:class:`Buckets` cuts ``[min, max]`` of one dim into at most ``max_buckets`` (default 8) contiguous,
inclusive ranges: by default power-of-two upper bounds (``1..2048`` with 8 buckets:
``1-1, 2-32, 33-64, 65-128, 129-256, 257-512, 513-1024, 1025-2048``: extent 1 a bucket of its own, the
smallest other ranges merged into the next one), or the user's bounds. ``bucket_of(extent)`` is the one mapping from an extent
to its :class:`Bucket` (an extent outside ``[min, max]`` is a :class:`~stitchtune.errors.GraphError`).
A :class:`BucketKey` is one bucket per dynamic dim (sorted by name): the unit the tuning database
records (its ``bucket`` column, :meth:`BucketKey.label`), selection looks up and the torch backend
caches compiled kernels by (graph structure, bucket key).

Contract of a compiled bucket (implemented by ``deploy.dynamic.compile_dynamic``)
---------------------------------------------------------------------------------
``compile_dynamic(dgraph, key, db=..., device=...) -> DynamicCompiled`` builds *one* program for
the bucket ``key``: planned at the bucket's largest extents, lowered with each dynamic extent a
kernel argument (``int``, after the pointers), so it runs for every extent in the bucket without a
rebuild. ``DynamicCompiled.run(extents, **arrays)`` / ``emulate(extents, **arrays)`` take the
extents explicitly (``dgraph.extents_of(shapes)`` infers them from input shapes) and check that
they lie in the bucket. A graph the generic kernel cannot serve (the reduced axis dynamic with a
scheme that needs a static row length, a cross reduction over dynamic rows, a slice / concat across
rows, a gather from a table with dynamic dims) gets a :class:`DynamicRefusal` (data: which part and why), and the caller falls back to
a specialised compile per extent.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from stitchtune.errors import GraphError

if TYPE_CHECKING:
    from stitchtune.graph.parse import Graph

#: default number of buckets per dynamic dim
MAX_BUCKETS = 8
MAX_EXTENT = 2**31 - 1


@dataclass(frozen=True, order=True)
class Bucket:
    """One inclusive range ``lo..hi`` of dynamic dim ``dim``."""

    dim: str
    lo: int
    hi: int

    def __post_init__(self) -> None:
        if not 1 <= self.lo <= self.hi <= MAX_EXTENT:
            raise ValueError(f"bad bucket {self.dim}={self.lo}..{self.hi}")

    def contains(self, extent: int) -> bool:
        return self.lo <= extent <= self.hi

    @property
    def label(self) -> str:
        """``"seq=129..256"``."""
        return f"{self.dim}={self.lo}..{self.hi}"

    def probes(self) -> tuple[int, ...]:
        """The extents every schedule of this bucket is checked at: the smallest, the largest and an
        odd one in between (fewer when the bucket holds fewer values), ascending, distinct."""
        mid = (self.lo + self.hi) // 2
        if mid % 2 == 0 and mid + 1 < self.hi:
            mid += 1
        return tuple(sorted({self.lo, mid, self.hi}))


@dataclass(frozen=True)
class BucketKey:
    """One bucket per dynamic dim, sorted by dim name (``()``: a static graph)."""

    buckets: tuple[Bucket, ...]

    def __post_init__(self) -> None:
        names = [b.dim for b in self.buckets]
        if names != sorted(set(names)):
            raise ValueError(f"bucket key dims must be sorted and distinct: {names}")

    def label(self) -> str:
        """``"batch=1..8,seq=129..256"`` (the database's ``bucket`` column; ``""`` for a static graph)."""
        return ",".join(b.label for b in self.buckets)

    @classmethod
    def parse(cls, label: str) -> "BucketKey":
        """The inverse of :meth:`label` (``ValueError`` on a malformed label)."""
        if not label:
            return cls(())
        out = []
        for part in label.split(","):
            dim, _, rng = part.partition("=")
            lo, _, hi = rng.partition("..")
            out.append(Bucket(dim, int(lo), int(hi)))
        return cls(tuple(out))

    def largest(self) -> dict[str, int]:
        """Each dim at its bucket's largest extent (the extents a bucket is planned at)."""
        return {b.dim: b.hi for b in self.buckets}

    def contains(self, extents: Mapping[str, int]) -> bool:
        return all(b.contains(int(extents[b.dim])) for b in self.buckets)


@dataclass(frozen=True)
class Buckets:
    """The buckets of one dynamic dim: ``uppers`` are the inclusive upper bounds, ascending, the last
    one ``hi``; the first bucket starts at ``lo``."""

    dim: str
    lo: int
    uppers: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.uppers or not 1 <= self.lo <= self.uppers[0]:
            raise ValueError(f"bad buckets for {self.dim}: lo {self.lo}, uppers {self.uppers}")
        if any(b <= a for a, b in zip(self.uppers, self.uppers[1:])) or self.uppers[-1] > MAX_EXTENT:
            raise ValueError(f"bucket bounds of {self.dim} must ascend strictly: {self.uppers}")

    @property
    def hi(self) -> int:
        return self.uppers[-1]

    @classmethod
    def power_of_two(cls, dim: str, lo: int, hi: int, max_buckets: int = MAX_BUCKETS) -> "Buckets":
        """Power-of-two upper bounds between ``lo`` and ``hi`` (``hi`` itself last); when that makes more
        than ``max_buckets`` buckets, the smallest ones are merged into the first, except extent 1: a
        range from 1 keeps ``1..1`` as its own first bucket (a decode step's one position, a batch of
        one: planned as one row, not as a tail of a bucket planned at 16 or 32)."""
        if not 1 <= lo <= hi <= MAX_EXTENT or max_buckets < 1:
            raise ValueError(f"bad range {dim}={lo}..{hi} / {max_buckets} buckets")
        ups = [1 << e for e in range(0, 32) if lo <= (1 << e) < hi]
        ups.append(hi)
        if ups[0] == 1 and len(ups) > max_buckets >= 2:   # extent 1 keeps a bucket of its own
            return cls(dim, lo, (1, *ups[-(max_buckets - 1):]))
        ups = ups[-max_buckets:]
        return cls(dim, lo, tuple(ups))

    @property
    def buckets(self) -> tuple[Bucket, ...]:
        lows = (self.lo,) + tuple(u + 1 for u in self.uppers[:-1])
        return tuple(Bucket(self.dim, a, b) for a, b in zip(lows, self.uppers))

    def bucket_of(self, extent: int) -> Bucket:
        """The bucket holding ``extent``; outside ``lo..hi``: :class:`GraphError` naming the dim."""
        if not self.lo <= extent <= self.hi:
            raise GraphError(f"dynamic dim {self.dim}: extent {extent} outside {self.lo}..{self.hi}")
        for b in self.buckets:
            if extent <= b.hi:
                return b
        raise AssertionError("unreachable")

    def share(self, bucket: Bucket) -> float:
        """The expected share of calls that land in ``bucket`` (extents uniform over ``lo..hi``): what a
        trial budget is split by."""
        return (bucket.hi - bucket.lo + 1) / (self.hi - self.lo + 1)


@dataclass(frozen=True)
class DynamicDim:
    """A named dynamic extent with its bounds and buckets."""

    name: str
    buckets: Buckets

    @property
    def lo(self) -> int:
        return self.buckets.lo

    @property
    def hi(self) -> int:
        return self.buckets.hi


def bucket_keys(dims: tuple[DynamicDim, ...]) -> tuple[BucketKey, ...]:
    """Every combination of the dims' buckets (the product, dims sorted by name)."""
    keys: list[tuple[Bucket, ...]] = [()]
    for d in sorted(dims, key=lambda d: d.name):
        keys = [k + (b,) for k in keys for b in d.buckets.buckets]
    return tuple(BucketKey(k) for k in keys)


def key_share(dims: tuple[DynamicDim, ...], key: BucketKey) -> float:
    """The expected share of calls in bucket key ``key`` (the product of each dim's share)."""
    by = {d.name: d for d in dims}
    return math.prod(by[b.dim].buckets.share(b) for b in key.buckets)


@dataclass(frozen=True)
class SymInt:
    """A monomial of dynamic extents: ``coef * prod(extents[d] for d in dims)`` (``dims`` sorted, a dim
    repeated for a power; ``()``: the constant ``coef``). The sizes, strides and row counts of a graph
    whose dynamic dims are outer dims are such monomials (products of dims). ``more``: further terms
    ``(coef, dims)`` of a polynomial (a decode step's cache concatenated with the new position along a
    dynamic axis: ``P + 1``), made by :meth:`poly` (the term of highest degree leading, then by dims,
    the constant last; no zero term); ``()`` for a monomial."""

    coef: int
    dims: tuple[str, ...] = ()
    more: tuple[tuple[int, tuple[str, ...]], ...] = ()

    @staticmethod
    def poly(terms: "list[tuple[int, tuple[str, ...]]]") -> "SymInt":
        """The polynomial sum of ``terms`` ``(coef, dims)``, normalised (equal dims merged, zeros dropped)."""
        acc: dict[tuple[str, ...], int] = {}
        for c, d in terms:
            key = tuple(sorted(d))
            acc[key] = acc.get(key, 0) + c
        items = sorted(((d, c) for d, c in acc.items() if c), key=lambda t: (-len(t[0]), t[0]))
        if not items:
            return SymInt(0)
        (d0, c0), rest = items[0], items[1:]
        return SymInt(c0, d0, tuple((c, d) for d, c in rest))

    @property
    def terms(self) -> tuple[tuple[int, tuple[str, ...]], ...]:
        """Every term ``(coef, dims)``, the leading one first."""
        return ((self.coef, self.dims), *self.more)

    def value(self, extents: Mapping[str, int]) -> int:
        return sum(c * math.prod(int(extents[d]) for d in ds) for c, ds in self.terms)

    @property
    def static(self) -> bool:
        return not self.dims and not self.more

    def multiple_of(self, k: int) -> bool:
        """Whether the value is a multiple of ``k`` for every extent (every coefficient is)."""
        return all(c % k == 0 for c, _ in self.terms)

    def __str__(self) -> str:
        return " + ".join("*".join([str(c)] * (c != 1 or not ds) + list(ds)) for c, ds in self.terms)


@dataclass(frozen=True)
class DynamicRefusal:
    """Why a graph (or one schedule) cannot be served by a generic kernel: ``part`` names what
    (``"row length"``, ``"scheme global"``, ``"cross reduction"``, ``"index op slice_1"``, ``"family col"``),
    ``reason`` says why, in one line."""

    part: str
    reason: str

    def __str__(self) -> str:
        return f"{self.part}: {self.reason}"


class DynamicGraphLike(Protocol):
    """What the torch backend needs of a dynamic graph."""

    dims: tuple[DynamicDim, ...]

    def at(self, extents: Mapping[str, int]) -> Graph: ...

    def key_of(self, extents: Mapping[str, int]) -> BucketKey: ...


@dataclass(frozen=True)
class DynamicGraph:
    """A graph.json whose shapes may name dynamic dims (module docstring). ``template`` is the decoded
    JSON without ``"dynamic"`` (names left in shapes), kept as JSON text in file order so the value is
    hashable; ``dims`` sorted by name."""

    template_json: str
    dims: tuple[DynamicDim, ...]

    @property
    def template(self) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(self.template_json)
        return out

    @property
    def dim_names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.dims)

    def dim(self, name: str) -> DynamicDim:
        for d in self.dims:
            if d.name == name:
                return d
        raise KeyError(name)

    def at(self, extents: Mapping[str, int]) -> Graph:
        """The static, validated :class:`~stitchtune.graph.parse.Graph` with every dim at ``extents``
        (each within its bounds, else :class:`GraphError`)."""
        from stitchtune.graph.parse import parse_graph

        ext = self._check_extents(extents)
        return parse_graph(_substitute(self.template, ext))

    def at_unchecked(self, extents: Mapping[str, int]) -> Graph:
        """:meth:`at` without the bounds check (the lowering plans at extents beyond a bucket to fit its
        symbols); the graph itself is still validated."""
        from stitchtune.graph.parse import parse_graph

        return parse_graph(_substitute(self.template, {d.name: int(extents[d.name]) for d in self.dims}))

    def key_of(self, extents: Mapping[str, int]) -> BucketKey:
        """The bucket key of ``extents`` (one bucket per dim)."""
        ext = self._check_extents(extents)
        return BucketKey(tuple(d.buckets.bucket_of(ext[d.name]) for d in self.dims))

    def keys(self) -> tuple[BucketKey, ...]:
        return bucket_keys(self.dims)

    def extents_of(self, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, int]:
        """The extents implied by the graph inputs' ``shapes`` (by name); a dim seen with two values, or
        a static dim that does not match: :class:`GraphError`."""
        seen: dict[str, int] = {}
        problems: list[str] = []
        for name, spec in self.template.get("inputs", {}).items():
            if name not in shapes:
                problems.append(f"input {ascii(name)}: missing")
                continue
            got = tuple(int(x) for x in shapes[name])
            want = spec["shape"]
            if len(got) != len(want):
                problems.append(f"input {ascii(name)}: rank {len(got)}, expected {len(want)}")
                continue
            for i, (g, w) in enumerate(zip(got, want)):
                if isinstance(w, str):
                    if seen.setdefault(w, g) != g:
                        problems.append(f"input {ascii(name)} dim {i}: {w}={g} but {w}={seen[w]} elsewhere")
                elif g != w:
                    problems.append(f"input {ascii(name)} dim {i}: {g}, expected {w}")
        if problems:
            raise GraphError(problems=problems)
        return seen

    def _check_extents(self, extents: Mapping[str, int]) -> dict[str, int]:
        problems = []
        out: dict[str, int] = {}
        for d in self.dims:
            if d.name not in extents:
                problems.append(f"dynamic dim {d.name}: no extent given")
                continue
            v = extents[d.name]
            if isinstance(v, bool) or not isinstance(v, int) or not d.lo <= v <= d.hi:
                problems.append(f"dynamic dim {d.name}: extent {v!r} outside {d.lo}..{d.hi}")
            else:
                out[d.name] = v
        if problems:
            raise GraphError(problems=problems)
        return out


def _substitute(obj: Any, ext: Mapping[str, int]) -> Any:
    """``obj`` with every dim name in a ``shape`` list replaced by its extent."""
    if isinstance(obj, dict):
        return {k: ([ext.get(x, x) if isinstance(x, str) else x for x in v]
                    if k == "shape" and isinstance(v, list) else _substitute(v, ext))
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [_substitute(x, ext) for x in obj]
    return obj


def _names_used(obj: Any, out: set[str]) -> set[str]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == "shape" and isinstance(v, list):
                out.update(x for x in v if isinstance(x, str))
            else:
                _names_used(v, out)
    elif isinstance(obj, list):
        for x in obj:
            _names_used(x, out)
    return out


def _parse_dim(name: Any, spec: Any, problems: list[str]) -> DynamicDim | None:
    from stitchtune.graph.checks import NAME_RE

    path = f"dynamic.{ascii(name)[1:-1]}"
    if not isinstance(name, str) or not NAME_RE.match(name):
        problems.append(f"{path}: not a valid name")
        return None
    if not isinstance(spec, dict) or set(spec) - {"min", "max", "buckets"} or not {"min", "max"} <= set(spec):
        problems.append(f"{path}: must be {{\"min\": int, \"max\": int}} with optional \"buckets\"")
        return None
    lo, hi = spec["min"], spec["max"]
    if any(isinstance(v, bool) or not isinstance(v, int) for v in (lo, hi)) or not 1 <= lo <= hi <= MAX_EXTENT:
        problems.append(f"{path}: need integers 1 <= min <= max <= {MAX_EXTENT}")
        return None
    ups = spec.get("buckets")
    if ups is None:
        return DynamicDim(name, Buckets.power_of_two(name, lo, hi))
    ok = (isinstance(ups, list) and 1 <= len(ups) <= 64
          and all(isinstance(u, int) and not isinstance(u, bool) for u in ups))
    if ok and (ups[-1] != hi or ups[0] < lo or any(b <= a for a, b in zip(ups, ups[1:]))):
        ok = False
    if not ok:
        problems.append(f"{path}.buckets: must be 1..64 ascending integers from min, the last one max ({hi})")
        return None
    return DynamicDim(name, Buckets(name, lo, tuple(ups)))


def parse_dynamic(obj: Any) -> DynamicGraph:
    """Decoded graph.json (with or without ``"dynamic"``) -> :class:`DynamicGraph`. The dims are
    checked here; the graph itself is validated at the dims' smallest and largest extents (every
    problem is a :class:`GraphError` entry)."""
    if not isinstance(obj, dict):
        raise GraphError("(top level): must be a JSON object")
    body = {k: v for k, v in obj.items() if k != "dynamic"}
    raw = obj.get("dynamic", {})
    problems: list[str] = []
    dims: list[DynamicDim] = []
    if not isinstance(raw, dict):
        problems.append("dynamic: must be an object mapping dim names to {min, max}")
        raw = {}
    for name, spec in raw.items():
        d = _parse_dim(name, spec, problems)
        if d is not None:
            dims.append(d)
    used = _names_used(body, set())
    declared = {d.name for d in dims} | set(raw if isinstance(raw, dict) else ())
    for n in sorted(used - declared):
        problems.append(f"shape dim {ascii(n)}: not declared in \"dynamic\"")
    for n in sorted(declared - used):
        problems.append(f"dynamic.{ascii(n)[1:-1]}: declared but used in no shape")
    if problems:
        raise GraphError(problems=problems)
    dg = DynamicGraph(json.dumps(body), tuple(sorted(dims, key=lambda d: d.name)))
    dg.at({d.name: d.lo for d in dg.dims})
    if dg.dims:
        dg.at({d.name: d.hi for d in dg.dims})
    return dg


def load_dynamic(path: str | os.PathLike[str]) -> DynamicGraph:
    """Read a graph.json file (see :func:`parse_dynamic`); unreadable / not JSON: :class:`GraphError`."""
    from stitchtune.graph.checks import MAX_FILE_BYTES

    shown = ascii(os.fspath(path))
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise GraphError(f"{shown}: cannot read graph file: {e.strerror or e}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise GraphError(f"{shown}: too large (limit {MAX_FILE_BYTES} bytes)")
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise GraphError(f"{shown}: not JSON: {str(e).splitlines()[0][:200]}") from None
    return parse_dynamic(obj)


def parse_dynamic_arg(text: str, max_buckets: int = MAX_BUCKETS) -> DynamicDim:
    """The CLI's ``--dynamic`` value: ``NAME=LO..HI`` (power-of-two buckets) or ``NAME=LO..HI:B1,B2,...``
    (upper bounds, the last one ``HI``). Malformed: :class:`GraphError` with one line naming it."""
    from stitchtune.graph.checks import NAME_RE

    bad = GraphError(f"--dynamic {ascii(text)}: expected NAME=LO..HI or NAME=LO..HI:B1,B2,...,HI "
                     f"(integers, 1 <= LO <= HI)")
    name, eq, rest = text.partition("=")
    rng, sep, ups_text = rest.partition(":")
    lo_t, dots, hi_t = rng.partition("..")
    if not eq or not dots or not NAME_RE.match(name) or not lo_t.isdigit() or not hi_t.isdigit():
        raise bad
    lo, hi = int(lo_t), int(hi_t)
    if not 1 <= lo <= hi <= MAX_EXTENT:
        raise bad
    if not sep:
        return DynamicDim(name, Buckets.power_of_two(name, lo, hi, max_buckets))
    parts = ups_text.split(",")
    if sep and not ups_text or not all(p.isdigit() for p in parts):
        raise bad
    ups = [int(p) for p in parts]
    if ups[-1] != hi or ups[0] < lo or any(b <= a for a, b in zip(ups, ups[1:])):
        raise bad
    return DynamicDim(name, Buckets(name, lo, tuple(ups)))
