"""A bucket's generic kernel with an embedding gather (stitchtune.deploy.dynamic): emulated at any
extent of the bucket, it raises the gather's error by name for an out-of-range id, as the static
compiled graph does."""

from __future__ import annotations

import json

import numpy as np
import pytest

from helpers.common import EXAMPLES_DIR
from helpers.lowering import DEV
from stitchtune.deploy.dynamic import CompiledBucket, compile_dynamic
from stitchtune.errors import StitchtuneError
from stitchtune.graph.dynamic import parse_dynamic
from stitchtune.graph.reference import random_inputs, run_reference


def test_a_generic_gather_bucket_emulates_and_raises_an_out_of_range_id() -> None:
    obj = json.loads((EXAMPLES_DIR / "dynamic" / "gather_embed_layernorm_seq.json").read_text())
    obj["dynamic"]["seq"] = {"min": 1, "max": 64}
    dg = parse_dynamic(obj)
    cb = compile_dynamic(dg, dg.key_of({"seq": 40}), db=None, device=DEV, build=False)
    assert isinstance(cb, CompiledBucket)
    for e in (33, 41, 64):
        g = dg.at({"seq": e})
        ins = random_inputs(g, e)
        assert np.allclose(cb.emulate({"seq": e}, **ins)["y"], run_reference(g, ins)["y"], atol=1e-4), e
    ins = random_inputs(dg.at({"seq": 37}), 0)
    ins["ids"][1, 36] = 50   # the table has 50 rows
    with pytest.raises(StitchtuneError) as err:
        cb.emulate({"seq": 37}, **ins)
    assert err.value.problems[0].startswith("gather 'we': index out of range")
