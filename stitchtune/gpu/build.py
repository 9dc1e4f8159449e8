"""nvcc builder: CUDA C source -> cubin + per-kernel resource usage, in parallel, with a timeout and
an on-disk cache.

Contract (docs/INTERFACES.md, "Builder / Runner"):

* ``Builder.build(sources, arch) -> list[BuildResult]``: one result per source, in order. A source
  that does not compile is *data* (status ``compile_error`` with nvcc's message), a compiler that
  runs past ``timeout_s`` is killed with its whole process group (status ``timeout``). Only a
  missing or unusable toolchain is an exception (:class:`~stitchtune.errors.ToolchainError`).
* The source text is written by us to a file in a private temporary directory and nvcc is called
  with an argument list (never a shell), so nothing in a source can reach a command line.
* Results of successful builds are cached on disk under
  ``sha256(source, arch, nvcc version, flags)``: ``<key>.cubin`` + ``<key>.json`` (metadata), both
  written atomically (temporary file + ``os.replace``), so concurrent builders never see torn files.
* A source given several times in one batch is compiled once; each occurrence gets its result.
* Registers, static shared memory, spill bytes (stores + loads) and stack frame come from
  ``-Xptxas -v`` and are keyed by kernel name.

:func:`find_nvcc` is the one nvcc finder of stitchtune (every caller uses it or :func:`nvcc_found`);
:class:`NvccBuilder`'s cache (``$STITCHTUNE_CACHE``, default ``~/.cache/stitchtune/cubin``) the one
build cache. Lookup order: ``$STITCHTUNE_NVCC``, ``nvcc`` on ``PATH``, ``/usr/local/cuda/bin/nvcc``,
the ``nvidia-cuda-nvcc`` wheel (``site-packages/nvidia/cu13/bin/nvcc`` or ``nvidia/cuda_nvcc/bin``).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import site
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Sequence
from enum import StrEnum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from stitchtune.errors import ToolchainError
from stitchtune.graph.files import write_atomic

log = logging.getLogger(__name__)



class BuildStatus(StrEnum):
    """How a build ended (``BuildResult.status``; a member equals its string, as JSON and the database hold it)."""

    OK = "ok"
    COMPILE_ERROR = "compile_error"
    TIMEOUT = "timeout"


BUILD_STATUSES: tuple[BuildStatus, ...] = tuple(BuildStatus)
DEFAULT_ARCH = "sm_90"
MAX_ERROR_CHARS = 4000
_ARCH_RE = re.compile(r"^sm_(\d{2,3})[af]?$")


@dataclass(frozen=True)
class BuildResult:
    """Outcome of compiling one source.

    ``status``: ``ok`` | ``compile_error`` | ``timeout``. ``cubin_path`` is set only when ``ok``.
    ``source_hash`` is the sha256 of the source text alone. Resource dicts are keyed by kernel
    name; ``spill_bytes`` = spill stores + spill loads; ``smem_bytes`` is *static* shared memory
    (dynamic shared memory is a launch parameter). ``compile_s`` is 0.0 for a cache hit.
    """

    status: BuildStatus   # a string naming one is turned into its member
    source_hash: str
    cubin_path: str | None
    arch: str
    registers: dict[str, int] = field(default_factory=dict)
    smem_bytes: dict[str, int] = field(default_factory=dict)
    spill_bytes: dict[str, int] = field(default_factory=dict)
    stack_bytes: dict[str, int] = field(default_factory=dict)
    compile_s: float = 0.0
    error: str = ""
    cached: bool = False

    def __post_init__(self) -> None:
        if self.status not in BUILD_STATUSES:
            raise ValueError(f"unknown build status {self.status!r}")
        object.__setattr__(self, "status", BuildStatus(self.status))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BuildResult:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@runtime_checkable
class Builder(Protocol):
    """Compiles a batch of sources; one :class:`BuildResult` per source, in order."""

    def build(self, sources: list[str], arch: str = DEFAULT_ARCH) -> list[BuildResult]: ...


# --------------------------------------------------------------------------------------------
# toolchain lookup


def _wheel_nvcc_candidates() -> list[Path]:
    dirs: list[str] = []
    try:
        dirs += list(site.getsitepackages())
    except (AttributeError, RuntimeError):  # embedded / unusual interpreters
        pass
    for key in ("purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            dirs.append(p)
    dirs += [p for p in sys.path if p.endswith("site-packages")]
    out: list[Path] = []
    for d in dict.fromkeys(dirs):
        for sub in ("nvidia/cu13/bin/nvcc", "nvidia/cuda_nvcc/bin/nvcc"):
            out.append(Path(d) / sub)
    return out


def find_nvcc() -> str:
    """Path of the nvcc to use; raises :class:`ToolchainError` naming every place looked at."""
    env = os.environ.get("STITCHTUNE_NVCC")
    if env:
        p = Path(env)
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
        raise ToolchainError(f"STITCHTUNE_NVCC={env!r} is not an executable file")
    on_path = shutil.which("nvcc")
    if on_path:
        return on_path
    candidates = [Path("/usr/local/cuda/bin/nvcc"), *_wheel_nvcc_candidates()]
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    raise ToolchainError(
        "nvcc not found: set STITCHTUNE_NVCC, put nvcc on PATH, install the CUDA toolkit "
        "(/usr/local/cuda/bin), or `pip install 'stitchtune[nvcc]'` (the nvidia-cuda-nvcc wheel)"
    )


def nvcc_found() -> bool:
    """True when :func:`find_nvcc` finds an nvcc (never raises)."""
    try:
        find_nvcc()
    except ToolchainError:
        return False
    return True


@functools.lru_cache(maxsize=8)
def nvcc_version(nvcc: str) -> str:
    """The last line of ``nvcc --version`` (e.g. ``Build cuda_13.0.r13.0/compiler.36424714_0``)."""
    try:
        proc = subprocess.run(
            [nvcc, "--version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolchainError(f"cannot run {nvcc} --version: {exc}") from exc
    lines = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip()]
    if proc.returncode != 0 or not lines:
        raise ToolchainError(
            f"{nvcc} --version failed (exit {proc.returncode}): {proc.stderr.strip()[:500]}"
        )
    return lines[-1]


def check_arch(arch: str) -> int:
    """Validate ``sm_XX`` (sm_70 or newer); returns the numeric compute capability (e.g. 90)."""
    m = _ARCH_RE.match(arch)
    if not m or int(m.group(1)) < 70:
        raise ToolchainError(f"unsupported architecture {arch!r}: expected sm_70 or newer, e.g. sm_90")
    return int(m.group(1))


# --------------------------------------------------------------------------------------------
# ptxas output


@dataclass(frozen=True)
class KernelResources:
    """ptxas' report for one entry function."""

    registers: int = 0
    smem_bytes: int = 0
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0
    stack_bytes: int = 0


_ENTRY_RE = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
_PROPS_RE = re.compile(r"Function properties for (\S+)")
_FRAME_RE = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
)
_USED_RE = re.compile(r"Used (\d+) registers")
_SMEM_RE = re.compile(r"(\d+) bytes smem")


def parse_ptxas(text: str) -> dict[str, KernelResources]:
    """Parse ``-Xptxas -v`` output into per-kernel resources (entry functions only).

    Handles both the CUDA 12/13 layout ("Used 32 registers, used 1 barriers, ... 4096 bytes
    smem") and the older one ("Used 32 registers, 4096 bytes smem, 360 bytes cmem[0]").
    """
    out: dict[str, dict[str, int]] = {}
    entries: set[str] = set()
    current: str | None = None  # kernel the next "Used ..." line belongs to
    props: str | None = None  # function whose properties the next frame line belongs to
    for line in text.splitlines():
        if m := _ENTRY_RE.search(line):
            current = m.group(1)
            entries.add(current)
            out.setdefault(current, {})
            continue
        if m := _PROPS_RE.search(line):
            props = m.group(1)
            continue
        if (m := _FRAME_RE.search(line)) and props is not None:
            d = out.setdefault(props, {})
            d["stack_bytes"] = int(m.group(1))
            d["spill_store_bytes"] = int(m.group(2))
            d["spill_load_bytes"] = int(m.group(3))
            props = None
            continue
        if (m := _USED_RE.search(line)) and current is not None:
            d = out.setdefault(current, {})
            d["registers"] = int(m.group(1))
            if sm := _SMEM_RE.search(line):
                d["smem_bytes"] = int(sm.group(1))
            current = None
    return {k: KernelResources(**v) for k, v in out.items() if k in entries}


# --------------------------------------------------------------------------------------------
# the builder


def default_cache_dir() -> Path:
    """The build cache's folder: ``$STITCHTUNE_CACHE``, else ``~/.cache/stitchtune/cubin``."""
    env = os.environ.get("STITCHTUNE_CACHE")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "stitchtune" / "cubin"


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill nvcc and everything it started (cicc, ptxas) - they share its new session."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


def _truncate(text: str) -> str:
    text = text.strip()
    if len(text) <= MAX_ERROR_CHARS:
        return text
    return text[: MAX_ERROR_CHARS // 2] + "\n...[truncated]...\n" + text[-MAX_ERROR_CHARS // 2 :]


def _compile_one(
    nvcc: str, flags: tuple[str, ...], source: str, arch: str, timeout_s: float
) -> tuple[str, bytes | None, str, float]:
    """Run nvcc once in a private temporary directory. Returns (status, cubin, log, seconds)."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="stitchtune-nvcc-") as tmp:
        src = Path(tmp) / "kernel.cu"
        src.write_text(source, encoding="utf-8")
        cubin = Path(tmp) / "kernel.cubin"
        # relative names (cwd=tmp) keep the temporary path out of error messages
        argv = [nvcc, "-cubin", f"-arch={arch}", *flags, "-o", cubin.name, src.name]
        proc = subprocess.Popen(  # noqa: S603 - argument list, our own file names only
            argv,
            cwd=tmp,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            raw, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raw, _ = proc.communicate()
            secs = time.perf_counter() - t0
            text = raw.decode("utf-8", "replace")
            return "timeout", None, f"nvcc timed out after {timeout_s:g} s\n{text}", secs
        secs = time.perf_counter() - t0
        text = raw.decode("utf-8", "replace")
        if proc.returncode != 0 or not cubin.is_file():
            return "compile_error", None, f"nvcc exit {proc.returncode}\n{text}", secs
        return "ok", cubin.read_bytes(), text, secs


class NvccBuilder:
    """Compiles sources with nvcc in parallel (``jobs`` concurrent nvcc processes).

    ``build`` raises :class:`ToolchainError` when nvcc is missing or the arch is invalid; every
    per-source failure is a status on its :class:`BuildResult`.
    """

    def __init__(
        self,
        jobs: int | None = None,
        timeout_s: float = 120.0,
        cache_dir: str | os.PathLike[str] | None = None,
        lineinfo: bool = True,
        extra_flags: Sequence[str] = (),
        nvcc: str | None = None,
    ) -> None:
        self.jobs = max(1, jobs or os.cpu_count() or 1)
        self.timeout_s = float(timeout_s)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        lines = ("-lineinfo",) if lineinfo else ()
        self.flags: tuple[str, ...] = ("-O3", "-Xptxas", "-v", *lines, *extra_flags)
        self._nvcc = nvcc

    @property
    def nvcc(self) -> str:
        if self._nvcc is None:
            self._nvcc = find_nvcc()
        return self._nvcc

    def cache_key(self, source: str, arch: str) -> str:
        h = hashlib.sha256()
        for part in (source, arch, nvcc_version(self.nvcc), "\0".join(self.flags)):
            h.update(part.encode("utf-8"))
            h.update(b"\0\1\0")
        return h.hexdigest()

    def _paths(self, key: str) -> tuple[Path, Path]:
        d = self.cache_dir / key[:2]
        return d / f"{key}.cubin", d / f"{key}.json"

    def _from_cache(self, key: str) -> BuildResult | None:
        cubin, meta = self._paths(key)
        if not (cubin.is_file() and meta.is_file()):
            return None
        try:
            d = json.loads(meta.read_text(encoding="utf-8"))
            res = BuildResult.from_dict(d)
        except (OSError, ValueError, TypeError) as exc:
            log.warning("ignoring unreadable cache entry %s: %s", meta, exc)
            return None
        return dataclasses.replace(res, cubin_path=str(cubin), compile_s=0.0, cached=True)

    def _build_one(self, source: str, arch: str) -> BuildResult:
        source_hash = hashlib.sha256(source.encode("utf-8")).hexdigest()
        key = self.cache_key(source, arch)
        hit = self._from_cache(key)
        if hit is not None:
            log.debug("cache hit %s", key[:12])
            return hit
        cubin_path, meta_path = self._paths(key)
        status, cubin, text, secs = _compile_one(self.nvcc, self.flags, source, arch, self.timeout_s)
        if status != BuildStatus.OK or cubin is None:
            log.info("build %s: %s", source_hash[:12], status)
            return BuildResult(BuildStatus(status), source_hash, None, arch, compile_s=secs, error=_truncate(text))
        res = parse_ptxas(text)
        warnings = [ln.strip() for ln in text.splitlines() if "warning" in ln.lower()]
        if warnings:
            log.info("build %s: %s", source_hash[:12], "; ".join(warnings[:3]))
        result = BuildResult(
            BuildStatus.OK,
            source_hash,
            str(cubin_path),
            arch,
            registers={k: r.registers for k, r in res.items()},
            smem_bytes={k: r.smem_bytes for k, r in res.items()},
            spill_bytes={k: r.spill_store_bytes + r.spill_load_bytes for k, r in res.items()},
            stack_bytes={k: r.stack_bytes for k, r in res.items()},
            compile_s=secs,
        )
        # cubin first, metadata last: a metadata file always has its cubin beside it
        try:
            write_atomic(cubin_path, cubin)
            meta = dict(result.to_dict(), cubin_path=None, key=key)
            write_atomic(meta_path, json.dumps(meta, sort_keys=True).encode("utf-8"))
        except OSError as e:
            via = " ($STITCHTUNE_CACHE)" if os.environ.get("STITCHTUNE_CACHE") else ""
            raise ToolchainError(f"cannot write the cubin cache {ascii(str(self.cache_dir))}{via}: "
                                 f"{e.strerror or e}") from None
        return result

    def build(self, sources: list[str], arch: str = DEFAULT_ARCH) -> list[BuildResult]:
        """One result per source, in order. A source that occurs several times in ``sources`` is built
        once and every occurrence gets that result (the same regions of every layer of a model, a
        schedule suggested twice): run concurrently, the copies all missed the cache and each ran nvcc."""
        check_arch(arch)
        nvcc_version(self.nvcc)  # fail early and clearly when the toolchain is unusable
        if not sources:
            return []
        unique = list(dict.fromkeys(sources))
        if len(unique) < len(sources):
            log.debug("build: %d sources, %d distinct", len(sources), len(unique))
        if self.jobs == 1 or len(unique) == 1:
            built = [self._build_one(s, arch) for s in unique]
        else:
            # Threads are enough: each one waits on its own nvcc process (the real parallel work).
            with concurrent.futures.ThreadPoolExecutor(max_workers=min(self.jobs, len(unique))) as ex:
                built = list(ex.map(lambda s: self._build_one(s, arch), unique))
        by_source = dict(zip(unique, built, strict=True))
        return [by_source[s] for s in sources]


class FakeBuilder:
    """A builder for tests: no compiler; statuses and resources are programmable.

    ``statuses`` is either a sequence consumed in order (cycled when exhausted) or a callable
    ``source -> status``. ``ok`` results carry ``registers`` for every kernel name found as
    ``extern "C" __global__ void NAME`` in the source (or ``{"kernel": registers}``).
    """

    _KERNEL_RE = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?([A-Za-z_]\w*)")

    def __init__(
        self,
        statuses: Sequence[str] | Callable[[str], str] = ("ok",),
        registers: int = 32,
        compile_s: float = 0.0,
    ) -> None:
        self._statuses = statuses
        self._i = 0
        self.registers = registers
        self.compile_s = compile_s
        self.calls: list[tuple[list[str], str]] = []

    def _next_status(self, source: str) -> str:
        if callable(self._statuses):
            return self._statuses(source)
        seq = list(self._statuses)
        s = seq[self._i % len(seq)]
        self._i += 1
        return s

    def build(self, sources: list[str], arch: str = DEFAULT_ARCH) -> list[BuildResult]:
        check_arch(arch)
        self.calls.append((list(sources), arch))
        out = []
        for src in sources:
            h = hashlib.sha256(src.encode("utf-8")).hexdigest()
            status = self._next_status(src)
            if status == BuildStatus.OK:
                names = self._KERNEL_RE.findall(src) or ["kernel"]
                out.append(
                    BuildResult(
                        BuildStatus.OK, h, None, arch,
                        registers={n: self.registers for n in names},
                        smem_bytes={n: 0 for n in names},
                        spill_bytes={n: 0 for n in names},
                        stack_bytes={n: 0 for n in names},
                        compile_s=self.compile_s,
                    )
                )
            else:
                out.append(BuildResult(BuildStatus(status), h, None, arch, compile_s=self.compile_s,
                                       error=f"fake {status}"))
        return out
