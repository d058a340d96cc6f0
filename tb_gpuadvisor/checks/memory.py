"""memory: how close does GPU memory come to its capacity?

## What it measures
From TensorFlow's allocator records (``MemoryAllocation``/``MemoryDeallocation`` events of
the ``GPU_<n>_bfc`` allocators): ``peak_percent``, the allocator's peak bytes in use as a
share of the GPU's memory size, on the GPU where it is highest; the fragmentation reported
at the moment of highest use; and the allocator's limit (bytes allocated + bytes still
available), which shows how much of the GPU TensorFlow claims for itself.

## Why it matters
A peak near capacity means the next larger batch or model change will fail with
out-of-memory, and fragmentation makes that happen earlier. A low peak means the GPU could
hold a larger batch, which keeps it busier per step and amortises per-step overheads. By
default TensorFlow reserves nearly all of a GPU's memory when it starts, so other processes
(or a second job) cannot share it. Warning at >= 90%; info below 30% (room for a larger batch).

## How to fix
Near capacity: smaller batch, mixed precision (halves activation memory), or cap the
allocator with a logical device memory limit. Low peak: raise the batch size (and the
learning rate with it). To share a GPU: enable memory growth.

Savings model: none (0 ms); the finding is about headroom, not time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tb_gpuadvisor.checks.context import Analysis
from tb_gpuadvisor.checks.fixes import (
    GPU_GUIDE, GPU_PERF_GUIDE, JAX_DONATION_GUIDE, JAX_GPU_TIPS, JAX_MEMORY_GUIDE, MIXED_PRECISION_GUIDE,
    TORCH_MEMORY_HEADROOM, TORCH_MEMORY_LARGER_BATCH, Remedy,
)
from tb_gpuadvisor.checks.base import NoMarks, Compared, Finding, NoReplay, Severity, register
from tb_gpuadvisor.checks.finding import Evidence, Fix
from tb_gpuadvisor.vocab import frameworks, jax, pytorch, tensorflow

CHECK_ID = "memory"
WARNING_AT = 90.0
LOW_BELOW = 30.0
RESERVES_ALL_AT = 85.0      # allocator limit as % of device memory that means "claims it all"
GIB = 1024 ** 3
MEMORY_GROWTH_DOC = f"{GPU_GUIDE}#limiting_gpu_memory_growth"

GROWTH_FIX = Remedy(
    "Let TensorFlow allocate GPU memory as needed instead of reserving it all at start-up.",
    'gpus = tf.config.list_physical_devices("GPU")\nfor gpu in gpus:\n'
    "    tf.config.experimental.set_memory_growth(gpu, True)\n"
    "# or, without code changes:  export TF_FORCE_GPU_ALLOW_GROWTH=true",
    MEMORY_GROWTH_DOC, jax=Fix(
        "JAX preallocates 75% of each GPU at start-up; allocate on demand or lower the fraction.",
        "export XLA_PYTHON_CLIENT_PREALLOCATE=false\n# or: export XLA_PYTHON_CLIENT_MEM_FRACTION=.50",
        JAX_MEMORY_GUIDE))
LIMIT_FIX = Remedy(
    "Cap how much memory TensorFlow may use on a GPU (a hard limit, in MB).",
    'gpus = tf.config.list_physical_devices("GPU")\n'
    "tf.config.set_logical_device_configuration(\n"
    "    gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=8192)])",
    MEMORY_GROWTH_DOC, jax=Fix(
        "Cap the share of each GPU that JAX may use (set before JAX starts).",
        "export XLA_PYTHON_CLIENT_MEM_FRACTION=.50",
        JAX_MEMORY_GUIDE))
NEAR_FULL_FIX = Remedy(
    "Reduce peak memory: a smaller batch, or mixed precision, which stores activations in 16-bit.",
    'keras.mixed_precision.set_global_policy("mixed_float16")\n'
    "batch_size //= 2   # and rebuild the dataset with it",
    MIXED_PRECISION_GUIDE, jax=Fix(
        "Reduce peak memory: donate the buffers the step replaces, store activations in bfloat16, "
        "or use a smaller batch.",
        "train_step = jax.jit(train_step, donate_argnums=(0, 1))   # params, opt_state updated in place\n"
        "x = x.astype(jnp.bfloat16)",
        JAX_DONATION_GUIDE), pytorch=TORCH_MEMORY_HEADROOM)
LARGER_BATCH_FIX = Remedy(
    "Raise the batch size until peak memory approaches ~80% of the GPU; scale the learning "
    "rate with it.",
    "batch_size *= 2\nlearning_rate *= 2\n"
    "dataset = dataset.unbatch().batch(batch_size).prefetch(tf.data.AUTOTUNE)",
    GPU_PERF_GUIDE, jax=Fix(
        "Raise the batch size until peak memory approaches ~80% of the device; scale the learning "
        "rate with it.",
        "batch_size *= 2\nlearning_rate *= 2",
        JAX_GPU_TIPS), pytorch=TORCH_MEMORY_LARGER_BATCH)


@dataclass
class AllocatorPeak:
    host: str
    device: str
    capacity: int
    peak: int                 # allocator peak bytes in use
    fragmentation: float      # at the record with the most bytes allocated
    limit: int                # bytes allocated + bytes available (what the allocator may use)
    peak_ms: float
    reserved: int = 0         # the most the allocator held at once (PyTorch's caching allocator: reserved)

    @property
    def percent(self) -> float:
        return 100.0 * self.peak / self.capacity

    @property
    def reserved_percent(self) -> float:
        return 100.0 * self.reserved / self.capacity


def allocator_peaks(analysis: Analysis) -> list[AllocatorPeak]:
    """Peak use of each GPU allocator that has records and a known device memory size."""
    model = analysis.model
    out = []
    for host in model.hosts:
        mem = host.memory
        gpus = {dev.device.index: dev.device for dev in host.devices if dev.device.kind == "gpu"}
        for index, name in enumerate(mem.allocators):
            device = gpus.get(frameworks.allocator_gpu(name))
            rows = np.flatnonzero(mem.allocator == index)
            if device is None or not device.memory_bytes or rows.size == 0:
                continue
            at_max = rows[int(np.argmax(mem.bytes_allocated[rows]))]
            peak = int(max(mem.peak_bytes_in_use[rows].max(), mem.bytes_allocated[rows].max()))
            out.append(AllocatorPeak(
                host.name, device.name, int(device.memory_bytes), peak,
                float(mem.fragmentation[at_max]),
                int(mem.bytes_allocated[at_max] + mem.bytes_available[at_max]),
                float(analysis.to_ms(float(mem.time_ps[at_max]))), int(mem.bytes_reserved[rows].max())))
    return out


class _Allocator:
    """The finding's words for TensorFlow's BFC allocator (and XLA's, under JAX): the peak in
    use, the fragmentation at the highest use, and the limit it may reserve at start-up."""

    reserves_at_start = True

    def used(self, p: AllocatorPeak) -> float:
        """The share of the GPU that counts towards running out."""
        return p.percent

    def metrics(self, p: AllocatorPeak) -> dict[str, float]:
        return {"peak_percent": round(p.percent, 2), "peak_gib": round(p.peak / GIB, 3),
                "capacity_gib": round(p.capacity / GIB, 3),
                "fragmentation_percent": round(100.0 * p.fragmentation, 2),
                "allocator_limit_percent": round(100.0 * p.limit / p.capacity, 1)}

    def detail(self, p: AllocatorPeak) -> str:
        return (f"peak {p.peak / GIB:.2f} GiB of {p.capacity / GIB:.2f} GiB; fragmentation "
                f"{100.0 * p.fragmentation:.1f}% at the highest use; allocator may use {p.limit / GIB:.2f} GiB")

    def where(self, p: AllocatorPeak) -> str:
        return f"{p.device} peaks at {p.peak / GIB:.2f} GiB of {p.capacity / GIB:.2f} GiB ({p.percent:.0f}%)"

    def running_out(self, p: AllocatorPeak) -> str:
        return (f", with {100.0 * p.fragmentation:.1f}% fragmentation at that moment: a larger batch or model "
                "will run out of memory.")


class _CachingAllocator(_Allocator):
    """PyTorch's caching allocator, in its user's words: what it allocated (the peak of
    torch.cuda.max_memory_allocated()) and reserved on each GPU, against the GPU's memory.
    Reserved memory is what runs out; it is reserved as the cache grows, not at start-up."""

    reserves_at_start = False

    def used(self, p: AllocatorPeak) -> float:
        return max(p.percent, p.reserved_percent)

    def metrics(self, p: AllocatorPeak) -> dict[str, float]:
        return {"peak_percent": round(p.percent, 2), "peak_gib": round(p.peak / GIB, 3),
                "reserved_percent": round(p.reserved_percent, 2), "reserved_gib": round(p.reserved / GIB, 3),
                "capacity_gib": round(p.capacity / GIB, 3), "cached_percent": round(100.0 * p.fragmentation, 2)}

    def detail(self, p: AllocatorPeak) -> str:
        return (f"peak {p.peak / GIB:.2f} GiB allocated, {p.reserved / GIB:.2f} GiB reserved by the caching "
                f"allocator, of {p.capacity / GIB:.2f} GiB; at the allocated peak {100.0 * p.fragmentation:.1f}% "
                "of what it reserved was cached, not allocated")

    def where(self, p: AllocatorPeak) -> str:
        return (f"{p.device} peaks at {p.peak / GIB:.2f} GiB allocated ({pytorch.PEAK_ALLOCATED_CALL}) and "
                f"{p.reserved / GIB:.2f} GiB reserved by {pytorch.CACHING_ALLOCATOR}, of {p.capacity / GIB:.2f} GiB "
                f"({p.percent:.0f}% / {p.reserved_percent:.0f}%)")

    def running_out(self, p: AllocatorPeak) -> str:
        return f": a larger batch or model will run out of memory ({pytorch.OUT_OF_MEMORY})."


@register(CHECK_ID, "GPU memory headroom", __doc__,
          what_if=NoReplay("it measures memory, not time"), aspect="memory",
          compared=Compared("peak_percent", timed=False), worst_host=True,
          marks=NoMarks("it measures memory, not time"))
def check(analysis: Analysis) -> Finding:
    peaks = allocator_peaks(analysis)
    framework = analysis.model.framework
    if not peaks:
        return Finding(CHECK_ID, Severity.NOT_APPLICABLE, "No GPU memory records",
                       "The capture has no GPU allocator records (or no GPU memory size), so peak "
                       "memory cannot be measured."
                       + ("" if framework in (jax.FRAMEWORK, pytorch.FRAMEWORK) else
                          f" {tensorflow.MEMORY_RECORDS_HINT}"))
    return _finding(peaks, _CachingAllocator() if framework == pytorch.FRAMEWORK else _Allocator())


def _finding(peaks: list[AllocatorPeak], allocator: _Allocator) -> Finding:
    """The finding on the GPU whose allocator comes closest to running out, in ALLOCATOR's words;
    the fixes are remedies, resolved to the capture's framework by the report."""
    worst = max(peaks, key=allocator.used)
    used = allocator.used(worst)
    claims_all = allocator.reserves_at_start and any(100.0 * p.limit / p.capacity >= RESERVES_ALL_AT for p in peaks)
    metrics = allocator.metrics(worst)
    evidence = [Evidence("device", p.device, round(p.percent, 1), "% of memory", detail=allocator.detail(p),
                         device=p.device, host=p.host, start_ms=round(p.peak_ms, 3), tool="memory_profile")
                for p in sorted(peaks, key=lambda p: -allocator.used(p))]
    reserve_note = ""
    if claims_all:
        reserve_note = (f" The allocator may take {100.0 * worst.limit / worst.capacity:.0f}% of the GPU; "
                        "unless memory growth is on it reserves that at start-up, so no other process "
                        "can share the GPU.")
    where = allocator.where(worst)
    if used >= WARNING_AT:
        return Finding(CHECK_ID, Severity.WARNING, f"GPU memory peaks at {used:.0f}% of capacity",
                       where + allocator.running_out(worst) + reserve_note,
                       metrics, 0.0, evidence, [NEAR_FULL_FIX, LIMIT_FIX])
    if used < LOW_BELOW:
        fixes = [LARGER_BATCH_FIX] + ([GROWTH_FIX] if claims_all else [])
        return Finding(CHECK_ID, Severity.INFO,
                       f"GPU memory peaks at only {used:.0f}%: room for a larger batch",
                       f"{where}. A larger batch would keep the GPU busier per step and spread per-step "
                       "overheads over more examples." + reserve_note, metrics, 0.0, evidence, fixes)
    return Finding(CHECK_ID, Severity.OK, f"GPU memory peaks at {used:.0f}% of capacity",
                   f"{where}: neither close to running out nor mostly unused." + reserve_note,
                   metrics, 0.0, evidence, [GROWTH_FIX] if claims_all else [])
