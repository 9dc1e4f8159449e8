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


def _audit(path: Path, regions: list[tuple[str, str, int, float]], model: str = "gpt2") -> None:
    path.mkdir(parents=True, exist_ok=True)
    rows = [{"graph": g, "uses": uses, "unique_bytes": mb * 1e6, "floor_us": mb / 4.8, "fitted_us": fit,
             "fitted_ideal_us": fit / 2} for g, uses, mb, fit in regions]
    (path / f"{model}.json").write_text(json.dumps({"regions": rows}))


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
    # region_a: 2 train occurrences (one launch each), 200 -> 80 MB, fitted 60 -> 40 (no L2 residency recorded: the
    # same with the L2 estimate); Inductor: two launches, 120 MB, 30 us
    assert "| softmax | a x2 | 2 -> 2 | 200 -> 80 |" in text and "| 60.0 -> 40.0 | 20.0 | 60.0 -> 40.0 |" in text
    assert "| 120 | 30.0 |" in text
    assert "| **total** | | 3 -> 3 | 250 -> 130 |" in text and "3 of 3" in text and "Not grouped" not in text


def test_inference_table_labels_measured_and_estimated_inductor_times(tmp_path: Path, monkeypatch: Any) -> None:
    mod = load_script("train_gap_table", monkeypatch)
    monkeypatch.setitem(mod.INFERENCE_GROUPS, "bert", [("copies", ("region_a", "region_b"), (0, 1))])
    _audit(tmp_path / "before", [("region_a", "inference x2", 25, 8.0)], model="bert")
    _audit(tmp_path / "after", [("region_b", "inference x3", 25, 8.0)], model="bert")   # renamed, one more use
    launches = [{"kernel": "triton_poi_fused_1", "bytes": 25e6, "estimated_us": 7.6, "measured_fw_us": 8.6},
                {"kernel": "triton_poi_fused_2", "bytes": 25e6, "estimated_us": 7.6, "measured_fw_us": None}]
    (tmp_path / "inductor_bert_inference.json").write_text(json.dumps({"launches": launches}))
    text = "\n".join(mod.table("bert", tmp_path / "before", tmp_path / "after", tmp_path, "inference"))
    assert "| copies | b x3 | 2 -> 3 | 50 -> 75 |" in text and "| 16.2 EM |" in text
    assert "mixed M / E; MEASURED in all: 243" in text


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


def test_inference_launches_take_the_training_forwards_measured_time_of_the_same_kernel(monkeypatch: Any) -> None:
    mod = load_script("inductor_kernels_cpu", monkeypatch)
    train = [{"graph": "forward", "kind": "pointwise", "ops": ["add", "erf"], "bytes": 100_000_000, "measured_us": 23.7},
             {"graph": "forward", "kind": "persistent", "ops": ["add", "var_mean"], "bytes": 50_000_000, "measured_us": 12.4},
             {"graph": "forward", "kind": "pointwise", "ops": ["add", "erf"], "bytes": 100_000_000, "measured_us": 23.4},
             {"graph": "backward", "kind": "pointwise", "ops": ["add", "erf"], "bytes": 100_000_000, "measured_us": 33.5}]
    inf = [{"kind": "pointwise", "ops": ["add", "erf"], "bytes": 100_012_288},      # + a 12 KB bias: the same kernel
           {"kind": "persistent", "ops": ["add", "var_mean"], "bytes": 37_000_000},  # writes less: no match
           {"kind": "pointwise", "ops": ["add", "erf"], "bytes": 100_000_000},
           {"kind": "pointwise", "ops": ["add", "erf"], "bytes": 100_000_000}]       # the forward has no third
    mod._same_kernel_in_training(inf, train)
    assert [a["measured_fw_us"] for a in inf] == [23.7, None, 23.4, None]


def test_committed_bert_inference_launches_are_the_measured_calls() -> None:
    data = json.loads((REPO / "results" / "inference-gap-2026-12-07-s15" / "inductor_bert_inference.json").read_text())
    assert len(data["launches"]) == data["measured"]["launches"] == 18   # gpu_models.md: inductor 18 kernels
    assert sum(a["kind"] == "persistent" for a in data["launches"]) == 7   # embeddings, 2 softmax, 4 LayerNorms
