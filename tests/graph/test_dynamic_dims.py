"""Dynamic dims in graph.json, buckets and bucket keys (stitchtune.graph.dynamic)."""

from __future__ import annotations

import json

import pytest

from helpers.common import EXAMPLES_DIR
from stitchtune.errors import GraphError
from stitchtune.graph.dynamic import (Bucket, BucketKey, Buckets, key_share, load_dynamic, parse_dynamic,
                                      parse_dynamic_arg)

DYN = EXAMPLES_DIR / "dynamic"


def test_power_of_two_default_has_eight_buckets_covering_the_range() -> None:
    b = Buckets.power_of_two("seq", 1, 2048)
    labels = [x.label for x in b.buckets]
    assert labels == ["seq=1..1", "seq=2..32", "seq=33..64", "seq=65..128", "seq=129..256",
                      "seq=257..512", "seq=513..1024", "seq=1025..2048"]   # extent 1: a bucket of its own
    covered = [e for x in b.buckets for e in range(x.lo, x.hi + 1)]
    assert covered == list(range(1, 2049))
    assert b.bucket_of(1).hi == 1 and b.bucket_of(2).hi == 32 and b.bucket_of(33).lo == 33
    assert b.bucket_of(2048).lo == 1025
    assert [x.label for x in Buckets.power_of_two("n", 1, 4096).buckets][:2] == ["n=1..1", "n=2..64"]
    assert sum(b.share(x) for x in b.buckets) == pytest.approx(1.0)
    assert Buckets.power_of_two("n", 5, 5).buckets == (Bucket("n", 5, 5),)
    assert Buckets.power_of_two("n", 3, 20).uppers == (4, 8, 16, 20)


def test_bucket_of_outside_the_range_is_a_graph_error() -> None:
    with pytest.raises(GraphError, match="seq: extent 2049 outside 1..2048"):
        Buckets.power_of_two("seq", 1, 2048).bucket_of(2049)


def test_probes_are_smallest_odd_and_largest() -> None:
    assert Bucket("s", 1025, 2048).probes() == (1025, 1537, 2048)
    assert Bucket("s", 1, 16).probes() == (1, 9, 16)
    assert Bucket("s", 3, 3).probes() == (3,)


def test_bucket_key_label_round_trips() -> None:
    k = BucketKey((Bucket("batch", 1, 8), Bucket("seq", 129, 256)))
    assert k.label() == "batch=1..8,seq=129..256"
    assert BucketKey.parse(k.label()) == k
    assert BucketKey.parse("") == BucketKey(())
    assert k.largest() == {"batch": 8, "seq": 256}
    with pytest.raises(ValueError):
        BucketKey((Bucket("seq", 1, 2), Bucket("batch", 1, 2)))


@pytest.mark.parametrize("text", ["seq", "seq=1", "seq=0..4", "seq=5..4", "1x=1..4", "seq=1..8:4,2,8",
                                  "seq=1..8:2,4", "seq=a..b", "seq=1..8:"])
def test_bad_dynamic_arg_is_one_clear_error(text: str) -> None:
    with pytest.raises(GraphError) as e:
        parse_dynamic_arg(text)
    assert len(e.value.problems) == 1 and "--dynamic" in e.value.problems[0]


def test_dynamic_arg_with_user_bounds() -> None:
    d = parse_dynamic_arg("seq=1..2048:64,512,2048")
    assert [b.label for b in d.buckets.buckets] == ["seq=1..64", "seq=65..512", "seq=513..2048"]
    assert parse_dynamic_arg("seq=1..2048").buckets == Buckets.power_of_two("seq", 1, 2048)


def test_examples_load_and_specialise() -> None:
    dg = load_dynamic(DYN / "embed_add_layernorm_seq.json")
    assert dg.dim_names == ("seq",)
    g = dg.at({"seq": 7})
    assert dict(g.inputs)["tok"].shape == (2, 7, 128) and dict(g.inputs)["pos"].shape == (7, 128)
    assert [n for n, _ in g.inputs] == ["tok", "pos", "gamma", "beta"]  # file order kept
    assert dg.extents_of({"tok": (2, 9, 128), "pos": (9, 128), "gamma": (128,), "beta": (128,)}) == {"seq": 9}
    with pytest.raises(GraphError, match="seq=8 but seq=9"):
        dg.extents_of({"tok": (2, 9, 128), "pos": (8, 128), "gamma": (128,), "beta": (128,)})
    with pytest.raises(GraphError, match="outside 1..2048"):
        dg.at({"seq": 0})
    assert dg.key_of({"seq": 100}).label() == "seq=65..128"
    assert len(dg.keys()) == 8 and key_share(dg.dims, dg.keys()[0]) == pytest.approx(1 / 2048)


def test_undeclared_and_unused_names_are_errors() -> None:
    obj = json.loads((DYN / "layernorm_seq.json").read_text())
    obj["inputs"]["gamma"]["shape"] = ["hid"]
    obj["dynamic"]["extra"] = {"min": 1, "max": 4}
    with pytest.raises(GraphError) as e:
        parse_dynamic(obj)
    text = "\n".join(e.value.problems)
    assert "'hid': not declared" in text and "dynamic.extra: declared but used in no shape" in text


def test_bad_bounds_are_errors() -> None:
    obj = json.loads((DYN / "layernorm_seq.json").read_text())
    obj["dynamic"]["seq"] = {"min": 4, "max": 2}
    with pytest.raises(GraphError, match="min <= max"):
        parse_dynamic(obj)
    obj["dynamic"]["seq"] = {"min": 1, "max": 64, "buckets": [8, 16]}
    with pytest.raises(GraphError, match="buckets"):
        parse_dynamic(obj)
    obj["dynamic"]["seq"] = {"min": 1, "max": 64, "buckets": [8, 64]}
    assert [b.hi for b in parse_dynamic(obj).dims[0].buckets.buckets] == [8, 64]


def test_static_graph_is_a_dynamic_graph_without_dims() -> None:
    dg = load_dynamic(EXAMPLES_DIR / "layernorm_small.json")
    assert dg.dims == () and dg.keys() == (BucketKey(()),)
    assert dg.at({}).name == "layernorm_small"


def test_a_static_reader_refuses_a_dynamic_graph_in_one_line() -> None:
    from stitchtune.graph.parse import load_graph

    with pytest.raises(GraphError) as e:
        load_graph(DYN / "layernorm_seq.json")
    assert len(e.value.problems) == 1 and "load_dynamic" in e.value.problems[0]


def test_validate_prints_the_buckets_of_a_dynamic_graph() -> None:
    import contextlib
    import io

    from stitchtune import cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["validate", str(DYN / "attention_softmax_seq.json")]) == 0
    text = out.getvalue()
    assert "seq: 1..2048, 8 bucket(s): 1..1, 2..32" in text and "s: float32[2, 4, 2048, 2048]" in text


def test_a_polynomial_symint_is_normalised_and_evaluates() -> None:
    from stitchtune.graph.dynamic import SymInt

    p = SymInt.poly([(1, ("p",)), (2, ()), (1, ("p",)), (-2, ())])   # 2p: the constants cancel
    assert p == SymInt(2, ("p",)) and p.multiple_of(2) and not p.multiple_of(4)
    q = SymInt.poly([(16, ()), (16, ("p",))])
    assert q == SymInt(16, ("p",), ((16, ()),)) and str(q) == "16*p + 16" and not q.static
    assert q.value({"p": 7}) == 128 and q.multiple_of(8) and not SymInt.poly([(2, ("p",)), (1, ())]).multiple_of(2)
    assert SymInt.poly([(3, ()), (-3, ())]) == SymInt(0) and SymInt.poly([(5, ())]).static
