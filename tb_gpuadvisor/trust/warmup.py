"""One-time set-up inside the captured steps, recognised before any idle time is attributed.

A PyTorch capture that starts with the first iterations holds work a warmed-up step never
pays, each event of it marked by the adapter (``HostEventKind``): the device's context created,
library set-up queries, kernels loaded on their first launch (CUDA lazy module loading) and
first launches that loaded them (``FIRST_USE``), torch.compile's tracing, compiling and
autotuning (``COMPILE``), cuDNN's algorithm search (``AUTOTUNE``: a convolution call launching
dozens of kernels), and here a final synchronize that waits long after the last traced kernel
ended (the profiler's stop, or work it did not trace). While it runs the GPU idles, and the
host is inside launch calls or ops: counted as idle it would read as launch or host overhead.
A step whose window is mostly set-up is a warm-up iteration and is left out; a capture whose
steps are mostly set-up, with fewer than ``CLEAN_STEPS`` others, is one to take again after
warm-up.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tb_gpuadvisor.model import intervals as iv
from tb_gpuadvisor.model.intervals import Intervals
from tb_gpuadvisor.kinds import HostEventKind
from tb_gpuadvisor.timeline import PS_PER_MS, HostActivity, HostModel, Steps

# A step whose window is at least this share set-up is a warm-up iteration; a capture whose
# steps are, all together, is one to take again.
WARM_UP_SHARE = 0.5
# Steps left once warm-up iterations are out from which the rest of a capture is still judged
# (fewer, and a capture mostly of set-up is taken again).
CLEAN_STEPS = 3
# A capture with set-up whose devices worked less than this share of its steps holds first calls
# (a warmed-up call's host runs ahead of its device, or waits for it), when set-up holds at least
# TINY_SETUP_SHARE of them (a host-bound loop with one lazily loaded kernel is judged as it is).
TINY_DEVICE_SHARE = 0.05
TINY_SETUP_SHARE = 0.1
# A synchronize that returns this long after the last device event ended waited for something
# the trace does not hold (a warmed-up step's sync returns microseconds after its last kernel).
FINAL_SYNC_PS = 10 * PS_PER_MS
KINDS = ("first-use set-up (context creation, library initialisation, lazy kernel loading, slow first launches)",
         "torch.compile tracing, compilation and autotuning",
         "cuDNN autotuning (convolutions timing every algorithm)",
         "a final synchronize outlasting the last kernel")


@dataclass
class SetUp:
    """The set-up time of each candidate step, by kind (rows of ``KINDS``), in ps."""

    by_kind: np.ndarray         # kinds x steps
    within: np.ndarray          # per step: the union of every kind inside its window
    device_busy: np.ndarray     # per step: the time any device worked inside its window
    by_host: dict[str, Intervals]   # host name -> its set-up (every kind), over the whole capture

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
        setup = int(self.within.sum())
        if not total or not setup:
            return None
        parts = ", ".join(f"{ps / PS_PER_MS:.1f} ms of {kind}"
                          for kind, ps in zip(KINDS, self.by_kind.sum(axis=1)) if ps)
        if setup >= WARM_UP_SHARE * total:
            return (f"one-time set-up fills {100 * setup / total:.0f}% of the captured steps ({parts}): the "
                    "capture holds warm-up, not training steps")
        busy = int(self.device_busy.sum())
        if busy < TINY_DEVICE_SHARE * total and setup >= TINY_SETUP_SHARE * total:
            return (f"the devices worked {100 * busy / total:.1f}% of the captured time and the rest holds "
                    f"one-time set-up ({parts}): the capture holds first calls, not warmed-up ones")
        return None


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
        late = _waits(act) & (act.end_ps - last > FINAL_SYNC_PS)
        starts.append(np.maximum(act.start_ps[late], last))
        stops.append(act.end_ps[late])
    return iv.union(np.concatenate(starts), np.concatenate(stops))


def _waits(act: HostActivity) -> np.ndarray:
    """The calls that wait for the device: synchronize calls, and streams told to wait."""
    return (act.kind == HostEventKind.SYNC) | (act.kind == HostEventKind.STREAM_WAIT)


def before_final_sync(hosts: list[HostModel], until: int) -> int:
    """UNTIL, or the start of a final synchronize's wait past the last device event when that wait
    runs up to UNTIL: the host waited there and launched nothing, so its trace did not outlast the
    device's."""
    starts, ends = final_syncs(hosts)
    tail = (starts < until) & (ends >= until - PS_PER_MS)
    return int(min(until, starts[tail].min())) if tail.any() else until


def _launch_calls(act: HostActivity) -> np.ndarray:
    """The calls that put work on a device: launches, slow ones, and set-up that launched (a first
    launch that loaded its kernel: a set-up call with a correlation id)."""
    kind = act.kind
    return ((kind == HostEventKind.LAUNCH) | (kind == HostEventKind.SLOW_LAUNCH)
            | ((kind == HostEventKind.FIRST_USE) & (act.correlation_id >= 0)))


def _library_set_up(host: HostModel, first_use: np.ndarray) -> Intervals:
    """The part of an op's call spent setting up a library on its first use: from the start of the
    innermost op around the first query of each set-up name (cuBLAS's handle inside the first
    ``aten::mm``: symbol and attribute queries, its pinned workspace, loading the library, none
    of them a kernel's work) to the op's first launch after it, or the op's end. Only the first
    query of a name counts, so a library that asks again on every call adds microseconds."""
    act = host.activity
    queries = np.flatnonzero(first_use)
    if not queries.size:
        return iv.EMPTY
    order = queries[np.lexsort((act.start_ps[queries], act.name[queries]))]
    keep = np.ones(order.size, bool)
    keep[1:] = act.name[order[1:]] != act.name[order[:-1]]
    queries = order[keep]
    ops = np.flatnonzero(act.kind == HostEventKind.FRAMEWORK_OP)
    launches = np.flatnonzero(_launch_calls(act))
    starts, ends = [], []
    for q in queries:
        around = ops[(act.thread[ops] == act.thread[q]) & (act.start_ps[ops] <= act.start_ps[q])
                     & (act.end_ps[ops] >= act.end_ps[q])]
        if not around.size:
            continue
        op = int(around[np.argmax(act.start_ps[around])])
        after = launches[(act.thread[launches] == act.thread[q]) & (act.start_ps[launches] >= act.end_ps[q])
                         & (act.start_ps[launches] < act.end_ps[op])]
        starts.append(int(act.start_ps[op]))
        ends.append(int(act.start_ps[after].min()) if after.size else int(act.end_ps[op]))
    return iv.union(np.array(starts, np.int64), np.array(ends, np.int64))


def measure(hosts: list[HostModel], steps: Steps) -> SetUp:
    """Each step's set-up time, by kind, inside its window, and each host's set-up."""
    kinds: list[list[Intervals]] = [[], [], [], [final_syncs(hosts)]]
    by_host: dict[str, Intervals] = {}
    for host in hosts:
        act = host.activity
        first_use = act.kind == HostEventKind.FIRST_USE
        own = [iv.union_of(iv.union(act.start_ps, act.end_ps, first_use), _library_set_up(host, first_use)),
               iv.union(act.start_ps, act.end_ps, act.kind == HostEventKind.COMPILE),
               iv.union(act.start_ps, act.end_ps, act.kind == HostEventKind.AUTOTUNE)]
        for kind, found in zip(kinds, own):
            kind.append(found)
        by_host[host.name] = _merge(own + [final_syncs([host])])
    merged = [_merge(sets) for sets in kinds]
    by_kind = np.vstack([iv.per_bin_total(m, steps.start_ps, steps.end_ps) for m in merged])
    every = _merge(merged)
    busy = _merge([iv.union(dev.start_ps, dev.end_ps) for host in hosts for dev in host.devices if len(dev)])
    return SetUp(by_kind, iv.per_bin_total(every, steps.start_ps, steps.end_ps),
                 iv.per_bin_total(busy, steps.start_ps, steps.end_ps), by_host)


def _merge(sets: list[Intervals]) -> Intervals:
    """The union of SETS."""
    if not sets:
        return iv.EMPTY
    return iv.union(np.concatenate([s for s, _ in sets]), np.concatenate([e for _, e in sets]))
