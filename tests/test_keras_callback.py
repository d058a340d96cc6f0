"""``AdvisorCallback`` in a real ``model.fit``: the right steps captured, the planted problem named.

TensorFlow runs in one child process (this file executed as a script) that trains
small classifiers and writes what it saw to a JSON file: a slow input pipeline (a
``tf.py_function`` map that sleeps, no prefetch of its own) with and without the
callback, the slow and the fixed pipeline with ``fail_on="critical"``, and
``steps_per_execution=2``.  The tests
read that file; they skip when TensorFlow is not installed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from advice_runs import REPO, assert_not_slower, run_child

from tb_gpuadvisor.input.discovery import find_sessions
from tb_gpuadvisor.keras import is_chief


@dataclass(frozen=True)
class Setup:
    """A model and its input pipeline; ``input_s`` is how long the slow pipeline sleeps per batch."""

    features: int
    hidden: tuple[int, ...]
    batch: int
    input_s: float


# Timed runs: the sleeping input dominates each batch, so the batch times barely move with the
# load of a busy 2-core machine, and any cost the callback adds shows against a short step.
TIMED = Setup(32, (64,), 32, 0.06)
# The fail_on pair: enough compute per step, and two steps per execution, that the fixed
# pipeline has no critical host overhead even on a loaded machine; input that still takes
# several times longer than a step there.
HEAVY = Setup(256, (1024, 1024), 256, 0.4)
HEAVY_SPE = 2
SLOW_WARMUP, PROFILED = 3, 5
TIMED_BATCHES = 40
FIXED_BATCHES = 60          # room for the longest "auto" warm-up (50 steps) and the capture
FIXED_STEPS = 4
SPE_STEPS, SPE = 4, 2
# Per-batch time outside the profiled window may grow by at most this much with the callback.
OVERHEAD_LIMIT = 0.10


def _model(setup: Setup, **compile_args):
    """A compiled classifier; runs that share one trace its training step only once."""
    from tf_loop import classifier, loss_fn

    model = classifier(setup.features, setup.hidden)
    model.compile("adam", loss_fn(), **compile_args)
    return model


def _batch_times(model, setup: Setup, slow: bool, batches: int, callbacks: list) -> tuple[list[float], str]:
    """Train MODEL for BATCHES batches; the seconds between batch starts, and what was printed."""
    import contextlib
    import io
    import time

    import keras

    class BatchStarts(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.starts = []

        def on_train_batch_begin(self, batch, logs=None):
            self.starts.append(time.perf_counter())

    starts = BatchStarts()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        model.fit(_pipeline(setup, slow), epochs=1, steps_per_epoch=batches, callbacks=[starts, *callbacks],
                  verbose=0)
    return np.diff(starts.starts).tolist(), printed.getvalue()


def _pipeline(setup: Setup, slow: bool):
    """The planted problem (a map that sleeps, one batch at a time) or its fix."""
    import time

    import tensorflow as tf
    from tf_loop import labelled_rows

    def wait(x):
        time.sleep(setup.input_s)
        return x

    data = labelled_rows(2048, setup.features).batch(setup.batch).repeat()
    if slow:
        return data.map(lambda x, y: (tf.ensure_shape(tf.py_function(wait, [x], tf.float32), x.shape), y))
    return data.map(lambda x, y: (x, y), num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


def _advised_run(log_dir: Path, model, setup: Setup, slow: bool, batches: int, **options) -> dict:
    import logging

    from tb_gpuadvisor.keras import AdvisorCallback, AdvisorFindingError

    logged: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())
    logging.getLogger("tb_gpuadvisor").addHandler(handler)
    advisor = AdvisorCallback(log_dir=str(log_dir), **options)
    raised = None
    try:
        times, printed = _batch_times(model, setup, slow, batches, [advisor])
    except AdvisorFindingError as err:
        times, printed, raised = [], "", str(err)
    finally:
        logging.getLogger("tb_gpuadvisor").removeHandler(handler)
    window = advisor.window
    return {"times": times, "printed": printed, "raised": raised, "logged": logged,
            "numbers": window.profiled_numbers, "session_dir": window.session_dir,
            "report": advisor.report, "problem": window.problem, "settled_after": window.clock.done}


def _write_runs(out: Path) -> None:
    timed, heavy = _model(TIMED), _model(HEAVY, steps_per_execution=HEAVY_SPE)
    # The slow run is timed between two runs without the callback, so a change in the load of
    # the machine during the test shows in one of them.
    runs = {"baseline_before": {"times": _batch_times(timed, TIMED, True, TIMED_BATCHES, [])[0]},
            "slow": _advised_run(out / "slow", timed, TIMED, True, TIMED_BATCHES, warmup_steps=SLOW_WARMUP,
                                 steps=PROFILED),
            "baseline_after": {"times": _batch_times(timed, TIMED, True, TIMED_BATCHES, [])[0]}}
    runs.update(
        slow_fail=_advised_run(out / "slow_fail", heavy, HEAVY, True, 8, warmup_steps=2, steps=2,
                               fail_on="critical", print_report=False),
        fixed=_advised_run(out / "fixed", heavy, HEAVY, False, FIXED_BATCHES, steps=FIXED_STEPS,
                            fail_on="critical"),
        spe=_advised_run(out / "spe", _model(TIMED, steps_per_execution=SPE), TIMED, False, 16, warmup_steps=2,
                         steps=SPE_STEPS, print_report=False),
    )
    (out / "runs.json").write_text(json.dumps(runs))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    if importlib.util.find_spec("tensorflow") is None or importlib.util.find_spec("keras") is None:
        pytest.skip("tensorflow/keras not installed")
    return run_child(__file__, tmp_path_factory.mktemp("keras_advisor"), TF_CPP_MIN_LOG_LEVEL="2")


def test_capture_skips_warmup_and_holds_the_requested_steps(runs: dict):
    slow = runs["slow"]
    # One unmarked lead-in step after warm-up, then the profiled ones.
    assert slow["numbers"] == list(range(SLOW_WARMUP + 1, SLOW_WARMUP + 1 + PROFILED))
    steps = slow["report"]["sessions"][0]["steps"]
    # Issue 26.8: fit's steps, marked as fit marks them, not "custom_loop markers".
    assert (steps["source"], steps["marker"]) == ("keras", "Profiled batch")
    assert "5 steps (keras markers)" in slow["printed"]
    assert steps["count"] == PROFILED
    assert steps["numbers"] == slow["numbers"]


def test_no_advice_to_wrap_a_fit_step_in_tf_function(runs: dict):
    """Issue 26.8: fit already runs its step as a tf.function (the capture holds its
    __inference_train_function calls) and owns the loop: neither is advised."""
    for name in ("slow", "fixed", "spe"):
        session = runs[name]["report"]["sessions"][0]
        texts = [fix["text"] for f in session["findings"] for fix in f["fixes"]]
        assert not [t for t in texts if "as one tf.function" in t or "custom training loop" in t], (name, texts)


def test_capture_is_in_the_tensorboard_layout(runs: dict):
    session_dir = Path(runs["slow"]["session_dir"])
    assert session_dir.parent.name == "profile" and session_dir.parent.parent.name == "plugins"
    refs = find_sessions(str(session_dir.parent.parent.parent))
    assert [ref.session for ref in refs] == [session_dir.name]
    assert f"tensorboard --logdir {session_dir.parent.parent.parent}" in runs["slow"]["printed"]


def test_printed_report_names_the_slow_input_pipeline(runs: dict):
    printed = runs["slow"]["printed"]
    first = printed.index("1. [")
    assert printed[first:].startswith("1. [CRITICAL] Training waits on input")
    assert "check: input_bound" in printed
    assert "saves about" in printed and "fix:" in printed
    assert "prefetch" in printed
    assert any("input_bound critical" in line for line in runs["slow"]["logged"])


def test_auto_warmup_waits_for_settled_steps(runs: dict):
    fixed = runs["fixed"]
    assert fixed["problem"] is None
    first = fixed["numbers"][0]
    # Warm-up ends at an execution's start; that execution is the lead-in.
    assert first >= 2 + HEAVY_SPE and first == fixed["settled_after"] + HEAVY_SPE
    assert fixed["report"]["sessions"][0]["steps"]["count"] == FIXED_STEPS  # training steps: markers x steps_per_execution


def test_fail_on_critical_raises_on_the_slow_pipeline_only(runs: dict):
    assert runs["slow_fail"]["raised"] is not None and "input_bound (critical)" in runs["slow_fail"]["raised"]
    assert runs["fixed"]["raised"] is None, runs["fixed"]["raised"]
    findings = runs["fixed"]["report"]["sessions"][0]["findings"]
    assert next(f for f in findings if f["check"] == "input_bound")["severity"] == "ok"


def test_steps_per_execution_counts_batches(runs: dict):
    spe = runs["spe"]
    # Executions start at even batches; after 2 warm-up batches and a lead-in execution, two
    # executions (four batches) are profiled, one marker each.
    assert spe["numbers"] == [4, 6]
    steps = spe["report"]["sessions"][0]["steps"]
    assert steps["numbers"] == [4, 6] and steps["count"] == SPE_STEPS and steps["steps_per_execution"] == SPE


def test_training_outside_the_capture_is_not_slower(runs: dict):
    """Median batch time outside the capture against runs without the callback; the analysis of
    the capture runs meanwhile."""
    assert_not_slower(runs, "slow", OVERHEAD_LIMIT)


@pytest.mark.parametrize("marker,advised", [
    ("keras3", []),                         # fit, step compiled (its __inference_ calls are in the capture)
    ("r", ["as one tf.function", "custom training loop"]),
])
def test_tf_function_advice_only_where_the_step_is_not_one(tmp_path, marker: str, advised: list[str]):
    """Issue 26.8, without TensorFlow: 20% planted host overhead and 30% launch time; fit's own markers
    with its compiled step get neither "run the step as one tf.function" nor the custom-loop advice,
    a custom loop's markers get both."""
    import synth

    from tb_gpuadvisor.multihost import analyze_session

    capture = synth.build_training_session(steps=5, marker=marker, host_overhead_frac=0.2, launch_frac=0.3,
                                           kernel_us=15)
    (ref,) = find_sessions(str(capture.write(tmp_path, run="train", session="s1")))
    session = analyze_session(ref)
    acted = [f for f in session["findings"] if f["check"] in ("host_overhead", "kernel_launch") and f["fixes"]]
    assert len(acted) == 2, [(f["check"], f["severity"]) for f in session["findings"]]
    texts = " ".join(fix["text"] for f in acted for fix in f["fixes"])
    assert [words for words in ("as one tf.function", "custom training loop") if words in texts] == advised


@pytest.mark.parametrize("task,chief", [
    ((None, None, None), True),
    (("chief", 0, {"chief": ["a:1"], "worker": ["b:1"]}), True),
    (("worker", 0, {"chief": ["a:1"], "worker": ["b:1"]}), False),
    (("worker", 0, {"worker": ["a:1", "b:1"]}), True),
    (("worker", 1, {"worker": ["a:1", "b:1"]}), False),
    (("evaluator", 0, {"worker": ["a:1"], "evaluator": ["c:1"]}), False),
])
def test_only_the_chief_reports(task: tuple, chief: bool):
    assert is_chief(*task) is chief


def test_importing_the_modules_loads_no_framework():
    code = ("import sys, tb_gpuadvisor.keras, tb_gpuadvisor.jax, tb_gpuadvisor.inloop; "
            "print(sorted(m for m in ('tensorflow', 'keras', 'jax', 'tf_keras') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


if __name__ == "__main__":
    _write_runs(Path(sys.argv[1]))
