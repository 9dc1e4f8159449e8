"""Where the schedule space's data comes from: ``search_spaces/stitch.json`` (domains, constraints,
scheme and reuse rules, ``version``), found as package data, via ``$STITCHTUNE_SPACES``, or in a
source checkout."""

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
