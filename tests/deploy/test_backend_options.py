"""Every backend option's value is checked when the backend is built (issue 42): one error naming the
option. Parametrised over the options table, so an option added without bad values here fails."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from stitchtune.deploy.backend_options import OPTION_CHECKS, OPTION_KEYS, STRICT_ENV, BackendOptions
from stitchtune.errors import StitchtuneError
from stitchtune.hardware.device import PRESETS

#: per option: values it must refuse, and values it must take
BAD: dict[str, list[Any]] = {
    "db": [3, 1.5, b"db", "", ["tuning-db"], True],
    "device": ["h300", "", 42, 9.0, True, ["h200"]],
    "fallback": ["xla", "", None, 1, True],
    "deterministic": ["yes", 1, 0, None, 1.0],
    "cpu": ["gpu", "", None, 0, True],
    "min_nodes": [0, -1, True, 2.5, "3", None, 2**31],
    "check_gather": ["yes", 1, 0, None, "SYNC"],
    "max_extent": [0, -5, True, 2.5, 2**31, "2048", None],
    "cudagraphs": ["yes", 1, 0, "reduce-overhead"],
    "strict": ["yes", 1, 0, None],
}
GOOD: dict[str, list[Any]] = {
    "db": [None, "tuning-db", Path("tuning-db")],
    "device": [None, "h200", "NVIDIA H100", PRESETS["a100"]],
    "fallback": ["inductor", "eager"],
    "deterministic": [True, False],
    "cpu": ["emulate", "reference"],
    "min_nodes": [1, 4],
    "check_gather": [True, False, "sync"],
    "max_extent": [1, 2048, 2**31 - 1],
    "cudagraphs": [None, True, False],
    "strict": [True, False],
}


def test_the_table_covers_every_option() -> None:
    assert set(OPTION_KEYS) == {f.name for f in fields(BackendOptions)} == set(OPTION_CHECKS)
    assert set(BAD) == set(OPTION_KEYS) == set(GOOD), "add bad and good values for the new option here"


@pytest.mark.parametrize(("name", "value"), [(n, v) for n in OPTION_KEYS for v in BAD.get(n, [])])
def test_a_bad_value_is_one_error_naming_the_option(name: str, value: Any) -> None:
    with pytest.raises(StitchtuneError) as err:
        BackendOptions.from_options({name: value})
    msg = str(err.value)
    assert msg.startswith(f"option {name}={value!r}: ") and "\n" not in msg


@pytest.mark.parametrize(("name", "value"), [(n, v) for n in OPTION_KEYS for v in GOOD.get(n, [])])
def test_a_good_value_is_taken(name: str, value: Any) -> None:
    assert getattr(BackendOptions.from_options({name: value}), name) is value


@pytest.mark.parametrize("value", ["h300", 42])
def test_an_unknown_device_lists_the_presets(value: Any) -> None:
    with pytest.raises(StitchtuneError, match="option device=") as err:
        BackendOptions.from_options({"device": value})
    assert all(p in str(err.value) for p in PRESETS)


def test_unknown_names_list_the_options() -> None:
    with pytest.raises(StitchtuneError, match=r"unknown stitchtune backend option\(s\) 'dbb'") as err:
        BackendOptions.from_options({"dbb": None, "db": None})
    assert all(k in str(err.value) for k in OPTION_KEYS)


def test_defaults_pass_their_own_checks() -> None:
    d = BackendOptions()
    assert all(OPTION_CHECKS[f.name].ok(getattr(d, f.name)) for f in fields(d))


def test_strict_is_on_in_the_tests_and_its_default_follows_the_environment(
        strict_backend: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    assert strict_backend and BackendOptions().strict          # tests/conftest.py: strict_backend
    for value, on in [("1", True), ("yes", True), ("TRUE", True), ("0", False), ("", False), ("no", False)]:
        monkeypatch.setenv(STRICT_ENV, value)
        assert BackendOptions().strict is on and BackendOptions.from_options({}).strict is on
    monkeypatch.delenv(STRICT_ENV)
    assert BackendOptions().strict is False
    assert BackendOptions.from_options({"strict": True}).strict is True


@pytest.mark.not_strict("checks the lenient default itself")
def test_not_strict_marker_turns_it_off(strict_backend: bool) -> None:
    assert not strict_backend and BackendOptions().strict is False


@pytest.mark.parametrize("strict", [True, False])
def test_reraise_raises_only_non_stitchtune_errors_when_strict(strict: bool) -> None:
    opts = BackendOptions(strict=strict)
    opts.reraise(StitchtuneError("a refusal"))   # declined in either mode
    bug = KeyError("bug")
    if strict:
        with pytest.raises(KeyError) as err:
            opts.reraise(bug)
        assert err.value is bug
    else:
        opts.reraise(bug)


def test_torch_compile_refuses_a_bad_device_before_compiling_anything() -> None:
    torch = pytest.importorskip("torch")
    from stitchtune.deploy import torch_backend

    torch_backend.LAST_REPORTS.clear()
    fn = torch.compile(lambda x: torch.nn.functional.gelu(x) + 1.0, backend="stitchtune",
                       options={"device": "h300", "db": None})
    with pytest.raises(Exception, match=r"option device='h300': .*h200") as err:
        fn(torch.randn(4, 8))
    assert not torch_backend.LAST_REPORTS            # no graph was stitched (or declined) first
    assert "StitchtuneError" in f"{type(err.value).__name__}: {err.value}"
