"""The stub CUDA driver library (``stub_libcuda.c``) for tests of the real driver bindings on a CPU.

:func:`build` compiles it with ``cc`` into ``<dir>/libcuda.so.1`` (and a ``libcuda.so`` link), cached
by the hash of the source and of the extra symbols: the catch-all entry points (they log the call
and answer ``CUDA_ERROR_NOT_SUPPORTED``) for every ``cu*`` symbol a linked binding (pycuda's
extension) needs at load that the stub does not implement. :class:`StubCuda.run` runs a Python
script in a subprocess whose loader finds the stub (``LD_LIBRARY_PATH``: cuda-python's
``dlopen("libcuda.so.1")`` and pycuda's link both resolve to it) and returns the process and the
calls the stub logged (one dict per call: ``call``, ``rc``, ``ctx`` and the decoded arguments).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).with_name("stub_libcuda.c")
REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"


def pycuda_symbols() -> tuple[str, ...]:
    """The ``cu*`` symbols pycuda's driver extension imports (``nm -D``), or () without pycuda/nm."""
    spec = importlib.util.find_spec("pycuda")
    if spec is None or not spec.submodule_search_locations:
        return ()
    libs = [p for d in spec.submodule_search_locations for p in Path(d).glob("_driver*.so")]
    nm = shutil.which("nm")
    if not libs or nm is None:
        return ()
    out = subprocess.run([nm, "-D", "--undefined-only", str(libs[0])], capture_output=True, text=True,
                         check=False).stdout
    return tuple(sorted({ln.split()[-1].split("@")[0] for ln in out.splitlines()
                         if ln.split() and ln.split()[-1].startswith("cu")}))


def _defined(source: str) -> set[str]:
    import re

    return set(re.findall(r"^CUresult (cu\w+)\(", source, re.M))


def build(cache: Path, extra_symbols: tuple[str, ...] = ()) -> Path:
    """Compile the stub (once per source and symbol set) into a directory under ``cache``; its path."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("no C compiler (cc) to build the stub CUDA driver")
    source = SOURCE.read_text()
    missing = sorted(set(extra_symbols) - _defined(source))
    catch_all = "".join(f'CUresult {s}(void) {{ logline("{{\\"call\\": \\"{s}\\", \\"rc\\": 801}}"); '
                        f"return E_NOT_SUPPORTED; }}\n" for s in missing)
    full = source + "\n/* catch-all entry points a linked binding needs at load */\n" + catch_all
    key = hashlib.sha256(full.encode()).hexdigest()[:16]
    out = cache / key
    if (out / "libcuda.so.1").exists():
        return out
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=cache))
    (tmp / "stub.c").write_text(full)
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-Wl,-soname,libcuda.so.1", "-o", str(tmp / "libcuda.so.1"),
                    str(tmp / "stub.c"), "-lpthread"], check=True, capture_output=True, timeout=120)
    os.symlink("libcuda.so.1", tmp / "libcuda.so")
    try:
        os.replace(tmp, out)  # atomic: parallel test workers may build it at the same time
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


@dataclass(frozen=True)
class Result:
    """A script's run: its exit code, output, the JSON of its last stdout line (None if none), the calls."""

    returncode: int
    stdout: str
    stderr: str
    value: Any
    calls: list[dict[str, Any]]

    def named(self, *names: str) -> list[dict[str, Any]]:
        """The logged calls of the given driver functions, in order."""
        return [c for c in self.calls if c["call"] in names]


@dataclass(frozen=True)
class StubCuda:
    """The built stub (``path``: its directory) and a way to run scripts over it."""

    path: Path

    def run(self, script: str, tmp: Path, timeout: float = 120, **env: str) -> Result:
        """Run ``script`` (Python) over the stub; ``env`` adds ``STUB_CUDA_*`` and other variables."""
        log = tmp / f"calls-{os.getpid()}-{len(list(tmp.glob('calls-*')))}.jsonl"
        e = dict(os.environ)
        e.update(LD_LIBRARY_PATH=f"{self.path}{os.pathsep}{e.get('LD_LIBRARY_PATH', '')}", STUB_CUDA_LOG=str(log),
                 PYTHONPATH=os.pathsep.join([str(REPO), str(TESTS), str(SOURCE.parent), e.get("PYTHONPATH", "")]))
        e.update(env)
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=e,
                              timeout=timeout, cwd=tmp, check=False)
        calls = [json.loads(ln) for ln in log.read_text().splitlines()] if log.exists() else []
        lines = proc.stdout.strip().splitlines()
        try:
            value = json.loads(lines[-1]) if lines else None
        except json.JSONDecodeError:
            value = None
        return Result(proc.returncode, proc.stdout, proc.stderr, value, calls)


def stub_image(kernels: dict[str, int]) -> bytes:
    """A module image the stub loads: ``{kernel name: number of parameters}``."""
    return ("STUBCUBIN " + " ".join(f"{k}:{n}" for k, n in kernels.items())).encode()
