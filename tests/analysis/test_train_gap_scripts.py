"""The train-gap scripts on small fixed inputs (no model, no torch compile): ``inductor_kernels_cpu.parse``
reads an Inductor wrapper module's launches in order with each kernel's kind, bytes, ATen ops and atomics;
``train_gap_table.table`` sums our regions' occurrences and Inductor's launches per group; and the
committed BERT data stays aligned with its measured trace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from helpers.common import REPO, load_script

_WRAPPER = '''
# kernel path: /tmp/x/a.py
# Source node to ATen node mapping:
#   %mul : Tensor "f32[8]" = call_function[target=torch.ops.aten.mul.Tensor](args = (%x, 2))
#   %tanh : Tensor "f32[8]" = call_function[target=torch.ops.aten.tanh.default](args = (%mul,))
triton_poi_fused_0 = async_compile.triton('triton_poi_fused_0', \'\'\'
@triton_heuristics.pointwise(
    inductor_meta={'kernel_name': 'triton_poi_fused_0', 'atomic_add_found': False, 'kernel_num_gb': 0.0025},
)
\'\'\', device_str='cuda')

# kernel path: /tmp/x/b.py
#   %sum_1 : Tensor "f32[1]" = call_function[target=torch.ops.aten.sum.dim_IntList](args = (%y, [1]))
triton_per_fused_1 = async_compile.triton('triton_per_fused_1', \'\'\'
@triton_heuristics.persistent_reduction(
    inductor_meta={'kernel_name': 'triton_per_fused_1', 'atomic_add_found': True, 'kernel_num_gb': 0.5},
)
\'\'\', device_str='cuda')

class Runner:
    def call(self, args):
        buf0 = empty_strided_cuda((8, ), (1, ), torch.float32)
        triton_poi_fused_0.run(arg0_1, buf0, 8, stream=stream0)
        extern_kernels.mm(buf0, arg1_1, out=buf1)
        triton_per_fused_1.run(buf1, buf2, 8, 8, stream=stream0)
        triton_poi_fused_0.run(buf2, buf3, 8, stream=stream0)
        return (buf3, )
'''


def test_parse_reads_the_launches_in_order(tmp_path: Path, monkeypatch: Any) -> None:
    mod = load_script("inductor_kernels_cpu", monkeypatch)
    path = tmp_path / "wrapper.py"
    path.write_text(_WRAPPER)
    got = mod.parse(path)
    assert [a["kernel"] for a in got] == ["triton_poi_fused_0", "triton_per_fused_1", "triton_poi_fused_0"]
    assert got[0] == {"kernel": "triton_poi_fused_0", "kind": "pointwise", "bytes": 2_500_000,
                      "ops": ["mul", "tanh"], "atomic": False}
    assert got[1]["kind"] == "persistent" and got[1]["atomic"] and got[1]["ops"] == ["sum"]


def _audit(path: Path, regions: list[tuple[str, str, int, float]]) -> None:
    path.mkdir(parents=True, exist_ok=True)
    rows = [{"graph": g, "uses": uses, "unique_bytes": mb * 1e6, "floor_us": mb / 4.8, "fitted_us": fit,
             "fitted_ideal_us": fit / 2} for g, uses, mb, fit in regions]
    (path / "gpt2.json").write_text(json.dumps({"regions": rows}))


def test_table_sums_occurrences_and_launches(tmp_path: Path, monkeypatch: Any) -> None:
    mod = load_script("train_gap_table", monkeypatch)
    monkeypatch.setitem(mod.GROUPS, "gpt2", [("softmax", ("region_a",), (0, 2)), ("copies", ("region_b",), (1,))])
    _audit(tmp_path / "before", [("region_a", "inference x2, train x2", 100, 30.0), ("region_b", "train x1", 50, 9.0)])
    _audit(tmp_path / "after", [("region_a", "train x2", 40, 20.0), ("region_b", "train x1", 50, 9.0)])
    launches = [{"kernel": "triton_per_fused_0", "bytes": 60e6, "estimated_us": 15.0},
                {"kernel": "triton_poi_fused_1", "bytes": 50e6, "estimated_us": 12.0},
                {"kernel": "triton_per_fused_0", "bytes": 60e6, "estimated_us": 15.0}]
    (tmp_path / "inductor_gpt2_train.json").write_text(json.dumps({"launches": launches}))
    text = "\n".join(mod.table("gpt2", tmp_path / "before", tmp_path / "after", tmp_path))
    # region_a: 2 train occurrences, 200 -> 80 MB, fitted 60 -> 40; Inductor: two launches, 120 MB, 30 us
    assert "| softmax | a x2 | 200 -> 80 |" in text and "| 60.0 -> 40.0 |" in text and "| 120 | 30.0 |" in text
    assert "| **total** | | 250 -> 130 |" in text and "3 of 3" in text and "Not grouped" not in text


def test_committed_bert_launches_match_the_measured_trace() -> None:
    data = json.loads((REPO / "results" / "train-gap-2026-12-07-s14" / "inductor_bert_train.json").read_text())
    rows = [json.loads(line) for line in (REPO / "results" / "h200-2026-12-04-models" / "logs" / "time_run3.log")
            .read_text().splitlines() if line.startswith("{")]
    trace = next(r for r in rows if (r.get("model"), r.get("mode"), r.get("variant")) == ("bert", "train", "inductor"))
    measured = [n for n, _ in trace["trace"] if n.startswith("triton_")]
    launches = data["launches"]
    assert len(launches) == len(measured) == 76
    # the same kernel kind (poi / per / red) at every position of the step
    assert [a["kernel"].split("_")[1] for a in launches] == [n.split("_")[1] for n in measured]
