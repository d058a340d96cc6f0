"""Finding training steps and assigning every event to one.

A stored ``Steps`` line (older TensorFlow's own grouping of the markers) is
used when a capture has one; otherwise markers are tried in order of trust (see
the check catalogue): custom-loop ``_r``=1 annotations, Keras 2 ``TraceContext``,
Keras 3 ``Profiled batch``, and finally inference from repeated top-level
function runs (tf.function or XLA executables).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from tb_gpuadvisor import cores
from tb_gpuadvisor.arrays import SortedKeys, reduce_by_key
from tb_gpuadvisor.input.capture import HostCapture
from tb_gpuadvisor.model import intervals
from tb_gpuadvisor.timeline import DeviceActivity, HostActivity, HostModel, Steps
from tb_gpuadvisor.kinds import HostEventKind
from tb_gpuadvisor.vocab import frameworks, hlo, jax, pytorch, tensorflow, xla
from tb_gpuadvisor.stages import Memo

# What this stage derives from the tables and asks for again (see stages.Memo).
_MEMO = Memo()

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
    for source, name in (("custom_loop", None), ("keras2", tensorflow.KERAS2_STEP), ("keras", tensorflow.KERAS3_STEP)):
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
            if name is None and pytorch.is_step_marker(marker):
                source = pytorch.STEP_SOURCE
            return _collapse(number, start, end, group, source, marker)
    return None


def _device_marks(hosts: list[HostCapture]) -> Steps | None:
    """PyTorch's ProfilerStep#N marks on the GPU side, for a trace whose host has none: they span
    each step's device work, so they are the device's steps as they are (not paced again)."""
    lines = [hc.device_steps for hc in hosts if hc.device_steps is not None and hc.device_steps.number.size]
    if not lines:
        return None
    return _collapse(*(np.concatenate([getattr(line, f) for line in lines])
                       for f in ("number", "start_ps", "end_ps", "group_id")),
                     pytorch.DEVICE_STEP_SOURCE, f"{pytorch.STEP_ANNOTATION}N")


def _root_marker_name(act: HostActivity, mask: np.ndarray) -> str:
    return act.names[int(act.name[np.flatnonzero(mask)[0]])]


def _steps_line(hosts: list[HostCapture]) -> Steps | None:
    for hc in hosts:
        line = hc.recorded_steps
        if line is not None and line.number.size:
            return _collapse(line.number, line.start_ps, line.end_ps, line.group_id, "steps_line", "Steps")
    return None


def _inferred(hosts: list[HostCapture], made_by: str) -> Steps | None:
    """Steps from repeated top-level function runs (TensorFlow) or XLA module runs (JAX)."""
    if made_by == jax.FRAMEWORK:
        return _jax_inferred(hosts)
    if made_by == pytorch.FRAMEWORK:
        # Eager PyTorch has no function runs to repeat: without ProfilerStep#N, iterations run
        # from one optimizer step's end to the next one's; with fewer than two optimizer steps
        # the capture is judged over the whole traced span: what the user paid, set-up before the
        # first kernel and DataLoader start-up included (trust tells set-up apart).
        return _optimizer_iterations(hosts) or _window(hosts, traced=True)
    best: tuple[int, int, np.ndarray, np.ndarray, str] | None = None
    for hc in hosts:
        act = hc.activity
        fn = np.flatnonzero(act.kind == HostEventKind.FUNCTION)
        for name_id in np.unique(act.name[fn]):
            idx = fn[act.name[fn] == name_id]
            score = (min(idx.size, 2), int(act.dur_ps[idx].sum()))
            if best is None or score > best[:2]:
                best = (*score, act.start_ps[idx], act.end_ps[idx], act.names[int(name_id)])
        for modules in hc.programs:
            for module_id, module in enumerate(modules.names):
                pick = modules.name == module_id
                score = (min(int(pick.sum()), 2), int((modules.end_ps - modules.start_ps)[pick].sum()))
                if pick.any() and (best is None or score > best[:2]):
                    best = (*score, modules.start_ps[pick], modules.end_ps[pick], module)
    if best is None:
        return None
    _, _, start, end, name = best
    start, end = _top_level(start, end)
    return Steps("inferred", np.arange(start.size, dtype=np.int64), start, end,
                 np.full(start.size, -1, np.int64), name)


def _top_level(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Runs in time order, nested or overlapping runs (one call seen on several threads or
    devices) merged into one."""
    order = np.argsort(start, kind="stable")
    start, end = start[order], end[order]
    if not start.size:
        return start, end
    first = np.ones(start.size, bool)
    first[1:] = start[1:] >= np.maximum.accumulate(end)[:-1]
    groups = np.flatnonzero(first)
    return start[first], np.maximum.reduceat(end, groups)


# A JAX computation is a step when it repeats and holds at least this share of the device time
# of all compiled computations; below it the capture is an op-by-op program with no step.
DOMINANT_SHARE = 0.5


@dataclass
class _Runs:
    """The runs of one XLA module: where they are timed, and the device time they used."""

    start_ps: np.ndarray
    end_ps: np.ndarray
    name: str
    device_ps: int = 0
    on_device: bool = False
    device_events: int = -1     # device events the module ran, -1 when unknown


def _jax_runs(hosts: list[HostCapture]) -> dict[str, _Runs]:
    """Runs per XLA module: device-side module runs where the device records them (TPU's
    "XLA Modules" line: dispatch is asynchronous, so only the device says how long a call
    takes), else the host calls (``PjitFunction(f)`` wins over its nested module execution)."""
    runs: dict[str, _Runs] = {}
    device_ps: dict[str, int] = {}
    events: dict[str, int] = {}
    for hc in hosts:
        for modules in hc.programs:
            for module_id, module in enumerate(modules.names):
                key = hlo.module_key(module)
                pick = modules.name == module_id
                if key is None or not pick.any():
                    continue
                device_ps[key] = device_ps.get(key, 0) + int((modules.end_ps - modules.start_ps)[pick].sum())
                # Devices run the same calls slightly shifted: the steps are one device's runs.
                if key not in runs or runs[key].start_ps.size < pick.sum():
                    runs[key] = _Runs(modules.start_ps[pick], modules.end_ps[pick], module, on_device=True)
        for dev in hc.devices:
            if dev.hlo_module.size and not hc.programs:
                has = dev.hlo_module >= 0
                sums = np.bincount(dev.hlo_module[has], weights=dev.dur_ps[has], minlength=len(dev.hlo_modules))
                counts = np.bincount(dev.hlo_module[has], minlength=len(dev.hlo_modules))
                for module, total, count in zip(dev.hlo_modules, sums, counts):
                    device_ps[module] = device_ps.get(module, 0) + int(total)
                    events[module] = events.get(module, 0) + int(count)
        act = hc.activity
        fn = np.flatnonzero(act.kind == HostEventKind.FUNCTION)
        for name_id in np.unique(act.name[fn]):
            name = act.names[int(name_id)]
            key = hlo.module_key(name)
            if key is None or (key in runs and runs[key].on_device):
                continue
            idx = fn[act.name[fn] == name_id]
            # The outer call (PjitFunction) includes argument handling the module run does not.
            if key not in runs or name.startswith(jax.PJIT_PREFIX):
                runs[key] = _Runs(act.start_ps[idx], act.end_ps[idx], name)
    for key, run in runs.items():
        run.device_ps = device_ps.get(key, 0) or int((run.end_ps - run.start_ps).sum())
        run.device_events = events.get(key, -1)
    return runs


def _loop_iterations(runs: dict[str, _Runs]) -> tuple[np.ndarray, np.ndarray, str] | None:
    """(start, end) of each iteration of the loop the host's program calls repeat in, and the
    marker's name (its first call), or None.

    Without a device timeline (JAX on the CPU) call times say nothing of which program is the
    step: a batch helper may outweigh the update, and op by op no program dominates. The loop
    does show in the calls' order: N iterations run the same sequence of programs, so the
    programs that repeat run a multiple of N times each, and the time-ordered calls cut into N
    equal chunks are the same sequence in each. The largest N that holds is the iteration count.
    A step runs from an iteration's first call to the next one's, so the N-1 steps that have a
    next iteration are measured whole; where the last one ends (its work runs on after its
    calls return) nothing on the host says.
    """
    calls = sorted((s, e, key) for key, run in runs.items() for s, e in zip(*_top_level(run.start_ps, run.end_ps)))
    counts: dict[str, int] = {}
    for _, _, key in calls:
        counts[key] = counts.get(key, 0) + 1
    repeated = [c for c in counts.values() if c >= 2]
    if not repeated:
        return None
    names = [key for _, _, key in calls if counts[key] >= 2]
    starts = np.array([s for s, _, key in calls if counts[key] >= 2], np.int64)
    for n in range(int(np.gcd.reduce(repeated)), 2, -1):
        size = len(names) // n
        if all(c % n == 0 for c in repeated) and all(names[i * size:(i + 1) * size] == names[:size]
                                                     for i in range(1, n)):
            firsts = starts[::size]
            first = runs[names[0]].name
            return firsts[:-1], firsts[1:], f"{first} (the first of the {size} program calls each loop iteration repeats)"
    return None


def _jax_inferred(hosts: list[HostCapture]) -> Steps | None:
    """The dominant repeated XLA computation by device time, never a small helper
    (``PjitFunction(add)``); a capture where none dominates is one window, not invented steps.
    Without any device timeline the steps are the loop's iterations (``_loop_iterations``)."""
    runs = _jax_runs(hosts)
    if not runs:
        return None
    host_only = not any(run.on_device or run.device_events >= 0 for run in runs.values())
    loop = _loop_iterations(runs) if host_only else None
    if loop is not None:
        start, end, marker = loop
        return Steps("inferred", np.arange(start.size, dtype=np.int64), start, end,
                     np.full(start.size, -1, np.int64), marker)
    total = sum(run.device_ps for run in runs.values())
    best = max(runs.values(), key=lambda run: run.device_ps)
    start, end = _top_level(best.start_ps, best.end_ps)
    # A jitted single op (jax.numpy's own PjitFunction(add)) runs one kernel per call: a helper.
    helper = 0 <= best.device_events <= start.size
    if start.size >= 2 and best.device_ps >= DOMINANT_SHARE * total and not helper:
        return Steps("inferred_device" if best.on_device else "inferred", np.arange(start.size, dtype=np.int64),
                     start, end, np.full(start.size, -1, np.int64), best.name)
    return _window(hosts)


def _optimizer_iterations(hosts: list[HostCapture]) -> Steps | None:
    """Iterations between the ends of consecutive ``Optimizer.step#...`` calls (of the first host
    that has at least three, i.e. two whole iterations)."""
    for hc in hosts:
        act = hc.activity
        ids = [i for i, n in enumerate(act.names) if pytorch.is_optimizer_step(n)]
        pick = np.isin(act.name, ids)
        if int(pick.sum()) >= 3:
            ends = np.sort(act.end_ps[pick])
            return Steps("inferred", np.arange(ends.size - 1, dtype=np.int64), ends[:-1], ends[1:],
                         np.full(ends.size - 1, -1, np.int64), act.names[ids[0]])
    return None


def _window(hosts: list[HostCapture], traced: bool = False) -> Steps:
    """The capture as one window: from the first to the last device activity (host activity when
    no device ran anything), or, TRACED, from the first to the last event of any kind."""
    lo, hi = _capture_span(hosts, traced)
    one = np.zeros(1, np.int64)
    return Steps("window", one, one + lo, one + hi, one - 1)


def _capture_span(hosts: list[HostCapture], traced: bool = False) -> tuple[int, int]:
    """First and last device activity (host activity when no device ran anything; both, TRACED)."""
    devices = [dev for hc in hosts for dev in hc.devices if len(dev)]
    activity = [hc.activity for hc in hosts if len(hc.activity)]
    tables = devices + activity if traced else devices or activity
    return (min(int(t.start_ps.min()) for t in tables), max(int(t.end_ps.max()) for t in tables))


def find_steps(hosts: list[HostCapture], made_by: str) -> Steps:
    """The session's steps; MADE_BY is the framework that wrote the capture (``framework``)."""
    # The Steps line is already on the device timeline and includes the partly captured
    # first and last steps, so it wins over the raw markers it was derived from.
    steps = _steps_line(hosts) or _marker_steps(hosts) or _device_marks(hosts) or _inferred(hosts, made_by)
    if steps is None:
        return Steps("none", _EMPTY, _EMPTY, _EMPTY, _EMPTY)
    marker_end = int(steps.end_ps[-1]) if len(steps) else 0
    _to_periods(steps, hosts)
    if made_by == jax.FRAMEWORK:
        _at_cpu_runs(steps, hosts)
    if made_by == pytorch.FRAMEWORK and steps.source in (pytorch.STEP_SOURCE, "inferred"):
        return _paced(steps, hosts, marker_end)
    return steps


def _cpu_runs(act: HostActivity) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) of the program runs on XLA's CPU client threads, in start order: each top-level
    run event with the wait for its parallel tasks that follows it on its thread."""
    ids = {n: i for i, n in enumerate(act.names) if n in (xla.CPU_RUN, xla.CPU_RUN_WAIT)}
    client = np.array([bool(xla.CPU_CLIENT_THREAD.match(t)) for t in act.threads], bool)
    if xla.CPU_RUN not in ids or not client.any():
        return _EMPTY, _EMPTY
    starts, ends = [], []
    runs = np.flatnonzero((act.name == ids[xla.CPU_RUN]) & client[act.thread])
    waits = (np.flatnonzero((act.name == ids[xla.CPU_RUN_WAIT]) & client[act.thread])
             if xla.CPU_RUN_WAIT in ids else _EMPTY)
    for thread in np.unique(act.thread[runs]):
        start, end = _top_level(*(a[runs[act.thread[runs] == thread]] for a in (act.start_ps, act.end_ps)))
        mine = waits[act.thread[waits] == thread]
        owner = np.searchsorted(start, act.start_ps[mine], side="right") - 1
        np.maximum.at(end, owner[owner >= 0], act.end_ps[mine][owner >= 0])
        starts.append(start)
        ends.append(end)
    start, end = np.concatenate(starts), np.concatenate(ends)
    order = np.argsort(start, kind="stable")
    return start[order], end[order]


def _at_cpu_runs(steps: Steps, hosts: list[HostCapture]) -> None:
    """JAX on the CPU dispatches each program and returns before it runs: a loop that does not wait
    for its results runs ahead, and its step markers (or calls) time the dispatch, not the work.
    Runs execute in the order they were dispatched, so the Nth dispatch is the Nth run. When most
    steps' runs were still going when the next step began, the steps are the runs' periods: each
    starts where its first run started, the last ends where its last run ended."""
    if len(steps) < 2 or any(len(dev) for hc in hosts for dev in hc.devices):
        return
    for hc in hosts:
        act = hc.activity
        run_start, run_end = _cpu_runs(act)
        ids = [i for i, n in enumerate(act.names) if xla.DISPATCH.search(n)]
        dispatch = np.sort(act.start_ps[np.isin(act.name, ids)])
        if not dispatch.size or dispatch.size != run_start.size:
            continue
        first = np.searchsorted(dispatch, steps.start_ps)
        last = np.searchsorted(dispatch, steps.end_ps) - 1
        if np.any(first > last):
            return              # a step that dispatched nothing: the pairing says nothing of it
        ran_on = run_end[last[:-1]] > steps.start_ps[1:]
        if 2 * np.count_nonzero(ran_on) < ran_on.size:
            return
        starts = np.maximum.accumulate(run_start[first])
        steps.start_ps = starts
        steps.end_ps = np.append(starts[1:], max(int(run_end[last[-1]]), int(starts[-1]))).astype(np.int64)
        return


# A step is the device's when its device was busy at least this share of its window (the
# median step): the host had queued the work before the device was free to run it.
DEVICE_PACED_BUSY = 0.9


def _paced(steps: Steps, hosts: list[HostCapture], marker_end: int) -> Steps:
    """PyTorch's step markers time the host's enqueue: with no sync inside the step the host
    runs ahead and the device runs the step's kernels later. A step ends no earlier than the
    device work its runtime calls launched (joined by correlation id), so step k's window runs
    from the later of its host start and the end of step k-1's device work (for the first step:
    of the work launched before it) to the start of step k+1's window; the last one to the end
    of its own device work (never past it: work
    launched after its marker is a queued step's, not its own). Host events keep their host
    period (``Steps.host_start_ps``). PACED_BY says which side set the length."""
    n = len(steps)
    host_start = steps.start_ps.copy()
    host_end = np.append(host_start[1:], max(marker_end, int(host_start[-1]))).astype(np.int64)
    on_host = Steps(steps.source, steps.number, host_start, host_end, steps.group_id)
    # work_end[k + 1]: the end of step k's device work; work_end[0]: of work launched before the
    # first step (the profiler's warm-up steps, still queued when the first recorded one starts).
    work_end = np.full(n + 1, np.iinfo(np.int64).min, np.int64)
    busy: list[tuple[np.ndarray, np.ndarray]] = []
    for hc in hosts:
        act = hc.activity
        act_step = on_host.locate(act.start_ps) + 1
        act_step[(act_step == 0) & (act.start_ps >= host_start[0])] = -1      # after the last step
        for dev in hc.devices:
            if not len(dev):
                continue
            row = launch_rows(act, dev)
            launched = row >= 0
            step = np.full(len(dev), -1, np.int64)
            step[launched] = act_step[row[launched]]
            mine = step >= 0
            reduce_by_key(np.maximum, work_end, step[mine], dev.end_ps[mine])
            own = step >= 1
            busy.append((dev.start_ps[own], dev.end_ps[own]))
    if not busy or (work_end[1:] < 0).all():
        return steps            # nothing launched on a device: the host's periods are the steps
    starts = np.maximum.accumulate(np.maximum(host_start, work_end[:-1]))
    # Without a launch joined to the last step's work, its period's end (``_to_periods``) stands.
    last = max(int(work_end[-1]), marker_end) if work_end[-1] >= 0 else int(steps.end_ps[-1])
    last = max(last, int(starts[-1]))
    ends = np.append(starts[1:], last).astype(np.int64)
    paced = replace(steps, start_ps=starts, end_ps=ends, host_start_ps=host_start, host_end_ps=host_end)
    paced.paced_by = "device" if _busy_share(busy, starts, ends) >= DEVICE_PACED_BUSY else "host"
    return paced


def _busy_share(busy: list[tuple[np.ndarray, np.ndarray]], starts: np.ndarray, ends: np.ndarray) -> float:
    """The median step's share of its window in which its busiest device ran the steps' own work
    (work queued before the first step, launched by calls the trace does not hold, is not the
    step's: a device still running it waits for nothing of the step's host)."""
    share = np.zeros(starts.size)
    for start, end in busy:
        done = intervals.per_bin_total(intervals.union(start, end), starts, ends)
        share = np.maximum(share, done / np.maximum(ends - starts, 1))
    return float(np.median(share))


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


# Each host's step columns: its activity's, then one per device, in the host's order.
StepColumns = list[tuple[np.ndarray, list[np.ndarray]]]


def step_columns(steps: Steps, hosts: Sequence[HostCapture | HostModel], within: bool = False) -> StepColumns:
    """Every host and device event's index into STEPS, -1 outside them (nothing is written).

    A device event belongs to the step of its TensorFlow group when it has one, else to the
    step in which its launch call ran, else to the step its start falls in. WITHIN keeps only
    events that start inside a step's window, even when their group or launch names one.
    """
    with_group = steps.group_id >= 0
    by_group = SortedKeys(steps.group_id[with_group], np.flatnonzero(with_group))
    out: StepColumns = []
    for hc in hosts:
        act = hc.activity
        act_step = steps.on_host().locate(act.start_ps)
        _correlation_rows(act)          # what every device's join reads, built before the threads

        def device_step(dev: DeviceActivity) -> np.ndarray:
            located = steps.locate(dev.start_ps)
            row = launch_rows(act, dev)
            via_launch = np.full(row.shape, -2, np.int32)
            launched = row >= 0
            via_launch[launched] = act_step[row[launched]]
            step = np.where(via_launch != -2, via_launch, located)
            via_group = by_group.get(dev.group_id, -2)
            step = np.where(via_group != -2, via_group, step)
            if within:
                step = np.where(located < 0, -1, step)
            return step.astype(np.int32, copy=False)

        out.append((act_step, cores.on_threads(device_step, [(dev,) for dev in hc.devices])))
    return out


def _correlation_rows(act: HostActivity) -> SortedKeys:
    """The host's events with a correlation id, by id (built once per host)."""
    table = _MEMO.of(act).get("correlation_rows")
    if table is None:
        with_id = np.flatnonzero(act.correlation_id >= 0)
        table = _MEMO.of(act)["correlation_rows"] = SortedKeys(act.correlation_id[with_id], with_id.astype(np.int32))
    return table


def launch_rows(act: HostActivity, dev: DeviceActivity) -> np.ndarray:
    """For every event of DEV, the row of the first ACT event with its correlation id (the call
    that launched it), -1 when none. The join does not depend on steps, so both step passes of
    trust share it: the host's table of correlation ids is built once, each device's rows once."""
    rows = _MEMO.of(dev).get("launch_rows")
    if rows is None:
        rows = _MEMO.of(dev)["launch_rows"] = _correlation_rows(act).get(dev.correlation_id, -1)
    return rows


def framework(hosts: list[HostCapture]) -> str:
    """The framework the hosts' file format says wrote them, else the one their names tell."""
    told = {hc.framework for hc in hosts if hc.framework}
    if len(told) == 1:
        return told.pop()
    names: list[str] = []
    threads: list[str] = []
    for hc in hosts:
        names += hc.activity.names
        threads += hc.activity.threads
        for modules in hc.programs:
            names += modules.names[:1]
    return frameworks.framework_from_names(names, threads)
