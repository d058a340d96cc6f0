"""Synthetic JAX captures on NVIDIA GPUs, shaped like the real AMD ones in the corpus.

No NVIDIA JAX capture is public, so these are built the way JAX's profiler writes them on
ROCm, with NVIDIA names: host calls ``PjitFunction(f)`` around ``jit_f:XLA GPU module``,
``cuLaunchKernel`` launches carrying ``correlation_id``, and kernels carrying ``hlo_op``,
``hlo_module`` and ``name`` (the JAX source op) with cuDNN ``sm90_xmma`` convolutions, cuBLAS
``nvjet`` GEMMs and NCCL collectives.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from synth import SpaceBuilder, gpu_props, write_session

PS_PER_US = 1_000_000
HOST = "h100-host"


@dataclasses.dataclass(frozen=True)
class JaxKernel:
    """One kernel of the jitted step: its CUDA name, HLO instruction, source op and duration."""

    name: str
    hlo_op: str
    source: str
    us: float


CONV_STEP = (
    JaxKernel("input_transpose_fusion", "input_transpose_fusion", "jit(train_step)/jit(main)/conv_general_dilated", 500),
    JaxKernel("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64",
              "cudnn-conv.1", "jit(train_step)/jit(main)/conv_general_dilated", 400),
    JaxKernel("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NTN", "gemm_fusion_dot.2", "jit(train_step)/jit(main)/dot_general", 60),
    JaxKernel("loop_add_fusion", "loop_add_fusion", "jit(train_step)/jit(main)/add", 40),
)
ATTENTION_STEP = (
    JaxKernel("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_3", "custom-call.2",
              "jit(train_step)/transpose(jvp())/dot_product_attention", 900),
    JaxKernel("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7", "custom-call.1",
              "jit(train_step)/jvp()/dot_product_attention", 450),
    JaxKernel("nvjet_hsh_256x128_64x4_1x2_h_bz_coopB_NNT", "gemm_fusion_dot", "jit(train_step)/jvp()/dot_general", 350),
    JaxKernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "all-reduce-start", "jit(train_step)/psum", 100),
)


def build_jax_session(logdir: Path, kernels: tuple[JaxKernel, ...], steps: int = 6,
                      host_gap_us: float = 30.0, reshard: bool = False, helper_calls: int = 0) -> Path:
    """A JAX program calling ``train_step`` STEPS times on one H100 (plus a small helper
    ``PjitFunction(add)`` HELPER_CALLS times per step); RESHARD re-shards an argument on
    every call (``cpp_pjit_shard_arg_fallback`` and two 640 KiB device-to-device copies)."""
    space = SpaceBuilder([HOST])
    gpu = space.gpu_plane(0, gpu_props((9, 0), "NVIDIA"))
    stream = gpu.line(1, "Stream #13(Compute)", 0)
    copies = gpu.line(2, "Stream #14(MemcpyD2D)", 0)
    host = space.plane("/host:CPU")
    python = host.line(1, "python", 0)
    launcher = host.line(2, "py_xla_execute/1", 0)
    t = 100 * PS_PER_US
    corr = 1
    for _ in range(steps):
        step_us = sum(k.us for k in kernels) + 50 * len(kernels)
        call_start = t
        if reshard:
            python.add("cpp_pjit_shard_arg_fallback", t + 5 * PS_PER_US, 150 * PS_PER_US)
            for i in range(2):
                copies.add("MemcpyD2D", t + (20 + 60 * i) * PS_PER_US, 40 * PS_PER_US,
                           {"memcpy_details": "size:655360 dest:1 async:1", "correlation_id": corr})
                corr += 1
            t += 200 * PS_PER_US
        launcher.add("jit_train_step:XLA GPU module", t, int(step_us * PS_PER_US))
        device_t = t + 20 * PS_PER_US
        for kernel in kernels:
            launcher.add("cuLaunchKernel", t, 5 * PS_PER_US, {"correlation_id": corr})
            stream.add(kernel.name, device_t, int(kernel.us * PS_PER_US), {
                "correlation_id": corr, "hlo_op": kernel.hlo_op, "hlo_module": "jit_train_step",
                "name": kernel.source, "tf_op": "XlaModule:", "kernel_details": "grid:132,1,1 block:256,1,1"})
            corr += 1
            t += 6 * PS_PER_US
            device_t += int((kernel.us + 2) * PS_PER_US)
        t = max(t, device_t)
        python.add("PjitFunction(train_step)", call_start, t - call_start)
        for _ in range(helper_calls):
            python.add("PjitFunction(add)", t, 8 * PS_PER_US)
            launcher.add("cuLaunchKernel", t + PS_PER_US, 3 * PS_PER_US, {"correlation_id": corr})
            stream.add("loop_add_fusion", t + 6 * PS_PER_US, 2 * PS_PER_US, {
                "correlation_id": corr, "hlo_op": "loop_add_fusion", "hlo_module": "jit_add",
                "name": "jit(add)/add", "tf_op": "XlaModule:"})
            corr += 1
            t += 10 * PS_PER_US
        t += int(host_gap_us * PS_PER_US)
    return write_session(logdir, "run", "2026_01_01_00_00_00", {HOST: space.build()})
