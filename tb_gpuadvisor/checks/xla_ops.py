"""xla_ops: where does the device time of XLA-compiled programs go?

## What it measures
The device time of every event an XLA program ran (JAX, and TensorFlow with XLA), by HLO
category read from the instruction names the capture carries (see vocab/hlo.py):
convolution, dot/GEMM, custom calls (library kernels such as fused attention), layout
transposes, dtype converts, reductions, other fusions, collectives and copies.
``conversion_percent`` is the share spent in layout-transpose and dtype-convert fusions on
the busiest device. ``reshard_copies_per_step`` counts the device-to-device copies JAX makes
when it re-shards an argument on every call (host event ``cpp_pjit_shard_arg_fallback``).
``device_busy_percent`` is the share of the step the device ran anything; at 85% or more
the step is compute-bound and the finding names the kernels that bound it.

## Why it matters
Transposes and converts do no math: XLA inserts them when a convolution or matmul gets its
operands in a layout or dtype its library kernel does not take, and they can cost as much
as the math itself. Re-sharding copies the same data between devices on every call. In a
compute-bound step neither launch overheads nor host gaps matter; only faster kernels do.

## How to fix
Give convolutions the layout the library wants (channels last), keep dtypes consistent so
no convert sits on the hot path (bf16 weights and activations), and put inputs on the
devices with the step's sharding once (``jax.device_put``) instead of on every call.

Savings model: conversions removed entirely, weighted by how busy the device is (time
removed from a mostly idle device does not shorten the step); re-sharding: its host time
per step. Warning when conversions take 20% of the device time or more, or when re-sharding
copies run on every step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tb_gpuadvisor.checks import fixes
from tb_gpuadvisor.checks.base import NoMarks, Compared, Finding, NoReplay, Severity, register
from tb_gpuadvisor.checks.finding import Evidence
from tb_gpuadvisor.checks.context import Analysis
from tb_gpuadvisor.model import intervals as iv
from tb_gpuadvisor.model.kernels import device_label, in_steps, top_by_time
from tb_gpuadvisor.timeline import PS_PER_MS, DeviceActivity
from tb_gpuadvisor.kinds import COPY_KINDS, DeviceEventKind
from tb_gpuadvisor.vocab import hlo, jax, tensorflow, xla

CHECK_ID = "xla_ops"
CONVERSION_WARNING = 20.0
COMPUTE_BOUND_BUSY = 85.0
TOP = 5
_DEVICE_COPIES = (DeviceEventKind.MEMCPY_D2D, DeviceEventKind.MEMCPY_P2P)


@dataclass
class DeviceXla:
    """The XLA view of one device's events inside the steps."""

    dev: DeviceActivity
    events: np.ndarray          # indices of events inside steps
    category: np.ndarray        # per event, index into CATEGORY_NAMES
    busy_ps: int                # union of the compute events (not copies or collectives) inside steps

    @property
    def total_ps(self) -> int:
        return int(self.dev.dur_ps[self.events].sum())


def _categories(dev: DeviceActivity, events: np.ndarray) -> np.ndarray:
    """Per event of EVENTS: its HLO category (from ``hlo_op``; collectives and copies by event
    kind), classified once per distinct instruction name."""
    table = np.array([hlo.category(op) for op in dev.hlo_ops] + [hlo.OTHER], dtype=object)
    out = table[dev.hlo_op[events]]            # -1 (no instruction) is the trailing OTHER
    kind = dev.kind[events]
    out[kind == DeviceEventKind.COLLECTIVE] = hlo.COLLECTIVE
    out[np.isin(kind, np.asarray(COPY_KINDS, np.int8))] = hlo.COPY
    return out


def _device_view(analysis: Analysis, dev: DeviceActivity) -> DeviceXla:
    events = np.flatnonzero(in_steps(dev, analysis.model))
    category = _categories(dev, events)
    compute = events[~np.isin(category, (hlo.COPY, hlo.COLLECTIVE))]
    start = dev.start_ps[compute]
    steps = analysis.model.steps
    busy = iv.total(iv.intersect(iv.union(start, start + dev.dur_ps[compute]), (steps.start_ps, steps.end_ps)))
    return DeviceXla(dev, events, category, int(busy))


def _source(dev: DeviceActivity, i: int) -> str:
    """The JAX source op of event I (the ``name`` stat on GPUs, ``tf_op`` on TPUs)."""
    if dev.source.size and dev.source[i] >= 0:
        return dev.sources[dev.source[i]]
    op = dev.ops[dev.op[i]] if dev.op[i] >= 0 else ""
    return "" if op.startswith(xla.MODULE_OP_PREFIX) else op.rstrip(":")


def _top_ops(view: DeviceXla, mask: np.ndarray, steps: int, label: str) -> list[Evidence]:
    """The HLO instructions (with their source ops) with the most time among MASK."""
    dev, idx = view.dev, view.events[mask]
    keys = np.where(dev.hlo_op[idx] >= 0, dev.hlo_op[idx], -1 - dev.name[idx])
    out = []
    for key, total, count in top_by_time(keys, dev.dur_ps[idx], TOP):
        first = idx[np.flatnonzero(keys == key)[0]]
        name = dev.hlo_ops[key] if key >= 0 else dev.names[-1 - key]
        source = _source(dev, int(first))
        kernel = dev.names[dev.name[first]]
        detail = f"{label}; {count} runs, {100 * total / max(view.total_ps, 1):.1f}% of device time"
        detail += f"; source op {source}" if source else ""
        detail += f"; kernel {kernel[:80]}" if kernel != name else ""
        out.append(Evidence("op", name, round(total / PS_PER_MS / steps, 3), "ms/step", detail,
                            device=dev.device.name, host=dev.device.host, tool="trace_viewer@"))
    return out


def _percent(view: DeviceXla, item: Evidence, steps: int) -> float:
    """An evidence item's ms/step as a percent of the device's XLA time."""
    return 100.0 * item.value * steps * PS_PER_MS / max(view.total_ps, 1)


def _reshard(analysis: Analysis) -> tuple[int, float, int, int]:
    """Re-sharding calls, their host ms per step, and the device-to-device copies (count, bytes)."""
    calls, host_ps, copies, nbytes = 0, 0, 0, 0
    for host in analysis.model.hosts:
        act = host.activity
        ids = [i for i, name in enumerate(act.names) if name == jax.RESHARD_EVENT]
        pick = np.isin(act.name, ids) & (act.step >= 0)
        calls += int(pick.sum())
        host_ps += int(act.dur_ps[pick].sum())
        if not pick.any():
            continue
        first = int(act.start_ps[pick].min())
        for dev in host.devices:
            copy = np.isin(dev.kind, np.asarray(_DEVICE_COPIES, np.int8)) & (dev.start_ps >= first)
            copies += int(copy.sum())
            nbytes += int(dev.nbytes[copy].sum())
    return calls, analysis.ms_per_step(host_ps), copies, nbytes


def _category_metrics(view: DeviceXla) -> dict[str, float]:
    total = max(view.total_ps, 1)
    cats, inverse = np.unique(view.category.astype(str), return_inverse=True)
    sums = np.bincount(inverse, weights=view.dev.dur_ps[view.events].astype(np.float64))
    return {f"{cat}_percent": round(100.0 * s / total, 2) for cat, s in zip(cats, sums)}


@register(CHECK_ID, "XLA ops: conversions, re-sharding and what bounds the step", __doc__,
          what_if=NoReplay("the replay has no cause for conversion kernels or re-sharding host calls; the "
                           "saving is the conversions weighted by how busy the device is, plus the "
                           "re-sharding host time"),
          # Its saving is weighted by how busy the device is: it rests on the idle split, not only on kernel classes.
          aspect="idle", explains="device compute", compared=Compared("conversion_percent"),
          # XLA compiles TensorFlow and JAX programs; a PyTorch trace holds no XLA instruction.
          frameworks=(tensorflow.FRAMEWORK, jax.FRAMEWORK),
          marks=NoMarks("its share is a share of device time in conversion ops, not idle intervals"))
def check(analysis: Analysis) -> Finding:
    model = analysis.model
    xla_devices = [dev for dev in model.devices if len(dev) and (dev.hlo_op >= 0).any()]
    if not xla_devices or not analysis.steps_count:
        return Finding(CHECK_ID, Severity.NOT_APPLICABLE, "No XLA-compiled device work",
                       "No device event carries an XLA instruction name (or there are no steps), "
                       "so there is no XLA program to break down.")
    views = [_device_view(analysis, dev) for dev in xla_devices]
    view = max(views, key=lambda v: v.total_ps)
    steps = analysis.steps_count
    label = device_label(model, view.dev)
    conversions = np.isin(view.category, hlo.CONVERSIONS)
    conv_ps = int(view.dev.dur_ps[view.events[conversions]].sum())
    conv_percent = 100.0 * conv_ps / max(view.total_ps, 1)
    busy_percent = 100.0 * view.busy_ps / max(analysis.step_time_ps, 1)
    calls, reshard_ms, copies, copy_bytes = _reshard(analysis)

    metrics: dict[str, float | int | str | None] = {
        "conversion_percent": round(conv_percent, 2), "device_busy_percent": round(busy_percent, 1),
        "reshard_calls_per_step": round(calls / steps, 2), "reshard_copies_per_step": round(copies / steps, 2),
        "reshard_mb_per_step": round(copy_bytes / 1e6 / steps, 3), "device": label}
    metrics.update(_category_metrics(view))
    parts: list[str] = []
    evidence: list[Evidence] = []
    fix_list = []
    savings = 0.0
    titles = []
    if conv_percent >= CONVERSION_WARNING:
        conv_ms = analysis.ms_per_step(conv_ps)
        savings += conv_ms * min(busy_percent, 100.0) / 100.0
        top = _top_ops(view, conversions, steps, "layout/dtype conversion")
        names = ", ".join(f"{e.name} {_percent(view, e, steps):.1f}%" for e in top[:3])
        parts.append(f"On {label} {conv_percent:.1f}% of the XLA device time ({conv_ms:.2f} ms per step) goes to "
                     f"layout transposes and dtype converts ({names}) that do no math.")
        titles.append(f"layout/dtype conversions take {conv_percent:.0f}% of device time")
        evidence += top
        math = np.isin(view.category, (hlo.CONVOLUTION, hlo.GEMM))
        if math.any():
            math_percent = 100.0 * view.dev.dur_ps[view.events[math]].sum() / max(view.total_ps, 1)
            parts.append(f"The convolutions and matmuls they feed take {math_percent:.1f}%.")
            evidence += _top_ops(view, math, steps, "the math the conversions feed")[:2]
        fix_list += [fixes.jax_only(fixes.JAX_CONV_LAYOUT), fixes.jax_only(fixes.JAX_BF16)]
    if calls >= steps:
        savings += reshard_ms
        parts.append(f"Arguments are re-sharded on every call: {calls} calls of {jax.RESHARD_EVENT} "
                     f"({reshard_ms:.2f} ms of host time per step) and {copies} device-to-device copies "
                     f"({copy_bytes / 2**20:.1f} MiB, {copy_bytes / max(copies, 1) / 1024:.0f} KiB each).")
        titles.append("inputs re-sharded every call")
        fix_list += [fixes.jax_only(fixes.JAX_DEVICE_PUT), fixes.jax_only(fixes.JAX_DONATE)]
    compute_bound = busy_percent >= COMPUTE_BOUND_BUSY
    kernels = (view.dev.kind[view.events] == DeviceEventKind.KERNEL) & ~np.isin(view.category, (hlo.COPY, hlo.COLLECTIVE))
    if compute_bound:
        top = _top_ops_by_kernel(view, kernels, steps)
        names = "; ".join(f"{e.name[:60]} ({e.detail})" for e in top[:3])
        parts.append(f"The step is compute-bound: {label} is busy {busy_percent:.0f}% of the step, so launch "
                     f"and host overheads are hidden; the kernels that bound it are {names}.")
        titles.append(f"compute-bound ({busy_percent:.0f}% busy)")
        evidence += top
    copies = view.category == hlo.COPY
    copy_percent = 100.0 * view.dev.dur_ps[view.events[copies]].sum() / max(view.total_ps, 1)
    if copy_percent >= CONVERSION_WARNING:
        top = _top_ops(view, copies, steps, "copy")
        parts.append(f"Copies take {copy_percent:.1f}% of the XLA device time on {label} "
                     f"({', '.join(e.name for e in top[:3])}): the device mostly waits for data to move "
                     "(between memory spaces, devices or the host), not for math.")
        titles.append(f"copies take {copy_percent:.0f}% of device time")
        evidence += top
    severity = Severity.WARNING if (conv_percent >= CONVERSION_WARNING or calls >= steps) else Severity.INFO
    if not parts:
        cats = sorted(((v, k) for k, v in metrics.items() if k.endswith("_percent") and k not in
                       ("conversion_percent", "device_busy_percent")), reverse=True)[:3]
        parts.append(f"On {label} the XLA device time goes to " +
                     ", ".join(f"{k[:-8]} {v:.1f}%" for v, k in cats) + "; no conversion or re-sharding stands out.")
        titles.append("no conversion or re-sharding overhead")
        severity = Severity.OK
    title = "XLA ops: " + "; ".join(titles)
    return Finding(CHECK_ID, severity, title[:1].upper() + title[1:], " ".join(parts), metrics,
                   round(savings, 3) if severity is Severity.WARNING else 0.0, evidence,
                   fix_list if severity is Severity.WARNING else [])


def _top_ops_by_kernel(view: DeviceXla, mask: np.ndarray, steps: int) -> list[Evidence]:
    """The kernels with the most device time (what a compute-bound step waits for)."""
    dev, idx = view.dev, view.events[mask]
    out = []
    for name, total, count in top_by_time(dev.name[idx], dev.dur_ps[idx], TOP):
        first = idx[np.flatnonzero(dev.name[idx] == name)[0]]
        hlo_name = dev.hlo_ops[dev.hlo_op[first]] if dev.hlo_op[first] >= 0 else ""
        detail = f"{100 * total / max(view.total_ps, 1):.1f}% of device time, {count} runs"
        detail += f", HLO {hlo_name}" if hlo_name else ""
        out.append(Evidence("kernel", dev.names[name], round(total / PS_PER_MS / steps, 3), "ms/step", detail,
                            device=dev.device.name, host=dev.device.host, tool="trace_viewer@"))
    return out
