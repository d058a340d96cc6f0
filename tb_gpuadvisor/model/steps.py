"""Finding training steps and assigning every event to one.

A stored ``Steps`` line (older TensorFlow's own grouping of the markers) is
used when a capture has one; otherwise markers are tried in order of trust (see
the check catalogue): custom-loop ``_r``=1 annotations, Keras 2 ``TraceContext``,
Keras 3 ``Profiled batch``, and finally inference from repeated top-level
function runs (tf.function or XLA executables).
"""

from __future__ import annotations

import numpy as np

from tb_gpuadvisor.arrays import SortedKeys
from tb_gpuadvisor.model import classify
from tb_gpuadvisor.model.build import HostCapture
from tb_gpuadvisor.model.timeline import HostActivity, HostEventKind, Steps

_EMPTY = np.empty(0, np.int64)


def _collapse(number: np.ndarray, start: np.ndarray, end: np.ndarray, group: np.ndarray,
              source: str, marker: str) -> Steps:
    """One step per step number (markers repeat across threads and hosts), in time order."""
    order = np.lexsort((start, number))
    number, start, end, group = number[order], start[order], end[order], group[order]
    first = np.ones(number.size, bool)
    first[1:] = number[1:] != number[:-1]
    starts = np.minimum.reduceat(start, np.flatnonzero(first)) if number.size else _EMPTY
    ends = np.maximum.reduceat(end, np.flatnonzero(first)) if number.size else _EMPTY
    groups = group[first]
    numbers = number[first]
    by_time = np.argsort(starts, kind="stable")
    return Steps(source, numbers[by_time], starts[by_time], ends[by_time], groups[by_time], marker)


def _marker_steps(hosts: list[HostCapture]) -> Steps | None:
    for source, name in (("custom_loop", None), ("keras2", "TraceContext"), ("keras", "Profiled batch")):
        parts = []
        for hc in hosts:
            act = hc.activity
            if name is None:
                mask = act.is_root & (act.step_num >= 0)
            else:
                ids = [i for i, n in enumerate(act.names) if n == name]
                mask = np.isin(act.name, ids) & (act.step_num >= 0)
            if mask.any():
                parts.append((act, mask))
        if parts:
            number = np.concatenate([a.step_num[m] for a, m in parts])
            start = np.concatenate([a.start_ps[m] for a, m in parts])
            end = np.concatenate([a.end_ps[m] for a, m in parts])
            group = np.concatenate([a.group_id[m] for a, m in parts])
            marker = name or _root_marker_name(parts[0][0], parts[0][1])
            return _collapse(number, start, end, group, source, marker)
    return None


def _root_marker_name(act: HostActivity, mask: np.ndarray) -> str:
    return act.names[int(act.name[np.flatnonzero(mask)[0]])]


def _steps_line(hosts: list[HostCapture]) -> Steps | None:
    for hc in hosts:
        line = hc.steps_line
        if line is not None and line.number.size:
            return _collapse(line.number, line.start_ps, line.end_ps, line.group_id, "steps_line", "Steps")
    return None


def _inferred(hosts: list[HostCapture]) -> Steps | None:
    """Steps from the most time-consuming repeated function (or the only one), at top level."""
    best: tuple[int, int, np.ndarray, np.ndarray, str] | None = None
    for hc in hosts:
        act = hc.activity
        fn = np.flatnonzero(act.kind == HostEventKind.FUNCTION)
        for name_id in np.unique(act.name[fn]):
            idx = fn[act.name[fn] == name_id]
            score = (min(idx.size, 2), int(act.dur_ps[idx].sum()))
            if best is None or score > best[:2]:
                best = (*score, act.start_ps[idx], act.end_ps[idx], act.names[int(name_id)])
        for modules in hc.xla_modules:
            for module_id, module in enumerate(modules.names):
                pick = modules.name == module_id
                score = (min(int(pick.sum()), 2), int((modules.end_ps - modules.start_ps)[pick].sum()))
                if pick.any() and (best is None or score > best[:2]):
                    best = (*score, modules.start_ps[pick], modules.end_ps[pick], module)
    if best is None:
        return None
    _, _, start, end, name = best
    order = np.argsort(start)
    start, end = start[order], end[order]
    # Nested calls of the same function are one step.
    keep = np.ones(start.size, bool)
    keep[1:] = start[1:] >= np.maximum.accumulate(end)[:-1]
    start, end = start[keep], end[keep]
    return Steps("inferred", np.arange(start.size, dtype=np.int64), start, end,
                 np.full(start.size, -1, np.int64), name)


def find_steps(hosts: list[HostCapture]) -> Steps:
    # The Steps line is already on the device timeline and includes the partly captured
    # first and last steps, so it wins over the raw markers it was derived from.
    steps = _steps_line(hosts) or _marker_steps(hosts) or _inferred(hosts)
    if steps is None:
        return Steps("none", _EMPTY, _EMPTY, _EMPTY, _EMPTY)
    _to_periods(steps, hosts)
    return steps


def _to_periods(steps: Steps, hosts: list[HostCapture]) -> None:
    """A step lasts until the next one starts; the last one until its last activity."""
    if not len(steps):
        return
    last_start, last_marker_end = int(steps.start_ps[-1]), int(steps.end_ps[-1])
    last_group = int(steps.group_id[-1])
    last_end = last_marker_end
    for hc in hosts:
        for dev in hc.devices:
            mine = dev.group_id == last_group if last_group >= 0 else np.zeros(len(dev), bool)
            if not mine.any():
                mine = (dev.start_ps >= last_start) & (dev.start_ps < last_marker_end)
            if mine.any():
                last_end = max(last_end, int(dev.end_ps[mine].max()))
    steps.end_ps = np.append(steps.start_ps[1:], last_end).astype(np.int64)
    steps.end_ps = np.maximum(steps.end_ps, steps.start_ps)


def assign_steps(steps: Steps, hosts: list[HostCapture]) -> None:
    """Fill the ``step`` column of every host and device table.

    A device event belongs to the step of its TensorFlow group when it has one, else
    to the step in which its launch call ran, else to the step its start falls in.
    """
    with_group = steps.group_id >= 0
    by_group = SortedKeys(steps.group_id[with_group], np.flatnonzero(with_group))
    for hc in hosts:
        act = hc.activity
        act.step = steps.locate(act.start_ps)
        launch = act.correlation_id >= 0
        by_launch = SortedKeys(act.correlation_id[launch], act.step[launch])
        for dev in hc.devices:
            step = steps.locate(dev.start_ps)
            via_launch = by_launch.get(dev.correlation_id, -2)
            step = np.where(via_launch != -2, via_launch, step)
            via_group = by_group.get(dev.group_id, -2)
            dev.step = np.where(via_group != -2, via_group, step).astype(np.int32)


def framework(hosts: list[HostCapture]) -> str:
    names: list[str] = []
    threads: list[str] = []
    for hc in hosts:
        names += hc.activity.names
        threads += hc.activity.threads
        for modules in hc.xla_modules:
            names += modules.names[:1]
    return classify.framework_from_names(names, threads)
