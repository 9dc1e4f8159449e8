"""The compiled facts of a built candidate: its cubin read in SASS once, for the after-build prediction.

Contract
--------
* :class:`SassFactsReader` is called with a :class:`~stitchtune.gpu.build.BuildResult` (or anything with
  ``status`` and ``cubin_path``) and returns ``{kernel name: CompiledFacts}``
  (:class:`~stitchtune.cost.compiled.CompiledFacts`, :func:`stitchtune.gpu.sass.compiled_facts` of every
  function of the cubin), or None when there are none: a failed build, no cubin (a fake or skipped
  build), no ``cuobjdump`` installed, or a cubin cuobjdump cannot read. None means "predict from the IR
  features" (:data:`~stitchtune.cost.compiled.PredictedFrom.IR`); it is never an error.
* It reads the cubin a build already made; it never compiles anything.
* One SASS read per distinct cubin: results are cached by the sha256 of the cubin's bytes, in memory
  (bounded to :data:`CACHE_ENTRIES` cubins, oldest dropped first; the process's reader,
  :func:`shared_reader`, serves both the search's pipeline and the emulate runner) and on disk beside the
  build cache (``<cache_dir>/sass-facts-v<FACTS_VERSION>/<sha[:2]>/<sha>.json``, ``cache_dir`` default
  the builder's ``$STITCHTUNE_CACHE`` or ``~/.cache/stitchtune/cubin``; written atomically; a file that
  cannot be read or written is a cache miss, never an error), so a search run again on cached builds
  reads no SASS. :data:`FACTS_VERSION` changes whenever what :func:`~stitchtune.gpu.sass.compiled_facts`
  reads of the SASS changes. An unreadable cubin is cached as None in memory only (one warning per cubin).
* cuobjdump costs about 0.4 s of CPU per cubin (nvdisasm's start-up, whatever the kernel:
  ``scripts/predict_cost_per_candidate.py --sass``); the pipeline reads a batch's cubins concurrently.
* Without ``cuobjdump`` the reader logs one note per process (at INFO) and returns None for every build.
* Thread-safe (the builder and the runner may call from different threads); ``reads`` counts the
  cuobjdump runs (tests and ``scripts/predict_cost_per_candidate.py`` read it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from stitchtune.cost.compiled import CompiledFacts
from stitchtune.errors import ToolchainError
from stitchtune.graph.files import write_atomic
from stitchtune.gpu.sass import SassMetrics, compiled_facts, find_cuobjdump, read_cubin

log = logging.getLogger(__name__)

__all__ = ["CACHE_ENTRIES", "SassFactsReader", "shared_reader"]

#: Cubins whose facts the cache keeps (a few hundred bytes each).
CACHE_ENTRIES = 4096
#: Version of the stored facts (the disk cache's folder name): bump it when the SASS parsing changes.
FACTS_VERSION = 1

_noted_missing = False
_note_lock = threading.Lock()


def _note_missing_tool() -> None:
    global _noted_missing
    with _note_lock:
        if _noted_missing:
            return
        _noted_missing = True
    log.info("cuobjdump not found: predictions after a build use the IR features only "
             "(predicted_from=ir; pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm for the compiled facts)")


class SassFactsReader:
    """Compiled facts of a build's cubin (module docstring). ``tool``: the cuobjdump to run (default
    :func:`~stitchtune.gpu.sass.find_cuobjdump`, looked up on first use); ``read``: the function that
    reads a cubin (``read(path, tool) -> {kernel: SassMetrics}``, injectable for tests)."""

    def __init__(self, tool: str | None = None,
                 read: Callable[[str, str], Mapping[str, SassMetrics]] | None = None,
                 cache_dir: str | os.PathLike[str] | None = None) -> None:
        from stitchtune.gpu.build import default_cache_dir

        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self._tool = tool
        self._tool_known = tool is not None
        self._read = read or (lambda path, t: read_cubin(path, t))
        self._cache: OrderedDict[str, dict[str, CompiledFacts] | None] = OrderedDict()
        self._lock = threading.Lock()
        self.reads = 0

    def tool(self) -> str | None:
        """The cuobjdump this reader runs, or None (then every build predicts from the IR)."""
        if not self._tool_known:
            self._tool, self._tool_known = find_cuobjdump(), True
        return self._tool

    def __call__(self, build: Any) -> dict[str, CompiledFacts] | None:
        path = getattr(build, "cubin_path", None)
        if str(getattr(build, "status", "")) != "ok" or not path:
            return None
        tool = self.tool()
        if tool is None:
            _note_missing_tool()
            return None
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            log.warning("cannot read the cubin %s: %s; predicting from the IR features", ascii(str(path)), exc)
            return None
        key = hashlib.sha256(data).hexdigest()
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        facts = self._load(key)
        if facts is None:
            try:
                facts = {name: compiled_facts(m) for name, m in self._read(str(path), tool).items()}
            except ToolchainError as exc:
                log.warning("SASS of %s not read (%s); predicting from the IR features", ascii(str(path)), exc)
            with self._lock:
                self.reads += 1
            if facts is not None:
                self._store(key, facts)
        with self._lock:
            self._cache[key] = facts
            while len(self._cache) > CACHE_ENTRIES:
                self._cache.popitem(last=False)
        return facts

    def _file(self, key: str) -> Path:
        return self.cache_dir / f"sass-facts-v{FACTS_VERSION}" / key[:2] / f"{key}.json"

    def _load(self, key: str) -> dict[str, CompiledFacts] | None:
        """The stored facts of the cubin ``key``, or None (absent or unreadable: a miss)."""
        try:
            d = json.loads(self._file(key).read_text(encoding="utf-8"))
            return {str(k): CompiledFacts.from_dict(v) for k, v in d.items()}
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return None

    def _store(self, key: str, facts: Mapping[str, CompiledFacts]) -> None:
        data = json.dumps({k: f.to_dict() for k, f in facts.items()}, sort_keys=True).encode("utf-8")
        try:
            write_atomic(self._file(key), data)
        except OSError as exc:
            log.debug("compiled facts not stored under %s: %s", ascii(str(self.cache_dir)), exc)


_shared: SassFactsReader | None = None
_shared_lock = threading.Lock()


def shared_reader() -> SassFactsReader:
    """The process's reader (one cache for the pipeline and the emulate runner)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = SassFactsReader()
        return _shared
