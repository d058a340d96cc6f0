"""What an event is: the kinds the input adapters give every device and host event (from the
vocabularies' name rules, once per distinct name) and every later stage reads.

The ground floor: imports nothing of the product, so the vocabularies, the adapters and the
model can all name a kind.
"""

from __future__ import annotations

import enum


class DeviceEventKind(enum.IntEnum):
    """What a device event is; drives the step breakdown."""

    KERNEL = 0
    MEMCPY_H2D = 1
    MEMCPY_D2H = 2
    MEMCPY_D2D = 3
    MEMCPY_P2P = 4
    MEMCPY_OTHER = 5
    MEMSET = 6
    COLLECTIVE = 7


COPY_KINDS = (DeviceEventKind.MEMCPY_H2D, DeviceEventKind.MEMCPY_D2H, DeviceEventKind.MEMCPY_D2D,
              DeviceEventKind.MEMCPY_P2P, DeviceEventKind.MEMCPY_OTHER, DeviceEventKind.MEMSET)


class HostEventKind(enum.IntEnum):
    """What a host event means for idle-time attribution."""

    OTHER = 0          # Python, callbacks, runtime bookkeeping
    INPUT_WAIT = 1     # consumer waiting for the next tf.data element
    INPUT_STAGE = 2    # a tf.data pipeline stage (Iterator::...), producer or consumer side
    LAUNCH = 3         # kernel launch / copy enqueue API calls (correlated with device work)
    FRAMEWORK_OP = 4   # a framework op executing (TF "scope/name:Type", eager kernels)
    STEP_MARKER = 5    # TraceContext / Profiled batch / _r=1 step annotations
    FUNCTION = 6       # tf.function / XLA executable runs (used for step inference)
    MEMORY = 7         # MemoryAllocation / MemoryDeallocation records
    EXECUTOR = 8       # executor scheduling (ExecutorState::Process, PjRt execute helpers)
    FIRST_USE = 9      # one-time set-up a warmed-up step does not pay (context creation, library queries, a
                       # launch that loaded its kernel first: that one carries its correlation id)
    ALLOCATOR = 10     # device memory allocated/freed through the driver (cudaFree, hipMalloc): may block the host
    SCOPE = 11         # an annotation wrapping other events of its thread ("## backward ##"): a phase, not work
    SLOW_LAUNCH = 12   # a launch call of a millisecond or more that is not set-up (a blocking copy waiting for
                       # the device, a CUDA graph's launch, a launch waiting for a full queue): it released device
                       # work, but its time is not the cost of launching
    SYNC = 13          # a call that holds the host until the device reaches it (cudaStreamSynchronize)
    STREAM_WAIT = 14   # a stream told to wait for an event (cudaStreamWaitEvent): the host returns at once
    COMPILE = 15       # a compiler's tracing, compiling or autotuning on the host (torch.compile): one-time set-up
    AUTOTUNE = 16      # a convolution call that timed every algorithm (cuDNN benchmark mode): one-time set-up
