"""The graph rewrite of the torch.compile backend: regions replaced by ``stitchtune::region`` calls, then checked on fake tensors.

Contract
--------
* :func:`replace_regions(gm, chosen, held)` returns a new GraphModule with ``gm``'s nodes in a
  topological order, each chosen region one ``stitchtune::region`` call plus one ``getitem`` per output
  (a region input that is a SymInt's bound tensor, :func:`~stitchtune.importers.torch_symvalues.is_bound`,
  is passed as the SymInt in the call's ``scalars``, in input order)
  (no-ops of a region read outside it copied over; a ``clone`` of a region's output that only other ops
  read, with its layout, is that output), and for each node made for a region, (the original node whose
  value it is, or None; the region's key). ``held[key]``: positions of the region's inputs that the call
  does not pass (constants its registered kernel holds); a node only they read is dead code. A cycle of
  regions raises :class:`~stitchtune.errors.StitchtuneError` (internal).
* :func:`fake_check(new_gm, origin, example_inputs)` runs those nodes on fake tensors and returns
  {region key: why} for the regions whose fake result fails or differs from PyTorch's in shape, dtype
  or strides (what :mod:`stitchtune.deploy.torch_backend` declines).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any

from stitchtune.errors import StitchtuneError


def _same_layout(got: Any, want: Any) -> str | None:
    """None when the fake tensors ``got`` and ``want`` agree in shape, dtype and strides (of the
    dims longer than 1), else what differs."""
    import torch

    if not isinstance(want, torch.Tensor):
        return None
    if not isinstance(got, torch.Tensor):
        return f"a {type(got).__name__} where PyTorch has a tensor"
    if tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
        return f"{got.dtype}{list(got.shape)} where PyTorch has {want.dtype}{list(want.shape)}"
    if any(n > 1 and a != b for n, a, b in zip(want.shape, got.stride(), want.stride())):
        return f"strides {list(got.stride())} where PyTorch has {list(want.stride())} (shape {list(want.shape)})"
    return None


def fake_check(new_gm: Any, origin: Mapping[Any, tuple[Any, str]], example_inputs: Sequence[Any]) -> dict[str, str]:
    """Run the nodes of ``new_gm`` made for regions (``origin``: new node -> (the original node it
    stands for or None, region key)) on fake tensors, as AOTAutograd and Inductor will, reading every
    other value from its node's ``meta["val"]`` (PyTorch's own fake value), and compare each with the
    original node's: {region key: why} for the regions whose fake result fails or differs (shape,
    dtype, strides)."""
    import torch
    import torch.fx
    from torch._guards import detect_fake_mode
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = detect_fake_mode(example_inputs) or FakeTensorMode(allow_non_fake_inputs=True)
    bad: dict[str, str] = {}
    vals: dict[Any, Any] = {}
    with mode:
        for n in new_gm.graph.nodes:
            hit = origin.get(n)
            if hit is None or hit[1] in bad:
                continue
            orig, key = hit
            try:
                args, kwargs = torch.fx.node.map_arg((n.args, n.kwargs),
                                                     lambda a: vals[a] if a in vals else a.meta["val"])
                vals[n] = n.target(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - the region's fake result failed
                bad[key] = f"{type(exc).__name__}: {str(exc)[:200]}"
                continue
            if orig is not None:
                why = _same_layout(vals[n], orig.meta.get("val"))
                if why:
                    bad[key] = f"{orig.name}: {why}"
    return bad


def replace_regions(gm: Any, chosen: Sequence[tuple[Any, str]], held: Mapping[str, frozenset[int]] | None = None
                    ) -> tuple[Any, dict[Any, tuple[Any, str]]]:
    """A new GraphModule: ``gm``'s nodes in a topological order, each region one ``stitchtune::region``
    call (placed after its last input; without the inputs at ``held[key]``) plus one ``getitem`` per
    output; and for each node made for a region, (the original node whose value it is, or None; the
    region's key)."""
    import torch
    import torch.fx

    from stitchtune.importers.torch_fx_util import fx_args
    from stitchtune.importers.torch_symsizes import is_carrier
    from stitchtune.importers.torch_symvalues import is_bound

    owner = {n: item for item in chosen for n in item[0].nodes}
    nodes = list(gm.graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    units: list[Any] = []
    seen_regions: set[str] = set()
    for n in nodes:
        if n in owner:
            if owner[n][1] not in seen_regions:
                seen_regions.add(owner[n][1])
                units.append(owner[n])
        else:
            units.append(n)

    def deps(u: Any) -> list[Any]:
        if isinstance(u, tuple):
            return list(u[0].inputs)
        return fx_args(u)

    g = torch.fx.Graph()
    env: dict[Any, Any] = {}
    origin: dict[Any, tuple[Any, str]] = {}
    for u in _topological(units, deps, owner, order):
        if isinstance(u, tuple):
            r, key = u
            skip = (held or {}).get(key, frozenset())
            bound = {i for i, x in enumerate(r.inputs) if (is_bound(x) or is_carrier(x)) and i not in skip}
            args: tuple[Any, ...] = (key, [env[x] for i, x in enumerate(r.inputs) if i not in skip | bound])
            if bound:   # SymInt values and sizes: passed as they are, made tensors by the registered region
                args += ([env[x.args[0][0] if is_carrier(x) else x.args[1]] for i, x in enumerate(r.inputs)
                          if i in bound],)
            call = g.call_function(torch.ops.stitchtune.region.default, args)
            perms = r.output_perms or (None,) * len(r.outputs)
            call.meta["val"] = [o.meta.get("val") if p is None else o.meta["val"].permute(p)
                                for o, p in zip(r.outputs, perms)]
            origin[call] = (None, key)
            for i, (o, p) in enumerate(zip(r.outputs, perms)):
                item = g.call_function(operator.getitem, (call, i))
                item.meta = dict(o.meta) if p is None else {"val": call.meta["val"][i]}
                if p is not None:   # the kernel wrote PyTorch's strided output row-major: view it back
                    origin[item] = (None, key)
                    item = g.call_function(torch.ops.aten.permute.default, (item, list(r.restore_perm(i))))
                    item.meta = dict(o.meta)
                env[o] = item
                origin[item] = (o, key)
            for a, _same in r.aliases:   # no-ops of the region read outside it: their views, again
                made = set(env.values())
                env[a] = _copy_noop_chain(g, env, a)
                origin.update({v: (k, key) for k, v in env.items() if v not in made})
        elif _redundant_copy(u, env, origin):
            env[u] = env[u.args[0]]
        else:
            env[u] = g.node_copy(u, lambda a: env[a])
    g.eliminate_dead_code()
    g.lint()
    return torch.fx.GraphModule(gm, g), origin


def _redundant_copy(n: Any, env: Mapping[Any, Any], origin: Mapping[Any, tuple[Any, str]]) -> bool:
    """Whether ``n`` is a ``clone`` / ``contiguous`` of a region's output (a new node of ``env`` made for a
    region, ``origin``) with its dtype, shape and strides, that no mutating op reads and that may share
    the output's tensor (:func:`~stitchtune.importers.torch_saved.may_share`: not both outliving the graph
    where a user may write to one; a dropout of probability 0 after a softmax, both saved for the
    backward): its readers may read the kernel's output itself, where Inductor would copy it in a
    kernel of its own (Inductor alone writes the copy from the softmax's kernel)."""
    import torch

    from stitchtune.importers.torch_fx_util import op_key
    from stitchtune.importers.torch_saved import may_share

    if n.op != "call_function" or op_key(n.target) not in ("aten.clone", "aten.contiguous") or not n.args:
        return False
    src = n.args[0]
    if getattr(src, "op", None) is None or env.get(src) not in origin:
        return False
    got, want = src.meta.get("val"), n.meta.get("val")
    if not (isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor)) or _same_layout(got, want):
        return False
    if not may_share(n, src):   # both outlive the graph where a user may write to one of them
        return False
    for u in n.users:
        schema = getattr(u.target, "_schema", None)
        if schema is not None and schema.is_mutable:
            return False
    return True


def _copy_noop_chain(g: Any, env: dict[Any, Any], n: Any) -> Any:
    """The new graph's node for ``n``, a no-op of a region (a view, eval dropout, a same-dtype cast)
    read outside it: ``n`` copied over its (copied) argument chain down to a value ``env`` has, so that
    its shape and strides are PyTorch's (an ``unsqueeze`` of a region output is not that output)."""
    from stitchtune.importers.torch_subgraph import is_noop

    if n in env:
        return env[n]
    if not is_noop(n):
        raise StitchtuneError(f"internal: alias {n.name} of a region is not a no-op chain")
    env[n] = g.node_copy(n, lambda a: _copy_noop_chain(g, env, a))
    return env[n]


def _topological(units: list[Any], deps: Any, owner: Mapping[Any, Any], order: Mapping[Any, int]) -> list[Any]:
    """``units`` in a topological order, each as early as the original order allows (Kahn, by index)."""
    import heapq

    def unit_of(n: Any) -> Any:
        return owner[n] if n in owner else n

    first = {id(u): order[u[0].nodes[0]] if isinstance(u, tuple) else order[u] for u in units}
    by_id = {id(u): u for u in units}
    need: dict[int, int] = {}
    users: dict[int, list[int]] = {}
    for u in units:
        ds = {id(unit_of(d)) for d in deps(u)} - {id(u)}
        need[id(u)] = len(ds)
        for d in ds:
            users.setdefault(d, []).append(id(u))
    ready = [(first[i], i) for i, c in need.items() if c == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        _, i = heapq.heappop(ready)
        out.append(by_id[i])
        for j in users.get(i, ()):
            need[j] -= 1
            if need[j] == 0:
                heapq.heappush(ready, (first[j], j))
    if len(out) != len(units):
        raise StitchtuneError("internal: stitched regions form a cycle (a region was not convex)")
    return out
