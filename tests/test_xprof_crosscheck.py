"""Our input_percent against XProf's on CPU captures where both measure the same thing.

XProf finds steps in custom loops annotated with ``_r=1`` and, on CPU-only captures,
reports the share of step time spent waiting for input on its overview page. A real
capture is written by TensorFlow in a child process (so this test process never imports
TensorFlow); both tools read the same file.

How XProf (2.24) arrives at its figure, and why the capture is shaped as it is:

- Input time of a step is the part of the step marker's span covered by any grouped
  ``IteratorGetNext*`` event (input waits outrank host compute where they overlap);
  ours is the same union of iterator waits, so the numerators agree.
- The percentage is total input time over total step time across its steps, a ratio
  of sums like ours. Its step time is the marker's own duration, ours the step period
  (until the next marker starts, as the catalogue defines it); between consecutive
  markers of this loop there are only microseconds, so the two barely differ.
- When it finds more than five steps it drops the first and the last as possibly
  incomplete. Markers with ``_r`` are recorded only when a step ran entirely inside the
  capture, so we keep every step: that is a deliberate difference, and with waits that
  vary from step to step it moves the two figures apart by several points. Profiling
  five steps keeps XProf's step set equal to ours, and the test asserts that it is.
- Its conclusion sentence quotes the input share only when the loop is at least
  moderately input-bound (otherwise it may quote the "All Others" share), so XProf's
  figure is read from its own step table, and checked against the sentence when the
  sentence is about input.

The tf.data map sleeps for a chosen time and runs when the training loop asks for the
next batch (tf.data's automatic prefetch is switched off): every step then waits at
least that long, whatever the machine's load, so the planted wait is known.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tb_gpuadvisor.pipeline import analyse
from tb_gpuadvisor.checks import REGISTRY, all_checks
from tb_gpuadvisor.input.discovery import find_sessions
from tb_gpuadvisor.pipeline import load_session
from tb_gpuadvisor.timeline import PS_PER_MS

REPO = Path(__file__).resolve().parent.parent
# XProf's overview page drops the first and last step when it finds more than five.
PROFILED_STEPS = 5


def _write_capture(log_dir: str, sleep_ms: float) -> None:
    """Custom training loop on CPU whose input pipeline sleeps ``sleep_ms`` per batch, on demand."""
    import time

    import tensorflow as tf
    from tf_loop import classifier, labelled_rows, profile_custom_loop

    def slow(features, labels):
        time.sleep(sleep_ms / 1000.0)
        return features, labels

    def slow_map(features, labels):
        features, labels = tf.numpy_function(slow, [features, labels], [tf.float32, tf.int64])
        return tf.ensure_shape(features, [None, 64]), tf.ensure_shape(labels, [None])

    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    dataset = labelled_rows(2048, 64).batch(64).map(slow_map).repeat()
    model = classifier(64, [512, 512])
    profile_custom_loop(log_dir, model, iter(dataset.with_options(options)),
                        warmup=3, steps=PROFILED_STEPS)


def xprof_input(xplane: Path, workdir: Path) -> tuple[float, list[int]]:
    """XProf's share of step time waiting for input, and the step numbers it measured.

    Both come from the step table of its overview page (step time and input time per
    step); the share is total input over total step time, as XProf computes it.
    """
    from xprof.convert import raw_to_tool_data

    copy = workdir / xplane.name
    shutil.copy(xplane, copy)   # XProf may write cached results beside its input
    data, _ = raw_to_tool_data.xspace_to_tool_data([str(copy)], "overview_page", {"use_saved_result": False})
    table = next(t for t in json.loads(data) if "input_conclusion" in t.get("p", {}))
    columns = [c["id"] for c in table["cols"]]
    rows = [dict(zip(columns, (cell.get("v") for cell in row["c"]))) for row in table["rows"]]
    assert rows, table["p"]["input_conclusion"]
    percent = 100.0 * sum(r["infeedTimeMs"] for r in rows) / sum(r["stepTimeMs"] for r in rows)
    sentence = re.search(r"([\d.]+)\s*% of the total step time sampled is waiting for input",
                         table["p"]["input_conclusion"])
    if sentence:
        assert abs(float(sentence.group(1)) - percent) <= 0.1, (table["p"]["input_conclusion"], percent)
    # Step rows are labelled "<marker name> <step number>".
    return percent, [int(r["stepnum"].rsplit(" ", 1)[-1]) for r in rows]


@pytest.mark.parametrize("sleep_ms", [20.0, 1.5])
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
    analysis = analyse(load_session(ref))
    steps = analysis.model.steps
    assert steps.source == "custom_loop"
    assert steps.number.tolist() == list(range(PROFILED_STEPS))
    all_checks()
    metrics = REGISTRY["input_bound"].run(analysis).metrics
    theirs, their_steps = xprof_input(Path(ref.host_file(ref.hosts[0])), tmp_path)
    assert their_steps == steps.number.tolist()
    assert abs(metrics["input_percent"] - theirs) <= 3.0, (metrics["input_percent"], theirs)
    # Each step waits for its batch at least as long as the map sleeps.
    primary = analysis.breakdown.primary
    assert np.all(primary.parts["input"] >= sleep_ms * PS_PER_MS), primary.parts["input"].tolist()
    assert metrics["input_ms_per_step"] >= sleep_ms


if __name__ == "__main__":
    _write_capture(sys.argv[1], float(sys.argv[2]))
