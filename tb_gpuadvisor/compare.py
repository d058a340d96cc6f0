"""Compare two analysed sessions: which findings are new, fixed, better, worse or unchanged.

Used by ``tb-gpuadvisor compare BASE NEW`` (and its ``--fail-on`` for CI) and by the plugin.
Both inputs are contract session objects (``report.analyze_session``), so a comparison can
also be made from two saved JSON reports.

Status of a check, decided in this order:

1. **Severity rank.** A finding is a *problem* when its severity is warning or critical.
   not a problem -> problem: ``new``; problem -> not a problem: ``fixed``; problem in both
   with a different severity: ``worse`` (critical from warning) or ``better``. A check
   missing from one side counts as "not a problem" there.
2. **Main metric.** Otherwise (same problem severity, or no problem on either side) the
   check's main metric decides: a change of more than ``METRIC_TOLERANCE`` percentage points
   in the harmful direction is ``worse``, in the helpful direction ``better``; anything
   smaller is ``unchanged``. Checks without a directional main metric (memory: a higher
   peak can be the point of a larger batch; profile_quality) are ``unchanged`` here.

``regressions`` counts ``new`` and ``worse`` checks.
"""

from __future__ import annotations

from tb_gpuadvisor.checks.base import Severity

METRIC_TOLERANCE = 2.0      # percentage points

# check id -> (main metric, +1 when larger is worse, -1 when larger is better, 0 no direction)
MAIN_METRIC: dict[str, tuple[str, int]] = {
    "input_bound": ("input_percent", 1),
    "kernel_launch": ("launch_percent", 1),
    "host_overhead": ("other_idle_percent", 1),
    "op_placement": ("host_op_percent", 1),
    "memcpy": ("memcpy_percent", 1),
    "precision": ("low_precision_percent", -1),
    "tensor_core": ("eligible_not_using_percent", 1),
    "multi_gpu_imbalance": ("imbalance_percent", 1),
    "collectives": ("collective_percent", 1),
    "launch_skew": ("skew_percent", 1),
    "memory": ("peak_percent", 0),
}

STATUSES = ("new", "worse", "better", "fixed", "unchanged")


def _weight(severity: str | None) -> int:
    return Severity(severity).weight if severity else 0


def _is_problem(severity: str | None) -> bool:
    return _weight(severity) >= Severity.WARNING.weight


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _status(check: str, base: dict | None, new: dict | None) -> str:
    base_sev = base["severity"] if base else None
    new_sev = new["severity"] if new else None
    if _is_problem(new_sev) and not _is_problem(base_sev):
        return "new"
    if _is_problem(base_sev) and not _is_problem(new_sev):
        return "fixed"
    if _is_problem(base_sev) and _weight(base_sev) != _weight(new_sev):
        return "worse" if _weight(new_sev) > _weight(base_sev) else "better"
    metric, direction = MAIN_METRIC.get(check, (None, 0))
    if not (metric and direction and base and new):
        return "unchanged"
    before, after = base["metrics"].get(metric), new["metrics"].get(metric)
    if not (_number(before) and _number(after)):
        return "unchanged"
    change = (after - before) * direction
    if change > METRIC_TOLERANCE:
        return "worse"
    if change < -METRIC_TOLERANCE:
        return "better"
    return "unchanged"


def _metric_deltas(base: dict | None, new: dict | None) -> dict[str, float]:
    if not (base and new):
        return {}
    return {key: round(new["metrics"][key] - value, 3)
            for key, value in base["metrics"].items()
            if _number(value) and _number(new["metrics"].get(key))}


def _savings(finding: dict | None) -> float:
    return float(finding.get("estimated_savings_ms_per_step") or 0.0) if finding else 0.0


def compare_sessions(base: dict, new: dict) -> dict:
    """Per-check status between two contract session objects, with metric and step-time deltas."""
    base_by_check = {f["check"]: f for f in base.get("findings", [])}
    new_by_check = {f["check"]: f for f in new.get("findings", [])}
    order = list(base_by_check) + [c for c in new_by_check if c not in base_by_check]
    checks = []
    for check in order:
        b, n = base_by_check.get(check), new_by_check.get(check)
        metric = MAIN_METRIC.get(check, (None, 0))[0]
        checks.append({
            "check": check,
            "status": _status(check, b, n),
            "base_severity": b["severity"] if b else None,
            "new_severity": n["severity"] if n else None,
            "main_metric": metric,
            "base_value": b["metrics"].get(metric) if b and metric else None,
            "new_value": n["metrics"].get(metric) if n and metric else None,
            "metric_deltas": _metric_deltas(b, n),
            "savings_delta_ms": round(_savings(n) - _savings(b), 3),
            "title": (n or b)["title"],
        })
    base_ms = (base.get("steps") or {}).get("mean_ms")
    new_ms = (new.get("steps") or {}).get("mean_ms")
    delta_ms = round(new_ms - base_ms, 3) if base_ms and new_ms else None
    delta_percent = round(100.0 * (new_ms - base_ms) / base_ms, 2) if base_ms and new_ms else None
    return {
        "base": {"run": base.get("run"), "session": base.get("session"), "step_ms": base_ms},
        "new": {"run": new.get("run"), "session": new.get("session"), "step_ms": new_ms},
        "step_time_delta_ms": delta_ms,
        "step_time_delta_percent": delta_percent,
        "checks": checks,
        "regressions": sum(c["status"] in ("new", "worse") for c in checks),
    }


def has_regression(result: dict, fail_on: str | Severity) -> bool:
    """True when a check is new or worse and its new severity reaches ``fail_on``."""
    threshold = Severity(fail_on).weight
    return any(c["status"] in ("new", "worse") and _weight(c["new_severity"]) >= threshold
               for c in result["checks"])


def _step_line(result: dict) -> str:
    base, new = result["base"]["step_ms"], result["new"]["step_ms"]
    if result["step_time_delta_ms"] is None:
        return "Step time: not comparable (no steps in one of the sessions)"
    sign = "+" if result["step_time_delta_ms"] >= 0 else ""
    return (f"Step time: {base:.2f} ms -> {new:.2f} ms ({sign}{result['step_time_delta_ms']:.2f} ms, "
            f"{sign}{result['step_time_delta_percent']:.1f}%)")


def _value(value) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if _number(value) else str(value)


def _metric_change(check: dict, arrow: str) -> str:
    """ "name before -> after", or "" when the check has no main metric on either side."""
    if not check["main_metric"] or (check["base_value"] is None and check["new_value"] is None):
        return ""
    return f"{check['main_metric']} {_value(check['base_value'])} {arrow} {_value(check['new_value'])}"


def _ordered(result: dict) -> list[dict]:
    return sorted(result["checks"], key=lambda c: STATUSES.index(c["status"]))


def render_comparison_text(result: dict) -> str:
    """A terminal summary: one line per check, changes first."""
    head = (f"{result['base']['run']}/{result['base']['session']} -> "
            f"{result['new']['run']}/{result['new']['session']}")
    lines = [head, _step_line(result), f"Regressions: {result['regressions']}", ""]
    for c in _ordered(result):
        severity = f"{c['base_severity'] or '-'} -> {c['new_severity'] or '-'}"
        lines.append(f"{c['status']:<9} {c['check']:<20} {severity:<34} {_metric_change(c, '->')}".rstrip())
    return "\n".join(lines)


def render_comparison_markdown(result: dict) -> str:
    """A pull-request comment: step time, regressions, and a table of the checks."""
    base, new = result["base"], result["new"]
    lines = [f"### GPU Advisor: `{base['run']}/{base['session']}` -> `{new['run']}/{new['session']}`", "",
             f"**{_step_line(result)}**", "",
             f"**Regressions: {result['regressions']}**", "",
             "| status | check | severity | main metric | saving change (ms/step) |",
             "|---|---|---|---|---|"]
    for c in _ordered(result):
        metric = _metric_change(c, "→")
        if metric:
            metric = f"`{c['main_metric']}`{metric[len(c['main_metric']):]}"
        lines.append(f"| {c['status']} | `{c['check']}` | {c['base_severity'] or '-'} → "
                     f"{c['new_severity'] or '-'} | {metric} | {c['savings_delta_ms']:+.2f} |")
    return "\n".join(lines) + "\n"
