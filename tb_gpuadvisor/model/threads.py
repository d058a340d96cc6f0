"""How many of a host's traced threads worked at once: the cores the capture saw the process use,
which the fixes that size a pool of worker processes leave to it."""

from __future__ import annotations

import numpy as np

from tb_gpuadvisor.kinds import HostEventKind
from tb_gpuadvisor.model import intervals as iv
from tb_gpuadvisor.timeline import HostActivity

# Threads at work together only in blips (two short events overlapping) are not the process's use
# of the cores: a count of threads at once counts when it holds for this share of the windows' time.
BUSY_SHARE = 0.05
# Events that are not a thread working: a step marker or a phase annotation wraps its thread's work
# (and its gaps), a wait for input blocks, memory records are instants.
_NOT_WORK = (HostEventKind.STEP_MARKER, HostEventKind.SCOPE, HostEventKind.INPUT_WAIT, HostEventKind.MEMORY)


def busy_threads(activity: HostActivity, windows: iv.Intervals) -> int:
    """The most threads of ACTIVITY with work at once inside WINDOWS (the steps), held for at least
    BUSY_SHARE of the windows' time; 0 when no thread worked there."""
    span = iv.total(windows)
    if not len(activity) or not span:
        return 0
    rows = np.flatnonzero(~activity.mask(*_NOT_WORK) & (activity.dur_ps > 0))
    rows = rows[np.argsort(activity.thread[rows], kind="stable")]      # by thread, each by start
    threads, first = np.unique(activity.thread[rows], return_index=True)
    edges, steps = [], []
    for part in np.split(rows, first[1:]) if rows.size else []:
        start = activity.start_ps[part]
        start, end = iv.intersect(iv.union(start, start + activity.dur_ps[part]), windows)
        edges += [start, end]
        steps += [np.ones(start.size, np.int64), -np.ones(end.size, np.int64)]
    if not edges:
        return 0
    at = np.concatenate(edges)
    order = np.argsort(at, kind="stable")
    at, running = at[order], np.cumsum(np.concatenate(steps)[order])   # threads at work from each edge on
    held = np.bincount(running[:-1], weights=np.diff(at), minlength=1)  # time with exactly k at work
    at_least = np.cumsum(held[::-1])[::-1]                               # time with k or more at work
    enough = np.flatnonzero(at_least[1:] >= BUSY_SHARE * span)
    return int(enough[-1]) + 1 if enough.size else 0
