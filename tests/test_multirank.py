"""Ranks of a PyTorch DDP job, one GPU each in its own trace file: the session compares them."""

from __future__ import annotations

import pytest

from synth_kineto import kineto_trace, write_trace
from tb_gpuadvisor.discovery import find_sessions
from tb_gpuadvisor.multihost import analyze_session
from tb_gpuadvisor.multihost.engine import LocalEngine


def _imbalance(folder) -> dict:
    refs = find_sessions(str(folder))
    assert len(refs) == 1 and len(refs[0].hosts) == 2
    with LocalEngine(workers=1) as engine:
        session = analyze_session(refs[0], engine)
    return next(f for f in session["findings"] if f["check"] == "multi_gpu_imbalance")


def test_one_gpu_per_rank_is_compared_across_ranks(tmp_path):
    """Rank 1's kernels take 600 us against rank 0's 400 us (20 per step): rank 1 is the
    straggler, busy 12 ms per step against 8 ms, a third more; each file alone has one GPU."""
    write_trace(tmp_path / "run" / "rank-0.pt.trace.json", kineto_trace(steps=4, kernels=20, kernel_us=400.0))
    write_trace(tmp_path / "run" / "rank-1.pt.trace.json", kineto_trace(steps=4, kernels=20, kernel_us=600.0))
    finding = _imbalance(tmp_path)
    assert finding["severity"] != "not_applicable"
    assert finding["metrics"]["straggler_device"].startswith("rank-1/")
    assert finding["metrics"]["max_busy_ms_per_step"] == pytest.approx(12.0, rel=0.02)
    assert finding["metrics"]["min_busy_ms_per_step"] == pytest.approx(8.0, rel=0.02)
    assert finding["metrics"]["imbalance_percent"] == pytest.approx(33.3, abs=1)


def test_hta_ranks_are_set_side_by_side(corpus):
    """pytorch-hta-2ranks, one A100 per rank. Hand check (a blind expert, from the raw JSON):
    compute kernels 106 and 104 ms in rank 0's two steps, 136 and 136 ms in rank 1's, so rank 1
    computes longer; with copies and memsets outside NCCL, 105.8 vs 140.3 ms per step."""
    folder = corpus / "pytorch-hta-2ranks"
    if not folder.exists():
        pytest.skip("corpus trace absent")
    finding = _imbalance(folder)
    assert finding["metrics"]["straggler_device"].startswith("rank-1/")
    assert finding["metrics"]["active_gpus"] == 2
    assert finding["metrics"]["imbalance_percent"] == pytest.approx(25, abs=2)
