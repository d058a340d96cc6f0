"""Trust: what a capture can tell, decided before anything is attributed or advised.

The model holds every step candidate the markers gave; this stage decides which steps
count (typical steps whose device data is present), the time each device's trace
covers, and what the capture says about itself. ``assess`` returns a :class:`Trust`
and re-bases the model's ``steps`` (and every event's ``step`` column) on the steps
that count, so every later stage measures only those.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tb_gpuadvisor.model.intervals import Intervals
from tb_gpuadvisor.model.steps import assign_steps
from tb_gpuadvisor.model.timeline import SessionModel, Steps


@dataclass
class ExcludedStep:
    """A candidate step left out of every per-step number, and why."""

    number: int
    start_ps: int
    end_ps: int
    reason: str


@dataclass
class Trust:
    """What the capture covers and which of its steps count."""

    candidates: Steps                       # every step the markers gave
    steps: Steps                            # the steps that count (the model's steps after assess)
    covered: dict[str, Intervals]           # device name -> the time its trace covers
    excluded: list[ExcludedStep] = field(default_factory=list)

    def covered_by(self, device_name: str) -> Intervals:
        """The window DEVICE_NAME's trace covers; empty when it recorded nothing."""
        empty = np.empty(0, np.int64)
        return self.covered.get(device_name, (empty, empty))


def _coverage(model: SessionModel) -> dict[str, Intervals]:
    out: dict[str, Intervals] = {}
    for dev in model.devices:
        if len(dev):
            out[dev.device.name] = (np.array([dev.start_ps.min()], np.int64), np.array([dev.end_ps.max()], np.int64))
    return out


def assess(model: SessionModel) -> Trust:
    """Decide which steps count and what each device's trace covers."""
    candidates = model.steps
    trust = Trust(candidates=candidates, steps=candidates, covered=_coverage(model))
    model.steps = trust.steps
    assign_steps(model.steps, model.hosts)
    return trust
