"""Shared test fixtures: where the real captures are; the synthetic builder and benchmarks on sys.path."""

from __future__ import annotations

import os
import shutil
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
