"""The JAX behaviour of the corpus tests, on synthetic NVIDIA JAX captures (tests/synth_jax.py)."""

from __future__ import annotations

import re

from synth_jax import ATTENTION_STEP, CONV_STEP, build_jax_session
from tb_gpuadvisor.input.discovery import find_sessions
from tb_gpuadvisor.multihost import analyze_session

TF_WORDS = re.compile(r"\btf\.|keras|tensorflow|TF_[A-Z]|model\.compile|steps_per_execution")


def _session(tmp_path, **kwargs) -> dict:
    build_jax_session(tmp_path, **kwargs)
    (ref,) = find_sessions(str(tmp_path))
    return analyze_session(ref)


def _xla(session: dict) -> dict:
    return next(f for f in session["findings"] if f["check"] == "xla_ops")


def test_nvidia_conv_step_names_transposes_and_resharding(tmp_path):
    """Per step: input_transpose_fusion 500 us of 1000 us of kernels (50%), the sm90_xmma bf16
    conv 400 us (40%); 2 re-sharding copies of 640 KiB per call; PjitFunction(add) runs 5 times
    per step but is never taken for the step."""
    session = _session(tmp_path, kernels=CONV_STEP, reshard=True, helper_calls=5)
    assert session["framework"] == "jax"
    assert session["steps"]["count"] == 6 and session["steps"]["marker"] == "PjitFunction(train_step)"
    finding = _xla(session)
    assert finding["severity"] == "warning"
    assert "input_transpose_fusion" in finding["summary"]
    assert "12 device-to-device copies" in finding["summary"] and "640 KiB each" in finding["summary"]
    fixes = "\n".join(f["code"] + f["text"] for f in session["findings"] for f in f["fixes"])
    assert "jax.device_put" in fixes and not TF_WORDS.search(fixes)


def test_nvidia_attention_step_is_compute_bound(tmp_path):
    """Kernels run back to back: 1800 us of 1808 us of device time per step; the cuDNN flash
    attention backward kernel is 900/1800 = 50% of it."""
    session = _session(tmp_path, kernels=ATTENTION_STEP, host_gap_us=0)
    finding = _xla(session)
    assert "compute-bound" in finding["summary"]
    top = [e for e in finding["evidence"] if e["kind"] == "kernel"][0]
    assert "flash_bprop" in top["name"] and "50.0% of device time" in top["detail"]
    assert finding["metrics"]["collective_percent"] > 0       # the NCCL kernel is a collective


def test_op_by_op_program_is_one_window(tmp_path):
    """An op-by-op program: train_step runs a single 40 us kernel per call, PjitFunction(add)
    40 kernels of 2 us per train_step (80 us, the most device time). Both run one kernel per
    call (jitted single ops), so neither is a step: the capture is one window."""
    session = _session(tmp_path, kernels=CONV_STEP[3:], helper_calls=40, steps=3)
    assert session["steps"]["source"] == "window" and session["steps"]["count"] == 1
