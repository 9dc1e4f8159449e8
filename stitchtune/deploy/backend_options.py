"""The ``options`` of ``torch.compile(model, backend="stitchtune", options={...})``, checked.

Contract
--------
* :class:`BackendOptions` holds one value per option (its field defaults are the options' defaults);
  :meth:`BackendOptions.from_options` builds it from torch.compile's ``options`` dict and checks every
  name and every value when the backend is built, before any graph is compiled. A problem raises
  :class:`~stitchtune.errors.StitchtuneError` with one line naming the option, the value given and what
  it takes (``option device='h300': a Device or a preset name (h200, h100, ...)``); an unknown name
  lists the options.
* :data:`OPTION_CHECKS` is the table: one row per option (a :class:`Check`: a predicate and the words
  for what the option takes). Every field of :class:`BackendOptions` has exactly one row (a test holds
  them equal), so an option added to the dataclass without its check fails the tests.
* ``device`` is checked against the preset names through
  :func:`stitchtune.hardware.device.get_device` (so every spelling it accepts is accepted), or
  must be a :class:`~stitchtune.hardware.device.Device`; None means the local GPU, else the H200
  preset.
* ``strict`` (dynamo's ``suppress_errors=False`` analogue): where the backend would decline a region, a
  graph or the Inductor fallback because of an error, an error that is not a
  :class:`~stitchtune.errors.StitchtuneError` (a bug, not a refusal) is re-raised instead
  (:meth:`BackendOptions.reraise`). Its default is False unless the environment sets
  ``STITCHTUNE_STRICT`` (:data:`STRICT_ENV`) to ``1``/``true``/``yes``/``on`` (the test suite does).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from stitchtune.errors import StitchtuneError
from stitchtune.tune.dbpath import DEFAULT_DB, DefaultDB

if TYPE_CHECKING:
    from stitchtune.hardware.device import Device

__all__ = ["BackendOptions", "Check", "OPTION_CHECKS", "OPTION_KEYS", "STRICT_ENV", "strict_default"]

#: the environment variable that turns ``strict`` on by default
STRICT_ENV = "STITCHTUNE_STRICT"


def strict_default() -> bool:
    """The default of the ``strict`` option: True when :data:`STRICT_ENV` is ``1``/``true``/``yes``/``on``."""
    return os.environ.get(STRICT_ENV, "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class BackendOptions:
    """The backend's options (see :mod:`stitchtune.deploy.torch_backend` for what each does)."""

    db: str | os.PathLike[str] | DefaultDB | None = DEFAULT_DB
    device: str | Device | None = None
    fallback: str = "inductor"
    deterministic: bool = False
    cpu: str = "emulate"
    min_nodes: int = 1
    check_gather: bool | str = True
    max_extent: int = 2048
    #: capture the compiled graphs in CUDA graphs (None: when ``mode="reduce-overhead"``)
    cudagraphs: bool | None = None
    strict: bool = field(default_factory=strict_default)

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | None) -> BackendOptions:
        """``options`` (torch.compile's dict; None: every default) checked name by name and value by
        value against :data:`OPTION_CHECKS`; raises StitchtuneError naming the first bad option."""
        opts = dict(options or {})
        bad = [k for k in opts if k not in OPTION_CHECKS]
        if bad:
            raise StitchtuneError(f"unknown stitchtune backend option(s) {', '.join(map(repr, bad))} "
                                  f"(options: {', '.join(OPTION_KEYS)})")
        for name, value in opts.items():
            check = OPTION_CHECKS[name]
            if not check.ok(value):
                raise StitchtuneError(f"option {name}={value!r}: {check.takes()}")
        return cls(**opts)

    def reraise(self, exc: BaseException) -> None:
        """Called where the backend catches ``exc`` to decline something: re-raises it when ``strict`` is
        on and it is not a :class:`~stitchtune.errors.StitchtuneError` (a refusal with its reason, which
        is declined in strict mode too); otherwise returns and the caller declines."""
        if self.strict and not isinstance(exc, StitchtuneError):
            raise exc


@dataclass(frozen=True)
class Check:
    """One option's check: ``accepts(value)`` is True for a value the option takes; ``expected`` says
    what it takes, for the error (a callable for words computed at error time, e.g. the presets)."""

    accepts: Callable[[Any], bool]
    expected: str | Callable[[], str]

    def ok(self, value: Any) -> bool:
        try:
            return bool(self.accepts(value))
        except Exception:  # noqa: BLE001 - a predicate that cannot judge a value refuses it
            return False

    def takes(self) -> str:
        return self.expected() if callable(self.expected) else self.expected


def _int_in(lo: int, hi: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _one_of(*choices: Any) -> Check:
    return Check(lambda v: isinstance(v, str) and v in choices, " or ".join(map(repr, choices)))


def _is_bool(v: Any) -> bool:
    return isinstance(v, bool)


def _db_ok(v: Any) -> bool:
    return v is None or isinstance(v, DefaultDB) or (isinstance(v, (str, os.PathLike)) and os.fspath(v) != "")


def _device_ok(v: Any) -> bool:
    from stitchtune.hardware.device import Device, DeviceError, get_device

    if v is None or isinstance(v, Device):
        return True
    if not isinstance(v, str):
        return False
    try:
        get_device(v)
    except DeviceError:
        return False
    return True


def _device_takes() -> str:
    from stitchtune.hardware.device import PRESETS

    return f"None (the local GPU), a Device or a preset name ({', '.join(PRESETS)})"


#: one row per option: what :meth:`BackendOptions.from_options` checks
OPTION_CHECKS: dict[str, Check] = {
    "db": Check(_db_ok, "None (no database), a directory path (str or os.PathLike) or the default"),
    "device": Check(_device_ok, _device_takes),
    "fallback": _one_of("inductor", "eager"),
    "deterministic": Check(_is_bool, "True or False"),
    "cpu": _one_of("emulate", "reference"),
    "min_nodes": Check(_int_in(1, 2**31 - 1), "a positive integer"),
    "check_gather": Check(lambda v: isinstance(v, bool) or v == "sync", "True, False or 'sync'"),
    "max_extent": Check(_int_in(1, 2**31 - 1), "a positive integer below 2**31"),
    "cudagraphs": Check(lambda v: v is None or isinstance(v, bool),
                        "None (on under mode='reduce-overhead'), True or False"),
    "strict": Check(_is_bool, "True or False"),
}
#: the option names, in the table's order
OPTION_KEYS: tuple[str, ...] = tuple(OPTION_CHECKS)
assert set(OPTION_KEYS) == {f.name for f in fields(BackendOptions)}, "an option without its check"
