"""Human-readable renderings of a report: terminal text and pull-request Markdown."""

from __future__ import annotations

import shutil
import textwrap

_MARK = {"critical": "CRIT", "warning": "WARN", "info": "info", "ok": " ok ", "not_applicable": " n/a"}
_EMOJI = {"critical": "🔴", "warning": "🟠", "info": "🔵", "ok": "🟢", "not_applicable": "⚪"}


def _device_line(dev: dict) -> str:
    parts = [dev["name"]]
    if dev.get("model"):
        parts.append(dev["model"])
    if dev.get("compute_capability"):
        parts.append(f"cc {dev['compute_capability']}")
    if dev.get("sm_count"):
        parts.append(f"{dev['sm_count']} SMs")
    if dev.get("memory_bytes"):
        parts.append(f"{dev['memory_bytes'] / 2**30:.1f} GiB")
    parts.append(f"{dev.get('events', 0)} events" if dev.get("active") else "no events")
    return ", ".join(parts)


def _steps_line(steps: dict) -> str:
    if not steps.get("count"):
        return "no steps found"
    return (f"{steps['count']} steps from {steps['source']} markers, "
            f"mean {steps['mean_ms']:.2f} ms (min {steps['min_ms']:.2f}, max {steps['max_ms']:.2f})")


def session_title(session: dict) -> str:
    return f"{session['run']} / {session['session']}"


def render_text(report: dict, width: int | None = None, verbose: bool = False) -> str:
    width = width or min(shutil.get_terminal_size((100, 20)).columns, 120)
    out: list[str] = []
    for session in report["sessions"]:
        out.append("=" * width)
        out.append(f"{session_title(session)}   [{session['framework']}; hosts: {', '.join(session['hosts'])}]")
        out.append(f"  steps:   {_steps_line(session['steps'])}")
        devices = session["devices"]
        active = [d for d in devices if d.get("active")]
        shown = devices if verbose or len(devices) <= 4 else active[:4]
        for dev in shown:
            out.append(f"  device:  {_device_line(dev)}")
        if len(shown) < len(devices):
            out.append(f"  device:  ... {len(devices) - len(shown)} more ({len(active)} of {len(devices)} active)")
        for err in session["errors"]:
            where = err.get("host") or err.get("check") or "session"
            out.append(f"  ERROR [{where}]: {err['message']}")
        if session.get("first_fix"):
            out.append("  fix first: " + session["first_fix"]["why"])
        findings = session["findings"]
        if findings:
            out.append("")
        for f in findings:
            if f["severity"] in ("ok", "not_applicable") and not verbose:
                continue
            saving = f["estimated_savings_ms_per_step"]
            out.append(f"  [{_MARK[f['severity']]}] {f['check']:<20} {saving:7.2f} ms/step  {f['title']}")
            for line in textwrap.wrap(f["summary"], width - 10):
                out.append(" " * 9 + line)
            if verbose:
                for ev in f["evidence"][:5]:
                    out.append(f"           - {ev['name'][:width - 40]}: {ev['value']:g} {ev['unit']}")
        quiet = [f["check"] for f in findings if f["severity"] in ("ok", "not_applicable")]
        if quiet and not verbose:
            out.append(f"  passed or not applicable: {', '.join(quiet)}")
    if not report["sessions"]:
        out.append("no sessions")
    return "\n".join(out) + "\n"


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def render_markdown(report: dict) -> str:
    out: list[str] = ["# GPU Advisor report", ""]
    for session in report["sessions"]:
        out += [f"## {_md_escape(session_title(session))}", ""]
        out.append(f"- **Framework:** {session['framework']}; **hosts:** {', '.join(session['hosts'])}")
        out.append(f"- **Steps:** {_steps_line(session['steps'])}")
        for dev in [d for d in session["devices"] if d.get("active")][:8]:
            out.append(f"- **Device:** {_md_escape(_device_line(dev))}")
        for err in session["errors"]:
            out.append(f"- ⛔ **Error** ({err.get('host') or err.get('check') or 'session'}): "
                       f"{_md_escape(err['message'])}")
        if session.get("first_fix"):
            out.append(f"- **Fix first:** {_md_escape(session['first_fix']['why'])}")
        out.append("")
        if session["findings"]:
            out += ["| | check | severity | saving (ms/step) | finding |", "|---|---|---|---:|---|"]
            for f in session["findings"]:
                out.append(f"| {_EMOJI[f['severity']]} | `{f['check']}` | {f['severity']} | "
                           f"{f['estimated_savings_ms_per_step']:.2f} | {_md_escape(f['title'])} |")
            out.append("")
        for f in session["findings"]:
            if f["severity"] not in ("critical", "warning", "info"):
                continue
            out += [f"<details><summary>{_EMOJI[f['severity']]} <b>{_md_escape(f['title'])}</b></summary>", "",
                    _md_escape(f["summary"]), ""]
            if f["metrics"]:
                out.append("Metrics: " + ", ".join(f"`{k}` = {v}" for k, v in f["metrics"].items()))
                out.append("")
            for fix in f["fixes"]:
                out.append(f"- {_md_escape(fix['text'])}")
                if fix.get("code"):
                    out += ["", "  ```", textwrap.indent(fix["code"], "  "), "  ```"]
            out += ["", "</details>", ""]
    return "\n".join(out) + "\n"
