"""`stitchtune run --backend emulate` matches `--backend reference` for every small example, under the
schedule `stitchtune compile` chooses: a tuned record (a database made here with one legal sampled
schedule per example) and, with an empty database, the heuristic."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.common import SMALL_EXAMPLES

from stitchtune import cli
from stitchtune.cost.model import predict
from stitchtune.tune.database import TuningDB
from stitchtune.hardware.device import get_device
from stitchtune.graph.parse import load_graph
from stitchtune.lower.entry import CODEGEN_VERSION, lower
from stitchtune.tune.pipeline import context_row, schedule_columns
from stitchtune.plan.planner import make_plan
from stitchtune.graph.reference import numpy_dtype
from stitchtune.gpu.runners import check_outputs, output_dtypes
from stitchtune.space import SearchSpace
from stitchtune.deploy.selection import clear_cache

H200 = get_device("h200")


def _tuned_row(path: Path, seed: int = 7) -> dict[str, Any]:
    g = load_graph(path)
    plan = make_plan(g)
    space = SearchSpace.for_plan(plan, H200)
    rng = random.Random(seed)
    for _ in range(500):
        s = space.sample(rng)
        if predict(lower(g, plan, s, H200, space).profile, H200).prune_reason is None:
            break
    else:
        raise AssertionError(f"{path.name}: no legal sampled schedule")
    return {**context_row(g, H200), **schedule_columns(s), "space_version": space.version,
            "codegen_version": CODEGEN_VERSION, "backend": "emulate", "estimated": True, "status": "ok",
            "measured_us": 1.0, "study": "test-run-emulate", "trial_number": 0}


@pytest.fixture(scope="module")
def tuned_db(tmp_path_factory: Any) -> Path:
    db = tmp_path_factory.mktemp("db")
    TuningDB(db).append([_tuned_row(p) for p in SMALL_EXAMPLES])
    return db


def _run(args: list[str], capsys: Any) -> str:
    clear_cache()
    assert cli.main(args) == 0, capsys.readouterr().err
    return capsys.readouterr().out


@pytest.mark.parametrize("which", ["tuned", "heuristic"])
@pytest.mark.parametrize("path", SMALL_EXAMPLES, ids=[p.stem for p in SMALL_EXAMPLES])
def test_emulate_matches_reference(path: Path, which: str, tuned_db: Path, tmp_path: Path, capsys: Any) -> None:
    db = tuned_db if which == "tuned" else tmp_path / "empty"
    base = ["run", str(path), "--random-inputs", "5", "--device", "h200", "--db", str(db)]
    out = _run([*base, "--out", str(tmp_path / "emu.npz"), "--backend", "emulate"], capsys)
    assert f"schedule: {which} (" in out
    _run([*base, "--out", str(tmp_path / "ref.npz"), "--backend", "reference"], capsys)
    g = load_graph(path)
    got, expected = _load_outputs(tmp_path / "emu.npz"), _load_outputs(tmp_path / "ref.npz")
    assert set(got) == set(expected) == set(g.outputs)
    res = check_outputs(got, {k: v.astype(np.float64) for k, v in expected.items()}, output_dtypes(g))
    assert res.ok, res.error


def _load_outputs(path: Path) -> dict[str, np.ndarray]:
    """Outputs from an .npz written by `run` (bfloat16 is stored as 2-byte void)."""
    with np.load(path, allow_pickle=False) as z:
        out = {k: z[k] for k in z.files}
    return {k: a.view(numpy_dtype("bfloat16")) if a.dtype.kind == "V" and a.dtype.itemsize == 2 else a
            for k, a in out.items()}


def test_emulate_with_given_schedule(tuned_db: Path, tmp_path: Path, capsys: Any) -> None:
    path = SMALL_EXAMPLES[0]
    sched = _tuned_row(path, seed=11)["schedule_json"]
    out = _run(["run", str(path), "--random-inputs", "0", "--out", str(tmp_path / "o.npz"), "--backend",
                "emulate", "--device", "h200", "--schedule", sched, "--db", str(tuned_db)], capsys)
    assert "schedule: given (" in out


def test_emulate_bad_schedule_is_a_user_error(tmp_path: Path, capsys: Any) -> None:
    rc = cli.main(["run", str(SMALL_EXAMPLES[0]), "--random-inputs", "0", "--out", str(tmp_path / "o.npz"),
                   "--backend", "emulate", "--device", "h200", "--schedule", '{"tpr": 3, "block": 7}'])
    err = capsys.readouterr().err
    assert rc == 2 and "stitchtune: error:" in err and "Traceback" not in err


def test_cuda_backend_without_gpu_is_a_user_error(tmp_path: Path, capsys: Any) -> None:
    from stitchtune.gpu.runner import cuda_available

    if cuda_available():
        pytest.skip("a GPU is here: covered by the GPU tests")
    rc = cli.main(["run", str(SMALL_EXAMPLES[0]), "--random-inputs", "0", "--out", str(tmp_path / "o.npz"),
                   "--backend", "cuda", "--device", "h200", "--db", str(tmp_path / "db")])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert "cuda-python" in err or "nvcc" in err
