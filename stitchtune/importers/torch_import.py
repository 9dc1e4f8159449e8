"""PyTorch -> graph.json: capture a function or ``nn.Module`` at example shapes and map its ATen ops.

Contract
--------
* :func:`import_torch(fn, inputs)` captures ``fn`` with ``torch.export.export`` (non-strict) at the
  given static shapes and dtypes; if export fails it falls back to ``make_fx`` (torch.fx tracing at
  the ATen level with real example tensors, so Python control flow is specialised). It returns a
  :class:`TorchImport` whose ``graph`` is a validated :class:`~stitchtune.graph.parse.Graph`.
* Graph inputs are the callable's tensor arguments (named as its parameters, in signature order),
  then the module's parameters and buffers (named after their sanitised qualified names; their
  values are in ``TorchImport.params``). Outputs are the returned tensors, named after the ATen node
  that produced them. Every generated name matches ``[A-Za-z_][A-Za-z0-9_]{0,63}``.
* Supported ATen ops (every op key: :data:`stitchtune.importers.torch_aten_ops.SUPPORTED_OPS`, the
  registry of op handlers, listed in docs/torch.md): layer_norm / native_layer_norm (decomposed),
  rms_norm, softmax / _softmax, log_softmax / _log_softmax, gelu (none / tanh), silu, sigmoid, tanh,
  relu, exp, log, sqrt, rsqrt, reciprocal, neg, abs, erf, square, add / sub / rsub (tensor or
  scalar, ``alpha``), mul, div (no rounding mode), pow, maximum, minimum, clamp / clamp_min /
  clamp_max, sum / mean / amax / amin (dims, keepdim, dtype), max.dim / min.dim values, casts
  (``_to_copy``, ``to``, ``type_as``; to bool is ``x != 0``), views (identity views,
  adding/removing leading size-1 dims, ``expand`` as implicit
  broadcasting, ``unsqueeze`` of a reduction that becomes ``keepdims``; a view that moves elements,
  ``view``/``reshape``/``_unsafe_view``/``flatten``/``unsqueeze``/``squeeze``, is a ``reshape``, and
  one that only adds or removes unit axes of a broadcast value keeps it broadcast), ``clone`` /
  ``contiguous`` / ``alias`` / ``detach`` (identity), ``transpose.int`` / ``permute`` / ``t``
  (``transpose``), ``cat`` (``concat``, 2 to 8 tensors), ``slice.Tensor`` (step 1, bounds clamped)
  and ``select.int`` (``slice``), ``embedding(weight, ids)`` (``gather`` of int32/int64 ids that are
  a graph input; inputs may be given as ``int32``/``int64``, example ids are zeros), dropout in
  eval mode (identity), eval-mode batch norm (``batch_norm`` / ``native_batch_norm`` /
  ``_native_batch_norm_legit_no_training`` with running statistics, channel axis 1),
  ``adaptive_avg_pool2d`` to 1x1 (a mean over H and W), in-place ops (``add_``, ``relu_``, ...) as
  their functional form when the mutated tensor is a fresh intermediate that nothing reads
  afterwards (see :mod:`stitchtune.importers.torch_cnn`),
  comparisons (eq/ne/lt/le/gt/ge), logical and bitwise and/or/not of bools, ``where`` and
  ``masked_fill`` with a number (bool values inside the graph; arithmetic on a bool is refused),
  ``scalar_tensor`` (a constant), ``scatter(base, dim, index, number)`` with an index of size 1 along
  ``dim`` (a one-hot: ``where(iota == index, number, base)``; ``base`` may be a ``full``),
  ``_unsafe_masked_index_put_accumulate`` / ``index_put(accumulate=True)`` into a fresh tensor of
  zeros (an embedding's gradient: ``scatter_add``, see :mod:`stitchtune.importers.torch_scatter`). Anything
  else raises
  :class:`~stitchtune.importers.builder.ImportError_` (a ``StitchtuneError``) naming the op and its
  source location.
* Every mapped value is checked against PyTorch's own shape and dtype metadata; a mismatch that the
  importer cannot express is an error rather than a silently different graph.

This module loads and captures the callable; the walk of the captured graph and the per-op
translation are in :mod:`stitchtune.importers.torch_aten`.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import operator
import sys
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from stitchtune.graph.parse import Graph
from stitchtune.importers.builder import GraphBuilder, ImportError_, sanitize_name
from stitchtune.importers.torch_aten import _Captured, _Walker
from stitchtune.importers.torch_fx_util import _TORCH_DTYPES, torch_dtype_name

__all__ = ["TorchImport", "all_positional", "first_line", "import_torch", "input_order", "load_callable",
           "torch_dtype_name"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TorchImport:
    """The result of importing a PyTorch callable."""

    graph: Graph
    #: parameter/buffer inputs and their values (numpy, in the input's dtype), in graph input order
    params: tuple[tuple[str, np.ndarray], ...] = field(default=(), compare=False)
    #: "export" or "make_fx"
    method: str = "export"


# ---------------------------------------------------------------------------- loading the callable
def _require_torch() -> None:
    try:
        import torch  # noqa: F401
    except ModuleNotFoundError as e:  # the optional extra is not installed
        raise ImportError_("PyTorch is not installed (pip install 'stitchtune[import]')") from e


def load_callable(spec: str) -> tuple[Any, str]:
    """``"path/to/file.py:NAME"`` or ``"dotted.module:NAME"`` -> (object, display name).

    ``NAME`` may be dotted (attribute path). An ``nn.Module`` subclass is instantiated with no
    arguments. Raises :class:`ImportError_` if the module or attribute cannot be found (torch is imported
    after the module, so a misspelt name is reported without waiting for it).
    """
    mod_part, colon, attr = spec.rpartition(":")
    if not colon or not mod_part or not attr:
        raise ImportError_(f"{spec!a} is not MODULE:CALLABLE (a .py path or dotted module, then ':' and a name)")
    try:
        if mod_part.endswith(".py") or "/" in mod_part or Path(mod_part).is_file():
            path = Path(mod_part)
            if not path.is_file():
                raise ImportError_(f"module file {mod_part!a} does not exist")
            mod_name = "stitchtune_user_" + sanitize_name(path.stem)
            spec_ = importlib.util.spec_from_file_location(mod_name, path)
            if spec_ is None or spec_.loader is None:
                raise ImportError_(f"cannot load {mod_part!a} as a Python module")
            module = importlib.util.module_from_spec(spec_)
            sys.modules[mod_name] = module
            spec_.loader.exec_module(module)
        else:
            module = importlib.import_module(mod_part)
    except ImportError_:
        raise
    except ModuleNotFoundError as e:
        if e.name == "torch":
            _require_torch()
        if e.name and mod_part.startswith(e.name):  # the module named, not one it imports
            raise ImportError_(f"no module named {e.name!a} (MODULE is a .py path or an importable dotted "
                               "module)") from None
        raise ImportError_(f"importing {mod_part!a} failed: {e}") from e
    except Exception as e:  # the user's code failed to import: a user error, reported in one line
        raise ImportError_(f"importing {mod_part!a} failed: {type(e).__name__}: {first_line(e)}") from e
    _require_torch()
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ImportError_(f"{mod_part!a} has no attribute {attr!a}")
        obj = getattr(obj, part)
    import torch

    if isinstance(obj, type) and issubclass(obj, torch.nn.Module):
        try:
            obj = obj()
        except TypeError as e:
            raise ImportError_(f"{attr!a} is an nn.Module class that cannot be built without arguments: {e}") from e
        except Exception as e:  # the user's constructor failed: their mistake, in one line
            raise ImportError_(f"building {attr!a} failed: {type(e).__name__}: {first_line(e)}") from e
    if not callable(obj):
        raise ImportError_(f"{attr!a} in {mod_part!a} is not callable")
    if isinstance(obj, torch.nn.Module):
        obj.eval()   # import the inference graph (dropout off, batchnorm running stats)
    return obj, attr.rsplit(".", 1)[-1]


def first_line(exc: BaseException, limit: int = 300) -> str:
    """The first line of ``str(exc)``, at most ``limit`` characters (for a one-line error)."""
    text = (str(exc).strip().splitlines() or [""])[0]
    return text if len(text) <= limit else text[: limit - 3] + "..."


def input_names(fn: Any) -> list[str]:
    """Positional tensor parameter names of ``fn`` (``forward`` for a module), without defaults."""
    import torch

    target = fn.forward if isinstance(fn, torch.nn.Module) else fn
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return []
    return [p.name for p in sig.parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]


def all_positional(fn: Any) -> list[str] | None:
    """All positional parameter names, or None if ``fn`` takes ``*args``."""
    import torch

    target = fn.forward if isinstance(fn, torch.nn.Module) else fn
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return None
    if any(p.kind == p.VAR_POSITIONAL for p in sig.parameters.values()):
        return None
    return [p.name for p in sig.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]

def input_order(fn: Any, names: Sequence[str]) -> list[str]:
    """The argument names ``names`` (from ``--shapes``) in the order ``fn`` takes them positionally: every
    name a positional parameter of ``fn``, every parameter without a default named, and together a prefix
    of the positional parameters (``names`` as given when ``fn`` takes ``*args``). One
    :class:`ImportError_` lists every problem. ``import torch`` and ``tune`` both call ``fn`` in this order."""
    positional = all_positional(fn)
    if positional is None:
        return list(names)
    params = ", ".join(positional) or "none"
    problems = [f"--shapes: {n!a} is not a parameter of the callable (parameters: {params})"
                for n in names if n not in positional]
    problems += [f"--shapes: missing shape for argument {n!a}" for n in input_names(fn) if n not in names]
    if problems:
        raise ImportError_(problems=problems)
    order = [n for n in positional if n in names]
    if order != positional[: len(order)]:
        raise ImportError_(f"--shapes must cover a prefix of the positional arguments ({params})")
    return order


# ---------------------------------------------------------------------------- capture
def _as_forward(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A copy of a plain function whose frame is named ``forward``.

    Non-strict ``torch.export`` keeps only frames named ``forward`` in ``node.meta["stack_trace"]``;
    renaming the code object (same file, same line numbers) keeps the user's source lines.
    """
    if not isinstance(fn, types.FunctionType):
        return fn
    code = fn.__code__.replace(co_name="forward")
    g = types.FunctionType(code, fn.__globals__, "forward", fn.__defaults__, fn.__closure__)
    g.__kwdefaults__ = fn.__kwdefaults__
    return g


def _wrap(fn: Any) -> Any:
    import torch

    if isinstance(fn, torch.nn.Module):
        return fn
    f = _as_forward(fn)

    class _Fn(torch.nn.Module):
        def forward(self, *args: Any) -> Any:
            return f(*args)

    return _Fn()

def _capture(fn: Any, args: tuple[Any, ...]) -> _Captured:
    import torch

    module = _wrap(fn)
    try:
        ep = torch.export.export(module, args, strict=False)
    except Exception as e:  # noqa: BLE001 -- any tracing failure -> try the fx fallback
        log.info("torch.export failed (%s: %s); falling back to make_fx", type(e).__name__, e)
        export_error = e
    else:
        from torch.export.graph_signature import InputKind, OutputKind

        bad_out = [s for s in ep.graph_signature.output_specs if s.kind != OutputKind.USER_OUTPUT]
        if bad_out:
            raise ImportError_(f"the callable mutates {bad_out[0].target!a} in place; "
                               "graph.json graphs are pure functions")
        bindings: dict[str, tuple[str, Any]] = {}
        user = 0
        for s in ep.graph_signature.input_specs:
            if s.kind == InputKind.USER_INPUT:
                bindings[s.arg.name] = ("user", user)
                user += 1
            elif s.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
                t = ep.state_dict.get(s.target)
                if t is None:
                    t = ep.constants.get(s.target)
                if t is None:
                    raise ImportError_(f"cannot find the value of {s.target!a}")
                kind = "const" if s.kind == InputKind.CONSTANT_TENSOR else "param"
                bindings[s.arg.name] = (kind, (s.target, t))
            else:
                raise ImportError_(f"unsupported graph input kind {s.kind.name} ({s.target!a})")
        return _Captured(ep.graph_module, bindings, "export")
    from torch.fx.experimental.proxy_tensor import make_fx

    try:
        gm = make_fx(module)(*args)
    except Exception as e:
        raise ImportError_(problems=[
            f"torch.export failed: {type(export_error).__name__}: {str(export_error).splitlines()[0] if str(export_error) else ''}",
            f"make_fx failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"]) from e
    bindings = {}
    fqns = {id(t): k for k, t in [*module.named_parameters(), *module.named_buffers()]}
    i = 0
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            bindings[n.name] = ("user", i)
            i += 1
        elif n.op == "get_attr":
            t = operator.attrgetter(n.target)(gm)
            if id(t) in fqns:
                bindings[n.name] = ("param", (fqns[id(t)], t))
            else:
                bindings[n.name] = ("const" if str(n.target).startswith("_tensor_constant") else "param",
                                    (str(n.target), t))
    return _Captured(gm, bindings, "make_fx")

# ---------------------------------------------------------------------------- entry point
def import_torch(fn: Any, inputs: Mapping[str, tuple[Sequence[int], str]], name: str | None = None,
                 seed: int = 0) -> TorchImport:
    """Capture ``fn`` (function or ``nn.Module``) at ``inputs`` = {arg name: (shape, dtype)}.

    Arguments are passed positionally in the order of ``fn``'s signature (the order of ``inputs`` if
    it takes ``*args``). Example tensors are seeded normal values on the CPU.
    """
    _require_torch()
    import torch

    order = input_order(fn, list(inputs))
    gen = torch.Generator().manual_seed(seed)
    b = GraphBuilder(name or str(getattr(fn, "__name__", type(fn).__name__)))
    args, values = [], []
    for n in order:
        shape, dt = inputs[n]
        tdt = getattr(torch, dt, None)
        if dt not in (*_TORCH_DTYPES, "int32", "int64") or tdt is None:
            raise ImportError_(f"input {n!a}: dtype {dt!a} is not supported")
        if dt in ("int32", "int64"):   # indices (embedding ids): zeros are in range for any table
            args.append(torch.zeros(tuple(shape), dtype=tdt))
        else:
            args.append(torch.randn(tuple(shape), generator=gen).to(tdt))
        values.append(b.add_input(n, shape, dt))
    cap = _capture(fn, tuple(args))

    def param_dtype(fqn: str, t: Any) -> str:
        dt = torch_dtype_name(t.dtype)
        if dt is None:
            raise ImportError_(f"parameter {fqn!a} has dtype {t.dtype}, which graph.json does not have")
        return dt

    walker = _Walker(cap, b, values, param_dtype)
    outputs = walker.run()
    graph = b.graph(outputs)
    log.info("imported %s via %s: %d nodes, %d inputs (%d parameters), outputs %s", b.name, cap.method,
             len(graph.nodes), len(graph.inputs), len(walker.params), ", ".join(graph.outputs))
    return TorchImport(graph=graph, params=tuple(walker.params), method=cap.method)
