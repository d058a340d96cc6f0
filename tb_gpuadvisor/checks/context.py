"""What every check receives: the values of the stages before the checks, bundled.

The pipeline (tb_gpuadvisor/pipeline.py) assesses trust, and gives the bundle the functions that
attribute the steps and replay them: several checks need the same expensive measurement (the
step breakdown walks every event of every device), computed on first ask and shared.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable, TypeVar

import numpy as np

from tb_gpuadvisor.attribution.breakdown import Breakdown
from tb_gpuadvisor.attribution.whatif import WhatIf
from tb_gpuadvisor.checks.finding import Evidence, Finding, Severity
from tb_gpuadvisor.model.intervals import Intervals
from tb_gpuadvisor.stages import Deferred
from tb_gpuadvisor.timeline import PS_PER_MS, DeviceActivity, HostModel, SessionModel
from tb_gpuadvisor.trust import Trust

# A finding is only worth acting on when its fix gains real time: a warning needs a replayed
# saving of at least WARNING_GAIN_SHARE of the mean step and WARNING_MIN_MS, a critical one
# CRITICAL_GAIN_SHARE and CRITICAL_MIN_MS. Below that a high metric is reported as info (or a
# critical one as a warning): the time it describes is not on the step's critical path (e.g.
# faster kernels on a GPU that mostly waits for the host), or too small to be worth a change (a
# launch gain of 0.1 ms on a compute-bound 2.6 ms step). The absolute floors keep a small share
# of a tiny step from sounding urgent: a 0.09 ms input wait of a 0.5 ms step is 18% of it, yet
# a million steps would win 1.5 minutes. A saving of WARNING_WHOLE_SHARE of the step or more is
# worth a warning however short the step (a fix that makes a 0.16 ms step 1.5x faster makes the
# whole loop so), and one of CRITICAL_WHOLE_SHARE a critical one.
WARNING_GAIN_SHARE = 0.04
CRITICAL_GAIN_SHARE = 0.10
WARNING_MIN_MS = 0.2
CRITICAL_MIN_MS = 0.5
WARNING_WHOLE_SHARE = 0.25
CRITICAL_WHOLE_SHARE = 0.5


class StepScale:
    """Judging a saving against the mean step: what a check's verdict needs of the session,
    whether it is one analysed model or hosts joined by multihost.merge."""

    mean_step_ms: float

    def gated(self, severity: Severity, saving_ms: float) -> Severity:
        """SEVERITY from a metric threshold, lowered when the replayed saving is small, as a share
        of the step or in absolute time per step."""
        if not self.mean_step_ms:
            return severity         # no step to measure the saving against
        share = saving_ms / self.mean_step_ms
        if severity is Severity.CRITICAL and (share < CRITICAL_GAIN_SHARE or (
                saving_ms < CRITICAL_MIN_MS and share < CRITICAL_WHOLE_SHARE)):
            severity = Severity.WARNING
        if severity is Severity.WARNING and (share < WARNING_GAIN_SHARE or (
                saving_ms < WARNING_MIN_MS and share < WARNING_WHOLE_SHARE)):
            severity = Severity.INFO
        return severity

    def gain_note(self, severity: Severity, saving_ms: float) -> str:
        """A sentence for a finding whose metric is high but whose replayed saving is small."""
        if severity is not Severity.INFO:
            return ""
        if self.mean_step_ms and saving_ms / self.mean_step_ms >= WARNING_GAIN_SHARE:
            return (f" Replaying the step without this cause shortens it by {saving_ms:.2f} ms: too little "
                    f"time per step to be worth a change (a warning needs {WARNING_MIN_MS} ms, or "
                    f"{100 * WARNING_WHOLE_SHARE:.0f}% of the step).")
        return (f" Replaying the step without this cause shortens it by only {saving_ms:.2f} ms, so it is "
                "not on the critical path: fix the larger findings first.")


M = TypeVar("M")


def measurement(measure: "Callable[[Analysis], M]") -> "Callable[[Analysis], M]":
    """A check's measurement, kept on the analysis: the check and the multihost map both ask for
    it, and the second asks for free. Each is asked from one thread at a time."""
    @functools.wraps(measure)
    def once(analysis: "Analysis") -> M:
        if measure not in analysis.measurements:
            analysis.measurements[measure] = measure(analysis)
        return analysis.measurements[measure]
    return once


def judged(measured: "M | Finding", judge: "Callable[[M], Finding]") -> Finding:
    """The finding of a check split into measure and judge: the not-applicable finding its
    measurement returned, else what JUDGE makes of the measurement."""
    return measured if isinstance(measured, Finding) else judge(measured)


@dataclass(frozen=True)
class Analysis(StepScale):
    """The analysed session handed to every check: the model as built, trust's view of it, and
    the attribution and replay of its trusted steps (``pipeline.analyse`` makes it).

    Nothing here changes SOURCE, so two analyses of one model are equal."""

    source: SessionModel     # the model as built: every candidate step and its step columns
    trust: Trust
    attribution: Deferred[Breakdown] = field(repr=False, compare=False)
    replay: Deferred[WhatIf] = field(repr=False, compare=False)
    # The checks' measurements (see ``measurement``), by function.
    measurements: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def model(self) -> SessionModel:
        """The session on the steps that count (``Trust.view``): what attribution and checks read."""
        return self.trust.view

    @property
    def breakdown(self) -> Breakdown:
        """The attribution of the trusted steps (computed once, by the first check to ask)."""
        return self.attribution.get()

    @property
    def what_if(self) -> WhatIf:
        """The replay of every step's dependency graph and each check's scenario (computed once)."""
        return self.replay.get()

    @property
    def primary_device(self) -> DeviceActivity | None:
        """The GPU the per-step breakdown is measured on (SessionModel.primary_gpu), or None."""
        return self.model.primary_gpu

    @property
    def comparable_gpus(self) -> list[DeviceActivity]:
        """Active GPUs whose traces can be set side by side: replicas whose steps were traced
        at other times than the primary GPU's are left out (see trust.coverage)."""
        return [d for d in self.model.active_gpus if d.device.name not in self.trust.misaligned]

    @property
    def primary_host_name(self) -> str | None:
        """The host the breakdown measures, by name (the only host of most captures)."""
        primary = self.breakdown.primary
        return primary.host if primary is not None else (self.model.hosts[0].name if self.model.hosts else None)

    @property
    def primary_host(self) -> HostModel | None:
        """The host of the breakdown's primary device: its threads are what fed or starved it."""
        primary = self.breakdown.primary
        if primary is None:
            return None
        return next(host for host in self.model.hosts if host.name == primary.host)

    @property
    def steps_count(self) -> int:
        """Training steps the trusted markers cover (a marker may cover several: steps_per_execution)."""
        return self.model.steps.training_steps

    @property
    def step_time_ps(self) -> int:
        """Sum of all step periods; the denominator of every "percent of step time" metric."""
        return int(np.sum(self.model.steps.duration_ps)) if self.steps_count else 0

    @property
    def mean_step_ms(self) -> float:
        return self.ms_per_step(self.step_time_ps)

    def ms_per_step(self, ps_total: float) -> float:
        """A total over all steps, as milliseconds per step (0 when there are no steps)."""
        return float(ps_total) / PS_PER_MS / self.steps_count if self.steps_count else 0.0

    @staticmethod
    def to_ms(ps: float | np.ndarray) -> float | np.ndarray:
        """Picoseconds from the session origin to milliseconds relative to capture start."""
        return ps / PS_PER_MS

    def step_evidence(self, per_step_ps: np.ndarray, detail: str, top: int = 3,
                      device: str | None = None, host: str | None = None) -> list[Evidence]:
        """The ``top`` steps with the largest value of a per-step quantity, as evidence items
        with the step's time range (for a jump into the trace viewer)."""
        steps = self.model.steps
        if not len(steps) or per_step_ps.size != len(steps):
            return []
        order = np.argsort(-per_step_ps, kind="stable")[:top]
        return [Evidence(kind="step", name=f"step {int(steps.number[i])}",
                         value=round(float(per_step_ps[i]) / PS_PER_MS, 3), unit="ms", detail=detail,
                         device=device, host=host, start_ms=round(steps.start_ps[i] / PS_PER_MS, 3),
                         end_ms=round(steps.end_ps[i] / PS_PER_MS, 3), tool="trace_viewer@")
                for i in order if per_step_ps[i] > 0]

    @staticmethod
    def gap_evidence(gaps: Intervals, detail: str, top: int = 3, device: str | None = None,
                     host: str | None = None) -> list[Evidence]:
        """The ``top`` longest intervals of a disjoint set (e.g. idle gaps), longest first."""
        starts, ends = gaps
        order = np.argsort(-(ends - starts), kind="stable")[:top]
        return [Evidence(kind="step", name=f"gap at {starts[i] / PS_PER_MS:.3f} ms",
                         value=round(float(ends[i] - starts[i]) / PS_PER_MS, 3), unit="ms",
                         detail=detail, device=device, host=host,
                         start_ms=round(starts[i] / PS_PER_MS, 3), end_ms=round(ends[i] / PS_PER_MS, 3),
                         tool="trace_viewer@")
                for i in order]
