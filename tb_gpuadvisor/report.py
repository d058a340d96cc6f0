"""From the analysed session to the contract's session object (see shared/design/contract.md).

``describe`` runs the checks and ``finish`` ranks what they found; neither raises for a bad
capture: a check that fails, or a session with no steps, become entries in ``errors`` and the
rest of the report is still produced. The report never changes a check's finding: it makes new
ones (its confidence, reconciled saving and severity, fixes and evidence as the user reads them).
Reading the files and joining many hosts is tb_gpuadvisor.multihost's job.
"""

from __future__ import annotations

import posixpath
import traceback
from dataclasses import replace

from tb_gpuadvisor import cores
from tb_gpuadvisor.heap import return_freed_memory_if_worth
from tb_gpuadvisor.input import opens_in_xprof
from tb_gpuadvisor.checks.finding import ACTIONABLE
from tb_gpuadvisor.checks.context import Analysis
from tb_gpuadvisor.checks import Check, Evidence, Finding, Severity, all_checks, declared, explaining, fixes
from tb_gpuadvisor.timeline import PS_PER_MS, SessionModel
from tb_gpuadvisor.trust import Trust, confidence



def _steps_json(model: SessionModel, trust: Trust) -> dict:
    """The trusted steps, per training step (a marker covering N steps counts as N)."""
    steps = model.steps
    out: dict = {"count": steps.training_steps, "source": steps.source}
    if steps.marker_name:
        out["marker"] = steps.marker_name
    if steps.paced_by:
        out["paced_by"] = steps.paced_by
    if steps.per_marker > 1:
        out.update(steps_per_execution=steps.per_marker, markers=len(steps))
    if trust.excluded:
        out["excluded"] = len(trust.excluded)
    if len(steps):
        ms = steps.duration_ps / PS_PER_MS / steps.per_marker
        out.update(mean_ms=round(float(ms.mean()), 3), min_ms=round(float(ms.min()), 3),
                   max_ms=round(float(ms.max()), 3), std_ms=round(float(ms.std()), 3),
                   numbers=[int(n) for n in steps.number])
    return out


def _devices_json(model: SessionModel) -> list[dict]:
    out = []
    for dev in model.devices:
        item = dev.device.to_json()
        item["events"] = len(dev)
        item["active"] = bool(len(dev))
        out.append(item)
    return out


def rank_findings(findings: list[Finding], bound: str | None = None) -> list[Finding]:
    """Actionable findings the capture supports first, biggest estimated saving first; then
    low-confidence actionable ones; then by severity, the findings about what bounds the steps
    (BOUND) first among equals, so a compute-bound step leads with the kernels that bound it."""
    describes_bound = explaining(bound)

    def key(f: Finding) -> tuple:
        actionable = f.severity in ACTIONABLE
        # A finding that says the capture cannot be advised on as it stands (metrics "leads": the
        # device trace is missing, the model ran on the CPU, a warm-up window) comes first.
        return (not (actionable and f.metrics.get("leads") is True), not actionable, f.confidence == "low", -f.estimated_savings_ms_per_step if actionable else 0.0,
                -f.severity.weight, f.check not in describes_bound, f.check)
    return sorted(findings, key=key)


def bottleneck(analysis: Analysis) -> dict | None:
    """What bounded the trusted steps, as a share of steps (from the attribution)."""
    shares = analysis.breakdown.critical_path["shares"]
    if not shares or (analysis.trust.placement.where == "gpu_trace_lost" and not analysis.model.gpus):
        return None             # the host's breakdown stands in for a GPU whose trace is missing
    kind, share = max(shares.items(), key=lambda kv: kv[1])
    return {"bound_by": kind, "share_of_steps": share,
            "checks": explaining(kind, analysis.model.framework)}


def _aspect(check_id: str) -> str:
    """What the check's numbers rest on (its declaration); a check not registered, the idle split."""
    check = declared(check_id)
    return check.aspect if check else "idle"


_CONFIDENCE_ORDER = {"high": 0, "medium": 1, "low": 2}


def with_confidence(finding: Finding, analysis: Analysis) -> Finding:
    """FINDING with the confidence the capture supports; a check's own reasons are kept and can
    only lower it."""
    if finding.severity is Severity.NOT_APPLICABLE:
        return finding
    level, reasons = confidence(analysis.trust, analysis.model, _aspect(finding.check))
    if _CONFIDENCE_ORDER[level] <= _CONFIDENCE_ORDER.get(finding.confidence, 0):
        level = finding.confidence
    return replace(finding, confidence=level,
                   confidence_reasons=reasons + [r for r in finding.confidence_reasons if r not in reasons])


def _first_fix(ranked: list[Finding], mean_step_ms: float) -> dict | None:
    top = next((f for f in ranked if f.severity in ACTIONABLE and f.confidence != "low"), None)
    if top is None:
        return None
    saving = top.estimated_savings_ms_per_step
    if saving <= 0:
        # Only findings without a time model are left (a degraded capture, full memory).
        return {"check": top.check,
                "why": f"{top.title}. It saves no time by itself, but the other findings are only "
                       "as good as the capture: fix this first and profile again."}
    share = f" ({100 * saving / mean_step_ms:.0f}% of the mean step)" if mean_step_ms else ""
    if top.metrics.get("leads") is True and any(f.estimated_savings_ms_per_step > saving for f in ranked
                                                 if f.severity in ACTIONABLE):
        return {"check": top.check,
                "why": f"{top.title}. It comes before the findings that save more: until it is fixed they "
                       f"describe a different run (its own estimated saving: {saving:.2f} ms per step{share})."}
    return {"check": top.check,
            "why": f"{top.title}. Fixing it has the largest estimated saving: "
                   f"{saving:.2f} ms per step{share}."}


# The what-if block combines at most this many of the top fixes.
WHAT_IF_FIXES = 3


def reconcile_savings(analysis: Analysis, ranked: list[Finding],
                      bound: str | None = None) -> tuple[list[Finding], dict | None]:
    """Make the findings' savings disjoint (attribution/whatif.py), re-rank, and predict the
    step with the top fixes applied together (the session's ``what_if``)."""
    if not analysis.steps_count:
        return ranked, None
    what_if = analysis.what_if
    shares = what_if.reconcile([(f.check, f.estimated_savings_ms_per_step) for f in ranked])
    ranked = rank_findings([replace(f, estimated_savings_ms_per_step=share,
                                    severity=analysis.gated(f.severity, share) if f.check in what_if.checks
                                    else f.severity)
                            for f, share in zip(ranked, shares)], bound)
    top = [f for f in ranked if f.severity in ACTIONABLE and f.estimated_savings_ms_per_step > 0][:WHAT_IF_FIXES]
    if not top:
        return ranked, None
    replayed = [f.check for f in top if f.check in what_if.checks]
    others = sum(f.estimated_savings_ms_per_step for f in top if f.check not in what_if.checks)
    before = analysis.mean_step_ms
    after = max(0.0, before - what_if.combined_ms(replayed) - others)
    names = ", ".join(f.check for f in top)
    return ranked, {
        "fixes": [f.check for f in top], "step_ms": round(before, 3), "predicted_step_ms": round(after, 3),
        "summary": f"Fix {names}: {before:.2f} -> {after:.2f} ms per step (replayed together).",
    }


def _run_one(check: Check, analysis: Analysis) -> Finding | dict:
    try:
        return check.run(analysis)
    except Exception as err:  # one broken check must not hide the others
        return {"check": check.id, "message": f"check failed: {err!r}", "trace": traceback.format_exc(limit=3)}
    finally:
        return_freed_memory_if_worth()     # a check's temporaries, as a stage's (stages.stage): 0.1 GB of the peak at 1 GB


# Checks are vectorised numpy work that mostly runs without the GIL, so two threads overlap
# the breakdown with the checks that do not need it.
CHECK_THREADS = 2


def run_checks(analysis: Analysis) -> tuple[list[Finding], list[dict]]:
    results = cores.on_threads(_run_one, [(c, analysis) for c in all_checks()
                                          if c.applies_to(analysis.model.framework)], CHECK_THREADS)
    return ([r for r in results if isinstance(r, Finding)], [r for r in results if isinstance(r, dict)])


def time_origin_ms(origin_ns: int) -> float:
    """The capture clock's time of the report's 0 ms (its first event): every start_ms/end_ms plus
    this is the time XProf's trace viewer shows, which links need to open at an evidence's range."""
    return round(origin_ns / 1e6, 6)


# What ``describe`` hands to ``finish``: the session object, the findings, the errors.
Described = tuple[dict, list[Finding], list[dict]]


def describe(analysis: Analysis) -> Described:
    """The session object before ranking, the findings with their standalone savings, and the
    errors so far: what one host's analysis hands on when a session spans several hosts."""
    model = analysis.model
    errors = list(model.errors)
    out = {
        "run": model.run, "session": model.session, "hosts": [h.name for h in model.hosts],
        "framework": model.framework, "devices": _devices_json(model),
        "steps": _steps_json(model, analysis.trust), "trust": analysis.trust.to_json(),
        "time_origin_ms": time_origin_ms(min((h.origin_ns for h in model.hosts), default=0)),
    }
    try:
        out["breakdown"] = analysis.breakdown.to_json()
    except Exception as err:
        errors.append({"message": f"step breakdown failed: {err!r}"})
    found, check_errors = run_checks(analysis)
    facts = fixes.run_facts(analysis)
    # With the capture's confidence, fixes in the user's own framework fitted to what the run has
    # and did, evidence the user can find.
    findings = [replace(with_confidence(f, analysis), fixes=fixes.for_run(f.fixes, model.framework, facts),
                        evidence=_located(_xprof_can_show(f.evidence, model), model)) for f in found]
    try:
        out["bottleneck"] = bottleneck(analysis)
    except Exception as err:
        errors.append({"message": f"critical path failed: {err!r}"})
    out["warnings"] = list(model.warnings)
    return out, findings, errors + check_errors


# Step markers XProf's own step grouping finds: root step events (tf.profiler.experimental.Trace
# with step_num and _r=1, JAX's StepTraceAnnotation), Keras 2's TraceContext, and the Steps line
# it derived itself. Keras 3's "Profiled batch" and steps the Advisor inferred are not among them:
# there XProf's input pipeline page says "No step marker observed".
XPROF_STEP_SOURCES = frozenset({"custom_loop", "keras2", "steps_line"})
INPUT_PIPELINE_TOOL = "input_pipeline_analyzer"


def _xprof_can_show(evidence: list[Evidence], model: SessionModel) -> list[Evidence]:
    """EVIDENCE with links to XProf's input pipeline page only where that page can analyse the
    capture (it finds the steps); elsewhere the trace viewer shows the same tf.data events."""
    if model.steps.source in XPROF_STEP_SOURCES:
        return evidence
    return [replace(item, tool="trace_viewer@") if item.tool == INPUT_PIPELINE_TOOL else item for item in evidence]


def _located(evidence: list[Evidence], model: SessionModel) -> list[Evidence]:
    """EVIDENCE as the user can find it: no XProf tool can open a file XProf does not read
    (a PyTorch trace), so such items name the file and the time range from the trace start."""
    files = {h.name: posixpath.basename(h.path.replace("\\", "/")) for h in model.hosts
             if not opens_in_xprof(h.path)}
    if not files:
        return evidence
    out = []
    for item in evidence:
        file = files.get(item.host) or (next(iter(files.values())) if len(files) == 1 else None)
        if file is None:
            out.append(item)
            continue
        where = f"in {file}" + (f", {item.start_ms:.3f}-{item.end_ms:.3f} ms from the trace start"
                                 if item.start_ms is not None and item.end_ms is not None else "")
        out.append(replace(item, tool=None, detail=f"{item.detail}; {where}" if item.detail else where))
    return out


def _marked_device(ranked: list[Finding]) -> str | None:
    """The device the tab's per-GPU chart marks: named by the first finding, in rank order, of a
    check that declares one (``Chart``), None when none does."""
    for finding in ranked:
        check = declared(finding.check)
        value = finding.metrics.get(check.chart.marked_device) if check and check.chart else None
        if isinstance(value, str):
            return value
    return None


def finish(out: dict, findings: list[Finding], errors: list[dict], analysis: Analysis) -> dict:
    """Rank the findings, make their savings add up, and name the first fix. ANALYSIS is the
    session's own, or what multihost.merge joins from its hosts (the same interface)."""
    bound = (out.get("bottleneck") or {}).get("bound_by")
    ranked = rank_findings(findings, bound)
    try:
        ranked, out["what_if"] = reconcile_savings(analysis, ranked, bound)
    except Exception as err:
        errors = errors + [{"message": f"what-if replay failed: {err!r}"}]
    out["findings"] = [dict(f.to_json(), rank=i + 1) for i, f in enumerate(ranked)]
    out["first_fix"] = _first_fix(ranked, analysis.mean_step_ms)
    marked = _marked_device(ranked)
    if marked is not None:
        out["marked_device"] = marked
    out["errors"] = errors
    out["warnings"] = out.pop("warnings")       # after the errors, as the contract lists them
    return out

