"""What an adapter returns for one host's capture file, whatever its format: the host's column
tables (``timeline``), the step spans its profiler recorded itself, the runs of compiled programs
on its devices, and the profiler's own warnings.  ``input.session`` reads a session's hosts into
these; ``model`` builds the session from them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from tb_gpuadvisor.timeline import DeviceActivity, HostActivity, MemoryRecords

_DROPPED = re.compile(r"dropped\s+(\d+)", re.IGNORECASE)

# Times are int64 picoseconds from the host's origin: about 53 days either way leaves room for sums.
MAX_PS = 1 << 62


@dataclass
class RecordedSteps:
    """Steps the profiler recorded as spans of their own (TensorFlow's derived "Steps" line, or
    PyTorch's GPU-side step marks)."""

    number: np.ndarray
    start_ps: np.ndarray
    end_ps: np.ndarray
    group_id: np.ndarray


@dataclass
class ProgramRuns:
    """Executions of compiled programs on a device (XLA modules): step finding's evidence when a
    capture has no step markers."""

    start_ps: np.ndarray
    end_ps: np.ndarray
    name: np.ndarray
    names: list[str]


@dataclass
class HostCapture:
    """What one capture file yields before session-level step finding."""

    host: str
    activity: HostActivity
    memory: MemoryRecords
    devices: list[DeviceActivity]
    recorded_steps: RecordedSteps | None
    programs: list[ProgramRuns]
    warnings: list[str]
    origin_ns: int
    # Why the trace holds only part of what ran (sampled or filtered after capture), or None.
    partial_trace: str | None = None
    # The framework the file's own format says wrote it (a Kineto trace is PyTorch's whatever its
    # event names), or None: the names decide.
    framework: str | None = None
    # Step marks the file writes on the device timeline (PyTorch's GPU-side ProfilerStep#N), or None.
    device_steps: RecordedSteps | None = None

    def shift(self, delta_ps: int) -> None:
        """Move every time by DELTA_PS (onto a session-wide origin)."""
        if not delta_ps:
            return
        self.activity.start_ps += delta_ps
        self.activity.moved()
        self.memory.time_ps += delta_ps
        for dev in self.devices:
            dev.start_ps += delta_ps
            dev.moved()
        lines = [line for line in (self.recorded_steps, self.device_steps) if line is not None]
        for table in lines + self.programs:
            table.start_ps += delta_ps
            table.end_ps += delta_ps

    @property
    def dropped_events(self) -> int:
        """Events the profiler says it dropped (its messages read "... dropped N events ...")."""
        return sum(int(n) for w in self.warnings for n in _DROPPED.findall(w))

    def earliest_ps(self) -> int | None:
        starts = [a.start_ps[0] for a in [self.activity, *self.devices] if len(a)]
        return int(min(starts)) if starts else None
