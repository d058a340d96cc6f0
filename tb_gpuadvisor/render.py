"""Human-readable renderings of a report: terminal text, pull-request Markdown and notebook HTML.

Names in a report come from the capture (run, session, host and op names) and can hold
anything a file name can: every renderer makes them inert (no terminal escape sequences,
no Markdown or HTML markup).
"""

from __future__ import annotations

import re
import shutil
import textwrap

from tb_gpuadvisor.checks.base import Severity
from tb_gpuadvisor.checks.finding import ACTIONABLE, QUIET

_MARK = {"critical": "CRIT", "warning": "WARN", "info": "info", "ok": " ok ", "not_applicable": " n/a"}
_EMOJI = {"critical": "🔴", "warning": "🟠", "info": "🔵", "ok": "🟢", "not_applicable": "⚪"}



def _bound_line(bottleneck: dict) -> str:
    """What bounded the steps, e.g. "device compute in 100% of the steps (see xla_ops, ...)"."""
    checks = ", ".join(bottleneck.get("checks") or [])
    return (f"{bottleneck['bound_by']} in {bottleneck['share_of_steps']:.0f}% of the steps"
            + (f" (see {checks})" if checks else ""))

def _architecture(version: str, amd: bool) -> str:
    """NVIDIA's compute capability ("cc 8.0"); on AMD the same plane stats hold the gfx version's
    major and minor digits (gfx942 is 9.4), which is no compute capability: "gfx94x"."""
    if not amd:
        return f"cc {version}"
    major, _, minor = version.partition(".")
    return f"gfx{major}{minor or 0}x"


def _device_line(dev: dict) -> str:
    parts = [dev["name"]]
    if dev.get("model"):
        parts.append(dev["model"])
    amd = dev.get("vendor") == "AMD"
    if dev.get("compute_capability"):
        parts.append(_architecture(dev["compute_capability"], amd))
    if dev.get("sm_count"):
        parts.append(f"{dev['sm_count']} {'CUs' if amd else 'SMs'}")
    if dev.get("memory_bytes"):
        parts.append(f"{dev['memory_bytes'] / 2**30:.1f} GiB")
    parts.append(f"{dev.get('events', 0)} events" if dev.get("active") else "no events")
    return ", ".join(parts)


# Said before anything else about a capture that has no accelerator: every number is the CPU's.
NO_ACCELERATOR = "none: no GPU or TPU in this capture, the model ran on the host CPU"


def _no_accelerator(session: dict) -> bool:
    return (session.get("trust") or {}).get("model_ran_on") == "cpu_only"


# Said of a capture whose host launched GPU work but which holds no device at all.
TRACE_MISSING = "trace missing: the host launched GPU work, but no device event was recorded"


def _trace_missing(session: dict) -> bool:
    return (session.get("trust") or {}).get("model_ran_on") == "gpu_trace_lost" and not session.get("devices")


def marker_words(steps: dict, framework: str | None) -> str:
    """What marked the steps, in the user's framework's words: a JAX loop's step annotations are
    its StepTraceAnnotation, not a TensorFlow custom loop's."""
    source = steps.get("source") or "no"
    if source == "custom_loop" and framework == "jax":
        return "StepTraceAnnotation"
    return source


def one_window(steps: dict) -> str | None:
    """How a trace with no step marker (export_chrome_trace around one call) is told: one window
    over what it traced, never "1 steps from window markers"; None for a capture with steps."""
    if steps.get("source") == "window" and steps.get("count") == 1:
        return f"one window, no step markers: {steps['mean_ms']:.2f} ms traced"
    return None


def _steps_line(steps: dict, framework: str | None = None) -> str:
    if not steps.get("count"):
        return "no steps found"
    pace = {"device": "; the device set the pace (the host ran ahead: each step lasts as long as its device work)",
            "host": "; the host set the pace (the device waited for it)"}.get(steps.get("paced_by", ""), "")
    if one_window(steps):
        return f"{one_window(steps)}{pace}"
    return (f"{steps['count']} steps from {marker_words(steps, framework)} markers, "
            f"mean {steps['mean_ms']:.2f} ms (min {steps['min_ms']:.2f}, max {steps['max_ms']:.2f}){pace}")


# Every C0/C1 control character but the newline: an ESC in a capture name would otherwise
# reach the terminal as an escape sequence.
_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """TEXT with control characters shown as ``\\xNN`` instead of acting on the terminal."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def session_title(session: dict) -> str:
    """"run / session", or the session alone for a capture in the logdir root."""
    if session["run"] == ".":
        return session["session"]
    return f"{session['run']} / {session['session']}"


def unreadable(session: dict) -> str | None:
    """Why nothing of SESSION could be analysed, or None when something was.

    That is every host file failing to read, or a session-level error (a refused or
    crashed load) that left no steps: a report about such a session would only describe
    an empty capture.
    """
    errors = session.get("errors") or []
    failed_hosts = {e["host"] for e in errors if e.get("host")}
    whole = [e for e in errors if not e.get("host") and not e.get("check")]
    if (session.get("hosts") and failed_hosts >= set(session["hosts"])) or \
            (whole and not (session.get("steps") or {}).get("count")):
        return "; ".join(f"{e['host']}: {e['message']}" if e.get("host") else e["message"] for e in errors
                         if not e.get("check"))
    return None


def actionable(finding: dict) -> bool:
    return Severity(finding["severity"]) in ACTIONABLE


def quiet(finding: dict) -> bool:
    """A passed or not-applicable check: one line for all of them unless asked."""
    return Severity(finding["severity"]) in QUIET


def _confidence(finding: dict) -> str:
    """"low (reason; reason)", or "" when the finding does not say."""
    level = finding.get("confidence")
    if not level:
        return ""
    reasons = finding.get("confidence_reasons") or []
    return level + (f" ({'; '.join(reasons)})" if reasons else "")


def _text_fix(fix: dict, indent: str, width: int) -> list[str]:
    """The fix's text wrapped, then its code as is (indented, never wrapped: it is copied)."""
    lines = textwrap.wrap(fix["text"], width - len(indent), initial_indent="fix: ", subsequent_indent="     ")
    lines += [f"       {line}" for line in fix.get("code", "").splitlines()]
    return [(indent + line).rstrip() for line in lines]


def _text_finding(f: dict, width: int, verbose: bool) -> list[str]:
    out = [f"  [{_MARK[f['severity']]}] {f['check']:<20} {f['estimated_savings_ms_per_step']:7.2f} ms/step  "
           f"{f['title']}"]
    indent = " " * 9
    out += [indent + line for line in textwrap.wrap(f["summary"], width - 10)]
    if _confidence(f):
        out += [indent + line for line in textwrap.wrap("confidence: " + _confidence(f), width - 10)]
    if verbose:
        for ev in f["evidence"][:5]:
            out.append(f"{indent}  - {ev['name']}: {ev['value']:g} {ev['unit']}"
                       + (f" ({ev['detail']})" if ev.get("detail") else ""))
    # The top fix of an actionable finding always, every fix with -v.
    shown = f["fixes"] if verbose else f["fixes"][:1] if actionable(f) else []
    for fix in shown:
        out += _text_fix(fix, indent, width)
    return out


def _text_session(session: dict, width: int, verbose: bool) -> list[str]:
    out = ["=" * width]
    reason = unreadable(session)
    if reason:
        hosts = f" (hosts: {', '.join(session['hosts'])})" if session.get("hosts") else ""
        return out + [f"{session_title(session)}{hosts}: could not be read: {reason}"]
    out.append(f"{session_title(session)}   [{session['framework']}; hosts: {', '.join(session['hosts'])}]")
    out.append(f"  steps:   {_steps_line(session['steps'], session.get('framework'))}")
    devices = session["devices"]
    active = [d for d in devices if d.get("active")]
    shown = devices if verbose or len(devices) <= 4 else active[:4]
    for dev in shown:
        out.append(f"  device:  {_device_line(dev)}")
    if len(shown) < len(devices):
        out.append(f"  device:  ... {len(devices) - len(shown)} more ({len(active)} of {len(devices)} active)")
    if _no_accelerator(session):
        out.append(f"  device:  {NO_ACCELERATOR}")
    if _trace_missing(session):
        out.append(f"  device:  {TRACE_MISSING}")
    for err in session["errors"]:
        where = err.get("host") or err.get("check") or "session"
        out.append(f"  ERROR [{where}]: {err['message']}")
    if session.get("bottleneck"):
        out.append("  bound by: " + _bound_line(session["bottleneck"]))
    if session.get("first_fix"):
        out.append("  fix first: " + session["first_fix"]["why"])
    findings = session["findings"]
    if findings:
        out.append("")
    passed = [f["check"] for f in findings if quiet(f)]
    for f in findings:
        if verbose or not quiet(f):
            out += _text_finding(f, width, verbose)
    if passed and not verbose:
        out.append(f"  passed or not applicable: {', '.join(passed)}")
    return out


def render_text(report: dict, width: int | None = None, verbose: bool = False) -> str:
    width = width or min(shutil.get_terminal_size((100, 20)).columns, 120)
    out: list[str] = []
    for session in report["sessions"]:
        out += _text_session(session, width, verbose)
    if not report["sessions"]:
        out.append("no sessions")
    return printable("\n".join(out) + "\n")


# What makes text active in GitHub's Markdown, each replaced by its inert spelling: HTML and
# entities, table cells, code spans, emphasis, links and images ("](" and "][": "[x]" alone is
# text), bare URLs and "www." (autolinked), and line breaks (a name must not start a heading).
_MD_INERT = {"\\": "\\\\", "&": "&amp;", "<": "&lt;", ">": "&gt;", "|": "\\|", "`": "\\`", "*": "\\*",
             "](": "]\\(", "][": "]\\[", "://": "\\://", "www.": "www\\.", "\n": " "}
_MD_ACTIVE = re.compile("|".join(re.escape(k) for k in sorted(_MD_INERT, key=len, reverse=True)))


def html_escape(text: str) -> str:
    """TEXT inside a line of HTML (where Markdown is not read, so its escapes would show): no
    markup, on one line."""
    return printable(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("\n", " ")


def md_escape(text: str) -> str:
    """TEXT (names from a capture inside it) as Markdown that shows it as written and does
    nothing else: no markup, no link, no image, no line of its own."""
    return _MD_ACTIVE.sub(lambda m: _MD_INERT[m.group()], printable(text))


def _quiet_line(findings: list[dict]) -> str:
    """"🟢 Passed: a, b · ⚪ Not applicable: c", or "" when every check has something to say."""
    parts = []
    for severity, label in (("ok", "Passed"), ("not_applicable", "Not applicable")):
        checks = [f"`{f['check']}`" for f in findings if f["severity"] == severity]
        if checks:
            parts.append(f"{_EMOJI[severity]} {label}: {', '.join(checks)}")
    return " · ".join(parts)


def render_markdown(report: dict) -> str:
    out: list[str] = ["# GPU Advisor report", ""]
    for session in report["sessions"]:
        out += [f"## {md_escape(session_title(session))}", ""]
        hosts = md_escape(", ".join(session["hosts"]))
        reason = unreadable(session)
        if reason:
            out += [f"- ⛔ **Could not be read** (hosts: {hosts}): {md_escape(reason)}", ""]
            continue
        out.append(f"- **Framework:** {session['framework']}; **hosts:** {hosts}")
        out.append(f"- **Steps:** {_steps_line(session['steps'], session.get('framework'))}")
        for dev in [d for d in session["devices"] if d.get("active")][:8]:
            out.append(f"- **Device:** {md_escape(_device_line(dev))}")
        if _no_accelerator(session):
            out.append(f"- **Device:** {NO_ACCELERATOR}")
        if _trace_missing(session):
            out.append(f"- **Device:** {TRACE_MISSING}")
        for err in session["errors"]:
            out.append(f"- ⛔ **Error** ({md_escape(err.get('host') or err.get('check') or 'session')}): "
                       f"{md_escape(err['message'])}")
        if session.get("bottleneck"):
            out.append(f"- **Bound by:** {md_escape(_bound_line(session['bottleneck']))}")
        if session.get("first_fix"):
            out.append(f"- **Fix first:** {md_escape(session['first_fix']['why'])}")
        out.append("")
        shown = [f for f in session["findings"] if not quiet(f)]
        if shown:
            out += ["| | check | severity | saving (ms/step) | finding |", "|---|---|---|---:|---|"]
            for f in shown:
                out.append(f"| {_EMOJI[f['severity']]} | `{f['check']}` | {f['severity']} | "
                           f"{f['estimated_savings_ms_per_step']:.2f} | {md_escape(f['title'])} |")
            out.append("")
        folded = _quiet_line(session["findings"])
        if folded:
            out += [folded, ""]
        for f in session["findings"]:
            if quiet(f):
                continue
            out += [f"<details><summary>{_EMOJI[f['severity']]} <b>{html_escape(f['title'])}</b></summary>", "",
                    md_escape(f["summary"]), ""]
            if _confidence(f):
                out += [f"**Confidence:** {md_escape(_confidence(f))}", ""]
            if f["metrics"]:
                out.append("Metrics: " + ", ".join(f"`{k}` = {md_escape(str(v))}" for k, v in f["metrics"].items()))
                out.append("")
            for fix in f["fixes"]:
                out.append(f"- {md_escape(fix['text'])}")
                if fix.get("code"):
                    out += ["", "  ```", textwrap.indent(fix["code"], "  "), "  ```"]
            out += ["", "</details>", ""]
    return "\n".join(out) + "\n"


def _html_text(text: str) -> str:
    """TEXT as HTML that keeps its line breaks (fix code is copied as shown)."""
    return printable(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def render_html(report: dict) -> str:
    """The report as one HTML fragment for a notebook cell: per session its steps and bound, then
    the ranked findings worth acting on, each with its saving, summary and first fix."""
    out = ['<div class="tb-gpuadvisor">']
    for session in report["sessions"]:
        out.append(f"<h4>{html_escape(session_title(session))}</h4>")
        reason = unreadable(session)
        if reason:
            out.append(f"<p>Could not be read: {html_escape(reason)}</p>")
            continue
        out.append(f"<p>{html_escape(session['framework'])}; hosts: {html_escape(', '.join(session['hosts']))}<br>"
                   f"steps: {html_escape(_steps_line(session['steps'], session.get('framework')))}")
        if session.get("bottleneck"):
            out.append(f"<br>bound by: {html_escape(_bound_line(session['bottleneck']))}")
        out.append("</p>")
        shown = [f for f in session["findings"] if not quiet(f)]
        if shown:
            out.append("<table><tr><th>#</th><th></th><th>check</th><th>saving (ms/step)</th><th>finding</th></tr>")
            for rank, f in enumerate(shown, 1):
                fix = f["fixes"][0] if f["fixes"] and actionable(f) else None
                detail = html_escape(f["summary"])
                if fix is not None:
                    detail += f"<br><i>fix:</i> {html_escape(fix['text'])}"
                    if fix.get("code"):
                        detail += f"<pre>{_html_text(fix['code'])}</pre>"
                out.append(f"<tr><td>{rank}</td><td>{_EMOJI[f['severity']]} {f['severity']}</td>"
                           f"<td><code>{html_escape(f['check'])}</code></td>"
                           f"<td style=\"text-align:right\">{f['estimated_savings_ms_per_step']:.2f}</td>"
                           f"<td><b>{html_escape(f['title'])}</b><br>{detail}</td></tr>")
            out.append("</table>")
        folded = [f["check"] for f in session["findings"] if quiet(f)]
        if folded:
            out.append(f"<p>passed or not applicable: {html_escape(', '.join(folded))}</p>")
    if not report["sessions"]:
        out.append("<p>no sessions</p>")
    out.append("</div>")
    return "\n".join(out) + "\n"
