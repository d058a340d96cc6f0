"""memcpy: are host-device copies eating step time?

## What it measures
``memcpy_percent``: the share of step time during which the primary GPU was copying
(``MemcpyH2D``/``D2H``/``D2D``/``P2P`` and memsets) and running no kernel at the same
time, i.e. copy time not hidden behind compute. ``h2d_mb_per_step`` and
``d2h_mb_per_step``: megabytes (10^6 bytes) moved per step in each direction, from the
copies' ``memcpy_details``. The evidence lists the copies (by op when the capture names
it) with the most exposed time, their volume and achieved bandwidth.

## Why it matters
PCIe moves data one to two orders of magnitude slower than GPU memory. A copy the GPU
must wait for (the batch arriving, a result fetched to the host for a Python decision or
a metric) stalls everything behind it. Critical at 15% of step time or more, warning
from 5%.

## How to fix
Overlap the input transfer with the previous step (prefetch to the device), send compact
data (uint8 images, cast on the GPU), and avoid host round trips inside the step
(``.numpy()``, printing tensors, ops placed on the CPU between GPU ops).

Savings model: a replay of the step's dependency graph (attribution/replay.py) with the
copies overlapping compute: their exposed time leaves the device's chain and the host's
timeline, so work queued or launched behind a copy moves earlier.
"""

from __future__ import annotations

import numpy as np

from tb_gpuadvisor.checks import fixes
from tb_gpuadvisor.checks.context import Analysis
from tb_gpuadvisor.attribution.replay import Scenario, shared_launches
from tb_gpuadvisor.checks.base import (
    Marks,
    Compared, Finding, Severity, needs_gpu, Replayed, needs_steps, register, severity_by_threshold,
)
from tb_gpuadvisor.checks.finding import Evidence, Fix
from tb_gpuadvisor.model import intervals as iv
from tb_gpuadvisor.model.kernels import named_events
from tb_gpuadvisor.model.steps import launch_rows
from tb_gpuadvisor.timeline import PS_PER_MS, DeviceActivity
from tb_gpuadvisor.kinds import COPY_KINDS, DeviceEventKind
from tb_gpuadvisor.vocab import pytorch

CHECK_ID = "memcpy"
CRITICAL, WARNING = 15.0, 5.0
TOP = 5
_DIRECTION = {DeviceEventKind.MEMCPY_H2D: "H2D", DeviceEventKind.MEMCPY_D2H: "D2H",
              DeviceEventKind.MEMCPY_D2D: "D2D", DeviceEventKind.MEMCPY_P2P: "P2P",
              DeviceEventKind.MEMCPY_OTHER: "copy", DeviceEventKind.MEMSET: "memset"}

PREFETCH_TO_DEVICE = fixes.Remedy(
    text="Copy the next batch to the GPU while the current step runs: make device prefetch the "
         "last stage of the input pipeline.",
    code="dataset = dataset.batch(batch_size).prefetch(tf.data.AUTOTUNE)\n"
         "dataset = dataset.apply(tf.data.experimental.prefetch_to_device('/gpu:0'))",
    doc=fixes.DATA_GUIDE,
    jax=fixes.JAX_PREFETCH, pytorch=fixes.TORCH_PINNED_COPIES)

COMPACT_INPUT = fixes.Remedy(
    text="Transfer compact data and convert on the GPU: uint8 images are a quarter of the bytes "
         "of float32 ones.",
    code="dataset = dataset.map(lambda img, label: (tf.cast(img, tf.uint8), label))\n"
         "# in the model, on the GPU:\n"
         "x = keras.layers.Rescaling(1.0 / 255)(inputs)",
    doc=fixes.GPU_PERF_GUIDE,
    jax=Fix(
        text="Transfer compact data and convert on the device: uint8 images are a quarter of the "
             "bytes of float32 ones.",
        code="batch = jax.device_put(images_uint8, sharding)   # copy the small dtype\n"
             "# inside the jitted step, on the device:\n"
             "x = batch.astype(jnp.bfloat16) / 255.0",
        doc=fixes.JAX_DEVICE_PUT_DOC),
)

NO_ROUND_TRIPS = fixes.Remedy(
    text="Keep the step on the GPU: avoid .numpy(), Python conditionals on tensor values and "
         "printing inside the step; accumulate metrics on the device and read them once per epoch.",
    code="@tf.function\n"
         "def train_step(x, y):\n"
         "    loss = ...\n"
         "    loss_metric.update_state(loss)   # stays on the GPU\n"
         "    return loss                      # no loss.numpy() per step",
    doc=fixes.GPU_PERF_GUIDE,
    jax=Fix(
        text="Keep the step on the device: avoid float(), np.asarray() or jax.device_get on results "
             "every step and Python conditionals on array values; accumulate metrics on the device.",
        code="for step, batch in enumerate(batches):\n"
             "    state, metrics = train_step(state, batch)   # metrics stay on the device\n"
             "    if step % 100 == 0:\n"
             "        print(jax.device_get(metrics))           # one copy every 100 steps",
        doc=fixes.JAX_GPU_TIPS), pytorch=fixes.TORCH_NO_HOST_SYNC)


def copy_evidence(dev: DeviceActivity, exposed: iv.Intervals, steps: int) -> list[Evidence]:
    """Copy groups (direction and op, or the copy's own name) with the most exposed time."""
    idx = np.flatnonzero(dev.mask(*COPY_KINDS) & (dev.step >= 0))
    if not idx.size:
        return []
    start = dev.start_ps[idx]
    exposed_ps = iv.per_bin_total(exposed, start, start + dev.dur_ps[idx])
    ops = np.array(dev.ops or [""], dtype=object)
    names = np.array(dev.names, dtype=object)
    kind_names = np.array([_DIRECTION.get(k, "") for k in DeviceEventKind], dtype=object)
    op_named = np.array([bool(o) for o in dev.ops] or [False])
    has_op = (dev.op[idx] >= 0) & op_named[np.clip(dev.op[idx], 0, None)]
    label = np.where(has_op, kind_names[dev.kind[idx]] + " for " + ops[np.where(has_op, dev.op[idx], 0)],
                     names[dev.name[idx]]).astype(str)
    uniq, inverse, counts = np.unique(label, return_inverse=True, return_counts=True)
    exposed_sum = np.bincount(inverse, weights=exposed_ps)
    bytes_sum = np.bincount(inverse, weights=dev.nbytes[idx])
    dur_sum = np.bincount(inverse, weights=dev.dur_ps[idx])
    out = []
    for i in np.argsort(-exposed_sum, kind="stable")[:TOP]:
        rate = bytes_sum[i] / (dur_sum[i] / 1e12) / 1e9 if dur_sum[i] else 0.0
        out.append(Evidence(kind="op", name=str(uniq[i]), value=round(exposed_sum[i] / PS_PER_MS / steps, 3),
                            unit="ms/step", detail=f"{counts[i] / steps:.1f} copies and {bytes_sum[i] / 1e6 / steps:.2f} MB "
                            f"per step at {rate:.1f} GB/s; exposed time shown",
                            device=dev.device.name, host=dev.device.host, tool="trace_viewer@"))
    return out


# A run that replays CUDA graphs (one launch call for many device events) and copies on the device:
# a graph reads its inputs at fixed addresses, so under torch.compile(mode="reduce-overhead") each
# input allocated anew every step is copied into the graph's own buffer (aten::copy_) before a replay.
GRAPH_INPUT_COPIES = Fix(
    text="This run replays CUDA graphs, which read their inputs at fixed addresses: each input "
         "allocated anew every step is copied into the graph's buffer before each replay. Allocate "
         "such inputs once, fill them in place and mark them static, so the graph reads them where "
         "they are.",
    code="static_x = torch.empty(batch_shape, device=\"cuda\")\n"
         "torch._dynamo.mark_static_address(static_x)   # read in place: no copy per replay\n"
         "step = torch.compile(train_step, mode=\"reduce-overhead\")\n"
         "for x, y in loader:\n"
         "    static_x.copy_(x, non_blocking=True)\n"
         "    loss = step(static_x, y)",
    doc=fixes.TORCH_CUDA_GRAPHS_DOC)
DEVICE_COPIES = Fix(
    text="Copy less on the device: .contiguous(), .clone(), torch.cat, .to(dtype) and layout changes "
         "copy on the GPU; write into preallocated outputs (out=) or use views instead.",
    code="torch.cat(chunks, dim=0, out=buffer)        # no extra copy of the result\n"
         "y = x.transpose(0, 1)                        # a view; .contiguous() would copy",
    doc=fixes.TORCH_PROFILER_DOC)


def _device_copies(analysis: Analysis, dev: DeviceActivity, exposed: iv.Intervals) -> tuple[float, float, str, bool]:
    """(exposed ms per step of device-to-device copies, copies per step, the ops that launched the
    most of them, whether the run replays CUDA graphs: a launch call put several events on DEV)."""
    rows = np.flatnonzero((dev.kind == DeviceEventKind.MEMCPY_D2D) & (dev.step >= 0))
    if not rows.size:
        return 0.0, 0.0, "", False
    ms = analysis.ms_per_step(int(iv.per_bin_total(exposed, dev.start_ps[rows], dev.end_ps[rows]).sum()))
    call = launch_rows(analysis.primary_host.activity, dev)
    graphs = bool(shared_launches(call).any())
    op = dev.launch_op[rows] if dev.launch_op.size else np.full(rows.size, -1)
    ids, counts = np.unique(op[op >= 0], return_counts=True)
    top = ", ".join(f"{dev.launch_ops[i]} {c / analysis.steps_count:.0f}"
                    for i, c in sorted(zip(ids.tolist(), counts.tolist()), key=lambda x: -x[1])[:2])
    return ms, rows.size / analysis.steps_count, top, graphs


def _pageable_h2d(analysis: Analysis, dev: DeviceActivity) -> tuple[float, float]:
    """(ms per step of host-to-device copies from pageable memory, of all host-to-device copies):
    PyTorch traces name each copy's host memory (vocab.pytorch)."""
    h2d = (dev.kind == DeviceEventKind.MEMCPY_H2D) & (dev.step >= 0)
    pageable = h2d & named_events(dev, "pageable_copy", pytorch.is_pageable_copy)
    return analysis.ms_per_step(dev.dur_ps[pageable].sum()), analysis.ms_per_step(dev.dur_ps[h2d].sum())


def _megabytes_per_step(dev: DeviceActivity, kind: DeviceEventKind, steps: int) -> float:
    return float(dev.nbytes[(dev.kind == kind) & (dev.step >= 0)].sum()) / 1e6 / steps


@register(CHECK_ID, "Host-device copies", __doc__,
          what_if=Replayed(lambda model: Scenario(hide_copies=True), what="copies overlapped with compute"),
          explains="copies", compared=Compared("memcpy_percent", "memcpy_ms_per_step"),
          marks=Marks(("copy",), "memcpy_percent"))
def check(analysis: Analysis) -> Finding:
    breakdown = analysis.breakdown
    primary = breakdown.primary
    if breakdown.device_kind != "gpu" or primary is None:
        return needs_gpu(CHECK_ID, "copies")
    if not analysis.steps_count:
        return needs_steps(CHECK_ID, "Copy time", "copy time")
    steps = analysis.steps_count
    dev = analysis.primary_device
    percent = primary.percent("copy")
    copy_ms = analysis.ms_per_step(primary.total("copy"))
    h2d = _megabytes_per_step(dev, DeviceEventKind.MEMCPY_H2D, steps)
    d2h = _megabytes_per_step(dev, DeviceEventKind.MEMCPY_D2H, steps)
    saving = analysis.what_if.saving_ms(CHECK_ID)
    severity = analysis.gated(severity_by_threshold(percent, CRITICAL, WARNING), saving)

    summary = (f"{primary.name} spent {percent:.1f}% of step time ({copy_ms:.2f} ms of a "
               f"{analysis.mean_step_ms:.2f} ms step) copying data with no kernel running alongside. "
               f"Per step it received {h2d:.2f} MB from the host and sent {d2h:.2f} MB back.")
    d2h_events = np.flatnonzero((dev.kind == DeviceEventKind.MEMCPY_D2H) & (dev.step >= 0))
    d2h_exposed = int(iv.per_bin_total(primary.sets["copy"], dev.start_ps[d2h_events], dev.end_ps[d2h_events]).sum())
    if severity is not Severity.OK and d2h_exposed > 0.2 * primary.total("copy"):
        summary += " Device-to-host copies inside a step usually mean a value is read on the host mid-step."
    torch = analysis.model.framework == pytorch.FRAMEWORK
    pageable_ms, h2d_ms = _pageable_h2d(analysis, dev) if torch else (0.0, 0.0)
    if h2d_ms:
        summary += (f" {pageable_ms:.2f} of its {h2d_ms:.2f} ms of host-to-device copies per step came from "
                    "pageable memory, which the driver stages and the host waits for: pin it and copy "
                    "with non_blocking=True." if pageable_ms else
                    f" Its {h2d_ms:.2f} ms of host-to-device copies per step already come from pinned memory.")
    d2d_ms, d2d_count, d2d_ops, graphs = (_device_copies(analysis, dev, primary.sets["copy"]) if torch and copy_ms
                                          else (0.0, 0.0, "", False))
    device_copies = d2d_ms > 0.5 * copy_ms
    if device_copies:
        summary += (f" {d2d_ms:.2f} ms of its exposed copy time per step are device-to-device copies "
                    f"({d2d_count:.0f} a step" + (f"; launched by {d2d_ops} a step" if d2d_ops else "") +
                    "): they never cross PCIe, so pinned memory and fewer host reads do not shorten them.")
    summary += analysis.gain_note(severity, saving)
    title = (f"Copies stall the GPU {percent:.1f}% of step time" if severity is not Severity.OK
             else f"Copies are hidden behind compute ({percent:.1f}% of step time exposed)")

    evidence = copy_evidence(dev, primary.sets["copy"], steps)
    evidence += analysis.gap_evidence(primary.sets["copy"], "copy with no kernel running",
                                      device=primary.name, host=primary.host)
    evidence += [Evidence(kind="device", name=other.name, value=round(other.percent("copy"), 2), unit="%",
                          detail="exposed copy time on this GPU", device=other.name, host=other.host)
                 for other in breakdown.devices if other is not primary]
    if pageable_ms:
        evidence.append(Evidence(kind="op", name="Memcpy HtoD from pageable memory", value=round(pageable_ms, 3),
                                 unit="ms/step", detail=f"of {h2d_ms:.2f} ms of host-to-device copies per step",
                                 device=primary.name, host=primary.host))

    fix_list = [PREFETCH_TO_DEVICE, COMPACT_INPUT, NO_ROUND_TRIPS]
    if d2h_exposed > 0.5 * primary.total("copy") and pageable_ms <= 0.5 * h2d_ms:
        fix_list = [NO_ROUND_TRIPS, PREFETCH_TO_DEVICE, COMPACT_INPUT]
    if h2d_ms and not pageable_ms:
        fix_list.remove(PREFETCH_TO_DEVICE)     # its PyTorch form pins copies that are pinned already
    if device_copies:
        fix_list = [GRAPH_INPUT_COPIES if graphs else DEVICE_COPIES, *fix_list]
    return Finding(
        check=CHECK_ID, severity=severity, title=title, summary=summary,
        metrics={"memcpy_percent": round(percent, 2), "memcpy_ms_per_step": round(copy_ms, 3),
                 "h2d_mb_per_step": round(h2d, 3), "d2h_mb_per_step": round(d2h, 3),
                 **({"pageable_h2d_ms_per_step": round(pageable_ms, 3)} if torch else {})},
        estimated_savings_ms_per_step=saving, evidence=evidence,
        fixes=fix_list if severity is not Severity.OK else [],
    )
