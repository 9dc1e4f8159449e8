"""What the tests share, one module per purpose (fixtures are in conftest.py); import a name from the
module that holds it (``from helpers.lowering import DEV, setup``):

* ``helpers.common``: Paths and limits every test room uses: ``REPO``, ``EXAMPLES_DIR`` (``EXAMPLES``), ``SMALL_EXAMPLES`` /
  ``FULL_EXAMPLES`` (sorted Paths), ``SMALL_DICTS``, ``COMMITTED_DB`` (the committed H200 tuning database,
  ``results/h200-2026-11-29``); ``time_limit(seconds)``: a context manager that raises ``Hang`` when its
  body runs longer (SIGALRM; the main thread only), for in-process CLI calls that must not hang.
* ``helpers.cli``: The CLI from a test: ``call_cli(argv)`` (``stitchtune ARGV`` in this process -> exit status, stdout,
  stderr); ``forked_cli(argv, out, err)`` / ``run_forked_cli(argv, tmp)``: ``python -m stitchtune ARGV`` as a
  process of its own forked from a server that imported the CLI's search path once (``FORKED_PRELOAD``), for
  the tests that start, kill and wait on many CLI processes; ``start_fork_server()`` starts the server ahead
  (a test that times its first process), ``stop_fork_server()`` ends (and waits for) it.
* ``helpers.lowering``: Planning, lowering and emulating from a test: ``DEV`` (H200 preset), ``setup(name)`` -> (graph, plan,
  space), ``rel_err``, ``emulated_errors``, ``check_emulates``, ``plan_or_refused``, ``float_graph``,
  ``channels_last_ln_backward``, ``GLOBAL_ROWS`` / ``local_scheme_space`` (a test-local scheme),
  ``assert_matches_golden``, ``suggested`` (schedules drawn the way optuna would) and ``emulator_kernels``.
* ``helpers.nvcc``: nvcc from a test: ``batch_source`` (many programs in one translation unit), ``ptxas_report`` (one nvcc
  -O3 build for sm_90 and its ``-Xptxas -v`` report), ``compile_programs_sm90`` (both, registers per kernel),
  ``shared_ptxas_report`` (one build per source for the whole run, shared by the xdist workers),
  ``check_compiles_sm90``, ``heuristic_programs``; ``BUILDER_FLAGS`` (what the NvccBuilder adds, for batched
  builds of what it would build one by one).
* ``helpers.search_fakes``: Search fakes: a 15-point fake space (block in ``BLOCKS`` x vec in ``VECS``) whose outcomes are fixed per
  point (``FATES``: (32,4) illegal -> pruned; (512,4) cost-model prune_reason -> pruned; (64,4)
  compile_error; (64,2) build timeout -> timeout; (512,1) launch_error; (512,2) run timeout; (128,1)
  wrong_result; all others ok with time = predicted time, fake, not a measurement), with ``fake_stages``,
  ``FakeBuilder``, ``FakeRunner`` and ``fake_components`` for ``run_search``.
* ``helpers.hostile``: Hypothesis strategies for hostile graph files: ``hostile_names``, ``json_values``, ``malformed_graph``
  (strategies built once at import, not per draw); ``pick(draw, items)`` draws one of a sequence that
  changes per example without building a ``sampled_from`` for it; ``SMALL_GRAPHS`` (one of the small
  examples, as a dict: copy before changing it); ``LOWER`` (a-z).
* ``helpers.onnx_models``: ONNX models from a test: ``onnx_vi``, ``onnx_model``, ``onnx_values`` (onnx's reference evaluator) and
  ``check_onnx_numerics`` (an import's subgraphs against it).
* ``helpers.graphs``: Graph builders shared by several test rooms: the loss heads (``ce_graph``: cross entropy with integer
  targets: log-softmax, a ``gather_elements`` pick, a scalar epilogue; ``ce_ignore_graph``, ``ce_items_graph``,
  ``ce_backward_graph``, ``int_next_to_pick_graph``), ``rotary_positions_graph`` and ``embedding_dropout_graph``.
* ``helpers.torch_models``: PyTorch from a test: ``torch_block`` (a small transformer block) and ``explain_with_eager``.

The package also re-exports every public name (``from helpers import DEV``), for tests written before the
split; new tests import from the modules.
"""

from __future__ import annotations

from helpers.common import COMMITTED_DB, EXAMPLES, EXAMPLES_DIR, FULL_EXAMPLES, Hang, REPO, SMALL_DICTS, SMALL_EXAMPLES, time_limit  # noqa: F401
from helpers.cli import FORKED_PRELOAD, call_cli, forked_cli, run_forked_cli, start_fork_server, stop_fork_server  # noqa: F401
from helpers.lowering import DEV, GLOBAL_ROWS, assert_matches_golden, channels_last_ln_backward, check_emulates, emulated_errors, emulator_kernels, float_graph, local_scheme_space, plan_or_refused, rel_err, setup, suggested  # noqa: F401
from helpers.nvcc import BUILDER_FLAGS, batch_source, check_compiles_sm90, compile_programs_sm90, heuristic_programs, ptxas_report, shared_ptxas_report  # noqa: F401
from helpers.search_fakes import BLOCKS, FATES, FakeBuild, FakeBuilder, FakeDevice, FakeGraph, FakeMeasurement, FakePlan, FakePrediction, FakeProfile, FakeProgram, FakeRunner, FakeSchedule, FakeSpace, FakeSpec, VECS, fake_components, fake_lower, fake_predict, fake_render, fake_should_prune, fake_stages, fake_time  # noqa: F401
from helpers.hostile import HOSTILE_CHARS, LOWER, SMALL_GRAPHS, hostile_names, json_values, malformed_graph, not_a_dict, not_a_list, pick  # noqa: F401
from helpers.onnx_models import check_onnx_numerics, onnx_model, onnx_values, onnx_vi  # noqa: F401
from helpers.graphs import ce_backward_graph, ce_graph, ce_ignore_graph, ce_items_graph, embedding_dropout_graph, int_next_to_pick_graph, rotary_positions_graph  # noqa: F401
from helpers.torch_models import explain_with_eager, torch_block  # noqa: F401
