"""The CLI's parser class and the options several subcommands share, spelled one way everywhere.

Contract
--------
* :class:`Parser` is the ``argparse.ArgumentParser`` of every (sub)command: a subcommand's one-line
  ``help`` is also its ``description`` (shown by ``stitchtune COMMAND --help``), and an option's
  old spellings kept for scripts (:func:`hidden_alias`) are accepted but not shown in help.
* :func:`add_graph`, :func:`add_db`, :func:`add_out` and :func:`add_device` add the shared arguments
  (``GRAPH``, ``--db DIR``, ``-o/--out``, ``--device NAME``) with the same names, metavars and help in
  every command, and declare their path checks (:mod:`stitchtune.cli.checks`).
* Imports nothing heavy (the parser is built on every call).
"""

from __future__ import annotations

import argparse
import copy
from typing import Any

from stitchtune.cli import checks
from stitchtune.tune.dbpath import DB_HELP, default_db


class HelpFormatter(argparse.HelpFormatter):
    """Leaves an action's hidden aliases (``action.hidden_aliases``) out of the help."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        hidden = getattr(action, "hidden_aliases", ())
        if hidden:
            action = copy.copy(action)
            action.option_strings = [s for s in action.option_strings if s not in hidden]
        return super()._format_action_invocation(action)


class _SubParsers(argparse._SubParsersAction):  # the documented hook: parser.register("action", "parsers", ...)
    def add_parser(self, name: str, **kwargs: Any) -> Any:
        if "help" in kwargs:
            kwargs.setdefault("description", kwargs["help"][:1].upper() + kwargs["help"][1:] + ".")
        return super().add_parser(name, **kwargs)


class Parser(argparse.ArgumentParser):
    """ArgumentParser with :class:`HelpFormatter`; its subcommands get their help as description."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self.register("action", "parsers", _SubParsers)


def hidden_alias(action: argparse.Action, *aliases: str) -> argparse.Action:
    """Mark ``aliases`` (already among ``action.option_strings``) as old spellings: accepted, not shown."""
    action.hidden_aliases = aliases  # type: ignore[attr-defined]
    return action


def add_graph(p: argparse.ArgumentParser, nargs: str | None = None) -> argparse.Action:
    """The positional ``GRAPH`` (a graph.json file; ``nargs="+"`` for several)."""
    a = p.add_argument("graph" if nargs is None else "graphs", nargs=nargs, metavar="GRAPH",
                       help="graph.json file" if nargs is None else "graph.json files")
    return checks.checked(p, a, checks.in_file)


_DB_KIND_HELP = {checks.db_read: "tuning database to read",
                 checks.db_maybe: "tuning database to choose schedules from (missing: heuristic schedules)",
                 checks.db_update: "tuning database to read and save the fit into",
                 checks.db_write: "tuning database the results are appended to (created when missing)"}


def add_db(p: argparse.ArgumentParser, kind: checks.Kind, help: str | None = None) -> argparse.Action:
    """``--db DIR`` (default ``$STITCHTUNE_DB``, else ``./tuning-db``), checked as ``kind``."""
    a = p.add_argument("--db", default=default_db(), metavar="DIR",
                       help=f"{help or _DB_KIND_HELP[kind]} (default: {DB_HELP})")
    return checks.checked(p, a, kind)


def add_out(p: argparse.ArgumentParser, kind: checks.Kind, help: str, *, metavar: str,
            required: bool = False, default: str | None = None, old: tuple[str, ...] = ()) -> argparse.Action:
    """``-o/--out`` (plus hidden old spellings ``old``), checked as ``kind`` (out_file or out_dir)."""
    a = p.add_argument("-o", "--out", *old, dest="out", required=required, default=default, metavar=metavar,
                       help=help)
    hidden_alias(a, *old)
    return checks.checked(p, a, kind)


def add_device(p: argparse.ArgumentParser, help: str = "device preset (default: the local GPU, else h200)") -> None:
    """``--device NAME``."""
    p.add_argument("--device", default=None, metavar="NAME", help=help)
