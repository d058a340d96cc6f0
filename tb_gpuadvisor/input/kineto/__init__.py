"""The Kineto adapter: ``*.pt.trace.json[.gz]`` traces written by PyTorch's profiler
(``torch.profiler.tensorboard_trace_handler``), one file per rank or worker.

This module says how a run folder's traces group into sessions (one per profiling cycle) and
name their hosts; ``decode.py`` turns a trace's JSON into plain columns and ``build.py`` those
into the host's tables (``input.capture.HostCapture``), with event kinds from ``vocab/pytorch.py``.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone

from tb_gpuadvisor.input import KINETO, Sessions
from tb_gpuadvisor.input.discovery import SESSION_TIME, SPLIT_SESSION_S

# torch.profiler.tensorboard_trace_handler names files "<worker>.<epoch time>.pt.trace.json[.gz]":
# the time in ms (PyTorch 1.x, 13 digits) or in ns (PyTorch 2.x, 19 digits).
_WORKER_STAMP = re.compile(r"^(?P<worker>.+)\.(?P<stamp>\d{12,14}|\d{18,20})$")


def kineto_worker(file_name: str) -> tuple[str, int | None]:
    """(host name, epoch ms the profiling cycle was written, or None) of a Kineto trace file."""
    stem = KINETO.stem(file_name)
    match = _WORKER_STAMP.match(stem)
    if not match:
        return stem, None
    stamp = match.group("stamp")
    return match.group("worker"), int(stamp) // (1_000_000 if len(stamp) >= 18 else 1)


def _cycle_name(stamp_ms: int | None) -> str:
    """A PyTorch session's name: when its cycle was written (as TensorFlow names sessions)."""
    if stamp_ms is None:
        return "trace"
    return datetime.fromtimestamp(stamp_ms / 1000, timezone.utc).strftime(SESSION_TIME)


def cycles(names: list[str]) -> Sessions:
    """One run folder's sessions: the files of one profiling cycle (one per rank or worker,
    written within SPLIT_SESSION_S of each other, or all without a time in their name)."""
    traces = sorted(((kineto_worker(n), n) for n in names),
                    key=lambda t: (t[0][1] is not None, t[0][1] or 0, t[0][0]))
    groups: list[tuple[int | None, list[tuple[str, str]]]] = []
    for (worker, stamp), name in traces:
        last = groups[-1] if groups else None
        same_cycle = last is not None and (last[0] is None) == (stamp is None) and (
            stamp is None or stamp - last[0] <= SPLIT_SESSION_S * 1000)
        if same_cycle and worker not in {w for w, _ in last[1]}:
            last[1].append((worker, name))
        else:
            groups.append((stamp, [(worker, name)]))
    sessions, used = [], set()
    for stamp, members in groups:
        session = _cycle_name(stamp)
        while session in used:          # two cycles in one second, or repeated worker names
            session += "_"
        used.add(session)
        sessions.append((session, members))
    return sessions
