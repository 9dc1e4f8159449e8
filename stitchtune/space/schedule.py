"""The :class:`Schedule` value: one point of the stitch schedule space.

A schedule is a frozen, hashable value with a JSON round trip and a stable :meth:`Schedule.key`
(tuning databases on disk are keyed by it). Its *core* is the mapping (``tpr``, ``block``, ``split``,
``vec``, ``tasks_per_block``, ``min_blocks``), one stitching scheme per reduction stage and one reuse
level per reuse candidate. Its *options* (``order``, ``prefetch``, ``combine``, ...) are declared in
:mod:`stitchtune.space.options`, not as fields here, so that adding one touches only the table.

Options are stored as the sorted (name, value) pairs that differ from their default (``options``) and
read with :meth:`Schedule.option`, resolved through the schedule's :class:`OptionTable` (``table``, not
compared): ``s.option(ORDER)`` is typed by the declaration (``ORDER: Option[Order]`` gives an
:class:`~stitchtune.space.option_values.Order`, ``PREFETCH: Option[bool]`` a ``bool``). That is the only
read: a name (``s.option("order")``) is a ``TypeError`` (and a mypy error), and ``s.order`` is a mypy
error and, at run time, an ``AttributeError``; both point at :meth:`~Schedule.option`. The options that are names are stored as the members of their
:class:`~enum.StrEnum` (``Order.ALTERNATE``; a string passed in is turned into its member), and the JSON
form writes their plain strings. An undeclared name is a ``KeyError``, so a misspelt option fails
loudly instead of reading a default.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping, TypeVar

from stitchtune.errors import ScheduleError
from stitchtune.space.options import CORE_FIELDS, OPTIONS, Option, OptionTable, deterministic, plain_value

T = TypeVar("T")

#: ``Schedule.tasks_per_block`` of a persistent grid (the JSON value): as many blocks as the device
#: holds at once, each taking tasks in turn until none are left (see :attr:`Schedule.persistent`)
PERSISTENT = 0


def _plain(names: Iterable[Any]) -> tuple[Any, ...]:
    """``names`` as a tuple, each string member of an enum (``SchemeName``, ``ReuseLevel``) as its plain value."""
    return tuple(str(x) if isinstance(x, str) else x for x in names)


def row_chunk(K: int, split: int, tpr: int, vec: int) -> int:
    """Elements of a reduction row of length ``K`` that one block covers per task (row family): its
    piece ``ceil(K / split)`` rounded up to whole sweeps of ``tpr`` threads x ``vec`` elements."""
    step = tpr * vec
    return math.ceil(math.ceil(K / split) / step) * step


@dataclass(frozen=True, init=False)
class Schedule:
    """One point of the space. See ``search_spaces/stitch.json`` for what each field and option means.

    ``Schedule(tpr, block, split, vec, tasks_per_block, min_blocks, schemes, reuse, options=(), *,
    table=OPTIONS, **named)``: ``options`` (a mapping or (name, value) pairs) and keyword ``named``
    options (these win) must be declared in ``table``; values equal to the default are dropped, so
    ``Schedule(..., order="forward") == Schedule(...)``. ``dataclasses.replace(s, order=Order.ALTERNATE)``
    works and keeps ``s.table``. Schemes and reuse levels are stored as plain strings (a
    :class:`~stitchtune.space.schemes.SchemeName` or ``ReuseLevel`` member turns into its value).
    """

    tpr: int
    block: int
    split: int
    vec: int
    tasks_per_block: int       # PERSISTENT (0): a grid sized to the device
    min_blocks: int
    schemes: tuple[str, ...]   # one per reduction stage
    reuse: tuple[str, ...]     # one per plan.reuse_candidates entry
    options: tuple[tuple[str, Any], ...]   # the non-default option values, sorted by name
    table: OptionTable = field(compare=False, repr=False)   # declares the options (and their defaults)

    def __init__(self, tpr: int, block: int, split: int, vec: int, tasks_per_block: int, min_blocks: int,
                 schemes: tuple[str, ...], reuse: tuple[str, ...],
                 options: Mapping[str, Any] | Iterable[tuple[str, Any]] = (), *,
                 table: OptionTable = OPTIONS, **named: Any) -> None:
        if isinstance(options, (str, bytes)):  # the old positional Schedule(..., "alternate")
            raise TypeError(f"options must be a mapping or (name, value) pairs, not {options!r}: "
                            "pass an option by name (order=...)")
        values = dict(options)
        values.update(named)
        for name, value in (("tpr", tpr), ("block", block), ("split", split), ("vec", vec),
                            ("tasks_per_block", tasks_per_block), ("min_blocks", min_blocks),
                            ("schemes", _plain(schemes)), ("reuse", _plain(reuse)),
                            ("options", table.normalized(values)), ("table", table)):
            object.__setattr__(self, name, value)

    if not TYPE_CHECKING:  # hidden from mypy, so that ``s.prefetch`` is a type error, not ``Any``
        def __getattr__(self, name: str) -> Any:
            """Not an option read: options are read with :meth:`option` (``s.option(PREFETCH)``, typed by
            the declaration). Only called for names that are not ordinary attributes; always raises
            ``AttributeError``, naming :meth:`option` when ``name`` is a declared option."""
            table = self.__dict__.get("table")
            if not name.startswith("_") and table is not None and name in table:
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}: options are read "
                                     f"with s.option(...), e.g. s.option({name.upper()}) "
                                     f"(stitchtune.space.options.{name.upper()})")
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def option(self, opt: Option[T]) -> T:
        """The value of option ``opt`` (its declaration: the value has the declared type); ``KeyError`` if
        this schedule's table does not declare an option of its name, ``TypeError`` for anything but a
        declaration (a name: ``s.option(ORDER)``, not ``s.option("order")``)."""
        if not isinstance(opt, Option):
            raise TypeError(f"options are read with their declaration, not {opt!r}: s.option(ORDER) "
                            "(stitchtune.space.options.ORDER)")
        value: T = dict(self.options).get(opt.name, self.table[opt.name].default)
        return value

    @property
    def persistent(self) -> bool:
        """Whether the grid is persistent (``tasks_per_block == PERSISTENT``): sized to the blocks that
        fit on the device at once rather than to ``tasks / tasks_per_block``."""
        return self.tasks_per_block == PERSISTENT

    @property
    def deterministic(self) -> bool:
        """Whether this schedule's results are bitwise reproducible (no float atomics anywhere; see
        :func:`stitchtune.space.options.deterministic`)."""
        return deterministic(self)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: the core fields, then each option that differs from its default (in table
        order). An option at its default is left out, so a schedule's JSON and :meth:`key` are those
        it had before the option existed."""
        d: dict[str, Any] = {"tpr": self.tpr, "block": self.block, "split": self.split, "vec": self.vec,
                             "tasks_per_block": self.tasks_per_block, "min_blocks": self.min_blocks,
                             "schemes": list(self.schemes), "reuse": list(self.reuse)}
        stored = dict(self.options)
        for opt in self.table:
            if opt.name in stored:
                d[opt.name] = plain_value(stored[opt.name])
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], table: OptionTable = OPTIONS) -> "Schedule":
        """Build from a dict (e.g. parsed JSON); raise :class:`ScheduleError` on a malformed one: a
        missing ``tpr`` / ``block``, a bad value, or a key that is neither a core field (:data:`CORE_FIELDS`)
        nor an option of ``table`` (named in the message, with the nearest known key: a typo such as
        ``"tpr_"`` or ``"vec4"`` is never read as a default). A missing option is its default.

        Every caller is strict, records included: no core field or option has ever left the space
        (space versions 1-4 only added options; ``order`` / ``prefetch`` / ``combine`` moved from core
        fields into the option table under the same names), so every record a tuning database or a
        compiled manifest wrote still loads, and a key today's table does not know comes from a newer
        stitchtune or a hand edit; read with it ignored, the schedule would not be the one recorded."""
        if not isinstance(d, Mapping):
            raise ScheduleError(f"malformed schedule: a JSON object is needed, not {type(d).__name__}")
        unknown = sorted(str(k) for k in d if k not in CORE_FIELDS and k not in table)
        if unknown:
            known = (*CORE_FIELDS, *table.names)
            near = difflib.get_close_matches(unknown[0], known, n=1, cutoff=0.5)
            hint = f" (did you mean {near[0]!a}?)" if near else f" (known keys: {', '.join(known)})"
            more = f" and {len(unknown) - 1} more" if len(unknown) > 1 else ""
            raise ScheduleError(f"malformed schedule: unknown key {unknown[0]!a}{hint}{more}")
        try:
            named = {opt.name: opt.decode(d[opt.name]) for opt in table if opt.name in d}
            return cls(tpr=int(d["tpr"]), block=int(d["block"]), split=int(d.get("split", 1)),
                       vec=int(d.get("vec", 1)), tasks_per_block=int(d.get("tasks_per_block", 1)),
                       min_blocks=int(d.get("min_blocks", 0)),
                       schemes=tuple(str(s) for s in d.get("schemes", ())),
                       reuse=tuple(str(r) for r in d.get("reuse", ())), table=table, **named)
        except KeyError as exc:
            raise ScheduleError(f"malformed schedule: missing key {exc.args[0]!a}") from None
        except (TypeError, ValueError, OverflowError) as exc:
            raise ScheduleError(f"malformed schedule: {ascii(str(exc))[1:-1]}") from None

    def to_json(self) -> str:
        """Canonical JSON of :meth:`to_dict` (sorted keys, no spaces)."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str, table: OptionTable = OPTIONS) -> "Schedule":
        """Parse :meth:`to_json` output (or any schedule JSON object); :class:`ScheduleError` if malformed."""
        try:
            d = json.loads(text)
        except (ValueError, RecursionError) as exc:  # also over-long integers, deep nesting
            raise ScheduleError(f"schedule is not JSON: {str(exc).split(';')[0] or 'nested too deeply'}") from None
        if not isinstance(d, dict):
            raise ScheduleError("schedule JSON must be an object")
        return cls.from_dict(d, table)

    def key(self) -> str:
        """Stable short hash of the schedule (of its canonical JSON)."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]

    def flat(self) -> dict[str, Any]:
        """Flat scalar columns: the core scalars, every option of the table (also at its default), then
        ``schemes``/``reuse`` as ``scheme_<i>``/``reuse_<i>``."""
        d: dict[str, Any] = {k: v for k, v in self.to_dict().items()
                             if k not in ("schemes", "reuse") and k not in self.table}
        for opt in self.table:
            d[opt.name] = plain_value(self.option(opt))
        for i, s in enumerate(self.schemes):
            d[f"scheme_{i}"] = s
        for i, r in enumerate(self.reuse):
            d[f"reuse_{i}"] = r
        return d
