"""Where the schedule space's data comes from: ``search_spaces/stitch.json`` (domains, constraints,
scheme and reuse rules, ``version``), found as package data, via ``$STITCHTUNE_SPACES``, or in a
source checkout; and what an earlier version drew (:func:`params_as_of`).

A parameter's ``before`` entries (``params.<name>.before.<V>``: ``choices`` and ``undrawn``) are what
it drew in studies created before space version ``V``: an optuna study resumes only with the choices it
was created with (optuna refuses a categorical whose choices changed), and the golden seeded samples
were recorded with them. A version may change what is drawn, never what is legal: the shipped file's
entries hold today's legal values (tests/space/test_compat.py); an entry is kept to today's legal values."""

from __future__ import annotations

import importlib.resources
import json
import os
from pathlib import Path
from typing import Any

from stitchtune.errors import StitchtuneError

SPACE_FILE = "stitch.json"


def default_space_file() -> Any:
    """Where the schedule space is read from: ``$STITCHTUNE_SPACES/stitch.json`` when that variable is
    set; else the copy installed as package data ``stitchtune.search_spaces`` (a wheel, or an editable
    install, maps the repository's top-level ``search_spaces/`` there); else, in a source checkout put
    on ``PYTHONPATH`` without installing, the repository's ``search_spaces/stitch.json``. Returns a
    ``Path`` or an ``importlib.resources`` Traversable (both have ``read_text``)."""
    env = os.environ.get("STITCHTUNE_SPACES")
    if env:
        return Path(env) / SPACE_FILE
    try:
        return importlib.resources.files("stitchtune.search_spaces") / SPACE_FILE
    except ModuleNotFoundError:
        return Path(__file__).resolve().parents[2] / "search_spaces" / SPACE_FILE


def load_space_file(path: Path | None = None) -> dict[str, Any]:
    """The parsed space file at ``path`` (default: :func:`default_space_file`); an unreadable or
    malformed file is a :class:`~stitchtune.errors.StitchtuneError`."""
    p = Path(path) if path else default_space_file()
    try:
        data: dict[str, Any] = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        env = os.environ.get("STITCHTUNE_SPACES")
        via = (f" ($STITCHTUNE_SPACES={env!a} names the folder that holds {SPACE_FILE})"
               if not path and env else "")
        raise StitchtuneError(f"cannot read search space {p}{via}: {why}") from None
    return data


def _version_number(v: Any, where: str) -> int:
    try:
        return int(str(v))
    except ValueError:
        raise StitchtuneError(f"search space file: {where}: version {str(v)[:20]!a} is not a whole number") from None


def params_as_of(data: dict[str, Any], version: str) -> dict[str, Any]:
    """``data["params"]`` as space version ``version`` drew them: each parameter with ``before`` entries
    takes the ``choices`` and ``undrawn`` of the entry of the smallest version above ``version`` (none
    above it: today's), kept to today's legal values (choices + undrawn: a file or a test that narrows a
    domain narrows every version's); the ``before`` entries themselves are dropped. ``data["params"]``
    itself where no entry applies. A malformed entry is a :class:`~stitchtune.errors.StitchtuneError`."""
    asked = _version_number(version, "as of")
    params: dict[str, Any] = data["params"]
    out: dict[str, Any] = {}
    changed = False
    for name, p in params.items():
        before = p.get("before") or {}
        if not isinstance(before, dict):
            raise StitchtuneError(f"search space file: params.{name}.before must map versions to domains")
        legal = [*p["choices"], *p.get("undrawn", [])]
        entries = sorted((_version_number(v, f"params.{name}.before"), e) for v, e in before.items())
        for v, e in entries:
            if not isinstance(e, dict) or not isinstance(e.get("choices"), list) \
                    or not isinstance(e.get("undrawn", []), list):
                raise StitchtuneError(f"search space file: params.{name}.before.{v} must be an object with a "
                                      f"'choices' list (and an optional 'undrawn' list)")
        later = [e for v, e in entries if v > asked]
        q = {k: x for k, x in p.items() if k != "before"}
        if later:
            q["choices"] = [x for x in later[0]["choices"] if x in legal]
            q["undrawn"] = [x for x in later[0].get("undrawn", []) if x in legal]
        changed |= bool(later)
        out[name] = q
    return out if changed else params
