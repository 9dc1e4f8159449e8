"""The safe evaluator of the space file's expressions (constraints, scheme and reuse rules).

An expression may use names, numbers, strings, tuples/lists, arithmetic, comparisons, ``in`` and
``and``/``or``/``not`` only; anything else (calls, attributes, subscripts, comprehensions, lambdas) is
refused with a :class:`~stitchtune.errors.StitchtuneError` naming the node. Evaluation has no builtins.
"""

from __future__ import annotations

import ast
import functools
from types import CodeType
from typing import Any, Mapping

from stitchtune.errors import StitchtuneError

_ALLOWED = (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.BinOp,
            ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod, ast.Div, ast.Compare, ast.Eq, ast.NotEq,
            ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Name, ast.Load, ast.Constant, ast.In, ast.NotIn,
            ast.Tuple, ast.List)


@functools.lru_cache(maxsize=1024)
def _compiled(expr: str) -> tuple[CodeType, tuple[str, ...]]:
    """The checked, compiled form of an expression and the names it uses, in first-use order
    (cached: the space's few expressions are evaluated for every point checked)."""
    tree = ast.parse(expr, mode="eval")
    used = []
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED):
            raise StitchtuneError(f"search space constraint {expr!r} uses {type(node).__name__}")
        if isinstance(node, ast.Name) and node.id not in ("True", "False"):
            used.append(node.id)
    return compile(tree, "<constraint>", "eval"), tuple(dict.fromkeys(used))


def names_used(expr: str) -> tuple[str, ...]:
    """The names ``expr`` reads (raises like :func:`safe_eval` on a refused expression)."""
    return _compiled(expr)[1]


def safe_eval(expr: str, names: Mapping[str, Any]) -> Any:
    """Evaluate ``expr`` over ``names``; a name it uses that ``names`` lacks is a
    :class:`~stitchtune.errors.StitchtuneError`, and so is anything but plain arithmetic/logic."""
    code, used = _compiled(expr)
    for n in used:
        if n not in names:
            raise StitchtuneError(f"search space constraint {expr!r} uses unknown name {n!r}")
    return eval(code, {"__builtins__": {}}, dict(names))  # noqa: S307
