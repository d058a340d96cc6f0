"""Which devices were traced, and for how long.

The profiler can lose a device's events (a full CUPTI buffer, a device it was not asked to
trace, a trace that stops while the host goes on) without saying so. A device that the
host clearly used (its allocator allocated, ops of its replica ran, an executor thread ran
programs for it) but that recorded no kernels, or whose events stop while the host keeps
stepping, is partly traced: its missing time is unknown, never idle. Replicas whose work
for the same step lies at different times cannot be compared with each other either.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from tb_gpuadvisor.arrays import reduce_by_key
from tb_gpuadvisor.model import kernels
from tb_gpuadvisor.model.steps import launch_rows
from tb_gpuadvisor.timeline import PS_PER_MS, DeviceActivity, HostModel, SessionModel, Steps
from tb_gpuadvisor.kinds import DeviceEventKind, HostEventKind
from tb_gpuadvisor.trust.warmup import before_final_sync
from tb_gpuadvisor.vocab import pytorch, tensorflow
from tb_gpuadvisor.vocab.gpu import HEAVY_KERNEL as _HEAVY_KERNEL
from tb_gpuadvisor.vocab.tensorflow import EIGEN_ELEMENTWISE_KERNEL as _ELEMENTWISE
from tb_gpuadvisor.vocab.tensorflow import GPU_PRIVATE_THREAD as _GPU_THREAD
from tb_gpuadvisor.vocab.tensorflow import REPLICA as _REPLICA
from tb_gpuadvisor.vocab.tensorflow import gpu_private_thread, replica_scope
from tb_gpuadvisor.vocab.xla import EXECUTE_THREAD_PREFIX as _XLA_EXECUTE_THREAD
from tb_gpuadvisor.stages import Memo

# What this stage derives from the tables and asks for again (see stages.Memo).
_MEMO = Memo()

# A device whose last event comes this long before the host's last step activity stopped early.
STOP_EARLY_MIN_PS = 5 * PS_PER_MS
STOP_EARLY_SHARE = 0.1
# A blocking call this long before a device's first traced event waited for work queued before the
# capture began (with nothing queued it returns in microseconds).
PRE_WINDOW_WAIT_PS = PS_PER_MS


@dataclass
class DeviceCoverage:
    """What one device's trace holds and what the host says it should hold."""

    name: str
    host: str
    events: int
    kernels: int
    first_ps: int | None
    last_ps: int | None
    used_because: list[str] = field(default_factory=list)   # host evidence that the device worked
    status: str = "unused"        # traced | stops_early | no_kernels | missing | unused
    note: str = ""
    # When the device was still running work queued before the capture (``queued_before``): its
    # trace holds nothing of it, so it covers the capture from then on.
    covers_from_ps: int = 0

    @property
    def partial(self) -> bool:
        return self.status in ("stops_early", "no_kernels", "missing")

    def to_json(self) -> dict:
        out: dict = {"device": self.name, "host": self.host, "status": self.status, "events": self.events,
                     "kernels": self.kernels}
        if self.first_ps is not None:
            out["covered_ms"] = [round(self.first_ps / PS_PER_MS, 3), round(self.last_ps / PS_PER_MS, 3)]
        if self.used_because:
            out["used_because"] = self.used_because
        if self.note:
            out["note"] = self.note
        if self.covers_from_ps:
            out["busy_before_window_until_ms"] = round(self.covers_from_ps / PS_PER_MS, 3)
        return out


def _allocations(host: HostModel) -> dict[int, int]:
    """GPU index -> peak bytes its allocator held during the capture."""
    mem = host.memory
    out: dict[int, int] = {}
    for i, name in enumerate(mem.allocators):
        gpu = tensorflow.gpu_allocator_index(name)
        pick = mem.allocator == i
        if gpu is not None and pick.any():
            out[gpu] = int(mem.bytes_allocated[pick].max(initial=0))
    return out


def _replica_events(host: HostModel) -> Counter:
    """Replica index -> host events naming it (TensorFlow's per-replica op scopes); a search of
    every event name, kept on the host (coverage and the device count both ask)."""
    act = host.activity
    if "replicas" in _MEMO.of(act):
        return _MEMO.of(act)["replicas"]
    per_name = np.bincount(act.name, minlength=len(act.names)) if len(act) else np.zeros(len(act.names), int)
    out: Counter = Counter()
    for name_id, name in enumerate(act.names):
        for replica in set(_REPLICA.findall(name)):
            out[int(replica)] += int(per_name[name_id])
    _MEMO.of(act)["replicas"] = out
    return out


def _launch_threads(host: HostModel) -> set[int]:
    return {int(m.group(1)) for t in host.activity.threads if (m := _GPU_THREAD.match(t))}


def xla_execute_threads(host: HostModel) -> int:
    """Host threads that ran compiled XLA programs (JAX runs one per device it drives)."""
    act = host.activity
    threads = [i for i, t in enumerate(act.threads) if t.startswith(_XLA_EXECUTE_THREAD)]
    if not threads:
        return 0
    ran = np.isin(act.thread, threads) & act.mask(HostEventKind.FUNCTION, HostEventKind.EXECUTOR)
    return int(np.unique(act.thread[ran]).size)


def _host_active_until(host: HostModel, steps: Steps) -> int | None:
    """When the host stopped stepping: the last step's end, else its last launch or program run."""
    if len(steps):
        return int(steps.end_ps.max())
    act = host.activity
    work = act.mask(HostEventKind.LAUNCH, HostEventKind.FUNCTION)
    return int(act.end_ps[work].max()) if work.any() else None


def launched_kernels(hosts: list[HostModel]) -> bool:
    """Whether any host called a kernel launch (not only copies and memsets): without one, a GPU
    trace of copies and no kernel is the whole of the device's work (a copy benchmark)."""
    for host in hosts:
        act = host.activity
        if any(pytorch.launches_kernel(act.names[i]) for i in np.unique(act.name[act.kind == HostEventKind.LAUNCH])):
            return True
    return False


def _coverage_of(dev: DeviceActivity, used_because: list[str], others_ran_kernels: bool,
                 active_until: int | None) -> DeviceCoverage:
    kernels = int(np.count_nonzero(dev.kind == DeviceEventKind.KERNEL))
    cov = DeviceCoverage(dev.device.name, dev.device.host, len(dev), kernels,
                         int(dev.start_ps.min()) if len(dev) else None,
                         int(dev.end_ps.max()) if len(dev) else None, used_because)
    if kernels:
        cov.status = "traced"
        span = cov.last_ps - cov.first_ps
        if active_until is not None and active_until - cov.last_ps > max(STOP_EARLY_MIN_PS, STOP_EARLY_SHARE * span):
            cov.status = "stops_early"
            cov.note = (f"its events stop at {cov.last_ps / PS_PER_MS:.2f} ms while the host kept stepping "
                        f"until {active_until / PS_PER_MS:.2f} ms")
    elif len(dev) and (used_because or others_ran_kernels):
        cov.status = "no_kernels"
        cov.note = f"it recorded {len(dev)} copies or memsets but no kernel"
    elif used_because:
        cov.status = "missing"
        cov.note = "it recorded nothing although the host used it"
    return cov


def device_coverage(model: SessionModel, steps: Steps) -> list[DeviceCoverage]:
    """Coverage of every GPU plane (TPUs and other accelerators are taken as traced when they
    hold events)."""
    out: list[DeviceCoverage] = []
    any_kernels = any(bool(np.any(dev.kind == DeviceEventKind.KERNEL)) for dev in model.gpus)
    copies_only = model.framework == pytorch.FRAMEWORK and not any_kernels and not launched_kernels(model.hosts)
    for host in model.hosts:
        allocations = _allocations(host)
        replicas = _replica_events(host)
        threads = _launch_threads(host)
        until = _host_active_until(host, steps)
        if until is not None and model.framework == pytorch.FRAMEWORK:
            until = before_final_sync(model.hosts, until)
        for dev in host.devices:
            index = dev.device.index
            why = []
            if dev.device.kind == "gpu":
                if index in allocations:
                    why.append(f"its allocator held up to {allocations[index] / 2**20:.0f} MiB")
                if replicas.get(index):
                    why.append(f"{replicas[index]} host events of {replica_scope(index)}")
                if index in threads:
                    why.append(f"the host ran its launch thread {gpu_private_thread(index)}")
            if dev.device.kind != "gpu":
                cov = DeviceCoverage(dev.device.name, dev.device.host, len(dev), len(dev),
                                     int(dev.start_ps.min()) if len(dev) else None,
                                     int(dev.end_ps.max()) if len(dev) else None,
                                     status="traced" if len(dev) else "unused")
            else:
                cov = _coverage_of(dev, [] if copies_only else why, any_kernels, until)
                if copies_only and len(dev):
                    cov.status = "traced"
                if model.framework == pytorch.FRAMEWORK and len(dev):
                    cov.covers_from_ps = queued_before(host, dev)
            out.append(cov)
    return out


def queued_before(host: HostModel, dev: DeviceActivity) -> int:
    """When DEV finished work queued before the capture began, 0 when nothing says it had any: the
    latest end of a blocking call (a synchronize, a copy) that started ``PRE_WINDOW_WAIT_PS`` or more
    before DEV's first traced event (beyond the time a copy call may stage its bytes) and lasted that
    long, with no traced work of DEV to wait for (the call's end, or DEV's first event where the call
    ends after it: a blocking copy waits for the queue, then runs)."""
    act = host.activity
    first = int(dev.start_ps.min())
    # A copy call may stage its bytes first (``vocab.pytorch.PAGEABLE_STAGING_BYTES_PER_S``).
    staging = np.zeros(len(act), np.int64)
    rows = launch_rows(act, dev)
    copied = (rows >= 0) & (dev.nbytes > 0)
    ps_per_byte = 1000 * PS_PER_MS / pytorch.PAGEABLE_STAGING_BYTES_PER_S
    staging[rows[copied]] = (dev.nbytes[copied] * ps_per_byte).astype(np.int64)
    calls = (kernels.named_events(act, "may_block", pytorch.may_block)
             & (act.start_ps <= first - PRE_WINDOW_WAIT_PS - staging) & (act.dur_ps >= PRE_WINDOW_WAIT_PS))
    if not calls.any():
        return 0
    return int(np.minimum(act.end_ps[calls], first).max())


def misaligned_replicas(model: SessionModel, steps: Steps, primary: DeviceActivity | None) -> list[str]:
    """Active GPUs whose work for the trusted steps never overlaps the primary GPU's work for
    the same steps: the traces of such replicas were taken at different times."""
    if primary is None or not len(steps) or len(model.active_gpus) < 2:
        return []
    mine_lo, mine_hi = _step_spans(primary, len(steps))
    bad = []
    for dev in model.active_gpus:
        if dev is primary:
            continue
        lo, hi = _step_spans(dev, len(steps))
        shared = (lo < hi) & (mine_lo < mine_hi)
        if shared.any() and np.all((lo[shared] >= mine_hi[shared]) | (hi[shared] <= mine_lo[shared])):
            bad.append(dev.device.name)
    return bad


def _step_spans(dev: DeviceActivity, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per step, the first start and last end of the device's events in it (lo >= hi: none)."""
    lo = np.full(n, np.iinfo(np.int64).max)
    hi = np.full(n, np.iinfo(np.int64).min)
    inside = dev.step >= 0
    step = dev.step[inside]
    return (reduce_by_key(np.minimum, lo, step, dev.start_ps[inside]),
            reduce_by_key(np.maximum, hi, step, dev.end_ps[inside]))


def missing_heavy_work(model: SessionModel) -> str | None:
    """Why the GPU trace seems to hold only part of the steps' work, or None.

    A training or inference step multiplies matrices or convolves; a GPU trace whose kernels
    include no matrix multiply or convolution at all recorded some other part of the step
    (in one corpus BERT capture, only its dropout masks), so the device's idle time there is
    unrecorded work, not idleness."""
    gpus = model.active_gpus
    if not gpus or (model.framework == pytorch.FRAMEWORK and not launched_kernels(model.hosts)):
        return None
    for dev in gpus:
        classes = kernels.classify(dev)
        heavy = kernels.name_mask(dev.names, lambda n: _ELEMENTWISE not in n and bool(_HEAVY_KERNEL.search(n)))[dev.name]
        if np.any(classes.kernel & (classes.eligible | classes.tensor_core | heavy)):
            return None
    n = sum(int(np.count_nonzero(kernels.classify(d).kernel)) for d in gpus)
    return (f"the {n} GPU kernels recorded include no matrix multiply or convolution, so the trace holds "
            "only part of the steps' device work")


def partial_trace(model: SessionModel) -> str | None:
    """Why a host's trace holds only part of what ran (its adapter can tell a trace that was
    sampled or filtered after capture), or None."""
    return next((f"{h.name}: {h.partial_trace}" for h in model.hosts if h.partial_trace), None)


def expected_device_count(model: SessionModel) -> int:
    """How many accelerators the host evidence says the job drove."""
    count = 0
    for host in model.hosts:
        count += max(len(_allocations(host)), len(_replica_events(host)), xla_execute_threads(host))
    return count
