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

from tb_gpuadvisor.checks.base import Evidence
from tb_gpuadvisor.model import intervals as iv
from tb_gpuadvisor.model.intervals import Intervals
from tb_gpuadvisor.model.kernels import named_events
from tb_gpuadvisor.model.timeline import PS_PER_MS, HostActivity
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
    open_until: dict[int, int] = {}
    for i, (thread, start, end) in enumerate(zip(act.thread[rows].tolist(), act.start_ps[rows].tolist(),
                                                 (act.start_ps[rows] + act.dur_ps[rows]).tolist())):
        if start < open_until.get(thread, -1):
            keep[i] = False
        else:
            open_until[thread] = end
    return rows[keep]


def _user_line(act: HostActivity, frames: np.ndarray, row: int) -> str | None:
    """The innermost user frame (FRAMES: start order) of ROW's thread that encloses ROW."""
    start, end = act.start_ps[row], act.start_ps[row] + act.dur_ps[row]
    same = frames[act.thread[frames] == act.thread[row]]
    before = same[: np.searchsorted(act.start_ps[same], start, side="right")]
    enclosing = before[act.start_ps[before] + act.dur_ps[before] >= end]
    return pytorch.user_frame(act.names[act.name[enclosing[-1]]]) if enclosing.size else None


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
    inside = (at >= 0) & (starts <= (act.start_ps[syncs] + act.dur_ps[syncs])[np.clip(at, 0, None)])
    per_sync = np.bincount(at[inside], weights=(ends - starts)[inside], minlength=syncs.size)
    frames = np.flatnonzero(named_events(act, "user_frame", pytorch.user_frame))
    stalls: dict[tuple[str, str | None], Stall] = {}
    for i in np.flatnonzero(per_sync > 0).tolist():
        row = int(syncs[i])
        key = (act.names[act.name[row]], _user_line(act, frames, row) if frames.size else None)
        stall = stalls.setdefault(key, Stall(key[0], key[1], 0, 0))
        stall.idle_ps += int(per_sync[i])
        stall.calls += 1
    return sorted(stalls.values(), key=lambda s: -s.idle_ps)


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
