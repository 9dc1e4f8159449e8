"""The CLI's parser class and the options several subcommands share, spelled one way everywhere.

Contract
--------
* :class:`Parser` is the ``argparse.ArgumentParser`` of every (sub)command: a subcommand's one-line
  ``help`` is also its ``description`` (shown by ``stitchtune COMMAND --help``), and an option's
  old spellings kept for scripts (:func:`hidden_alias`) are accepted but not shown in help.
* :func:`add_graph`, :func:`add_db`, :func:`add_out`, :func:`add_device` and :func:`add_callable` add
  the shared arguments (``GRAPH``, ``--db DIR``, ``-o/--out``, ``--device NAME``, ``MODULE:CALLABLE`` with
  ``--shapes`` and ``--dtype``) with the same names, metavars and help in
  every command, and declare their path checks (:mod:`stitchtune.cli.checks`).
* :func:`seed` is the ``type=`` of every random seed (0 .. 2**32 - 1); :func:`int_at_most` is the
  ``type=`` of a count whose huge values can only be typos (a 40-digit
  ``--trials`` would run until interrupted): over the bound is a usage error, exit 2; so is under its
  lower bound when given (``search --trials 0``, ``--jobs 0``, ``--early-stop 0``: refused before
  anything is printed). :func:`float_above` is the ``type=`` of a number with a lower bound
  below which it means nothing (``model-check --factor`` > 1, ``report --bandwidth-gbs`` > 0, ``search
  --timeout`` > 0 and ``--prune-factor`` > 1): NaN, infinities and values at or below it are usage errors.
* An argument a subcommand does not know is that subcommand's usage error (its usage line, exit 2),
  with ``(did you mean --trials?)`` when an option of it is close (:func:`did_you_mean`); a misspelt
  command is a usage error with ``(did you mean 'search'?)``.
* Imports nothing heavy (the parser is built on every call).
"""

from __future__ import annotations

import argparse
import copy
import difflib
import math
from collections.abc import Callable
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

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        """As argparse, but arguments the subcommand does not know are its usage error (its usage, a
        "did you mean" for a misspelt option), not the top-level parser's."""
        super().__call__(parser, namespace, values, option_string)
        extras = vars(namespace).pop(argparse._UNRECOGNIZED_ARGS_ATTR, None)
        if extras:
            sub = self._name_parser_map[values[0]]
            sub.error(f"unrecognized arguments: {' '.join(extras)}{did_you_mean(sub, extras)}")


def did_you_mean(parser: argparse.ArgumentParser, extras: list[str]) -> str:
    """`` (did you mean --trials?)`` for the first option in ``extras`` close to one of ``parser``'s
    shown options, else "" (difflib; argparse's own ``suggest_on_error``, Python 3.14, covers choices,
    not option names)."""
    known = [s for a in parser._actions for s in a.option_strings
             if s.startswith("--") and s not in getattr(a, "hidden_aliases", ())]
    for word in extras:
        if word.startswith("--"):
            close = difflib.get_close_matches(word.split("=", 1)[0], known, n=1, cutoff=0.7)
            if close:
                return f" (did you mean {close[0]}?)"
    return ""


class Parser(argparse.ArgumentParser):
    """ArgumentParser with :class:`HelpFormatter`; its subcommands get their help as description."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self.register("action", "parsers", _SubParsers)

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        """A misspelt command (``stitchtune serch``) gets a "did you mean" too."""
        if isinstance(action, _SubParsers) and isinstance(value, str) and value not in action.choices:
            close = difflib.get_close_matches(value, list(action.choices), n=1, cutoff=0.7)
            if close:
                raise argparse.ArgumentError(action, f"invalid choice: {value!r} (did you mean {close[0]!r}?)")
        super()._check_value(action, value)


def hidden_alias(action: argparse.Action, *aliases: str) -> argparse.Action:
    """Mark ``aliases`` (already among ``action.option_strings``) as old spellings: accepted, not shown."""
    action.hidden_aliases = aliases  # type: ignore[attr-defined]
    return action


def add_graph(p: argparse.ArgumentParser, nargs: str | None = None) -> argparse.Action:
    """The positional ``GRAPH`` (a graph.json file; ``nargs="+"`` for several)."""
    a = p.add_argument("graph" if nargs is None else "graphs", nargs=nargs, metavar="GRAPH",
                       help="graph.json file" if nargs is None else "graph.json files")
    return checks.checked(p, a, checks.in_file)


_DB_KIND_HELP: dict[checks.Kind, str] = {checks.db_read: "tuning database to read",
                 checks.db_maybe: "tuning database to choose schedules from; without one, the heuristic schedule",
                 checks.db_update: "tuning database to read and save the fit into",
                 checks.db_write: "tuning database the results are appended to, created when missing"}


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


def add_callable(p: argparse.ArgumentParser, shapes_example: str, dtype_help: str) -> None:
    """``MODULE:CALLABLE``, ``--shapes`` and ``--dtype`` (``import torch``, ``tune``)."""
    checks.checked(p, p.add_argument(
        "callable", metavar="MODULE:CALLABLE",
        help="path/to/file.py:NAME or dotted.module:NAME (a function, nn.Module, or nn.Module class)"), checks.in_module)
    p.add_argument("--shapes", required=True, metavar="NAME=DIMS,...",
                   help=f"example shapes per argument, e.g. {shapes_example}")
    p.add_argument("--dtype", default=None, metavar="DTYPE", help=dtype_help)


def add_device(p: argparse.ArgumentParser, help: str = "device preset (default: the local GPU, else h200)") -> None:
    """``--device NAME``."""
    p.add_argument("--device", default=None, metavar="NAME", help=help)


#: upper bounds of the CLI's counts (far above any real use)
MAX_TRIALS = 1_000_000
MAX_JOBS = 4096
MAX_SAMPLES = 1_000_000


def int_at_most(hi: int, lo: int | None = None) -> Callable[[str], int]:
    """An argparse ``type``: an integer <= ``hi`` (and >= ``lo`` when given)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:  # also over Python's digit limit
            raise argparse.ArgumentTypeError(f"not an integer: {text[:40]!a}") from None
        if value > hi or (lo is not None and value < lo):
            bound = f"at most {hi}" if lo is None else f"from {lo} to {hi}"
            raise argparse.ArgumentTypeError(f"{bound} (got {text[:40]})")
        return value

    parse.__name__ = "integer"   # argparse names the type in its messages
    return parse


def float_above(lo: float) -> Callable[[str], float]:
    """An argparse ``type``: a finite number > ``lo`` (NaN, infinities and ``lo`` itself are usage errors,
    exit 2, e.g. ``--factor 0.5`` where only a factor > 1 means anything)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text[:40]!a}") from None
        if not (math.isfinite(value) and value > lo):
            raise argparse.ArgumentTypeError(f"a finite number > {lo:g} (got {text[:40]})")
        return value

    parse.__name__ = "number"   # argparse names the type in its messages
    parse.numeric = True  # type: ignore[attr-defined]  # tests/cli/test_hostile_argv.py: fuzz it with bad numbers
    return parse


#: a random seed (numpy's and optuna's samplers take 0 .. 2**32 - 1)
seed = int_at_most(2**32 - 1, lo=0)
