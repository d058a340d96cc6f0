"""Keras ``steps_per_execution``: a marker that covers N training steps counts as N steps.

TensorFlow runs in a child process (this file executed as a script), as in
tests/test_real_tf_capture.py. The model is large enough that compute, not Keras' per-call
Python, dominates a step, so the per-step time should hardly depend on N.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tb_gpuadvisor.compare import compare_sessions, regressions_reaching
from tb_gpuadvisor.input.discovery import find_sessions
from tb_gpuadvisor.multihost import analyze_session

REPO = Path(__file__).resolve().parent.parent
BATCH, FEATURES, HIDDEN = 256, 256, (1024, 1024)
# (steps_per_execution, profiled calls of the callback, steps per epoch): 12 training steps each.
# Each is trained twice, interleaved, and the faster capture of each kept: a burst of other work
# on a shared machine slows one capture, not both.
CONFIGS = {"spe1": (1, (9, 20), 24), "spe4": (4, (3, 5), 24)}
RUNS = {f"{name}_{round}": config for round in "ab" for name, config in CONFIGS.items()}


def _write_captures(root: Path) -> None:
    import keras
    from tf_loop import classifier, labelled_rows, loss_fn

    for name, (per_call, calls, steps) in RUNS.items():
        data = labelled_rows(4096, FEATURES).batch(BATCH).repeat().prefetch(2)
        model = classifier(FEATURES, HIDDEN)
        model.compile("adam", loss_fn(), steps_per_execution=per_call)
        board = keras.callbacks.TensorBoard(log_dir=str(root / name), profile_batch=calls)
        model.fit(data, epochs=1, steps_per_epoch=steps, callbacks=[board], verbose=0)


@pytest.fixture(scope="module")
def sessions(tmp_path_factory) -> dict[str, dict]:
    if importlib.util.find_spec("tensorflow") is None or importlib.util.find_spec("keras") is None:
        pytest.skip("tensorflow/keras not installed")
    root = tmp_path_factory.mktemp("spe")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), str(REPO / "tests"),
                                                       os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, __file__, str(root)], capture_output=True, text=True,
                            timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    reports = {name: analyze_session(find_sessions(str(root / name))[0]) for name in RUNS}
    return {name: min((reports[f"{name}_{r}"] for r in "ab"), key=lambda s: s["steps"]["mean_ms"])
            for name in CONFIGS}


def test_markers_that_cover_four_steps_are_divided(sessions):
    """With steps_per_execution=4 the callback's markers are numbered 8, 12, 16 (one per call of
    the compiled function), each covering 4 training steps."""
    steps = sessions["spe4"]["steps"]
    assert steps["steps_per_execution"] == 4 and steps["markers"] == 3 and steps["count"] == 12
    assert sessions["spe4"]["trust"]["steps_per_execution"] == 4
    assert "steps_per_execution" not in sessions["spe1"]["steps"]


def test_per_step_time_matches_one_step_per_call(sessions):
    """The same model trained one step per call: per training step, spe4 takes about what spe1 does.
    Quiet, it may be faster (one call for four steps saves three host round trips: a clean-clone CI
    run measured 35.8 against 46.6 ms, a ratio of 0.77); on a shared 2-core machine other work slows
    one capture and not the other, by up to 2x in runs here (15.7 against 32.4 ms: 0.48; once 27.4
    against 21.1 ms: 1.30), and a tighter bound (spe4 at most 20% slower) failed under load. What
    this guards is the count: undivided, each spe4 marker would read as one step of 4x the time (3.1x
    on the quiet figures, 1.9x on the fastest loaded one, 5.2x on the slowest), divided twice a quarter
    of it (0.19x quiet). The window 0.3x to 2.5x of spe1's step catches a 4x error either way on the
    quiet figures and leaves the load's 2x room.
    Compare between the two reads the same per-step times and finds no check regressed; its step
    time verdict is left to its own noise band (narrower than this test's load allowance)."""
    one, four = sessions["spe1"]["steps"], sessions["spe4"]["steps"]
    assert 0.3 * one["mean_ms"] <= four["mean_ms"] <= 2.5 * one["mean_ms"]
    result = compare_sessions(sessions["spe1"], sessions["spe4"])
    assert (result["base"]["step_ms"], result["new"]["step_ms"]) == pytest.approx((one["mean_ms"], four["mean_ms"]))
    step_verdict = ["step time slower beyond the noise band"]
    assert regressions_reaching(result, "warning") in ([], step_verdict)


if __name__ == "__main__":
    _write_captures(Path(sys.argv[1]))
