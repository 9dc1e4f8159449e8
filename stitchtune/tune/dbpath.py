"""Where the tuning database lives when the caller names none.

Contract
--------
* :func:`default_db` is ``$STITCHTUNE_DB`` when that variable is set and not empty, else ``tuning-db``
  (relative to the working directory; ``.gitignore`` ignores it, so a search in a checkout leaves
  ``git status`` clean). Every ``--db`` of the CLI, :class:`stitchtune.tune.search.SearchConfig`,
  :func:`stitchtune.compile` and ``stitchtune.deploy.torch_entry.compile`` default to it; the variable is
  read at each call, not at import.
* :data:`DEFAULT_DB` is the "no database named" marker of the Python APIs whose ``db=None`` means "no
  database at all" (heuristic schedule); :func:`resolve_db` turns it into :func:`default_db`.
* This module imports nothing heavy (the CLI reads the default while it builds its parser).
"""

from __future__ import annotations

import enum
import os

__all__ = ["DB_ENV", "DEFAULT_DB", "DEFAULT_DB_DIR", "DB_HELP", "DefaultDB", "default_db", "resolve_db"]

#: environment variable naming the default tuning database
DB_ENV = "STITCHTUNE_DB"
#: the default database directory when :data:`DB_ENV` is not set (git-ignored)
DEFAULT_DB_DIR = "tuning-db"
#: how the CLI's help describes the default
DB_HELP = f"${DB_ENV}, else ./{DEFAULT_DB_DIR}"


class DefaultDB(enum.Enum):
    """Type of :data:`DEFAULT_DB` (an enum member, so type checkers can tell it from a path or None)."""

    DEFAULT = "the default tuning database"

    def __repr__(self) -> str:
        return f"<default tuning database: {DB_HELP}>"


DEFAULT_DB = DefaultDB.DEFAULT


def default_db() -> str:
    """``$STITCHTUNE_DB`` when set and not empty, else ``tuning-db``."""
    return os.environ.get(DB_ENV) or DEFAULT_DB_DIR


def resolve_db(db: str | os.PathLike[str] | None | DefaultDB) -> str | os.PathLike[str] | None:
    """``db`` itself, or :func:`default_db` for :data:`DEFAULT_DB` (None stays None: no database)."""
    return default_db() if db is DEFAULT_DB else db
