"""JAX captures get JAX advice: steps, XLA-level findings and fixes in the user's framework.

The corpus captures were checked by hand against the raw trace (events dumped with
``tb_gpuadvisor.input.xplane.schema.XSpace`` and summed per name); the numbers each test
expects are written in its docstring.  A real JAX capture is also written in a child
process (this file run as a script) so the test process never imports JAX.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tb_gpuadvisor.checks import all_checks, fixes
from tb_gpuadvisor.checks.finding import Fix
from tb_gpuadvisor.input.discovery import find_sessions
from tb_gpuadvisor.kinds import HostEventKind
from tb_gpuadvisor.vocab import hlo
from tb_gpuadvisor.input.xplane.classify import host_event_kind
from tb_gpuadvisor.model.kernels import is_tensor_core_kernel
from tb_gpuadvisor.multihost import analyze_session

REPO = Path(__file__).resolve().parent.parent
JAX_CAPTURES = ("jax-mi300x-amd", "jax-mi355x-amd", "jax-tpu-v6e")
CPU_STEPS = 6
# TensorFlow/Keras code or links; and JAX code, which a TensorFlow report must not show.
TF_WORDS = re.compile(r"\btf\.|keras|tensorflow|TF_[A-Z]|model\.compile|steps_per_execution|tf_function")
JAX_WORDS = re.compile(r"\bjax\b|\bjnp\.|\blax\.|XLA_PYTHON|docs\.jax\.dev")


def _session(path: Path) -> dict:
    refs = find_sessions(str(path))
    assert len(refs) == 1
    return analyze_session(refs[0])


def _finding(session: dict, check: str) -> dict:
    return next(f for f in session["findings"] if f["check"] == check)


def _fix_text(session: dict) -> str:
    return "\n".join(f"{fix['text']}\n{fix['code']}\n{fix['doc']}" for f in session["findings"] for fix in f["fixes"])


@pytest.mark.parametrize("name", JAX_CAPTURES)
def test_jax_corpus_gets_no_tensorflow_advice(corpus, name):
    session = _session(corpus / name)
    assert session["framework"] == "jax"
    assert not TF_WORDS.search(_fix_text(session))
    summaries = " ".join(f["summary"] for f in session["findings"])
    assert "tf.function" not in summaries and "tf.data" not in summaries


def test_conv_minimal_names_transpose_fusions_and_resharding(corpus):
    """Hand check (GPU:7 is the only device with kernels; 5 runs of 5 kernels, 3.586 ms in all):
    input_transpose_fusion 1.951 ms = 54.4%, the bf16 conv GEMM ``Cijk_..._BBS_..._MI16x16x16x1``
    (hlo_op cudnn-conv.1.0) 1.459 ms = 40.7%, Im3d2Col (same conv) 2.3%, input_transpose_fusion.1
    1.9%, loop_transpose_fusion 0.7%: conversions 57.1%, convolution 42.9%.  The host thread
    runs cpp_pjit_shard_arg_fallback once per call (10 calls, 6.13 ms in all) and GPU:0 runs
    53 CopyDeviceToDevice of 655360 bytes (640 KiB) each; no other device-to-device copies."""
    session = _session(corpus / "jax-mi300x-amd")
    # 10 calls; the 5 after GPU:7's trace ends are left out by the trust stage (tests/test_trust.py)
    assert session["trust"]["candidate_steps"] == 10 and session["steps"]["count"] == 5
    finding = _finding(session, "xla_ops")
    assert finding["severity"] == "warning"
    assert finding["metrics"]["conversion_percent"] == pytest.approx(57.1, abs=0.2)
    assert finding["metrics"]["convolution_percent"] == pytest.approx(42.9, abs=0.2)
    assert "input_transpose_fusion 54.4%" in finding["summary"]
    assert "cpp_pjit_shard_arg_fallback" in finding["summary"] and "53 device-to-device copies" in finding["summary"]
    assert "640 KiB each" in finding["summary"]
    codes = " ".join(fix["code"] for fix in finding["fixes"])
    assert "jax.device_put" in codes and "dimension_numbers" in codes


def test_te_fused_attn_is_compute_bound_and_names_its_kernels(corpus):
    """Hand check: GPU:0 runs 150 events, 12.13 ms of kernels in a 12.96 ms span (94%); the
    flash-attention backward kernel ``ck_tile::FmhaBwdDQDKDVKernel`` 4.279 ms = 35.3%, the
    forward ``FmhaFwdKernel`` 2.062 ms = 17.0%, gemm_fusion_dot.kd 1.713 ms = 14.1%.  The steps
    (5 calls of PjitFunction(loss_fn)) start at the host call, so the device is busy ~91% of them."""
    session = _session(corpus / "jax-mi355x-amd")
    assert session["steps"]["count"] == 5
    finding = _finding(session, "xla_ops")
    assert "compute-bound" in finding["summary"]
    assert finding["metrics"]["device_busy_percent"] >= 85
    kernels = [e for e in finding["evidence"] if e["kind"] == "kernel"]
    assert "FmhaBwdDQDKDVKernel" in kernels[0]["name"] and "35.3% of device time" in kernels[0]["detail"]
    assert "FmhaFwdKernel" in kernels[1]["name"]
    # compute-bound: the report leads with that, and launch (0.1 ms of a 2.6 ms step) is no warning
    assert session["bottleneck"]["bound_by"] == "device compute"
    assert session["findings"][0]["check"] == "xla_ops"
    assert _finding(session, "kernel_launch")["severity"] not in ("warning", "critical")


def test_tpu_step_time_comes_from_the_device(corpus):
    """Hand check: the TPU planes' "XLA Modules" line runs jit_f 100 times per TPU; TPU:0's runs
    have a median of ~784 ms, while the host's PjitFunction(f) windows (asynchronous dispatch)
    average 575.7 ms.  Copies (copy-start/copy-done of a host-offload test) take ~97% of the
    XLA op time, the broadcast_add fusions ~3%."""
    session = _session(corpus / "jax-tpu-v6e")
    steps = session["steps"]
    assert steps["source"] == "inferred_device" and steps["count"] == 100
    assert steps["marker"].startswith("jit_f(")
    assert 770 <= steps["mean_ms"] <= 800
    finding = _finding(session, "xla_ops")
    assert finding["metrics"]["copy_percent"] == pytest.approx(97.0, abs=0.5)
    assert "compute-bound" not in finding["summary"]


def test_hlo_categories():
    assert hlo.category("input_transpose_fusion.1") == hlo.TRANSPOSE
    assert hlo.category("loop_convert_fusion") == hlo.CONVERT
    assert hlo.category("gemm_fusion_dot.6") == hlo.GEMM
    assert hlo.category("cudnn-conv.1.0") == hlo.CONVOLUTION
    assert hlo.category("te_fused_attn_backward_ffi.18") == hlo.CUSTOM_CALL
    assert hlo.category("all-reduce-start.2") == hlo.COLLECTIVE
    assert hlo.category("copy-done.2") == hlo.COPY
    assert hlo.instruction("%copy-done.2 = f32[5]{0} copy-done((f32[5]) %copy-start.2)") == "copy-done.2"
    assert hlo.module_key("PjitFunction(forward_3d_conv)") == "jit_forward_3d_conv"
    assert hlo.module_key("jit_loss_fn:XLA GPU module") == "jit_loss_fn"
    assert hlo.module_key("__inference_train_function_123") is None


def test_vendor_vocabulary():
    """Launch APIs and matrix-unit kernels as the ROCm JAX captures and NVIDIA libraries name them."""
    for name in ("hipModuleLaunchKernel", "hipLaunchKernel", "hipExtModuleLaunchKernel", "cuLaunchKernel"):
        assert host_event_kind(name) == HostEventKind.LAUNCH, name
    assert is_tensor_core_kernel("Cijk_Ailk_Bljk_BBS_BH_MT256x128x64_MI16x16x16x1_SN_1LDSB0")
    assert is_tensor_core_kernel("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc")
    assert is_tensor_core_kernel("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NTN")
    assert not is_tensor_core_kernel("input_transpose_fusion")


def _check_fixes() -> list[Fix]:
    """Every Fix the check modules define, except the JAX forms named ``JAX_*`` (JAX only)."""
    all_checks()
    modules = [sys.modules[name] for name in list(sys.modules) if name.startswith("tb_gpuadvisor.checks.")]
    found = []
    for module in modules:
        for name, value in inspect.getmembers(module):
            values = value if isinstance(value, list) else [value]
            found += [v for v in values if isinstance(v, Fix) and not name.lstrip("_").startswith("JAX_")]
    return found


def test_every_fix_speaks_one_framework():
    """A plain Fix shows in both frameworks' reports, so it names neither; a Remedy's
    TensorFlow form has no JAX code and its JAX form no TensorFlow code."""
    found = _check_fixes()
    jax_forms = {id(fix.jax) for fix in found if isinstance(fix, fixes.Remedy)}
    assert len(found) > 30
    for fix in found:
        text = f"{fix.text}\n{fix.code}\n{fix.doc}"
        if isinstance(fix, fixes.Remedy):
            if fix.tensorflow:
                assert not JAX_WORDS.search(text), fix.text
            if fix.jax is not None:
                jax_text = f"{fix.jax.text}\n{fix.jax.code}\n{fix.jax.doc}"
                assert not TF_WORDS.search(jax_text), fix.jax.text
        elif id(fix) not in jax_forms:
            assert not TF_WORDS.search(text) and not JAX_WORDS.search(text), fix.text


def test_resolution_drops_other_framework():
    tf_only = fixes.GPU_PRIVATE_THREADS
    assert fixes.for_framework([tf_only, fixes.TF_FUNCTION, fixes.XLA_JIT], "jax") == [fixes.JAX_JIT_STEP]
    assert fixes.for_framework([fixes.jax_only(fixes.JAX_DONATE)], "tensorflow") == []
    assert fixes.for_framework([fixes.TF_FUNCTION], "unknown")[0].code.startswith("@tf.function")


# A real JAX capture, written by the installed JAX in a child process.


def _write_capture(log_dir: str) -> None:
    import jax
    import jax.numpy as jnp

    @jax.jit
    def train_step(w, x):
        loss, grad = jax.value_and_grad(lambda w: jnp.mean((x @ w) ** 2))(w)
        return w - 0.1 * grad, loss

    w, x = jnp.ones((256, 256)), jnp.ones((64, 256))
    w, loss = train_step(w, x)          # compile outside the trace
    loss.block_until_ready()
    with jax.profiler.trace(log_dir):
        for step in range(CPU_STEPS):
            with jax.profiler.StepTraceAnnotation("train", step_num=step):
                w, loss = train_step(w, x)
                loss.block_until_ready()


@pytest.fixture(scope="module")
def jax_logdir(tmp_path_factory) -> Path:
    if importlib.util.find_spec("jax") is None:
        pytest.skip("jax not installed")
    root = tmp_path_factory.mktemp("real_jax")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "JAX_PLATFORMS": "cpu"}
    result = subprocess.run([sys.executable, __file__, str(root)], capture_output=True, text=True,
                            timeout=120, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return root


def test_real_jax_capture_steps_and_fixes(jax_logdir):
    """StepTraceAnnotation writes one ``train`` event per step with _r=1 and step_num; XLA's
    CPU backend runs the program's instructions (dot, fusions) on its own thread pools."""
    session = _session(jax_logdir)
    assert session["framework"] == "jax"
    # every annotated step is a candidate; one far slower than the rest (often the first) is left out
    assert session["trust"]["candidate_steps"] == CPU_STEPS
    assert session["steps"]["count"] + session["steps"].get("excluded", 0) == CPU_STEPS
    assert set(session["steps"]["numbers"]) <= set(range(CPU_STEPS))
    assert not TF_WORDS.search(_fix_text(session))
    host = _finding(session, "host_overhead")
    assert "tf.function" not in host["summary"]
    assert host["metrics"]["other_idle_percent"] < 100.0   # the XLA CPU ops are the computation


if __name__ == "__main__":
    _write_capture(sys.argv[1])
