"""One step as a picture: the drawable form of a step the tab's timeline and ``analyze --timeline``
read, with each finding's evidence marked on it.

It reads the analysed session (the model through trust's view, the attribution) and the checks'
findings, and writes nothing back. A step comes back as rows (one per device stream and one per
host thread that did work in it, grouped by host), each a few columns of rectangles in
microseconds from the step's start. What one pixel cannot show at the closest zoom is merged
(``WIDTH_PX`` times ``MAX_ZOOM``), and the step keeps about ``STEP_RECTS`` rectangles, shared by
its rows, so a step of a 1 GB capture stays small enough to send and to draw.

A finding's marks are the attribution's own intervals for the causes its check declares
(``checks.base.Marks``): the time the finding's number counts, so the marked share of the step and
the number are one measurement. A check that declares ``NoMarks`` says why it marks nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tb_gpuadvisor.attribution.breakdown import CATEGORIES
from tb_gpuadvisor.checks import Check, Finding, all_checks
from tb_gpuadvisor.checks.base import Marks
from tb_gpuadvisor.checks.context import Analysis
from tb_gpuadvisor.kinds import DeviceEventKind, HostEventKind
from tb_gpuadvisor.model import intervals as iv
from tb_gpuadvisor.stages import Memo
from tb_gpuadvisor.timeline import PS_PER_MS, PS_PER_US, DeviceActivity, HostActivity

_MEMO = Memo()

# The timeline zooms in at most this far from the whole step at WIDTH_PX pixels: a rectangle or gap
# shorter than one pixel there is merged with its neighbours (never below a nanosecond).
WIDTH_PX = 900
MAX_ZOOM = 200
# Rectangles kept per step, shared by the rows in proportion to their events (at least ROW_MIN,
# at most ROW_RECTS each); past its share a row is merged across its smallest gaps.
STEP_RECTS = 20000
ROW_RECTS = 4000
ROW_MIN = 100
# A table's events longer than this share of its events are looked up apart (see _window).
LONG_QUANTILE = 0.999
SAMPLE = 100_000
# Marked intervals per finding; past it adjacent ones merge the same way.
MARK_RECTS = 4000

# What each row's rectangles are, coloured as the step chart's legend groups.
DEVICE_GROUPS = {int(DeviceEventKind.KERNEL): "compute", int(DeviceEventKind.COLLECTIVE): "collective"}
HOST_KINDS = {int(HostEventKind.INPUT_WAIT): "input", int(HostEventKind.LAUNCH): "launch",
              int(HostEventKind.FRAMEWORK_OP): "host", int(HostEventKind.ALLOCATOR): "host",
              int(HostEventKind.FUNCTION): "host", int(HostEventKind.EXECUTOR): "host"}
GROUPS = ("compute", "copy", "collective", "input", "launch", "host", "host_ops", "not_traced")
# The attribution's sets drawn in the primary device's cause row, in the legend's groups.
CAUSE_SETS = (("compute", "compute"), ("collective", "collective"), ("copy", "copy"),
              ("not_traced", "not_traced"), ("input", "input"), ("host_ops", "host_ops"),
              ("launch", "launch"), ("other_host", "host"))
# The cause row's names: the breakdown's labels, and the sets that join several of its categories.
_CATEGORY_LABELS = {c.key: c.label for c in CATEGORIES}
_CAUSE_LABELS = {"compute": "compute", "collective": "collectives", "copy": "copies"}


class StepNotFound(LookupError):
    """The asked step is not one of the trusted steps."""


@dataclass
class _Rects:
    """Rectangles of one row before they are sent: ps from the session origin."""

    start: np.ndarray
    end: np.ndarray
    name: np.ndarray        # index into the row table's names
    group: np.ndarray       # index into GROUPS
    corr: np.ndarray        # correlation id, -1 when none
    lane: np.ndarray        # 0: top level; 1: nested in a call of the same thread


def step_index(analysis: Analysis, step: int | None) -> int:
    """The position of STEP (as the program numbered it) among the trusted steps; None: the
    representative step, the one of median duration (the report's critical path reads it)."""
    steps = analysis.model.steps
    if not len(steps):
        raise StepNotFound("the session has no trusted steps to draw")
    if step is None:
        order = np.argsort(steps.duration_ps, kind="stable")
        return int(order[(order.size - 1) // 2])
    found = np.flatnonzero(steps.number == step)
    if not found.size:
        raise StepNotFound(f"step {step} is not one of the trusted steps "
                           f"({int(steps.number.min())} to {int(steps.number.max())})")
    return int(found[0])


def step_timeline(analysis: Analysis, findings: list[Finding], step: int | None = None) -> dict:
    """The drawable form of STEP (None: the representative step) with every finding's marks."""
    index = step_index(analysis, step)
    steps = analysis.model.steps
    lo, hi = int(steps.start_ps[index]), int(steps.end_ps[index])
    resolution = max((hi - lo) // (WIDTH_PX * MAX_ZOOM), 1000)
    names = _Names()
    rows = _device_rows(analysis, lo, hi) + _host_rows(analysis, lo, hi)
    # The step's rectangles shared by the rows in proportion to their events.
    events = max(sum(rects.start.size for _, rects, _ in rows), 1)
    drawn = [dict(head, **_columns(_merged(rects, resolution, _row_cap(rects.start.size, events)), lo, names, table))
             for head, rects, table in rows]
    cause = _cause_row(analysis, lo, hi, resolution, names)
    declared = {c.id: c for c in all_checks()}
    return {
        "step": int(steps.number[index]), "index": index, "steps": [int(n) for n in steps.number],
        "start_ms": round(lo / PS_PER_MS, 6), "duration_us": _us(hi - lo),
        "resolution_us": _us(resolution), "groups": list(GROUPS),
        "device": analysis.breakdown.primary.name if analysis.breakdown.primary else None,
        "rows": ([cause] if cause else []) + drawn, "names": names.values,
        "findings": [_marks(analysis, finding, declared.get(finding.check), lo, hi, resolution)
                     for finding in findings],
    }


def _row_cap(size: int, events: int) -> int:
    """How many rectangles a row of SIZE events keeps, of a step of EVENTS."""
    return max(ROW_MIN, min(ROW_RECTS, STEP_RECTS * size // events))


class _Names:
    """Every rectangle's name, once per step."""

    def __init__(self) -> None:
        self.values: list[str] = []
        self._at: dict[str, int] = {}

    def index(self, name: str) -> int:
        at = self._at.get(name)
        if at is None:
            at = self._at[name] = len(self.values)
            self.values.append(name)
        return at


def _window(table: DeviceActivity | HostActivity, lo: int, hi: int) -> np.ndarray:
    """Rows of TABLE (sorted by start) whose events overlap [LO, HI), never a scan of the whole
    table: the events no longer than nearly all (``LONG_QUANTILE``) are found by two binary
    searches, the few longer ones (a whole-capture annotation) are kept apart once per table."""
    memo = _MEMO.of(table)
    if "long" not in memo:
        # The cut is taken on an even sample of at most SAMPLE events (any cut is correct; this
        # one keeps the window short and the events apart few), the long events found exactly.
        dur = table.dur_ps
        sample = np.sort(dur[::max(1, dur.size // SAMPLE)])
        cut = int(sample[int(LONG_QUANTILE * (sample.size - 1))]) if sample.size else 0
        memo["long"] = (cut, np.flatnonzero(dur > cut))
    cut, long_rows = memo["long"]
    first, last = np.searchsorted(table.start_ps, [lo - cut, hi], side="left")
    rows = np.arange(first, last, dtype=np.int64)
    rows = rows[(table.end_ps[rows] > lo) & (table.dur_ps[rows] <= cut)]
    far = long_rows[(table.start_ps[long_rows] < hi) & (table.end_ps[long_rows] > lo)]
    return np.union1d(rows, far) if far.size else rows


def _device_rows(analysis: Analysis, lo: int, hi: int) -> list[tuple[dict, _Rects, list[str]]]:
    """One row per stream of every device that ran work in [LO, HI)."""
    out = []
    hosts = len(analysis.model.hosts)
    for host in analysis.model.hosts:
        for dev in host.devices:
            rows = _window(dev, lo, hi)
            if not rows.size:
                continue
            kind = dev.kind[rows].astype(np.int64)
            group = np.full(rows.size, GROUPS.index("copy"), np.int8)
            for code, name in DEVICE_GROUPS.items():
                group[kind == code] = GROUPS.index(name)
            streams = dev.stream[rows]
            for stream in np.unique(streams):
                at = rows[streams == stream]
                head = {"host": host.name if hosts > 1 else "", "kind": "device", "device": dev.device.name,
                        "label": f"{_short(dev.device.name)} {dev.streams[int(stream)]}" if dev.streams
                        else dev.device.name}
                out.append((head, _Rects(dev.start_ps[at], dev.end_ps[at], dev.name[at], group[streams == stream],
                                         _ids(dev.correlation_id, at), np.zeros(at.size, np.int8)), dev.names))
    return out


def _host_rows(analysis: Analysis, lo: int, hi: int) -> list[tuple[dict, _Rects, list[str]]]:
    """One row per host thread that ran ops, runtime calls, input waits or allocator calls in
    [LO, HI); a call inside an earlier call of its thread goes in the row's second lane."""
    out = []
    hosts = len(analysis.model.hosts)
    for host in analysis.model.hosts:
        act = host.activity
        rows = _window(act, lo, hi)
        kind = act.kind[rows].astype(np.int64)
        group = np.full(rows.size, -1, np.int8)
        for code, name in HOST_KINDS.items():
            group[kind == code] = GROUPS.index(name)
        rows, group = rows[group >= 0], group[group >= 0]
        threads = act.thread[rows]
        for thread in np.unique(threads):
            mine = threads == thread
            at = rows[mine]
            start, end = act.start_ps[at], act.end_ps[at]
            reach = np.maximum.accumulate(end)
            nested = np.zeros(at.size, np.int8)
            nested[1:] = start[1:] < reach[:-1]
            head = {"host": host.name if hosts > 1 else "", "kind": "host", "device": "",
                    "label": act.threads[int(thread)]}
            out.append((head, _Rects(start, end, act.name[at], group[mine], _ids(act.correlation_id, at), nested),
                        act.names))
    return out


def _short(device: str) -> str:
    """"/device:GPU:0" as "GPU:0": row labels are narrow."""
    return device.rsplit("/device:", 1)[-1]


def _ids(column: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """A table's id column at ROWS (an id column without values is one shared -1)."""
    return column[rows] if column.size > 1 else np.full(rows.size, -1, np.int64)


def _groups_of(start: np.ndarray, end: np.ndarray, resolution: int) -> np.ndarray:
    """Group number per rectangle (sorted by start): a rectangle shorter than RESOLUTION joins a
    neighbour also shorter when the gap between them is shorter too; longer ones stand alone."""
    if not start.size:
        return np.empty(0, np.int64)
    small = (end - start) < resolution
    reach = np.maximum.accumulate(end)
    joins = np.zeros(start.size, bool)
    joins[1:] = small[1:] & small[:-1] & (start[1:] - reach[:-1] < resolution)
    return np.cumsum(~joins) - 1


def _merged(rects: _Rects, resolution: int, cap: int) -> tuple[_Rects, np.ndarray]:
    """RECTS merged per lane below RESOLUTION; a lane still over its part of CAP is merged across
    its smallest gaps until it fits (the largest gaps stay: what a zoomed-out eye tells apart).
    The merged rectangles, and each one's count of events."""
    lanes = [np.flatnonzero(rects.lane == lane) for lane in (0, 1)]
    total = max(sum(mine.size for mine in lanes), 1)
    parts, counts = [], []
    for lane, mine in enumerate(lanes):
        if not mine.size:
            continue
        mine = mine[np.argsort(rects.start[mine], kind="stable")]
        start, end = rects.start[mine], rects.end[mine]
        group = _groups_of(start, end, resolution)
        firsts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
        budget = max(1, cap * mine.size // total)
        if firsts.size > budget:
            reach = np.maximum.accumulate(end)
            gaps = start[firsts[1:]] - reach[firsts[1:] - 1]
            boundary = np.zeros(firsts.size, bool)
            boundary[0] = True
            if budget > 1:
                boundary[np.argpartition(-gaps, budget - 2)[:budget - 1] + 1] = True
            group = (np.cumsum(boundary) - 1)[group]
            firsts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
        count = np.diff(np.r_[firsts, group.size])
        # The merged rectangle carries its longest event's name, group and id.
        order = np.lexsort((start - end, group))
        longest = mine[order[firsts]]
        parts.append(_Rects(start[firsts], np.maximum.reduceat(end, firsts), rects.name[longest],
                            rects.group[longest], rects.corr[longest], np.full(firsts.size, lane, np.int8)))
        counts.append(count)
    if not parts:
        return rects, np.empty(0, np.int64)
    joined = _Rects(*(np.concatenate([getattr(p, f) for p in parts]) for f in _Rects.__dataclass_fields__))
    return joined, np.concatenate(counts)


def _columns(merged: tuple[_Rects, np.ndarray], lo: int, names: _Names, table: list[str]) -> dict:
    """A row's rectangles as JSON columns: start and duration in us from the step's start."""
    rects, count = merged
    start = np.maximum(rects.start, lo)
    known = {int(i): names.index(table[int(i)]) for i in np.unique(rects.name)} if rects.name.size else {}
    return {"start": _us(start - lo), "dur": _us(rects.end - start),
            "name": [known[int(i)] for i in rects.name], "group": rects.group.tolist(),
            "corr": rects.corr.tolist(), "lane": rects.lane.tolist(), "count": count.tolist()}


def _cause_row(analysis: Analysis, lo: int, hi: int, resolution: int, names: _Names) -> dict | None:
    """The primary device's step as the attribution split it: every microsecond under its cause."""
    primary = analysis.breakdown.primary
    if primary is None:
        return None
    starts, ends, groups, labels, table = [], [], [], [], []
    for key, group in CAUSE_SETS:
        if key not in primary.sets:
            continue
        s, e = _inside(primary.sets[key], lo, hi)
        starts.append(s)
        ends.append(e)
        groups.append(np.full(s.size, GROUPS.index(group), np.int8))
        labels.append(np.full(s.size, len(table), np.int64))
        table.append(_CAUSE_LABELS.get(key) or _CATEGORY_LABELS[key])
    start, end = np.concatenate(starts), np.concatenate(ends)
    rects = _Rects(start, end, np.concatenate(labels), np.concatenate(groups),
                   np.full(start.size, -1, np.int64), np.zeros(start.size, np.int8))
    return dict({"host": "", "kind": "cause", "device": primary.name, "label": f"{_short(primary.name)} by cause"},
                **_columns(_merged(rects, resolution, ROW_RECTS), lo, names, table))


def _marks(analysis: Analysis, finding: Finding, check: Check | None, lo: int, hi: int, resolution: int) -> dict:
    """FINDING's marked intervals in the step (CHECK declares which), their share of it, and the
    finding's own number."""
    out = {"check": finding.check, "title": finding.title, "severity": finding.severity.value}
    primary = analysis.breakdown.primary
    if check is None or not isinstance(check.marks, Marks):
        return dict(out, why=check.marks.why if check is not None else "not a registered check")
    metric = finding.metrics.get(check.marks.metric)
    if metric is None:
        return dict(out, why=f"not measured on this capture ({finding.title})")
    if primary is None or any(key not in primary.sets for key in check.marks.causes):
        return dict(out, why="the attribution has no device to mark it on")
    start, end = iv.EMPTY
    for key in check.marks.causes:     # the causes' sets are disjoint: one cause per microsecond
        s, e = _inside(primary.sets[key], lo, hi)
        start, end = np.concatenate([start, s]), np.concatenate([end, e])
    order = np.argsort(start, kind="stable")
    start, end = start[order], end[order]
    total = int(np.sum(end - start))
    # Drawn as the attribution cut them; merged (gaps under a pixel filled) only past MARK_RECTS.
    while start.size > MARK_RECTS:
        start, end = _filled(start, end, resolution)
        resolution *= 2
    return dict(out, device=primary.name, causes=list(check.marks.causes), metric=check.marks.metric,
                finding_percent=metric, step_percent=round(100.0 * total / (hi - lo), 2),
                marked_us=_us(total), start=_us(start - lo), dur=_us(end - start))


def _inside(intervals: iv.Intervals, lo: int, hi: int) -> iv.Intervals:
    """The part of a disjoint sorted set inside [LO, HI), found by binary search: the session's
    sets hold every step, and a step is a small part of them."""
    starts, ends = intervals
    first = int(np.searchsorted(ends, lo, side="right"))
    last = int(np.searchsorted(starts, hi, side="left"))
    return iv.clip((starts[first:last], ends[first:last]), lo, hi)


def _filled(start: np.ndarray, end: np.ndarray, resolution: int) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint sorted intervals with the gaps shorter than RESOLUTION filled."""
    keep = np.r_[True, start[1:] - end[:-1] >= resolution]
    firsts = np.flatnonzero(keep)
    return start[firsts], np.r_[end[firsts[1:] - 1], end[-1]]


def _us(ps: np.ndarray | int) -> list[float] | float:
    """Picoseconds as microseconds, to the nanosecond."""
    if isinstance(ps, np.ndarray):
        return np.round(ps / PS_PER_US, 3).tolist()
    return round(int(ps) / PS_PER_US, 3)
