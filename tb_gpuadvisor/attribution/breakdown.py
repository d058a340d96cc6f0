"""Where each step's time went, per device: the one attribution every check reads.

For every active GPU (or, on a CPU-only capture, every host) each trusted step is
split into disjoint categories (``CATEGORIES``) that add up to the step duration,
taken in priority order:

- device work: compute by kind (Tensor-Core-eligible 32-bit, 16-bit, other; by the
  name patterns of ``model.kernels``), then collectives not overlapped by compute
  (split per step into the transfer and the time spent waiting for the slowest
  replica), then copies by direction not hidden behind either;
- ``not_traced``: step time outside the window the device's trace covers (from
  trust), and all device idle time when the host recorded nothing (a PyTorch capture of
  ``ProfilerActivity.CUDA`` only): missing data is never idle time, nor a host cause;
- ``setup``: device idle while its host ran one-time set-up (trust's ``setup``: the context's
  creation, a library's initialisation, lazily loaded kernels): a warmed-up step does not pay
  it, so it is no host cost (a step it bounds is bound by set-up), and a report shows it only
  where there is some;
- device idle, by what the host was doing: ``input`` (waiting on tf.data or the DataLoader, or,
  in a PyTorch trace, inside a host-to-device copy's call: a pageable batch being staged, or
  preparing the batch on the host in the loop itself: ``cpu_preprocessing``) >
  ``host_ops`` (framework ops computing on the host that launch nothing) >
  ``launch`` (launching kernels or dispatching ops for this device; in a PyTorch trace the
  launch calls and the short gaps between them, never a sync's aftermath) >
  ``other_host`` (Python, callbacks, eager bookkeeping, or nothing at all).

XProf's GPU step breakdown only counts device events, so a GPU starved by its
input pipeline or by Python shows up there as unexplained time; asking what the
host did during each idle gap is what lets the checks name the cause.

On CPU-only captures the host is the device: ``input`` is time the training
threads spend waiting for the next tf.data element or DataLoader batch (or preparing it in the
loop: PyTorch's ``cpu_preprocessing``), compute is framework op
time (and the executor's own threads running the graph) outside those waits,
and the rest of the step is ``other_host``.

Everything is computed with interval algebra on whole columns; there is no
loop over events.
"""

from __future__ import annotations

import functools
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import numpy as np

from tb_gpuadvisor.arrays import SortedKeys, distinct_small_ints
from tb_gpuadvisor import cores
from tb_gpuadvisor.model import kernels
from tb_gpuadvisor.model import intervals as iv
from tb_gpuadvisor.model.intervals import BLOCK, Intervals
from tb_gpuadvisor.model.steps import launch_rows
from tb_gpuadvisor.trust.placement import executor_work_mask, host_op_mask, step_threads
from tb_gpuadvisor.timeline import (
    PS_PER_MS, PS_PER_US, Device, DeviceActivity, HostActivity, HostModel, SessionModel, Steps,
)
from tb_gpuadvisor.kinds import COPY_KINDS, DeviceEventKind, HostEventKind
from tb_gpuadvisor.vocab import pytorch, tensorflow
from tb_gpuadvisor.vocab.gpu import SYNC_CALL as _SYNC_CALL
from tb_gpuadvisor.vocab.tensorflow import EAGER_SINGLE_OP as _EAGER_OP
from tb_gpuadvisor.vocab.tensorflow import INPUT_SEND as _INPUT_SEND
from tb_gpuadvisor.stages import Memo

# What this stage derives from the tables and asks for again (see stages.Memo).
_MEMO = Memo()

if TYPE_CHECKING:
    from tb_gpuadvisor.trust import Trust

@dataclass(frozen=True)
class Category:
    """One part of a step: ``key`` names the per-step JSON column ``<key>_ms``."""

    key: str
    label: str
    group: str      # compute | copy | collective | input | launch | host | gap | not_traced | setup


# Every microsecond of a step belongs to exactly one of these, in this priority order: device
# work first (compute > collectives > copies), then time the device's trace does not cover,
# then device idle time by what the host was doing.
CATEGORIES = (
    Category("compute_fp32_eligible", "Tensor-Core-eligible 32-bit compute", "compute"),
    Category("compute_16bit", "16-bit compute", "compute"),
    Category("compute_other", "other compute", "compute"),
    Category("collective_transfer", "collective transfer", "collective"),
    Category("collective_wait", "waiting for the slowest replica", "collective"),
    Category("copy_h2d", "host-to-device copies", "copy"),
    Category("copy_d2h", "device-to-host copies", "copy"),
    Category("copy_other", "other copies and memsets", "copy"),
    Category("not_traced", "not traced", "not_traced"),
    Category("setup", "one-time set-up (device idle)", "setup"),
    Category("input", "waiting for input", "input"),
    Category("host_ops", "host ops (device idle)", "host"),
    Category("launch", "launch and dispatch", "launch"),
    Category("other_host", "other host work", "host"),
)
CATEGORY_KEYS = tuple(c.key for c in CATEGORIES)
# Categories a report shows only where some step has time in them (most captures have none).
SHOWN_WHEN_PRESENT = frozenset({"setup"})
# The busy parts besides compute, in the order the busy set grows by them.
BUSY_KEYS = ("collective", "copy_h2d", "copy_d2h", "copy_other")
# The interval sets every device's breakdown keeps (``DeviceBreakdown.sets``): the time assigned to
# each cause, what a check marks on the step timeline (checks.base.Marks); "compute" on the primary
# device only, "copy" the three copy sets together.
SET_KEYS = ("compute", "collective", "copy_h2d", "copy_d2h", "copy_other", "copy", "not_traced", "input",
            "host_ops", "launch", "other_host")
# What bounded a step: its largest group of categories (the critical path's kind).
BOUND_GROUPS = {"compute": "device compute", "copy": "copies", "collective": "communication",
                "input": "input", "launch": "host", "host": "host", "setup": "one-time set-up"}


@dataclass
class DeviceBreakdown:
    """Per-step time split of one device; ``parts`` maps every category key to int64
    picoseconds per step, and the parts add up to ``duration``.

    ``sets`` holds the interval sets (sorted, disjoint, inside steps) of the categories that
    are time ranges, so checks can find the longest gaps of each kind and the host work that
    overlapped them (the collective split is per step only: who waited is known per step).
    The compute classes are per step only, and only the primary device keeps its compute
    ranges (``Breakdown.primary``: the report's median step path and busy set): no check or
    replay reads the others, and on a big capture they were the largest sets.
    """

    device: Device
    duration: np.ndarray
    parts: dict[str, np.ndarray]
    sets: dict[str, Intervals]

    @property
    def name(self) -> str:
        return self.device.name

    @functools.cached_property
    def busy_set(self) -> Intervals:
        """The primary device's busy time, grown from compute as ``_split`` grew it; found when a
        check asks, not kept for every device."""
        busy = self.sets["compute"]
        for key in BUSY_KEYS:
            if self.sets[key][0].size:
                busy = iv.union_of(busy, self.sets[key])
        return busy

    @property
    def host(self) -> str:
        return self.device.host

    def part(self, name: str) -> np.ndarray:
        """Per-step ps of a category key, or of a group of categories ("compute", "copy"...)."""
        if name in self.parts:
            return self.parts[name]
        keys = [c.key for c in CATEGORIES if c.group == name]
        if not keys:
            raise KeyError(f"no breakdown category or group {name!r}")
        return np.sum([self.parts[k] for k in keys], axis=0).astype(np.int64)

    @property
    def idle(self) -> np.ndarray:
        return self.duration - self.busy

    @property
    def busy(self) -> np.ndarray:
        return self.part("compute") + self.part("collective") + self.part("copy")

    def total(self, part: str) -> int:
        """Sum over all steps of one part ("compute", "input", a category key...), in ps."""
        return int(np.sum(self.part(part)))

    def percent(self, part: str) -> float:
        """One part as a percentage of the summed step time."""
        duration = int(np.sum(self.duration))
        return 100.0 * self.total(part) / duration if duration else 0.0

    def shown_keys(self) -> tuple[str, ...]:
        """The category keys a report shows for this device (``SHOWN_WHEN_PRESENT``)."""
        return tuple(k for k in CATEGORY_KEYS if k not in SHOWN_WHEN_PRESENT or self.parts[k].any())

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
            **{f"{key}_ms": _ms(self.total(key) / n) for key in self.shown_keys()},
        }


@dataclass
class Breakdown:
    """Step breakdown of every measured device; ``primary`` is the one the step table shows (the
    model's primary_gpu on a GPU capture: measured_devices lists the GPUs in host order)."""

    steps: Steps
    devices: list[DeviceBreakdown]
    device_kind: str            # "gpu", "tpu" or "cpu" (host as the device)

    @property
    def primary(self) -> DeviceBreakdown | None:
        return self.devices[0] if self.devices else None

    @property
    def bound_kinds(self) -> list[str]:
        """BOUND_GROUPS' distinct kinds, in words for this capture: on a CPU-only one the compute
        is the CPU's (there is no device)."""
        kinds = list(dict.fromkeys(BOUND_GROUPS.values()))
        return ["CPU compute" if k == "device compute" and self.device_kind == "cpu" else k for k in kinds]

    def bounds(self) -> np.ndarray:
        """Per step, the index into ``bound_kinds`` of what bounded it on the primary device: the
        kind holding the most of the step (not-traced time bounds nothing)."""
        kinds = list(dict.fromkeys(BOUND_GROUPS.values()))
        primary = self.primary
        totals = np.zeros((len(kinds), len(self.steps)), np.int64)
        for category in CATEGORIES:
            if category.group in BOUND_GROUPS:
                totals[kinds.index(BOUND_GROUPS[category.group])] += primary.parts[category.key]
        return np.argmax(totals, axis=0)

    @functools.cached_property
    def critical_path(self) -> dict:
        """What bounded the steps (share of steps per kind) and the median step's path as ranges
        (the step JSON and the report's bottleneck both read it: measured once)."""
        primary = self.primary
        if primary is None or not len(self.steps):
            return {"shares": {}, "median_step": None}
        kinds = self.bound_kinds
        bounds = self.bounds()
        counts = np.bincount(bounds, minlength=len(kinds))
        shares = {kind: round(100.0 * int(c) / len(self.steps), 1) for kind, c in zip(kinds, counts) if c}
        order = np.argsort(primary.duration, kind="stable")
        median = int(order[(order.size - 1) // 2])
        lo, hi = int(self.steps.start_ps[median]), int(self.steps.end_ps[median])
        ranges = _labelled_ranges(primary.sets, lo, hi, kinds[0])
        return {"shares": shares, "median_step": {
            "step": int(self.steps.number[median]), "start_ms": _ms(lo), "end_ms": _ms(hi),
            "bound_by": kinds[int(bounds[median])], "ranges": ranges}}

    def to_json(self) -> dict:
        primary = self.primary
        steps = []
        shown = primary.shown_keys() if primary is not None else CATEGORY_KEYS
        if primary is not None:
            columns = {"duration_ms": primary.duration, **{f"{key}_ms": primary.parts[key] for key in shown}}
            rounded = {key: np.round(values / PS_PER_MS, 3).tolist() for key, values in columns.items()}
            starts = np.round(self.steps.start_ps / PS_PER_MS, 3).tolist()
            numbers = self.steps.number.tolist()
            steps = [{"step": int(numbers[i]), "start_ms": starts[i],
                      **{key: values[i] for key, values in rounded.items()}}
                     for i in range(len(self.steps))]
        return {
            "device": primary.name if primary else None,
            "categories": [{"key": c.key, "label": c.label, "group": c.group} for c in CATEGORIES if c.key in shown],
            "steps": steps,
            "per_device": [dev.to_json() for dev in self.devices],
            "critical_path": self.critical_path,
        }


# At most this many ranges of the median step's path are listed (the longest, in time order).
PATH_RANGES = 40


def _labelled_ranges(sets: dict[str, Intervals], lo: int, hi: int, compute: str) -> list[dict]:
    """The categories' time ranges inside [lo, hi), adjacent ranges of one kind merged (COMPUTE
    names the compute kind)."""
    starts, ends, labels = [], [], []
    for key, group in (("compute", compute), ("collective", "communication"), ("copy", "copies"),
                       ("not_traced", "not traced"), ("input", "input"), ("host_ops", "host"),
                       ("launch", "host"), ("other_host", "host"), ("setup", "one-time set-up")):
        s, e = iv.clip(sets[key], lo, hi)
        starts.append(s)
        ends.append(e)
        labels += [group] * s.size
    s, e = np.concatenate(starts), np.concatenate(ends)
    order = np.argsort(s, kind="stable")
    merged: list[list] = []
    for i in order:
        if merged and merged[-1][2] == labels[i] and merged[-1][1] >= s[i]:
            merged[-1][1] = max(merged[-1][1], int(e[i]))
        else:
            merged.append([int(s[i]), int(e[i]), labels[i]])
    keep = sorted(sorted(range(len(merged)), key=lambda j: merged[j][0] - merged[j][1])[:PATH_RANGES])
    return [{"kind": merged[j][2], "start_ms": _ms(merged[j][0]), "end_ms": _ms(merged[j][1])} for j in keep]


def _ms(ps: float) -> float:
    return round(float(ps) / PS_PER_MS, 3)


def _set(starts: np.ndarray, ends: np.ndarray, mask: np.ndarray | None = None) -> Intervals:
    return iv.union(starts, ends, mask)


def _merge(*sets: Intervals) -> Intervals:
    return iv.union(np.concatenate([s for s, _ in sets]), np.concatenate([e for _, e in sets]))


def _both(a: Intervals, b: Intervals) -> Intervals:
    """Intersection, walking the smaller set through the larger one (its cost follows the first)."""
    if not a[0].size or not b[0].size:
        return iv.EMPTY
    return iv.intersect(a, b) if a[0].size <= b[0].size else iv.intersect(b, a)


@dataclass
class _Dispatch:
    """A host's events that launch or dispatch device work, grouped once for all its devices.

    Launch calls are linked to a device by correlation id (calls without one count for every
    device of the host); framework op events count for a device when it ran an op of the same
    node name (ops without device annotations count for every device); executor scheduling
    counts for every device. The parts every device shares are merged once per set of op
    names (replicas run the same ops), so each device adds only its own launches.
    """

    # Kept in this stage's memo of its host's activity, so it holds no reference back to the activity (that
    # cycle kept every host event of a pool worker's earlier hosts alive until the collector ran).
    own: list[np.ndarray]           # per device position: int32 rows of the launches joined to it
    allocator: Intervals            # allocator calls (cudaFree...): not launch cost
    shared: Intervals               # unjoined launches and executor scheduling: every device's
    ops: np.ndarray                 # int32 rows of the framework op events
    _common: dict = field(default_factory=dict)     # frozenset of op names -> Intervals

    @classmethod
    def of(cls, host: HostModel, by_rate: bool = False) -> "_Dispatch":
        """The host's index, built once and kept with its events (it does not depend on steps).

        BY_RATE (PyTorch): an op's dispatch is the host's time between two launch calls that
        follow each other closely (``launch_rate_gaps``), not the whole of every op: an aten op
        that computes on the CPU, or milliseconds of Python before a kernel, are not launch cost.
        Synchronize calls are never launch cost either (the host waits for the device there)."""
        found = _MEMO.of(host.activity).get("dispatch")
        if found is None:
            activity = host.activity
            kind = activity.kind
            target = launch_targets(host)
            launches = activity.rows_of(HostEventKind.LAUNCH)
            to = target[launches]
            # One pass per device keeps its rows in start order (a stable sort of every launch by
            # device cost ten times more).
            own = [launches[to == position] for position in range(len(host.devices))]
            shared = ((kind == HostEventKind.LAUNCH) & (target == -1)) | (kind == HostEventKind.EXECUTOR)
            not_launch = kind == HostEventKind.ALLOCATOR
            shared_set = _set(activity.start_ps, activity.end_ps, shared)
            ops = activity.rows_of(HostEventKind.FRAMEWORK_OP)
            # A sampled or filtered trace lost most launch calls: the gaps between those left say
            # nothing of the launch rate, and its ops stand in for the launches they made.
            if by_rate and host.partial_trace is None:
                not_launch = (not_launch | (kind == HostEventKind.FIRST_USE) | (kind == HostEventKind.SLOW_LAUNCH)
                              | kernels.named_events(activity, "sync", _SYNC_CALL.search))
                shared_set = iv.union_of(shared_set, launch_rate_gaps(activity))
                ops = ops[:0]
            found = _MEMO.of(host.activity)["dispatch"] = cls(
                own, _set(activity.start_ps, activity.end_ps, not_launch), shared_set, ops)
        return found

    def common(self, activity: HostActivity, device_ops: frozenset[str]) -> Intervals:
        """What every device with ops named DEVICE_OPS counts (all ops when it names none)."""
        found = self._common.get(device_ops)
        if found is None:
            rows = self.ops
            if device_ops:
                rows = rows[kernels.name_mask(activity.names, lambda n: tensorflow.op_key(n) in device_ops)[activity.name[rows]]]
            found = self._common[device_ops] = iv.union_of(
                self.shared, _set(activity.start_ps[rows], activity.end_ps[rows]))
        return found

    def launch_set(self, activity: HostActivity, dev: DeviceActivity, position: int) -> Intervals:
        """When the host (ACTIVITY) launched or dispatched work for DEV (at POSITION in its devices)."""
        rows = self.own[position]
        return iv.union_of(self.common(activity, _op_keys(dev)), _set(activity.start_ps[rows], activity.end_ps[rows]))


# Eager PyTorch dispatches the next launch 20-340 us after the last one returns (the corpus's
# eager captures, 10th to 99th percentile: Python, the dispatcher, ops that launch nothing).
# A longer gap is host work of another kind (CPU compute, input, first-use set-up, a custom
# op's preparation): the GPU idling in it does not wait for the launch rate.
DISPATCH_GAP_PS = 500 * PS_PER_US


def launch_rate_gaps(activity: HostActivity) -> Intervals:
    """The host's time between consecutive launch calls of one thread, where the next one
    followed within ``DISPATCH_GAP_PS``: dispatching launches back to back."""
    rows = activity.rows_of(HostEventKind.LAUNCH)
    if rows.size < 2:
        return iv.EMPTY
    rows = rows[np.lexsort((activity.start_ps[rows], activity.thread[rows]))]
    after, before = rows[1:], rows[:-1]
    lo, hi = activity.end_ps[before], activity.start_ps[after]
    close = (activity.thread[after] == activity.thread[before]) & (hi > lo) & (hi - lo <= DISPATCH_GAP_PS)
    return iv.union(lo[close], hi[close])


def launch_targets(host: HostModel) -> np.ndarray:
    """For every host event, the position in ``host.devices`` of the device that ran the work
    it launched (joined by correlation id), -1 when none; computed once per host."""
    targets = _MEMO.of(host.activity).get("launch_targets")
    if targets is None:
        keys = [d.correlation_id[d.correlation_id >= 0] for d in host.devices]
        positions = [np.full(k.size, i, np.int32) for i, k in enumerate(keys)]
        table = SortedKeys(np.concatenate(keys) if keys else np.empty(0, np.int64),
                           np.concatenate(positions) if positions else np.empty(0, np.int32))
        del keys, positions
        # Looked up in blocks: the look-up's temporaries stay small (see intervals.BLOCK). A host's
        # device positions fit int8 (a quarter of the memory of a column over every host event).
        ids = host.activity.correlation_id
        targets = np.empty(ids.size, np.int8 if len(host.devices) <= np.iinfo(np.int8).max else np.int32)
        for first in range(0, ids.size, BLOCK):
            targets[first:first + BLOCK] = table.get(ids[first:first + BLOCK], -1)
        _MEMO.of(host.activity)["launch_targets"] = targets
    return targets


def _now(value: Intervals) -> Callable[[], Intervals]:
    return lambda: value


@dataclass
class _DeviceSets:
    """The raw interval sets of one device and its host, before they are made disjoint. The host's
    op and launch sets come as functions that give them: another thread may still be making them
    while ``_split`` finds the device's busy time and idle gaps, which need no host event."""

    compute: Intervals = iv.EMPTY
    compute_low: Intervals = iv.EMPTY
    compute_fp32_eligible: Intervals = iv.EMPTY
    collective: Intervals = iv.EMPTY
    copy_h2d: Intervals = iv.EMPTY
    copy_d2h: Intervals = iv.EMPTY
    copy_other: Intervals = iv.EMPTY
    covered: Intervals | None = None      # None: the trace covers every step
    setup: Intervals = iv.EMPTY           # the host's one-time set-up (trust)
    waits: Callable[[], Intervals] = _now(iv.EMPTY)
    host_ops: Callable[[], Intervals] = _now(iv.EMPTY)
    launch: Callable[[], Intervals] = _now(iv.EMPTY)
    syncs: Intervals | None = None        # PyTorch's sync ops: idle that begins in one is not launch time
    host_traced: bool = True              # False: the host recorded nothing, so no idle has a known cause


def _gaps_from(idle: Intervals, calls: Intervals) -> Intervals:
    """The gaps of IDLE (disjoint, sorted) that begin inside one of CALLS (disjoint, sorted)."""
    starts, ends = idle
    if not calls[0].size:
        return iv.EMPTY
    at = np.searchsorted(calls[0], starts, side="right") - 1
    inside = (at >= 0) & (starts < calls[1][np.clip(at, 0, None)])
    return starts[inside], ends[inside]


class _Done:
    """A value made at once, read like a pool's future (``_split`` without a pool)."""

    def __init__(self, work: Callable, *args) -> None:
        self.value = work(*args)

    def result(self) -> object:
        return self.value


def _split(device: Device, windows: Intervals, steps: Steps, raw: _DeviceSets,
           pool: Executor | None = None) -> DeviceBreakdown:
    """Cut a window set into the disjoint categories, in priority order, and total each per step.
    POOL (a device measured alone) takes the parts that do not depend on each other: the compute
    classes beside the busy time, and the per-step totals."""
    lo, hi = steps.start_ps, steps.end_ps
    run = pool.submit if pool is not None else _Done
    sets: dict[str, Intervals] = {}

    def within(candidate: Intervals) -> Intervals:
        if windows[0].size == 1:        # contiguous steps: a clip, much cheaper than an intersection
            return iv.clip(candidate, int(windows[0][0]), int(windows[1][0]))
        return iv.intersect(candidate, windows)

    # 16-bit and eligible kernels are compute kernels, so their sets lie inside compute's.
    compute = within(raw.compute)
    low = within(raw.compute_low)
    fp32 = within(raw.compute_fp32_eligible)
    fp32 = iv.subtract(fp32, low) if low[0].size and fp32[0].size else fp32
    other = run(lambda: iv.cut(compute, iv.union_of(low, fp32)))
    busy = compute
    for key in BUSY_KEYS:
        candidate = getattr(raw, key)
        sets[key] = part = within(iv.subtract(candidate, busy)) if candidate[0].size else iv.EMPTY
        if part[0].size:
            busy = iv.union_of(busy, part)
    # The rest of the steps is device idle time, cut by priority; what is left is other host work.
    rest = iv.cut(windows, busy)
    gaps = iv.EMPTY if raw.syncs is None else _gaps_from(rest, raw.syncs)

    def launch() -> Intervals:
        return raw.launch() if raw.syncs is None else iv.subtract(raw.launch(), gaps)
    for key, candidate in (("not_traced", None), ("setup", _now(raw.setup)), ("input", raw.waits),
                           ("host_ops", raw.host_ops), ("launch", launch)):
        if key == "not_traced" and not raw.host_traced:
            part = rest
        elif key == "not_traced":
            part = iv.EMPTY if raw.covered is None else iv.cut(rest, _both(rest, raw.covered))
        else:
            part = _both(rest, candidate())
        sets[key] = part
        rest = iv.cut(rest, part)
    sets["other_host"] = rest

    def per_step(s: Intervals) -> np.ndarray:
        return iv.per_bin_total(s, lo, hi)

    ranges = {"compute_16bit": low, "compute_fp32_eligible": fp32, "compute_other": other.result(), **sets}
    totals = {key: run(per_step, ranges[key]) for key in CATEGORY_KEYS if key in ranges}
    collective = run(per_step, sets["collective"])
    parts = {key: total.result() for key, total in totals.items()}
    parts["collective_transfer"] = collective.result()     # split by compute_breakdown
    parts["collective_wait"] = np.zeros(len(steps), np.int64)
    sets["compute"] = compute
    sets["copy"] = _merge(sets["copy_h2d"], sets["copy_d2h"], sets["copy_other"])
    return DeviceBreakdown(device=device, duration=(hi - lo).astype(np.int64), parts=parts, sets=sets)


def collective_wait(coll: np.ndarray) -> np.ndarray:
    """Per replica and step (rows x steps of collective time), the part spent waiting.

    Replicas leave a collective together, so the one that arrived last spent only the transfer
    in it; what the others spent beyond the shortest of the replicas that ran one they waited
    for the slowest replica.
    """
    ran = coll > 0
    floor = np.where(ran, coll, np.iinfo(np.int64).max).min(axis=0)
    floor = np.where(ran.any(axis=0), floor, 0)
    return np.where(ran, coll - floor, 0).astype(np.int64)


def _split_collective_wait(devices: list[DeviceBreakdown]) -> None:
    """Each replica's collective time split into transfer and waiting (see collective_wait)."""
    if len(devices) < 2:
        return
    coll = np.vstack([dev.parts["collective_transfer"] for dev in devices])
    for dev, row, wait in zip(devices, coll, collective_wait(coll)):
        dev.parts["collective_wait"] = wait
        dev.parts["collective_transfer"] = row - wait


def _input_waits(host: HostModel, torch: bool = False) -> Intervals:
    """When the host waited on tf.data or the DataLoader, or (TORCH, PyTorch) prepared the batch in
    the loop itself (``cpu_preprocessing``) or handed it to the device (inside the runtime calls of
    host-to-device copies, ``batch_copies``); shared by every device of the host, built once."""
    key = "input_waits_torch" if torch else "input_waits"
    waits = _MEMO.of(host.activity).get(key)
    if waits is None:
        activity = host.activity
        mask = (activity.kind == HostEventKind.INPUT_WAIT) | kernels.named_events(
            activity, "input_sends", _INPUT_SEND.search)
        if torch:
            mask = mask | batch_copies(host) | cpu_preprocessing(host)
        waits = _MEMO.of(host.activity)[key] = _set(activity.start_ps, activity.end_ps, mask)
    return waits


def cpu_preprocessing(host: HostModel) -> np.ndarray:
    """Per host event (PyTorch): the step's input prepared on the host inside the loop, a scope or
    Python frame the vocabulary names so (``pytorch.is_preprocessing``: an image processor, a video
    decode) inside which its thread launched no kernel, and not inside a post-processing frame. The
    device has nothing of the step to run meanwhile, so its idle then is the input's, as if the loop
    waited on a DataLoader that prepares batches in its own process; a scope that launches kernels
    prepares on the device, which is the device's work."""
    activity = host.activity
    found = _MEMO.of(activity).get("cpu_preprocessing")
    if found is not None:
        return found
    found = kernels.named_events(activity, "preprocessing", pytorch.is_preprocessing).copy()
    rows = np.flatnonzero(found)
    if rows.size:
        launches = np.zeros(len(activity), bool)
        for dev in host.devices:
            launched = launch_rows(activity, dev)[~dev.mask(*COPY_KINDS)]
            launches[launched[launched >= 0]] = True
        launched = np.flatnonzero(launches)
        post = np.flatnonzero(kernels.named_events(activity, "postprocessing", pytorch.is_postprocessing))
        for thread in np.unique(activity.thread[rows]):
            spans = rows[activity.thread[rows] == thread]
            at = np.sort(activity.start_ps[launched[activity.thread[launched] == thread]])
            inside = (np.searchsorted(at, activity.end_ps[spans]) - np.searchsorted(at, activity.start_ps[spans]))
            found[spans[inside > 0]] = False
            mine = post[activity.thread[post] == thread]
            if mine.size:
                outputs = iv.union(activity.start_ps[mine], activity.end_ps[mine])
                within = np.searchsorted(outputs[0], activity.start_ps[spans], side="right") - 1
                found[spans[(within >= 0) & (activity.start_ps[spans] < outputs[1][np.clip(within, 0, None)])]] = False
    found.flags.writeable = False
    _MEMO.of(activity)["cpu_preprocessing"] = found
    return found


def batch_copies(host: HostModel) -> np.ndarray:
    """Per host event: a call that copied data host-to-device (joined to its copy by correlation id).
    A pageable batch's call lasts while the driver stages it: the device idles behind the copy's
    host side, a cost of feeding input (pinned memory and non_blocking=True take it away)."""
    activity = host.activity
    mask = np.zeros(len(activity), bool)
    for dev in host.devices:
        rows = launch_rows(activity, dev)[dev.kind == DeviceEventKind.MEMCPY_H2D]
        mask[rows[rows >= 0]] = True
    return mask


@dataclass
class _HostSide:
    """What one device's breakdown reads of its host's events, as functions that give it (the
    pool's threads may be making it, see ``_DeviceSets``)."""

    waits: Callable[[], Intervals]
    host_ops: Callable[[], Intervals]
    launch: Callable[[], Intervals]


def _gpu_breakdown(dev: DeviceActivity, host: HostModel, windows: Intervals, steps: Steps, covered: Intervals | None,
                   setup: Intervals, side: _HostSide, by_rate: bool, pool: Executor | None = None) -> DeviceBreakdown:
    start, end = dev.start_ps, dev.end_ps
    # Kernel classes (16-bit, collectives) come from model.kernels, cached per device and
    # shared with the precision and collectives checks, so the breakdown and they agree.
    classes = kernels.classify(dev)
    activity = host.activity
    kind = dev.kind
    return _split(dev.device, windows, steps, _DeviceSets(
        compute=_set(start, end, classes.kernel), compute_low=_set(start, end, classes.low_precision),
        compute_fp32_eligible=_set(start, end, fp32_eligible(classes)),
        collective=_set(start, end, classes.collective),
        copy_h2d=_set(start, end, kind == DeviceEventKind.MEMCPY_H2D),
        copy_d2h=_set(start, end, kind == DeviceEventKind.MEMCPY_D2H),
        copy_other=_set(start, end, dev.mask(*COPY_KINDS)),
        covered=covered, setup=setup, waits=side.waits, host_ops=side.host_ops, launch=side.launch,
        # After a sync the queue is empty and the device idles until the host launches again: the
        # sync's cost (sync_stalls names it), not the launch rate's.
        syncs=_set(activity.start_ps, activity.end_ps, kernels.named_events(activity, "sync_op", pytorch.is_sync_op))
        if by_rate else None, host_traced=len(activity) > 0), pool)


def _launch_set(host: HostModel, dev: DeviceActivity, by_rate: bool) -> Intervals:
    """When the host launched or dispatched work for DEV, less the time it sat in allocator calls
    (cudaFree/hipFree inside an op block until the device drains: that idle is not launch cost)."""
    dispatch = _Dispatch.of(host, by_rate)
    position = next(i for i, d in enumerate(host.devices) if d is dev)
    launch = dispatch.launch_set(host.activity, dev, position)
    return iv.subtract(launch, dispatch.allocator) if dispatch.allocator[0].size else launch


def _op_keys(dev: DeviceActivity) -> frozenset[str]:
    """The node names of the framework ops DEV ran (how host op events are linked to it)."""
    return frozenset(tensorflow.op_key(dev.ops[i]) for i in distinct_small_ints(dev.op[dev.op >= 0]))


def fp32_eligible(classes: kernels.KernelClasses) -> np.ndarray:
    """Kernels of Tensor-Core-eligible ops computing in 32 bits: what mixed precision speeds up."""
    return classes.eligible & ~classes.low_precision


def host_ops_mask(host: HostModel, steps: Steps) -> np.ndarray:
    """Framework ops that ran on the host's threads and launched no GPU work: while the GPU
    idles behind them it waits for host compute (op placement), not for launches. It depends
    on the steps, so it is not kept on the table (views with other steps share that)."""
    gpus = [d for d in host.devices if d.device.kind == "gpu"]
    return host_op_mask(host.activity, gpus, steps)


def host_device(host: HostModel) -> Device:
    """The host CPU as a device, for CPU-only captures."""
    for dev in host.devices:
        if dev.device.kind == "cpu":
            return dev.device
    return Device(name="/host:CPU", host=host.name, kind="cpu", index=0)


def _cpu_breakdown(host: HostModel, windows: Intervals, steps: Steps, torch: bool) -> DeviceBreakdown:
    activity = host.activity
    start, end = activity.start_ps, activity.end_ps
    waits = _input_waits(host, torch)
    # Ops of tf.data map functions run ahead on pipeline threads; they are not the step's compute.
    # Eagerly executed ops (a step not in tf.function) are compute too, and so is the executor
    # running the step's graph on its own threads (all there is when ops were not traced).
    eager = kernels.named_events(activity, "eager_ops", _EAGER_OP.match)
    step_ops = (((activity.kind == HostEventKind.FRAMEWORK_OP) | eager) & step_threads(activity)
                | executor_work_mask(activity))
    ops = iv.subtract(_set(start, end, step_ops), waits)
    # Collectives between ranks (gloo's, on its own threads) are the host's collective time: split
    # like a GPU's into transfer and waiting for the slowest rank, never host overhead.
    collective = _set(start, end, kernels.named_events(activity, "host_collectives", pytorch.HOST_COLLECTIVE.match))
    # The waits are handed over as the compute-free part of the step, so they land in ``input``.
    return _split(host_device(host), windows, steps, _DeviceSets(compute=ops, waits=_now(waits), collective=collective))


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


def _measure(pair: tuple[DeviceActivity | None, HostModel], windows: Intervals, steps: Steps,
             trust: "Trust | None", side: Callable[[DeviceActivity, HostModel], _HostSide], by_rate: bool,
             pool: Executor | None = None) -> DeviceBreakdown:
    dev, host = pair
    if dev is None:
        return _cpu_breakdown(host, windows, steps, by_rate)
    covered = trust.covered_by(dev.device.name) if trust is not None else None
    setup = trust.setup.get(host.name, iv.EMPTY) if trust is not None else iv.EMPTY
    return _gpu_breakdown(dev, host, windows, steps, covered, setup, side(dev, host), by_rate, pool)


def compute_breakdown(model: SessionModel, trust: "Trust | None" = None) -> Breakdown:
    """Attribute every trusted step of every measured device; TRUST gives the time each
    device's trace covers (step time outside it is "not traced", never idle) and each host's
    one-time set-up."""
    steps = model.steps
    windows = iv.union(steps.start_ps, steps.end_ps) if len(steps) else iv.EMPTY
    kind, pairs = measured_devices(model)
    # Per-host parts, before the device threads share them (every GPU of a host reads the same
    # host-op time, input waits and launch index).
    hosts = {id(h): h for dev, h in pairs if dev is not None}
    by_rate = model.framework == pytorch.FRAMEWORK

    def host_ops_set(host: HostModel) -> Intervals:
        return _set(host.activity.start_ps, host.activity.end_ps, host_ops_mask(host, steps))

    def host_parts(host: HostModel) -> Intervals:
        dispatch = _Dispatch.of(host, by_rate)
        for dev in (d for d, h in pairs if h is host):  # the launch sets' shared part, once per op set
            dispatch.common(host.activity, _op_keys(dev))
        return _input_waits(host, torch=by_rate)

    threads = cores.threads(cores.DEVICE_THREADS)
    if threads < 2 or len(pairs) < 2 and not hosts:     # one host measured as the device: nothing to spread
        host_ops = {key: host_ops_set(host) for key, host in hosts.items()}
        waits = {key: host_parts(host) for key, host in hosts.items()}
        devices = [_measure(pair, windows, steps, trust, lambda dev, host: _HostSide(
            _now(waits[id(host)]), _now(host_ops[id(host)]), _now(_launch_set(host, dev, by_rate))), by_rate)
            for pair in pairs]
    else:
        # Devices are measured in parallel: the interval algebra is numpy and C work that releases
        # the GIL. The host parts go first, two tasks per host (the host-op time; the launch index
        # and the waits). A device measured alone (one GPU) spreads its own parts on the threads
        # instead: its host's launch set is made beside its busy time and idle gaps.
        with ThreadPoolExecutor(max_workers=threads) as pool:
            ops = {key: pool.submit(host_ops_set, host) for key, host in hosts.items()}
            parts = {key: pool.submit(host_parts, host) for key, host in hosts.items()}
            if len(pairs) > 1:
                for done in parts.values():
                    done.result()
                devices = list(pool.map(lambda pair: _measure(pair, windows, steps, trust, lambda dev, host: _HostSide(
                    parts[id(host)].result, ops[id(host)].result, _now(_launch_set(host, dev, by_rate))), by_rate), pairs))
            else:
                def alone(dev: DeviceActivity, host: HostModel) -> _HostSide:
                    def launch() -> Intervals:
                        parts[id(host)].result()        # the launch index it reads
                        return _launch_set(host, dev, by_rate)
                    return _HostSide(parts[id(host)].result, ops[id(host)].result, pool.submit(launch).result)
                devices = [_measure(pairs[0], windows, steps, trust, alone, by_rate, pool)]
    _split_collective_wait(devices)
    for dev in devices[1:]:     # compute ranges are read on the primary only (see DeviceBreakdown)
        del dev.sets["compute"]
    return Breakdown(steps=steps, devices=devices, device_kind=kind)
