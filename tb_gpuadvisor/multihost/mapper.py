"""The map of a many-host session: one host's capture in, a small summary out.

Each host is read, trusted, attributed and checked on its own (the same stages as a
one-host session), then everything a cross-host judgement needs is kept as per-step
tables of a few numbers per GPU, and the host's events are dropped. A summary is tens
of kilobytes whatever the capture's size, so a merge of hundreds of hosts fits in one
process and a worker never holds more than one host.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tb_gpuadvisor import heap
from tb_gpuadvisor.attribution.replay import Scenario
from tb_gpuadvisor.checks import Finding, _ranks, all_checks
from tb_gpuadvisor.checks.base import Replayed
from tb_gpuadvisor.checks.context import Analysis
from tb_gpuadvisor.input.discovery import SessionRef
from tb_gpuadvisor.model import kernels
from tb_gpuadvisor.pipeline import analyse, check, load_session, report_session
from tb_gpuadvisor.report import rank_findings
from tb_gpuadvisor.stages import stage

# Combined gains are kept for this many of a host's replayed causes, in its rank order.
COMBINED_CAUSES = 8


@dataclass(frozen=True)
class HostJob:
    """One host of a session to map; HOSTS is how many the session has (labels name the host
    when there are several)."""

    ref: SessionRef
    host: str
    hosts: int


@dataclass
class RankParts:
    """What the merge matches the ranks on, call by call: the group collective calls of each of a
    host's comparable GPUs (``checks/_ranks``), where the trace names its calls."""

    calls: list[_ranks.RankCalls | None]
    windows: int                        # the host's step windows the calls' steps count in
    devices: list[tuple[str, str]]      # (device name, host) of each GPU


@dataclass
class HostSummary:
    """What the merge needs of one host; never its events."""

    host: str
    errors: list[dict]
    report: dict | None = None            # the finished report, for a one-host session
    out: dict | None = None               # the host's session object before ranking
    findings: list[Finding] = field(default_factory=list)
    primary_gpu: str | None = None        # the host's SessionModel.primary_gpu, by name
    origin_ns: int = 0                    # the host clock's origin (per-step times are ps from it)
    numbers: np.ndarray | None = None     # step window numbers (marker numbers, or 0..n-1 without steps)
    durations: np.ndarray | None = None   # ps per window
    training_steps: int = 0
    parts: dict[str, Any] = field(default_factory=dict)   # cross-host check id -> its per-host measurement
    standalone_ms: dict[str, float] = field(default_factory=dict)     # each replayed cause, this host alone
    combined: dict[frozenset, np.ndarray] = field(default_factory=dict)  # causes -> per-step device gain
    balance: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None    # replay.balance_gain inputs
    ranks: RankParts | None = None        # None: no GPU of the host can be compared

    @property
    def analysed(self) -> bool:
        return self.out is not None and bool(self.out["hosts"])


def replayed_across_hosts() -> frozenset[str]:
    """The checks whose scenario the merge replays over every host's replicas together
    (``Replayed.across_hosts``), not combined from each host's own replay."""
    return frozenset(c.id for c in all_checks() if isinstance(c.what_if, Replayed) and c.what_if.across_hosts)


def map_host(job: HostJob) -> HostSummary:
    """Analyse one host of JOB's session alone; problems become errors, never exceptions."""
    heap.tune_for_trimming()
    # A one-host session keeps its skipped files' errors; a many-host one reports them once, in the merge.
    ref = dataclasses.replace(job.ref, hosts=(job.host,), skipped=job.ref.skipped if job.hosts == 1 else ())
    try:
        if job.hosts == 1:
            report = report_session(ref, session_hosts=1)
            return HostSummary(job.host, [], report=dict(report, hosts=report["hosts"] or [job.host]))
        # Findings name devices as the whole session does (SessionModel.session_hosts).
        model = load_session(ref, session_hosts=job.hosts)
        if not model.hosts:
            return HostSummary(job.host, model.errors)      # unreadable: nothing to analyse
        analysis = analyse(model)
        out, findings, errors = check(analysis)
        with stage("report"):
            return _summary(job.host, analysis, out, findings, errors)
    except Exception as err:  # one bad host never hides the others
        return HostSummary(job.host, [{"host": job.host, "message": f"could not analyse this host: {err!r}"}])


def _summary(host: str, analysis: Analysis, out: dict, findings: list[Finding], errors: list[dict]) -> HostSummary:
    model = analysis.model
    primary = model.primary_gpu
    summary = HostSummary(host, errors, out=out, findings=findings,
                          primary_gpu=primary.device.name if primary is not None else None)
    if not model.hosts:
        return summary
    summary.origin_ns = model.hosts[0].origin_ns
    steps = model.steps
    summary.numbers = steps.number.astype(np.int64) if len(steps) else np.zeros(1, np.int64)
    summary.training_steps = steps.training_steps
    summary.parts = {c.id: c.cross_host.measure(analysis) for c in all_checks() if c.cross_host is not None}
    summary.ranks = _rank_parts(analysis)
    if len(steps):
        summary.durations = steps.duration_ps.astype(np.int64)
        _gains(summary, analysis)
    return summary


def _rank_parts(analysis: Analysis) -> RankParts | None:
    """The host's comparable GPUs' collective calls in its step windows, or None without such GPUs."""
    model, active = analysis.model, analysis.comparable_gpus
    if not active:
        return None
    lo, _, _ = kernels.step_windows(model)
    return RankParts([_ranks.measure(dev, model) for dev in active], lo.size,
                     [(dev.device.name, dev.device.host) for dev in active])


def _gains(summary: HostSummary, analysis: Analysis) -> None:
    """Per-step replayed gains of this host's causes: each alone, and the fixes combined in the
    order this host ranks them (what the merge's reconcile and what-if ask for when the hosts
    agree on the order; when they do not, the merge uses the largest combination it has)."""
    what_if = analysis.what_if
    replay = what_if.replay
    if not analysis.breakdown.devices or len(analysis.breakdown.steps) != len(summary.durations):
        return      # no replay, or one over other windows than the trusted steps: nothing to join
    causes = {check: what_if.saving_ms(check) for check in what_if.scenarios}
    summary.standalone_ms = causes
    bound = (summary.out or {}).get("bottleneck") or {}
    ranked = [f.check for f in rank_findings(summary.findings, bound.get("bound_by"))]
    across = replayed_across_hosts()
    order = [c for c in ranked if causes.get(c, 0.0) > 0 and c not in across][:COMBINED_CAUSES]
    subsets = {frozenset()} | {frozenset([c]) for c in order} | {frozenset(order[:n]) for n in range(2, len(order) + 1)}
    for subset in subsets:
        scenario = Scenario()       # the empty one measures the replay's own residual
        for check in subset:
            scenario = scenario + what_if.scenarios[check]
        summary.combined[subset] = replay.device_gains(scenario)
    summary.balance = replay.balance_inputs()
