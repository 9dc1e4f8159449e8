"""The numbers of a plan as functions of a bucket's extents: monomials and multilinear polynomials.

Contract
--------
:func:`fit_monomial` is the monomial ``coef * prod(d ** e_d)`` (integer ``coef``, exponents 0..4) through
the value at the representative extents (every dim at ``a``) and, per dim, the value with that one dim
moved to ``b``; None where there is none. Sizes and strides of a graph whose dynamic dims are whole
dims are such monomials (attention scores ``[B, H, S, S]``: ``B*H*S*S``).

:func:`fit_multilinear` is the polynomial of degree at most 1 in each dim (integer coefficients)
through the values at the corners of the box ``{a_d, b_d}`` of the dims that change the value:
``value(moved)`` answers the value with the dims of ``moved`` at ``b`` and the others at ``a``; None
where a coefficient is not an integer. A decode step's cache concatenated with the new position
under a dynamic batch has rows ``B*H*(P + 1) = H*B*P + H*B``; a slice dropping a position of the
sequence ``[B, S - 1, C]`` has ``B*S - B`` rows. It asks for ``2 ** k`` corners (``k`` the dims that
change the value), each at most once per caller (the caller memoises: a corner is a plan).

Neither proves anything: :func:`stitchtune.lower.dynamic.fit_rows` keeps a fit only where it gives the
value at a further, odd extent of every dim.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction

from stitchtune.graph.dynamic import SymInt

__all__ = ["fit_monomial", "fit_multilinear"]


def fit_monomial(base: int, moved: Mapping[str, tuple[int, int, int]]) -> SymInt | None:
    """The monomial through ``base`` (all dims at a) and, per dim, its value with that dim at b:
    ``moved[d] = (a, b, value)``; None when there is none with integer exponents 0..4."""
    dims: list[str] = []
    coef = Fraction(base)
    for d, (a, b, v) in sorted(moved.items()):
        if v == base:
            continue
        if base == 0 or v == 0:
            return None
        ratio, e, step = Fraction(v, base), 0, Fraction(b, a)
        power = Fraction(1)
        while power != ratio and e < 4:
            e += 1
            power *= step
        if power != ratio:
            return None
        dims += [d] * e
        coef /= Fraction(a) ** e
    if coef.denominator != 1:
        return None
    return SymInt(int(coef), tuple(sorted(dims)))


def fit_multilinear(dims: Sequence[str], a: Mapping[str, int], b: Mapping[str, int],
                    value: Callable[[frozenset[str]], int]) -> SymInt | None:
    """The polynomial of degree <= 1 in each of ``dims`` through ``value`` at the corners (module
    docstring); ``a[d] != b[d]`` for every dim; None for a coefficient that is not an integer."""

    def fit(i: int, moved: frozenset[str]) -> dict[tuple[str, ...], Fraction]:
        if i == len(dims):
            return {(): Fraction(value(moved))}
        d = dims[i]
        at_a, at_b = fit(i + 1, moved), fit(i + 1, moved | {d})
        out: dict[tuple[str, ...], Fraction] = {}
        for key in at_a.keys() | at_b.keys():   # per coefficient of the other dims: beta * d + alpha
            va, vb = at_a.get(key, Fraction(0)), at_b.get(key, Fraction(0))
            beta = (vb - va) / (b[d] - a[d])
            out[key] = out.get(key, Fraction(0)) + va - beta * a[d]
            out[(*key, d)] = out.get((*key, d), Fraction(0)) + beta
        return out

    coefs = fit(0, frozenset())
    if any(c.denominator != 1 for c in coefs.values()):
        return None
    return SymInt.poly([(int(c), k) for k, c in coefs.items()])
