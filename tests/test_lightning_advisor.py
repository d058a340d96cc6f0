"""``tb_gpuadvisor.lightning.AdvisorCallback`` on a real Lightning ``Trainer`` on the CPU.

The README's Lightning example runs with ``fail_on="critical"`` added (in its own process, in a
temporary folder, one thread: it prints the advice, then raises), beside its fixed twin (the
example as written without the planted 1 ms sleep per sample). Its 16-sample batches are made
in the training process (num_workers=0): a slow batch waits about 16 ms beside ~10 ms of compute.
"""

from __future__ import annotations

import importlib.util
import json
import struct
from pathlib import Path

import pytest
from advice_runs import ONE_THREAD, assert_failed_on_input, example_runs, printed_checks, readme_example

from tb_gpuadvisor.cli import main

pytestmark = pytest.mark.skipif(importlib.util.find_spec("lightning") is None, reason="lightning not installed")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    return example_runs(readme_example("from tb_gpuadvisor.lightning import"), tmp_path_factory.mktemp("lightning"),
                        "AdvisorCallback(steps=5)", as_written=False, **ONE_THREAD)


def test_readme_example_prints_the_slow_dataloader_first(runs):
    """The example with fail_on="critical": the advice is printed before it raises."""
    result, _ = runs["slow_fail"]
    assert printed_checks(result.stdout)[0] == "input_bound", result.stdout + result.stderr[-3000:]


def test_capture_is_in_the_loggers_version_folder_and_the_cli_reads_it(runs, capsys):
    _, cwd = runs["slow_fail"]
    version = cwd / "logs" / "lightning" / "lightning_logs" / "version_0"
    (trace,) = version.glob("*.pt.trace.json")
    assert f"capture: {trace}" in runs["slow_fail"][0].stdout
    assert main(["analyze", str(cwd / "logs" / "lightning"), "--format", "json"]) == 0
    (session,) = json.loads(capsys.readouterr().out)["sessions"]
    assert session["run"] == "lightning_logs/version_0" and session["trust"]["candidate_steps"] == 5
    first = next(f for f in session["findings"] if f["check"] != "profile_quality")
    assert first["check"] == "input_bound" and first["severity"] == "critical"


def _scalars(folder: Path) -> dict[str, float]:
    """The last value of each scalar in FOLDER's TensorBoard event files, read record by record
    (length, its CRC, the Event, its CRC): tensorboard's own readers load TensorFlow into this
    process, after which an import of torch._dynamo crashes."""
    from tensorboard.compat.proto import event_pb2

    found = {}
    for path in folder.glob("events.out.tfevents.*"):
        data, at = path.read_bytes(), 0
        while at < len(data):
            (length,) = struct.unpack_from("<Q", data, at)
            event = event_pb2.Event.FromString(data[at + 12:at + 12 + length])
            at += 12 + length + 4
            found.update((v.tag, v.simple_value) for v in event.summary.value)
    return found


def test_the_advice_numbers_go_through_the_trainers_logger(runs):
    _, cwd = runs["slow_fail"]
    scalars = _scalars(cwd / "logs" / "lightning" / "lightning_logs" / "version_0")
    assert {"gpuadvisor/step_ms", "gpuadvisor/findings", "gpuadvisor/top_saving_ms"} <= set(scalars)
    assert scalars["gpuadvisor/top_saving_ms"] >= 5.0      # the ~16 ms input wait


def test_fixed_twin_has_no_input_finding(runs):
    result, _ = runs["fixed"]
    assert result.returncode == 0, result.stderr[-3000:]
    assert "advice from the profiled steps" in result.stdout
    assert "input_bound" not in printed_checks(result.stdout)


def test_fail_on_critical_fails_fit(runs):
    assert_failed_on_input(runs["slow_fail"][0])
