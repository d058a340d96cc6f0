"""The step window a user pays: from the step's host call to the end of its own work.

Two things make raw step windows wrong on real captures:

- Older TensorFlow's derived ``Steps`` line (and device-side markers) start a step at its
  first device op, leaving out the host work of ``train_function`` before it, which can hold
  the step's only input wait. A step is moved back to the start of the host call that
  contains it (a ``tf.function``/XLA call or a step marker), never before the previous step.
- The TensorBoard callback exports the trace right after the profiled batch: an untraced
  stretch of Python, a large constant holding the run metadata, then ``LogicalAnd``,
  ``Identity``, ``WriteSummary`` and ``FlushSummaryWriter``. Those ops carry the step's
  group id, so the ``Steps`` line (and XProf's step time) runs to their end. The export is
  recognised by its summary-writer ops preceded by an untraced gap, and the step ends where
  its own work (device work, the loss/metric copies back to the host) ended.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from tb_gpuadvisor.model.kernels import named_events
from tb_gpuadvisor.timeline import HostModel, Steps
from tb_gpuadvisor.kinds import HostEventKind
from tb_gpuadvisor.trust.placement import step_threads
from tb_gpuadvisor.vocab.tensorflow import EAGER_DISPATCH as _EAGER_OP
from tb_gpuadvisor.vocab.tensorflow import EXPORT_SEQUENCE as _EXPORT_SEQUENCE
from tb_gpuadvisor.vocab.tensorflow import SUMMARY_WRITER as _SUMMARY_WRITER


@dataclass
class ExportCut:
    """Profiler export work cut off the end of one step."""

    step: int               # the step's position
    start_ps: int           # where the export run began (the step now ends at or before it)
    excluded_ps: int        # how much was cut off the step


def anchor_to_host_calls(steps: Steps, hosts: list[HostModel]) -> Steps:
    """Move each step's start back to the start of the host call (function or marker) that
    contains it; a step never starts before the previous one did.

    Only the derived Steps line starts steps on the device while the host call that ran them
    started earlier; markers already start on the host, and device-side steps of asynchronous
    dispatch (TPU) are the device's own time, which a host call does not bound."""
    if not len(steps) or steps.source != "steps_line":
        return steps
    starts = steps.start_ps.copy()
    for host in hosts:
        act = host.activity
        calls = np.flatnonzero(act.mask(HostEventKind.FUNCTION, HostEventKind.STEP_MARKER) & step_threads(act))
        if not calls.size:
            continue
        c_start, c_end = act.start_ps[calls], act.end_ps[calls]
        previous = np.concatenate([[np.iinfo(np.int64).min], steps.start_ps[:-1]])
        for i, s in enumerate(steps.start_ps):
            inside = (c_start > previous[i]) & (c_start <= s) & (c_end > s)
            if inside.any():
                starts[i] = min(starts[i], int(c_start[inside].min()))
    ends = steps.end_ps.copy()
    # Periods stay periods: a step that ran up to the next step's start still does.
    touching = np.append(steps.end_ps[:-1] == steps.start_ps[1:], False)
    ends[:-1] = np.where(touching[:-1], starts[1:], ends[:-1])
    return replace(steps, start_ps=starts, end_ps=np.maximum(ends, starts))


def include_launched_work(steps: Steps, hosts: list[HostModel]) -> Steps:
    """The last step ends no earlier than the device work its launch calls started: with
    asynchronous dispatch (JAX, XLA) the host call returns long before the device finishes.
    Where the host's periods are kept apart (device-paced steps), the launches are those of the
    last step's host period: the host calls made in its device window are a queued step's."""
    if not len(steps):
        return steps
    hi = int(steps.end_ps[-1])
    on_host = steps.on_host()
    end = hi
    for host in hosts:
        act = host.activity
        rows = _span(act.start_ps, int(on_host.start_ps[-1]), int(on_host.end_ps[-1]))
        end = max(end, _launched_work_end(host, act.correlation_id[rows]))
    if end == hi:
        return steps
    ends = steps.end_ps.copy()
    ends[-1] = end
    return replace(steps, end_ps=ends)


def _span(starts: np.ndarray, lo: int, hi: int) -> slice:
    """Rows of a start-sorted table that start in [lo, hi)."""
    return slice(int(np.searchsorted(starts, lo)), int(np.searchsorted(starts, hi)))


def _launched_work_end(host: HostModel, correlation_ids: np.ndarray) -> int:
    """The latest end of HOST's device work launched by calls with these correlation ids (-1:
    none), or the lowest int when none of them launched any."""
    launched = correlation_ids[correlation_ids >= 0]
    end = np.iinfo(np.int64).min
    if launched.size:
        for dev in host.devices:
            mine = np.isin(dev.correlation_id, launched)
            if mine.any():
                end = max(end, int(dev.end_ps[mine].max()))
    return int(end)


def _own_work_end(hosts: list[HostModel], lo: int, before: int) -> int:
    """The end of a step's own work started in [lo, before): its device work and the host's
    launch, copy and synchronize calls (the loss/metric copies back to the host).

    Device work the step launched in that time is the step's wherever it runs: without a sync
    on the Python thread the export starts while the GPU still runs the step's kernels.
    """
    end = lo
    for host in hosts:
        act = host.activity
        rows = _span(act.start_ps, lo, before)
        launches = act.kind[rows] == HostEventKind.LAUNCH
        if launches.any():
            end = max(end, int(act.end_ps[rows][launches].max()))
        end = max(end, _launched_work_end(host, act.correlation_id[rows][launches]))
        for dev in host.devices:
            rows = _span(dev.start_ps, lo, before)
            if rows.stop > rows.start:
                end = max(end, int(dev.end_ps[rows].max()))
    return end


def _call_end(hosts: list[HostModel], lo: int, hi: int) -> int:
    """The end of the step's host calls (function runs, markers) that finished inside [lo, hi)."""
    end = lo
    for host in hosts:
        act = host.activity
        rows = _span(act.start_ps, lo, hi)
        kind = act.kind[rows]
        calls = ((kind == HostEventKind.FUNCTION) | (kind == HostEventKind.STEP_MARKER)) & (act.end_ps[rows] < hi)
        if calls.any():
            end = max(end, int(act.end_ps[rows][calls].max()))
    return end


def _export_start(hosts: list[HostModel], after: int, hi: int) -> int | None:
    """Where a post-step export sequence begins in [after, hi): its first op after the last other
    op the summary writer's thread ran before the writer. An eager step (run_eagerly) runs Identity
    and LogicalAnd ops of its own: the export is only the run of them that leads to the writer."""
    first = None
    for host in hosts:
        act = host.activity
        rows = _span(act.start_ps, after, hi)
        writers = np.flatnonzero(named_events(act, "summary_writer", _SUMMARY_WRITER.search)[rows])
        if not writers.size:
            continue
        export = named_events(act, "export_sequence", _EXPORT_SEQUENCE.search)[rows]
        ops = (act.kind[rows] == HostEventKind.FRAMEWORK_OP) | named_events(act, "eager_op", _EAGER_OP.search)[rows]
        own = np.flatnonzero((ops & ~export & (act.thread[rows] == act.thread[rows.start + writers[0]]))[:writers[0]])
        begin = int(own[-1]) + 1 if own.size else 0
        sequence = np.flatnonzero(export[begin:])
        start = int(act.start_ps[rows.start + begin + sequence[0]])
        first = start if first is None else min(first, start)
    return first


def cut_profiler_export(steps: Steps, hosts: list[HostModel]) -> tuple[Steps, list[ExportCut]]:
    """End every step whose tail holds the trace export (or a post-step summary write) where
    its own work ended; the cut is reported, never attributed."""
    ends = steps.end_ps.copy()
    cuts: list[ExportCut] = []
    if not any(named_events(h.activity, "summary_writer", _SUMMARY_WRITER.search).any() for h in hosts):
        return steps, cuts
    # The export may run past the step's recorded end: look up to the next step (or the end).
    limits = np.append(steps.start_ps[1:], np.iinfo(np.int64).max)
    for i in range(len(steps)):
        lo, hi = int(steps.start_ps[i]), int(steps.end_ps[i])
        call_end = _call_end(hosts, lo, hi)
        export = _export_start(hosts, call_end, int(max(limits[i], hi)))
        if export is None or export >= hi:
            continue
        own_end = max(call_end, _own_work_end(hosts, lo, export))
        if own_end < hi:
            ends[i] = own_end
            cuts.append(ExportCut(step=i, start_ps=export, excluded_ps=hi - own_end))
    return replace(steps, end_ps=ends), cuts


def emptied_by_cut(steps: Steps, cuts: list[ExportCut]) -> list[ExportCut]:
    """The cuts that left their step nothing (a 0 ms window): such a step measures nothing, and
    counting it would pull the mean step down and widen its spread."""
    return [c for c in cuts if steps.end_ps[c.step] <= steps.start_ps[c.step]]
