"""What an event is: the kinds the input adapters give every device and host event (from the
vocabularies' name rules, once per distinct name) and every later stage reads, and what an
input pipeline's stage names say (``InputStage``).

The ground floor: imports nothing of the product, so the vocabularies, the adapters and the
model can all name a kind.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


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


@dataclass(frozen=True)
class StageOrigin:
    """What a tf.data stage's dataset name (the ``name`` stat recent TensorFlow records) says the
    user's code wrote there, as against what tf.data inserted or rewrote."""

    prefetch: bool                  # a prefetch the user wrote
    parallel: bool                  # a dataset op the user gave parallelism
    sequential_map: bool            # a plain, sequential ``map``
    inserted: str | None = None     # what tf.data inserted or rewrote here, in the user's words


@dataclass(frozen=True)
class InputStage:
    """An input-pipeline stage or wait as its adapter read its name (tf.data's
    ``Iterator::Root::Prefetch::MapAndBatch``, PyTorch's DataLoader ``__next__``): later stages read
    these facts, never the names."""

    kind: str = ""                  # tf.data: the stage's own kind ("MapAndBatch", "Prefetch")
    ancestors: frozenset[str] = frozenset()   # the stages it is nested in (their names)
    prefetch: bool = False          # a prefetch buffer
    parallel: bool = False          # runs its function on several elements at once
    sequential_map: bool = False    # a plain map
    buffer: bool = False            # only hands over what another thread made: its self time is waiting
    in_memory_source: bool = False  # the pipeline's source is held in memory (from_tensor_slices, range)
    reads_files: bool = False       # reads files (TFRecord, interleave, ...)
    origin: StageOrigin | None = None   # None: the capture does not record the stage's dataset
    in_process: bool = False        # a DataLoader loading in the training process (num_workers=0)
