"""The CLI's path arguments, checked before a command does any work.

Contract
--------
* An option or positional argument that names a path is declared with :func:`checked` (in the
  ``_add_<name>`` function that creates it) together with one of the kinds below. :func:`preflight`
  (called by :func:`stitchtune.cli.main` after parsing, before the command runs) checks every declared
  value and raises one :class:`~stitchtune.errors.StitchtuneError` holding every problem, so a wrong path
  is one error line and exit 2 before any search, compile or report starts.
* The kinds (functions of this module: path -> problem or None):

  ``in_file``     an existing, readable regular file (a directory, FIFO or device is refused: reading a
                  FIFO without a writer would block forever);
  ``out_file``    a file to write: an existing path must be a regular file; a new one must be creatable
                  (its nearest existing ancestor a writable directory);
  ``out_dir``     a directory to write into: an existing path must be a writable directory; a new one
                  must be creatable;
  ``db_read``     a tuning database that must exist (``show``, ``export``, ``report``, ``calibrate``,
                  ``model-check``): an existing, readable directory;
  ``db_maybe``    a tuning database that may be missing (``compile``, ``run``: no records, heuristic):
                  when it exists, a readable directory;
  ``db_update``  a tuning database that must exist and that the command writes into (``calibrate``);
  ``db_write``    a tuning database the command appends to (``search``, ``tune``, ``bench``): an existing
                  writable directory, or a creatable new one;
  ``in_module``   a ``MODULE:CALLABLE`` (``tune``, ``import torch``): not checked (the importer reports a
                  missing module); its ``.py`` file is an input below.

* An ``out_file`` argument that names the same file as an input (an ``in_file``, or the ``.py`` file of an
  ``in_module``; the same real path or inode) is refused too, before any work: ``run G --out G`` would
  replace the graph with its outputs, ``import torch model.py:f -o model.py`` the user's model. Two
  output files of one command naming the same file are refused alike.

* :func:`user_paths` lists the checked values of a parsed command line; the CLI turns an ``OSError``
  on one of them that still happens later (a race, a file system that refuses what ``access`` allowed,
  e.g. ``/proc`` as root) into an error line as well.
* Only ``os`` and ``stat`` are imported: the checks run on every command, also the fast ones.
"""

from __future__ import annotations

import argparse
import os
import stat
from collections.abc import Callable, Iterator
from typing import Any

from stitchtune.errors import StitchtuneError

Kind = Callable[[str], "str | None"]


class _Refused(StitchtuneError):
    """A path that cannot even be looked at (too long, a loop, a NUL byte); :func:`preflight` adds the
    flag and the path to the message."""


def _show(path: str) -> str:
    return ascii(path)


def _stat(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return None
    except OSError as e:   # ELOOP, ENAMETOOLONG, EACCES on a parent ...
        raise _Refused(e.strerror or str(e)) from None
    except ValueError:     # an embedded NUL byte
        raise _Refused("not a valid path") from None




def _creatable(path: str) -> str | None:
    """Why a new file or directory at ``path`` cannot be made, or None."""
    parent = os.path.dirname(os.path.abspath(path))
    while True:
        st = _stat(parent)
        if st is not None:
            break
        up = os.path.dirname(parent)
        if up == parent:
            return "no existing parent directory"
        parent = up
    if not stat.S_ISDIR(st.st_mode):
        return f"{_show(parent)} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot create it: {_show(parent)} is not writable"
    return None


def _kind(st: os.stat_result) -> str:
    mode = st.st_mode
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def in_file(path: str) -> str | None:
    """Why ``path`` cannot be read as an input file, or None (kind ``in_file``)."""
    st = _stat(path)
    if st is None:
        return "does not exist"
    if not stat.S_ISREG(st.st_mode):
        return f"is {_kind(st)}, not a regular file"
    if not os.access(path, os.R_OK):
        return "cannot read it (permission denied)"
    return None


def out_file(path: str) -> str | None:
    """Why a file cannot be written at ``path``, or None (kind ``out_file``)."""
    if path == "":
        return "empty path"
    st = _stat(path)
    if st is None:
        return _creatable(path)
    if not stat.S_ISREG(st.st_mode):
        return f"is {_kind(st)}, not a file"
    if not os.access(path, os.W_OK) or not os.access(os.path.dirname(os.path.abspath(path)), os.W_OK | os.X_OK):
        return "not writable (permission denied)"
    return None


def out_dir(path: str) -> str | None:
    """Why files cannot be written into the directory ``path``, or None (kind ``out_dir``)."""
    if path == "":
        return "empty path"
    st = _stat(path)
    if st is None:
        return _creatable(path)
    if not stat.S_ISDIR(st.st_mode):
        return f"is {_kind(st) if not stat.S_ISREG(st.st_mode) else 'a file'}, not a directory"
    if not os.access(path, os.W_OK | os.X_OK):
        return "directory not writable (permission denied)"
    return None


def _db_dir(st: os.stat_result, path: str) -> str | None:
    if not stat.S_ISDIR(st.st_mode):
        return f"is {_kind(st) if not stat.S_ISREG(st.st_mode) else 'a file'}, not a tuning database directory"
    if not os.access(path, os.R_OK | os.X_OK):
        return "tuning database not readable (permission denied)"
    return None


def db_read(path: str) -> str | None:
    """Why ``path`` is not a readable tuning database, or None (kind ``db_read``)."""
    st = _stat(path)
    if st is None:
        return "no such tuning database directory (a search creates one)"
    return _db_dir(st, path)


def db_maybe(path: str) -> str | None:
    """Like :func:`db_read`, but a missing database is fine (kind ``db_maybe``)."""
    st = _stat(path)
    return None if st is None else _db_dir(st, path)


def db_update(path: str) -> str | None:
    """Like :func:`db_read`, and writable (kind ``db_update``: ``calibrate`` saves its fit there)."""
    problem = db_read(path)
    if problem is None and not os.access(path, os.W_OK | os.X_OK):
        problem = "tuning database not writable (permission denied)"
    return problem


def db_write(path: str) -> str | None:
    """Why rows cannot be appended to the database ``path``, or None (kind ``db_write``)."""
    st = _stat(path)
    if st is None:
        return _creatable(path)
    problem = _db_dir(st, path)
    if problem is None and not os.access(path, os.W_OK | os.X_OK):
        problem = "tuning database not writable (permission denied)"
    return problem


def checked(parser: argparse.ArgumentParser, action: argparse.Action, kind: Kind) -> argparse.Action:
    """Declare that ``action``'s value (a path, or a list of paths) is checked with ``kind`` before the
    command runs; returns ``action``."""
    flag = "/".join(action.option_strings[:2]) or (action.metavar if isinstance(action.metavar, str) else action.dest)
    before = parser.get_default("_path_checks") or ()
    parser.set_defaults(_path_checks=(*before, (action.dest, flag, kind)))
    return action


def _values(args: argparse.Namespace) -> Iterator[tuple[str, str, Kind]]:
    for dest, flag, kind in getattr(args, "_path_checks", ()):
        value: Any = getattr(args, dest, None)
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, str):
                yield flag, v, kind


def in_module(spec: str) -> str | None:
    """Kind of a ``MODULE:CALLABLE`` argument: nothing is checked here (the importer names a missing or
    broken module in its own words); its ``.py`` file counts as an input for :func:`preflight`."""
    return None


def _read_path(kind: Kind, value: str) -> str | None:
    """The file an input argument reads (None: not an input, or a dotted module name)."""
    if kind is in_file:
        return value
    if kind is in_module:
        module = value.rpartition(":")[0]
        return module if module.endswith(".py") or "/" in module else None
    return None


def same_file(a: str, b: str) -> bool:
    """Whether the paths ``a`` and ``b`` name the same file: the same real path, or the same inode when both
    exist (a hard link); never raises."""
    try:
        if os.path.realpath(a) == os.path.realpath(b):
            return True
        return os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def _overwrites(values: list[tuple[str, str, Kind]]) -> Iterator[str]:
    """A problem for each output argument that names one of the inputs (it would be replaced before, or
    while, it is read)."""
    inputs = [(flag, path) for flag, value, kind in values if (path := _read_path(kind, value)) is not None]
    outputs = [(flag, value) for flag, value, kind in values if kind is out_file]
    for i, (flag, value) in enumerate(outputs):
        clash = next((f"the input {in_flag} (writing it would replace the input)" for in_flag, path in inputs
                      if same_file(value, path)), None)
        clash = clash or next((f"the output {o_flag} (one would replace the other)" for o_flag, o_value in outputs[:i]
                               if same_file(value, o_value)), None)
        if clash:
            yield f"{flag} {_show(value)}: is also {clash}; name another output"


def preflight(args: argparse.Namespace) -> None:
    """Check every declared path of ``args``; raise one StitchtuneError naming each problem."""
    problems = []
    values = list(_values(args))
    for flag, value, kind in values:
        try:
            why = kind(value)
        except _Refused as e:
            why = str(e)
        if why:
            problems.append(f"{flag} {_show(value)}: {why}")
    problems += _overwrites(values)
    if problems:
        raise StitchtuneError(problems=problems)


def user_paths(args: argparse.Namespace) -> list[str]:
    """The checked path values of ``args`` (absolute, normalised)."""
    out = []
    for _flag, value, _kind in _values(args):
        try:
            out.append(os.path.abspath(value))
        except ValueError:
            pass
    return out


def is_about(exc: OSError, paths: list[str]) -> bool:
    """Whether ``exc`` names one of ``paths`` or something inside one of them."""
    names = [n for n in (exc.filename, exc.filename2) if isinstance(n, (str, bytes, os.PathLike))]
    for name in names:
        try:
            full = os.path.abspath(os.fsdecode(name))
        except (ValueError, TypeError):
            continue
        if any(full == p or full.startswith(p.rstrip(os.sep) + os.sep) for p in paths):
            return True
    return False
