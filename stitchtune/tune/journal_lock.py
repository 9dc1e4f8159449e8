"""The optuna journal's lock, safe against Ctrl-C: :class:`HeldInterruptLock`.

optuna's ``JournalFileSymlinkLock`` takes the lock by creating a symbolic link and gives it back by renaming
and removing it. A ``KeyboardInterrupt`` raised inside ``release()`` before the rename (its ``uuid4()`` name is
Python code, where the signal's handler can run) leaves the link behind: the next append, here while the
interrupted search marks its trial failed, waits the whole grace period (``$STITCHTUNE_JOURNAL_LOCK_GRACE_S``,
default 30 s) before breaking it. ``stitchtune search --dynamic ... --backend emulate`` interrupted right after its
first rows exited after 30.7 s once in 35 tries on the CPU (0.4-0.8 s otherwise);
``tests/tune/test_journal_lock_interrupts.py`` lands the signal there every time.

Contract: :class:`HeldInterruptLock` takes and gives back the same link (same file, same grace period,
the same forced release of a link left unchanged for ``grace_period`` seconds), but from the attempt to
take it until it is given back, SIGINT is *held*: a Ctrl-C in that time (an append: milliseconds) is
delivered when the lock has been given back, or when the attempt finds the lock taken, never inside.
Waiting for another process's lock stays interruptible and gives back nothing it does not hold. Holding
applies in the main thread while SIGINT has a Python handler (:func:`signal.default_int_handler` or
another callable); elsewhere the lock is optuna's behaviour.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from types import FrameType
from typing import Any

from optuna.storages.journal import JournalFileSymlinkLock

log = logging.getLogger(__name__)

__all__ = ["HeldInterruptLock", "SigintHold"]


class SigintHold:
    """SIGINT held from :meth:`start` to :meth:`stop`: a signal meanwhile is noted, and :meth:`stop` gives
    it to the handler that was in place (``default_int_handler``: a ``KeyboardInterrupt`` raised there).
    A no-op outside the main thread or where SIGINT has no Python handler."""

    def __init__(self) -> None:
        self._old: Any = None
        self._hit = False

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self._hit = True

    def start(self) -> SigintHold:
        if threading.current_thread() is threading.main_thread():
            old = signal.getsignal(signal.SIGINT)
            if callable(old):
                signal.signal(signal.SIGINT, self._note)
                self._old = old
        return self

    def stop(self) -> None:
        old, self._old = self._old, None
        if old is None:
            return
        signal.signal(signal.SIGINT, old)
        if self._hit:
            self._hit = False
            old(signal.SIGINT, None)


class HeldInterruptLock(JournalFileSymlinkLock):
    """optuna's symlink lock with SIGINT held while it is being taken or held (module docstring)."""

    def __init__(self, filepath: str, grace_period: int | None = 30) -> None:
        super().__init__(filepath, grace_period=grace_period)
        self._hold: SigintHold | None = None

    def acquire(self) -> bool:
        """Take the lock (blocking; optuna's waits and forced release of a stale link); SIGINT stays held
        until :meth:`release`."""
        sleep_secs = 0.001
        last_change = time.monotonic()
        mtime: float | None = None
        while True:
            hold = SigintHold().start()
            try:
                os.symlink(self._lock_target_file, self._lock_file)
            except FileExistsError:
                hold.stop()  # a Ctrl-C that came meanwhile is raised here, holding nothing
            except BaseException:
                hold.stop()
                raise
            else:
                self._hold = hold
                return True
            if self.grace_period is not None:
                current: float | None
                try:
                    current = os.stat(self._lock_file).st_mtime   # the journal's (the link's target)
                except OSError:
                    if not os.path.lexists(self._lock_file):
                        continue  # given back meanwhile: try again at once
                    current = None  # a link to no journal: its age counts from the first look
                if current != mtime:
                    mtime, last_change = current, time.monotonic()
                if time.monotonic() - last_change > self.grace_period:
                    log.warning("journal lock %s held for %d s without a change: broken", self._lock_file,
                                self.grace_period)
                    try:
                        self._give_back()
                        sleep_secs = 0.001
                    except RuntimeError:
                        continue
            time.sleep(sleep_secs)
            sleep_secs = min(sleep_secs * 2, 1)

    def _give_back(self) -> None:
        """optuna's release (rename, then remove the link) with SIGINT held throughout."""
        hold = SigintHold().start()
        try:
            super().release()
        finally:
            hold.stop()

    def release(self) -> None:
        """Give the lock back, then deliver a Ctrl-C held since it was taken."""
        hold, self._hold = self._hold, None
        try:
            super().release()
        finally:
            if hold is not None:
                hold.stop()
