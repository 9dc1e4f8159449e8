"""Build and measurement statuses as enums (issue 43 item 4): ``BuildResult.status`` is a
:class:`~stitchtune.gpu.build.BuildStatus`, ``Measurement.status`` a :class:`~stitchtune.gpu.runners.MeasureStatus`
(``StrEnum``s: a string naming one is turned into its member; JSON and the database hold the plain string)."""

from __future__ import annotations

import json
import pickle

import pytest

from stitchtune.gpu.build import BUILD_STATUSES, BuildResult, BuildStatus
from stitchtune.gpu.runners import MEASURE_STATUSES, FakeRunner, Measurement, MeasureStatus


@pytest.mark.parametrize("status", ["ok", "compile_error", "timeout"])
def test_a_build_status_is_its_enum_and_its_string(status: str) -> None:
    r = BuildResult(status, "h", None, "sm_90")  # type: ignore[arg-type]  # a string, as JSON gives it
    assert type(r.status) is BuildStatus and r.status == status and r.status in BUILD_STATUSES
    d = r.to_dict()
    assert json.loads(json.dumps(d))["status"] == status
    assert BuildResult.from_dict(d) == r and pickle.loads(pickle.dumps(r)) == r


@pytest.mark.parametrize("status", ["ok", "launch_error", "timeout", "wrong_result"])
def test_a_measurement_status_is_its_enum_and_its_string(status: str) -> None:
    m = Measurement(status)  # type: ignore[arg-type]
    assert type(m.status) is MeasureStatus and m.status == status and m.status in MEASURE_STATUSES
    assert json.loads(json.dumps(m.to_dict()))["status"] == status
    assert Measurement.from_dict(m.to_dict()) == m


def test_an_unknown_status_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown build status 'linked'"):
        BuildResult("linked", "h", None, "sm_90")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown measurement status 'slow'"):
        Measurement("slow")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown measurement status 'slow'"):
        FakeRunner(statuses=("ok", "slow"))


def test_the_fakes_report_members() -> None:
    [m] = FakeRunner(statuses=("timeout",)).run([(None, None)])
    assert m.status is MeasureStatus.TIMEOUT
