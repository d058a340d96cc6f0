"""collectives: how much of the step goes to gradient AllReduce and other collectives?

## What it measures
On every GPU, collective kernels (NCCL/RCCL, XLA all-reduce/all-gather/reduce-scatter) inside
the profiled steps. ``collective_percent``: their busy time (union over streams) as a share
of the step time, averaged over GPUs; ``exposed_collective_percent``: the part not hidden
behind the same GPU's compute; ``allreduce_calls_per_step``: AllReduce kernels per step per
GPU. When the capture records the allocations of the model's variable initializers, the
parameter count gives the AllReduce time to expect: parameters x 4 bytes (gradients are
reduced in float32 even under mixed precision) / link bandwidth, with an assumed
50 GB/s link (between PCIe 4.0 x16 and NVLink); otherwise the finding says it cannot.

## Why it matters
Every synchronous data-parallel step waits for its gradient AllReduce. Its cost depends on
the model size, not the batch size, so it is amortised by larger batches; AllReduce calls
beyond one per gradient bucket add a synchronisation across all devices each. Warning when
collectives take >= 15% of the step; where the trace names the calls (PyTorch), also when their
exposed transfer is >= 3% of the step and the step's largest cost besides compute (more than its
copies, input waits, host work or launches) and the overlap fix hides at least 0.2 ms of it: a
well-tuned rank whose one exposed cost is its communication. That finding is of medium confidence:
its saving is what overlapping can hide, which the trace bounds but does not measure.

## How to fix
Raise the per-replica batch size to amortise communication, remove AllReduce calls outside
the gradient reduction (metrics reduced every step, manual ``all_reduce`` in the loop), and
let the cross-device ops pack gradients into few buckets.

Where the trace names each call (PyTorch: ``record_param_comms``, ``nccl:*`` annotations),
``exposed_collective_ms_per_step`` is the collective time with no compute kernel alongside on
any stream, and the ranks of a many-host session are matched call by call (checks/_ranks.py):
its waiting part (``collective_wait_ms_per_step``, a rank arriving early and waiting for the
last) is multi_gpu_imbalance's, the rest is transfer. The fix is to overlap the calls with
compute: DDP buckets (``bucket_cap_mb``, ``gradient_as_bucket_view``) for all-reduces, with a
registered comm hook compressing what they move, FSDP ``forward_prefetch``/``backward_prefetch``
and ``limit_all_gathers`` for all-gathers and reduce-scatters, ``async_op=True`` for all-to-all.
Its saving (``overlap_saving_ms_per_step``), per step and GPU from the timeline: the exposed
transfer beyond what has to stay exposed (per kind with several calls in the step, the most
exposed call: the first gather before any compute, the last gradient reduction after the last
gradient; a kind's only call can be split into buckets that overlap), bounded by the compute not
yet alongside a collective, and for gradient reductions (all-reduce, reduce-scatter: issued from
backward hooks as each bucket's gradients are ready) by the backward compute they can run behind.

Savings model (TensorFlow, JAX: calls not named): only the transfer counts. Time a replica
spends inside a collective waiting for the slowest one (its collective time beyond the shortest
replica's in that step) is the straggler's, reported and saved by multi_gpu_imbalance. The
saving is the transfer time above params x 4 B / bandwidth when the parameter count is known;
otherwise the exposed transfer time above 5% of the step.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from tb_gpuadvisor.attribution.breakdown import CATEGORIES
from tb_gpuadvisor.model import kernels
from tb_gpuadvisor.checks.context import WARNING_MIN_MS, Analysis, StepScale, judged, measurement
from tb_gpuadvisor.checks import _ranks, fixes
from tb_gpuadvisor.checks.fixes import GPU_PERF_GUIDE, Remedy
from tb_gpuadvisor.checks.base import (
    NoMarks,
    Compared, CrossHost, DevicePart, Finding, HostAlignment, NoReplay, Severity, measured_parts, needs_gpu,
    register,
)
from tb_gpuadvisor.checks.finding import Evidence, Fix
from tb_gpuadvisor.model import intervals
from tb_gpuadvisor.model.steps import launch_rows
from tb_gpuadvisor.timeline import PS_PER_MS, DeviceActivity, SessionModel
from tb_gpuadvisor.vocab import pytorch, tensorflow

CHECK_ID = "collectives"
WARNING_AT = 15.0
# Exposed collective transfer this share of the step (%) or more that is the step's largest cost
# besides compute is a warning however small a share of the step the collectives take.
EXPOSED_WARNING_AT = 3.0
# The step's other costs it is weighed against: the breakdown's groups of device idle and copies
# (one-time set-up and untraced time are no cost of a steady step), in words.
OTHER_COSTS = {"copy": "copies", "input": "waiting for input", "host": "host work", "launch": "kernel launches"}
ASSUMED_LINK_BYTES_PER_S = 50e9
ACCEPTABLE_FRACTION = 0.05     # exposed collective time treated as the unavoidable cost
BYTES_PER_GRADIENT = 4
TOP = 5
ALL_REDUCE = "all-reduce"
# Calls that reduce gradients: issued from backward hooks as each bucket's gradients are ready, one
# can hide only behind the backward compute still to run, never behind the forward pass.
GRADIENT_REDUCTIONS = frozenset({ALL_REDUCE, "reduce-scatter"})
# Bus bandwidth per algorithm bandwidth of a collective over n ranks (the NCCL tests' factors): an
# all-reduce moves each byte out and back, the others each byte once, to the n-1 other ranks.
BUS_FACTOR = {ALL_REDUCE: lambda n: 2 * (n - 1) / n, "all-gather": lambda n: (n - 1) / n,
              "reduce-scatter": lambda n: (n - 1) / n, "all-to-all": lambda n: (n - 1) / n}
# The torch remedy for a kind of collective that is exposed, in the order the evidence ranks them.
# DDP's all-reduces also move half the bytes when a comm hook compresses the gradients to bf16.
TORCH_COMM_HOOK = Fix(
    "Halve what each DDP all-reduce moves: register a communication hook that sends the gradient buckets "
    "in bf16 (fp16 before Ampere) and restores them after the reduction.",
    "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks\n"
    "model.register_comm_hook(state=None, hook=default_hooks.bf16_compress_hook)",
    "https://pytorch.org/docs/stable/ddp_comm_hooks.html")
TORCH_REMEDY = {ALL_REDUCE: fixes.TORCH_DDP_BUCKETS, "all-to-all": fixes.TORCH_OVERLAP_ALL_TO_ALL,
                "send/recv": fixes.TORCH_OVERLAP_ALL_TO_ALL, "all-gather": fixes.TORCH_FSDP_PREFETCH,
                "reduce-scatter": fixes.TORCH_FSDP_PREFETCH}

FIXES = [
    Remedy("Increase the per-replica batch: the AllReduce cost per step stays the same while each "
        "step does more work.",
        "strategy = tf.distribute.MirroredStrategy()\n"
        "global_batch = 128 * strategy.num_replicas_in_sync   # larger per-replica batch\n"
        "dataset = dataset.batch(global_batch, drop_remainder=True)",
        GPU_PERF_GUIDE, jax=Fix(
            "Increase the per-device batch: the gradient all-reduce per step stays the same while "
            "each step does more work.",
            "global_batch = 128 * jax.device_count()   # larger per-device batch\n"
            "batch = jax.device_put(next_batch(global_batch), data_sharding)",
            fixes.JAX_SHARDING_GUIDE), pytorch=fixes.TORCH_LARGER_BATCH),
    Remedy("Pack gradients into few AllReduce calls and avoid extra cross-replica reductions inside "
        "the step (e.g. reduce metrics once per epoch, not per step).",
        "strategy = tf.distribute.MirroredStrategy(\n"
        "    cross_device_ops=tf.distribute.NcclAllReduce(num_packs=1))",
        "https://www.tensorflow.org/api_docs/python/tf/distribute/NcclAllReduce",
        jax=Fix("Let XLA overlap the gradient collectives with compute: its latency-hiding scheduler "
                "moves collectives so they run while independent kernels execute (set before JAX starts).",
                "import os\nos.environ['XLA_FLAGS'] = '--xla_gpu_enable_latency_hiding_scheduler=true'\n"
                "import jax",
                fixes.JAX_GPU_TIPS), pytorch=fixes.TORCH_DDP_BUCKETS),
]


@dataclass
class KindCollectives:
    """One kind of collective on one GPU, where the trace names each call's kind (PyTorch)."""

    kind: str                 # "all-reduce", "all-to-all", ... (vocab/gpu.py)
    calls: int
    ps: int                   # busy time of its kernels
    exposed_ps: int           # of which not overlapped by the GPU's compute
    sized_calls: int          # calls whose message bytes the trace records
    sized_ps: int
    bytes: int                # over the sized calls
    group_size: int | None
    group: str | None


@dataclass
class GpuCollectives:
    """One GPU's collective work inside the steps (times in ps, totals over all steps), small
    enough to travel from a host's analysis to the merge of a many-host session."""

    label: str
    device: str
    host: str
    busy_ps: int
    exposed_ps: int           # collective time not overlapped by the GPU's compute
    allreduce_calls: int
    calls: int
    allreduce_ps: int
    top: list[tuple[str, int, int]]                   # (kernel, ps, calls) of the longest-running kinds
    longest: tuple[str, int, int, int] | None        # (kernel, ps, start_ps, end_ps) of the longest call
    kinds: list[KindCollectives] = field(default_factory=list)   # most exposed first; empty unless named
    overlap: np.ndarray | None = None     # 4 x step windows where calls are named: exposed, what stays exposed
                                          # (per kind the most exposed call), compute not alongside a collective,
                                          # what an overlap fix can hide at most (``_overlap_room``)


@dataclass
class Collectives:
    """What the collectives judgement needs, however it was measured."""

    rows: list[GpuCollectives]
    windows: int
    step_ps: float            # sum of the step windows
    transfer_ms: float        # per step, mean over replicas
    waiting_ms: float
    param_bytes: int | None
    calls: list[_ranks.RankCalls | None] | None = None   # per row, its group calls (named: PyTorch)
    # The step's largest cost besides compute and collectives (OTHER_COSTS' words, ms per step) on the
    # primary device; of a many-host session, the largest of its hosts'.
    largest_other: tuple[str, float] | None = None


def parameter_bytes(model: SessionModel) -> int | None:
    """Bytes of the model's variables, read from the allocations of their initializers.

    Variables are created once, before training, so this is only known when the capture
    covers model construction; the allocations of one GPU's allocator are used.
    """
    for host in model.hosts:
        mem = host.memory
        if not len(mem) or not mem.ops:
            continue
        init_ops = np.array([tensorflow.INITIALIZER_SCOPE in op for op in mem.ops], bool)
        for index, allocator in enumerate(mem.allocators):
            if not allocator.startswith(tensorflow.GPU_ALLOCATOR_PREFIX):
                continue
            rows = mem.is_alloc & (mem.allocator == index) & (mem.op >= 0)
            rows &= init_ops[np.where(mem.op >= 0, mem.op, 0)]
            total = int(mem.requested_bytes[rows].sum())
            if total:
                return total
    return None


def measure_gpu(dev: DeviceActivity, model: SessionModel) -> GpuCollectives:
    cls = kernels.classify(dev)
    keep = kernels.in_steps(dev, model)
    coll = cls.collective & keep
    compute = cls.kernel & keep
    allreduce = cls.allreduce & keep
    coll_busy = intervals.union(dev.start_ps[coll], dev.end_ps[coll])
    compute_busy = intervals.union(dev.start_ps[compute], dev.end_ps[compute])
    exposed = intervals.subtract(coll_busy, compute_busy)
    kinds = _by_kind(dev, coll, compute_busy) if dev.collective.size else []
    overlap = _overlap_room(dev, model, coll, coll_busy, compute_busy, exposed) if kinds else None
    if kinds:       # the trace names each call's kind: an all-reduce is one whatever its kernel is called
        ids = [i for i, call in enumerate(dev.collectives) if call.kind == ALL_REDUCE]
        allreduce = coll & np.isin(dev.collective, ids)
    top = [(dev.names[name_idx], int(dur), int(count))
           for name_idx, dur, count in kernels.top_by_time(dev.name[coll], dev.dur_ps[coll], TOP)]
    longest = None
    if coll.any():
        i = int(np.flatnonzero(coll)[np.argmax(dev.dur_ps[coll])])
        longest = (dev.names[dev.name[i]], int(dev.dur_ps[i]), int(dev.start_ps[i]), int(dev.end_ps[i]))
    return GpuCollectives(kernels.device_label(model, dev), dev.device.name, dev.device.host, intervals.total(coll_busy),
                          intervals.total(exposed), int(allreduce.sum()), int(coll.sum()),
                          int(dev.dur_ps[allreduce].sum()), top, longest, kinds, overlap)


def _overlap_room(dev: DeviceActivity, model: SessionModel, coll: np.ndarray, coll_busy: intervals.Intervals,
                  compute_busy: intervals.Intervals, exposed: intervals.Intervals) -> np.ndarray | None:
    """Per step window: collective time not alongside compute; the part of it that stays so when the
    calls overlap compute (per kind with several calls in the step, its most exposed call: the first
    gather needs its parameters before any compute, the last gradient reduction follows the last
    gradient; a kind's only call can be split into buckets or per-layer units that overlap);
    compute not yet alongside any collective (what the calls can hide behind); and what the fix can
    hide at most: gradient reductions only behind backward compute (``_backward_kernels``), other
    calls wherever they are exposed (no bound where the host recorded no backward op)."""
    lo, hi, _ = kernels.step_windows(model)
    if not len(model.steps) or dev.step.size != len(dev):
        return None
    rows = np.flatnonzero(coll & (dev.collective >= 0))
    order = rows[np.argsort(dev.start_ps[rows], kind="stable")]
    per_call = intervals.per_bin_total(exposed, dev.start_ps[order], dev.end_ps[order])
    kinds = sorted({call.kind for call in dev.collectives})
    kind_of = np.array([kinds.index(call.kind) for call in dev.collectives])[dev.collective[order]]
    at = (kind_of, dev.step[order].astype(np.int64))
    most, count = np.zeros((len(kinds), lo.size), np.int64), np.zeros((len(kinds), lo.size), np.int64)
    np.maximum.at(most, at, per_call)
    np.add.at(count, at, 1)
    free = intervals.subtract(compute_busy, coll_busy)
    cap = intervals.per_bin_total(exposed, lo, hi)
    backward = _backward_kernels(dev, model)
    if backward is not None:
        ids = [i for i, call in enumerate(dev.collectives) if call.kind in GRADIENT_REDUCTIONS]
        reducing = coll & np.isin(dev.collective, ids)
        others = intervals.subtract(exposed, intervals.union(dev.start_ps[reducing], dev.end_ps[reducing]))
        behind = intervals.intersect(free, intervals.union(dev.start_ps[backward], dev.end_ps[backward]))
        cap = intervals.per_bin_total(others, lo, hi) + intervals.per_bin_total(behind, lo, hi)
    return np.vstack([intervals.per_bin_total(exposed, lo, hi), np.where(count >= 2, most, 0).sum(axis=0),
                      intervals.per_bin_total(free, lo, hi), cap])


def _backward_kernels(dev: DeviceActivity, model: SessionModel) -> np.ndarray | None:
    """Per event of DEV: launched from inside a backward op of its launching thread (the backward
    pass's kernels); None where its host recorded no backward op (inference, or no host trace)."""
    host = next((h for h in model.hosts if any(d is dev for d in h.devices)), None)
    if host is None:
        return None
    act = host.activity
    ops = np.flatnonzero(kernels.named_events(act, "backward_op", pytorch.is_backward_op))
    if not ops.size:
        return None
    # Ops and launches on one axis, thread by thread: a launch is inside an op of its own thread.
    span = int(act.end_ps.max()) + 1
    base = act.thread.astype(np.int64) * span
    starts, ends = intervals.union(base[ops] + act.start_ps[ops], base[ops] + act.end_ps[ops])
    rows = launch_rows(act, dev)
    launched = np.flatnonzero(rows >= 0)
    keys = base[rows[launched]] + act.start_ps[rows[launched]]
    at = np.searchsorted(starts, keys, side="right") - 1
    out = np.zeros(len(dev), bool)
    out[launched[(at >= 0) & (keys < ends[np.clip(at, 0, None)])]] = True
    return out


def _by_kind(dev: DeviceActivity, coll: np.ndarray, compute_busy: np.ndarray) -> list[KindCollectives]:
    """DEV's collective kernels (COLL) per kind of call, the most exposed first."""
    out = []
    calls = dev.collectives
    for kind in dict.fromkeys(call.kind for call in calls):
        ids = [i for i, call in enumerate(calls) if call.kind == kind]
        rows = coll & np.isin(dev.collective, ids)
        if not rows.any():
            continue
        busy = intervals.union(dev.start_ps[rows], dev.end_ps[rows])
        sized = rows & (dev.nbytes > 0)
        group = next((calls[i] for i in ids if calls[i].group_size or calls[i].group), None)
        out.append(KindCollectives(kind, int(rows.sum()), intervals.total(busy),
                                   intervals.total(intervals.subtract(busy, compute_busy)), int(sized.sum()),
                                   int(dev.dur_ps[sized].sum()), int(dev.nbytes[sized].sum()),
                                   group.group_size if group else None, group.group if group else None))
    return sorted(out, key=lambda k: (-k.exposed_ps, -k.ps))


def replica_parts_ms(analysis: Analysis) -> tuple[float, float]:
    """Collective transfer and waiting, ms per step, mean over the measured replicas."""
    parts = analysis.breakdown.devices
    if analysis.breakdown.device_kind != "gpu" or not parts:
        return 0.0, 0.0
    return (sum(analysis.ms_per_step(dev.total("collective_transfer")) for dev in parts) / len(parts),
            sum(analysis.ms_per_step(dev.total("collective_wait")) for dev in parts) / len(parts))


@measurement
def measure(analysis: Analysis) -> Collectives | Finding:
    model = analysis.model
    active = analysis.comparable_gpus
    if not active:
        return needs_gpu(CHECK_ID, "collectives")
    lo, hi, windows = kernels.step_windows(model)
    return Collectives([measure_gpu(dev, model) for dev in active], windows,
                       float((hi - lo).sum()), *replica_parts_ms(analysis), parameter_bytes(model),
                       [_ranks.measure(dev, model) for dev in active], _largest_other(analysis))


def _largest_other(analysis: Analysis) -> tuple[str, float] | None:
    """The primary device's largest cost per step besides compute and collectives (OTHER_COSTS)."""
    primary = analysis.breakdown.primary
    if primary is None:
        return None
    totals = dict.fromkeys(OTHER_COSTS, 0)
    for category in CATEGORIES:
        if category.group in totals:
            totals[category.group] += primary.total(category.key)
    group = max(totals, key=totals.__getitem__)
    return OTHER_COSTS[group], analysis.ms_per_step(totals[group])


def join(alignment: HostAlignment, primary: object, parts: list, steps: int) -> Collectives | None:
    """Every host's GPUs as rows (their longest call on the session clock); transfer and waiting
    over every host's replicas when each host kept them, else the rows' mean."""
    measured = measured_parts(parts, Collectives)
    if not measured:
        return None
    shifted = [replace(row, longest=row.longest if row.longest is None else (
                   *row.longest[:2], *map(int, alignment.on_session_clock(h, np.array(row.longest[2:])))),
                   overlap=None if row.overlap is None else alignment.take(h, row.overlap))
               for h, c in measured for row in c.rows]
    ones = [c for _, c in measured]
    transfer_ms, waiting_ms = alignment.collective_parts_ms(steps) or (
        sum(c.transfer_ms * len(c.rows) for c in ones) / len(shifted),
        sum(c.waiting_ms * len(c.rows) for c in ones) / len(shifted))
    return Collectives(shifted, ones[0].windows, ones[0].step_ps, transfer_ms, waiting_ms,
                       next((c.param_bytes for c in ones if c.param_bytes), None),
                       _ranks.join_calls(alignment, [(h, c.calls, c.windows) for h, c in measured]),
                       max((c.largest_other for c in ones if c.largest_other), key=lambda o: o[1], default=None))


@register(CHECK_ID, "Collective communication (AllReduce)", __doc__,
          what_if=NoReplay("the replay balances replicas (multi_gpu_imbalance) but has no faster interconnect; "
                           "the saving is the transfer time beyond the expected bandwidth"),
          aspect="replicas", explains="communication", explains_order=1,
          compared=Compared("collective_percent", "collective_ms_per_step", device_parts=(
              # Its whole time, overlapped with compute or not; where the trace names its calls
              # (PyTorch), also the part with no compute alongside, which an overlap fix (DDP
              # buckets, FSDP prefetch) moves while the whole stays.
              DevicePart("collectives (NCCL/RCCL)", breakdown="collective_ms"),
              DevicePart("collectives with no compute alongside", "exposed_collective_ms_per_step"))),
          cross_host=CrossHost(measure, join, lambda c, scale: judge(c, scale) if len(c.rows) >= 2 else None,
                               "every host's GPUs as rows; transfer and waiting over all replicas"),
          marks=NoMarks("its share is the collectives' busy time averaged over every GPU, not one device's intervals"))
def check(analysis: Analysis) -> Finding:
    return judged(measure(analysis), lambda m: judge(m, analysis))


def judge(measured: Collectives, scale: StepScale) -> Finding:
    """The finding from every replica's collective time."""
    rows, steps, step_ps = measured.rows, measured.windows, measured.step_ps
    transfer_ms, waiting_ms = measured.transfer_ms, measured.waiting_ms
    if not any(row.calls for row in rows):
        if len(rows) < 2:
            return Finding(CHECK_ID, Severity.NOT_APPLICABLE, "Single GPU: no collectives",
                           "One GPU ran all the work, so there is no gradient communication to assess.")
        return Finding(CHECK_ID, Severity.OK, "No collective kernels found",
                       f"{len(rows)} GPUs ran kernels but none was an NCCL/AllReduce collective inside "
                       "the profiled steps.", {"collective_percent": 0.0, "allreduce_calls_per_step": 0.0})
    n = len(rows)
    percent = 100.0 * sum(row.busy_ps for row in rows) / n / step_ps if step_ps else 0.0
    exposed_percent = 100.0 * sum(row.exposed_ps for row in rows) / n / step_ps if step_ps else 0.0
    calls = sum(row.allreduce_calls for row in rows) / n / steps
    step_ms = step_ps / steps / PS_PER_MS
    metrics = {"collective_percent": round(percent, 2), "exposed_collective_percent": round(exposed_percent, 2),
               "allreduce_calls_per_step": round(calls, 2),
               "collective_ms_per_step": round(sum(row.busy_ps for row in rows) / n / steps / PS_PER_MS, 3)}
    allreduce_ms = min(row.allreduce_ps for row in rows) / steps / PS_PER_MS
    metrics["collective_transfer_ms_per_step"] = round(transfer_ms, 3)
    metrics["collective_wait_ms_per_step"] = round(waiting_ms, 3)
    param_bytes = measured.param_bytes
    if param_bytes:
        # Variables (and so gradients) are float32: their bytes are parameters x 4.
        expected_ms = param_bytes / ASSUMED_LINK_BYTES_PER_S * 1e3
        metrics["parameters"] = param_bytes // BYTES_PER_GRADIENT
        metrics["expected_allreduce_ms"] = round(expected_ms, 3)
        savings = max(0.0, allreduce_ms - expected_ms)
        expectation = (f"With about {param_bytes // BYTES_PER_GRADIENT:,} parameters, an AllReduce at "
                       f"{ASSUMED_LINK_BYTES_PER_S / 1e9:.0f} GB/s should take about {expected_ms:.2f} ms; "
                       f"it takes {allreduce_ms:.2f} ms per step.")
    else:
        savings = max(0.0, transfer_ms - ACCEPTABLE_FRACTION * step_ms)
        expectation = ("The capture does not record the model's parameter count (variables are created "
                       "before profiling starts), so the AllReduce time cannot be compared with "
                       "parameters x 4 bytes / bandwidth.")
    kinds = _kinds_per_step(rows, steps)
    remedies = FIXES
    room = _overlap_saving(measured)
    if room is not None:
        transfer_ms, waiting_ms = room.transfer_ms, room.waiting_ms
        metrics["collective_transfer_ms_per_step"] = round(transfer_ms, 3)
        metrics["collective_wait_ms_per_step"] = round(waiting_ms, 3)
        metrics["exposed_collective_ms_per_step"] = round(room.exposed_ms, 3)
        metrics["exposed_transfer_ms_per_step"] = round(room.exposed_transfer_ms, 3)
        metrics["overlap_saving_ms_per_step"] = round(room.saving_ms, 3)
        savings = room.saving_ms
    if kinds:
        metrics.update((f"{_slug(k['kind'])}_{key}", value) for k in kinds for key, value in k.items()
                       if key not in ("kind", "group"))
        calls_text = ", ".join(f"{k['calls_per_step']:.1f} {k['kind']}" for k in kinds)
        expectation = " ".join(_kind_text(k) for k in kinds)
        if not any("bytes_per_call" in k for k in kinds):
            expectation += (" The trace does not record the calls' message sizes, so their bandwidth "
                            "cannot be measured.")
        remedies = []
        hooks = [TORCH_COMM_HOOK] if any(k["kind"] == ALL_REDUCE for k in kinds) else []
        kind_fixes = [TORCH_REMEDY[k["kind"]] for k in kinds if k["kind"] in TORCH_REMEDY]
        for fix in kind_fixes + hooks + [fixes.TORCH_LARGER_BATCH]:
            if fix not in remedies:
                remedies.append(fix)
    else:
        calls_text = f"{calls:.1f} AllReduce"
    evidence = _evidence(rows, steps)
    severity = scale.gated(Severity.WARNING if percent >= WARNING_AT else Severity.OK, savings)
    summary = (f"Collectives keep each GPU busy {percent:.1f}% of the step ({exposed_percent:.1f}% not "
               f"hidden behind compute), with {calls_text} call(s) per step per GPU. {expectation}")
    if room is not None:
        summary += room.sentence(step_ms)
    if waiting_ms > 0.1 * (transfer_ms + waiting_ms) and not (room is not None and room.ranks_matched):
        summary += (f" Of the collective time, {waiting_ms:.2f} ms per step (mean per GPU) is replicas waiting "
                    "for the slowest one: that is load imbalance (see multi_gpu_imbalance), not communication.")
    title = (f"Collectives take {percent:.0f}% of each step" if severity is Severity.WARNING
             else f"Collectives take {percent:.1f}% of each step")
    confidence, reasons = "high", []
    if severity is not Severity.WARNING and room is not None and _exposure_leads(room, measured.largest_other, step_ms):
        # A well-tuned step whose one cost beyond compute is the exposed communication: the overlap fix
        # is its first change, though it hides only part of that time.
        severity = Severity.WARNING
        other, other_ms = measured.largest_other
        title = (f"Collectives leave {room.exposed_transfer_ms:.2f} ms of each step with no compute alongside "
                 f"({100 * room.exposed_transfer_ms / step_ms:.1f}%)")
        summary += (f" That exposed time is the step's largest cost besides compute (the next is {other}, "
                    f"{other_ms:.2f} ms per step).")
        confidence, reasons = "medium", [
            f"the saving is what overlapping the calls with compute can hide, {room.saving_ms:.2f} of the "
            f"{room.exposed_transfer_ms:.2f} ms exposed per step; how much of it a given bucket size or "
            "prefetch hides depends on message sizes and ordering the trace only partly shows"]
    # Where the calls are named, the overlap fix goes with a saving too small for a warning.
    shown = severity is Severity.WARNING or (severity is Severity.INFO and room is not None and room.saving_ms > 0)
    return Finding(CHECK_ID, severity, title, summary, metrics, round(savings, 3), evidence,
                   remedies if shown else [], confidence, reasons)


def _exposure_leads(room: "OverlapRoom", largest_other: tuple[str, float] | None, step_ms: float) -> bool:
    """Whether the exposed collective transfer is EXPOSED_WARNING_AT% of the step or more, more than
    the step's largest other cost besides compute, and the overlap fix hides a warning's worth of it
    (WARNING_MIN_MS): then the exposure is the step's first finding, whatever share the collectives'
    whole time or the bounded saving is."""
    return (largest_other is not None and step_ms > 0
            and 100 * room.exposed_transfer_ms / step_ms >= EXPOSED_WARNING_AT
            and room.exposed_transfer_ms > largest_other[1] and room.saving_ms >= WARNING_MIN_MS)


@dataclass
class OverlapRoom:
    """Per step, mean over GPUs: collective time not alongside compute, the part of it that is
    waiting for the last rank, and what overlapping the calls with compute would save."""

    exposed_ms: float
    exposed_transfer_ms: float
    transfer_ms: float        # exposed collective time that is not waiting (as the breakdown counts it)
    waiting_ms: float
    saving_ms: float
    ranks: int                # GPUs measured
    ranks_matched: bool       # waiting measured by matching the ranks' calls (else not separable here)

    def sentence(self, step_ms: float) -> str:
        if self.ranks_matched:
            wait = (f", of which {self.exposed_ms - self.exposed_transfer_ms:.2f} ms is waiting for the last rank "
                    "(multi_gpu_imbalance's)")
        elif self.ranks == 1:
            wait = " (with one rank in the capture, waiting for other ranks cannot be told apart from transfer)"
        else:
            wait = (" (the ranks' calls do not end together call by call, so they are not the same collectives "
                    "and waiting cannot be told apart from transfer)")
        return (f" Per step {self.exposed_ms:.2f} ms of collective time runs with no compute alongside{wait}. "
                f"Issued so they overlap compute (only the first gather or the last gradient reduction of "
                f"each kind has nothing to hide behind), the step would take about {step_ms - self.saving_ms:.2f} "
                f"ms instead of {step_ms:.2f} ms: the saving is bounded by the compute not yet alongside a "
                "collective, and a gradient reduction's by the backward compute it can run behind.")


def _overlap_saving(measured: Collectives) -> OverlapRoom | None:
    """What overlapping the named calls with compute saves, per step and GPU (mean over GPUs): the
    exposed time beyond what must stay exposed (per kind its most exposed call) and beyond the
    waiting for the last rank (the straggler's, not communication's), capped by the compute
    available to hide it and by what the fix can hide (gradient reductions behind backward
    compute); None where the trace does not name its calls (TensorFlow, JAX)."""
    rows = [row for row in measured.rows if row.overlap is not None]
    if not rows or len(rows) != len(measured.rows):
        return None
    table = np.stack([row.overlap for row in rows]).astype(np.float64)     # rows x 4 x steps
    exposed, stays, free, cap = table[:, 0], table[:, 1], table[:, 2], table[:, 3]
    steps = exposed.shape[1]
    if not steps:
        return None
    found = _ranks.split(measured.calls, steps) if measured.calls and all(measured.calls) else None
    if found is not None and found.wait.shape == exposed.shape:
        wait = np.minimum(found.wait, exposed)
        stays = _stays_exposed(found)
        transfer_ms = float(found.transfer.sum()) / len(rows) / steps / PS_PER_MS
        waiting_ms = float(found.wait.sum()) / len(rows) / steps / PS_PER_MS
    else:
        found, wait = None, np.zeros_like(exposed)
        transfer_ms, waiting_ms = measured.transfer_ms, measured.waiting_ms
    saving = np.clip(np.minimum(np.minimum(exposed - wait - stays, free), cap), 0.0, None)
    per = len(rows) * steps * PS_PER_MS
    return OverlapRoom(float(exposed.sum()) / per, float((exposed - wait).sum()) / per, transfer_ms, waiting_ms,
                       float(saving.sum()) / per, len(rows), found is not None)


def _stays_exposed(found: _ranks.Split) -> np.ndarray:
    """Ranks x steps: per kind of call with several calls in the step, the most exposed call's exposed
    transfer (its exposed time beyond the waiting for the last rank), the part no reordering hides."""
    transfer = np.clip(found.call_exposed - found.call_wait, 0, None)
    keys = sorted(set(found.call_key))
    kind_of = np.array([keys.index(k) for k in found.call_key], np.int64)
    out = np.zeros((transfer.shape[0], found.steps), np.float64)
    for kind in range(len(keys)):
        most = np.zeros((transfer.shape[0], found.steps), np.int64)
        cols = np.flatnonzero(kind_of == kind)
        several = np.bincount(found.call_step[cols], minlength=found.steps) >= 2
        for rank in range(transfer.shape[0]):
            np.maximum.at(most[rank], found.call_step[cols], transfer[rank, cols])
        out += np.where(several, most, 0)
    return out


def _slug(kind: str) -> str:
    return kind.replace("-", "_").replace("/", "_")


def _kinds_per_step(rows: list[GpuCollectives], steps: int) -> list[dict]:
    """Per kind of collective, over the GPUs that ran it: calls and ms per step (mean per GPU), ms
    not overlapped, and where the trace records sizes bytes per call, effective bandwidth (message
    bytes / kernel time) and, with the group's size, bus bandwidth; the most exposed kind first."""
    by_kind: dict[str, list[KindCollectives]] = {}
    for row in rows:
        for k in row.kinds:
            by_kind.setdefault(k.kind, []).append(k)
    out = []
    for kind, parts in by_kind.items():
        n = len(parts)
        entry = {"kind": kind, "calls_per_step": round(sum(p.calls for p in parts) / n / steps, 2),
                 "ms_per_step": round(sum(p.ps for p in parts) / n / steps / PS_PER_MS, 3),
                 "exposed_ms_per_step": round(sum(p.exposed_ps for p in parts) / n / steps / PS_PER_MS, 3)}
        sized_calls, sized_ps = sum(p.sized_calls for p in parts), sum(p.sized_ps for p in parts)
        if sized_calls and sized_ps:
            nbytes = sum(p.bytes for p in parts)
            entry["bytes_per_call"] = nbytes // sized_calls
            entry["gb_per_s"] = round(nbytes / (sized_ps / 1e12) / 1e9, 2)
            size = next((p.group_size for p in parts if p.group_size), None)
            if size and size > 1 and kind in BUS_FACTOR:
                entry["bus_gb_per_s"] = round(entry["gb_per_s"] * BUS_FACTOR[kind](size), 2)
        size = next((p.group_size for p in parts if p.group_size), None)
        if size:
            entry["group_size"] = size
        group = next((p.group for p in parts if p.group), None)
        if group:
            entry["group"] = group
        out.append(entry)
    return sorted(out, key=lambda e: (-e["exposed_ms_per_step"], -e["ms_per_step"]))


def _kind_text(k: dict) -> str:
    """One kind's sentence: its time per step, how much of it is exposed, its size and group."""
    text = (f"{k['kind'].capitalize()}: {k['calls_per_step']:.1f} call(s), {k['ms_per_step']:.2f} ms per step, "
            f"{k['exposed_ms_per_step']:.2f} ms of it not overlapped with compute")
    if "bytes_per_call" in k:
        text += (f"; {k['bytes_per_call'] / 2**20:.2f} MiB per call at {k['gb_per_s']:.1f} GB/s effective "
                 "(message bytes / kernel time" + (f", bus bandwidth {k['bus_gb_per_s']:.1f} GB/s)"
                                                    if "bus_gb_per_s" in k else ")"))
    if "group_size" in k or "group" in k:
        text += f"; a group of {k.get('group_size', '?')} ranks" + (f" ({k['group']})" if "group" in k else "")
    return text + "."


def _evidence(rows: list[GpuCollectives], steps: int) -> list[Evidence]:
    """Per GPU its collective time and top collective kernels, then the longest collective call."""
    out = []
    longest = None
    for row in rows:
        kinds = (", ".join(f"{k.calls / steps:.1f} {k.kind}" for k in row.kinds) if row.kinds
                 else f"{row.allreduce_calls / steps:.1f} AllReduce")
        out.append(Evidence("device", row.label, round(row.busy_ps / steps / PS_PER_MS, 3), "ms/step",
                            detail=f"{row.calls / steps:.1f} collective call(s) per step, {kinds}; "
                                   f"{row.exposed_ps / steps / PS_PER_MS:.3f} ms not overlapped with compute",
                            device=row.device, host=row.host))
        if row.longest is not None and (longest is None or row.longest[1] > longest[1].longest[1]):
            longest = (row.label, row)
        for name, dur, count in row.top:
            out.append(Evidence("kernel", name, round(dur / steps / PS_PER_MS, 3), "ms/step",
                                detail=f"{count} call(s)", device=row.device, host=row.host,
                                tool="kernel_stats"))
    if longest is not None:
        label, row = longest
        name, dur, start, end = row.longest
        out.append(Evidence("kernel", f"longest collective on {label}", round(dur / PS_PER_MS, 3), "ms",
                            detail=name[:120], device=row.device, host=row.host,
                            start_ms=round(start / PS_PER_MS, 3), end_ms=round(end / PS_PER_MS, 3),
                            tool="trace_viewer@"))
    return out
