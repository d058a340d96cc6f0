"""kernel_launch: is the GPU starved by kernel launch latency?

## What it measures
``launch_percent``: the share of step time during which the GPU was idle while the host
was launching kernels or dispatching ops for it (CUDA launch calls linked to this GPU by
correlation id, executor op dispatch), and not waiting on input. In a PyTorch trace only the
launch rate counts: the launch calls and the gaps between consecutive launches of a thread
shorter than 0.5 ms (``breakdown.DISPATCH_GAP_PS``); an aten op computing on the CPU, Python
before a custom kernel, first-use set-up, and the idle after a sync (``sync_stalls``) are not
launch time, and warm-up steps are left out before (``trust.warmup``). Also
``median_kernel_us`` (median compute-kernel duration) and ``kernels_per_step``, and as
evidence the ops with the most tiny kernels (shorter than 20 us, the top of the launch
costs captures show) per step.
Measured on the primary GPU; the other GPUs are listed as evidence.

## Why it matters
Launching a kernel costs the host roughly 20-40 us. When most kernels finish faster
than that, the GPU runs a kernel, waits for the next launch, runs it, and so on: the
step is bound by the CPU's launch rate, not by the GPU. This is typical of small batches
and of models made of many small element-wise ops. Critical at 15% of step time or
more, warning from 3%.

## How to fix
Give each kernel more work (a larger batch), fuse small ops (XLA ``jit_compile=True``,
vectorised code instead of Python loops over tensors), and make sure the step runs as a
``tf.function`` graph rather than op by op.

The launch cost is measured: ``launch_cost_us`` is the median duration of the capture's
own launch calls (7-14 us in the corpus captures, about half the often quoted 20 us);
10 us is assumed when the capture records none.

Savings model: a replay of the step's dependency graph (attribution/replay.py) with the
host's launch cost per kernel cut from the measured cost to about 1 us, as a CUDA graph
or an XLA fusion would: device-idle launch time shrinks by 1 - 1 us / launch_cost_us,
and kernels the host released after it move earlier. GPU idle time behind host ops that
compute is op_placement's, not this check's.
"""

from __future__ import annotations

import numpy as np

from tb_gpuadvisor.checks import fixes
from tb_gpuadvisor.attribution.breakdown import DeviceBreakdown
from tb_gpuadvisor.attribution.replay import Scenario
from tb_gpuadvisor.attribution.whatif import launch_cost_us
from tb_gpuadvisor.checks.context import Analysis
from tb_gpuadvisor.checks.graph_fixes import graph_remedies
from tb_gpuadvisor.checks.launch_bound import LAUNCH_WARNING_PERCENT
from tb_gpuadvisor.model.kernels import op_type
from tb_gpuadvisor.checks.base import (
    Marks,
    Compared, Finding, Replayed, Severity, needs_gpu, needs_steps, register, severity_by_threshold,
)
from tb_gpuadvisor.checks.finding import Evidence
from tb_gpuadvisor.timeline import PS_PER_MS, PS_PER_US, DeviceActivity, SessionModel
from tb_gpuadvisor.kinds import DeviceEventKind
from tb_gpuadvisor.vocab import pytorch

CHECK_ID = "kernel_launch"
# Host cost per kernel left when launches are batched (a CUDA graph replays many kernels for
# one call; an XLA fusion launches one kernel for many ops): about 1 us.
BATCHED_LAUNCH_US = 1.0
CRITICAL, WARNING = 15.0, LAUNCH_WARNING_PERCENT
TOP = 5
TINY_KERNEL_PS = 20 * PS_PER_US     # a kernel this short finishes before most launches of the next return


def _step_kernels(dev: DeviceActivity) -> np.ndarray:
    return (dev.kind == DeviceEventKind.KERNEL) & (dev.step >= 0)


def tiny_ops(dev: DeviceActivity, steps: int, top: int = TOP) -> list[Evidence]:
    """Ops (or kernels, when the capture names no op) launching the most tiny kernels per step."""
    tiny = np.flatnonzero(_step_kernels(dev) & (dev.dur_ps < TINY_KERNEL_PS))
    if not tiny.size:
        return []
    # Label each kernel by its op type, or by its own name when no op is recorded: map op and
    # kernel-name ids to label ids once per distinct value, then count with integer keys.
    labels: dict[str, int] = {}
    op_label = np.fromiter((labels.setdefault(op_type(o), len(labels)) for o in dev.ops), np.int64, len(dev.ops))
    name_label = np.fromiter((labels.setdefault(n, len(labels)) for n in dev.names), np.int64, len(dev.names))
    ops = dev.op[tiny]
    key = np.where(ops >= 0, op_label[np.clip(ops, 0, None)] if op_label.size else 0, name_label[dev.name[tiny]])
    counts = np.bincount(key, minlength=len(labels))
    durations = np.bincount(key, weights=dev.dur_ps[tiny], minlength=len(labels))
    uniq = list(labels)
    order = [i for i in np.argsort(-counts, kind="stable")[:top] if counts[i]]
    return [Evidence(kind="op", name=str(uniq[i]), value=round(counts[i] / steps, 1), unit="kernels/step",
                     detail=f"mean {durations[i] / counts[i] / PS_PER_US:.1f} us per kernel, "
                            f"{durations[i] / PS_PER_MS / steps:.3f} ms per step",
                     device=dev.device.name, host=dev.device.host, tool="tensorflow_stats")
            for i in order]


def _other_devices(analysis: Analysis, primary: DeviceBreakdown) -> list[Evidence]:
    return [Evidence(kind="device", name=dev.name, value=round(dev.percent("launch"), 2), unit="%",
                     detail=f"{analysis.ms_per_step(dev.total('launch')):.3f} ms per step idle while launching",
                     device=dev.name, host=dev.host)
            for dev in analysis.breakdown.devices if dev is not primary]


def batched_launches(model: SessionModel) -> Scenario:
    """The fix as a replay: each launch's device-idle time shrinks to what a batched launch costs."""
    cost, _ = launch_cost_us(model)
    return Scenario(idle={"launch": max(0.0, 1.0 - BATCHED_LAUNCH_US / cost)})


@register(CHECK_ID, "Kernel launch overhead", __doc__,
          what_if=Replayed(batched_launches, what="device idle time of launches cut to 1 us per kernel (batched)"),
          explains="host", explains_order=1, compared=Compared("launch_percent", "launch_ms_per_step"),
          marks=Marks(("launch",), "launch_percent"))
def check(analysis: Analysis) -> Finding:
    breakdown = analysis.breakdown
    primary = breakdown.primary
    if breakdown.device_kind != "gpu" or primary is None:
        return needs_gpu(CHECK_ID, "kernel launches")
    if not analysis.steps_count:
        return needs_steps(CHECK_ID, "Launch overhead", "launch gaps")
    dev = analysis.primary_device
    kernels = _step_kernels(dev)
    median_us = float(np.median(dev.dur_ps[kernels])) / PS_PER_US if kernels.any() else 0.0
    per_step = int(kernels.sum()) / analysis.steps_count
    cost_us, measured = launch_cost_us(analysis.model)
    tiny_share = 100.0 * float(np.mean(dev.dur_ps[kernels] < TINY_KERNEL_PS)) if kernels.any() else 0.0
    percent = primary.percent("launch")
    launch_ms = analysis.ms_per_step(primary.total("launch"))
    saving = analysis.what_if.saving_ms(CHECK_ID)
    severity = analysis.gated(severity_by_threshold(percent, CRITICAL, WARNING), saving)

    summary = (f"{primary.name} sat idle {percent:.1f}% of step time ({launch_ms:.2f} ms of a "
               f"{analysis.mean_step_ms:.2f} ms step) while the host was launching its kernels. "
               f"It ran {per_step:.0f} kernels per step with a median of {median_us:.1f} us; "
               f"{tiny_share:.0f}% of them are shorter than 20 us; a launch call takes {cost_us:.1f} us here "
               f"({'the median of this capture' if measured else 'assumed: the capture records no launch calls'}). ")
    if severity is Severity.OK:
        summary += "Kernels are long enough to keep the GPU fed."
        title = f"Kernel launches keep up ({percent:.1f}% of step time)"
    else:
        summary += "The GPU finishes kernels faster than the CPU can launch them." + analysis.gain_note(severity, saving)
        title = f"GPU waits on kernel launches {percent:.1f}% of step time"

    evidence = tiny_ops(dev, analysis.steps_count)
    evidence += analysis.gap_evidence(primary.sets["launch"], "GPU idle while the host launches kernels",
                                      device=primary.name, host=primary.host)
    evidence += _other_devices(analysis, primary)

    return Finding(
        check=CHECK_ID, severity=severity, title=title, summary=summary,
        metrics={"launch_percent": round(percent, 2), "launch_ms_per_step": round(launch_ms, 3),
                 "median_kernel_us": round(median_us, 2), "kernels_per_step": round(per_step, 1),
                 "tiny_kernel_percent": round(tiny_share, 1), "launch_cost_us": round(cost_us, 2),
                 "launch_cost_measured": measured},
        estimated_savings_ms_per_step=saving, evidence=evidence,
        fixes=_remedies(analysis) if severity is not Severity.OK else [],
    )


def _remedies(analysis: Analysis) -> list[fixes.Remedy]:
    """Of the tf.function remedies only the step itself matters here: launches happen inside it.
    An eager PyTorch loop (training or inference) loses its launches to CUDA graphs and fewer
    kernels to torch.compile, whatever its batch; a graph-compiled TF or JAX step has already
    fused what it can, so there a larger batch comes first."""
    compiled = [fixes.XLA_JIT, *graph_remedies(analysis)[:1]]
    if analysis.model.framework == pytorch.FRAMEWORK:
        return [*compiled, fixes.LARGER_BATCH]
    return [fixes.LARGER_BATCH, *compiled]
