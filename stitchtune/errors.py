"""User-facing error types.

Contract: anything raised as a :class:`StitchtuneError` is the user's problem (bad input, missing
tool, unusable database) and the CLI prints it as one line per problem and exits with code 2.
Any other exception is a bug in stitchtune.
"""

from __future__ import annotations


class StitchtuneError(Exception):
    """Root of all user-facing errors. ``problems`` holds one message per problem."""

    def __init__(self, message: str | None = None, problems: list[str] | None = None) -> None:
        self.problems: list[str] = list(problems) if problems else [message or "error"]
        super().__init__(message if message is not None else "; ".join(self.problems))


class GraphError(StitchtuneError):
    """graph.json is malformed, invalid or too large; each problem names its JSON path."""


class ScheduleError(StitchtuneError):
    """A schedule is illegal for a graph (bad parameter, constraint violated, unsupported pattern)."""


class UnsupportedGraphError(StitchtuneError):
    """The graph is valid and runs on the reference, but no stitched kernel can be generated for it."""


class SeparateRegionsError(UnsupportedGraphError):
    """The graph is one region where its parts need two: ``apart`` names the nodes (graph ids) that
    must be in separate regions, the first one to cut off from the others (a region finder may split
    the region there instead of giving up a node)."""

    def __init__(self, message: str, apart: tuple[str, ...], edges: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.apart = tuple(apart)
        #: ``(reader, source)`` node pairs whose reads a region finder cuts all together (the edges
        #: between two independent parts and the tensors they share; empty: cut by ``apart`` alone)
        self.edges = tuple(edges)


class ToolchainError(StitchtuneError):
    """A required external tool (nvcc, cuda-python and the CUDA driver, a GPU) is missing or unusable."""


class DatabaseError(StitchtuneError):
    """The tuning database or optuna storage cannot be used."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, with what was kept: ``str(exc)`` is ``"interrupted: <kept>"`` (e.g. ``"interrupted: 12 rows
    written to tuning-db"``). A KeyboardInterrupt (not a StitchtuneError): code that stops on Ctrl-C stops
    on it too, and the CLI prints it as its one line and exits with code 130."""

    def __init__(self, kept: str) -> None:
        self.kept = kept
        super().__init__(f"interrupted: {kept}")


def from_ctrl_c(exc: BaseException) -> bool:
    """Whether ``exc`` is a Ctrl-C, or an error raised while one was being handled: a KeyboardInterrupt
    landing inside a library's clean-up can come out as another exception (optuna's journal lock, interrupted
    in ``release()``, raises ``FileNotFoundError`` for its ``.rename`` file). Such an error is the interruption,
    not a problem of its own."""
    seen: BaseException | None = exc
    for _ in range(16):
        if seen is None:
            return False
        if isinstance(seen, KeyboardInterrupt):
            return True
        seen = seen.__context__ or seen.__cause__
    return False
