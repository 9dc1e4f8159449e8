"""The pieces the fit study scripts share (``scripts/fit_terms.py``, ``fit_order.py``, ``fit_learner.py``,
``fit_ceiling.py``): the fit cache by (variant, groups left out), held-out (leave-one-model-out) predictions and the
nested choice among variants, the common options with the ``--variants`` check, the dataset's rows loaded with their
derived arrays, and the report written as ``<out>/<name>.md`` and ``.json``.

Nothing here fits or measures on its own; each script passes its own fit callable, defaults and name (the ``prog``
of its ``<prog>: error: ...`` lines).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from fit_cost_model import ir_only  # noqa: E402

from stitchtune.cost.fit_dataset import DatasetError, load_dataset, with_timing  # noqa: E402
from stitchtune.cost.fitted import Coefficients  # noqa: E402
from stitchtune.cost.fitting import TOLERANCE, predict_rows, score  # noqa: E402
from stitchtune.hardware.device import get_device  # noqa: E402

#: ``fit(rows, dev, variant) -> Coefficients``: one variant's coefficients fitted to ``rows``
FitVariant = Callable[[list[dict[str, Any]], Any, int], Coefficients]


class Fits:
    """Fits cached by (variant, groups left out): ``fits(v, out)`` is ``fit`` of the rows whose group is not in
    ``out``, computed once per key. ``dev`` is public (``fit_ceiling.lomo`` reads ``fits.dev``)."""

    def __init__(self, rows: list[dict[str, Any]], dev: Any, fit: FitVariant) -> None:
        self.rows, self.dev, self.fit = rows, dev, fit
        self.cache: dict[tuple[int, frozenset[str]], Coefficients] = {}

    def __call__(self, v: int, out: frozenset[str]) -> Coefficients:
        key = (v, out)
        if key not in self.cache:
            self.cache[key] = self.fit([r for r in self.rows if r["group"] not in out], self.dev, v)
        return self.cache[key]


def lomo(fits: Any, v: int, rows: list[dict[str, Any]], groups: list[str], skip: frozenset[str] = frozenset()) -> Any:
    """Held-out predictions of ``rows`` (features as given), each group fitted without it (and ``skip``); ``fits``
    is any cache called as ``fits(variant, left-out groups) -> Coefficients`` with the device as ``fits.dev``
    (:class:`Fits`). A row whose group is not in ``groups`` stays NaN."""
    pred = np.full(len(rows), np.nan)
    for g in groups:
        idx = [i for i, r in enumerate(rows) if r["group"] == g]
        pred[idx] = predict_rows([rows[i] for i in idx], fits.dev, fits(v, skip | {g}))
    return pred


def nested_choice(fits: Any, pre: list[dict[str, Any]], groups: list[str], m: Any, vs: Sequence[int],
                  prepare: Callable[[int], None] | None = None) -> dict[str, int]:
    """Per held-out group g, the variant of ``vs`` with the best leave-one-model-out score (pre-build within ±25%,
    then ρ; the first of ``vs`` on a tie) on the other groups only, fitted without g too: no held-out score enters
    the choice. ``prepare(v)``, where given, is called before each variant's fits and predictions."""
    chosen: dict[str, int] = {}
    for g in groups:
        others = [x for x in groups if x != g]
        sub = [i for i, r in enumerate(pre) if r["group"] != g]
        best: tuple[tuple[float, float], int] | None = None
        for v in vs:
            if prepare is not None:
                prepare(v)
            p = lomo(fits, v, [pre[i] for i in sub], others, skip=frozenset({g}))
            s = score(m[sub], p)
            key = (s["within25"], s["spearman"])
            if best is None or key > best[0]:
                best = (key, v)
        assert best is not None, "no variants"
        chosen[g] = best[1]
    return chosen


def nested_predictions(chosen: dict[str, int], held: dict[int, tuple[Any, Any]], gs: Any) -> tuple[Any, Any]:
    """The nested held-out predictions (pre-build, post-build): each group's rows as its chosen variant predicted
    them held out (``held[v]``: that variant's held-out pre- and post-build arrays); NaN for a group not chosen."""
    nested, nested_post = np.full(len(gs), np.nan), np.full(len(gs), np.nan)
    for g, v in chosen.items():
        idx = gs == g
        nested[idx] = held[v][0][idx]
        nested_post[idx] = held[v][1][idx]
    return nested, nested_post


def study_args(prog: str, doc: str, argv: Sequence[str] | None, *, dataset: str, out: str, variants: int,
               name: str) -> tuple[argparse.Namespace, list[int]] | None:
    """Parse ``--dataset`` / ``--out`` / ``--variants`` (default: all ``variants`` of them) / ``--no-nested`` /
    ``--name`` (the first line of ``doc`` as the description) and check ``--variants``: comma-separated numbers of
    0..variants-1, at least one. Returns (options, the variants chosen), or None after the one line
    ``<prog>: error: --variants: ...`` on stderr (the caller exits 2). argparse's own errors exit 2 as ever."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--dataset", default=dataset)
    ap.add_argument("--out", default=out)
    ap.add_argument("--variants", default=",".join(str(i) for i in range(variants)))
    ap.add_argument("--no-nested", action="store_true")
    ap.add_argument("--name", default=name, help="output file stem: <out>/<name>.md and .json")
    a = ap.parse_args(argv)
    try:
        vs = [int(x) for x in a.variants.split(",")]
        if not vs or not all(0 <= v < variants for v in vs):
            raise ValueError
    except ValueError:
        print(f"{prog}: error: --variants: comma-separated numbers of 0..{variants - 1}", file=sys.stderr)
        return None
    return a, vs


@dataclasses.dataclass(frozen=True)
class StudyRows:
    """A dataset's measured rows and what every study derives from them (row order kept throughout)."""

    rows: list[dict[str, Any]]   #: the rows with their timing (post-build: the SASS facts as stored)
    pre: list[dict[str, Any]]    #: the same rows with the compiled facts zeroed (pre-build, ``ir_only``)
    groups: list[str]            #: the distinct groups, sorted
    gs: Any                      #: numpy array: each row's group
    m: Any                       #: numpy array: each row's measured time, us


def load_rows(prog: str, dataset: str | Path, dev: Any) -> StudyRows | None:
    """The rows of ``REPO / dataset`` (an absolute path stays as it is) for ``dev``; None after the one line
    ``<prog>: error: <why>`` on stderr where it cannot be read (:class:`DatasetError`; the caller exits 2)."""
    try:
        stored = load_dataset(REPO / dataset, dev.key)
    except DatasetError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return None
    rows = with_timing([dict(r) for r in stored.rows])
    return StudyRows(rows=rows, pre=ir_only(rows), groups=sorted({r["group"] for r in rows}),
                     gs=np.array([r["group"] for r in rows]), m=np.array([r["measured_us"] for r in rows]))


@dataclasses.dataclass(frozen=True)
class Study:
    """A variant study ready to run: its options, the variants chosen, the device (H200), the rows and the fits of
    the pre-build rows."""

    args: argparse.Namespace
    vs: list[int]
    dev: Any
    data: StudyRows
    fits: Fits


def open_study(prog: str, doc: str, argv: Sequence[str] | None, fit: FitVariant, *, dataset: str, out: str,
               variants: int, name: str) -> Study | None:
    """:func:`study_args`, then :func:`load_rows` on the H200 and a :class:`Fits` of the pre-build rows by
    ``fit``; None after the one ``<prog>: error: ...`` line of either (the caller exits 2)."""
    parsed = study_args(prog, doc, argv, dataset=dataset, out=out, variants=variants, name=name)
    if parsed is None:
        return None
    a, vs = parsed
    dev = get_device("h200")
    data = load_rows(prog, a.dataset, dev)
    if data is None:
        return None
    return Study(args=a, vs=vs, dev=dev, data=data, fits=Fits(data.pre, dev, fit))


def within(m: Any, p: Any) -> Any:
    """Per row: is the prediction ``p`` within the fit's tolerance (±25%) of the measured ``m``?"""
    return np.abs(p / m - 1) <= TOLERANCE


def within_text(m: Any, p: Any, s: dict[str, Any]) -> str:
    """A report's cell for predictions ``p`` of ``m`` scored ``s`` (:func:`score`): ``"92.5% (111)"``, the share
    within ±25% and the count of rows."""
    return f"{s['within25']:.1%} ({int(within(m, p).sum())})"


def per_group(m: Any, gs: Any, groups: list[str], pre: Any, post: Any) -> dict[str, tuple[float, float]]:
    """Per group: the shares of its rows within ±25% by the pre-build and the post-build predictions."""
    return {g: (float(np.mean(within(m[gs == g], pre[gs == g]))), float(np.mean(within(m[gs == g], post[gs == g]))))
            for g in groups}


def command(prog: str, argv: Sequence[str] | None) -> str:
    """The command line a report quotes: ``python scripts/<prog>.py`` and the arguments (``sys.argv``'s if None)."""
    return " ".join([f"python scripts/{prog}.py", *(argv if argv is not None else sys.argv[1:])])


def write_report(out: str | Path, name: str, text: str, data: dict[str, Any]) -> None:
    """Print ``text`` and write it as ``REPO / out / <name>.md``, ``data`` as ``<name>.json`` (indented, numpy
    numbers as floats); ``out`` is made if missing, an absolute ``out`` stays as it is."""
    print(text)
    o = REPO / out
    o.mkdir(parents=True, exist_ok=True)
    (o / f"{name}.md").write_text(text)
    (o / f"{name}.json").write_text(json.dumps(data, indent=1, default=float))
