"""Real before/after pairs: the replay's predicted step time against the step time measured
after the fix, on demo jobs trained with TensorFlow on the CPU (demo/fixed.py)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from demo.fixed import PAIRS, Pair
from tb_gpuadvisor.checks.context import Analysis
from tb_gpuadvisor.discovery import find_sessions
from tb_gpuadvisor.model import load_session

REPO = Path(__file__).resolve().parent.parent
PROFILED_STEPS, WARMUP_STEPS = 5, 3
TOLERANCE = 0.20


@pytest.fixture(scope="module")
def pairs_logdir(tmp_path_factory) -> Path:
    if importlib.util.find_spec("tensorflow") is None or importlib.util.find_spec("keras") is None:
        pytest.skip("the demo pairs need tensorflow and keras (pip install '.[demo]')")
    logdir = tmp_path_factory.mktemp("pairs")
    command = [sys.executable, "-m", "demo.fixed", "--logdir", str(logdir), "--steps", str(PROFILED_STEPS),
               "--warmup", str(WARMUP_STEPS)]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return logdir


def _analysis(logdir: Path, run: str) -> Analysis:
    (ref,) = find_sessions(str(logdir / run))
    return Analysis(load_session(ref))


def prediction(logdir: Path, pair: Pair) -> tuple[float, float, float]:
    """(step before, predicted step after the fix, measured step after the fix), ms."""
    before = _analysis(logdir, pair.before)
    after = _analysis(logdir, pair.after)
    predicted = before.mean_step_ms - before.what_if.saving_ms(pair.check)
    return before.mean_step_ms, predicted, after.mean_step_ms


@pytest.mark.parametrize("pair", PAIRS, ids=[p.before for p in PAIRS])
def test_predicted_step_after_the_fix_matches_the_measured_one(pairs_logdir: Path, pair: Pair) -> None:
    before, predicted, measured = prediction(pairs_logdir, pair)
    print(f"{pair.name}: {before:.2f} ms -> predicted {predicted:.2f} ms, measured {measured:.2f} ms")
    assert measured < before        # the fix is real
    assert predicted == pytest.approx(measured, rel=TOLERANCE)
