"""The XPlane adapter's classifier: event names, once per distinct name, into their kinds.

The profiler names events after what ran: CUDA kernels and copies on device
planes; framework ops ("scope/op:Type"), tf.data stages ("Iterator::..."),
runtime APIs and Python functions on host threads.  What each name means is a fact of
its framework or vendor, kept in tb_gpuadvisor/vocab (tensorflow.py, xla.py, jax.py,
gpu.py); this module decides, in order, which kind a name is.
"""

from __future__ import annotations

import re

from tb_gpuadvisor.kinds import DeviceEventKind, HostEventKind
from tb_gpuadvisor.vocab import gpu, jax, tensorflow, xla


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
    return gpu.wait_kind(name) or HostEventKind.OTHER


def is_xla_cpu_thread(thread_name: str) -> bool:
    return bool(xla.CPU_THREAD.match(thread_name))
