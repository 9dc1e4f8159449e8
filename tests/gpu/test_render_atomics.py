"""Atomic adds into float32 parameters are PTX reductions, so a grid barrier after them does not make them
returning atomics (issue 39, the embedding backward: :mod:`stitchtune.gpu.render_atomics`).

``atomicAdd`` ahead of ``st_grid_sync``'s ``__threadfence()`` compiled to ``ATOMG.E.ADD.F32x4 ... PT, RZ`` on sm_90
(Llama's training ``region_view_102``); ``st_red`` is ``REDG`` there too. The rendering tests need no tool; the
SASS tests need nvcc and cuobjdump and skip without them.
"""

from __future__ import annotations

import dataclasses

import pytest

from stitchtune.gpu.build import NvccBuilder, nvcc_found
from stitchtune.gpu.render import preamble, render_kernel
from stitchtune.gpu.render_atomics import RED_PREAMBLE, needs_red, red_call, returning_adds
from stitchtune.gpu.sass import find_cuobjdump, parse_sass, read_cubin
from stitchtune.ir import kir
from stitchtune.ir.kir import F32, I32, AtomicAdd, Bin, Const, For, GridSync, LoadVec, Param, Special, Var

ROWS, BLOCK = 8, 128


def _kernel(width: int = 4, dtype: str = "float32", barrier: bool = True) -> kir.Kernel:
    """``t[r * BLOCK * width + tid * width ...] += x[...]`` for ``ROWS`` rows, then (``barrier``) a grid barrier."""
    i = Var("i", I32)
    v = tuple(Var(f"v{k}", F32) for k in range(width))
    at = Bin("+", Bin("*", i, Const(BLOCK * width, I32)), Bin("*", Special("tid"), Const(width, I32)))
    add = AtomicAdd("t", at, v[0], more=v[1:])
    loop = For(i, Const(0, I32), Const(ROWS, I32), 1, (LoadVec(v, "x", at), add))
    params = (Param("x", "float32", ROWS * BLOCK * width, "input"), Param("t", dtype, ROWS * BLOCK * width, "output"))
    if barrier:
        params += (Param("gbar", "float32", 2, "barrier"),)   # as the lowering declares it
    return kir.Kernel("scatter", params, (loop, GridSync()) if barrier else (loop,), BLOCK,
                      barrier_param="gbar" if barrier else None)


def test_a_float32_atomic_add_renders_as_a_reduction() -> None:
    k = _kernel()
    src = render_kernel(k)
    assert "st_red(t + " in src and "atomicAdd(" not in src
    assert needs_red([k]) and preamble([k]).endswith(RED_PREAMBLE)
    assert "red.relaxed.gpu.global.add.v4.f32" in RED_PREAMBLE and "red.relaxed.gpu.global.add.f32" in RED_PREAMBLE


def test_programs_without_float32_atomics_keep_their_preamble() -> None:
    plain = kir.Kernel("copy", (Param("x", "float32", BLOCK, "input"),), (), BLOCK)
    half = _kernel(width=1, dtype="float16")
    assert not needs_red([plain]) and RED_PREAMBLE not in preamble([plain])
    assert not needs_red([half]) and "atomicAdd(t + " in render_kernel(half)   # 16-bit tables: atomicAdd


def test_returning_adds_renders_atomicadd_as_before() -> None:
    k = _kernel()
    with returning_adds():
        src, pre = render_kernel(k), preamble([k])
    assert "atomicAdd(reinterpret_cast<float4*>(t + " in src and "st_red" not in src and RED_PREAMBLE not in pre
    assert "st_red(t + " in render_kernel(k)   # the context restores the reductions


def test_red_call_takes_one_two_or_four_values() -> None:
    assert red_call("p + 4", ["a", "b"]) == "st_red(p + 4, a, b);"
    with pytest.raises(ValueError):
        red_call("p", ["a", "b", "c"])


def test_the_sass_parser_tells_returning_float_atomics_from_reductions() -> None:
    text = """
        Function : k
        /*0130*/                   ATOMG.E.ADD.F32x4.FTZ.RN.STRONG.GPU PT, RZ, desc[UR4][R4.64], R8 ;
        /*0140*/                   REDG.E.ADD.F32x4.FTZ.RN.STRONG.GPU desc[UR4][R6.64], R8 ;
        /*01d0*/                   ATOMG.E.ADD.STRONG.GPU PT, RZ, desc[UR4][R2.64], R5 ;
        /*01e0*/                   EXIT ;
    """
    m = parse_sass(text)["k"]
    assert (m.atomics, m.float_atoms) == (3, 1)


needs_tools = pytest.mark.skipif(not nvcc_found() or find_cuobjdump() is None,
                                 reason="needs nvcc and cuobjdump (pip install nvidia-cuda-cuobjdump)")


def _sass(k: kir.Kernel, tmp_path, returning: bool = False):  # type: ignore[no-untyped-def]
    if returning:
        with returning_adds():
            src = preamble([k]) + render_kernel(k)
    else:
        src = preamble([k]) + render_kernel(k)
    res = NvccBuilder(jobs=1, cache_dir=tmp_path).build([src], "sm_90")[0]
    assert res.status == "ok", res.error
    return read_cubin(res.cubin_path)[k.name]


@needs_tools
@pytest.mark.parametrize("width", [1, 4])
def test_sm90_issues_reductions_ahead_of_a_grid_barrier(tmp_path, width: int) -> None:  # type: ignore[no-untyped-def]
    m = _sass(_kernel(width), tmp_path)
    assert m.float_atoms == 0, m
    assert m.atomics >= ROWS, m   # the reductions, plus the barrier's own integer atomics


@needs_tools
def test_sm90_atomicadd_ahead_of_a_grid_barrier_returns_its_values(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """What the reductions replace: ``atomicAdd`` before the barrier's fence is a returning ``ATOMG .F32x4``, one per
    unrolled row (without the barrier nvcc makes it ``REDG`` itself)."""
    assert _sass(_kernel(4), tmp_path, returning=True).float_atoms == ROWS
    assert _sass(_kernel(4, barrier=False), tmp_path / "nobar", returning=True).float_atoms == 0


@pytest.mark.skipif(not nvcc_found(), reason="nvcc not installed")
def test_every_reduction_compiles_in_a_host_pass_and_below_sm90(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The rendered source is plain CUDA a user may build as a whole program (``nvcc -c``: a host pass without
    ``__CUDA_ARCH__``) or for another architecture: every ``st_red`` form is declared in every pass (the vector
    PTX forms on sm_90, atomicAdd one float at a time elsewhere). Failed before: the 2- and 4-wide forms were
    declared for ``__CUDA_ARCH__ >= 900`` only, so a host pass and sm_80 saw ``too many arguments``."""
    import subprocess

    from stitchtune.gpu.build import find_nvcc

    ks = [dataclasses.replace(_kernel(w), name=f"scatter{w}") for w in (1, 2, 4)]
    src = tmp_path / "red.cu"
    src.write_text(preamble(ks) + "".join(render_kernel(k) for k in ks))
    nvcc = str(find_nvcc())
    for argv in (["-arch=sm_90", "-c", "-o", str(tmp_path / "red.o")],
                 ["-arch=sm_80", "-cubin", "-o", str(tmp_path / "red80.cubin")]):
        r = subprocess.run([nvcc, *argv, str(src)], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, (argv, r.stderr[-2000:])
