"""Stages pass values forward: trust reads the model and returns a view, never rewriting it.

The hand check behind each capture: keras-cnn-rtx5000 batch 64 holds 21 Keras steps whose last
one runs into the profiler's trace export (trust cuts it, so the export's events belong to
no step in trust's view while the model's candidate step still holds them); bert-8xv100 has
one step whose replica GPU:6 was traced at another time (trust ends the step with the
aligned replicas' work); the synthetic capture's planted 3.5x warm-up step is left out, so
trust's view has 5 steps where the model has 6.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from tb_gpuadvisor.checks.context import Analysis
from tb_gpuadvisor.pipeline import analyse
from tb_gpuadvisor.input.discovery import find_sessions
from tb_gpuadvisor.timeline import SessionModel
from tb_gpuadvisor.pipeline import load_session
from tb_gpuadvisor.report import describe, finish
from tb_gpuadvisor import stages
from tb_gpuadvisor.stages import ENV, stage


def _step_columns(model: SessionModel) -> list[np.ndarray]:
    return [table.step.copy() for host in model.hosts for table in (host.activity, *host.devices)]


def _report(analysis: Analysis) -> dict:
    return finish(*describe(analysis), analysis)


def _assert_trust_leaves_model(model: SessionModel) -> tuple[Analysis, Analysis]:
    steps, numbers, ends = model.steps, model.steps.number.copy(), model.steps.end_ps.copy()
    per_marker, columns = steps.per_marker, _step_columns(model)
    first, second = analyse(model), analyse(model)
    assert _report(first) == _report(second)
    assert model.steps is steps and steps.per_marker == per_marker
    assert np.array_equal(steps.number, numbers) and np.array_equal(steps.end_ps, ends)
    after = _step_columns(model)
    assert all(np.array_equal(a, b) for a, b in zip(columns, after))
    # Trust's view differs from the model, so a trust that wrote into it would be caught above.
    view = _step_columns(first.model)
    assert any(not np.array_equal(a, b) for a, b in zip(columns, view)) or len(first.model.steps) != len(steps)
    return first, second


@pytest.mark.parametrize("capture", ["keras-cnn-rtx5000/download64-*", "bert-8xv100"])
def test_analysis_twice_on_real_captures(corpus, capture):
    (run,) = corpus.glob(capture)
    (ref, *_) = find_sessions(str(run))
    first, _ = _assert_trust_leaves_model(load_session(ref))
    assert first.trust.export_cuts or first.trust.misaligned


def test_analysis_twice_with_a_left_out_step(tmp_path: Path):
    from synth import build_training_session

    build_training_session(steps=6, step_ms=20.0, first_step_factor=3.5).write(tmp_path)
    (ref,) = find_sessions(str(tmp_path))
    model = load_session(ref)
    first, _ = _assert_trust_leaves_model(model)
    assert len(model.steps) == 6 and len(first.model.steps) == 5 and len(first.trust.excluded) == 1


def test_stage_timings_only_when_asked(capsys, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    with stage("decode", "host0"):
        pass
    assert capsys.readouterr().err == ""
    monkeypatch.setenv(ENV, "1")
    with stage("decode", "host0"):
        pass
    line = capsys.readouterr().err
    assert line.startswith("tb-gpuadvisor timing: decode") and f"pid {os.getpid()}" in line and "host0" in line


def test_a_stage_hands_back_what_it_freed_even_when_it_fails(monkeypatch):
    """A stage's freed temporaries go back to the system at its end (malloc_trim where the C
    library is glibc), also when the stage raises: a bad host's stage must not keep them."""
    handed = []
    monkeypatch.setattr(stages, "return_freed_memory_if_worth", lambda: handed.append(True))
    with stage("trust"):
        pass
    with pytest.raises(ValueError):
        with stage("decode"):
            raise ValueError("bad bytes")
    with stage("decode", hand_back=False):      # what the next stages allocate again
        pass
    assert handed == [True, True]
