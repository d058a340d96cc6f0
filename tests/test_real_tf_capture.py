"""Captures written by the installed TensorFlow right now, read back by the Advisor.

The corpus holds captures from TF <= 2.10; this test makes sure the step markers
of today's Keras 3 ``TensorBoard(profile_batch=...)`` callback and of a custom
loop annotated with ``Trace(..., step_num=..., _r=1)`` are found.  TensorFlow
runs in a child process (this file executed as a script) so the test process
never imports it; the test skips when TensorFlow is not installed.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tb_gpuadvisor.input.discovery import find_sessions
from tb_gpuadvisor.pipeline import load_session
from tb_gpuadvisor.kinds import HostEventKind
from tb_gpuadvisor.multihost import analyze_session

REPO = Path(__file__).resolve().parent.parent
KERAS_PROFILE_BATCHES = (3, 5)   # 1-based batches given to the callback
KERAS_STEP_NUMS = [2, 3, 4]      # Keras 3 labels them with the 0-based batch index
LOOP_WARMUP, LOOP_STEPS = 2, 4


def _write_keras_capture(log_dir: Path) -> None:
    import keras
    from tf_loop import classifier, labelled_rows, loss_fn

    data = labelled_rows(512, 16).batch(32).repeat().prefetch(2)
    model = classifier(16, [32])
    model.compile("adam", loss_fn())
    board = keras.callbacks.TensorBoard(log_dir=str(log_dir), profile_batch=KERAS_PROFILE_BATCHES)
    model.fit(data, epochs=1, steps_per_epoch=KERAS_PROFILE_BATCHES[1] + 1, callbacks=[board], verbose=0)


def _write_custom_loop_capture(log_dir: Path) -> None:
    from tf_loop import classifier, labelled_rows, profile_custom_loop

    batches = iter(labelled_rows(512, 16).batch(32).repeat())
    profile_custom_loop(str(log_dir), classifier(16, [32]), batches,
                        warmup=LOOP_WARMUP, steps=LOOP_STEPS)


@pytest.fixture(scope="module")
def logdir(tmp_path_factory) -> Path:
    if importlib.util.find_spec("tensorflow") is None or importlib.util.find_spec("keras") is None:
        pytest.skip("tensorflow/keras not installed")
    root = tmp_path_factory.mktemp("real_tf")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, __file__, str(root)], capture_output=True, text=True,
                            timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return root


def _session(logdir: Path, run: str):
    refs = {ref.run: ref for ref in find_sessions(str(logdir))}
    assert run in refs, f"run {run!r} not among {sorted(refs)}"
    return refs[run]


def test_keras3_callback_writes_under_train_and_is_found(logdir: Path):
    refs = find_sessions(str(logdir))
    assert sorted(ref.run for ref in refs) == ["custom_loop", "keras/train"]
    assert all(len(ref.hosts) == 1 for ref in refs)


def test_keras3_profiled_batch_markers_are_the_steps(logdir: Path):
    model = load_session(_session(logdir, "keras/train"))
    assert model.framework == "tensorflow"
    assert model.steps.source == "keras"
    assert model.steps.number.tolist() == KERAS_STEP_NUMS
    assert np.all(model.steps.duration_ps > 0)
    assert np.all(np.diff(model.steps.start_ps) > 0)


def test_custom_loop_markers_are_the_steps_not_function_runs(logdir: Path):
    """TF also tags every FunctionRun with _r=1 (but no step_num); only the Trace events are steps."""
    model = load_session(_session(logdir, "custom_loop"))
    host = model.hosts[0].activity
    function_runs = host.names.index("FunctionRun") if "FunctionRun" in host.names else -1
    assert np.any(host.is_root & (host.name == function_runs)), "expected _r=1 FunctionRun events in TF 2.x"
    assert model.steps.source == "custom_loop"
    assert model.steps.number.tolist() == list(range(LOOP_STEPS))
    assert np.all(model.steps.duration_ps > 0)


@pytest.mark.parametrize("run", ["keras/train", "custom_loop"])
def test_host_events_are_classified(logdir: Path, run: str):
    activity = load_session(_session(logdir, run)).hosts[0].activity
    kinds = set(np.unique(activity.kind).tolist())
    assert {HostEventKind.INPUT_WAIT, HostEventKind.INPUT_STAGE, HostEventKind.FRAMEWORK_OP,
            HostEventKind.STEP_MARKER} <= kinds


@pytest.mark.parametrize("run,source,count", [("keras/train", "keras", len(KERAS_STEP_NUMS)),
                                              ("custom_loop", "custom_loop", LOOP_STEPS)])
def test_report_on_a_real_cpu_capture(logdir: Path, run: str, source: str, count: int):
    session = analyze_session(_session(logdir, run))
    assert session["errors"] == []
    assert session["steps"]["source"] == source
    # A step far slower than the others (the first profiled one often is) is left out, not lost.
    assert session["steps"]["count"] + session["steps"].get("excluded", 0) == count
    assert session["trust"]["candidate_steps"] == count
    assert session["breakdown"]["device"] == "/host:CPU"
    severities = {f["check"]: f["severity"] for f in session["findings"]}
    assert "input_bound" in severities
    assert set(severities.values()) <= {"critical", "warning", "info", "ok", "not_applicable"}


if __name__ == "__main__":
    out = Path(sys.argv[1])
    _write_keras_capture(out / "keras")
    _write_custom_loop_capture(out / "custom_loop")
