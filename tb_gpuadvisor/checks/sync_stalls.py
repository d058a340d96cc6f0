"""Synchronisation stalls of a PyTorch trace, named by the op and the user's line that caused them.

A sync (``.item()``, ``.cpu()``, ``cudaStreamSynchronize``, a plain ``cudaMemcpy``) only costs GPU
time when the GPU runs dry behind it: the host waits until the queued work finishes, and the GPU
then idles until the host has launched new work.  So an idle gap of the device counts against the
sync call it began inside (the outermost one of its thread: ``aten::item`` rather than the
``cudaStreamSynchronize`` it calls), and a host blocked in a sync while the GPU stays busy costs
nothing.  Where the trace has Python frames (``with_stack=True``), the innermost frame of the
user's own code around the call names the line.  Not a check: host_overhead reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tb_gpuadvisor.checks.finding import Evidence
from tb_gpuadvisor.model import intervals as iv
from tb_gpuadvisor.model.intervals import Intervals
from tb_gpuadvisor.model.kernels import named_events
from tb_gpuadvisor.timeline import PS_PER_MS, HostActivity
from tb_gpuadvisor.vocab import pytorch

TOP = 3


@dataclass
class Stall:
    """Device idle behind one sync op at one line, over all steps."""

    op: str
    line: str | None        # "train.py:42 in train_step", None without Python frames
    idle_ps: int
    calls: int

    @property
    def label(self) -> str:
        return f"{self.op} at {self.line}" if self.line else self.op


def _outermost(act: HostActivity, rows: np.ndarray) -> np.ndarray:
    """ROWS (start order) not inside an earlier one of the same thread."""
    keep = np.ones(rows.size, bool)
    thread = act.thread[rows]
    for t in np.unique(thread).tolist():
        mine = np.flatnonzero(thread == t)
        ends = np.maximum.accumulate(act.end_ps[rows[mine]])
        keep[mine[1:]] = act.start_ps[rows[mine[1:]]] >= ends[:-1]
    return rows[keep]


def _innermost(act: HostActivity, frames: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Per row of ROWS, the innermost of FRAMES (rows of ACT) on its thread open when it starts
    and still open when it ends; -1 where none is.

    Python frames nest, so the frame open at a time t at depth d (the number of frames open at
    t) is the last frame of depth d that started by t: one sorted search per row instead of a
    walk over the frames."""
    found = np.full(rows.size, -1)
    for t in np.unique(act.thread[rows]).tolist():
        mine = np.flatnonzero(act.thread[rows] == t)
        own = frames[act.thread[frames] == t]
        if not own.size:
            continue
        fs, fe = act.start_ps[own], act.end_ps[own]
        order = np.lexsort((-fe, fs))               # by start, an enclosing frame before those it holds
        own, fs, fe = own[order], fs[order], fe[order]
        ends = np.sort(fe)
        depth = np.arange(1, own.size + 1) - np.searchsorted(ends, fs, side="right")
        by_level = np.lexsort((fs, depth))
        span = int(fs.max() - fs.min()) + 1
        level_keys = depth[by_level] * span + (fs[by_level] - fs.min())
        s = act.start_ps[rows[mine]]
        e = act.end_ps[rows[mine]]
        open_now = np.searchsorted(fs, s, side="right") - np.searchsorted(ends, s, side="right")
        at = np.searchsorted(level_keys, open_now * span + np.clip(s - fs.min(), None, span - 1), side="right") - 1
        frame = by_level[np.clip(at, 0, None)]
        ok = (open_now > 0) & (at >= 0) & (depth[frame] == open_now) & (fe[frame] >= e)
        found[mine[ok]] = own[frame[ok]]
    return found


# The device-idle categories of the breakdown a sync can leave behind it (not input waits).
IDLE_KEYS = ("host_ops", "launch", "other_host")


def idle_gaps(sets: dict[str, Intervals]) -> Intervals:
    """The device's idle gaps (the breakdown's SETS) while the host did anything but wait for input."""
    parts = [sets[key] for key in IDLE_KEYS if key in sets]
    return iv.union(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))


def sync_stalls(act: HostActivity, idle: Intervals) -> list[Stall]:
    """The device-idle gaps of IDLE that began inside a sync op of ACT, per op and user line,
    largest first."""
    syncs = np.flatnonzero(named_events(act, "sync_op", pytorch.is_sync_op) & (act.step >= 0))
    starts, ends = idle
    if not syncs.size or not starts.size:
        return []
    syncs = _outermost(act, syncs)
    # The sync each gap began in: the last one starting before the gap, if it had not returned.
    at = np.searchsorted(act.start_ps[syncs], starts, side="right") - 1
    inside = (at >= 0) & (starts <= act.end_ps[syncs][np.clip(at, 0, None)])
    per_sync = np.bincount(at[inside], weights=(ends - starts)[inside], minlength=syncs.size)
    frames = np.flatnonzero(named_events(act, "user_frame", pytorch.user_frame))
    stalled = np.flatnonzero(per_sync > 0)
    rows = syncs[stalled]
    frame = _innermost(act, frames, rows)
    stalls: dict[tuple[str, str | None], Stall] = {}
    for op, line, idle, calls in _grouped(act.name[rows], np.where(frame >= 0, act.name[frame], -1), per_sync[stalled]):
        key = (act.names[op], pytorch.user_frame(act.names[line]) if line >= 0 else None)
        stall = stalls.setdefault(key, Stall(key[0], key[1], 0, 0))
        stall.idle_ps += idle
        stall.calls += calls
    return sorted(stalls.values(), key=lambda s: -s.idle_ps)


def _grouped(op: np.ndarray, line: np.ndarray, idle: np.ndarray) -> list[tuple[int, int, int, int]]:
    """(op name id, frame name id or -1, idle ps, calls) per distinct pair."""
    pairs, which = np.unique(np.stack((op, line), axis=1), axis=0, return_inverse=True)
    which = which.ravel()
    total, calls = np.bincount(which, weights=idle), np.bincount(which)
    return [(int(o), int(n), int(t), int(c)) for (o, n), t, c in zip(pairs.tolist(), total, calls)]


def stall_evidence(stalls: list[Stall], steps: int, device: str, host: str) -> list[Evidence]:
    return [Evidence(kind="op", name=s.label, value=round(s.idle_ps / PS_PER_MS / steps, 3), unit="ms/step",
                     detail=f"sync: {s.calls} call(s) waited for {device}, which then sat idle until new work "
                            "was launched", device=device, host=host)
            for s in stalls[:TOP]]


def stall_sentence(stalls: list[Stall], steps: int) -> str:
    """The largest stall in words, for the finding's summary."""
    if not stalls:
        return ""
    top = stalls[0]
    return (f" The largest sync stall: {top.label} waits for the GPU, which then idles "
            f"{top.idle_ps / PS_PER_MS / steps:.2f} ms per step until new work arrives.")
