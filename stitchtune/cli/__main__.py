"""``python -m stitchtune.cli``: the same as ``python -m stitchtune`` (see :mod:`stitchtune.cli`)."""

from __future__ import annotations

import sys

from stitchtune.cli import entry

if __name__ == "__main__":  # pragma: no cover
    sys.exit(entry())
