"""One-time set-up inside the captured steps, recognised before any idle time is attributed.

A PyTorch capture that starts with the first iterations holds work a warmed-up step never
pays: kernels loaded on their first launch (CUDA lazy module loading: ``cuModuleLoad*``,
``cudaGetFuncBySymbol``, ...), library set-up queries, a kernel's first launch lasting a
millisecond or more (``HostEventKind.FIRST_USE``), torch.compile's tracing, compiling and autotuning
(``vocab.pytorch.is_compile``), cuDNN's algorithm search (cudnn.benchmark: a convolution call
launching dozens of kernels), and a final synchronize that waits long after the last traced
kernel ended (the profiler's stop, or work it did not trace). While it runs the GPU idles, and
the host is inside launch calls or ops: counted as idle it would read as launch or host
overhead. A step whose window is mostly set-up is a warm-up iteration and is left out; a
capture whose steps are mostly set-up, with fewer than ``CLEAN_STEPS`` others, is one to take
again after warm-up.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tb_gpuadvisor.model import intervals as iv
from tb_gpuadvisor.model.intervals import Intervals
from tb_gpuadvisor.model.kernels import named_events
from tb_gpuadvisor.model.steps import launch_rows
from tb_gpuadvisor.kinds import DeviceEventKind, HostEventKind
from tb_gpuadvisor.timeline import PS_PER_MS, HostActivity, HostModel, Steps
from tb_gpuadvisor.vocab import pytorch
from tb_gpuadvisor.vocab.gpu import LAUNCH_CALL, SYNC_CALL

# A step whose window is at least this share set-up is a warm-up iteration; a capture whose
# steps are, all together, is one to take again.
WARM_UP_SHARE = 0.5
# Steps left once warm-up iterations are out from which the rest of a capture is still judged
# (fewer, and a capture mostly of set-up is taken again).
CLEAN_STEPS = 3
# A synchronize that returns this long after the last device event ended waited for something
# the trace does not hold (a warmed-up step's sync returns microseconds after its last kernel).
FINAL_SYNC_PS = 10 * PS_PER_MS
KINDS = ("first-use set-up (lazy kernel loading, library queries, slow first launches)",
         "torch.compile tracing, compilation and autotuning",
         "cuDNN autotuning (convolutions timing every algorithm)",
         "a final synchronize outlasting the last kernel")


@dataclass
class SetUp:
    """The set-up time of each candidate step, by kind (rows of ``KINDS``), in ps."""

    by_kind: np.ndarray         # kinds x steps
    within: np.ndarray          # per step: the union of every kind inside its window

    def share(self, steps: Steps) -> np.ndarray:
        return self.within / np.maximum(steps.duration_ps, 1)

    def reason(self, index: int, steps: Steps) -> str:
        """Why step INDEX is a warm-up iteration, in words."""
        parts = [f"{ps / PS_PER_MS:.1f} ms of {kind}" for kind, ps in zip(KINDS, self.by_kind[:, index]) if ps]
        return (f"{100 * self.share(steps)[index]:.0f}% of it is one-time set-up (" + ", ".join(parts)
                + "): a warm-up iteration")

    def window_reason(self, steps: Steps) -> str | None:
        """Why the whole capture must be taken again, or None when its steps are mostly work."""
        total = int(steps.duration_ps.sum())
        if not total or self.within.sum() < WARM_UP_SHARE * total:
            return None
        parts = [f"{ps / PS_PER_MS:.1f} ms of {kind}" for kind, ps in zip(KINDS, self.by_kind.sum(axis=1)) if ps]
        return (f"one-time set-up fills {100 * self.within.sum() / total:.0f}% of the captured steps ("
                + ", ".join(parts) + "): the capture holds warm-up, not training steps")


def final_syncs(hosts: list[HostModel]) -> Intervals:
    """The part of each synchronize call after the capture's last device event, where that part
    is longer than ``FINAL_SYNC_PS``."""
    ends = [int(dev.end_ps.max()) for host in hosts for dev in host.devices if len(dev)]
    if not ends:
        return iv.EMPTY
    last = max(ends)
    starts, stops = [], []
    for host in hosts:
        act = host.activity
        late = named_events(act, "sync", SYNC_CALL.search) & (act.end_ps - last > FINAL_SYNC_PS)
        starts.append(np.maximum(act.start_ps[late], last))
        stops.append(act.end_ps[late])
    return iv.union(np.concatenate(starts), np.concatenate(stops))


def before_final_sync(hosts: list[HostModel], until: int) -> int:
    """UNTIL, or the start of a final synchronize's wait past the last device event when that wait
    runs up to UNTIL: the host waited there and launched nothing, so its trace did not outlast the
    device's."""
    starts, ends = final_syncs(hosts)
    tail = (starts < until) & (ends >= until - PS_PER_MS)
    return int(min(until, starts[tail].min())) if tail.any() else until


def _first_use(host: HostModel) -> np.ndarray:
    """The host's first-use events: kernel loads and library queries, and launch calls of a
    millisecond or more that launched a kernel's first run on its device (a lazily loaded kernel).
    A long launch of a kernel run before waited for a full launch queue, and a long copy call
    for the copy itself: neither is set-up."""
    act = host.activity
    first_use = act.kind == HostEventKind.FIRST_USE
    launch_call = named_events(act, "launch_call", LAUNCH_CALL.search)
    mask = first_use & ~launch_call
    slow = np.flatnonzero(first_use & launch_call)
    if slow.size:
        for dev in host.devices:
            _, first = np.unique(dev.name, return_index=True)
            rows = launch_rows(act, dev)[first[dev.kind[first] == DeviceEventKind.KERNEL]]
            mask[np.intersect1d(rows, slow)] = True
    return mask


def _autotuning(act: HostActivity) -> Intervals:
    """Convolution op calls that launched ``AUTOTUNE_KERNELS_PER_CALL`` kernels or more on their
    thread: cuDNN benchmark mode timing every algorithm on a shape's first call."""
    ops = np.flatnonzero(named_events(act, "convolution_op", pytorch.is_convolution_op))
    launches = np.flatnonzero(act.kind == HostEventKind.LAUNCH)
    if not ops.size or not launches.size:
        return iv.EMPTY
    # Launches ordered by (thread, start): the ones inside an op are one run of that order.
    threads = np.unique(act.thread[ops])
    rank = np.searchsorted(threads, act.thread[launches])
    launches = launches[(rank < threads.size) & (threads[np.clip(rank, 0, threads.size - 1)] == act.thread[launches])]
    span = int(act.end_ps.max()) + 1
    keys = np.sort(np.searchsorted(threads, act.thread[launches]).astype(np.int64) * span + act.start_ps[launches])
    base = np.searchsorted(threads, act.thread[ops]).astype(np.int64) * span
    count = np.searchsorted(keys, base + act.end_ps[ops]) - np.searchsorted(keys, base + act.start_ps[ops])
    tuning = ops[count >= pytorch.AUTOTUNE_KERNELS_PER_CALL]
    return iv.union(act.start_ps[tuning], act.end_ps[tuning])


def measure(hosts: list[HostModel], steps: Steps) -> SetUp:
    """Each step's set-up time, by kind, inside its window."""
    kinds: list[list[Intervals]] = [[], [], [], [final_syncs(hosts)]]
    for host in hosts:
        act = host.activity
        kinds[0].append(iv.union(act.start_ps, act.end_ps, _first_use(host)))
        kinds[1].append(iv.union(act.start_ps, act.end_ps, named_events(act, "torch_compile", pytorch.is_compile)))
        kinds[2].append(_autotuning(act))
    merged = [iv.union(np.concatenate([s for s, _ in sets]), np.concatenate([e for _, e in sets]))
              for sets in kinds]
    by_kind = np.vstack([iv.per_bin_total(m, steps.start_ps, steps.end_ps) for m in merged])
    every = iv.union(np.concatenate([s for s, _ in merged]), np.concatenate([e for _, e in merged]))
    return SetUp(by_kind, iv.per_bin_total(every, steps.start_ps, steps.end_ps))
