"""Ctrl-C in the commands that write a tuning database (``search``, ``tune``, ``bench``): one line saying
what was kept.

Contract
--------
* :func:`keeping_rows(db)` is a context manager around a command's work: a ``KeyboardInterrupt`` inside it
  (Ctrl-C anywhere: while importing torch, capturing a model, in the middle of a batch; also an error raised
  while one was handled, :func:`~stitchtune.errors.from_ctrl_c`) leaves it as an
  :class:`~stitchtune.errors.Interrupted` whose text counts the rows this process appended to ``db``
  since the block began (:meth:`~stitchtune.tune.database.TuningDB.rows_appended_since`), plus
  ``also`` (a callable giving more kept things, e.g. the bench CSV, or None). An
  ``Interrupted`` raised inside passes through unchanged.
* :func:`rows_kept(n, db)` is the text of that count; :func:`interrupted_search(result)` the
  ``Interrupted`` of a search that stopped on Ctrl-C (its own ``rows_written``).
* :func:`stitchtune.cli.main` prints ``stitchtune: interrupted: <kept>`` (one line, no traceback) and
  returns 130. Every part a search appends is complete (the database writes parts atomically), so the
  rows counted are readable.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from stitchtune.errors import Interrupted, from_ctrl_c

#: said after the count: what running the command again does
RESUMES = "the same command resumes (schedules already measured are not run again)"


def rows_kept(n: int, db: str) -> str:
    """``"12 rows written to tuning-db"`` (``"no row written to ..."`` for 0)."""
    what = "no row" if n == 0 else "1 row" if n == 1 else f"{n} rows"
    return f"{what} written to {db}"


@contextlib.contextmanager
def keeping_rows(db: str, also: Callable[[], str | None] | None = None) -> Iterator[None]:
    """Turn Ctrl-C inside the block into :class:`Interrupted` counting the rows written to ``db`` (module
    docstring)."""
    from stitchtune.tune.database import TuningDB

    tdb = TuningDB(db)
    before = tdb.parts()
    try:
        yield
    except Interrupted:
        raise
    except (KeyboardInterrupt, OSError) as exc:
        if not from_ctrl_c(exc):
            raise
        more = also() if also is not None else None
        kept = rows_kept(tdb.rows_appended_since(before), db)
        raise Interrupted(f"{kept}{'; ' + more if more else ''}; {RESUMES}") from None


def interrupted_search(result: Any) -> Interrupted:
    """The :class:`Interrupted` of a search ``result`` (a SearchResult) that stopped on Ctrl-C."""
    return Interrupted(f"{rows_kept(result.rows_written, result.db_path)} "
                       f"({result.trials_run} trial(s) finished); {RESUMES}")
