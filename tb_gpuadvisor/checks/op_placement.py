"""op_placement: are compute ops running on the host instead of the GPU?

## What it measures
``host_op_percent``: time-weighted share of op execution that happens on host threads,
``host op time / (host op time + GPU compute time)`` per step, where host op time is the
summed duration of framework op events (``scope/name:Type``) on the primary GPU's host
that launched nothing on a GPU (an op event whose node also ran kernels on a GPU is only
dispatching them), and GPU compute time is the primary GPU's kernel busy time.
Bookkeeping ops (Send/Recv, Identity, Const, variable reads, shape ops) and iterator ops
are left out. XProf's "ops placed on host" counts ops regardless of how long they run;
weighting by time says how much of the work actually left the GPU.

The evidence names the heaviest host ops, says whether the same op type runs on a GPU
elsewhere in the capture (so a GPU kernel exists) or is known to have none
(``tf.unique``, ``tf.py_function``, string ops), and counts the host-device copies that
start within 100 us of a host op (the copies a misplaced op causes).

## Why it matters
A matrix multiply or convolution on the CPU is one to two orders of magnitude slower
than on the GPU, and data has to travel to the host and back around it. Critical at
50% or more, warning from 10%.

## How to fix
Log device placement to find the ops TensorFlow put on the CPU; pin the model to the
GPU (``tf.device`` or ``OneDeviceStrategy``); replace ops that have no GPU kernel, or
move them into the tf.data pipeline where they run ahead of the step.

Savings model: a replay of the step's dependency graph (attribution/replay.py) where the
host ops during which the GPU sat idle run a stated conservative 10x faster (GPU vs host
speed for the ops that have GPU kernels): that device-idle host op time shrinks by
1 - 1/10 on the host's timeline and the GPU work released after it moves earlier. Host ops
overlapping GPU work save nothing. The GPU idle time behind them is this check's, not
kernel_launch's.

Ops of tf.data functions (run ahead of the step on tf.data's threads, or on the runtime's
threads without the step's group id) are input work, counted by input_bound, not here.

## When the model ran on the CPU although a GPU was there
When the capture has GPU planes with no kernels while the step's model ops run on host
compute threads for milliseconds each (see ``trust.placement``), TensorFlow did not use
the GPU at all. That is a critical finding ranked first: ``host_op_percent`` is then the
share of the step covered by host model ops, the evidence lists them, and the fixes are the
checks a user makes: is the GPU listed, do CUDA/cuDNN match the TensorFlow build, where do
ops run. Savings model: the host op time per step shrinks by the stated factor of 10.

## On CPU-only captures
Without a GPU every op runs on the host, so misplacement itself cannot show. What can
show is the work that would *stay* on the host after moving to a GPU: ops TensorFlow
has no GPU kernel for. There ``host_op_percent`` is their share of the op time on the
threads that run the step (tf.data's own threads excluded, and the ops its map functions run on
the runtime's threads without the step's group id), with the same thresholds,
and the saving assumes they leave the step (moved into the input pipeline, or
replaced): savings = their ms per step, on this CPU as on a GPU.
"""

from __future__ import annotations

import numpy as np

from tb_gpuadvisor.attribution.replay import Scenario
from tb_gpuadvisor.checks import fixes
from tb_gpuadvisor.checks.context import Analysis
from tb_gpuadvisor.trust.placement import LONG_OP_SHARE, host_op_mask, of_the_step, step_threads
from tb_gpuadvisor.model.kernels import name_mask, op_type
from tb_gpuadvisor.checks.base import (
    NoMarks,
    Compared, Finding, Replayed, Severity, needs_steps, register, severity_by_threshold,
)
from tb_gpuadvisor.checks.finding import Evidence, Fix
from tb_gpuadvisor.model import intervals as iv
from tb_gpuadvisor.timeline import PS_PER_MS, PS_PER_US, DeviceActivity, HostActivity
from tb_gpuadvisor.kinds import DeviceEventKind, HostEventKind
from tb_gpuadvisor.vocab import pytorch, tensorflow

CHECK_ID = "op_placement"
# Host ops moved to the GPU run about this much faster there (a conservative factor).
HOST_OP_GPU_SPEEDUP = 10.0
CRITICAL, WARNING = 50.0, 10.0
COPY_WINDOW_PS = 100 * PS_PER_US
TOP = 5

FIND_CPU_OPS = fixes.Remedy(
    text="Make TensorFlow fail instead of silently falling back to the CPU, to find ops without "
         "a GPU kernel; replace them or move them into the tf.data pipeline.",
    code="tf.config.set_soft_device_placement(False)\n"
         "with tf.device('/GPU:0'):\n"
         "    loss = train_step(x, y)  # raises for ops that cannot run on the GPU",
    doc=fixes.GPU_GUIDE,
    jax=Fix(
        text="Find what runs on the host: host callbacks (jax.pure_callback, jax.debug.print, "
             "io_callback) and NumPy code between jitted calls; move the work into jnp inside the step.",
        code="jax.config.update('jax_platforms', 'gpu')   # fail instead of silently running on the CPU\n"
             "print(jax.make_jaxpr(train_step)(state, batch))   # look for pure_callback / debug_callback",
        doc=fixes.JAX_JIT_GUIDE),
)


def _op_evidence(activity: HostActivity, idx: np.ndarray, gpu_types: set[str], steps: int) -> list[Evidence]:
    types = np.array([op_type(activity.names[i]) for i in activity.name[idx]], dtype=object).astype(str)
    uniq, inverse, counts = np.unique(types, return_inverse=True, return_counts=True)
    time_ps = np.bincount(inverse, weights=activity.dur_ps[idx])
    out = []
    for i in np.argsort(-time_ps, kind="stable")[:TOP]:
        name = str(uniq[i])
        if name in gpu_types:
            note = "runs on the GPU elsewhere in this capture, so a GPU kernel exists"
        elif name in tensorflow.HOST_ONLY_OPS:
            note = "has no GPU kernel in TensorFlow"
        else:
            note = "runs only on the host in this capture"
        out.append(Evidence(kind="op", name=name, value=round(time_ps[i] / PS_PER_MS / steps, 3),
                            unit="ms/step", detail=f"{counts[i] / steps:.1f} calls per step; {note}",
                            host=activity.host, tool="tensorflow_stats"))
    return out


def _nearby_copies(dev: DeviceActivity, op_set: iv.Intervals) -> np.ndarray:
    """Host-device copies in steps that start within COPY_WINDOW_PS of a host op."""
    copies = np.flatnonzero(dev.mask(DeviceEventKind.MEMCPY_H2D, DeviceEventKind.MEMCPY_D2H) & (dev.step >= 0))
    if not copies.size or not op_set[0].size:
        return copies[:0]
    near_s, near_e = iv.union(op_set[0] - COPY_WINDOW_PS, op_set[1] + COPY_WINDOW_PS)
    starts = dev.start_ps[copies]
    slot = np.searchsorted(near_s, starts, side="right") - 1
    inside = (slot >= 0) & (starts < near_e[np.clip(slot, 0, None)])
    return copies[inside]


def _host_only_ops(analysis: Analysis) -> Finding:
    """The CPU-only form of the check: ops that have no GPU kernel (see the docstring)."""
    host_only_ps = op_ps = 0
    evidence: list[Evidence] = []
    steps = analysis.steps_count
    for host in analysis.model.hosts:
        activity = host.activity
        types = [op_type(n) for n in activity.names]
        counted = name_mask(types, lambda t: t not in tensorflow.BOOKKEEPING_OPS)
        stuck = name_mask(types, lambda t: t in tensorflow.HOST_ONLY_OPS)
        ops = of_the_step(activity, (activity.kind == HostEventKind.FRAMEWORK_OP) & (activity.step >= 0)
                          & step_threads(activity) & counted[activity.name], analysis.model.steps, grouped_ops=True)
        idx = np.flatnonzero(ops & stuck[activity.name])
        op_ps += int(activity.dur_ps[ops].sum())
        host_only_ps += int(activity.dur_ps[idx].sum())
        if idx.size:
            evidence += _op_evidence(activity, idx, set(), steps)
    percent = 100.0 * host_only_ps / op_ps if op_ps else 0.0
    severity = severity_by_threshold(percent, CRITICAL, WARNING)
    ms = analysis.ms_per_step(host_only_ps)
    names = ", ".join(dict.fromkeys(e.name for e in evidence)) or "none"
    pipeline = {"pytorch": "the DataLoader's workers", "jax": "the input pipeline"}.get(
        analysis.model.framework, "the tf.data pipeline")
    summary = ("This capture has no GPU, so every op runs on the CPU and misplacement itself cannot show. "
               f"{percent:.1f}% of the step's op time ({ms:.2f} ms per step) is in ops that have no GPU "
               f"kernel ({names}): moved into {pipeline} they leave the step on this CPU, and on "
               "a GPU they could not run at all.")
    title = (f"{percent:.1f}% of op time is in ops with no GPU kernel" if severity is not Severity.OK
             else f"Few ops without a GPU kernel ({percent:.1f}% of op time)")
    return Finding(
        check=CHECK_ID, severity=severity, title=title, summary=summary,
        metrics={"host_op_percent": round(percent, 2), "host_op_ms_per_step": round(ms, 3),
                 "measured_on": "cpu"},
        estimated_savings_ms_per_step=ms if severity is not Severity.OK else 0.0, evidence=evidence[:TOP],
        fixes=[fixes.HOST_OPS_INTO_PIPELINE] if severity is not Severity.OK else [],
    )


def _model_on_host(analysis: Analysis) -> Finding:
    """The model ran on host threads although TensorFlow saw a GPU (see trust.placement)."""
    placement = analysis.trust.placement
    gpus = ", ".join(d.device.name for d in analysis.model.gpus)
    evidence = [Evidence(kind="op", name=op["op"], value=op["ms_per_step"], unit="ms/step",
                         detail=f"{op['calls_per_step']:.1f} calls per step on host compute threads",
                         host=analysis.primary_host_name, tool="tensorflow_stats")
                for op in placement.ops]
    how = (f"most of them for milliseconds each ({100 * placement.long_op_share:.0f}% of host op time is in ops "
           "longer than 0.1 ms)" if placement.long_op_share >= LONG_OP_SHARE else
           "and nothing on the host drove a GPU (no kernel launch, no function input sent to it)")
    summary = (f"The model ran on the CPU: {placement.host_op_percent:.1f}% of the step "
               f"({placement.host_op_ms_per_step:.2f} ms per step) is model ops executing on host threads, {how}, "
               f"while {gpus} recorded nothing. " + (
                   "PyTorch saw the GPU but the model and its batches stayed on the CPU: a model or batch "
                   "never moved with .to('cuda'), a CPU-only torch wheel or a hidden GPU (CUDA_VISIBLE_DEVICES)"
                   if analysis.model.framework == pytorch.FRAMEWORK else
                   "TensorFlow sees the GPU but does not run the model on it: a CPU-only TensorFlow package, "
                   "CUDA/cuDNN libraries that do not match the TensorFlow build, a hidden GPU "
                   "(CUDA_VISIBLE_DEVICES) or a CPU device scope")
               + ". Fix this first: every other number describes a CPU run.")
    return Finding(
        check=CHECK_ID, severity=Severity.CRITICAL, title="The model ran on the CPU, not on the GPU",
        summary=summary,
        # leads: a GPU the trace lists got no work, so moving the model to it comes before any other fix.
        metrics={"host_op_percent": round(placement.host_op_percent, 2),
                 "host_op_ms_per_step": round(placement.host_op_ms_per_step, 3), "measured_on": "cpu",
                 "leads": True},
        # On the GPU these ops would take a fraction of their host time (the replay's stated speed-up).
        estimated_savings_ms_per_step=placement.host_op_ms_per_step * (1.0 - 1.0 / HOST_OP_GPU_SPEEDUP),
        evidence=evidence, fixes=[fixes.CHECK_GPU_VISIBLE, fixes.LOG_DEVICE_PLACEMENT, FIND_CPU_OPS])


@register(CHECK_ID, "Ops placed on the host", __doc__,
          what_if=Replayed(lambda model: Scenario(idle={"host_ops": 1.0 - 1.0 / HOST_OP_GPU_SPEEDUP}),
                           what=f"device idle time behind host ops cut {HOST_OP_GPU_SPEEDUP:.0f}x (ops moved to the GPU)"),
          explains="host", explains_order=0, compared=Compared("host_op_percent", "host_op_ms_per_step"),
          marks=NoMarks("its share is host op time against GPU op time, not a share of the step"))
def check(analysis: Analysis) -> Finding:
    if analysis.trust.placement.where == "host_despite_gpu":
        return _model_on_host(analysis)
    breakdown = analysis.breakdown
    primary = breakdown.primary
    if breakdown.device_kind == "cpu" and analysis.steps_count:
        return _host_only_ops(analysis)
    if breakdown.device_kind != "gpu" or primary is None:
        return Finding(CHECK_ID, Severity.NOT_APPLICABLE, "No GPU to place ops on",
                       "The capture has no GPU that ran kernels, so op placement between host and GPU "
                       "does not apply.")
    if not analysis.steps_count:
        return needs_steps(CHECK_ID, "Op placement", "op time")
    host = analysis.primary_host
    gpus = [d for d in analysis.model.active_gpus if d.device.host == host.name]
    activity = host.activity
    idx = np.flatnonzero(host_op_mask(activity, gpus, analysis.model.steps))
    steps = analysis.steps_count
    host_ps = int(activity.dur_ps[idx].sum())
    gpu_ps = primary.total("compute")
    percent = 100.0 * host_ps / (host_ps + gpu_ps) if host_ps + gpu_ps else 0.0
    severity = severity_by_threshold(percent, CRITICAL, WARNING)

    op_set = iv.union(activity.start_ps[idx], activity.end_ps[idx])
    windows = iv.union(analysis.model.steps.start_ps, analysis.model.steps.end_ps)
    gpu_idle = iv.subtract(windows, primary.busy_set)
    exposed_ms = analysis.ms_per_step(iv.total(iv.intersect(op_set, gpu_idle)))
    savings = analysis.what_if.saving_ms(CHECK_ID)
    severity = analysis.gated(severity, savings)

    dev = analysis.primary_device
    copies = _nearby_copies(dev, op_set)
    copies_per_step = copies.size / steps
    copy_mb = float(dev.nbytes[copies].sum()) / 1e6 / steps

    host_ms = analysis.ms_per_step(host_ps)
    summary = (f"{percent:.1f}% of op execution time runs on host threads instead of the GPU "
               f"({host_ms:.2f} ms of host ops per step against {analysis.ms_per_step(gpu_ps):.2f} ms "
               f"of kernels on {primary.name}). ")
    if idx.size:
        summary += (f"{exposed_ms:.2f} ms of it per step leaves the GPU idle" if exposed_ms >= 0.005 else
                    "It overlaps GPU work, so it does not lengthen the step today, but it holds host cores "
                    "the input pipeline and launches need")
        summary += f"; {copies_per_step:.1f} host-device copies per step ({copy_mb:.2f} MB) start next to host ops."
    else:
        summary += "No compute op runs on the host."
    title = (f"{percent:.1f}% of op time runs on the host" if severity is not Severity.OK
             else f"Ops run on the GPU ({percent:.1f}% of op time on host)")

    gpu_types = {op_type(o) for d in analysis.model.active_gpus for o in d.ops}
    evidence = _op_evidence(activity, idx, gpu_types, steps) if idx.size else []
    if copies.size:
        evidence.append(Evidence(kind="kernel", name="MemcpyH2D/MemcpyD2H", value=round(copies_per_step, 1),
                                 unit="copies/step", detail=f"{copy_mb:.2f} MB per step, starting within "
                                 "100 us of a host op", device=primary.name, host=primary.host,
                                 tool="trace_viewer@"))

    return Finding(
        check=CHECK_ID, severity=severity, title=title, summary=summary,
        metrics={"host_op_percent": round(percent, 2), "host_op_ms_per_step": round(host_ms, 3),
                 "exposed_host_op_ms_per_step": round(exposed_ms, 3),
                 "host_op_copies_per_step": round(copies_per_step, 2)},
        estimated_savings_ms_per_step=savings, evidence=evidence,
        fixes=[fixes.LOG_DEVICE_PLACEMENT, FIND_CPU_OPS] if severity is not Severity.OK else [],
    )
