"""The saving of an overlap fix is what the fix can hide: a gradient reduction can run only behind
the backward compute still to come when its gradients are ready, never behind the forward pass."""

from __future__ import annotations

from pathlib import Path

import pytest

from synth_kineto import kineto_trace, write_trace
from tb_gpuadvisor.input.discovery import find_sessions
from tb_gpuadvisor.multihost import build_report

ALL_REDUCE = ("allreduce", "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 1 << 20, 1500.0)
FORWARD = ("aten::linear", "aten::mm")
BACKWARD = ("autograd::engine::evaluate_function: MmBackward0", "MmBackward0", "aten::mm")


def _collectives(tmp_path: Path, chains: tuple[tuple[str, ...], ...]) -> dict:
    trace = kineto_trace(steps=4, kernels=12, kernel_us=400.0, collectives=(ALL_REDUCE, ALL_REDUCE), op_chains=chains)
    write_trace(tmp_path / "run" / "w.pt.trace.json", trace)
    session = build_report(find_sessions(str(tmp_path / "run")))["sessions"][0]
    return next(f for f in session["findings"] if f["check"] == "collectives")


def test_gradient_reductions_hide_only_behind_backward_compute(tmp_path):
    """Each step: 12 kernels of 400 us, the last 2 launched inside ``autograd::engine::evaluate_function``
    (backward), then two all-reduces of 1.5 ms with nothing alongside. By hand: 3 ms exposed; the last
    reduction stays exposed whatever the order (1.5 ms); the first could hide behind 4.8 ms of compute,
    but only 0.8 ms of it is backward (2 x 400 us): the fix saves 0.8 ms, not 1.5."""
    finding = _collectives(tmp_path, (FORWARD,) * 10 + (BACKWARD,) * 2)
    assert finding["metrics"]["exposed_collective_ms_per_step"] == pytest.approx(3.0, abs=0.01)
    assert finding["metrics"]["overlap_saving_ms_per_step"] == pytest.approx(0.8, abs=0.01)
    assert finding["estimated_savings_ms_per_step"] == pytest.approx(0.8, abs=0.01)
    assert "backward compute" in finding["summary"]


def test_without_backward_ops_the_bound_is_the_compute(tmp_path):
    """The same step with no backward op recorded (all 12 kernels forward): nothing tells which
    compute follows the gradients, so the bound is all compute not alongside a collective (4.8 ms)
    and the saving is the first reduction's 1.5 ms."""
    finding = _collectives(tmp_path, (FORWARD,))
    assert finding["metrics"]["overlap_saving_ms_per_step"] == pytest.approx(1.5, abs=0.01)
