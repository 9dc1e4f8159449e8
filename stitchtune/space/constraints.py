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


_GLOBALS: dict[str, Any] = {"__builtins__": {}}
"""The globals every expression is evaluated in: no builtins (an allowed expression cannot assign)."""


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
    return eval(code, _GLOBALS, names)  # noqa: S307  (an allowed expression cannot change ``names``)


@functools.lru_cache(maxsize=256)
def _compiled_all(exprs: tuple[str, ...]) -> tuple[CodeType, frozenset[str]]:
    """One code object that evaluates every expression of ``exprs`` (each checked as
    :func:`_compiled` checks it) into a tuple, and the names they use together."""
    used = [n for e in exprs for n in _compiled(e)[1]]
    elts: list[ast.expr] = [ast.parse(e, mode="eval").body for e in exprs]
    tree = ast.fix_missing_locations(ast.Expression(body=ast.Tuple(elts=elts, ctx=ast.Load())))
    return compile(tree, "<constraints>", "eval"), frozenset(used)


def safe_eval_all(exprs: tuple[str, ...], names: Mapping[str, Any]) -> tuple[Any, ...]:
    """``tuple(safe_eval(e, names) for e in exprs)``, with one evaluation instead of one per expression
    (the space's rules are checked for every point drawn): the same results, and the same error, for
    the first expression in order that uses a name ``names`` lacks or anything refused."""
    code, used = _compiled_all(exprs)
    if not names.keys() >= used:
        return tuple(safe_eval(e, names) for e in exprs)  # raises for the first expression at fault
    values: tuple[Any, ...] = eval(code, _GLOBALS, names)  # noqa: S307
    return values
