"""Tests of the nvcc builder: ptxas parsing, toolchain lookup, real compiles, cache, timeouts."""

from __future__ import annotations

import json
import os
import stat
import sys
import textwrap
import time
from pathlib import Path

import pytest

from stitchtune.gpu import build as B
from stitchtune.gpu.build import BuildResult, FakeBuilder, NvccBuilder, find_nvcc, nvcc_found, parse_ptxas
from stitchtune.errors import StitchtuneError, ToolchainError

HAVE_NVCC = nvcc_found()
needs_nvcc = pytest.mark.skipif(not HAVE_NVCC, reason="nvcc not installed")

PTXAS_CUDA13 = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'dyn' for 'sm_90'
ptxas info    : Function properties for dyn
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers, used 1 barriers
ptxas info    : Compile time = 12.103 ms
ptxas info    : Compiling entry function 'big' for 'sm_90'
ptxas info    : Function properties for big
    256 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 32 registers, used 1 barriers, 256 bytes cumulative stack size, 4096 bytes smem
ptxas info    : Compile time = 52.694 ms
"""

PTXAS_CUDA11 = """\
ptxas info    : 0 bytes gmem
ptxas info    : Function properties for helper
    16 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'k' for 'sm_80'
ptxas info    : Function properties for k
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, 2048 bytes smem, 368 bytes cmem[0]
"""

KERNELS = r"""
extern "C" __global__ void add(const float* a, const float* b, float* c) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  c[i] = a[i] + b[i];
}
extern "C" __global__ void __launch_bounds__(256) staged(const float* a, float* c) {
  __shared__ float s[1024];
  int t = threadIdx.x;
  for (int k = 0; k < 4; ++k) s[t + 256 * k] = a[t + 256 * k];
  __syncthreads();
  c[t] = s[(t * 7) % 1024] + s[1023 - t];
}
"""


def test_parse_ptxas_cuda13_layout() -> None:
    res = parse_ptxas(PTXAS_CUDA13)
    assert set(res) == {"dyn", "big"}
    assert res["big"] == B.KernelResources(registers=32, smem_bytes=4096, spill_store_bytes=8,
                                           spill_load_bytes=12, stack_bytes=256)
    assert res["dyn"].registers == 12 and res["dyn"].smem_bytes == 0


def test_parse_ptxas_old_layout_ignores_non_entry_functions() -> None:
    res = parse_ptxas(PTXAS_CUDA11)
    assert set(res) == {"k"}  # 'helper' is a device function, not a kernel
    assert res["k"].registers == 40 and res["k"].smem_bytes == 2048 and res["k"].stack_bytes == 0


def test_check_arch() -> None:
    assert B.check_arch("sm_90") == 90
    assert B.check_arch("sm_90a") == 90
    assert B.check_arch("sm_100") == 100
    for bad in ("sm_60", "compute_90", "sm_90; rm -rf /", "", "90"):
        with pytest.raises(ToolchainError):
            B.check_arch(bad)


def test_build_result_round_trip() -> None:
    r = BuildResult("ok", "ab", "/x.cubin", "sm_90", {"k": 3}, {"k": 0}, {"k": 0}, {"k": 0}, 1.5)
    assert BuildResult.from_dict(json.loads(json.dumps(r.to_dict()))) == r
    with pytest.raises(ValueError):
        BuildResult("weird", "ab", None, "sm_90")


# ---- toolchain lookup ------------------------------------------------------------------------


def test_missing_nvcc_is_a_clear_toolchain_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("STITCHTUNE_NVCC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(B, "_wheel_nvcc_candidates", lambda: [tmp_path / "nope" / "nvcc"])
    real_is_file = Path.is_file
    monkeypatch.setattr(Path, "is_file", lambda p: False if str(p) == "/usr/local/cuda/bin/nvcc" else real_is_file(p))
    with pytest.raises(ToolchainError) as ei:
        find_nvcc()
    assert isinstance(ei.value, StitchtuneError)
    assert "nvcc not found" in str(ei.value) and "STITCHTUNE_NVCC" in str(ei.value)
    with pytest.raises(ToolchainError):
        NvccBuilder(cache_dir=tmp_path).build(["x"])


def test_stitchtune_nvcc_must_be_executable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("STITCHTUNE_NVCC", str(tmp_path / "missing-nvcc"))
    with pytest.raises(ToolchainError, match="STITCHTUNE_NVCC"):
        find_nvcc()


def test_wheel_nvcc_is_found(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "site" / "nvidia" / "cu13" / "bin" / "nvcc"
    fake.parent.mkdir(parents=True)
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.delenv("STITCHTUNE_NVCC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(B, "_wheel_nvcc_candidates", lambda: [fake])
    real_is_file = Path.is_file
    monkeypatch.setattr(Path, "is_file", lambda p: False if str(p) == "/usr/local/cuda/bin/nvcc" else real_is_file(p))
    assert find_nvcc() == str(fake)


# ---- a fake nvcc: argv logging, hang, counting -------------------------------------------------


def _fake_nvcc(tmp_path: Path, body: str) -> Path:
    """A python script standing in for nvcc; ``body`` runs for a compile (argv in ``args``)."""
    script = tmp_path / "fake-nvcc"
    script.write_text(
        f"#!{sys.executable}\n"
        + textwrap.dedent(
            """\
            import os, sys, time, json
            args = sys.argv[1:]
            if args == ["--version"]:
                print("fake nvcc"); print("Build fake_1.0"); sys.exit(0)
            log = os.environ.get("FAKE_NVCC_LOG")
            if log:
                with open(log, "a") as f: f.write(json.dumps(args) + "\\n")
            out = args[args.index("-o") + 1]
            """
        )
        + textwrap.dedent(body)
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_timeout_kills_the_compiler_and_is_a_status(tmp_path: Path) -> None:
    nvcc = _fake_nvcc(tmp_path, """\
        time.sleep(60)
        """)
    b = NvccBuilder(jobs=2, timeout_s=1.0, cache_dir=tmp_path / "cache", nvcc=str(nvcc))
    t0 = time.monotonic()
    res = b.build(["// a", "// b"])
    assert time.monotonic() - t0 < 20
    assert [r.status for r in res] == ["timeout", "timeout"]
    assert all("timed out" in r.error and r.cubin_path is None for r in res)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie not yet reaped by init counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except (OSError, IndexError):
        return True


def test_timeout_kills_grandchildren(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    nvcc = _fake_nvcc(tmp_path, f"""\
        import subprocess
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open(os.path.join({str(pids)!r}, str(child.pid)), "w").close()
        time.sleep(60)
        """)
    t0 = time.monotonic()
    (r,) = NvccBuilder(jobs=1, timeout_s=1.0, cache_dir=tmp_path / "cache", nvcc=str(nvcc)).build(["// a"])
    assert r.status == "timeout"
    assert time.monotonic() - t0 < 15  # not blocked until the grandchild exits on its own
    started = [int(p.name) for p in pids.iterdir()]
    assert len(started) == 1
    deadline = time.monotonic() + 10
    while not _gone(started[0]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(started[0]), "nvcc's child process survived the timeout"


def test_compile_failure_is_a_status_and_not_cached(tmp_path: Path) -> None:
    nvcc = _fake_nvcc(tmp_path, """\
        print("kernel.cu(1): error: boom", file=sys.stderr); sys.exit(2)
        """)
    b = NvccBuilder(jobs=1, cache_dir=tmp_path / "cache", nvcc=str(nvcc))
    (r,) = b.build(["int x;"])
    assert r.status == "compile_error" and "boom" in r.error and "exit 2" in r.error
    assert not list((tmp_path / "cache").rglob("*.json"))


def test_source_never_reaches_the_command_line_and_cache_hits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "argv.log"
    monkeypatch.setenv("FAKE_NVCC_LOG", str(log))
    nvcc = _fake_nvcc(tmp_path, """\
        src = open(args[-1]).read()
        open(out, "wb").write(b"CUBIN" + src.encode())
        print("ptxas info    : Compiling entry function 'k' for 'sm_90'")
        print("ptxas info    : Function properties for k")
        print("    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads")
        print("ptxas info    : Used 7 registers, used 0 barriers")
        """)
    hostile = '// "; rm -rf / ; $(reboot) `id` */ \n extern "C" __global__ void k() {}'
    b = NvccBuilder(jobs=2, cache_dir=tmp_path / "cache", nvcc=str(nvcc))
    first = b.build([hostile, hostile + " ", "// other"], arch="sm_80")
    assert [r.status for r in first] == ["ok", "ok", "ok"]
    assert first[0].registers == {"k": 7} and first[0].arch == "sm_80" and not first[0].cached
    assert Path(first[0].cubin_path).read_bytes() == b"CUBIN" + hostile.encode()
    argvs = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(argvs) == 3
    for argv in argvs:
        assert "-arch=sm_80" in argv and "-cubin" in argv and "-Xptxas" in argv and "-lineinfo" in argv
        assert not any("rm -rf" in a or "reboot" in a for a in argv)
        assert argv[-1] == "kernel.cu"
    # second build: all three from the cache, nvcc not run again
    again = b.build([hostile, hostile + " ", "// other"], arch="sm_80")
    assert all(r.cached and r.compile_s == 0.0 for r in again)
    assert [r.cubin_path for r in again] == [r.cubin_path for r in first]
    assert len(log.read_text().splitlines()) == 3
    # another arch or other flags are another key
    b.build([hostile], arch="sm_90")
    NvccBuilder(cache_dir=tmp_path / "cache", nvcc=str(nvcc), lineinfo=False).build([hostile], arch="sm_80")
    assert len(log.read_text().splitlines()) == 5
    # no temporary files left behind in the cache
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.name.endswith(".tmp")]


def test_a_source_repeated_in_one_batch_is_compiled_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Copies of a source in one batch (the same region in every layer of a model) run nvcc once; every
    copy gets that build's result, in the batch's order."""
    log = tmp_path / "argv.log"
    monkeypatch.setenv("FAKE_NVCC_LOG", str(log))
    nvcc = _fake_nvcc(tmp_path, """\
        src = open(args[-1]).read()
        time.sleep(0.2)  # the copies would overlap in the thread pool
        open(out, "wb").write(src.encode())
        """)
    b = NvccBuilder(jobs=4, cache_dir=tmp_path / "cache", nvcc=str(nvcc))
    res = b.build(["// a", "// b", "// a", "// a", "// c", "// b"])
    assert len(log.read_text().splitlines()) == 3
    assert [Path(r.cubin_path).read_bytes() for r in res] == [b"// a", b"// b", b"// a", b"// a", b"// c", b"// b"]
    assert res[0] == res[2] == res[3] and res[1] == res[5] and not any(r.cached for r in res)
    (single,) = NvccBuilder(jobs=1, cache_dir=tmp_path / "cache2", nvcc=str(nvcc)).build(["// d"])
    assert single.status == "ok" and len(log.read_text().splitlines()) == 4
    assert [r.status for r in NvccBuilder(jobs=1, cache_dir=tmp_path / "cache3", nvcc=str(nvcc)).build(["// e"] * 3)] \
        == ["ok"] * 3 and len(log.read_text().splitlines()) == 5


def test_corrupt_cache_entry_is_rebuilt(tmp_path: Path) -> None:
    nvcc = _fake_nvcc(tmp_path, """\
        open(out, "wb").write(b"CUBIN")
        """)
    b = NvccBuilder(jobs=1, cache_dir=tmp_path / "cache", nvcc=str(nvcc))
    (r,) = b.build(["// x"])
    meta = Path(r.cubin_path).with_suffix(".json")
    meta.write_text("{ torn")
    (r2,) = b.build(["// x"])
    assert r2.status == "ok" and not r2.cached
    assert json.loads(meta.read_text())["status"] == "ok"


# ---- the real nvcc -----------------------------------------------------------------------------


@needs_nvcc
def test_real_nvcc_compiles_and_reports_resources(tmp_path: Path) -> None:
    b = NvccBuilder(jobs=2, cache_dir=tmp_path / "cache")
    ok, bad = b.build([KERNELS, 'extern "C" __global__ void f(float* a) { a[0] = undefined_thing; }'])
    assert ok.status == "ok", ok.error
    assert set(ok.registers) == {"add", "staged"}
    assert 4 <= ok.registers["add"] <= 32 and 4 <= ok.registers["staged"] <= 64
    assert ok.smem_bytes == {"add": 0, "staged": 4096}
    assert ok.spill_bytes == {"add": 0, "staged": 0} and ok.stack_bytes == {"add": 0, "staged": 0}
    assert Path(ok.cubin_path).read_bytes()[:4] == b"\x7fELF"
    assert ok.compile_s > 0
    assert bad.status == "compile_error" and "undefined_thing" in bad.error
    assert "stitchtune-nvcc-" not in bad.error  # relative file names: no temporary paths
    (again,) = b.build([KERNELS])
    assert again.cached and again.registers == ok.registers


@needs_nvcc
def test_real_nvcc_reports_spills_under_a_register_cap(tmp_path: Path) -> None:
    src = r"""
    extern "C" __global__ void __launch_bounds__(1024, 2) heavy(const float* a, float* c) {
      float v[64];
      #pragma unroll
      for (int k = 0; k < 64; ++k) v[k] = a[threadIdx.x * 64 + k];
      float acc = 0.f;
      #pragma unroll
      for (int r = 0; r < 8; ++r)
        #pragma unroll
        for (int k = 0; k < 64; ++k) acc += v[k] * v[(k * 7 + r) % 64];
      c[threadIdx.x] = acc;
    }
    """
    (r,) = NvccBuilder(jobs=1, cache_dir=tmp_path).build([src], arch="sm_90")
    assert r.status == "ok", r.error
    assert r.registers["heavy"] <= 32  # 65536 / (1024 * 2)
    assert r.spill_bytes["heavy"] > 0


# ---- FakeBuilder -------------------------------------------------------------------------------


def test_fake_builder_programmable_statuses() -> None:
    fb = FakeBuilder(statuses=["ok", "compile_error", "timeout"], registers=40)
    res = fb.build(['extern "C" __global__ void __launch_bounds__(128) k1(float* a) {}', "x", "y", "z"])
    assert [r.status for r in res] == ["ok", "compile_error", "timeout", "ok"]
    assert res[0].registers == {"k1": 40} and res[1].error == "fake compile_error"
    fb2 = FakeBuilder(statuses=lambda s: "compile_error" if "bad" in s else "ok")
    assert [r.status for r in fb2.build(["good", "bad"])] == ["ok", "compile_error"]
    assert fb2.calls == [(["good", "bad"], "sm_90")]


def test_the_tests_batched_builds_use_the_builders_flags() -> None:
    """helpers.nvcc.BUILDER_FLAGS (tests that build in one translation unit what the builder would build one by
    one) are the NvccBuilder's default flags beyond ``-O3 -Xptxas -v``."""
    from helpers.nvcc import BUILDER_FLAGS

    assert NvccBuilder(nvcc="/bin/false").flags == ("-O3", "-Xptxas", "-v", *BUILDER_FLAGS)


def test_default_cache_dir_honours_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("STITCHTUNE_CACHE", str(tmp_path / "c"))
    assert NvccBuilder(nvcc="/bin/false").cache_dir == tmp_path / "c"
    monkeypatch.delenv("STITCHTUNE_CACHE")
    assert NvccBuilder(nvcc="/bin/false").cache_dir == Path.home() / ".cache" / "stitchtune" / "cubin"
    assert NvccBuilder(nvcc="/bin/false", jobs=None).jobs == (os.cpu_count() or 1)


# ---- rendered schedules of the examples compile, with consistent resource numbers ---------------

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


#: the sampled programs go through the builder in this many sources (one translation unit each, built in
#: parallel by ``jobs=2``): each nvcc process spends ~0.7 CPU-s on its headers before the first kernel, so
#: 29 sources (one per program) cost ~25 CPU-s where two cost ~7
SAMPLED_SOURCES = 2


def _check_resources(dev, where: str, kernels, b, names: dict[str, str]) -> None:
    """The resources ``b`` (a BuildResult) reports for ``kernels`` (named in the source as ``names[k.name]``)
    are sane: registers within 1..255 and the launch bounds' cap, no static shared memory, spills >= 0."""
    for k in kernels:
        n = names[k.name]
        min_blocks = max(1, k.min_blocks_per_sm)
        if k.block * min_blocks > dev.max_threads_per_sm:
            min_blocks = 1  # ptxas: "threads per SM out of range, .minnctapersm will be ignored"
        cap = dev.regs_per_sm // (k.block * min_blocks)
        assert 1 <= b.registers[n] <= min(255, cap), (where, k.name, b.registers[n])
        assert b.smem_bytes[n] == 0, where  # all shared memory is dynamic (extern __shared__)
        assert b.spill_bytes[n] >= 0 and b.stack_bytes[n] >= 0


def _compile_sampled(per_example: int, tmp_path: Path) -> int:
    """Build ``per_example`` seeded legal schedules of every small example through one NvccBuilder, the
    programs in :data:`SAMPLED_SOURCES` translation units (``helpers.nvcc.batch_source``: the preamble once,
    kernels renamed ``p<i>_<name>``); check each program's kernels' resources. A source that fails to
    build has each of its programs built alone (``render``, as a search builds it), so that the failure
    names the schedule(s) at fault. The number of programs."""
    import random

    from helpers.nvcc import batch_source
    from stitchtune.hardware.device import get_device
    from stitchtune.errors import ScheduleError
    from stitchtune.graph.parse import load_graph
    from stitchtune.lower.entry import lower
    from stitchtune.plan.planner import make_plan
    from stitchtune.gpu.render import render
    from stitchtune.space import SearchSpace

    dev = get_device("h200")
    programs = []
    for path in sorted(EXAMPLES.glob("*_small.json")):
        g = load_graph(path)
        plan = make_plan(g)
        space = SearchSpace.for_plan(plan, dev)
        rng = random.Random(7)
        got = 0
        for _ in range(100 * per_example):
            if got == per_example:
                break
            s = space.sample(rng)
            try:
                programs.append((path.stem, s, lower(g, plan, s, dev)))
                got += 1
            except ScheduleError:
                continue
    groups = [programs[i::SAMPLED_SOURCES] for i in range(SAMPLED_SOURCES)]
    builder = NvccBuilder(jobs=2, cache_dir=tmp_path / "cache")
    sources = [batch_source([p for _, _, p in group]) for group in groups]
    for group, (_, names), b in zip(groups, sources, builder.build([src for src, _ in sources], dev.arch),
                                    strict=True):
        if b.status != "ok":   # which program(s): each alone, as the search would build it
            alone = builder.build([render(p) for _, _, p in group], dev.arch)
            failed = [f"{name} {s.to_json()}: {r.error}" for (name, s, _), r in zip(group, alone) if r.status != "ok"]
            pytest.fail("\n".join(failed) or f"the batched source failed, every program alone built: {b.error}")
        assert set(b.registers) == set(names), sorted(set(b.registers) ^ set(names))
        for i, (name, s, p) in enumerate(group):
            _check_resources(dev, f"{name} {s.to_json()}", p.kernels, b, {k.name: f"p{i}_{k.name}" for k in p.kernels})
    return len(programs)


@needs_nvcc
@pytest.mark.slow
def test_sampled_schedules_of_small_examples_compile(tmp_path: Path) -> None:
    """STITCHTUNE_BUILD_SAMPLES (default 1) seeded legal schedules of every small example build through
    the NvccBuilder (the programs batched into a few sources, resources parsed from ptxas per kernel) with
    sane resources. Breadth
    is tests/lower/test_codegen.py's job: it compiles the heuristic and 50 sampled schedules of every
    small example with nvcc (batched); this test is about the builder path, hence one sample."""
    n = int(os.environ.get("STITCHTUNE_BUILD_SAMPLES", "1"))
    assert _compile_sampled(n, tmp_path) == n * len(list(EXAMPLES.glob("*_small.json")))
