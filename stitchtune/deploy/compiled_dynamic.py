"""A dynamic graph compiled whole: every bucket's generic kernels, run at any extent in the declared range.

What ``stitchtune.compile("graph.json")`` returns for a graph with dynamic dims, and what ``stitchtune
compile`` / ``stitchtune run`` of such a graph use.

Contract
--------
:func:`compile_buckets(dgraph, db=..., device=..., *, keys=None, schedule=None, build=None, deterministic=False)
-> DynamicCompiledGraph` compiles each bucket key of ``dgraph`` (``keys``: a subset, default every key)
with :func:`stitchtune.deploy.dynamic.compile_dynamic`: one generic program per bucket, its schedule the
database's best record of that bucket (the ``bucket`` column that ``search --dynamic`` writes), else the
heuristic. The selection's per-bucket fallback warnings are collected
(:func:`stitchtune.deploy.selection.collecting_fallbacks`) and replaced by one summary warning naming the
buckets without a record. A bucket whose graph the generic kernel refuses is kept as
a :class:`RefusedBucket` (its :class:`~stitchtune.graph.dynamic.DynamicRefusal`): a call in it compiles
the static graph at the call's extents (:func:`stitchtune.deploy.compiled.compile`, cached per extents).

:class:`DynamicCompiledGraph` (immutable but for its caches):

* ``dgraph``, ``device``, ``buckets`` (one :class:`~stitchtune.deploy.dynamic.CompiledBucket` or
  :class:`RefusedBucket` per compiled key, in key order), ``manifest`` (plain JSON, below);
* ``extents_of(**arrays)``: each dim's extent from the inputs' shapes (:class:`GraphError` naming the input
  and dim that disagree, or an extent outside the dim's bounds); ``bucket_for(extents)``: the compiled
  bucket holding them (:class:`GraphError` when none does);
* ``emulate(**arrays)`` (the CPU emulator) and ``cg(**arrays)`` (the GPU, as
  :class:`~stitchtune.deploy.compiled.CompiledGraph`): the extents from the shapes, the bucket, its run;
  ``{output: array}`` shaped like the graph at those extents;
* ``write(dir)``: ``manifest.json`` and one folder per generic bucket (:func:`bucket_dir`) with its
  ``kernels.cu`` (and ``kernels.cubin`` when built); :meth:`DynamicCompiledGraph.load` reads it back,
  re-lowers every bucket's schedule and refuses a directory whose source this stitchtune would not
  generate again.

The manifest: ``format``, ``kind: "dynamic"``, ``graph_name``, ``device``/``device_key``/``arch``, the
versions, ``dims`` (name, min, max, each bucket's ``[lo, hi]``), ``extent_args`` (how extents reach the
kernels: one ``const int`` per dim after a kernel's pointer arguments, in ``dims`` order, named ``param``),
``inputs``/``outputs`` (shapes with dim names), ``graph`` (the graph file with its ``dynamic`` section) and
``buckets``: per bucket its ``label``, ``ranges``, ``generic`` and then either ``dir``, ``schedule``,
``schedule_key``, ``choice`` (source in tuned|nearest-shape|heuristic|given, reason), ``planned_extents``,
``kernels`` (grid rule: view rows as a monomial of the extents and rows per block, with the grid at the
bucket's smallest and largest extents; block; shared memory; arguments), ``buffers`` (sizes as monomials)
and ``cubin``; or ``refusal`` (why the generic kernel does not serve it).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from stitchtune._version import __version__
from stitchtune.deploy.compiled_graph import compile_graph
from stitchtune.deploy.dynamic import CompiledBucket, compile_dynamic
from stitchtune.deploy.manifest_io import check_codegen_version, read_manifest, write_compiled, write_kernels
from stitchtune.errors import GraphError, ScheduleError, StitchtuneError, UnsupportedGraphError
from stitchtune.graph.dynamic import BucketKey, DynamicGraph, DynamicRefusal
from stitchtune.tune.dbpath import DEFAULT_DB, DefaultDB, resolve_db

if TYPE_CHECKING:
    from stitchtune.deploy.compiled_graph import CompiledGraph
    from stitchtune.hardware.device import Device
    from stitchtune.ir.kir import Program
    from stitchtune.ir.launches import DynamicInfo
    from stitchtune.space import Schedule

log = logging.getLogger(__name__)

MANIFEST_FORMAT = 1
MAX_STATIC = 16  # static compiles kept for refused buckets (one per extents seen)
MAX_NAMED = 8    # buckets named in the fallback warning (then "... (N more)")


@dataclass(frozen=True)
class RefusedBucket:
    """A bucket the generic kernel does not serve: calls in it are compiled per extents (module docstring)."""

    key: BucketKey
    refusal: DynamicRefusal

    def covers(self, extents: Mapping[str, int]) -> bool:
        return self.key.contains(extents)


def bucket_dir(key: BucketKey) -> str:
    """The folder of a bucket's kernels: ``seq-2-32`` (``batch-1-4_seq-33-64``; ``static`` without dims)."""
    return "_".join(f"{b.dim}-{b.lo}-{b.hi}" for b in key.buckets) or "static"


def dynamic_json(dg: DynamicGraph) -> dict[str, Any]:
    """The graph file of ``dg``: its template with the ``dynamic`` section of its dims (bounds and buckets)."""
    out = {"dynamic": {d.name: {"min": d.lo, "max": d.hi, "buckets": list(d.buckets.uppers)} for d in dg.dims}}
    return {**dg.template, **out}


def compile_buckets(dgraph: DynamicGraph, db: str | os.PathLike[str] | None | DefaultDB = DEFAULT_DB,
                    device: str | Device | None = None, *, keys: Sequence[BucketKey] | None = None,
                    schedule: Schedule | Mapping[str, Any] | None = None,
                    build: bool | None = None, deterministic: bool = False) -> DynamicCompiledGraph:
    """Compile every bucket (or ``keys``) of ``dgraph`` (module docstring). ``device``: a Device, a preset
    name, or None (the local GPU, else the H200 preset); ``build`` as :func:`stitchtune.deploy.compiled.compile`;
    ``schedule`` (a Schedule or its dict) is used for every bucket; ``deterministic``: only bitwise-reproducible
    records (the generic heuristic combines in order)."""
    from stitchtune.deploy.selection import collecting_fallbacks
    from stitchtune.hardware.device import get_device
    from stitchtune.lower.entry import CODEGEN_VERSION

    db = resolve_db(db)
    if device is None:
        from stitchtune.gpu.device_query import default_device

        dev = default_device()
    else:
        dev = get_device(device) if isinstance(device, str) else device
    todo = list(dgraph.keys()) if keys is None else list(keys)
    out: list[CompiledBucket | RefusedBucket] = []
    with collecting_fallbacks():   # one summary below, not a warning per bucket
        for key in todo:
            got = compile_dynamic(dgraph, key, db=db, device=dev, schedule=schedule, build=build,
                                  deterministic=deterministic)
            out.append(RefusedBucket(key, got) if isinstance(got, DynamicRefusal) else got)
    fallback = [b for b in out if isinstance(b, CompiledBucket) and b.source in ("heuristic", "nearest-shape")]
    if fallback:
        where = ("no database given" if db is None else f"no database at {os.fspath(db)!a}"
                 if not os.path.isdir(db) else f"no record of the bucket in {os.fspath(db)!a}")
        kinds = sorted({b.source for b in fallback})
        named = [b.key.label() + (f" ({b.source})" if len(kinds) > 1 else "") for b in fallback]
        if len(named) > MAX_NAMED:
            named = named[:MAX_NAMED - 1] + [f"... ({len(named) - MAX_NAMED + 1} more)"]
        log.warning("%s: %d of %d bucket(s) without a tuned record of their own use the %s (%s): %s", _name(dgraph),
                    len(fallback), len(out), " or ".join(f"{k} schedule" for k in kinds), where, "; ".join(named))
    versions = {b.space_version for b in out if isinstance(b, CompiledBucket)}
    manifest = build_dynamic_manifest(dgraph, dev, out, "/".join(sorted(versions)), str(CODEGEN_VERSION))
    return DynamicCompiledGraph(dgraph, dev, tuple(out), manifest, db=db)


def _name(dg: DynamicGraph) -> str:
    return str(dg.template.get("name", "graph"))


def _generic(program: Program) -> DynamicInfo:
    """The dynamic facts of a bucket's program (a generic one: :func:`~stitchtune.lower.dynamic.lower_dynamic` sets them)."""
    if program.dynamic is None:
        raise ValueError("a compiled bucket's program is not generic (no dynamic facts)")
    return program.dynamic


def _kernel_dict(program: Program, index: int, key: BucketKey, registers: Mapping[str, int]) -> dict[str, Any]:
    ln = program.launches[index]
    k = program.kernel(ln.kernel)
    bufs = {b.name: b for b in program.buffers}
    args = [{"param": p.name, "buffer": a, "dtype": "uint32" if bufs[a].role == "barrier" else bufs[a].dtype,
             "role": bufs[a].role, "tensor": bufs[a].tensor or None} for p, a in zip(k.params, ln.args)]
    dyn = _generic(program)
    args += [{"param": x, "dim": d, "dtype": "int32", "role": "extent"} for d, x in zip(dyn.dims, dyn.args)]
    rule = dyn.grids[index]
    lo = {b.dim: b.lo for b in key.buckets}
    grid = {"fixed": int(rule.fixed)} if rule.fixed else {
        "rows": str(rule.rows), "rows_per_block": rule.rows_per_block, "split": rule.split,
        "persistent": rule.persistent, "grid_barrier": rule.needs_sync}
    grid.update({"at_min": int(dyn.grid(index, lo)), "at_max": int(dyn.grid(index, key.largest()))})
    return {"kernel": ln.kernel, "grid": grid, "block": [int(ln.block), 1, 1],
            "dynamic_smem_bytes": int(ln.smem_bytes), "registers": registers.get(ln.kernel), "args": args}


def _bucket_dict(b: CompiledBucket | RefusedBucket) -> dict[str, Any]:
    head: dict[str, Any] = {"label": b.key.label(), "ranges": {x.dim: [x.lo, x.hi] for x in b.key.buckets},
                            "generic": isinstance(b, CompiledBucket)}
    if isinstance(b, RefusedBucket):
        return {**head, "refusal": str(b.refusal),
                "note": "the generic kernel does not serve this bucket: a call in it is compiled for its extents"}
    p = b.program
    sizes = dict(_generic(p).sizes)
    return {**head, "dir": bucket_dir(b.key), "schedule": b.schedule.to_dict(), "schedule_key": b.schedule.key(),
            "choice": {"source": b.source, "reason": b.reason}, "planned_extents": dict(_generic(p).planned),
            "kernels": [_kernel_dict(p, i, b.key, dict(b.registers)) for i in range(len(p.launches))],
            "buffers": [{"name": x.name, "dtype": "uint32" if x.role == "barrier" else x.dtype,
                         "size": str(sizes[x.name]) if x.name in sizes else int(x.size), "role": x.role,
                         "tensor": x.tensor or None, "zero_init": bool(x.zero_init or x.role == "barrier")}
                        for x in p.buffers],
            "cubin": f"{bucket_dir(b.key)}/kernels.cubin" if b.cubin is not None else None}


def build_dynamic_manifest(dg: DynamicGraph, device: Device, buckets: Sequence[CompiledBucket | RefusedBucket],
                           space_version: str, codegen_version: str) -> dict[str, Any]:
    """The manifest of a compiled dynamic graph (module docstring)."""
    tpl = dg.template
    generic = [b for b in buckets if isinstance(b, CompiledBucket)]
    params = list(_generic(generic[0].program).args) if generic else [f"ext{i}" for i in range(len(dg.dims))]
    g = dg.at({d.name: d.hi for d in dg.dims})
    return {
        "format": MANIFEST_FORMAT,
        "kind": "dynamic",
        "stitchtune_version": __version__,
        "graph_name": _name(dg),
        "device": device.to_dict(),
        "device_key": device.key,
        "arch": device.arch,
        "space_version": space_version,
        "codegen_version": codegen_version,
        "dims": [{"name": d.name, "min": d.lo, "max": d.hi, "buckets": [[b.lo, b.hi] for b in d.buckets.buckets]}
                 for d in dg.dims],
        "extent_args": {"how": "every kernel of a generic bucket takes one `const int` per dynamic dim after its "
                               "pointer arguments, in this order; the grid follows each kernel's grid rule",
                        "args": [{"param": x, "dim": d.name} for x, d in zip(params, dg.dims)]},
        "inputs": [{"name": n, "shape": list(s["shape"]), "dtype": s["dtype"]} for n, s in tpl["inputs"].items()],
        "outputs": [{"name": o, "dtype": g.spec(o).dtype} for o in g.outputs],
        "buckets": [_bucket_dict(b) for b in buckets],
        "graph": dynamic_json(dg),
    }


@dataclass(frozen=True)
class DynamicCompiledGraph:
    """The buckets of a dynamic graph compiled for one device (module docstring)."""

    dgraph: DynamicGraph
    device: Device
    buckets: tuple[CompiledBucket | RefusedBucket, ...]
    manifest: dict[str, Any] = field(compare=False)
    #: the tuning database a refused bucket's static compiles choose from (None: the heuristic)
    db: str | os.PathLike[str] | None = field(default=None, compare=False)
    _state: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)

    def __repr__(self) -> str:
        n = sum(isinstance(b, CompiledBucket) for b in self.buckets)
        tuned = sum(isinstance(b, CompiledBucket) and b.source == "tuned" for b in self.buckets)
        return (f"<DynamicCompiledGraph {_name(self.dgraph)} on {self.device.key}: {len(self.buckets)} bucket(s) of "
                f"{', '.join(f'{d.name}={d.lo}..{d.hi}' for d in self.dgraph.dims)}, {n} generic ({tuned} tuned)>")

    @property
    def name(self) -> str:
        return _name(self.dgraph)

    def extents_of(self, **arrays: Any) -> dict[str, int]:
        """Each dim's extent from the inputs' shapes, checked against its bounds."""
        ext = self.dgraph.extents_of({k: tuple(np.shape(a)) if not hasattr(a, "shape") else tuple(a.shape)
                                      for k, a in arrays.items()})
        self.dgraph.key_of(ext)  # an extent outside its dim's bounds: GraphError naming it
        return ext

    def bucket_for(self, extents: Mapping[str, int]) -> CompiledBucket | RefusedBucket:
        """The compiled bucket holding ``extents`` (GraphError when none was compiled)."""
        key = self.dgraph.key_of(extents)
        for b in self.buckets:
            if b.key == key:
                return b
        raise GraphError(f"{self.name}: bucket {key.label()} was not compiled (compiled: "
                         f"{', '.join(b.key.label() for b in self.buckets)})")

    def static_at(self, extents: Mapping[str, int], *, build: bool | None = None) -> CompiledGraph:
        """The static :class:`~stitchtune.deploy.compiled.CompiledGraph` at ``extents`` (a refused bucket's
        calls), compiled once per extents with the heuristic or the database's record of that shape."""
        k = tuple(sorted(extents.items()))
        cg = self._state.get(k)
        if cg is None:
            if len(self._state) >= MAX_STATIC:
                self._state.pop(next(iter(self._state)))
            try:
                cg = compile_graph(self.dgraph.at(extents), db=self.db, device=self.device, build=build)
            except StitchtuneError as e:   # e.g. no plan at these extents: say where
                at = ", ".join(f"{d}={v}" for d, v in sorted(extents.items()))
                kind = UnsupportedGraphError if isinstance(e, UnsupportedGraphError) else StitchtuneError
                raise kind(problems=[f"{self.name} at {at}: {p}" for p in e.problems]) from None
            self._state[k] = cg
        return cg

    def emulate(self, **arrays: np.ndarray) -> dict[str, np.ndarray]:
        """The bucket of the inputs' extents in the CPU emulator (slow: small extents)."""
        ext = self.extents_of(**arrays)
        b = self.bucket_for(ext)
        if isinstance(b, RefusedBucket):
            out: dict[str, np.ndarray] = self.static_at(ext, build=False).emulate(**arrays)
            return out
        return b.emulate(ext, **arrays)

    def __call__(self, **arrays: Any) -> dict[str, np.ndarray]:
        """The bucket of the inputs' extents on the GPU (no rebuild within a bucket)."""
        ext = self.extents_of(**arrays)
        b = self.bucket_for(ext)
        if isinstance(b, RefusedBucket):
            out: dict[str, np.ndarray] = self.static_at(ext)(**arrays)
            return out
        return b(ext, **arrays)

    # -- persistence ------------------------------------------------------------------------------
    def write(self, out_dir: str | os.PathLike[str]) -> list[Path]:
        """``manifest.json`` and each generic bucket's ``<dir>/kernels.cu`` (+ ``kernels.cubin``); the paths."""
        def buckets(out: Path) -> list[Path]:
            paths: list[Path] = []
            for b in self.buckets:
                if isinstance(b, RefusedBucket):
                    continue
                d = out / bucket_dir(b.key)
                d.mkdir(exist_ok=True)
                paths += write_kernels(d, b.sources, b.cubin)
            return paths

        return write_compiled(out_dir, self.manifest, buckets)

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> DynamicCompiledGraph:
        """Read a directory written by :meth:`write` (module docstring)."""
        from stitchtune.graph.dynamic import parse_dynamic
        from stitchtune.hardware.device import Device
        from stitchtune.lower.dynamic import fit_rows, lower_dynamic
        from stitchtune.gpu.render import render
        from stitchtune.space import Schedule, SearchSpace

        d = Path(directory)
        where = ascii(str(d))
        raw = read_manifest(d, where)
        try:
            m = json.loads(raw)
            if not isinstance(m, dict) or m.get("format") != MANIFEST_FORMAT or m.get("kind") != "dynamic":
                raise ValueError("not the manifest of a dynamic graph")
            dg = parse_dynamic(m["graph"])
            device = Device.from_dict(m["device"])
            entries = [(BucketKey.parse(str(b["label"])), b) for b in m["buckets"]]
        except StitchtuneError:
            raise
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            raise StitchtuneError(f"{where}: not a stitchtune manifest ({exc})") from None
        check_codegen_version(m, where)
        out: list[CompiledBucket | RefusedBucket] = []
        for key, b in entries:
            fit = fit_rows(dg, key)
            if not b.get("generic"):
                out.append(RefusedBucket(key, fit if isinstance(fit, DynamicRefusal)
                                         else DynamicRefusal("bucket", str(b.get("refusal", "")))))
                continue
            try:
                s = Schedule.from_dict(b["schedule"])
            except ScheduleError as exc:
                raise StitchtuneError(f"{where}: not a stitchtune manifest (bucket {key.label()}: {exc})") from None
            except KeyError:
                raise StitchtuneError(f"{where}: not a stitchtune manifest (bucket {key.label()}: no schedule)") from None
            program = None if isinstance(fit, DynamicRefusal) else lower_dynamic(
                fit, s, device, SearchSpace.for_plan(fit.plan, device))
            sub = d / bucket_dir(key)
            try:
                sources = (sub / "kernels.cu").read_text()
                cubin = (sub / "kernels.cubin").read_bytes() if b.get("cubin") else None
            except OSError as exc:
                raise StitchtuneError(f"cannot read compiled graph {where}: {exc.strerror or exc}") from None
            if program is None or isinstance(program, DynamicRefusal) or render(program) != sources:
                raise StitchtuneError(f"{where}: {bucket_dir(key)}/kernels.cu differs from what this stitchtune "
                                      "generates for its schedule: recompile it")
            ch = b.get("choice", {})
            out.append(CompiledBucket(key, dg, device, s, str(ch.get("source", "given")), program, sources, cubin,
                                      reason=str(ch.get("reason", ""))))
        return cls(dg, device, tuple(out), m)



def load_any(graph_or_path: Any) -> Any:
    """What :func:`stitchtune.deploy.compiled.compile` takes (a Graph, a DynamicGraph, a graph.json dict or
    path) as a static :class:`~stitchtune.graph.parse.Graph`, or as a :class:`DynamicGraph` when it has
    dynamic dims (a DynamicGraph without dims is its static graph)."""
    from stitchtune.graph.dynamic import load_dynamic, parse_dynamic
    from stitchtune.graph.parse import Graph, load_graph, parse_graph

    if isinstance(graph_or_path, DynamicGraph):
        return graph_or_path if graph_or_path.dims else graph_or_path.at({})
    if isinstance(graph_or_path, Graph):
        return graph_or_path
    if isinstance(graph_or_path, Mapping):
        obj = dict(graph_or_path)
        if "dynamic" not in obj:
            return parse_graph(obj)
        dg = parse_dynamic(obj)
    else:
        try:
            return load_graph(os.fspath(graph_or_path))
        except GraphError as e:
            if not is_dynamic_refusal(e):
                raise
        dg = load_dynamic(os.fspath(graph_or_path))
    if not dg.dims:
        raise GraphError("dynamic: declares no dim")
    return dg

def is_dynamic_refusal(e: GraphError) -> bool:
    """Whether ``e`` is the static reader's refusal of a graph with dynamic dims (``graph.parse``)."""
    return bool(e.problems) and e.problems[0].startswith("dynamic: a graph with dynamic dims")
