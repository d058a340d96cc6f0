"""Compare two analysed sessions: which findings are new, fixed, better, worse or unchanged.

Used by ``tb-gpuadvisor compare BASE NEW`` (and its ``--fail-on`` for CI) and by the plugin.
Both inputs are contract session objects (``multihost.analyze_session``), so a comparison can
also be made from two saved JSON reports.

Everything is judged on **absolute time per step**, never on shares of the step: when a fix
makes the step 9x shorter, the host work left over becomes a larger *share* of a much
shorter step although it takes less time than before; that is not a regression.

Each check's time is the ``*_ms_per_step`` metric its declaration names (``Compared`` in
checks/base.py), else its ``estimated_savings_ms_per_step``. When both sessions give a different ``steps.batch_size``,
times are divided by it (ms per example). A change counts only beyond the **noise band**:
``NOISE_SIGMAS`` standard errors of the difference of the two mean step times (from each
side's ``std_ms`` and step count), and at least ``NOISE_FLOOR_PERCENT`` of the longer step for a
check's time, ``STEP_NOISE_FLOOR_PERCENT`` for the step itself and for a check's time when either
side holds one step (its spread is unknown).

Status of a check with a time: more time beyond the band is ``new`` (a problem now, not
before) or ``worse``; less time beyond the band is ``fixed`` (a problem before, not now) or
``better``; within the band ``unchanged``, whatever its severity did. Checks without a time
(memory, profile_quality) follow their severity: problem (warning or critical) appearing is
``new``, disappearing ``fixed``, a different problem severity ``worse``/``better``. A check
missing from one side has no time and no problem there.

The step itself gets the same verdict (``step_status``). ``regressions`` counts ``new`` and
``worse`` checks, plus one when the step got slower beyond the band.

A check whose severity moved while its status did not follow (``ok -> warning`` but
``unchanged``: its time stayed within the band) carries a ``note`` saying why, and that
``--fail-on`` does not count it.
"""

from __future__ import annotations

import math

from tb_gpuadvisor.checks import all_checks, declared
from tb_gpuadvisor.checks.base import Compared, Severity
from tb_gpuadvisor.render import md_escape, printable, session_title, unreadable

NOISE_SIGMAS = 2.0          # standard errors of the difference of the means
NOISE_FLOOR_PERCENT = 1.0   # of the longer mean step: timer and scheduling jitter
# The step as a whole: two runs of the same job differ by several percent (scheduling, clocks,
# other processes) however steady each capture is, so a smaller change of the step is no evidence.
STEP_NOISE_FLOOR_PERCENT = 10.0

# The order of the checks in a comparison (changes first), for the CLI and the tab alike.
STATUSES = ("new", "worse", "better", "fixed", "unchanged")
# Where the primary device's step went (breakdown.per_device, ms per step), for "what grew": its
# kernel compute, then the parts checks declare (Compared.device_parts), then copies and idle.
DEVICE_COMPUTE = (("compute_ms", "kernel compute"),)
DEVICE_REST = (("copy_ms", "copies"), ("idle_ms", "GPU idle"))
# A run without a GPU: the host is the device, its compute the CPU's, its idle time no op running.
CPU_LABELS = {"kernel compute": "CPU compute", "GPU idle": "no op running"}


def _weight(severity: str | None) -> int:
    return Severity(severity).weight if severity else 0


def _is_problem(severity: str | None) -> bool:
    return _weight(severity) >= Severity.WARNING.weight


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_title(check: str) -> str:
    """The registered check's name ("Multi-GPU imbalance"), or the id for an unknown one."""
    declaration = declared(check)
    return declaration.title if declaration else check


def _compared(check: str) -> Compared:
    """What the check is compared by (a check this version does not know: its saving)."""
    declaration = declared(check)
    return declaration.compared if declaration else Compared()


def _time_ms(check: str, finding: dict | None) -> float | None:
    """The check's time per step in FINDING (0 when the check is absent); None: no time."""
    compared = _compared(check)
    if not compared.timed:
        return None
    if finding is None:
        return 0.0
    value = finding["metrics"].get(compared.time or "")
    if not _number(value):
        value = finding.get("estimated_savings_ms_per_step")
    return float(value) if _number(value) else 0.0


def _by_severity(base_sev: str | None, new_sev: str | None) -> str:
    if _is_problem(new_sev) and not _is_problem(base_sev):
        return "new"
    if _is_problem(base_sev) and not _is_problem(new_sev):
        return "fixed"
    if _is_problem(base_sev) and _weight(base_sev) != _weight(new_sev):
        return "worse" if _weight(new_sev) > _weight(base_sev) else "better"
    return "unchanged"


def _by_time(delta: float, band: float, base_sev: str | None, new_sev: str | None) -> str:
    if delta > band:
        return "new" if _is_problem(new_sev) and not _is_problem(base_sev) else "worse"
    if delta < -band:
        return "fixed" if _is_problem(base_sev) and not _is_problem(new_sev) else "better"
    return "unchanged"


def _note(status: str, base_sev: str | None, new_sev: str | None, delta: float | None, band: float,
          unit: str) -> str | None:
    """Why a check that became (or stopped being) a problem is unchanged: its time moved less
    than the noise band, so it is not counted as new or fixed, nor by --fail-on."""
    if status != "unchanged" or delta is None or _weight(base_sev) == _weight(new_sev) \
            or not (_is_problem(base_sev) or _is_problem(new_sev)):
        return None
    what = "a regression, so --fail-on does not count it" if _weight(new_sev) > _weight(base_sev) else "a fix"
    return (f"severity {base_sev or 'absent'} -> {new_sev or 'absent'}, but its time changed by {delta:+.2f} {unit}, "
            f"within the noise band (±{band:.2f}): not {what}")


def _metric_deltas(base: dict | None, new: dict | None) -> dict[str, float]:
    if not (base and new):
        return {}
    return {key: round(new["metrics"][key] - value, 3)
            for key, value in base["metrics"].items()
            if _number(value) and _number(new["metrics"].get(key))}


def _device_time(session: dict) -> dict[str, float]:
    """The parts of SESSION's primary device's step, ms per step (empty without a device breakdown)."""
    breakdown = session.get("breakdown") or {}
    device = next((p for p in breakdown.get("per_device", []) if p.get("device") == breakdown.get("device")), None)
    if device is None:
        return {}
    findings = {f["check"]: f for f in session.get("findings", [])}
    parts = [(label, device.get(key)) for key, label in DEVICE_COMPUTE]
    for check in all_checks():
        finding = findings.get(check.id)
        for part in check.compared.device_parts:
            if finding is None:
                value = device.get(part.breakdown) if part.breakdown else None
            else:
                value = finding["metrics"].get(part.metric) if part.metric else _time_ms(check.id, finding)
            parts.append((part.label, value))
    parts += [(label, device.get(key)) for key, label in DEVICE_REST]
    cpu = (session.get("trust") or {}).get("model_ran_on") == "cpu_only"
    return {CPU_LABELS.get(label, label) if cpu else label: float(value) for label, value in parts if _number(value)}


def _device_deltas(base: dict, new: dict, divisors: tuple[float, float]) -> list[dict]:
    """How each part of the device's step changed, largest change first."""
    before, after = _device_time(base), _device_time(new)
    rows = [{"part": label, "base_ms": round(before[label] / divisors[0], 3),
             "new_ms": round(after[label] / divisors[1], 3)} for label in before if label in after]
    for row in rows:
        row["delta_ms"] = round(row["new_ms"] - row["base_ms"], 3)
    return sorted(rows, key=lambda row: -abs(row["delta_ms"]))


def _savings(finding: dict | None) -> float:
    return float(finding.get("estimated_savings_ms_per_step") or 0.0) if finding else 0.0


def _per_example(base: dict, new: dict) -> tuple[float, float]:
    """Divisors for each side's times: their batch sizes when both are known and differ."""
    sizes = [(s.get("steps") or {}).get("batch_size") for s in (base, new)]
    if all(_number(b) and b > 0 for b in sizes) and sizes[0] != sizes[1]:
        return float(sizes[0]), float(sizes[1])
    return 1.0, 1.0


def _standard_error(steps: dict) -> float:
    """Standard error of the mean step time: its std (else half its range) over sqrt(count)."""
    spread = steps.get("std_ms")
    if not _number(spread):
        low, high = steps.get("min_ms"), steps.get("max_ms")
        spread = (high - low) / 2 if _number(low) and _number(high) else 0.0
    return spread / math.sqrt(max(int(steps.get("count") or 1), 1))


def noise_band(base_steps: dict, new_steps: dict, divisors: tuple[float, float] = (1.0, 1.0)) -> float:
    """How far apart two mean times (per step or per example) must be to count as a change.

    A side with one step shows no spread at all: nothing says how much its parts vary from
    step to step, so any part may differ by as much as whole steps of one job do
    (``STEP_NOISE_FLOOR_PERCENT``), and the band is that wide.
    """
    errors = [_standard_error(s) / d for s, d in zip((base_steps, new_steps), divisors)]
    means = [(s.get("mean_ms") or 0.0) / d for s, d in zip((base_steps, new_steps), divisors)]
    one_step = any(int(s.get("count") or 0) == 1 for s in (base_steps, new_steps))
    floor = STEP_NOISE_FLOOR_PERCENT if one_step else NOISE_FLOOR_PERCENT
    return max(NOISE_SIGMAS * math.hypot(*errors), floor / 100 * max(means))


def compare_sessions(base: dict, new: dict) -> dict:
    """Per-check status between two contract session objects, judged on time per step."""
    base_by_check = {f["check"]: f for f in base.get("findings", [])}
    new_by_check = {f["check"]: f for f in new.get("findings", [])}
    order = list(base_by_check) + [c for c in new_by_check if c not in base_by_check]
    base_steps, new_steps = base.get("steps") or {}, new.get("steps") or {}
    divisors = _per_example(base, new)
    unit = "ms/example" if divisors != (1.0, 1.0) else "ms/step"
    band = noise_band(base_steps, new_steps, divisors)
    checks = []
    for check in order:
        b, n = base_by_check.get(check), new_by_check.get(check)
        base_sev, new_sev = (b["severity"] if b else None), (n["severity"] if n else None)
        metric = _compared(check).share
        base_ms, new_ms = _time_ms(check, b), _time_ms(check, n)
        timed = base_ms is not None and new_ms is not None
        if timed:
            base_ms, new_ms = base_ms / divisors[0], new_ms / divisors[1]
        status = _by_time(new_ms - base_ms, band, base_sev, new_sev) if timed else _by_severity(base_sev, new_sev)
        note = _note(status, base_sev, new_sev, new_ms - base_ms if timed else None, band, unit)
        checks.append({
            "check": check,
            "name": _check_title(check),
            "status": status,
            **({"note": note} if note else {}),
            "base_severity": base_sev,
            "new_severity": new_sev,
            "new_confidence": n.get("confidence") if n else None,
            "base_ms": round(base_ms, 4) if timed else None,
            "new_ms": round(new_ms, 4) if timed else None,
            "main_metric": metric,
            "base_value": b["metrics"].get(metric) if b and metric else None,
            "new_value": n["metrics"].get(metric) if n and metric else None,
            "metric_deltas": _metric_deltas(b, n),
            "savings_delta_ms": round(_savings(n) - _savings(b), 3),
            "title": (n or b)["title"],
        })
    checks.sort(key=lambda c: STATUSES.index(c["status"]))     # stable: BASE's order within a status
    base_ms, new_ms = base_steps.get("mean_ms"), new_steps.get("mean_ms")
    comparable = bool(base_ms and new_ms)
    delta_ms = round(new_ms - base_ms, 3) if comparable else None
    delta_percent = round(100.0 * (new_ms - base_ms) / base_ms, 2) if comparable else None
    step_band = max(band, STEP_NOISE_FLOOR_PERCENT / 100 * max(base_ms / divisors[0], new_ms / divisors[1])) \
        if comparable else band
    step_status = (_by_time(new_ms / divisors[1] - base_ms / divisors[0], step_band, None, None)
                   if comparable else None)
    return {
        "base": {"run": base.get("run"), "session": base.get("session"), "step_ms": base_ms},
        "new": {"run": new.get("run"), "session": new.get("session"), "step_ms": new_ms},
        "unit": unit,
        "noise_band": round(step_band, 4) if comparable else None,
        "check_noise_band": round(band, 4),
        "step_time_delta_ms": delta_ms,
        "step_time_delta_percent": delta_percent,
        "step_status": step_status,
        "checks": checks,
        "device_time": _device_deltas(base, new, divisors),
        "regressions": sum(c["status"] in ("new", "worse") for c in checks) + (step_status == "worse"),
    }


def regressions_reaching(result: dict, fail_on: str | Severity) -> list[str]:
    """What trips ``--fail-on``: "step time slower beyond the noise band" when it is, and
    "input_bound new (critical)" per check that is new or worse with a new severity reaching
    ``fail_on`` (a finding of low confidence does not count)."""
    threshold = Severity(fail_on).weight
    causes = ["step time slower beyond the noise band"] if result.get("step_status") == "worse" else []
    return causes + [f"{c['check']} {c['status']} ({c['new_severity']})" for c in result["checks"]
                     if c["status"] in ("new", "worse") and _weight(c["new_severity"]) >= threshold
                     and c.get("new_confidence") != "low"]


def _unread(base: dict, new: dict) -> tuple[str, dict, str] | None:
    """(side, session, why) of the first of BASE and NEW that could not be analysed at all, or None."""
    for side, session in (("base", base), ("new", new)):
        why = unreadable(session)
        if why:
            return side, session, why
    return None


def refusal(base: dict, new: dict) -> str | None:
    """Why BASE and NEW cannot be compared (one of them could not be analysed at all), or None.
    A table against an unread session would list "fixed" and "unchanged" checks nobody measured."""
    found = _unread(base, new)
    if found is None:
        return None
    side, session, why = found
    return f"cannot compare: the {side} session {session_title(session)} could not be analysed: {why}"


def refused_side(base: dict, new: dict) -> str | None:
    """Which of BASE and NEW ("base" or "new") makes the comparison a refusal, or None: the tab
    drops an unreadable base from its choices and picks the next one."""
    found = _unread(base, new)
    return found[0] if found else None


def _label(side: dict) -> str:
    return side["session"] if side["run"] == "." else f"{side['run']}/{side['session']}"


def _step_line(result: dict) -> str:
    base, new = result["base"]["step_ms"], result["new"]["step_ms"]
    if result["step_time_delta_ms"] is None:
        return "Step time: not comparable (no steps in one of the sessions)"
    sign = "+" if result["step_time_delta_ms"] >= 0 else ""
    verdict = {"worse": "slower", "better": "faster", "unchanged": "within noise"}[result["step_status"]]
    return (f"Step time: {base:.2f} ms -> {new:.2f} ms ({sign}{result['step_time_delta_ms']:.2f} ms, "
            f"{sign}{result['step_time_delta_percent']:.1f}%; {verdict}, noise band "
            f"±{result['noise_band']:.2f} {result['unit']})")


def _device_line(result: dict) -> str | None:
    """"What grew: kernel compute +44.5 ms/step (46.9 -> 91.4), ...": the device's step parts."""
    grew = [row for row in result.get("device_time", []) if row["delta_ms"] > 0]
    if not grew:
        return None
    return "What grew: " + ", ".join(f"{row['part']} +{row['delta_ms']:.2f} {result['unit']} "
                                     f"({row['base_ms']:.2f} -> {row['new_ms']:.2f})" for row in grew)


def _value(value) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if _number(value) else str(value)


def _change(check: dict, unit: str, arrow: str) -> str:
    """"1.20 -> 0.80 ms/step (input_percent 31.0 -> 9.0)": the time, then the share."""
    parts = []
    if check["base_ms"] is not None:
        parts.append(f"{check['base_ms']:.2f} {arrow} {check['new_ms']:.2f} {unit}")
    if check["main_metric"] and not (check["base_value"] is None and check["new_value"] is None):
        share = f"{check['main_metric']} {_value(check['base_value'])} {arrow} {_value(check['new_value'])}"
        parts.append(f"({share})" if parts else share)
    return " ".join(parts)


def _severity_change(check: dict, arrow: str) -> str:
    """"ok -> warning"; the same severity on both sides once ("not_applicable")."""
    base, new = check["base_severity"] or "-", check["new_severity"] or "-"
    return base if base == new else f"{base} {arrow} {new}"


def render_comparison_text(result: dict) -> str:
    """A terminal summary: one line per check, changes first, in columns as wide as their
    longest entry; a check whose severity moved without a change of status says why below it."""
    head = f"{_label(result['base'])} -> {_label(result['new'])}"
    lines = [head, _step_line(result), *filter(None, [_device_line(result)]),
             f"Regressions: {result['regressions']}", ""]
    checks = result["checks"]
    rows = [(c["status"], c["check"], _severity_change(c, "->"), _change(c, result["unit"], "->")) for c in checks]
    widths = [max((len(row[i]) for row in rows), default=0) for i in range(3)]
    for c, row in zip(checks, rows):
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + f"  {row[3]}".rstrip())
        if c.get("note"):
            lines.append(" " * (widths[0] + 2) + f"why: {c['note']}")
    return printable("\n".join(line.rstrip() for line in lines))


def render_comparison_markdown(result: dict) -> str:
    """A pull-request comment: step time, regressions, and a table of the checks."""
    base, new = md_escape(_label(result["base"])), md_escape(_label(result["new"]))
    grew = _device_line(result)
    lines = [f"### GPU Advisor: {base} -> {new}", "",
             f"**{_step_line(result)}**", "",
             *([grew, ""] if grew else []),
             f"**Regressions: {result['regressions']}**", "",
             f"| status | check | severity | time ({result['unit']}) and share | saving change (ms/step) |",
             "|---|---|---|---|---|"]
    for c in result["checks"]:
        note = f"<br>why: {c['note']}" if c.get("note") else ""
        lines.append(f"| {c['status']} | `{c['check']}` | {_severity_change(c, '→')} | "
                     f"{_change(c, result['unit'], '→')}{note} | {c['savings_delta_ms']:+.2f} |")
    return "\n".join(lines) + "\n"
