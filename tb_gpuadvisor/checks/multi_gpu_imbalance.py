"""multi_gpu_imbalance: does every GPU replica do the same amount of work?

## What it measures
For every GPU that ran kernels, its busy time per step outside collectives: the union of
its kernel and copy intervals (all streams) inside the step periods, with NCCL/AllReduce
kernels left out because they wait for the slowest replica. ``imbalance_percent`` =
(max - min) / max of those per-GPU times; ``straggler_device`` is the busiest GPU. The GPU
that spends notably the least time in collectives (``late_device``) is the one the others
wait for there; ``straggler_reason`` says why it arrives last: ``compute`` (it works longer)
or ``host`` (its GPU idles longer outside collectives, waiting on its host). Ranks of a
many-host job (one GPU per trace file) are compared in the merge. Where the trace names its
collective calls (PyTorch), the ranks are matched call by call on the calls' end times (clock
offsets between hosts measured and taken out, checks/_ranks.py): per call the rank with the
shortest kernel arrived last and the others waited; the rank the others waited for longest is
the straggler, and the framework op on its host that takes longer than on the other ranks
(``straggler_host_op``, e.g. its ``Optimizer.step``) is the reason it is late. Also
the overlap of the GPUs' busy time (``min_overlap_percent``: the least-overlapping pair,
as a share of the less busy GPU's time) to spot GPUs that run one after another instead of
together, and GPU planes of the capture that ran no kernels at all.

## Why it matters
In synchronous data-parallel training every step waits for the slowest replica at the
gradient AllReduce, so the extra work of one GPU (often GPU:0, which also does the host's
extra work) is paid by all of them. GPUs whose busy periods barely overlap usually have
control dependencies between them and run serially. Critical at >= 20%, warning at >= 10%;
fewer than two GPUs with kernels: not applicable.

## How to fix
A rank late for its host (PyTorch): make that op as cheap as on the others (a fused or foreach
optimizer), give each rank's process its own cores, and keep rank-only work out of the step.
Give every replica the same work: let ``tf.distribute.MirroredStrategy`` split a global
batch that is a multiple of the replica count, keep per-replica ops (metrics, summaries,
checkpoints) off GPU:0, recheck the input pipeline for the larger global batch, and
dedicate launch threads per GPU with ``TF_GPU_THREAD_MODE=gpu_private``.

Savings model: the straggler's work brought to the median replica's, replayed per step
(attribution/replay.py): the replica that waited least inside its collectives arrived
last; the step gains its extra work, but only until the next-latest replica becomes the
last one (the second-smallest collective wait). The other replicas' waiting inside
AllReduce is this cause's time, not the collectives finding's. A rank late for its host
gains per step the larger: its late op brought to the other ranks' median lets it arrive that
much earlier, up to the least any other rank waits for it (replayed with the balance in the
merge of a many-host session). When GPUs run serially
(pairwise overlap < 30%), the larger of that and the time their combined busy span
exceeds the busiest GPU's busy time (what running them side by side would save).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from tb_gpuadvisor.model import kernels
from tb_gpuadvisor.checks import _ranks
from tb_gpuadvisor.checks.context import Analysis, StepScale, judged, measurement
from tb_gpuadvisor.checks.fixes import (
    DISTRIBUTED_GUIDE, GPU_GUIDE, GPU_PERF_GUIDE, JAX_SHARDING_GUIDE, SPARE_CORES, TORCH_DDP_DOC, Remedy,
)
from tb_gpuadvisor.checks.base import (
    NoMarks,
    Chart, Compared, CrossHost, Finding, HostAlignment, Replayed, Severity, measured_parts, register,
    severity_by_threshold,
)
from tb_gpuadvisor.checks.finding import Evidence, Fix
from tb_gpuadvisor.attribution.replay import Scenario
from tb_gpuadvisor.model import intervals
from tb_gpuadvisor.timeline import PS_PER_MS, PS_PER_US, DeviceActivity, SessionModel
from tb_gpuadvisor.vocab import pytorch

CHECK_ID = "multi_gpu_imbalance"
CRITICAL_AT, WARNING_AT = 20.0, 10.0
SERIAL_OVERLAP_BELOW = 30.0   # pairwise overlap (percent of the less busy GPU) that means "serial"
# A replica arrives notably last at the collectives when it waits in them at least this much less
# than the longest waiter (share of that wait, and at least this many ps).
LATE_WAIT_SHARE, LATE_WAIT_MIN_PS = 0.1, 50 * PS_PER_US

ALL_DEVICES_FIX = Remedy(
    "If the job should use every GPU, check which devices the strategy sees.",
    "print(tf.config.list_physical_devices('GPU'))\n"
    "strategy = tf.distribute.MirroredStrategy()\n"
    "print(strategy.num_replicas_in_sync)",
    GPU_GUIDE, jax=Fix(
        "If the job should use every GPU, check which devices JAX sees and that the step's "
        "inputs are sharded over all of them.",
        "print(jax.devices())\nprint(batch.sharding)   # a mesh over all devices, not one device",
        JAX_SHARDING_GUIDE))

FIXES = [
    Remedy("Let MirroredStrategy split one global batch evenly: scale the batch with the number of "
        "replicas so every GPU gets the same per-replica batch.",
        "strategy = tf.distribute.MirroredStrategy()\n"
        "per_replica_batch = 64\n"
        "global_batch = per_replica_batch * strategy.num_replicas_in_sync\n"
        "dataset = dataset.batch(global_batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)\n"
        "with strategy.scope():\n    model = build_model()\n    model.compile(...)",
        DISTRIBUTED_GUIDE, jax=Fix(
            "Split one global batch evenly over the devices: shard its leading axis over a mesh of "
            "all devices so every device gets the same slice.",
            "mesh = jax.make_mesh((jax.device_count(),), ('data',))\n"
            "batch = jax.device_put(batch, NamedSharding(mesh, PartitionSpec('data')))   # N divisible by devices",
            JAX_SHARDING_GUIDE),
        pytorch=Fix(
            "Give every rank the same share of the data and the same batch: a DistributedSampler "
            "with drop_last, and one per-rank batch size everywhere.",
            "import os\n"
            "sampler = torch.utils.data.distributed.DistributedSampler(dataset, drop_last=True)\n"
            "loader = torch.utils.data.DataLoader(dataset, batch_size=per_rank_batch, sampler=sampler,\n"
            f"                                     num_workers={SPARE_CORES}, pin_memory=True, persistent_workers=True)\n"
            "for epoch in range(epochs):\n"
            "    sampler.set_epoch(epoch)",
            TORCH_DDP_DOC)),
    Remedy("Give each GPU its own kernel-launch threads so one busy GPU does not starve the others "
        "of host time (set before TensorFlow starts).",
        "export TF_GPU_THREAD_MODE=gpu_private\nexport TF_GPU_THREAD_COUNT=2",
        GPU_PERF_GUIDE),
    Remedy("Keep extra work off GPU:0: compute metrics and summaries inside the replicated step "
        "(strategy.run) rather than on the default device, and check that no op is pinned with "
        "tf.device('/GPU:0').",
        "@tf.function\ndef train_step(iterator):\n"
        "    per_replica_loss = strategy.run(step_fn, args=(next(iterator),))\n"
        "    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_loss, axis=None)",
        DISTRIBUTED_GUIDE, jax=Fix(
            "Keep extra work off the first device: arrays created without a sharding live on "
            "device 0, so metrics and inputs built there make it do more than the others.",
            "print(x.sharding)                  # SingleDeviceSharding -> everything on device 0\n"
            "x = jax.device_put(x, NamedSharding(mesh, PartitionSpec('data')))",
            JAX_SHARDING_GUIDE),
        pytorch=Fix(
            "Keep extra work off rank 0: logging, metrics, evaluation and checkpoints run there alone "
            "make every other rank wait at the next collective; do them every N steps, reduce "
            "metrics on all ranks, and save checkpoints asynchronously.",
            "if step % 100 == 0:\n"
            "    torch.distributed.all_reduce(metric)        # every rank takes part\n"
            "    if torch.distributed.get_rank() == 0:\n"
            "        log(metric.item())",
            TORCH_DDP_DOC)),
]

def _torch_only(fix: Fix) -> Remedy:
    """A remedy that exists only in PyTorch (these are only given on traces that name their calls)."""
    return Remedy(fix.text, fix.code, fix.doc, pytorch=fix, tensorflow=False)


# What a rank late for its host changes.
HOST_OPTIMIZER_FIX = _torch_only(Fix(
    "Make the late rank's optimizer step as cheap as the others': the fused (or foreach) implementation "
    "updates every parameter in a few kernels instead of a loop of small ones per parameter, so the host "
    "spends far less time in it; then check why that rank's host is slower (other processes or "
    "DataLoader workers on its cores).",
    "optimizer = torch.optim.AdamW(model.parameters(), lr=lr, fused=True)   # or foreach=True",
    "https://pytorch.org/docs/stable/optim.html#algorithms"))
HOST_CORES_FIX = _torch_only(Fix(
    "Give every rank's process the same host resources: bind it to its own cores (and NUMA node), keep "
    "rank-only work (logging, evaluation, checkpoints) out of the step, and look for other load on the late "
    "rank's host; every collective waits for its slowest host.",
    "import os\n"
    "cores = max(1, (os.cpu_count() or 1) // local_world_size)   # the host's cores split evenly between its ranks\n"
    "if hasattr(os, 'sched_setaffinity') and (os.cpu_count() or 1) >= local_world_size:   # Linux\n"
    "    os.sched_setaffinity(0, range(local_rank * cores, (local_rank + 1) * cores))\n"
    "torch.set_num_threads(cores)",
    TORCH_DDP_DOC))


def busy_intervals(dev: DeviceActivity, model: SessionModel) -> intervals.Intervals:
    """Union of one GPU's kernel and copy intervals inside the steps, collectives excluded."""
    cls = kernels.classify(dev)
    keep = kernels.in_steps(dev, model) & ~cls.collective
    return intervals.union(dev.start_ps[keep], dev.end_ps[keep])


def _collective_and_idle(dev: DeviceActivity, model: SessionModel, lo: np.ndarray,
                         hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per step window: the GPU's time in collective kernels, and its time with nothing running."""
    in_steps = kernels.in_steps(dev, model)
    coll = in_steps & kernels.classify(dev).collective
    collective = intervals.per_bin_total(intervals.union(dev.start_ps[coll], dev.end_ps[coll]), lo, hi)
    busy = intervals.per_bin_total(intervals.union(dev.start_ps[in_steps], dev.end_ps[in_steps]), lo, hi)
    return collective, (hi - lo) - busy


@dataclass
class Replicas:
    """The GPUs compared and what each did per step, whether measured from one process holding
    every host's events or joined from per-host summaries (multihost.merge)."""

    labels: list[str]
    devices: list[tuple[str, str]]            # (device name, host) of each label
    per_step: np.ndarray                      # GPU x step window: busy ps outside collectives
    lo: np.ndarray                            # the step windows, ps on the session's clock
    hi: np.ndarray
    min_overlap: float                        # percent, the least-overlapping pair
    serial_pairs: list[tuple[int, int, float]]
    combined_busy_ps: int                     # union of every GPU's busy time (for serial GPUs)
    idle: list[tuple[str, str, str, int]]     # label, device, host, events of planes with no kernels
    planes: int
    partial_used: list[str]                   # devices the host used but the trace does not hold
    collective: np.ndarray                    # GPU x step window: ps in collective kernels
    idle_ps: np.ndarray                       # GPU x step window: ps with nothing running
    calls: list[_ranks.RankCalls | None] | None = None   # per GPU, its group collectives (PyTorch)


def not_applicable(active: list[str], planes: int, active_gpus: int, traced_apart: list[str]) -> Finding:
    """Fewer than two GPUs whose traces can be compared."""
    summary = (f"{len(active)} of {planes} GPU(s) in this capture ran kernels that can be compared, "
               "so there are no replicas to compare.")
    if traced_apart:
        summary += (f" {', '.join(traced_apart)} ran the same steps at other times than "
                    f"{active[0] if active else 'the first GPU'} in this trace, so their work cannot be "
                    "set side by side.")
    return Finding(CHECK_ID, Severity.NOT_APPLICABLE, "Fewer than two GPUs with comparable traces", summary,
                   {"active_gpus": active_gpus, "gpu_planes": planes})


@measurement
def measure(analysis: Analysis) -> Replicas | Finding:
    """The comparable GPUs' busy time per step (one GPU too: a host of one GPU is one replica of
    a many-host job, which the merge compares), or the not-applicable finding."""
    model = analysis.model
    active = analysis.comparable_gpus
    planes = model.gpus
    if not active:
        return _alone(analysis)
    lo, hi, _ = kernels.step_windows(model)
    busy = [busy_intervals(dev, model) for dev in active]
    per_step = np.vstack([intervals.per_bin_total(b, lo, hi) for b in busy])    # GPU x step
    min_overlap, serial_pairs = _overlaps(busy)
    combined = 0
    if serial_pairs:
        combined = intervals.total(intervals.union(np.concatenate([b[0] for b in busy]),
                                                   np.concatenate([b[1] for b in busy])))
    idle = [(kernels.device_label(model, dev), dev.device.name, dev.device.host, len(dev))
            for dev in planes if dev not in active]
    waits = [_collective_and_idle(dev, model, lo, hi) for dev in active]
    return Replicas([kernels.device_label(model, dev) for dev in active],
                    [(dev.device.name, dev.device.host) for dev in active], per_step, lo, hi,
                    min_overlap, serial_pairs, int(combined), idle, len(planes),
                    [d.name for d in analysis.trust.partial_devices],
                    np.vstack([c for c, _ in waits]), np.vstack([i for _, i in waits]),
                    [_ranks.measure(dev, model) for dev in active])


def join(alignment: HostAlignment, primary: object, parts: list, steps: int) -> Replicas | None:
    """Every host's replicas as one set, per session step, on the session clock."""
    measured = measured_parts(parts, Replicas)
    if not measured:
        return None
    first_host, first = measured[0]
    serial, offset = [], 0
    for _, r in measured:
        serial += [(a + offset, b + offset, share) for a, b, share in r.serial_pairs]
        offset += len(r.labels)
    return Replicas(
        [label for _, r in measured for label in r.labels], [d for _, r in measured for d in r.devices],
        np.vstack([alignment.take(h, r.per_step) for h, r in measured]),
        *alignment.windows(first_host, first.lo, first.hi),
        min(r.min_overlap for _, r in measured), serial, max(r.combined_busy_ps for _, r in measured),
        [item for _, r in measured for item in r.idle], sum(r.planes for _, r in measured),
        [d for _, r in measured for d in r.partial_used],
        np.vstack([alignment.take(h, r.collective) for h, r in measured]),
        np.vstack([alignment.take(h, r.idle_ps) for h, r in measured]),
        _ranks.join_calls(alignment, [(h, r.calls, r.per_step.shape[1]) for h, r in measured]))


def judge_joined(r: Replicas, scale) -> Finding | None:
    """The session's imbalance over every host's replicas (SCALE: the merged session)."""
    return judge(r, scale.what_if.saving_ms(CHECK_ID), scale) if len(r.labels) >= 2 else None


@register(CHECK_ID, "Multi-GPU load imbalance", __doc__,
          what_if=Replayed(lambda model: Scenario(balance=True),
                           what="every replica's work balanced to the mean, the straggler's wait removed",
                           across_hosts=True),
          aspect="replicas", explains="communication", compared=Compared("imbalance_percent"),
          chart=Chart(marked_device="straggler_device"),
          cross_host=CrossHost(measure, join, judge_joined,
                               "every host's replicas stacked per session step; judged with the balance all hosts allow"),
          marks=NoMarks("it compares the replicas' per-step work; the straggler is named in the per-GPU chart"))
def check(analysis: Analysis) -> Finding:
    if len(analysis.comparable_gpus) < 2:
        return _alone(analysis)     # one replica: only a many-host merge measures it (cross_host)
    return judged(measure(analysis), lambda r: judge(r, analysis.what_if.saving_ms(CHECK_ID), analysis))


def _alone(analysis: Analysis) -> Finding:
    """Not applicable: fewer than two of this capture's GPUs can be compared."""
    model = analysis.model
    return not_applicable([d.device.name for d in analysis.comparable_gpus], len(model.gpus),
                          len(model.active_gpus), list(analysis.trust.misaligned))


def judge(r: Replicas, balance_ms: float, scale: StepScale) -> Finding:
    """The finding from the replicas' busy times and the replayed saving of balancing them."""
    labels, per_step, idle = r.labels, r.per_step, r.idle
    steps = per_step.shape[1]
    means = per_step.sum(axis=1) / steps
    top, bottom = int(np.argmax(means)), int(np.argmin(means))
    imbalance = float(100.0 * (means[top] - means[bottom]) / means[top]) if means[top] > 0 else 0.0
    savings_ms = balance_ms
    if r.serial_pairs:
        # Work that could run side by side runs in sequence: the step would shrink by the
        # time the GPUs' combined busy span exceeds the busiest GPU's own busy time.
        savings_ms = max(savings_ms, (r.combined_busy_ps / steps - float(means[top])) / PS_PER_MS)
    metrics = {
        "imbalance_percent": round(imbalance, 2),
        "straggler_device": labels[top],
        "active_gpus": len(labels),
        "gpu_planes": r.planes,
        "max_busy_ms_per_step": round(float(means[top]) / PS_PER_MS, 3),
        "min_busy_ms_per_step": round(float(means[bottom]) / PS_PER_MS, 3),
        "min_overlap_percent": round(r.min_overlap, 1),
    }
    late = _late_arrival(r, means)
    host_late = _host_straggler(r, means)
    if host_late is not None:
        late = host_late.late or late
        metrics.update(host_late.metrics)
        if host_late.reason is not None and late is not None:
            metrics["straggler_device"] = labels[late.index]     # the rank the others wait for
        savings_ms = max(savings_ms, host_late.gain_ms)
    if late is not None:
        metrics.update(late_device=labels[late.index], straggler_reason=late.reason)
    evidence = _device_evidence(r, means, top)
    for a, b, share in r.serial_pairs:
        evidence.append(Evidence("device", f"{labels[a]} / {labels[b]}", round(share, 1),
                                 "% overlap", detail="these GPUs are busy one after another rather "
                                 "than together: look for control dependencies between them",
                                 tool="trace_viewer@"))
    for label, device, host, events in idle:
        evidence.append(Evidence("device", label, 0.0, "ms/step",
                                 detail=f"no kernels ({events} copies only)" if events else "no events",
                                 device=device, host=host))
    severity = severity_by_threshold(imbalance, CRITICAL_AT, WARNING_AT)
    if host_late is not None and host_late.reason is not None:
        severity = max(severity, severity_by_threshold(host_late.wait_percent, CRITICAL_AT, WARNING_AT),
                       key=lambda s: s.weight)
    if r.serial_pairs and severity is Severity.OK:
        severity = Severity.WARNING
    severity = scale.gated(severity, savings_ms)
    if idle and severity is Severity.OK:
        severity = Severity.INFO
    names = ", ".join(labels)
    summary = (f"Across {len(labels)} GPUs ({names}) the busiest, {labels[top]}, works "
               f"{means[top] / PS_PER_MS:.2f} ms per step outside collectives and the least busy "
               f"{means[bottom] / PS_PER_MS:.2f} ms: an imbalance of {imbalance:.0f}%.")
    if host_late is not None and host_late.reason is not None:
        summary += (" Their GPUs' work is not what holds the step; one rank's host is, at every collective "
                    "that joins them.")
        evidence.insert(0, host_late.evidence(r))
    else:
        summary += (" The others wait for the straggler in every collective that joins them (in data-parallel "
                    f"training, the gradient all-reduce); evening out the work would save about {balance_ms:.2f} "
                    "ms per step.")
    summary += late.sentence if late is not None else ""
    if r.serial_pairs:
        summary += (f" Some GPUs overlap only {r.min_overlap:.0f}% of their busy time, so they run one "
                    f"after another instead of in parallel; running them together would save about "
                    f"{savings_ms:.2f} ms per step.")
    if idle:
        copying = ", ".join(label for label, _, _, events in idle if events)
        silent = ", ".join(label for label, _, _, events in idle if not events)
        parts = ([f"{copying} only copied data"] if copying else []) + \
                ([f"{silent} recorded nothing"] if silent else [])
        cause = (f"the host used {', '.join(r.partial_used)}, so the profiler traced only part of the job"
                 if r.partial_used else "the training uses fewer GPUs than the machine has")
        summary += f" {len(idle)} of {r.planes} GPU planes ran no kernels ({'; '.join(parts)}): {cause}."
    if host_late is not None and host_late.reason is not None and host_late.wait_percent >= WARNING_AT:
        title = host_late.title
    elif imbalance >= WARNING_AT:
        title = f"{labels[top]} works {imbalance:.0f}% more than the least busy GPU"
    elif r.serial_pairs:
        title = f"GPUs run one after another instead of together ({r.min_overlap:.0f}% overlap)"
    elif idle:
        title = f"Only {len(labels)} of {r.planes} GPUs ran kernels; they are balanced within {imbalance:.0f}%"
    else:
        title = f"GPU work is balanced within {imbalance:.0f}%"
    fixes = FIXES if severity in (Severity.WARNING, Severity.CRITICAL) else []
    if fixes and host_late is not None and host_late.reason is not None:
        fixes = host_late.fixes     # its GPU's work is even: splitting the data differently changes nothing
    if idle:
        fixes = fixes + [ALL_DEVICES_FIX]
    return Finding(CHECK_ID, severity, title, summary, metrics, round(max(savings_ms, 0.0), 3),
                   evidence, fixes)


@dataclass
class _HostLate:
    """A rank the others wait for at their collective calls, matched call by call (PyTorch ranks)."""

    late: _Late | None                   # None: neither its host nor its GPU's work explains it
    reason: _ranks.HostReason | None     # the op on its host that makes it late (None: not its host)
    gain_ms: float                       # per step: that op at the others' median, replayed on the calls
    wait_percent: float                  # the other ranks' mean wait for it, percent of the step
    title: str
    metrics: dict
    fixes: list

    def evidence(self, r: Replicas) -> Evidence:
        """The late rank's host op, against the others' median."""
        assert self.reason is not None and self.late is not None
        device, host = r.devices[self.late.index]
        return Evidence("op", self.reason.op, round(float(self.reason.late_ms.mean()), 3), "ms/step",
                        detail=f"on {r.labels[self.late.index]}'s host; {self.reason.others_ms:.2f} ms per step on "
                               "the other ranks (median)", device=device, host=host)


def _host_straggler(r: Replicas, means: np.ndarray) -> _HostLate | None:
    """The rank the others wait for, from their calls matched one by one (``checks/_ranks``): per
    call the rank with the shortest kernel arrived last, and the one that made the others wait
    longest over all calls is the straggler. Late because of its host when an op there takes
    longer than on the other ranks by more than its GPU's extra work; the saving (replayed with the
    balance in the merge) is that op brought to the others' median, per step, capped by how long
    the next-latest rank waits."""
    steps = r.per_step.shape[1]
    found = _ranks.split(r.calls, steps) if r.calls else None
    if found is None or found.straggler is None:
        return None
    index = found.straggler
    n = len(r.calls)
    ms = PS_PER_MS
    step_ms = float((r.hi - r.lo).mean()) / ms if r.lo.size else 0.0
    others = [i for i in range(n) if i != index]
    others_wait_ms = float(found.wait[others].sum(axis=1).mean()) / steps / ms
    wait_percent = 100 * others_wait_ms / step_ms if step_ms else 0.0
    last, waited = found.last_share(index)
    metrics = {"collective_wait_ms_per_step": round(float(found.wait.sum()) / n / steps / ms, 3),
               "collective_transfer_ms_per_step": round(float(found.transfer.sum()) / n / steps / ms, 3),
               "aligned_collectives_per_step": round(found.calls / steps, 2),
               "others_wait_ms_per_step": round(others_wait_ms, 3),
               "straggler_last_calls": last, "waited_calls": waited,
               "max_clock_offset_ms": round(float(np.ptp(found.offsets)) / ms, 3)}
    label = r.labels[index]
    spent = (f" Matching the ranks' {found.calls} collective calls one by one (a call ends at the same moment "
             f"on every rank; their clocks differ by up to {metrics['max_clock_offset_ms']:.2f} ms), {label} "
             f"arrives last at {last} of the {waited} calls where ranks wait: the other ranks spend "
             f"{others_wait_ms:.2f} ms per step ({wait_percent:.0f}% of the step) inside them waiting for it, while "
             f"the transfer itself keeps them {metrics['collective_transfer_ms_per_step']:.2f} ms per step with no "
             "compute alongside.")
    reason = _ranks.host_reason(r.calls, index)       # type: ignore[arg-type]
    extra_work = float(means[index] - np.median(means))
    if reason is None or reason.excess_ps.sum() / steps <= extra_work:
        late = None if extra_work <= 0 else _Late(index, "compute", spent + (
            f" It arrives late because its GPU computes {extra_work / ms:.2f} ms per step more than the median rank."))
        return _HostLate(late, None, 0.0, wait_percent, "", metrics, [])
    gain = _ranks.host_gain(found, index, reason)
    late_ms, others_ms = float(reason.late_ms.mean()), reason.others_ms
    metrics.update(straggler_host_op=reason.op, straggler_op_ms_per_step=round(late_ms, 3),
                   others_op_ms_per_step=round(others_ms, 3))
    times = f"{late_ms / others_ms:.1f}x" if others_ms > 0 else "far longer than"
    late = _Late(index, "host", spent + (
        f" It is late because of its host: {reason.op} takes {late_ms:.2f} ms per step there against "
        f"{others_ms:.2f} ms on the other ranks (median), and its next collectives are launched after it. "
        f"Bringing it to the others' time lets every rank start them that much earlier, up to what the "
        f"next-latest rank waits: {float(gain.mean()) / ms:.2f} ms per step."))
    title = f"{label}'s host holds up every rank: its {reason.op} takes {times} the others'"
    fixes = ([HOST_OPTIMIZER_FIX] if pytorch.is_optimizer_step(reason.op) else []) + [HOST_CORES_FIX]
    return _HostLate(late, reason, float(gain.mean()) / ms, wait_percent, title, metrics, fixes)


@dataclass
class _Late:
    """The replica the others wait for in their collectives, and why it arrives last."""

    index: int
    reason: str         # "compute": it works longest; "host": its GPU idles longest outside them
    sentence: str


def _late_arrival(r: Replicas, means: np.ndarray) -> _Late | None:
    """The replica that spends least time in collectives arrived last at them (the others wait
    there for it): late because it computes longer than the others, or because its GPU sits idle
    longer outside them, waiting on its host, whichever of the two is the larger excess."""
    steps = r.collective.shape[1]
    waits = r.collective.sum(axis=1) / steps
    if steps == 0 or np.count_nonzero(waits) < 2:
        return None
    late = int(np.argmin(waits))
    if waits.max() - waits[late] < max(LATE_WAIT_SHARE * waits.max(), LATE_WAIT_MIN_PS):
        return None         # every replica waits about as long: none arrives notably last
    idle = r.idle_ps.sum(axis=1) / steps
    extra_work, extra_idle = means[late] - means.min(), idle[late] - idle.min()
    ms = PS_PER_MS
    spent = (f"{r.labels[late]} spends the least time in collectives ({waits[late] / ms:.2f} ms per step, "
             f"against up to {waits.max() / ms:.2f} ms): the others wait there for it")
    if extra_idle > extra_work:
        return _Late(late, "host", (
            f" {spent}. It arrives late because its GPU sits idle {idle[late] / ms:.2f} ms per step outside "
            f"them against {idle.min() / ms:.2f} ms on the least idle replica, waiting on its host (input, "
            "Python, launches): see that host's own findings."))
    return _Late(late, "compute", f" {spent}. It arrives late because it computes "
                                  f"{extra_work / ms:.2f} ms per step more than the least busy replica.")


def _overlaps(busy: list[intervals.Intervals]) -> tuple[float, list[tuple[int, int, float]]]:
    """Smallest pairwise overlap (percent of the less busy GPU) and the serial (i, j, share) pairs."""
    smallest = 100.0
    serial = []
    table = intervals.pairwise_overlaps(busy)
    for i, j in itertools.combinations(range(len(busy)), 2):
        ta, tb = table[i, i], table[j, j]
        if min(ta, tb) == 0:
            continue
        share = 100.0 * table[i, j] / min(ta, tb)
        smallest = min(smallest, share)
        if share < SERIAL_OVERLAP_BELOW:
            serial.append((i, j, share))
    return smallest, serial


def _device_evidence(r: Replicas, means: np.ndarray, top: int) -> list[Evidence]:
    """One item per GPU, busiest first; the straggler's points at its most lopsided step."""
    per_step = r.per_step
    mean_all = float(means.mean())
    worst_step = int(np.argmax(per_step[top] - per_step.min(axis=0))) if per_step.shape[1] else 0
    out = []
    for i in np.argsort(-means, kind="stable"):
        device, host = r.devices[int(i)]
        item = Evidence("device", r.labels[int(i)], round(float(means[i]) / PS_PER_MS, 3), "ms/step",
                        detail=f"{100.0 * means[i] / mean_all:.0f}% of the mean busy time (excluding collectives)"
                        if mean_all else None,
                        device=device, host=host)
        if int(i) == top and r.lo.size:
            item.start_ms = round(float(r.lo[worst_step]) / PS_PER_MS, 3)
            item.end_ms = round(float(r.hi[worst_step]) / PS_PER_MS, 3)
            item.tool = "trace_viewer@"
        out.append(item)
    return out
