"""Which values of an ATen graph someone outside it can see: copy semantics for provably identical outputs.

A ``clone`` (attention dropout at probability 0 in training) is PyTorch's promise of a second tensor:
an in-place write to one must not change the other. Inside a functional ATen graph nothing writes,
so two values that are equal (a ``clone`` of a region's output and that output) may share one
tensor unless both outlive the graph where a writer can reach them:

* a value is **returned** when the graph's output node returns it or a view of it (views share its
  storage);
* it is **user-visible** when it is returned at a position the user (or a mutated input) receives. In
  an AOTAutograd forward graph the outputs from ``fw_metadata.num_forward`` on are the tensors saved
  for the backward, which only autograd reads (and never writes): :func:`mark_saved_outputs`, called
  in the forward compiler, records that position on the output node (:data:`SAVED_FROM`); a graph
  without the mark counts every output as user-visible.

:func:`may_share` is the rule the region finder (a ``clone`` output is left out of the region) and the
backend's rewrite (its readers read the kernel's tensor) both apply: sharing is refused when one of the
two values is user-visible and the other is returned (a user's in-place write would change a tensor
autograd saved, or another output); two values only autograd keeps, or one that nobody outside
the graph sees, share safely.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["SAVED_FROM", "mark_saved_outputs", "may_share", "returned", "user_visible"]

#: output-node meta key: the position from which the graph's outputs are saved for the backward
SAVED_FROM = "stitchtune_saved_from"


def mark_saved_outputs(gm: Any) -> int | None:
    """In an AOTAutograd forward compiler: record on ``gm``'s output node (meta :data:`SAVED_FROM`) the
    position from which its outputs are tensors saved for the backward (``fw_metadata.num_forward``), and
    return it; None (nothing marked) outside such a compiler, with effect tokens, or when the number does
    not fit the graph's outputs."""
    try:
        from torch._guards import TracingContext

        ctx = TracingContext.try_get()
        meta = getattr(ctx, "fw_metadata", None) if ctx is not None else None
        if meta is None or getattr(meta, "tokens", None):
            return None
        frm = int(meta.num_forward)
    except Exception as exc:  # noqa: BLE001 - a private torch API: without it every output is user-visible
        log.debug("no forward metadata (%s): every output counts as the user's", exc)
        return None
    out = next((n for n in gm.graph.nodes if n.op == "output"), None)
    if out is None or not out.args or not isinstance(out.args[0], (tuple, list)) or not 0 <= frm <= len(out.args[0]):
        return None
    out.meta[SAVED_FROM] = frm
    return frm


def _positions(node: Any) -> list[tuple[Any, int]]:
    """(output node, position) of every place the graph returns ``node`` or a view of it."""
    from stitchtune.importers.torch_subgraph import _is_view

    found: list[tuple[Any, int]] = []
    seen: set[Any] = set()
    todo = [node]
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        for u in n.users:
            if u.op == "output":
                outs = u.args[0] if u.args and isinstance(u.args[0], (tuple, list)) else (u.args[0],) if u.args else ()
                found += [(u, i) for i, o in enumerate(outs) if o is n]
            elif u.op == "call_function" and _is_view(u):
                todo.append(u)
    return found


def returned(node: Any) -> bool:
    """Whether the graph returns ``node`` or a view of it (at any position, saved ones included)."""
    return bool(_positions(node))


def user_visible(node: Any) -> bool:
    """Whether the graph returns ``node`` or a view of it at a position that is not a saved tensor of
    the backward (every position where the output node has no :data:`SAVED_FROM`)."""
    for out, i in _positions(node):
        frm = out.meta.get(SAVED_FROM)
        if frm is None or i < int(frm):
            return True
    return False


def may_share(a: Any, b: Any) -> bool:
    """Whether equal values ``a`` and ``b`` (fx nodes) may be one tensor (module docstring): not when one
    is user-visible and the other returned."""
    return not ((user_visible(a) and returned(b)) or (user_visible(b) and returned(a)))
