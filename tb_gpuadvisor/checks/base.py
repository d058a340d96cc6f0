"""What a check is and what it returns.

A check is a small registered unit, like a linter rule: a stable id, a title,
and a function from the analysed session (``context.Analysis``) to one
:class:`Finding` (``finding.py``).  Each check
lives in its own module whose docstring explains what it measures, why it
matters and how to fix it; the registry reads that docstring for ``--explain``.

Everything else the pipeline needs to know about a check is declared once, in its
``register`` call: the fix as a what-if replay scenario (or why it has none), the
capture aspect its confidence rests on, the step bound it explains, the metrics
``compare`` judges it by, and for a check judged across hosts how per-host
measurements are joined. The what-if, the report, compare, the multihost merge and
``tb-gpuadvisor checks`` read these declarations; no other table names a check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

import numpy as np

from tb_gpuadvisor.attribution.breakdown import BOUND_GROUPS, SET_KEYS
from tb_gpuadvisor.attribution.replay import Scenario
from tb_gpuadvisor.checks.context import Analysis, StepScale
from tb_gpuadvisor.checks.finding import Finding, Severity
from tb_gpuadvisor.timeline import SessionModel

# The severities a run can be failed on (the CLI's --fail-on, the in-loop helpers' fail_on).
FAIL_ON = ("warning", "critical")


def failing(findings: list[dict], fail_on: str | None) -> list[dict]:
    """The report findings of at least FAIL_ON severity that are not of low confidence (those
    never count on their own), in their order."""
    if not fail_on:
        return []
    limit = Severity(fail_on).weight
    return [f for f in findings if Severity(f["severity"]).weight >= limit and f.get("confidence") != "low"]


def severity_by_threshold(value: float, critical: float | None, warning: float | None) -> Severity:
    """Severity for metrics where bigger is worse (the catalogue's ">= N" rules)."""
    if critical is not None and value >= critical:
        return Severity.CRITICAL
    if warning is not None and value >= warning:
        return Severity.WARNING
    return Severity.OK


def needs_steps(check_id: str, subject: str, measure: str) -> Finding:
    """The not-applicable finding of a per-step check on a capture without steps."""
    return Finding(check_id, Severity.NOT_APPLICABLE, f"{subject} not measurable",
                   f"No training steps were found, so {measure} per step cannot be measured "
                   "(see the profile quality finding).")


def needs_gpu(check_id: str, subject: str) -> Finding:
    """The not-applicable finding of a GPU check on a capture where no GPU ran kernels."""
    return Finding(check_id, Severity.NOT_APPLICABLE, f"No GPU {subject} to assess",
                   f"The capture has no GPU that ran kernels, so there are no GPU {subject} to measure.")


CheckFunction = Callable[["Analysis"], Finding]

# What a finding's confidence can rest on (trust.confidence): the per-step idle attribution of
# the primary device, kernel classes, the comparison of replicas, memory records, or the capture.
ASPECTS = ("idle", "kernels", "replicas", "memory", "capture")


@dataclass(frozen=True)
class Replayed:
    """The check's fix as a what-if scenario of the step replay (attribution/replay.py)."""

    scenario: Callable[[SessionModel], Scenario]
    # On a CPU-only capture the cause is time on the host's own timeline (the host is the device).
    on_cpu: bool = False
    what: str = ""      # the scenario in words, for `tb-gpuadvisor checks ID`
    # In a many-host session the scenario is replayed over every host's replicas together (by
    # multihost.merge), not combined from each host's own replay.
    across_hosts: bool = False


@dataclass(frozen=True)
class NoReplay:
    """A check whose saving is not replayed, and why (its own estimate, or no time at all)."""

    why: str


@dataclass(frozen=True)
class DevicePart:
    """A part of the primary device's step that compare lists beside compute, copies and idle
    ("what grew"), in ms per step: LABEL; METRIC, the finding's metric holding it (None: the
    check's compared time); BREAKDOWN, the device breakdown's column that stands in for it when
    the session has no finding of the check (None: none)."""

    label: str
    metric: str | None = None
    breakdown: str | None = None


@dataclass(frozen=True)
class Compared:
    """What ``compare`` judges the check by: SHARE, a metric shown beside the time (None: none);
    TIME, the metric holding its ms per step (None: its estimated saving); TIMED False: the
    check measures no time and is judged on its severity; DEVICE_PARTS, its parts of the primary
    device's step."""

    share: str | None = None
    time: str | None = None
    timed: bool = True
    device_parts: tuple[DevicePart, ...] = ()


class HostAlignment(Protocol):
    """What a cross-host join needs of the merge (multihost.merge.Alignment): the session's
    steps on every host, and one clock."""

    def take(self, host: Any, table: np.ndarray) -> np.ndarray: ...
    def on_session_clock(self, host: Any, times: np.ndarray) -> np.ndarray: ...
    def windows(self, host: Any, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...
    def collective_parts_ms(self, steps: int) -> tuple[float, float] | None: ...


@dataclass(frozen=True)
class CrossHost:
    """A check judged over every host's devices in a many-host session.

    MEASURE is the per-host part each host's summary keeps (a measurement, or the
    not-applicable Finding); JOIN(alignment, primary, parts, steps) makes one measurement of the
    hosts' measured parts, given as (host summary, part) pairs in host order (None: nothing to
    judge); JUDGE(joined, scale) gives the session's finding, or None when the join is too small
    to compare (the primary host's own finding stands)."""

    measure: Callable[["Analysis"], Any]
    join: Callable[[HostAlignment, Any, list[tuple[Any, Any]], int], Any]
    judge: Callable[[Any, "StepScale"], "Finding | None"]
    what: str = ""      # the join in words


def measured_parts(parts: list[tuple[Any, Any]], kind: type) -> list[tuple[Any, Any]]:
    """The (host, part) pairs whose host measured a part of KIND (not a not-applicable Finding)."""
    return [(host, part) for host, part in parts if isinstance(part, kind)]


def join_per_gpu(primary: Any, parts: list[tuple[Any, Any]], kind: type,
                 rescale: Callable[[Any, float, Any], Any]) -> Any:
    """KIND(gpus, windows) of every host's measured GPUs (parts of KIND: ``gpus`` and a
    ``windows`` count), each GPU's totals brought to the primary host's number of step windows
    by RESCALE(gpu, factor, host): hosts may have captured different numbers of steps. None when
    no host measured any."""
    measured = measured_parts(parts, kind)
    if not measured:
        return None
    windows = next((p.windows for h, p in measured if h is primary), measured[0][1].windows)
    return kind([rescale(g, windows / p.windows, h) for h, p in measured for g in p.gpus], windows)


@dataclass(frozen=True)
class Chart:
    """What the tab's charts take from the check's finding: MARKED_DEVICE, the metric naming the
    device the per-GPU chart marks (the straggler); the report gives it as ``marked_device``."""

    marked_device: str


@dataclass(frozen=True)
class PerHostJoin:
    """What the many-host merge does with a per-host check's findings beyond taking one host's:
    SUMMED, the metrics that add up over the hosts (counts of the capture); UNREADABLE(finding,
    errors), the finding once the hosts whose files could not be read are known (None: as is)."""

    summed: tuple[str, ...] = ()
    unreadable: Callable[[Finding, list[dict]], Finding] | None = None


@dataclass(frozen=True)
class Marks:
    """What the check's finding lays on the step timeline: CAUSES, the attribution's interval sets
    (``DeviceBreakdown.sets`` keys of the primary device) whose time its METRIC counts, a percent
    of the step time. The picture and the number are then one measurement."""

    causes: tuple[str, ...]
    metric: str


@dataclass(frozen=True)
class NoMarks:
    """A check whose finding has no intervals of the step to mark, and why (the timeline says it)."""

    why: str


# What a check that declares no marks (a test's toy check) lays on the timeline: nothing.
UNDECLARED = NoMarks("the check declares no intervals of the step")


@dataclass(frozen=True)
class Check:
    id: str
    title: str
    function: CheckFunction
    doc: str
    what_if: Replayed | NoReplay
    aspect: str = "idle"
    explains: str | None = None     # the step bound it explains (attribution.breakdown.BOUND_GROUPS' kinds)
    explains_order: int = 0         # its place among the checks that explain that bound
    compared: Compared = Compared()
    cross_host: CrossHost | None = None
    # A per-host check whose many-host session is as bad as its worst host (each host judges its
    # own devices or capture), not the primary host's verdict.
    worst_host: bool = False
    # The frameworks whose captures the check reads (empty: all): a check of one framework's API
    # (PyTorch's model.eval()) is not listed on another framework's report.
    frameworks: tuple[str, ...] = ()
    per_host: PerHostJoin = PerHostJoin()
    chart: Chart | None = None
    marks: Marks | NoMarks = UNDECLARED

    def applies_to(self, framework: str) -> bool:
        return not self.frameworks or framework in self.frameworks

    def run(self, analysis: "Analysis") -> Finding:
        return self.function(analysis)

    def declaration(self) -> list[tuple[str, str]]:
        """The declaration in words, as (field, value) rows for `tb-gpuadvisor checks ID`."""
        if isinstance(self.what_if, Replayed):
            scenario = "replayed: " + (self.what_if.what or "its own scenario")
            scenario += "" if self.what_if.on_cpu else " (GPU captures only)"
            scenario += "; over every host's replicas together" if self.what_if.across_hosts else ""
        else:
            scenario = "no replay: " + self.what_if.why
        if not self.compared.timed:
            compared = "no time per step; judged on its severity"
        else:
            compared = f"time: {self.compared.time or 'estimated_savings_ms_per_step'}"
        if self.compared.share:
            compared += f", share: {self.compared.share}"
        return [("what-if", scenario), ("confidence aspect", self.aspect),
                ("explains bound", self.explains or "-"), ("compare metric", compared),
                ("cross-host join", self.cross_host.what if self.cross_host
                 else "no: the worst host's verdict" if self.worst_host else "no: judged on the primary host"),
                ("frameworks", ", ".join(self.frameworks) or "all"),
                ("timeline marks", f"{', '.join(self.marks.causes)} (its {self.marks.metric})"
                 if isinstance(self.marks, Marks) else f"none: {self.marks.why}")]


REGISTRY: dict[str, Check] = {}


def register(check_id: str, title: str, doc: str | None, *, what_if: Replayed | NoReplay, aspect: str = "idle",
             explains: str | None = None, explains_order: int = 0, compared: Compared = Compared(),
             cross_host: CrossHost | None = None, worst_host: bool = False,
             frameworks: tuple[str, ...] = (), per_host: PerHostJoin = PerHostJoin(),
             chart: Chart | None = None, marks: Marks | NoMarks = UNDECLARED,
             ) -> Callable[[CheckFunction], CheckFunction]:
    """Decorator: ``@register("input_bound", "Input pipeline bottleneck", __doc__, what_if=...)``;
    the keywords are the declaration (see :class:`Check`)."""
    if aspect not in ASPECTS:
        raise ValueError(f"check {check_id!r}: unknown confidence aspect {aspect!r}; known: {', '.join(ASPECTS)}")
    if explains is not None and explains not in BOUND_GROUPS.values():
        raise ValueError(f"check {check_id!r}: unknown step bound {explains!r}")
    if isinstance(marks, Marks) and not set(marks.causes) <= set(SET_KEYS):
        raise ValueError(f"check {check_id!r}: marks unknown causes {sorted(set(marks.causes) - set(SET_KEYS))}; "
                         f"known: {', '.join(SET_KEYS)}")

    def decorate(function: CheckFunction) -> CheckFunction:
        if check_id in REGISTRY:
            raise ValueError(f"check {check_id!r} registered twice")
        REGISTRY[check_id] = Check(check_id, title, function, (doc or "").strip(), what_if, aspect,
                                   explains, explains_order, compared, cross_host, worst_host, frameworks,
                                   per_host, chart, marks)
        return function

    return decorate
