"""32-bit work on Tensor-Core GPUs in PyTorch traces (issue 38, part 2): each kernel linked to the
aten op whose runtime call launched it, its precision read from its name, and the precision and
tensor_core checks judging it per GPU generation (autocast float16 + GradScaler on Volta/Turing,
bfloat16 and TF32 on Ampere and newer), never offering a fix the run already applied."""

from __future__ import annotations

from pathlib import Path

import pytest
from synth_kineto import kineto_trace, write_trace

from tb_gpuadvisor.input.discovery import find_sessions
from tb_gpuadvisor.input.kineto import build as kineto
from tb_gpuadvisor.model import kernels
from tb_gpuadvisor.multihost import build_report
from tb_gpuadvisor.vocab import gpu, pytorch

CONV = ("aten::conv2d", "aten::convolution", "aten::_convolution", "aten::cudnn_convolution")
CONV_BACKWARD = ("autograd::engine::evaluate_function: ConvolutionBackward0", "ConvolutionBackward0",
                 "aten::convolution_backward")
LINEAR = ("aten::linear", "aten::addmm")
# A ResNet-like FP32 step on a Volta: the kernels in turn, each launched inside its op chain.
FP32_VOLTA = (
    ("volta_scudnn_128x64_relu_interior_nn_v1", CONV),                                       # eligible
    ("void implicit_convolve_sgemm<float, float, 128, 6, 7, 3, 3, 5, 1, false, true, true>()", CONV_BACKWARD),  # eligible
    ("volta_sgemm_128x64_nt", LINEAR),                                                       # eligible
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>()", ("aten::add_",)),
    # a copy matmul makes of its input: the op is a matmul, the kernel no matrix math
    ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda>()",
     ("aten::matmul", "aten::contiguous", "aten::copy_")),
    ("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, 512, true, 1>()", ("aten::batch_norm", "aten::cudnn_batch_norm")),
    ("volta_sgemm_64x32_sliced1x4_nn", ("CompiledFunction",)),                               # eligible: a cuBLAS GEMM
)
V100 = {"name": "Tesla V100-SXM2-16GB", "computeMajor": 7, "computeMinor": 0, "numSms": 80}
T4 = {"name": "Tesla T4", "computeMajor": 7, "computeMinor": 5, "numSms": 40}


def _trace(pairs, props: dict | None = None, repeat: int = 2, **kwargs) -> dict:
    """4 steps of PAIRS' kernels (400 us each, the GPU running them back to back), REPEAT times a step."""
    return kineto_trace(steps=4, kernels=len(pairs) * repeat, kernel_us=400, kernel_names=tuple(k for k, _ in pairs),
                        op_chains=tuple(chain for _, chain in pairs), device_properties=props, **kwargs)


def _findings(tmp_path: Path, trace: dict, name: str = "run") -> dict:
    write_trace(tmp_path / name / "w.pt.trace.json", trace)
    [session] = build_report(find_sessions(str(tmp_path / name)))["sessions"]
    return {f["check"]: f for f in session["findings"]} | {"_devices": session["devices"]}


def _read(tmp_path: Path, trace: dict):
    return kineto.read(str(write_trace(tmp_path / "link" / "w.pt.trace.json", trace)), "w")


def test_each_kernel_belongs_to_the_innermost_math_op_else_the_outermost_op(tmp_path):
    """The chains of FP32_VOLTA: conv kernels belong to aten::cudnn_convolution (innermost of four
    convolution ops), the backward one to aten::convolution_backward, the linear's to aten::addmm;
    the copy inside matmul > contiguous > copy_ to aten::matmul (the innermost math op), the
    batch-norm kernel to aten::batch_norm (no math op around it: the outermost).  A launch moved to
    another thread has no op there: it belongs to none."""
    trace = _trace(FP32_VOLTA, V100, repeat=1)
    launches = [e for e in trace["traceEvents"] if e.get("name") == "cudaLaunchKernel"]
    launches[-1]["tid"] = 99
    [dev] = _read(tmp_path, trace).devices
    op, ops = kernels.op_column(dev)
    owners = [ops[i] if i >= 0 else None for i in op.tolist()]
    expected = ["aten::cudnn_convolution", "aten::convolution_backward", "aten::addmm", "aten::add_",
                "aten::matmul", "aten::batch_norm", "CompiledFunction"] * 4
    expected[-1] = None
    assert owners == expected
    cls = kernels.classify(dev)
    eligible = [bool(x) for x in cls.eligible[:7]]
    assert eligible == [True, True, True, False, False, False, True]


def test_volta_fp32_is_told_autocast_float16_with_a_grad_scaler(tmp_path):
    """FP32_VOLTA twice a step: 14 kernels of 0.4 ms, 8 of them the 32-bit matrix math of
    convolution/linear ops or a cuBLAS GEMM: 3.2 of 5.6 ms of compute per step, none 16-bit.  The
    GPU runs them back to back (10 us launches), so at Volta's assumed 3x the replay saves about
    3.2 * 2/3 = 2.13 ms per step.  Before the launch link both checks saw no eligible work."""
    found = _findings(tmp_path, _trace(FP32_VOLTA, V100))
    precision, tensor_core = found["precision"], found["tensor_core"]
    assert precision["severity"] == "warning"
    assert precision["title"].startswith("fp32 matmuls and convolutions miss the Tensor Cores")
    assert precision["metrics"]["fp32_eligible_ms_per_step"] == pytest.approx(3.2, abs=0.01)
    assert precision["metrics"]["low_precision_percent"] == 0
    assert precision["estimated_savings_ms_per_step"] == pytest.approx(3.2 * 2 / 3, rel=0.1)
    code = "\n".join(fix["code"] for fix in precision["fixes"])
    assert "GradScaler" in code and "torch.float16" in code and "bfloat16" not in code and "allow_tf32" not in code
    assert "compute capability 7.0" in precision["summary"] and "float16 with a GradScaler" in precision["summary"]
    assert {e["detail"].split(",")[0] for e in precision["evidence"]} == {
        "32-bit kernel of aten::cudnn_convolution", "32-bit kernel of aten::convolution_backward",
        "32-bit kernel of aten::addmm", "32-bit kernel of CompiledFunction"}
    assert tensor_core["metrics"]["eligible_not_using_percent"] == 100
    assert {e["name"] for e in tensor_core["evidence"] if e["kind"] == "op"} == {
        "aten::cudnn_convolution", "aten::convolution_backward", "aten::addmm", "CompiledFunction"}
    assert any("GradScaler" in fix["code"] for fix in tensor_core["fixes"])


def test_turing_gets_float16_and_ampere_bfloat16_with_tf32(tmp_path):
    """The same work on a T4 (7.5: fp16 Tensor Cores only) is told float16 with a GradScaler; on an
    A100 (8.0) with cuDNN's fp32 kernels ("ampere_scudnn", TF32 off for convolutions) bfloat16
    autocast and TF32, at Ampere's assumed 2x: 3.2 * 1/2 = 1.6 ms per step."""
    turing = _findings(tmp_path, _trace(FP32_VOLTA, T4), "t4")["precision"]
    assert turing["severity"] == "warning" and any("GradScaler" in f["code"] for f in turing["fixes"])
    ampere_pairs = tuple((name.replace("volta_sgemm", "ampere_scudnn").replace("volta_", "ampere_"), chain)
                         for name, chain in FP32_VOLTA)
    ampere = _findings(tmp_path, _trace(ampere_pairs), "a100")["precision"]
    assert ampere["severity"] == "warning" and ampere["metrics"]["fp32_eligible_ms_per_step"] == pytest.approx(3.2, abs=0.01)
    code = "\n".join(fix["code"] for fix in ampere["fixes"])
    assert "torch.bfloat16" in code and "allow_tf32 = True" in code and "GradScaler" not in code
    assert ampere["estimated_savings_ms_per_step"] == pytest.approx(1.6, rel=0.1)


def test_work_already_on_tensor_cores_is_not_flagged(tmp_path):
    """TF32 (sm80 xmma tf32, CUTLASS s1688 tensorop) GEMMs on an A100 are 32-bit but already on
    Tensor Cores: no CUDA-core work to move and no TF32 switch to offer, only the next step (16-bit
    autocast, at twice TF32's rate).  A Volta run under autocast (h884 GEMMs and fp16 s884 cuDNN
    convolutions, 3 of 4 eligible kernels) with one fp32 sgemm left is not told to turn on mixed
    precision by either check."""
    tf32 = (("sm80_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x16_stage4", LINEAR),
            ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x64_32x6_nt_align1>()", ("aten::bmm",)))
    found = _findings(tmp_path, _trace(tf32), "tf32")
    assert found["precision"]["metrics"]["fp32_eligible_ms_per_step"] == 0
    assert found["precision"]["title"].startswith("TF32 matmuls and convolutions")
    assert all("allow_tf32" not in fix["code"] for fix in found["precision"]["fixes"])
    assert found["tensor_core"]["severity"] == "ok" and found["tensor_core"]["metrics"]["tensor_core_percent"] == 100
    amp = (("volta_h884gemm_64x64_ldg8_nn", LINEAR), ("volta_fp16_s884cudnn_fp16_256x128_ldg8_relu_f2f_exp_small_nhwc", CONV),
           ("volta_h884gemm_256x128_ldg8_nt", ("aten::bmm",)), ("volta_sgemm_128x64_nt", ("aten::mm",)))
    found = _findings(tmp_path, _trace(amp, V100), "amp")
    assert found["precision"]["severity"] == "ok"
    assert found["tensor_core"]["metrics"]["eligible_not_using_percent"] == pytest.approx(25, abs=0.5)
    assert not any("autocast" in fix["code"] for check in ("precision", "tensor_core") for fix in found[check]["fixes"])


def test_a_trace_without_device_properties_is_placed_by_its_kernels(tmp_path):
    """PyTorch 1.8 traces write no deviceProperties: volta_ kernels say a Volta (7.0), so the FP32
    convolutions are still 32-bit work on a Tensor Core GPU (before: "GPU has no Tensor Cores")."""
    found = _findings(tmp_path, _trace(FP32_VOLTA, old=True), "old")
    assert found["_devices"][0]["compute_capability"] == "7.0"
    assert found["precision"]["severity"] == "warning"
    assert found["tensor_core"]["metrics"]["eligible_ms_per_step"] == pytest.approx(3.2, abs=0.01)


def test_kernel_name_vocabulary():
    """Architecture tags give the least compute capability; the op vocabulary knows forward and
    backward math ops, not their neighbours."""
    assert gpu.compute_capability_of_kernels(["volta_sgemm_128x64_nn", "void at::native::add<float>()"]) == (7, 0)
    assert gpu.compute_capability_of_kernels(["cutlass_75_tensorop_bf16_s1688gemm", "sm90_xmma_gemm_bf16bf16"]) == (9, 0)
    assert gpu.compute_capability_of_kernels(["ncclKernel_AllReduce_RING_LL_Sum_float"]) is None
    kinds = {name: pytorch.tensor_core_op_kind(name) for name in (
        "aten::cudnn_convolution_backward_weight", "aten::addmm", "aten::_scaled_dot_product_flash_attention",
        "aten::_cudnn_rnn", "aten::einsum", "aten::_conv_depthwise2d", "aten::add_", "aten::batch_norm")}
    assert kinds == {"aten::cudnn_convolution_backward_weight": "convolution", "aten::addmm": "matmul",
                     "aten::_scaled_dot_product_flash_attention": "attention", "aten::_cudnn_rnn": "rnn",
                     "aten::einsum": "einsum", "aten::_conv_depthwise2d": None, "aten::add_": None,
                     "aten::batch_norm": None}
    assert not gpu.LIBRARY_MATRIX_KERNEL.search("void fbgemm_gpu::permute_2D_data_kernel<false, int>()")


def _corpus_session(corpus: Path, relative: str) -> dict:
    [session] = build_report(find_sessions(str(corpus / relative)))["sessions"]
    return session


def test_resnet50_fp32_on_a_volta(corpus):
    """pytorch-resnet50-dataloader/num_workers_0: no deviceProperties; its kernels are volta_sgemm/
    volta_scudnn/implicit_convolve_sgemm and cuDNN's fp32 dgrad/wgrad engines: ResNet-50 training in
    FP32 on a V100-class GPU.  Hand check (a script over the raw JSON, not the product): for each
    "Kernel" event, its "Runtime" event of the same args.correlation; the "Operator" events on that
    thread around the runtime call; a kernel whose chain holds aten::cudnn_convolution*/mm/addmm and
    whose name holds scudnn/sgemm/dgrad_engine/wgrad_alg/winograd/gemm counts, and so does one
    without a runtime event whose name holds scudnn/sgemm/dgrad_engine/wgrad_alg/winograd; launched
    (or, without a launch, started) between the first ProfilerStep#N's start and the last one's end:
    413.7 + 21.0 ms over 6 steps = 72.45 ms per step (the product 72.71: kernels of the last step
    that run past its end count with it).  Before the launch link: 0.00 ms and "GPU has no Tensor Cores"."""
    session = _corpus_session(corpus, "pytorch-resnet50-dataloader/num_workers_0")
    assert session["devices"][0]["compute_capability"] == "7.0"
    found = {f["check"]: f for f in session["findings"]}
    precision = found["precision"]
    assert precision["severity"] == "warning"
    assert precision["metrics"]["fp32_eligible_ms_per_step"] == pytest.approx(72.45, rel=0.03)
    assert any("GradScaler" in fix["code"] for fix in precision["fixes"])
    assert precision["estimated_savings_ms_per_step"] > 1
    ops = {e["name"] for e in found["tensor_core"]["evidence"] if e["kind"] == "op"}
    assert {"aten::cudnn_convolution", "aten::cudnn_convolution_backward_input",
            "aten::cudnn_convolution_backward_weight"} <= ops


def test_tracediff_v100_sgemms_of_a_compiled_region(corpus):
    """pytorch-a100-tracediff/test is rank 3 on a V100 (deviceProperties 7.0) whose GEMMs are
    volta_sgemm launched from torch.compile's CompiledFunction/CompiledFunctionBackward (no aten op
    around them) and a few from aten::mm/addmm.  Hand check over the raw JSON as in the ResNet-50
    test: kernels whose name holds "gemm" (not fbgemm, not gemv) launched between the first
    ProfilerStep#N's start and the last one's end: 196.8 + 2.4 ms over 6 steps = 33.20 ms per step,
    all fp32 on CUDA cores.  Before: 0.00 ms and "No Tensor-Core-eligible work"."""
    session = _corpus_session(corpus, "pytorch-a100-tracediff/test")
    found = {f["check"]: f for f in session["findings"]}
    assert found["precision"]["metrics"]["fp32_eligible_ms_per_step"] == pytest.approx(33.20, rel=0.03)
    assert found["precision"]["title"].startswith("fp32 matmuls and convolutions miss the Tensor Cores")
    assert found["tensor_core"]["metrics"]["eligible_not_using_percent"] == 100


@pytest.mark.parametrize("relative", ["pytorch-mi300x-ddp-resnet18", "pytorch-h100-qwen", "pytorch-h100-owlv2"])
def test_16bit_runs_are_not_told_to_use_autocast(corpus, relative):
    """The MI300X ResNet-18 runs bf16 MIOpen xdlops convolutions (igemm_*_gtcx3_nhwc_bf16: matrix
    cores) under autocast; qwen runs bf16 sm90 xmma GEMMs and FlashAttention (flash_fwd_kernel on
    bfloat16: Tensor Cores); owlv2 bf16 CUTLASS/xmma GEMMs.  Neither check offers mixed precision,
    and every eligible kernel is on the matrix units (counted by hand: no 32-bit GEMM or convolution
    kernel in these traces apart from qwen's one 3.5 us cutlass_80_simt_sgemm from aten::bmm)."""
    found = {f["check"]: f for f in _corpus_session(corpus, relative)["findings"]}
    assert found["precision"]["severity"] == "ok"
    assert found["tensor_core"]["severity"] == "ok"
    assert found["tensor_core"]["metrics"]["tensor_core_percent"] > 99.9


def test_an_sgemm_beside_tf32_gemms_does_not_say_tf32_is_off(tmp_path):
    """cuBLAS still runs an ampere_sgemm for some shapes with TF32 allowed (pytorch-hta-2ranks: 4.1 ms
    of ampere_sgemm beside CUTLASS s1688 TF32 GEMMs from the same aten::mm/bmm ops).  One sgemm of
    four GEMMs: not "TF32 is off", but 0.8 ms per step of fp32 GEMMs that bfloat16 autocast would
    put on Tensor Cores."""
    pairs = (("ampere_sgemm_128x64_nn", ("aten::mm",)),
             *[("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x64_32x6_nt_align1>()", ("aten::bmm",))] * 3)
    precision = _findings(tmp_path, _trace(pairs), "mixed")["precision"]
    assert not precision["title"].startswith("TF32 is off")
    assert precision["metrics"]["fp32_eligible_ms_per_step"] == pytest.approx(0.8, abs=0.01)
    assert any("torch.bfloat16" in fix["code"] for fix in precision["fixes"])


def test_library_gemms_count_without_any_op_recorded(tmp_path):
    """A trace whose runtime calls have no cpu_op around them (record_shapes off and ops filtered,
    or a compiled graph): the cuBLAS/cuDNN kernels' names still make 4 of the 7 kernels eligible
    (volta_scudnn, implicit_convolve_sgemm, two volta_sgemm): 3.2 ms per step, as with the ops."""
    pairs = tuple((name, ()) for name, _ in FP32_VOLTA)
    found = _findings(tmp_path, _trace(pairs, V100), "no_ops")
    assert found["precision"]["metrics"]["fp32_eligible_ms_per_step"] == pytest.approx(3.2, abs=0.01)


def test_mi300x_fp32_tensile_gemms_are_told_bfloat16_autocast(tmp_path):
    """On an MI300X (deviceProperties 9.4, HIP launches), rocBLAS/Tensile fp32 GEMMs without an MFMA
    shape ("Cijk_..._S_MT64x64x16_SN_...") from aten::addmm/bmm are 32-bit work off the Matrix Cores:
    2 of 4 kernels, 0.8 ms per step; the fix is bfloat16 autocast (no GradScaler, no TF32 on AMD).
    A bf16 MFMA GEMM ("_BBS_..._MI16x16x16x1") is on them: a quarter of compute is 16-bit, but the
    eligible work is mostly fp32, so autocast is not on (before: "25% of GPU compute runs in 16-bit", ok)."""
    pairs = (("Cijk_Ailk_Bljk_S_MT64x64x16_SN_1LDSB0_GRVW4", LINEAR), ("Cijk_Alik_Bljk_S_MT64x64x16_SN_1LDSB0_GRVW4", ("aten::bmm",)),
             ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>()", ("aten::add_",)),
             ("Cijk_Ailk_Bljk_BBS_BH_MT128x128x64_MI16x16x16x1_SN_1LDSB1", ("aten::mm",)))
    found = _findings(tmp_path, _trace(pairs, repeat=1, hip=True), "mi300")
    precision, tensor_core = found["precision"], found["tensor_core"]
    assert found["_devices"][0]["vendor"] == "AMD"
    assert precision["metrics"]["fp32_eligible_ms_per_step"] == pytest.approx(0.8, abs=0.01)
    code = "\n".join(fix["code"] for fix in precision["fixes"])
    assert "torch.bfloat16" in code and "GradScaler" not in code and "allow_tf32" not in code
    assert tensor_core["title"].endswith("misses Matrix Cores")
    assert tensor_core["metrics"]["tensor_core_percent"] == pytest.approx(100 / 3, abs=0.5)


_TF32_CONV = ("sm86_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_stage4_"
              "warpsize2x2x1_g1_tensor16x8x8_kernel")
_CONV_CHAIN = ("aten::conv2d", "aten::convolution", "aten::_convolution", "aten::cudnn_convolution")
_RTX_4090 = {"name": "NVIDIA GeForce RTX 4090", "computeMajor": 8, "computeMinor": 9, "numSms": 128}


def _precision(tmp_path: Path, **kwargs) -> dict:
    write_trace(tmp_path / "run" / "w.pt.trace.json", kineto_trace(steps=4, kernels=20, **kwargs))
    session = build_report(find_sessions(str(tmp_path / "run")))["sessions"][0]
    return session


def test_tf32_convolutions_are_not_the_end_of_the_precision_road(tmp_path):
    """An fp32 convolution net on an RTX 4090 (cc 8.9) whose 20 convolutions per step run as TF32
    (cuDNN's ``..._tf32f32_tf32f32_f32_...`` Tensor Core kernels, 400 us each, the GPU busy
    throughout). By hand: 8 ms of TF32 per step; 16-bit runs at twice TF32's rate, so autocast
    saves about 4 ms, and channels_last is the convolutions' layout for it."""
    session = _precision(tmp_path, kernel_us=400.0, kernel_names=(_TF32_CONV,), op_chains=(_CONV_CHAIN,),
                         device_properties=_RTX_4090)
    first = session["findings"][0]
    assert first["check"] == "precision" and first["severity"] == "warning"
    assert first["metrics"]["tf32_ms_per_step"] == pytest.approx(8.0, abs=0.01)
    assert first["estimated_savings_ms_per_step"] == pytest.approx(4.0, abs=0.05)
    codes = [fix["code"] for fix in first["fixes"]]
    assert "torch.autocast" in codes[0] and "bfloat16" in codes[0]
    assert any("channels_last" in code for code in codes)


def test_a_little_tf32_is_information(tmp_path):
    """The same net where the TF32 convolutions are 2 of 20 kernels (10% of compute): worth knowing,
    not a warning; channels_last still named for the convolutions."""
    names = (_TF32_CONV,) + ("void at::native::vectorized_elementwise_kernel<4, add>()",) * 9
    session = _precision(tmp_path, kernel_us=400.0, kernel_names=names, op_chains=(_CONV_CHAIN,) + (("aten::add",),) * 9,
                         device_properties=_RTX_4090)
    finding = next(f for f in session["findings"] if f["check"] == "precision")
    assert finding["severity"] == "info" and finding["metrics"]["tf32_ms_per_step"] == pytest.approx(0.8, abs=0.01)
