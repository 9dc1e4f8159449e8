"""Graphs with dynamic dims on the command line: ``compile`` and ``run`` of them, ``--dynamic`` checked early.

Contract
--------
* :func:`static_only(path)`: the static graph of ``path``; a graph with dynamic dims is one error line naming
  its dims and bounds and the commands that take it (for the commands that need one shape, e.g. ``space``).
* :func:`parse_dims(texts)`: the ``--dynamic NAME=LO..HI[:B1,...]`` values of ``search`` and ``compile``; a
  malformed one or a dim named twice is one error line.
* :func:`search_dims(path, texts)`: ``search``'s ``--dynamic`` values, checked before anything runs: a graph
  with dynamic dims searched without ``--dynamic`` is one error line saying how (``--dynamic seq=1..2048``
  with the graph's own bounds); a range beyond the bounds the graph declares is one line naming the dim and
  its bounds; ``--dynamic`` on a static graph is one line too.
* :func:`cmd_compile(args, dgraph)`: ``compile`` of a dynamic graph: every bucket's generic kernels
  (:func:`stitchtune.deploy.compiled_dynamic.compile_buckets`; ``--dynamic NAME=LO..HI[:B1,...]`` picks other
  buckets within the declared bounds, e.g. the ones ``search --dynamic`` tuned), one line per bucket (its
  schedule and where it came from), a summary of the buckets left to the heuristic, the manifest and one
  folder per bucket written.
* :func:`cmd_run(args, dgraph)`: ``run`` of a dynamic graph at the extents of the ``--inputs`` arrays' shapes
  and/or ``--dynamic NAME=N`` (needed for ``--random-inputs`` of a dim no file fixes); an extent outside the
  declared bounds, two sources that disagree or a dim without an extent are one error line each. The
  ``reference`` backend runs the graph at those extents; ``emulate`` and ``cuda`` compile the one bucket
  that holds them (a bucket the generic kernel refuses: the static graph at those extents) and say which.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from stitchtune.errors import GraphError, StitchtuneError


def bounds_text(dg: Any) -> str:
    """``seq=1..2048`` (``batch=1..8, seq=1..2048``): the dims the graph declares."""
    return ", ".join(f"{d.name}={d.lo}..{d.hi}" for d in dg.dims)


def dynamic_hint(dg: Any) -> str:
    """``--dynamic seq=1..2048`` (one per dim): the option that searches the graph's range in its buckets
    (``seq=1..2048:64,256,2048`` when they are not the power-of-two default)."""
    from stitchtune.graph.dynamic import Buckets

    def arg(d: Any) -> str:
        own = "" if d.buckets == Buckets.power_of_two(d.name, d.lo, d.hi) else ":" + ",".join(map(str, d.buckets.uppers))
        return f"--dynamic {d.name}={d.lo}..{d.hi}{own}"

    return " ".join(arg(d) for d in dg.dims)


def load_graph_arg(path: str) -> Any:
    """The graph file ``path`` as a static Graph, or a DynamicGraph when it declares dynamic dims."""
    from stitchtune.deploy.compiled_dynamic import load_any

    return load_any(path)


def is_dynamic(g: Any) -> bool:
    """Whether ``g`` (from :func:`load_graph_arg`) is a DynamicGraph."""
    from stitchtune.graph.dynamic import DynamicGraph

    return isinstance(g, DynamicGraph)


def load_for(args: argparse.Namespace) -> Any:
    """``args.graph`` for ``run`` / ``compile``: a static Graph, or a DynamicGraph; ``--dynamic`` with a static
    graph is one error line."""
    g = load_graph_arg(args.graph)
    if not is_dynamic(g) and args.dynamic:
        raise GraphError(f"--dynamic {args.dynamic[0]}: {ascii(args.graph)} has no dynamic dim (name one in a "
                         "shape and declare it in a top-level \"dynamic\" section: docs/graph-format.md)")
    return g


def validate_load(path: str) -> Any:
    """``validate``'s graph: a static graph as it is; a graph with dynamic dims validated at every dim's
    bounds, its dims and buckets printed, and the graph at the largest extents returned (summarised after)."""
    g = load_graph_arg(path)
    if not is_dynamic(g):
        return g
    print(f"dynamic dims ({len(g.dims)}), the graph valid at every dim's min and max:")
    for d in g.dims:
        print(f"  {d.name}: {d.lo}..{d.hi}, {len(d.buckets.buckets)} bucket(s): "
              + ", ".join(f"{b.lo}..{b.hi}" for b in d.buckets.buckets))
    print("at the largest extents:")
    return g.at({d.name: d.hi for d in g.dims})


def static_only(path: str) -> Any:
    """The static graph of ``path`` (module docstring)."""
    from stitchtune.deploy.compiled_dynamic import is_dynamic_refusal
    from stitchtune.graph.dynamic import load_dynamic
    from stitchtune.graph.parse import load_graph

    try:
        return load_graph(path)
    except GraphError as e:
        if not is_dynamic_refusal(e):
            raise
    dg = load_dynamic(path)
    raise GraphError(f"{ascii(path)} has dynamic dims ({bounds_text(dg)}): this command needs one shape; "
                     f"`stitchtune search {dynamic_hint(dg)}`, `compile` and `run` take the graph as it is")


def parse_dims(texts: list[str] | None) -> list[Any]:
    """``search``'s and ``compile``'s ``--dynamic NAME=LO..HI[:B1,...]`` values as DynamicDims, in order; a
    malformed one, or a dim named twice, is one error line (before anything runs)."""
    from stitchtune.graph.dynamic import parse_dynamic_arg

    dims: list[Any] = []
    for text in texts or ():
        d = parse_dynamic_arg(text)
        twice = next((t for t, e in zip(texts or (), dims) if e.name == d.name), None)
        if twice is not None:
            raise GraphError(f"--dynamic {d.name}: given twice ({ascii(twice)} and {ascii(text)}); "
                             "give each dynamic dim once")
        dims.append(d)
    return dims


def search_dims(path: str, texts: list[str] | None) -> list[Any]:
    """``search``'s ``--dynamic`` values as DynamicDims, checked against the graph (module docstring)."""
    from stitchtune.graph.dynamic import DynamicGraph
    from stitchtune.tune.dynamic_search import with_dims

    dims = parse_dims(texts)  # bad text: one error line before anything runs
    g = load_graph_arg(path)
    if not isinstance(g, DynamicGraph):
        if dims:
            raise GraphError(f"--dynamic {dims[0].name}: {ascii(path)} has no dynamic dim (name one in a shape "
                             "and declare it in a top-level \"dynamic\" section: docs/graph-format.md)")
        return dims
    if not dims:
        raise GraphError(f"{ascii(path)} has dynamic dims ({bounds_text(g)}): search it with {dynamic_hint(g)} "
                         "(one generic kernel per bucket; a narrower range within those bounds also works)")
    with_dims(g, dims)  # a name the graph lacks or a range beyond its bounds: one line
    return dims


# ---------------------------------------------------------------------------- compile
def cmd_compile(args: argparse.Namespace, dg: Any) -> int:
    """``stitchtune compile`` of a graph with dynamic dims (module docstring)."""
    import os

    from stitchtune.cli import checks
    from stitchtune.cli.inputs import parse_schedule_arg
    from stitchtune.cli.outputs import no_cubin_line
    from stitchtune.deploy.compiled_dynamic import RefusedBucket, compile_buckets
    from stitchtune.tune.dynamic_search import with_dims

    dg = with_dims(dg, parse_dims(args.dynamic))
    name = str(dg.template.get("name", "graph"))
    out = args.out or os.path.join("compiled", name)
    why = checks.out_dir(out) if args.out is None else None
    if why:
        raise StitchtuneError(f"output directory {ascii(out)} (the default; -o/--out DIR names another): {why}")
    cg = compile_buckets(dg, args.db, args.device, schedule=parse_schedule_arg(args.schedule),
                         build=False if args.no_cubin else None, deterministic=args.deterministic)
    paths = cg.write(out)
    m = cg.manifest
    ext = ", ".join(f"{a['param']} = {a['dim']}" for a in m["extent_args"]["args"])
    print(f"{name} on {m['device_key']}: {len(cg.buckets)} bucket(s) of {bounds_text(dg)}, one generic program "
          f"each; the extents are passed to every kernel as `const int` after its pointers ({ext})")
    for b, entry in zip(cg.buckets, m["buckets"]):
        if isinstance(b, RefusedBucket):
            print(f"  {entry['label']}: no generic kernel ({b.refusal}): compiled per extent when called")
            continue
        ks = "; ".join(f"{k['kernel']} grid {k['grid']['at_min']}..{k['grid']['at_max']} x block {k['block'][0]}"
                       + (f", {k['registers']} registers" if k.get("registers") is not None else "")
                       for k in entry["kernels"])
        print(f"  {entry['label']}: schedule {entry['schedule_key']} ({b.source}): {ks}")
    generic = [b for b in cg.buckets if not isinstance(b, RefusedBucket)]
    rest = [b for b in generic if b.source in ("heuristic", "nearest-shape")]
    tuned = sum(b.source == "tuned" for b in generic)
    line = f"  {tuned} of {len(cg.buckets)} bucket(s) tuned"
    if rest:
        kinds = " or ".join(f"{k} schedule" for k in sorted({b.source for b in rest}))
        line += (f"; {len(rest)} without a record of their bucket use the {kinds} "
                 f"(`stitchtune search {dynamic_hint(dg)}` tunes them)")
    print(line)
    if all(b.cubin is None for b in generic):
        print(no_cubin_line(args.no_cubin))
    dirs = list(dict.fromkeys(p.parent.name for p in paths if p.name != "manifest.json"))  # bucket order
    print(f"wrote {os.path.join(out, 'manifest.json')} and {len(dirs)} bucket folder(s) of kernels "
          f"({', '.join(os.path.join(out, d) for d in dirs[:2])}{', ...' if len(dirs) > 2 else ''})")
    return 0


# ---------------------------------------------------------------------------- run
def parse_extent_arg(text: str) -> tuple[str, int]:
    """``run``'s ``--dynamic NAME=N`` (one extent); malformed: one GraphError line."""
    from stitchtune.graph.checks import NAME_RE
    from stitchtune.graph.dynamic import MAX_EXTENT

    name, eq, val = text.partition("=")
    if not eq or not NAME_RE.match(name) or not val.isdigit() or not 1 <= int(val) <= MAX_EXTENT:
        raise GraphError(f"--dynamic {ascii(text)}: run takes one extent per dynamic dim, NAME=N (an integer >= 1)")
    return name, int(val)


def _extents(args: argparse.Namespace, dg: Any, arrays: dict[str, np.ndarray]) -> dict[str, int]:
    """Each dim's extent from ``--dynamic NAME=N`` and the shapes of the arrays read (module docstring)."""
    by = {d.name: d for d in dg.dims}
    ext: dict[str, int] = {}
    where: dict[str, str] = {}
    for text in args.dynamic or ():
        name, n = parse_extent_arg(text)
        if name not in by:
            raise GraphError(f"--dynamic {name}: the graph has no dynamic dim {name!r} (its dims: {bounds_text(dg)})")
        if name in ext and ext[name] != n:
            raise GraphError(f"--dynamic {name}: given twice ({ext[name]} and {n})")
        ext[name], where[name] = n, f"--dynamic {name}={n}"
    for inp, spec in dg.template["inputs"].items():
        a = arrays.get(inp)
        if a is None or a.ndim != len(spec["shape"]):
            continue  # missing or of another rank: the input check names it
        for axis, (want, got) in enumerate(zip(spec["shape"], a.shape)):
            if isinstance(want, str):
                if want in ext and ext[want] != got:
                    raise GraphError(f"input {ascii(inp)} dim {axis}: {want}={got}, but {where[want]}")
                ext[want], where[want] = int(got), f"input {ascii(inp)} has {want}={got}"
    missing = [d for d in dg.dims if d.name not in ext]
    if missing:
        raise GraphError(problems=[
            f"no extent for dynamic dim {d.name}: give --dynamic {d.name}=N ({d.lo} <= N <= {d.hi}) for "
            f"--random-inputs, or --inputs arrays of that extent" for d in missing])
    for d in dg.dims:
        if not d.lo <= ext[d.name] <= d.hi:
            raise GraphError(f"{where[d.name]}: outside the bounds the graph declares for {d.name}, {d.lo}..{d.hi}")
    return ext


def cmd_run(args: argparse.Namespace, dg: Any) -> int:
    """``stitchtune run`` of a graph with dynamic dims (module docstring)."""
    from stitchtune.cli.inputs import load_inputs_npz, parse_schedule_arg
    from stitchtune.cli.outputs import save_outputs_npz
    from stitchtune.graph.reference import check_inputs, random_inputs

    schedule = parse_schedule_arg(args.schedule)
    specs = dg.at({d.name: d.lo for d in dg.dims})  # the inputs' dtypes (the same at every extent)
    arrays: dict[str, np.ndarray] = {}
    for path in args.inputs or ():
        arrays.update(load_inputs_npz(path, specs))
    ext = _extents(args, dg, arrays)
    g = dg.at(ext)
    key = dg.key_of(ext)
    if args.random_inputs is not None:
        arrays = {**random_inputs(g, args.random_inputs), **arrays}
    else:
        try:
            check_inputs(g, arrays)
        except StitchtuneError as e:
            hint = ["--random-inputs SEED draws the inputs that no --inputs file has"] \
                if any(": missing" in p for p in e.problems) else []
            raise StitchtuneError(problems=[*e.problems, *hint]) from None
    print(f"extents {', '.join(f'{k}={v}' for k, v in sorted(ext.items()))}: bucket {key.label()}")
    outputs = _run_backend(args, dg, key, g, arrays, schedule)
    save_outputs_npz(args.out, outputs)
    for name, a in outputs.items():
        print(f"{name}: {a.dtype}{list(a.shape)}")
    print(f"wrote {args.out}")
    return 0


def _run_backend(args: argparse.Namespace, dg: Any, key: Any, g: Any, arrays: dict[str, np.ndarray],
                 schedule: dict[str, Any] | None) -> dict[str, np.ndarray]:
    from stitchtune.deploy.compiled_dynamic import RefusedBucket, compile_buckets
    from stitchtune.emulate.memory import EmulatorFault
    from stitchtune.graph.reference import run_reference

    if args.backend == "reference":
        out: dict[str, np.ndarray] = run_reference(g, arrays)
        return out
    emulate = args.backend == "emulate"
    cg = compile_buckets(dg, args.db, args.device, keys=[key], schedule=schedule, build=False if emulate else True)
    [b] = cg.buckets
    if isinstance(b, RefusedBucket):
        print(f"bucket {key.label()}: no generic kernel ({b.refusal}): compiled for these extents")
    else:
        print(f"bucket {key.label()}: schedule {b.schedule.key()} ({b.source}: {b.reason})")
    try:
        return cg.emulate(**arrays) if emulate else cg(**arrays)
    except EmulatorFault as e:  # the user's schedule (e.g. a grid barrier over more blocks than fit); else a bug
        if schedule is None:
            raise
        raise StitchtuneError(f"--schedule cannot run on {cg.device.key}: {e}") from None
