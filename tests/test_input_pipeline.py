"""input_bound's evidence says what the user's tf.data code did, not what tf.data made of it.

Three real pipelines are profiled by the installed TensorFlow in a child process (this
file run as a script, so the test process never imports TensorFlow), each with a slow
``tf.py_function`` inside ``map``:

- ``bare``: ``map(f).batch(8)``: no prefetch, a sequential map that tf.data fuses into a
  ``MapAndBatch`` stage (whose name alone looks parallel);
- ``tuned``: ``map(f, num_parallel_calls=AUTOTUNE).batch(8).prefetch(AUTOTUNE)``;
- ``injected``: ``batch(8).map(f)``: tf.data inserts a prefetch of its own.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

import synth
from tb_gpuadvisor.model.pipeline import Pipeline, Stage, user_facts
from tb_gpuadvisor.vocab.tensorflow import dataset_ops, input_stage
from tb_gpuadvisor.input.discovery import find_sessions
from tb_gpuadvisor.multihost import analyze_session

REPO = Path(__file__).resolve().parent.parent
PIPELINES = ("bare", "tuned", "injected")


def _write_captures(root: str) -> None:
    import time

    import keras
    import tensorflow as tf
    from tf_loop import classifier, labelled_rows, loss_fn

    def slow(x):
        time.sleep(0.004)
        return x

    def decode(x, y):
        shaped = tf.py_function(slow, [x], tf.float32)
        shaped.set_shape(x.shape)
        return shaped, y

    autotune = tf.data.AUTOTUNE
    build = {
        "bare": lambda ds: ds.map(decode).batch(8),
        "tuned": lambda ds: ds.map(decode, num_parallel_calls=autotune).batch(8).prefetch(autotune),
        "injected": lambda ds: ds.batch(8).map(decode),
    }
    for name in PIPELINES:
        model = classifier(16, [32])
        model.compile("adam", loss_fn())
        board = keras.callbacks.TensorBoard(log_dir=f"{root}/{name}", profile_batch=(3, 5))
        data = build[name](labelled_rows(256, 16).repeat())
        model.fit(data, epochs=1, steps_per_epoch=6, callbacks=[board], verbose=0)


@pytest.fixture(scope="module")
def findings(tmp_path_factory) -> dict[str, dict]:
    if importlib.util.find_spec("tensorflow") is None or importlib.util.find_spec("keras") is None:
        pytest.skip("tensorflow/keras not installed")
    root = tmp_path_factory.mktemp("pipelines")
    tests = str(REPO / "tests")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), tests, os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, __file__, str(root)], capture_output=True, text=True,
                            timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    out = {}
    for ref in find_sessions(str(root)):
        session = analyze_session(ref)
        out[ref.run.split("/")[0]] = next(f for f in session["findings"] if f["check"] == "input_bound")
    assert sorted(out) == sorted(PIPELINES)
    return out


def _pipeline_line(finding: dict) -> str:
    return next(e["detail"] for e in finding["evidence"] if e["name"] == "pipeline")


@pytest.mark.parametrize("name", PIPELINES)
def test_the_slow_py_function_is_named(findings, name):
    finding = findings[name]
    assert finding["severity"] in ("warning", "critical"), finding["metrics"]
    ops = [e for e in finding["evidence"] if e["kind"] == "op"]
    assert ops and ops[0]["name"].startswith("EagerPyFunc (tf.py_function"), finding["evidence"]
    assert "EagerPyFunc (tf.py_function" in finding["summary"]


def test_bare_pipeline_has_neither_prefetch_nor_parallel_map(findings):
    line = _pipeline_line(findings["bare"])
    assert line.startswith("your code: prefetch: no; parallel map: no"), line
    assert "MapAndBatch (your map fused with batch, still sequential)" in line
    assert "does not prefetch" in findings["bare"]["summary"]


def test_tuned_pipeline_prefetches_and_maps_in_parallel(findings):
    assert _pipeline_line(findings["tuned"]) == "your code: prefetch: yes; parallel map: yes"


def test_prefetch_inserted_by_tf_data_is_not_the_users(findings):
    line = _pipeline_line(findings["injected"])
    assert line.startswith("your code: prefetch: no; parallel map: no") and "prefetch (inject_prefetch)" in line


def test_capture_without_dataset_names_says_it_cannot_tell(tmp_path):
    """Older TensorFlow records no dataset names: fall back to the stages and say so."""
    capture = synth.build_training_session(steps=4, input_wait_frac=0.4)
    (ref,) = find_sessions(str(capture.write(tmp_path)))
    finding = next(f for f in analyze_session(ref)["findings"] if f["check"] == "input_bound")
    assert "does not record which stages your code wrote" in _pipeline_line(finding)


def test_dataset_names_decide_origin():
    assert dataset_ops("fused(MapDataset:2,BatchDatasetV2:3)") == ["MapDataset", "BatchDatasetV2"]
    stages = {"Iterator::Root", "Iterator::Root::Prefetch", "Iterator::Root::Prefetch::ParallelInterleaveV4"}
    names = {"Iterator::Root::Prefetch": "PrefetchDataset:9",
             "Iterator::Root::Prefetch::ParallelInterleaveV4": "ParallelInterleaveDatasetV4:4"}
    assert user_facts({s: input_stage(s, names.get(s)) for s in stages}) == (True, True, False, [])
    line = Pipeline([Stage("x", 1, "t")], False, False, False, origin_known=True).describe()
    assert line == "your code: prefetch: no; parallel map: no map"


if __name__ == "__main__":
    _write_captures(sys.argv[1])
