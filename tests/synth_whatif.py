"""Planted what-if scenarios: synthetic captures whose step time after a fix is known.

Built on :mod:`synth` (``build_training_session``); each builder returns the capture
written to a folder, analysed, and the planted truth of the fix: the mean step time the
capture would have with that one cause removed or shrunk. Tests compare the replay's
prediction (``Analysis.what_if``) against it.

Synthetic GPUs record events through the whole capture, so the trust stage takes them as
traced throughout: the planted numbers are about attribution.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from synth import SynthSession, Truth, build_training_session

from tb_gpuadvisor.checks.context import Analysis
from tb_gpuadvisor.pipeline import analyse
from tb_gpuadvisor.input.discovery import find_sessions
from tb_gpuadvisor.pipeline import load_session


def analysed(session: SynthSession, folder: Path) -> Analysis:
    """Write SESSION to FOLDER and analyse it as fully traced."""
    session.write(folder)
    (ref,) = find_sessions(str(folder))
    model = load_session(ref)
    return analyse(model)


@dataclass
class Planted:
    """A capture and the mean step time (ms) the planted fix would give."""

    analysis: Analysis
    truth: Truth
    step_ms: float          # mean step now
    fixed_step_ms: float    # mean step with the planted cause fixed
    check: str              # the check whose fix it is

    @property
    def predicted_step_ms(self) -> float:
        return self.analysis.mean_step_ms - self.analysis.what_if.saving_ms(self.check)


def _planted(folder: Path, check: str, saving_ms: float, **planted) -> Planted:
    session = build_training_session(**planted)
    analysis = analysed(session, folder)
    step = session.truth.mean("duration_ms")
    return Planted(analysis, session.truth, step, step - saving_ms, check)


def input_wait(folder: Path, frac: float = 0.3) -> Planted:
    """Every step waits ``frac`` of its time for tf.data before the GPU gets work."""
    probe = build_training_session(input_wait_frac=frac, steps=6)
    return _planted(folder, "input_bound", probe.truth.mean("input_ms"), input_wait_frac=frac, steps=6)


def launch_bound(folder: Path, kernels: int = 400, launch_us: float = 12.0) -> Planted:
    """``kernels`` short kernels per step, each waiting ``launch_us`` for its own launch call.

    With launches batched, each kernel still costs the replay's 1 us: the fix saves
    ``kernels x (launch_us - 1)`` per step.
    """
    from tb_gpuadvisor.checks.kernel_launch import BATCHED_LAUNCH_US

    step_ms = 20.0
    # The launch gaps are spread over every device op (kernels plus the one H2D copy).
    ops = kernels + 1
    frac = ops * launch_us / 1000.0 / step_ms
    saving = ops * (launch_us - BATCHED_LAUNCH_US) / 1000.0
    return _planted(folder, "kernel_launch", saving, launch_frac=frac, kernels_per_step=kernels,
                    step_ms=step_ms, steps=5)


def fp32_matmuls(folder: Path, eligible: float = 0.6) -> Planted:
    """A device-bound Turing GPU spending ``eligible`` of its compute in fp32 MatMul/Conv
    kernels: 3x faster on Tensor Cores, the step loses two thirds of that time."""
    probe = build_training_session(eligible_frac=eligible, tensor_core_frac=0.0, cc=(7, 5), steps=5)
    saving = probe.truth.mean("eligible_ms", 0) * (1 - 1 / 3)
    return _planted(folder, "precision", saving, eligible_frac=eligible, tensor_core_frac=0.0, cc=(7, 5),
                    steps=5)


def exposed_copies(folder: Path, frac: float = 0.2) -> Planted:
    """Every step copies its batch (and a result back) with nothing running beside it; copies
    that overlap compute would take their time off the step."""
    probe = build_training_session(memcpy_frac=frac, d2h_bytes=1 << 20, steps=5)
    return _planted(folder, "memcpy", probe.truth.mean("copy_ms", 0), memcpy_frac=frac, d2h_bytes=1 << 20,
                    steps=5)


def straggler(folder: Path, gpus: int = 4, lighter: float = 0.6) -> Planted:
    """GPU:0 does 1/``lighter`` times the compute of the other replicas, which wait for it in
    their AllReduce; evened out, the step loses GPU:0's extra compute."""
    scale = {g: (1.0 if g == 0 else lighter) for g in range(gpus)}
    probe = build_training_session(gpus=gpus, gpu_compute_scale=scale, collective_frac=0.05, steps=5)
    extra = probe.truth.mean("compute_ms", 0) - probe.truth.mean("compute_ms", 1)
    return _planted(folder, "multi_gpu_imbalance", extra, gpus=gpus, gpu_compute_scale=scale,
                    collective_frac=0.05, steps=5)


def host_bound_fp32(folder: Path) -> Planted:
    """fp32 matmuls on a GPU idle most of the step (launch-bound): faster kernels save nothing."""
    return _planted(folder, "precision", 0.0, eligible_frac=0.6, tensor_core_frac=0.0, cc=(7, 5),
                    launch_frac=0.7, kernel_us=6.0, step_ms=12.0, steps=4)
