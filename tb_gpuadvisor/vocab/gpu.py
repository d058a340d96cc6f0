"""What GPU vendor names mean, whatever framework launched the work.

Kernel names are the CUDA/HIP symbols the libraries launched (cuBLAS, cuDNN, CUTLASS, rocBLAS/
hipBLASLt "Cijk" Tensile kernels, NCCL/RCCL) and host calls are the CUDA/HIP runtime and driver
APIs; the same names appear in TensorFlow, JAX and PyTorch captures, so every adapter and stage
reads them from here.
"""

from __future__ import annotations

import re

from tb_gpuadvisor.kinds import DeviceEventKind, HostEventKind

# Copies and memsets as the device planes name them ("MemcpyH2D", "Memcpy HtoD", "CopyHostToDevice"),
# keyed by the name without spaces, lower-cased.
COPY_BY_NAME = {
    "memcpyh2d": DeviceEventKind.MEMCPY_H2D, "memcpyhtod": DeviceEventKind.MEMCPY_H2D,
    "copyhosttodevice": DeviceEventKind.MEMCPY_H2D,
    "memcpyd2h": DeviceEventKind.MEMCPY_D2H, "memcpydtoh": DeviceEventKind.MEMCPY_D2H,
    "copydevicetohost": DeviceEventKind.MEMCPY_D2H,
    "memcpyd2d": DeviceEventKind.MEMCPY_D2D, "memcpydtod": DeviceEventKind.MEMCPY_D2D,
    "copydevicetodevice": DeviceEventKind.MEMCPY_D2D,
    "memcpyp2p": DeviceEventKind.MEMCPY_P2P, "memcpypeer": DeviceEventKind.MEMCPY_P2P,
    "copypeertopeer": DeviceEventKind.MEMCPY_P2P,
}
COPY_PREFIXES = ("memcpy", "copy")
MEMSET_PREFIX = "memset"

# Kernels of the communication libraries: NCCL/RCCL, DeepEP (dpsk::ep / deep_ep) and NVSHMEM.
# They move data between GPUs; counting them as compute would hide a communication bottleneck.
COMMUNICATION_KERNEL = re.compile(r"nccl|rccl|dpsk::ep|deep_ep|nvshmem", re.IGNORECASE)
# A device event that moves data between GPUs: a communication library's kernel or one of the
# collective instructions XLA names its own kernels after (all-reduce, collective-permute, send/recv).
COLLECTIVE_EVENT = re.compile(COMMUNICATION_KERNEL.pattern + r"|allreduce|all_reduce|all-reduce|allgather|all-gather|"
                              r"reducescatter|reduce-scatter|reduce_scatter|alltoall|all-to-all|"
                              r"collective-permute|sendrecv", re.IGNORECASE)
# Collective communication kernels (NCCL/RCCL, XLA's own collectives), as the kernel checks read them.
COLLECTIVE_KERNEL = re.compile(
    r"nccl|rccl|all[-_]?reduce|all[-_]?gather|reduce[-_]?scatter|all[-_]?to[-_]?all"
    r"|collective[-_]?permute",
    re.IGNORECASE)
# AllReduce kernels; NCCL's generic kernels ("ncclKernel_..."/"ncclDevKernel_...") name the
# collective in their template arguments.
ALLREDUCE_KERNEL = re.compile(r"all[-_]?reduce", re.IGNORECASE)
# The kind of a collective, from its kernel's name (ncclDevKernel_AllReduce_Sum_f32_RING_LL,
# ncclKernel_AllToAll..., ncclDevKernel_SendRecv, RCCL's the same) or the name its framework
# gives the call (allreduce, _allgather_base, reduce_scatter_tensor, alltoall_base); first match
# wins, so reduce-scatter is tested before reduce.  DeepEP's dispatch/combine kernels exchange
# tokens between experts' GPUs: an all-to-all.
COLLECTIVE_KINDS = (
    ("all-reduce", ALLREDUCE_KERNEL),
    ("reduce-scatter", re.compile(r"reduce[-_]?scatter", re.IGNORECASE)),
    ("all-gather", re.compile(r"all[-_]?gather", re.IGNORECASE)),
    ("all-to-all", re.compile(r"all[-_]?to[-_]?all|dpsk::ep|deep_ep", re.IGNORECASE)),
    ("send/recv", re.compile(r"send|recv", re.IGNORECASE)),
    ("broadcast", re.compile(r"broadcast", re.IGNORECASE)),
    ("reduce", re.compile(r"reduce", re.IGNORECASE)),
)


def collective_kind(name: str) -> str:
    """"all-reduce", "all-to-all", ... for a collective's kernel or call name; "other" if none."""
    return next((kind for kind, pattern in COLLECTIVE_KINDS if pattern.search(name)), "other")

# Launch and copy APIs per vendor, as the host plane names them: CUDA driver/runtime
# (cuLaunchKernel, cudaLaunchKernel, cuMemcpy*Async, cuGraphLaunch) and HIP (hipModuleLaunchKernel
# for XLA's own kernels, hipLaunchKernel for library kernels, hipExtModuleLaunchKernel for
# hipBLASLt/Tensile, hipMemcpyDtoDAsync, hipMemsetAsync), checked on the ROCm JAX captures.
LAUNCH_CALL = re.compile(r"^(cu|cuda|hip|hipModule|hipExtModule)(Launch|Memcpy|Memset|Graph(Exec)?Launch)|"
                         r"^(cuLaunchKernel|cudaLaunchKernel|hipLaunchKernel|hipExtLaunchKernel)")
# Host calls that block until the device has finished work queued before them.
SYNC_CALL = re.compile(r"Synchronize|cudaDeviceSynchronize|hipDeviceSynchronize|StreamWait", re.IGNORECASE)
# Of those, the calls that hold the host itself until the device reaches them; a stream told to wait
# for an event (cudaStreamWaitEvent, hipStreamWaitEvent) holds only that stream: the host returns at once.
HOST_WAIT_CALL = re.compile(r"Synchronize", re.IGNORECASE)


def wait_kind(name: str) -> HostEventKind | None:
    """SYNC for a call that holds the host until the device reaches it, STREAM_WAIT for one that
    makes a stream wait, else None."""
    if HOST_WAIT_CALL.search(name):
        return HostEventKind.SYNC
    return HostEventKind.STREAM_WAIT if SYNC_CALL.search(name) else None

# Tensor Core (matrix unit) kernels. cuBLAS/cuDNN encode the MMA shape in the name:
# h884/s884 (Volta), h1688/s1688 (Turing), 16816/i8816 (Ampere and later), plus hmma/xmma/
# tensorop (CUTLASS and cuDNN "xmma" engines, sm80_/sm90_ prefixes). XProf's list stops at
# Ampere; Hopper kernels are recognised here too: warpgroup MMA ("wgmma"), cuBLAS's "nvjet"
# GEMMs and cuDNN/CUTLASS "sm90_" xmma/gmma engines, otherwise every Hopper GEMM would be
# reported as "not on Tensor Cores". AMD matrix cores show up in rocBLAS/hipBLASLt (Tensile)
# names as "_MI<m>x<n>x<k>" (MFMA instruction shape, e.g. "Cijk_..._MT256x128x64_MI16x16x16x1"
# in the MI300X JAX capture), as "mfma"/"wmma" in composable-kernel and RDNA kernel names.
TENSOR_CORE_KERNEL = re.compile(
    r"h884|s884|h1688|s1688|16816|i8816|hmma|xmma|wgmma|gmma|tensorop|nvjet"
    r"|sm(?:80|86|89|90|100|120)_.*(?:gemm|conv|fprop|dgrad|wgrad)|_MI\d+x\d+x\d+|mfma|wmma",
    re.IGNORECASE)

# 16-bit (and narrower) floating point and int8 kernels. XProf counts bf16 kernels as
# 32-bit compute; bf16 is the 16-bit format Ampere/Hopper GPUs and TPUs are fed with under
# "mixed_bfloat16", so counting it as 32-bit would tell a user who already enabled mixed
# precision to enable it. Tokens: Eigen/CUDA half types, "fp16"/"f16"/"bf16" in cuBLAS/cuDNN
# names, h-prefixed MMA shapes (half inputs), fp8 (e4m3/e5m2), int8 MMA, cuBLAS "nvjet_"
# type triplets starting with h/b/e (half, bf16, fp8 inputs), and Tensile (AMD) type codes.
LOW_PRECISION_KERNEL = re.compile(
    r"(?<![a-z])half|__half|bfloat16|bf16|(?<![a-z])fp16|(?<![a-z0-9])f16|f16f16|fp8|e4m3|e5m2"
    r"|(?<![a-z])h884|(?<![a-z])h1688|(?<![a-z])h16816|hgemm|i8816|(?<![a-z])int8"
    r"|nvjet_(?:sm\d+_)?[hbe][a-z]{2}_|Cijk_\w*?_(?:HH|HHS|HSS|BB|BBS|BSS|I8I\w*)_",
    re.IGNORECASE)

# Kernels that convert between the NHWC and NCHW layouts.
LAYOUT_KERNEL = re.compile(r"nhwcToNchw|nchwToNhwc|NHWCToNCHW|NCHWToNHWC", re.IGNORECASE)

# Kernels a GEMM or convolution launches that do no matrix math: FFT-based convolution (the FFTs,
# the complex GEMM between them and the filter flip), layout shuffles and transposes, and cuDNN/
# cuBLAS helper kernels that compute offsets, pointers or split-K reductions. Counting them
# as eligible overstated eligible time about 1.4x on a TF 2.4 CNN against TF's own kernel_stats.
NOT_MATH_KERNEL = re.compile(
    r"fft|flip_filter|cgemm|Shuffle|Transpose|SwapDimension|nhwcToNchw|nchwToNhwc"
    r"|compute\w*Offsets|gemm_pointers|splitKreduce|generateWinogradTiles",
    re.IGNORECASE)

# Kernels that do a model's heavy math, by name, when the op that ran them is not recorded
# (cuBLAS/cuDNN/CUTLASS, XLA dot/conv fusions, AMD Tensile "Cijk" GEMMs).
HEAVY_KERNEL = re.compile(r"gemm|cutlass|xmma|wgmma|nvjet|Cijk|cudnn|winograd|implicit_convolve|conv[23]d|"
                          r"convolution|wgrad|dgrad|fft2d|\bdot\b|dot_fusion|gemm_fusion|matmul",
                          re.IGNORECASE)


def matrix_units(vendors: set[str | None]) -> str:
    """What a capture's GPUs call their matrix-multiply units: Matrix Cores on AMD, Tensor Cores
    on NVIDIA (and whenever the vendors are mixed or unknown)."""
    return "Matrix Cores" if vendors and all((v or "").upper() == "AMD" for v in vendors) else "Tensor Cores"


# cuBLAS, cuDNN and CUTLASS kernels name the architecture they were built for: "volta_sgemm_128x64_nn",
# "turing_fp16_s1688gemm_fp16_...", "ampere_sgemm_...", "sm80_xmma_...", "sm90_xmma_...",
# "cutlass_80_tensorop_s1688gemm_..."; cuBLAS's "nvjet" GEMMs exist from Hopper on.  A GPU runs
# kernels built for its own or an older architecture, so the newest tag among its kernels is a lower
# bound of its compute capability: what a trace without deviceProperties still says of its GPU.
_ARCH_TAG = re.compile(r"(?<![a-z])(volta|turing|ampere|hopper|blackwell)_|(?<![a-z0-9])sm_?(\d{2,3})_"
                       r"|cutlass_(\d{2,3})_|(?<![a-z])(nvjet)", re.IGNORECASE)
_ARCH_BY_NAME = {"volta": (7, 0), "turing": (7, 5), "ampere": (8, 0), "hopper": (9, 0), "blackwell": (10, 0),
                 "nvjet": (9, 0)}


def _arch_of(name: str) -> tuple[int, int] | None:
    match = _ARCH_TAG.search(name)
    if match is None:
        return None
    word = match.group(1) or match.group(4)
    if word:
        return _ARCH_BY_NAME[word.lower()]
    digits = match.group(2) or match.group(3)
    return int(digits[:-1]), int(digits[-1])


def compute_capability_of_kernels(names: list[str]) -> tuple[int, int] | None:
    """The least compute capability an NVIDIA GPU that ran kernels NAMES has (the newest
    architecture tag among them), None when no name carries one."""
    found = [arch for arch in map(_arch_of, names) if arch is not None and arch[0] >= 3]
    return max(found) if found else None

# Library kernels that are a GEMM or a convolution whatever op launched them: cuBLAS/CUTLASS/cuDNN
# GEMMs and convolutions ("volta_sgemm_128x64_nn", "implicit_convolve_sgemm", "volta_scudnn_128x64_...",
# "cudnn::detail::dgrad_engine", "sm80_xmma_fprop_...", "nvjet_tst_..."), rocBLAS/hipBLASLt Tensile
# "Cijk_" GEMMs and MIOpen "igemm_" convolutions.  They name the work of a compiled region too
# (torch.compile calls cuBLAS without an aten op around it).  FBGEMM's kernels ("fbgemm_gpu::...")
# are embedding and quantisation kernels, not GEMMs.
LIBRARY_MATRIX_KERNEL = re.compile(r"(?<!fb)gemm(?!v)|xmma|nvjet|implicit_convolve|scudnn|[hs]884cudnn|[hs]1688cudnn"
                                   r"|dgrad_engine|wgrad_alg|winograd|fprop|Cijk_|igemm_", re.IGNORECASE)

# Kernels that do the matrix math of a matmul, convolution, attention or RNN op: library GEMMs and
# convolutions (above), CUTLASS kernels, fused attention (FlashAttention "flash_fwd_kernel",
# memory-efficient "fmha_cutlassF", cuDNN/TensorRT "fmha") and cuDNN's RNN kernels
# ("RNN_blockPersist_fp_LSTM").  An op of those kinds also launches copies, casts, softmaxes and
# cuDNN helpers ("cudnn::ops::scalePackedTensor_kernel"): those run on CUDA cores in every precision,
# so they are not the op's eligible work.
MATRIX_MATH_KERNEL = re.compile(LIBRARY_MATRIX_KERNEL.pattern + r"|cutlass|conv[123]d|convolution|matmul"
                                r"|flash|fmha|attention|\brnn|rnn_|lstm|gru", re.IGNORECASE)

# Kernels on matrix units whose names carry no MMA shape: FlashAttention's (16-bit only), fused
# attention "fmha" kernels in a 16-bit type (the fp32 "fmha_cutlassF_f32" one runs on CUDA cores),
# and MIOpen/composable-kernel convolutions built on xdlops (MFMA): "igemm_fwd_gtcx3_nhwc_bf16",
# "kernel_grouped_conv_fwd_xdl_cshuffle".  Read where kernels are linked to the ops that launched
# them (PyTorch traces); the TensorFlow and JAX reports keep TENSOR_CORE_KERNEL alone.
MATRIX_UNIT_KERNEL = re.compile(r"flash_fwd|flash_bwd|flash_attn|flash::|_xdl_|xdlops|gtcx", re.IGNORECASE)
FUSED_ATTENTION_KERNEL = re.compile(r"fmha", re.IGNORECASE)
