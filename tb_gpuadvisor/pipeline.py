"""The analysis of one session, said in one place (docs/architecture.md):

    files -> input adapters -> model -> trust -> attribution and replay -> checks -> report

Each stage is a function from the values before it to a value of its own; no stage writes into
another's values.  ``report_session`` is the whole flow for a session read in one process;
``multihost`` runs the same stages per host and joins the hosts' summaries.
"""

from __future__ import annotations

from dataclasses import dataclass

from tb_gpuadvisor import cores
from tb_gpuadvisor.attribution.breakdown import Breakdown, compute_breakdown, measured_devices
from tb_gpuadvisor.attribution.replay import Scenario
from tb_gpuadvisor.attribution.whatif import WhatIf
from tb_gpuadvisor.checks import Finding, replay_scenarios
from tb_gpuadvisor.checks.context import Analysis
from tb_gpuadvisor.input.discovery import SessionRef
from tb_gpuadvisor.input.session import read_session
from tb_gpuadvisor.model.session import build_session
from tb_gpuadvisor.report import Described, describe, finish
from tb_gpuadvisor.stages import Deferred, stage
from tb_gpuadvisor.stepview import step_timeline
from tb_gpuadvisor.timeline import SessionModel
from tb_gpuadvisor.trust import Trust, assess


def load_session(ref: SessionRef, session_hosts: int = 0) -> SessionModel:
    """Files -> model: REF's hosts read by their formats' adapters, then joined into one session
    (one host of a SESSION_HOSTS-host session when multihost maps its hosts one by one)."""
    return build_session(read_session(ref), session_hosts)


def attribute(model: SessionModel, trust: Trust) -> Breakdown:
    """One cause per microsecond of each trusted step of MODEL (trust's view)."""
    return compute_breakdown(model, trust)


def scenarios(model: SessionModel) -> dict[str, Scenario]:
    """The scenario every replayed check declares for MODEL (it reads the model alone)."""
    return replay_scenarios(model, measured_devices(model)[0])


def replay(model: SessionModel, breakdown: Breakdown, declared: dict[str, Scenario] | None = None) -> WhatIf:
    """The trusted steps replayed, with the scenario every replayed check declares for MODEL
    (DECLARED: ``scenarios(model)``, when already found)."""
    return WhatIf.build(model, breakdown, scenarios(model) if declared is None else declared)


def analyse(model: SessionModel) -> Analysis:
    """Model -> trust -> attribution and replay: what the checks read. Trust is assessed here;
    the attribution and the replay are computed by the first check that asks (checks run in
    threads, and those that need neither overlap with them). The checks' replay scenarios read the
    model alone (the launch cost's median over every launch call, say): they are found beside the
    attribution, whose host-wide parts leave a core idle, not after it."""
    with stage("trust"):
        trust = assess(model)
    view = trust.view
    declared = Deferred("replay", lambda: scenarios(view))
    attribution = Deferred("attribution", lambda: cores.beside(declared.get, lambda: attribute(view, trust)))
    replayed = Deferred("replay", lambda: replay(view, attribution.get(), declared.get()))
    return Analysis(model, trust, attribution, replayed)


def check(analysis: Analysis) -> Described:
    """Analysis -> checks: the session object before ranking, every check's finding, the errors."""
    with stage("checks", "breakdown, replay and every check"):
        return describe(analysis)


def report(described: Described, analysis: Analysis) -> dict:
    """Checks -> report: the findings ranked, their savings made to add up, the first fix named."""
    with stage("report"):
        return finish(*described, analysis)


def report_session(ref: SessionRef, session_hosts: int = 0) -> dict:
    """The whole flow for the session REF, in this process."""
    model = load_session(ref, session_hosts)
    analysis = analyse(model)
    described = check(analysis)
    return report(described, analysis)


def report_model(model: SessionModel) -> dict:
    """The report of a session model already built (benchmarks time the stages apart)."""
    analysis = analyse(model)
    return report(check(analysis), analysis)


@dataclass(frozen=True)
class Analysed:
    """A session analysed and checked in this process, kept to draw its steps (``timeline``)."""

    analysis: Analysis
    findings: list[Finding]

    def timeline(self, step: int | None = None) -> dict:
        """The drawable form of STEP (None: the representative step), each finding marked on it."""
        return step_timeline(self.analysis, self.findings, step)


def analysed_session(ref: SessionRef) -> Analysed:
    """The flow up to the checks for every host of REF in this process: what a step's timeline
    reads (the report of a many-host session joins per-host summaries and keeps no events)."""
    analysis = analyse(load_session(ref))
    _, findings, _ = check(analysis)
    return Analysed(analysis, findings)
