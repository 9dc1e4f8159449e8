"""The kernel IR's verifier (:mod:`stitchtune.ir.verify`): every kind of defect it knows, planted in a small
valid program, is found and named; valid programs (hand-built and lowered from every small example) pass."""

from __future__ import annotations

import dataclasses
import random

import pytest

from stitchtune.ir import kir
from stitchtune.ir.verify import IRVerifyError, check, verify

TID, BID = kir.Special("tid"), kir.Special("bid")
I, X, T = kir.Var("i", kir.I32), kir.Var("x"), kir.Var("t", kir.I32)


def program(body: tuple[kir.Stmt, ...], *, shared: tuple[kir.SharedBuf, ...] = (), cluster: int = 1,
            barrier: bool = False, extents: tuple[str, ...] = (), launch: dict[str, object] | None = None
            ) -> kir.Program:
    """A one-kernel program over ``src`` (float32 input, 256), ``dst`` (float32 output, 256), ``idx`` (int64
    input, 256) and, with ``barrier``, the grid barrier's counters."""
    params = [kir.Param("src", "float32", 256, "input"), kir.Param("dst", "float32", 256, "output"),
              kir.Param("idx", "int64", 256, "input")]
    bufs = [kir.BufferSpec("src", "float32", 256, "input", "a"), kir.BufferSpec("dst", "float32", 256, "output", "b"),
            kir.BufferSpec("idx", "int64", 256, "input", "c")]
    if barrier:
        params.append(kir.Param("bar", "uint32", 2, "barrier"))
        bufs.append(kir.BufferSpec("bar", "uint32", 2, "barrier"))
    k = kir.Kernel("k0", tuple(params), body, 128, shared=shared, cluster=cluster,
                   barrier_param="bar" if barrier else None, extents=extents, locals=(kir.LocalArray("acc", 4),))
    smem = 4 * sum(s.size for s in shared)
    fields = {"kernel": "k0", "grid": 2 * cluster, "block": 128, "smem_bytes": smem,
              "args": tuple(p.name for p in params)}
    fields.update(launch or {})
    return kir.Program((k,), tuple(bufs), (kir.Launch(**fields),), kir.ProgramProfile((), 0))  # type: ignore[arg-type]


#: a valid body: t = bid * 128 + tid; x = src[t]; block barrier; dst[t] = x
GOOD = (kir.Assign(T, kir.Bin("+", kir.Bin("*", BID, kir.Const(128, kir.I32)), TID)),
        kir.Assign(X, kir.Load("src", T)),
        kir.Barrier(),
        kir.StoreVec("dst", T, (X,)))


def messages(p: kir.Program) -> list[str]:
    return [d.message for d in check(p)]


def test_a_valid_program_passes_and_verify_returns_it() -> None:
    p = program(GOOD)
    assert check(p) == ()
    assert verify(p) is p


def test_a_barrier_under_a_block_uniform_condition_or_loop_is_legal() -> None:
    body = (kir.Assign(T, kir.Bin("*", BID, kir.Const(2, kir.I32))),
            kir.If(kir.Bin("<", T, kir.Const(3, kir.I32)), (kir.Barrier(),)),
            kir.For(I, kir.Const(0, kir.I32), kir.Bin("+", T, kir.Const(1, kir.I32)), 1, (kir.Barrier(),)))
    assert check(program(body)) == ()


PLANTED = {
    "undeclared buffer": (GOOD[:1] + (kir.Assign(X, kir.Load("nowhere", T)),) + GOOD[2:], "load of undeclared buffer nowhere"),
    "store to an input": (GOOD[:3] + (kir.StoreVec("src", T, (X,)),), "store to input src"),
    "atomic on an input": (GOOD + (kir.AtomicAdd("src", T, X),), "atomic add to input src"),
    "atomic on an int buffer": (GOOD + (kir.AtomicAdd("idx", T, X),), "atomic add to idx of type int64"),
    "barrier under tid": (GOOD[:2] + (kir.If(kir.Bin("<", TID, kir.Const(16, kir.I32)), (kir.Barrier(),)),) + GOOD[3:],
                          "Barrier under a thread-varying condition"),
    "barrier under a var made from tid": (
        (kir.Assign(kir.Var("u", kir.I32), kir.Bin("%", TID, kir.Const(2, kir.I32))),
         kir.Assign(kir.Var("w", kir.I32), kir.Bin("+", kir.Var("u", kir.I32), BID)),
         kir.If(kir.Bin("==", kir.Var("w", kir.I32), kir.Const(0, kir.I32)), (kir.Barrier(),))),
        "Barrier under a thread-varying condition"),
    "barrier under a loaded condition": (
        GOOD[:2] + (kir.If(kir.Bin(">", X, kir.Const(0.0)), (kir.Barrier(),)),), "Barrier under a thread-varying condition"),
    "barrier in a tid-bounded loop": (
        (kir.For(I, kir.Const(0, kir.I32), TID, 1, (kir.Barrier(),)),), "Barrier under the thread-varying loop over i"),
    "grid sync without its counters": (GOOD + (kir.GridSync(),), "grid barrier in a kernel without a barrier parameter"),
    "read, never assigned": ((kir.StoreVec("dst", TID, (kir.Var("ghost"),)),), "variable ghost is read but never assigned"),
    "two types": (GOOD + (kir.Assign(kir.Var("t", kir.F32), kir.Const(1.0)),), "variable t used with two types (i32, f32)"),
    "vector of three": (GOOD + (kir.StoreVec("dst", T, (X, X, X)),), "vector store of 3 elements (1, 2, 4 or 8)"),
    "float vector over 16 bytes": (GOOD + (kir.LoadVec(tuple(kir.Var(f"v{j}") for j in range(8)), "src", T),),
                                   "vector load of 32 bytes (at most 16)"),
    "int vector load of a float buffer": (GOOD + (kir.LoadVec((kir.Var("n", kir.I32),), "src", T),),
                                          "int vector load from src, which is not an int global buffer"),
    "int load of a float buffer": (GOOD + (kir.Assign(kir.Var("n", kir.I32), kir.Load("src", T, dtype=kir.I32)),),
                                   "int load from src, which is not an int global buffer"),
    "index load of a float buffer": (GOOD + (kir.Assign(kir.Var("n", kir.I32), kir.IndexLoad("src", T, 10)),),
                                     "index load from src of type float32"),
    "constant index out of bounds": (GOOD + (kir.Assign(X, kir.Load("src", kir.Const(256, kir.I32))),),
                                     "load of src[256] out of its 256 elements"),
    "local array out of bounds": (GOOD + (kir.SetLocal("acc", kir.Const(4, kir.I32), X),),
                                  "local array acc[4] out of its 4 elements"),
    "undeclared local array": (GOOD + (kir.Assign(X, kir.LocalRef("tmp", kir.Const(0, kir.I32))),),
                               "local array tmp is not declared"),
    "undeclared extent": (GOOD + (kir.Assign(T, kir.Extent("seq")),), "extent seq is not an argument of the kernel"),
    "unrolled loop with a runtime bound": ((kir.For(I, kir.Const(0, kir.I32), BID, 1, (), unroll=True),),
                                           "unrolled loop over i with bounds that are not constants"),
    "shuffle lane mask": (GOOD + (kir.Assign(X, kir.Shfl(X, 32)),), "shuffle with lane mask 32 and width 32"),
    "cluster rank without a cluster": (GOOD + (kir.Assign(T, kir.ClusterRank()),), "ClusterRank in a kernel without a cluster"),
    "remote store to a global": ((kir.StoreVec("dst", TID, (kir.Const(0.0),)), kir.RemoteStore("dst", kir.Const(0, kir.I32), TID, kir.Const(1.0))),
                                 "RemoteStore in a kernel without a cluster"),
}


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_each_planted_defect_is_found_and_named(name: str) -> None:
    body, want = PLANTED[name]
    p = program(body)
    assert any(m.startswith(want) for m in messages(p)), messages(p)
    with pytest.raises(IRVerifyError, match="invalid kernel program: k0: "):
        verify(p)


def test_cluster_rules() -> None:
    sh = (kir.SharedBuf("part", 128),)
    remote = kir.Assign(X, kir.RemoteLoad("part", kir.Const(1, kir.I32), TID))
    ok = program((kir.ClusterSync(), remote, kir.ClusterSync()), shared=sh, cluster=2)
    assert check(ok) == ()
    unsynced = program((kir.ClusterSync(), remote), shared=sh, cluster=2)
    assert messages(unsynced) == ["remote shared-memory access not followed by a cluster barrier"]
    not_shared = program((kir.ClusterSync(), kir.Assign(X, kir.RemoteLoad("src", kir.Const(1, kir.I32), TID)),
                          kir.ClusterSync()), cluster=2)
    assert "remote load of src, which is not a shared buffer" in messages(not_shared)
    odd_grid = program((kir.ClusterSync(),), cluster=2, launch={"grid": 3})
    assert "launch 0 (k0): grid 3 is not a positive multiple of the cluster 2" in messages(odd_grid)


@pytest.mark.parametrize("launch, want", [
    ({"kernel": "k9"}, "launch 0 (k9): no such kernel"),
    ({"block": 256}, "launch 0 (k0): block 256, the kernel's is 128"),
    ({"smem_bytes": 0}, "launch 0 (k0): 0 bytes of shared memory, the kernel needs 512"),
    ({"args": ("src", "dst")}, "launch 0 (k0): 2 arguments for 3 parameters"),
    ({"args": ("src", "dst", "nope")}, "launch 0 (k0): argument nope is not a buffer of the program"),
    ({"args": ("dst", "src", "src")}, "launch 0 (k0): parameter idx (int64) bound to src (float32)"),
])
def test_launch_defects(launch: dict[str, object], want: str) -> None:
    p = program(GOOD, shared=(kir.SharedBuf("s", 128),), launch=launch)
    assert want in messages(p), messages(p)


def test_grid_barrier_parameter_roles() -> None:
    assert check(program(GOOD + (kir.GridSync(),), barrier=True)) == ()
    p = program(GOOD + (kir.GridSync(),), barrier=True)
    k = dataclasses.replace(p.kernels[0], barrier_param="dst")
    assert "barrier parameter dst is not a parameter of role barrier" in messages(dataclasses.replace(p, kernels=(k,)))


def test_every_small_example_lowers_to_verified_programs(small_examples: list) -> None:
    """lower() verifies what it returns: the heuristic and two seeded samples of every small example lower
    without an IRVerifyError (and check() finds nothing on them)."""
    from helpers.lowering import DEV
    from stitchtune.cost.heuristic import heuristic_schedule
    from stitchtune.errors import StitchtuneError
    from stitchtune.graph.parse import load_graph
    from stitchtune.lower.entry import lower
    from stitchtune.plan.planner import make_plan
    from stitchtune.space import SearchSpace

    n = 0
    for path in small_examples:
        g = load_graph(path)
        plan = make_plan(g)
        space = SearchSpace.for_plan(plan, DEV)
        for s in [heuristic_schedule(plan, DEV, space)] + [space.sample(random.Random(i)) for i in range(2)]:
            try:
                prog = lower(g, plan, s, DEV, space)
            except StitchtuneError:
                continue
            assert check(prog) == (), (path.name, s.to_json())
            n += 1
    assert n >= len(small_examples)
