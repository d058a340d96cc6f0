"""``tb_gpuadvisor.transformers.AdvisorCallback`` on a real Hugging Face ``Trainer`` on the CPU.

The README's example (a 2-layer BERT built from a config: nothing is downloaded, and
HF_HUB_OFFLINE=1 makes sure) runs with ``fail_on="critical"`` added, in its own process (it
prints the advice, then raises), beside its fixed twin (the example as written without the
planted 2 ms sleep per sample). Its 16-sample batches are made in the training process: a slow
step waits about 32 ms for them, beside some 40 ms of the tiny model's step.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
from advice_runs import ONE_THREAD, assert_failed_on_input, example_runs, printed_checks, readme_example

from tb_gpuadvisor.cli import main

pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers") is None or
                                importlib.util.find_spec("accelerate") is None,
                                reason="transformers (with accelerate) not installed")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    return example_runs(readme_example("from tb_gpuadvisor.transformers import"),
                        tmp_path_factory.mktemp("transformers"), "AdvisorCallback(steps=5)",
                        as_written=False, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", **ONE_THREAD)


def test_readme_example_prints_the_slow_dataloader_first(runs):
    """The example with fail_on="critical": the advice is printed before it raises."""
    result, _ = runs["slow_fail"]
    assert printed_checks(result.stdout)[0] == "input_bound", result.stdout + result.stderr[-3000:]


def test_capture_is_beside_the_trainers_scalars_and_the_cli_reads_it(runs, capsys):
    _, cwd = runs["slow_fail"]
    logdir = cwd / "out" / "hf" / "runs"
    (trace,) = logdir.glob("*.pt.trace.json")
    assert f"capture: {trace}" in runs["slow_fail"][0].stdout
    # Transformers' TensorBoard callback wrote its scalars into a run folder of the same logdir.
    assert list(logdir.glob("*/events.out.tfevents.*"))
    assert main(["analyze", str(logdir), "--format", "json"]) == 0
    (session,) = json.loads(capsys.readouterr().out)["sessions"]
    assert session["run"] == "runs" and session["trust"]["candidate_steps"] == 5
    first = next(f for f in session["findings"] if f["check"] != "profile_quality")
    assert first["check"] == "input_bound" and first["severity"] == "critical"


def test_fixed_twin_has_no_input_finding(runs):
    result, _ = runs["fixed"]
    assert result.returncode == 0, result.stderr[-3000:]
    assert "advice from the profiled steps" in result.stdout
    assert "input_bound" not in printed_checks(result.stdout)


def test_fail_on_critical_fails_train(runs):
    assert_failed_on_input(runs["slow_fail"][0])
