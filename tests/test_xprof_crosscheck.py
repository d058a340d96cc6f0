"""Our input_percent against XProf's on CPU captures where XProf measures it correctly.

XProf finds steps in custom loops annotated with ``_r=1`` and, on CPU-only captures,
reports the share of step time spent waiting for input on its overview page. A real
capture is written by TensorFlow in a child process (so this test process never imports
TensorFlow), with a tf.data map that sleeps to make the loop input-bound by a chosen
amount; both tools read the same file.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tb_gpuadvisor.analysis.context import Analysis
from tb_gpuadvisor.checks import REGISTRY, all_checks
from tb_gpuadvisor.discovery import find_sessions
from tb_gpuadvisor.model import load_session

REPO = Path(__file__).resolve().parent.parent
PROFILED_STEPS = 6


def _write_capture(log_dir: str, sleep_ms: float) -> None:
    """Custom training loop on CPU whose input pipeline sleeps ``sleep_ms`` per batch."""
    import time

    import keras
    import numpy as np
    import tensorflow as tf

    def slow(features, labels):
        time.sleep(sleep_ms / 1000.0)
        return features, labels

    def slow_map(features, labels):
        features, labels = tf.numpy_function(slow, [features, labels], [tf.float32, tf.int64])
        return tf.ensure_shape(features, [None, 64]), tf.ensure_shape(labels, [None])

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(2048, 64)).astype("float32"), rng.integers(0, 4, 2048)
    batches = iter(tf.data.Dataset.from_tensor_slices((x, y)).batch(64).map(slow_map).repeat())
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(512, activation="relu"),
                              keras.layers.Dense(512, activation="relu"), keras.layers.Dense(4)])
    optimizer = keras.optimizers.Adam()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(features, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(features, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    for _ in range(3):
        train_step(*next(batches))
    tf.profiler.experimental.start(log_dir)
    for step in range(PROFILED_STEPS):
        with tf.profiler.experimental.Trace("train", step_num=step, _r=1):
            train_step(*next(batches))
    tf.profiler.experimental.stop()


def xprof_input_percent(xplane: Path, workdir: Path) -> float:
    """XProf's "% of the total step time ... waiting for input" from its overview page."""
    from xprof.convert import raw_to_tool_data

    copy = workdir / xplane.name
    shutil.copy(xplane, copy)   # XProf may write cached results beside its input
    data, _ = raw_to_tool_data.xspace_to_tool_data([str(copy)], "overview_page", {"use_saved_result": False})
    tables = json.loads(data)
    # The second table is the input analysis; its properties hold the conclusion sentence.
    props = next(t["p"] for t in tables if "input_conclusion" in t.get("p", {}))
    match = re.search(r"([\d.]+)\s*% of the total step time", props["input_conclusion"])
    assert match, props["input_conclusion"]
    return float(match.group(1))


@pytest.mark.parametrize("sleep_ms", [20.0, 4.0])
def test_input_percent_matches_xprof(tmp_path: Path, sleep_ms: float) -> None:
    pytest.importorskip("tensorflow")
    pytest.importorskip("xprof")
    log_dir = tmp_path / "log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "2"}
    result = subprocess.run([sys.executable, __file__, str(log_dir), str(sleep_ms)], capture_output=True,
                            text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    (ref,) = find_sessions(str(log_dir))
    analysis = Analysis(load_session(ref))
    assert analysis.model.steps.source == "custom_loop"
    all_checks()
    ours = REGISTRY["input_bound"].run(analysis).metrics["input_percent"]
    theirs = xprof_input_percent(Path(ref.host_file(ref.hosts[0])), tmp_path)
    assert abs(ours - theirs) <= 3.0, (ours, theirs)
    assert ours > (40.0 if sleep_ms >= 20 else 5.0)


if __name__ == "__main__":
    _write_capture(sys.argv[1], float(sys.argv[2]))
