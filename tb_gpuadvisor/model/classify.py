"""Classifying XPlane event names, once per distinct name, into what they mean.

The profiler names events after what ran: CUDA kernels and copies on device
planes; framework ops ("scope/op:Type"), tf.data stages ("Iterator::..."),
runtime APIs and Python functions on host threads.  What each name means is a fact of
its framework or vendor, kept in tb_gpuadvisor/vocab (tensorflow.py, xla.py, jax.py,
gpu.py); this module decides, in order, which kind a name is.
"""

from __future__ import annotations

import re

from tb_gpuadvisor.model.timeline import DeviceEventKind, HostEventKind
from tb_gpuadvisor.vocab import gpu, jax, pytorch, tensorflow, xla


def device_event_kind(name: str) -> DeviceEventKind:
    key = name.replace(" ", "").lower()
    if key in gpu.COPY_BY_NAME:
        return gpu.COPY_BY_NAME[key]
    if key.startswith(gpu.COPY_PREFIXES):
        return DeviceEventKind.MEMCPY_OTHER
    if key.startswith(gpu.MEMSET_PREFIX):
        return DeviceEventKind.MEMSET
    if gpu.COLLECTIVE_EVENT.search(name):
        return DeviceEventKind.COLLECTIVE
    return DeviceEventKind.KERNEL


# Host events that call a compiled function or program, and the executor work around them,
# in every framework the XPlane adapter reads.
_FUNCTION = re.compile("|".join(r.pattern for r in (tensorflow.FUNCTION, jax.FUNCTION, xla.FUNCTION)))
_EXECUTOR = re.compile("|".join(r.pattern for r in (tensorflow.EXECUTOR, xla.EXECUTOR)))


def is_graph_op(name: str) -> bool:
    """A TensorFlow graph op ("scope/name:Type"): placed on a device by the framework.  PyTorch's
    ops ("aten::add") run where their tensors are, so they are never misplaced graph ops."""
    return bool(tensorflow.GRAPH_OP.match(name))


def host_event_kind(name: str) -> HostEventKind:
    if name in tensorflow.STEP_MARKERS:
        return HostEventKind.STEP_MARKER
    if name in tensorflow.INPUT_WAIT:
        return HostEventKind.INPUT_WAIT
    if name.startswith(tensorflow.INPUT_STAGE_PREFIXES):
        return HostEventKind.INPUT_STAGE
    if name in tensorflow.MEMORY_EVENTS:
        return HostEventKind.MEMORY
    if gpu.LAUNCH_CALL.search(name):
        return HostEventKind.LAUNCH
    if _FUNCTION.search(name):
        return HostEventKind.FUNCTION
    if _EXECUTOR.search(name):
        return HostEventKind.EXECUTOR
    if tensorflow.GRAPH_OP.match(name):
        return HostEventKind.FRAMEWORK_OP
    return HostEventKind.OTHER


def gpu_allocator_index(allocator: str) -> int | None:
    """The GPU a TensorFlow allocator serves ("GPU_0_bfc" -> 0), or None for other allocators."""
    match = tensorflow.GPU_ALLOCATOR.match(allocator)
    return int(match.group(1)) if match else None


def allocator_gpu(allocator: str) -> int | None:
    """The GPU an allocator serves, however its framework names it: TensorFlow's "GPU_0_bfc" or
    PyTorch's caching allocator "cuda:0"; None for host allocators."""
    index = gpu_allocator_index(allocator)
    return pytorch.gpu_allocator_index(allocator) if index is None else index


def is_xla_cpu_thread(thread_name: str) -> bool:
    return bool(xla.CPU_THREAD.match(thread_name))


def is_input_pipeline_thread(thread_name: str) -> bool:
    """tf.data runs its producers (and their map functions' ops) on threads of its own."""
    return thread_name.startswith(tensorflow.INPUT_PIPELINE_THREAD_PREFIX)


def framework_from_names(names: list[str], threads: list[str]) -> str:
    """Guess which framework wrote the capture from host event and thread names."""
    if any(n.startswith(pytorch.HOST_HINTS) for n in names):
        return pytorch.FRAMEWORK
    tf = (any(n.startswith(tensorflow.HOST_HINTS) for n in names)
          or any(t.startswith(tensorflow.THREAD_HINT) for t in threads))
    if tf and not any(n.startswith(jax.PJIT_PREFIX) for n in names):
        return tensorflow.FRAMEWORK
    if any(n.startswith(jax.HOST_HINTS) for n in names) or any(t.startswith(jax.THREAD_HINT) for t in threads):
        return jax.FRAMEWORK
    return "unknown"


def op_key(op_name: str) -> str:
    """The op's node name without its type suffix ("scope/MatMul:MatMul" -> "scope/MatMul").

    Device events carry the TF op as "scope/name:Type" (or just the node name), host
    events as "scope/name:Type"; comparing node names links the two.
    """
    base = op_name.split("#", 1)[0]
    head, sep, tail = base.rpartition(":")
    return head if sep and "/" not in tail else base
