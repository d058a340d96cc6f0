"""Shared test fixtures: where the real captures are; the synthetic builder and benchmarks on sys.path."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
sys.path.insert(0, str(TESTS))
sys.path.insert(0, str(REPO / "benchmarks"))

# Real captures from other people's GPUs live beside the repo, never inside it.
CORPUS = Path(os.environ.get("TB_GPUADVISOR_CORPUS", REPO.parent / "shared" / "corpus"))


@pytest.fixture(scope="session")
def corpus() -> Path:
    if not CORPUS.is_dir():
        pytest.skip(f"real-capture corpus not found at {CORPUS}")
    return CORPUS


@pytest.fixture
def corpus_copy(corpus: Path, tmp_path: Path):
    """Copy one corpus folder into tmp (tools like XProf write caches beside captures)."""

    def copy(relative: str) -> Path:
        target = tmp_path / "corpus" / relative
        shutil.copytree(corpus / relative, target)
        return target

    return copy


def _profile_torch_loop(logdir: Path, kinds: tuple[str, ...]) -> Path:
    """tests/torch_loop.py run once per KIND, each in its own process, into LOGDIR/<kind> (one
    TensorBoard run each, with tensorboard_trace_handler's own file names)."""
    pytest.importorskip("torch")
    for kind in kinds:
        result = subprocess.run([sys.executable, str(TESTS / "torch_loop.py"), str(logdir / kind), kind],
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
    return logdir


@pytest.fixture(scope="session")
def torch_logdir(tmp_path_factory) -> Path:
    """The slow DataLoader loop ("slow", num_workers=0) and its fixed twin ("fixed", 4 workers),
    profiled on the CPU once for every test that reads them."""
    return _profile_torch_loop(tmp_path_factory.mktemp("torch_logs"), ("slow", "fixed"))


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory) -> Path:
    """The same pair on a tiny MLP ("tiny_slow", "tiny_fixed"): with the loader fixed, the host's
    own dispatch sets the step."""
    return _profile_torch_loop(tmp_path_factory.mktemp("tiny_pair"), ("tiny_slow", "tiny_fixed"))
