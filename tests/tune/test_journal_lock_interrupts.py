"""Ctrl-C and the optuna journal's lock (``stitchtune.tune.journal_lock``): a SIGINT that lands while the lock
is being given back leaves no lock behind (it did: the next append waited the grace period), and one that
lands while another process holds it ends the wait without taking that process's lock. Each case runs in a
child process with SIGINT at its default (a real signal, as a terminal sends it) and a grace period of 600 s,
so that a lock left behind shows as a child that does not finish (the bound is the child's timeout, not a
measured time)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from helpers.common import REPO

RELEASE = """
import os, signal, sys, uuid
from stitchtune.tune.study import journal_lock

path = sys.argv[1]
open(path, "w").close()
real, asked = uuid.uuid4, []

def interrupting():  # optuna's release names its rename file first: Ctrl-C lands right there
    if not asked:
        asked.append(1)
        os.kill(os.getpid(), signal.SIGINT)
        sum(i for i in range(1000))  # Python code: the handler runs here
    return real()

uuid.uuid4 = interrupting
lock = journal_lock(path)
lock.acquire()
try:
    lock.release()
    print("not interrupted")
except KeyboardInterrupt:
    print("interrupted; lock left:", os.path.lexists(path + ".lock"), flush=True)
uuid.uuid4 = real
again = journal_lock(path)
again.acquire()
again.release()
print("taken again; lock left:", os.path.lexists(path + ".lock"))
"""

WAITING = """
import os, signal, sys, threading
from stitchtune.tune.study import journal_lock

path = sys.argv[1]
open(path, "w").close()
os.symlink(path, path + ".lock")  # another process holds the lock
threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
try:
    journal_lock(path).acquire()
    print("taken")
except KeyboardInterrupt:
    print("interrupted; the other's lock kept:", os.path.lexists(path + ".lock"))
"""


def _child(code: str, tmp_path: Path) -> list[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
               STITCHTUNE_JOURNAL_LOCK_GRACE_S="600")
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code), str(tmp_path / "optuna.journal")],
                          env=env, capture_output=True, text=True, timeout=120,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.splitlines()


def test_ctrl_c_while_the_lock_is_given_back_leaves_no_lock(tmp_path: Path) -> None:
    """optuna's release, interrupted before its rename, left the link: the next append (an interrupted search
    marking its trial failed) waited the grace period, 30 s by default. Now the Ctrl-C comes after the release."""
    assert _child(RELEASE, tmp_path) == ["interrupted; lock left: False", "taken again; lock left: False"]


def test_ctrl_c_while_another_process_holds_the_lock_leaves_its_lock(tmp_path: Path) -> None:
    """Waiting for another process's lock stays interruptible, and the interrupted wait gives back nothing it
    does not hold: the other process's link stays (optuna's acquire releases on any exception of its body)."""
    assert _child(WAITING, tmp_path) == ["interrupted; the other's lock kept: True"]
