"""launch_skew: do all GPUs start a step together, or do some wait for the host?

## What it measures
For every step and every GPU that ran kernels in it, the start of the GPU's first kernel
relative to the earliest first kernel of any GPU in that step. ``skew_ms`` is the mean, over
steps, of the largest such delay; ``skew_percent`` is that delay as a share of the mean step
time. Evidence names the late GPUs and, by following each kernel's correlation id back to
the host call that launched it, the host threads that launch work for each GPU (threads
that serve several GPUs are where the contention is).

## Why it matters
With many independent ops to schedule, the host can spend several threads keeping one GPU
busy and start another GPU's kernels late; in synchronous training the late GPU then delays
every replica at the next AllReduce. Warning when the skew is >= 10% of the step time;
fewer than two GPUs with kernels: not applicable.

## How to fix
Give each GPU private launch threads with ``TF_GPU_THREAD_MODE=gpu_private`` (two threads
per GPU by default, ``TF_GPU_THREAD_COUNT`` to change it), and keep the input pipeline off
those threads.

Savings model: the skew removed, ``skew_ms`` per step, because the late GPU's delay carries
through the step's synchronisation points. It is not replayed: the report caps it by what is
left of the mean step after the findings ranked above it, so it never claims their time.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

import numpy as np

from tb_gpuadvisor.arrays import reduce_by_key
from tb_gpuadvisor.model import kernels
from tb_gpuadvisor.attribution.breakdown import launch_targets
from tb_gpuadvisor.checks.context import Analysis, judged, measurement
from tb_gpuadvisor.checks import fixes
from tb_gpuadvisor.checks.fixes import GPU_PERF_GUIDE, Remedy
from tb_gpuadvisor.checks.base import (
    NoMarks,
    Compared, CrossHost, Finding, HostAlignment, NoReplay, Severity, measured_parts, register,
)
from tb_gpuadvisor.checks.finding import Evidence, Fix
from tb_gpuadvisor.timeline import PS_PER_MS, DeviceActivity, SessionModel
from tb_gpuadvisor.kinds import HostEventKind

CHECK_ID = "launch_skew"
WARNING_AT = 10.0
TOP_THREADS = 3

FIXES = [
    Remedy("Launch each GPU's kernels from its own host threads (set before TensorFlow starts).",
        "export TF_GPU_THREAD_MODE=gpu_private\n"
        "export TF_GPU_THREAD_COUNT=2   # threads per GPU; raise it if one GPU still lags",
        GPU_PERF_GUIDE),
    fixes.GPU_PRIVATE_THREADS,      # the same from Python
]
SERIAL_FIX = Remedy(
    "Look in the trace viewer for what the late GPU waits on: ops that read another replica's "
    "tensors, tf.control_dependencies across devices or variables placed on one GPU; run the "
    "replicated step with strategy.run so replicas are independent until the gradient AllReduce.",
    "with strategy.scope():\n    model = build_model()        # variables mirrored on every GPU\n"
    "per_replica = strategy.run(train_step, args=(batch,))",
    GPU_PERF_GUIDE, jax=Fix(
        "Look in the trace viewer for what the late GPU waits on: arrays committed to one device "
        "and copied to the others, or work run per device from Python; run one jitted step over "
        "all devices with sharded inputs so XLA launches every device's work together.",
        "batch = jax.device_put(batch, NamedSharding(mesh, PartitionSpec('data')))\n"
        "state, loss = train_step(state, batch)   # one jax.jit call for all devices",
        fixes.JAX_SHARDING_GUIDE))


def first_kernel_per_step(dev: DeviceActivity, model: SessionModel, windows: int) -> np.ndarray:
    """Start of the device's first compute or collective kernel in each window (int64 max if none)."""
    first = np.full(windows, NO_KERNEL, np.int64)
    cls = kernels.classify(dev)
    mask = (cls.kernel | cls.collective) & kernels.in_steps(dev, model)
    if not mask.any():
        return first
    if len(model.steps):
        idx = dev.step[mask].astype(np.int64)
    else:
        idx = np.zeros(int(mask.sum()), np.int64)
    return reduce_by_key(np.minimum, first, idx, dev.start_ps[mask])


@dataclass
class StepStarts:
    """When each compared GPU started each step, whether measured from one process holding every
    host's events or joined from per-host summaries (multihost.merge)."""

    labels: list[str]
    devices: list[tuple[str, str]]      # (device name, host) of each label
    firsts: np.ndarray                  # GPU x step window: first kernel start, ps (NO_KERNEL if none)
    lo: np.ndarray                      # the step windows, ps on the session's clock
    hi: np.ndarray
    threads: list[Evidence]             # the host threads that launched each GPU's kernels


NO_KERNEL = np.iinfo(np.int64).max


def too_few_gpus(comparable: int) -> Finding:
    return Finding(CHECK_ID, Severity.NOT_APPLICABLE, "Fewer than two GPUs with comparable traces",
                   f"{comparable} GPU(s) ran kernels in the same steps of this trace, so there is no skew "
                   "between GPUs to measure.")


@measurement
def measure(analysis: Analysis) -> StepStarts | Finding:
    """Every comparable GPU's first kernel per step, or the not-applicable finding."""
    model = analysis.model
    active = analysis.comparable_gpus
    if len(active) < 2:
        return too_few_gpus(len(active))
    lo, hi, windows = kernels.step_windows(model)
    labels = [kernels.device_label(model, dev) for dev in active]
    return StepStarts(labels, [(dev.device.name, dev.device.host) for dev in active],
                      np.vstack([first_kernel_per_step(dev, model, windows) for dev in active]), lo, hi,
                      _launch_threads(model, active, labels))


def join(alignment: HostAlignment, primary: object, parts: list, steps: int) -> StepStarts | None:
    """Every host's first kernel per step on the session clock, and the slowest launch threads."""
    measured = measured_parts(parts, StepStarts)
    if not measured:
        return None
    first_host, first = measured[0]
    firsts = [np.where(s.firsts != NO_KERNEL, alignment.on_session_clock(h, alignment.take(h, s.firsts)), NO_KERNEL)
              for h, s in measured]
    threads = [item for _, s in measured for item in s.threads]
    labels = [label for _, s in measured for label in s.labels]
    return StepStarts(labels, [d for _, s in measured for d in s.devices], np.vstack(firsts),
                      *alignment.windows(first_host, first.lo, first.hi), top_threads(threads, len(labels)))


@register(CHECK_ID, "GPU launch skew", __doc__,
          what_if=NoReplay("a skewed start is waited for in the collectives; its time is the skew itself"),
          aspect="replicas", compared=Compared("skew_percent", "skew_ms"),
          cross_host=CrossHost(measure, join, lambda starts, scale: judge(starts) if len(starts.labels) >= 2 else None,
                               "every host's first kernel per step on the session clock"),
          marks=NoMarks("it compares the replicas' first kernels per step, a skew between devices, not intervals of one"))
def check(analysis: Analysis) -> Finding:
    return judged(measure(analysis), judge)


def judge(starts: StepStarts) -> Finding:
    """The finding from the GPUs' first kernel of every step."""
    firsts, lo, hi, labels = starts.firsts, starts.lo, starts.hi, starts.labels
    present = firsts != NO_KERNEL
    usable = present.sum(axis=0) >= 2
    if not usable.any():
        return Finding(CHECK_ID, Severity.NOT_APPLICABLE, "No step ran kernels on two GPUs",
                       "No profiled step has kernels on more than one GPU, so their start times "
                       "cannot be compared.")
    earliest = np.where(present, firsts, NO_KERNEL).min(axis=0)
    delay = np.where(present, firsts - earliest, 0)          # per GPU, per step
    skew = delay.max(axis=0)[usable]
    step_ps = (hi - lo)[usable]
    skew_ms = float(skew.mean()) / PS_PER_MS
    step_ms = float(step_ps.mean()) / PS_PER_MS
    percent = 100.0 * skew_ms / step_ms if step_ms else 0.0
    mean_delay = np.array([delay[i][usable & present[i]].mean() if (usable & present[i]).any() else 0.0
                           for i in range(len(labels))]) / PS_PER_MS
    late = int(np.argmax(mean_delay))
    worst = int(np.flatnonzero(usable)[int(np.argmax(skew))])
    metrics = {"skew_ms": round(skew_ms, 3), "skew_percent": round(percent, 2),
               "late_device": labels[late], "steps_compared": int(usable.sum())}
    evidence = []
    for i in np.argsort(-mean_delay, kind="stable"):
        device, host = starts.devices[int(i)]
        item = Evidence("device", labels[int(i)], round(float(mean_delay[i]), 3), "ms",
                        detail="mean delay of the first kernel of a step after the earliest GPU's",
                        device=device, host=host)
        if int(i) == late:
            item.start_ms = round(float(earliest[worst]) / PS_PER_MS, 3)
            item.end_ms = round(float(firsts[late][worst]) / PS_PER_MS, 3)
            item.tool = "trace_viewer@"
        evidence.append(item)
    evidence += starts.threads
    if percent < WARNING_AT:
        return Finding(CHECK_ID, Severity.OK, f"GPUs start each step within {skew_ms:.2f} ms of each other",
                       f"The first kernels of a step start on all GPUs within {skew_ms:.2f} ms "
                       f"({percent:.1f}% of the step).", metrics, round(skew_ms, 3), evidence, [])
    summary = (f"In each step the GPUs start their first kernel up to {skew_ms:.2f} ms apart "
               f"({percent:.0f}% of the {step_ms:.2f} ms step); {labels[late]} is the latest. The late "
               "GPU holds every replica back at the next synchronisation; removing the skew would save "
               f"about {skew_ms:.2f} ms per step.")
    fixes = FIXES
    if any(item.kind == "thread" and "gpu_private" in item.name for item in evidence):
        # Private launch threads are already in use, so thread contention is not the cause.
        summary += (" Each GPU already has private launch threads (TF_GPU_THREAD_MODE=gpu_private), so "
                    "the delay comes from the late GPU's work depending on the other's (control "
                    "dependencies or cross-device copies), not from thread contention.")
        fixes = [SERIAL_FIX]
    else:
        summary += " The host launches work for one GPU before the others."
    return Finding(CHECK_ID, Severity.WARNING,
                   f"{labels[late]} starts each step {mean_delay[late]:.2f} ms late",
                   summary, metrics, round(skew_ms, 3), evidence, fixes)


def _launch_threads(model: SessionModel, active: list[DeviceActivity], labels: list[str]) -> list[Evidence]:
    """Host threads that launched each GPU's kernels, joined through correlation ids."""
    by_thread: dict[tuple[str, str], Counter] = defaultdict(Counter)
    for host in model.hosts:
        act = host.activity
        target = launch_targets(host)           # device position of each launch, by correlation id
        label_of = {pos: label for pos, d in enumerate(host.devices)
                    for dev, label in zip(active, labels) if d is dev}
        launch = act.mask(HostEventKind.LAUNCH) & (target >= 0)
        if not launch.any() or not label_of:
            continue
        width = len(host.devices)
        # (thread, device) pairs are few: counted by bincount, not by sorting every launch
        per_pair = np.bincount(act.thread[launch].astype(np.int64) * width + target[launch])
        keys = np.flatnonzero(per_pair)
        for key, count in zip(keys.tolist(), per_pair[keys].tolist()):
            thread, pos = divmod(key, width)
            if pos in label_of:
                by_thread[(host.name, act.threads[thread])][label_of[pos]] += count
    items = []
    for (host, thread), counts in by_thread.items():
        gpus = sorted(counts)
        items.append(Evidence(
            "thread", thread, sum(counts.values()), "launches",
            detail=("launches for " + ", ".join(f"{g} ({counts[g]})" for g in gpus)
                    + ("; shared between GPUs" if len(gpus) > 1 else "")),
            host=host))
    return top_threads(items, len(active))


def top_threads(items: list[Evidence], gpus: int) -> list[Evidence]:
    """Threads that serve several GPUs first (that is where launches contend), then the busiest."""
    return sorted(items, key=lambda item: ("shared" not in (item.detail or ""), -item.value))[:TOP_THREADS * gpus]
