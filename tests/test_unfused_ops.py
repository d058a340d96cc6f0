"""unfused_ops (issue 38: PyTorch advice an expert would sign): a GPU busy most of the step whose
time goes to chains of small eager element-wise, reduction and concatenation kernels is told to
torch.compile the model, with the saving replayed (chained kernels twice as fast); a GEMM-bound
step, a compiled model and a launch-bound (idle) GPU are not."""

from __future__ import annotations

from pathlib import Path

import pytest
from synth_kineto import kineto_trace, write_trace

from tb_gpuadvisor.checks.base import Severity
from tb_gpuadvisor.checks.finding import ACTIONABLE
from tb_gpuadvisor.checks.context import Analysis
from tb_gpuadvisor.input.discovery import find_sessions
from tb_gpuadvisor.model import kernels
from tb_gpuadvisor.pipeline import analyse, load_session
from tb_gpuadvisor.multihost import build_report
from tb_gpuadvisor.vocab import pytorch

H100 = {"name": "NVIDIA H100 80GB HBM3", "computeMajor": 9, "computeMinor": 0, "numSms": 132}
GEMM = ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_"
        "kernel__5x_cublas", ("aten::linear", "aten::addmm"))
# An RMSNorm and a residual add as eager PyTorch runs them: one kernel per op.
RMS_NORM = (
    ("void at::native::vectorized_elementwise_kernel<4, at::native::bfloat16_copy_kernel_cuda>()", ("aten::to", "aten::_to_copy", "aten::copy_")),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::pow_tensor_scalar_kernel>()", ("aten::pow",)),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, "
     "unsigned int, float, 4>>()", ("aten::mean",)),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::rsqrt_kernel_cuda>()", ("aten::rsqrt",)),
    ("void at::native::elementwise_kernel<128, 4, at::native::BinaryFunctor<float, float, float, MulFunctor<float>>>()",
     ("aten::mul",)),
    ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::(anonymous namespace)::OpaqueType<2u>, "
     "unsigned int, 4, 64, 64>()", ("aten::cat",)),
)
TRITON = (("triton_poi_fused__to_copy_add_mul_pow_0", ("Torch-Compiled Region: 0/0",)),
          ("triton_red_fused_mean_pow_rsqrt_1", ("Torch-Compiled Region: 0/0",)),
          ("triton_poi_fused_cat_2", ("Torch-Compiled Region: 0/0",)))


def _trace(pairs, durations, **kwargs) -> dict:
    """4 steps of PAIRS' kernels (DURATIONS us each, in turn) 8 times a step, on an H100."""
    defaults = {"steps": 4, "kernels": 8 * len(pairs), "launch_us": 5.0, "ahead": True}
    return kineto_trace(kernel_names=tuple(k for k, _ in pairs), op_chains=tuple(c for _, c in pairs),
                        kernel_durations=durations, device_properties=H100, **{**defaults, **kwargs})


def _analysis(tmp_path: Path, trace: dict, name: str) -> Analysis:
    [ref] = find_sessions(str(write_trace(tmp_path / name / "w.pt.trace.json", trace).parent))
    return analyse(load_session(ref))


def _findings(path: Path) -> dict:
    [session] = build_report(find_sessions(str(path)))["sessions"]
    return {f["check"]: f for f in session["findings"]}


def test_eager_chains_on_a_busy_gpu_are_fused_by_the_replay_as_in_a_fused_twin(tmp_path):
    """Per layer a 100 us bf16 GEMM, then six 40 us eager kernels (an RMSNorm's cast, pow, mean,
    rsqrt, mul and a KV-cache cat): 240 of 340 us in one chain, the host a step ahead (the GPU
    paces the steps).  The twin runs the chain at 20 us a kernel (fused: memory crossed half as
    often); the replay's saving is the measured difference of the two steps, within 25%."""
    pairs = (GEMM, *RMS_NORM)
    eager = _trace(pairs, (100.0,) + (40.0,) * 6)
    fused = _trace(pairs, (100.0,) + (20.0,) * 6)
    measured = _analysis(tmp_path, eager, "eager").mean_step_ms - _analysis(tmp_path, fused, "fused").mean_step_ms
    finding = _findings(tmp_path / "eager")["unfused_ops"]
    assert finding["severity"] == "warning"
    assert finding["metrics"]["unfused_percent"] == pytest.approx(100 * 240 / 340, abs=2)
    assert finding["metrics"]["unfused_kernels_per_step"] == 48
    assert measured == pytest.approx(8 * 120 / 1000, rel=0.05)
    assert finding["estimated_savings_ms_per_step"] == pytest.approx(measured, rel=0.25)
    codes = [fix["code"] for fix in finding["fixes"]]
    assert codes[0] == "model = torch.compile(model)"
    assert any("torch.cat" in code for code in codes)        # the cat kernels: a static KV cache
    assert finding["confidence"] == "medium"         # how far a chain fuses is assumed
    ops = [e for e in finding["evidence"] if e["kind"] == "op"]
    assert len(ops) == 5 and "aten::mean" in {e["name"] for e in ops}      # six ops of 0.32 ms a step each
    assert all(e["value"] == pytest.approx(8 * 40 / 1000) for e in ops)


def test_a_training_step_is_not_told_about_a_kv_cache(tmp_path):
    """The same chains with a backward op among them (training): torch.compile, but the cat
    kernels are no KV cache to preallocate."""
    backward = (RMS_NORM[4][0], ("autograd::engine::evaluate_function: MulBackward0", "MulBackward0", "aten::mul"))
    finding = _findings(write_trace(tmp_path / "train" / "w.pt.trace.json",
                                    _trace((GEMM, *RMS_NORM, backward), (100.0,) + (40.0,) * 7)).parent)["unfused_ops"]
    assert finding["severity"] == "warning"
    assert [fix["code"] for fix in finding["fixes"]] == ["model = torch.compile(model)"]


def test_a_gemm_bound_step_is_quiet(tmp_path):
    """A 1 ms GEMM, then an add and a mul of 20 us: the chain is 40 of 1040 us (3.8%)."""
    finding = _findings(write_trace(tmp_path / "gemm" / "w.pt.trace.json",
                                    _trace((GEMM, *RMS_NORM[3:5]), (1000.0, 20.0, 20.0))).parent)["unfused_ops"]
    assert finding["severity"] == "ok" and not finding["fixes"]
    assert finding["metrics"]["unfused_percent"] == pytest.approx(100 * 40 / 1040, abs=0.5)


def test_a_compiled_model_is_not_told_to_compile(tmp_path):
    """Inductor's Triton kernels (3 x 40 us) beside an eager chain of two 40 us kernels left out of
    the compiled region: compiled (120 us of Triton against 80 us eager), so no torch.compile fix;
    the 27% still eager is said as info, with the graph-break hunt."""
    finding = _findings(write_trace(tmp_path / "compiled" / "w.pt.trace.json",
                                    _trace((GEMM, *TRITON, *RMS_NORM[:2]), (100.0,) + (40.0,) * 5)).parent)["unfused_ops"]
    assert finding["severity"] == "info"
    assert finding["title"].startswith("torch.compile is in use")
    assert all("torch.compile(model" not in fix["code"] for fix in finding["fixes"])
    assert "torch._dynamo.explain" in finding["fixes"][0]["code"]


def test_a_launch_bound_idle_gpu_is_left_to_kernel_launch(tmp_path):
    """5 us element-wise kernels each launched by a 20 us call and waited for (no host lead):
    the GPU idles most of the step, so the launches are the fix (kernel_launch), not fusion."""
    found = _findings(write_trace(tmp_path / "launch" / "w.pt.trace.json",
                                  _trace(RMS_NORM, (5.0,), launch_us=20.0, ahead=False)).parent)
    assert found["unfused_ops"]["severity"] == "ok"
    assert found["unfused_ops"]["title"].startswith("GPU idle most of the step")
    assert found["kernel_launch"]["severity"] in ("warning", "critical")


def test_chains_need_two_small_memory_bound_kernels_in_a_row_on_one_stream(tmp_path):
    """GEMM, add, GEMM, add, mul, GEMM: only the add-mul pair chains; a 150 us add is not small."""
    pairs = (GEMM, RMS_NORM[3], GEMM, RMS_NORM[3], RMS_NORM[4], GEMM, RMS_NORM[3], RMS_NORM[4])
    a = _analysis(tmp_path, _trace(pairs, (100.0, 30.0, 100.0, 30.0, 30.0, 100.0, 150.0, 30.0)), "mask")
    dev = a.primary_device
    chained = kernels.unfused_chains(dev) & (dev.step >= 0)
    assert int(chained.sum()) == 2 * 8 * 4
    assert set(dev.dur_ps[chained].tolist()) == {30_000_000}
    assert not pytorch.is_eager_memory_bound_kernel(GEMM[0])
    assert not pytorch.is_eager_memory_bound_kernel(TRITON[0][0]) and pytorch.is_inductor_kernel(TRITON[0][0])


def test_qwen_on_h100_is_told_to_compile(corpus):
    """pytorch-h100-qwen, by hand from the raw JSON: the model's one step runs from the first
    ProfilerStep#6 (ts 1428625731896.179) to the last kernel's end, 49.38 ms; its 1459 kernels
    (all on stream 7, median 29.12 us) sorted by ts, the ATen element-wise/reduce/cat kernels
    under 100 us with such a kernel before or after them: 1082 kernels, 24616.1 us (2853.4 us of
    them CatArrayBatchedCopy); every memory-bound ATen kernel 28599.7 of 45134.0 us of kernel time
    (63.4%); the GPU is 92% busy.  The replay (chains 2x faster) gives 6.0 ms: the host's launches
    pace what is left (no fix of the chains alone goes below them), under half the chains' time.
    The GPU also idles 5.4% of the step behind launches (kernel_launch's launch_percent, from 3%):
    compile in "reduce-overhead" mode, CUDA graphs as well; the first fix of the report."""
    [session] = build_report(find_sessions(str(corpus / "pytorch-h100-qwen")))["sessions"]
    assert session["first_fix"]["check"] == "unfused_ops"
    finding = next(f for f in session["findings"] if f["check"] == "unfused_ops")
    metrics = finding["metrics"]
    assert finding["severity"] == "warning"
    assert metrics["unfused_ms_per_step"] == pytest.approx(24.616, abs=0.01)
    assert metrics["unfused_kernels_per_step"] == 1082
    assert metrics["memory_bound_percent"] == pytest.approx(63.37, abs=0.05)
    assert metrics["median_kernel_us"] == pytest.approx(29.12, abs=0.01)
    assert 3.0 < finding["estimated_savings_ms_per_step"] <= metrics["unfused_ms_per_step"] / 2
    codes = [fix["code"] for fix in finding["fixes"]]
    assert codes[0] == 'model = torch.compile(model, mode="reduce-overhead")'
    assert "torch.cat" in codes[1]          # inference whose cat kernels are 11.6% of the chained time


# Expert first fixes elsewhere: the DataLoader (nw0, owlv2), autocast (nw4), launches (b200: GPU 13%
# busy), hipFree/the allocator (MI300X), communication (HTA, tracediff).
@pytest.mark.parametrize("relative", [
    "pytorch-resnet50-dataloader/num_workers_0", "pytorch-resnet50-dataloader/num_workers_4",
    "pytorch-a100-tracediff/control", "pytorch-a100-tracediff/test", "pytorch-b200-eager",
    "pytorch-h100-owlv2", "pytorch-mi300x-ddp-resnet18", "pytorch-hta-2ranks"])
def test_quiet_where_the_first_fix_is_something_else(corpus, relative):
    """Chains take 0.4-13% of these steps (ResNet-50 4-5%, tracediff 10-13% with 0.2-0.4 ms
    replayed), or the GPU idles most of the step (b200 14%, MI300X 9%, HTA 45%, owlv2 47% busy)."""
    finding = _findings(corpus / relative)["unfused_ops"]
    assert Severity(finding["severity"]) not in ACTIONABLE and Severity(finding["severity"]) is not Severity.INFO
