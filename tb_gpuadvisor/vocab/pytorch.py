"""What PyTorch profiler (Kineto) event names mean.

Facts read from the traces in ``../shared/corpus/pytorch-*`` (PyTorch 1.8 to 2.8, CUDA and
ROCm): the category spellings of each Kineto version, the step annotation, the DataLoader's
annotations, the CUDA/HIP runtime calls that launch work, the communication kernels of NCCL,
RCCL, DeepEP and NVSHMEM, and the calls a first iteration makes (lazy module loading, kernel
attribute queries) that a warmed-up one does not.  Calls that wait for the device
(``cudaStreamSynchronize``, ``hipDeviceSynchronize``) and the calls that launch work are
CUDA/HIP names shared by every framework (vocab/gpu.py).
"""

from __future__ import annotations

import re

from tb_gpuadvisor.kinds import DeviceEventKind, HostEventKind, InputStage
from tb_gpuadvisor.vocab import gpu

FRAMEWORK = "pytorch"

# Kineto categories, lower-cased (older traces write "Kernel", "Runtime", "Operator", ...).
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "memcpy", "gpu_memset", "memset"})
HOST_CATEGORIES = frozenset({"cpu_op", "operator", "user_annotation", "cuda_runtime", "runtime",
                             "cuda_driver", "python_function"})
RUNTIME_CATEGORIES = frozenset({"cuda_runtime", "runtime", "cuda_driver"})
# record_function / user annotations: they name a phase ("## backward ##"); wrapping other events
# of their thread they are a scope, not work of their own.
ANNOTATION_CATEGORIES = frozenset({"user_annotation"})
# Neither set holds "gpu_user_annotation", the device-side twin of an annotation: it is not device
# work, and its ProfilerStep#N (the span of the step's GPU work) is the step only when the host has
# none (DEVICE_STEP_CATEGORIES).

_STEP = re.compile(r"^ProfilerStep#(\d+)$")
STEP_SOURCE = "profiler_step"
# torch.optim records every optimizer.step() call as "Optimizer.step#SGD.step": once per
# training iteration, so its repeats mark iterations when prof.step() was never called.
_OPTIMIZER_STEP = re.compile(r"^Optimizer\.step#\w+\.step$")

# enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__ (1.8+) and the Python frame of
# the same call when the trace has stacks (torch/utils/data/dataloader.py(703): __next__).
_INPUT_WAIT = re.compile(r"^enumerate\(DataLoader\)#.*__next__$|torch/utils/data/dataloader\.py\(\d+\): __next__$")
# Work of the DataLoader's own pin-memory thread and of its pinning.
_INPUT_STAGE = re.compile(r"^aten::(_)?pin_memory$|torch/utils/data/_utils/pin_memory\.py")

# Costs of first use: lazy kernel loading (the driver's module, library and function look-ups, in
# CUDA and HIP spellings), the attribute, symbol, occupancy and driver entry-point queries cuBLAS,
# cuDNN, Triton and PyTorch's own kernels make on their first call, and the stream pool PyTorch
# creates on a device's first use (``cudaStreamCreateWithFlags``, 32 streams per priority).  Calls
# libraries make again on every call (``cudaFuncSetAttribute``, ``cudaDeviceGetAttribute``: thousands
# per trace in the corpus) are not among them; pinned memory (``cudaHostAlloc``) is an allocator
# call, inside a library's first call counted by its set-up window (trust/warmup.py).
_WARM_UP = re.compile(r"^(cudaFuncGetAttributes|(cu|hip)Module(Load\w*|GetFunction|GetGlobal\w*)|cuLibraryLoad\w*|"
                      r"cuKernelGetFunction|cuLibraryGetKernel|(cuda|hip)GetFuncBySymbol|(cu|hip)FuncGetAttribute|"
                      r"hipFuncGetAttributes|cudaGetDeviceProperties\w*|hipGetDeviceProperties\w*|"
                      r"(cuda|hip)GetSymbolAddress|(cuda|hip)StreamCreate(WithFlags|WithPriority)?|"
                      r"(cuda|hip)Occupancy\w*|cuOccupancy\w*|cudaGetDriverEntryPoint\w*|cuGetProcAddress\w*|"
                      r"cuInit|hipInit|cuDevicePrimaryCtxRetain|hipDevicePrimaryCtxRetain|cuCtxCreate\w*|hipCtxCreate)$")
# PyTorch creates a device's CUDA/HIP context lazily, with ``cudaFree(nullptr)`` on its first use:
# the process's first such call lasts from about 100 ms to seconds, before any device work.
_CONTEXT_CREATION = re.compile(r"^(cuda|hip)Free$")

# Device and pinned-host memory allocated or freed through the runtime or driver.  PyTorch's
# caching allocator calls these only when its cache misses or is emptied; cudaFree/hipFree (and
# the host-pinned variants) wait for the device to finish its queued work, so the host stalls
# inside an op that would otherwise be launching.  Not launch time: GPU idle behind them is host
# overhead of a different cause.  The async variants (cudaMallocAsync, cudaFreeAsync) enqueue on
# a stream and do not block, so they are left out.
_ALLOCATOR = re.compile(r"^(cuda|hip)(Malloc|MallocManaged|MallocHost|HostAlloc|HostMalloc|Free|FreeHost|HostFree|"
                        r"HostRegister|HostUnregister)$|^cu(MemAlloc|MemFree|MemAllocHost|MemFreeHost|"
                        r"MemHostAlloc|MemHostRegister|MemHostUnregister)(_v2)?$")

# ProcessGroupNCCL wraps each collective it issues in a ``nccl:<collective>`` annotation
# (``nccl:all_reduce``, ``nccl:_all_gather_base``, ``nccl:all_to_all``; RCCL builds too) and a
# ``record_param_comms`` op whose args give its sizes and group in newer versions; the kernels it
# launches inside them are the collective's, whatever their own name says (all-reduce of two
# ranks runs as ``ncclKernel_SendRecv``).
_COLLECTIVE_SCOPE = re.compile(r"^nccl:(\w+)$")
# ProcessGroupGloo (CPU tensors, a CPU-only DDP run) records each collective as a ``gloo:<collective>``
# annotation on its own worker thread, from when the work starts to when every rank has taken
# part: a rank that is early spends the rest of it waiting for the others, not on host overhead.
HOST_COLLECTIVE = re.compile(r"^gloo:\w+$")
COLLECTIVE_ARGS_OP = "record_param_comms"
# Bytes per element of the ``dtype`` arg (c10 ScalarType names).
DTYPE_BYTES = {"Double": 8, "Long": 8, "ComplexFloat": 8, "ComplexDouble": 16, "Float": 4, "Int": 4,
               "Half": 2, "BFloat16": 2, "Short": 2, "ComplexHalf": 4, "Byte": 1, "Char": 1, "Bool": 1,
               "Float8_e4m3fn": 1, "Float8_e5m2": 1, "Float8_e4m3fnuz": 1, "Float8_e5m2fnuz": 1}
# [memory] events of the GPU allocator: c10::DeviceType CUDA (ROCm builds report HIP memory as
# CUDA too); the host's (CPU, 0) are left out.
GPU_MEMORY_DEVICE_TYPE = 1
_ALLOCATOR_NAME = re.compile(r"^cuda:(\d+)$")
# How a PyTorch user knows GPU memory: the allocator that holds it, the call that reads its peak
# and the error a full GPU raises.
CACHING_ALLOCATOR = "PyTorch's caching allocator"
PEAK_ALLOCATED_CALL = "torch.cuda.max_memory_allocated()"
OUT_OF_MEMORY = "CUDA out of memory"


def collective_scope(name: str) -> str | None:
    """The collective a ``nccl:<collective>`` annotation wraps ("all_reduce"), else None."""
    match = _COLLECTIVE_SCOPE.match(name)
    return match.group(1) if match else None


def is_collective_call(name: str) -> bool:
    """Whether host event NAME is a collective between ranks (NCCL's or gloo's, or the op that
    records a collective's arguments): the trace is one rank's of a multi-rank run."""
    return name == COLLECTIVE_ARGS_OP or bool(HOST_COLLECTIVE.match(name) or _COLLECTIVE_SCOPE.match(name))


def allocator_name(device: int) -> str:
    """The caching allocator of GPU DEVICE, named as torch names the device ("cuda:0")."""
    return f"cuda:{device}"


def gpu_allocator_index(name: str) -> int | None:
    """The GPU index of an allocator named by ``allocator_name``, else None."""
    match = _ALLOCATOR_NAME.match(name)
    return int(match.group(1)) if match else None


# A context-creating call this long made the context (a cudaFree of memory takes microseconds).
CONTEXT_CREATION_PS = 1_000_000_000         # 1 ms


def may_create_context(name: str) -> bool:
    """Whether a runtime call named NAME creates the device's context when it is the first one
    (then it is long, and no device work came before it)."""
    return bool(_CONTEXT_CREATION.match(name))


# A launch call this long that launched its kernel's first run on its GPU loaded the kernel first
# (CUDA lazy module loading; before the GPU's first work, the context and libraries too): a warmed-up
# launch takes microseconds.  A copy call this long waited for the device (a blocking copy), and a
# graph launch this long launched many kernels at once: their length is no set-up.
FIRST_USE_LAUNCH_PS = 1_000_000_000          # 1 ms
# The calls that launch one kernel, whose first launch of a kernel loads its module.
_KERNEL_LOADING_LAUNCH = re.compile(r"^(cu|cuda|hip)(Ext)?(Module)?Launch\w*Kernel\w*$")


def may_load_kernel(name: str) -> bool:
    """Whether a runtime call launches one kernel, so that its first launch may load the kernel
    (not a copy, a memset or a CUDA graph's launch)."""
    return bool(_KERNEL_LOADING_LAUNCH.match(name))

# Kineto numbers every runtime API call from one counter, whether it records the call or not.
# In a whole trace the recorded runtime calls hold 6-43% of the ids between their lowest and
# highest (the corpus: 0.06 on owlv2 and b200, 0.43 on the MI300X); a trace sampled or filtered
# after capture keeps far fewer (HTA's trace filter left 0.4-0.5%: 1,204 calls of 259,691 ids).
SAMPLED_ID_DENSITY = 0.02
SAMPLED_MIN_IDS = 10_000        # the id range from which the density is telling


# Precision facts in the kernel names of PyTorch's libraries (cuBLAS, CUTLASS, cuDNN, rocBLAS):
# float64 math (cuBLAS/rocBLAS "dgemm", Tensile "_DD" type codes, ATen kernels templated on
# double: "AddFunctor<double>"; a "(..., double, long)" argument list is a scalar, not the data);
# and fp32 GEMMs on CUDA cores ("ampere_sgemm_128x64_nn", CUTLASS "simt_sgemm", cuDNN's
# "implicit_convolve_sgemm"), which Ampere and newer run only when TF32 is off: with TF32 on the
# same work runs as "s1688gemm"/"tf32" Tensor Core kernels.
_FP64_KERNEL = re.compile(r"[dz]gemm|<double\b|\bdouble>|_fp64|f64f64|Cijk_\w*?_(?:DD|ZZ)[SB]?_", re.IGNORECASE)
_FP32_CUDA_CORE_GEMM = re.compile(r"(?:ampere|sm_?8\d|sm_?9\d|sm_?1\d\d|hopper|blackwell)_sgemm|simt_sgemm|"
                                  r"implicit_convolve_sgemm", re.IGNORECASE)
# Compute capability from which fp32 matmuls can run as TF32 on Tensor Cores (Ampere).
TF32_MAJOR = 8


# Assumed speed-ups when the fix is applied: float64 -> float32 (at least 2x: A100/H100 run fp64 at
# half the fp32 rate, most other GPUs at 1/32 or less) and fp32 CUDA-core GEMMs run as TF32 (A100's
# peak ratio is 8x, 156 vs 19.5 TFLOPS; real GEMMs gain far less).
FP64_SPEEDUP = 2.0
TF32_SPEEDUP = 2.0
# TF32 Tensor Core work run in 16 bits under autocast: the 16-bit peak is twice TF32's (A100 312 vs
# 156 TFLOPS, H100 SXM 989 vs 495), and the operands move half the bytes.
TF32_TO_16BIT_SPEEDUP = 2.0


def runs_tf32(vendor: str | None, cc_major: int | None) -> bool:
    """Whether a GPU has TF32 Tensor Cores (NVIDIA Ampere or newer)."""
    return (vendor or "").upper() == "NVIDIA" and cc_major is not None and cc_major >= TF32_MAJOR


def is_fp64_kernel(name: str) -> bool:
    return bool(_FP64_KERNEL.search(name))


def is_fp32_cuda_core_gemm(name: str) -> bool:
    return bool(_FP32_CUDA_CORE_GEMM.search(name))


# Names only PyTorch's profiler writes: how a capture is known to be PyTorch's.
# The profiler's step annotation, "ProfilerStep#N".
STEP_ANNOTATION = "ProfilerStep#"
HOST_HINTS = ("aten::", STEP_ANNOTATION, "enumerate(DataLoader)", "autograd::")


def step_number(name: str) -> int | None:
    """N of a ``ProfilerStep#N`` annotation, None for any other name."""
    match = _STEP.match(name)
    return int(match.group(1)) if match else None


def is_step_marker(name: str) -> bool:
    return step_number(name) is not None


def is_optimizer_step(name: str) -> bool:
    return bool(_OPTIMIZER_STEP.match(name))


def host_event_kind(name: str, category: str) -> HostEventKind:
    """The kind of a host event from its name and its Kineto category (either spelling)."""
    category = category.lower()
    if is_step_marker(name):
        return HostEventKind.STEP_MARKER
    if _INPUT_WAIT.search(name):
        return HostEventKind.INPUT_WAIT
    if _INPUT_STAGE.search(name):
        return HostEventKind.INPUT_STAGE
    if is_compile(name):
        return HostEventKind.COMPILE
    if category in RUNTIME_CATEGORIES and _WARM_UP.match(name):
        return HostEventKind.FIRST_USE
    if category in RUNTIME_CATEGORIES and _ALLOCATOR.match(name):
        return HostEventKind.ALLOCATOR
    if category in RUNTIME_CATEGORIES and gpu.LAUNCH_CALL.search(name):
        return HostEventKind.LAUNCH
    if category in ("cpu_op", "operator"):
        return HostEventKind.FRAMEWORK_OP
    return gpu.wait_kind(name) or HostEventKind.OTHER


# A batch handed over from a DataLoader worker process crosses a queue (pickled, through shared
# memory) and wakes the training process: on the order of a millisecond per batch. A batch that
# costs the training process less than this to make (an in-memory TensorDataset, a cheap collate)
# is slower from workers (issue 44: a 0.79 ms step with 0.22 ms of input wait went to 1.22 ms with
# 4 persistent workers); indexing a whole batch in one call is its fix.
WORKER_HANDOFF_MS = 1.0


def loads_in_process(input_wait: str) -> bool:
    """Whether a DataLoader wait names the single-process iterator: ``num_workers=0``, batches
    are loaded by the training loop itself."""
    return "_SingleProcessDataLoaderIter" in input_wait


def input_stage(name: str) -> InputStage:
    """A DataLoader wait's or pinning's facts: whether its batches are loaded in the training process."""
    return InputStage(in_process=loads_in_process(name))


def loads_in_workers(input_wait: str) -> bool:
    """Whether a DataLoader wait names the multi-process iterator: ``num_workers`` > 0 already."""
    return "_MultiProcessingDataLoaderIter" in input_wait


# Preparing the step's input on the host inside the loop itself (issue 41: an inference window 57%
# of which was video decode and an image processor): a record_function scope or a function of the
# user's named for it ("preprocess", "image_preprocessing", "tokenize", "decode_video"), or a Python
# frame (with_stack=True) of a library that decodes, resizes, augments or tokenizes on the host.
# A scope named "decoder", "## decode ##" (an LLM's decode phase) or "Transformer" is none of these.
_PREPROCESS_NAME = re.compile(
    r"(?i)(?<![a-z])(pre[-_ ]?process(es|ing|or)?|tokeni[sz](e|er|ation)|augment(s|ation)?|"
    r"(image|video|audio|frame)s?[-_ ]?(processor|processing|decod(e|ing)|transforms?)|"
    r"(decode|read|load)[-_ ]?(videos?|images?|frames?|jpe?gs?))(?![a-z])")
_PREPROCESS_FRAME = re.compile(
    r"(^|/)(PIL|av|decord|cv2|imageio|librosa|albumentations|torchvision/(transforms|io)|torchaudio/(transforms|io)|"
    r"transformers/(models/\w+/)?(image_processing|image_transforms|image_utils|video_processing|video_utils|"
    r"feature_extraction|tokenization|processing)\w*\.py|timm/data)[/(]")


# The same libraries turn the model's outputs back into results after the step's work
# (``image_processing_owlv2.py(503): post_process_object_detection``): that is not input.
_POSTPROCESS_NAME = re.compile(r"(?i)(?<![a-z])post[-_ ]?process")


def is_preprocessing(name: str) -> bool:
    """Whether host event NAME prepares input on the host: a scope or Python function named for it,
    or a frame of a host-side decode, transform or tokenizer library (``PIL/Image.py(2200): resize``),
    not one that post-processes outputs."""
    return bool(_PREPROCESS_NAME.search(name) or _PREPROCESS_FRAME.search(name)) and not is_postprocessing(name)


def is_postprocessing(name: str) -> bool:
    """Whether host event NAME turns outputs into results (the frames inside it are not input)."""
    return bool(_POSTPROCESS_NAME.search(name))


def device_event_kind(name: str, category: str) -> DeviceEventKind:
    """Kind of a device event: ``Memcpy HtoD (Pageable -> Device)``, ``Memset (Device)``, kernels."""
    category = category.lower()
    if "memset" in category:
        return DeviceEventKind.MEMSET
    if "memcpy" in category:
        direction = name.split(" ", 2)[1] if name.count(" ") else ""
        return {"HtoD": DeviceEventKind.MEMCPY_H2D, "DtoH": DeviceEventKind.MEMCPY_D2H,
                "DtoD": DeviceEventKind.MEMCPY_D2D, "PtoP": DeviceEventKind.MEMCPY_P2P
                }.get(direction, DeviceEventKind.MEMCPY_OTHER)
    if gpu.COMMUNICATION_KERNEL.search(name):
        return DeviceEventKind.COLLECTIVE
    return DeviceEventKind.KERNEL


def vendor_of(runtime_names: list[str], device_name: str | None) -> str:
    """NVIDIA or AMD, from the GPU's name or else from the runtime API the host called."""
    if device_name:
        return "AMD" if re.search(r"\bAMD\b|Instinct|Radeon", device_name) else "NVIDIA"
    return "AMD" if any(n.startswith("hip") for n in runtime_names) else "NVIDIA"


# Work that only runs in training mode.  Dropout kernels run only when a module is in training
# mode (in eval mode F.dropout returns its input and launches nothing): ATen's fused_dropout
# kernels, the ops aten::native_dropout (train=True only) and aten::_fused_dropout.  Batch norm in
# training mode computes the batch's statistics: cuDNN's "bn_fw_tr_*" kernels (eval mode runs
# "bn_fw_inf_*"), ATen's batch_norm_collect_statistics kernels (eval mode only transforms),
# MIOpen's BatchNormFwdTrain* kernels (eval: BatchNormFwdInfer*).
_DROPOUT_KERNEL = re.compile(r"fused_dropout|native_dropout|dropout_kernel", re.IGNORECASE)
_TRAINING_BATCH_NORM_KERNEL = re.compile(r"\bbn_fw_tr_|batch_norm_collect_statistics|BatchNormFwdTrain", re.IGNORECASE)
DROPOUT = "dropout"
TRAINING_BATCH_NORM = "training-mode batch norm"
# Backward and optimizer work: the autograd engine's functions, "*Backward0" nodes, aten
# "*_backward" ops and torch.optim's recorded calls.  A trace with none of them is inference.
_BACKWARD = r"^autograd::engine::evaluate_function|Backward\d*$|^aten::\w+_backward$"
_BACKWARD_OP = re.compile(_BACKWARD)
_TRAINING_WORK = re.compile(_BACKWARD + r"|^Optimizer\.(step|zero_grad)#")
# Annotations (torch.profiler.record_function) that name an inference phase: the tutorials'
# "model_inference", or eval/validation/predict/no_grad/inference_mode as a word of the name.
_INFERENCE_SCOPE = re.compile(r"(?<![a-z])(inference|inference_mode|no_grad|eval|evaluation|validation|"
                              r"evaluate|validate|predict|prediction)(?![a-z])", re.IGNORECASE)


def training_mode_kernel(name: str) -> str | None:
    """DROPOUT or TRAINING_BATCH_NORM for a kernel that only runs in a module's training mode."""
    if _DROPOUT_KERNEL.search(name):
        return DROPOUT
    if _TRAINING_BATCH_NORM_KERNEL.search(name):
        return TRAINING_BATCH_NORM
    return None


def is_backward_op(name: str) -> bool:
    """Whether a host op is backward-pass work (the kernels it launches compute gradients)."""
    return bool(_BACKWARD_OP.search(name))


def is_training_work(name: str) -> bool:
    """Whether a host op is backward-pass or optimizer work (a training step runs it)."""
    return bool(_TRAINING_WORK.search(name))


def is_inference_scope(name: str) -> bool:
    """Whether an annotation's name says the code inside it is inference."""
    return bool(_INFERENCE_SCOPE.search(name))


# Kineto names a copy by its direction and both ends: "Memcpy HtoD (Pageable -> Device)",
# "Memcpy DtoH (Device -> Pinned)".  A copy to or from pageable host memory is staged through a
# driver bounce buffer and blocks the host; pinned memory lets the copy engine run it async.
_COPY_ENDS = re.compile(r"\((\w+) -> (\w+)\)")
PAGEABLE = "Pageable"


def copy_host_memory(name: str) -> str | None:
    """The host end of a copy ("Pageable", "Pinned"), None when neither end is the host."""
    match = _COPY_ENDS.search(name)
    if not match:
        return None
    host = [end for end in match.groups() if end != "Device"]
    return host[0] if host else None


def is_pageable_copy(name: str) -> bool:
    return copy_host_memory(name) == PAGEABLE


# Calls that make the host wait for the GPU: .item()/.cpu() on a CUDA tensor (ATen's
# _local_scalar_dense), and the runtime's synchronising calls (a plain cudaMemcpy waits too).
_SYNC_OP = re.compile(r"^(aten::item|aten::_local_scalar_dense|(cuda|hip)(Stream|Device|Event)Synchronize|"
                      r"(cuda|hip)Memcpy|cuCtxSynchronize|cuStreamSynchronize)$")
# Python frames of with_stack=True traces: "train.py(42): train_step"; the library's own frames
# ("torch/nn/modules/module.py(1751): _call_impl", "<built-in method ...>") are not user code.
_FRAME = re.compile(r"^(?P<file>[^<(][^(]*\.py)\((?P<line>\d+)\): (?P<function>.+)$")
_LIBRARY_FRAME = re.compile(r"^(torch|torchvision|torchaudio|transformers|accelerate|lightning|pytorch_lightning|"
                            r"numpy|triton|functorch)/|(site|dist)-packages/|/lib/python3")


# .item() / .cpu() read a tensor's value back (ATen's _local_scalar_dense): on a CPU tensor in
# microseconds; one that lasts milliseconds in a capture with no device waited for a device the
# profiler does not trace (Apple's MPS: Kineto records no MPS activity).
_READ_BACK = re.compile(r"^aten::_local_scalar_dense$")
UNTRACED_DEVICE_WAIT_PS = 1_000_000_000      # 1 ms
UNTRACED_DEVICES = "Apple's MPS (an Apple-silicon GPU) or another device PyTorch's profiler does not trace"


def is_read_back(name: str) -> bool:
    return bool(_READ_BACK.match(name))


def is_sync_op(name: str) -> bool:
    """Whether a host op or runtime call makes the host wait for the GPU."""
    return bool(_SYNC_OP.match(name))


# Runtime calls that return only once the device reached them: synchronising calls, and copies
# (a pageable or blocking copy waits for the work queued on its stream first).
_BLOCKING_CALL = re.compile(r"^((cuda|hip)(Stream|Device|Event)Synchronize|(cuda|hip)Memcpy\w*|cuCtxSynchronize|"
                            r"cuStreamSynchronize)$")


# A host stages a pageable host-to-device copy at several GB/s before and while the copy runs: a
# copy call that waited longer than its bytes at this rate before its copy started waited for
# work queued on its stream.
PAGEABLE_STAGING_BYTES_PER_S = 1e9


def may_block(name: str) -> bool:
    """Whether a runtime call can wait for the device's queued work."""
    return bool(_BLOCKING_CALL.match(name))


def user_frame(name: str) -> str | None:
    """"file:line in function" for a Python frame of the user's code, None for any other event."""
    match = _FRAME.match(name)
    if not match or _LIBRARY_FRAME.search(match["file"]):
        return None
    return f"{match['file']}:{match['line']} in {match['function']}"


# torch.compile's own work, as the profiler records it: every TorchDynamo/Inductor phase timed by
# ``dynamo_timed`` appears as "<phase> (dynamo_timed)" ("_compile.compile_inner (dynamo_timed)",
# "compile_fx_inner (dynamo_timed)", "OutputGraph.call_user_compiler (dynamo_timed)"), and with
# stacks the Python frames of torch/_dynamo's frame conversion (run on a cache miss only), Inductor's
# kernel compilation and its autotuner (max-autotune: "CachingAutotuner.benchmark_all_configs").
# "Torch-Compiled Region" and "TorchDynamo Cache Lookup" are a compiled call's run, not its compile.
_COMPILE = re.compile(r"\(dynamo_timed\)$|^torch/_dynamo/convert_frame\.py\(\d+\)|"
                      r"^torch/_inductor/(async_compile|select_algorithm)\.py\(\d+\)|benchmark_all_configs")


def is_compile(name: str) -> bool:
    """Whether a host event is torch.compile's tracing, compiling or autotuning."""
    return bool(_COMPILE.search(name))



# Runtime and driver calls that launch a kernel (a graph launches many), as opposed to the copy
# and memset calls that also enqueue device work: a host that made none ran a copy-only program.
_KERNEL_LAUNCH = re.compile(r"^(cu|cuda|hip|hipExt|hipModule)Launch\w*Kernel\w*$|^(cuda|hip|cu)Graph(Exec)?Launch$")


def launches_kernel(name: str) -> bool:
    """Whether a runtime call launches a kernel or a graph of kernels (not a copy or memset)."""
    return bool(_KERNEL_LAUNCH.match(name))


# The convolution ops whose first call per shape, with torch.backends.cudnn.benchmark = True,
# times every cuDNN (MIOpen) algorithm: dozens of kernels launched inside one op call.
_CONVOLUTION_OP = re.compile(r"^aten::(cudnn_convolution|miopen_convolution|_convolution|convolution|"
                             r"convolution_backward|cudnn_convolution_backward\w*|miopen_convolution_backward\w*)$")
# A convolution launches a handful of kernels; this many in one call is an algorithm search.
AUTOTUNE_KERNELS_PER_CALL = 20


def is_convolution_op(name: str) -> bool:
    return bool(_CONVOLUTION_OP.match(name))


# ATen ops whose kernels can run on Tensor Cores (Matrix Cores on AMD), by the kind of math they do.
# Forward and backward: nn.Linear runs aten::linear > aten::addmm (its backward aten::mm), nn.Conv2d
# aten::conv2d > aten::convolution > aten::_convolution > aten::cudnn_convolution (backward
# aten::convolution_backward, older aten::cudnn_convolution_backward_input/_weight; MIOpen on ROCm),
# attention aten::scaled_dot_product_attention > aten::_scaled_dot_product_flash_attention /
# _efficient_attention / the math path's aten::bmm, RNNs aten::lstm > aten::_cudnn_rnn.  Depthwise
# convolution (aten::_conv_depthwise2d) is ATen's own CUDA-core kernel in every precision: left out.
TENSOR_CORE_OP_KINDS = (
    ("matmul", re.compile(r"^aten::(mm|addmm_?|bmm|baddbmm_?|addbmm_?|matmul|linear|_addmm_activation|_scaled_mm|"
                          r"_int_mm|_grouped_mm|_scaled_grouped_mm|mm_backward|matmul_backward)$")),
    ("convolution", re.compile(r"^aten::(conv[123]d|conv_transpose[123]d|convolution|_convolution|convolution_overrideable|"
                               r"convolution_backward(_overrideable)?|_convolution_double_backward|"
                               r"(cudnn|miopen)_convolution(_transpose)?(_backward(_input|_weight)?)?|"
                               r"cudnn_convolution_(add_)?relu|slow_conv[23]d\w*|slow_conv_transpose[23]d\w*)$")),
    ("attention", re.compile(r"^aten::(scaled_dot_product_attention|_scaled_dot_product_\w+|_flash_attention_\w+|"
                             r"_efficient_attention_\w+|_native_multi_head_attention|_fused_sdp_choice)$")),
    ("einsum", re.compile(r"^aten::einsum$")),
    ("rnn", re.compile(r"^aten::(lstm|gru|rnn_tanh|rnn_relu|lstm_cell|gru_cell|_cudnn_rnn(_backward)?|"
                       r"miopen_rnn(_backward)?|_thnn_fused_(lstm|gru)_cell\w*)$")),
)


def tensor_core_op_kind(name: str) -> str | None:
    """"matmul", "convolution", "attention", "einsum" or "rnn" for an ATen op whose math can run
    on Tensor Cores; None for any other op."""
    return next((kind for kind, pattern in TENSOR_CORE_OP_KINDS if pattern.match(name)), None)


# PyTorch's ways to put fp32 matrix math on Tensor Cores, per GPU generation: autocast to float16
# with a GradScaler on Volta and Turing (compute capability 7.x: no bf16 or TF32 Tensor Cores),
# bfloat16 autocast (no loss scaling) on Ampere and newer, and on AMD CDNA2/CDNA3 (MI200/MI300,
# gfx90a/gfx94x, whose ROCm builds answer to device_type="cuda"); TF32 for what stays float32 on
# NVIDIA Ampere and newer.
BF16_MAJOR = 8


def autocast_dtype(vendor: str | None, cc_major: int | None) -> str:
    """The autocast dtype an expert picks first for a GPU: "bfloat16" or "float16"."""
    if (vendor or "").upper() == "AMD":
        return "bfloat16" if cc_major is not None and cc_major >= 9 else "float16"
    return "bfloat16" if cc_major is not None and cc_major >= BF16_MAJOR else "float16"


# cuDNN runs float32 convolutions as TF32 by default (torch.backends.cudnn.allow_tf32), while
# matmuls need torch.backends.cuda.matmul.allow_tf32 (off by default since PyTorch 1.12): only a
# GEMM kernel that is not a convolution's ("sm80_xmma_gemm_..._tf32", "cutlass_80_tensorop_s1688gemm",
# not "sm80_xmma_fprop_implicit_gemm_tf32...") tells whether matmuls may use TF32.
_GEMM_KERNEL = re.compile(r"gemm|nvjet", re.IGNORECASE)
_CONVOLUTION_KERNEL = re.compile(r"fprop|dgrad|wgrad|conv|cudnn", re.IGNORECASE)


def is_matmul_kernel(name: str) -> bool:
    """Whether a kernel is a matmul's GEMM (not a convolution run as an implicit GEMM)."""
    return bool(_GEMM_KERNEL.search(name)) and not _CONVOLUTION_KERNEL.search(name)


# ATen's own eager kernels that do no matrix math and stream their tensors through memory once per
# op: the element-wise kernels of every pointwise op and cast ("vectorized_elementwise_kernel",
# "unrolled_elementwise_kernel<direct_copy_kernel_cuda>", "elementwise_kernel_with_index"),
# reductions ("reduce_kernel<... MeanOps ...>": RMSNorm's mean), concatenation
# ("CatArrayBatchedCopy": a KV cache grown by torch.cat), softmax ("cunn_SoftMaxForward",
# "softmax_warp_forward"), and ATen's normalisation and dropout kernels.  torch.compile's Inductor
# fuses chains of them into one Triton kernel ("triton_poi_fused_...", "triton_red_fused_...") that
# reads and writes memory once; library kernels (cuBLAS, cuDNN, FlashAttention) it leaves alone.
_EAGER_MEMORY_BOUND_KERNEL = re.compile(
    r"elementwise_kernel|reduce_kernel|CatArrayBatchedCopy|softmax_warp|SoftMax(Forward|Backward)|"
    r"layer_norm|LayerNorm|RowwiseMoments|GammaBetaBackward|batch_norm_\w*kernel|GroupNorm|group_norm|"
    r"rms_?norm|RMSNorm|fused_dropout|index_elementwise", re.IGNORECASE)
# Inductor's generated kernels: pointwise, reduction, persistent reduction and template (GEMM) kernels
# ("triton_poi_fused_add_0", "triton_red_fused_mean_1", "triton_per_fused_...", "triton_tem_fused_mm_2");
# a hand-written Triton kernel is named after its Python function.
_INDUCTOR_KERNEL = re.compile(r"^triton_(poi|red|per|tem)_")


def is_eager_memory_bound_kernel(name: str) -> bool:
    """Whether a kernel is one of ATen's eager element-wise, reduction, cat, softmax or
    normalisation kernels (what torch.compile fuses); never a compiled (Triton) one."""
    return bool(_EAGER_MEMORY_BOUND_KERNEL.search(name)) and not _INDUCTOR_KERNEL.search(name)


def is_inductor_kernel(name: str) -> bool:
    """Whether a kernel was generated by torch.compile's Inductor (a Triton kernel)."""
    return bool(_INDUCTOR_KERNEL.search(name))


# Where ProfilerStep#N is found on the GPU side (a capture of ProfilerActivity.CUDA only, and
# PyTorch 1.8-1.10 traces, may write it only there): on the device's pid/tid, over the span of
# the step's GPU work.  Steps come from these only when the host has no ProfilerStep#N.
DEVICE_STEP_CATEGORIES = frozenset({"gpu_user_annotation"})
DEVICE_STEP_SOURCE = "profiler_step_device"
