"""Classifying event names, once per distinct name, into what they mean.

The profiler names events after what ran: CUDA kernels and copies on device
planes; framework ops ("scope/op:Type"), tf.data stages ("Iterator::..."),
runtime APIs and Python functions on host threads.  These facts come from
reading real TensorFlow (2.4-2.21) and JAX captures.
"""

from __future__ import annotations

import re

from tb_gpuadvisor.model.timeline import DeviceEventKind, HostEventKind
from tb_gpuadvisor.vocab import pytorch

# Lines of a GPU plane that TensorFlow derives from the streams; not device activity.
DERIVED_DEVICE_LINES = frozenset({
    "TensorFlow Ops", "TensorFlow Name Scope", "Steps", "XLA Modules", "Async XLA Ops",
    "XLA TraceMe", "Overlay", "Framework Ops", "Framework Name Scope", "Source code",
    "Launch Stats", "Host Offload Ops",
})
STEPS_LINE = "Steps"
TPU_OPS_LINE = "XLA Ops"
XLA_MODULES_LINE = "XLA Modules"

# tf.data stages on the host timeline ("Iterator::Model::Prefetch::Map").
INPUT_STAGE_PREFIX = "Iterator::"

_COPY_BY_NAME = {
    "memcpyh2d": DeviceEventKind.MEMCPY_H2D, "memcpyhtod": DeviceEventKind.MEMCPY_H2D,
    "copyhosttodevice": DeviceEventKind.MEMCPY_H2D,
    "memcpyd2h": DeviceEventKind.MEMCPY_D2H, "memcpydtoh": DeviceEventKind.MEMCPY_D2H,
    "copydevicetohost": DeviceEventKind.MEMCPY_D2H,
    "memcpyd2d": DeviceEventKind.MEMCPY_D2D, "memcpydtod": DeviceEventKind.MEMCPY_D2D,
    "copydevicetodevice": DeviceEventKind.MEMCPY_D2D,
    "memcpyp2p": DeviceEventKind.MEMCPY_P2P, "memcpypeer": DeviceEventKind.MEMCPY_P2P,
    "copypeertopeer": DeviceEventKind.MEMCPY_P2P,
}
_COLLECTIVE = re.compile(r"nccl|rccl|allreduce|all_reduce|all-reduce|allgather|all-gather|"
                         r"reducescatter|reduce-scatter|reduce_scatter|alltoall|all-to-all|"
                         r"collective-permute|sendrecv", re.IGNORECASE)


def device_event_kind(name: str) -> DeviceEventKind:
    key = name.replace(" ", "").lower()
    if key in _COPY_BY_NAME:
        return _COPY_BY_NAME[key]
    if key.startswith("memcpy") or key.startswith("copy"):
        return DeviceEventKind.MEMCPY_OTHER
    if key.startswith("memset"):
        return DeviceEventKind.MEMSET
    if _COLLECTIVE.search(name):
        return DeviceEventKind.COLLECTIVE
    return DeviceEventKind.KERNEL


STEP_MARKERS = {"Profiled batch": "keras", "TraceContext": "keras2"}

_INPUT_WAIT = frozenset({
    "IteratorGetNextOp::DoCompute", "IteratorGetNextAsOptionalOp::DoCompute",
    "MultiDeviceIteratorGetNextFromShardOp::DoCompute",
})
# Launch and copy APIs per vendor, as the host plane names them: CUDA driver/runtime
# (cuLaunchKernel, cudaLaunchKernel, cuMemcpy*Async, cuGraphLaunch) and HIP (hipModuleLaunchKernel
# for XLA's own kernels, hipLaunchKernel for library kernels, hipExtModuleLaunchKernel for
# hipBLASLt/Tensile, hipMemcpyDtoDAsync, hipMemsetAsync), checked on the ROCm JAX captures.
_LAUNCH = re.compile(r"^(cu|cuda|hip|hipModule|hipExtModule)(Launch|Memcpy|Memset|Graph(Exec)?Launch)|"
                     r"^(cuLaunchKernel|cudaLaunchKernel|hipLaunchKernel|hipExtLaunchKernel)")
_FUNCTION = re.compile(r"^__inference_|^__forward_|^[a-z_]*_function$|^PjitFunction\(|^jit_|"
                       r"^TfrtTpuLoadedExecutable::Execute$|^PjRtCApiLoadedExecutable::Execute$")
# Eager dispatch wraps both single eager ops and whole tf.function calls, so it is executor
# work, not an op: counting it as one would count the ops of a function twice.
_EXECUTOR = re.compile(r"^Executor|^PjRt|^ThunkExecutor|^Thunk::|^ThreadpoolListener|^BufferSequencingEvent|"
                       r"^Eager(Kernel|Local)?Execute")
_TF_OP = re.compile(r"^[^\s:]+:[A-Za-z_][A-Za-z0-9_]*$")
MEMORY_EVENTS = frozenset({"MemoryAllocation", "MemoryDeallocation"})


def is_graph_op(name: str) -> bool:
    """A TensorFlow graph op ("scope/name:Type"): placed on a device by the framework.  PyTorch's
    ops ("aten::add") run where their tensors are, so they are never misplaced graph ops."""
    return bool(_TF_OP.match(name))


def host_event_kind(name: str) -> HostEventKind:
    if name in STEP_MARKERS:
        return HostEventKind.STEP_MARKER
    if name in _INPUT_WAIT:
        return HostEventKind.INPUT_WAIT
    if name.startswith(INPUT_STAGE_PREFIX) or name.startswith("ParallelMap") or name.startswith("ParallelInterleave"):
        return HostEventKind.INPUT_STAGE
    if name in MEMORY_EVENTS:
        return HostEventKind.MEMORY
    if _LAUNCH.search(name):
        return HostEventKind.LAUNCH
    if _FUNCTION.search(name):
        return HostEventKind.FUNCTION
    if _EXECUTOR.search(name):
        return HostEventKind.EXECUTOR
    if _TF_OP.match(name):
        return HostEventKind.FRAMEWORK_OP
    return HostEventKind.OTHER


# XLA's CPU backend runs the compiled HLO instructions ("dot", "ynn_fusion.1") on threads of
# its own pools (names seen in JAX CPU captures); those events are the computation itself.
_XLA_CPU_THREAD = re.compile(r"^(tf_)?XLA(Eigen|PjRtCpuClient)")


_GPU_ALLOCATOR = re.compile(r"^GPU_(\d+)_bfc$")


def gpu_allocator_index(allocator: str) -> int | None:
    """The GPU a TensorFlow allocator serves ("GPU_0_bfc" -> 0), or None for other allocators."""
    match = _GPU_ALLOCATOR.match(allocator)
    return int(match.group(1)) if match else None


def is_xla_cpu_thread(thread_name: str) -> bool:
    return bool(_XLA_CPU_THREAD.match(thread_name))


def is_input_pipeline_thread(thread_name: str) -> bool:
    """tf.data runs its producers (and their map functions' ops) on threads of its own."""
    return thread_name.startswith("tf_data_")


_TF_HOST_HINTS = ("ExecutorState::Process", "EagerKernelExecute", "TraceContext", "Profiled batch",
                  "TFE_", "IteratorGetNextOp::DoCompute", "__inference_")
_JAX_HOST_HINTS = ("PjitFunction", "py_xla_execute", "PjRt", "TfrtTpuLoadedExecutable", "jit_")


def framework_from_names(names: list[str], threads: list[str]) -> str:
    """Guess which framework wrote the capture from host event and thread names."""
    if any(n.startswith(pytorch.HOST_HINTS) for n in names):
        return pytorch.FRAMEWORK
    tf = any(n.startswith(_TF_HOST_HINTS) for n in names) or any(t.startswith("tf_Compute") for t in threads)
    jax = any(n.startswith(_JAX_HOST_HINTS) for n in names) or any(t.startswith("py_xla_execute") for t in threads)
    if tf and not any(n.startswith("PjitFunction") for n in names):
        return "tensorflow"
    if jax:
        return "jax"
    return "unknown"


def op_key(op_name: str) -> str:
    """The op's node name without its type suffix ("scope/MatMul:MatMul" -> "scope/MatMul").

    Device events carry the TF op as "scope/name:Type" (or just the node name), host
    events as "scope/name:Type"; comparing node names links the two.
    """
    base = op_name.split("#", 1)[0]
    head, sep, tail = base.rpartition(":")
    return head if sep and "/" not in tail else base
