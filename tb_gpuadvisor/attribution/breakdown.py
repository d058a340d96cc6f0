"""Where each step's time went, per device: the measurement most checks rest on.

For every active GPU (or, on a CPU-only capture, every host) each step period
is split into disjoint parts that add up to the step duration:

- ``compute``: kernels running (``compute_low`` is the part in 16-bit or narrower
  kernels, by the name patterns of ``analysis.kernels``);
- ``collective``: collective kernels (NCCL, AllReduce...) not overlapped by compute;
- ``copy``: copies and memsets not hidden behind compute or collectives;
- idle, attributed by what the host was doing while the device had nothing to do,
  in priority order: ``input`` (waiting on tf.data) > ``launch`` (launching
  kernels or dispatching ops for this device) > ``other`` (everything else:
  Python, callbacks, eager ops, host-side conditionals).

XProf's GPU step breakdown only counts device events, so a GPU starved by its
input pipeline or by Python shows up there as unexplained time; asking what the
host did during each idle gap is what lets the checks name the cause.

On CPU-only captures the host is the device: ``input`` is time the training
threads spend waiting for the next tf.data element, ``compute`` is framework op
time outside those waits, and the rest of the step is ``other``.

Everything is computed with interval algebra on whole columns; there is no
loop over events.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from tb_gpuadvisor.arrays import SortedKeys, distinct_small_ints
from tb_gpuadvisor.model import kernels
from tb_gpuadvisor.model import classify
from tb_gpuadvisor.model import intervals as iv
from tb_gpuadvisor.model.intervals import Intervals
from tb_gpuadvisor.model.timeline import (
    COPY_KINDS, PS_PER_MS, Device, DeviceActivity, DeviceEventKind, HostActivity, HostEventKind,
    HostModel, SessionModel, Steps,
)

def op_key(op_name: str) -> str:
    """The op's node name without its type suffix ("scope/MatMul:MatMul" -> "scope/MatMul").

    Device events carry the TF op as "scope/name:Type" (or just the node name), host
    events as "scope/name:Type"; comparing node names links the two.
    """
    base = op_name.split("#", 1)[0]
    head, sep, tail = base.rpartition(":")
    return head if sep and "/" not in tail else base


@dataclass
class DeviceBreakdown:
    """Per-step time split of one device; arrays are int64 picoseconds, one entry per step.

    The interval sets (sorted, disjoint, inside steps) let checks find the longest
    gaps of each kind and the host work that overlapped them.
    """

    device: Device
    duration: np.ndarray
    compute: np.ndarray
    compute_low: np.ndarray
    collective: np.ndarray
    copy: np.ndarray
    input: np.ndarray
    launch: np.ndarray
    other: np.ndarray
    busy_set: Intervals
    input_set: Intervals
    launch_set: Intervals
    other_set: Intervals
    copy_set: Intervals

    @property
    def name(self) -> str:
        return self.device.name

    @property
    def host(self) -> str:
        return self.device.host

    @property
    def idle(self) -> np.ndarray:
        return self.input + self.launch + self.other

    @property
    def busy(self) -> np.ndarray:
        return self.compute + self.collective + self.copy

    def total(self, part: str) -> int:
        """Sum over all steps of one part ("compute", "input", ...), in ps."""
        return int(np.sum(getattr(self, part)))

    def percent(self, part: str) -> float:
        """One part as a percentage of the summed step time."""
        duration = int(np.sum(self.duration))
        return 100.0 * self.total(part) / duration if duration else 0.0

    def to_json(self) -> dict:
        n = max(int(self.duration.size), 1)
        duration = int(np.sum(self.duration))
        busy = int(np.sum(self.busy))
        return {
            "device": self.name,
            "host": self.host,
            "compute_ms": _ms(self.total("compute") / n),
            "collective_ms": _ms(self.total("collective") / n),
            "copy_ms": _ms(self.total("copy") / n),
            "idle_ms": _ms(int(np.sum(self.idle)) / n),
            "busy_percent": round(100.0 * busy / duration, 2) if duration else 0.0,
        }


@dataclass
class Breakdown:
    """Step breakdown of every measured device; ``primary`` is the one the step table shows."""

    steps: Steps
    devices: list[DeviceBreakdown]
    device_kind: str            # "gpu", "tpu" or "cpu" (host as the device)

    @property
    def primary(self) -> DeviceBreakdown | None:
        return self.devices[0] if self.devices else None

    def to_json(self) -> dict:
        primary = self.primary
        steps = []
        if primary is not None:
            columns = {
                "duration_ms": primary.duration, "compute_ms": primary.compute,
                "compute_low_precision_ms": primary.compute_low, "collective_ms": primary.collective,
                "copy_ms": primary.copy, "input_ms": primary.input, "launch_ms": primary.launch,
                "other_ms": primary.other,
            }
            rounded = {key: np.round(values / PS_PER_MS, 3).tolist() for key, values in columns.items()}
            starts = np.round(self.steps.start_ps / PS_PER_MS, 3).tolist()
            numbers = self.steps.number.tolist()
            steps = [{"step": int(numbers[i]), "start_ms": starts[i],
                      **{key: values[i] for key, values in rounded.items()}}
                     for i in range(len(self.steps))]
        return {
            "device": primary.name if primary else None,
            "steps": steps,
            "per_device": [dev.to_json() for dev in self.devices],
        }


# Twice the cores: Python bookkeeping between numpy calls holds the GIL part of the time.
THREADS = min(4, 2 * (os.cpu_count() or 1))


def _ms(ps: float) -> float:
    return round(float(ps) / PS_PER_MS, 3)


def _set(starts: np.ndarray, ends: np.ndarray, mask: np.ndarray | None = None) -> Intervals:
    if mask is not None:
        starts, ends = starts[mask], ends[mask]
    return iv.union(starts, ends)


def _merge(*sets: Intervals) -> Intervals:
    return iv.union(np.concatenate([s for s, _ in sets]), np.concatenate([e for _, e in sets]))


def _dispatch_mask(host: HostModel, dev: DeviceActivity) -> np.ndarray:
    """Host events that launch or dispatch work for ``dev``.

    Launch calls are linked to the device by correlation id (calls without one
    count for every device of the host); framework op events count when the
    device ran an op of the same node name (ops without device annotations count
    for every device); executor scheduling counts for every device of the host.
    """
    activity = host.activity
    kind = activity.kind
    target = launch_targets(host)
    position = next(i for i, d in enumerate(host.devices) if d is dev)
    launch = (kind == HostEventKind.LAUNCH) & ((target == -1) | (target == position))
    ops = kind == HostEventKind.FRAMEWORK_OP
    device_ops = {op_key(dev.ops[i]) for i in distinct_small_ints(dev.op[dev.op >= 0])}
    if device_ops:
        ops &= kernels.name_mask(activity.names, lambda n: op_key(n) in device_ops)[activity.name]
    return launch | ops | (kind == HostEventKind.EXECUTOR)


def launch_targets(host: HostModel) -> np.ndarray:
    """For every host event, the position in ``host.devices`` of the device that ran the work
    it launched (joined by correlation id), -1 when none; computed once per host."""
    targets = host.activity.derived.get("launch_targets")
    if targets is None:
        keys = [d.correlation_id[d.correlation_id >= 0] for d in host.devices]
        positions = [np.full(k.size, i, np.int32) for i, k in enumerate(keys)]
        table = SortedKeys(np.concatenate(keys) if keys else np.empty(0, np.int64),
                           np.concatenate(positions) if positions else np.empty(0, np.int32))
        targets = host.activity.derived["launch_targets"] = table.get(host.activity.correlation_id, -1)
    return targets


def _split(device: Device, windows: Intervals, steps: Steps, compute: Intervals, compute_low: Intervals,
           collective: Intervals, copy: Intervals, waits: Intervals, launch: Intervals) -> DeviceBreakdown:
    """Cut a window set into the disjoint parts and total each per step."""
    lo, hi = steps.start_ps, steps.end_ps
    compute = iv.intersect(compute, windows)
    collective = iv.intersect(iv.subtract(collective, compute), windows)
    covered = _merge(compute, collective)
    copy = iv.intersect(iv.subtract(copy, covered), windows)
    busy = _merge(covered, copy)
    idle = iv.subtract(windows, busy)
    input_set = iv.intersect(idle, waits)
    rest = iv.subtract(idle, waits)
    launch_set = iv.intersect(rest, launch)
    other_set = iv.subtract(rest, launch)

    def per_step(s: Intervals) -> np.ndarray:
        return iv.per_bin_total(s, lo, hi)

    return DeviceBreakdown(
        device=device, duration=(hi - lo).astype(np.int64), compute=per_step(compute),
        compute_low=per_step(iv.intersect(compute_low, compute)), collective=per_step(collective),
        copy=per_step(copy), input=per_step(input_set), launch=per_step(launch_set),
        other=per_step(other_set), busy_set=busy, input_set=input_set, launch_set=launch_set,
        other_set=other_set, copy_set=copy)


def _input_waits(host: HostModel) -> Intervals:
    """When the host waited on tf.data; shared by every device of the host, built once."""
    waits = host.activity.derived.get("input_waits")
    if waits is None:
        activity = host.activity
        waits = host.activity.derived["input_waits"] = _set(
            activity.start_ps, activity.end_ps, activity.kind == HostEventKind.INPUT_WAIT)
    return waits


def _gpu_breakdown(dev: DeviceActivity, host: HostModel, windows: Intervals, steps: Steps) -> DeviceBreakdown:
    start, end = dev.start_ps, dev.end_ps
    # Kernel classes (16-bit, collectives) come from analysis.kernels, cached per device and
    # shared with the precision and collectives checks, so the breakdown and they agree.
    classes = kernels.classify(dev)
    activity = host.activity
    return _split(
        dev.device, windows, steps,
        compute=_set(start, end, classes.kernel), compute_low=_set(start, end, classes.low_precision),
        collective=_set(start, end, classes.collective),
        copy=_set(start, end, dev.mask(*COPY_KINDS)),
        waits=_input_waits(host),
        launch=_set(activity.start_ps, activity.end_ps, _dispatch_mask(host, dev)))


def host_device(host: HostModel) -> Device:
    """The host CPU as a device, for CPU-only captures."""
    for dev in host.devices:
        if dev.device.kind == "cpu":
            return dev.device
    return Device(name="/host:CPU", host=host.name, kind="cpu", index=0)


def training_threads(activity: HostActivity) -> np.ndarray:
    """Events on the threads that run the step (not tf.data's own producer threads)."""
    pipeline = kernels.name_mask(activity.threads, classify.is_input_pipeline_thread)
    return ~pipeline[activity.thread] if activity.threads else np.ones(len(activity), bool)


def _cpu_breakdown(host: HostModel, windows: Intervals, steps: Steps) -> DeviceBreakdown:
    activity = host.activity
    start, end = activity.start_ps, activity.end_ps
    waits = _input_waits(host)
    # Ops of tf.data map functions run ahead on pipeline threads; they are not the step's compute.
    step_ops = (activity.kind == HostEventKind.FRAMEWORK_OP) & training_threads(activity)
    ops = iv.subtract(_set(start, end, step_ops), waits)
    # The waits are handed over as the compute-free part of the step, so they land in ``input``.
    return _split(host_device(host), windows, steps, compute=ops, compute_low=iv.EMPTY,
                  collective=iv.EMPTY, copy=iv.EMPTY, waits=waits, launch=iv.EMPTY)


def measured_devices(model: SessionModel) -> tuple[str, list[tuple[DeviceActivity | None, HostModel]]]:
    """The devices the breakdown covers: active GPUs, else active TPUs, else the hosts."""
    gpus = {id(dev) for dev in model.active_gpus}
    pairs = [(dev, host) for host in model.hosts for dev in host.devices if id(dev) in gpus]
    if pairs:
        return "gpu", pairs
    tpus = [(dev, host) for host in model.hosts for dev in host.devices
            if dev.device.kind == "tpu" and bool(np.any(dev.kind == DeviceEventKind.KERNEL))]
    if tpus:
        return "tpu", tpus
    return "cpu", [(None, host) for host in model.hosts]


def compute_breakdown(model: SessionModel) -> Breakdown:
    steps = model.steps
    windows = iv.union(steps.start_ps, steps.end_ps) if len(steps) else iv.EMPTY
    kind, pairs = measured_devices(model)

    def measure(pair: tuple[DeviceActivity | None, HostModel]) -> DeviceBreakdown:
        dev, host = pair
        return _gpu_breakdown(dev, host, windows, steps) if dev is not None else _cpu_breakdown(host, windows, steps)

    if len(pairs) > 1:
        for host in {id(h): h for _, h in pairs}.values():   # per-host parts, before the threads share them
            _input_waits(host)
            launch_targets(host)
        # Devices are measured in parallel: the interval algebra is numpy work that releases the GIL.
        with ThreadPoolExecutor(max_workers=THREADS) as pool:
            devices = list(pool.map(measure, pairs))
    else:
        devices = [measure(pair) for pair in pairs]
    return Breakdown(steps=steps, devices=devices, device_kind=kind)
