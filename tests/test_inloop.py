"""The framework-free core of the in-loop advice: warm-up, the step window, the analysis process.

A fake tracer stands in for the profiler: it records what it was asked to do and,
when stopped, writes a synthetic capture where a real profiler would.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from synth import build_training_session, write_bad_session, write_session

import tb_gpuadvisor
from tb_gpuadvisor.inloop import (
    AUTO_WARMUP_CAP, AdvisorFindingError, BackgroundAnalysis, Phase, StepWindow, Tracer, WarmupClock,
    failing_findings,
)


class FakeProfiler:
    """Records start/stop/marker calls; ``stop`` writes SESSION (or nothing) under the log dir."""

    def __init__(self, input_wait_frac: float = 0.0, fail_start: bool = False) -> None:
        self.calls: list[tuple] = []
        self.input_wait_frac = input_wait_frac
        self.fail_start = fail_start
        self.log_dir = ""

    def start(self, log_dir: str) -> None:
        if self.fail_start:
            raise RuntimeError("another profiler is already running")
        self.log_dir = log_dir
        self.calls.append(("start",))

    def stop(self) -> None:
        self.calls.append(("stop",))
        session = build_training_session(steps=4, marker="r", input_wait_frac=self.input_wait_frac)
        write_session(self.log_dir, ".", "2026_01_01_00_00_00", {"host": session.space})

    @contextlib.contextmanager
    def marker(self, step: int):
        self.calls.append(("enter", step))
        yield
        self.calls.append(("exit", step))

    def tracer(self) -> Tracer:
        return Tracer(self.start, self.stop, self.marker)


def _run(window: StepWindow, begins: list[int], room_of=None) -> None:
    for step in begins:
        window.begin(step, room=room_of(step) if room_of else None)


def test_fixed_warmup_then_lead_in_then_marked_steps(tmp_path: Path):
    fake = FakeProfiler()
    window = StepWindow(str(tmp_path), fake.tracer(), steps=3, warmup_steps=2, analyse=False)
    _run(window, list(range(10)))
    assert fake.calls == [("start",), ("enter", 3), ("exit", 3), ("enter", 4), ("exit", 4),
                          ("enter", 5), ("exit", 5), ("stop",)]
    assert window.profiled_numbers == [3, 4, 5] and window.phase is Phase.ANALYSING
    assert Path(window.session_dir).parent == tmp_path / "plugins" / "profile"


def test_steps_per_execution_counts_every_batch(tmp_path: Path):
    fake = FakeProfiler()
    window = StepWindow(str(tmp_path), fake.tracer(), steps=4, warmup_steps=2, analyse=False)
    _run(window, list(range(0, 20, 2)))
    assert window.profiled_numbers == [4, 6] and window.profiled == 4
    assert fake.calls[-1] == ("stop",) and fake.calls[-2] == ("exit", 6)


def test_capture_waits_for_an_epoch_with_room_for_it(tmp_path: Path):
    """Lead-in, 3 steps and the step that stops the capture need 5 steps of an epoch."""
    fake = FakeProfiler()
    window = StepWindow(str(tmp_path), fake.tracer(), steps=3, warmup_steps=1, analyse=False)
    _run(window, list(range(5)), room_of=lambda step: 5 - step)
    window.interrupt()                       # end of the first epoch: warm-up ended too late in it
    assert fake.calls == []
    _run(window, list(range(5)), room_of=lambda step: 5 - step)
    assert window.profiled_numbers == [1, 2, 3] and fake.calls[0] == ("start",) and fake.calls[-1] == ("stop",)


def test_auto_warmup_needs_settled_times_and_stops_waiting_at_the_cap():
    clock = WarmupClock("auto")
    for seconds in (5.0, 0.30, 0.10, 0.20):     # the first step (tracing) never counts
        clock.record(seconds, 1)
    assert not clock.settled()
    for seconds in (0.10, 0.11, 0.10):
        clock.record(seconds, 1)
    assert clock.settled()
    noisy = WarmupClock("auto")
    for i in range(AUTO_WARMUP_CAP):
        assert not noisy.settled()
        noisy.record(0.1 if i % 2 else 0.3, 1)
    assert noisy.settled()


def test_advice_printed_and_fail_on_raises_after_the_analysis(tmp_path: Path, capsys):
    fake = FakeProfiler(input_wait_frac=0.4)
    window = StepWindow(str(tmp_path), fake.tracer(), steps=2, warmup_steps=0, fail_on="critical")
    _run(window, list(range(4)))
    with pytest.raises(AdvisorFindingError, match="input_bound"):
        window.finish()
    out = capsys.readouterr().out
    assert "1. [CRITICAL]" in out and "check: input_bound" in out
    assert f"tensorboard --logdir {tmp_path}" in out


def test_no_finding_no_raise(tmp_path: Path, capsys):
    fake = FakeProfiler()
    window = StepWindow(str(tmp_path), fake.tracer(), steps=2, warmup_steps=0, fail_on="critical")
    _run(window, list(range(4)))
    window.finish()
    assert window.report["sessions"][0]["steps"]["count"] == 4
    assert "capture:" in capsys.readouterr().out


def test_peers_defer_the_analysis_to_finish_where_every_process_meets(tmp_path: Path):
    """A process of a multi-process job analyses only after PEERS returns (every rank has stopped
    its capture), and calls it whether it captured or not, so no rank waits for one that never will."""
    met: list[bool] = []
    fake = FakeProfiler(input_wait_frac=0.4)
    tracer = fake.tracer()
    tracer.peers = lambda: met.append(window.analysis is None)    # no analysis before every rank is in
    window = StepWindow(str(tmp_path), tracer, steps=2, warmup_steps=0, print_report=False)
    _run(window, list(range(4)))
    assert window.phase is Phase.ANALYSING and window.analysis is None
    window.finish()
    assert met == [True] and window.report["sessions"][0]["findings"][0]["check"] == "input_bound"
    short = StepWindow(str(tmp_path / "short"), tracer, steps=2, warmup_steps=10, print_report=False)
    _run(short, list(range(3)))
    short.finish()
    assert len(met) == 2 and short.problem.startswith("training ended after")


def test_a_trace_file_is_analysed_with_the_other_ranks_of_its_cycle(tmp_path: Path):
    """Rank 0's trace names the session: the files every rank wrote in the same profiling cycle
    (within 30 s), not an earlier cycle in the same run folder."""
    from synth_kineto import kineto_trace, write_trace

    from tb_gpuadvisor.inloop import _sessions_of

    for name in ("vm_rank0.1700000000000", "vm_rank1.1700000002000", "vm_rank0.1600000000000"):
        write_trace(tmp_path / f"{name}.pt.trace.json", kineto_trace(steps=2))
    (ref,) = _sessions_of(str(tmp_path / "vm_rank0.1700000000000.pt.trace.json"))
    assert ref.hosts == ("vm_rank0", "vm_rank1")


def test_a_profiler_that_cannot_start_leaves_training_alone(tmp_path: Path, capsys):
    window = StepWindow(str(tmp_path), FakeProfiler(fail_start=True).tracer(), steps=2, warmup_steps=0,
                        fail_on="warning")
    _run(window, list(range(5)))
    window.finish()
    assert "no advice: could not start the profiler: another profiler" in capsys.readouterr().out


def test_training_shorter_than_the_warmup_says_so(tmp_path: Path, capsys):
    window = StepWindow(str(tmp_path), FakeProfiler().tracer(), steps=5, warmup_steps=10)
    _run(window, list(range(3)))
    window.finish()
    assert "training ended after 3 steps, before warm-up was over" in capsys.readouterr().out


def test_a_broken_capture_is_a_problem_not_an_exception(tmp_path: Path):
    host_file = write_bad_session(tmp_path, ".", "s1", "garbage")
    report, problem = BackgroundAnalysis(str(host_file.parent)).result()
    assert problem is None and report["sessions"][0]["errors"]
    report, problem = BackgroundAnalysis(str(tmp_path / "missing")).result()
    assert report is None and problem.startswith("the analysis failed: ")


@pytest.mark.parametrize("option", [{"steps": 0}, {"steps": 11}, {"warmup_steps": -1},
                                    {"warmup_steps": "soon"}, {"fail_on": "info"}])
def test_bad_options_fail_at_construction(tmp_path: Path, option: dict):
    with pytest.raises(ValueError):
        StepWindow(str(tmp_path), FakeProfiler().tracer(), **option)


def test_low_confidence_findings_never_fail_the_run():
    report = {"sessions": [{"findings": [
        {"check": "a", "severity": "critical", "confidence": "low"},
        {"check": "b", "severity": "warning", "confidence": "high"},
        {"check": "c", "severity": "warning"},
    ]}]}
    assert failing_findings(report, "critical") == []
    assert [f["check"] for f in failing_findings(report, "warning")] == ["b", "c"]


def test_the_helpers_do_not_load_the_cli():
    """The fail-on rule sits below both the CLI and the in-loop helpers (checks/base.py): a
    training script that imports the helpers never loads the command line (argparse, the
    engines' flags) it does not use."""
    root = str(Path(tb_gpuadvisor.__file__).parent.parent)
    code = "import sys, tb_gpuadvisor.inloop; print('tb_gpuadvisor.cli' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root,
                         env=dict(os.environ, PYTHONPATH=root))
    assert out.stdout.strip() == "False"
