"""Race tracking for the emulator: which thread last read, wrote or atomically added each element in the current interval.

``_Tracker`` holds one int32 array per access kind; :mod:`stitchtune.emulate.memory` keeps one per
tracked global buffer and per shared buffer (and one for the cluster's distributed shared memory) and
turns the elements it reports into race faults; the barriers (:mod:`stitchtune.emulate.translate`,
:mod:`stitchtune.emulate.cluster_ops`) reset it.
"""

from __future__ import annotations

import numpy as np


class _Tracker:
    """Per-element accessors of the current interval, one int32 array per access kind.

    ``w`` (plain writes), ``r`` (plain reads), ``a`` (atomic adds) hold -1 (nobody), the single
    accessor id, or -2 (several different accessors). Accessor ids are block ids (global memory) or
    thread ids (shared memory).
    """

    def __init__(self, n: int, atomics: bool) -> None:
        self.w = np.full(n, -1, np.int32)
        self.r = np.full(n, -1, np.int32)
        self.a = np.full(n, -1, np.int32) if atomics else None  # None: the kernel has no atomics here

    def reset(self, rows: np.ndarray | None = None, row_len: int = 0) -> None:
        """Start a new interval for all elements, or for the blocks ``rows`` (bool) of length ``row_len``."""
        for arr in (self.w, self.r, self.a):
            if arr is None:
                continue
            if rows is None:
                arr.fill(-1)
            else:
                arr.reshape(-1, row_len)[rows] = -1

    @staticmethod
    def _other(arr: np.ndarray, e: np.ndarray, who: np.ndarray) -> np.ndarray:
        """Lanes whose element has an accessor other than ``who`` in ``arr`` (``e``: intp indices)."""
        x = arr.take(e)
        return (x != -1) & (x != who)

    @staticmethod
    def _add(arr: np.ndarray, e: np.ndarray, who: np.ndarray, distinct: bool = False) -> bool:
        """Record ``who`` as an accessor of ``e`` (exact also when lanes share an element); True when an
        element ended with several accessors (-2) in this call.

        After ``arr[e] = who`` every element holds the id of one of its lanes (whichever numpy wrote
        last), so a lane that reads back a different id shares its element with another accessor; so
        does a lane whose element already had another one. ``distinct``: the caller knows that no two
        lanes share an element, so the read-back cannot differ and is skipped.
        """
        x = arr.take(e)
        arr[e] = who
        clash = (x != -1) & (x != who)
        if not distinct:
            clash |= arr.take(e) != who
        if clash.any():
            arr[e[clash]] = -2
            return True
        return False

    def read(self, e: np.ndarray, who: np.ndarray, distinct: bool = False) -> np.ndarray:
        bad = self._other(self.w, e, who)
        if self.a is not None:
            bad |= self._other(self.a, e, who)
        self._add(self.r, e, who, distinct)
        return bad

    def write(self, e: np.ndarray, who: np.ndarray, distinct: bool = False) -> np.ndarray:
        # first, so that two writers in one statement conflict; without a clash every element now
        # holds exactly its lanes' id, so no lane sees another writer
        if self._add(self.w, e, who, distinct):
            bad = self._other(self.w, e, who)
        else:
            bad = np.zeros(e.size, bool)
        bad |= self._other(self.r, e, who)
        if self.a is not None:
            bad |= self._other(self.a, e, who)
        return bad

    def atomic(self, e: np.ndarray, who: np.ndarray, distinct: bool = False) -> np.ndarray:
        assert self.a is not None
        self._add(self.a, e, who, distinct)
        bad = self._other(self.w, e, who)
        bad |= self._other(self.r, e, who)
        return bad
