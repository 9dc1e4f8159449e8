"""``python -m stitchtune``: the command-line interface (see :mod:`stitchtune.cli`)."""

from __future__ import annotations

import sys

from stitchtune.cli import entry

if __name__ == "__main__":
    sys.exit(entry())
